//! Format 2's cut decision: a pseudorandom function of a keyed rolling hash.
//!
//! Format 1 cuts where bits of a keyed Gear hash are zero. The Gear hash is linear in its
//! secret table, so every observed chunk boundary gives equations on the key; the 2025
//! attacks on keyed content-defined chunking (IACR eprint 2025/532 and 2025/558) recover the
//! key from chunk sizes and then fingerprint known files. Format 2 follows the fix those papers
//! propose (hash, then encrypt):
//!
//! 1. A rolling hash of the last [`WINDOW`] bytes that is an exactly 2^-64-universal hash
//!    under a secret table `T` of 256 random 64-bit values: the window's digest is
//!    `sum over j of T[byte at distance j] * x^j` in GF(2^64) = GF(2)[x] / (x^64 + x^4 + x^3 +
//!    x + 1). Two different windows collide only if `T[b] * q = r` for some byte value `b`
//!    whose positions differ between them (`q` a non-zero polynomial of degree below 64, so
//!    invertible): probability exactly 2^-64 over the random `T[b]`.
//! 2. AES-128 under a second secret key encrypts the digest (little-endian, zero-padded to a
//!    block); the cut is decided on bits of the ciphertext, with FastCDC's normalised masks
//!    (more bits before the average size, fewer after).
//!
//! The PRF is evaluated at every candidate position (every length from the minimum up): there
//! is no cheaper pre-filter, whose matches would leak the same equations as before. The digests
//! do not depend on where cuts fall, so they are computed ahead and encrypted in batches, which
//! lets AES-NI pipeline the blocks.

use aes::Aes128;
use aes::cipher::{BlockEncrypt, KeyInit, generic_array::GenericArray};

/// Bytes the rolling hash covers. The minimum chunk size must be at least this.
pub const WINDOW: usize = 64;

/// Positions encrypted at once.
const BATCH: usize = 32;

/// The reduction of x^64 in GF(2^64): x^4 + x^3 + x + 1.
const REDUCTION: u64 = 0x1b;

/// `h * x` in GF(2^64).
#[inline]
fn times_x(h: u64) -> u64 {
    (h << 1) ^ ((h >> 63) * REDUCTION)
}

/// The secret state of format 2's cut decision. Derived from the master key.
#[derive(Clone)]
pub struct PrfCut {
    /// `T[b]`: a byte's contribution as it enters the window.
    table: Box<[u64; 256]>,
    /// `T[b] * x^WINDOW`: what leaves the window [`WINDOW`] bytes later.
    leaving: Box<[u64; 256]>,
    prf: Aes128,
}

impl std::fmt::Debug for PrfCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrfCut(..)")
    }
}

impl PrfCut {
    /// The cut decision of a hash table `table` (256 secret values) and a PRF key.
    #[must_use]
    pub fn new(table: &[u64; 256], prf_key: &[u8; 16]) -> Self {
        let mut leaving = [0u64; 256];
        for (out, t) in leaving.iter_mut().zip(table.iter()) {
            let mut v = *t;
            for _ in 0..WINDOW {
                v = times_x(v);
            }
            *out = v;
        }
        Self {
            table: Box::new(*table),
            leaving: Box::new(leaving),
            prf: Aes128::new(GenericArray::from_slice(prf_key)),
        }
    }

    /// The digest of `window` (exactly [`WINDOW`] bytes, oldest first), as the rolling update
    /// computes it. For tests and to seed the roll.
    fn digest(&self, window: &[u8]) -> u64 {
        window.iter().fold(0, |h, &b| times_x(h) ^ self.table[usize::from(b)])
    }

