//! The `ferry` command line end to end: a repository on a real S3 server (moto) and on a
//! file system, driven exactly as a user would, checking output formats and exit codes.

use std::path::Path;
use std::process::{Command, Output};

use common::ok;
use ferry_testbed::S3Server;

mod common;

fn ferry(envs: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = common::ferry_command(args);
    cmd.env("AWS_ACCESS_KEY_ID", "ferry-test")
        .env("AWS_SECRET_ACCESS_KEY", "ferry-test-secret")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run ferry")
}

fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("sub/deeper")).expect("mkdir");
    std::fs::write(root.join("a.txt"), b"hello ferry\n").expect("write");
    std::fs::write(
        root.join("sub/big.bin"),
        (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>(),
    )
    .expect("write");
    std::fs::write(root.join("sub/deeper/empty"), b"").expect("write");
    std::os::unix::fs::symlink("../a.txt", root.join("sub/link")).expect("symlink");
}

/// A new file repository `repo` and the tree of `make_tree` at `src`, both under `dir`.
fn repo_and_tree(dir: &Path) -> (String, std::path::PathBuf) {
    let repo = format!("file://{}", dir.join("repo").display());
    let src = dir.join("src");
    make_tree(&src);
    ok(&ferry(&[], &["repo", "init", "--repo", &repo]));
    (repo, src)
}

fn assert_same_tree(a: &Path, b: &Path) {
    let out =
        Command::new("diff").args(["-r", "--no-dereference"]).arg(a).arg(b).output().expect("diff");
    assert!(out.status.success(), "trees differ: {}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn backup_restore_snapshots_check_on_s3() {
    let s3 = S3Server::shared();
    s3.create_bucket("cli-s3").expect("bucket");
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    make_tree(&src);
    let xdg = dir.path().join("xdg");
    let env = [
        ("FERRY_S3_ENDPOINT", s3.endpoint()),
        ("FERRY_S3_REGION", "us-east-1"),
        ("XDG_CACHE_HOME", xdg.to_str().expect("path")),
    ];
    let repo = "s3://cli-s3/ferry/ns";

    let init = ok(&ferry(&env, &["repo", "init", "--repo", repo]));
    assert!(init.contains("created repository"), "{init}");
    // A second init (another node racing, or a rerun) opens the existing repository.
    let again = ok(&ferry(&env, &["repo", "init", "--repo", repo]));
    assert!(again.contains("already exists"), "{again}");

    let json = ok(&ferry(
        &env,
        &["backup", "--repo", repo, "--json", "--tag", "pvc=data-0", src.to_str().expect("path")],
    ));
    let summary: serde_json::Value =
        serde_json::from_str(json.trim()).expect("backup --json is JSON");
    let id = summary["snapshot_id"].as_str().expect("snapshot_id").to_owned();
    assert_eq!(summary["files"], 3, "regular files: {summary}");
    assert!(summary["bytes_total"].as_u64().expect("bytes_total") >= 3_000_012);
    assert!(summary["duration_s"].is_number());

    // Plain output: the snapshot ID is the last line of stdout.
    let second =
        ok(&ferry(&env, &["backup", "--repo", repo, "--parent", &id, src.to_str().expect("path")]));
    let second_id = second.lines().last().expect("a line").to_owned();
    assert_eq!(second_id.len(), 64, "{second}");

    let list: serde_json::Value =
        serde_json::from_str(&ok(&ferry(&env, &["snapshots", "--repo", repo, "--json"])))
            .expect("JSON");
    let list = list.as_array().expect("a list");
    assert_eq!(list.len(), 2);
    let newest =
        list.iter().find(|s| s["id"] == second_id.as_str()).expect("second snapshot listed");
    assert_eq!(newest["parent"], id.as_str());
    assert_eq!(newest["tags"], serde_json::json!({}));
    let first = list.iter().find(|s| s["id"] == id.as_str()).expect("first listed");
    assert_eq!(first["tags"]["pvc"], "data-0");
    assert!(first["bytes"].as_u64().is_some() && first["time"].is_string());

    let target = dir.path().join("restored");
    ok(&ferry(
        &env,
        &["restore", "--repo", repo, "--sparse", &second_id[..12], target.to_str().expect("path")],
    ));
    assert_same_tree(&src, &target);

    let check = ok(&ferry(&env, &["check", "--repo", repo, "--read-data"]));
    assert!(check.contains("no problems found"), "{check}");

    // S3 repositories get a local cache in the user's cache folder, one folder per repository.
    let repos: Vec<_> = std::fs::read_dir(xdg.join("ferry/repos"))
        .expect("cache folder")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(repos.len(), 1, "{repos:?}");
    assert!(repos[0].join("index").read_dir().expect("cached index files").next().is_some());
}

/// Environment, arguments, and a text the one-line error must contain.
type FailureCase<'a> = (&'a [(&'a str, &'a str)], Vec<&'a str>, &'a str);

