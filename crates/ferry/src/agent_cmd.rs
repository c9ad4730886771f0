//! `ferry agent`: one node's DataUpload/DataDownload controllers with the CSI exposers and the
//! repository data path; and `ferry hold`, what the pods holding exposed volumes run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_agent::{Agent, AgentConfig, Backends};
use ferry_api::GoDuration;
use ferry_expose::{CsiBackupExposer, CsiRestoreExposer, ExposerConfig};
use ferry_mover::{BslRepositories, FixedRepository, RepoMover, RepositorySource};
use ferry_repo::{InitOptions, Repository};
use tokio_util::sync::CancellationToken;

use crate::cli::RepoArgs;
use crate::repo_cmds;

fn duration(text: &str) -> Result<Duration, String> {
    GoDuration::parse(text).map(|d| d.0).map_err(|e| e.to_string())
}

/// Settings of `ferry agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// This node's name (a DaemonSet passes it from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Velero's namespace.
    #[arg(long, env = "VELERO_NAMESPACE", default_value = "velero")]
    pub namespace: String,
    /// The `spec.datamover` value to handle.
    #[arg(long, default_value = "ferry")]
    pub data_mover: String,
    /// The kubelet's root directory as mounted into the agent.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_root: PathBuf,
    /// Image of the pods that hold exposed volumes (the agent's own image).
    #[arg(long, env = "FERRY_IMAGE", default_value = "ferry:latest")]
    pub pod_image: String,
    /// Data movements at once on this node.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// How often bytes done are written to the CR (Go duration).
    #[arg(long, default_value = "3s", value_parser = duration)]
    pub progress_interval: Duration,
    /// How long a CR may wait for its volume (Go duration).
    #[arg(long, default_value = "30m", value_parser = duration)]
    pub prepare_timeout: Duration,
    /// Node liveness lease duration (Go duration).
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// How long a holding pod may be unschedulable before the CR fails (Go duration).
    #[arg(long, default_value = "1m", value_parser = duration)]
    pub unschedulable_grace: Duration,
    /// Use this one repository for everything instead of one per BackupStorageLocation and
    /// namespace (`file:///path` or `s3://bucket/prefix`; password as for other commands).
    #[arg(long = "repo")]
    pub repo: Option<String>,
    #[arg(long, hide = true, env = "FERRY_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    #[arg(long, hide = true, env = "FERRY_S3_REGION")]
    pub s3_region: Option<String>,
    /// A file holding the password of `--repo` (else `FERRY_PASSWORD`).
    #[arg(long)]
    pub password_file: Option<PathBuf>,
}

pub async fn run(args: &AgentArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API server (in-cluster or KUBECONFIG)")?;
    let repos: Arc<dyn RepositorySource> = match &args.repo {
        Some(url) => {
            let repo_args = RepoArgs {
                repo: url.clone(),
                password_file: args.password_file.clone(),
                s3_endpoint: args.s3_endpoint.clone(),
                s3_region: args.s3_region.clone(),
            };
            let repo: Repository = repo_cmds::open_repo(&repo_args, cancel).await?;
            Arc::new(FixedRepository::new(repo, url.clone()))
        }
        None => Arc::new(BslRepositories::new(
            client.clone(),
            args.namespace.clone(),
            InitOptions::default(),
        )),
    };
    let mut exposer = ExposerConfig::new(args.pod_image.clone());
    exposer.namespace.clone_from(&args.namespace);
    exposer.kubelet_root.clone_from(&args.kubelet_root);
    exposer.unschedulable_grace = args.unschedulable_grace;
    let backends = Backends {
        upload_exposer: Arc::new(CsiBackupExposer::new(client.clone(), exposer.clone())),
        download_exposer: Arc::new(CsiRestoreExposer::new(client.clone(), exposer)),
        mover: Arc::new(RepoMover::new(repos)),
    };
    let mut config = AgentConfig::new(args.node_name.clone());
    config.namespace.clone_from(&args.namespace);
    config.data_mover.clone_from(&args.data_mover);
    config.concurrency = args.concurrency;
    config.progress_interval = args.progress_interval;
    config.prepare_timeout = args.prepare_timeout;
    config.lease_duration = args.lease_duration;
    let agent = Agent::start(client, config, backends).await.context("starting the agent")?;
    tracing::info!(node = %args.node_name, "agent running");
    eprintln!("ferry agent: running on node {} (namespace {})", args.node_name, args.namespace);
    cancel.cancelled().await;
    eprintln!("ferry agent: stopping");
    agent.shutdown().await;
    Ok(())
}

/// Waits until stopped: the holding pods' only job is to keep a volume attached and mounted.
pub async fn hold(cancel: &CancellationToken) -> anyhow::Result<()> {
    cancel.cancelled().await;
    Ok(())
}
