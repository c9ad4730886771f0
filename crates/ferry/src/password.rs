//! Where the repository password comes from.

use std::path::Path;

use anyhow::{Context, bail};

/// The password from `--password-file` (trailing newline removed) or `FERRY_PASSWORD`.
///
/// # Errors
/// Neither is given, the file is unreadable, or the password is empty.
pub fn read(file: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    read_from(file, "FERRY_PASSWORD", "--password-file", "password")
}

/// A new password from `--new-password-file` or `FERRY_NEW_PASSWORD`, as [`read`].
///
/// # Errors
/// As [`read`].
pub fn read_new(file: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    read_from(file, "FERRY_NEW_PASSWORD", "--new-password-file", "new password")
}

fn read_from(file: Option<&Path>, env: &str, flag: &str, what: &str) -> anyhow::Result<Vec<u8>> {
    let password = match file {
        Some(path) => {
            let mut bytes = std::fs::read(path)
                .with_context(|| format!("reading {what} file {}", path.display()))?;
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            bytes
        }
        None => match std::env::var_os(env) {
            Some(p) => p.into_encoded_bytes(),
            None => bail!("no {what}: set {env} or pass {flag}"),
        },
    };
    if password.is_empty() {
        bail!("the {what} is empty");
    }
    Ok(password)
}
