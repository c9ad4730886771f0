use bytes::Bytes;
use ferry_store::{MemoryStore, ObjectStore};

use super::*;
use crate::format::{
    ChunkRef, FileContent, IndexFile, IndexId, IndexPack, Metadata, Node, ObjectKind, Snapshot,
    Summary, Timestamp,
};
use crate::repo::tests::{fast_options, write_blobs};

fn entry(id: u8, offset: u32) -> PackEntry {
    PackEntry {
        id: BlobId([id; 32]),
        kind: ObjectKind::DataBlob,
        offset,
        length: 60,
        raw_length: 20,
    }
}

#[test]
fn a_header_agrees_with_the_index_only_where_the_index_files_list_its_blobs() {
    let (p, q) = (PackId([1; 32]), PackId([2; 32]));
    let listing = |entries| IndexFile {
        packs: vec![
            IndexPack { id: p, size: 500, entries },
            IndexPack { id: q, size: 500, entries: vec![entry(12, 2), entry(14, 62)] },
        ],
        supersedes: vec![],
    };
    // Blob 12 is stored twice (in P and in Q); P's listing is read twice.
    let files = vec![
        (IndexId([9; 32]), listing(vec![entry(10, 2), entry(11, 62), entry(12, 122)])),
        (IndexId([8; 32]), listing(vec![entry(10, 2), entry(11, 62), entry(12, 122)])),
    ];
    let index = MemIndex::build(files);
    let mut copies = Vec::new();
    index.for_each_copy(|pack| copies.push(index.packs()[pack].id));
    assert_eq!(copies.len(), 1, "one further place (12), none for P's listing read twice");
    let agrees = |entries: &[PackEntry]| header_agrees(&index, p, entries, 3);
    assert!(agrees(&[entry(10, 2), entry(11, 62), entry(12, 122)]));
    assert!(agrees(&[entry(12, 122), entry(11, 62), entry(10, 2)]), "in any order");
    assert!(
        header_agrees(&index, q, &[entry(12, 2), entry(14, 62)], 2),
        "the other place of the blob stored twice"
    );
    assert!(!agrees(&[entry(10, 2), entry(11, 64), entry(12, 122)]), "elsewhere than listed");
    let mut tree = entry(11, 62);
    tree.kind = ObjectKind::TreeBlob;
    assert!(!agrees(&[entry(10, 2), tree, entry(12, 122)]), "another kind");
    assert!(!agrees(&[entry(10, 2), entry(11, 62)]), "a listed blob missing");
    assert!(
        !agrees(&[entry(10, 2), entry(11, 62), entry(12, 122), entry(14, 182)]),
        "a copy only listed in Q"
    );
    assert!(
        !agrees(&[entry(10, 2), entry(11, 62), entry(12, 122), entry(13, 182)]),
        "a blob in no index"
    );
    assert!(!header_agrees(&index, PackId([3; 32]), &[], 0), "a pack no index lists");
}

fn snapshot(body: NodeBody) -> Snapshot {
    Snapshot {
        time: Timestamp::default(),
        hostname: "test".into(),
        source: "test".into(),
        paths: Vec::new(),
        tags: Vec::new(),
        parent: None,
        root: Node {
            name: Vec::new(),
            body,
            meta: Metadata::default(),
            hardlink: None,
            error: None,
        },
        summary: Summary::default(),
        program: "test".into(),
    }
}

#[tokio::test]
async fn blobs_reached_but_in_no_index_are_each_reported_once() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (repo, _) = Repository::init(store, b"pw", &fast_options(), &cancel).await?;
    let stored = write_blobs(&repo, vec![b"stored".to_vec()]).await?[0];
    let (lost_chunk, lost_tree) = (BlobId([7; 32]), BlobId([8; 32]));
    let chunks = [stored, lost_chunk, lost_chunk, stored]
        .into_iter()
        .map(|id| ChunkRef { id, len: 6 })
        .collect();
    let file = FileContent { size: 24, extents: None, chunks };
    repo.save_snapshot(&snapshot(NodeBody::File(file.clone())), &cancel).await?;
    repo.save_snapshot(&snapshot(NodeBody::File(file)), &cancel).await?;
    repo.save_snapshot(&snapshot(NodeBody::Dir { pages: vec![lost_tree, lost_tree] }), &cancel)
        .await?;
    let report = check(&repo, CheckOptions::default(), None, &cancel).await?;
    assert_eq!(report.problems.len(), 2, "{report:?}");
    assert!(report.problems.iter().any(|p| p.contains(&format!("data blob {lost_chunk}"))));
    assert!(report.problems.iter().any(|p| p.contains(&format!("tree blob {lost_tree}"))));
    assert_eq!((report.snapshots, report.trees, report.data_blobs), (3, 1, 2), "{report:?}");
    Ok(())
}

