//! Shared helpers: repositories on real stores, a tree of hard cases, and a tree comparison.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_repo::{InitOptions, KdfParams, Repository};
use ferry_store::{FsStore, MemoryStore, ObjectStore};
use tokio_util::sync::CancellationToken;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

pub fn options() -> InitOptions {
    let mut o = InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() };
    o.packs.target_size = 4 << 20;
    o
}

/// A fresh repository on the in-memory store.
pub async fn memory_repo() -> (Repository, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let (repo, _) = Repository::init(dyn_store, b"secret", &options(), &CancellationToken::new())
        .await
        .unwrap();
    (repo, store)
}

/// A fresh repository of `format` on the in-memory store.
pub async fn memory_repo_of(
    format: ferry_repo::RepoFormat,
) -> Result<(Repository, Arc<MemoryStore>), ferry_repo::RepoError> {
    let store = Arc::new(MemoryStore::new());
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let options = InitOptions { format, ..options() };
    let (repo, _) =
        Repository::init(dyn_store, b"secret", &options, &CancellationToken::new()).await?;
    Ok((repo, store))
}

/// A fresh repository on the file-system store under `dir`.
pub async fn fs_repo(dir: &Path) -> Repository {
    let store: Arc<dyn ObjectStore> = Arc::new(FsStore::open(dir).unwrap());
    Repository::init(store, b"secret", &options(), &CancellationToken::new()).await.unwrap().0
}

/// A store on the shared real S3 server (moto) under `bucket/prefix`, creating the bucket.
pub async fn s3_store(bucket: &str, prefix: &str) -> Arc<dyn ObjectStore> {
    use ferry_store::{S3Config, S3Options, S3Store, StaticCredentials};
    ferry_testbed::install_crypto_provider();
    let s3 = ferry_testbed::S3Server::shared();
    s3.create_bucket(bucket).unwrap();
    let options = S3Options {
        endpoint: Some(s3.endpoint().to_owned()),
        region: Some("us-east-1".into()),
        force_path_style: true,
        credentials: Some(StaticCredentials {
            access_key_id: "ferry-test".into(),
            secret_access_key: "ferry-test-secret".into(),
            session_token: None,
        }),
        ..S3Options::default()
    };
    let config = S3Config { bucket: bucket.into(), prefix: prefix.into(), options };
    Arc::new(S3Store::new(config).await.unwrap())
}

pub fn noise(len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![0u8; len];
    blake3::Hasher::new_keyed(&[seed; 32]).finalize_xof().fill(&mut v);
    v
}

/// `len` bytes of numbered lines of text: a volume image that compresses well and whose chunks
/// all differ.
pub fn text_image(len: usize) -> Vec<u8> {
    (0u32..)
        .flat_map(|i| format!("line {i} of a volume, {}\n", i % 89).into_bytes())
        .take(len)
        .collect()
}

