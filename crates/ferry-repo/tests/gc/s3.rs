//! The key scenario on a real S3 server (moto).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_and_gc_reclaim_space_on_s3() {
    let store = crate::common::s3_store("gc-reclaim", "ferry/gc").await;
    crate::reclaim(store).await;
}
