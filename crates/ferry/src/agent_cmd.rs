//! `ferry agent`: one node's DataUpload/DataDownload controllers with the CSI exposers and the
//! repository data path; and `ferry hold`, what the pods holding exposed volumes run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_agent::{Agent, AgentConfig, Backends};
use ferry_api::GoDuration;
use ferry_api::k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use ferry_api::node_agent_config::NodeAgentConfig;
use ferry_cbt::ServiceAccount;
use ferry_expose::{CsiBackupExposer, CsiRestoreExposer, ExposerConfig};
use ferry_mover::{BslRepositories, ChangedBlocks, FixedRepository, RepoMover, RepositorySource};
use ferry_repo::{InitOptions, Repository};
use kube::api::Api;
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
    /// The agent's own pod (in `--namespace`; a DaemonSet passes it from the downward API):
    /// holding pods get its tolerations, but never the cordon's. Without it holding pods
    /// tolerate no taint.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
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
    /// At most this many DataUploads and DataDownloads in Accepted or Prepared at once,
    /// cluster-wide (Velero's `prepareQueueLength`; the ConfigMap's value wins). No limit when
    /// absent.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub prepare_queue_length: Option<u32>,
    /// How often bytes done are written to the CR (Go duration).
    #[arg(long, default_value = "3s", value_parser = duration)]
    pub progress_interval: Duration,
    /// How often a Progress Event (throughput, time left, bytes read, skipped, deduplicated
    /// and uploaded) is added to the CR while data moves (Go duration).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub progress_event_interval: Duration,
    /// How long a CR may wait for its volume (Go duration).
    #[arg(long, default_value = "30m", value_parser = duration)]
    pub prepare_timeout: Duration,
    /// Node liveness lease duration (Go duration).
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// How long a holding pod may be unschedulable before the CR fails (Go duration). A pod
    /// waiting only for its claim to be bound (a volume made from a snapshot can take minutes
    /// to provision) is not counted: the operation timeout bounds that wait, and past the
    /// grace a `WaitingForProvisioning` Event tells what the provisioner last said.
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
    /// A local cache of each repository's index files, snapshot manifests and tree packs
    /// (none unless `--cache-dir` is given; the manifests mount a size-limited emptyDir).
    #[command(flatten)]
    pub cache: crate::cli::CacheArgs,
    /// How often the snapshots of deleted backups are looked for (Go duration).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub deletion_interval: Duration,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, default_value = "0.0.0.0:8085")]
    pub metrics_address: std::net::SocketAddr,
    /// Velero's node-agent ConfigMap (in `--namespace`) to read concurrency, backup/restore
    /// PVC and pod settings from; `--concurrency` applies when it gives none.
    #[arg(long)]
    pub config_map: Option<String>,
    /// What file-system restores recreate of what grants privileges in a volume (device
    /// nodes, set-ID bits of root's files, `security.*`/`trusted.*` xattrs): `confined`
    /// withholds them unless a DataDownload's `dataMoverConfig` asks (`ferry.io/restore-*`
    /// keys), `full` restores them unless it declines.
    #[arg(long, value_enum, default_value_t = RestoreFidelity::Confined)]
    pub restore_fidelity: RestoreFidelity,
    /// Whether block backups ask the CSI driver's SnapshotMetadata service (changed-block
    /// tracking) which ranges to read: `auto` uses it where the driver offers one and reads
    /// the whole device otherwise, saying why; `off` always reads the whole device. Tokens
    /// are of the agent's own service account, bound to its pod (`--pod-name`).
    #[arg(long, value_enum, default_value_t = ChangedBlocksMode::Auto)]
    pub changed_blocks: ChangedBlocksMode,
    /// Keep each completed block backup's physical snapshot (its VolumeSnapshotContent set to
    /// `Retain`, labelled `ferry.io/kept-base=true`) so the next backup of the PVC asks the
    /// driver only for the blocks changed since (a delta) instead of reading every allocated
    /// range. Costs the storage one snapshot per block PVC between backups; it is released
    /// when a newer backup of the PVC completes or the backup is deleted. A source PVC's
    /// annotation `ferry.io/keep-base-snapshot: "true"` or `"false"` overrides this for its
    /// backups. Nothing is kept with `--changed-blocks off`.
    #[arg(long, env = "FERRY_KEEP_BASE_SNAPSHOT")]
    pub keep_base_snapshot: bool,
    /// Give a repository that only the password of Velero's `velero-repo-credentials` opens
    /// (as earlier versions of Ferry created them) a key for Ferry's own password. Off, such a
    /// repository is refused: anyone who can write to the bucket could put one keyed with
    /// Velero's published default password where a namespace's repository will be, and read
    /// every backup written into it. Turn it on to take over an earlier Ferry's repositories,
    /// then off again.
    #[arg(long, env = "FERRY_ADOPT_VELERO_KEYED_REPOSITORIES")]
    pub adopt_velero_keyed_repositories: bool,
}

