//! Content-defined chunking: FastCDC (2020) with a secret cut decision.
//!
//! Format 1 hands fastcdc's `cut_gear` a whole table of 256 secret 64-bit values expanded from
//! the master key (and its one-bit-left-shifted twin, which the 2020 "rolling two bytes" loop
//! needs) and cuts on bits of that keyed Gear hash. The 2025 attacks on keyed CDC recover
//! such a key from observed chunk sizes (see [`super::prf_cut`]), so format 2 keeps FastCDC's
//! sizes and normalisation but decides each cut on a PRF of a keyed rolling hash instead.

use fastcdc::v2020::{self, Normalization};
use serde::{Deserialize, Serialize};

use crate::format::{FormatError, PrfCut, RepoFormat, RepoKeys};

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
            && max % 2 == 0
            && min >= super::prf_cut::WINDOW;
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
    by: CutBy,
    mask_s: u64,
    mask_l: u64,
}

/// How a chunker decides where to cut.
#[derive(Clone)]
enum CutBy {
    /// Format 1: bits of the keyed Gear hash.
    Gear { gear: Box<[u64; 256]>, gear_ls: Box<[u64; 256]> },
    /// Format 2: bits of a PRF of a keyed rolling hash.
    Prf(Box<PrfCut>),
}

impl std::fmt::Debug for Chunker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let by = match self.by {
            CutBy::Gear { .. } => "gear",
            CutBy::Prf(_) => "prf",
        };
        f.debug_struct("Chunker").field("params", &self.params).field("by", &by).finish()
    }
}

impl Chunker {
    /// Format 1's chunker: cuts on the repository's secret gear table.
    ///
    /// # Errors
    /// Invalid parameters.
    pub fn new(params: ChunkerParams, gear: &[u64; 256]) -> Result<Self, FormatError> {
        let mut gear_ls = [0u64; 256];
        for (ls, g) in gear_ls.iter_mut().zip(gear.iter()) {
            *ls = g << 1;
        }
        Self::with(params, CutBy::Gear { gear: Box::new(*gear), gear_ls: Box::new(gear_ls) })
    }

    /// Format 2's chunker: cuts on a PRF of the keyed rolling hash (see [`PrfCut`]).
    ///
    /// # Errors
    /// Invalid parameters.
    pub fn prf(params: ChunkerParams, cut: &PrfCut) -> Result<Self, FormatError> {
        Self::with(params, CutBy::Prf(Box::new(cut.clone())))
    }

    /// The chunker of a repository of `format` with `keys`.
    ///
    /// # Errors
    /// Invalid parameters.
    pub fn for_format(
        format: RepoFormat,
        params: ChunkerParams,
        keys: &RepoKeys,
    ) -> Result<Self, FormatError> {
        match format {
            RepoFormat::V1 => Self::new(params, keys.gear()),
            RepoFormat::V2 | RepoFormat::V3 => Self::prf(params, keys.prf_cut()),
        }
    }

