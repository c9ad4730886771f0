//! Listing: a walk of the directories that can hold keys with a given prefix.

use std::fs;
use std::path::Path;

use tokio_util::sync::CancellationToken;

use super::{check_root, is_absent};
use crate::{ObjectKey, ObjectMeta, StoreError, StoreResult};

/// Every object whose key starts with `prefix`, sorted by key.
pub(super) fn list(
    root: &Path,
    prefix: &str,
    cancel: &CancellationToken,
) -> StoreResult<Vec<ObjectMeta>> {
    check_root(root)?;
    // Keys under `prefix` all live below the directory named by its part up to the last `/`.
    let (dir_part, name_start) = match prefix.rsplit_once('/') {
        Some((dir, rest)) => (Some(dir), rest),
        None => (None, prefix),
    };
    let mut start = root.to_path_buf();
    if let Some(dir) = dir_part {
        if ObjectKey::new(dir).is_err() {
            return Ok(Vec::new());
        }
        start.extend(dir.split('/'));
    }
    let mut found = Vec::new();
    // (directory, its key prefix with trailing `/` or empty at the root, name filter)
    let mut pending =
        vec![(start, dir_part.map(|d| format!("{d}/")).unwrap_or_default(), name_start)];
    while let Some((dir, key_prefix, name_filter)) = pending.pop() {
        if cancel.is_cancelled() {
            return Err(StoreError::Cancelled);
        }
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if is_absent(&e) => continue,
            Err(e) => return Err(StoreError::io("list directory", dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list directory", &dir, e))?;
            let name = entry.file_name();
            // Temporary files, `tmp~` and foreign entries have names no key segment can have.
            let Some(name) = name.to_str().filter(|n| ObjectKey::is_valid_segment(n)) else {
                continue;
            };
            if !name.starts_with(name_filter) {
                continue;
            }
            let kind =
                entry.file_type().map_err(|e| StoreError::io("inspect entry", entry.path(), e))?;
            let key_text = format!("{key_prefix}{name}");
            if kind.is_dir() {
                if key_text.len() >= ObjectKey::MAX_LEN {
                    continue; // nothing below can be a key
                }
                pending.push((entry.path(), format!("{key_text}/"), ""));
            } else if kind.is_file() {
                let Ok(key) = ObjectKey::new(key_text) else { continue };
                let size = match entry.metadata() {
                    Ok(meta) => meta.len(),
                    // Deleted between the directory read and now.
                    Err(e) if is_absent(&e) => continue,
                    Err(e) => return Err(StoreError::io("inspect object", entry.path(), e)),
                };
                found.push(ObjectMeta { key, size });
            }
        }
    }
    found.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    Ok(found)
}
