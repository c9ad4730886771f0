//! Deterministic data for Ferry's benchmarks.
//!
//! The criterion benchmarks in `benches/pipeline.rs` measure each stage of Ferry's data path
//! (chunking, keyed ids, compression, encryption, packs, tree pages) and whole backups and
//! restores. They need data that is the same on every run and every machine, so the numbers of
//! two runs can be compared: this crate makes it from a seed.
//!
//! - [`random_bytes`]: incompressible bytes (media, archives, encrypted files).
//! - [`text_bytes`]: source-code-like text that zstd compresses about as well as real source.
//! - [`write_tree`]: a directory tree of such files with a spread of sizes, like a small
//!   source checkout with a few large binaries.
//!
//! The comparison runner against kopia and restic lives in `compare/` beside this crate's
//! `Cargo.toml`; see `README.md` there. Its remote mode runs over [`netpath`], a delayed,
//! rate-limited relay to the S3 server that counts requests.

pub mod netpath;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// A small, fast, seeded pseudo-random generator (SplitMix64). Not for secrets.
#[derive(Debug, Clone)]
pub struct SeededRng {
    state: u64,
}

impl SeededRng {
    /// A generator whose output depends only on `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..bound` (`bound` > 0; returns 0 for 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        // Multiply-shift: the bias is below 2^-32 for the bounds used here.
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// Fills `out` with random bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// `len` incompressible bytes from `seed`.
#[must_use]
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    SeededRng::new(seed).fill(&mut out);
    out
}

/// Words of the kind found in C and Rust sources.
const WORDS: &[&str] = &[
    "static",
    "struct",
    "return",
    "if",
    "else",
    "for",
    "while",
    "int",
    "unsigned",
    "long",
    "const",
    "void",
    "char",
    "sizeof",
    "break",
    "case",
    "switch",
    "default",
    "NULL",
    "err",
    "ret",
    "dev",
    "data",
    "len",
    "size",
    "buf",
    "ptr",
    "flags",
    "state",
    "lock",
    "unlock",
    "spin_lock",
    "mutex",
    "kfree",
    "kmalloc",
    "GFP_KERNEL",
    "EINVAL",
    "ENOMEM",
    "u32",
    "u64",
    "u8",
    "bool",
    "true",
    "false",
    "goto",
    "out",
    "fail",
    "list",
    "head",
    "next",
    "prev",
    "count",
    "index",
    "offset",
    "page",
    "inode",
    "file",
    "pos",
    "value",
    "result",
    "config",
    "#include",
    "#define",
    "/*",
    "*/",
    "=",
    "==",
    "!=",
    "->",
    "&&",
    "||",
    "+=",
    "<<",
    ">>",
];

/// `len` bytes of source-code-like text from `seed`: indented lines of common words mixed
/// with random identifiers and numbers. zstd level 3 shrinks it about 3–4×, like real source.
#[must_use]
pub fn text_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SeededRng::new(seed);
    let mut out = Vec::with_capacity(len + 128);
    while out.len() < len {
        let indent = rng.below(4) as usize;
        out.extend(std::iter::repeat_n(b'\t', indent));
        let words = 2 + rng.below(9);
        for i in 0..words {
            if i > 0 {
                out.push(b' ');
            }
            match rng.below(10) {
                0 => push_identifier(&mut rng, &mut out),
                1 => out.extend_from_slice(rng.below(100_000).to_string().as_bytes()),
                _ => {
                    out.extend_from_slice(WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes())
                }
            }
        }
        out.extend_from_slice(if rng.below(3) == 0 { b";\n" } else { b"\n" });
    }
    out.truncate(len);
    out
}

fn push_identifier(rng: &mut SeededRng, out: &mut Vec<u8>) {
    let n = 3 + rng.below(10);
    for _ in 0..n {
        let c = rng.below(27) as u8;
        out.push(if c == 26 { b'_' } else { b'a' + c });
    }
}

/// The shape of a tree made by [`write_tree`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeSpec {
    /// Seed: the same seed gives the same names, sizes and bytes.
    pub seed: u64,
    /// Small files, spread over the directories.
    pub files: usize,
    /// Directories, nested up to three deep.
    pub dirs: usize,
    /// Smallest small file.
    pub min_file: usize,
    /// Largest small file (sizes are log-uniform between the two, as in source trees).
    pub max_file: usize,
    /// Percentage of small files holding text; the rest hold random bytes.
    pub text_percent: u8,
    /// Large incompressible files (like images or archives) at the root.
    pub large_files: usize,
    /// Size of each large file.
    pub large_size: usize,
}

impl Default for TreeSpec {
    /// About 60 MiB: 1,500 files of 256 B to 256 KiB (mostly text) in 60 directories, and
    /// one 8 MiB binary.
    fn default() -> Self {
        Self {
            seed: 1,
            files: 1_500,
            dirs: 60,
            min_file: 256,
            max_file: 256 << 10,
            text_percent: 80,
            large_files: 1,
            large_size: 8 << 20,
        }
    }
}

/// What [`write_tree`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Regular files.
    pub files: u64,
    /// Directories below the root.
    pub dirs: u64,
    /// Content bytes.
    pub bytes: u64,
}

