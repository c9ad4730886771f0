//! Listing by prefix.

use super::{Store, live, put};
use crate::support::{data, key};

async fn keys(store: &impl Store, prefix: &str) -> Vec<String> {
    let listed =
        store.list(prefix, &live()).await.unwrap_or_else(|e| panic!("list {prefix:?}: {e}"));
    listed.into_iter().map(|m| m.key.to_string()).collect()
}

/// Byte order of the whole key, not directory order: `-` < `/` < `0` < `b`.
pub async fn list_by_prefix_in_order(store: &impl Store) {
    let names =
        ["idx/b", "idx/a0", "idx/a/2", "other/x", "idx/ab/c", "idx/a-1", "idx/a/1", "idx.json"];
    for (i, name) in names.iter().enumerate() {
        put(store, &key(name), data(i, i as u8)).await;
    }
    let all =
        ["idx.json", "idx/a-1", "idx/a/1", "idx/a/2", "idx/a0", "idx/ab/c", "idx/b", "other/x"];
    assert_eq!(keys(store, "").await, all);
    assert_eq!(keys(store, "idx").await, all[..7]);
    assert_eq!(keys(store, "idx/").await, all[1..7]);
    assert_eq!(keys(store, "idx/a").await, all[1..6]);
    assert_eq!(keys(store, "idx/a/").await, ["idx/a/1", "idx/a/2"]);
    assert_eq!(keys(store, "idx/a/1").await, ["idx/a/1"]);
    assert_eq!(keys(store, "idx/ab/").await, ["idx/ab/c"]);
    assert!(keys(store, "nothing").await.is_empty());
    assert!(keys(store, "idx/zz/").await.is_empty());
    assert!(keys(store, "bad~prefix/").await.is_empty());
    let sizes: Vec<u64> =
        store.list("", &live()).await.unwrap_or_default().iter().map(|m| m.size).collect();
    assert_eq!(sizes, [7, 5, 6, 2, 1, 4, 0, 3]);
}

/// More objects than one S3 list page in the tests (7): pagination must stitch pages.
pub async fn list_spans_pages(store: &impl Store) {
    let mut want: Vec<String> =
        (0..25).map(|i| format!("data/{:02x}/obj-{i}", i * 7 % 16)).collect();
    for name in &want {
        put(store, &key(name), "x".into()).await;
    }
    put(store, &key("datb"), "y".into()).await;
    want.sort();
    assert_eq!(keys(store, "data/").await, want);
    assert_eq!(keys(store, "d").await.len(), 26);
}
