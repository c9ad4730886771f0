//! `ferry volume restore SNAPSHOT NAMESPACE/PVC`.

use anyhow::{Context, bail, ensure};
use ferry_api::k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use ferry_api::keys::BACKUP_NAME_LABEL;
use ferry_api::{Backup, DataUpload, GoDuration, Restore};
use ferry_dmp::PvcRestoreAction;
use ferry_host::{LocalRestoreActions, Operation, OperationStatus, Phase, Tally};
use ferry_plugin::{JsonObject, RestoreItemActionV2, RestoreItemInput};
use ferry_repo::SnapshotKind;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::progress::human;
use crate::repo_cmds::open_repo;

use super::follow::{ProgressRecorder, follow};
use super::{
    PvcRestoreArgs, connect, context, create, object_name, operation_error, pvc_identifier,
    split_target,
};

pub(crate) async fn run(args: &PvcRestoreArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    let (namespace, pvc_name) = split_target(&args.pvc)?;
    let cluster = &args.cluster;
    let repo = open_repo(&cluster.repo, cancel).await?;
    let id = repo.find_snapshot(&args.snapshot, cancel).await?;
    let snapshot = repo.load_snapshot(&id, cancel).await?;
    let tag = |key: &str| snapshot.tags.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let du_name = tag(ferry_mover::DATA_UPLOAD_TAG).with_context(|| {
        format!(
            "snapshot {id} was not made by a DataUpload (no {} tag)",
            ferry_mover::DATA_UPLOAD_TAG
        )
    })?;
    let client = connect().await?;
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), &cluster.velero_namespace);
    let du = uploads.get(&du_name).await.with_context(|| {
        format!(
            "reading DataUpload {}/{du_name}, which made snapshot {id} (it records the source \
             PVC's UID and class)",
            cluster.velero_namespace
        )
    })?;
    let backup_name = du.labels().get(BACKUP_NAME_LABEL).cloned().unwrap_or_default();
    let backups: Api<Backup> = Api::namespaced(client.clone(), &cluster.velero_namespace);
    backups.get(&backup_name).await.with_context(|| {
        format!("reading Backup {}/{backup_name} of DataUpload {du_name}", cluster.velero_namespace)
    })?;
    let targets: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    ensure!(
        targets
            .get_opt(&pvc_name)
            .await
            .with_context(|| format!("reading PVC {}", args.pvc))?
            .is_none(),
        "PVC {} exists already; restore into a new PVC",
        args.pvc
    );

    // The PVC as the backup saw it: from the source PVC if it is still there, with the
    // DataUpload's record of its UID and class.
    let source_ns = du.spec.source_namespace.clone();
    let source = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &source_ns)
        .get_opt(&du.spec.source_pvc)
        .await
        .with_context(|| format!("reading PVC {source_ns}/{}", du.spec.source_pvc))?;
    let item_from_backup =
        pvc_from_backup(&du, source.as_ref(), args, snapshot.kind()?, &cluster.velero_namespace)?;
    let mut item = item_from_backup.clone();
    item["metadata"]["name"] = json!(pvc_name);

    let restores: Api<Restore> = Api::namespaced(client.clone(), &cluster.velero_namespace);
    let name = object_name("restore");
    let mut spec = json!({ "backupName": backup_name,
                           "itemOperationTimeout": GoDuration(cluster.timeout).to_string() });
    if source_ns != namespace {
        spec["namespaceMapping"] = json!({ source_ns.clone(): namespace });
    }
    let restore: Restore = serde_json::from_value(json!({
        "apiVersion": "velero.io/v1", "kind": "Restore",
        "metadata": { "name": name, "namespace": cluster.velero_namespace,
                      "labels": { ferry_expose::labels::CREATED_BY: "ferry-volume" } },
        "spec": spec,
    }))?;
    let restore = create(&restores, &restore, &format!("Restore {name}")).await?;
    let mut recorder = ProgressRecorder::new(restores, name.clone(), "restore", "restoring");
    recorder.set_phase(Phase::InProgress, Tally::default()).await?;
    eprintln!(
        "ferry volume: Restore {}/{name} of snapshot {id} into PVC {}",
        cluster.velero_namespace, args.pvc
    );
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &cluster.velero_namespace);
    // Velero keys the result by the PVC's name in the backup; the item here carries the new
    // name (Velero itself never renames a PVC), so the result is keyed by that.
    let mut result = ferry_dmp::upload_result_config_map(&restore, &du)?;
    if let Some(labels) = result.metadata.labels.as_mut() {
        labels.insert(
            ferry_dmp::keys::PVC_NAMESPACE_NAME_LABEL.to_owned(),
            ferry_api::naming::valid_label_value(&format!("{source_ns}.{pvc_name}")),
        );
    }
    create(&maps, &result, "the DataUpload result").await?;

    let action = PvcRestoreAction::new(context(&client, cluster));
    let restore_obj = JsonObject::from_value(serde_json::to_value(&restore)?)?;
    let input = RestoreItemInput {
        item: JsonObject::from_value(item)?,
        item_from_backup: JsonObject::from_value(item_from_backup)?,
        restore: restore_obj.clone(),
    };
    let executed = match action.execute(input).await {
        Ok(out) => out,
        Err(e) => {
            recorder.set_phase(Phase::Failed, Tally::default()).await?;
            return Err(anyhow::Error::new(e).context(format!("restoring PVC {}", args.pvc)));
        }
    };
    let (Some(operation_id), Some(mut pvc)) =
        (executed.operation_id.clone(), executed.item.clone())
    else {
        recorder.set_phase(Phase::Failed, Tally::default()).await?;
        bail!("PVC {}: the restore action started no data movement", args.pvc);
    };
    // Velero creates the item the action returned, in the target namespace.
    if let Some(meta) = pvc.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in ["uid", "resourceVersion", "creationTimestamp", "managedFields"] {
            meta.remove(key);
        }
        meta.insert("namespace".into(), json!(namespace));
    }
    if let Some(object) = pvc.as_object_mut() {
        object.remove("status");
    }
    let pvc: PersistentVolumeClaim = serde_json::from_value(pvc)?;
    create(&targets, &pvc, &format!("PVC {}", args.pvc)).await?;
    let mut ops = vec![Operation {
        spec: ferry_host::RestoreOperationSpec {
            restore_name: name,
            restore_uid: restore.uid().unwrap_or_default(),
            restore_item_action: ferry_dmp::PVC_RESTORE_PLUGIN.to_owned(),
            resource_identifier: pvc_identifier(&namespace, &pvc_name),
            operation_id,
        },
        status: OperationStatus::new(jiff::Timestamp::now()),
    }];
    let actions = LocalRestoreActions { action, restore: restore_obj };
    follow(&mut ops, &actions, &mut recorder, cluster, cancel).await?;
    operation_error(&ops[0], &format!("restore into PVC {}", args.pvc))?;
    eprintln!(
        "ferry volume: snapshot {id} restored into PVC {} ({})",
        args.pvc,
        human(ops[0].status.n_total.unsigned_abs())
    );
    Ok(())
}

