//! The key hierarchy: a random master secret, the keys derived from it, and key files that
//! hold the master secret wrapped by a password-derived key, optionally encrypted again by a
//! KMS-held key.
//!
//! ```text
//! password --argon2id(salt, params)--> KEK --XChaCha20-Poly1305--> sealed master secret
//!     sealed --(optional) KMS Encrypt, context KMS_CONTEXT--> kms_blob      (keys/<id>)
//! master secret --BLAKE3 derive_key--> object encryption key
//!                                  --> chunk id key (keyed BLAKE3)
//!                                  --> chunker gear table (keyed FastCDC boundaries)
//! ```
//!
//! Changing a password adds a key file wrapping the same master secret; no data is rewritten.
//! The KMS call itself is not made here (this module does no I/O): [`PasswordSeal`] is what
//! goes to the KMS, and [`KeyFile::kms_layer`] what comes back from it.

use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::format::{
    BlobId, Cipher, FORMAT_VERSION, FormatError, ObjectKind, PrfCut, associated_data, decode_body,
    encode_body, split_prefix,
};

const CONTEXT_ENCRYPTION: &str = "ferry repository 2025-06 object encryption key v1";
const CONTEXT_ID: &str = "ferry repository 2025-06 blob id key v1";
const CONTEXT_CHUNKER: &str = "ferry repository 2025-06 chunker gear table v1";
const CONTEXT_WINDOW_TABLE: &str = "ferry repository 2026-11 chunker window table v2";
const CONTEXT_CUT_PRF: &str = "ferry repository 2026-11 chunker cut prf key v2";

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
        let gear = table(&blake3::derive_key(CONTEXT_CHUNKER, &self.secret));
        let window = table(&blake3::derive_key(CONTEXT_WINDOW_TABLE, &self.secret));
        let cut_key = blake3::derive_key(CONTEXT_CUT_PRF, &self.secret);
        let mut prf_key = [0u8; 16];
        prf_key.copy_from_slice(&cut_key[..16]);
        RepoKeys {
            cipher: Cipher::new(&enc),
            id_key,
            gear: Box::new(gear),
            prf_cut: PrfCut::new(&window, &prf_key),
        }
    }
}

/// 256 secret 64-bit values: the BLAKE3 output stream keyed by `key`, little-endian.
pub(crate) fn table(key: &[u8; 32]) -> [u64; 256] {
    let mut bytes = [0u8; 256 * 8];
    blake3::Hasher::new_keyed(key).finalize_xof().fill(&mut bytes);
    let mut out = [0u64; 256];
    for (slot, chunk) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        *slot = u64::from_le_bytes(b);
    }
    out
}

/// The keys a repository works with, derived from the [`MasterKey`].
#[derive(Clone)]
pub struct RepoKeys {
    /// Encrypts every stored object and blob.
    pub cipher: Cipher,
    id_key: [u8; 32],
    gear: Box<[u64; 256]>,
    prf_cut: PrfCut,
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

