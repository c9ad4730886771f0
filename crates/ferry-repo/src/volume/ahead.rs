//! Reading ahead across segments when a plan names the chunks to read (a delta, the allocated
//! ranges): the readers take their segments from one cursor over the plan, in order, and each
//! keeps the kernel reading the next planned chunks, up to a byte budget counted from the start
//! of the segment it takes. Without it a reader asks for a segment's few chunks just before
//! reading them, so a sparse plan reads the device one request per reader at a time and waits
//! for each.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use crate::volume::plan::Plan;

/// The readers' shared segment counter and read-ahead over a plan's chunks.
#[derive(Debug)]
pub(super) struct Ahead {
    state: Mutex<State>,
    /// Bytes asked for from the start of the newest segment taken on (a run may pass it by
    /// less than a chunk). With chunks of 1 MiB and more a segment alone fills a 64 MiB budget:
    /// the read-ahead then covers the first 64 MiB of each segment's planned chunks only.
    budget: u64,
    chunk: u64,
    segment_chunks: u64,
    size: u64,
}

#[derive(Debug, Default)]
struct State {
    /// The next segment to hand out.
    segment: u64,
    /// The first chunk not yet considered.
    cursor: u64,
    /// Byte ranges asked for, ascending, cut to start at the newest segment's start.
    asked: VecDeque<(u64, u64)>,
    /// Their total length.
    bytes: u64,
}

impl Ahead {
    pub(super) fn new(budget: u64, chunk: u64, segment_chunks: u64, size: u64) -> Self {
        Self { state: Mutex::new(State::default()), budget, chunk, segment_chunks, size }
    }

    /// Takes the next segment (its number) and the byte ranges of the next chunks `plan` reads
    /// or checks to ask the kernel for, so that about `budget` bytes are asked for from the
    /// segment's start on. Segments are handed out under the same lock, so a segment's chunks
    /// are asked for before or as it is taken, never skipped; no range is given twice.
    pub(super) fn take(&self, plan: &Plan) -> (u64, Vec<(u64, u64)>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let segment = state.segment;
        state.segment += 1;
        let start = segment.saturating_mul(self.segment_chunks).saturating_mul(self.chunk);
        let chunks = self.size.div_ceil(self.chunk);
        if start >= self.size {
            return (segment, Vec::new());
        }
        // What lies behind the start no longer counts.
        while let Some(&(at, len)) = state.asked.front() {
            if at >= start {
                break;
            }
            state.asked.pop_front();
            state.bytes -= len;
            if at + len > start {
                let rest = at + len - start;
                state.asked.push_front((start, rest));
                state.bytes += rest;
                break;
            }
        }
        state.cursor = state.cursor.max(start / self.chunk);
        let mut out = Vec::new();
        while state.bytes < self.budget {
            let Some(first) = plan.next_touched(state.cursor).filter(|&i| i < chunks) else {
                state.cursor = chunks;
                break;
            };
            let room = (self.budget - state.bytes).div_ceil(self.chunk);
            let run = (first..chunks).take(usize::try_from(room).unwrap_or(usize::MAX));
            let last = run.take_while(|&i| plan.touches(i)).last().unwrap_or(first);
            let at = first * self.chunk;
            let len = ((last + 1) * self.chunk).min(self.size) - at;
            state.asked.push_back((at, len));
            state.bytes += len;
            state.cursor = last + 1;
            out.push((at, len));
        }
        (segment, out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const K: u64 = 4096;

    fn plan(read: &[bool], verify: &[u64]) -> Plan {
        Plan {
            read: Some(read.to_vec()),
            slots: vec![None; read.len()],
            from_parent: 0,
            verify: verify.iter().map(|&i| (i, None)).collect(),
        }
    }

    #[test]
    fn asks_for_the_planned_runs_across_segments_up_to_the_budget() {
        // Segments of two chunks. Chunks 1-2, 5 (checked only), 9-11 and 14 of 16; a budget
        // of three chunks.
        let mut read = vec![false; 16];
        for i in [1, 2, 9, 10, 11, 14] {
            read[i] = true;
        }
        let plan = plan(&read, &[5]);
        let ahead = Ahead::new(3 * K, K, 2, 16 * K);
        assert_eq!(ahead.take(&plan), (0, vec![(K, 2 * K), (5 * K, K)]));
        // From chunk 2 on, chunks 2 and 5 are asked for: room for one more.
        assert_eq!(ahead.take(&plan), (1, vec![(9 * K, K)]));
        // From chunk 4 on: 5 and 9 asked for, room for one more of the run.
        assert_eq!(ahead.take(&plan), (2, vec![(10 * K, K)]));
        assert_eq!(ahead.take(&plan), (3, vec![(11 * K, K)]));
        // From chunk 8 on, 9-11 fill the budget; from chunk 10 on, room for 14.
        assert_eq!(ahead.take(&plan), (4, vec![]));
        assert_eq!(ahead.take(&plan), (5, vec![(14 * K, K)]));
        assert_eq!(ahead.take(&plan), (6, vec![]));
        assert_eq!(ahead.take(&plan), (7, vec![]));
        // Past the end: segment numbers, nothing to ask for.
        assert_eq!(ahead.take(&plan), (8, vec![]));
    }

    #[test]
    fn a_dense_plan_keeps_the_budget_ahead_of_each_segment_and_the_last_chunk_is_short() {
        let plan = plan(&[true; 8], &[]);
        // Two-chunk segments, a four-chunk budget, the last chunk 100 bytes.
        let ahead = Ahead::new(4 * K, K, 2, 7 * K + 100);
        assert_eq!(ahead.take(&plan), (0, vec![(0, 4 * K)]));
        assert_eq!(ahead.take(&plan), (1, vec![(4 * K, 2 * K)]));
        assert_eq!(ahead.take(&plan), (2, vec![(6 * K, K + 100)]));
        assert_eq!(ahead.take(&plan), (3, vec![]));
        assert_eq!(ahead.take(&plan), (4, vec![]));
    }

    #[test]
    fn a_checked_chunk_next_to_read_ones_joins_their_run_and_the_budget_is_passed_by_under_a_chunk()
    {
        let plan = plan(&[true, true, false, false], &[2]);
        let ahead = Ahead::new(K + 1, K, 4, 4 * K);
        // Room for 1 byte more after the first chunk: a whole chunk.
        assert_eq!(ahead.take(&plan), (0, vec![(0, 2 * K)]));
        let ahead = Ahead::new(3 * K, K, 4, 4 * K);
        assert_eq!(ahead.take(&plan), (0, vec![(0, 3 * K)]));
    }
}
