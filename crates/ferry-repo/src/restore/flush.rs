//! Getting the restored data onto the disk: while the workers write, and once at the end.
//!
//! A restore's writes land in the page cache. Left to the kernel, the data of a restore smaller
//! than the dirty-page thresholds (a tenth of the memory, 2.3 GiB on a 23 GiB machine) and
//! shorter than their expiry (30 s) reaches the disk only at the final flush, after every byte
//! was fetched: restoring the Linux tree from S3 (MinIO) over a 20 ms / 1000 Mbit/s path, all
//! data was written by 3.4–3.5 s and the final flush ended at 5.1–5.5 s. So a flusher thread
//! syncs the target's file system each time [`FLUSH_BYTES`] more content has been written,
//! and the disk writes while the network brings the rest: the same restores then ended at
//! 4.2–4.3 s, 0.1 s after their last byte. A pod's dirty pages count against its memory limit
//! until written, so this also keeps a restore's dirty pages near that step while the disk
//! keeps up.
//!
//! A sync covers the whole file system: restoring into a directory of a shared one (a hostPath
//! volume on the node's disk) also writes out other programs' dirty data there sooner than
//! the kernel would, and commits its journal each time. A cancelled restore ends once a sync in
//! progress has.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::restore::fsops;

/// Content bytes written between two flushes while a restore runs.
pub(crate) const FLUSH_BYTES: u64 = 64 << 20;
/// How often the flusher looks at the bytes written.
const POLL: Duration = Duration::from_millis(20);

/// Everything written reaches the disk before the restore says it is done: a write-back error
/// is this restore's failure, not a later unmount's. `root` was opened before any file was
/// written, so syncfs reports every error since (Linux 5.8 and later); each call reports an
/// error once, so every flush's error fails the restore.
pub(crate) fn flush(root: &impl AsFd, target: &Path) -> RepoResult<()> {
    nix::unistd::syncfs(root.as_fd())
        .map_err(|e| RepoError::io("flush the restored files of", target, fsops::err(e)))
}

/// Calls `flush` each time `written` has grown by `step` bytes since the last call, until
/// every sender of `running` is gone (the workers and the planner hold one each) or `stop` is
/// cancelled. A flush that fails ends it with that error (the restore fails with it).
pub(crate) fn flush_while_running(
    written: &AtomicU64,
    step: u64,
    running: &Receiver<()>,
    stop: &CancellationToken,
    mut flush: impl FnMut() -> RepoResult<()>,
) -> RepoResult<()> {
    let mut flushed = 0u64;
    loop {
        match running.recv_timeout(POLL) {
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) | Ok(()) => {}
        }
        if stop.is_cancelled() {
            break;
        }
        let now = written.load(Ordering::Relaxed);
        if now >= flushed.saturating_add(step) {
            flushed = now;
            flush()?;
        }
    }
    Ok(())
}

/// [`flush_while_running`] of the restore's target, every [`FLUSH_BYTES`].
pub(crate) fn flusher(
    shared: &super::Shared,
    root: &OwnedFd,
    target: &Path,
    running: &Receiver<()>,
) -> RepoResult<()> {
    flush_while_running(&shared.progress.bytes_done, FLUSH_BYTES, running, &shared.stop, || {
        flush(root, target)
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    use super::*;

    /// Waits (bounded) until `calls` reaches `n`.
    fn await_calls(calls: &AtomicUsize, n: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while calls.load(Ordering::SeqCst) < n {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    #[test]
    fn flushes_once_per_step_written_and_ends_with_the_senders() -> RepoResult<()> {
        let written = AtomicU64::new(0);
        let calls = AtomicUsize::new(0);
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        let stop = CancellationToken::new();
        let seen = std::thread::scope(|s| {
            let writer = s.spawn(|| {
                // Half a step: no flush yet; then ten steps, each seen flushed before the next.
                written.fetch_add(50, Ordering::SeqCst);
                std::thread::sleep(POLL * 3);
                let mut seen = vec![calls.load(Ordering::SeqCst)];
                for n in 1..=10 {
                    written.fetch_add(100, Ordering::SeqCst);
                    if !await_calls(&calls, n) {
                        break;
                    }
                }
                seen.push(calls.load(Ordering::SeqCst));
                drop(tx);
                seen
            });
            flush_while_running(&written, 100, &rx, &stop, || {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })?;
            writer.join().map_err(|_| RepoError::Internal { what: "test", reason: "panic".into() })
        })?;
        assert_eq!(seen, [0, 10], "none below a step, then one a step");
        assert_eq!(calls.load(Ordering::SeqCst), 10, "and none after the senders are gone");
        Ok(())
    }

    #[test]
    fn a_stop_ends_the_flusher_while_the_restore_still_holds_its_senders() -> RepoResult<()> {
        let written = AtomicU64::new(0);
        let (_tx, rx) = crossbeam_channel::bounded::<()>(0);
        let stop = CancellationToken::new();
        let mut calls = 0;
        std::thread::scope(|s| {
            s.spawn(|| {
                written.store(50, Ordering::SeqCst);
                std::thread::sleep(POLL * 5);
                stop.cancel();
            });
            flush_while_running(&written, 100, &rx, &stop, || {
                calls += 1;
                Ok(())
            })
        })?;
        assert!(stop.is_cancelled());
        assert_eq!(calls, 0, "less than a step was written");
        Ok(())
    }

    #[test]
    fn a_failed_flush_ends_the_flusher_with_its_error() {
        let written = AtomicU64::new(500);
        let (_tx, rx) = crossbeam_channel::bounded::<()>(0);
        let stop = CancellationToken::new();
        let mut calls = 0;
        let result = flush_while_running(&written, 100, &rx, &stop, || {
            calls += 1;
            Err(RepoError::io(
                "flush the restored files of",
                Path::new("/t"),
                std::io::Error::from_raw_os_error(libc::EIO),
            ))
        });
        assert!(matches!(result, Err(RepoError::Io { .. })), "{result:?}");
        assert_eq!(calls, 1);
    }

    #[test]
    fn flush_syncs_a_real_directorys_file_system() -> RepoResult<()> {
        let dir = tempfile::tempdir().map_err(|e| RepoError::io("tempdir", "/tmp", e))?;
        let root = nix::fcntl::open(
            dir.path(),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| RepoError::io("open", dir.path(), std::io::Error::from(e)))?;
        std::fs::write(dir.path().join("f"), [1u8; 4096])
            .map_err(|e| RepoError::io("write", dir.path(), e))?;
        flush(&root, dir.path())
    }
}
