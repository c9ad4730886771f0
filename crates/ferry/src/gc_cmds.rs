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
use crate::retention::Policy;

#[derive(Debug, Args)]
pub struct ForgetArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Print JSON: {"forgotten": [ids]}, with a policy also "kept": [{"id", "reasons"}].
    #[arg(long)]
    pub json: bool,
    /// Snapshot IDs (or unique prefixes of at least 4 hex digits); or give a policy instead.
    pub snapshots: Vec<String>,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// A retention policy, applied to each group of snapshots of the same host and source.
/// Snapshots made for Velero's DataUploads are never forgotten by a policy (deleting the
/// Velero backup does that).
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Keep the N newest snapshots.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_last: u32,
    /// Keep the newest snapshot of each of the N latest hours that have one (UTC).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_hourly: u32,
    /// ... of each of the N latest days (UTC).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_daily: u32,
    /// ... of each of the N latest ISO weeks.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_weekly: u32,
    /// ... of each of the N latest months.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_monthly: u32,
    /// ... of each of the N latest years.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_yearly: u32,
    /// Keep every snapshot at most this long before the group's newest (e.g. `14d`,
    /// `2 weeks`, `6mo`, `1y`; months are `mo`, minutes `min`).
    #[arg(long, value_name = "SPAN", value_parser = parse_span)]
    pub keep_within: Option<jiff::Span>,
    /// Keep every snapshot with this tag (repeatable).
    #[arg(long = "keep-tag", value_name = "K=V", value_parser = crate::cli::parse_tag)]
    pub keep_tags: Vec<(String, String)>,
    /// Apply the policy only to snapshots of this source (as `ferry snapshots` shows it).
    #[arg(long, value_name = "SOURCE")]
    pub source: Option<String>,
    /// Show what the policy keeps and forgets; forget nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl PolicyArgs {
    fn policy(&self) -> Policy {
        Policy {
            last: self.keep_last,
            hourly: self.keep_hourly,
            daily: self.keep_daily,
            weekly: self.keep_weekly,
            monthly: self.keep_monthly,
            yearly: self.keep_yearly,
            within: self.keep_within,
            tags: self.keep_tags.clone(),
        }
    }
}

fn parse_span(text: &str) -> Result<jiff::Span, String> {
    // A bare `m` is minutes to jiff but months to restic's --keep-within: refuse to guess
    // (`6m` read as minutes would forget six months of snapshots).
    if text.split(|c: char| !c.is_ascii_alphabetic()).any(|unit| unit == "m") {
        return Err(format!(
            "{text:?}: write `mo` for months or `min` for minutes (a bare `m` could be either)"
        ));
    }
    match text.parse::<jiff::Span>() {
        Ok(span) if span.is_negative() => Err(format!("{text:?} is a negative span")),
        Ok(span) => Ok(span),
        Err(e) => Err(format!("{text:?} is not a span like 14d, 2 weeks or 6 months: {e}")),
    }
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    kept: Vec<KeptJson>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dry_run: bool,
}

#[derive(Serialize)]
struct KeptJson {
    id: String,
    reasons: Vec<&'static str>,
}

pub async fn forget(args: &ForgetArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    use clap::error::ErrorKind;
    let policy = args.policy.policy();
    match (args.snapshots.is_empty(), policy.is_empty()) {
        (true, true) => usage_error(
            ErrorKind::MissingRequiredArgument,
            "name the snapshots to forget, or give a policy (--keep-last N, --keep-daily N, \
             --keep-within SPAN, ...)",
        ),
        (false, false) => usage_error(
            ErrorKind::ArgumentConflict,
            "give snapshot IDs or a --keep-* policy, not both",
        ),
        _ => {}
    }
    if policy.is_empty() && (args.policy.dry_run || args.policy.source.is_some()) {
        usage_error(
            ErrorKind::ArgumentConflict,
            "--dry-run and --source go with a --keep-* policy",
        );
    }
    let repo = open_repo(&args.repo, cancel).await?;
    let (ids, kept) = if policy.is_empty() {
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
        (ids, Vec::new())
    } else {
        let plan =
            crate::forget_policy::plan(&repo, &policy, args.policy.source.as_deref(), cancel)
                .await?;
        if !args.json {
            plan.print(args.policy.dry_run);
        }
        (plan.forget, plan.keep)
    };
    let dry_run = args.policy.dry_run;
    if !dry_run {
        ferry_repo::gc::forget(&repo, &ids, cancel).await.context("forgetting snapshots")?;
    }
    if args.json {
        let json = ForgetJson {
            forgotten: ids.iter().map(ToString::to_string).collect(),
            kept: kept
                .into_iter()
                .map(|(id, reasons)| KeptJson { id: id.to_string(), reasons })
                .collect(),
            dry_run,
        };
        println!("{}", serde_json::to_string(&json)?);
    } else if !dry_run {
        for id in &ids {
            println!("forgot {id}");
        }
        if !ids.is_empty() {
            eprintln!("forget: run `ferry gc` to reclaim their space");
        }
    }
    Ok(())
}

/// Ends the process as clap does for a usage mistake (status 2), before anything is done.
fn usage_error(kind: clap::error::ErrorKind, message: &str) -> ! {
    use clap::CommandFactory;
    let mut forget = crate::cli::Cli::command();
    let forget = forget.find_subcommand_mut("forget").map(std::mem::take).unwrap_or_default();
    forget.bin_name("ferry forget").error(kind, message).exit()
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
    ignored_leases: Vec<String>,
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
        ignored_leases: report.ignored_leases.clone(),
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
    let report = match ferry_repo::gc::gc(&repo, &options, cancel).await {
        Ok(report) => report,
        Err(e) if ferry_mover::space::is_stop(&e) => anyhow::bail!(
            "gc stopped and deleted nothing: {e}. Run `ferry check` on this repository to see \
             what is damaged"
        ),
        Err(e) => return Err(e).context("collecting garbage"),
    };
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
    for lease in &json.ignored_leases {
        println!(
            "gc: ignored lease {lease}: it expires further ahead than any holder writes (at most \
             {} plus the clock skew); a running Ferry did not write it. Delete it if nothing \
             else should hold the repository",
            humantime_secs(ferry_repo::gc::MAX_LEASE_TTL.as_secs())
        );
    }
    if report.pending() {
        println!(
            "gc: {} backups that started before the mark are still running; run gc again \
             after they finish to delete the {} marked packs",
            json.waiting_for_writers, json.condemned_packs
        );
    }
    Ok(())
}

/// Whole minutes as `N min`.
fn humantime_secs(secs: u64) -> String {
    format!("{} min", secs / 60)
}

#[cfg(test)]
mod tests {
    use super::parse_span;

    #[test]
    fn spans_read_as_written_and_a_bare_m_is_refused() {
        let months = parse_span("6mo").expect("months");
        assert_eq!((months.get_months(), months.get_minutes()), (6, 0));
        let minutes = parse_span("90min").expect("minutes");
        assert_eq!((minutes.get_months(), minutes.get_minutes()), (0, 90));
        assert_eq!(parse_span("2 weeks").expect("weeks").get_weeks(), 2);
        assert_eq!(parse_span("14d").expect("days").get_days(), 14);
        for ambiguous in ["6m", "1y6m", "1h30m", "6 m"] {
            let e = parse_span(ambiguous).expect_err(ambiguous);
            assert!(e.contains("`mo` for months"), "{ambiguous}: {e}");
        }
        assert!(parse_span("-3d").expect_err("negative").contains("negative"));
        assert!(parse_span("soon").expect_err("not a span").contains("not a span"));
    }
}
