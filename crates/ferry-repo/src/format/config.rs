//! The repository config object (`config`), written once at init with create-if-absent.

use serde::{Deserialize, Serialize};

use crate::format::{
    ChunkerParams, Cipher, FormatError, ObjectKind, decode_body, encode_body, open_object,
    seal_object,
};

/// Pack size targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackParams {
    /// A pack is sealed once its blobs reach this many bytes.
    pub target_size: u32,
}

impl Default for PackParams {
    /// 16 MiB: few objects on S3, ranged reads for single blobs.
    fn default() -> Self {
        Self { target_size: 16 << 20 }
    }
}

/// Repository-wide parameters, encrypted with the master key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Random repository identifier.
    pub repo_id: [u8; 32],
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: i64,
    /// Chunking of file data.
    pub chunker: ChunkerParams,
    /// Chunking of block volumes, when it differs from file data (decided with block support).
    pub volume_chunker: Option<ChunkerParams>,
    /// Pack sizes.
    pub packs: PackParams,
}

const IDENTITY: &[u8] = b"config";

impl Config {
    /// Checks the parameters a hostile or damaged config could get wrong.
    ///
    /// # Errors
    /// [`FormatError::Invalid`].
    pub fn validate(&self) -> Result<(), FormatError> {
        self.chunker.validate()?;
        if let Some(v) = &self.volume_chunker {
            v.validate()?;
        }
        if !(1 << 20..=1 << 30).contains(&self.packs.target_size) {
            return Err(FormatError::Invalid {
                what: "config",
                reason: format!("pack target size {} outside 1 MiB..1 GiB", self.packs.target_size),
            });
        }
        Ok(())
    }

    /// The stored (encrypted) form.
    #[must_use]
    pub fn encode(&self, cipher: &Cipher) -> Vec<u8> {
        seal_object(cipher, ObjectKind::Config, IDENTITY, &encode_body(self))
    }

    /// Authenticates, decodes and validates the stored form.
    ///
    /// # Errors
    /// [`FormatError::Authentication`] when `cipher` is not this repository's key; any other
    /// [`FormatError`] for damaged bytes.
    pub fn decode(cipher: &Cipher, bytes: &[u8]) -> Result<Self, FormatError> {
        let body = open_object(cipher, ObjectKind::Config, IDENTITY, bytes)?;
        let config: Self = decode_body("config", &body)?;
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Config {
        Config {
            repo_id: [4; 32],
            created_unix: 1_700_000_000,
            chunker: ChunkerParams::default(),
            volume_chunker: None,
            packs: PackParams::default(),
        }
    }

    #[test]
    fn round_trip_and_wrong_key() -> Result<(), FormatError> {
        let c = Cipher::new(&[1; 32]);
        let bytes = sample().encode(&c);
        assert_eq!(Config::decode(&c, &bytes)?, sample());
        assert!(matches!(
            Config::decode(&Cipher::new(&[2; 32]), &bytes),
            Err(FormatError::Authentication)
        ));
        Ok(())
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Config::decode(&Cipher::new(&[1; 32]), &bytes);
        }

        #[test]
        fn body_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_body::<Config>("config", &bytes);
        }
    }
}
