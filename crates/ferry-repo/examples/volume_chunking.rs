//! Compares block-volume chunking strategies on two images of one volume (a base and the same
//! volume after a change): how many bytes the incremental backup of the second would store
//! after the first, and how fast each strategy chunks and hashes.
//!
//! `cargo run --release -p ferry-repo --example volume_chunking -- BASE.img CHANGED.img`
//!
//! Strategies: FastCDC with the file-data parameters (256 KiB / 1 MiB / 4 MiB, keyed gear table)
//! and fixed-size chunks aligned to the device at 64 KiB, 256 KiB, 1 MiB and 4 MiB. All-zero
//! chunks are skipped by every strategy, as the volume backup does. The results are recorded in
//! `VOLUMES.md` beside this crate's `Cargo.toml`.

use std::collections::HashSet;
use std::time::Instant;

use ferry_repo::format::{Chunker, ChunkerParams, MasterKey};

#[derive(Default)]
struct Stats {
    chunks: u64,
    data: u64,
    ids: HashSet<[u8; 32]>,
}

fn chunk_lengths(data: &[u8], strategy: &Strategy) -> Vec<usize> {
    match strategy {
        Strategy::Cdc(c) => c.split(data),
        Strategy::Fixed(size) => data.chunks(*size).map(<[u8]>::len).collect(),
    }
}

enum Strategy {
    Cdc(Chunker),
    Fixed(usize),
}

fn scan(data: &[u8], strategy: &Strategy, key: &[u8; 32]) -> Stats {
    let mut s = Stats::default();
    let mut pos = 0;
    for len in chunk_lengths(data, strategy) {
        let chunk = &data[pos..pos + len];
        pos += len;
        if chunk.iter().all(|b| *b == 0) {
            continue;
        }
        s.chunks += 1;
        s.data += len as u64;
        s.ids.insert(*blake3::keyed_hash(key, chunk).as_bytes());
    }
    s
}

fn new_bytes(data: &[u8], strategy: &Strategy, key: &[u8; 32], base: &HashSet<[u8; 32]>) -> u64 {
    let mut pos = 0;
    let mut new = 0u64;
    let mut seen = HashSet::new();
    for len in chunk_lengths(data, strategy) {
        let chunk = &data[pos..pos + len];
        pos += len;
        if chunk.iter().all(|b| *b == 0) {
            continue;
        }
        let id = *blake3::keyed_hash(key, chunk).as_bytes();
        if !base.contains(&id) && seen.insert(id) {
            new += len as u64;
        }
    }
    new
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(base), Some(changed)) = (args.get(1), args.get(2)) else {
        return Err("usage: volume_chunking BASE.img CHANGED.img".into());
    };
    let base = std::fs::read(base)?;
    let changed = std::fs::read(changed)?;
    let keys = MasterKey::generate().derive();
    let key = *blake3::hash(b"volume chunking comparison").as_bytes();
    let strategies = [
        ("FastCDC 256K/1M/4M", Strategy::Cdc(Chunker::new(ChunkerParams::default(), keys.gear())?)),
        ("fixed 64 KiB", Strategy::Fixed(64 << 10)),
        ("fixed 256 KiB", Strategy::Fixed(256 << 10)),
        ("fixed 1 MiB", Strategy::Fixed(1 << 20)),
        ("fixed 4 MiB", Strategy::Fixed(4 << 20)),
    ];
    println!(
        "volume {} MiB; base and changed differ in {} 4 KiB blocks",
        base.len() >> 20,
        base.chunks(4096).zip(changed.chunks(4096)).filter(|(a, b)| a != b).count()
    );
    println!(
        "| strategy | chunks (base) | mean chunk | stored by the incremental | of the device | chunk+hash GB/s |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, strategy) in &strategies {
        let started = Instant::now();
        let stats = scan(&base, strategy, &key);
        let secs = started.elapsed().as_secs_f64();
        let new = new_bytes(&changed, strategy, &key, &stats.ids);
        println!(
            "| {name} | {} | {} KiB | {:.1} MiB | {:.2} % | {:.2} |",
            stats.chunks,
            stats.data / stats.chunks.max(1) / 1024,
            new as f64 / f64::from(1 << 20),
            100.0 * new as f64 / changed.len() as f64,
            base.len() as f64 / secs / 1e9,
        );
    }
    Ok(())
}
