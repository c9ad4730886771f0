//! End to end on three real nodes on one host: three kubelets, each with its own containerd and
//! CSI hostpath driver (node-local volumes and snapshots: the provisioner and snapshotter run
//! per node), the controllers (with the node-lifecycle controller), Ferry installed from its
//! chart (one agent per node) and S3 (moto). What one node cannot show: the object lock among
//! agents on different nodes, DataUploads spread over nodes moving where their data lives,
//! and a node lost while it holds a DataUpload.
//!
//! The cluster is started once for this test binary; if it cannot start, every test fails
//! with the reason.

use std::sync::OnceLock;

use ferry_testbed::realnode::RealCluster;

mod lost_node;
#[allow(dead_code)] // Shared with the one-node suite, which uses more of it.
#[path = "../realnode/node.rs"]
mod node;
#[path = "../support/spans.rs"]
mod spans;
mod spread;
mod support;
#[path = "../support/velero_crs.rs"]
mod velero_crs;

/// How many nodes.
pub const NODES: usize = 3;

/// The agents' options here: progress written every second; a holding pod may stay
/// unschedulable for five minutes (the lost-node test keeps one so while it stops a node).
const VALUES: &[&str] = &["agent.extraArgs={--progress-interval,1s,--unschedulable-grace,5m}"];

/// The three-node cluster with Ferry installed, started on first use.
///
/// # Panics
/// If the cluster, S3 or Ferry's installation fails; the message says why.
pub fn cluster() -> &'static node::Node {
    static CLUSTER: OnceLock<Result<RealCluster, String>> = OnceLock::new();
    static NODE: OnceLock<Result<node::Node, String>> = OnceLock::new();
    let set_up = NODE.get_or_init(|| {
        ferry_testbed::process::run_on_own_thread(|| async {
            let started = CLUSTER.get_or_init(|| {
                ferry_testbed::process::run_on_own_thread(|| RealCluster::start_nodes(NODES))
            });
            let cluster = started.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
            node::set_up_on(cluster, ferry_testbed::S3Server::shared(), VALUES).await
        })
    });
    match set_up {
        Ok(n) => n,
        Err(e) => panic!("three real nodes unavailable: {e}"),
    }
}

/// One test, in order: the spread needs all three nodes, and losing one is for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_uploads_and_survive_losing_one() -> node::TestResult {
    let setup = cluster();
    spread::thirty_uploads_each_move_once_where_their_data_is(setup).await.map_err(|e| {
        format!("thirty uploads over three nodes: {e}\n{}", support::agent_logs(setup.cluster))
    })?;
    lost_node::a_lost_node_s_upload_is_taken_over(setup).await.map_err(|e| {
        format!("a node lost while it holds an upload: {e}\n{}", support::agent_logs(setup.cluster))
    })?;
    Ok(())
}
