//! `interop/goplugin-host`, the Go program that loads plugins with Velero's own plugin manager
//! over hashicorp/go-plugin, built once per version of its sources and cached under
//! `${XDG_CACHE_HOME:-$HOME/.cache}/ferry/goplugin-host/<hash>/`. The first build downloads
//! Velero's dependencies from the Go module proxy and takes minutes; it needs `go` on `PATH`.

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::Signal;
use sha2::{Digest as _, Sha256};

use crate::paths::workspace_root;

const SOURCES: [&str; 3] = ["go.mod", "go.sum", "main.go"];
const BUILD_DEADLINE: Duration = Duration::from_secs(30 * 60);

fn cache_root() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    Ok(base.join("ferry/goplugin-host"))
}

/// The built Go host (building it unless a build of the same sources is cached).
///
/// # Errors
/// When the sources cannot be read or `go build` fails or outlives its deadline (the whole
/// process group is then killed).
pub fn build() -> anyhow::Result<PathBuf> {
    let dir = workspace_root()?.join("interop/goplugin-host");
    let mut hash = Sha256::new();
    for name in SOURCES {
        let bytes = std::fs::read(dir.join(name)).with_context(|| format!("reading {name}"))?;
        hash.update(name.as_bytes());
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    let key = hex::encode(&hash.finalize()[..12]);
    let cached = cache_root()?.join(&key).join("goplugin-host");
    if cached.exists() {
        return Ok(cached);
    }
    let parent = cached.parent().context("cache path has a parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let partial = parent.join(format!("goplugin-host.partial-{}", std::process::id()));
    eprintln!(
        "building {} (first time: this downloads Velero's dependencies and takes minutes)",
        dir.display()
    );
    let log = tempfile::NamedTempFile::new()?;
    let mut child = Command::new("go")
        .args(["build", "-o"])
        .arg(&partial)
        .arg(".")
        .current_dir(&dir)
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=mod")
        .stdin(Stdio::null())
        .stdout(log.reopen()?)
        .stderr(log.reopen()?)
        .process_group(0)
        .spawn()
        .context("starting `go build` (is Go installed?)")?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() > BUILD_DEADLINE {
            kill_group(child.id());
            let _ = child.wait();
            bail!("go build of {} did not finish within {BUILD_DEADLINE:?}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if !status.success() {
        let output = std::fs::read_to_string(log.path()).unwrap_or_default();
        bail!("go build of {} failed ({status}):\n{output}", dir.display());
    }
    // Atomic: a concurrent build of the same sources produced the same program.
    std::fs::rename(&partial, &cached)
        .with_context(|| format!("moving the build to {}", cached.display()))?;
    Ok(cached)
}

fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
    }
}
