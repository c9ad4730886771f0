//! A moto S3 server on a loopback port for the lifetime of a guard.
//!
//! `MotoServer::start` spawns `moto_server -H 127.0.0.1 -p PORT` and waits (bounded) until it
//! answers HTTP; dropping the guard kills the process by its id and reaps it, also when a
//! test panics. `MotoServer::shared` hands out one server to all tests that overlap in time
//! and stops it when the last of them drops its handle.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::http;

/// How long moto may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running moto server, killed on drop.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    addr: SocketAddr,
}

static SHARED: Mutex<Weak<MotoServer>> = Mutex::new(Weak::new());

impl MotoServer {
    /// Starts a server of its own, with extra environment variables for moto.
    pub fn start(env: &[(&str, &str)]) -> Self {
        let mut last_error = String::new();
        // A free port can be taken by someone else before moto binds it: try a few.
        for _ in 0..3 {
            let port = free_port();
            let mut command = Command::new("moto_server");
            command
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = command.spawn().unwrap_or_else(|e| panic!("spawning moto_server: {e}"));
            let mut server = Self { child, addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)) };
            match server.wait_ready() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("moto_server did not start: {last_error}");
    }

    /// A server shared with every other test running at the same time.
    pub fn shared() -> Arc<Self> {
        let mut slot = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(server) = slot.upgrade() {
            return server;
        }
        let server = Arc::new(Self::start(&[]));
        *slot = Arc::downgrade(&server);
        server
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server's socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("moto_server exited with {status}"));
            }
            if http::request(self.addr, "GET", "/moto-api/", &[], b"").is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("no HTTP answer on {} within {START_TIMEOUT:?}", self.addr))
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        // `Child::kill` signals exactly this process id; `wait` reaps it.
        if let Err(e) = self.child.kill() {
            eprintln!("killing moto_server {}: {e}", self.child.id());
        }
        let _reaped = self.child.wait();
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("binding a port: {e}"));
    listener.local_addr().unwrap_or_else(|e| panic!("{e}")).port()
}
