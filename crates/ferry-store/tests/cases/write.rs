//! Create-if-absent, delete and cancellation.

use std::time::Duration;

use ferry_store::{PutOutcome, StoreError};
use tokio_util::sync::CancellationToken;

use super::{Store, assert_not_found, get, live, put};
use crate::support::{data, key};

async fn round_trip(store: &impl Store, size: usize) {
    let k = key(&format!("objects/size-{size}"));
    let bytes = data(size, 3);
    assert_eq!(put(store, &k, bytes.clone()).await, PutOutcome::Created);
    let back = get(store, &k).await;
    assert_eq!(back.len(), size);
    assert!(back == bytes, "content of {k} differs");
}

pub async fn round_trip_small_and_empty(store: &impl Store) {
    round_trip(store, 0).await;
    round_trip(store, 1).await;
    round_trip(store, 4097).await;
}

pub async fn round_trip_multi_mib(store: &impl Store) {
    round_trip(store, (3 << 20) + 7).await;
}

/// Larger than the S3 tests' multipart threshold: three 5 MiB parts, the last one short.
pub async fn round_trip_multipart_sized(store: &impl Store) {
    round_trip(store, (13 << 20) + 11).await;
}

pub async fn second_put_keeps_first(store: &impl Store) {
    let k = key("config");
    assert_eq!(put(store, &k, "first".into()).await, PutOutcome::Created);
    assert_eq!(put(store, &k, "second, longer".into()).await, PutOutcome::AlreadyExists);
    assert_eq!(put(store, &k, bytes::Bytes::new()).await, PutOutcome::AlreadyExists);
    assert_eq!(get(store, &k).await, "first");
}

/// Runs `writers` racing creates of one key; returns the writers that saw `Created`, after
/// checking every call succeeded and the stored object is one winner's whole content.
async fn race(store: &impl Store, writers: u8, size: usize) -> Vec<u8> {
    let k = key("locks/leader");
    let tasks: Vec<_> = (0..writers)
        .map(|i| {
            let (store, k) = (store.clone(), k.clone());
            tokio::spawn(async move { (i, store.put_if_absent(&k, data(size, i), &live()).await) })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        let (i, outcome) = task.await.unwrap_or_else(|e| panic!("writer task: {e}"));
        match outcome {
            Ok(PutOutcome::Created) => winners.push(i),
            Ok(PutOutcome::AlreadyExists) => {}
            Err(e) => panic!("writer {i}: {e}"),
        }
    }
    assert!(!winners.is_empty(), "no writer created the object");
    let stored = get(store, &k).await;
    assert!(winners.iter().any(|&i| stored == data(size, i)), "stored content is no winner's");
    assert_eq!(put(store, &k, "late".into()).await, PutOutcome::AlreadyExists);
    winners
}

pub async fn racing_puts_have_one_winner(store: &impl Store) {
    let winners = race(store, 8, 1000).await;
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
}

pub async fn racing_multipart_puts_have_one_winner(store: &impl Store) {
    let winners = race(store, 3, 7 << 20).await;
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
}

/// The racing cases for servers whose conditional writes are not atomic under concurrency
/// (moto checks `If-None-Match` and then writes, without a lock, in a threaded server, so
/// concurrent creates can all succeed there). What still must hold: every call succeeds, the
/// stored object is one writer's complete content, and later creates see it.
pub async fn racing_puts_stay_consistent(store: &impl Store) {
    race(store, 8, 1000).await;
}

/// See [`racing_puts_stay_consistent`].
pub async fn racing_multipart_puts_stay_consistent(store: &impl Store) {
    race(store, 3, 7 << 20).await;
}

/// While one object is written, readers polling it see nothing or all of it.
pub async fn readers_never_see_partial_objects(store: &impl Store) {
    let k = key("packs/big");
    let bytes = data((12 << 20) + 5, 9);
    let writer = {
        let (store, k, bytes) = (store.clone(), k.clone(), bytes.clone());
        tokio::spawn(async move { store.put_if_absent(&k, bytes, &live()).await })
    };
    let mut seen_complete = false;
    for _ in 0..10_000 {
        match store.head(&k, &live()).await {
            Ok(None) => {}
            Ok(Some(meta)) => assert_eq!(meta.size, bytes.len() as u64, "partial object visible"),
            Err(e) => panic!("head during write: {e}"),
        }
        let listed = store.list("packs/", &live()).await.unwrap_or_else(|e| panic!("list: {e}"));
        for meta in &listed {
            assert_eq!(
                (&meta.key, meta.size),
                (&k, bytes.len() as u64),
                "unexpected listing {listed:?}"
            );
        }
        match store.get(&k, &live()).await {
            Ok(read) => {
                assert!(read == bytes, "read {} bytes that are not the object", read.len());
                seen_complete = true;
            }
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => panic!("get during write: {e}"),
        }
        if seen_complete && writer.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let outcome = writer.await.unwrap_or_else(|e| panic!("writer task: {e}"));
    assert!(matches!(outcome, Ok(PutOutcome::Created)), "{outcome:?}");
    assert!(seen_complete, "the object never became readable");
}

pub async fn delete_removes_and_tolerates_missing(store: &impl Store) {
    let (a, b) = (key("snapshots/a"), key("snapshots/b"));
    put(store, &a, "a".into()).await;
    put(store, &b, "b".into()).await;
    store.delete(&a, &live()).await.unwrap_or_else(|e| panic!("delete: {e}"));
    assert_not_found(store.get(&a, &live()).await, &a);
    assert_eq!(
        store.head(&a, &live()).await.unwrap_or_else(|e| panic!("head: {e}")),
        None,
        "deleted"
    );
    assert_eq!(get(store, &b).await, "b");
    store.delete(&a, &live()).await.unwrap_or_else(|e| panic!("delete again: {e}"));
    store
        .delete(&key("never/existed"), &live())
        .await
        .unwrap_or_else(|e| panic!("delete missing: {e}"));
    // A deleted key can be created again.
    assert_eq!(put(store, &a, "a2".into()).await, PutOutcome::Created);
    assert_eq!(get(store, &a).await, "a2");
}

pub async fn cancelled_token_stops_every_call(store: &impl Store) {
    let (present, absent) = (key("present"), key("absent"));
    put(store, &present, "x".into()).await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let cancelled = |what: &str, r: Result<(), StoreError>| {
        assert!(matches!(r, Err(StoreError::Cancelled)), "{what}: {r:?}");
    };
    cancelled("put", store.put_if_absent(&absent, data(1 << 20, 1), &cancel).await.map(drop));
    cancelled("big put", store.put_if_absent(&absent, data(7 << 20, 1), &cancel).await.map(drop));
    cancelled("get", store.get(&present, &cancel).await.map(drop));
    cancelled("get_at_most", store.get_at_most(&present, 1, &cancel).await.map(drop));
    cancelled("get_range", store.get_range(&present, 0, 1, &cancel).await.map(drop));
    cancelled("head", store.head(&present, &cancel).await.map(drop));
    cancelled("list", store.list("", &cancel).await.map(drop));
    cancelled("delete", store.delete(&present, &cancel).await);
    // Nothing happened.
    assert_eq!(
        store.head(&absent, &live()).await.unwrap_or_else(|e| panic!("head: {e}")),
        None,
        "nothing created"
    );
    assert_eq!(get(store, &present).await, "x");
}
