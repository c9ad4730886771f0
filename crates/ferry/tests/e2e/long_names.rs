//! A DataUpload and a DataDownload with names as long as Kubernetes allows (253 characters):
//! the exposers' objects are named after the CRs and labelled with them, so the labels must
//! take Velero's shortened form (57 characters and a hash) or the API server refuses them.
//! The agents' Events on such a CR cannot be named `<CR name>.<timestamp>` either (over 253
//! characters): they get a shortened, hashed name and still regard the CR.

use ferry_agent::event_recorder::{EventRecorder, MAX_NAME_LEN};
use ferry_api::k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use ferry_api::k8s_openapi::api::events::v1::Event as K8sEvent;
use ferry_api::naming::valid_label_value;
use ferry_api::{DataDownload, DataDownloadPhase, DataUpload, DataUploadPhase};
use ferry_sim::{Binding, FsTree};
use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::harness::{TestResult, World, dd_phase, dd_terminal, du_phase, du_terminal};

/// Longest name of an object (a DNS subdomain).
const MAX_NAME: usize = MAX_NAME_LEN;

/// The Events every agent publishes on a DataUpload or DataDownload that completes.
const COMPLETED_EVENTS: [&str; 4] = ["Accepted", "Prepared", "InProgress", "Completed"];

/// A unique name of exactly 253 characters ending in `end`.
fn longest_name(world: &World, end: &str) -> String {
    let start = format!("{}-", world.mover);
    let fill = MAX_NAME - start.len() - end.len();
    format!("{start}{}{end}", "n".repeat(fill))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_253_character_data_upload_and_data_download_complete() -> TestResult {
    let world = World::start("e2e-long").await?;
    let tree = FsTree::sample(3);
    let vs = world.volume_with_snapshot("data", "32Mi", &tree).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(world.client.clone(), &world.ns);
    let pvc_uid = pvcs.get("data").await?.uid().unwrap_or_default();

    // The backup, as Velero's CSI plugin creates it, under the longest name there is.
    let name = longest_name(&world, "-up");
    assert_eq!(name.len(), MAX_NAME);
    let backup_uid = "0b3a63a4-0000-4000-8000-000000000001";
    let du: DataUpload = serde_json::from_value(json!({
        "apiVersion": "velero.io/v2alpha1",
        "kind": "DataUpload",
        "metadata": {
            "name": name,
            "namespace": VELERO_NAMESPACE,
            "labels": {
                "velero.io/backup-name": valid_label_value(&name),
                "velero.io/backup-uid": backup_uid,
                "velero.io/pvc-uid": pvc_uid,
                "velero.io/async-operation-id":
                    valid_label_value(&format!("du-{backup_uid}.{pvc_uid}")),
            },
        },
        "spec": {
            "snapshotType": "CSI",
            "csiSnapshot": {
                "volumeSnapshot": vs.name_any(),
                "storageClass": world.sim().storage_class(Binding::Immediate),
                "snapshotClass": world.sim().snapshot_class(),
                "driver": world.sim().driver(),
            },
            "sourcePVC": "data",
            "datamover": world.mover,
            "backupStorageLocation": world.bsl,
            "sourceNamespace": world.ns,
            "operationTimeout": "10m0s",
        },
    }))?;
    let uploads: Api<DataUpload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    uploads.create(&PostParams::default(), &du).await?;
    let du: DataUpload = world.wait_for(&name, "terminal", du_terminal).await?;
    assert_eq!(
        du_phase(&du),
        Some(DataUploadPhase::Completed),
        "{:#?}\n{}",
        du.status,
        world.agent_logs()
    );
    assert!(world.leftovers_of(&name).await?.is_empty(), "{:?}", world.leftovers_of(&name).await?);
    assert_events_published(&world, &name).await?;

    // The restore, under a name of the same length.
    let dd_name = longest_name(&world, "-down");
    let target = world
        .create_target_pvc(&world.ns, "data-back", "32Mi", "Filesystem", Binding::Immediate)
        .await?;
    let status = du.status.clone().unwrap_or_default();
    let restore_uid = "0b3a63a4-0000-4000-8000-000000000002";
    let target_uid = target.uid().unwrap_or_default();
    let dd: DataDownload = serde_json::from_value(json!({
        "apiVersion": "velero.io/v2alpha1",
        "kind": "DataDownload",
        "metadata": {
            "name": dd_name,
            "namespace": VELERO_NAMESPACE,
            "labels": {
                "velero.io/restore-name": valid_label_value(&dd_name),
                "velero.io/restore-uid": restore_uid,
                "velero.io/async-operation-id":
                    valid_label_value(&format!("dd-{restore_uid}.{target_uid}")),
            },
        },
        "spec": {
            "targetVolume": { "pvc": "data-back", "pv": "", "namespace": world.ns },
            "backupStorageLocation": world.bsl,
            "datamover": world.mover,
            "snapshotID": status.snapshot_id,
            "sourceNamespace": world.ns,
            "operationTimeout": "10m0s",
            "nodeOS": "linux",
            "snapshotSize": status.progress.total_bytes,
        },
    }))?;
    let downloads: Api<DataDownload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    downloads.create(&PostParams::default(), &dd).await?;
    let dd: DataDownload = world.wait_for(&dd_name, "terminal", dd_terminal).await?;
    assert_eq!(
        dd_phase(&dd),
        Some(DataDownloadPhase::Completed),
        "{:#?}\n{}",
        dd.status,
        world.agent_logs()
    );
    assert_eq!(world.sim().read_files(&world.ns, "data-back").await?, tree);
    let target = pvcs.get("data-back").await?;
    assert_eq!(target.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Bound"));
    assert!(world.leftovers_of(&dd_name).await?.is_empty());
    assert_events_published(&world, &dd_name).await?;
    world.shutdown().await
}

/// The agents' Events of a completed CR named `name` are all there, none refused.
async fn assert_events_published(world: &World, name: &str) -> TestResult {
    for reason in COMPLETED_EVENTS {
        if let Err(e) = world.event_note(name, reason).await {
            return Err(format!("{e}\n{}", world.agent_logs()).into());
        }
    }
    let logs = world.agent_logs();
    assert!(!logs.contains("publishing an event failed"), "{logs}");
    Ok(())
}

/// The Events on `name` in Velero's namespace published by `controller`.
async fn events_regarding(
    events: &Api<K8sEvent>,
    name: &str,
    controller: &str,
) -> Result<Vec<K8sEvent>, kube::Error> {
    let list = events.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reporting_controller.as_deref() == Some(controller))
        .collect())
}

