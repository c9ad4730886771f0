//! Ferry's container image, made without a registry or a container engine: the `ferry` binary
//! at `/ferry` with the shared libraries it links and a CA bundle, as the Dockerfile's image
//! has them (`ENTRYPOINT ["/ferry"]`, `CMD ["agent"]`; holding pods run `/ferry hold`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::paths;

/// The CA bundle copied into the image (the Dockerfile's base image has one too).
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// An OCI image archive of `binary` written into `out_dir`, and the image's name
/// (`ferry.local/ferry:<12 hex digits of the binary's SHA-256>`).
///
/// # Errors
/// The binary is unreadable, `ldd` or the packer failed.
pub fn ferry_image(binary: &Path, out_dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let tag = hex::encode(&Sha256::digest(&bytes)[..6]);
    let name = format!("ferry.local/ferry:{tag}");
    let rootfs = tempfile::Builder::new().prefix("ferry-image-").tempdir_in(out_dir)?;
    let root = rootfs.path();
    std::fs::create_dir_all(root.join("tmp")).context("making the image's /tmp")?;
    std::fs::copy(binary, root.join("ferry"))
        .with_context(|| format!("copying {} into the image", binary.display()))?;
    for lib in linked_libraries(binary)? {
        let dest = root.join(lib.strip_prefix("/").unwrap_or(&lib));
        std::fs::create_dir_all(dest.parent().unwrap_or(root))
            .with_context(|| format!("making {}", dest.display()))?;
        // Follows symbolic links: the image holds the library under the name the loader asks for.
        std::fs::copy(&lib, &dest).with_context(|| format!("copying {}", lib.display()))?;
    }
    if Path::new(CA_BUNDLE).is_file() {
        let dest = root.join(CA_BUNDLE.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap_or(root))
            .with_context(|| format!("making {}", dest.display()))?;
        std::fs::copy(CA_BUNDLE, &dest).with_context(|| format!("copying {CA_BUNDLE}"))?;
    }
    let archive = out_dir.join(format!("ferry-{tag}.tar"));
    let packer = paths::workspace_root()?.join("scripts/oci-image.py");
    let out = Command::new("python3")
        .arg(&packer)
        .arg(root)
        .arg(&archive)
        .arg(&name)
        .arg(r#"["/ferry"]"#)
        .arg(r#"["agent"]"#)
        .stdin(Stdio::null())
        .output()
        .context("running python3")?;
    if !out.status.success() {
        bail!("{} failed: {}", packer.display(), String::from_utf8_lossy(&out.stderr));
    }
    Ok((archive, name))
}

/// The absolute paths of the shared libraries `binary` loads (the dynamic loader included).
fn linked_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out =
        Command::new("ldd").arg(binary).stdin(Stdio::null()).output().context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // A static binary: nothing to copy.
        if text.contains("not a dynamic executable")
            || String::from_utf8_lossy(&out.stderr).contains("not a dynamic")
        {
            return Ok(Vec::new());
        }
        bail!("ldd {} failed: {}", binary.display(), String::from_utf8_lossy(&out.stderr));
    }
    Ok(text.split_whitespace().filter(|w| w.starts_with('/')).map(PathBuf::from).collect())
}
