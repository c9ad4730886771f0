//! `ferry repo migrate`: the repository copied into a new one of the newest format, under the
//! same keys and with the same snapshots (`ferry_repo::migrate`). The old one is left as it
//! is: delete it once the new one is in use.

use anyhow::Context;
use ferry_repo::RepoFormat;
use tokio_util::sync::CancellationToken;

use crate::cli::RepoArgs;
use crate::{move_cmd, repo_cmds};

pub async fn migrate(
    args: &RepoArgs,
    to_url: &str,
    json: bool,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let source = repo_cmds::open_repo_uncached(args, cancel).await?;
    move_cmd::prepare_destination(&args.repo, to_url)?;
    let to_args = RepoArgs { repo: to_url.to_owned(), ..args.clone() };
    let target = repo_cmds::open_store(&to_args).await?;
    let format = RepoFormat::default();
    let (_, report) =
        ferry_repo::migrate(&source, target, format, 0, cancel).await.with_context(|| {
            format!("migrating {} to {to_url}; {} is unchanged", args.repo, args.repo)
        })?;
    if json {
        let value = serde_json::json!({
            "format": report.format,
            "resumed": report.resumed,
            "snapshots": report.snapshots,
            "blobs": report.blobs,
            "blobs_copied": report.blobs_copied,
            "packs_read": report.packs_read,
            "bytes_written": report.bytes_written,
            "keys_only_in_target": report.keys_only_in_target,
        });
        println!("{value}");
    } else {
        let again = if report.resumed { " (resumed)" } else { "" };
        println!(
            "migrated {} snapshots to {to_url}, format {}{again}: {} blobs ({} copied now, from \
             {} packs), {} bytes written; the same passwords open it; {} is unchanged (delete it \
             once the new repository is in use)",
            report.snapshots,
            report.format,
            report.blobs,
            report.blobs_copied,
            report.packs_read,
            report.bytes_written,
            args.repo
        );
    }
    if report.keys_only_in_target > 0 {
        eprintln!(
            "ferry: warning: {} key files of {to_url} are no longer in {}: the passwords removed \
             there since the first migration still open {to_url} (`ferry repo key remove --repo \
             {to_url} KEY_ID`)",
            report.keys_only_in_target, args.repo
        );
    }
    Ok(())
}
