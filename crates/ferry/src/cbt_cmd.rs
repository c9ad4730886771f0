//! `ferry cbt`: asks a CSI driver's SnapshotMetadata service (changed-block tracking) about a
//! VolumeSnapshot, as the agent does for block backups: which ranges hold data, or which
//! changed since a base snapshot. For operators checking that a driver's service works, and
//! what Ferry would read.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use ferry_api::{VolumeSnapshot, VolumeSnapshotContent};
use ferry_cbt::{BlockMap, BlockType, Connection, Query, Retry, Service, ServiceAccount, Tokens};
use kube::Api;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Subcommand)]
pub enum CbtCommand {
    /// The ranges of a VolumeSnapshot that hold data.
    Allocated(CbtArgs),
    /// The ranges of a VolumeSnapshot that changed since a base snapshot of the same volume.
    Delta {
        #[command(flatten)]
        args: CbtArgs,
        /// The base: a VolumeSnapshot in the same namespace (its content's snapshot handle is
        /// sent).
        #[arg(long, required_unless_present = "base_handle", conflicts_with = "base_handle")]
        base: Option<String>,
        /// The base by its CSI snapshot handle (the base VolumeSnapshot may be gone).
        #[arg(long, value_name = "HANDLE")]
        base_handle: Option<String>,
    },
    /// Base snapshots kept for the next delta (the agent's `--keep-base-snapshot`, a PVC's
    /// `ferry.io/keep-base-snapshot`): list them, or release them.
    Bases {
        #[command(subcommand)]
        command: BasesCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum BasesCommand {
    /// The kept base snapshots (and the pending ones, of backups that run), with their source
    /// PVC, the DataUpload that kept them and the physical snapshot's handle.
    List {
        /// Only those of PVCs in this namespace.
        #[arg(short, long)]
        namespace: Option<String>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Release base snapshots: each is set back to `Delete`, then deleted, so the driver's
    /// snapshotter deletes the physical snapshot (a content that stays `Terminating` means it
    /// could not; its events say why). The next backup of the PVC reads the allocated ranges
    /// instead of a delta; a pending one's backup, still running, keeps nothing. Agents release
    /// bases themselves; this is for bases left by an uninstalled Ferry, or storage wanted back.
    Release {
        /// VolumeSnapshotContent names (as `list` shows them).
        #[arg(
            value_name = "CONTENT",
            required_unless_present_any = ["namespace", "all"],
            conflicts_with_all = ["namespace", "all"]
        )]
        contents: Vec<String>,
        /// Every base of PVCs in this namespace.
        #[arg(short, long, conflicts_with = "all")]
        namespace: Option<String>,
        /// Every base in the cluster.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Args)]
pub struct CbtArgs {
    /// The VolumeSnapshot (ready to use).
    snapshot: String,
    /// Its namespace.
    #[arg(short, long, default_value = "default")]
    namespace: String,
    /// The service account whose token is presented, `NAMESPACE/NAME`: the service lets it
    /// read the snapshot's metadata if it may `get` the VolumeSnapshot; the caller needs
    /// `create` on that account's `serviceaccounts/token`.
    #[arg(
        long,
        env = "FERRY_SERVICE_ACCOUNT",
        value_name = "NAMESPACE/NAME",
        required_unless_present = "token_file"
    )]
    service_account: Option<String>,
    /// A file holding a token already scoped to the service's audience, sent as it is.
    #[arg(long, value_name = "PATH", conflicts_with = "service_account")]
    token_file: Option<PathBuf>,
    /// Ranges per response asked of the service (0: the service chooses).
    #[arg(long, default_value_t = 0)]
    max_results: i32,
    /// Print one JSON object with every range.
    #[arg(long)]
    json: bool,
}

pub async fn run(command: &CbtCommand, cancel: &CancellationToken) -> anyhow::Result<()> {
    let client = crate::pvc::connect().await?;
    let (args, base) = match command {
        CbtCommand::Bases { command } => return bases(&client, command).await,
        CbtCommand::Allocated(args) => (args, None),
        CbtCommand::Delta { args, base, base_handle } => {
            let handle = match (base, base_handle) {
                (_, Some(handle)) => handle.clone(),
                (Some(base), None) => snapshot_content(&client, &args.namespace, base)
                    .await?
                    .status
                    .and_then(|s| s.snapshot_handle)
                    .with_context(|| {
                        format!(
                            "the content of base snapshot {}/{base} has no snapshot handle yet",
                            args.namespace
                        )
                    })?,
                (None, None) => anyhow::bail!("a delta needs --base or --base-handle"),
            };
            (args, Some(handle))
        }
    };
    let content = snapshot_content(&client, &args.namespace, &args.snapshot).await?;
    let driver = content.spec.driver;
    let service = Service::discover(client.clone(), &driver).await?;
    let tokens = match (&args.token_file, &args.service_account) {
        (Some(path), _) => {
            let token = std::fs::read_to_string(path)
                .with_context(|| format!("reading the token file {}", path.display()))?;
            Tokens::fixed(token.trim().to_owned(), &service.audience)
        }
        (None, Some(account)) => {
            let account = ServiceAccount::parse(account).map_err(anyhow::Error::msg)?;
            Tokens::new(client.clone(), account, &service.audience)
        }
        (None, None) => anyhow::bail!("give --service-account or --token-file"),
    };
    let channel = service.connect().await?;
    let retry = Retry { max_results: args.max_results, ..Retry::default() };
    let connection = Connection::new(channel, tokens, retry);
    let query = match base {
        None => {
            Query::Allocated { namespace: args.namespace.clone(), snapshot: args.snapshot.clone() }
        }
        Some(base_handle) => Query::Delta {
            namespace: args.namespace.clone(),
            base_handle,
            target: args.snapshot.clone(),
        },
    };
    let map = connection.query(&query, cancel).await?;
    print(args, &driver, &query, &map)
}

/// The VolumeSnapshot's bound content.
async fn snapshot_content(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<VolumeSnapshotContent> {
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), namespace);
    let snapshot = snapshots
        .get(name)
        .await
        .with_context(|| format!("reading VolumeSnapshot {namespace}/{name}"))?;
    let content_name =
        snapshot.status.and_then(|s| s.bound_volume_snapshot_content_name).with_context(|| {
            format!("VolumeSnapshot {namespace}/{name} is not bound to a content yet")
        })?;
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    contents.get(&content_name).await.with_context(|| {
        format!("reading VolumeSnapshotContent {content_name} of {namespace}/{name}")
    })
}