#[test]
fn failures_exit_non_zero_with_a_one_line_cause() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = format!("file://{}", dir.path().join("repo").display());
    ok(&ferry(&[], &["repo", "init", "--repo", &repo]));
    let never = dir.path().join("never");
    let never_arg = never.to_str().expect("utf-8");

    let cases: [FailureCase<'_>; 4] = [
        (&[("FERRY_PASSWORD", "wrong")], vec!["snapshots", "--repo", &repo], "wrong password"),
        (&[], vec!["snapshots", "--repo", "file:///nonexistent/ferry-repo"], "does not exist"),
        (&[], vec!["restore", "--repo", &repo, "deadbeef", never_arg], "deadbeef"),
        (
            &[("FERRY_S3_ENDPOINT", "http://127.0.0.1:9"), ("FERRY_S3_REGION", "us-east-1")],
            vec!["snapshots", "--repo", "s3://nobucket/x"],
            "127.0.0.1:9",
        ),
    ];
    for (env, args, expected) in cases {
        let out = ferry(env, &args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<_> = stderr.lines().filter(|l| l.starts_with("ferry: error:")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(lines[0].contains(expected), "{args:?}: expected {expected:?} in {stderr}");
    }
    assert!(!never.exists(), "a failed restore must not create its target");
}

fn dir_bytes(p: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(p).expect("read_dir") {
        let e = e.expect("entry");
        let m = e.metadata().expect("metadata");
        total += if m.is_dir() { dir_bytes(&e.path()) } else { m.len() };
    }
    total
}

#[test]
fn forget_and_gc_reclaim_space_with_clear_output_and_exit_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("repo");
    let repo = format!("file://{}", root.display());
    ok(&ferry(&[], &["repo", "init", "--repo", &repo]));
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    make_tree(&one);
    // Incompressible content only the forgotten snapshot holds.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..2_500_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(one.join("noise.bin"), noise).expect("write");
    std::fs::create_dir_all(&two).expect("mkdir");
    std::fs::write(
        two.join("other.bin"),
        (0..2_000_000u32).map(|i| (i * 13 % 241) as u8).collect::<Vec<_>>(),
    )
    .expect("write");
    let backup = |src: &Path| {
        let out = ok(&ferry(&[], &["backup", "--repo", &repo, src.to_str().expect("path")]));
        out.lines().last().expect("snapshot id").to_owned()
    };
    let (id1, id2) = (backup(&one), backup(&two));

    // Unknown snapshot: nothing is deleted, one-line cause, exit status 1.
    let bad = ferry(&[], &["forget", "--repo", &repo, &id1[..8], "deadbeef"]);
    assert_eq!(bad.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("ferry: error:") && stderr.contains("deadbeef"), "{stderr}");
    // Usage errors are clap's (status 2).
    assert_eq!(ferry(&[], &["forget", "--repo", &repo]).status.code(), Some(2));
    assert_eq!(
        ferry(&[], &["gc", "--repo", &repo, "--repack-fraction", "2"]).status.code(),
        Some(2)
    );

    let forgotten: serde_json::Value = serde_json::from_str(&ok(&ferry(
        &[],
        &["forget", "--repo", &repo, "--json", &id1[..12], &id1],
    )))
    .expect("forget --json is JSON");
    assert_eq!(forgotten, serde_json::json!({ "forgotten": [id1] }));

    let before = dir_bytes(&root);
    let report: serde_json::Value =
        serde_json::from_str(&ok(&ferry(&[], &["gc", "--repo", &repo, "--json"])))
            .expect("gc --json is JSON");
    assert_eq!(report["state"], "done", "{report}");
    assert_eq!(report["snapshots"], 1, "{report}");
    let deleted = report["deleted_bytes"].as_u64().expect("deleted_bytes");
    assert!(deleted >= 2_000_000, "{report}");
    assert!(before - dir_bytes(&root) >= deleted, "space actually returned");

    let list: serde_json::Value =
        serde_json::from_str(&ok(&ferry(&[], &["snapshots", "--repo", &repo, "--json"])))
            .expect("JSON");
    assert_eq!(list.as_array().map(Vec::len), Some(1));
    assert_eq!(list[0]["id"], id2.as_str());
    let check = ok(&ferry(&[], &["check", "--repo", &repo, "--read-data"]));
    assert!(check.contains("no problems found"), "{check}");
    let target = dir.path().join("restored");
    ok(&ferry(&[], &["restore", "--repo", &repo, &id2, target.to_str().expect("path")]));
    assert_same_tree(&two, &target);

    let again = ok(&ferry(&[], &["gc", "--repo", &repo]));
    assert!(again.contains("deleted 0 packs"), "{again}");
}

/// Files under `dir` whose path contains `part`.
fn files_with(dir: &Path, part: &str) -> Vec<std::path::PathBuf> {
    let out = Command::new("find").arg(dir).args(["-type", "f"]).output().expect("find");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(part))
        .map(std::path::PathBuf::from)
        .collect()
}

#[test]
fn the_cache_serves_verified_copies_may_be_deleted_and_is_never_used_by_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    make_tree(&src);
    let store = dir.path().join("repo");
    let repo = format!("file://{}", store.display());
    let cache = dir.path().join("cache");
    let cache_arg = cache.to_str().expect("path");
    ok(&ferry(&[], &["repo", "init", "--repo", &repo]));
    let id = ok(&ferry(
        &[],
        &["backup", "--repo", &repo, "--cache-dir", cache_arg, src.to_str().expect("path")],
    ));
    let id = id.lines().last().expect("snapshot id").to_owned();
    // The backup kept copies of what it wrote before it exited.
    assert_eq!(files_with(&cache, "/index/").len(), 1);
    assert_eq!(files_with(&cache, "/snapshots/").len(), 1);
    assert_eq!(files_with(&cache, "/trees/").len(), 1);

    // Damage the repository's index file: check (which never uses the cache) reports it even
    // when given one, a restore through the cache still restores exactly (the cached copy is
    // the original, verified by its hash), and without the cache the restore refuses.
    let index = files_with(&store, "/index/");
    assert_eq!(index.len(), 1);
    let mut bytes = std::fs::read(&index[0]).expect("read index");
    bytes[40] ^= 1;
    std::fs::write(&index[0], bytes).expect("write index");
    let check = ferry(&[], &["check", "--repo", &repo, "--cache-dir", cache_arg]);
    assert!(!check.status.success());
    assert!(String::from_utf8_lossy(&check.stdout).contains("problem: index"), "{check:?}");
    let target = dir.path().join("restored");
    let t = target.to_str().expect("path");
    ok(&ferry(&[], &["restore", "--repo", &repo, "--cache-dir", cache_arg, &id, t]));
    assert_same_tree(&src, &target);
    let refused = ferry(
        &[],
        &["restore", "--repo", &repo, &id, dir.path().join("r2").to_str().expect("path")],
    );
    assert!(!refused.status.success(), "restore without the cache read the damaged index");

    // Deleted cache: the next command reads the store (here refused, the index is damaged),
    // and with a sound repository fills the cache again.
    std::fs::remove_dir_all(&cache).expect("delete cache");
    let cold = ferry(&[], &["snapshots", "--repo", &repo, "--cache-dir", cache_arg]);
    assert!(cold.status.success(), "listing needs no index: {cold:?}");
    assert!(files_with(&cache, "/snapshots/").len() == 1, "cache filled again");
    // --no-cache wins over a cache folder from the environment.
    let unused = dir.path().join("unused");
    let env = [("FERRY_CACHE_DIR", unused.to_str().expect("path"))];
    ok(&ferry(&env, &["snapshots", "--repo", &repo, "--no-cache"]));
    assert!(!unused.exists());
}

