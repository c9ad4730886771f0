//! Getting a restore's data onto the disk while its writers write.
//!
//! A restore's writes land in the page cache. Left to the kernel, the data of a restore smaller
//! than the dirty-page thresholds (a tenth of the memory, 2.3 GiB on a 23 GiB machine) and
//! shorter than their expiry (30 s) reaches the disk only at the final flush, after every byte
//! was fetched: restoring the Linux tree from S3 (MinIO) over a 20 ms / 1000 Mbit/s path, all
//! data was written by 3.4–3.5 s and the final flush ended at 5.1–5.5 s. So a flusher thread
//! syncs the target each time [`FLUSH_BYTES`] more has been written, and the disk writes while
//! the network brings the rest: the same restores then ended at 4.2–4.3 s, 0.1 s after their
//! last byte. A pod's dirty pages count against its memory limit until written, so this also
//! keeps a restore's dirty pages near that step while the disk keeps up.
//!
//! The tree restore syncs its target's file system (`restore/flush.rs`), the volume restore
//! its device or image file (fdatasync). A cancelled restore ends once a sync in progress has.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::Scope;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};

/// Bytes written between two flushes while a restore runs.
pub(crate) const FLUSH_BYTES: u64 = 64 << 20;
/// How often the flusher looks at the bytes written.
const POLL: Duration = Duration::from_millis(20);

/// Calls `flush` each time `written` has grown by `step` bytes since the last call, until
/// every sender of `running` is gone (the restore's writers hold them) or `stop` is
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

/// Runs `flusher` (a [`flush_while_running`] loop) on a thread of `scope`; its error, or the
/// thread's failure to start (restoring into `target`), goes to `fail`, which stops the
/// restore.
pub(crate) fn start<'scope>(
    scope: &'scope Scope<'scope, '_>,
    target: &Path,
    fail: &'scope (dyn Fn(RepoError) + Sync),
    flusher: impl FnOnce() -> RepoResult<()> + Send + 'scope,
) {
    let started =
        std::thread::Builder::new().name("restore-flush".into()).spawn_scoped(scope, move || {
            if let Err(e) = flusher() {
                fail(e);
            }
        });
    if let Err(e) = started {
        fail(RepoError::io("start restore flusher", target, e));
    }
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
}
