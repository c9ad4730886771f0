//! The repository config object (`config`), written once at init with create-if-absent.

use serde::{Deserialize, Serialize};

use crate::format::{
    ChunkerParams, Cipher, FormatError, ObjectKind, compress, decode_body, encode_body,
    open_object_of, seal_object_as,
};

/// A repository's format version, the first byte of its `config`: how data is chunked and how
/// packs are laid out. A repository keeps the format it was created with; this build reads and
/// writes all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum RepoFormat {
    /// Format 1: FastCDC cutting on a keyed Gear hash; pack headers of their exact length.
    V1,
    /// Format 2: cuts decided by a PRF of a keyed rolling hash ([`crate::format::PrfCut`]);
    /// data packs' headers padded to [`crate::format::HEADER_PADDING`] so a pack's header
    /// tells its blob count only to within about 93.
    V2,
    /// Format 3: format 2, and small data blobs (a file backup's under
    /// [`crate::format::FRAMED_MAX`], a volume backup's under 512 KiB) stored together in
    /// frames ([`crate::format::frame`]) compressed and sealed as one.
    #[default]
    V3,
}

impl RepoFormat {
    /// The version byte.
    #[must_use]
    pub fn byte(self) -> u8 {
        match self {
            Self::V1 => 1,
            Self::V2 => 2,
            Self::V3 => 3,
        }
    }

    /// Whether small data blobs are stored in frames (format 3).
    #[must_use]
    pub fn frames(self) -> bool {
        self >= Self::V3
    }

    /// Every format this build reads, by version byte.
    const BYTES: [u8; 3] = [1, 2, 3];

    fn from_byte(byte: u8) -> Result<Self, FormatError> {
        match byte {
            1 => Ok(Self::V1),
            2 => Ok(Self::V2),
            3 => Ok(Self::V3),
            found => Err(FormatError::Version { found }),
        }
    }
}

impl std::fmt::Display for RepoFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.byte())
    }
}

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
    /// The repository's format: the config's version byte (authenticated with it), not part
    /// of its body.
    #[serde(skip)]
    pub format: RepoFormat,
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
        let (version, body) = (self.format.byte(), encode_body(self));
        seal_object_as(cipher, version, compress::OBJECT_LEVEL, ObjectKind::Config, IDENTITY, &body)
    }

    /// Authenticates, decodes and validates the stored form.
    ///
    /// # Errors
    /// [`FormatError::Authentication`] when `cipher` is not this repository's key; any other
    /// [`FormatError`] for damaged bytes.
    pub fn decode(cipher: &Cipher, bytes: &[u8]) -> Result<Self, FormatError> {
        let (version, body) =
            open_object_of(cipher, ObjectKind::Config, IDENTITY, bytes, &RepoFormat::BYTES)?;
        let mut config: Self = decode_body("config", &body)?;
        config.format = RepoFormat::from_byte(version)?;
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
            format: RepoFormat::V2,
        }
    }

    #[test]
    fn round_trip_and_wrong_key() -> Result<(), FormatError> {
        let c = Cipher::new(&[1; 32]);
        let bytes = sample().encode(&c);
        assert_eq!(Config::decode(&c, &bytes)?, sample());
        let v1 = Config { format: RepoFormat::V1, ..sample() };
        let v1_bytes = v1.encode(&c);
        assert_eq!((v1_bytes[0], bytes[0]), (1, 2), "the version byte is the format");
        assert_eq!(Config::decode(&c, &v1_bytes)?, v1);
        // The version is authenticated: a format 1 config relabelled 2 does not open.
        let mut relabelled = v1_bytes.clone();
        relabelled[0] = 2;
        assert!(matches!(Config::decode(&c, &relabelled), Err(FormatError::Authentication)));
        let mut unknown = bytes.clone();
        unknown[0] = 4;
        assert!(matches!(Config::decode(&c, &unknown), Err(FormatError::Version { found: 4 })));
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
