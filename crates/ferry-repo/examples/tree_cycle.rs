//! Backs up a directory into a fresh file-system repository, backs it up again unchanged,
//! restores it, and prints the wall times: a quick manual check of the data path.
//!
//! `cargo run --release -p ferry-repo --example tree_cycle -- SOURCE WORKDIR [phase]`
//! where `phase` is `all` (default), `backup`, `nochange`, `restore` or `check` (the later
//! phases reuse the repository left in WORKDIR).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ferry_repo::{BackupOptions, InitOptions, Repository, RestoreOptions, backup_tree, restore};
use ferry_store::{FsStore, ObjectStore};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(source), Some(work)) = (args.get(1), args.get(2)) else {
        return Err("usage: tree_cycle SOURCE WORKDIR [all|backup|nochange|restore|check]".into());
    };
    let phase = args.get(3).map_or("all", String::as_str);
    let (source, work) = (PathBuf::from(source), PathBuf::from(work));
    let repo_dir = work.join("repo");
    std::fs::create_dir_all(&repo_dir)?;
    let store: Arc<dyn ObjectStore> = Arc::new(FsStore::open(&repo_dir)?);
    let cancel = CancellationToken::new();
    let (repo, _) = Repository::init(store, b"benchmark", &InitOptions::default(), &cancel).await?;
    let latest = repo.snapshots(&cancel).await?.last().map(|(id, _)| *id);
    // FERRY_LEVEL overrides the zstd level, for comparing speed and size.
    let level = std::env::var("FERRY_LEVEL")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(ferry_repo::format::DEFAULT_DATA_LEVEL);
    if matches!(phase, "all" | "backup") {
        let t = Instant::now();
        let options = BackupOptions { compression_level: level, ..BackupOptions::default() };
        let s = backup_tree(&repo, &source, &options, None, &cancel).await?;
        println!("first backup: {:.2}s {s:?}", t.elapsed().as_secs_f64());
    }
    if matches!(phase, "all" | "nochange") {
        let parent = repo.snapshots(&cancel).await?.last().map(|(id, _)| *id).or(latest);
        let t = Instant::now();
        let s = backup_tree(
            &repo,
            &source,
            &BackupOptions { parent, ..BackupOptions::default() },
            None,
            &cancel,
        )
        .await?;
        println!("no-change backup: {:.2}s {s:?}", t.elapsed().as_secs_f64());
    }
    if matches!(phase, "all" | "restore") {
        let id = repo.snapshots(&cancel).await?.last().map(|(id, _)| *id).ok_or("no snapshot")?;
        let target = work.join("restore");
        let _ = std::fs::remove_dir_all(&target);
        let t = Instant::now();
        let r = restore(&repo, &id, &target, &RestoreOptions::default(), None, &cancel).await?;
        println!("restore: {:.2}s files={} bytes={}", t.elapsed().as_secs_f64(), r.files, r.bytes);
    }
    if phase == "check" {
        let t = Instant::now();
        let report = ferry_repo::check(
            &repo,
            ferry_repo::CheckOptions { read_data: true, subset: None },
            None,
            &cancel,
        )
        .await?;
        println!(
            "check --read-data: {:.2}s ok={} {report:?}",
            t.elapsed().as_secs_f64(),
            report.is_ok()
        );
    }
    Ok(())
}
