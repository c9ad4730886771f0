//! A file-system volume backed up through a DataUpload and restored through a DataDownload
//! into a new PVC, content and metadata compared.

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use ferry_api::{
    DataDownload, DataDownloadPhase, DataUpload, DataUploadPhase, NodeOs, VolumeSnapshot,
    VolumeSnapshotContent,
};
use ferry_sim::FsTree;
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::Api;

use crate::harness::{TestResult, World, dd_phase, du_phase};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_volume_backed_up_by_data_upload_is_restored_by_data_download() -> TestResult {
    let world = World::start("e2e-fs").await?;
    let tree = FsTree::sample(7);
    let vs = world.volume_with_snapshot("data", "64Mi", &tree).await?;
    let du = world.create_data_upload("nightly", "data", &vs.name_any()).await?;
    let name = du.name_any();
    let terminal = |d: &DataUpload| {
        matches!(
            du_phase(d),
            Some(DataUploadPhase::Completed | DataUploadPhase::Failed | DataUploadPhase::Canceled)
        )
    };
    let du: DataUpload = world.wait_for(&name, "terminal", terminal).await?;
    let status = du.status.clone().unwrap_or_default();
    assert_eq!(
        du_phase(&du),
        Some(DataUploadPhase::Completed),
        "{status:#?}\n{}",
        world.agent_logs()
    );
    assert!(!status.snapshot_id.is_empty());
    assert!(status.progress.total_bytes > 0);
    assert_eq!(status.progress.bytes_done, status.progress.total_bytes);
    assert!(status.incremental_bytes > 0);
    assert_eq!(status.node_os, Some(NodeOs::Linux));
    assert!(world.sim().nodes().contains(&status.node), "{status:#?}");
    assert!(!status.accepted_by_node.is_empty());
    assert!(status.start_timestamp.is_some() && status.completion_timestamp.is_some());
    assert!(!status.path.is_empty());
    // The agent that moved the data kept the repository's index and snapshot in its cache.
    let cached = world.cached_files(&status.node);
    for kind in ["/index/", "/snapshots/", "/trees/"] {
        assert!(cached.iter().any(|p| p.contains(kind)), "no {kind} in the cache: {cached:?}");
    }
    // The Completed event tells how the bytes divided up: a first backup reads them all.
    let note = world.event_note(&name, "Completed").await?;
    for part in ["MB/s", "read ", "skipped 0 B", "uploaded "] {
        assert!(note.contains(part), "Completed note without {part:?}: {note}");
    }
    // The Prepared and InProgress events say where exposing the volume spent its time.
    let note = world.event_note(&name, "Prepared").await?;
    for part in
        ["volume exposed on node", "snapshot handed over ", "backup snapshot ready ", "pod placed "]
    {
        assert!(note.contains(part), "Prepared note without {part:?}: {note}");
    }
    let note = world.event_note(&name, "InProgress").await?;
    assert!(note.contains("s after Prepared"), "InProgress note: {note}");
    // Everything the exposer made is gone, and so is the source snapshot it took over.
    let velero = |c| -> (Api<Pod>, Api<PersistentVolumeClaim>, Api<VolumeSnapshot>) {
        (
            Api::namespaced(c, VELERO_NAMESPACE),
            Api::namespaced(world.client.clone(), VELERO_NAMESPACE),
            Api::namespaced(world.client.clone(), VELERO_NAMESPACE),
        )
    };
    let (pods, pvcs, snaps) = velero(world.client.clone());
    let contents: Api<VolumeSnapshotContent> = Api::all(world.client.clone());
    let gone = async {
        for _ in 0..100 {
            let left = (
                pods.get_opt(&name).await?.is_some(),
                pvcs.get_opt(&name).await?.is_some(),
                snaps.get_opt(&name).await?.is_some(),
                contents.get_opt(&name).await?.is_some(),
            );
            if left == (false, false, false, false) {
                return Ok::<_, kube::Error>(None);
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        Ok(Some("exposed objects left behind"))
    };
    assert_eq!(gone.await?, None);
    let source_vs: Api<VolumeSnapshot> = Api::namespaced(world.client.clone(), &world.ns);
    assert!(source_vs.get_opt(&vs.name_any()).await?.is_none(), "source snapshot kept");

    // Restore into a new PVC in the same namespace.
    let dd = world
        .create_data_download("nightly-restore", &world.ns, "data-restored", "64Mi", &du)
        .await?;
    let dd_name = dd.name_any();
    let terminal = |d: &DataDownload| {
        matches!(
            dd_phase(d),
            Some(
                DataDownloadPhase::Completed
                    | DataDownloadPhase::Failed
                    | DataDownloadPhase::Canceled
            )
        )
    };
    let dd: DataDownload = world.wait_for(&dd_name, "terminal", terminal).await?;
    let dd_status = dd.status.clone().unwrap_or_default();
    assert_eq!(
        dd_phase(&dd),
        Some(DataDownloadPhase::Completed),
        "{dd_status:#?}\n{}",
        world.agent_logs()
    );
    assert_eq!(dd_status.progress.bytes_done, dd_status.progress.total_bytes);
    // The target PVC is bound to the restored volume, which carries the selector's label and
    // the class's reclaim policy again.
    let targets: Api<PersistentVolumeClaim> = Api::namespaced(world.client.clone(), &world.ns);
    let target = targets.get("data-restored").await?;
    let pv_name = target.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
    assert_eq!(target.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Bound"));
    let pv = Api::<PersistentVolume>::all(world.client.clone()).get(&pv_name).await?;
    let wanted = target
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    for (k, v) in &wanted {
        assert_eq!(pv.labels().get(k), Some(v), "PV labels {:?}", pv.labels());
    }
    assert_eq!(
        pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()),
        Some("Delete")
    );
    assert!(!pv.labels().contains_key("ferry.io/restore-for"));
    let restored = world.sim().read_files(&world.ns, "data-restored").await?;
    assert_eq!(restored, tree);
    world.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_block_volume_round_trips_through_data_upload_and_data_download() -> TestResult {
    let world = World::start("e2e-block").await?;
    // 8 MiB of data at 1 MiB into a 64 MiB raw volume; the rest stays zero.
    let data = crate::harness::big_tree(1, 8, 5)
        .entries
        .into_values()
        .find_map(|e| match e.kind {
            ferry_sim::FsKind::File(bytes) => Some(bytes),
            _ => None,
        })
        .unwrap_or_default();
    let vs = world.block_volume_with_snapshot("raw", "64Mi", 1 << 20, &data).await?;
    let du = world.create_data_upload("blocky", "raw", &vs.name_any()).await?;
    let du: DataUpload =
        world.wait_for(&du.name_any(), "terminal", crate::harness::du_terminal).await?;
    let status = du.status.clone().unwrap_or_default();
    assert_eq!(
        du_phase(&du),
        Some(DataUploadPhase::Completed),
        "{status:#?}\n{}",
        world.agent_logs()
    );
    assert_eq!(status.progress.total_bytes, 64 << 20, "the device size is the total");
    // Zeros are not stored: only about the data written is new.
    assert!(status.incremental_bytes <= 10 << 20, "{status:#?}");
    let note = world.event_note(&du.name_any(), "Completed").await?;
    assert!(note.contains("uploaded ") && !note.contains("skipped 0 B"), "{note}");
    let dd = world
        .create_data_download_in_mode("blocky-restore", &world.ns, "raw-back", "64Mi", &du, "Block")
        .await?;
    let dd: DataDownload =
        world.wait_for(&dd.name_any(), "terminal", crate::harness::dd_terminal).await?;
    assert_eq!(
        dd_phase(&dd),
        Some(DataDownloadPhase::Completed),
        "{:#?}\n{}",
        dd.status,
        world.agent_logs()
    );
    let back = world.sim().read_block(&world.ns, "raw-back", 0, 64 << 20).await?;
    let mut want = vec![0u8; 64 << 20];
    want[1 << 20..(1 << 20) + data.len()].copy_from_slice(&data);
    assert!(back == want, "restored device differs");
    world.shutdown().await
}
