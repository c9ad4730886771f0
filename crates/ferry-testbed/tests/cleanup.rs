//! Services started by the testbed never outlive the process that started them, however it
//! ends: a clean stop, or SIGKILL.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Up {
    child: Child,
    pids: Vec<u32>,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

fn up() -> Up {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry-testbed"))
        .args(["up", "--s3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start ferry-testbed");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
    let info: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    let pids = info["pids"]
        .as_array()
        .expect("pids")
        .iter()
        .map(|p| u32::try_from(p.as_u64().expect("pid")).expect("pid fits"))
        .collect();
    let path = |k: &str| PathBuf::from(info[k].as_str().expect(k));
    Up { pids, dir: path("dir"), kubeconfig: path("kubeconfig"), child }
}

fn alive(pid: u32) -> bool {
    // A zombie is dead for our purposes; /proc/PID/stat's third field is the state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

fn wait_gone(up: &Up) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if up.pids.iter().all(|p| !alive(*p)) && !up.dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<_> = up.pids.iter().filter(|p| alive(**p)).collect();
    panic!("left behind: pids {left:?}, dir exists: {}", up.dir.exists());
}

#[test]
fn services_run_while_up_and_vanish_on_sigkill() {
    let mut up = up();
    assert_eq!(up.pids.len(), 3, "etcd, kube-apiserver and moto");
    assert!(up.pids.iter().all(|p| alive(*p)));
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&up.kubeconfig)
        .args(["get", "crd", "datauploads.velero.io", "-o", "name"])
        .output()
        .expect("kubectl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "customresourcedefinition.apiextensions.k8s.io/datauploads.velero.io"
    );
    up.child.kill().expect("SIGKILL");
    up.child.wait().expect("reap");
    wait_gone(&up);
}

#[test]
fn services_vanish_on_clean_stop() {
    let mut up = up();
    drop(up.child.stdin.take().map(|mut s| s.flush()));
    let status = up.child.wait().expect("wait");
    assert!(status.success());
    wait_gone(&up);
}
