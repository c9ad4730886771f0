//! A tree nesting 2,000 directories of 255-byte names (its deepest path is about 500 KB long),
//! backed up and restored with the `ferry` command line, in little memory: the backup walker
//! and the restore planner keep each name once (`DirPath`), where a whole path per level took
//! the sum of every level's path, about 2,000 × 2,000 / 2 × 256 bytes = 512 MB (a debug build
//! peaked at 1,022 MiB that way, and at 88 MiB with `DirPath`).
//!
//! Its own test binary: the peak resident memory of the children this process waited for
//! (`getrusage(RUSAGE_CHILDREN)`) is then that of these `ferry` runs (and at most this test's
//! own, which a child starts with until it executes `ferry`: that can only fail the test).
//! They run on two CPUs, so their worker threads (and the buffers each holds) do not grow with
//! the machine.

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{Pid, UnlinkatFlags, unlinkat};

use common::{ferry, ok};

mod common;

const LEVELS: usize = 2_000;
/// Above what the `ferry` runs need here (tens of MiB), far below what whole paths per level
/// took (512 MB).
const PEAK_LIMIT_MIB: i64 = 160;
const NAME: [u8; 255] = [b'n'; 255];

fn open_dir(at: &OwnedFd, name: &[u8]) -> OwnedFd {
    openat(at, name, dir_flags(), Mode::empty()).expect("open directory")
}

/// Removes the chains of [`NAME`] under its folders when dropped, passed or failed, one level
/// at a time: a recursive removal (the temporary directory's own) keeps a descriptor open per
/// level, more than a test process may have.
struct Chains(Vec<PathBuf>);

impl Drop for Chains {
    fn drop(&mut self) {
        for top in &self.0 {
            if let Err(e) = remove_chain(top) {
                eprintln!("removing {}: {e}", top.display());
            }
        }
    }
}

/// `top/NAME/NAME/…/bottom` removed by moving the rest of the chain up a level each time.
fn remove_chain(top: &Path) -> nix::Result<()> {
    let top: OwnedFd = match std::fs::File::open(top) {
        Ok(f) => f.into(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))),
    };
    for _ in 0..=LEVELS {
        let first = match openat(&top, &NAME[..], dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        let more = match renameat(&first, &NAME[..], &top, "rest") {
            Ok(()) => true,
            Err(Errno::ENOENT) => false,
            Err(e) => return Err(e),
        };
        match unlinkat(&first, "bottom", UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(e),
        }
        drop(first);
        unlinkat(&top, &NAME[..], UnlinkatFlags::RemoveDir)?;
        if !more {
            return Ok(());
        }
        renameat(&top, "rest", &top, &NAME[..])?;
    }
    Err(Errno::ELOOP)
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Confines this thread, and the processes it starts, to two of its CPUs (one if it has one).
fn on_two_cpus() {
    let allowed = sched_getaffinity(Pid::from_raw(0)).expect("sched_getaffinity");
    let mut two = CpuSet::new();
    let mut taken = 0;
    for cpu in 0..CpuSet::count() {
        if taken < 2 && allowed.is_set(cpu).unwrap_or(false) {
            two.set(cpu).expect("cpu");
            taken += 1;
        }
    }
    sched_setaffinity(Pid::from_raw(0), &two).expect("sched_setaffinity");
}

#[test]
fn a_deep_tree_of_long_names_backs_up_and_restores_in_little_memory() {
    on_two_cpus();
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, restored) = (dir.path().join("src"), dir.path().join("restored"));
    std::fs::create_dir(&src).expect("mkdir");
    let _chains = Chains(vec![src.clone(), restored.clone()]);
    let name = NAME;
    let mut fd: OwnedFd = std::fs::File::open(&src).expect("open").into();
    for _ in 0..LEVELS {
        mkdirat(&fd, &name[..], Mode::from_bits_truncate(0o755)).expect("mkdir");
        fd = open_dir(&fd, &name);
    }
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC;
    let file = openat(&fd, "bottom", flags, Mode::from_bits_truncate(0o644)).expect("create");
    std::fs::File::from(file).write_all(b"the deepest file\n").expect("write");

    let repo = format!("file://{}", dir.path().join("repo").display());
    ok(&ferry(&["repo", "init", "--repo", &repo]));
    ok(&ferry(&["backup", "--repo", &repo, src.to_str().expect("utf-8")]));
    ok(&ferry(&["restore", "--repo", &repo, "latest", restored.to_str().expect("utf-8")]));
    let peak_mib = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage").max_rss() / 1024;

    let mut fd: OwnedFd = std::fs::File::open(&restored).expect("open restored").into();
    for _ in 0..LEVELS {
        fd = open_dir(&fd, &name);
    }
    let file = openat(&fd, "bottom", OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
        .expect("the deepest file restored");
    let mut content = String::new();
    std::fs::File::from(file).read_to_string(&mut content).expect("read");
    assert_eq!(content, "the deepest file\n");
    // `repo init` alone derives a key with 64 MiB: a smaller peak was not measured.
    assert!(peak_mib >= 64, "getrusage reported a peak of {peak_mib} MiB");
    assert!(
        peak_mib <= PEAK_LIMIT_MIB,
        "a ferry run peaked at {peak_mib} MiB resident, above {PEAK_LIMIT_MIB} MiB"
    );
}
