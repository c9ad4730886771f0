//! The repository commands: `repo init`, `backup`, `restore`, `snapshots`, `check`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use ferry_repo::{
    BackupOptions, CacheOptions, InitOptions, InitOutcome, OpenOptions, RepoError, Repository,
    RestoreOptions, Snapshot, SnapshotId, SnapshotKind,
};
use ferry_store::{AnyStore, AwsKms, KeyWrapper, KmsOptions, ObjectStore, S3Options, StoreUrl};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cli::{BackupArgs, CacheArgs, RepoArgs, RestoreArgs};
use crate::{password, progress};

/// The store at `args.repo`, with the S3 flags of `args`.
pub(crate) async fn open_store(args: &RepoArgs) -> anyhow::Result<Arc<dyn ObjectStore>> {
    let url = StoreUrl::parse(&args.repo)?;
    let options = S3Options {
        endpoint: args.s3_endpoint.clone(),
        region: args.s3_region.clone(),
        force_path_style: args.s3_endpoint.is_some(),
        ..S3Options::default()
    };
    if let Some(endpoint) = options.plain_http_endpoint() {
        tracing::warn!(
            endpoint,
            "the S3 endpoint is plain HTTP: object names, sizes and request signatures cross the network readable, and anyone on the path can withhold or delete objects (their contents stay encrypted and authenticated); use https"
        );
    }
    let store = AnyStore::open(&url, &options)
        .await
        .with_context(|| format!("opening storage {}", args.repo))?;
    Ok(Arc::new(store))
}

/// The KMS `--kms-key-id` asks for, if any: it wraps new key files and unwraps the
/// repository's KMS-wrapped ones (each with the key it names). Makes no call to KMS yet.
pub(crate) async fn key_wrapper(args: &RepoArgs) -> anyhow::Result<Option<Arc<dyn KeyWrapper>>> {
    let Some(key_id) = &args.kms.kms_key_id else {
        if args.kms.kms_endpoint.is_some() || args.kms.kms_region.is_some() {
            anyhow::bail!("--kms-endpoint and --kms-region need --kms-key-id (FERRY_KMS_KEY_ID)");
        }
        return Ok(None);
    };
    let options = KmsOptions {
        endpoint: args.kms.kms_endpoint.clone(),
        region: args.kms.kms_region.clone().or_else(|| args.s3_region.clone()),
        ..KmsOptions::new(key_id.clone())
    };
    let kms = AwsKms::new(options).await.with_context(|| format!("setting up KMS key {key_id}"))?;
    Ok(Some(Arc::new(kms)))
}

/// Opens the repository, with the local cache the arguments ask for.
pub(crate) async fn open_repo(
    args: &RepoArgs,
    cancel: &CancellationToken,
) -> anyhow::Result<Repository> {
    open_repo_for(args, Creates::No, cancel).await
}

/// [`open_repo`] for a command that will create objects (a backup or a restore writes a
/// lease): the store's one-time check before its first create runs while the repository
/// opens.
pub(crate) async fn open_repo_writing(
    args: &RepoArgs,
    cancel: &CancellationToken,
) -> anyhow::Result<Repository> {
    open_repo_for(args, Creates::Yes, cancel).await
}

/// Whether the command will create objects in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Creates {
    No,
    Yes,
}

async fn open_repo_for(
    args: &RepoArgs,
    creates: Creates,
    cancel: &CancellationToken,
) -> anyhow::Result<Repository> {
    let repo = open_repo_uncached_for(args, creates, cancel).await?;
    if let Some(options) = cache_options(&args.cache, &StoreUrl::parse(&args.repo)?) {
        repo.set_cache(&options);
    }
    Ok(repo)
}

/// Opens the repository without a local cache: every object is read from the store.
pub(crate) async fn open_repo_uncached(
    args: &RepoArgs,
    cancel: &CancellationToken,
) -> anyhow::Result<Repository> {
    open_repo_uncached_for(args, Creates::No, cancel).await
}

async fn open_repo_uncached_for(
    args: &RepoArgs,
    creates: Creates,
    cancel: &CancellationToken,
) -> anyhow::Result<Repository> {
    let password = password::read(args.password_file.as_deref())?;
    let store = open_store(args).await?;
    let options = OpenOptions {
        hint: None,
        key_wrapper: key_wrapper(args).await?,
        prepare_creates: creates == Creates::Yes,
    };
    Repository::open_with(store, &password, &options, cancel).await.map_err(|e| {
        let needs_kms = matches!(e, RepoError::KmsKeyNeeded { .. });
        let how = if needs_kms { " (give --kms-key-id or FERRY_KMS_KEY_ID)" } else { "" };
        anyhow::Error::new(e).context(format!("opening repository {}{how}", args.repo))
    })
}

/// Where the cache of `url`'s repository goes: `--cache-dir`, else the user's cache folder
/// for S3 repositories (a file repository is on local disk already); none with `--no-cache`.
fn cache_options(args: &CacheArgs, url: &StoreUrl) -> Option<CacheOptions> {
    let default_dir = match url {
        StoreUrl::File { .. } => None,
        _ => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
            .map(|base| base.join("ferry").join("repos")),
    };
    args.options(default_dir)
}

