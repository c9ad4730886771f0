//! DataUpload -> DataDownload round trips on the real node, for a file-system PVC and a block
//! PVC: the data written by one pod is restored into a new PVC and compared by another.

use crate::node::{self, TestResult, name_of};

/// Lists every entry under /data (lost+found aside) with its kind, mode and, for files, the
/// MD5 of its content; written to the termination message (4 KiB at most: keep trees small).
pub const FS_MANIFEST: &str = r#"cd /data && find . -path ./lost+found -prune -o -print | sort | while read -r p; do
  if [ -L "$p" ]; then echo "L $p -> $(readlink "$p")";
  elif [ -d "$p" ]; then echo "D $p $(stat -c %a "$p")";
  else echo "F $p $(stat -c %a "$p") $(md5sum < "$p" | cut -d' ' -f1)"; fi
done > /dev/termination-log"#;

pub const FS_WRITE: &str = r#"set -e; cd /data; mkdir -p sub/deep empty
for i in $(seq 1 20); do dd if=/dev/urandom of=f$i bs=1k count=$((i * 37)) 2>/dev/null; done
echo hello > sub/deep/h; chmod 600 sub/deep/h; chmod 750 sub
ln -s ../f1 sub/link
ln f2 sub/hard
dd if=/dev/urandom of=sparse bs=4k seek=1024 count=1 2>/dev/null
sync
"#;

/// The sum of the sizes of the volume's regular files, each inode once.
const INODE_BYTES: &str = "cd /data && find . -path ./lost+found -prune -o -type f -print \
  | while read -r p; do stat -c '%i %s' \"$p\"; done | sort -u \
  | awk '{ s += $2 } END { print s }' > /dev/termination-log";

/// Random data at two places of the device; the manifest is the MD5 of the whole device.
pub const BLOCK_WRITE: &str = "set -e
dd if=/dev/urandom of=/dev/volume bs=1M count=4 seek=2 conv=fsync 2>/dev/null
dd if=/dev/urandom of=/dev/volume bs=4k count=3 seek=5000 conv=fsync 2>/dev/null
";
pub const BLOCK_MANIFEST: &str = "md5sum < /dev/volume | cut -d' ' -f1 > /dev/termination-log";

#[tokio::test]
async fn filesystem_pvc_round_trip() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("fs").await?;
    node::create_pvc(&client, &ns, "data", "64Mi", "Filesystem").await?;
    let written =
        node::run_pod(&client, &ns, "data", false, &format!("{FS_WRITE}\n{FS_MANIFEST}")).await?;
    assert!(written.lines().count() > 20, "the writer listed its tree: {written}");
    // The bytes of the tree's regular files, each inode once (f2 is also sub/hard).
    let inode_bytes = node::run_pod(&client, &ns, "data", false, INODE_BYTES).await?;

    let snapshot = node::snapshot(&client, &ns, "data").await?;
    let du = node::data_upload(&client, &ns, "data", &snapshot, "fs-backup").await?;
    let du = node::wait_upload(&client, &name_of(&du)).await?;
    let status = du.status.clone().unwrap_or_default();
    assert!(!status.snapshot_id.is_empty(), "a snapshot ID: {status:?}");
    assert!(status.progress.total_bytes > 7_000_000, "the tree's bytes counted: {status:?}");
    assert_eq!(
        status.progress.total_bytes.to_string(),
        inode_bytes.trim(),
        "totalBytes counts each inode's bytes once: {status:?}"
    );
    // The chart's log level (`ferry=debug` here) reaches the agent, whose pod log has no
    // terminal colour codes.
    let log = node.agent_logs().await?;
    let tail: Vec<&str> = log.lines().rev().take(20).collect();
    assert!(log.contains("driver step"), "no debug line in the agent's log; its end: {tail:#?}");
    assert!(!log.contains('\x1b'), "colour codes in the agent's log");
    let snapshots = node.ferry(&ns, &["snapshots", "--json"]).await?;
    assert!(
        snapshots.contains(&status.snapshot_id),
        "the repository lists {}: {snapshots}",
        status.snapshot_id
    );
    node.ferry(&ns, &["check", "--read-data"]).await?;

    let target_ns = node.namespace("fs-restored").await?;
    let dd =
        node::data_download(&client, &target_ns, "data", "64Mi", "Filesystem", &du, "fs-restore")
            .await?;
    node::wait_download(&client, &name_of(&dd)).await?;
    let restored = node::run_pod(&client, &target_ns, "data", false, FS_MANIFEST).await?;
    assert_eq!(restored, written, "the restored tree differs from the written one");
    Ok(())
}