/// Whether block backups use changed-block tracking (see [`AgentArgs::changed_blocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChangedBlocksMode {
    /// Where the CSI driver offers it.
    Auto,
    /// Never.
    Off,
}

/// The agent's default restore fidelity (see [`AgentArgs::restore_fidelity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestoreFidelity {
    /// Withhold device nodes, root's set-ID bits and privileged xattrs.
    Confined,
    /// Restore everything the snapshot recorded.
    Full,
}

impl RestoreFidelity {
    fn fidelity(self) -> ferry_repo::Fidelity {
        match self {
            Self::Confined => ferry_repo::Fidelity::CONFINED,
            Self::Full => ferry_repo::Fidelity::FULL,
        }
    }
}

/// The agent's own pod (`None` when it is not named).
async fn own_pod(client: &kube::Client, args: &AgentArgs) -> anyhow::Result<Option<Pod>> {
    let Some(name) = &args.pod_name else {
        tracing::warn!(
            "POD_NAME is not set: holding pods will tolerate no taint, and block backups \
             read whole devices (changed-block tracking needs the agent's service account)"
        );
        return Ok(None);
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &args.namespace);
    let pod = pods
        .get(name)
        .await
        .with_context(|| format!("reading the agent's own pod {}/{name}", args.namespace))?;
    Ok(Some(pod))
}

/// Changed-block tracking with tokens of the pod's service account, bound to the pod.
fn changed_blocks(
    client: &kube::Client,
    args: &AgentArgs,
    pod: Option<&Pod>,
) -> Option<ChangedBlocks> {
    if args.changed_blocks == ChangedBlocksMode::Off {
        return None;
    }
    let pod = pod?;
    let name = pod.metadata.name.as_deref()?;
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".to_owned());
    let account = ServiceAccount { namespace: args.namespace.clone(), name: account };
    Some(
        ChangedBlocks::new(client.clone(), account).bound_to_pod(name, pod.metadata.uid.as_deref()),
    )
}