#[tokio::test]
async fn an_index_that_misplaces_a_blob_is_reported_when_packs_are_read() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (repo, _) = Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await?;
    write_blobs(&repo, vec![b"first".to_vec(), b"second".to_vec()]).await?;
    let read_data = CheckOptions { read_data: true, subset: None };
    let clean = check(&repo, read_data, None, &cancel).await?;
    assert!(clean.is_ok() && clean.packs_read == 1, "{clean:?}");
    // A file superseding the index, listing the pack with one blob's offset moved.
    let old = repo.index_ids(&cancel).await?;
    let mut packs = Vec::new();
    for id in &old {
        packs.extend(repo.read_index_file(*id, &cancel).await?.packs);
    }
    let pack = packs[0].id;
    packs[0].entries[0].offset += 1;
    let file = IndexFile { packs, supersedes: old };
    let bytes = file.encode(&repo.keys().cipher);
    let key = layout::index(&IndexId(content_address(&bytes)))?;
    store
        .put_if_absent(&key, Bytes::from(bytes), &cancel)
        .await
        .map_err(|e| RepoError::store("put", &key, e))?;
    let fresh = Repository::open(store, b"pw", &cancel).await?;
    let structure = check(&fresh, CheckOptions::default(), None, &cancel).await?;
    assert!(structure.is_ok(), "without reading packs nothing shows: {structure:?}");
    let report = check(&fresh, read_data, None, &cancel).await?;
    assert_eq!(report.problems, vec![format!("pack {pack}: header and index disagree")]);
    Ok(())
}

#[tokio::test]
async fn a_tree_page_with_the_bytes_of_a_reached_chunk_is_still_read() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (repo, _) = Repository::init(store, b"pw", &fast_options(), &cancel).await?;
    // A chunk whose bytes are those of an (empty) tree page: the same id, stored as data.
    let page = crate::format::TreePage { entries: Vec::new() }.encode();
    let id = write_blobs(&repo, vec![page]).await?[0];
    let file = FileContent { size: 1, extents: None, chunks: vec![ChunkRef { id, len: 1 }] };
    repo.save_snapshot(&snapshot(NodeBody::File(file)), &cancel).await?;
    repo.save_snapshot(&snapshot(NodeBody::Dir { pages: vec![id] }), &cancel).await?;
    let report = check(&repo, CheckOptions::default(), None, &cancel).await?;
    // The index holds it as data: read as a tree page it does not authenticate.
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert!(report.problems[0].contains("directory /"), "{report:?}");
    assert_eq!((report.trees, report.data_blobs), (1, 1), "{report:?}");
    Ok(())
}

#[tokio::test]
async fn missing_resized_and_unindexed_packs_are_told_apart() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (repo, _) = Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await?;
    for blob in [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()] {
        write_blobs(&repo, vec![blob]).await?;
    }
    let put = |key: ferry_store::ObjectKey, bytes: Vec<u8>| {
        let store = Arc::clone(&store);
        async move {
            store
                .put_if_absent(&key, Bytes::from(bytes), &CancellationToken::new())
                .await
                .map_err(|e| RepoError::store("put", &key, e))
        }
    };
    let mut packs = Vec::new();
    for id in repo.index_ids(&cancel).await? {
        packs.extend(repo.read_index_file(id, &cancel).await?.packs);
    }
    packs.sort_by_key(|p| p.id);
    assert!(packs.len() >= 3, "{} packs", packs.len());
    let (gone, grown) = (packs[0].id, packs[2].id);
    let delete = |key: ferry_store::ObjectKey| {
        let store = Arc::clone(&store);
        async move {
            store
                .delete(&key, &CancellationToken::new())
                .await
                .map_err(|e| RepoError::store("delete", &key, e))
        }
    };
    delete(layout::pack(&gone)?).await?;
    let mut bytes = store
        .get(&layout::pack(&grown)?, &cancel)
        .await
        .map_err(|e| RepoError::store("get", "pack", e))?
        .to_vec();
    bytes.push(0);
    delete(layout::pack(&grown)?).await?;
    put(layout::pack(&grown)?, bytes).await?;
    put(layout::pack(&PackId([0xab; 32]))?, b"stray".to_vec()).await?;
    let report = check(&repo, CheckOptions::default(), None, &cancel).await?;
    assert_eq!(
        report.problems,
        vec![
            format!("pack {gone} named by the index is missing"),
            format!(
                "pack {grown} is {} bytes, the index says {}",
                packs[2].size + 1,
                packs[2].size
            ),
        ],
        "in pack order"
    );
    assert_eq!((report.packs, report.unindexed_packs), (packs.len() as u64, 1), "{report:?}");
    Ok(())
}
