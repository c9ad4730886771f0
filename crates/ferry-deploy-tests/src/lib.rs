//! Test support for Ferry's deployment files in `deploy/`: where they are, and running
//! `kubectl` (built by `scripts/build-control-plane.sh`) and `helm` (built by
//! `deploy/build-helm.sh`, both from the Go module proxy and cached under `~/.cache/ferry`).
//! The tests themselves are in `tests/deploy.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, bail};
use ferry_testbed::ControlPlane;
use serde::Deserialize as _;

/// The `deploy/` folder of the workspace.
///
/// # Errors
/// The workspace root cannot be found.
pub fn deploy_dir() -> anyhow::Result<PathBuf> {
    Ok(ferry_testbed::paths::workspace_root()?.join("deploy"))
}

/// Runs kubectl against `cp` with `args`, `stdin` fed to it; fails unless it exits 0.
///
/// # Errors
/// kubectl is missing or exits non-zero (the error carries its output).
pub fn kubectl(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let out = kubectl_output(cp, args, stdin)?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).context("kubectl printed non-UTF-8")
}

/// Runs kubectl against `cp` and returns its output whatever its exit status.
///
/// # Errors
/// kubectl is missing or cannot be run.
pub fn kubectl_output(
    cp: &ControlPlane,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<Output> {
    let mut cmd = Command::new(ferry_testbed::paths::kubectl()?);
    cmd.arg("--kubeconfig").arg(cp.kubeconfig()).args(args);
    run(cmd, stdin)
}

/// The helm binary: what `deploy/build-helm.sh` prints (it builds helm once and caches it).
///
/// # Errors
/// The script failed.
pub fn helm() -> anyhow::Result<PathBuf> {
    ferry_testbed::paths::helm()
}

/// `helm template ferry deploy/helm/ferry` with `args` (such as `--values FILE`) for the
/// control plane's Kubernetes version; returns the rendered YAML.
///
/// # Errors
/// helm is missing or exits non-zero.
pub fn helm_template(args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["--kube-version", "v1.36.2"];
    all.extend_from_slice(args);
    helm_template_as_built(&all)
}

/// `helm template ferry deploy/helm/ferry` with `args` only: no `--kube-version`, so for the
/// Kubernetes version helm was built to assume; returns the rendered YAML.
///
/// # Errors
/// helm is missing or exits non-zero.
pub fn helm_template_as_built(args: &[&str]) -> anyhow::Result<String> {
    let chart = deploy_dir()?.join("helm/ferry");
    let mut full = vec!["template", "ferry"];
    let chart = chart.to_str().context("non-UTF-8 chart path")?;
    full.push(chart);
    full.extend_from_slice(args);
    let out = helm_output(&full)?;
    if !out.status.success() {
        bail!("helm template failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8(out.stdout).context("helm printed non-UTF-8")
}

/// Runs helm with `args` and returns its output whatever its exit status.
///
/// # Errors
/// helm is missing or cannot be run.
pub fn helm_output(args: &[&str]) -> anyhow::Result<Output> {
    let mut cmd = Command::new(helm()?);
    cmd.args(args);
    run(cmd, None)
}

/// The helm version `deploy/build-helm.sh` builds: `FERRY_HELM_VERSION`, else the script's
/// default.
///
/// # Errors
/// The script cannot be read or names no default version.
pub fn pinned_helm_version() -> anyhow::Result<String> {
    if let Some(version) = std::env::var("FERRY_HELM_VERSION").ok().filter(|v| !v.is_empty()) {
        return Ok(version);
    }
    let script = read(&deploy_dir()?.join("build-helm.sh"))?;
    let marker = "${FERRY_HELM_VERSION:-";
    let start = script.find(marker).context("build-helm.sh names no default version")?;
    let rest = &script[start + marker.len()..];
    let end = rest.find('}').context("build-helm.sh: unterminated default version")?;
    Ok(rest[..end].to_owned())
}

/// Every non-empty document of a multi-document YAML text.
///
/// # Errors
/// The text is not YAML.
pub fn documents(yaml: &str) -> anyhow::Result<Vec<serde_yaml::Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc).context("parsing YAML")?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The YAML files of the plain manifests, sorted by name.
///
/// # Errors
/// The folder cannot be read.
pub fn manifest_files() -> anyhow::Result<Vec<PathBuf>> {
    let dir = deploy_dir()?.join("manifests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    Ok(files)
}

/// Reads a file to text.
///
/// # Errors
/// The file cannot be read.
pub fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn run(mut cmd: Command, stdin: Option<&str>) -> anyhow::Result<Output> {
    use std::io::Write;
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).context("writing to the child's stdin")?;
    }
    child.wait_with_output().with_context(|| format!("waiting for {cmd:?}"))
}
