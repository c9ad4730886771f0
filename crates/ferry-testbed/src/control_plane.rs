//! A real Kubernetes control plane (etcd + kube-apiserver) on loopback.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{AuthInfo, Config};

use crate::process::{self, Guarded};
use crate::{crds, paths};

/// The namespace Velero (and so every DataUpload/DataDownload) lives in.
pub const VELERO_NAMESPACE: &str = "velero";

const TOKEN: &str = "ferry-testbed-admin-token";
const START_ATTEMPTS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// How a control plane is started.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// For clusters with real nodes: ServiceAccount admission on (pods get a token volume), and
    /// a serving certificate from a CA of the test bed's own ([`ControlPlane::ca_file`]) naming
    /// the `kubernetes` Service's address [`SERVICE_IP`], so pods verify the API server.
    pub for_nodes: bool,
}

/// The `kubernetes` Service's ClusterIP: the first address of the service range.
pub const SERVICE_IP: &str = "10.0.0.1";

/// A running etcd + kube-apiserver with Velero's and the CSI snapshotter's CRDs installed and
/// the `velero` namespace created. Dropping it stops both and removes their files.
#[derive(Debug)]
pub struct ControlPlane {
    url: String,
    port: u16,
    kubeconfig: PathBuf,
    // Field order is drop order: the API server stops before etcd, then files go.
    apiserver: Guarded,
    etcd: Guarded,
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Starts a fresh control plane (about 5–10 s with cached binaries).
    ///
    /// # Errors
    /// Binaries missing and not buildable, ports taken on every attempt, readiness timeout,
    /// CRD installation failure. The error names the step and includes the server's log tail.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(Options::default()).await
    }

    /// Starts a fresh control plane with `options`.
    ///
    /// # Errors
    /// As [`ControlPlane::start`].
    pub async fn start_with(options: Options) -> anyhow::Result<Self> {
        let bin = paths::control_plane_bin()?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::start_once(&bin, options).await {
                Ok(cp) => {
                    crds::install_all(&cp.client()?).await?;
                    cp.create_namespace(VELERO_NAMESPACE).await?;
                    return Ok(cp);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no start attempt made")))
    }

    /// The control plane shared by every test in this test binary, started on first use.
    /// Its processes die with the binary and its files are removed after it exits.
    ///
    /// # Panics
    /// If the control plane cannot start; the message says why.
    #[must_use]
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        let started = SHARED.get_or_init(|| {
            process::run_on_own_thread(|| async {
                let cp = Self::start().await?;
                process::remove_on_exit(cp.dir.path())?;
                Ok(cp)
            })
        });
        match started {
            Ok(cp) => cp,
            Err(e) => panic!("test control plane unavailable: {e}"),
        }
    }

    async fn start_once(bin: &Path, options: Options) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("ferry-testbed-").tempdir()?;
        let root = dir.path();
        let etcd_port = process::free_port()?;
        let api_port = process::free_port()?;
        write_credentials(root)?;
        if options.for_nodes {
            write_serving_certificate(root)?;
        }

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let mut etcd = Command::new(bin.join("etcd"));
        etcd.args(["--data-dir", &root.join("etcd").to_string_lossy()])
            .args(["--listen-client-urls", &etcd_url, "--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", "http://127.0.0.1:0"])
            .args(["--unsafe-no-fsync", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log_file(root, "etcd.log")?)
            .stderr(log_file(root, "etcd.log")?);
        let etcd = process::spawn("etcd", etcd)?;

        let url = format!("https://127.0.0.1:{api_port}");
        let mut api = Command::new(bin.join("kube-apiserver"));
        api.arg(format!("--etcd-servers={etcd_url}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={api_port}"))
            .arg(format!("--cert-dir={}", root.join("pki").display()))
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg(format!("--service-account-issuer={url}"))
            .arg(format!("--service-account-key-file={}", root.join("sa.pub").display()))
            .arg(format!("--service-account-signing-key-file={}", root.join("sa.key").display()))
            .arg(format!("--token-auth-file={}", root.join("tokens.csv").display()))
            .arg("--authorization-mode=RBAC")
            .args(["--allow-privileged=true", "--v=0"])
            .stdin(Stdio::null())
            .stdout(log_file(root, "kube-apiserver.log")?)
            .stderr(log_file(root, "kube-apiserver.log")?);
        if options.for_nodes {
            api.arg(format!("--tls-cert-file={}", root.join("apiserver.crt").display()))
                .arg(format!("--tls-private-key-file={}", root.join("apiserver.key").display()));
        } else {
            // Simulated nodes run no kubelet to mount service-account tokens.
            api.arg("--disable-admission-plugins=ServiceAccount");
        }
        let apiserver = process::spawn("kube-apiserver", api)?;

        let kubeconfig = root.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url))?;
        let mut cp = Self { url, port: api_port, kubeconfig, apiserver, etcd, dir };
        cp.wait_ready().await?;
        Ok(cp)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let client = self.client()?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.etcd.is_running() || !self.apiserver.is_running() {
                bail!("control plane exited during start:\n{}", self.log_tail());
            }
            let req = http::Request::get("/readyz").body(Vec::new())?;
            if client.request_text(req).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("control plane not ready after {READY_TIMEOUT:?}:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The last lines of etcd's and the API server's logs.
    #[must_use]
    pub fn log_tail(&self) -> String {
        ["etcd.log", "kube-apiserver.log"]
            .iter()
            .map(|name| {
                let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
                let lines: Vec<_> = text.lines().rev().take(15).collect();
                let tail: Vec<_> = lines.into_iter().rev().collect();
                format!("--- {name}\n{}", tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A client configuration for the API server (admin, TLS without verification).
    #[must_use]
    pub fn config(&self) -> Config {
        let mut config = Config::new(self.url.parse().expect("valid URL"));
        config.accept_invalid_certs = true;
        config.auth_info = AuthInfo { token: Some(TOKEN.to_owned().into()), ..AuthInfo::default() };
        config.default_namespace = VELERO_NAMESPACE.to_owned();
        config
    }

    /// A new client bound to the caller's tokio runtime.
    ///
    /// # Errors
    /// The client could not be built (no runtime, TLS setup).
    pub fn client(&self) -> anyhow::Result<kube::Client> {
        install_crypto_provider();
        kube::Client::try_from(self.config()).context("building a kube client")
    }

    /// A kubeconfig file for kubectl and for processes under test.
    #[must_use]
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The folder holding the services' data, logs and credentials.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// PIDs of etcd and the API server.
    #[must_use]
    pub fn pids(&self) -> Vec<u32> {
        vec![self.etcd.pid(), self.apiserver.pid()]
    }

    /// The API server's URL.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The API server's port on 127.0.0.1.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA that signed the serving certificate (only for [`Options::for_nodes`]).
    #[must_use]
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The admin bearer token of the kubeconfig.
    #[must_use]
    pub fn admin_token(&self) -> &'static str {
        TOKEN
    }

    /// Creates a namespace named `prefix-<random>` and returns its name, so tests sharing one
    /// control plane never collide.
    ///
    /// # Errors
    /// The API server refused.
    pub async fn unique_namespace(&self, prefix: &str) -> anyhow::Result<String> {
        let name = format!("{prefix}-{:08x}", rand_u32());
        self.create_namespace(&name).await?;
        Ok(name)
    }

    async fn create_namespace(&self, name: &str) -> anyhow::Result<()> {
        let api: Api<Namespace> = Api::all(self.client()?);
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.to_owned());
        api.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(())
    }
}

/// Selects rustls' `ring` provider for the process. When a build links both of rustls'
/// providers (aws-sdk-s3 brings aws-lc-rs, kube brings ring), rustls cannot choose one itself.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.write_u32(std::process::id());
    #[allow(clippy::cast_possible_truncation)] // Truncation is the point: 32 random bits.
    let v = h.finish() as u32;
    v
}

fn log_file(root: &Path, name: &str) -> anyhow::Result<std::fs::File> {
    Ok(std::fs::OpenOptions::new().create(true).append(true).open(root.join(name))?)
}

fn write_credentials(root: &Path) -> anyhow::Result<()> {
    std::fs::write(
        root.join("tokens.csv"),
        format!("{TOKEN},admin,admin-uid,\"system:masters\"\n"),
    )?;
    let key = root.join("sa.key");
    let status = Command::new("openssl")
        .args(["ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out"])
        .arg(&key)
        .stderr(Stdio::null())
        .status()
        .context("running openssl to make the service-account key")?;
    if !status.success() {
        bail!("openssl ecparam failed");
    }
    let status = Command::new("openssl")
        .args(["ec", "-pubout", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(root.join("sa.pub"))
        .stderr(Stdio::null())
        .status()
        .context("running openssl to derive the public key")?;
    if !status.success() {
        bail!("openssl ec -pubout failed");
    }
    Ok(())
}

fn openssl(args: &[&str], root: &Path) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(root)
        .stdin(Stdio::null())
        .output()
        .context("running openssl")?;
    if !out.status.success() {
        bail!("openssl {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A CA (`ca.crt`) and the API server's certificate signed by it (`apiserver.crt`/`.key`) for
/// every name and address clients use: loopback for the tests, the `kubernetes` Service for pods.
fn write_serving_certificate(root: &Path) -> anyhow::Result<()> {
    openssl(&["ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out", "ca.key"], root)?;
    openssl(
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=ferry-testbed-ca",
            "-days",
            "2",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            "ca.crt",
        ],
        root,
    )?;
    openssl(
        &["ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out", "apiserver.key"],
        root,
    )?;
    openssl(
        &[
            "req",
            "-new",
            "-key",
            "apiserver.key",
            "-subj",
            "/CN=kube-apiserver",
            "-out",
            "apiserver.csr",
        ],
        root,
    )?;
    std::fs::write(
        root.join("apiserver.ext"),
        format!(
            "subjectAltName=IP:127.0.0.1,IP:{SERVICE_IP},DNS:localhost,DNS:kubernetes,\
             DNS:kubernetes.default,DNS:kubernetes.default.svc,\
             DNS:kubernetes.default.svc.cluster.local\n\
             extendedKeyUsage=serverAuth\n"
        ),
    )?;
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "apiserver.ext",
            "-out",
            "apiserver.crt",
        ],
        root,
    )
}

fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: ferry-testbed
  cluster:
    server: {url}
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: {TOKEN}
contexts:
- name: ferry-testbed
  context:
    cluster: ferry-testbed
    user: admin
    namespace: {VELERO_NAMESPACE}
current-context: ferry-testbed
"
    )
}
