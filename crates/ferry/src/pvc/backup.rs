//! `ferry volume backup NAMESPACE/PVC`.

use anyhow::{Context, bail};
use ferry_api::k8s_openapi::api::core::v1::PersistentVolumeClaim;
use ferry_api::{Backup, DataUpload, GoDuration};
use ferry_dmp::PvcBackupAction;
use ferry_host::{LocalBackupActions, Operation, OperationStatus, Phase, Tally};
use ferry_plugin::{BackupItemActionV2, BackupItemInput, JsonObject};
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::progress::human;
use crate::repo_cmds::open_repo;

use super::follow::{ProgressRecorder, follow};
use super::{
    PvcBackupArgs, connect, context, create, identifier, object_name, operation_error,
    pvc_identifier, split_target,
};

pub(crate) async fn run(args: &PvcBackupArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    let (namespace, pvc_name) = split_target(&args.pvc)?;
    let cluster = &args.cluster;
    // The repository first: a wrong URL or password fails before anything is created. A
    // repository that does not exist yet is made by the agents on their first backup.
    let repo = match open_repo(&cluster.repo, cancel).await {
        Ok(repo) => Some(repo),
        Err(e) if matches!(e.downcast_ref(), Some(ferry_repo::RepoError::NotFound { .. })) => {
            eprintln!(
                "ferry volume: no repository at {} yet; the agents create it",
                cluster.repo.repo
            );
            None
        }
        Err(e) => return Err(e),
    };
    let client = connect().await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let pvc = pvcs.get(&pvc_name).await.with_context(|| format!("reading PVC {}", args.pvc))?;

    let backups: Api<Backup> = Api::namespaced(client.clone(), &cluster.velero_namespace);
    let name = object_name("backup");
    let backup: Backup = serde_json::from_value(json!({
        "apiVersion": "velero.io/v1", "kind": "Backup",
        "metadata": { "name": name, "namespace": cluster.velero_namespace,
                      "labels": { ferry_expose::labels::CREATED_BY: "ferry-volume" } },
        "spec": { "snapshotMoveData": true, "datamover": cluster.data_mover,
                  "storageLocation": args.storage_location, "includedNamespaces": [namespace],
                  "itemOperationTimeout": GoDuration(cluster.timeout).to_string(),
                  "csiSnapshotTimeout": "10m0s" },
    }))?;
    let backup = create(&backups, &backup, &format!("Backup {name}")).await?;
    let mut recorder = ProgressRecorder::new(backups, name.clone(), "backup", "backing up");
    recorder.set_phase(Phase::InProgress, Tally::default()).await?;
    eprintln!("ferry volume: Backup {}/{name} for PVC {}", cluster.velero_namespace, args.pvc);

    let action = PvcBackupAction::new(context(&client, cluster));
    let backup_obj = JsonObject::from_value(serde_json::to_value(&backup)?)?;
    let input = BackupItemInput {
        item: JsonObject::from_value(serde_json::to_value(&pvc)?)?,
        backup: backup_obj.clone(),
    };
    let executed = match action.execute(input).await {
        Ok(out) => out,
        Err(e) => {
            recorder.set_phase(Phase::Failed, Tally::default()).await?;
            return Err(anyhow::Error::new(e).context(format!("backing up PVC {}", args.pvc)));
        }
    };
    let Some(operation_id) = executed.operation_id.clone() else {
        recorder.set_phase(Phase::Failed, Tally::default()).await?;
        bail!("PVC {}: the backup action started no data movement", args.pvc);
    };
    let du_name = executed
        .post_operation_items
        .iter()
        .find(|i| i.resource == "datauploads")
        .map(|i| i.name.clone())
        .context("the backup action named no DataUpload")?;
    let mut ops = vec![Operation {
        spec: ferry_host::BackupOperationSpec {
            backup_name: name.clone(),
            backup_uid: backup.uid().unwrap_or_default(),
            backup_item_action: ferry_dmp::PVC_BACKUP_PLUGIN.to_owned(),
            resource_identifier: pvc_identifier(&namespace, &pvc_name),
            operation_id,
            post_operation_items: Some(
                executed.post_operation_items.iter().map(identifier).collect(),
            ),
        },
        status: OperationStatus::new(jiff::Timestamp::now()),
    }];
    let actions = LocalBackupActions { action, backup: backup_obj };
    let tally = follow(&mut ops, &actions, &mut recorder, cluster, cancel).await?;
    operation_error(&ops[0], &format!("backup of PVC {}", args.pvc))?;
    debug_assert_eq!(tally.completed, 1);

    let uploads: Api<DataUpload> = Api::namespaced(client, &cluster.velero_namespace);
    let du =
        uploads.get(&du_name).await.with_context(|| format!("reading DataUpload {du_name}"))?;
    let status = du.status.unwrap_or_default();
    let repo = match repo {
        Some(repo) => repo,
        None => open_repo(&cluster.repo, cancel).await?,
    };
    let id = repo.find_snapshot(&status.snapshot_id, cancel).await.with_context(|| {
        format!(
            "snapshot {} of DataUpload {du_name} is not in {}: do the agents store into this \
                 repository (BackupStorageLocation {})?",
            status.snapshot_id, cluster.repo.repo, args.storage_location
        )
    })?;
    eprintln!(
        "ferry volume: PVC {} backed up: {} ({} new) by DataUpload {du_name}",
        args.pvc,
        human(status.progress.total_bytes.unsigned_abs()),
        human(status.incremental_bytes.unsigned_abs()),
    );
    println!("{id}");
    Ok(())
}