    /// Length of the next chunk at the start of `data`: the first length `len` in
    /// `min..max.min(data.len())` whose last [`WINDOW`] bytes' PRF output has no bit of the
    /// mask set (`mask_small` below `avg`, `mask_large` from it on), else that upper bound.
    /// `min` must be at least [`WINDOW`] (the chunker's parameters ensure it).
    pub(crate) fn cut(
        &self,
        data: &[u8],
        (min, avg, max): (usize, usize, usize),
        (mask_small, mask_large): (u64, u64),
    ) -> usize {
        let end = data.len().min(max);
        if end <= min || min < WINDOW {
            return end;
        }
        let mut h = self.digest(&data[min - WINDOW..min]);
        let mut blocks = [GenericArray::default(); BATCH];
        let mut len = min;
        while len < end {
            let n = BATCH.min(end - len);
            for (i, block) in blocks[..n].iter_mut().enumerate() {
                if i > 0 {
                    let at = len + i - 1;
                    h = times_x(h)
                        ^ self.table[usize::from(data[at])]
                        ^ self.leaving[usize::from(data[at - WINDOW])];
                }
                block[..8].copy_from_slice(&h.to_le_bytes());
                block[8..].fill(0);
            }
            self.prf.encrypt_blocks(&mut blocks[..n]);
            for (i, block) in blocks[..n].iter().enumerate() {
                let mut word = [0u8; 8];
                word.copy_from_slice(&block[..8]);
                let bits = u64::from_le_bytes(word);
                let at = len + i;
                let mask = if at < avg { mask_small } else { mask_large };
                if bits & mask == 0 {
                    return at;
                }
            }
            // Roll on to the first length of the next batch.
            let at = len + n - 1;
            if len + n < end {
                h = times_x(h)
                    ^ self.table[usize::from(data[at])]
                    ^ self.leaving[usize::from(data[at - WINDOW])];
            }
            len += n;
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is the first 2048 bytes of the stream keyed by `[seed; 32]`, the key the 16
    /// after them.
    fn cut_of(seed: u8) -> PrfCut {
        let mut stream = blake3::Hasher::new_keyed(&[seed; 32]).finalize_xof();
        stream.set_position(2048);
        let mut key = [0u8; 16];
        stream.fill(&mut key);
        PrfCut::new(&crate::format::keys::table(&[seed; 32]), &key)
    }

    #[test]
    fn the_rolling_digest_is_the_digest_of_the_window() {
        let c = cut_of(1);
        let mut data = vec![0u8; 400];
        blake3::Hasher::new_keyed(&[4; 32]).finalize_xof().fill(&mut data);
        let mut h = c.digest(&data[..WINDOW]);
        for end in WINDOW + 1..=data.len() {
            h = times_x(h)
                ^ c.table[usize::from(data[end - 1])]
                ^ c.leaving[usize::from(data[end - 1 - WINDOW])];
            assert_eq!(h, c.digest(&data[end - WINDOW..end]), "window ending at {end}");
        }
    }

    #[test]
    fn the_cut_is_the_first_position_whose_prf_matches() {
        // Checked position by position against a direct evaluation of the definition.
        let c = cut_of(2);
        let mut data = vec![0u8; 6000];
        blake3::Hasher::new_keyed(&[3; 32]).finalize_xof().fill(&mut data);
        let (min, avg, max) = (100, 400, 1600);
        let masks = (0x3ff, 0x3f);
        let direct = |d: &[u8]| {
            let end = d.len().min(max);
            (min..end)
                .find(|&len| {
                    let mut block = GenericArray::default();
                    block[..8].copy_from_slice(&c.digest(&d[len - WINDOW..len]).to_le_bytes());
                    c.prf.encrypt_block(&mut block);
                    let bits = u64::from_le_bytes(block[..8].try_into().unwrap_or_default());
                    bits & if len < avg { masks.0 } else { masks.1 } == 0
                })
                .unwrap_or(end)
        };
        let mut pos = 0;
        let mut cuts = 0;
        while pos < data.len() {
            let rest = &data[pos..];
            let n = c.cut(rest, (min, avg, max), masks);
            assert_eq!(n, direct(rest), "at {pos}");
            pos += n;
            cuts += 1;
        }
        assert!(cuts > 5, "{cuts} chunks");
    }
}
