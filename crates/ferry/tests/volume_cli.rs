//! Volume snapshots through the `ferry` command line: a block device (a real loop device) is
//! detected by `backup`, an image file needs `--volume`; `restore` puts a volume onto a device
//! or image file and refuses to mix kinds; `snapshots` shows the kind.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{ferry, ok};

mod common;

fn fails_with(out: &Output, expected: &str) {
    assert!(!out.status.success(), "ferry succeeded unexpectedly");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(expected), "expected {expected:?} in {stderr}");
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// A loop device over an image file, detached on drop.
struct Loop(PathBuf);

impl Loop {
    fn attach(image: &Path) -> Self {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(image)
            .output()
            .expect("run losetup");
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        Self(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn volume_backup_restore_and_kind_checks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = format!("file://{}", dir.path().join("repo").display());
    ok(&ferry(&["repo", "init", "--repo", &repo]));

    // An image file with data, a hole and zeros.
    let image = dir.path().join("disk.img");
    let f = std::fs::File::create(&image).expect("create image");
    f.set_len(24 << 20).expect("size");
    f.write_all_at(&pattern(3 << 20, 1), 1 << 20).expect("write");
    f.write_all_at(&pattern(5000, 2), 20 << 20).expect("write");
    let img = image.to_str().expect("path");

    // Without --volume a regular file is not a directory tree.
    assert!(!ferry(&["backup", "--repo", &repo, img]).status.success());
    let json = ok(&ferry(&["backup", "--repo", &repo, "--volume", "--json", img]));
    let summary: serde_json::Value = serde_json::from_str(json.trim()).expect("JSON");
    assert_eq!(summary["kind"], "volume");
    assert_eq!(summary["bytes_total"], 24 << 20);
    assert!(summary["bytes_skipped"].as_u64().expect("bytes_skipped") >= 19 << 20, "{summary}");
    let vol_id = summary["snapshot_id"].as_str().expect("id").to_owned();

    // A block device is detected without --volume; with --parent it is an incremental.
    let lo = Loop::attach(&image);
    let dev = lo.0.to_str().expect("path");
    let inc = ok(&ferry(&["backup", "--repo", &repo, "--json", "--parent", &vol_id, dev]));
    let inc: serde_json::Value = serde_json::from_str(inc.trim()).expect("JSON");
    assert_eq!(inc["kind"], "volume");
    assert_eq!(inc["bytes_new"], 0, "same data, nothing new: {inc}");

    let tree_src = dir.path().join("tree");
    std::fs::create_dir_all(&tree_src).expect("mkdir");
    std::fs::write(tree_src.join("a"), b"a file").expect("write");
    let tree_out = ok(&ferry(&["backup", "--repo", &repo, tree_src.to_str().expect("path")]));
    let tree_id = tree_out.lines().last().expect("id").to_owned();

    let list: serde_json::Value =
        serde_json::from_str(&ok(&ferry(&["snapshots", "--repo", &repo, "--json"]))).expect("JSON");
    let kinds: Vec<&str> =
        list.as_array().expect("list").iter().map(|s| s["kind"].as_str().unwrap_or("?")).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "volume").count(), 2, "{list}");
    assert_eq!(kinds.iter().filter(|k| **k == "tree").count(), 1, "{list}");
    let table = ok(&ferry(&["snapshots", "--repo", &repo]));
    assert!(table.contains(" volume ") && table.contains(" tree "), "{table}");

    // Volume onto a new image file: identical bytes.
    let restored = dir.path().join("restored.img");
    ok(&ferry(&["restore", "--repo", &repo, &vol_id[..12], restored.to_str().expect("path")]));
    assert!(std::fs::read(&image).expect("read") == std::fs::read(&restored).expect("read"));

    // Kinds are not mixed.
    fails_with(&ferry(&["restore", "--repo", &repo, &tree_id, dev]), "tree snapshot");
    fails_with(
        &ferry(&["restore", "--repo", &repo, &vol_id, tree_src.to_str().expect("path")]),
        "is a directory",
    );
    let check = ok(&ferry(&["check", "--repo", &repo, "--read-data"]));
    assert!(check.contains("no problems found"), "{check}");
}

/// `--compression` sets the zstd level of the data: 0 stores text as is, the default shrinks
/// it, the restore is identical either way, and a level zstd does not have is refused.
#[test]
fn compression_level_is_chosen_per_backup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("text.img");
    let line = b"fn main() { println!(\"a line of source code, compressible\"); }\n";
    let text: Vec<u8> = line.iter().copied().cycle().take(4 << 20).collect();
    std::fs::write(&image, &text).expect("write image");
    let img = image.to_str().expect("path");
    let stored = |level: Option<&str>| {
        let repo = format!("file://{}", dir.path().join(format!("repo-{level:?}")).display());
        ok(&ferry(&["repo", "init", "--repo", &repo]));
        let mut args = vec!["backup", "--repo", &repo, "--volume", "--json"];
        if let Some(level) = level {
            args.extend(["--compression", level]);
        }
        args.push(img);
        let summary: serde_json::Value =
            serde_json::from_str(ok(&ferry(&args)).trim()).expect("JSON");
        let id = summary["snapshot_id"].as_str().expect("id").to_owned();
        (repo, id, summary["bytes_stored"].as_u64().expect("bytes_stored"))
    };
    let (raw_repo, raw_id, raw) = stored(Some("0"));
    let (_, _, default) = stored(None);
    let (_, _, fast) = stored(Some("-3"));
    assert!(raw > 4 << 20, "level 0 stores every byte: {raw}");
    assert!(default * 20 < raw, "the default level compresses text: {default} of {raw}");
    assert!(fast < raw / 4, "a fast level still compresses: {fast} of {raw}");

    let restored = dir.path().join("restored.img");
    ok(&ferry(&["restore", "--repo", &raw_repo, &raw_id, restored.to_str().expect("path")]));
    assert!(std::fs::read(&restored).expect("read") == text);

    let repo = format!("file://{}", dir.path().join("repo-bad").display());
    fails_with(&ferry(&["backup", "--repo", &repo, "--compression", "20", img]), "20");
}
