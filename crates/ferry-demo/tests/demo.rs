//! `make demo` keeps working: the demo program runs the whole story on a small data set, on
//! the real node and on the simulator, and ends with the restored volume identical to the
//! source and nothing left behind.

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

/// Runs the demo on a small data set with `extra` options; returns its standard output.
fn run_demo(extra: &[&str]) -> String {
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
        .args(extra)
        .output()
        .expect("running ferry-demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ferry-demo failed: {}\n{stdout}\n{stderr}", out.status);
    for expected in
        ["identical to the source", "no problems found", "everything stopped and removed"]
    {
        assert!(stdout.contains(expected), "no {expected:?} in the demo's output:\n{stdout}");
    }
    stdout
}

/// `make demo` as it runs by default: on the real node, with Ferry from its chart and Velero on
/// the node. It must not fall back to the simulator here (`make test` builds the node).
#[test]
fn the_demo_backs_up_and_restores_a_volume_on_the_real_node() {
    let stdout = run_demo(&[]);
    assert!(!stdout.contains("falling back"), "the real node did not start:\n{stdout}");
    assert!(stdout.contains("written by an application pod"), "{stdout}");
    // Two backups and a restore, the second backup incremental.
    assert_eq!(stdout.matches("Completed on ferry-node-0").count(), 3, "{stdout}");
}

/// The fallback where a real node cannot start: three simulated nodes and their agents.
#[test]
fn the_demo_runs_on_the_simulator_when_asked() {
    let stdout = run_demo(&["--sim"]);
    assert_eq!(stdout.matches("Completed on node-").count(), 3, "{stdout}");
}