    /// The repository's secret cut decision for format 2's chunker.
    #[must_use]
    pub fn prf_cut(&self) -> &PrfCut {
        &self.prf_cut
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

    /// The most memory a key file may ask for: 1 GiB, 16 times the default, and never more
    /// than a quarter of the process's memory limit ([`Self::max_memory_kib`]): a hostile key
    /// file must not get the agent killed for memory.
    pub const MAX_MEMORY_KIB: u32 = 1024 * 1024;

    /// The most memory a key file may ask for under a memory limit of `limit_bytes` (`None`:
    /// none): [`Self::MAX_MEMORY_KIB`], at most a quarter of the limit, at least the default
    /// (every key file Ferry writes opens wherever it runs at all).
    #[must_use]
    pub fn max_memory_kib(limit_bytes: Option<u64>) -> u32 {
        let default = Self::default().memory_kib;
        limit_bytes.map_or(Self::MAX_MEMORY_KIB, |bytes| {
            let quarter = u32::try_from(bytes / 4 / 1024).unwrap_or(u32::MAX);
            quarter.clamp(default, Self::MAX_MEMORY_KIB)
        })
    }

    /// The most passes a key file may ask for (bounds the time one key file costs).
    pub const MAX_ITERATIONS: u32 = 64;

    fn derive(&self, password: &[u8], salt: &[u8]) -> Result<[u8; 32], FormatError> {
        let invalid = |reason: String| FormatError::Invalid { what: "argon2 parameters", reason };
        if self.memory_kib > Self::MAX_MEMORY_KIB || self.iterations > Self::MAX_ITERATIONS {
            return Err(invalid(format!("{self:?} exceeds the accepted maximum")));
        }
        let limit = crate::thread_budget::process_memory_limit();
        let allowed = Self::max_memory_kib(limit.as_ref().map(|l| l.bytes));
        if self.memory_kib > allowed {
            let limit = limit.map(|l| format!("{} MiB ({})", l.bytes >> 20, l.file.display()));
            return Err(invalid(format!(
                "{self:?} asks for {} MiB, more than a quarter of this process's memory limit \
                 of {} allows",
                self.memory_kib >> 10,
                limit.unwrap_or_default()
            )));
        }
        // Derivations asking more than the default run one at a time: several hostile key
        // files opened at once (repositories of several namespaces) cannot add up.
        let _one_at_a_time = (self.memory_kib > Self::default().memory_kib)
            .then(|| LARGE_DERIVATIONS.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
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

/// Held by a key derivation that asks for more memory than the default (see
/// [`KdfParams::derive`]).
static LARGE_DERIVATIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The encryption context of every KMS wrap of a key file: the KMS binds it to the blob, so a
/// blob wrapped by the same key for anything else does not unwrap as a key file.
pub const KMS_CONTEXT: &[(&str, &str)] = &[("ferry:purpose", "repository key file")];

/// The longest KMS key id a key file may name (AWS's limit for a `KeyId`).
pub const MAX_KMS_KEY_ID_BYTES: usize = 2048;

/// The largest KMS ciphertext a key file may hold (AWS's limit for a `CiphertextBlob`).
pub const MAX_KMS_BLOB_BYTES: usize = 6144;

/// Appended to the associated data of a password seal that a KMS layer covers, so that a seal
/// taken out of a KMS key file (by someone who could call the KMS once) does not open as a
/// password-only key file.
const KMS_LAYER_TAG: &[u8] = b"kms layer";

/// How a key file protects the master secret. A separate layer: each variant is one way of
/// wrapping the same master secret, and a repository may have key files of both.
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
    /// Sealed under a password as [`KeyWrap::Password`] is, then encrypted by a KMS key:
    /// opening needs the password and the KMS's permission to decrypt with that key.
    PasswordAndKms {
        /// argon2id costs.
        kdf: KdfParams,
        /// Random salt.
        salt: [u8; 32],
        /// The KMS key that encrypted `kms_blob`, as the KMS named it (for AWS the key ARN);
        /// in clear, so a reader can say which key it needs.
        kms_key_id: String,
        /// The KMS ciphertext (authenticated by the KMS, with [`KMS_CONTEXT`]) of the password
        /// seal: `nonce || ciphertext || tag` of the master secret.
        kms_blob: Vec<u8>,
    },
}

/// The password layer of a KMS-wrapped key file: what goes to the KMS
/// ([`KeyFile::seal_for_kms`]), and what the finished key file is made of
/// ([`PasswordSeal::into_key_file`]).
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordSeal {
    /// argon2id costs.
    pub kdf: KdfParams,
    /// Random salt.
    pub salt: [u8; 32],
    /// `nonce || ciphertext || tag` of the master secret: the plaintext given to the KMS.
    pub sealed: Vec<u8>,
}

impl std::fmt::Debug for PasswordSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordSeal").field("kdf", &self.kdf).finish_non_exhaustive()
    }
}

impl PasswordSeal {
    /// The key file holding this seal encrypted by the KMS key `kms_key_id` as `kms_blob`.
    ///
    /// # Errors
    /// [`FormatError::Invalid`] for a key id or blob a reader would refuse (empty, too long,
    /// a key id with spaces or control characters).
    pub fn into_key_file(
        self,
        kms_key_id: String,
        kms_blob: Vec<u8>,
        hostname: String,
        created_unix: i64,
    ) -> Result<KeyFile, FormatError> {
        let Self { kdf, salt, .. } = self;
        let wrap = KeyWrap::PasswordAndKms { kdf, salt, kms_key_id, kms_blob };
        let file = KeyFile { created_unix, hostname, wrap };
        file.validate()?;
        Ok(file)
    }
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

/// What the password seal authenticates: the costs and salt (so tampering with them fails),
/// and for a seal under a KMS layer, that tag (postcard's encoding of `kdf` delimits itself and
/// the salt is 32 bytes, so the tag cannot be confused with either).
fn wrap_ad(kdf: &KdfParams, salt: &[u8; 32], under_kms: bool) -> Vec<u8> {
    let mut identity = encode_body(kdf);
    identity.extend_from_slice(salt);
    if under_kms {
        identity.extend_from_slice(KMS_LAYER_TAG);
    }
    associated_data(ObjectKind::KeyFile, &identity)
}

/// Seals `master` under `password` with a fresh salt.
fn seal(
    master: &MasterKey,
    password: &[u8],
    kdf: KdfParams,
    under_kms: bool,
) -> Result<PasswordSeal, FormatError> {
    let mut salt = [0u8; 32];
    rand::rng().fill_bytes(&mut salt);
    let kek = kdf.derive(password, &salt)?;
    let mut sealed = Vec::new();
    Cipher::new(&kek).seal_append(&mut sealed, &wrap_ad(&kdf, &salt, under_kms), master.secret());
    Ok(PasswordSeal { kdf, salt, sealed })
}

/// Opens a password seal.
fn open_seal(
    kdf: &KdfParams,
    salt: &[u8; 32],
    under_kms: bool,
    sealed: &[u8],
    password: &[u8],
) -> Result<MasterKey, FormatError> {
    let kek = kdf.derive(password, salt)?;
    let secret = Cipher::new(&kek).open(&wrap_ad(kdf, salt, under_kms), sealed)?;
    let secret: [u8; 32] = secret.try_into().map_err(|_| FormatError::Invalid {
        what: "key file",
        reason: "wrapped secret is not 32 bytes".into(),
    })?;
    Ok(MasterKey::from_secret(secret))
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
        let PasswordSeal { kdf, salt, sealed } = seal(master, password, kdf, false)?;
        Ok(Self { created_unix, hostname, wrap: KeyWrap::Password { kdf, salt, sealed } })
    }

