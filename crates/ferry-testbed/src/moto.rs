//! A real S3 server over HTTP on loopback: moto (tests), or MinIO (benchmarks, where moto's
//! single Python thread would be the bottleneck).

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::process::{self, Guarded};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `moto_server` bound to 127.0.0.1 on a free port. Any access key and secret are
/// accepted; use path-style addressing. Dropping it stops the server.
#[derive(Debug)]
pub struct S3Server {
    endpoint: String,
    /// Declared before `data`: the server stops before its folder goes.
    server: Guarded,
    /// MinIO's data folder (a bucket is a folder in it); `None` for moto.
    data: Option<tempfile::TempDir>,
}

impl S3Server {
    /// Starts moto (`$FERRY_MOTO_SERVER` or `moto_server` on the PATH) and waits until it
    /// answers HTTP.
    ///
    /// # Errors
    /// moto is not installed, exits, or does not answer within 30 s.
    pub fn start() -> anyhow::Result<Self> {
        let program = std::env::var("FERRY_MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
        let mut last = None;
        for _ in 0..3 {
            let port = process::free_port()?;
            let mut cmd = Command::new(&program);
            cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let server = process::spawn("moto_server", cmd)
                .with_context(|| format!("starting {program} (pip install 'moto[server]')"))?;
            let mut s3 = Self { endpoint: format!("http://127.0.0.1:{port}"), server, data: None };
            match s3.wait_ready(port) {
                Ok(()) => return Ok(s3),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("moto did not start")))
    }

    /// One server shared by every test in this test binary; tests use their own buckets.
    ///
    /// # Panics
    /// If moto cannot start.
    #[must_use]
    pub fn shared() -> &'static S3Server {
        static SHARED: OnceLock<Result<S3Server, String>> = OnceLock::new();
        match SHARED.get_or_init(|| Self::start().map_err(|e| format!("{e:#}"))) {
            Ok(s3) => s3,
            Err(e) => panic!("test S3 server unavailable: {e}"),
        }
    }

    /// Starts MinIO (`program`, a `minio` binary) on a fresh data folder inside `parent` with
    /// root user `access_key` (at least 3 characters) and password `secret_key` (at least 8),
    /// and waits until it answers. For benchmarks: unlike moto it keeps up with a data mover.
    ///
    /// # Errors
    /// The program cannot start, exits, or does not answer within 30 s.
    pub fn start_minio(
        program: &std::path::Path,
        parent: &std::path::Path,
        access_key: &str,
        secret_key: &str,
    ) -> anyhow::Result<Self> {
        let data = tempfile::Builder::new().prefix("ferry-minio-").tempdir_in(parent)?;
        let port = process::free_port()?;
        let console = process::free_port()?;
        let mut cmd = Command::new(program);
        cmd.args(["server", "--quiet", "--address", &format!("127.0.0.1:{port}")])
            .args(["--console-address", &format!("127.0.0.1:{console}")])
            .arg(data.path())
            .env("MINIO_ROOT_USER", access_key)
            .env("MINIO_ROOT_PASSWORD", secret_key)
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let server = process::spawn("minio", cmd)
            .with_context(|| format!("starting {}", program.display()))?;
        let mut s3 =
            Self { endpoint: format!("http://127.0.0.1:{port}"), server, data: Some(data) };
        s3.wait_ready(port)?;
        Ok(s3)
    }

    fn wait_ready(&mut self, port: u16) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.server.is_running() {
                bail!("the S3 server exited during start (port {port} taken?)");
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the S3 server is not answering on port {port} after {READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The endpoint URL, `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Creates bucket `name`: with a path-style `PUT /<name>` on moto (which needs no
    /// signature), as a folder of the data folder on MinIO (which lists its top-level folders
    /// as buckets).
    ///
    /// # Errors
    /// The server cannot be reached or refuses.
    pub fn create_bucket(&self, name: &str) -> anyhow::Result<()> {
        use std::io::{Read, Write};
        if let Some(data) = &self.data {
            let dir = data.path().join(name);
            return std::fs::create_dir(&dir)
                .with_context(|| format!("creating bucket folder {}", dir.display()));
        }
        let addr = self.endpoint().trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(addr)
            .with_context(|| format!("connecting to moto at {addr}"))?;
        write!(
            stream,
            "PUT /{name} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        anyhow::ensure!(response.starts_with("HTTP/1.1 200"), "creating bucket {name}: {response}");
        Ok(())
    }

    /// MinIO's data folder (`None` for moto).
    #[must_use]
    pub fn data_dir(&self) -> Option<&std::path::Path> {
        self.data.as_ref().map(tempfile::TempDir::path)
    }

    /// The server's PID.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.server.pid()
    }
}
