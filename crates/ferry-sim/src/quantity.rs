//! Kubernetes resource quantities for storage sizes: parse (`64Mi`, `1G`, `1e3`...) and format
//! as the API server's canonical binary form (`64Mi`, or plain bytes).

use crate::SimError;

const BINARY: [(&str, u32); 6] = [("Ki", 1), ("Mi", 2), ("Gi", 3), ("Ti", 4), ("Pi", 5), ("Ei", 6)];
const DECIMAL: [(&str, u32); 6] = [("k", 1), ("M", 2), ("G", 3), ("T", 4), ("P", 5), ("E", 6)];

/// Reads a storage quantity as bytes, rounding fractions up (as Kubernetes does for sizes).
///
/// # Errors
/// [`SimError::Quantity`] for text that is not a non-negative quantity or overflows `u64`.
pub fn parse_bytes(text: &str) -> Result<u64, SimError> {
    let bad = |reason| SimError::Quantity { value: text.to_owned(), reason };
    let s = text.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() {
        return Err(bad("no number"));
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(bad("no digits"));
    }
    // Work in a scaled integer: value = mantissa / 10^frac_len * multiplier.
    let digits = format!("{whole}{frac}");
    let mantissa: u128 = digits.parse().map_err(|_| bad("number too long"))?;
    let frac_len = u32::try_from(frac.len()).map_err(|_| bad("number too long"))?;
    let divisor = 10u128.checked_pow(frac_len).ok_or_else(|| bad("number too long"))?;
    let multiplier: u128 = if suffix.is_empty() {
        1
    } else if let Some((_, p)) = BINARY.iter().find(|(n, _)| *n == suffix) {
        1024u128.pow(*p)
    } else if let Some((_, p)) = DECIMAL.iter().find(|(n, _)| *n == suffix) {
        1000u128.pow(*p)
    } else if let Some(exp) = suffix.strip_prefix(['e', 'E']) {
        let exp: u32 = exp.parse().map_err(|_| bad("bad exponent"))?;
        10u128.checked_pow(exp).ok_or_else(|| bad("exponent too large"))?
    } else {
        return Err(bad("unknown suffix"));
    };
    let scaled = mantissa.checked_mul(multiplier).ok_or_else(|| bad("too large"))?;
    let bytes = scaled.div_ceil(divisor);
    u64::try_from(bytes).map_err(|_| bad("too large"))
}

/// Formats bytes the way the API server canonicalises a binary-SI quantity: the largest binary
/// suffix that divides the value exactly, else plain bytes.
#[must_use]
pub fn format_bytes(bytes: u64) -> String {
    if bytes == 0 {
        return "0".to_owned();
    }
    for (suffix, power) in BINARY.iter().rev() {
        let unit = 1u64 << (10 * power);
        if bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_usual_forms() {
        assert_eq!(parse_bytes("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1Gi").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("100M").unwrap(), 100_000_000);
        assert_eq!(parse_bytes("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("1.5Ki").unwrap(), 1536);
        assert_eq!(parse_bytes("0.5").unwrap(), 1, "fractions round up");
        assert_eq!(parse_bytes("2e3").unwrap(), 2000);
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "Mi", "-1", "12Qi", "1e99999", "99999999999999999999999Ei", "."] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(format_bytes(64 << 20), "64Mi");
        assert_eq!(format_bytes(1536), "1536");
        assert_eq!(format_bytes(3 << 10), "3Ki");
        assert_eq!(format_bytes(0), "0");
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(bytes in any::<u64>()) {
            prop_assert_eq!(parse_bytes(&format_bytes(bytes)).unwrap(), bytes);
        }

        #[test]
        fn parse_never_panics(text in ".{0,24}") {
            let _ = parse_bytes(&text);
        }
    }
}
