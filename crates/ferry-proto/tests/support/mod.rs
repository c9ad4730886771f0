//! Helpers shared by the integration tests: where the `.proto` files are and how to list them.

use std::path::{Path, PathBuf};

pub type BoxError = Box<dyn std::error::Error>;

/// The repository's `proto/` directory, the include root of every `.proto` file.
pub fn proto_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto")
}

/// Every `.proto` file under `root`, as paths relative to it, sorted.
pub fn proto_files(root: &Path) -> Result<Vec<PathBuf>, BoxError> {
    let mut pending = vec![PathBuf::new()];
    let mut found = Vec::new();
    while let Some(rel) = pending.pop() {
        for entry in std::fs::read_dir(root.join(&rel))? {
            let entry = entry?;
            let rel_child = rel.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                pending.push(rel_child);
            } else if rel_child.extension().is_some_and(|ext| ext == "proto") {
                found.push(rel_child);
            }
        }
    }
    found.sort();
    if found.is_empty() {
        return Err(format!("no .proto files under {}", root.display()).into());
    }
    Ok(found)
}
