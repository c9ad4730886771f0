//! Criterion benchmarks of each stage of Ferry's data path, and of whole backups and restores.
//!
//! Stages, each on one core, in bytes per second of plaintext:
//! - `chunker`: keyed FastCDC boundaries over a 32 MiB stream: format 1's cut on the keyed
//!   Gear hash (`gear_*`) and format 2's on a PRF of a keyed rolling hash (`prf_*`).
//! - `blob_id`: keyed BLAKE3 of one 1 MiB chunk.
//! - `zstd`: the zstd call Ferry makes for file data (level [`DEFAULT_DATA_LEVEL`], a reused
//!   compressor), on text and on incompressible bytes (the bypass path).
//! - `cipher`: XChaCha20-Poly1305 seal and open of 1 MiB.
//! - `pack`: [`PackBuilder`] filled with 16 chunks of 1 MiB (compress, encrypt, append) and
//!   sealed; [`open_blob`] (authenticate, decompress, verify the id) for one chunk, which is
//!   what restore does per chunk.
//! - `tree`: [`TreePage`] encode and decode (with validation) of a full page of files.
//!
//! Whole pipeline, on a generated tree of about 60 MiB ([`TreeSpec::default`]), into a
//! [`MemoryStore`] and into an [`FsStore`] in a temporary directory: first backup into an
//! empty repository, backup of the unchanged tree against its parent, and restore into an
//! empty directory. Key derivation uses test-grade argon2 costs so it does not hide the data
//! path.
//!
//! `cargo bench -p ferry-benches -- --quick` runs everything in a couple of minutes.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, measurement::WallTime};
use ferry_benches::{SeededRng, TreeSpec, random_bytes, text_bytes, write_tree};
use ferry_repo::format::{
    BlobId, ChunkRef, Chunker, ChunkerParams, Cipher, DEFAULT_DATA_LEVEL, FileContent, MasterKey,
    Metadata, Node, NodeBody, ObjectKind, PackBuilder, RepoFormat, RepoKeys, Timestamp, TreePage,
    open_blob,
};
use ferry_repo::{
    BackupOptions, InitOptions, KdfParams, Repository, RestoreOptions, SnapshotId, backup_tree,
    restore,
};
use ferry_store::{FsStore, MemoryStore, ObjectStore};
use tokio_util::sync::CancellationToken;

const MIB: usize = 1 << 20;

fn keys() -> RepoKeys {
    MasterKey::from_secret([42; 32]).derive()
}

/// A group for micro benchmarks: small sample count, short windows.
fn micro<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g
}

fn bench_chunker(c: &mut Criterion) {
    let keys = keys();
    let mut g = micro(c, "chunker");
    for (format, name) in [(RepoFormat::V1, "gear"), (RepoFormat::V2, "prf")] {
        let Ok(chunker) = Chunker::for_format(format, ChunkerParams::default(), &keys) else {
            panic!("default chunker parameters are valid");
        };
        for (label, data) in
            [("random", random_bytes(1, 32 * MIB)), ("text", text_bytes(1, 32 * MIB))]
        {
            g.throughput(Throughput::Bytes(data.len() as u64));
            g.bench_function(format!("{name}_{label}"), |b| {
                b.iter(|| black_box(chunker.split(black_box(&data))))
            });
        }
    }
    g.finish();
}

fn bench_blob_id(c: &mut Criterion) {
    let keys = keys();
    let chunk = random_bytes(2, MIB);
    let mut g = micro(c, "blob_id");
    g.throughput(Throughput::Bytes(chunk.len() as u64));
    g.bench_function("keyed_blake3_1MiB", |b| {
        b.iter(|| black_box(keys.blob_id(black_box(&chunk))))
    });
    g.finish();
}

fn bench_zstd(c: &mut Criterion) {
    let mut g = micro(c, "zstd");
    for (label, data) in [("text", text_bytes(3, MIB)), ("random", random_bytes(3, MIB))] {
        let Ok(mut compressor) = zstd::bulk::Compressor::new(DEFAULT_DATA_LEVEL) else {
            panic!("zstd level {DEFAULT_DATA_LEVEL} is valid");
        };
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.bench_function(format!("compress_level{DEFAULT_DATA_LEVEL}_{label}"), |b| {
            b.iter(|| {
                out.clear();
                black_box(compressor.compress_to_buffer(black_box(&data), &mut out).ok())
            });
        });
    }
    let text = text_bytes(3, MIB);
    let Ok(packed) = zstd::bulk::compress(&text, DEFAULT_DATA_LEVEL) else {
        panic!("zstd compresses text");
    };
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("decompress_text", |b| {
        b.iter(|| black_box(zstd::bulk::decompress(black_box(&packed), MIB).ok()));
    });
    g.finish();
}