/// The source PVC as Velero would have stored it in the backup: UID and the DataUpload's
/// annotation, with the spec of the source PVC (when it still exists) or of the options.
fn pvc_from_backup(
    du: &DataUpload,
    source: Option<&PersistentVolumeClaim>,
    args: &PvcRestoreArgs,
    kind: SnapshotKind,
    velero_namespace: &str,
) -> anyhow::Result<Value> {
    let uid = du.labels().get(ferry_api::keys::PVC_UID_LABEL).cloned().unwrap_or_default();
    ensure!(
        !uid.is_empty(),
        "DataUpload {} has no {} label",
        du.name_any(),
        ferry_api::keys::PVC_UID_LABEL
    );
    let source_spec = source.and_then(|p| p.spec.clone()).unwrap_or_default();
    let class = args
        .storage_class
        .clone()
        .or(source_spec.storage_class_name.clone())
        .or_else(|| du.spec.csi_snapshot.as_ref().map(|c| c.storage_class.clone()))
        .filter(|c| !c.is_empty())
        .context("no storage class: pass --storage-class")?;
    let size = args
        .size
        .clone()
        .or_else(|| {
            source_spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .map(|q| q.0.clone())
        })
        .context("the source PVC is gone: pass --size")?;
    let block = kind == SnapshotKind::Volume;
    let access_modes =
        source_spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]);
    Ok(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": du.spec.source_pvc, "namespace": du.spec.source_namespace, "uid": uid,
                      "annotations": { ferry_dmp::keys::DATA_UPLOAD_NAME_ANNOTATION:
                                       format!("{velero_namespace}/{}", du.name_any()) } },
        "spec": { "accessModes": access_modes, "storageClassName": class,
                  "volumeMode": if block { "Block" } else { "Filesystem" },
                  "resources": { "requests": { "storage": size } } },
    }))
}
