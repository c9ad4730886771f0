//! Changed-block tracking against the real service: the hostpath driver's SnapshotMetadata
//! service behind the real csi-snapshot-metadata sidecar (TLS, TokenReview, SubjectAccessReview),
//! asked by `ferry cbt` from inside the node with tokens of Ferry's own agent account, whose
//! rights come from Ferry's chart.

use std::process::Command;

use serde_json::Value;

use crate::node::{self, TestResult};

pub const MIB: u64 = 1 << 20;
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

/// Runs `ferry cbt bases ARGS` from the host as the cluster's admin: its standard output, or
/// the error text.
pub fn bases(args: &[&str]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["cbt", "bases"])
        .args(args)
        .env("KUBECONFIG", node::node().cluster.kubeconfig())
        .output()
        .map_err(|e| format!("running ferry cbt bases {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ferry cbt bases {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| e.to_string())
}

/// Releases, as it is dropped, every base snapshot kept of PVCs in its namespace (with `ferry
/// cbt bases release --namespace`), so a test that stops half-way leaves none behind for the
/// tests after it. A release that fails fails a test that had passed.
#[must_use = "the bases are released when this is dropped"]
pub struct ReleaseBases(pub String);

impl Drop for ReleaseBases {
    fn drop(&mut self) {
        if let Err(e) = bases(&["release", "--namespace", &self.0]) {
            if std::thread::panicking() {
                eprintln!("releasing the kept bases of {}: {e}", self.0);
            } else {
                panic!("releasing the kept bases of {}: {e}", self.0);
            }
        }
    }
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
    // Not while a test redirects the driver's service object (cbt_wrong).
    let _agent = node::AGENT.read().await;
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
    let read =
        node::number_after(message, "read ").ok_or_else(|| format!("no count in {message:?}"))?;
    // Whole chunks (256 KiB) around each range: at most one more at each end.
    assert!(
        (allocated..=allocated + 4 * 256 * 1024).contains(&read),
        "read {read} bytes for {allocated} allocated: {message}"
    );
    assert_eq!(status.progress.total_bytes, i64::try_from(256 * MIB)?, "{status:?}");
    let events = node::agent_events_after(&client, &node::name_of(&du), "Completed").await?;
    assert_eq!(events.get("Completed"), Some(&1), "{events:?}");

    // The snapshot records the CSI snapshot it was read from (the base of a later delta).
    let listed = node.ferry(&ns, &["snapshots", "--json"]).await?;
    assert!(listed.contains(ferry_mover::CSI_SNAPSHOT_HANDLE_TAG), "{listed}");
    node.ferry(&ns, &["check", "--read-data"]).await?;

    let target_ns = node.namespace("cbt-restored").await?;
    let dd = node::data_download(&client, &target_ns, "disk", "256Mi", "Block", &du, "cbt-restore")
        .await?;
    node::wait_download(&client, &node::name_of(&dd)).await?;
    let restored = node::device_md5(&client, &target_ns, "disk").await?;
    assert_eq!(restored, written, "the restored device differs from the written one");
    node::delete_pvc(&client, &target_ns, "disk").await?;
    node::delete_pvc(&client, &ns, "disk").await?;
    Ok(())
}

/// The backup VolumeSnapshotContent of DataUpload `name`, once `done` accepts it (`None`: it
/// is gone); fails with what was last seen after [`node::WAIT`].
pub async fn content_when(
    client: &kube::Client,
    name: &str,
    what: &str,
    done: impl Fn(Option<&ferry_api::VolumeSnapshotContent>) -> bool,
) -> Result<Option<ferry_api::VolumeSnapshotContent>, Box<dyn std::error::Error>> {
    let contents: kube::Api<ferry_api::VolumeSnapshotContent> = kube::Api::all(client.clone());
    let deadline = std::time::Instant::now() + node::WAIT;
    loop {
        let content = contents.get_opt(name).await?;
        if done(content.as_ref()) {
            return Ok(content);
        }
        if std::time::Instant::now() > deadline {
            return Err(
                format!("content {name} not {what} after {:?}: {content:?}", node::WAIT).into()
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// A block PVC `ns/disk` of `size` whose backups keep their physical snapshot as the next
/// delta's base (the PVC's [`ferry_expose::KEEP_BASE_ANNOTATION`] set to `true`).
pub async fn kept_block_pvc(client: &kube::Client, ns: &str, size: &str) -> TestResult {
    node::create_pvc(client, ns, "disk", size, "Block").await?;
    keep_base(client, ns, "disk").await
}

/// Sets PVC `ns/pvc`'s [`ferry_expose::KEEP_BASE_ANNOTATION`] to `true`.
pub async fn keep_base(client: &kube::Client, ns: &str, pvc: &str) -> TestResult {
    use kube::api::{Patch, PatchParams};
    let keep = serde_json::json!({
        "metadata": { "annotations": { ferry_expose::KEEP_BASE_ANNOTATION: "true" } }
    });
    kube::Api::<ferry_api::k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        client.clone(),
        ns,
    )
    .patch(pvc, &PatchParams::default(), &Patch::Merge(&keep))
    .await?;
    Ok(())
}

/// Deletes DataUpload `du`, as Velero does when it deletes the backup, and waits until the
/// agent has released the base snapshot the backup kept.
pub async fn release_base(client: &kube::Client, du: &ferry_api::DataUpload) -> TestResult {
    let name = node::name_of(du);
    kube::Api::<ferry_api::DataUpload>::namespaced(client.clone(), ferry_testbed::VELERO_NAMESPACE)
        .delete(&name, &kube::api::DeleteParams::default())
        .await?;
    content_when(client, &name, "released", |c| c.is_none()).await?;
    Ok(())
}

/// Whether `content` is kept as a delta base: labelled, `Retain`, its VolumeSnapshot gone.
pub fn is_kept(content: Option<&ferry_api::VolumeSnapshotContent>) -> bool {
    use kube::ResourceExt;
    content.is_some_and(|c| {
        c.labels().get(ferry_expose::KEPT_BASE_LABEL).map(String::as_str) == Some("true")
            && c.spec.deletion_policy == "Retain"
    })
}

/// Snapshots `ns/disk`, backs it up as `backup` and waits for Completed.
pub async fn back_up(
    client: &kube::Client,
    ns: &str,
    backup: &str,
) -> Result<ferry_api::DataUpload, Box<dyn std::error::Error>> {
    let snapshot = node::snapshot(client, ns, "disk").await?;
    let du = node::data_upload(client, ns, "disk", &snapshot, backup).await?;
    node::wait_upload(client, &node::name_of(&du)).await
}

/// Restores `du` into a new namespace's block PVC `disk` of `size`; that namespace and the
/// restored device's MD5 (the PVC is left for the caller).
pub async fn restore_block(
    node: &node::Node,
    client: &kube::Client,
    du: &ferry_api::DataUpload,
    size: &str,
) -> Result<(String, String), Box<dyn std::error::Error>> {
    let target_ns = node.namespace("cbt-restored").await?;
    let dd =
        node::data_download(client, &target_ns, "disk", size, "Block", du, "cbt-restore").await?;
    node::wait_download(client, &node::name_of(&dd)).await?;
    let md5 = node::device_md5(client, &target_ns, "disk").await?;
    Ok((target_ns, md5))
}

/// Restores `du` into a new namespace's 128 MiB block PVC; the restored device's MD5.
pub async fn restored_md5(
    node: &node::Node,
    client: &kube::Client,
    du: &ferry_api::DataUpload,
) -> Result<String, Box<dyn std::error::Error>> {
    let (target_ns, md5) = restore_block(node, client, du, "128Mi").await?;
    node::delete_pvc(client, &target_ns, "disk").await?;
    Ok(md5)
}

/// Writes `script` (a shell script on `/dev/volume`) to `ns/disk`; the device's MD5 after.
pub async fn write(
    client: &kube::Client,
    ns: &str,
    script: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let script =
        format!("set -e\n{script}\nmd5sum < /dev/volume | cut -d' ' -f1 > /dev/termination-log");
    node::run_pod(client, ns, "disk", true, &script).await
}

/// With the PVC's `ferry.io/keep-base-snapshot: "true"`, each completed block backup keeps its
/// physical snapshot (content `Retain`, labelled) and the next backup reads only the blocks
/// the driver says changed since it (a delta), taking the rest from the parent; the older base
/// is released (its physical snapshot deleted: the driver no longer knows the handle). A base
/// gone by hand falls back to the allocated ranges, saying why; a deleted DataUpload's base is
/// released. Every restore is bit for bit.
#[tokio::test]
async fn incrementals_read_only_what_changed_since_the_kept_base_snapshot() -> TestResult {
    use kube::api::{Api, Patch, PatchParams};

    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("cbt-delta").await?;
    let _bases = ReleaseBases(ns.clone());
    node::create_pvc(&client, &ns, "disk", "128Mi", "Block").await?;
    let pvcs: Api<ferry_api::k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &ns);
    let annotate = |value: &str| {
        Patch::Merge(serde_json::json!({
            "metadata": { "annotations": { ferry_expose::KEEP_BASE_ANNOTATION: value } }
        }))
    };
    // A typo is refused with a message, not taken as either answer.
    pvcs.patch("disk", &PatchParams::default(), &annotate("yes")).await?;
    write(
        &client,
        &ns,
        "dd if=/dev/urandom of=/dev/volume bs=1M count=8 seek=16 conv=fsync 2>/dev/null",
    )
    .await?;
    let snapshot = node::snapshot(&client, &ns, "disk").await?;
    let du = node::data_upload(&client, &ns, "disk", &snapshot, "cbt-typo").await?;
    let failed =
        node::wait_upload(&client, &node::name_of(&du)).await.expect_err("a typo was taken");
    assert!(failed.to_string().contains(ferry_expose::KEEP_BASE_ANNOTATION), "{failed}");

    pvcs.patch("disk", &PatchParams::default(), &annotate("true")).await?;
    let first = back_up(&client, &ns, "cbt-delta-1").await?;
    let message = &first.status.clone().unwrap_or_default().message;
    assert!(
        message.contains("allocated ranges"),
        "a first backup reads the allocated ranges: {message}"
    );
    let first_name = node::name_of(&first);
    let kept = content_when(&client, &first_name, "kept", is_kept).await?;
    let first_handle = kept
        .and_then(|c| c.status?.snapshot_handle)
        .ok_or("the kept content has no snapshot handle")?;
    // An operator sees it, with its source PVC and the DataUpload that kept it.
    let seen: Value = serde_json::from_str(&bases(&["list", "--namespace", &ns, "--json"])?)?;
    let seen = seen["bases"].as_array().ok_or("no list of bases")?;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["content"], first_name.as_str());
    assert_eq!(seen[0]["state"], "kept");
    assert_eq!(seen[0]["source"], format!("{ns}/disk"));
    assert_eq!(seen[0]["dataUpload"], format!("{}/{first_name}", ferry_testbed::VELERO_NAMESPACE));
    assert_eq!(seen[0]["snapshotHandle"], first_handle.as_str());
    let listed = node.ferry(&ns, &["snapshots", "--json"]).await?;
    assert!(listed.contains(ferry_mover::CSI_SNAPSHOT_KEPT_TAG), "{listed}");
    assert!(listed.contains(ferry_mover::CSI_SOURCE_VOLUME_TAG), "{listed}");

    // 1 MiB at 64 MiB, and 4 KiB inside the first range.
    let changed = MIB + 4096;
    let written = write(
        &client,
        &ns,
        "dd if=/dev/urandom of=/dev/volume bs=1M count=1 seek=64 conv=fsync 2>/dev/null
dd if=/dev/urandom of=/dev/volume bs=4k count=1 seek=4101 conv=fsync 2>/dev/null",
    )
    .await?;
    let second = back_up(&client, &ns, "cbt-delta-2").await?;
    let message = second.status.clone().unwrap_or_default().message;
    assert!(
        message.contains(&format!("changed since the parent's snapshot ({changed} bytes)")),
        "the incremental did not read by the driver's delta: {message}"
    );
    let read =
        node::number_after(&message, "read ").ok_or_else(|| format!("no count in {message:?}"))?;
    // Whole chunks around the changes, and the sample of unchanged chunks read to check them.
    let check = ferry_repo::default_delta_check(128 * MIB, ferry_repo::DEFAULT_VOLUME_CHUNK);
    assert!(
        (changed + check..=changed + check + 4 * 256 * 1024).contains(&read),
        "read {read} bytes for {changed} changed and {check} checked: {message}"
    );
    // The older base is released: its content and its physical snapshot are gone.
    content_when(&client, &first_name, "released", |c| c.is_none()).await?;
    let second_name = node::name_of(&second);
    let kept = content_when(&client, &second_name, "kept", is_kept).await?;
    let second_handle = kept
        .and_then(|c| c.status?.snapshot_handle)
        .ok_or("the kept content has no snapshot handle")?;
    let probe = node::snapshot(&client, &ns, "disk").await?;
    let gone = cbt(&["delta", "-n", &ns, &probe, "--base-handle", &first_handle], AGENT_ACCOUNT)
        .expect_err("the released base snapshot is still known to the driver");
    assert!(gone.contains("NotFound"), "{gone}");
    cbt(&["delta", "-n", &ns, &probe, "--base-handle", &second_handle], AGENT_ACCOUNT)?;
    node.ferry(&ns, &["check", "--read-data"]).await?;
    assert_eq!(restored_md5(node, &client, &second).await?, written, "delta restore differs");

    // The base released by hand: the next backup falls back to the allocated ranges, and says so.
    // A name that is not a kept base is refused, and nothing is released with it.
    let refused = bases(&["release", &second_name, &first_name])
        .expect_err("a content that is no kept base was taken");
    assert!(refused.contains(&first_name) && refused.contains("nothing released"), "{refused}");
    let still = content_when(&client, &second_name, "still kept", |c| c.is_some()).await?;
    let untouched = still.as_ref().is_some_and(|c| {
        c.metadata.deletion_timestamp.is_none() && c.spec.deletion_policy == "Retain"
    });
    assert!(is_kept(still.as_ref()) && untouched, "released with a typo: {still:?}");
    assert_eq!(bases(&["release", &second_name])?.trim(), format!("released {second_name}"));
    content_when(&client, &second_name, "released", |c| c.is_none()).await?;
    let written = write(
        &client,
        &ns,
        "dd if=/dev/urandom of=/dev/volume bs=64k count=1 seek=100 conv=fsync 2>/dev/null",
    )
    .await?;
    let third = back_up(&client, &ns, "cbt-delta-3").await?;
    let message = third.status.clone().unwrap_or_default().message;
    assert!(
        message.contains("allocated ranges")
            && message.contains("no delta from the parent's snapshot"),
        "the fallback is not told: {message}"
    );
    assert_eq!(restored_md5(node, &client, &third).await?, written, "fallback restore differs");
    node.ferry(&ns, &["check", "--read-data"]).await?;

    // The DataUpload deleted (its backup deleted): the agent releases its base.
    content_when(&client, &node::name_of(&third), "kept", is_kept).await?;
    release_base(&client, &third).await?;
    cbt(&["delta", "-n", &ns, &probe, "--base-handle", &second_handle], AGENT_ACCOUNT)
        .expect_err("the base released by hand is still known to the driver");
    node::delete_pvc(&client, &ns, "disk").await?;
    Ok(())
}