fn bench_cipher(c: &mut Criterion) {
    let cipher = Cipher::new(&[9; 32]);
    let data = random_bytes(4, MIB);
    let mut sealed = Vec::with_capacity(MIB + 64);
    cipher.seal_append(&mut sealed, b"ad", &data);
    let mut g = micro(c, "cipher");
    g.throughput(Throughput::Bytes(data.len() as u64));
    let mut out = Vec::with_capacity(MIB + 64);
    g.bench_function("seal_1MiB", |b| {
        b.iter(|| {
            out.clear();
            cipher.seal_append(&mut out, b"ad", black_box(&data));
            black_box(out.len())
        });
    });
    g.bench_function("open_1MiB", |b| {
        b.iter(|| black_box(cipher.open(b"ad", black_box(&sealed)).ok()))
    });
    g.finish();
}

fn bench_pack(c: &mut Criterion) {
    let keys = keys();
    let chunks_of = |text: bool| -> Vec<(BlobId, Vec<u8>)> {
        (0..16u64)
            .map(|i| {
                let d = if text { text_bytes(100 + i, MIB) } else { random_bytes(100 + i, MIB) };
                (keys.blob_id(&d), d)
            })
            .collect()
    };
    let mut g = micro(c, "pack");
    g.throughput(Throughput::Bytes(16 * MIB as u64));
    for (label, chunks, level) in [
        ("text_zstd", chunks_of(true), DEFAULT_DATA_LEVEL),
        ("random_zstd_bypass", chunks_of(false), DEFAULT_DATA_LEVEL),
        ("text_uncompressed", chunks_of(true), 0),
    ] {
        g.bench_function(format!("build_16MiB_{label}"), |b| {
            b.iter(|| {
                let mut pack = PackBuilder::new();
                for (id, data) in &chunks {
                    pack.add(&keys, *id, ObjectKind::DataBlob, level, data);
                }
                black_box(pack.finish(&keys.cipher, RepoFormat::V2).bytes.len())
            });
        });
    }
    for (label, data) in [("text", text_bytes(200, MIB)), ("random", random_bytes(200, MIB))] {
        let id = keys.blob_id(&data);
        let mut pack = PackBuilder::new();
        pack.add(&keys, id, ObjectKind::DataBlob, DEFAULT_DATA_LEVEL, &data);
        let sealed = pack.finish(&keys.cipher, RepoFormat::V2);
        let Some(entry) = sealed.entries.first() else { panic!("the pack holds one blob") };
        let blob = &sealed.bytes[entry.offset as usize..(entry.offset + entry.length) as usize];
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.bench_function(format!("open_blob_1MiB_{label}"), |b| {
            b.iter(|| black_box(open_blob(&keys, &id, ObjectKind::DataBlob, black_box(blob)).ok()));
        });
    }
    g.finish();
}

/// A full tree page of small files, one or two chunks each, with realistic metadata.
fn tree_page() -> TreePage {
    let mut rng = SeededRng::new(5);
    let entries = (0..TreePage::MAX_ENTRIES)
        .map(|i| {
            let chunks: Vec<ChunkRef> = (0..1 + rng.below(2))
                .map(|_| {
                    let mut id = [0u8; 32];
                    rng.fill(&mut id);
                    ChunkRef { id: BlobId(id), len: 1 + rng.below(1 << 20) as u32 }
                })
                .collect();
            let size = chunks.iter().map(|c| u64::from(c.len)).sum();
            let ts = Timestamp {
                sec: 1_700_000_000 + rng.below(1 << 24) as i64,
                nsec: rng.below(1_000_000_000) as u32,
            };
            Node {
                name: format!("source_file_{i:06}.c").into_bytes(),
                body: NodeBody::File(FileContent { size, extents: None, chunks }),
                meta: Metadata {
                    mode: 0o644,
                    uid: 1000,
                    gid: 1000,
                    mtime: ts,
                    atime: ts,
                    ctime: ts,
                    xattrs: Vec::new(),
                },
                hardlink: None,
                error: None,
            }
        })
        .collect();
    TreePage { entries }
}

fn bench_tree(c: &mut Criterion) {
    let page = tree_page();
    let encoded = page.encode();
    let mut g = micro(c, "tree");
    g.throughput(Throughput::Bytes(encoded.len() as u64));
    g.bench_function("encode_4096_files", |b| b.iter(|| black_box(black_box(&page).encode())));
    g.bench_function("decode_4096_files", |b| {
        b.iter(|| black_box(TreePage::decode(black_box(&encoded)).ok()))
    });
    g.finish();
}

