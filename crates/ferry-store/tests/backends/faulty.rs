//! The fault-injecting wrapper around the file-system store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_store::{
    AnyStore, FaultConfig, FaultyStore, FsStore, ObjectStore, PutOutcome, StoreError,
};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use crate::support::{data, key};

/// The wrapper with latency but no failures must still meet the whole contract.
async fn fixture() -> (AnyStore, TempDir) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let fs = FsStore::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let faulty = FaultyStore::new(
        AnyStore::from(fs),
        FaultConfig::new().latency(Duration::from_micros(200)),
    );
    (AnyStore::Faulty(Arc::new(faulty)), dir)
}

mod contract {
    crate::contract_tests!(super::fixture);
}

/// Writes and deletes under a 30 % failure rate, half of the failures after the effect
/// (lost acknowledgements), retrying each call until it succeeds. At every step the real
/// store holds each key completely or not at all, and the end state is exactly what was
/// asked for, with no temporary files left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_leave_no_partial_objects() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let fs = FsStore::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let config = FaultConfig::new().fail_randomly(0.3, 42).lose_acknowledgements();
    let store = FaultyStore::new(fs.clone(), config);
    let live = CancellationToken::new();
    let mut written = BTreeMap::new();
    let mut lost_acks = 0;
    for i in 0..40u8 {
        let k = key(&format!("data/{:02x}/obj-{i}", i % 5));
        let bytes = data(usize::from(i) * 50_000 % 2_100_000, i);
        let mut failed_before = false;
        let mut settled = None;
        for _ in 0..50 {
            match store.put_if_absent(&k, bytes.clone(), &live).await {
                Ok(outcome) => {
                    settled = Some(outcome);
                    break;
                }
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    failed_before = true;
                    // Complete or absent, never partial.
                    match fs.get(&k, &live).await {
                        Ok(stored) => assert!(stored == bytes, "{k}: partial or wrong object"),
                        Err(e) => assert!(e.is_not_found(), "{e}"),
                    }
                }
            }
        }
        match settled {
            Some(PutOutcome::Created) => {}
            // Only a lost acknowledgement of our own earlier attempt explains this.
            Some(PutOutcome::AlreadyExists) => {
                assert!(failed_before, "{k} existed before it was written");
                lost_acks += 1;
            }
            None => panic!("{k}: 50 attempts all failed at p=0.3"),
        }
        written.insert(k, bytes);
    }
    assert!(store.injected_failures() > 0 && lost_acks > 0, "the plan injected too little to test");
    let listed = fs.list("", &live).await.unwrap_or_else(|e| panic!("{e}"));
    let listed: Vec<_> = listed.into_iter().map(|m| (m.key, m.size)).collect();
    let want: Vec<_> = written.iter().map(|(k, v)| (k.clone(), v.len() as u64)).collect();
    assert_eq!(listed, want);
    for (k, bytes) in &written {
        assert!(fs.get(k, &live).await.ok().as_ref() == Some(bytes), "{k} differs");
    }
    for k in written.keys() {
        let mut deleted = false;
        for _ in 0..50 {
            if store.delete(k, &live).await.is_ok() {
                deleted = true;
                break;
            }
        }
        assert!(deleted, "{k}: 50 delete attempts failed");
    }
    assert!(fs.list("", &live).await.ok().is_some_and(|l| l.is_empty()));
    let temp = std::fs::read_dir(dir.path().join("tmp~")).map(Iterator::count).unwrap_or(0);
    assert_eq!(temp, 0, "temporary files left behind");
}

#[tokio::test]
async fn nth_call_fails_with_unavailable_and_nothing_written() {
    let (_, dir) = fixture().await;
    let fs = FsStore::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let store = FaultyStore::new(fs.clone(), FaultConfig::new().fail_call(1).fail_call(3));
    let live = CancellationToken::new();
    let k = key("config");
    let first = store.put_if_absent(&k, "x".into(), &live).await;
    assert!(matches!(first, Err(StoreError::Unavailable { .. })), "{first:?}");
    assert_eq!(
        fs.head(&k, &live).await.unwrap_or_else(|e| panic!("head: {e}")),
        None,
        "the failed put wrote nothing"
    );
    assert_eq!(store.put_if_absent(&k, "x".into(), &live).await.ok(), Some(PutOutcome::Created));
    assert!(store.get(&k, &live).await.is_err());
    assert_eq!(store.get(&k, &live).await.ok().as_deref(), Some(&b"x"[..]));
    assert_eq!((store.calls(), store.injected_failures()), (4, 2));
}
