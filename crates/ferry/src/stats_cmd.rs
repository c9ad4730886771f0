//! `ferry stats`: what the repository holds and how much space deduplication and compression
//! save.

use anyhow::Context;
use ferry_repo::SnapshotKind;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cli::RepoArgs;
use crate::progress::human;
use crate::repo_cmds::open_repo;

#[derive(Serialize)]
struct StatsJson {
    /// The repository's format (1 or 2; FORMAT.md).
    format: u8,
    snapshots: u64,
    tree_snapshots: u64,
    volume_snapshots: u64,
    damaged_snapshots: u64,
    bytes_backed_up: u64,
    packs: u64,
    pack_bytes: u64,
    data_blobs: u64,
    data_raw_bytes: u64,
    data_stored_bytes: u64,
    tree_blobs: u64,
    tree_stored_bytes: u64,
}

pub async fn stats(args: &RepoArgs, json: bool, cancel: &CancellationToken) -> anyhow::Result<()> {
    let repo = open_repo(args, cancel).await?;
    let (readable, damaged) = repo.readable_snapshots(cancel).await.context("listing snapshots")?;
    let index = repo.stats(cancel).await.context("reading the index")?;
    let kind = |k: SnapshotKind| readable.iter().filter(|(_, s)| s.kind().ok() == Some(k)).count();
    let out = StatsJson {
        format: repo.config().format.byte(),
        snapshots: readable.len() as u64,
        tree_snapshots: kind(SnapshotKind::Tree) as u64,
        volume_snapshots: kind(SnapshotKind::Volume) as u64,
        damaged_snapshots: damaged.len() as u64,
        bytes_backed_up: readable.iter().map(|(_, s)| s.summary.bytes_total).sum(),
        packs: index.packs,
        pack_bytes: index.pack_bytes,
        data_blobs: index.data_blobs,
        data_raw_bytes: index.data_raw_bytes,
        data_stored_bytes: index.data_stored_bytes,
        tree_blobs: index.tree_blobs,
        tree_stored_bytes: index.tree_stored_bytes,
    };
    if json {
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    println!(
        "snapshots  {} ({} trees, {} volumes{}), {} as backed up",
        out.snapshots,
        out.tree_snapshots,
        out.volume_snapshots,
        if out.damaged_snapshots > 0 {
            format!(", {} damaged", out.damaged_snapshots)
        } else {
            String::new()
        },
        human(out.bytes_backed_up)
    );
    println!(
        "content    {} in {} unique chunks, stored as {}{}",
        human(out.data_raw_bytes),
        out.data_blobs,
        human(out.data_stored_bytes),
        ratio(out.data_raw_bytes, out.data_stored_bytes, "compression")
    );
    println!("trees      {} pages, {}", out.tree_blobs, human(out.tree_stored_bytes));
    println!(
        "packs      {}, {}{}",
        out.packs,
        human(out.pack_bytes),
        ratio(out.bytes_backed_up, out.pack_bytes, "smaller than what was backed up")
    );
    println!("format     {}", out.format);
    Ok(())
}

/// ` (2.50× what)` when `a` is at least `b` and `b` is non-zero (less would read as "0.40×
/// smaller": after `forget` and before `gc`, or with incompressible data, say nothing).
fn ratio(a: u64, b: u64, what: &str) -> String {
    if b == 0 || a < b {
        return String::new();
    }
    #[allow(clippy::cast_precision_loss)] // Display only.
    let r = a as f64 / b as f64;
    format!(" ({r:.2}× {what})")
}

#[cfg(test)]
mod tests {
    use super::ratio;

    #[test]
    fn a_ratio_is_shown_only_when_it_is_a_saving() {
        assert_eq!(ratio(500, 200, "smaller"), " (2.50× smaller)");
        assert_eq!(ratio(200, 200, "smaller"), " (1.00× smaller)");
        assert_eq!(ratio(200, 500, "smaller"), "");
        assert_eq!(ratio(0, 0, "smaller"), "");
        assert_eq!(ratio(5, 0, "smaller"), "");
    }
}