    fn with(params: ChunkerParams, by: CutBy) -> Result<Self, FormatError> {
        params.validate()?;
        let (mask_s, mask_l) = v2020::select_masks(params.avg_size as usize, Normalization::Level2);
        Ok(Self { params, by, mask_s, mask_l })
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
        let (min, avg, max) = (
            self.params.min_size as usize,
            self.params.avg_size as usize,
            self.params.max_size as usize,
        );
        let len = match &self.by {
            CutBy::Gear { gear, gear_ls } => {
                let (_, len) = v2020::cut_gear(
                    data,
                    min,
                    avg,
                    max,
                    self.mask_s,
                    self.mask_l,
                    self.mask_s << 1,
                    self.mask_l << 1,
                    &gear[..],
                    &gear_ls[..],
                );
                len
            }
            CutBy::Prf(cut) => cut.cut(data, (min, avg, max), (self.mask_s, self.mask_l)),
        };
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
        crate::format::keys::table(&[seed; 32])
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

    fn prf(seed: u8) -> PrfCut {
        let mut key = [0u8; 16];
        blake3::Hasher::new_keyed(&[seed; 32]).finalize_xof().fill(&mut key);
        PrfCut::new(&gear(seed.wrapping_add(100)), &key)
    }

    /// Format 1's and format 2's chunkers of one seed.
    fn both(params: ChunkerParams, seed: u8) -> Result<[Chunker; 2], FormatError> {
        Ok([Chunker::new(params, &gear(seed))?, Chunker::prf(params, &prf(seed))?])
    }

    #[test]
    fn boundaries_depend_on_the_key() -> Result<(), FormatError> {
        let data = noise(200_000, 1);
        for (a, b) in both(small(), 1)?.iter().zip(both(small(), 2)?.iter()) {
            assert_ne!(a.split(&data), b.split(&data), "{a:?}");
        }
        Ok(())
    }

    /// Known answers: where each format cuts a fixed stream under a fixed master key (key
    /// derivation included). A change here moves the cuts of data already stored, so
    /// deduplication against it is lost: only a new format may change them.
    #[test]
    fn each_format_cuts_where_it_always_has() -> Result<(), FormatError> {
        let keys = crate::format::MasterKey::from_secret([3; 32]).derive();
        let data = noise(40_000, 12);
        let mut found = Vec::new();
        for format in [RepoFormat::V1, RepoFormat::V2] {
            found.push(Chunker::for_format(format, small(), &keys)?.split(&data));
        }
        assert_eq!(found, [KNOWN_V1.to_vec(), KNOWN_V2.to_vec()]);
        Ok(())
    }

    const KNOWN_V1: &[usize] = &[
        659, 840, 1173, 807, 493, 1031, 1613, 512, 1541, 1147, 1472, 1042, 1220, 1093, 1024, 1053,
        1442, 1454, 1373, 1029, 668, 1154, 1128, 1440, 1505, 1277, 1947, 1201, 1099, 1253, 1608,
        1164, 1244, 1294,
    ];
    const KNOWN_V2: &[usize] = &[
        1308, 1088, 1262, 1053, 1489, 1185, 937, 395, 1043, 1112, 1077, 1056, 1074, 565, 1492,
        1145, 1351, 1601, 1108, 1394, 1175, 1244, 1061, 1317, 1688, 1663, 1343, 1208, 876, 1178,
        640, 1028, 1221, 1353, 270,
    ];

    #[test]
    fn the_two_formats_cut_differently() -> Result<(), FormatError> {
        let data = noise(200_000, 5);
        let [gear, prf] = both(small(), 1)?;
        assert_ne!(gear.split(&data), prf.split(&data));
        Ok(())
    }

    #[test]
    fn chunks_average_near_the_target() -> Result<(), FormatError> {
        // 1 MiB average over 64 MiB of random data: FastCDC's normalised masks give a mean
        // between the average and 1.3 times it (the minimum adds to every chunk).
        let data = noise(64 << 20, 6);
        for c in both(ChunkerParams::default(), 3)? {
            let lens = c.split(&data);
            let mean = data.len() / lens.len();
            assert!((1 << 20..(13 << 20) / 10).contains(&mean), "{c:?}: mean {mean}");
            assert!(lens[..lens.len() - 1].iter().all(|&n| (256 << 10..=4 << 20).contains(&n)));
        }
        Ok(())
    }

    #[test]
    fn an_insertion_changes_only_nearby_chunks() -> Result<(), FormatError> {
        for c in both(small(), 3)? {
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
            assert!(shared + 2 >= after.len(), "{c:?}: boundaries did not resynchronise");
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn chunks_reassemble_and_respect_bounds(data in proptest::collection::vec(any::<u8>(), 0..20_000), seed in any::<u8>()) {
            for c in both(small(), seed).map_err(|e| TestCaseError::fail(e.to_string()))? {
                let lens = c.split(&data);
                prop_assert_eq!(lens.iter().sum::<usize>(), data.len());
                for (i, &n) in lens.iter().enumerate() {
                    prop_assert!(n <= 4096);
                    if i + 1 < lens.len() { prop_assert!(n >= 256); }
                }
            }
        }

        #[test]
        fn streaming_with_max_lookahead_matches_whole(data in proptest::collection::vec(any::<u8>(), 0..20_000)) {
            for c in both(small(), 9).map_err(|e| TestCaseError::fail(e.to_string()))? {
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
}
