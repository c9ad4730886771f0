//! Intervals of work (a CR's start to its completion), to check how many ran at once.

use ferry_api::k8s_openapi::jiff::Timestamp;

/// The most intervals `[start, end)` of `spans` that overlap at any instant.
pub fn max_overlap(spans: &[(Timestamp, Timestamp)]) -> usize {
    // Ends sort before starts at the same instant: half-open intervals. Timestamps truncated
    // to the second never make disjoint intervals overlap, but can hide an overlap shorter
    // than a second: measure with finer times where movements are short.
    let mut edges: Vec<(Timestamp, i32)> =
        spans.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]).collect();
    edges.sort();
    let (mut now, mut most) = (0_i32, 0_i32);
    for (_, delta) in edges {
        now += delta;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

#[test]
fn overlap_counts_half_open_intervals() {
    let t = |s: i64| Timestamp::from_second(s).expect("valid");
    assert_eq!(max_overlap(&[]), 0);
    assert_eq!(max_overlap(&[(t(0), t(5)), (t(5), t(9))]), 1);
    assert_eq!(max_overlap(&[(t(0), t(5)), (t(4), t(9)), (t(1), t(2))]), 2);
    assert_eq!(max_overlap(&[(t(0), t(9)), (t(1), t(8)), (t(2), t(3))]), 3);
}
