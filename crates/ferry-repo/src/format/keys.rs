//! The key hierarchy: a random master secret, the keys derived from it, and key files that
//! hold the master secret wrapped by a password-derived (or, later, KMS-held) key.
//!
//! ```text
//! password --argon2id(salt, params)--> KEK --XChaCha20-Poly1305--> wrapped master secret (keys/<id>)
//! master secret --BLAKE3 derive_key--> object encryption key
//!                                  --> chunk id key (keyed BLAKE3)
//!                                  --> chunker gear table (keyed FastCDC boundaries)
//! ```
//!
//! Changing a password adds a key file wrapping the same master secret; no data is rewritten.

use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::format::{
    BlobId, Cipher, FORMAT_VERSION, FormatError, ObjectKind, associated_data, decode_body,
    encode_body, split_prefix,
};

const CONTEXT_ENCRYPTION: &str = "ferry repository 2025-06 object encryption key v1";
const CONTEXT_ID: &str = "ferry repository 2025-06 blob id key v1";
const CONTEXT_CHUNKER: &str = "ferry repository 2025-06 chunker gear table v1";

/// The repository's root secret: 32 random bytes. Everything else derives from it.
#[derive(Clone, PartialEq, Eq)]
pub struct MasterKey {
    secret: [u8; 32],
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    /// A fresh random master key.
    #[must_use]
    pub fn generate() -> Self {
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        Self { secret }
    }

    /// A master key from its secret bytes (for key wrapping layers).
    #[must_use]
    pub fn from_secret(secret: [u8; 32]) -> Self {
        Self { secret }
    }

    /// The secret bytes, for wrapping by a key-encryption key.
    #[must_use]
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// Derives the working keys.
    #[must_use]
    pub fn derive(&self) -> RepoKeys {
        let enc = blake3::derive_key(CONTEXT_ENCRYPTION, &self.secret);
        let id_key = blake3::derive_key(CONTEXT_ID, &self.secret);
        let chunker_key = blake3::derive_key(CONTEXT_CHUNKER, &self.secret);
        let mut gear_bytes = [0u8; 256 * 8];
        blake3::Hasher::new_keyed(&chunker_key).finalize_xof().fill(&mut gear_bytes);
        let mut gear = [0u64; 256];
        for (slot, bytes) in gear.iter_mut().zip(gear_bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(bytes);
            *slot = u64::from_le_bytes(b);
        }
        RepoKeys { cipher: Cipher::new(&enc), id_key, gear: Box::new(gear) }
    }
}

/// The keys a repository works with, derived from the [`MasterKey`].
#[derive(Clone)]
pub struct RepoKeys {
    /// Encrypts every stored object and blob.
    pub cipher: Cipher,
    id_key: [u8; 32],
    gear: Box<[u64; 256]>,
}

impl std::fmt::Debug for RepoKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RepoKeys(..)")
    }
}

impl RepoKeys {
    /// The id of a blob with this plaintext: keyed BLAKE3, so ids reveal nothing about
    /// content to whoever lacks the key.
    #[must_use]
    pub fn blob_id(&self, plaintext: &[u8]) -> BlobId {
        BlobId(*blake3::keyed_hash(&self.id_key, plaintext).as_bytes())
    }

    /// The repository's secret gear table for the chunker.
    #[must_use]
    pub fn gear(&self) -> &[u64; 256] {
        &self.gear
    }
}

/// argon2id cost parameters, stored in each key file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfParams {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes over memory.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl Default for KdfParams {
    /// 64 MiB, 3 passes, 1 lane: about 0.3–0.4 s on one core of a current server.
    fn default() -> Self {
        Self { memory_kib: 64 * 1024, iterations: 3, parallelism: 1 }
    }
}

impl KdfParams {
    /// Tiny parameters for tests only: no protection against guessing.
    #[must_use]
    pub fn insecure_for_tests() -> Self {
        Self { memory_kib: 64, iterations: 1, parallelism: 1 }
    }

    /// The most memory a key file may ask for: 1 GiB, half the agent's default memory limit
    /// (a hostile key file must not get the agent killed for memory), 16 times the default.
    pub const MAX_MEMORY_KIB: u32 = 1024 * 1024;
    /// The most passes a key file may ask for (bounds the time one key file costs).
    pub const MAX_ITERATIONS: u32 = 64;

    fn derive(&self, password: &[u8], salt: &[u8]) -> Result<[u8; 32], FormatError> {
        let invalid = |reason: String| FormatError::Invalid { what: "argon2 parameters", reason };
        if self.memory_kib > Self::MAX_MEMORY_KIB || self.iterations > Self::MAX_ITERATIONS {
            return Err(invalid(format!("{self:?} exceeds the accepted maximum")));
        }
        let params =
            argon2::Params::new(self.memory_kib, self.iterations, self.parallelism, Some(32))
                .map_err(|e| invalid(e.to_string()))?;
        let argon =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = [0u8; 32];
        argon.hash_password_into(password, salt, &mut out).map_err(|e| invalid(e.to_string()))?;
        Ok(out)
    }
}

/// How a key file protects the master secret. A separate layer, so that a KMS-held key can be
/// added as another variant without touching anything else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyWrap {
    /// Wrapped by a key derived from a password with argon2id.
    Password {
        /// argon2id costs.
        kdf: KdfParams,
        /// Random salt.
        salt: [u8; 32],
        /// `nonce || ciphertext || tag` of the 32-byte master secret.
        sealed: Vec<u8>,
    },
}

