//! Whole, ranged and metadata reads.

use ferry_store::StoreError;

use super::{Store, assert_not_found, live, put};
use crate::support::{data, key};

pub async fn missing_objects_are_not_found(store: &impl Store) {
    let k = key("data/00/missing");
    assert_not_found(store.get(&k, &live()).await, &k);
    assert_not_found(store.get_range(&k, 0, 1, &live()).await, &k);
    assert_not_found(store.get_range(&k, 0, 0, &live()).await, &k);
    assert_eq!(store.head(&k, &live()).await.ok(), Some(None));
    // A key below an existing object's name is missing too, not an error of another kind.
    put(store, &key("data/00"), "x".into()).await;
    let below = key("data/00/x");
    assert_not_found(store.get(&below, &live()).await, &below);
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
