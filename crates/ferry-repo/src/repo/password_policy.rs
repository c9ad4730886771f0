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

/// Why `password` must not key a new repository, or `None` when it may.
#[must_use]
pub fn weak_password_reason(password: &[u8]) -> Option<String> {
    const HOW: &str = "choose a random one, e.g. `openssl rand -hex 32`";
    if password == VELERO_DEFAULT_PASSWORD {
        return Some(format!(
            "refusing to create a repository with Velero's published default password; {HOW}"
        ));
    }
    if password.len() < MIN_PASSWORD_LEN {
        return Some(format!(
            "refusing to create a repository with a password of {} bytes (at least \
             {MIN_PASSWORD_LEN}); {HOW}",
            password.len()
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_published_passwords_are_refused() {
        assert!(weak_password_reason(b"static-passw0rd").is_some_and(|r| r.contains("Velero")));
        assert!(weak_password_reason(&[b'x'; 15]).is_some_and(|r| r.contains("15 bytes")));
        assert_eq!(weak_password_reason(&[b'x'; 16]), None);
    }
}
