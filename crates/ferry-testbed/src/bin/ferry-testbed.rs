//! `ferry-testbed`: starts the test services outside a test, for the demo and for developers.
//!
//! `ferry-testbed up` starts a control plane (and with `--s3` a moto S3 server), prints one
//! JSON line describing them (kubeconfig, API server URL, S3 endpoint, PIDs, temp dir) and
//! keeps them running until its standard input closes or it receives SIGINT/SIGTERM. Killed
//! any other way, its services still die with it and its files are removed.
//!
//! `ferry-testbed node [--nodes N]` does the same with a real cluster of one node, or N
//! (kubelet, containerd, the CSI hostpath driver on each; see `ferry_testbed::realnode`), and
//! prints its kubeconfig and folders.

use std::io::Read;

use ferry_testbed::realnode::RealCluster;
use ferry_testbed::{ControlPlane, S3Server};

fn usage() -> ! {
    eprintln!("usage: ferry-testbed up [--s3] | ferry-testbed node [--nodes N]");
    std::process::exit(2);
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("up") => {}
        Some("node") => {
            return match args.get(1..).unwrap_or_default() {
                [] => node(1),
                [flag, n] if flag == "--nodes" => node(n.parse().unwrap_or_else(|_| usage())),
                _ => usage(),
            };
        }
        _ => usage(),
    }
    let with_s3 = match args.get(1).map(String::as_str) {
        None => false,
        Some("--s3") => true,
        Some(_) => usage(),
    };
    let rt = tokio::runtime::Runtime::new()?;
    let cp = rt.block_on(ControlPlane::start())?;
    ferry_testbed::process::remove_on_exit(cp.dir())?;
    let s3 = if with_s3 { Some(S3Server::start()?) } else { None };
    let info = serde_json::json!({
        "kubeconfig": cp.kubeconfig(),
        "url": cp.url(),
        "dir": cp.dir(),
        "pids": cp.pids().into_iter().chain(s3.as_ref().map(S3Server::pid)).collect::<Vec<_>>(),
        "s3_endpoint": s3.as_ref().map(S3Server::endpoint),
    });
    println!("{info}");
    rt.block_on(until_stopped())?;
    drop(s3);
    drop(cp);
    Ok(())
}

fn node(count: usize) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let cluster = rt.block_on(RealCluster::start_nodes(count))?;
    let info = serde_json::json!({
        "kubeconfig": cluster.kubeconfig(),
        "url": cluster.control_plane().url(),
        "dir": cluster.dir(),
        "node_root": cluster.node_path(std::path::Path::new("/")),
        "nodes": cluster.nodes().iter().map(|n| serde_json::json!({
            "name": n.name(),
            "dir": n.dir(),
            "root": n.node_path(std::path::Path::new("/")),
            "cgroup": n.cgroup(),
        })).collect::<Vec<_>>(),
        "pids": cluster.pids(),
        "cgroup": cluster.cgroup(),
    });
    println!("{info}");
    rt.block_on(until_stopped())?;
    drop(cluster);
    Ok(())
}

/// Returns when standard input closes or SIGINT/SIGTERM arrives.
async fn until_stopped() -> anyhow::Result<()> {
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = stdin_closed => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
