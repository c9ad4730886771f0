//! Which packs `check --read-data-subset` reads: one of M groups of packs (`N/M`, by pack id,
//! so running 1/M to M/M reads every pack once), or a random sample (`P%`).

use std::str::FromStr;

use rand::seq::IndexedRandom;

use crate::format::PackId;

/// A part of the repository's packs to read and authenticate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PackSubset {
    /// Group `n` (1-based) of `of`: packs whose id, as a number, leaves remainder `n - 1`.
    Group {
        /// Which group, from 1.
        n: u32,
        /// How many groups.
        of: u32,
    },
    /// This share (percent) of the packs, rounded up (at least one), drawn anew on every run.
    Percent(f64),
}

impl PackSubset {
    /// The packs of `packs` in the subset.
    ///
    /// # Errors
    /// A group outside `1..=of` or a percentage outside `(0, 100]` (the parser refuses them;
    /// a subset built directly could otherwise read nothing and pass).
    pub fn pick(&self, packs: &[PackId]) -> Result<Vec<PackId>, SubsetError> {
        match *self {
            Self::Group { n, of } => {
                if n == 0 || n > of {
                    return Err(SubsetError::new(format!("{n}/{of}"), "N must be between 1 and M"));
                }
                let in_group = |id: &&PackId| {
                    let mut head = [0u8; 8];
                    head.copy_from_slice(&id.0[..8]);
                    u64::from_be_bytes(head) % u64::from(of) == u64::from(n - 1)
                };
                Ok(packs.iter().filter(in_group).copied().collect())
            }
            Self::Percent(p) => {
                if !(p > 0.0 && p <= 100.0) {
                    return Err(SubsetError::new(format!("{p}%"), PERCENT_RANGE));
                }
                // As a count: at least one pack, at most all; f64 holds any pack count exactly.
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss
                )]
                let count =
                    ((packs.len() as f64 * p / 100.0).ceil() as usize).clamp(1, packs.len().max(1));
                Ok(packs.choose_multiple(&mut rand::rng(), count).copied().collect())
            }
        }
    }
}

const PERCENT_RANGE: &str = "the percentage must be above 0 and at most 100";

/// Why a subset could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("read-data subset {text:?}: {reason} (expected N/M, e.g. 2/5, or P%, e.g. 10%)")]
pub struct SubsetError {
    text: String,
    reason: &'static str,
}

impl SubsetError {
    fn new(text: String, reason: &'static str) -> Self {
        Self { text, reason }
    }
}

impl FromStr for PackSubset {
    type Err = SubsetError;

    fn from_str(text: &str) -> Result<Self, SubsetError> {
        let fail = |reason| SubsetError::new(text.to_owned(), reason);
        if let Some(p) = text.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| fail("not a number before %"))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(fail(PERCENT_RANGE));
            }
            return Ok(Self::Percent(p));
        }
        let (n, of) = text.split_once('/').ok_or_else(|| fail("neither N/M nor P%"))?;
        let n: u32 = n.trim().parse().map_err(|_| fail("N is not a whole number"))?;
        let of: u32 = of.trim().parse().map_err(|_| fail("M is not a whole number"))?;
        if of == 0 || n == 0 || n > of {
            return Err(fail("N must be between 1 and M"));
        }
        Ok(Self::Group { n, of })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(first: u8) -> PackId {
        let mut bytes = [0u8; 32];
        bytes[7] = first;
        bytes[20] = 0xff;
        PackId(bytes)
    }

    #[test]
    fn parses_groups_and_percentages_and_explains_mistakes() {
        assert_eq!("2/5".parse(), Ok(PackSubset::Group { n: 2, of: 5 }));
        assert_eq!("12.5%".parse(), Ok(PackSubset::Percent(12.5)));
        for bad in ["", "0/3", "4/3", "1/0", "a/3", "3", "0%", "101%", "x%", "-5%"] {
            let err = bad.parse::<PackSubset>().expect_err(bad);
            assert!(err.to_string().contains("expected N/M"), "{err}");
        }
    }

    #[test]
    fn the_groups_of_a_split_cover_every_pack_exactly_once() {
        let packs: Vec<PackId> = (0..=255u8).map(id).collect();
        let mut seen = Vec::new();
        for n in 1..=7 {
            seen.extend(PackSubset::Group { n, of: 7 }.pick(&packs).expect("valid group"));
        }
        seen.sort_unstable_by_key(|p| p.0);
        assert_eq!(seen, packs, "each pack in exactly one of the seven groups");
    }

    #[test]
    fn a_percentage_reads_that_share_rounded_up_and_never_nothing() {
        let packs: Vec<PackId> = (0..=199u8).map(id).collect();
        for (p, want) in [(100.0, 200), (10.0, 20), (0.3, 1), (0.0001, 1), (50.5, 101)] {
            let mut got = PackSubset::Percent(p).pick(&packs).expect("valid percentage");
            assert_eq!(got.len(), want, "{p}%");
            got.sort_unstable_by_key(|p| p.0);
            got.dedup();
            assert_eq!(got.len(), want, "{p}%: no pack twice");
        }
        assert!(PackSubset::Percent(5.0).pick(&[]).expect("empty").is_empty());
    }

    #[test]
    fn a_subset_built_by_hand_out_of_range_is_refused() {
        let packs = [id(1)];
        for bad in [
            PackSubset::Group { n: 0, of: 3 },
            PackSubset::Group { n: 4, of: 3 },
            PackSubset::Group { n: 0, of: 0 },
            PackSubset::Percent(0.0),
            PackSubset::Percent(f64::NAN),
            PackSubset::Percent(101.0),
        ] {
            assert!(bad.pick(&packs).is_err(), "{bad:?}");
        }
    }
}
