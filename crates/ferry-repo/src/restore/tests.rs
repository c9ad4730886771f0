//! Restores of hand-crafted hostile snapshots.

use std::sync::Arc;

use ferry_store::{MemoryStore, ObjectStore};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::format::{FileContent, Metadata, ObjectKind, Snapshot, Summary, Timestamp, TreePage};
use crate::repo::tests::{fast_options, write_blobs, write_blobs_of};

fn node(name: &[u8], body: NodeBody) -> Node {
    Node {
        name: name.to_vec(),
        body,
        meta: Metadata { mode: 0o755, ..Metadata::default() },
        hardlink: None,
        error: None,
    }
}

async fn repo() -> RepoResult<Repository> {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    Ok(Repository::init(store, b"pw", &fast_options(), &CancellationToken::new()).await?.0)
}

async fn file(repo: &Repository, data: &[u8]) -> RepoResult<NodeBody> {
    let ids = write_blobs(repo, vec![data.to_vec()]).await?;
    let len = u32::try_from(data.len()).unwrap_or(0);
    Ok(NodeBody::File(FileContent {
        size: data.len() as u64,
        extents: None,
        chunks: vec![crate::format::ChunkRef { id: ids[0], len }],
    }))
}

/// Stores pages as written (no validation) and a snapshot whose root lists `root_pages`.
async fn snapshot_of(repo: &Repository, pages: Vec<Vec<Node>>) -> RepoResult<SnapshotId> {
    let raw: Vec<Vec<u8>> =
        pages.into_iter().map(|entries| TreePage { entries }.encode()).collect();
    let ids = write_blobs_of(repo, ObjectKind::TreeBlob, raw).await?;
    snapshot_with_root(repo, ids).await
}

async fn snapshot_with_root(repo: &Repository, pages: Vec<BlobId>) -> RepoResult<SnapshotId> {
    snapshot_rooted(repo, node(b"", NodeBody::Dir { pages })).await
}

async fn snapshot_rooted(repo: &Repository, root: Node) -> RepoResult<SnapshotId> {
    let snap = Snapshot {
        time: Timestamp::default(),
        hostname: "h".into(),
        source: "s".into(),
        paths: vec![],
        tags: vec![],
        parent: None,
        root,
        summary: Summary::default(),
        program: "test".into(),
    };
    // A fresh repository handle so the index written above is loaded.
    repo.refresh_index(&CancellationToken::new()).await?;
    repo.save_snapshot(&snap, &CancellationToken::new()).await
}

/// Restores into a new temporary directory with default options.
async fn restore_into_temp(
    repo: &Repository,
    id: SnapshotId,
) -> RepoResult<(tempfile::TempDir, RestoreSummary)> {
    let out = tempfile::tempdir().map_err(|e| RepoError::io("tempdir", "/tmp", e))?;
    let options = RestoreOptions::default();
    let summary = restore(repo, &id, out.path(), &options, None, &CancellationToken::new()).await?;
    Ok((out, summary))
}

