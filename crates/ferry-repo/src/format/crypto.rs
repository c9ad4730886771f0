//! Authenticated encryption of stored bytes: XChaCha20-Poly1305 with random 192-bit nonces.
//!
//! Random nonces of 192 bits may be drawn independently by any number of concurrent writers
//! under one key without coordination (the collision bound stays negligible far beyond 2^64
//! messages), which is what a repository shared by many agents needs.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{Tag, XChaCha20Poly1305, XNonce};
use rand::RngCore;

use crate::format::FormatError;

/// Bytes of nonce in front of every ciphertext.
pub const NONCE_LEN: usize = 24;
/// Bytes of authentication tag after every ciphertext.
pub const TAG_LEN: usize = 16;

/// One AEAD key. Cheap to clone.
#[derive(Clone)]
pub struct Cipher {
    aead: XChaCha20Poly1305,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher(..)")
    }
}

impl Cipher {
    /// A cipher under a 256-bit key.
    #[must_use]
    pub fn new(key: &[u8; 32]) -> Self {
        Self { aead: XChaCha20Poly1305::new(key.into()) }
    }

    /// Appends `nonce || ciphertext || tag` of `plaintext` to `out`.
    pub fn seal_append(&self, out: &mut Vec<u8>, ad: &[u8], plaintext: &[u8]) {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        out.reserve(NONCE_LEN + plaintext.len() + TAG_LEN);
        out.extend_from_slice(&nonce);
        let start = out.len();
        out.extend_from_slice(plaintext);
        // Encryption fails only for messages longer than the cipher's 2^38-byte limit, which
        // no caller produces (objects are bounded far below); keep the output well-formed
        // regardless by writing a zero tag that will never authenticate.
        let tag = self
            .aead
            .encrypt_in_place_detached(XNonce::from_slice(&nonce), ad, &mut out[start..])
            .unwrap_or_default();
        out.extend_from_slice(&tag);
    }

    /// Authenticates and decrypts `nonce || ciphertext || tag`.
    ///
    /// # Errors
    /// [`FormatError::Truncated`] for input shorter than nonce and tag,
    /// [`FormatError::Authentication`] when the bytes or `ad` differ from what was sealed.
    pub fn open(&self, ad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, FormatError> {
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(FormatError::Truncated { what: "ciphertext", len: sealed.len() });
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let (ciphertext, tag) = rest.split_at(rest.len() - TAG_LEN);
        let mut buf = ciphertext.to_vec();
        self.aead
            .decrypt_in_place_detached(
                XNonce::from_slice(nonce),
                ad,
                &mut buf,
                Tag::from_slice(tag),
            )
            .map_err(|_| FormatError::Authentication)?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn seal_open_round_trip(key in any::<[u8; 32]>(), ad in proptest::collection::vec(any::<u8>(), 0..40),
                                data in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let c = Cipher::new(&key);
            let mut out = Vec::new();
            c.seal_append(&mut out, &ad, &data);
            prop_assert_eq!(out.len(), data.len() + NONCE_LEN + TAG_LEN);
            prop_assert_eq!(c.open(&ad, &out).ok(), Some(data));
        }

        #[test]
        fn any_flipped_bit_is_rejected(data in proptest::collection::vec(any::<u8>(), 1..300),
                                       pos in any::<prop::sample::Index>(), bit in 0u8..8) {
            let c = Cipher::new(&[7; 32]);
            let mut out = Vec::new();
            c.seal_append(&mut out, b"ad", &data);
            let i = pos.index(out.len());
            out[i] ^= 1 << bit;
            prop_assert!(matches!(c.open(b"ad", &out), Err(FormatError::Authentication)));
        }

        #[test]
        fn open_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Cipher::new(&[1; 32]).open(b"", &bytes);
        }
    }

    #[test]
    fn other_associated_data_is_rejected() {
        let c = Cipher::new(&[3; 32]);
        let mut out = Vec::new();
        c.seal_append(&mut out, b"snapshot", b"payload");
        assert!(matches!(c.open(b"index", &out), Err(FormatError::Authentication)));
        assert!(matches!(
            Cipher::new(&[4; 32]).open(b"snapshot", &out),
            Err(FormatError::Authentication)
        ));
    }
}
