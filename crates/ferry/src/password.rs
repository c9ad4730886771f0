//! Where the repository password comes from.

use std::path::Path;

use anyhow::{Context, bail};

/// The password from `--password-file` (trailing newline removed) or `FERRY_PASSWORD`.
///
/// # Errors
/// Neither is given, the file is unreadable, or the password is empty.
pub fn read(file: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    let password = match file {
        Some(path) => {
            let mut bytes = std::fs::read(path)
                .with_context(|| format!("reading password file {}", path.display()))?;
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            bytes
        }
        None => match std::env::var_os("FERRY_PASSWORD") {
            Some(p) => p.into_encoded_bytes(),
            None => bail!("no password: set FERRY_PASSWORD or pass --password-file"),
        },
    };
    if password.is_empty() {
        bail!("the password is empty");
    }
    Ok(password)
}
