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
    built_by("FERRY_CONTROL_PLANE_BIN", "scripts/build-control-plane.sh")
}

/// `$variable`, or the path the workspace's build `script` prints (it builds once and caches).
fn built_by(variable: &str, script: &str) -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os(variable) {
        return Ok(PathBuf::from(dir));
    }
    let root = workspace_root()?;
    let script = root.join(script);
    let out = Command::new("bash")
        .arg(&script)
        .current_dir(&root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let path = String::from_utf8(out.stdout).context("build script printed non-UTF-8")?;
    Ok(PathBuf::from(path.trim()))
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

/// The folder with the real node's binaries (kubelet, containerd, runc, CNI plugins, the CSI
/// hostpath driver and sidecars, the controllers): `$FERRY_REALNODE_BIN`, or what
/// `scripts/build-realnode.sh` prints (it builds them once and caches them under
/// `~/.cache/ferry/realnode`).
///
/// # Errors
/// The build script failed.
pub fn realnode_bin() -> anyhow::Result<PathBuf> {
    built_by("FERRY_REALNODE_BIN", "scripts/build-realnode.sh")
}

/// The folder with the real node's OCI image archives (`pause.tar`, `busybox.tar`), beside
/// [`realnode_bin`]'s.
///
/// # Errors
/// As [`realnode_bin`].
pub fn realnode_images() -> anyhow::Result<PathBuf> {
    let bin = realnode_bin()?;
    Ok(bin.parent().map_or_else(|| bin.join("images"), |p| p.join("images")))
}

/// The `ferry` binary the real-node tests make Ferry's image of: `$FERRY_IMAGE_BINARY`, which
/// `make test` sets to the release build (`target/release/ferry`, the binary the Dockerfile
/// puts in the image users run), else `dev_build` (the test's own build of the same source;
/// said on standard error).
///
/// # Errors
/// `$FERRY_IMAGE_BINARY` names no file.
pub fn image_binary(dev_build: &Path) -> anyhow::Result<PathBuf> {
    match std::env::var_os("FERRY_IMAGE_BINARY").filter(|v| !v.is_empty()) {
        Some(path) => {
            let path = PathBuf::from(path);
            if !path.is_file() {
                bail!(
                    "FERRY_IMAGE_BINARY is {}, which is not a file (build it with \
                     `cargo build --release --locked -p ferry`)",
                    path.display()
                );
            }
            Ok(path)
        }
        None => {
            eprintln!(
                "Ferry's image is made of the tests' own build {} (FERRY_IMAGE_BINARY is not \
                 set; `make test` sets it to the release build)",
                dev_build.display()
            );
            Ok(dev_build.to_owned())
        }
    }
}

/// The pinned `helm`: `$FERRY_HELM`, or what `deploy/build-helm.sh` builds and caches.
///
/// # Errors
/// The build script failed.
pub fn helm() -> anyhow::Result<PathBuf> {
    built_by("FERRY_HELM", "deploy/build-helm.sh")
}
