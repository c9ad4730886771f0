//! A restore whose volume the cluster cannot provision: its StorageClass names a provisioner
//! secret that does not exist, so the real external-provisioner fails every attempt with a
//! `ProvisioningFailed` Event on the restore PVC, and kube-scheduler holds the holding pod back
//! because its claim is unbound. The wait is bounded by the operation timeout only (a volume
//! made from a snapshot may take minutes), but once the claim has been unbound past the
//! agent's `--unschedulable-grace`, the agent tells the provisioner's words in a
//! `WaitingForProvisioning` Event on the DataDownload, and the timeout's message carries them.

use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ferry_api::k8s_openapi::api::storage::v1::StorageClass;
use ferry_api::naming::valid_label_value;
use ferry_api::{DataDownload, DataDownloadPhase};
use ferry_testbed::{VELERO_NAMESPACE, realnode};
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::node::{self, MOVER, TestResult, WAIT, name_of};
use crate::velero_crs::{self, Mover};

/// The class whose volumes cannot be provisioned.
const CLASS: &str = "ferry-hostpath-unprovisionable";
/// The provisioner secret it names, which never exists.
const ABSENT_SECRET: &str = "ferry-absent-provisioner-secret";

#[tokio::test]
async fn a_restore_volume_that_cannot_be_provisioned_is_told_and_fails_with_the_provisioners_words()
-> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": { "name": CLASS },
        "provisioner": realnode::DRIVER,
        "volumeBindingMode": "Immediate",
        "parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": ABSENT_SECRET,
            "csi.storage.k8s.io/provisioner-secret-namespace": VELERO_NAMESPACE,
        },
    }))?;
    match Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }

    let ns = node.namespace("unprovisioned").await?;
    node::create_pvc(&client, &ns, "data", "64Mi", "Filesystem").await?;
    let snapshot = node::snapshot(&client, &ns, "data").await?;
    let du = node::data_upload(&client, &ns, "data", &snapshot, "unprovisioned").await?;
    let du = node::wait_upload(&client, &name_of(&du)).await?;

    // The target as Velero's restore leaves it (its selector keeps provisioners away), in the
    // class; the restore PVC Ferry makes like it is the one provisioned.
    let target = node.namespace("unprovisioned-to").await?;
    let pvc = velero_crs::target_pvc(&target, "data", "64Mi", "Filesystem", CLASS, &target)?;
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &target)
        .create(&PostParams::default(), &pvc)
        .await?;
    let mover = Mover { datamover: MOVER, bsl: &du.spec.backup_storage_location };
    let mut dd = velero_crs::data_download(&mover, "unprovisioned", &node::uid(), &pvc, &du)?;
    // Past the suite's 20 s grace, and short.
    let timeout = Duration::from_secs(50);
    dd.spec.operation_timeout = timeout.into();
    let dd = Api::<DataDownload>::namespaced(client.clone(), VELERO_NAMESPACE)
        .create(&PostParams::default(), &dd)
        .await?;
    let name = name_of(&dd);
    let started = Instant::now();

    // Told once the grace has passed, with the provisioner's own words.
    let note =
        node::agent_event_note(&client, &name, ferry_expose::WAITING_FOR_PROVISIONING).await?;
    assert!(started.elapsed() >= Duration::from_secs(20), "told before the grace: {note}");
    assert!(
        note.starts_with(&format!("claim {VELERO_NAMESPACE}/{name} not bound after"))
            && note.contains("; its latest Event: ProvisioningFailed")
            && note.contains(ABSENT_SECRET),
        "{note}"
    );

    // Failed at the timeout, saying why in the provisioner's words, and nothing left behind.
    let api: Api<DataDownload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let deadline = Instant::now() + WAIT;
    let status = loop {
        let status = api.get(&name).await?.status.unwrap_or_default();
        match status.phase {
            Some(DataDownloadPhase::Failed) => break status,
            Some(p @ (DataDownloadPhase::Completed | DataDownloadPhase::Canceled)) => {
                return Err(format!("{name} ended {p:?}: {}", status.message).into());
            }
            _ if Instant::now() > deadline => {
                return Err(format!("{name} not failed within {WAIT:?}: {status:?}").into());
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    assert!(started.elapsed() >= timeout, "failed before the timeout: {}", status.message);
    assert!(
        status.message.contains("timed out")
            && status.message.contains("waits for its volume to be provisioned")
            && status.message.contains("ProvisioningFailed")
            && status.message.contains(ABSENT_SECRET),
        "{}",
        status.message
    );
    assert!(status.start_timestamp.is_none(), "no data moved: {status:?}");
    // Told once in all that time, as a Warning.
    let events = node::agent_event_list(&client, &name).await?;
    let told: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(ferry_expose::WAITING_FOR_PROVISIONING))
        .collect();
    assert!(
        told.len() == 1 && told[0].type_.as_deref() == Some("Warning") && told[0].series.is_none(),
        "told once, as a Warning: {told:?}"
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let deadline = Instant::now() + WAIT;
    while claims.get_opt(&name).await?.is_some()
        || pods.get_opt(&valid_label_value(&name)).await?.is_some()
    {
        assert!(Instant::now() < deadline, "the restore PVC or its pod outlived the failure");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let target_pvc =
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), &target).get("data").await?;
    assert_eq!(target_pvc.spec.and_then(|s| s.volume_name), None, "the target was never bound");
    node::delete_pvc(&client, &target, "data").await?;
    node::delete_pvc(&client, &ns, "data").await
}
