//! Committed repository fixtures (`tests/fixtures/repos/`, written by
//! `cargo run -p ferry-repo --example broken_fixtures`): a good repository written by an
//! earlier build must stay readable bit for bit, and each broken copy must make `ferry` fail
//! with one line naming the damaged object, never restore wrong data, never mention internals.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::ok;

mod common;

const PASSWORD: &str = "ferry-fixture-password";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/repos")
}

/// A fixture copied into a temporary directory, so nothing a command writes lands in the tree.
struct Case {
    dir: tempfile::TempDir,
    name: &'static str,
}

impl Case {
    fn new(name: &'static str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new("cp")
            .arg("-a")
            .arg(fixtures().join(name))
            .arg(dir.path().join(name))
            .status()
            .expect("run cp");
        assert!(status.success(), "copying fixture {name}");
        Self { dir, name }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join(self.name)
    }

    fn url(&self) -> String {
        format!("file://{}", self.root().join("repo").display())
    }

    fn snapshot(&self, which: &str) -> String {
        let path = self.root().join(format!("{which}-snapshot"));
        std::fs::read_to_string(path).expect("snapshot id file").trim().to_owned()
    }

    fn ferry(&self, args: &[&str]) -> Output {
        let url = self.url();
        let mut full: Vec<&str> = vec![args[0], "--repo", &url];
        full.extend(&args[1..]);
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(&full)
            .env_remove("FERRY_REPO")
            .env("FERRY_PASSWORD", PASSWORD)
            .output()
            .expect("run ferry")
    }

    /// The repository file that differs from the good fixture's (`data/ab/ab..`).
    fn damaged_key(&self) -> String {
        let good = fixtures().join("good/repo");
        let repo = self.root().join("repo");
        files(&good)
            .into_iter()
            .find(|rel| std::fs::read(good.join(rel)).ok() != std::fs::read(repo.join(rel)).ok())
            .map(|rel| rel.display().to_string())
            .expect("a file differs from the good fixture")
    }