pub async fn init(
    args: &RepoArgs,
    pack_size_mib: Option<u32>,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let password = password::read(args.password_file.as_deref())?;
    if let StoreUrl::File { root } = StoreUrl::parse(&args.repo)? {
        std::fs::create_dir_all(&root)
            .with_context(|| format!("creating repository directory {}", root.display()))?;
    }
    let store = open_store(args).await?;
    let mut options = InitOptions {
        refuse_weak_password: true,
        key_wrapper: key_wrapper(args).await?,
        ..InitOptions::default()
    };
    if let Some(mib) = pack_size_mib {
        options.packs.target_size = mib << 20;
    }
    let (repo, outcome) = Repository::init(store, &password, &options, cancel)
        .await
        .with_context(|| format!("initialising repository {}", args.repo))?;
    match outcome {
        InitOutcome::Created => match repo.kms_key_id() {
            Some(kms) => println!(
                "created repository {}: opening it needs the password and KMS key {kms}",
                args.repo
            ),
            None => println!("created repository {}", args.repo),
        },
        InitOutcome::AlreadyExisted => {
            println!("repository {} already exists; opened it", args.repo);
            let existing = repo.config().packs.target_size;
            if pack_size_mib.is_some() && existing != options.packs.target_size {
                eprintln!(
                    "ferry: warning: --pack-size-mib ignored: the repository's packs are {} MiB",
                    existing >> 20
                );
            }
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct BackupJson {
    snapshot_id: String,
    kind: &'static str,
    bytes_total: u64,
    bytes_new: u64,
    bytes_stored: u64,
    files: u64,
    dirs: u64,
    errors: u64,
    duration_s: f64,
}

pub async fn backup(args: &BackupArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    let exclude = exclude_patterns(args)?;
    if crate::volume_cmds::is_volume_source(&args.path, args.volume)? {
        if !exclude.is_empty() {
            anyhow::bail!(
                "{} is backed up as a volume (whole device or image): --exclude applies to \
                 directories only",
                args.path.display()
            );
        }
        return crate::volume_cmds::backup(args, cancel).await;
    }
    let repo = open_repo_writing(&args.repo, cancel).await?;
    let source = std::fs::canonicalize(&args.path)
        .with_context(|| format!("backup source {}", args.path.display()))?;
    warn_of_absolute_excludes(&exclude, &source);
    let host = args.host.clone().unwrap_or_else(ferry_repo::hostname);
    let parent = crate::snapshot_arg::find_parent(
        &repo,
        args.parent.as_deref(),
        &source.display().to_string(),
        &host,
        SnapshotKind::Tree,
        cancel,
    )
    .await?;
    let options = BackupOptions {
        parent,
        tags: args.tags.clone(),
        source: source.display().to_string(),
        hostname: Some(host),
        compression_level: args.compression.unwrap_or(BackupOptions::default().compression_level),
        exclude,
        ..BackupOptions::default()
    };
    let (report, bar) = progress::reporter("backup");
    let summary = ferry_repo::backup_tree(&repo, &source, &options, Some(report), cancel)
        .await
        .with_context(|| format!("backing up {}", source.display()));
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let summary = summary?;
    if summary.errors > 0 {
        eprintln!(
            "backup: {} entries could not be read; they are recorded in the snapshot",
            summary.errors
        );
    }
    if args.json {
        let json = BackupJson {
            snapshot_id: summary.snapshot_id.to_string(),
            kind: "tree",
            bytes_total: summary.bytes_total,
            bytes_new: summary.bytes_new,
            bytes_stored: summary.bytes_stored,
            files: summary.files,
            dirs: summary.dirs,
            errors: summary.errors,
            duration_s: summary.duration.as_secs_f64(),
        };
        println!("{}", serde_json::to_string(&json)?);
    } else {
        eprintln!(
            "backup: {} files, {} total, {} new, {} stored, in {:.2} s",
            summary.files,
            progress::human(summary.bytes_total),
            progress::human(summary.bytes_new),
            progress::human(summary.bytes_stored),
            summary.duration.as_secs_f64()
        );
        println!("{}", summary.snapshot_id);
    }
    Ok(())
}

/// `--exclude` patterns and those of `--exclude-file`.
fn exclude_patterns(args: &BackupArgs) -> anyhow::Result<Vec<String>> {
    let mut patterns = args.exclude.clone();
    if let Some(file) = &args.exclude_file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading exclude file {}", file.display()))?;
        patterns.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned),
        );
    }
    Ok(patterns)
}

/// Patterns with `/` start at the backup root; one spelled as an absolute path under the root
/// (`/home/alice/.cache` when backing up `/home`) would match nothing, so say how to write it.
fn warn_of_absolute_excludes(patterns: &[String], source: &Path) {
    let root = source.display().to_string();
    if root == "/" {
        return;
    }
    for pattern in patterns {
        if let Some(rest) = pattern.strip_prefix(&root).and_then(|r| r.strip_prefix('/')) {
            eprintln!(
                "ferry: warning: exclude pattern {pattern:?} is read from the backup root \
                 {root}; for the path it names, write \"/{rest}\""
            );
        }
    }
}

