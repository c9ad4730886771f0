//! Go's `time.Duration` in its text form, as `metav1.Duration` puts it on the wire.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration that reads and writes Go's `time.Duration.String()` form: `10m0s`, `4h0m0s`,
/// `1.5s`, `300ms`, `0s`. Parsing also accepts any form Go's `time.ParseDuration` accepts
/// (`90m`, `1h30m`, `2.5h`, `100us`, `-1s` is rejected as a timeout cannot be negative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoDuration(pub Duration);

/// A string that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {text:?}: {reason} (expected Go's form, such as 10m0s or 1h30m)")]
pub struct InvalidDuration {
    /// The rejected text.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

impl GoDuration {
    /// Parses Go's duration syntax: a sequence of decimal numbers with optional fractions,
    /// each followed by a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`); `0` alone is allowed.
    ///
    /// # Errors
    /// [`InvalidDuration`] for empty text, a sign, a missing or unknown unit, or overflow.
    pub fn parse(text: &str) -> Result<Self, InvalidDuration> {
        let err = |reason| InvalidDuration { text: text.to_owned(), reason };
        if text == "0" {
            return Ok(Self(Duration::ZERO));
        }
        if text.is_empty() {
            return Err(err("empty"));
        }
        if text.starts_with(['-', '+']) {
            return Err(err("signed durations are not accepted"));
        }
        let mut rest = text;
        let mut total_ns: u128 = 0;
        while !rest.is_empty() {
            let num_len =
                rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
            if num_len == 0 {
                return Err(err("expected a number"));
            }
            let (number, tail) = rest.split_at(num_len);
            let unit_len =
                tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
            let (unit, tail) = tail.split_at(unit_len);
            let scale =
                UNITS.iter().find(|(name, _)| *name == unit).map(|(_, scale)| *scale).ok_or_else(
                    || err(if unit.is_empty() { "missing unit" } else { "unknown unit" }),
                )?;
            let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
            if (whole.is_empty() && frac.is_empty()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err("expected a number"));
            }
            let whole: u128 = if whole.is_empty() {
                0
            } else {
                whole.parse().map_err(|_| err("number too large"))?
            };
            let mut part = whole.checked_mul(scale).ok_or_else(|| err("overflow"))?;
            let mut place = scale;
            for digit in frac.bytes() {
                place /= 10;
                part += u128::from(digit - b'0') * place;
            }
            total_ns = total_ns.checked_add(part).ok_or_else(|| err("overflow"))?;
            rest = tail;
        }
        let nanos = u64::try_from(total_ns).map_err(|_| err("overflow"))?;
        Ok(Self(Duration::from_nanos(nanos)))
    }
}

impl fmt::Display for GoDuration {
    /// Go's `time.Duration.String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            return f.write_str("0s");
        }
        if ns < 1_000_000_000 {
            let (unit, scale) = if ns < 1_000 {
                ("ns", 1)
            } else if ns < 1_000_000 {
                ("µs", 1_000)
            } else {
                ("ms", 1_000_000)
            };
            return write!(f, "{}{unit}", fraction(ns, scale));
        }
        let hours = ns / 3_600_000_000_000;
        let minutes = ns / 60_000_000_000 % 60;
        let seconds = fraction(ns % 60_000_000_000, 1_000_000_000);
        if hours > 0 {
            write!(f, "{hours}h{minutes}m{seconds}s")
        } else if minutes > 0 {
            write!(f, "{minutes}m{seconds}s")
        } else {
            write!(f, "{seconds}s")
        }
    }
}

/// `value / scale` as a decimal with trailing zeros dropped, as Go prints it.
fn fraction(value: u128, scale: u128) -> String {
    let whole = value / scale;
    let rem = value % scale;
    if rem == 0 {
        return whole.to_string();
    }
    let digits = scale.ilog10() as usize;
    let frac = format!("{rem:0digits$}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: u64) -> GoDuration {
        GoDuration(Duration::from_secs(s))
    }

    #[test]
    fn prints_like_go() {
        assert_eq!(secs(600).to_string(), "10m0s");
        assert_eq!(secs(4 * 3600).to_string(), "4h0m0s");
        assert_eq!(secs(5400).to_string(), "1h30m0s");
        assert_eq!(secs(0).to_string(), "0s");
        assert_eq!(GoDuration(Duration::from_millis(1500)).to_string(), "1.5s");
        assert_eq!(GoDuration(Duration::from_millis(300)).to_string(), "300ms");
        assert_eq!(GoDuration(Duration::from_micros(2)).to_string(), "2µs");
        assert_eq!(GoDuration(Duration::from_nanos(61_000_000_001)).to_string(), "1m1.000000001s");
    }

    #[test]
    fn parses_like_go() {
        assert_eq!(GoDuration::parse("10m0s"), Ok(secs(600)));
        assert_eq!(GoDuration::parse("90m"), Ok(secs(5400)));
        assert_eq!(GoDuration::parse("1h30m"), Ok(secs(5400)));
        assert_eq!(GoDuration::parse("2.5h"), Ok(secs(9000)));
        assert_eq!(GoDuration::parse("0"), Ok(secs(0)));
        assert_eq!(GoDuration::parse(".5s"), Ok(GoDuration(Duration::from_millis(500))));
        assert_eq!(GoDuration::parse("100us"), Ok(GoDuration(Duration::from_micros(100))));
        for bad in ["", "10", "-1s", "1x", "m", "1.2.3s", "s1"] {
            assert!(GoDuration::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn display_then_parse_is_identity(ns in 0u64..u64::MAX / 2) {
            let d = GoDuration(Duration::from_nanos(ns));
            prop_assert_eq!(GoDuration::parse(&d.to_string()), Ok(d));
        }

        #[test]
        fn parse_never_panics(s in ".{0,24}") {
            let _ = GoDuration::parse(&s);
        }
    }
}
