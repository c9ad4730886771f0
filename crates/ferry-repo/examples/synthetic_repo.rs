//! Builds a synthetic repository of many tiny chunks on the file-system store, to measure
//! `ferry` itself on it (open, `check`, `restore`, `backup`, `gc`; see `benches/README.md`):
//! `FILES × CHUNKS_PER_FILE` distinct 16-byte chunks, 16 per pack, in two overlapping
//! snapshots (files [0, 60 %) and [40 %, 100 %)), password `bench`.
//!
//! `cargo run --release -p ferry-repo --example synthetic_repo -- WORKDIR [FILES] [CHUNKS_PER_FILE]`
//! (defaults: 1000, 1000). WORKDIR must not hold a repository yet.

use std::sync::Arc;
use std::time::Instant;

use ferry_repo::gc::synthetic;
use ferry_repo::{InitOptions, KdfParams, Repository};
use ferry_store::{FsStore, ObjectStore};
use tokio_util::sync::CancellationToken;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(work) = args.get(1) else {
        return Err("usage: synthetic_repo WORKDIR [FILES] [CHUNKS_PER_FILE]".into());
    };
    let files: u32 = args.get(2).map_or(Ok(1000), |s| s.parse())?;
    let per_file: u32 = args.get(3).map_or(Ok(1000), |s| s.parse())?;
    std::fs::create_dir_all(work)?;
    let store: Arc<dyn ObjectStore> = Arc::new(FsStore::open(work)?);
    let cancel = CancellationToken::new();
    let options = InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() };
    let (repo, _) = Repository::init(store, b"bench", &options, &cancel).await?;
    let started = Instant::now();
    let ranges = [(0, files * 6 / 10), (files * 4 / 10, files)];
    let ids = synthetic::populate(&repo, files, per_file, &ranges, &cancel).await?;
    println!(
        "built {} chunks in {:.1} s; snapshots {}",
        u64::from(files) * u64::from(per_file),
        started.elapsed().as_secs_f64(),
        ids.iter().map(ToString::to_string).collect::<Vec<_>>().join(" ")
    );
    Ok(())
}
