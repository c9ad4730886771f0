//! Restoring over a target that already holds traps (symlinks and hard links pointing outside,
//! left by an earlier restore or planted by someone) never writes outside the target.

use crate::common;

use common::{TestResult, memory_repo};
use ferry_repo::{BackupOptions, RestoreOptions, backup_tree, restore};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_over_planted_links_stays_inside_the_target() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    std::fs::create_dir(src.path().join("d"))?;
    std::fs::write(src.path().join("d/f"), b"inside d")?;
    std::fs::write(src.path().join("f2"), b"new f2")?;
    std::fs::write(src.path().join("h"), b"new h")?;
    let s = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancel).await?;

    let outside = tempfile::tempdir()?;
    let victim_dir = outside.path().join("victim-dir");
    std::fs::create_dir(&victim_dir)?;
    std::fs::write(outside.path().join("victim-file"), b"untouched")?;
    std::fs::write(outside.path().join("victim-link"), b"untouched too")?;
    let target = tempfile::tempdir()?;
    std::os::unix::fs::symlink(&victim_dir, target.path().join("d"))?;
    std::os::unix::fs::symlink(outside.path().join("victim-file"), target.path().join("f2"))?;
    std::fs::hard_link(outside.path().join("victim-link"), target.path().join("h"))?;

    restore(&repo, &s.snapshot_id, target.path(), &RestoreOptions::default(), None, &cancel)
        .await?;
    assert_eq!(std::fs::read_dir(&victim_dir)?.count(), 0, "wrote through a directory symlink");
    assert_eq!(std::fs::read(outside.path().join("victim-file"))?, b"untouched");
    assert_eq!(std::fs::read(outside.path().join("victim-link"))?, b"untouched too");
    assert!(std::fs::symlink_metadata(target.path().join("d"))?.is_dir());
    assert_eq!(std::fs::read(target.path().join("d/f"))?, b"inside d");
    assert_eq!(std::fs::read(target.path().join("f2"))?, b"new f2");
    assert_eq!(std::fs::read(target.path().join("h"))?, b"new h");
    // Restoring again over the first restore gives the same tree.
    restore(&repo, &s.snapshot_id, target.path(), &RestoreOptions::default(), None, &cancel)
        .await?;
    common::assert_same_tree(src.path(), target.path());
    Ok(())
}
