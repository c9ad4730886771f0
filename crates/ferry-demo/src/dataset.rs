//! The demo's volume content: an application's data of mixed kinds and sizes (compressible
//! logs and sources, incompressible media, a database file with structure and empty pages),
//! a small change to it for the incremental backup, and the comparison of a restored tree.

use std::path::{Path, PathBuf};

use ferry_sim::{FsEntry, FsKind, FsTree};

const MIB: u64 = 1 << 20;
const T0: i64 = 1_735_689_600; // 2025-01-01, the files' first modification time.
const OWNER: u32 = 1000;

/// A xorshift generator: deterministic data, fast enough for hundreds of MiB.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

const WORDS: &[&str] = &[
    "GET",
    "POST",
    "/api/orders",
    "/api/users",
    "/healthz",
    "status=200",
    "status=404",
    "status=500",
    "cache=hit",
    "cache=miss",
    "user=alice",
    "user=bob",
    "region=eu-west",
    "shard=3",
    "retry=0",
    "retry=1",
    "lat=12ms",
    "lat=340ms",
    "bytes=5120",
    "ok",
    "timeout",
];

/// `len` bytes of log lines: timestamps, levels and request fields (compresses about 4x).
fn log_text(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 200);
    let mut t = T0 + i64::try_from(rng.below(1_000_000)).unwrap_or(0);
    while out.len() < len {
        t += i64::try_from(rng.below(3)).unwrap_or(0);
        let level = ["INFO", "INFO", "INFO", "WARN", "DEBUG", "ERROR"][(rng.below(6)) as usize];
        out.extend_from_slice(
            format!("{t} {level} worker-{} req={:08x}", rng.below(8), rng.next() as u32).as_bytes(),
        );
        for _ in 0..(4 + rng.below(5)) {
            out.push(b' ');
            out.extend_from_slice(WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes());
        }
        out.push(b'\n');
    }
    out.truncate(len);
    out
}

/// A database-like file: 8 KiB pages, each a random header, rows of repeated structure, and
/// some pages still empty (zeros).
fn database(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8192);
    while out.len() < len {
        let mut page = vec![0u8; 8192];
        if rng.below(5) != 0 {
            page[..64].copy_from_slice(&rng.bytes(64));
            let rows = 20 + rng.below(60) as usize;
            let mut at = 64;
            for _ in 0..rows {
                let row = format!(
                    "{:06}|customer-{}|{}.{:02}|",
                    rng.below(1_000_000),
                    rng.below(5000),
                    rng.below(900),
                    rng.below(100)
                );
                if at + row.len() > page.len() {
                    break;
                }
                page[at..at + row.len()].copy_from_slice(row.as_bytes());
                at += row.len();
            }
        }
        out.extend_from_slice(&page);
    }
    out.truncate(len);
    out
}

fn file(bytes: Vec<u8>, mode: u32, mtime: i64) -> FsEntry {
    FsEntry { kind: FsKind::File(bytes), mode, uid: OWNER, gid: OWNER, mtime }
}

fn dir(mtime: i64) -> FsEntry {
    FsEntry { kind: FsKind::Dir, mode: 0o755, uid: OWNER, gid: OWNER, mtime }
}

const DIRS: &[&str] = &[
    "app",
    "app/config",
    "app/logs",
    "db",
    "media",
    "media/photos",
    "media/video",
    "home",
    "home/alice",
    "home/alice/docs",
    "home/bob",
    "home/bob/src",
];

/// An application's volume of about `total_mib` MiB in about `files` files (at least 40):
/// 40% media (random bytes, 10 files), 25% logs (20 files of text), a database file of 20%,
/// and small text files (documents, sources, configuration) for the rest of the count.
#[must_use]
pub fn generate(total_mib: u64, files: usize, seed: u64) -> FsTree {
    let mut rng = Rng(seed | 1);
    let total = total_mib * MIB;
    let mut tree = FsTree::default();
    for (i, d) in DIRS.iter().enumerate() {
        tree.entries.insert(d.into(), dir(T0 + i as i64));
    }
    let mut t = T0 + 100;
    let mut next_time = || {
        t += 37;
        t
    };
    let mut used = 0u64;
    for i in 0..10 {
        let size = total * 4 / 100 * (70 + rng.below(61)) / 100;
        let (folder, ext) = if i < 7 { ("media/photos", "jpg") } else { ("media/video", "mp4") };
        let name = format!("{folder}/clip-{i:02}.{ext}");
        tree.entries.insert(name.into(), file(rng.bytes(size as usize), 0o644, next_time()));
        used += size;
    }
    for i in 0..20 {
        let size = total / 80 * (50 + rng.below(101)) / 100;
        tree.entries.insert(
            format!("app/logs/app-{i:02}.log").into(),
            file(log_text(&mut rng, size as usize), 0o640, next_time()),
        );
        used += size;
    }
    let small = files.saturating_sub(32).max(8);
    let small_budget = total / 20;
    for i in 0..small {
        // Log-distributed sizes from 0 to about 2 * budget / count.
        let cap = (2 * small_budget / small as u64).max(1024);
        let size = if i % 50 == 0 { 0 } else { cap >> rng.below(6) } as usize;
        let (folder, name) = match i % 3 {
            0 => ("home/alice/docs", format!("report-{i:04}.txt")),
            1 => ("home/bob/src", format!("module_{i:04}.rs")),
            _ => ("app/config", format!("service-{i:04}.yaml")),
        };
        let mode = if i % 7 == 0 { 0o600 } else { 0o644 };
        let path = format!("{folder}/{name}");
        tree.entries.insert(path.into(), file(log_text(&mut rng, size), mode, next_time()));
        used += size as u64;
    }
    let db = total.saturating_sub(used).max(MIB);
    tree.entries
        .insert("db/main.db".into(), file(database(&mut rng, db as usize), 0o600, next_time()));
    tree.entries.insert(
        "app/current.log".into(),
        FsEntry {
            kind: FsKind::Symlink("logs/app-19.log".into()),
            mode: 0,
            uid: OWNER,
            gid: OWNER,
            mtime: 0,
        },
    );
    tree
}

