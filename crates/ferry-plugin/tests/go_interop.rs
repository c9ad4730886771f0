//! Interop with the real go-plugin client: `interop/goplugin-host`, a Go program built from the
//! Go module proxy with hashicorp/go-plugin and Velero's own plugin framework, discovers the
//! example plugin through Velero's plugin registry, calls it through Velero's plugin manager,
//! and exits non-zero on any answer other than the expected one.
//!
//! The Go program is built inside Velero's own build by `scripts/build-velero.sh` (`make tools`;
//! cached per Velero version and source of the host).
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

const RUN_DEADLINE: Duration = Duration::from_secs(180);

/// A child process in a process group of its own; the whole group is killed on drop, so no
/// plugin process it started can outlive the test.
struct Group {
    child: Option<Child>,
    pgid: Pid,
}

impl Group {
    fn spawn(cmd: &mut Command) -> Self {
        let child =
            cmd.process_group(0).spawn().unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let pgid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        Self { child: Some(child), pgid }
    }

    /// Waits for the child to exit (killing the group after `deadline`), checks nothing it
    /// started is left, and returns its output.
    fn finish(mut self, deadline: Duration, what: &str) -> Output {
        let child = self.child.as_mut().unwrap();
        // Drain the pipes while waiting, or a chatty child blocks on a full pipe.
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(start.elapsed() < deadline, "{what} did not finish within {deadline:?}");
            std::thread::sleep(Duration::from_millis(100));
        };
        self.child = None;
        let output =
            Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() };
        let start = Instant::now();
        while killpg(self.pgid, None).is_ok() {
            if start.elapsed() > Duration::from_secs(10) {
                let _ = killpg(self.pgid, Signal::SIGKILL);
                panic!("{what} left processes behind");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        output
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Not finished (a failed assertion, say): kill the child and whatever it started.
        if let Some(mut child) = self.child.take() {
            let _ = killpg(self.pgid, Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    })
}

#[test]
fn velero_loads_and_calls_the_plugin_through_go_plugin() {
    let host = ferry_testbed::goplugin_host::build().unwrap();

    // Velero's plugin directory: it runs every executable in it.
    let plugins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(support::PLUGIN, plugins.path().join("ferry-plugin-example"))
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();

    // `goplugin-host server <flags>` passes its flags on to every plugin, as `velero server`
    // does; the environment (cookie, protocol versions, ports) comes from go-plugin's client.
    let mut cmd = Command::new(&host);
    cmd.arg("server")
        .arg("--plugin-dir")
        .arg(plugins.path())
        .args(["--log-level", "debug", "--features=", "--uploader-type=kopia"])
        .env("TMPDIR", tmp.path())
        .env_remove("VELERO_PLUGIN")
        .env_remove("PLUGIN_PROTOCOL_VERSIONS")
        .env_remove("FERRY_PLUGIN_EXTRA_KINDS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = Group::spawn(&mut cmd).finish(RUN_DEADLINE, "the Go host");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Go host reported failures ({}):\n{stdout}\n--- stderr ---\n{stderr}",
        out.status
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(stdout.contains("ok   BIA v2 Progress:"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");

    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.is_empty(), "plugin processes left sockets behind: {left:?}");
}
