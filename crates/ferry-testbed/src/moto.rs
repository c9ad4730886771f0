//! moto's S3 server, a real S3 implementation over HTTP, on loopback.

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
    server: Guarded,
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
            let mut s3 = Self { endpoint: format!("http://127.0.0.1:{port}"), server };
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

    fn wait_ready(&mut self, port: u16) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.server.is_running() {
                bail!("moto_server exited during start (port {port} taken?)");
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("moto_server not answering on port {port} after {READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The endpoint URL, `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Creates bucket `name` with a path-style `PUT /<name>` (moto needs no signature).
    ///
    /// # Errors
    /// The server cannot be reached or refuses.
    pub fn create_bucket(&self, name: &str) -> anyhow::Result<()> {
        use std::io::{Read, Write};
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

    /// The server's PID.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.server.pid()
    }
}