fn key_list(password: &str, repo: &str) -> Vec<serde_json::Value> {
    let out = ok(&ferry(
        &[("FERRY_PASSWORD", password)],
        &["repo", "key", "list", "--repo", repo, "--json"],
    ));
    serde_json::from_str(&out).expect("key list JSON")
}

fn current_key(keys: &[serde_json::Value]) -> String {
    let current: Vec<_> = keys.iter().filter(|k| k["current"] == true).collect();
    assert_eq!(current.len(), 1, "{keys:?}");
    current[0]["id"].as_str().expect("id").to_owned()
}

#[test]
fn passwords_are_added_removed_and_changed_without_touching_the_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = format!("file://{}", dir.path().join("repo").display());
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    make_tree(&src);
    ok(&ferry(&[("FERRY_PASSWORD", "alpha-password-16")], &["repo", "init", "--repo", &repo]));
    let backup = ok(&ferry(
        &[("FERRY_PASSWORD", "alpha-password-16")],
        &["backup", "--repo", &repo, src.to_str().expect("utf-8")],
    ));
    let snapshot = backup.lines().last().expect("snapshot id").to_owned();

    // A second password.
    let added = ok(&ferry(
        &[("FERRY_PASSWORD", "alpha-password-16"), ("FERRY_NEW_PASSWORD", "beta")],
        &["repo", "key", "add", "--repo", &repo],
    ));
    let beta_key = added.trim().to_owned();
    let keys = key_list("alpha-password-16", &repo);
    assert_eq!(keys.len(), 2, "{keys:?}");
    let alpha_key = current_key(&keys);
    assert_ne!(alpha_key, beta_key);
    assert_eq!(current_key(&key_list("beta", &repo)), beta_key);
    for k in &keys {
        assert_eq!(k["kdf"]["algorithm"], "argon2id", "{k}");
        assert!(k["created"].as_str().is_some_and(|t| t.ends_with('Z')), "{k}");
    }
    let table = ok(&ferry(
        &[("FERRY_PASSWORD", "alpha-password-16")],
        &["repo", "key", "list", "--repo", &repo],
    ));
    assert!(table.lines().any(|l| l.starts_with(&format!("* {}", &alpha_key[..16]))), "{table}");

    // Refusals: the key of the password in use, an unknown key, a too-short prefix.
    for (id, expected) in [
        (&alpha_key[..8], "change the password instead"),
        ("00000000", "no such key"),
        ("ab", "4 hex"),
    ] {
        let out = ferry(
            &[("FERRY_PASSWORD", "alpha-password-16")],
            &["repo", "key", "remove", "--repo", &repo, id],
        );
        assert!(!out.status.success(), "removing {id} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "removing {id}: {stderr}");
    }
    assert_eq!(key_list("alpha-password-16", &repo).len(), 2);

    // Opened with beta, alpha's key goes (by prefix); alpha no longer opens the repository.
    let removed = ok(&ferry(
        &[("FERRY_PASSWORD", "beta")],
        &["repo", "key", "remove", "--repo", &repo, &alpha_key[..10]],
    ));
    assert!(removed.contains(&alpha_key), "{removed}");
    let out = ferry(&[("FERRY_PASSWORD", "alpha-password-16")], &["snapshots", "--repo", &repo]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrong password"), "{out:?}");
    let out = ferry(
        &[("FERRY_PASSWORD", "beta")],
        &["repo", "key", "remove", "--repo", &repo, &beta_key],
    );
    assert!(!out.status.success(), "the last key was removed");

    // passwd: same password refused; beta becomes gamma; the data restores with gamma.
    let out = ferry(
        &[("FERRY_PASSWORD", "beta"), ("FERRY_NEW_PASSWORD", "beta")],
        &["repo", "passwd", "--repo", &repo],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("same as the current"), "{out:?}");
    let out = ferry(&[("FERRY_PASSWORD", "beta")], &["repo", "passwd", "--repo", &repo]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("FERRY_NEW_PASSWORD"), "{out:?}");
    let new_file = dir.path().join("new-password");
    std::fs::write(&new_file, "gamma\n").expect("write password file");
    let changed = ok(&ferry(
        &[("FERRY_PASSWORD", "beta")],
        &[
            "repo",
            "passwd",
            "--repo",
            &repo,
            "--new-password-file",
            new_file.to_str().expect("utf-8"),
        ],
    ));
    assert!(changed.contains(&beta_key), "{changed}");
    let out = ferry(&[("FERRY_PASSWORD", "beta")], &["snapshots", "--repo", &repo]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrong password"), "{out:?}");
    let keys = key_list("gamma", &repo);
    assert_eq!(keys.len(), 1, "{keys:?}");
    ok(&ferry(
        &[("FERRY_PASSWORD", "gamma")],
        &["restore", "--repo", &repo, &snapshot, dst.to_str().expect("utf-8")],
    ));
    assert_same_tree(&src, &dst);
    ok(&ferry(&[("FERRY_PASSWORD", "gamma")], &["check", "--repo", &repo, "--read-data"]));
}

#[test]
fn ls_lists_a_snapshot_and_restore_path_takes_part_of_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, src) = repo_and_tree(dir.path());
    let backup = ok(&ferry(&[], &["backup", "--repo", &repo, src.to_str().expect("utf-8")]));
    let id = backup.lines().last().expect("snapshot id").to_owned();

    let top = ok(&ferry(&[], &["ls", "--repo", &repo, &id[..12]]));
    let paths: Vec<&str> = top.lines().filter_map(|l| l.split_whitespace().nth(5)).collect();
    assert_eq!(paths, ["/a.txt", "/sub"], "{top}");
    assert!(top.lines().next().is_some_and(|l| l.starts_with("-rw")), "{top}");

    let all = ok(&ferry(&[], &["ls", "--repo", &repo, "--recursive", "--json", &id]));
    let entries: Vec<serde_json::Value> =
        all.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    let paths: Vec<&str> = entries.iter().filter_map(|e| e["path"].as_str()).collect();
    assert_eq!(
        paths,
        ["/a.txt", "/sub", "/sub/big.bin", "/sub/deeper", "/sub/deeper/empty", "/sub/link"]
    );
    assert_eq!(entries[2]["size"], 3_000_000);
    assert_eq!(entries[2]["type"], "file");
    assert_eq!(entries[5]["target"], "../a.txt");
    let one = ok(&ferry(&[], &["ls", "--repo", &repo, "--json", &id, "sub/link"]));
    assert_eq!(one.lines().count(), 1, "{one}");
    let out = ferry(&[], &["ls", "--repo", &repo, &id, "sub/missing"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("/sub/missing is not in the snapshot"));

    // A directory's content, then one file beside what is already there.
    let part = dir.path().join("part");
    ok(&ferry(
        &[],
        &["restore", "--repo", &repo, "--path", "/sub", &id, part.to_str().expect("utf-8")],
    ));
    let diff = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(src.join("sub"))
        .arg(&part)
        .output()
        .expect("diff");
    assert!(diff.status.success(), "{}", String::from_utf8_lossy(&diff.stdout));
    ok(&ferry(
        &[],
        &["restore", "--repo", &repo, "--path", "a.txt", &id, part.to_str().expect("utf-8")],
    ));
    assert_eq!(std::fs::read(part.join("a.txt")).expect("restored file"), b"hello ferry\n");
    assert!(part.join("big.bin").exists(), "restoring one file removed its neighbours");
    let never = dir.path().join("never");
    let never_arg = never.to_str().expect("utf-8");
    let out = ferry(&[], &["restore", "--repo", &repo, "--path", "../etc", &id, never_arg]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("`..`"), "{out:?}");
    assert!(!never.exists());
}

#[test]
fn latest_names_the_newest_snapshot_and_parent_latest_the_newest_of_the_same_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = format!("file://{}", dir.path().join("repo").display());
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    make_tree(&a);
    std::fs::create_dir(&b).expect("mkdir");
    std::fs::write(b.join("other.txt"), b"another source\n").expect("write");
    let (a_arg, b_arg) = (a.to_str().expect("utf-8"), b.to_str().expect("utf-8"));
    ok(&ferry(&[], &["repo", "init", "--repo", &repo]));
    let never = dir.path().join("never");
    let out = ferry(&[], &["restore", "--repo", &repo, "latest", never.to_str().expect("utf-8")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no snapshots yet"), "{out:?}");

    let backup = |path: &str| {
        let out = ferry(&[], &["backup", "--repo", &repo, "--parent", "latest", path]);
        let stdout = ok(&out);
        let id = stdout.lines().last().expect("snapshot id").to_owned();
        (id, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (first_a, said) = backup(a_arg);
    assert!(said.contains("no earlier snapshot of"), "{said}");
    let (first_b, _) = backup(b_arg);
    // The same path backed up by another host is not a parent: its files are other files.
    ok(&ferry(&[], &["backup", "--repo", &repo, "--host", "elsewhere", a_arg]));
    let (second_a, said) = backup(a_arg);
    assert!(said.contains(&format!("parent is {} ({a_arg} on ", &first_a[..16])), "{said}");
    let listed: Vec<serde_json::Value> =
        serde_json::from_str(&ok(&ferry(&[], &["snapshots", "--repo", &repo, "--json"])))
            .expect("JSON");
    let parent_of = |id: &str| {
        listed.iter().find(|s| s["id"] == id).map(|s| s["parent"].clone()).expect("listed")
    };
    assert_eq!(parent_of(&first_b), serde_json::Value::Null, "b has no earlier snapshot");
    assert_eq!(
        parent_of(&second_a),
        first_a.as_str(),
        "the newest of the same path and host, not b's or the other host's"
    );

    let top = ferry(&[], &["ls", "--repo", &repo, "latest"]);
    assert!(String::from_utf8_lossy(&top.stderr).contains(&second_a[..16]), "{top:?}");
    let top = ok(&top);
    assert!(top.contains("/sub"), "latest is a's second snapshot: {top}");
    let out = dir.path().join("out");
    ok(&ferry(&[], &["restore", "--repo", &repo, "latest", out.to_str().expect("utf-8")]));
    assert_same_tree(&a, &out);
}

#[test]
fn check_reads_a_subset_of_the_data_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, src) = repo_and_tree(dir.path());
    ok(&ferry(&[], &["backup", "--repo", &repo, src.to_str().expect("utf-8")]));
    let packs = |out: &str| -> u64 {
        let (_, tail) = out.split_once(" packs (").expect("packs read");
        tail.split_whitespace().next().expect("count").parse().expect("number")
    };
    let whole = ok(&ferry(&[], &["check", "--repo", &repo, "--read-data"]));
    let halves: u64 = ["1/2", "2/2"]
        .iter()
        .map(|part| {
            let out = ok(&ferry(&[], &["check", "--repo", &repo, "--read-data-subset", part]));
            assert!(out.contains("of the subset"), "{out}");
            packs(&out)
        })
        .sum();
    assert_eq!(halves, packs(&whole), "{whole}");
    let tiny = ok(&ferry(&[], &["check", "--repo", &repo, "--read-data-subset", "0.01%"]));
    assert_eq!(packs(&tiny), 1, "a share rounds up to at least one pack: {tiny}");
    let out = ferry(&[], &["check", "--repo", &repo, "--read-data-subset", "3/2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("N must be between 1 and M"), "{out:?}");
}

#[test]
fn forget_by_policy_keeps_per_source_shows_a_dry_run_and_leaves_velero_snapshots_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = format!("file://{}", dir.path().join("repo").display());
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    make_tree(&a);
    std::fs::create_dir(&b).expect("mkdir");
    let (a_arg, b_arg) = (a.to_str().expect("utf-8"), b.to_str().expect("utf-8"));
    ok(&ferry(&[], &["repo", "init", "--repo", &repo]));
    let backup = |args: &[&str]| {
        let mut all = vec!["backup", "--repo", &repo];
        all.extend_from_slice(args);
        ok(&ferry(&[], &all)).lines().last().expect("snapshot id").to_owned()
    };
    let a_ids: Vec<String> = (0..4).map(|_| backup(&[a_arg])).collect();
    let b_id = backup(&[b_arg]);
    let velero = backup(&["--tag", "ferry.io/data-upload=du-1", a_arg]);
    let listed = || -> Vec<String> {
        let out = ok(&ferry(&[], &["snapshots", "--repo", &repo, "--json"]));
        let list: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
        list.iter().map(|s| s["id"].as_str().expect("id").to_owned()).collect()
    };
    assert_eq!(listed().len(), 6);

    let refused = ferry(&[], &["forget", "--repo", &repo]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("or give a policy"), "{refused:?}");
    let both = ferry(&[], &["forget", "--repo", &repo, "--keep-last", "1", &b_id]);
    assert!(String::from_utf8_lossy(&both.stderr).contains("not both"), "{both:?}");
    let bad = ferry(&[], &["forget", "--repo", &repo, "--keep-within", "soon"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a span"), "{bad:?}");
    let ambiguous = ferry(&[], &["forget", "--repo", &repo, "--keep-within", "6m"]);
    assert_eq!(ambiguous.status.code(), Some(2), "{ambiguous:?}");
    assert!(String::from_utf8_lossy(&ambiguous.stderr).contains("`mo` for months"));
    let within = ok(&ferry(&[], &["forget", "--repo", &repo, "--keep-within", "6mo", "--dry-run"]));
    assert!(within.contains("within 6mo of its group's newest"), "{within}");

    let dry = ok(&ferry(&[], &["forget", "--repo", &repo, "--keep-last", "2", "--dry-run"]));
    assert!(dry.contains(&format!("{a_arg} on ")), "{dry}");
    assert!(dry.contains("keeping 2 of 4 snapshots") && dry.contains("keeping 1 of 1"), "{dry}");
    assert!(dry.contains("1 snapshots of Velero DataUploads left alone"), "{dry}");
    assert_eq!(listed().len(), 6, "a dry run forgets nothing");

    let out = ok(&ferry(&[], &["forget", "--repo", &repo, "--keep-last", "2", "--json"]));
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let forgotten: Vec<&str> =
        json["forgotten"].as_array().expect("list").iter().filter_map(|v| v.as_str()).collect();
    let mut expected = vec![a_ids[0].as_str(), a_ids[1].as_str()];
    expected.sort_unstable();
    let mut got = forgotten.clone();
    got.sort_unstable();
    assert_eq!(got, expected, "the two oldest of a");
    assert_eq!(json["kept"].as_array().expect("kept").len(), 3);
    let mut left = listed();
    left.sort();
    let mut want = vec![a_ids[2].clone(), a_ids[3].clone(), b_id, velero];
    want.sort();
    assert_eq!(left, want);
}

#[test]
fn backup_excludes_patterns_from_flags_and_a_file_and_refuses_bad_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = format!("file://{}", dir.path().join("repo").display());
    let src = dir.path().join("src");
    make_tree(&src);
    std::fs::write(src.join("sub/deeper/skip.tmp"), b"scratch").expect("write");
    let patterns = dir.path().join("excludes");
    std::fs::write(&patterns, "# scratch files\n\n*.tmp\n").expect("write");
    let (src_arg, patterns_arg) = (src.to_str().expect("utf-8"), patterns.to_str().expect("utf-8"));
    ok(&ferry(&[], &["repo", "init", "--repo", &repo]));
    let out = ok(&ferry(
        &[],
        &[
            "backup",
            "--repo",
            &repo,
            "--exclude",
            "/sub/big.bin",
            "--exclude-file",
            patterns_arg,
            src_arg,
        ],
    ));
    let id = out.lines().last().expect("snapshot id").to_owned();
    let listed = ok(&ferry(&[], &["ls", "--repo", &repo, "--recursive", "--json", &id]));
    let paths: Vec<String> = listed
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON line"))
        .filter_map(|e| e["path"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(paths, ["/a.txt", "/sub", "/sub/deeper", "/sub/deeper/empty", "/sub/link"]);

    let canonical = std::fs::canonicalize(&src).expect("canonical source");
    let absolute = format!("{}/sub/big.bin", canonical.display());
    let warned = ferry(&[], &["backup", "--repo", &repo, "--exclude", &absolute, src_arg]);
    ok(&warned);
    let stderr = String::from_utf8_lossy(&warned.stderr);
    assert!(stderr.contains("write \"/sub/big.bin\""), "{stderr}");

    let bad = ferry(&[], &["backup", "--repo", &repo, "--exclude", "{a,b", src_arg]);
    assert_eq!(bad.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("exclude pattern") && stderr.contains("{a,b"), "{stderr}");
    let image = dir.path().join("disk.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).expect("image");
    let image_arg = image.to_str().expect("utf-8");
    let volume = ferry(&[], &["backup", "--repo", &repo, "--volume", "--exclude", "x", image_arg]);
    assert!(String::from_utf8_lossy(&volume.stderr).contains("directories only"), "{volume:?}");
}

#[test]
fn stats_count_snapshots_unique_content_and_the_space_they_take() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, src) = repo_and_tree(dir.path());
    for _ in 0..2 {
        ok(&ferry(&[], &["backup", "--repo", &repo, src.to_str().expect("utf-8")]));
    }
    let out = ok(&ferry(&[], &["stats", "--repo", &repo, "--json"]));
    let stats: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let n = |key: &str| stats[key].as_u64().unwrap_or_else(|| panic!("{key} in {stats}"));
    assert_eq!((n("snapshots"), n("tree_snapshots"), n("volume_snapshots")), (2, 2, 0));
    let content = 12 + 3_000_000; // a.txt and sub/big.bin; the rest is empty or a link
    assert_eq!(n("bytes_backed_up"), 2 * content, "{stats}");
    assert_eq!(n("data_raw_bytes"), content, "stored once: {stats}");
    assert!(n("data_stored_bytes") < content, "big.bin compresses: {stats}");
    assert!(n("tree_blobs") >= 1 && n("packs") >= 2, "{stats}");
    assert!(n("pack_bytes") >= n("data_stored_bytes") + n("tree_stored_bytes"), "{stats}");
    let text = ok(&ferry(&[], &["stats", "--repo", &repo]));
    assert!(text.starts_with("snapshots  2 (2 trees, 0 volumes)"), "{text}");
    assert!(text.contains("smaller than what was backed up"), "{text}");
    assert_eq!(n("format"), 3, "a new repository is format 3: {stats}");
    assert!(text.ends_with("format     3\n"), "{text}");
}

/// A user (not root) restores over an earlier restore of a tree with a read-only directory:
/// the kept directory is made writable while entries go in and read-only again at the end.
/// Runs `ferry` as `nobody`, so the test needs root.
#[test]
fn restoring_again_over_a_read_only_directory_works_for_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    assert!(nix::unistd::geteuid().is_root(), "this test runs ferry as nobody: run it as root");
    let nobody = (nix::unistd::Uid::from_raw(65_534), nix::unistd::Gid::from_raw(65_534));
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("ro")).expect("mkdir");
    std::fs::write(src.join("ro/f.txt"), b"read-only home").expect("write");
    for path in [src.join("ro/f.txt"), src.join("ro"), src.clone()] {
        nix::unistd::chown(&path, Some(nobody.0), Some(nobody.1)).expect("chown");
    }
    std::fs::set_permissions(src.join("ro"), std::fs::Permissions::from_mode(0o555))
        .expect("chmod");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    nix::unistd::chown(&work, Some(nobody.0), Some(nobody.1)).expect("chown");
    let repo = format!("file://{}", work.join("repo").display());
    let as_nobody = |args: &[&str]| {
        let mut cmd = common::ferry_command(args);
        cmd.uid(nobody.0.as_raw()).gid(nobody.1.as_raw()).env("HOME", &work);
        cmd.output().expect("run ferry as nobody")
    };
    ok(&as_nobody(&["repo", "init", "--repo", &repo]));
    let id = ok(&as_nobody(&["backup", "--repo", &repo, src.to_str().expect("utf-8")]));
    let id = id.lines().last().expect("snapshot id").to_owned();
    let out_arg = work.join("out");
    let out_arg = out_arg.to_str().expect("utf-8");
    for round in ["first", "over the first"] {
        let restored = as_nobody(&["restore", "--repo", &repo, &id, out_arg]);
        assert!(restored.status.success(), "{round} restore: {restored:?}");
    }
    let ro = work.join("out/ro");
    assert_eq!(std::fs::read(ro.join("f.txt")).expect("restored"), b"read-only home");
    let mode = std::fs::metadata(&ro).expect("stat").permissions().mode() & 0o7777;
    assert_eq!(mode, 0o555, "the directory's own mode again");
}

/// A tree with more hardlink groups, in more directories, than the open-file limit: restore
/// does not keep a descriptor per group (it failed with "Too many open files").
#[test]
fn restore_links_more_hardlink_groups_than_open_files_allow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("links")).expect("mkdir");
    for i in 0..600 {
        let d = src.join(format!("d{i:03}"));
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(d.join("f"), format!("file {i}")).expect("write");
        std::fs::hard_link(d.join("f"), src.join(format!("links/l{i:03}"))).expect("link");
    }
    let repo = format!("file://{}", dir.path().join("repo").display());
    ok(&common::ferry(&["repo", "init", "--repo", &repo]));
    let id = ok(&common::ferry(&["backup", "--repo", &repo, src.to_str().expect("utf-8")]));
    let id = id.lines().last().expect("snapshot id").to_owned();
    let out = dir.path().join("out");
    let low_limit = ["sh", "-c", r#"ulimit -n 256 && exec "$@""#, "sh"];
    let restored = common::ferry_through(
        &low_limit,
        &["restore", "--repo", &repo, &id, out.to_str().expect("utf-8")],
    )
    .output()
    .expect("run ferry with a low open-file limit");
    ok(&restored);
    for i in [0, 299, 599] {
        let link = std::fs::metadata(out.join(format!("links/l{i:03}"))).expect("link");
        let file = std::fs::metadata(out.join(format!("d{i:03}/f"))).expect("file");
        use std::os::unix::fs::MetadataExt;
        assert_eq!((link.ino(), link.nlink()), (file.ino(), 2), "links/l{i:03}");
        let text = std::fs::read_to_string(out.join(format!("links/l{i:03}"))).expect("read");
        assert_eq!(text, format!("file {i}"));
    }
}

/// `RUST_LOG` filters the logs when `FERRY_LOG` is unset, and logs to a pipe (a pod's log, not
/// a terminal) carry no colour codes.
#[test]
fn rust_log_filters_and_piped_logs_have_no_colour_codes() {
    let s3 = S3Server::shared();
    s3.create_bucket("cli-rust-log").expect("bucket");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = common::ferry_command(&["repo", "init", "--repo", "s3://cli-rust-log/ns"])
        .env("AWS_ACCESS_KEY_ID", "ferry-test")
        .env("AWS_SECRET_ACCESS_KEY", "ferry-test-secret")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FERRY_S3_ENDPOINT", s3.endpoint())
        .env("FERRY_S3_REGION", "us-east-1")
        .env("XDG_CACHE_HOME", dir.path())
        .env_remove("FERRY_LOG")
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "debug")
        .output()
        .expect("run ferry");
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.lines().any(|l| l.contains("DEBUG")), "no debug line on stderr:\n{stderr}");
    assert!(!out.stderr.contains(&0x1b), "ANSI escape codes on a pipe:\n{stderr}");
}

