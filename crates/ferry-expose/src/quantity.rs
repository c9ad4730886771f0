//! Kubernetes resource quantities (`500m`, `1.5Gi`, `2e3`), read exactly enough to validate a
//! configured value and compare a request with its limit.
//!
//! The grammar is the API machinery's: an optional sign, digits with an optional fraction, then
//! a suffix: binary (`Ki` … `Ei`), decimal (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`) or
//! an exponent (`e3`, `E-2`). Values are kept in nano-units, fractions of a nano-unit rounded
//! up (as the API server does). Unlike the API machinery, a number needs at least one digit
//! (it reads a lone sign or suffix as zero) and surrounding spaces are refused (as Velero's
//! parsing does).

/// Why a text is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Nothing at all.
    #[error("empty")]
    Empty,
    /// No digit before the suffix.
    #[error("no digits")]
    NoDigits,
    /// The text after the number is no suffix Kubernetes knows.
    #[error(
        "unknown suffix {0:?} (expected Ki…Ei, n, u, m, k, M, G, T, P, E or an exponent like e3)"
    )]
    Suffix(String),
    /// Too many digits or too large a value to compare.
    #[error("too large or too precise")]
    TooLarge,
}

/// A parsed quantity, in nano-units (`1` is 10⁹, `1m` is 10⁶).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Quantity {
    nanos: i128,
}

const BINARY: [(&str, u32); 6] = [("Ki", 1), ("Mi", 2), ("Gi", 3), ("Ti", 4), ("Pi", 5), ("Ei", 6)];
const DECIMAL: [(&str, i32); 10] = [
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("", 0),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];

impl Quantity {
    /// Reads `text` (untrusted: never panics).
    ///
    /// # Errors
    /// [`QuantityError`] naming what is wrong.
    pub(crate) fn parse(text: &str) -> Result<Self, QuantityError> {
        if text.is_empty() {
            return Err(QuantityError::Empty);
        }
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.strip_prefix('+').unwrap_or(text)),
        };
        let (whole, rest) = split_digits(rest);
        let (fraction, suffix) = match rest.strip_prefix('.') {
            Some(rest) => split_digits(rest),
            None => ("", rest),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(QuantityError::NoDigits);
        }
        let (exp10, exp2) = interpret(suffix)?;
        // Trailing zeros of the fraction change nothing; dropping them keeps long but exact
        // texts (`1.000000000000000000000000000000000000000`) readable.
        let fraction = fraction.trim_end_matches('0');
        let digits = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        let mantissa: u128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| QuantityError::TooLarge)?
        };
        let fraction_len = i64::try_from(fraction.len()).map_err(|_| QuantityError::TooLarge)?;
        let scale = exp10 - fraction_len + 9;
        let shifted = 1u128
            .checked_shl(exp2)
            .and_then(|f| mantissa.checked_mul(f))
            .ok_or(QuantityError::TooLarge)?;
        let nanos = if scale >= 0 {
            let factor = u32::try_from(scale)
                .ok()
                .and_then(|s| 10u128.checked_pow(s))
                .ok_or(QuantityError::TooLarge);
            if shifted == 0 {
                0
            } else {
                shifted.checked_mul(factor?).ok_or(QuantityError::TooLarge)?
            }
        } else {
            // Rounded up to a whole nano-unit; a divisor past u128 leaves 0 < value < 1.
            match u32::try_from(-scale).ok().and_then(|s| 10u128.checked_pow(s)) {
                Some(divisor) => shifted.div_ceil(divisor),
                None => u128::from(shifted > 0),
            }
        };
        let nanos = i128::try_from(nanos).map_err(|_| QuantityError::TooLarge)?;
        Ok(Self { nanos: if negative { -nanos } else { nanos } })
    }

    /// Whether the value is zero (Velero's "not set, unbounded").
    pub(crate) fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// Whether the value is below zero.
    pub(crate) fn is_negative(self) -> bool {
        self.nanos < 0
    }
}

/// The leading ASCII digits of `text`, and the rest.
fn split_digits(text: &str) -> (&str, &str) {
    text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()))
}