fn print(args: &CbtArgs, driver: &str, query: &Query, map: &BlockMap) -> anyhow::Result<()> {
    let call = query.call();
    let base = match query {
        Query::Allocated { .. } => None,
        Query::Delta { base_handle, .. } => Some(base_handle.as_str()),
    };
    let block_type = map.block_type.map(BlockType::as_str);
    if args.json {
        let ranges: Vec<_> = map
            .ranges
            .iter()
            .map(|r| serde_json::json!({"offset": r.offset, "length": r.len}))
            .collect();
        let out = serde_json::json!({
            "namespace": args.namespace,
            "snapshot": args.snapshot,
            "baseSnapshotHandle": base,
            "driver": driver,
            "call": call,
            "capacityBytes": map.capacity,
            "blockMetadataType": block_type,
            "bytes": map.bytes(),
            "ranges": ranges,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let of = match (map.capacity, block_type) {
            (Some(capacity), Some(kind)) => format!(" of {capacity} ({kind} blocks)"),
            _ => " (the service sent no response: nothing)".to_owned(),
        };
        println!(
            "{}/{} ({driver}, {call}{}): {} ranges, {} bytes{of}",
            args.namespace,
            args.snapshot,
            base.map(|b| format!(" since {b}")).unwrap_or_default(),
            map.ranges.len(),
            map.bytes(),
        );
    }
    Ok(())
}

async fn bases(client: &kube::Client, command: &BasesCommand) -> anyhow::Result<()> {
    match command {
        BasesCommand::List { namespace, json } => {
            let bases = ferry_expose::kept_bases(client, namespace.as_deref()).await?;
            if *json {
                let list: Vec<_> = bases.iter().map(base_json).collect();
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({"bases": list}))?);
            } else if bases.is_empty() {
                println!("no kept base snapshots{}", of_namespace(namespace.as_deref()));
            } else {
                for base in &bases {
                    println!("{}", base_line(base));
                }
            }
            Ok(())
        }
        BasesCommand::Release { contents, namespace, all } => {
            let bases = ferry_expose::kept_bases(client, namespace.as_deref()).await?;
            let names: Vec<String> = if contents.is_empty() {
                debug_assert!(*all || namespace.is_some(), "clap requires one");
                if bases.is_empty() {
                    println!("no kept base snapshots{}", of_namespace(namespace.as_deref()));
                }
                bases.into_iter().map(|b| b.content).collect()
            } else {
                // Every name checked before any is released: a typo releases nothing.
                let not_bases: Vec<&str> = contents
                    .iter()
                    .filter(|name| !bases.iter().any(|b| &b.content == *name))
                    .map(String::as_str)
                    .collect();
                if !not_bases.is_empty() {
                    anyhow::bail!(
                        "not a kept base snapshot (no VolumeSnapshotContent labelled {}): {}; \
                         nothing released",
                        ferry_expose::KEPT_BASE_LABEL,
                        not_bases.join(", ")
                    );
                }
                contents.clone()
            };
            for name in &names {
                // One gone meanwhile was released by its agent.
                if ferry_expose::release_kept_base(client, name).await? {
                    println!("released {name}");
                }
            }
            Ok(())
        }
    }
}

fn of_namespace(namespace: Option<&str>) -> String {
    namespace.map(|ns| format!(" of PVCs in {ns}")).unwrap_or_default()
}

fn base_json(base: &ferry_expose::KeptBase) -> serde_json::Value {
    serde_json::json!({
        "content": base.content,
        "state": if base.completed { "kept" } else { "pending" },
        "source": base.source,
        "dataUpload": base.data_upload,
        "completedAt": base.completed_at,
        "driver": base.driver,
        "snapshotHandle": base.snapshot_handle,
        "releasing": base.releasing,
    })
}

fn base_line(base: &ferry_expose::KeptBase) -> String {
    let state = match (base.completed, base.releasing) {
        (_, true) => "releasing",
        (true, false) => "kept",
        (false, false) => "pending",
    };
    let when = base
        .completed_at
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map(|t| format!(", completed {t}"))
        .unwrap_or_default();
    let handle =
        if base.snapshot_handle.is_empty() { "(no handle yet)" } else { &base.snapshot_handle };
    format!(
        "{} {state}: {} by {}{when}; {} {handle}",
        base.content, base.source, base.data_upload, base.driver
    )
}