/// Reads Velero's node-agent ConfigMap and the node's labels (for per-node concurrency).
async fn node_agent_config(
    client: &kube::Client,
    args: &AgentArgs,
    name: &str,
) -> anyhow::Result<(NodeAgentConfig, BTreeMap<String, String>)> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let map = maps
        .get(name)
        .await
        .with_context(|| format!("reading ConfigMap {}/{name}", args.namespace))?;
    let config = NodeAgentConfig::from_config_map_data(name, &map.data.unwrap_or_default())
        .with_context(|| format!("ConfigMap {}/{name}", args.namespace))?;
    config.validate().with_context(|| format!("ConfigMap {}/{name}", args.namespace))?;
    for key in config.unknown_keys() {
        tracing::warn!(configmap = name, %key, "unknown key ignored");
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let labels = match nodes.get(&args.node_name).await {
        Ok(node) => node.metadata.labels.unwrap_or_default(),
        Err(e) => {
            tracing::warn!(node = %args.node_name, error = %e, "cannot read the node's labels; per-node concurrency rules will not match");
            BTreeMap::new()
        }
    };
    Ok((config, labels))
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
                kms: crate::cli::KmsArgs::default(),
                // The agent keeps a cache only where it is told to (a bounded volume).
                cache: crate::cli::CacheArgs {
                    no_cache: args.cache.no_cache || args.cache.cache_dir.is_none(),
                    ..args.cache.clone()
                },
            };
            let repo: Repository = repo_cmds::open_repo(&repo_args, cancel).await?;
            Arc::new(FixedRepository::new(repo, url.clone()))
        }
        None => {
            let cache = args.cache.options(None);
            let bsl = Arc::new(
                BslRepositories::new(
                    client.clone(),
                    args.namespace.clone(),
                    InitOptions::default(),
                )
                .adopting_velero_keyed(args.adopt_velero_keyed_repositories)
                .with_cache(cache),
            );
            // Idle repositories give their memory back even when no CR comes.
            drop(bsl.spawn_idle_closer(cancel.clone()));
            bsl
        }
    };
    let mut exposer = ExposerConfig::new(args.pod_image.clone());
    exposer.namespace.clone_from(&args.namespace);
    exposer.kubelet_root.clone_from(&args.kubelet_root);
    exposer.node_name = Some(args.node_name.clone());
    exposer.unschedulable_grace = args.unschedulable_grace;
    let pod = own_pod(&client, args).await?;
    exposer.agent_tolerations =
        pod.as_ref().and_then(|p| p.spec.as_ref()?.tolerations.clone()).unwrap_or_default();
    let changed_blocks = changed_blocks(&client, args, pod.as_ref());
    // A base is kept only for changed-block tracking's deltas.
    exposer.keep_base_snapshot = changed_blocks.is_some().then_some(args.keep_base_snapshot);
    let mut concurrency = args.concurrency;
    let mut prepare_queue_length = args.prepare_queue_length.map(|n| n as usize);
    if let Some(name) = &args.config_map {
        let (config, labels) = node_agent_config(&client, args, name).await?;
        if config.load_concurrency.is_some() {
            concurrency = config.concurrency_for_node(&labels);
        }
        if let Some(n) = config.prepare_queue_length() {
            prepare_queue_length = Some(n);
        }
        exposer
            .apply_node_agent_config(&config)
            .with_context(|| format!("ConfigMap {}/{name}", args.namespace))?;
        let queue = prepare_queue_length.map_or_else(|| "no limit".to_owned(), |n| n.to_string());
        eprintln!(
            "ferry agent: configuration from ConfigMap {name}: concurrency {concurrency}, \
             prepare queue {queue}"
        );
    }
    // More movements at once than the pod's memory holds would have it killed mid-transfer:
    // at most what fits, saying so.
    let budget = ferry_repo::thread_budget::default_threads();
    if let Some(fits) = budget.max_jobs().filter(|&fits| fits < concurrency) {
        tracing::warn!(asked = concurrency, fits, threads = %budget, "concurrency lowered to what the pod's memory limit holds");
        eprintln!(
            "ferry agent: concurrency {concurrency} lowered to {fits}: the pod's memory limit \
             holds {fits} data movements at once ({budget}); raise the limit for more"
        );
        concurrency = fits;
    }
    let mut mover = RepoMover::new(Arc::clone(&repos))
        .with_fidelity(args.restore_fidelity.fidelity())
        .with_concurrent_jobs(concurrency);
    if let Some(changed_blocks) = changed_blocks {
        mover = mover.with_changed_blocks(changed_blocks);
    }
    let backends = Backends {
        upload_exposer: Arc::new(CsiBackupExposer::new(client.clone(), exposer.clone())),
        download_exposer: Arc::new(CsiRestoreExposer::new(client.clone(), exposer)),
        mover: Arc::new(mover),
    };
    let mut config = AgentConfig::new(args.node_name.clone());
    config.namespace.clone_from(&args.namespace);
    config.data_mover.clone_from(&args.data_mover);
    config.concurrency = concurrency;
    config.prepare_queue_length = prepare_queue_length;
    config.progress_interval = args.progress_interval;
    config.progress_event_interval = args.progress_event_interval;
    config.prepare_timeout = args.prepare_timeout;
    config.lease_duration = args.lease_duration;
    // The snapshot of a Completed DataUpload is held from the moment it is recorded, so the
    // reclaim loop below sees its deletion however soon it comes.
    config.completed_upload_finalizer = Some(ferry_mover::upload_finalizer::FINALIZER.to_owned());
    let client_for_deletions = client.clone();
    let client_for_bases = client.clone();
    let location_events = ferry_mover::space::LocationEvents::new(
        client.clone(),
        args.namespace.clone(),
        &args.node_name,
    );
    let agent = Agent::start(client, config, backends).await.context("starting the agent")?;
    let deletions = tokio::spawn(ferry_mover::deletion::keep_forgetting(
        client_for_deletions.clone(),
        args.namespace.clone(),
        args.data_mover.clone(),
        Arc::clone(&repos),
        location_events.clone(),
        args.deletion_interval,
        cancel.clone(),
    ));
    // Backup deletion without Ferry's plugin: Completed DataUploads are held by a finalizer
    // until Velero has deleted their backup (its files gone from the location, which this
    // reads) and the snapshot is forgotten.
    let locations = Arc::new(
        BslRepositories::new(
            client_for_deletions.clone(),
            args.namespace.clone(),
            InitOptions::default(),
        )
        .adopting_velero_keyed(args.adopt_velero_keyed_repositories),
    );
    let reclaimer = ferry_mover::upload_finalizer::Reclaimer {
        client: client_for_deletions,
        namespace: args.namespace.clone(),
        data_mover: args.data_mover.clone(),
        repos,
        metadata: locations,
        events: location_events,
    };
    let reclaims = tokio::spawn(ferry_mover::upload_finalizer::keep_reclaiming(
        reclaimer,
        args.deletion_interval,
        cancel.clone(),
    ));
    let kept_bases = tokio::spawn(release_orphaned_bases(
        client_for_bases,
        args.namespace.clone(),
        args.deletion_interval,
        cancel.clone(),
    ));
    let ready = Arc::new(AtomicBool::new(true));
    let server_stop = CancellationToken::new();
    let server = tokio::spawn(crate::serve::serve(
        args.metrics_address,
        agent.metrics(),
        Arc::clone(&ready),
        server_stop.clone(),
    ));
    tracing::info!(node = %args.node_name, "agent running");
    // Per data movement; the limit is the pod's (read again by each movement), shared by the
    // movements that run at once.
    tracing::info!(
        threads = %budget,
        concurrency,
        per_movement = budget.per_job(concurrency),
        "data-path threads"
    );
    eprintln!(
        "ferry agent: running on node {} (namespace {}); metrics and health on {}",
        args.node_name, args.namespace, args.metrics_address
    );
    let served = tokio::select! {
        () = cancel.cancelled() => Ok(()),
        result = server => result.context("metrics server task")?,
    };
    eprintln!("ferry agent: stopping");
    ready.store(false, Ordering::Relaxed);
    agent.shutdown().await;
    server_stop.cancel();
    deletions.abort();
    reclaims.abort();
    kept_bases.abort();
    served
}

/// Releases, every `interval`, the kept base snapshots whose backup was deleted.
async fn release_orphaned_bases(
    client: kube::Client,
    namespace: String,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        if let Err(e) = ferry_expose::release_orphaned_kept_bases(&client, &namespace).await {
            tracing::warn!(error = %e, "releasing the kept base snapshots of deleted backups failed; will retry");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Waits until stopped: the holding pods' only job is to keep a volume attached and mounted.
pub async fn hold(cancel: &CancellationToken) -> anyhow::Result<()> {
    cancel.cancelled().await;
    Ok(())
}
