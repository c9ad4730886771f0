//! Content-defined chunking: FastCDC (2020) over a per-repository secret gear table.
//!
//! fastcdc's own seed only XORs one 64-bit value into its public table. Ferry instead hands
//! fastcdc's `cut_gear` a whole table of 256 secret 64-bit values expanded from the master key
//! (and its one-bit-left-shifted twin, which the 2020 "rolling two bytes" loop needs), so
//! chunk boundaries depend on 16 KiB of key material and reveal nothing about content to an
//! observer without the key.

use fastcdc::v2020::{self, Normalization};
use serde::{Deserialize, Serialize};

use crate::format::FormatError;

/// Chunk size bounds, stored in the repository config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerParams {
    /// No chunk (except the last of a stream) is shorter.
    pub min_size: u32,
    /// Target mean.
    pub avg_size: u32,
    /// No chunk is longer.
    pub max_size: u32,
}

impl Default for ChunkerParams {
    /// 256 KiB / 1 MiB / 4 MiB: see `FORMAT.md` for the reasoning.
    fn default() -> Self {
        Self { min_size: 256 << 10, avg_size: 1 << 20, max_size: 4 << 20 }
    }
}

impl ChunkerParams {
    /// Checks the bounds fastcdc accepts (and that they are even and ordered).
    ///
    /// # Errors
    /// [`FormatError::Invalid`] naming the broken rule.
    pub fn validate(&self) -> Result<(), FormatError> {
        let (min, avg, max) =
            (self.min_size as usize, self.avg_size as usize, self.max_size as usize);
        let ok = (v2020::MINIMUM_MIN..=v2020::MINIMUM_MAX).contains(&min)
            && (v2020::AVERAGE_MIN..=v2020::AVERAGE_MAX).contains(&avg)
            && (v2020::MAXIMUM_MIN..=v2020::MAXIMUM_MAX).contains(&max)
            && min <= avg
            && avg <= max
            && min % 2 == 0
            && avg % 2 == 0
            && max % 2 == 0;
        if ok {
            Ok(())
        } else {
            Err(FormatError::Invalid {
                what: "chunker parameters",
                reason: format!("{self:?} outside fastcdc's bounds or not even and ordered"),
            })
        }
    }
}

/// A keyed FastCDC chunker. Cheap to share between threads by reference.
#[derive(Clone)]
pub struct Chunker {
    params: ChunkerParams,
    gear: Box<[u64; 256]>,
    gear_ls: Box<[u64; 256]>,
    mask_s: u64,
    mask_l: u64,
}

impl std::fmt::Debug for Chunker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunker").field("params", &self.params).finish_non_exhaustive()
    }
}

impl Chunker {
    /// A chunker with the repository's secret gear table.
    ///
    /// # Errors
    /// Invalid parameters.
    pub fn new(params: ChunkerParams, gear: &[u64; 256]) -> Result<Self, FormatError> {
        params.validate()?;
        let mut gear_ls = [0u64; 256];
        for (ls, g) in gear_ls.iter_mut().zip(gear.iter()) {
            *ls = g << 1;
        }
        let (mask_s, mask_l) = v2020::select_masks(params.avg_size as usize, Normalization::Level2);
        Ok(Self { params, gear: Box::new(*gear), gear_ls: Box::new(gear_ls), mask_s, mask_l })
    }

    /// The size bounds.
    #[must_use]
    pub fn params(&self) -> ChunkerParams {
        self.params
    }

    /// Length of the next chunk at the start of `data`. Unless `data` holds the rest of the
    /// stream, callers must supply at least `max_size` bytes so the cut is the same as it
    /// would be on the whole stream.
    #[must_use]
    pub fn cut(&self, data: &[u8]) -> usize {
        if data.is_empty() {
            return 0;
        }
        let (_, len) = v2020::cut_gear(
            data,
            self.params.min_size as usize,
            self.params.avg_size as usize,
            self.params.max_size as usize,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
            &self.gear[..],
            &self.gear_ls[..],
        );
        len.max(1).min(data.len())
    }

    /// Splits a whole in-memory stream into chunk lengths.
    #[must_use]
    pub fn split(&self, data: &[u8]) -> Vec<usize> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < data.len() {
            let n = self.cut(&data[pos..]);
            out.push(n);
            pos += n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn small() -> ChunkerParams {
        ChunkerParams { min_size: 256, avg_size: 1024, max_size: 4096 }
    }

    fn gear(seed: u8) -> [u64; 256] {
        let mut g = [0u64; 256];
        let mut bytes = [0u8; 2048];
        blake3::Hasher::new_keyed(&[seed; 32]).finalize_xof().fill(&mut bytes);
        for (i, c) in bytes.chunks_exact(8).enumerate() {
            g[i] = u64::from_le_bytes(c.try_into().unwrap_or_default());
        }
        g
    }

    fn noise(len: usize, seed: u8) -> Vec<u8> {
        let mut v = vec![0u8; len];
        blake3::Hasher::new_keyed(&[seed; 32]).finalize_xof().fill(&mut v);
        v
    }

    #[test]
    fn default_params_are_valid() {
        assert!(ChunkerParams::default().validate().is_ok());
        assert!(ChunkerParams { min_size: 3, avg_size: 8, max_size: 9 }.validate().is_err());
    }

    #[test]
    fn boundaries_depend_on_the_key() -> Result<(), FormatError> {
        let data = noise(200_000, 1);
        let a = Chunker::new(small(), &gear(1))?.split(&data);
        let b = Chunker::new(small(), &gear(2))?.split(&data);
        assert_ne!(a, b);
        Ok(())
    }

    #[test]
    fn an_insertion_changes_only_nearby_chunks() -> Result<(), FormatError> {
        let c = Chunker::new(small(), &gear(3))?;
        let data = noise(100_000, 4);
        let mut edited = data.clone();
        edited.splice(50_000..50_000, b"inserted bytes".iter().copied());
        let ends = |d: &[u8]| {
            let mut pos = 0;
            c.split(d)
                .into_iter()
                .map(|n| {
                    pos += n;
                    pos
                })
                .collect::<Vec<_>>()
        };
        let before = ends(&data);
        let after: Vec<usize> =
            ends(&edited).into_iter().filter(|&e| e > 60_000).map(|e| e - 14).collect();
        let shared = after.iter().filter(|e| before.contains(e)).count();
        assert!(shared + 2 >= after.len(), "boundaries after the edit did not resynchronise");
        Ok(())
    }

    proptest! {
        #[test]
        fn chunks_reassemble_and_respect_bounds(data in proptest::collection::vec(any::<u8>(), 0..20_000), seed in any::<u8>()) {
            let c = Chunker::new(small(), &gear(seed)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let lens = c.split(&data);
            prop_assert_eq!(lens.iter().sum::<usize>(), data.len());
            for (i, &n) in lens.iter().enumerate() {
                prop_assert!(n <= 4096);
                if i + 1 < lens.len() { prop_assert!(n >= 256); }
            }
        }

        #[test]
        fn streaming_with_max_lookahead_matches_whole(data in proptest::collection::vec(any::<u8>(), 0..20_000)) {
            let c = Chunker::new(small(), &gear(9)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let whole = c.split(&data);
            let mut streamed = Vec::new();
            let mut pos = 0;
            while pos < data.len() {
                let window = &data[pos..data.len().min(pos + 4096)];
                let n = c.cut(window);
                streamed.push(n);
                pos += n;
            }
            prop_assert_eq!(whole, streamed);
        }
    }
}
