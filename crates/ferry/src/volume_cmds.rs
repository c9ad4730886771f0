//! Volume snapshots from the command line: `backup` of a block device (or `--volume` image
//! file) and `restore` of a volume snapshot onto a device or image file.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use anyhow::Context;
use ferry_repo::{Repository, SnapshotId, SnapshotKind, VolumeBackupOptions, VolumeRestoreOptions};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cli::{BackupArgs, RestoreArgs};
use crate::progress;
use crate::repo_cmds::open_repo_writing;

/// Whether `backup PATH` makes a volume snapshot: PATH is a block device, or `--volume` was
/// given (then PATH must be a block device or a regular file).
pub fn is_volume_source(path: &Path, volume_flag: bool) -> anyhow::Result<bool> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("backup source {}", path.display()))?;
    let ft = meta.file_type();
    if ft.is_block_device() {
        return Ok(true);
    }
    if volume_flag {
        anyhow::ensure!(
            ft.is_file(),
            "backup source {}: --volume needs a block device or a regular image file",
            path.display()
        );
        return Ok(true);
    }
    Ok(false)
}

#[derive(Serialize)]
struct VolumeBackupJson {
    snapshot_id: String,
    kind: &'static str,
    bytes_total: u64,
    bytes_new: u64,
    bytes_stored: u64,
    files: u64,
    dirs: u64,
    errors: u64,
    duration_s: f64,
    bytes_data: u64,
    bytes_read: u64,
    bytes_skipped: u64,
    chunks: u64,
}

pub async fn backup(args: &BackupArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    let repo = open_repo_writing(&args.repo, cancel).await?;
    let source = std::fs::canonicalize(&args.path)
        .with_context(|| format!("backup source {}", args.path.display()))?;
    let host = args.host.clone().unwrap_or_else(ferry_repo::hostname);
    let parent = crate::snapshot_arg::find_parent(
        &repo,
        args.parent.as_deref(),
        &source.display().to_string(),
        &host,
        ferry_repo::SnapshotKind::Volume,
        cancel,
    )
    .await?;
    let options = VolumeBackupOptions {
        parent,
        tags: args.tags.clone(),
        source: source.display().to_string(),
        hostname: Some(host),
        compression_level: args
            .compression
            .unwrap_or(VolumeBackupOptions::default().compression_level),
        ..VolumeBackupOptions::default()
    };
    let (report, bar) = progress::reporter("backup");
    let summary = ferry_repo::backup_volume(&repo, &source, &options, Some(report), cancel)
        .await
        .with_context(|| format!("backing up volume {}", source.display()));
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let s = summary?;
    if args.json {
        let json = VolumeBackupJson {
            snapshot_id: s.snapshot_id.to_string(),
            kind: SnapshotKind::Volume.as_str(),
            bytes_total: s.size,
            bytes_new: s.bytes_new,
            bytes_stored: s.bytes_stored,
            files: 0,
            dirs: 0,
            errors: 0,
            duration_s: s.duration.as_secs_f64(),
            bytes_data: s.bytes_data,
            bytes_read: s.bytes_read,
            bytes_skipped: s.bytes_skipped,
            chunks: s.chunks,
        };
        println!("{}", serde_json::to_string(&json)?);
    } else {
        eprintln!(
            "backup: volume of {}, {} read, {} unallocated or zero, {} new, {} stored, in {:.2} s",
            progress::human(s.size),
            progress::human(s.bytes_read),
            progress::human(s.bytes_skipped),
            progress::human(s.bytes_new),
            progress::human(s.bytes_stored),
            s.duration.as_secs_f64()
        );
        println!("{}", s.snapshot_id);
    }
    Ok(())
}

/// Restores `id` if it is a volume snapshot (returns `true`); refuses a tree snapshot onto a
/// block device or file; returns `false` for a tree snapshot going into a directory.
pub async fn restore_if_volume(
    repo: &Repository,
    id: &SnapshotId,
    args: &RestoreArgs,
    cancel: &CancellationToken,
) -> anyhow::Result<bool> {
    let snapshot =
        repo.load_snapshot(id, cancel).await.with_context(|| format!("reading snapshot {id}"))?;
    let kind = snapshot.kind().with_context(|| format!("snapshot {id}"))?;
    let target = &args.target;
    if kind != SnapshotKind::Volume {
        if let Ok(meta) = std::fs::metadata(target) {
            let ft = meta.file_type();
            anyhow::ensure!(
                !ft.is_block_device() && !ft.is_file(),
                "snapshot {id} is a {kind} snapshot: it restores into a directory, not onto {} {}",
                if ft.is_block_device() { "block device" } else { "file" },
                target.display()
            );
        }
        return Ok(false);
    }
    let options = VolumeRestoreOptions {
        target_zeroed: args.target_zeroed,
        ..VolumeRestoreOptions::default()
    };
    let (report, bar) = progress::reporter("restore");
    let summary = ferry_repo::restore_volume(repo, id, target, &options, Some(report), cancel)
        .await
        .with_context(|| format!("restoring volume {id} onto {}", target.display()));
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let s = summary?;
    eprintln!(
        "restore: volume of {} onto {}{}: {} written{}, {} zero, in {:.2} s",
        progress::human(s.size),
        target.display(),
        if s.created { " (created)" } else { "" },
        progress::human(s.bytes_written),
        match s.bytes_direct {
            0 => String::new(),
            d if d == s.bytes_written => " (direct I/O)".to_owned(),
            d => format!(" ({} with direct I/O)", progress::human(d)),
        },
        progress::human(s.bytes_zero),
        s.duration.as_secs_f64()
    );
    Ok(true)
}