    /// Seals `master` under `password` for a KMS to encrypt: give [`PasswordSeal::sealed`] to
    /// the KMS with [`KMS_CONTEXT`], then [`PasswordSeal::into_key_file`] its answer.
    ///
    /// # Errors
    /// Invalid argon2 parameters.
    pub fn seal_for_kms(
        master: &MasterKey,
        password: &[u8],
        kdf: KdfParams,
    ) -> Result<PasswordSeal, FormatError> {
        seal(master, password, kdf, true)
    }

    /// The KMS key and ciphertext of a KMS-wrapped key file, `None` for a password-only one.
    #[must_use]
    pub fn kms_layer(&self) -> Option<(&str, &[u8])> {
        match &self.wrap {
            KeyWrap::Password { .. } => None,
            KeyWrap::PasswordAndKms { kms_key_id, kms_blob, .. } => Some((kms_key_id, kms_blob)),
        }
    }

    /// The argon2id costs of its password.
    #[must_use]
    pub fn kdf(&self) -> &KdfParams {
        match &self.wrap {
            KeyWrap::Password { kdf, .. } | KeyWrap::PasswordAndKms { kdf, .. } => kdf,
        }
    }

    /// Unwraps the master key of a password-only key file with `password`.
    ///
    /// # Errors
    /// [`FormatError::Authentication`] for a wrong password (or a damaged key file);
    /// [`FormatError::Invalid`] for a KMS-wrapped key file (see
    /// [`KeyFile::unwrap_after_kms`]).
    pub fn unwrap_with_password(&self, password: &[u8]) -> Result<MasterKey, FormatError> {
        match &self.wrap {
            KeyWrap::Password { kdf, salt, sealed } => {
                open_seal(kdf, salt, false, sealed, password)
            }
            KeyWrap::PasswordAndKms { kms_key_id, .. } => Err(FormatError::Invalid {
                what: "key file",
                reason: format!("it opens only through KMS key {kms_key_id}"),
            }),
        }
    }

    /// Unwraps the master key of a KMS-wrapped key file: `sealed` is what the KMS decrypted
    /// [`KeyFile::kms_layer`]'s blob to, `password` opens it.
    ///
    /// # Errors
    /// [`FormatError::Authentication`] for a wrong password (or a damaged key file);
    /// [`FormatError::Invalid`] for a password-only key file.
    pub fn unwrap_after_kms(
        &self,
        sealed: &[u8],
        password: &[u8],
    ) -> Result<MasterKey, FormatError> {
        match &self.wrap {
            KeyWrap::PasswordAndKms { kdf, salt, .. } => {
                open_seal(kdf, salt, true, sealed, password)
            }
            KeyWrap::Password { .. } => Err(FormatError::Invalid {
                what: "key file",
                reason: "it is not wrapped by a KMS".into(),
            }),
        }
    }

