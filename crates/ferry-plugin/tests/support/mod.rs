//! Launching the example plugin the way Velero (go-plugin's client) does, for the tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tonic::transport::Channel;

/// The example plugin binary built from `tests/bin/example_plugin.rs`.
pub const PLUGIN: &str = env!("CARGO_BIN_EXE_ferry-plugin-example");

/// The flags a Velero server passes on to its plugins (its own command line).
pub const VELERO_FLAGS: [&str; 5] = [
    "--log-level",
    "debug",
    "--features=",
    "--uploader-type=kopia",
    "--default-volumes-to-fs-backup",
];

/// How long a plugin may take to print its handshake line or to exit.
const DEADLINE: Duration = Duration::from_secs(30);

/// The environment go-plugin's client gives a plugin launched for Velero.
pub fn velero_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("VELERO_PLUGIN", "hello"),
        ("PLUGIN_PROTOCOL_VERSIONS", "2"),
        ("PLUGIN_MIN_PORT", "10000"),
        ("PLUGIN_MAX_PORT", "25000"),
    ]
}

/// A running plugin process, killed and reaped on drop. Its `TMPDIR` is a fresh directory the
/// guard owns, so the tests can see what the plugin leaves behind.
pub struct Plugin {
    child: Child,
    tmp: tempfile::TempDir,
    stdout_rest: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<thread::JoinHandle<()>>,
    /// The handshake line, without its newline.
    pub handshake: String,
}

/// Starts the plugin with `env` (on top of an environment cleared of Velero's and go-plugin's
/// variables) and `args`; returns the process and its stdout and stderr readers.
fn spawn(
    env: &[(&str, &str)],
    args: &[&str],
    tmp: &Path,
) -> (Child, mpsc::Receiver<String>, Arc<Mutex<String>>, thread::JoinHandle<()>) {
    let mut cmd = Command::new(PLUGIN);
    cmd.args(args)
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for key in [
        "VELERO_PLUGIN",
        "PLUGIN_PROTOCOL_VERSIONS",
        "PLUGIN_UNIX_SOCKET_DIR",
        "FERRY_PLUGIN_EXTRA_KINDS",
    ] {
        cmd.env_remove(key);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr_text = Arc::new(Mutex::new(String::new()));
    let mut stderr = child.stderr.take().unwrap();
    let sink = stderr_text.clone();
    let reader = thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (child, rx, stderr_text, reader)
}

impl Plugin {
    /// Launches the plugin with Velero's environment and flags, and waits for its handshake.
    pub fn launch() -> Self {
        Self::launch_with(&velero_env(), &VELERO_FLAGS)
    }

    /// Launches the plugin with `env` and `args`, and waits for its handshake line.
    pub fn launch_with(env: &[(&str, &str)], args: &[&str]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let (child, stdout, stderr, reader) = spawn(env, args, tmp.path());
        let mut plugin = Self {
            child,
            tmp,
            stdout_rest: stdout,
            stderr,
            stderr_reader: Some(reader),
            handshake: String::new(),
        };
        match plugin.stdout_rest.recv_timeout(DEADLINE) {
            Ok(line) => plugin.handshake = line,
            Err(e) => {
                panic!("no handshake line within {DEADLINE:?} ({e}); stderr:\n{}", plugin.stderr())
            }
        }
        plugin
    }

    /// The directory given to the plugin as `TMPDIR`.
    pub fn tmp(&self) -> &Path {
        self.tmp.path()
    }

    /// The socket path from the handshake line.
    pub fn socket(&self) -> PathBuf {
        let fields: Vec<&str> = self.handshake.split('|').collect();
        assert_eq!(fields.len(), 5, "handshake {:?}", self.handshake);
        PathBuf::from(fields[3])
    }

    /// A gRPC channel to the plugin over its Unix socket.
    pub async fn channel(&self) -> Channel {
        let endpoint = format!("unix:{}", self.socket().display());
        tonic::transport::Endpoint::from_shared(endpoint).unwrap().connect().await.unwrap()
    }

    /// What the plugin wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (at most 30 seconds) until the plugin has written `needle` to stderr.
    pub fn await_stderr(&self, needle: &str) {
        let start = Instant::now();
        while !self.stderr().contains(needle) {
            assert!(
                start.elapsed() < DEADLINE,
                "{needle:?} never appeared on stderr:\n{}",
                self.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process ID.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// Waits (at most 30 seconds) for the process to exit; then returns its status, and every
    /// line it printed on stdout after the handshake line. Afterwards [`Plugin::stderr`] holds
    /// all the process wrote there.
    pub fn wait(&mut self) -> (ExitStatus, Vec<String>) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the plugin did not exit; stderr:\n{}",
                self.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        };
        let mut rest = Vec::new();
        while let Ok(line) = self.stdout_rest.recv_timeout(Duration::from_secs(5)) {
            rest.push(line);
        }
        if let Some(reader) = self.stderr_reader.take() {
            reader.join().unwrap();
        }
        (status, rest)
    }

    /// [`Plugin::wait`] off the async runtime's thread, so that the runtime keeps driving the
    /// test's gRPC connections (which must answer the server's goodbye for it to finish).
    pub async fn wait_async(mut self) -> (Self, ExitStatus, Vec<String>) {
        tokio::task::spawn_blocking(move || {
            let (status, rest) = self.wait();
            (self, status, rest)
        })
        .await
        .unwrap()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the plugin to completion with `env`: for launches that must fail before serving.
/// Returns the exit status, stdout and stderr.
pub fn run_to_exit(env: &[(&str, &str)], args: &[&str]) -> (ExitStatus, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, stdout, stderr, reader) = spawn(env, args, tmp.path());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the plugin did not exit within {DEADLINE:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    while let Ok(line) = stdout.recv_timeout(Duration::from_secs(5)) {
        out.push_str(&line);
        out.push('\n');
    }
    reader.join().unwrap();
    let text = stderr.lock().unwrap().clone();
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "the plugin left files in TMPDIR"
    );
    (status, out, text)
}

/// A Kubernetes object's JSON.
pub fn json(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}
