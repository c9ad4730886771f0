//! A full disk under the repository or the restore target: the command fails with an error
//! that says so, and nothing already stored is lost (the repository still checks clean and
//! restores what it held). Real tmpfs mounts of a few MiB; needs root, as the volume tests do.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{ferry, noise, ok};

mod common;

/// Fails with one `ferry: error:` line saying the disk is full.
fn fails_full(out: &Output, what: &str) -> String {
    assert!(!out.status.success(), "{what} succeeded on a full disk");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<_> = stderr.lines().filter(|l| l.starts_with("ferry: error:")).collect();
    assert_eq!(lines.len(), 1, "{what}: {stderr}");
    assert!(lines[0].contains("No space left on device"), "{what}: {stderr}");
    lines[0].to_owned()
}

/// A tmpfs of `mib` MiB, unmounted (and its folder removed) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(dir: &Path, mib: u32) -> Self {
        std::fs::create_dir_all(dir).expect("mount point");
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={mib}m").as_str()),
        )
        .expect("mount tmpfs (the test needs root)");
        Self(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount(&self.0);
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn same_tree(a: &Path, b: &Path) {
    let out = Command::new("diff").arg("-r").arg(a).arg(b).output().expect("diff");
    assert!(out.status.success(), "trees differ: {}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn a_full_repository_disk_fails_the_backup_and_keeps_what_was_stored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = Tmpfs::new(&dir.path().join("disk"), 8);
    let repo = format!("file://{}", disk.0.join("repo").display());
    let (small, big) = (dir.path().join("small"), dir.path().join("big"));
    std::fs::create_dir_all(&small).expect("mkdir");
    std::fs::write(small.join("a"), noise(1 << 20, 1)).expect("write");
    std::fs::create_dir_all(&big).expect("mkdir");
    for i in 0..4 {
        std::fs::write(big.join(format!("f{i}")), noise(4 << 20, 10 + i)).expect("write");
    }
    ok(&ferry(&["repo", "init", "--repo", &repo, "--pack-size-mib", "1"]));
    let first = ok(&ferry(&["backup", "--repo", &repo, small.to_str().expect("utf-8")]));
    let first = first.lines().last().expect("snapshot id").to_owned();

    fails_full(&ferry(&["backup", "--repo", &repo, big.to_str().expect("utf-8")]), "backup");

    let snapshots = ok(&ferry(&["snapshots", "--repo", &repo, "--json"]));
    let list: Vec<serde_json::Value> = serde_json::from_str(&snapshots).expect("JSON");
    assert_eq!(list.len(), 1, "{snapshots}");
    assert_eq!(list[0]["id"], first.as_str());
    ok(&ferry(&["check", "--repo", &repo, "--read-data"]));
    let restored = dir.path().join("restored");
    ok(&ferry(&["restore", "--repo", &repo, &first, restored.to_str().expect("utf-8")]));
    same_tree(&small, &restored);
}

#[test]
fn a_full_target_disk_fails_the_restore_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = format!("file://{}", dir.path().join("repo").display());
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    for i in 0..3 {
        std::fs::write(src.join(format!("f{i}")), noise(3 << 20, 20 + i)).expect("write");
    }
    ok(&ferry(&["repo", "init", "--repo", &repo]));
    let id = ok(&ferry(&["backup", "--repo", &repo, src.to_str().expect("utf-8")]));
    let id = id.lines().last().expect("snapshot id").to_owned();

    let disk = Tmpfs::new(&dir.path().join("disk"), 4);
    let target = disk.0.join("target");
    let line = fails_full(
        &ferry(&["restore", "--repo", &repo, &id, target.to_str().expect("utf-8")]),
        "restore",
    );
    assert!(line.contains(&target.display().to_string()), "no path in: {line}");
    // The repository is untouched: a restore with room succeeds.
    let roomy = dir.path().join("roomy");
    ok(&ferry(&["restore", "--repo", &repo, &id, roomy.to_str().expect("utf-8")]));
    same_tree(&src, &roomy);
}