/// Where the index places each chunk of the volume snapshot `id`, in the volume's order.
pub async fn volume_chunk_locations(
    repo: &Repository,
    id: &ferry_repo::SnapshotId,
) -> Vec<ferry_repo::BlobLocation> {
    let cancel = CancellationToken::new();
    let snapshot = repo.load_snapshot(id, &cancel).await.unwrap();
    let ferry_repo::format::NodeBody::Volume { content, .. } = &snapshot.root.body else {
        panic!("a volume snapshot: {:?}", snapshot.root.body);
    };
    let mut places = Vec::with_capacity(content.chunks.len());
    for chunk in &content.chunks {
        let located = repo.locate(&chunk.id, &cancel).await.unwrap();
        places.push(located.unwrap_or_else(|| panic!("chunk {:?} not indexed", chunk.id)));
    }
    assert!(!places.is_empty(), "a volume snapshot with no chunks");
    places
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn set_times(p: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    utimensat(
        nix::fcntl::AT_FDCWD,
        p,
        &TimeSpec::new(atime.0, atime.1),
        &TimeSpec::new(mtime.0, mtime.1),
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
}

pub fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    let c = cpath(p);
    // The test tree lives on a file system with user xattrs (tmpfs/ext4); fail loudly otherwise.
    #[allow(unsafe_code)]
    let rc =
        unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(rc, 0, "setxattr {}: {}", p.display(), std::io::Error::last_os_error());
}

/// Builds the tree of hard cases under `root` (which must exist).
pub fn build_hard_tree(root: &Path) {
    use std::fs;
    let w = |p: &str, data: &[u8]| fs::write(root.join(p), data).unwrap();
    fs::create_dir_all(root.join("dir/sub/empty")).unwrap();
    w("empty", b"");
    w("one", b"x");
    w("random-3m", &noise(3 << 20, 1));
    w("text", &b"the quick brown fox jumps over the lazy dog\n".repeat(50_000));
    // Content shared by two files (dedup) and a file larger than one pack.
    w("dir/copy-of-random", &noise(3 << 20, 1));
    w("dir/big", &noise(9 << 20, 2));
    // Sparse: 64 MiB with two data islands.
    {
        let f = fs::File::create(root.join("sparse")).unwrap();
        f.set_len(64 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&noise(100_000, 3), 1 << 20).unwrap();
        f.write_all_at(&noise(5000, 4), 40 << 20).unwrap();
    }
    // Hard links, across directories.
    w("hl-a", b"linked content");
    fs::hard_link(root.join("hl-a"), root.join("dir/hl-b")).unwrap();
    fs::hard_link(root.join("hl-a"), root.join("hl-c")).unwrap();
    // Symlinks: dangling, looping, absolute, into the tree.
    std::os::unix::fs::symlink("does/not/exist", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("loop-b", root.join("loop-a")).unwrap();
    std::os::unix::fs::symlink("loop-a", root.join("loop-b")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("absolute")).unwrap();
    std::os::unix::fs::symlink("dir/sub", root.join("to-dir")).unwrap();
    // Special nodes.
    nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o640))
        .unwrap();
    nix::sys::stat::mknod(
        &root.join("null-dev"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    nix::sys::stat::mknod(
        &root.join("blk-dev"),
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(7, 200),
    )
    .unwrap();
    // Names.
    w("héllo wörld ✓", b"unicode");
    fs::write(root.join(OsStr::from_bytes(b"new\nline")), b"newline").unwrap();
    fs::write(root.join(OsStr::from_bytes(b"latin1-\xe9")), b"not utf-8").unwrap();
    // Deep nesting.
    let mut deep = root.join("deep");
    for i in 0..80 {
        deep.push(format!("level{i}"));
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("bottom"), b"deep file").unwrap();
    // Many small files.
    fs::create_dir(root.join("many")).unwrap();
    for i in 0..5000 {
        fs::write(
            root.join(format!("many/f{i:05}")),
            format!("small file number {i}\n").repeat(i % 7 + 1),
        )
        .unwrap();
    }
    // Modes, owners, xattrs, times.
    fs::set_permissions(root.join("one"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(root.join("dir/sub"), fs::Permissions::from_mode(0o1777)).unwrap();
    w("no-perms", b"locked");
    fs::set_permissions(root.join("no-perms"), fs::Permissions::from_mode(0o000)).unwrap();
    nix::unistd::chown(
        &root.join("text"),
        Some(nix::unistd::Uid::from_raw(1234)),
        Some(nix::unistd::Gid::from_raw(5678)),
    )
    .unwrap();
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &root.join("dangling"),
        Some(nix::unistd::Uid::from_raw(42)),
        Some(nix::unistd::Gid::from_raw(43)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    set_xattr(&root.join("text"), "user.comment", b"hello xattr");
    set_xattr(&root.join("text"), "user.binary", &[0, 1, 2, 255]);
    set_xattr(&root.join("dir"), "user.dir", b"on a directory");
    // A file capability (cap_net_raw, permitted and effective; VFS_CAP_REVISION_2): the
    // kernel drops it on any chown, so restore must set owners before xattrs.
    w("capable", b"ping");
    let mut cap = Vec::new();
    for word in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
        cap.extend_from_slice(&word.to_le_bytes());
    }
    set_xattr(&root.join("capable"), "security.capability", &cap);
    set_times(&root.join("text"), (1_600_000_000, 123_456_789), (1_500_000_000, 987_654_321));
    set_times(&root.join("dangling"), (1_400_000_000, 1), (1_300_000_000, 999_999_999));
    set_times(&root.join("dir/sub/empty"), (1_200_000_000, 5), (1_100_000_000, 7));
}

/// What we compare of one entry.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, i64),
    pub size: u64,
    pub rdev: u64,
    pub link: Option<Vec<u8>>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub content: Option<[u8; 32]>,
    pub data_ranges: Option<Vec<(u64, u64)>>,
    /// Paths of the other names of this inode, relative to the root.
    pub links: Vec<PathBuf>,
}

fn xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = cpath(p);
    let mut names = vec![0u8; 4096];
    #[allow(unsafe_code)]
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    let n = usize::try_from(n).unwrap_or(0);
    let mut out = Vec::new();
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name).unwrap();
        let mut value = vec![0u8; 65536];
        #[allow(unsafe_code)]
        let m = unsafe {
            libc::lgetxattr(c.as_ptr(), cn.as_ptr(), value.as_mut_ptr().cast(), value.len())
        };
        value.truncate(usize::try_from(m).unwrap_or(0));
        out.push((name.to_vec(), value));
    }
    out.sort();
    out
}

