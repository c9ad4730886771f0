//! Which packs `check --read-data-subset` reads: one of M groups of packs (`N/M`, by pack id,
//! so running 1/M to M/M reads every pack once), or a random sample (`P%`).

use std::str::FromStr;

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
    /// Each pack with this probability (percent), drawn anew on every run.
    Percent(f64),
}

impl PackSubset {
    /// Whether the pack `id` is in the subset.
    #[must_use]
    pub fn selects(&self, id: &PackId) -> bool {
        match *self {
            Self::Group { n, of } => {
                let mut head = [0u8; 8];
                head.copy_from_slice(&id.0[..8]);
                u64::from_be_bytes(head) % u64::from(of) == u64::from(n - 1)
            }
            Self::Percent(p) => rand::random::<f64>() * 100.0 < p,
        }
    }
}

/// Why a subset could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("read-data subset {text:?}: {reason} (expected N/M, e.g. 2/5, or P%, e.g. 10%)")]
pub struct SubsetError {
    text: String,
    reason: &'static str,
}

impl FromStr for PackSubset {
    type Err = SubsetError;

    fn from_str(text: &str) -> Result<Self, SubsetError> {
        let fail = |reason| SubsetError { text: text.to_owned(), reason };
        if let Some(p) = text.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| fail("not a number before %"))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(fail("the percentage must be above 0 and at most 100"));
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
        for first in 0..=255u8 {
            let chosen =
                (1..=7).filter(|n| PackSubset::Group { n: *n, of: 7 }.selects(&id(first))).count();
            assert_eq!(chosen, 1, "pack {first}");
        }
        assert!(PackSubset::Percent(100.0).selects(&id(1)));
    }
}
