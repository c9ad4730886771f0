//! The real Velero: `velero server` and the `velero` CLI of the pinned version, with Velero's
//! AWS object-store plugin, built from the Go module proxy by `scripts/build-velero.sh` and
//! cached under `~/.cache/ferry`.
//!
//! [`install_crds`] puts Velero's own CRDs of that version (as `velero install --crds-only`
//! prints them) into a control plane, over the fixtures' copies. [`VeleroServer::start`] runs
//! `velero server` against it outside any pod, as a child of the test binary, with a plugin
//! folder of the test's choosing; [`VeleroServer::cli`] runs the `velero` CLI as a user would.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::process::{self, Guarded};
use crate::{ControlPlane, VELERO_NAMESPACE, paths};

/// The Velero version `scripts/build-velero.sh` builds by default.
pub const VELERO_VERSION: &str = "v1.18.3";

/// The most DeleteBackupRequests [`VeleroServer::delete_backup`] makes for one Backup.
pub const DELETE_ATTEMPTS: usize = 3;

/// Velero's deletion errors that pass with time (see [`VeleroServer::delete_backup`]): its
/// one minute for the restores' finalizers ran out, its location was Unavailable at the last
/// validation, or the backup was still tracked as in progress.
pub const PASSING_DELETE_ERRORS: [&str; 3] =
    ["error deleting restore", "is currently in Unavailable state", "backup is still in progress"];

/// The folder holding `velero`, `velero-plugin-for-aws`, `velero-crds.yaml` and `goplugin-host`:
/// `$FERRY_VELERO_BIN`, or what `scripts/build-velero.sh` prints (it builds them once).
///
/// # Errors
/// The build script failed, or the folder lacks one of the three files.
pub fn velero_dir() -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("FERRY_VELERO_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script = paths::workspace_root()?.join("scripts/build-velero.sh");
            let out = Command::new("bash")
                .arg(&script)
                .stderr(Stdio::inherit())
                .output()
                .with_context(|| format!("running {}", script.display()))?;
            if !out.status.success() {
                bail!("{} failed ({}): Velero could not be built", script.display(), out.status);
            }
            PathBuf::from(String::from_utf8(out.stdout).context("non-UTF-8 path")?.trim())
        }
    };
    for file in ["velero", "velero-plugin-for-aws", "velero-crds.yaml"] {
        if !dir.join(file).is_file() {
            bail!("{} has no {file}: run scripts/build-velero.sh", dir.display());
        }
    }
    Ok(dir)
}

/// Applies Velero's CRDs of the pinned version to `cp` (server-side, taking over the fixtures'
/// copies) and waits until every one is Established.
///
/// # Errors
/// Velero is not built, or kubectl failed.
pub fn install_crds(cp: &ControlPlane) -> anyhow::Result<()> {
    let crds = velero_dir()?.join("velero-crds.yaml");
    let kubectl = paths::kubectl()?;
    let run = |args: &[&str]| -> anyhow::Result<()> {
        let out = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(cp.kubeconfig())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    let file = crds.to_string_lossy();
    run(&["apply", "--server-side", "--force-conflicts", "--field-manager=velero", "-f", &file])?;
    run(&["wait", "--for=condition=Established", "--timeout=60s", "-f", &file])
}

/// The `velero` Deployment as `velero install` makes it, with no replicas: the server runs as
/// a child process here, but looks its own Deployment up (for its image, when it restores).
fn deployment_yaml() -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: velero
  namespace: {VELERO_NAMESPACE}
  labels: {{component: velero}}
spec:
  replicas: 0
  selector:
    matchLabels: {{deploy: velero}}
  template:
    metadata:
      labels: {{component: velero, deploy: velero}}
    spec:
      containers:
      - name: velero
        image: velero/velero:{VELERO_VERSION}
        command: [/velero]
        args: [server, --features=EnableCSI]
"#
    )
}

