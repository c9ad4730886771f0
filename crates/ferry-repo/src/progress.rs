//! Progress reports shared by backup and restore.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A progress report, delivered at least once a second and once at the end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Content bytes read or found unchanged so far.
    pub bytes_done: u64,
    /// Content bytes expected in total (grows while the walk discovers files; at least the
    /// parent snapshot's total).
    pub bytes_total_estimate: u64,
    /// Files finished.
    pub files_done: u64,
    /// Files discovered so far.
    pub files_total_estimate: u64,
    /// Content bytes that were new to the repository.
    pub bytes_new: u64,
    /// Backup: bytes actually read from the source (the rest of `bytes_done` was skipped).
    /// Volume restore: bytes written.
    pub bytes_read: u64,
    /// Backup: bytes not read because they were known already: files unchanged since the
    /// parent snapshot (trees), unallocated or all-zero ranges (volumes, which are not
    /// stored). Volume restore: zero ranges not written.
    pub bytes_skipped: u64,
    /// Entries that could not be read (recorded in the snapshot with their error).
    pub errors: u64,
    /// Whether this is the final report.
    pub finished: bool,
}

/// Receives [`Progress`] reports.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) bytes_done: AtomicU64,
    pub(crate) bytes_total: AtomicU64,
    pub(crate) files_done: AtomicU64,
    pub(crate) files_total: AtomicU64,
    pub(crate) bytes_new: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_skipped: AtomicU64,
    pub(crate) tree_bytes_new: AtomicU64,
    pub(crate) errors: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self, floor: u64, finished: bool) -> Progress {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Progress {
            bytes_done: r(&self.bytes_done),
            bytes_total_estimate: r(&self.bytes_total).max(if finished { 0 } else { floor }),
            files_done: r(&self.files_done),
            files_total_estimate: r(&self.files_total),
            bytes_new: r(&self.bytes_new),
            bytes_read: r(&self.bytes_read),
            bytes_skipped: r(&self.bytes_skipped),
            errors: r(&self.errors),
            finished,
        }
    }
}

/// Calls a progress function every half second from its own thread until dropped.
pub(crate) struct Ticker {
    done: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    /// Starts ticking if there is a function to call.
    pub(crate) fn start(
        f: Option<ProgressFn>,
        report: impl Fn() -> Progress + Send + 'static,
    ) -> Self {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = f.map(|f| {
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    for _ in 0..5 {
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        if done.load(Ordering::Relaxed) {
                            return;
                        }
                    }
                    f(&report());
                }
            })
        });
        Self { done, thread }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
