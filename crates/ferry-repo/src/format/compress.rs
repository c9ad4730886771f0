//! zstd compression with a bypass for data that does not compress.
//!
//! A stored plaintext is `[mode: u8][raw length: u32 LE][payload]`. Mode 0 stores the payload
//! raw, mode 1 stores a zstd frame that must expand to exactly the raw length. Data is kept
//! compressed only when zstd saves at least 1/32 of it: incompressible chunks (media,
//! archives, already-compressed images) are stored raw so restores skip decompression. zstd
//! rejects incompressible input at several GB/s, so no separate probe is needed.

use std::cell::RefCell;

use crate::format::{FormatError, MAX_PLAINTEXT};

/// The default zstd level for file data (speed first; see `FORMAT.md`).
pub const DEFAULT_DATA_LEVEL: i32 = 3;
/// zstd level for metadata objects (trees, index, snapshots): small and very compressible.
pub(crate) const OBJECT_LEVEL: i32 = 3;

const MODE_RAW: u8 = 0;
const MODE_ZSTD: u8 = 1;
const HEADER: usize = 5;

/// How a blob's plaintext was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Stored as is.
    Raw,
    /// A zstd frame.
    Zstd,
}

/// Largest output buffer a thread keeps between calls: room for the largest volume chunk
/// (16 MiB) at zstd's worst-case bound.
pub(crate) const SCRATCH_KEEP: usize = 17 << 20;

thread_local! {
    static COMPRESSORS: RefCell<Vec<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(Vec::new()) };
    /// The compressor's output buffer, reused: a fresh one per chunk costs page faults.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Encodes `raw` as a stored plaintext, compressing at `level` when that pays
/// (`level` 0 disables compression).
#[must_use]
pub(crate) fn encode(level: i32, raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(level, raw, &mut out);
    out
}

/// As [`encode`], appending to `out`; returns the mode chosen.
pub(crate) fn encode_into(level: i32, raw: &[u8], out: &mut Vec<u8>) -> Compression {
    let raw_len = u32::try_from(raw.len()).unwrap_or(u32::MAX);
    let start = out.len();
    out.push(MODE_RAW);
    out.extend_from_slice(&raw_len.to_le_bytes());
    if level != 0 && raw.len() >= 64 {
        let budget = raw.len() - raw.len() / 32;
        let done = COMPRESSORS.with(|cell| {
            let mut list = cell.borrow_mut();
            let pos = match list.iter().position(|(l, _)| *l == level) {
                Some(pos) => pos,
                None => match zstd::bulk::Compressor::new(level) {
                    Ok(c) => {
                        list.push((level, c));
                        list.len() - 1
                    }
                    Err(_) => return false,
                },
            };
            let compressor = &mut list[pos].1;
            SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                scratch.clear();
                scratch.reserve(zstd::zstd_safe::compress_bound(raw.len()));
                let done = match compressor.compress_to_buffer(raw, &mut *scratch) {
                    Ok(n) if n <= budget => {
                        out.extend_from_slice(&scratch[..n]);
                        true
                    }
                    _ => false,
                };
                // Chunks are at most a few MiB; a large metadata object must not leave its
                // buffer behind on a long-lived thread.
                if scratch.capacity() > SCRATCH_KEEP {
                    *scratch = Vec::new();
                }
                done
            })
        });
        if done {
            out[start] = MODE_ZSTD;
            return Compression::Zstd;
        }
    }
    out.extend_from_slice(raw);
    Compression::Raw
}

/// Decodes a stored plaintext back to its raw bytes.
///
/// # Errors
/// Truncated input, an unknown mode, a length above [`MAX_PLAINTEXT`], or a zstd frame that is
/// malformed or expands to another length than declared.
pub fn decode(stored: &[u8]) -> Result<Vec<u8>, FormatError> {
    if stored.len() < HEADER {
        return Err(FormatError::Truncated { what: "compression header", len: stored.len() });
    }
    let mode = stored[0];
    let mut len_bytes = [0u8; 4];
    len_bytes.copy_from_slice(&stored[1..HEADER]);
    let raw_len = u32::from_le_bytes(len_bytes) as usize;
    let payload = &stored[HEADER..];
    match mode {
        MODE_RAW => {
            if payload.len() != raw_len {
                return Err(FormatError::Decompress {
                    reason: format!("raw payload of {} bytes declared as {raw_len}", payload.len()),
                });
            }
            Ok(payload.to_vec())
        }
        MODE_ZSTD => {
            if raw_len > MAX_PLAINTEXT {
                return Err(FormatError::Decompress {
                    reason: format!("declared length {raw_len} too large"),
                });
            }
            let mut out = Vec::with_capacity(raw_len);
            let n = DECOMPRESSOR.with(|cell| {
                let mut slot = cell.borrow_mut();
                if slot.is_none() {
                    *slot = Some(
                        zstd::bulk::Decompressor::new()
                            .map_err(|e| FormatError::Decompress { reason: e.to_string() })?,
                    );
                }
                match slot.as_mut() {
                    Some(d) => d
                        .decompress_to_buffer(payload, &mut out)
                        .map_err(|e| FormatError::Decompress { reason: e.to_string() }),
                    None => Err(FormatError::Decompress { reason: "no decompressor".into() }),
                }
            })?;
            if n != raw_len {
                return Err(FormatError::Decompress {
                    reason: format!("expanded to {n} bytes, declared {raw_len}"),
                });
            }
            Ok(out)
        }
        found => Err(FormatError::Compression { found }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn compressible_data_is_compressed_and_random_data_is_not() {
        let text = b"hello world, hello ferry. ".repeat(400);
        let stored = encode(3, &text);
        assert_eq!(stored[0], MODE_ZSTD);
        assert!(stored.len() < text.len() / 4);
        assert_eq!(decode(&stored).ok(), Some(text));

        let mut noise = vec![0u8; 50_000];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut noise);
        let stored = encode(3, &noise);
        assert_eq!(stored[0], MODE_RAW);
        assert_eq!(decode(&stored).ok(), Some(noise));
    }

    #[test]
    fn wrong_declared_length_is_rejected() {
        let mut stored = encode(3, &[5u8; 1000]);
        stored[1] ^= 1;
        assert!(decode(&stored).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(level in prop_oneof![Just(0), Just(1), Just(3)], data in proptest::collection::vec(0u8..4, 0..5000)) {
            prop_assert_eq!(decode(&encode(level, &data)).ok(), Some(data));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_zstd_mode(mut bytes in proptest::collection::vec(any::<u8>(), 5..300)) {
            bytes[0] = MODE_ZSTD;
            let _ = decode(&bytes);
        }
    }
}