#[tokio::test]
async fn block_pvc_round_trip() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("block").await?;
    node::create_pvc(&client, &ns, "disk", "32Mi", "Block").await?;
    let written =
        node::run_pod(&client, &ns, "disk", true, &format!("{BLOCK_WRITE}\n{BLOCK_MANIFEST}"))
            .await?;
    assert_eq!(written.trim().len(), 32, "an MD5 of the device: {written}");

    let snapshot = node::snapshot(&client, &ns, "disk").await?;
    let du = node::data_upload(&client, &ns, "disk", &snapshot, "block-backup").await?;
    let du = node::wait_upload(&client, &name_of(&du)).await?;

    let target_ns = node.namespace("block-restored").await?;
    let dd =
        node::data_download(&client, &target_ns, "disk", "32Mi", "Block", &du, "block-restore")
            .await?;
    node::wait_download(&client, &name_of(&dd)).await?;
    let restored = node::run_pod(&client, &target_ns, "disk", true, BLOCK_MANIFEST).await?;
    assert_eq!(restored, written, "the restored device differs from the written one");

    // Everything Ferry exposed is gone without leaving the node a device it cannot release.
    node::delete_pvc(&client, &target_ns, "disk").await?;
    node::delete_pvc(&client, &ns, "disk").await?;
    node::no_leaked_devices(node).await?;
    Ok(())
}

/// `ferry volume backup NS/PVC` and `ferry volume restore SNAPSHOT NS2/PVC` against the real
/// node: the CLI plays Velero's part for one PVC (no Velero running), the chart's agent moves
/// the data, and a pod compares the restored tree with the one written.
#[tokio::test]
async fn ferry_volume_backs_up_and_restores_a_pvc() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("volcli").await?;
    node::create_pvc(&client, &ns, "data", "64Mi", "Filesystem").await?;
    let written =
        node::run_pod(&client, &ns, "data", false, &format!("{FS_WRITE}\n{FS_MANIFEST}")).await?;
    let common =
        ["--velero-namespace", ferry_testbed::VELERO_NAMESPACE, "--data-mover", node::MOVER];
    let source = format!("{ns}/data");
    let mut args = vec!["volume", "backup", "--storage-location", node::BSL, &source];
    args.extend(common);
    let out = node.ferry(&ns, &args).await?;
    let id = out.lines().last().unwrap_or_default().to_owned();
    assert_eq!(id.len(), 64, "the snapshot ID printed last: {out}");

    let target_ns = node.namespace("volcli-copy").await?;
    let copy = format!("{target_ns}/copy");
    let mut args = vec!["volume", "restore", &id[..12], &copy];
    args.extend(common);
    node.ferry(&ns, &args).await?;
    let restored = node::run_pod(&client, &target_ns, "copy", false, FS_MANIFEST).await?;
    assert_eq!(restored, written, "the restored PVC holds the tree written");
    Ok(())
}

/// A unique name of 253 characters (the longest Kubernetes allows) ending in `end`.
fn longest_name(end: &str) -> String {
    let start = format!("long-{}-", &node::uid()[..8]);
    format!("{start}{}{end}", "n".repeat(253 - start.len() - end.len()))
}

