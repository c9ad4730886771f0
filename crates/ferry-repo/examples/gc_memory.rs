//! Garbage collection of a repository with a million chunks: builds a synthetic repository
//! (16-byte chunks, 16 per pack, two overlapping snapshots of 1000 files × 1000 chunks each
//! range), forgets one snapshot, runs `gc`, and prints the peak heap it used.
//!
//! `cargo run --release -p ferry-repo --example gc_memory -- [WORKDIR] [FILES] [CHUNKS_PER_FILE]`
//! (defaults: a temporary directory, 1000, 1000).
// A counting global allocator needs `unsafe impl GlobalAlloc`; it only forwards to `System`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use ferry_repo::gc::{GcOptions, forget, gc, synthetic};
use ferry_repo::{InitOptions, KdfParams, Repository};
use ferry_store::{FsStore, ObjectStore};
use tokio_util::sync::CancellationToken;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = CURRENT.fetch_add(new_size - layout.size(), Ordering::Relaxed)
                    + (new_size - layout.size());
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn mib(b: usize) -> f64 {
    b as f64 / (1 << 20) as f64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let temp = tempfile::tempdir()?;
    let work = args.get(1).map_or_else(|| temp.path().to_path_buf(), Into::into);
    let files: u32 = args.get(2).map_or(Ok(1000), |s| s.parse())?;
    let per_file: u32 = args.get(3).map_or(Ok(1000), |s| s.parse())?;
    std::fs::create_dir_all(&work)?;
    let store: Arc<dyn ObjectStore> = Arc::new(FsStore::open(&work)?);
    let cancel = CancellationToken::new();
    let options = InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() };
    let (repo, _) = Repository::init(Arc::clone(&store), b"bench", &options, &cancel).await?;
    let started = Instant::now();
    // Snapshot A: files [0, 60 %); snapshot B: files [40 %, 100 %).
    let ranges = [(0, files * 6 / 10), (files * 4 / 10, files)];
    let ids = synthetic::populate(&repo, files, per_file, &ranges, &cancel).await?;
    println!(
        "built {} chunks in {:.1} s",
        u64::from(files) * u64::from(per_file),
        started.elapsed().as_secs_f64()
    );
    forget(&repo, &ids[..1], &cancel).await?;
    drop(repo);
    // A fresh handle, as `ferry gc` would open it.
    let repo = Repository::open(store, b"bench", &cancel).await?;
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let started = Instant::now();
    let report = gc(&repo, &GcOptions::default(), &cancel).await?;
    let peak = PEAK.load(Ordering::Relaxed);
    let (packs, bytes) = report.deleted();
    println!(
        "gc: {:.1} s, deleted {packs} packs ({:.1} MiB), referenced blobs {}, peak heap {:.1} MiB \
         above {:.1} MiB before gc",
        started.elapsed().as_secs_f64(),
        mib(bytes as usize),
        report.mark.as_ref().map_or(0, |m| m.referenced_blobs),
        mib(peak - base),
        mib(base)
    );
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        for line in status.lines().filter(|l| l.starts_with("VmHWM")) {
            println!("process {line} (includes building the repository)");
        }
    }
    Ok(())
}
