//! One contract, every backend: the cases in `cases/` run against the file-system store, an
//! S3 store on a real moto server over HTTP, the in-memory store and the fault-injecting
//! wrapper. Backend-specific behaviour (missing locations, credentials, atomicity under
//! cancellation and injected faults) is tested beside each backend in `backends/`.

mod backends;
mod cases;
mod support;

/// Generates one `#[tokio::test]` per contract case, each on a fresh store from
/// `$fixture().await`, which returns `(store, guard)`; the guard lives until the case ends.
macro_rules! contract_tests {
    // The full contract.
    ($fixture:path) => {
        $crate::contract_tests!(@cases $fixture;
            racing_puts_have_one_winner,
            racing_multipart_puts_have_one_winner,
        );
        $crate::contract_tests!(@common $fixture);
    };
    // For a server whose conditional writes are not atomic under concurrency (moto): the
    // racing cases check consistency but not that exactly one writer wins.
    ($fixture:path, non_atomic_conditional_writes) => {
        $crate::contract_tests!(@cases $fixture;
            racing_puts_stay_consistent,
            racing_multipart_puts_stay_consistent,
        );
        $crate::contract_tests!(@common $fixture);
    };
    (@common $fixture:path) => {
        $crate::contract_tests!(@cases $fixture;
            round_trip_small_and_empty,
            round_trip_multi_mib,
            round_trip_multipart_sized,
            second_put_keeps_first,
            readers_never_see_partial_objects,
            delete_removes_and_tolerates_missing,
            cancelled_token_stops_every_call,
            missing_objects_are_not_found,
            ranged_reads,
            capped_whole_reads,
            empty_object_ranges,
            head_reports_size,
            list_by_prefix_in_order,
            list_spans_pages,
        );
    };
    (@cases $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (store, _guard) = $fixture().await;
                crate::cases::$case(&store).await;
            }
        )*
    };
}
pub(crate) use contract_tests;