/// `ferry repo init` refuses to create a repository with a password under 16 bytes or with
/// Velero's published default; opening an existing one with a short password stays allowed.
#[test]
fn repo_init_refuses_weak_passwords() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = format!("file://{}", dir.path().join("repo").display());
    for (password, says) in [
        ("fifteen-bytes!!", "password of 15 bytes (at least 16)"),
        ("static-passw0rd", "published default"),
    ] {
        let out = ferry(&[("FERRY_PASSWORD", password)], &["repo", "init", "--repo", &repo]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{password:?} accepted");
        assert!(stderr.contains(says) && stderr.contains("openssl rand"), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(!dir.path().join("repo/config").exists(), "nothing created");
    }
    let strong = "sixteen-bytes!!!";
    ok(&ferry(&[("FERRY_PASSWORD", strong)], &["repo", "init", "--repo", &repo]));
    ok(&ferry(
        &[("FERRY_PASSWORD", strong), ("FERRY_NEW_PASSWORD", "short")],
        &["repo", "key", "add", "--repo", &repo],
    ));
    let again = ok(&ferry(&[("FERRY_PASSWORD", "short")], &["repo", "init", "--repo", &repo]));
    assert!(again.contains("already exists"), "{again}");
}

fn files_under(root: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.expect("entry").path();
            if path.is_dir() { dirs.push(path) } else { found.push(path) }
        }
    }
    found
}

