//! 256-bit identifiers of stored things.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::format::FormatError;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub [u8; 32]);

        impl $name {
            /// The identifier as 64 lowercase hex digits.
            #[must_use]
            pub fn to_hex(&self) -> String {
                hex::encode(self.0)
            }

            /// Parses 64 hex digits.
            ///
            /// # Errors
            /// [`FormatError::Invalid`] when `text` is not 64 hex digits.
            pub fn from_hex(text: &str) -> Result<Self, FormatError> {
                let mut out = [0u8; 32];
                hex::decode_to_slice(text, &mut out).map_err(|e| FormatError::Invalid {
                    what: $what,
                    reason: format!("{text:?} is not 64 hex digits: {e}"),
                })?;
                Ok(Self(out))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), &self.to_hex()[..16])
            }
        }

        impl FromStr for $name {
            type Err = FormatError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::from_hex(s)
            }
        }
    };
}

id_type!(
    /// A blob (chunk of file data or tree page): keyed BLAKE3 of its plaintext.
    BlobId,
    "blob id"
);
id_type!(
    /// A pack file: BLAKE3 of its stored bytes.
    PackId,
    "pack id"
);
id_type!(
    /// An index file: BLAKE3 of its stored bytes.
    IndexId,
    "index id"
);
id_type!(
    /// A snapshot manifest: BLAKE3 of its stored bytes.
    SnapshotId,
    "snapshot id"
);
id_type!(
    /// A key file: BLAKE3 of its stored bytes.
    KeyId,
    "key id"
);

/// The unkeyed BLAKE3 hash of stored bytes: the name of every content-addressed object.
#[must_use]
pub(crate) fn content_address(bytes: &[u8]) -> [u8; 32] {
    *blake3::hash(bytes).as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hex_round_trip(bytes in any::<[u8; 32]>()) {
            let id = BlobId(bytes);
            prop_assert_eq!(BlobId::from_hex(&id.to_hex()).ok(), Some(id));
        }

        #[test]
        fn from_hex_never_panics(text in ".{0,80}") {
            let _ = SnapshotId::from_hex(&text);
        }
    }
}
