//! Checks that the committed code in `src/gen/` is exactly what the generator makes from the
//! `.proto` files under the repository's `proto/` directory.
//!
//! To regenerate after editing a `.proto` file:
//!
//! ```text
//! FERRY_REGEN_PROTO=1 cargo test -p ferry-proto --test drift
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod support;

use support::{BoxError, proto_files, proto_root};

const REGEN_VAR: &str = "FERRY_REGEN_PROTO";

fn committed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/gen")
}

/// Compiles every `.proto` file with protox and writes the Rust code into `out_dir`.
fn generate(out_dir: &Path) -> Result<(), BoxError> {
    let root = proto_root();
    let files = proto_files(&root)?;
    let descriptors = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(out_dir)
        .compile_fds(descriptors)?;
    Ok(())
}

/// The `.rs` files of a directory, by name.
fn rust_files(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>, BoxError> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "rs") {
            let name = path
                .file_name()
                .and_then(|name| name.to_str())
                .ok_or_else(|| format!("odd file name {}", path.display()))?
                .to_owned();
            files.insert(name, std::fs::read(&path)?);
        }
    }
    Ok(files)
}

#[test]
fn generated_code_matches_protos() -> Result<(), BoxError> {
    let scratch = tempfile::tempdir()?;
    generate(scratch.path())?;
    let fresh = rust_files(scratch.path())?;
    let committed_path = committed_dir();

    if std::env::var_os(REGEN_VAR).is_some_and(|value| value == "1") {
        std::fs::create_dir_all(&committed_path)?;
        for stale in rust_files(&committed_path)?.keys() {
            if !fresh.contains_key(stale) {
                std::fs::remove_file(committed_path.join(stale))?;
            }
        }
        for (name, contents) in &fresh {
            std::fs::write(committed_path.join(name), contents)?;
        }
        return Ok(());
    }

    let committed = rust_files(&committed_path)?;
    let mut problems = Vec::new();
    for (name, contents) in &fresh {
        match committed.get(name) {
            None => problems.push(format!("{name} is missing from src/gen/")),
            Some(old) if old != contents => problems.push(format!("{name} is out of date")),
            Some(_) => {}
        }
    }
    for name in committed.keys() {
        if !fresh.contains_key(name) {
            problems.push(format!("{name} in src/gen/ is no longer generated"));
        }
    }
    assert!(
        problems.is_empty(),
        "generated protocol code drifted from proto/: {}.\n\
         Regenerate with `{REGEN_VAR}=1 cargo test -p ferry-proto --test drift` and review the diff.",
        problems.join("; ")
    );
    Ok(())
}
