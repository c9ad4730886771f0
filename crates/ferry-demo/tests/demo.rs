//! `make demo` keeps working: the demo program runs the whole story on a small data set, and
//! ends with the restored volume identical to the source and nothing left behind.

use std::path::PathBuf;
use std::process::Command;

/// The `ferry` binary of this build: `cargo test --workspace` builds every binary before any
/// test runs, next to this test's own directory.
fn ferry_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/demo-<hash> -> target/<profile>/ferry
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    profile_dir.join("ferry")
}

#[test]
fn the_demo_backs_up_and_restores_a_volume_through_the_agents() {
    let ferry = ferry_binary();
    assert!(
        ferry.is_file(),
        "{} is missing: build it first (`cargo build -p ferry`; `make test` does)",
        ferry.display()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_ferry-demo"))
        .arg("--ferry")
        .arg(&ferry)
        .args(["--size", "16", "--files", "40"])
        .output()
        .expect("running ferry-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ferry-demo failed: {}\n{stdout}\n{stderr}", out.status);
    for expected in [
        "Completed on node-",
        "identical to the source",
        "no problems found",
        "everything stopped and removed",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in the demo's output:\n{stdout}");
    }
    // Two backups and a restore, the second backup incremental.
    assert_eq!(stdout.matches("Completed on node-").count(), 3, "{stdout}");
}
