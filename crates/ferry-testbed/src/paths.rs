//! Where the workspace, the shared fixtures and the cached binaries are.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The workspace root (the folder holding `Cargo.lock`).
///
/// # Errors
/// No ancestor of this crate holds a `Cargo.lock`.
pub fn workspace_root() -> anyhow::Result<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|p| p.join("Cargo.lock").is_file())
        .map(Path::to_path_buf)
        .context("no Cargo.lock above the testbed crate")
}

/// The shared fixtures: `$FERRY_FIXTURES`, or `../shared/fixtures` beside the workspace.
///
/// # Errors
/// The folder does not exist.
pub fn fixtures_dir() -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("FERRY_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root()?.join("../shared/fixtures"),
    };
    if !dir.join("velero-crds").is_dir() {
        bail!(
            "fixtures not found at {} (set FERRY_FIXTURES to the folder holding velero-crds/)",
            dir.display()
        );
    }
    Ok(dir)
}

/// The folder with `kube-apiserver` and `etcd`: `$FERRY_CONTROL_PLANE_BIN`, or what
/// `scripts/build-control-plane.sh` prints (it builds them from the Go module proxy once and
/// caches them under `~/.cache/ferry`).
///
/// # Errors
/// The build script failed.
pub fn control_plane_bin() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("FERRY_CONTROL_PLANE_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let script = workspace_root()?.join("scripts/build-control-plane.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let dir = String::from_utf8(out.stdout).context("build script printed non-UTF-8")?;
    Ok(PathBuf::from(dir.trim()))
}

/// `kubectl` of the control plane's Kubernetes version, built and cached beside
/// `kube-apiserver` by `scripts/build-control-plane.sh` (so tests never depend on a kubectl
/// the machine may or may not have).
///
/// # Errors
/// The build script failed, or the folder it gave has no `kubectl`.
pub fn kubectl() -> anyhow::Result<PathBuf> {
    let path = control_plane_bin()?.join("kubectl");
    if !path.is_file() {
        bail!("{} is missing: run scripts/build-control-plane.sh", path.display());
    }
    Ok(path)
}