    /// Checks what decoding alone does not: a KMS key id and blob a reader can use and print.
    fn validate(&self) -> Result<(), FormatError> {
        let KeyWrap::PasswordAndKms { kms_key_id, kms_blob, .. } = &self.wrap else {
            return Ok(());
        };
        let invalid = |reason: String| Err(FormatError::Invalid { what: "key file", reason });
        if kms_key_id.is_empty()
            || kms_key_id.len() > MAX_KMS_KEY_ID_BYTES
            || !kms_key_id.bytes().all(|b| b.is_ascii_graphic())
        {
            return invalid(format!(
                "KMS key id of {} bytes: not 1 to {MAX_KMS_KEY_ID_BYTES} printable ASCII \
                 characters without spaces",
                kms_key_id.len()
            ));
        }
        if kms_blob.is_empty() || kms_blob.len() > MAX_KMS_BLOB_BYTES {
            return invalid(format!(
                "KMS ciphertext of {} bytes: not 1 to {MAX_KMS_BLOB_BYTES}",
                kms_blob.len()
            ));
        }
        Ok(())
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
        let file: Self = decode_body("key file", split_prefix(bytes, ObjectKind::KeyFile)?)?;
        file.validate()?;
        Ok(file)
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
        let KeyWrap::Password { kdf, .. } = &mut file.wrap else { panic!("a password key") };
        kdf.iterations = 2;
        assert!(file.unwrap_with_password(b"pw").is_err());
        Ok(())
    }

    /// A stand-in KMS layer: the blob is the seal itself (the real KMS is in the repository
    /// tests), so the password layer can be checked alone.
    fn kms_file(master: &MasterKey, password: &[u8]) -> Result<(KeyFile, Vec<u8>), FormatError> {
        let seal = KeyFile::seal_for_kms(master, password, tiny())?;
        let sealed = seal.sealed.clone();
        let key_id = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab";
        let file = seal.into_key_file(key_id.into(), sealed.clone(), "h".into(), 5)?;
        Ok((file, sealed))
    }

    #[test]
    fn a_key_file_written_before_kms_existed_reads_bit_for_bit() -> Result<(), FormatError> {
        // The committed fixture repository's key file (crates/ferry/tests/fixtures/repos).
        let bytes = include_bytes!(
            "../../../ferry/tests/fixtures/repos/good/repo/keys/\
             1d479dce3066940a9ae0c08cb834674a941c0fe6cd8607721b271ecaf0972f06"
        );
        let file = KeyFile::decode(bytes)?;
        assert!(matches!(file.wrap, KeyWrap::Password { .. }) && file.kms_layer().is_none());
        assert_eq!(file.encode(), bytes, "re-encodes to the same bytes");
        file.unwrap_with_password(b"ferry-fixture-password")?;
        Ok(())
    }

    #[test]
    fn a_kms_key_file_needs_the_kms_plaintext_and_the_password() -> Result<(), FormatError> {
        let master = MasterKey::generate();
        let (file, sealed) = kms_file(&master, b"pw")?;
        let decoded = KeyFile::decode(&file.encode())?;
        assert_eq!(decoded, file);
        let (key_id, blob) = decoded.kms_layer().expect("a KMS layer");
        assert!(key_id.starts_with("arn:aws:kms:eu-west-1:") && blob == sealed.as_slice());
        assert_eq!(decoded.kdf(), &tiny());
        assert_eq!(decoded.unwrap_after_kms(&sealed, b"pw")?, master);
        assert!(matches!(
            decoded.unwrap_after_kms(&sealed, b"pW"),
            Err(FormatError::Authentication)
        ));
        let refused = decoded.unwrap_with_password(b"pw").expect_err("needs the KMS");
        assert!(refused.to_string().contains(key_id), "{refused}");
        let password_only = KeyFile::wrap_with_password(&master, b"pw", tiny(), "h".into(), 5)?;
        assert!(password_only.unwrap_after_kms(&sealed, b"pw").is_err());
        Ok(())
    }

    #[test]
    fn a_seal_moved_between_variants_does_not_open() -> Result<(), FormatError> {
        let master = MasterKey::generate();
        // Out of a KMS key file (by someone who could call the KMS once) into a password-only
        // one: refused, so losing KMS access keeps its meaning.
        let (file, sealed) = kms_file(&master, b"pw")?;
        let KeyWrap::PasswordAndKms { kdf, salt, .. } = file.wrap.clone() else {
            panic!("a KMS key")
        };
        let downgraded =
            KeyFile { wrap: KeyWrap::Password { kdf, salt, sealed: sealed.clone() }, ..file };
        let decoded = KeyFile::decode(&downgraded.encode())?;
        assert!(matches!(decoded.unwrap_with_password(b"pw"), Err(FormatError::Authentication)));
        // And a password-only seal put under a KMS layer.
        let plain = KeyFile::wrap_with_password(&master, b"pw", tiny(), "h".into(), 5)?;
        let KeyWrap::Password { kdf, salt, sealed } = plain.wrap else { panic!("a password key") };
        let upgraded = PasswordSeal { kdf, salt, sealed: sealed.clone() }.into_key_file(
            "alias/x".into(),
            sealed.clone(),
            "h".into(),
            5,
        )?;
        assert!(matches!(
            upgraded.unwrap_after_kms(&sealed, b"pw"),
            Err(FormatError::Authentication)
        ));
        Ok(())
    }

