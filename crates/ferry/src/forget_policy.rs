//! `ferry forget --keep-*`: the repository's snapshots grouped by host and source, the
//! retention policy applied to each group, and the decisions shown.

use std::collections::BTreeMap;

use ferry_repo::{Repository, Snapshot, SnapshotId};
use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use crate::retention::{Candidate, Policy, Reasons, apply};

/// What a policy decided.
pub(crate) struct Plan {
    /// Snapshots to forget.
    pub(crate) forget: Vec<SnapshotId>,
    /// Snapshots kept, with the rules that kept them.
    pub(crate) keep: Vec<(SnapshotId, Reasons)>,
    /// Each group's lines, for people.
    lines: Vec<String>,
}

impl Plan {
    /// Prints the decisions, group by group.
    pub(crate) fn print(&self, dry_run: bool) {
        for line in &self.lines {
            println!("{line}");
        }
        if dry_run {
            println!("dry run: nothing was forgotten");
        }
    }
}

/// A snapshot with its time read.
type Dated = (SnapshotId, Snapshot, Timestamp);

/// Applies `policy` to every group of snapshots (only `source`'s, when given). Velero's
/// snapshots (made for a DataUpload) and damaged manifests are left alone.
pub(crate) async fn plan(
    repo: &Repository,
    policy: &Policy,
    source: Option<&str>,
    cancel: &CancellationToken,
) -> anyhow::Result<Plan> {
    let (readable, damaged) = repo.readable_snapshots(cancel).await?;
    for e in &damaged {
        eprintln!("forget: left alone, unreadable: {e}");
    }
    let mut groups: BTreeMap<(String, String), Vec<Dated>> = BTreeMap::new();
    let mut velero = 0;
    for (id, snapshot) in readable {
        let Some(time) = time_of(&snapshot) else {
            eprintln!("forget: left alone, its time is out of range: snapshot {id}");
            continue;
        };
        if snapshot.tags.iter().any(|(k, _)| k == ferry_mover::DATA_UPLOAD_TAG) {
            velero += 1;
            continue;
        }
        if source.is_some_and(|s| s != snapshot.source) {
            continue;
        }
        let key = (snapshot.source.clone(), snapshot.hostname.clone());
        groups.entry(key).or_default().push((id, snapshot, time));
    }
    let mut plan = Plan { forget: Vec::new(), keep: Vec::new(), lines: Vec::new() };
    if let Some(span) = policy.within {
        plan.lines.push(format!("keeping every snapshot within {span:#} of its group's newest"));
    }
    if let Some(source) = source
        && groups.is_empty()
    {
        anyhow::bail!("no snapshots of source {source:?} (see `ferry snapshots`)");
    }
    for ((source, host), snapshots) in groups {
        let candidates: Vec<Candidate<'_>> =
            snapshots.iter().map(|(_, s, time)| Candidate { time: *time, tags: &s.tags }).collect();
        let reasons = apply(policy, &candidates).map_err(anyhow::Error::msg)?;
        let kept = reasons.iter().filter(|r| !r.is_empty()).count();
        plan.lines
            .push(format!("{source} on {host}: keeping {kept} of {} snapshots", snapshots.len()));
        // Newest first, as people read retention.
        let mut rows: Vec<_> = snapshots.iter().zip(reasons).collect();
        rows.sort_by_key(|row| std::cmp::Reverse(row.0.2));
        for ((id, _, when), reasons) in rows {
            let short = &id.to_hex()[..16];
            if reasons.is_empty() {
                plan.lines.push(format!("  forget {short}  {when}"));
                plan.forget.push(*id);
            } else {
                plan.lines.push(format!("  keep   {short}  {when}  ({})", reasons.join(", ")));
                plan.keep.push((*id, reasons));
            }
        }
    }
    if velero > 0 {
        plan.lines.push(format!(
            "{velero} snapshots of Velero DataUploads left alone (deleting their Velero backups \
             forgets them)"
        ));
    }
    Ok(plan)
}

/// The snapshot's time; `None` when out of range (such a snapshot is left alone rather than
/// taken for the oldest).
fn time_of(s: &Snapshot) -> Option<Timestamp> {
    let nsec = i32::try_from(s.time.nsec).ok()?;
    Timestamp::new(s.time.sec, nsec).ok()
}