/// The decimal exponent and the power of two a suffix stands for.
fn interpret(suffix: &str) -> Result<(i64, u32), QuantityError> {
    if let Some((_, e)) = DECIMAL.iter().find(|(s, _)| *s == suffix) {
        return Ok((i64::from(*e), 0));
    }
    if let Some((_, p)) = BINARY.iter().find(|(s, _)| *s == suffix) {
        return Ok((0, 10 * p));
    }
    let exponent = suffix
        .strip_prefix(['e', 'E'])
        .filter(|e| {
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        })
        .ok_or_else(|| QuantityError::Suffix(suffix.to_owned()))?;
    // Beyond this the value cannot be compared anyway (i128 holds about 10^38 nano-units).
    match exponent.parse::<i64>() {
        Ok(e) if e.abs() <= 1000 => Ok((e, 0)),
        _ => Err(QuantityError::TooLarge),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nanos(text: &str) -> i128 {
        Quantity::parse(text).unwrap().nanos
    }

    #[test]
    fn reads_every_suffix_family() {
        let units = 1_000_000_000_i128;
        assert_eq!(nanos("1"), units);
        assert_eq!(nanos("500m"), units / 2);
        assert_eq!(nanos("0.5"), units / 2);
        assert_eq!(nanos(".5"), units / 2);
        assert_eq!(nanos("5."), 5 * units);
        assert_eq!(nanos("+2"), 2 * units);
        assert_eq!(nanos("-2k"), -2000 * units);
        assert_eq!(nanos("1Ki"), 1024 * units);
        assert_eq!(nanos("1.5Gi"), 3 * (1 << 29) * units);
        assert_eq!(nanos("64Mi"), (64 << 20) * units);
        assert_eq!(nanos("3n"), 3);
        assert_eq!(nanos("7u"), 7000);
        assert_eq!(nanos("2e3"), 2000 * units);
        assert_eq!(nanos("2E-3"), units / 500);
        assert_eq!(nanos("1e+2"), 100 * units);
        assert_eq!(nanos("1E"), 10_i128.pow(18) * units, "E alone is exa");
        assert_eq!(nanos("0"), 0);
        assert_eq!(nanos("000.000"), 0);
        assert_eq!(nanos("1.000000000000000000000000000000000000000000"), units);
        // Below a nano-unit rounds up, as the API server does.
        assert_eq!(nanos("0.1n"), 1);
        assert_eq!(nanos("1e-30"), 1);
        assert_eq!(Quantity::parse("1000m"), Quantity::parse("1"));
        assert!(Quantity::parse("100Mi").unwrap() > Quantity::parse("100M").unwrap());
    }

    #[test]
    fn refuses_what_kubernetes_refuses() {
        assert_eq!(Quantity::parse(""), Err(QuantityError::Empty));
        assert_eq!(Quantity::parse("Mi"), Err(QuantityError::NoDigits));
        assert_eq!(Quantity::parse("-"), Err(QuantityError::NoDigits));
        assert_eq!(Quantity::parse("."), Err(QuantityError::NoDigits));
        for bad in
            ["1KB", "1 Gi", " 1", "1 ", "1ki", "1e", "1e+", "1e1.5", "1.2.3", "1Gi1", "m1", "0x10"]
        {
            assert!(
                matches!(
                    Quantity::parse(bad),
                    Err(QuantityError::Suffix(_) | QuantityError::NoDigits)
                ),
                "{bad:?} accepted: {:?}",
                Quantity::parse(bad)
            );
        }
        assert_eq!(Quantity::parse("1e99999"), Err(QuantityError::TooLarge));
        assert_eq!(
            Quantity::parse("9999999999999999999999999999999999Ei"),
            Err(QuantityError::TooLarge)
        );
        assert_eq!(
            Quantity::parse("1KB").unwrap_err().to_string(),
            "unknown suffix \"KB\" (expected Ki…Ei, n, u, m, k, M, G, T, P, E or an exponent like e3)"
        );
    }

    proptest! {
        #[test]
        fn never_panics(text in "[-+]?[0-9.]{0,30}[a-zA-Z+-]{0,4}[0-9]{0,6}") {
            let _ = Quantity::parse(&text);
        }

        #[test]
        fn milli_and_whole_units_agree(n in 0u64..1_000_000_000) {
            prop_assert_eq!(Quantity::parse(&format!("{n}000m")), Quantity::parse(&n.to_string()));
            prop_assert_eq!(Quantity::parse(&format!("{n}Ki")).map(|q| q.nanos),
                Quantity::parse(&(u128::from(n) * 1024).to_string()).map(|q| q.nanos));
        }
    }
}