pub async fn restore(args: &RestoreArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    let repo = open_repo_writing(&args.repo, cancel).await?;
    let id: SnapshotId = crate::snapshot_arg::find(&repo, &args.snapshot, None, cancel).await?;
    // A path inside the snapshot only exists in a tree; the library says so for a volume.
    if args.path.is_none()
        && crate::volume_cmds::restore_if_volume(&repo, &id, args, cancel).await?
    {
        return Ok(());
    }
    let options = RestoreOptions {
        sparse: args.sparse,
        subtree: args.path.clone(),
        ..RestoreOptions::default()
    };
    let (report, bar) = progress::reporter("restore");
    let summary = ferry_repo::restore(&repo, &id, &args.target, &options, Some(report), cancel)
        .await
        .with_context(|| format!("restoring {id} into {}", args.target.display()));
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let summary = summary?;
    for warning in &summary.warnings {
        eprintln!("restore: warning: {warning}");
    }
    eprintln!(
        "restore: {} files, {} dirs, {} in {:.2} s into {}",
        summary.files,
        summary.dirs,
        progress::human(summary.bytes),
        summary.duration.as_secs_f64(),
        args.target.display()
    );
    // Last, where it is seen: what did not come back as it was. The restore wrote all the
    // snapshot holds, so the exit status stays 0 (as a backup's with unreadable entries).
    if let Some(note) = summary.shortfall(0) {
        eprintln!("restore: warning: {note}");
    }
    Ok(())
}

#[derive(Serialize)]
struct SnapshotJson {
    id: String,
    kind: &'static str,
    time: String,
    hostname: String,
    source: String,
    tags: std::collections::BTreeMap<String, String>,
    parent: Option<String>,
    bytes: u64,
    bytes_new: u64,
    files: u64,
}

pub async fn snapshots(
    args: &RepoArgs,
    json: bool,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let repo = open_repo(args, cancel).await?;
    let (list, damaged) = repo.readable_snapshots(cancel).await.context("listing snapshots")?;
    for e in &damaged {
        eprintln!("ferry: warning: {e}");
    }
    let listed = print_snapshots(&list, json);
    match damaged.len() {
        0 => listed,
        n => listed.and_then(|()| {
            anyhow::bail!(
                "{n} snapshot(s) could not be read (see the warnings above); the others are listed"
            )
        }),
    }
}

/// A recorded time as RFC 3339 in UTC (empty when out of range).
pub(crate) fn time_text(t: &ferry_repo::format::Timestamp) -> String {
    jiff::Timestamp::new(t.sec, i32::try_from(t.nsec).unwrap_or(0))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn print_snapshots(list: &[(SnapshotId, Snapshot)], json: bool) -> anyhow::Result<()> {
    let rows: Vec<SnapshotJson> = list
        .iter()
        .map(|(id, s)| SnapshotJson {
            id: id.to_string(),
            kind: s.kind().map_or("unknown", |k| k.as_str()),
            time: time_text(&s.time),
            hostname: s.hostname.clone(),
            source: s.source.clone(),
            tags: s.tags.iter().cloned().collect(),
            parent: s.parent.as_ref().map(ToString::to_string),
            bytes: s.summary.bytes_total,
            bytes_new: s.summary.bytes_new,
            files: s.summary.files,
        })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<6} {:<25} {:>10} {:>10} {:>8}  source",
        "id", "kind", "time", "size", "new", "files"
    );
    for row in rows {
        println!(
            "{:<16} {:<6} {:<25} {:>10} {:>10} {:>8}  {}",
            &row.id[..16.min(row.id.len())],
            row.kind,
            row.time,
            progress::human(row.bytes),
            progress::human(row.bytes_new),
            row.files,
            row.source
        );
    }
    Ok(())
}

pub async fn check(
    args: &RepoArgs,
    options: ferry_repo::CheckOptions,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    // Never through the cache: check is about what the store holds.
    let repo = open_repo_uncached(args, cancel).await?;
    let report =
        ferry_repo::check(&repo, options, None, cancel).await.context("checking the repository")?;
    println!(
        "checked {} snapshots, {} trees, {} data blobs, {} packs{}",
        report.snapshots,
        report.trees,
        report.data_blobs,
        report.packs,
        if options.read_data {
            format!(
                " ({} packs{}, {} read and authenticated)",
                report.packs_read,
                if options.subset.is_some() { " of the subset" } else { "" },
                progress::human(report.bytes_read)
            )
        } else {
            String::new()
        }
    );
    if report.unindexed_packs > 0 {
        println!(
            "{} packs not yet indexed (an interrupted or running backup)",
            report.unindexed_packs
        );
    }
    for problem in &report.problems {
        println!("problem: {problem}");
    }
    if report.is_ok() {
        println!("no problems found");
        Ok(())
    } else {
        anyhow::bail!("the repository has {} problem(s)", report.problems.len())
    }
}
