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

    // Nothing written since: the driver ends the stream without a response, an empty answer.
    let third = node::snapshot(&client, &ns, "data").await?;
    let unchanged = cbt(&["delta", "-n", &ns, &third, "--base", &second], AGENT_ACCOUNT)?;
    assert_eq!(ranges(&unchanged), [], "{unchanged}");
    assert_eq!(unchanged["bytes"].as_u64(), Some(0), "{unchanged}");

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

/// The number after `prefix` in `text` (`read 123 bytes` → 123).
fn number_after(text: &str, prefix: &str) -> Option<u64> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[tokio::test]
async fn a_block_backup_reads_only_the_allocated_ranges_and_restores_bit_for_bit() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("cbt-backup").await?;
    node::create_pvc(&client, &ns, "disk", "256Mi", "Block").await?;
    // 4 MiB at 100 MiB and 64 KiB at 200 MiB of random data; the rest never written.
    let written = node::run_pod(
        &client,
        &ns,
        "disk",
        true,
        "set -e
dd if=/dev/urandom of=/dev/volume bs=1M count=4 seek=100 conv=fsync 2>/dev/null
dd if=/dev/urandom of=/dev/volume bs=64k count=1 seek=3200 conv=fsync 2>/dev/null
md5sum < /dev/volume | cut -d' ' -f1 > /dev/termination-log",
    )
    .await?;
    let snapshot = node::snapshot(&client, &ns, "disk").await?;
    let du = node::data_upload(&client, &ns, "disk", &snapshot, "cbt-backup").await?;
    let du = node::wait_upload(&client, &node::name_of(&du)).await?;
    let status = du.status.clone().unwrap_or_default();

    // The message says which path the backup took and what it read.
    let message = &status.message;
    let allocated = 4 * MIB + 64 * 1024;
    assert!(
        message.contains(&format!("allocated ranges ({allocated} bytes)"))
            && message.contains(ferry_testbed::realnode::DRIVER),
        "the backup did not read by the driver's allocated ranges: {message:?}"
    );
    let read = number_after(message, "read ").ok_or_else(|| format!("no count in {message:?}"))?;
    // Whole chunks (256 KiB) around each range: at most one more at each end.
    assert!(
        (allocated..=allocated + 4 * 256 * 1024).contains(&read),
        "read {read} bytes for {allocated} allocated: {message}"
    );
    assert_eq!(status.progress.total_bytes, i64::try_from(256 * MIB)?, "{status:?}");
    let events = node::agent_events(&client, &node::name_of(&du)).await?;
    assert_eq!(events.get("Completed"), Some(&1), "{events:?}");

    // The snapshot records the CSI snapshot it was read from (the base of a later delta).
    let listed = node.ferry(&ns, &["snapshots", "--json"]).await?;
    assert!(listed.contains(ferry_mover::CSI_SNAPSHOT_HANDLE_TAG), "{listed}");
    node.ferry(&ns, &["check", "--read-data"]).await?;

    let target_ns = node.namespace("cbt-restored").await?;
    let dd = node::data_download(&client, &target_ns, "disk", "256Mi", "Block", &du, "cbt-restore")
        .await?;
    node::wait_download(&client, &node::name_of(&dd)).await?;
    let restored = node::run_pod(
        &client,
        &target_ns,
        "disk",
        true,
        "md5sum < /dev/volume | cut -d' ' -f1 > /dev/termination-log",
    )
    .await?;
    assert_eq!(restored, written, "the restored device differs from the written one");
    node::delete_pvc(&client, &target_ns, "disk").await?;
    node::delete_pvc(&client, &ns, "disk").await?;
    Ok(())
}