/// A DataUpload and a DataDownload named with 253 characters, as a client other than Velero
/// may name them: the holding pods, PVCs and snapshots named after them run on the real
/// kubelet and CSI driver, their labels take Velero's shortened form, and the round trip
/// restores the tree written.
#[tokio::test]
async fn crs_with_the_longest_names_round_trip() -> TestResult {
    use ferry_api::k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use ferry_api::{DataDownload, DataUpload};
    use ferry_testbed::VELERO_NAMESPACE;
    use kube::api::{Api, PostParams};

    use crate::velero_crs::{self, Mover};

    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("long").await?;
    node::create_pvc(&client, &ns, "data", "64Mi", "Filesystem").await?;
    let written =
        node::run_pod(&client, &ns, "data", false, &format!("{FS_WRITE}\n{FS_MANIFEST}")).await?;
    let snapshot = node::snapshot(&client, &ns, "data").await?;
    let source = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns).get("data").await?;
    let mover = Mover { datamover: node::MOVER, bsl: node::BSL };
    let mut du =
        velero_crs::data_upload(&mover, &node::CLASSES, "long", &node::uid(), &source, &snapshot)?;
    du.metadata.generate_name = None;
    du.metadata.name = Some(longest_name("u"));
    let du = Api::<DataUpload>::namespaced(client.clone(), VELERO_NAMESPACE)
        .create(&PostParams::default(), &du)
        .await?;
    let du = node::wait_upload(&client, &name_of(&du)).await?;

    let target_ns = node.namespace("long-to").await?;
    let target = velero_crs::target_pvc(
        &target_ns,
        "data",
        "64Mi",
        "Filesystem",
        ferry_testbed::realnode::STORAGE_CLASS,
        &format!("{target_ns}.data"),
    )?;
    let target = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &target_ns)
        .create(&PostParams::default(), &target)
        .await?;
    let mut dd = velero_crs::data_download(&mover, "long-r", &node::uid(), &target, &du)?;
    dd.metadata.generate_name = None;
    dd.metadata.name = Some(longest_name("d"));
    let dd = Api::<DataDownload>::namespaced(client.clone(), VELERO_NAMESPACE)
        .create(&PostParams::default(), &dd)
        .await?;
    node::wait_download(&client, &name_of(&dd)).await?;
    let restored = node::run_pod(&client, &target_ns, "data", false, FS_MANIFEST).await?;
    assert_eq!(restored, written, "the restored PVC holds the tree written");
    Ok(())
}

/// A tenant's volume holding a set-user-ID file of root and a device node (made by the
/// tenant's pod): the agent restores it without them, saying so in a `RestoreWithheld`
/// Event; a DataDownload whose `dataMoverConfig` asks gets them back.
#[tokio::test]
async fn a_restore_withholds_privileges_unless_the_download_asks() -> TestResult {
    use ferry_api::keys::{RESTORE_DEVICE_NODES, RESTORE_ROOT_SETID_BITS};

    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("priv").await?;
    node::create_pvc(&client, &ns, "data", "16Mi", "Filesystem").await?;
    let write = "set -e; cd /data; echo x > su; chmod 4755 su; mknod null c 1 3; echo y > plain";
    node::run_pod(&client, &ns, "data", false, write).await?;
    let snapshot = node::snapshot(&client, &ns, "data").await?;
    let du = node::data_upload(&client, &ns, "data", &snapshot, "priv-backup").await?;
    let du = node::wait_upload(&client, &name_of(&du)).await?;
    let look = "cd /data; { stat -c %a su; if [ -c null ]; then echo device; else echo none; fi; \
                cat plain; } > /dev/termination-log";

    let confined = node.namespace("priv-confined").await?;
    let dd = node::data_download(&client, &confined, "data", "16Mi", "Filesystem", &du, "priv-1")
        .await?;
    node::wait_download(&client, &name_of(&dd)).await?;
    let seen = node::run_pod(&client, &confined, "data", false, look).await?;
    assert_eq!(seen.split_whitespace().collect::<Vec<_>>(), ["755", "none", "y"], "{seen}");
    let withheld = node::agent_event_note(&client, &name_of(&dd), "RestoreWithheld").await?;
    assert!(
        withheld.contains("1 device nodes") && withheld.contains("1 files of root"),
        "{withheld}"
    );

    let asked = node.namespace("priv-asked").await?;
    let pvc = node::target_pvc(&client, &asked, "data", "16Mi", "Filesystem").await?;
    let config = [RESTORE_DEVICE_NODES, RESTORE_ROOT_SETID_BITS]
        .map(|k| (k.to_owned(), "true".to_owned()))
        .into();
    let dd = node::data_download_into(&client, &pvc, &du, "priv-2", Some(config)).await?;
    node::wait_download(&client, &name_of(&dd)).await?;
    let seen = node::run_pod(&client, &asked, "data", false, look).await?;
    assert_eq!(seen.split_whitespace().collect::<Vec<_>>(), ["4755", "device", "y"], "{seen}");
    Ok(())
}