/// `ferry repo move`: every object copied (objects an interrupted run already copied are
/// fine), the copy readable at the new place, the old place empty, a rerun harmless, and a
/// destination holding another repository refused before anything is copied or deleted.
#[test]
fn repo_move_moves_a_repository_and_reruns_safely() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (old, src) = repo_and_tree(dir.path());
    let backup = ok(&ferry(&[], &["backup", "--repo", &old, src.to_str().expect("utf-8")]));
    let id = backup.lines().last().expect("snapshot id").to_owned();
    let old_root = dir.path().join("repo");
    let new_root = dir.path().join("bsl/plugins/ferry/ns");
    let new = format!("file://{}", new_root.display());
    // An earlier run copied some objects before it was interrupted.
    for file in files_under(&old_root).iter().filter(|f| !f.ends_with("config")).take(2) {
        let to = new_root.join(file.strip_prefix(&old_root).expect("under root"));
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(file, &to).expect("copy");
    }
    let objects = files_under(&old_root).len();

    let out = ok(&ferry(&[], &["repo", "move", "--repo", &old, "--to", &new]));
    assert!(out.contains(&format!("moved {objects} objects")), "{out}");
    assert_eq!(files_under(&old_root), Vec::<std::path::PathBuf>::new(), "old place empty");
    assert_eq!(files_under(&new_root).len(), objects);
    let listed = ok(&ferry(&[], &["snapshots", "--repo", &new]));
    assert!(listed.contains(&id[..8]), "{listed}");
    let target = dir.path().join("restored");
    ok(&ferry(&[], &["restore", "--repo", &new, &id, target.to_str().expect("utf-8")]));
    assert_same_tree(&src, &target);
    ok(&ferry(&[], &["check", "--repo", &new, "--read-data"]));

    let again = ok(&ferry(&[], &["repo", "move", "--repo", &old, "--to", &new]));
    assert!(again.contains("is empty"), "{again}");
    assert_eq!(files_under(&new_root).len(), objects, "a rerun changes nothing");

    // Another repository at the destination: refused, nothing touched.
    let other = format!("file://{}", dir.path().join("other").display());
    ok(&ferry(&[], &["repo", "init", "--repo", &other]));
    let before = files_under(&new_root).len();
    let refused = ferry(&[], &["repo", "move", "--repo", &new, "--to", &other]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("holds another repository"), "{stderr}");
    assert_eq!(files_under(&new_root).len(), before);
    assert_eq!(files_under(&dir.path().join("other")).len(), 2, "config and one key");
}

