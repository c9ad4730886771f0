//! Backup reads extended attributes with `listxattrat`/`getxattrat` where the kernel has them.
//! Container runtimes' default seccomp profiles refuse system calls they do not know, with
//! ENOSYS or with EPERM: backup must then read xattrs the other way, not record every entry
//! as unreadable. `ferry backup` runs here under such a filter (libseccomp through Python's
//! ctypes, both on the test machines).

mod common;

use std::process::Command;

use common::ok;

/// Installs a filter answering `getxattrat` (464) and `listxattrat` (465) with errno `argv[1]`,
/// then runs `argv[2:]`.
const UNDER_FILTER: &str = r#"
import ctypes, os, sys
lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
lib.seccomp_init.restype = ctypes.c_void_p
ctx = lib.seccomp_init(ctypes.c_uint32(0x7FFF0000))  # SCMP_ACT_ALLOW
if not ctx:
    sys.exit("seccomp_init failed")
errno = int(sys.argv[1])
for nr in (464, 465):
    rc = lib.seccomp_rule_add(ctypes.c_void_p(ctx), ctypes.c_uint32(0x00050000 | errno), nr, 0)
    if rc != 0:
        sys.exit(f"seccomp_rule_add {nr}: {rc}")
if lib.seccomp_load(ctypes.c_void_p(ctx)) != 0:
    sys.exit("seccomp_load failed")
os.execv(sys.argv[2], sys.argv[2:])
"#;

/// Sets (`set PATH`) or prints (`get PATH`) the attribute `user.ferry`.
const XATTR: &str = r#"
import os, sys
if sys.argv[1] == "set":
    os.setxattr(sys.argv[2], "user.ferry", b"kept")
else:
    sys.stdout.buffer.write(os.getxattr(sys.argv[2], "user.ferry"))
"#;

fn python(script: &str, args: &[&str]) -> std::process::Output {
    Command::new("python3").args(["-c", script]).args(args).output().expect("run python3")
}

#[test]
fn xattrs_are_read_when_a_seccomp_filter_refuses_the_new_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).expect("mkdir");
    for file in [src.join("a"), src.join("sub/b")] {
        std::fs::write(&file, b"data").expect("write");
        let set = python(XATTR, &["set", file.to_str().expect("utf-8")]);
        assert!(set.status.success(), "set xattr: {set:?}");
    }
    let repo = format!("file://{}", dir.path().join("repo").display());
    ok(&common::ferry(&["repo", "init", "--repo", &repo]));
    for (errno, what) in [(1, "EPERM"), (38, "ENOSYS")] {
        let errno = errno.to_string();
        let filter = ["python3", "-c", UNDER_FILTER, &errno];
        let args = ["backup", "--repo", &repo, "--json", src.to_str().expect("utf-8")];
        let backup = common::ferry_through(&filter, &args).output().expect("run ferry filtered");
        let json: serde_json::Value =
            serde_json::from_str(ok(&backup).trim()).expect("backup summary");
        assert_eq!(json["errors"], 0, "{what}: {}", String::from_utf8_lossy(&backup.stderr));
        let id = json["snapshot_id"].as_str().expect("snapshot id");
        let out = dir.path().join(format!("out-{what}"));
        ok(&common::ferry(&["restore", "--repo", &repo, id, out.to_str().expect("utf-8")]));
        for file in [out.join("a"), out.join("sub/b")] {
            let get = python(XATTR, &["get", file.to_str().expect("utf-8")]);
            assert_eq!(get.stdout, b"kept", "{what}: {}: {get:?}", file.display());
        }
    }
}