/// Where a whole-pipeline benchmark keeps its repositories.
#[derive(Clone, Copy)]
enum StoreKind {
    Memory,
    Fs,
}

impl StoreKind {
    fn label(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Fs => "fs",
        }
    }

    /// A new, empty store (under `scratch` for the file system).
    fn create(self, scratch: &Path, n: u64) -> Arc<dyn ObjectStore> {
        match self {
            Self::Memory => Arc::new(MemoryStore::new()),
            Self::Fs => {
                let root = scratch.join(format!("repo{n}"));
                if let Err(e) = std::fs::create_dir_all(&root) {
                    panic!("create {}: {e}", root.display());
                }
                match FsStore::open(&root) {
                    Ok(s) => Arc::new(s),
                    Err(e) => panic!("open a file-system store at {}: {e}", root.display()),
                }
            }
        }
    }

    fn remove(self, scratch: &Path, n: u64) {
        if let Self::Fs = self {
            let _ = std::fs::remove_dir_all(scratch.join(format!("repo{n}")));
        }
    }
}

struct Pipeline {
    rt: tokio::runtime::Runtime,
    cancel: CancellationToken,
    source: tempfile::TempDir,
    scratch: tempfile::TempDir,
    bytes: u64,
    counter: std::cell::Cell<u64>,
}

impl Pipeline {
    fn new() -> Self {
        let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => panic!("tokio runtime: {e}"),
        };
        let (source, scratch) = match (tempfile::tempdir(), tempfile::tempdir()) {
            (Ok(a), Ok(b)) => (a, b),
            _ => panic!("cannot create temporary directories"),
        };
        let stats = match write_tree(source.path(), &TreeSpec::default()) {
            Ok(s) => s,
            Err(e) => panic!("generate the benchmark tree: {e}"),
        };
        Self {
            rt,
            cancel: CancellationToken::new(),
            source,
            scratch,
            bytes: stats.bytes,
            counter: 0.into(),
        }
    }

    fn next(&self) -> u64 {
        let n = self.counter.get();
        self.counter.set(n + 1);
        n
    }

    fn init(&self, store: Arc<dyn ObjectStore>) -> Repository {
        let options =
            InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() };
        match self.rt.block_on(Repository::init(store, b"bench", &options, &self.cancel)) {
            Ok((repo, _)) => repo,
            Err(e) => panic!("init repository: {e}"),
        }
    }

    fn backup(&self, repo: &Repository, parent: Option<SnapshotId>) -> SnapshotId {
        let options = BackupOptions { parent, ..BackupOptions::default() };
        match self.rt.block_on(backup_tree(repo, self.source.path(), &options, None, &self.cancel))
        {
            Ok(s) => s.snapshot_id,
            Err(e) => panic!("backup: {e}"),
        }
    }
}

fn bench_pipeline(c: &mut Criterion) {
    let p = Pipeline::new();
    let mut g = c.benchmark_group("pipeline");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Bytes(p.bytes));
    for kind in [StoreKind::Memory, StoreKind::Fs] {
        g.bench_function(format!("backup_first_{}", kind.label()), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let n = p.next();
                    let repo = p.init(kind.create(p.scratch.path(), n));
                    let start = Instant::now();
                    black_box(p.backup(&repo, None));
                    total += start.elapsed();
                    drop(repo);
                    kind.remove(p.scratch.path(), n);
                }
                total
            });
        });

        let n = p.next();
        let repo = p.init(kind.create(p.scratch.path(), n));
        let first = p.backup(&repo, None);
        g.bench_function(format!("backup_unchanged_{}", kind.label()), |b| {
            b.iter(|| black_box(p.backup(&repo, Some(first))));
        });
        g.bench_function(format!("restore_{}", kind.label()), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let target = p.scratch.path().join(format!("restore{}", p.next()));
                    let start = Instant::now();
                    let done = p.rt.block_on(restore(
                        &repo,
                        &first,
                        &target,
                        &RestoreOptions::default(),
                        None,
                        &p.cancel,
                    ));
                    total += start.elapsed();
                    if let Err(e) = done {
                        panic!("restore: {e}");
                    }
                    let _ = std::fs::remove_dir_all(&target);
                }
                total
            });
        });
        drop(repo);
        kind.remove(p.scratch.path(), n);
    }
    g.finish();
}

criterion::criterion_group!(
    stages,
    bench_chunker,
    bench_blob_id,
    bench_zstd,
    bench_cipher,
    bench_pack,
    bench_tree
);
criterion::criterion_group!(pipeline, bench_pipeline);
criterion::criterion_main!(stages, pipeline);
