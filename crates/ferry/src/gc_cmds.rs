//! `forget` and `gc`.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_repo::gc::{GcOptions, GcReport, SweepReport};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cli::RepoArgs;
use crate::progress::human;
use crate::repo_cmds::open_repo;

#[derive(Debug, Args)]
pub struct ForgetArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Print JSON: {"forgotten": [ids]}.
    #[arg(long)]
    pub json: bool,
    /// Snapshot IDs (or unique prefixes of at least 4 hex digits).
    #[arg(required = true)]
    pub snapshots: Vec<String>,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Seconds to wait for backups that were running when gc marked; if they are still
    /// running then, the mark stays and the next gc finishes the job.
    #[arg(long, default_value_t = 300)]
    pub wait: u64,
    /// Rewrite a pack still in use when at least this fraction of it is garbage.
    #[arg(long, default_value_t = 0.5, value_parser = parse_fraction)]
    pub repack_fraction: f64,
    /// ...and at least this many of its bytes are garbage.
    #[arg(long, default_value_t = 1 << 20)]
    pub repack_min_bytes: u64,
    /// Largest clock difference between nodes using the repository, in seconds.
    #[arg(long, default_value_t = 120)]
    pub max_clock_skew: u64,
    /// Print a JSON report.
    #[arg(long)]
    pub json: bool,
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{text:?} is not a fraction between 0 and 1")),
    }
}

#[derive(Serialize)]
struct ForgetJson {
    forgotten: Vec<String>,
}

pub async fn forget(args: &ForgetArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    let repo = open_repo(&args.repo, cancel).await?;
    // Resolve every id first: nothing is deleted when one of them is wrong.
    let mut ids = Vec::new();
    for query in &args.snapshots {
        let id = repo
            .find_snapshot(query, cancel)
            .await
            .with_context(|| format!("finding snapshot {query}"))?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ferry_repo::gc::forget(&repo, &ids, cancel).await.context("forgetting snapshots")?;
    if args.json {
        let json = ForgetJson { forgotten: ids.iter().map(ToString::to_string).collect() };
        println!("{}", serde_json::to_string(&json)?);
    } else {
        for id in &ids {
            println!("forgot {id}");
        }
        eprintln!("forget: run `ferry gc` to reclaim their space");
    }
    Ok(())
}

#[derive(Serialize)]
struct GcJson {
    /// `done`, or `pending` when backups that predate the mark are still running.
    state: &'static str,
    deleted_packs: u64,
    deleted_bytes: u64,
    revived_packs: u64,
    condemned_packs: u64,
    repacked_packs: u64,
    repack_written_bytes: u64,
    referenced_blobs: u64,
    snapshots: u64,
    waiting_for_writers: u64,
}

fn to_json(report: &GcReport) -> GcJson {
    let (deleted_packs, deleted_bytes) = report.deleted();
    let mark = report.mark.clone().unwrap_or_default();
    let revived = [report.earlier.as_ref(), Some(&report.sweep)]
        .into_iter()
        .flatten()
        .map(|s| if let SweepReport::Swept(s) = s { s.revived_packs } else { 0 })
        .sum();
    GcJson {
        state: if report.pending() { "pending" } else { "done" },
        deleted_packs,
        deleted_bytes,
        revived_packs: revived,
        condemned_packs: mark.condemned_packs,
        repacked_packs: mark.repacked_packs,
        repack_written_bytes: mark.repack_written_bytes,
        referenced_blobs: mark.referenced_blobs,
        snapshots: mark.snapshots,
        waiting_for_writers: match report.sweep {
            SweepReport::Waiting { writers } => writers,
            _ => 0,
        },
    }
}

pub async fn gc(args: &GcArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    let repo = open_repo(&args.repo, cancel).await?;
    let options = GcOptions {
        repack_dead_fraction: args.repack_fraction,
        repack_min_dead_bytes: args.repack_min_bytes,
        wait: Duration::from_secs(args.wait),
        max_clock_skew: Duration::from_secs(args.max_clock_skew),
        ..GcOptions::default()
    };
    let report = ferry_repo::gc::gc(&repo, &options, cancel).await.context("collecting garbage")?;
    let json = to_json(&report);
    if args.json {
        println!("{}", serde_json::to_string(&json)?);
        return Ok(());
    }
    println!(
        "gc: {} snapshots, {} referenced blobs; deleted {} packs ({}), repacked {} packs",
        json.snapshots,
        json.referenced_blobs,
        json.deleted_packs,
        human(json.deleted_bytes),
        json.repacked_packs
    );
    if report.pending() {
        println!(
            "gc: {} backups that started before the mark are still running; run gc again \
             after they finish to delete the {} marked packs",
            json.waiting_for_writers, json.condemned_packs
        );
    }
    Ok(())
}
