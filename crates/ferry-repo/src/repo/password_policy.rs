//! Which passwords a new repository may be created with.
//!
//! A repository's password is the only secret between its bytes and anyone who can read the
//! bucket, so creating one with a short password, or with Velero's published default (the
//! value Velero's server writes into `velero-repo-credentials` when nobody made that secret
//! first), is refused. Opening an existing repository with such a password stays possible:
//! the way out is `ferry repo passwd`, which needs it.

/// The fewest bytes a new repository's password may have.
pub const MIN_PASSWORD_LEN: usize = 16;

/// The repository password Velero's server publishes as its default.
pub const VELERO_DEFAULT_PASSWORD: &[u8] = b"static-passw0rd";

/// What makes a password too weak to key a repository. Its text names the password ("a
/// password of 15 bytes (at least 16)"); each caller says what it refuses to do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WeakPassword {
    /// Velero's published default, [`VELERO_DEFAULT_PASSWORD`].
    #[error("Velero's published default password")]
    VeleroDefault,
    /// Fewer than [`MIN_PASSWORD_LEN`] bytes.
    #[error("a password of {len} bytes (at least {MIN_PASSWORD_LEN})")]
    TooShort {
        /// Its length in bytes.
        len: usize,
    },
}

impl WeakPassword {
    /// What to do instead, for the end of a message.
    pub const ADVICE: &'static str = "choose a random one, e.g. `openssl rand -hex 32`";
}

/// Why `password` must not key a repository, or `None` when it may.
#[must_use]
pub fn weak_password(password: &[u8]) -> Option<WeakPassword> {
    if password == VELERO_DEFAULT_PASSWORD {
        Some(WeakPassword::VeleroDefault)
    } else if password.len() < MIN_PASSWORD_LEN {
        Some(WeakPassword::TooShort { len: password.len() })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_published_passwords_are_refused() {
        assert_eq!(weak_password(b"static-passw0rd"), Some(WeakPassword::VeleroDefault));
        assert_eq!(weak_password(&[b'x'; 15]), Some(WeakPassword::TooShort { len: 15 }));
        assert_eq!(
            WeakPassword::TooShort { len: 15 }.to_string(),
            "a password of 15 bytes (at least 16)"
        );
        assert_eq!(weak_password(&[b'x'; 16]), None);
    }
}
