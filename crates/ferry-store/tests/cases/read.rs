//! Whole, ranged and metadata reads.

use ferry_store::StoreError;

use super::{Store, assert_not_found, live, put};
use crate::support::{data, key};

pub async fn missing_objects_are_not_found(store: &impl Store) {
    let k = key("data/00/missing");
    assert_not_found(store.get(&k, &live()).await, &k);
    assert_not_found(store.get_at_most(&k, 0, &live()).await, &k);
    assert_not_found(store.get_range(&k, 0, 1, &live()).await, &k);
    assert_not_found(store.get_range(&k, 0, 0, &live()).await, &k);
    assert_eq!(store.head(&k, &live()).await.ok(), Some(None));
    // A key below an existing object's name is missing too, not an error of another kind.
    put(store, &key("data/00"), "x".into()).await;
    let below = key("data/00/x");
    assert_not_found(store.get(&below, &live()).await, &below);
    assert_not_found(store.get_at_most(&below, 1 << 20, &live()).await, &below);
    assert_eq!(store.head(&below, &live()).await.ok(), Some(None));
}

pub async fn ranged_reads(store: &impl Store) {
    let k = key("data/ab/pack");
    let size = (1 << 20) + 333;
    let bytes = data(size, 5);
    put(store, &k, bytes.clone()).await;
    let size = size as u64;
    let cases = [
        (0, 1),
        (0, 100),
        (4096, 70_000),
        (size - 10, 10),
        (size - 1, 1),
        (0, size),
        (size, 0),
        (17, 0),
    ];
    for (offset, len) in cases {
        let got = store.get_range(&k, offset, len, &live()).await;
        let got = got.unwrap_or_else(|e| panic!("range {offset}+{len}: {e}"));
        let want = &bytes[offset as usize..(offset + len) as usize];
        assert!(got == want, "range {offset}+{len}: {} bytes, wrong content", got.len());
    }
    let out_of_bounds =
        [(size, 1), (size - 1, 2), (0, size + 1), (size + 100, 0), (size + 100, 5), (u64::MAX, 2)];
    for (offset, len) in out_of_bounds {
        match store.get_range(&k, offset, len, &live()).await {
            Err(StoreError::RangeOutOfBounds { key: got_key, offset: o, len: l, size: s }) => {
                assert_eq!((got_key, o, l, s), (k.clone(), offset, len, size));
            }
            other => panic!("range {offset}+{len}: expected RangeOutOfBounds, got {other:?}"),
        }
    }
}

pub async fn empty_object_ranges(store: &impl Store) {
    let k = key("empty");
    put(store, &k, bytes::Bytes::new()).await;
    assert_eq!(store.get_range(&k, 0, 0, &live()).await.ok().map(|b| b.len()), Some(0));
    assert!(matches!(
        store.get_range(&k, 0, 1, &live()).await,
        Err(StoreError::RangeOutOfBounds { size: 0, .. })
    ));
}

pub async fn head_reports_size(store: &impl Store) {
    for (name, size) in [("h/empty", 0), ("h/one", 1), ("h/big", 2 << 20)] {
        let k = key(name);
        put(store, &k, data(size, 2)).await;
        let meta = store.head(&k, &live()).await.unwrap_or_else(|e| panic!("head {k}: {e}"));
        let meta = meta.unwrap_or_else(|| panic!("head {k}: missing"));
        assert_eq!((meta.key, meta.size), (k, size as u64));
    }
}

/// A capped whole read returns the object when it fits and refuses it, with its size and the
/// cap, when it does not.
pub async fn capped_whole_reads(store: &impl Store) {
    let k = key("index/capped");
    let size = (3 << 20) + 7;
    let bytes = data(size, 9);
    put(store, &k, bytes.clone()).await;
    let size = size as u64;
    for max in [size, size + 1, u64::MAX] {
        let got = store.get_at_most(&k, max, &live()).await;
        let got = got.unwrap_or_else(|e| panic!("cap {max}: {e}"));
        assert!(got == bytes, "cap {max}: {} bytes, wrong content", got.len());
    }
    for max in [size - 1, 1 << 20, 1, 0] {
        match store.get_at_most(&k, max, &live()).await {
            Err(StoreError::TooLarge { key: got_key, size: s, max: m }) => {
                assert_eq!((got_key, s, m), (k.clone(), size, max));
            }
            other => panic!("cap {max}: expected TooLarge, got {other:?}"),
        }
    }
    let empty = key("index/empty");
    put(store, &empty, bytes::Bytes::new()).await;
    assert_eq!(store.get_at_most(&empty, 0, &live()).await.ok().map(|b| b.len()), Some(0));
    let one = key("index/one");
    put(store, &one, "x".into()).await;
    assert_eq!(store.get_at_most(&one, 1, &live()).await.ok().as_deref(), Some(&b"x"[..]));
    assert!(matches!(
        store.get_at_most(&one, 0, &live()).await,
        Err(StoreError::TooLarge { size: 1, max: 0, .. })
    ));
}