/// The command line, the operator's own tool, restores with full fidelity what the agent
/// withholds unless a DataDownload asks: a device node, a set-user-ID file owned by root and a
/// `trusted.*` extended attribute come back as they were. Needs root.
#[test]
fn the_command_line_restores_devices_set_id_bits_and_privileged_xattrs() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    assert!(nix::unistd::geteuid().is_root(), "device nodes and trusted.* need root");
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, src) = repo_and_tree(dir.path());
    let device = nix::sys::stat::makedev(1, 3);
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o644);
    nix::sys::stat::mknod(&src.join("null"), nix::sys::stat::SFlag::S_IFCHR, mode, device)
        .expect("mknod");
    let tool = src.join("tool");
    std::fs::write(&tool, b"#!/bin/sh\n").expect("write");
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o4755)).expect("chmod");
    let set = Command::new("setfattr")
        .args(["-n", "trusted.ferry", "-v", "kept"])
        .arg(&tool)
        .status()
        .expect("setfattr");
    assert!(set.success(), "setting a trusted.* attribute");

    let src_arg = src.to_str().expect("utf-8");
    let backup: serde_json::Value = serde_json::from_str(
        ok(&ferry(&[], &["backup", "--repo", &repo, "--json", src_arg])).trim(),
    )
    .expect("JSON");
    let id = backup["snapshot_id"].as_str().expect("snapshot id").to_owned();
    let target = dir.path().join("restored");
    ok(&ferry(&[], &["restore", "--repo", &repo, &id, target.to_str().expect("utf-8")]));

    let null = std::fs::symlink_metadata(target.join("null")).expect("device restored");
    assert!(null.file_type().is_char_device() && null.rdev() == device, "{null:?}");
    let restored = std::fs::symlink_metadata(target.join("tool")).expect("tool restored");
    assert_eq!((restored.mode() & 0o7777, restored.uid()), (0o4755, 0), "set-user-ID kept");
    let get = Command::new("getfattr")
        .args(["--only-values", "-n", "trusted.ferry"])
        .arg(target.join("tool"))
        .output()
        .expect("getfattr");
    assert_eq!(String::from_utf8_lossy(&get.stdout), "kept", "trusted.* kept: {get:?}");
}