fn apply(cp: &ControlPlane, yaml: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut child = Command::new(paths::kubectl()?)
        .arg("--kubeconfig")
        .arg(cp.kubeconfig())
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    child.stdin.take().context("kubectl stdin")?.write_all(yaml.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// A running `velero server` and what it needs: its plugin folder, a temp folder (for the
/// credential files Velero writes), a log file and a HOME for the CLI. Stopped on drop.
#[derive(Debug)]
pub struct VeleroServer {
    // Field order is drop order: the server stops before its files go.
    server: Guarded,
    bin: PathBuf,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

/// How to start a server.
#[derive(Debug, Clone)]
pub struct VeleroOptions {
    /// Plugin executables to put in the plugin folder, as (file name, path). The AWS
    /// object-store plugin is always there.
    pub plugins: Vec<(String, PathBuf)>,
    /// How often Velero validates every BackupStorageLocation (its default is 1 minute).
    pub store_validation: Duration,
    /// How often Velero polls asynchronous item operations (its default is 10 s).
    pub item_operation_sync: Duration,
    /// Further `velero server` arguments.
    pub extra_args: Vec<String>,
    /// The access key and secret of Velero's own credentials, as `velero install
    /// --secret-file` gives them: the `cloud-credentials` Secret mounted as a file that
    /// `AWS_SHARED_CREDENTIALS_FILE` names. A location without `spec.credential` uses them.
    /// Without them the AWS plugin finds no credentials for such a location.
    pub cloud_credentials: Option<(String, String)>,
}

impl VeleroOptions {
    /// The defaults, with Velero's own credentials (see [`VeleroOptions::cloud_credentials`]).
    #[must_use]
    pub fn with_credentials(access_key: &str, secret_key: &str) -> Self {
        Self { cloud_credentials: Some((access_key.into(), secret_key.into())), ..Self::default() }
    }
}

/// An AWS shared credentials file with one `default` profile: what Velero's `cloud-credentials`
/// Secret holds under its `cloud` key.
#[must_use]
pub fn aws_credentials_file(access_key: &str, secret_key: &str) -> String {
    format!("[default]\naws_access_key_id = {access_key}\naws_secret_access_key = {secret_key}\n")
}

impl Default for VeleroOptions {
    fn default() -> Self {
        Self {
            plugins: Vec::new(),
            store_validation: Duration::from_secs(5),
            item_operation_sync: Duration::from_secs(2),
            extra_args: Vec::new(),
            cloud_credentials: None,
        }
    }
}

impl VeleroServer {
    /// Starts `velero server` in namespace `velero` of `cp` and waits until it has started
    /// its controllers (its log says so).
    ///
    /// # Errors
    /// Velero is not built, cannot start, or exits or stays silent for 120 s; the error
    /// carries the server's log tail.
    pub fn start(cp: &ControlPlane, options: &VeleroOptions) -> anyhow::Result<Self> {
        Self::launch(cp, options, cp.kubeconfig(), |cmd| process::spawn("velero server", cmd))
    }

    /// Starts `velero server` as it runs in a cluster: inside the real node's network and mount
    /// namespaces (it reaches the API server at the `kubernetes` Service and the storage
    /// locations at the addresses pods use), its plugins started there too.
    ///
    /// # Errors
    /// As [`VeleroServer::start`].
    pub fn start_on_node(
        cluster: &crate::realnode::RealCluster,
        options: &VeleroOptions,
    ) -> anyhow::Result<Self> {
        let cp = cluster.control_plane();
        Self::launch(cp, options, cluster.node_kubeconfig(), |cmd| {
            cluster.spawn_inside("velero server", cmd)
        })
    }

    fn launch(
        cp: &ControlPlane,
        options: &VeleroOptions,
        server_kubeconfig: &Path,
        spawn: impl FnOnce(Command) -> anyhow::Result<Guarded>,
    ) -> anyhow::Result<Self> {
        let velero = velero_dir()?;
        apply(cp, &deployment_yaml()).context("creating the velero Deployment object")?;
        let dir = tempfile::Builder::new().prefix("ferry-velero-").tempdir()?;
        let plugins = dir.path().join("plugins");
        let tmp = dir.path().join("tmp");
        let home = dir.path().join("home");
        for d in [&plugins, &tmp, &home] {
            std::fs::create_dir_all(d)?;
        }
        let aws = ("velero-plugin-for-aws".to_owned(), velero.join("velero-plugin-for-aws"));
        for (name, path) in std::iter::once(&aws).chain(&options.plugins) {
            install_plugin(dir.path(), name, path)?;
        }
        let log = dir.path().join("velero-server.log");
        let mut cmd = Command::new(velero.join("velero"));
        // Velero's own credentials file, where the Deployment that `velero install` writes
        // mounts the `cloud-credentials` Secret. Locations with `spec.credential` are not
        // used for the test bed's default location:
        // Velero v1.18 writes such a secret to one file per secret key, truncating it each
        // time any controller opens the location, so a plugin reading it at that moment finds
        // no credentials ("failed to refresh cached credentials, no EC2 IMDS role found") and
        // the location turns Unavailable until its next validation: restores are refused and
        // backups fail meanwhile (seen in this project's CI; Velero's issue 8524 reports the
        // same symptom from production).
        if let Some((access_key, secret_key)) = &options.cloud_credentials {
            let mounted = dir.path().join("cloud-credentials");
            std::fs::create_dir_all(&mounted)?;
            let file = mounted.join("cloud");
            std::fs::write(&file, aws_credentials_file(access_key, secret_key))?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
            cmd.env("AWS_SHARED_CREDENTIALS_FILE", &file);
        }
        cmd.arg("server")
            .arg("--kubeconfig")
            .arg(server_kubeconfig)
            .args(["--namespace", VELERO_NAMESPACE])
            .arg("--plugin-dir")
            .arg(&plugins)
            .arg(format!("--metrics-address=127.0.0.1:{}", process::free_port()?))
            .arg(format!("--profiler-address=127.0.0.1:{}", process::free_port()?))
            .arg(format!("--store-validation-frequency={}s", options.store_validation.as_secs()))
            .arg(format!(
                "--item-operation-sync-frequency={}s",
                options.item_operation_sync.as_secs().max(1)
            ))
            // Velero v1.18 skips its CSI actions without this feature flag (`velero install
            // --features=EnableCSI`): no VolumeSnapshot, no DataUpload.
            .arg("--features=EnableCSI")
            .args(["--log-level", "debug", "--log-format", "text"])
            .args(&options.extra_args)
            // Velero writes BSL credentials under $TMPDIR/credentials.
            .env("TMPDIR", &tmp)
            .env("HOME", &home)
            // Plugins inherit the server's environment, as in Velero's pod.
            .env("KUBECONFIG", server_kubeconfig)
            .env("VELERO_NAMESPACE", VELERO_NAMESPACE)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::OpenOptions::new().append(true).open(&log)?);
        // Its own process group, so that stopping it also stops the plugin processes it
        // started (go-plugin does not take them down when the server is killed).
        cmd.process_group(0);
        let server = spawn(cmd)?;
        process::remove_on_exit(dir.path())?;
        let mut started = Self {
            server,
            bin: velero.join("velero"),
            kubeconfig: cp.kubeconfig().to_owned(),
            dir,
        };
        started.wait_started()?;
        Ok(started)
    }

    fn wait_started(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if !self.server.is_running() {
                bail!("velero server exited during start-up:\n{}", self.log_tail(60));
            }
            if self.log().contains("Server starting") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("velero server did not start within 120 s:\n{}", self.log_tail(60));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        self.server.is_running()
    }

    /// Kills the server and its plugin processes now (SIGKILL, as a lost pod).
    pub fn kill(&mut self) {
        let pid = self.server.pid();
        if pid != 0 && self.server.is_running() {
            // The group is the server's own (`process_group(0)`): its pid is the group id.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        self.server.stop();
    }

    /// The server's whole log.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The server log's file.
    #[must_use]
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("velero-server.log")
    }

    /// The last `lines` lines of the server's log at info level and above: the server logs
    /// at debug level, whose lines (a dozen a second, the controllers' periodic queues) would
    /// push the errors that explain a failure out of any tail. The whole log stays at
    /// [`VeleroServer::log_path`].
    #[must_use]
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let tail: Vec<&str> =
            log.lines().rev().filter(|l| !l.contains("level=debug")).take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Runs the `velero` CLI with `args` against this server's cluster and namespace, as a
    /// user would, and returns its output whatever its exit status. Bounded by `timeout`.
    ///
    /// # Errors
    /// The CLI could not be started or outlived `timeout` (it is then killed).
    pub fn cli_output(&self, args: &[&str], timeout: Duration) -> anyhow::Result<Output> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--namespace", VELERO_NAMESPACE])
            .env("HOME", self.dir.path().join("home"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().with_context(|| format!("starting velero {}", args.join(" ")))?;
        wait_output(child, timeout).with_context(|| format!("velero {}", args.join(" ")))
    }

    /// As [`VeleroServer::cli_output`], failing unless the CLI exits 0; returns its stdout.
    ///
    /// # Errors
    /// The CLI failed; the error carries its output and the server's log tail.
    pub fn cli(&self, args: &[&str], timeout: Duration) -> anyhow::Result<String> {
        let out = self.cli_output(args, timeout)?;
        if !out.status.success() {
            bail!(
                "velero {} failed ({}):\n{}{}\n--- velero server log (tail)\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log_tail(40)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `velero backup delete NAME --confirm`, then waits (up to `timeout` per request) until the
    /// Backup object is gone.
    ///
    /// Velero processes a DeleteBackupRequest once. After deleting the backup's data it deletes
    /// the restores made from it and gives their finalizers one minute; past that it records
    /// "error deleting restore ..." and keeps the Backup, and its user deletes again. On a busy
    /// machine that minute runs out; and a location whose last validation timed out is
    /// Unavailable until the next one, refusing deletions meanwhile. Those errors alone
    /// ([`PASSING_DELETE_ERRORS`]) ask once more, once every location is Available again (at
    /// most [`DELETE_ATTEMPTS`] requests in all). Any other error of Velero's ends the wait at once,
    /// with Velero's errors and its error lines. The worst case is [`DELETE_ATTEMPTS`] times
    /// the CLI's run and the wait, and a wait for the locations between requests, each
    /// bounded by `timeout`.
    ///
    /// # Errors
    /// The CLI failed, Velero's request failed for another reason, or the Backup outlived the
    /// wait.
    pub async fn delete_backup(
        &self,
        client: &kube::Client,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let backups = velero_v1(client, "Backup", "backups");
        let requests = velero_v1(client, "DeleteBackupRequest", "deletebackuprequests");
        // Requests are told by their spec (their label holds the name only up to 63
        // characters, then shortened).
        let of_backup = |r: &kube::api::DynamicObject| r.data["spec"]["backupName"] == name;
        let mut failures = Vec::new();
        for attempt in 1..=DELETE_ATTEMPTS {
            let earlier: Vec<String> = requests
                .list(&kube::api::ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|r| of_backup(r))
                .filter_map(|r| r.metadata.name)
                .collect();
            self.cli(&["backup", "delete", name, "--confirm"], timeout)?;
            let deadline = Instant::now() + timeout;
            let errors = loop {
                if backups.get_opt(name).await?.is_none() {
                    return Ok(());
                }
                let listed = requests.list(&kube::api::ListParams::default()).await?;
                let errors: Vec<String> = listed
                    .items
                    .iter()
                    .filter(|r| of_backup(r))
                    .filter(|r| r.metadata.name.as_ref().is_some_and(|n| !earlier.contains(n)))
                    .filter(|r| r.data["status"]["phase"] == "Processed")
                    .flat_map(|r| {
                        r.data["status"]["errors"].as_array().cloned().unwrap_or_default()
                    })
                    .filter_map(|e| e.as_str().map(str::to_owned))
                    .collect();
                if !errors.is_empty() {
                    break errors;
                }
                if Instant::now() > deadline {
                    bail!(
                        "Backup {name} still there {timeout:?} after velero backup delete{}\n{}",
                        earlier_failures(&failures),
                        self.error_lines(40)
                    );
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            let passing =
                errors.iter().all(|e| PASSING_DELETE_ERRORS.iter().any(|p| e.contains(p)));
            failures.push(errors);
            if !passing || attempt == DELETE_ATTEMPTS {
                break;
            }
            // Velero refuses deletions while a location is Unavailable: ask again once every
            // location is Available (or, that not seen within the wait, ask anyway: Velero's
            // answer then says why).
            let locations = velero_v1(client, "BackupStorageLocation", "backupstoragelocations");
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                let listed = locations.list(&kube::api::ListParams::default()).await?;
                if listed.items.iter().all(|l| l.data["status"]["phase"] == "Available") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        bail!(
            "Velero did not delete Backup {name}{}\n{}",
            earlier_failures(&failures),
            self.error_lines(40)
        )
    }

    /// The last `lines` lines of the server's log at level warning or error (its debug lines
    /// bury them in a plain tail).
    #[must_use]
    pub fn error_lines(&self, lines: usize) -> String {
        let log = self.log();
        let picked: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("level=error") || l.contains("level=warning"))
            .collect();
        let from = picked.len().saturating_sub(lines);
        format!(
            "--- velero server log, warnings and errors (last {lines})\n{}",
            picked[from..].join("\n")
        )
    }

    /// The folder Velero's plugins are run from.
    #[must_use]
    pub fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    /// The server's working folder.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for VeleroServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Puts plugin `name` (the executable at `path`) into the plugin folder under `dir`: a copy
/// under `dir/plugin-bin/`, started through `setpriv --pdeathsig KILL` by a script in
/// `dir/plugins/`, so a plugin process dies with the server that started it however the
/// server ends. The copy keeps the plugin's name (Ferry's binary serves plugins when its name
/// starts with `velero-plugin`).
fn install_plugin(dir: &Path, name: &str, path: &Path) -> anyhow::Result<()> {
    let bin = dir.join("plugin-bin");
    std::fs::create_dir_all(&bin)?;
    let real = bin.join(name);
    std::fs::copy(path, &real).with_context(|| format!("copying plugin {}", path.display()))?;
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .context("setpriv (util-linux) is needed to tie Velero's plugins to the server")?;
    let script = dir.join("plugins").join(name);
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec {} --pdeathsig KILL -- '{}' \"$@\"\n",
            setpriv.display(),
            real.display()
        ),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// A namespaced API of Velero's `velero.io/v1` kind `kind` (resource `plural`) in Velero's
/// namespace, read as dynamic objects (Ferry's API crate types only what Ferry itself uses).
#[must_use]
pub fn velero_v1(
    client: &kube::Client,
    kind: &str,
    plural: &str,
) -> kube::Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource {
        group: "velero.io".into(),
        version: "v1".into(),
        api_version: "velero.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    kube::Api::namespaced_with(client.clone(), VELERO_NAMESPACE, &resource)
}

/// Velero's errors of earlier DeleteBackupRequests, for a message.
fn earlier_failures(failures: &[Vec<String>]) -> String {
    failures
        .iter()
        .enumerate()
        .map(|(i, errors)| format!("\n  request {}: {}", i + 1, errors.join("; ")))
        .collect()
}

fn wait_output(mut child: std::process::Child, timeout: Duration) -> anyhow::Result<Output> {
    use std::io::Read as _;
    let mut stdout = child.stdout.take().context("stdout piped")?;
    let mut stderr = child.stderr.take().context("stderr piped")?;
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Ok(Output { status, stdout, stderr })
}
