//! `ferry backup` killed with SIGKILL at many points of an upload (before anything is stored,
//! after the first packs, right after the first index checkpoint, late in the upload), of a
//! directory and of a volume image: every time `check` accepts the repository, and the next
//! backup completes, restores exactly, and reuses what the killed one had checkpointed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{ferry_command as ferry, noise, ok};

mod common;

/// Packs of 1 MiB (`repo init --pack-size-mib 1`), so an index checkpoint (every 8 stored
/// packs) comes after 8 MiB and a small source spans many packs.
const PACK_MIB: u64 = 1;
/// What a checkpoint makes reusable at least: 8 packs of at least 1 MiB each, less the
/// packs' own overhead.
const CHECKPOINT_BYTES: u64 = (7 * PACK_MIB) << 20;

fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else {
                out.insert(e.path());
            }
        }
    }
    out
}

/// Where to kill the backup.
#[derive(Debug, Clone, Copy)]
enum Point {
    /// Right after it starts (opening the repository).
    AtStart,
    /// Once this many new packs are stored.
    Packs(usize),
    /// Once its first index checkpoint is stored.
    FirstIndex,
}

struct Repo {
    dir: tempfile::TempDir,
    url: String,
}

impl Repo {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("file://{}", dir.path().join("repo").display());
        ok(&ferry(&["repo", "init", "--repo", &url, "--pack-size-mib", "1"])
            .output()
            .expect("run"));
        Self { dir, url }
    }

    fn packs(&self) -> BTreeSet<PathBuf> {
        files_under(&self.dir.path().join("repo/data"))
    }

    fn indexes(&self) -> usize {
        files_under(&self.dir.path().join("repo/index")).len()
    }

    /// Starts `ferry backup` and SIGKILLs it at `point`; returns false when it finished first.
    fn kill_backup_at(&self, source_args: &[&str], point: Point) -> bool {
        let packs_before = self.packs();
        let indexes_before = self.indexes();
        let mut args = vec!["backup", "--repo", &self.url];
        args.extend(source_args);
        let mut child = ferry(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ferry backup");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if child.try_wait().expect("wait").is_some() {
                break false;
            }
            let reached = match point {
                Point::AtStart => true,
                Point::Packs(n) => self.packs().difference(&packs_before).count() >= n,
                Point::FirstIndex => self.indexes() > indexes_before,
            };
            if reached {
                let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                break true;
            }
            assert!(Instant::now() < deadline, "backup neither finished nor reached {point:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn check(&self, read_data: bool) {
        let mut args = vec!["check", "--repo", &self.url];
        if read_data {
            args.push("--read-data");
        }
        let out = ok(&ferry(&args).output().expect("run check"));
        assert!(out.contains("no problems found"), "{out}");
    }

    /// A complete backup; returns (snapshot id, bytes_total, bytes_new).
    fn backup(&self, source_args: &[&str]) -> (String, u64, u64) {
        let mut args = vec!["backup", "--repo", &self.url, "--json"];
        args.extend(source_args);
        let json: serde_json::Value =
            serde_json::from_str(ok(&ferry(&args).output().expect("run")).trim()).expect("JSON");
        let field = |k: &str| json[k].as_u64().unwrap_or_else(|| panic!("{k} in {json}"));
        (
            json["snapshot_id"].as_str().expect("id").to_owned(),
            field("bytes_total"),
            field("bytes_new"),
        )
    }

    fn restore(&self, id: &str, target: &Path) {
        let target = target.to_str().expect("path");
        ok(&ferry(&["restore", "--repo", &self.url, id, target]).output().expect("run"));
    }
}

/// Kills a backup of `source_args` at `point` in a fresh repository, then checks the
/// repository, backs up again and returns the repository and the completed backup.
fn kill_then_resume(source_args: &[&str], point: Point) -> (Repo, String, u64, u64) {
    let repo = Repo::new();
    let killed = repo.kill_backup_at(source_args, point);
    assert!(killed, "the backup finished before {point:?}: the source is too small");
    repo.check(false);
    let (id, total, new) = repo.backup(source_args);
    // By 12 stored packs the first checkpoint is stored: it starts after the 8th upload, and
    // until it is done at most the 3 uploads already running can finish.
    if matches!(point, Point::FirstIndex | Point::Packs(12..)) {
        assert!(
            new + CHECKPOINT_BYTES <= total,
            "killed at {point:?}: the next backup stored {new} of {total} bytes again"
        );
    }
    (repo, id, total, new)
}

const POINTS: [Point; 5] =
    [Point::AtStart, Point::Packs(1), Point::Packs(4), Point::FirstIndex, Point::Packs(12)];
/// Source size in MiB: the last kill point leaves 20 MiB still to upload, so the backup is
/// always killed before it ends, even on a loaded machine.
const SOURCE_MIB: u64 = 32;

#[test]
fn a_directory_backup_killed_anywhere_resumes() {
    let src = tempfile::tempdir().expect("tempdir");
    for i in 0..SOURCE_MIB {
        std::fs::write(src.path().join(format!("f{i:02}")), noise(1 << 20, i)).expect("write");
    }
    std::fs::write(src.path().join("notes.txt"), b"a small file\n").expect("write");
    let path = src.path().to_str().expect("path");
    for point in POINTS {
        let (repo, id, total, _) = kill_then_resume(&[path], point);
        assert!(total >= SOURCE_MIB << 20);
        let out = repo.dir.path().join("restored");
        repo.restore(&id, &out);
        for i in 0..SOURCE_MIB {
            let name = format!("f{i:02}");
            let restored = std::fs::read(out.join(&name)).expect("restored file");
            assert!(restored == noise(1 << 20, i), "{name} differs after {point:?}");
        }
        repo.check(true);
    }
}

#[test]
fn a_volume_backup_killed_anywhere_resumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("volume.img");
    let data = noise(usize::try_from(SOURCE_MIB << 20).expect("size"), 99);
    let file = std::fs::File::create(&image).expect("create");
    file.set_len((SOURCE_MIB + 8) << 20).expect("size");
    std::os::unix::fs::FileExt::write_all_at(&file, &data, 4 << 20).expect("write");
    drop(file);
    let path = image.to_str().expect("path");
    for point in POINTS {
        let (repo, id, _, _) = kill_then_resume(&["--volume", path], point);
        let out = repo.dir.path().join("restored.img");
        repo.restore(&id, &out);
        assert!(std::fs::read(&out).expect("read") == std::fs::read(&image).expect("read"));
        repo.check(true);
    }
}