    /// Restores both snapshots: each either fails naming `key`, or gives exactly the source.
    /// Returns how many failed.
    fn restores_fail_naming(&self, key: &str) -> usize {
        // The broken copies' sources are the good fixture's.
        let own = self.root();
        let good = if own.join("source").exists() { own } else { fixtures().join("good") };
        let mut failed = 0;
        let tree_out = self.dir.path().join("tree-out");
        let out = self.ferry(&["restore", &self.snapshot("tree"), path(&tree_out)]);
        if out.status.success() {
            assert_same_source(&good.join("source"), &tree_out);
        } else {
            assert_names(&out, key);
            failed += 1;
        }
        let image_out = self.dir.path().join("volume-out.img");
        let out = self.ferry(&["restore", &self.snapshot("volume"), path(&image_out)]);
        if out.status.success() {
            assert!(read(&image_out) == read(&good.join("volume.img")), "wrong volume data");
        } else {
            assert_names(&out, key);
            failed += 1;
        }
        failed
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Relative paths of the regular files under `root`.
fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let entry = entry.expect("entry");
            if entry.file_type().expect("file type").is_dir() {
                stack.push(entry.path());
            } else {
                out.push(entry.path().strip_prefix(root).expect("prefix").to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// The command failed with exactly one error line, naming `what`, with no cause repeated and
/// no Rust internals in it.
fn assert_names(out: &Output, what: &str) -> String {
    assert!(!out.status.success(), "ferry succeeded on a broken repository");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("ferry: error: ")).collect();
    assert_eq!(errors.len(), 1, "one error line expected: {stderr}");
    let line = errors[0];
    assert!(line.contains(what), "{what:?} not named in: {line}");
    assert!(line.matches(what).count() <= 2, "repeated cause: {line}");
    assert!(!line.contains("Store {") && !line.contains("Fs("), "internals shown: {line}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    format!("{stdout}{line}")
}

/// `check` failed, and its report (stdout) names `what`.
fn assert_check_names(out: &Output, what: &str) {
    let report = assert_names(out, "problem(s)");
    assert!(report.lines().any(|l| l.starts_with("problem: ") && l.contains(what)), "{report}");
}

fn assert_same_source(expected: &Path, restored: &Path) {
    for rel in ["hello.txt", "dir/text.txt", "empty"] {
        assert!(read(&expected.join(rel)) == read(&restored.join(rel)), "{rel} differs");
    }
    let link = std::fs::read_link(restored.join("dir/link")).expect("symlink restored");
    assert_eq!(link, Path::new("../hello.txt"));
}

#[test]
fn good_repository_from_an_earlier_build_reads_back_bit_for_bit() {
    reads_back_bit_for_bit_and_cuts_as_it_did(Case::new("good"));
}

#[test]
fn good_format_2_repository_reads_back_bit_for_bit() {
    let case = Case::new("good-v2");
    let config = std::fs::read(case.root().join("repo/config")).expect("config");
    assert_eq!(config[0], 2, "the fixture is a format 2 repository");
    reads_back_bit_for_bit_and_cuts_as_it_did(case);
}

#[test]
fn good_format_3_repository_reads_back_bit_for_bit() {
    let case = Case::new("good-v3");
    let config = std::fs::read(case.root().join("repo/config")).expect("config");
    assert_eq!(config[0], 3, "the fixture is a format 3 repository");
    reads_back_bit_for_bit_and_cuts_as_it_did(case);
}

/// The format 1 fixture moved by `ferry repo migrate`: the new repository is format 3, opens
/// with the same password, lists the same snapshot ids, checks clean reading every byte and
/// restores both exactly; the old one is left byte for byte as it was; a second run copies
/// nothing.
#[test]
fn good_format_1_repository_migrates_to_format_3() {
    let case = Case::new("good");
    let old = case.root().join("repo");
    let before: Vec<_> = files(&old).into_iter().map(|f| (read(&old.join(&f)), f)).collect();
    let to = case.root().join("repo-v3");
    let migrate = || {
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["repo", "migrate", "--repo", &case.url(), "--json", "--to"])
            .arg(format!("file://{}", to.display()))
            .env_remove("FERRY_REPO")
            .env("FERRY_PASSWORD", PASSWORD)
            .output()
            .expect("run ferry")
    };
    let report: serde_json::Value = serde_json::from_str(ok(&migrate()).trim()).expect("JSON");
    assert_eq!((report["format"].as_u64(), report["snapshots"].as_u64()), (Some(3), Some(2)));
    assert_eq!(report["resumed"], false, "{report}");
    let after: Vec<_> = files(&old).into_iter().map(|f| (read(&old.join(&f)), f)).collect();
    assert!(before == after, "the old repository changed");
    let again: serde_json::Value = serde_json::from_str(ok(&migrate()).trim()).expect("JSON");
    assert_eq!((again["resumed"].as_bool(), again["blobs_copied"].as_u64()), (Some(true), Some(0)));

    // The new repository in the old one's place, for the checks that name it.
    std::fs::rename(&old, case.root().join("repo-v1")).expect("rename");
    std::fs::rename(&to, &old).expect("rename");
    assert_eq!(read(&old.join("config"))[0], 3, "a format 3 repository");
    let list: serde_json::Value =
        serde_json::from_str(&ok(&case.ferry(&["snapshots", "--json"]))).expect("JSON");
    let list = list.as_array().expect("list");
    let mut ids: Vec<String> =
        list.iter().map(|s| s["id"].as_str().expect("id").to_owned()).collect();
    ids.sort();
    let mut expected = vec![case.snapshot("tree"), case.snapshot("volume")];
    expected.sort();
    assert_eq!(ids, expected, "the same snapshot ids");
    let check = ok(&case.ferry(&["check", "--read-data"]));
    assert!(check.contains("no problems found"), "{check}");
    assert_eq!(case.restores_fail_naming("nothing"), 0);
}

/// Both snapshots listed, `check --read-data` clean, both restored exactly; and the source
/// backed up again stores no new data: this build cuts it where the fixture's build did.
fn reads_back_bit_for_bit_and_cuts_as_it_did(case: Case) {
    let list: serde_json::Value =
        serde_json::from_str(&ok(&case.ferry(&["snapshots", "--json"]))).expect("JSON");
    let list = list.as_array().expect("list");
    assert_eq!(list.len(), 2, "{list:?}");
    for (which, kind) in [("tree", "tree"), ("volume", "volume")] {
        let id = case.snapshot(which);
        let entry = list.iter().find(|s| s["id"] == id.as_str()).expect("snapshot listed");
        assert_eq!(entry["kind"], kind);
        assert_eq!(entry["tags"]["kind"], which, "{entry}");
    }
    let check = ok(&case.ferry(&["check", "--read-data"]));
    assert!(check.contains("no problems found"), "{check}");
    assert_eq!(case.restores_fail_naming("nothing"), 0);
    let source = case.root().join("source");
    let again: serde_json::Value =
        serde_json::from_str(ok(&case.ferry(&["backup", path(&source), "--json"])).trim())
            .expect("JSON");
    assert!(again["bytes_total"].as_u64() > Some(250_000), "{again}");
    assert_eq!(again["bytes_new"], 0, "chunks cut elsewhere than the fixture's: {again}");
}

#[test]
fn flipped_pack_byte_fails_restore_and_read_data_check_naming_the_pack() {
    let case = Case::new("pack-flipped");
    let key = case.damaged_key();
    assert!(key.starts_with("data/"), "{key}");
    // The structure is intact: only reading the data finds it.
    ok(&case.ferry(&["check"]));
    assert_check_names(&case.ferry(&["check", "--read-data"]), &key);
    assert!(case.restores_fail_naming(&key) >= 1, "no restore read the damaged pack");
}

#[test]
fn truncated_pack_is_found_by_check_and_fails_restore() {
    let case = Case::new("pack-truncated");
    let key = case.damaged_key();
    let pack_id = key.rsplit('/').next().expect("id");
    assert_check_names(&case.ferry(&["check"]), pack_id);
    assert!(case.restores_fail_naming(pack_id) >= 1);
}

#[test]
fn missing_pack_is_found_by_check_and_fails_restore() {
    let case = Case::new("pack-missing");
    let good = fixtures().join("good/repo");
    let gone = files(&good)
        .into_iter()
        .find(|rel| !case.root().join("repo").join(rel).exists())
        .expect("a pack is gone");
    let pack_id = gone.file_name().and_then(|n| n.to_str()).expect("id").to_owned();
    assert_check_names(
        &case.ferry(&["check"]),
        &format!("{pack_id} named by the index is missing"),
    );
    assert!(case.restores_fail_naming(&pack_id) >= 1);
}

#[test]
fn flipped_index_byte_is_named_by_check_and_restore() {
    let case = Case::new("index-flipped");
    let key = case.damaged_key();
    assert!(key.starts_with("index/"), "{key}");
    assert_check_names(&case.ferry(&["check"]), &key);
    assert!(case.restores_fail_naming(&key) >= 1);
}

#[test]
fn a_damaged_snapshot_is_named_and_hides_no_other() {
    let case = Case::new("snapshot-flipped");
    let tree_key = format!("snapshots/{}", case.snapshot("tree"));
    let out = case.ferry(&["snapshots", "--json"]);
    assert_names(&out, "could not be read");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("warning: snapshot {tree_key} is damaged")), "{stderr}");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON list");
    let ids: Vec<&str> =
        list.as_array().expect("list").iter().filter_map(|s| s["id"].as_str()).collect();
    assert_eq!(ids, [case.snapshot("volume").as_str()], "the readable snapshot is listed");
    assert_check_names(&case.ferry(&["check"]), &tree_key);
    assert_eq!(case.restores_fail_naming(&tree_key), 1, "only the damaged one fails");
}

#[test]
fn damaged_key_file_refuses_to_open_as_a_wrong_password() {
    let case = Case::new("keyfile-flipped");
    for args in
        [&["snapshots"][..], &["check"], &["restore", &case.snapshot("tree"), "/nonexistent"]]
    {
        assert_names(&case.ferry(args), "wrong password");
    }
}

#[test]
fn missing_config_says_there_is_no_repository_and_where() {
    let case = Case::new("config-missing");
    let line = assert_names(&case.ferry(&["snapshots"]), "no repository found");
    assert!(line.contains(path(&case.root().join("repo"))), "{line}");
    assert_names(&case.ferry(&["check"]), "no repository found");
}

#[test]
fn gc_over_a_lost_index_stops_says_why_and_deletes_nothing() {
    let case = Case::new("good");
    let repo = case.root().join("repo");
    let index = repo.join("index");
    std::fs::remove_dir_all(&index).expect("remove the index");
    std::fs::create_dir(&index).expect("empty index folder");
    let data_before: Vec<_> = files(&repo.join("data"));
    assert!(!data_before.is_empty());

    let out = case.ferry(&["gc"]);
    let line = assert_names(&out, "gc stopped and deleted nothing");
    assert!(line.contains("missing from the index") && line.contains("ferry check"), "{line}");
    assert_eq!(files(&repo.join("data")), data_before, "no pack deleted");
}

#[test]
fn gc_says_which_lease_no_running_ferry_wrote_and_is_not_held_up_by_it() {
    let case = Case::new("good");
    let locks = case.root().join("repo/locks");
    std::fs::create_dir_all(&locks).expect("locks folder");
    let name = format!("{}-{:020}", "cd".repeat(16), 99_999_999_999u64);
    std::fs::write(locks.join(&name), "forged").expect("a forged lease");
    let text = ok(&case.ferry(&["gc"]));
    assert!(text.contains(&format!("gc: ignored lease locks/{name}")), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(ok(&case.ferry(&["gc", "--json"])).trim()).expect("JSON");
    assert_eq!(json["ignored_leases"][0], format!("locks/{name}"), "{json}");
    assert_eq!(json["waiting_for_writers"], 0, "held up by the forged lease: {json}");
}