/// A key file, stored plaintext (its secret part is wrapped) as
/// `[version][kind] || postcard(KeyFile)` under `keys/<BLAKE3 of the bytes>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyFile {
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: i64,
    /// Host that wrote it.
    pub hostname: String,
    /// The wrapped master secret.
    pub wrap: KeyWrap,
}

fn wrap_ad(kdf: &KdfParams, salt: &[u8; 32]) -> Vec<u8> {
    let mut identity = encode_body(kdf);
    identity.extend_from_slice(salt);
    associated_data(ObjectKind::KeyFile, &identity)
}

impl KeyFile {
    /// Wraps `master` under `password`.
    ///
    /// # Errors
    /// Invalid argon2 parameters.
    pub fn wrap_with_password(
        master: &MasterKey,
        password: &[u8],
        kdf: KdfParams,
        hostname: String,
        created_unix: i64,
    ) -> Result<Self, FormatError> {
        let mut salt = [0u8; 32];
        rand::rng().fill_bytes(&mut salt);
        let kek = kdf.derive(password, &salt)?;
        let mut sealed = Vec::new();
        Cipher::new(&kek).seal_append(&mut sealed, &wrap_ad(&kdf, &salt), master.secret());
        Ok(Self { created_unix, hostname, wrap: KeyWrap::Password { kdf, salt, sealed } })
    }

    /// Unwraps the master key with `password`.
    ///
    /// # Errors
    /// [`FormatError::Authentication`] for a wrong password (or a damaged key file).
    pub fn unwrap_with_password(&self, password: &[u8]) -> Result<MasterKey, FormatError> {
        match &self.wrap {
            KeyWrap::Password { kdf, salt, sealed } => {
                let kek = kdf.derive(password, salt)?;
                let secret = Cipher::new(&kek).open(&wrap_ad(kdf, salt), sealed)?;
                let secret: [u8; 32] = secret.try_into().map_err(|_| FormatError::Invalid {
                    what: "key file",
                    reason: "wrapped secret is not 32 bytes".into(),
                })?;
                Ok(MasterKey::from_secret(secret))
            }
        }
    }

    /// The stored form.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT_VERSION, ObjectKind::KeyFile as u8];
        out.extend_from_slice(&encode_body(self));
        out
    }

    /// Parses the stored form.
    ///
    /// # Errors
    /// Any [`FormatError`]; never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        decode_body("key file", split_prefix(bytes, ObjectKind::KeyFile)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tiny() -> KdfParams {
        KdfParams::insecure_for_tests()
    }

    #[test]
    fn right_password_unwraps_and_wrong_one_fails() -> Result<(), FormatError> {
        let master = MasterKey::generate();
        let file = KeyFile::wrap_with_password(&master, b"pw", tiny(), "h".into(), 5)?;
        let decoded = KeyFile::decode(&file.encode())?;
        assert_eq!(decoded, file);
        assert_eq!(decoded.unwrap_with_password(b"pw")?, master);
        assert!(matches!(decoded.unwrap_with_password(b"pW"), Err(FormatError::Authentication)));
        Ok(())
    }

    #[test]
    fn tampered_params_fail_authentication() -> Result<(), FormatError> {
        let master = MasterKey::generate();
        let mut file = KeyFile::wrap_with_password(&master, b"pw", tiny(), "h".into(), 5)?;
        let KeyWrap::Password { kdf, .. } = &mut file.wrap;
        kdf.iterations = 2;
        assert!(file.unwrap_with_password(b"pw").is_err());
        Ok(())
    }

    #[test]
    fn derived_keys_differ_per_master_and_are_stable() {
        let m = MasterKey::from_secret([9; 32]);
        let a = m.derive();
        let b = m.derive();
        assert_eq!(a.blob_id(b"x"), b.blob_id(b"x"));
        assert_eq!(a.gear(), b.gear());
        let other = MasterKey::from_secret([8; 32]).derive();
        assert_ne!(a.blob_id(b"x"), other.blob_id(b"x"));
        assert_ne!(a.gear(), other.gear());
    }

    #[test]
    fn hostile_costs_are_refused_before_work() {
        let huge = KdfParams { memory_kib: u32::MAX, iterations: 1, parallelism: 1 };
        assert!(huge.derive(b"p", &[0; 32]).is_err());
        // Over the agent's share of memory: refused without allocating it.
        let over = KdfParams { memory_kib: 2 * 1024 * 1024, iterations: 1, parallelism: 1 };
        let refused = over.derive(b"p", &[0; 32]).expect_err("2 GiB");
        assert!(refused.to_string().contains("exceeds the accepted maximum"), "{refused}");
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = KeyFile::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_after_prefix(mut bytes in proptest::collection::vec(any::<u8>(), 2..200)) {
            bytes[0] = FORMAT_VERSION;
            bytes[1] = ObjectKind::KeyFile as u8;
            if let Ok(file) = KeyFile::decode(&bytes) {
                // Hostile costs must be refused rather than computed for long.
                let KeyWrap::Password { kdf, .. } = &file.wrap;
                if kdf.memory_kib <= 1024 && kdf.iterations <= 2 {
                    let _ = file.unwrap_with_password(b"x");
                }
            }
        }
    }
}