/// Writes the tree described by `spec` under `root` (created if missing).
///
/// # Errors
/// Any I/O error creating a directory or writing a file, with the path in its message.
pub fn write_tree(root: &Path, spec: &TreeSpec) -> io::Result<TreeStats> {
    let mut rng = SeededRng::new(spec.seed);
    let mut stats = TreeStats::default();
    let mut dirs: Vec<PathBuf> = vec![root.to_path_buf()];
    create_dir(root)?;
    for i in 0..spec.dirs {
        // Nest under a random earlier directory, at most three levels below the root.
        let parent = loop {
            let p = &dirs[rng.below(dirs.len() as u64) as usize];
            if p.strip_prefix(root).map_or(0, |r| r.components().count()) < 3 {
                break p.clone();
            }
        };
        let dir = parent.join(format!("dir{i:04}"));
        create_dir(&dir)?;
        dirs.push(dir);
        stats.dirs += 1;
    }
    let (lo, hi) = (spec.min_file.max(1) as f64, spec.max_file.max(spec.min_file.max(1)) as f64);
    for i in 0..spec.files {
        let dir = &dirs[rng.below(dirs.len() as u64) as usize];
        let unit = rng.below(1 << 53) as f64 / (1u64 << 53) as f64;
        let size = (lo * (hi / lo).powf(unit)) as usize;
        let seed = rng.next_u64();
        let (name, bytes) = if rng.below(100) < u64::from(spec.text_percent) {
            (format!("file{i:05}.c"), text_bytes(seed, size))
        } else {
            (format!("file{i:05}.bin"), random_bytes(seed, size))
        };
        write_file(&dir.join(name), &bytes)?;
        stats.files += 1;
        stats.bytes += bytes.len() as u64;
    }
    for i in 0..spec.large_files {
        let bytes = random_bytes(rng.next_u64(), spec.large_size);
        write_file(&root.join(format!("large{i:02}.img")), &bytes)?;
        stats.files += 1;
        stats.bytes += bytes.len() as u64;
    }
    Ok(stats)
}

fn create_dir(path: &Path) -> io::Result<()> {
    fs::create_dir_all(path)
        .map_err(|e| io::Error::new(e.kind(), format!("create directory {}: {e}", path.display())))
}

fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fs::write(path, bytes)
        .map_err(|e| io::Error::new(e.kind(), format!("write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_are_deterministic_and_seed_dependent() {
        assert_eq!(random_bytes(7, 1000), random_bytes(7, 1000));
        assert_ne!(random_bytes(7, 1000), random_bytes(8, 1000));
        assert_eq!(text_bytes(7, 5000), text_bytes(7, 5000));
        assert_ne!(text_bytes(7, 5000), text_bytes(8, 5000));
        assert_eq!(random_bytes(3, 13).len(), 13);
        assert_eq!(text_bytes(3, 13).len(), 13);
    }

    #[test]
    fn text_compresses_like_source_and_random_does_not() {
        let text = text_bytes(1, 1 << 20);
        let random = random_bytes(1, 1 << 20);
        let t = zstd::bulk::compress(&text, 3).map(|c| c.len()).unwrap_or(usize::MAX);
        let r = zstd::bulk::compress(&random, 3).map(|c| c.len()).unwrap_or(0);
        let ratio = text.len() as f64 / t as f64;
        assert!((2.0..6.0).contains(&ratio), "text ratio {ratio}");
        assert!(r >= random.len(), "random data compressed to {r}");
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = SeededRng::new(5);
        for bound in [1u64, 2, 3, 10, 1000] {
            for _ in 0..1000 {
                assert!(rng.below(bound) < bound);
            }
        }
        assert_eq!(rng.below(0), 0);
    }

    #[test]
    fn tree_is_reproducible() -> io::Result<()> {
        let spec = TreeSpec {
            files: 40,
            dirs: 6,
            max_file: 4096,
            large_files: 1,
            large_size: 10_000,
            ..TreeSpec::default()
        };
        let a = tempfile::tempdir()?;
        let b = tempfile::tempdir()?;
        let sa = write_tree(a.path(), &spec)?;
        let sb = write_tree(b.path(), &spec)?;
        assert_eq!(sa, sb);
        assert_eq!((sa.files, sa.dirs), (41, 6));
        let listing = |root: &Path| -> io::Result<Vec<(PathBuf, Vec<u8>)>> {
            let mut out = Vec::new();
            let mut stack = vec![root.to_path_buf()];
            while let Some(dir) = stack.pop() {
                for entry in fs::read_dir(&dir)? {
                    let path = entry?.path();
                    if path.is_dir() {
                        stack.push(path);
                    } else {
                        let rel =
                            path.strip_prefix(root).map(Path::to_path_buf).unwrap_or_default();
                        out.push((rel, fs::read(&path)?));
                    }
                }
            }
            out.sort();
            Ok(out)
        };
        let (la, lb) = (listing(a.path())?, listing(b.path())?);
        assert_eq!(la, lb);
        assert_eq!(la.len(), 41);
        assert_eq!(la.iter().map(|(_, d)| d.len() as u64).sum::<u64>(), sa.bytes);
        Ok(())
    }
}
