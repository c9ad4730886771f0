//! Changed-block tracking against the real service: the hostpath driver's SnapshotMetadata
//! service behind the real csi-snapshot-metadata sidecar (TLS, TokenReview, SubjectAccessReview),
//! asked by `ferry cbt` from inside the node with tokens of Ferry's own agent account, whose
//! rights come from Ferry's chart.

use std::process::Command;

use serde_json::Value;

use crate::node::{self, TestResult};

const MIB: u64 = 1 << 20;
/// Ferry's agent account, as its chart installs it (in Velero's namespace).
const AGENT_ACCOUNT: &str = "velero/ferry-agent";

/// Runs `ferry cbt ARGS --json` inside the first node (where the sidecar's address is), as the
/// cluster's admin asking tokens of `account`; the JSON answer, or the error text.
fn cbt(args: &[&str], account: &str) -> Result<Value, String> {
    let cluster = node::node().cluster;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.arg("cbt")
        .args(args)
        .args(["--json", "--service-account", account])
        .env("KUBECONFIG", cluster.nodes()[0].kubeconfig())
        .env("FERRY_LOG", "info");
    let out = cluster.nodes()[0].output_inside(cmd).map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn ranges(answer: &Value) -> Vec<(u64, u64)> {
    answer["ranges"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|r| (r["offset"].as_u64().unwrap_or(0), r["length"].as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn the_drivers_service_reports_allocated_and_changed_blocks_to_the_agents_account()
-> TestResult {
    let node = node::node();
    let client = node.client()?;
    let ns = node.namespace("cbt").await?;
    node::create_pvc(&client, &ns, "data", "64Mi", "Block").await?;
    // Random data (no 4 KiB block of it is zero): 4 MiB at 2 MiB, and 12 KiB at 20000 KiB.
    node::run_pod(
        &client,
        &ns,
        "data",
        true,
        "set -e
dd if=/dev/urandom of=/dev/volume bs=1M count=4 seek=2 conv=fsync 2>/dev/null
dd if=/dev/urandom of=/dev/volume bs=4k count=3 seek=5000 conv=fsync 2>/dev/null",
    )
    .await?;
    let first = node::snapshot(&client, &ns, "data").await?;
    // Then 8 KiB at 40 MiB, and one block inside the first write.
    node::run_pod(
        &client,
        &ns,
        "data",
        true,
        "set -e
dd if=/dev/urandom of=/dev/volume bs=4k count=2 seek=10240 conv=fsync 2>/dev/null
dd if=/dev/urandom of=/dev/volume bs=4k count=1 seek=600 conv=fsync 2>/dev/null",
    )
    .await?;
    let second = node::snapshot(&client, &ns, "data").await?;

    let allocated = cbt(&["allocated", "-n", &ns, &first], AGENT_ACCOUNT)?;
    assert_eq!(allocated["driver"], ferry_testbed::realnode::DRIVER);
    assert_eq!(allocated["capacityBytes"].as_u64(), Some(64 * MIB));
    assert_eq!(
        ranges(&allocated),
        [(2 * MIB, 4 * MIB), (5000 * 4096, 3 * 4096)],
        "the allocated ranges of the first snapshot: {allocated}"
    );

    let delta = cbt(&["delta", "-n", &ns, &second, "--base", &first], AGENT_ACCOUNT)?;
    assert_eq!(
        ranges(&delta),
        [(600 * 4096, 4096), (40 * MIB, 2 * 4096)],
        "the blocks changed since the first snapshot: {delta}"
    );
    assert!(delta["baseSnapshotHandle"].as_str().is_some_and(|h| !h.is_empty()), "{delta}");

    // An account that may not read the snapshot is refused by the sidecar's access review.
    let refused = cbt(&["allocated", "-n", &ns, &first], &format!("{ns}/default"))
        .expect_err("an account without access to the VolumeSnapshot read its metadata");
    assert!(refused.contains("PermissionDenied"), "{refused}");
    // A base the driver does not know.
    let unknown =
        cbt(&["delta", "-n", &ns, &second, "--base-handle", "no-such-snapshot"], AGENT_ACCOUNT)
            .expect_err("a delta from an unknown base succeeded");
    assert!(unknown.contains("NotFound") || unknown.contains("InvalidArgument"), "{unknown}");
    Ok(())
}
