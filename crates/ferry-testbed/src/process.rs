//! Child processes that never outlive the test binary.
//!
//! Every service a test starts is spawned through [`spawn`], which asks the kernel to kill the
//! child (`PR_SET_PDEATHSIG`) when the thread that spawned it ends. All spawns happen on one
//! dedicated thread that lives as long as the process, so children die exactly when the test
//! binary exits, however it exits (normal end, panic, abort, SIGKILL). [`Guarded`] also kills
//! and reaps its child on drop, for services owned by a single test.
#![allow(unsafe_code)] // `pre_exec` is unsafe by signature; the hook only calls async-signal-safe prctl/getppid.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, anyhow};

type Request = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("ferry-testbed-spawner".into())
            .spawn(move || {
                // Lives until the process exits: the parent thread of every child.
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
                // All senders gone (never happens: the sender is in a static). Park forever
                // rather than end, since ending this thread would kill every child.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn the testbed spawner thread");
        Mutex::new(tx)
    })
}

/// A child process killed and reaped on drop.
#[derive(Debug)]
pub struct Guarded {
    name: String,
    child: Option<Child>,
}

impl Guarded {
    /// The child's PID.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// How the child ended, once it has (reaping it); `None` while it runs, after
    /// [`Self::stop`], or if it could not be waited for.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Kills and reaps the child now.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The name given at spawn time.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Spawns `command` so that it dies with the test binary.
///
/// # Errors
/// The spawn failed (binary missing, not executable...).
pub fn spawn(name: &str, command: Command) -> anyhow::Result<Guarded> {
    spawn_then(name, command, |_| Ok(()))
}

/// Like [`spawn`], with `then` adding more `pre_exec` hooks that run after the child asked
/// to die with the test binary (a hook that forks, as [`crate::netns`]'s does, relies on it).
///
/// # Errors
/// `then` failed, or the spawn failed.
pub fn spawn_then(
    name: &str,
    mut command: Command,
    then: impl FnOnce(&mut Command) -> anyhow::Result<()>,
) -> anyhow::Result<Guarded> {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only calls prctl and
    // getppid, both async-signal-safe; it touches no memory shared with the parent.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::other("parent exited during spawn"));
            }
            Ok(())
        });
    }
    then(&mut command)?;
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .map_err(|_| anyhow!("spawner lock poisoned"))?
        .send((command, tx))
        .map_err(|_| anyhow!("spawner thread is gone"))?;
    let child = rx
        .recv()
        .map_err(|_| anyhow!("spawner thread is gone"))?
        .with_context(|| format!("spawning {name}"))?;
    Ok(Guarded { name: name.to_owned(), child: Some(child) })
}

/// Starts a detached janitor that removes `dir` once this process has exited (checked once a
/// second, for at most a day). It covers statics that are never dropped and SIGKILLed test
/// binaries.
///
/// # Errors
/// `sh` could not be started.
pub fn remove_on_exit(dir: &std::path::Path) -> anyhow::Result<()> {
    let script = r#"i=0; while [ "$i" -lt 86400 ] && kill -0 "$1" 2>/dev/null; do sleep 1; i=$((i+1)); done; rm -rf -- "$2""#;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("ferry-janitor")
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .context("starting the temp-dir janitor")?;
    Ok(())
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// # Errors
/// No port could be bound.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Runs the future `make` returns to its end on a thread of its own with a fresh runtime, so a
/// shared service can be started from inside any test's runtime; an error comes back as its
/// text.
///
/// # Errors
/// The runtime could not be built, the future failed, or it panicked.
pub fn run_on_own_thread<T, F, Fut>(make: F) -> Result<T, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
    T: Send + 'static,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(make()).map_err(|e| format!("{e:#}"))
    })
    .join()
    .unwrap_or_else(|_| Err("panicked".into()))
}
