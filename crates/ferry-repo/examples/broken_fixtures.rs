//! Writes the repository fixtures under `crates/ferry/tests/fixtures/repos/`: one good
//! format 1 repository (a small tree and a small volume image, with their sources beside it)
//! and copies of it each broken in one way. They are committed, so the tests also prove that
//! repositories written by an earlier build stay readable; regenerate them only when the format
//! changes.
//!
//! `cargo run -p ferry-repo --example broken_fixtures -- crates/ferry/tests/fixtures/repos`
//!
//! `--good-v2 DIR` writes only the good format 2 repository (`good-v2`), with chunk sizes
//! small enough (4/16/64 KiB) that its text file is cut in many places by format 2's cut
//! decision:
//!
//! `cargo run -p ferry-repo --example broken_fixtures -- --good-v2 crates/ferry/tests/fixtures/repos/good-v2`
//!
//! `--good-v3 DIR` writes the good format 3 repository (`good-v3`) the same way: its small
//! file and the text file's chunks (all under 128 KiB) are stored in frames.
//!
//! `cargo run -p ferry-repo --example broken_fixtures -- --good-v3 crates/ferry/tests/fixtures/repos/good-v3`
//!
//! The password is `ferry-fixture-password`; the key file uses low argon2 costs so the tests
//! open it quickly (the costs are recorded in the key file, as for any repository).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_repo::format::ChunkerParams;
use ferry_repo::{
    BackupOptions, InitOptions, KdfParams, RepoFormat, Repository, VolumeBackupOptions,
    backup_tree, backup_volume,
};
use ferry_store::{FsStore, ObjectStore};
use tokio_util::sync::CancellationToken;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const PASSWORD: &[u8] = b"ferry-fixture-password";

/// Lines of made-up source text: compressible, so the packs stay small in git.
fn text(lines: usize, seed: usize) -> Vec<u8> {
    (0..lines)
        .flat_map(|i| {
            format!("let value_{i} = compute({}, \"fixture line\");\n", i * 31 + seed).into_bytes()
        })
        .collect()
}

fn write_source(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("dir"))?;
    std::fs::write(dir.join("hello.txt"), b"hello from a Ferry fixture\n")?;
    std::fs::write(dir.join("dir/text.txt"), text(6000, 1))?;
    std::fs::write(dir.join("empty"), b"")?;
    std::os::unix::fs::symlink("../hello.txt", dir.join("dir/link"))?;
    Ok(())
}

fn write_image(path: &Path) -> Result<()> {
    let file = std::fs::File::create(path)?;
    file.set_len(1 << 20)?;
    file.write_all_at(&text(1500, 2)[..64 << 10], 0)?;
    file.write_all_at(&text(1500, 3)[..64 << 10], 512 << 10)?;
    Ok(())
}

async fn write_good(dir: &Path, options: &InitOptions) -> Result<()> {
    let cancel = CancellationToken::new();
    let source = dir.join("source");
    write_source(&source)?;
    let image = dir.join("volume.img");
    write_image(&image)?;
    let repo_dir = dir.join("repo");
    std::fs::create_dir_all(&repo_dir)?;
    let store: Arc<dyn ObjectStore> = Arc::new(FsStore::open(&repo_dir)?);
    let (repo, _) = Repository::init(store, PASSWORD, options, &cancel).await?;
    let tree_options = BackupOptions {
        source: "fixture-source".into(),
        hostname: Some("fixture-host".into()),
        tags: vec![("kind".into(), "tree".into())],
        ..BackupOptions::default()
    };
    let tree = backup_tree(&repo, &source, &tree_options, None, &cancel).await?;
    let volume_options = VolumeBackupOptions {
        source: "fixture-volume".into(),
        hostname: Some("fixture-host".into()),
        tags: vec![("kind".into(), "volume".into())],
        ..VolumeBackupOptions::default()
    };
    let volume = backup_volume(&repo, &image, &volume_options, None, &cancel).await?;
    std::fs::write(dir.join("tree-snapshot"), format!("{}\n", tree.snapshot_id))?;
    std::fs::write(dir.join("volume-snapshot"), format!("{}\n", volume.snapshot_id))?;
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The files under `dir` (recursively), sorted.
fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            out.extend(files(&entry.path())?);
        } else {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

fn largest(dir: &Path) -> Result<PathBuf> {
    let mut all = files(dir)?;
    all.sort_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0));
    all.pop().ok_or_else(|| format!("nothing under {}", dir.display()).into())
}

fn flip_byte(path: &Path, at: Option<u64>) -> Result<()> {
    let mut bytes = std::fs::read(path)?;
    let i = at.map_or(bytes.len() / 2, |a| usize::try_from(a).unwrap_or(0));
    bytes[i] ^= 0x20;
    std::fs::write(path, bytes)?;
    Ok(())
}

/// The broken copies: (name, what is wrong, how to break the copy's `repo/`).
type Breaker = fn(&Path) -> Result<()>;
const BROKEN: &[(&str, Breaker)] = &[
    ("pack-flipped", |repo| flip_byte(&largest(&repo.join("data"))?, None)),
    ("pack-truncated", |repo| {
        let pack = largest(&repo.join("data"))?;
        let len = std::fs::metadata(&pack)?.len();
        std::fs::OpenOptions::new().write(true).open(&pack)?.set_len(len / 2)?;
        Ok(())
    }),
    ("pack-missing", |repo| Ok(std::fs::remove_file(largest(&repo.join("data"))?)?)),
    ("index-flipped", |repo| flip_byte(&files(&repo.join("index"))?[0], None)),
    ("snapshot-flipped", |repo| {
        let id = std::fs::read_to_string(repo.with_file_name("tree-snapshot"))?;
        flip_byte(&repo.join("snapshots").join(id.trim()), None)
    }),
    ("keyfile-flipped", |repo| {
        let key = files(&repo.join("keys"))?.remove(0);
        flip_byte(&key, Some(std::fs::metadata(&key)?.len() - 3))
    }),
    ("config-missing", |repo| Ok(std::fs::remove_file(repo.join("config"))?)),
];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let usage = "usage: broken_fixtures OUT_DIR | broken_fixtures --good-v2 DIR | broken_fixtures --good-v3 DIR";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fast = InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() };
    if let [flag, dir] = &args[..]
        && let Some(format) = match flag.as_str() {
            "--good-v2" => Some(RepoFormat::V2),
            "--good-v3" => Some(RepoFormat::V3),
            _ => None,
        }
    {
        let dir = PathBuf::from(dir);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        let chunker = ChunkerParams { min_size: 4 << 10, avg_size: 16 << 10, max_size: 64 << 10 };
        write_good(&dir, &InitOptions { format, chunker, ..fast }).await?;
        println!("good-v{format}");
        return Ok(());
    }
    let [out] = &args[..] else { return Err(usage.into()) };
    let out = PathBuf::from(out);
    // Only what this mode writes is replaced (`good-v2` and `good-v3` stay).
    for name in std::iter::once("good").chain(BROKEN.iter().map(|(name, _)| *name)) {
        if out.join(name).exists() {
            std::fs::remove_dir_all(out.join(name))?;
        }
    }
    let good = out.join("good");
    write_good(&good, &InitOptions { format: RepoFormat::V1, ..fast }).await?;
    for (name, breaker) in BROKEN {
        let dir = out.join(name);
        copy_tree(&good.join("repo"), &dir.join("repo"))?;
        for file in ["tree-snapshot", "volume-snapshot"] {
            std::fs::copy(good.join(file), dir.join(file))?;
        }
        breaker(&dir.join("repo"))?;
        println!("{name}");
    }
    Ok(())
}