/// A forward HTTP proxy on loopback: every connection is passed on to `target`, and the first
/// request line of each (absolute form, as clients speak to a proxy) is recorded. Serves at
/// most 64 connections, each in a thread of its own.
fn forward_proxy(
    target: std::net::SocketAddr,
) -> (std::net::SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let addr = listener.local_addr().expect("proxy address");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in listener.incoming().take(64) {
            let Ok(client) = conn else { return };
            let log = std::sync::Arc::clone(&log);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(client.try_clone().expect("clone"));
                let mut first = String::new();
                if reader.read_line(&mut first).is_err() {
                    return;
                }
                log.lock().expect("log").push(first.trim_end().to_owned());
                let Ok(mut upstream) = TcpStream::connect(target) else { return };
                let buffered = reader.buffer().to_vec();
                if upstream.write_all(first.as_bytes()).is_err()
                    || upstream.write_all(&buffered).is_err()
                {
                    return;
                }
                let (mut up_read, mut client_write) =
                    (upstream.try_clone().expect("clone"), client.try_clone().expect("clone"));
                let back = std::thread::spawn(move || {
                    let _ = std::io::copy(&mut up_read, &mut client_write);
                    let _ = client_write.shutdown(Shutdown::Write);
                });
                let mut client_read = client;
                let _ = std::io::copy(&mut client_read, &mut upstream);
                let _ = upstream.shutdown(Shutdown::Write);
                let _ = back.join();
            });
        }
    });
    (addr, seen)
}

