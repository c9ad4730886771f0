//! Whole and ranged reads, and metadata, of one object file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::{check_root, is_absent};
use crate::cancel::{check_range, check_size};
use crate::{ObjectKey, ObjectMeta, StoreError, StoreResult};

/// Bytes read between two cancellation checks.
const READ_CHUNK: usize = 4 << 20;

/// What part of an object to read.
#[derive(Debug, Clone, Copy)]
pub(super) enum Want {
    /// All of it, refused (before reading) when larger than the cap.
    Whole {
        /// The cap, if any.
        max: Option<u64>,
    },
    /// `len` bytes from `offset`.
    Range(u64, u64),
}

/// Reads the object at `path`, whole or a range. Exactly the size the file had when opened is
/// read, so a file growing meanwhile cannot make the read exceed a cap.
pub(super) fn read(
    root: &Path,
    key: &ObjectKey,
    path: &Path,
    want: Want,
    cancel: &CancellationToken,
) -> StoreResult<Bytes> {
    let not_found = || StoreError::NotFound { key: key.clone() };
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if is_absent(&e) => return check_root(root).and(Err(not_found())),
        Err(e) => return Err(StoreError::io("open object", path, e)),
    };
    let meta = file.metadata().map_err(|e| StoreError::io("inspect object", path, e))?;
    if !meta.is_file() {
        return Err(not_found());
    }
    let size = meta.len();
    let (offset, len) = match want {
        Want::Whole { max } => {
            check_size(key, size, max.unwrap_or(u64::MAX))?;
            (0, size)
        }
        Want::Range(offset, len) => (offset, len),
    };
    check_range(key, offset, len, size)?;
    let len = usize::try_from(len).map_err(|_| StoreError::Backend {
        location: root.display().to_string(),
        operation: format!("get {key}"),
        message: format!("{len} bytes do not fit in memory on this platform"),
    })?;
    let mut buf = vec![0; len];
    let mut done = 0;
    for chunk in buf.chunks_mut(READ_CHUNK) {
        if cancel.is_cancelled() {
            return Err(StoreError::Cancelled);
        }
        file.read_exact_at(chunk, offset + done)
            .map_err(|e| StoreError::io("read object", path, e))?;
        done += chunk.len() as u64;
    }
    Ok(Bytes::from(buf))
}

/// Size of the object at `path`, or `None`.
pub(super) fn head(root: &Path, key: ObjectKey, path: &Path) -> StoreResult<Option<ObjectMeta>> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(Some(ObjectMeta { key, size: meta.len() })),
        Ok(_) => Ok(None),
        Err(e) if is_absent(&e) => check_root(root).map(|()| None),
        Err(e) => Err(StoreError::io("inspect object", path, e)),
    }
}
