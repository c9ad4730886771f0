//! `ferry volume backup NAMESPACE/PVC` and `ferry volume restore SNAPSHOT NAMESPACE/PVC`:
//! volume backups without Velero. The commands play Velero's server for one PVC: they make the
//! Backup or Restore object, run Ferry's PVC item action in this process (the same code as
//! `ferry plugin`), and follow the operation through `ferry-host`'s monitor with a progress bar
//! while Ferry's agents move the data. They need Ferry's agents and Velero's CRDs in the
//! cluster, not Velero.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use clap::{Args, Subcommand};
use ferry_api::GoDuration;
use ferry_dmp::PluginContext;
use ferry_host::{Operation, OperationPhase, ResourceIdentifier};
use kube::Resource;
use kube::api::{Api, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::cli::RepoArgs;

mod backup;
mod follow;
mod restore;

/// `ferry volume …`.
#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Back up a PVC through a DataUpload moved by Ferry's agents; prints the snapshot ID last.
    Backup(PvcBackupArgs),
    /// Restore a snapshot into a new PVC through a DataDownload moved by Ferry's agents.
    Restore(PvcRestoreArgs),
}

/// What both commands share.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The namespace of Velero's objects, where Ferry's agents watch.
    #[arg(long, default_value = ferry_api::DEFAULT_VELERO_NAMESPACE)]
    pub velero_namespace: String,
    /// The data mover name Ferry's agents answer to.
    #[arg(long, default_value = "ferry")]
    pub data_mover: String,
    /// How long the data movement may take before it is canceled.
    #[arg(long, default_value = "4h", value_parser = duration)]
    pub timeout: Duration,
    /// How often to ask for progress.
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub poll_interval: Duration,
}

#[derive(Debug, Args)]
pub struct PvcBackupArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The BackupStorageLocation the agents store into (its repository must be `--repo`).
    #[arg(long, default_value = "default")]
    pub storage_location: String,
    /// The PVC to back up.
    #[arg(value_name = "NAMESPACE/PVC")]
    pub pvc: String,
}

#[derive(Debug, Args)]
pub struct PvcRestoreArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The new PVC's storage class (default: the source PVC's).
    #[arg(long)]
    pub storage_class: Option<String>,
    /// The new PVC's size (default: the source PVC's request).
    #[arg(long)]
    pub size: Option<String>,
    /// The snapshot (ID or unique prefix) a `ferry volume backup` or Velero backup made.
    pub snapshot: String,
    /// The PVC to create; it must not exist.
    #[arg(value_name = "NAMESPACE/PVC")]
    pub pvc: String,
}

fn duration(text: &str) -> Result<Duration, String> {
    GoDuration::parse(text).map(|d| d.0).map_err(|e| e.to_string())
}

pub(crate) fn split_target(text: &str) -> anyhow::Result<(String, String)> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => bail!("{text:?} is not NAMESPACE/PVC"),
    }
}

/// A name for a Backup or Restore made by these commands (unique per second).
pub(crate) fn object_name(what: &str) -> String {
    format!("ferry-volume-{what}-{}", jiff::Timestamp::now().strftime("%Y%m%d%H%M%S"))
}

pub(crate) fn context(client: &kube::Client, args: &ClusterArgs) -> PluginContext {
    PluginContext::new(client.clone())
        .with_velero_namespace(args.velero_namespace.clone())
        .with_data_mover(args.data_mover.clone())
}

pub(crate) async fn connect() -> anyhow::Result<kube::Client> {
    kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API server (in-cluster or KUBECONFIG)")
}

pub(crate) fn operation_error<S>(op: &Operation<S>, what: &str) -> anyhow::Result<()> {
    ensure!(
        op.status.phase == OperationPhase::Completed,
        "{what} failed: {}",
        if op.status.error.is_empty() { "no reason given" } else { &op.status.error }
    );
    Ok(())
}

pub(crate) async fn create<K>(api: &Api<K>, object: &K, what: &str) -> anyhow::Result<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await.with_context(|| format!("creating {what}"))
}

pub async fn run(command: &VolumeCommand, cancel: &CancellationToken) -> anyhow::Result<()> {
    match command {
        VolumeCommand::Backup(args) => backup::run(args, cancel).await,
        VolumeCommand::Restore(args) => restore::run(args, cancel).await,
    }
}

pub(crate) fn pvc_identifier(namespace: &str, name: &str) -> ResourceIdentifier {
    ResourceIdentifier {
        group: String::new(),
        resource: "persistentvolumeclaims".into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

pub(crate) fn identifier(r: &ferry_plugin::ResourceIdentifier) -> ResourceIdentifier {
    ResourceIdentifier {
        group: r.group.clone(),
        resource: r.resource.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
    }
}