/// The day's changes: new lines at the end of three logs, 1 MiB of the database rewritten,
/// one new document. Returns the changed entries (to write into the volume) and the whole
/// tree after the change (what a restore must give back).
#[must_use]
pub fn change(tree: &FsTree, seed: u64) -> (FsTree, FsTree) {
    let mut rng = Rng(seed | 1);
    let mut changed = FsTree::default();
    let later = T0 + 86_400;
    for i in [3, 11, 19] {
        let path = PathBuf::from(format!("app/logs/app-{i:02}.log"));
        if let Some(FsEntry { kind: FsKind::File(bytes), mode, .. }) = tree.entries.get(&path) {
            let mut bytes = bytes.clone();
            bytes.extend_from_slice(&log_text(&mut rng, 48 << 10));
            changed.entries.insert(path, file(bytes, *mode, later));
        }
    }
    let db = PathBuf::from("db/main.db");
    if let Some(FsEntry { kind: FsKind::File(bytes), mode, .. }) = tree.entries.get(&db) {
        let mut bytes = bytes.clone();
        let at = bytes.len() / 2;
        let end = (at + MIB as usize).min(bytes.len());
        let fresh = database(&mut rng, end - at);
        bytes[at..end].copy_from_slice(&fresh);
        changed.entries.insert(db, file(bytes, *mode, later + 1));
    }
    // A new file changes its folder's time: the folder goes along with its original time, so
    // writing restores it.
    let docs = PathBuf::from("home/alice/docs");
    if let Some(entry) = tree.entries.get(&docs) {
        changed.entries.insert(docs.clone(), entry.clone());
    }
    changed.entries.insert(
        docs.join("minutes-2025-01-02.txt"),
        file(log_text(&mut rng, 8 << 10), 0o644, later + 2),
    );
    let mut after = tree.clone();
    after.entries.extend(changed.entries.iter().map(|(k, v)| (k.clone(), v.clone())));
    (changed, after)
}

/// Files and bytes of a tree.
#[must_use]
pub fn count(tree: &FsTree) -> (usize, u64) {
    let files = tree.entries.values().filter(|e| matches!(e.kind, FsKind::File(_))).count();
    (files, tree.content_bytes())
}

/// The entries of `want` and `got` that differ, described, at most `limit` of them.
#[must_use]
pub fn differences(want: &FsTree, got: &FsTree, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let show = |p: &Path| p.display().to_string();
    for (path, w) in &want.entries {
        match got.entries.get(path) {
            None => out.push(format!("{} is missing", show(path))),
            Some(g) if g.kind != w.kind => {
                out.push(format!("{} has different content", show(path)))
            }
            Some(g) if g != w => out.push(format!(
                "{}: mode {:o}/{:o}, owner {}:{}/{}:{}, mtime {}/{} (want/got)",
                show(path),
                w.mode,
                g.mode,
                w.uid,
                w.gid,
                g.uid,
                g.gid,
                w.mtime,
                g.mtime
            )),
            Some(_) => {}
        }
    }
    for path in got.entries.keys().filter(|p| !want.entries.contains_key(*p)) {
        out.push(format!("{} is extra", show(path)));
    }
    let more = out.len().saturating_sub(limit);
    out.truncate(limit);
    if more > 0 {
        out.push(format!("... and {more} more"));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn the_data_set_has_the_asked_size_and_count() {
        let tree = generate(24, 120, 7);
        let (files, bytes) = count(&tree);
        assert!((110..=130).contains(&files), "{files} files");
        assert!(bytes.abs_diff(24 * MIB) < 2 * MIB, "{bytes} bytes");
        assert_eq!(generate(24, 120, 7), tree, "deterministic");
    }

    #[test]
    fn the_change_is_small_and_shows_in_the_comparison() {
        let tree = generate(16, 60, 3);
        let (changed, after) = change(&tree, 9);
        assert_eq!(changed.entries.len(), 6, "3 logs, the database, a folder, a new file");
        let diff = differences(&tree, &after, 10);
        assert_eq!(diff.len(), 5, "{diff:?}");
        assert!(diff.iter().any(|d| d.contains("minutes-2025-01-02.txt is extra")), "{diff:?}");
        assert!(differences(&after, &after, 10).is_empty());
        assert_eq!(count(&after).0, count(&tree).0 + 1);
    }
}