    #[test]
    fn tampered_params_of_a_kms_key_file_fail_authentication() -> Result<(), FormatError> {
        let master = MasterKey::generate();
        let (mut file, sealed) = kms_file(&master, b"pw")?;
        let KeyWrap::PasswordAndKms { salt, .. } = &mut file.wrap else { panic!("a KMS key") };
        salt[0] ^= 1;
        assert!(matches!(file.unwrap_after_kms(&sealed, b"pw"), Err(FormatError::Authentication)));
        Ok(())
    }

    #[test]
    fn unusable_kms_key_ids_and_blobs_are_refused_on_write_and_read() -> Result<(), FormatError> {
        let master = MasterKey::generate();
        let (file, sealed) = kms_file(&master, b"pw")?;
        let long = "k".repeat(MAX_KMS_KEY_ID_BYTES + 1);
        let bad_ids = ["", "alias/with space", "key\u{1b}[31m", "clé", long.as_str()];
        for bad in bad_ids {
            let seal = KeyFile::seal_for_kms(&master, b"pw", tiny())?;
            assert!(seal.into_key_file(bad.into(), sealed.clone(), "h".into(), 5).is_err());
            let mut forged = file.clone();
            let KeyWrap::PasswordAndKms { kms_key_id, .. } = &mut forged.wrap else {
                panic!("a KMS key")
            };
            *kms_key_id = bad.into();
            assert!(KeyFile::decode(&forged.encode()).is_err(), "{bad:?}");
        }
        for bad in [Vec::new(), vec![0; MAX_KMS_BLOB_BYTES + 1]] {
            let seal = KeyFile::seal_for_kms(&master, b"pw", tiny())?;
            assert!(seal.into_key_file("alias/x".into(), bad.clone(), "h".into(), 5).is_err());
            let mut forged = file.clone();
            let KeyWrap::PasswordAndKms { kms_blob, .. } = &mut forged.wrap else {
                panic!("a KMS key")
            };
            *kms_blob = bad;
            assert!(KeyFile::decode(&forged.encode()).is_err());
        }
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

    #[test]
    fn a_key_file_may_ask_a_quarter_of_the_memory_limit_at_most() {
        const GIB: u64 = 1 << 30;
        let max = KdfParams::max_memory_kib;
        assert_eq!(max(None), KdfParams::MAX_MEMORY_KIB, "no limit: 1 GiB");
        assert_eq!(max(Some(64 * GIB)), KdfParams::MAX_MEMORY_KIB, "1 GiB at most");
        assert_eq!(max(Some(2 * GIB)), 512 * 1024, "the agent's default limit: 512 MiB");
        let default = KdfParams::default().memory_kib;
        assert_eq!(max(Some(64 << 20)), default, "never below what Ferry writes");
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
                let kdf = file.kdf();
                if kdf.memory_kib <= 1024 && kdf.iterations <= 2 {
                    let _ = file.unwrap_with_password(b"x");
                    let _ = file.unwrap_after_kms(b"x", b"x");
                }
                assert_eq!(KeyFile::decode(&file.encode()).ok(), Some(file));
            }
        }

        #[test]
        fn kms_key_files_round_trip(
            key_id in "[!-~]{1,300}",
            blob in proptest::collection::vec(any::<u8>(), 1..700),
            hostname in ".{0,40}",
            created_unix in any::<i64>(),
            memory_kib in any::<u32>(),
            iterations in any::<u32>(),
            salt in any::<[u8; 32]>(),
        ) {
            let kdf = KdfParams { memory_kib, iterations, parallelism: 1 };
            let seal = PasswordSeal { kdf, salt, sealed: Vec::new() };
            let file = seal.into_key_file(key_id.clone(), blob.clone(), hostname, created_unix)
                .expect("a valid KMS key file");
            let decoded = KeyFile::decode(&file.encode()).expect("decodes");
            prop_assert_eq!(decoded.kms_layer(), Some((key_id.as_str(), blob.as_slice())));
            prop_assert_eq!(decoded, file);
        }
    }
}