/// Restores into `<tmp>/target` and returns the error and whether anything appeared beside it.
async fn restore_hostile(
    repo: &Repository,
    id: SnapshotId,
) -> RepoResult<(RepoResult<RestoreSummary>, Vec<String>)> {
    let base = tempfile::tempdir().map_err(|e| RepoError::io("tempdir", "/tmp", e))?;
    let target = base.path().join("target");
    let r =
        restore(repo, &id, &target, &RestoreOptions::default(), None, &CancellationToken::new())
            .await;
    let beside: Vec<String> = std::fs::read_dir(base.path())
        .map_err(|e| RepoError::io("list", base.path(), e))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n != "target")
        .collect();
    Ok((r, beside))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_and_separator_names_are_refused() -> RepoResult<()> {
    let repo = repo().await?;
    for bad in [&b"../x"[..], b"..", b"a/b", b"/abs", b".", b"", b"nul\0byte"] {
        let body = file(&repo, b"payload").await?;
        let id = snapshot_of(&repo, vec![vec![node(bad, body)]]).await?;
        let (r, beside) = restore_hostile(&repo, id).await?;
        assert!(matches!(r, Err(RepoError::Corrupt { .. })), "{bad:?}: {r:?}");
        assert!(beside.is_empty(), "{bad:?} wrote {beside:?} outside the target");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_whose_root_is_a_file_is_refused_as_not_a_directory() -> RepoResult<()> {
    let repo = repo().await?;
    let body = file(&repo, b"payload").await?;
    let id = snapshot_rooted(&repo, node(b"", body)).await?;
    let (r, beside) = restore_hostile(&repo, id).await?;
    match r {
        Err(RepoError::InvalidInput { reason, .. }) => {
            assert!(reason.contains("only directory snapshots"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(beside.is_empty(), "wrote {beside:?} outside the target");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_names_are_refused_within_and_across_pages() -> RepoResult<()> {
    let repo = repo().await?;
    let body = file(&repo, b"payload").await?;
    let within =
        snapshot_of(&repo, vec![vec![node(b"a", body.clone()), node(b"a", body.clone())]]).await?;
    assert!(matches!(restore_hostile(&repo, within).await?.0, Err(RepoError::Corrupt { .. })));
    // The same name again after an empty page.
    let across_empty = snapshot_of(
        &repo,
        vec![vec![node(b"a", body.clone())], vec![], vec![node(b"a", body.clone())]],
    )
    .await?;
    let (r, _) = restore_hostile(&repo, across_empty).await?;
    assert!(matches!(r, Err(RepoError::UnsafeEntry { .. })), "{r:?}");
    // A symlink named `x` in one page, then a directory `x` with a file in the next: the
    // classic symlink-then-file trick.
    let inner = write_blobs_of(
        &repo,
        ObjectKind::TreeBlob,
        vec![TreePage { entries: vec![node(b"f", body.clone())] }.encode()],
    )
    .await?;
    let outside = tempfile::tempdir().map_err(|e| RepoError::io("tempdir", "/tmp", e))?;
    let link = node(
        b"x",
        NodeBody::Symlink { target: outside.path().as_os_str().as_encoded_bytes().to_vec() },
    );
    let across =
        snapshot_of(&repo, vec![vec![link], vec![node(b"x", NodeBody::Dir { pages: inner })]])
            .await?;
    let (r, beside) = restore_hostile(&repo, across).await?;
    assert!(matches!(r, Err(RepoError::UnsafeEntry { .. })), "{r:?}");
    assert!(beside.is_empty());
    assert_eq!(
        std::fs::read_dir(outside.path()).map(|d| d.count()).unwrap_or(99),
        0,
        "wrote through the symlink"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nesting_beyond_the_limit_is_refused() -> RepoResult<()> {
    let repo = repo().await?;
    let mut pages =
        write_blobs_of(&repo, ObjectKind::TreeBlob, vec![TreePage::default().encode()]).await?;
    for _ in 0..MAX_DEPTH + 1 {
        let page = TreePage { entries: vec![node(b"d", NodeBody::Dir { pages })] }.encode();
        pages = write_blobs_of(&repo, ObjectKind::TreeBlob, vec![page]).await?;
    }
    let id = snapshot_with_root(&repo, pages).await?;
    let (r, beside) = restore_hostile(&repo, id).await?;
    assert!(matches!(r, Err(RepoError::UnsafeEntry { .. })), "{r:?}");
    assert!(beside.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_blob_in_place_of_a_data_blob_is_refused() -> RepoResult<()> {
    let repo = repo().await?;
    let page = TreePage::default().encode();
    let ids = write_blobs_of(&repo, ObjectKind::TreeBlob, vec![page.clone()]).await?;
    let len = u32::try_from(page.len()).unwrap_or(0);
    let body = NodeBody::File(FileContent {
        size: u64::from(len),
        extents: None,
        chunks: vec![crate::format::ChunkRef { id: ids[0], len }],
    });
    let id = snapshot_of(&repo, vec![vec![node(b"f", body)]]).await?;
    // The tree blob authenticates only as a tree blob, never as file data.
    let (r, _) = restore_hostile(&repo, id).await?;
    assert!(matches!(r, Err(RepoError::Corrupt { .. })), "{r:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_wrongly_sized_chunks_fail_the_restore() -> RepoResult<()> {
    let repo = repo().await?;
    let ids = write_blobs(&repo, vec![b"12345".to_vec()]).await?;
    let wrong_len = NodeBody::File(FileContent {
        size: 6,
        extents: None,
        chunks: vec![crate::format::ChunkRef { id: ids[0], len: 6 }],
    });
    let id = snapshot_of(&repo, vec![vec![node(b"f", wrong_len)]]).await?;
    assert!(matches!(restore_hostile(&repo, id).await?.0, Err(RepoError::Corrupt { .. })));
    let missing = NodeBody::File(FileContent {
        size: 5,
        extents: None,
        chunks: vec![crate::format::ChunkRef { id: BlobId([9; 32]), len: 5 }],
    });
    let id = snapshot_of(&repo, vec![vec![node(b"f", missing)]]).await?;
    assert!(matches!(restore_hostile(&repo, id).await?.0, Err(RepoError::MissingBlob { .. })));
    Ok(())
}

#[test]
fn batches_shrink_to_fit_the_open_file_limit() {
    assert_eq!(batch_items(1 << 20, 17), BATCH_ITEMS);
    let scarce = batch_items(4096, 17);
    assert!(scarce < BATCH_ITEMS, "{scarce}");
    assert!((4 * 17 + 1) * scarce as u64 + FDS_RESERVED <= 4096, "{scarce}");
    assert_eq!(batch_items(100, 4), 1, "always at least one file per batch");
}

/// Members of hardlink groups whose first names were unreadable at backup time (restored
/// empty on their own) become links to the first member that was read, also in a directory
/// whose descriptor is closed by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardlink_members_with_errors_link_to_the_first_member_that_was_read() -> RepoResult<()> {
    use std::os::unix::fs::MetadataExt;
    let repo = repo().await?;
    let member = |name: &[u8], body: NodeBody, group: u64, failed: bool| Node {
        hardlink: Some(group),
        error: failed.then(|| "read: Input/output error".to_owned()),
        ..node(name, body)
    };
    let unread = || NodeBody::File(FileContent::default());
    let inner = write_blobs_of(
        &repo,
        ObjectKind::TreeBlob,
        vec![
            TreePage {
                entries: vec![
                    member(b"e", unread(), 2, true),
                    member(b"k", file(&repo, b"in d").await?, 4, false),
                ],
            }
            .encode(),
        ],
    )
    .await?;
    let root = vec![
        member(b"a", unread(), 1, true),
        member(b"b", file(&repo, b"payload").await?, 1, false),
        member(b"c", unread(), 1, true),
        node(b"d", NodeBody::Dir { pages: inner }),
        member(b"f", file(&repo, b"other").await?, 2, false),
        // Every member had an error (say its xattrs could not be read): still one inode.
        member(b"g", file(&repo, b"all failed").await?, 3, true),
        member(b"h", file(&repo, b"all failed").await?, 3, true),
        // Linked to d/k after d/e was relinked: d opened again (or reused) a second time.
        member(b"l", file(&repo, b"in d").await?, 4, false),
    ];
    let id = snapshot_of(&repo, vec![root]).await?;
    let (out, summary) = restore_into_temp(&repo, id).await?;
    assert_eq!(summary.entries_with_backup_errors, 5);
    let read = |name: &str| std::fs::read(out.path().join(name)).unwrap_or_default();
    let inode = |name: &str| std::fs::metadata(out.path().join(name)).map_or(0, |m| m.ino());
    for (name, content, anchor) in [
        ("a", &b"payload"[..], "b"),
        ("c", b"payload", "b"),
        ("d/e", b"other", "f"),
        ("h", b"all failed", "g"),
    ] {
        assert_eq!(read(name), content, "{name}");
        assert_eq!(inode(name), inode(anchor), "{name} is a link to {anchor}");
    }
    Ok(())
}

/// A directory reopened by its place under the target is refused once a component of the
/// way has become a symlink, even one pointing at a directory of the same shape.
#[test]
fn reopening_a_directory_never_follows_a_replaced_component() -> RepoResult<()> {
    let tmp = tempfile::tempdir().map_err(|e| RepoError::io("tempdir", "/tmp", e))?;
    let io = |e| RepoError::io("set up", "/tmp", e);
    std::fs::create_dir_all(tmp.path().join("target/a/b")).map_err(io)?;
    std::fs::create_dir_all(tmp.path().join("elsewhere/b")).map_err(io)?;
    let target = std::fs::File::open(tmp.path().join("target")).map_err(io)?;
    let root = Arc::new(OwnedFd::from(target));
    let loc = DirPath::root(&tmp.path().join("target")).child(b"a").child(b"b");
    assert_eq!(loc.path(), tmp.path().join("target/a/b"));
    assert_eq!(loc.child_path(b"c"), tmp.path().join("target/a/b/c"));
    assert!(loc.open(&root).is_ok(), "the real directory opens");
    std::fs::rename(tmp.path().join("target/a"), tmp.path().join("a-moved")).map_err(io)?;
    std::os::unix::fs::symlink(tmp.path().join("elsewhere"), tmp.path().join("target/a"))
        .map_err(io)?;
    assert!(loc.open(&root).is_err(), "followed a symlink out of the target");
    Ok(())
}

/// A symlink backup could not read (recorded with an error and no target) is left out with a
/// warning; the rest of the tree restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_whose_target_was_not_read_is_skipped_with_a_warning() -> RepoResult<()> {
    let repo = repo().await?;
    let unread = Node {
        error: Some("read link: Permission denied".into()),
        ..node(b"a", NodeBody::Symlink { target: Vec::new() })
    };
    let id =
        snapshot_of(&repo, vec![vec![unread, node(b"b", file(&repo, b"kept").await?)]]).await?;
    let (out, summary) = restore_into_temp(&repo, id).await?;
    assert_eq!(std::fs::read(out.path().join("b")).ok().as_deref(), Some(&b"kept"[..]));
    assert!(std::fs::symlink_metadata(out.path().join("a")).is_err(), "nothing at a");
    assert!(summary.warnings.iter().any(|w| w.contains("symlink not restored")), "{summary:?}");
    Ok(())
}

/// A snapshot holding each privilege-bearing part: a device node, set-ID files owned by root
/// and by a user, and privileged and ordinary xattrs.
async fn privileged_snapshot(repo: &Repository) -> RepoResult<SnapshotId> {
    let x =
        |name: &str| crate::format::Xattr { name: name.as_bytes().to_vec(), value: b"v".to_vec() };
    let with = |mut n: Node, mode: u32, uid: u32, gid: u32| {
        n.meta = Metadata { mode, uid, gid, ..Metadata::default() };
        n
    };
    let mut tagged = with(node(b"tagged", file(repo, b"t").await?), 0o644, 0, 0);
    tagged.meta.xattrs = vec![x("trusted.ferry"), x("user.note")];
    let entries = vec![
        with(
            node(b"null", NodeBody::CharDevice { rdev: nix::sys::stat::makedev(1, 3) }),
            0o666,
            0,
            0,
        ),
        with(node(b"root-suid", file(repo, b"r").await?), 0o6755, 0, 0),
        tagged,
        with(node(b"user-suid", file(repo, b"u").await?), 0o4755, 1000, 1000),
    ];
    snapshot_of(repo, vec![entries]).await
}

fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).map_or(0, |m| m.mode() & 0o7777)
}

fn xattr_names(path: &std::path::Path) -> Vec<String> {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return vec![] };
    crate::sys::list_xattrs(crate::sys::Target::PathNoFollow(&c))
        .unwrap_or_default()
        .into_iter()
        .map(|x| String::from_utf8_lossy(&x.name).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confined_restore_withholds_devices_root_set_id_bits_and_privileged_xattrs()
-> RepoResult<()> {
    assert!(nix::unistd::geteuid().is_root(), "needs root: device nodes, owners, trusted.*");
    let repo = repo().await?;
    let id = privileged_snapshot(&repo).await?;
    let out = tempfile::tempdir().map_err(|e| RepoError::io("tempdir", "/tmp", e))?;
    let options = RestoreOptions { fidelity: Fidelity::CONFINED, ..RestoreOptions::default() };
    let cancel = CancellationToken::new();
    let summary = restore(&repo, &id, out.path(), &options, None, &cancel).await?;
    assert_eq!(summary.withheld, Withheld { device_nodes: 1, setid_files: 1, xattrs: 1 });
    assert!(!out.path().join("null").exists(), "no device node");
    assert_eq!(mode_of(&out.path().join("root-suid")), 0o755);
    assert_eq!(mode_of(&out.path().join("user-suid")), 0o4755, "a user's set-ID file stays");
    assert_eq!(xattr_names(&out.path().join("tagged")), ["user.note"]);

    let full = tempfile::tempdir().map_err(|e| RepoError::io("tempdir", "/tmp", e))?;
    let summary =
        restore(&repo, &id, full.path(), &RestoreOptions::default(), None, &cancel).await?;
    assert!(!summary.withheld.any(), "{:?}", summary.withheld);
    let dev = std::fs::symlink_metadata(full.path().join("null"))
        .map_err(|e| RepoError::io("stat", "null", e))?;
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&dev.file_type()));
    assert_eq!(mode_of(&full.path().join("root-suid")), 0o6755);
    let mut names = xattr_names(&full.path().join("tagged"));
    names.sort();
    assert_eq!(names, ["trusted.ferry", "user.note"]);
    Ok(())
}

/// Owners and modes are set only where the created file differs (see `fsops::apply_fd`):
/// whether a file was made with them already (a root-owned 0644 file under umask 022) or not
/// (another owner, bits the umask takes away, set-ID bits, none at all), each ends exact, and
/// so do empty files (finished by the planner, not a worker) and the owner of a directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_and_modes_end_exact_however_the_file_was_created() -> RepoResult<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    assert!(nix::unistd::geteuid().is_root(), "needs root: owners");
    let repo = repo().await?;
    let with = |mut n: Node, mode: u32, uid: u32, gid: u32| {
        n.meta = Metadata { mode, uid, gid, ..Metadata::default() };
        n
    };
    let empty = || NodeBody::File(FileContent { size: 0, extents: None, chunks: vec![] });
    let cases: [(&[u8], u32, u32, u32, bool); 13] = [
        (b"plain", 0o644, 0, 0, false),
        (b"exec", 0o755, 0, 0, false),
        (b"group-write", 0o666, 0, 0, false),
        (b"group-only", 0o640, 0, 0, false),
        (b"others-only", 0o604, 0, 0, false),
        (b"none", 0o000, 0, 0, false),
        (b"setgid", 0o2755, 0, 0, false),
        (b"with-xattr", 0o644, 0, 0, false),
        (b"user", 0o644, 1000, 1001, false),
        (b"user-only", 0o600, 1000, 0, false),
        (b"group-changed", 0o644, 0, 1001, false),
        (b"user-setuid", 0o4750, 1000, 1001, false),
        (b"empty-user", 0o640, 1000, 1001, true),
    ];
    let mut entries = Vec::new();
    for (name, mode, uid, gid, is_empty) in cases {
        let body = if is_empty { empty() } else { file(&repo, name).await? };
        let mut n = with(node(name, body), mode, uid, gid);
        if name == b"with-xattr" {
            n.meta.xattrs = vec![note()];
        }
        entries.push(n);
    }
    entries.push(with(node(b"owned-dir", NodeBody::Dir { pages: vec![] }), 0o750, 7, 8));
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let id = snapshot_of(&repo, vec![entries]).await?;
    let out = tempfile::tempdir().map_err(|e| RepoError::io("tempdir", "/tmp", e))?;
    let cancel = CancellationToken::new();
    restore(&repo, &id, out.path(), &RestoreOptions::default(), None, &cancel).await?;
    let stat = |name: &[u8]| -> RepoResult<(u32, u32, u32)> {
        let path = out.path().join(std::ffi::OsStr::from_bytes(name));
        let m = std::fs::symlink_metadata(&path).map_err(|e| RepoError::io("stat", &path, e))?;
        Ok((m.mode() & 0o7777, m.uid(), m.gid()))
    };
    for (name, mode, uid, gid, _) in cases {
        assert_eq!(stat(name)?, (mode, uid, gid), "{}", String::from_utf8_lossy(name));
    }
    assert_eq!(stat(b"owned-dir")?, (0o750, 7, 8));
    Ok(())
}

fn note() -> crate::format::Xattr {
    crate::format::Xattr { name: b"user.note".to_vec(), value: b"v".to_vec() }
}

#[test]
fn files_are_created_with_their_final_bits_only_where_no_one_gains_meanwhile() {
    let meta = |mode| Metadata { mode, ..Metadata::default() };
    for (mode, created) in [
        (0o644, 0o644),
        (0o755, 0o755),
        (0o700, 0o700),
        (0o666, 0o666),
        (0o4755, 0o755),
        (0o1777, 0o777),
        (0o640, 0o600),
        (0o604, 0o600),
        (0o664, 0o600),
        (0o077, 0o600),
        (0o000, 0o000),
    ] {
        assert_eq!(fsops::created_mode(&meta(mode)), created, "{mode:o}");
    }
    // An access ACL (an xattr) can give someone less than others get: never early.
    let with_xattr = Metadata { xattrs: vec![note()], ..meta(0o644) };
    assert_eq!(fsops::created_mode(&with_xattr), 0o600);
}

/// Holds ranged reads back, so that batches overlap.
#[derive(Debug)]
struct Slow;

#[async_trait::async_trait]
impl ferry_store::Hook for Slow {
    async fn before(&self, call: ferry_store::Call<'_>) {
        if matches!(call, ferry_store::Call::GetRange(..)) {
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        }
    }
}

/// The restores that change this crate's test settings for restores, one at a time.
static TEST_SETTINGS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Backs up 6 directories of `per_dir` small files of random bytes through a store whose
/// ranged reads are slow, then restores them with 4 workers, batches of `batch_items` files
/// (0: the default) and `keep` bytes of frames kept, and checks every file. A restore that
/// has not ended two minutes after it began fails.
async fn restore_through_slow_reads(
    per_dir: u32,
    batch_items: usize,
    keep: usize,
) -> RepoResult<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> =
        Arc::new(ferry_store::Hooked::new(Arc::new(MemoryStore::new()), Slow));
    let repo = Repository::init(store, b"pw", &fast_options(), &cancel).await?.0;
    let src = tempfile::tempdir().map_err(|e| RepoError::io("make", "a temporary dir", e))?;
    let mut files = Vec::new();
    for d in 0..6u32 {
        for n in 0..per_dir {
            let path = src.path().join(format!("d{d}/f{n}"));
            let mut body = vec![0; 1000 + (n as usize * 7) % 2000];
            blake3::Hasher::new()
                .update(&[d as u8, (n >> 8) as u8, n as u8])
                .finalize_xof()
                .fill(&mut body);
            std::fs::create_dir_all(src.path().join(format!("d{d}")))
                .and_then(|()| std::fs::write(&path, &body))
                .map_err(|e| RepoError::io("write", &path, e))?;
            files.push((format!("d{d}/f{n}"), body));
        }
    }
    let backup = crate::BackupOptions { threads: 2, ..crate::BackupOptions::default() };
    let summary = crate::backup_tree(&repo, src.path(), &backup, None, &cancel).await?;
    let settings = TEST_SETTINGS.lock().await;
    frames::KEEP_FOR_TESTS.store(keep, Relaxed);
    BATCH_ITEMS_FOR_TESTS.store(batch_items, Relaxed);
    let out = tempfile::tempdir().map_err(|e| RepoError::io("make", "a temporary dir", e))?;
    let options = RestoreOptions { threads: 4, ..RestoreOptions::default() };
    let restored = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        restore(&repo, &summary.snapshot_id, out.path(), &options, None, &cancel),
    )
    .await;
    frames::KEEP_FOR_TESTS.store(frames::KEEP_BYTES, Relaxed);
    BATCH_ITEMS_FOR_TESTS.store(0, Relaxed);
    drop(settings);
    let Ok(restored) = restored else {
        cancel.cancel();
        panic!("the restore stalled: not ended two minutes after it began");
    };
    assert_eq!(restored?.files, u64::from(6 * per_dir));
    for (name, body) in files {
        let got =
            std::fs::read(out.path().join(&name)).map_err(|e| RepoError::io("read", &name, e))?;
        assert!(got == body, "{name} restored exactly");
    }
    Ok(())
}

/// Frames evicted as soon as they are published (restores in this test binary keep no frame
/// while this runs): the batches that waited for one fetch it in their last round (claiming it
/// again when nobody else has), and every file is written exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_evicted_at_once_are_claimed_again_and_every_file_written() -> RepoResult<()> {
    restore_through_slow_reads(400, 0, 0).await
}

/// Batches of 8 files, each worker taking its next batch ahead (claiming that batch's frames
/// before it has finished the current one), and frames evicted at once, so they are claimed
/// again and again, also by batches taken ahead: the restore ends, every file exact. (A first
/// version of taking batches ahead stalled here every time: a worker waited for a frame while
/// the batch it had taken ahead held the claim of a frame another waiting worker needed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_batches_taken_ahead_with_frames_evicted_at_once_never_stall() -> RepoResult<()> {
    restore_through_slow_reads(300, 8, 0).await
}

/// Removing an entry in the way never crosses a mount point and stops at the depth limit; an
/// empty directory at the limit is removed.
#[test]
fn removal_stops_at_other_file_systems_and_the_depth_limit() {
    use fsops::{Refusal, Removal, removal};
    let (dir, file, link) = (libc::S_IFDIR, libc::S_IFREG, libc::S_IFLNK);
    assert_eq!(removal(7, 7, file, 0), Removal::Unlink);
    assert_eq!(removal(7, 7, link, MAX_DEPTH + 5), Removal::Unlink);
    assert_eq!(removal(7, 7, dir, 0), Removal::Empty);
    assert_eq!(removal(7, 7, dir, MAX_DEPTH - 1), Removal::Empty);
    assert_eq!(removal(7, 7, dir, MAX_DEPTH), Removal::RmdirOnly);
    for (kind, depth) in [(dir, 0), (dir, 3), (file, 0), (link, 1), (dir, MAX_DEPTH)] {
        assert_eq!(removal(7, 8, kind, depth), Removal::Refuse(Refusal::MountPoint));
    }
}

#[test]
fn a_refused_replacement_names_what_was_in_the_way() {
    use fsops::{Refusal, ReplaceError};
    let refused = |at: &str, reason| {
        ReplaceError::Refused { at: at.into(), reason }
            .into_repo("create file", std::path::Path::new("/t/x"))
            .to_string()
    };
    assert_eq!(
        refused("a/m", Refusal::MountPoint),
        "refusing to restore /t/x: /t/x/a/m is a mount point (another file system, or a bind \
         mount); not replaced"
    );
    assert_eq!(
        refused("", Refusal::MountPoint),
        "refusing to restore /t/x: it is a mount point (another file system, or a bind mount); \
         not replaced"
    );
    assert_eq!(
        refused("d", Refusal::TooDeep),
        format!(
            "refusing to restore /t/x: /t/x/d nests directories deeper than {MAX_DEPTH}; not replaced"
        )
    );
}

fn io_err(what: &'static str) -> impl Fn(std::io::Error) -> RepoError {
    move |e| RepoError::io(what, "(test)", e)
}

fn open_dir_at(path: &std::path::Path) -> RepoResult<OwnedFd> {
    nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| RepoError::io("open", path, e.into()))
}

/// A chain of directories one level deeper than the removal keeps open is refused (nothing of
/// the chain removed); one level less, and it goes.
#[test]
fn removing_a_tree_in_the_way_is_bounded_in_depth() -> RepoResult<()> {
    let base = tempfile::tempdir().map_err(io_err("tempdir"))?;
    let top = open_dir_at(base.path())?;
    // d/d/…/d, MAX_DEPTH + 2 directories: the one at the limit holds one more.
    let mut fd = open_dir_at(base.path())?;
    for _ in 0..MAX_DEPTH + 2 {
        nix::sys::stat::mkdirat(&fd, "d", Mode::from_bits_truncate(0o700))
            .map_err(|e| io_err("mkdir")(e.into()))?;
        fd = fsops::open_dir(&fd, b"d").map_err(io_err("open"))?;
    }
    drop(fd);
    match fsops::remove_any(&top, b"d") {
        Err(fsops::ReplaceError::Refused { at, reason: fsops::Refusal::TooDeep }) => {
            assert_eq!(at.components().count(), MAX_DEPTH, "{}", at.display());
        }
        other => panic!("not refused as too deep: {other:?}"),
    }
    // The innermost directory goes: the one at the limit is empty now.
    let mut fd = open_dir_at(base.path())?;
    for _ in 0..MAX_DEPTH + 1 {
        fd = fsops::open_dir(&fd, b"d").map_err(io_err("open"))?;
    }
    nix::unistd::unlinkat(&fd, "d", nix::unistd::UnlinkatFlags::RemoveDir)
        .map_err(|e| io_err("rmdir")(e.into()))?;
    drop(fd);
    fsops::remove_any(&top, b"d").map_err(|e| e.into_repo("remove", base.path()))?;
    assert!(!base.path().join("d").exists());
    Ok(())
}

/// A mount (unmounted, lazily, when dropped).
struct Mounted(std::path::PathBuf);

impl Mounted {
    /// A fresh tmpfs at `at`, or `from` bind-mounted there.
    fn new(from: Option<&std::path::Path>, at: &std::path::Path) -> RepoResult<Self> {
        use nix::mount::MsFlags;
        let (source, fstype, flags) = match from {
            Some(from) => (from.as_os_str(), None, MsFlags::MS_BIND),
            None => (std::ffi::OsStr::new("tmpfs"), Some("tmpfs"), MsFlags::empty()),
        };
        nix::mount::mount(Some(source), at, fstype, flags, None::<&str>)
            .map_err(|e| RepoError::io("mount", at, e.into()))?;
        Ok(Self(at.to_path_buf()))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// An entry of the target in the way of a restored one, with another file system mounted in
/// it (or on it, or a directory bind-mounted from the same file system): the restore refuses
/// to replace it, naming the mount point, and nothing of the mounted file system is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_in_the_way_is_never_removed_across_a_mount_point() -> RepoResult<()> {
    assert!(nix::unistd::geteuid().is_root(), "needs root: mount");
    let repo = repo().await?;
    let base = tempfile::tempdir().map_err(io_err("tempdir"))?;
    let target = base.path().join("target");
    let elsewhere = base.path().join("elsewhere");
    for dir in ["target/x/a", "target/x/m", "target/y", "target/z", "elsewhere"] {
        std::fs::create_dir_all(base.path().join(dir)).map_err(io_err("mkdir"))?;
    }
    let _x = Mounted::new(None, &target.join("x/m"))?;
    let _y = Mounted::new(None, &target.join("y"))?;
    let _z = Mounted::new(Some(&elsewhere), &target.join("z"))?;
    for precious in ["x/m/precious", "y/precious", "z/precious"] {
        std::fs::write(target.join(precious), b"keep").map_err(io_err("write"))?;
    }
    let cancel = CancellationToken::new();
    // x: a mount point inside the directory in the way; y: the entry itself; z: a bind mount.
    for (name, mount_point) in [("x", "x/m"), ("y", "y"), ("z", "z")] {
        let body = file(&repo, b"restored").await?;
        let id = snapshot_of(&repo, vec![vec![node(name.as_bytes(), body)]]).await?;
        let r = restore(&repo, &id, &target, &RestoreOptions::default(), None, &cancel).await;
        let Err(RepoError::UnsafeEntry { path, reason }) = r else {
            panic!("{name}: not refused: {r:?}");
        };
        assert_eq!(path, target.join(name));
        assert!(reason.contains("is a mount point (another file system"), "{name}: {reason}");
        if name == "x" {
            let shown = target.join(mount_point).display().to_string();
            assert!(reason.contains(&shown), "{name}: {reason}");
        }
        let kept = std::fs::read(target.join(mount_point).join("precious"));
        assert_eq!(kept.map_err(io_err("read"))?, b"keep", "{name}");
    }
    Ok(())
}

#[test]
fn the_shortfall_counts_unreadable_entries_and_quotes_the_first_warnings() {
    let summary = |errors: u64, warnings: &[&str], total: u64| RestoreSummary {
        files: 9,
        dirs: 2,
        bytes: 100,
        entries_with_backup_errors: errors,
        warnings: warnings.iter().map(|w| (*w).to_owned()).collect(),
        warnings_total: total,
        withheld: Withheld::default(),
        duration: Duration::ZERO,
    };
    assert_eq!(summary(0, &[], 0).shortfall(3), None);
    assert_eq!(
        summary(1, &[], 0).shortfall(3).as_deref(),
        Some(
            "1 entry was unreadable when backed up and is restored as recorded (its content missing)"
        )
    );
    assert_eq!(
        summary(4, &["a: set xattr user.x: Operation not supported"], 1).shortfall(3).as_deref(),
        Some(
            "4 entries were unreadable when backed up and are restored as recorded (their content \
             missing); 1 warning: a: set xattr user.x: Operation not supported"
        )
    );
    // Five kept of 250: three quoted, the rest counted.
    let many = summary(0, &["w1", "w2", "w3", "w4", "w5"], 250);
    assert_eq!(many.shortfall(3).as_deref(), Some("250 warnings: w1; w2; w3; and 247 more"));
    assert_eq!(many.shortfall(0).as_deref(), Some("250 warnings"));
    assert_eq!(summary(0, &["w1", "w2"], 2).shortfall(3).as_deref(), Some("2 warnings: w1; w2"));
}
