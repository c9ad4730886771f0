//! `ferry agent` serves `/healthz`, `/readyz` and `/metrics`, and stops cleanly on SIGTERM.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};

fn get(port: u16, path: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_serves_health_readiness_and_metrics() -> Result<(), Box<dyn std::error::Error>> {
    ferry_testbed::install_crypto_provider();
    let cp = ControlPlane::shared();
    let port = ferry_testbed::process::free_port()?;
    let kubelet = tempfile::tempdir()?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.args(["agent", "--node-name", "endpoint-node", "--namespace", VELERO_NAMESPACE])
        .args(["--data-mover", &format!("ferry-endpoints-{port}")])
        .arg("--kubelet-root")
        .arg(kubelet.path())
        .args(["--metrics-address", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", cp.kubeconfig())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut agent = ferry_testbed::process::spawn("ferry agent endpoints", cmd)?;
    let start = Instant::now();
    let mut ready = None;
    while start.elapsed() < Duration::from_secs(60) && agent.is_running() {
        if let Some(r) = get(port, "/readyz") {
            ready = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready = ready.ok_or("the agent never served /readyz")?;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let health = get(port, "/healthz").ok_or("no /healthz")?;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = get(port, "/metrics").ok_or("no /metrics")?;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    for name in [
        "ferry_data_upload_success_total",
        "ferry_data_download_failure_total",
        "ferry_data_movement_duration_seconds",
        "ferry_data_movements_in_flight",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
    let missing = get(port, "/nope").ok_or("no answer")?;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    // SIGTERM (what the kubelet sends) stops it with status 0.
    let pid = agent.pid().to_string();
    let term = Command::new("kill").args(["-TERM", &pid]).status()?;
    assert!(term.success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = agent.exit_status() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the agent ignored SIGTERM for 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "the agent stopped on SIGTERM with {status}, not status 0");
    Ok(())
}