fn data_ranges(p: &Path) -> Vec<(u64, u64)> {
    use nix::unistd::{Whence, lseek};
    use std::os::fd::AsFd;
    let f = std::fs::File::open(p).unwrap();
    let size = i64::try_from(f.metadata().unwrap().len()).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < size {
        let Ok(data) = lseek(f.as_fd(), pos, Whence::SeekData) else { break };
        let hole = lseek(f.as_fd(), data, Whence::SeekHole).unwrap();
        out.push((data as u64, hole as u64));
        pos = hole;
    }
    out
}

/// Every entry under `root` (relative path → entry); the root itself is "".
pub fn scan(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut inodes: HashMap<(u64, u64), Vec<PathBuf>> = HashMap::new();
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let md = std::fs::symlink_metadata(&p).unwrap();
        let kind = md.mode() & libc::S_IFMT;
        if kind == libc::S_IFDIR {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        } else if md.nlink() > 1 {
            inodes.entry((md.dev(), md.ino())).or_default().push(rel.clone());
        }
        let is_file = kind == libc::S_IFREG;
        out.insert(
            rel.clone(),
            Entry {
                kind,
                mode: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                mtime: (md.mtime(), md.mtime_nsec()),
                size: if kind == libc::S_IFDIR { 0 } else { md.size() },
                rdev: md.rdev(),
                link: (kind == libc::S_IFLNK)
                    .then(|| std::fs::read_link(&p).unwrap().into_os_string().into_vec()),
                xattrs: xattrs(&p),
                content: is_file.then(|| *blake3::hash(&std::fs::read(&p).unwrap()).as_bytes()),
                data_ranges: (is_file && md.blocks() * 512 < md.size()).then(|| data_ranges(&p)),
                links: Vec::new(),
            },
        );
    }
    for group in inodes.values() {
        for member in group {
            let mut others: Vec<PathBuf> = group.iter().filter(|o| *o != member).cloned().collect();
            others.sort();
            if let Some(e) = out.get_mut(member) {
                e.links = others;
            }
        }
    }
    out
}

use std::os::unix::ffi::OsStringExt;

/// Asserts two trees are identical in everything [`scan`] sees.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let (sa, sb) = (scan(a), scan(b));
    let names_a: Vec<_> = sa.keys().collect();
    let names_b: Vec<_> = sb.keys().collect();
    assert_eq!(names_a, names_b, "different entries");
    for (k, ea) in &sa {
        assert_eq!(Some(ea), sb.get(k), "entry {} differs", k.display());
    }
}

/// Cancels a token once `after` pack files (`data/…`) have been written (a hook for
/// [`ferry_store::Hooked`]): a deterministic interruption point, whatever the machine's speed.
#[derive(Debug)]
pub struct CancelAfterPacks {
    pub after: usize,
    pub written: std::sync::atomic::AtomicUsize,
    pub cancel: CancellationToken,
}

#[async_trait::async_trait]
impl ferry_store::Hook for CancelAfterPacks {
    fn after(&self, call: ferry_store::Call<'_>, ok: bool) {
        if ok && matches!(call, ferry_store::Call::Put(key) if key.as_str().starts_with("data/")) {
            let n = self.written.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            if n >= self.after {
                self.cancel.cancel();
            }
        }
    }
}

/// Backs up the tree of hard cases, restores it, compares, and checks every byte.
pub async fn hard_cases_round_trip(repo: &Repository) -> TestResult {
    let cancel = CancellationToken::new();
    let src = tempfile::tempdir()?;
    build_hard_tree(src.path());
    let summary = ferry_repo::backup_tree(
        repo,
        src.path(),
        &ferry_repo::BackupOptions::default(),
        None,
        &cancel,
    )
    .await?;
    assert_eq!(summary.errors, 0);
    assert!(summary.files > 5000);
    // The duplicated 3 MiB file is stored once.
    assert!(
        summary.bytes_new + (3 << 20) <= summary.bytes_total + (64 << 20) - 105_000,
        "{summary:?}"
    );
    let out = tempfile::tempdir()?;
    let target = out.path().join("restored");
    let r = ferry_repo::restore(
        repo,
        &summary.snapshot_id,
        &target,
        &ferry_repo::RestoreOptions::default(),
        None,
        &cancel,
    )
    .await?;
    assert_eq!(r.files, summary.files);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_same_tree(src.path(), &target);
    let report = ferry_repo::check(
        repo,
        ferry_repo::CheckOptions { read_data: true, subset: None },
        None,
        &cancel,
    )
    .await?;
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.snapshots, 1);
    assert!(report.packs_read > 0);
    Ok(())
}