/// A node that reaches its object store only through a proxy: the proxy the environment names
/// (`HTTP_PROXY` here, for a plain-HTTP endpoint) carries every S3 request.
#[test]
fn s3_requests_go_through_the_proxy_the_environment_names() {
    let s3 = S3Server::shared();
    s3.create_bucket("cli-proxy").expect("bucket");
    let target: std::net::SocketAddr = s3
        .endpoint()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("moto listens on an IP address and port");
    let (proxy, seen) = forward_proxy(target);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd =
        common::ferry_command(&["repo", "init", "--repo", "s3://cli-proxy/ferry/behind-a-proxy"]);
    cmd.env("AWS_ACCESS_KEY_ID", "ferry-test")
        .env("AWS_SECRET_ACCESS_KEY", "ferry-test-secret")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FERRY_S3_ENDPOINT", s3.endpoint())
        .env("FERRY_S3_REGION", "us-east-1")
        .env("XDG_CACHE_HOME", dir.path())
        .env("HTTP_PROXY", format!("http://{proxy}"))
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env_remove("http_proxy");
    let init = ok(&cmd.output().expect("run ferry"));
    assert!(init.contains("created repository"), "{init}");
    let seen = seen.lock().expect("log").clone();
    let through = format!("http://{target}/cli-proxy");
    assert!(
        seen.iter().any(|line| line.contains(&through)),
        "no request for {through} came through the proxy: {seen:?}"
    );
}
