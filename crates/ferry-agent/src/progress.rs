//! Progress reporting from the data path to the CR.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the data path reports how far it is. Cheap to clone; every clone reports into the
/// same counters. The agent reads them at its progress interval and writes
/// `status.progress` to the CR; `bytes_done` only ever grows.
#[derive(Debug, Clone, Default)]
pub struct ProgressSink {
    inner: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    total: AtomicU64,
    done: AtomicU64,
    read: AtomicU64,
    skipped: AtomicU64,
    new: AtomicU64,
}

/// A reading of a [`ProgressSink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProgressSnapshot {
    /// The total bytes to move, once known.
    pub total_bytes: u64,
    /// Bytes moved so far.
    pub bytes_done: u64,
    /// Of `bytes_done`, the bytes actually read (backup) or written (restore of a block
    /// volume). Zero when the data path does not tell.
    pub bytes_read: u64,
    /// Of `bytes_done`, the bytes not moved because they were known already: unchanged
    /// files, unallocated or all-zero ranges.
    pub bytes_skipped: u64,
    /// Of `bytes_done`, the bytes new to the repository (uploaded; the rest was
    /// deduplicated).
    pub bytes_new: u64,
}

/// How the data path's bytes divide up, for [`ProgressSink::set_breakdown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Breakdown {
    /// See [`ProgressSnapshot::bytes_read`].
    pub read: u64,
    /// See [`ProgressSnapshot::bytes_skipped`].
    pub skipped: u64,
    /// See [`ProgressSnapshot::bytes_new`].
    pub new: u64,
}

impl ProgressSink {
    /// A sink starting at zero.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the total bytes to move.
    pub fn set_total(&self, bytes: u64) {
        self.inner.total.store(bytes, Ordering::Relaxed);
    }

    /// Reports that `bytes` more were moved.
    pub fn add_done(&self, bytes: u64) {
        self.inner.done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Reports the bytes moved so far; a value below an earlier one is ignored.
    pub fn set_done(&self, bytes: u64) {
        self.inner.done.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Reports how the bytes so far divide up; each count only ever grows.
    pub fn set_breakdown(&self, b: Breakdown) {
        self.inner.read.fetch_max(b.read, Ordering::Relaxed);
        self.inner.skipped.fetch_max(b.skipped, Ordering::Relaxed);
        self.inner.new.fetch_max(b.new, Ordering::Relaxed);
    }

    /// The current reading.
    #[must_use]
    pub fn snapshot(&self) -> ProgressSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProgressSnapshot {
            total_bytes: r(&self.inner.total),
            bytes_done: r(&self.inner.done),
            bytes_read: r(&self.inner.read),
            bytes_skipped: r(&self.inner.skipped),
            bytes_new: r(&self.inner.new),
        }
    }
}

/// The progress to write given what the CR shows and what the sink reports: `bytesDone`
/// never goes below what the CR already shows (a restarted data movement counts from zero
/// again), and never above the total once the total is known. `None` when nothing changed.
#[must_use]
pub(crate) fn next_progress(
    shown: ferry_api::DataMoveOperationProgress,
    reported: ProgressSnapshot,
) -> Option<ferry_api::DataMoveOperationProgress> {
    let total = i64::try_from(reported.total_bytes).unwrap_or(i64::MAX);
    let mut done = i64::try_from(reported.bytes_done).unwrap_or(i64::MAX);
    if total > 0 {
        done = done.min(total);
    }
    let next = ferry_api::DataMoveOperationProgress {
        total_bytes: if total > 0 { total } else { shown.total_bytes },
        bytes_done: done.max(shown.bytes_done),
    };
    (next != shown).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::DataMoveOperationProgress as P;

    fn reading(total_bytes: u64, bytes_done: u64) -> ProgressSnapshot {
        ProgressSnapshot { total_bytes, bytes_done, ..ProgressSnapshot::default() }
    }

    #[test]
    fn sink_done_is_monotonic_under_set_and_adds_up() {
        let sink = ProgressSink::new();
        sink.set_total(100);
        sink.add_done(30);
        sink.clone().add_done(20);
        sink.set_done(10);
        assert_eq!(sink.snapshot(), reading(100, 50));
        sink.set_done(70);
        assert_eq!(sink.snapshot().bytes_done, 70);
    }

    #[test]
    fn breakdown_counts_only_grow() {
        let sink = ProgressSink::new();
        sink.set_breakdown(Breakdown { read: 10, skipped: 5, new: 3 });
        sink.set_breakdown(Breakdown { read: 8, skipped: 6, new: 1 });
        let r = sink.snapshot();
        assert_eq!((r.bytes_read, r.bytes_skipped, r.bytes_new), (10, 6, 3));
    }

    #[test]
    fn written_progress_never_goes_backwards() {
        let shown = P { total_bytes: 100, bytes_done: 60 };
        // A restarted movement reports less than the CR shows: keep the CR's value.
        assert_eq!(next_progress(shown, reading(100, 10)), None);
        assert_eq!(
            next_progress(shown, reading(100, 61)),
            Some(P { total_bytes: 100, bytes_done: 61 })
        );
        // Never above the total.
        assert_eq!(
            next_progress(shown, reading(100, 500)),
            Some(P { total_bytes: 100, bytes_done: 100 })
        );
        // An unknown total keeps what was shown.
        assert_eq!(
            next_progress(P::default(), reading(0, 5)),
            Some(P { total_bytes: 0, bytes_done: 5 })
        );
    }
}