/// A DataUpload in Velero's namespace named `name` (it need not exist to have Events).
fn data_upload_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(DataUpload::api_version(&()).into_owned()),
        kind: Some(DataUpload::kind(&()).into_owned()),
        namespace: Some(VELERO_NAMESPACE.into()),
        name: Some(name.into()),
        uid: Some(format!("uid-{}", name.len())),
        ..ObjectReference::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_event_on_a_253_character_name_is_a_series_as_on_a_short_one() -> TestResult {
    ferry_testbed::install_crypto_provider();
    let client = ControlPlane::shared().client()?;
    let id = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
    // A reporter of this test's own, so only its Events are counted.
    let controller = format!("ferry-long-{:x}", id % 0xffff_ffff);
    let recorder = EventRecorder::new(
        client.clone(),
        Reporter { controller: controller.clone(), instance: Some("node-a".into()) },
    );
    let short_name = format!("{controller}-short");
    let long_name = format!("{controller}-{}", "l".repeat(MAX_NAME - controller.len() - 1));
    assert_eq!(long_name.len(), MAX_NAME);
    let events: Api<K8sEvent> = Api::namespaced(client, VELERO_NAMESPACE);

    let mut published = Vec::new();
    for name in [&short_name, &long_name] {
        let regarding = data_upload_ref(name);
        for note in ["first", "second"] {
            let event = Event {
                type_: EventType::Warning,
                reason: "Failed".into(),
                note: Some(note.into()),
                action: "Failed".into(),
                secondary: None,
            };
            recorder.publish(&event, &regarding).await?;
        }
        let found = events_regarding(&events, name, &controller).await?;
        assert_eq!(found.len(), 1, "{name}: {found:#?}");
        let event = found.into_iter().next().unwrap_or_default();
        assert!(event.name_any().len() <= MAX_NAME, "{}", event.name_any());
        assert_eq!(event.regarding.as_ref(), Some(&regarding));
        assert_eq!(event.series.as_ref().map(|s| s.count), Some(2), "{event:#?}");
        published.push(event);
    }
    let [short, long] = <[K8sEvent; 2]>::try_from(published).map_err(|_| "two events")?;
    // The short name's Event is kube's own `<name>.<timestamp>`; the long one's is cut.
    assert!(short.name_any().starts_with(&format!("{short_name}.")), "{}", short.name_any());
    assert!(!long.name_any().starts_with(&long_name), "{}", long.name_any());
    // Otherwise the same Event, first note kept as kube's Recorder keeps it.
    let shape = |e: &K8sEvent| {
        (
            e.type_.clone(),
            e.reason.clone(),
            e.action.clone(),
            e.note.clone(),
            e.reporting_controller.clone(),
            e.reporting_instance.clone(),
        )
    };
    assert_eq!(shape(&short), shape(&long));
    assert_eq!(long.note.as_deref(), Some("first"));
    Ok(())
}
