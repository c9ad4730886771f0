//! The namespaces a real node runs in, and TCP forwarding across their boundary.
//!
//! A real node's kubelet, container runtime, CSI driver and pods live in namespaces the test bed
//! creates: a network namespace (so pod, service and node addresses never appear on the host's
//! network), a mount namespace (so every mount they make, and the shared propagation the kubelet
//! root needs, vanish with it) and a PID namespace (so every container and runtime shim is killed
//! by the kernel when its first process dies, however the test binary ends).
//!
//! The host side reaches in, and the node reaches out, only through [`Forwarder`]s: listeners
//! bound inside one namespace whose connections are relayed from the other.
#![allow(unsafe_code)] // setns(2) in a forked child before exec and on a dedicated thread.

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::process::{self, Guarded};

/// A network, mount and PID namespace held open by a process that does nothing else.
#[derive(Debug)]
pub struct NodeNamespaces {
    net: OwnedFd,
    mnt: OwnedFd,
    pid: OwnedFd,
    /// PID (in the host's PID namespace) of the namespaces' first process.
    init_pid: u32,
    /// A pidfd of that process: waited on without the risk of a reused PID.
    init: OwnedFd,
    /// `unshare`, parent of the first process: killing it kills the first process, and the
    /// kernel then kills everything else in the PID namespace.
    holder: Guarded,
}

impl NodeNamespaces {
    /// Creates the namespaces. The mount namespace starts as a private copy of the host's.
    ///
    /// # Errors
    /// `unshare` is missing or failed, or its child did not appear within 10 s.
    pub fn create() -> anyhow::Result<Self> {
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--fork",
            "--pid",
            "--kill-child",
            "--mount",
            "--net",
            "--propagation",
            "private",
        ])
        .args(["--", "sleep", "infinity"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let mut holder = process::spawn("namespace holder", cmd).context("starting unshare")?;
        let children = format!("/proc/{0}/task/{0}/children", holder.pid());
        let deadline = Instant::now() + Duration::from_secs(10);
        // Ready once unshare's child has made the mounts private and become `sleep`.
        let init_pid = loop {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(pid) = text.split_whitespace().next().and_then(|p| p.parse::<u32>().ok())
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
            {
                break pid;
            }
            if !holder.is_running() {
                bail!("unshare exited before creating the node's namespaces");
            }
            if Instant::now() > deadline {
                bail!("unshare created no namespace process within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let open = |kind: &str| -> anyhow::Result<OwnedFd> {
            let path = format!("/proc/{init_pid}/ns/{kind}");
            Ok(File::open(&path).with_context(|| format!("opening {path}"))?.into())
        };
        // SAFETY: pidfd_open(2) with a PID and no flags; the result is checked.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, init_pid, 0) };
        let init = i32::try_from(raw)
            .ok()
            .filter(|fd| *fd >= 0)
            .ok_or_else(std::io::Error::last_os_error)
            .with_context(|| format!("pidfd_open of the namespaces' first process {init_pid}"))?;
        // SAFETY: a descriptor pidfd_open just returned, owned from here on.
        let init = unsafe { OwnedFd::from_raw_fd(init) };
        Ok(Self { net: open("net")?, mnt: open("mnt")?, pid: open("pid")?, init_pid, init, holder })
    }

    /// Starts `cmd` inside the namespaces through [`process::spawn`]: the program runs in the
    /// node's network, mount and PID namespaces. A PID namespace can only be entered by a new
    /// process (a program that makes threads cannot start in one it joined by `setns`), so the
    /// child joins the namespaces and forks: the program runs in the grandchild, which dies with
    /// its parent; the parent (the returned process) waits for it and exits as it did.
    ///
    /// # Errors
    /// The descriptors could not be duplicated, or the spawn failed.
    pub fn spawn(&self, name: &str, cmd: Command) -> anyhow::Result<Guarded> {
        process::spawn_then(name, cmd, |cmd| self.enter(cmd))
    }

    fn enter(&self, cmd: &mut Command) -> anyhow::Result<()> {
        let mnt = self.mnt.try_clone()?;
        let net = self.net.try_clone()?;
        let pid = self.pid.try_clone()?;
        // SAFETY: runs in the forked child before exec and makes only raw system calls
        // (setns, clone, prctl, close_range, close, waitpid, _exit): no allocation, no lock, no
        // atfork handler; the closure reads only the three descriptors it owns.
        unsafe {
            cmd.pre_exec(move || {
                for (fd, kind) in [
                    (mnt.as_raw_fd(), libc::CLONE_NEWNS),
                    (net.as_raw_fd(), libc::CLONE_NEWNET),
                    (pid.as_raw_fd(), libc::CLONE_NEWPID),
                ] {
                    if libc::setns(fd, kind) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // A plain fork as a raw clone: the new process is the namespace's.
                let child = libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0);
                if child < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if child == 0 {
                    // Dies with the parent below. (Were the parent already gone, the kernel
                    // would have reparented this process to a host process, which getppid()
                    // cannot tell from the living parent outside the namespace; the namespace's
                    // end kills it then.)
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    return Ok(());
                }
                let child = i32::try_from(child).unwrap_or(i32::MAX);
                // The parent must not hold the spawner's exec-status pipe open, or the spawn
                // would wait for this process to end.
                if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
                    for fd in 3..65_536 {
                        libc::close(fd);
                    }
                }
                let mut status = 0;
                loop {
                    let r = libc::waitpid(child, &raw mut status, 0);
                    if r == child {
                        break;
                    }
                    if r < 0 && *libc::__errno_location() != libc::EINTR {
                        libc::_exit(127);
                    }
                }
                if libc::WIFEXITED(status) {
                    libc::_exit(libc::WEXITSTATUS(status));
                }
                libc::_exit(128 + libc::WTERMSIG(status));
            });
        }
        Ok(())
    }

    /// Runs `cmd` to its end inside the namespaces (standard input empty) and returns its
    /// status and output, whatever the status.
    ///
    /// # Errors
    /// The program could not be started.
    pub fn output(&self, mut cmd: Command) -> anyhow::Result<std::process::Output> {
        cmd.stdin(Stdio::null());
        self.enter(&mut cmd)?;
        cmd.output().with_context(|| format!("running {cmd:?} in the node's namespaces"))
    }

    /// Runs `script` with `sh -e` inside the namespaces and waits for it.
    ///
    /// # Errors
    /// The script failed; the error carries its output.
    pub fn run(&self, script: &str) -> anyhow::Result<String> {
        let mut cmd = Command::new("sh");
        cmd.args(["-ec", script]).stdin(Stdio::null());
        self.enter(&mut cmd)?;
        let out = cmd.output().context("running sh in the node's namespaces")?;
        if !out.status.success() {
            bail!(
                "in the node's namespaces, `{}` failed ({}): {}{}",
                script.lines().next().unwrap_or_default(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A path as the node's processes see it (through their mount namespace).
    #[must_use]
    pub fn path(&self, inside: &Path) -> std::path::PathBuf {
        Path::new(&format!("/proc/{}/root", self.init_pid))
            .join(inside.strip_prefix("/").unwrap_or(inside))
    }

    /// The PID of the namespaces' first process.
    #[must_use]
    pub fn init_pid(&self) -> u32 {
        self.init_pid
    }

    /// A TCP listener bound inside the node's network namespace.
    ///
    /// # Errors
    /// The address cannot be bound there.
    pub fn listen(&self, addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
        let net = self.net.try_clone()?;
        // setns(CLONE_NEWNET) changes only the calling thread; a thread of its own binds the
        // socket (which stays in the namespace it was made in) and ends.
        std::thread::spawn(move || -> std::io::Result<std::net::TcpListener> {
            // SAFETY: setns on this thread only, with a descriptor it owns.
            if unsafe { libc::setns(net.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let listener = std::net::TcpListener::bind(addr)?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the namespace thread panicked"))?
        .with_context(|| format!("binding {addr} in the node's network namespace"))
    }

    /// A TCP connection made from inside the node's network namespace.
    ///
    /// # Errors
    /// The address did not accept the connection.
    pub fn connect(&self, addr: SocketAddr) -> anyhow::Result<std::net::TcpStream> {
        let net = self.net.try_clone()?;
        std::thread::spawn(move || -> std::io::Result<std::net::TcpStream> {
            // SAFETY: setns on this thread only, with a descriptor it owns.
            if unsafe { libc::setns(net.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the namespace thread panicked"))?
        .with_context(|| format!("connecting to {addr} in the node's network namespace"))
    }

    /// Kills the namespaces' first process, and with it every process in them (the kernel
    /// kills a PID namespace's processes when its first one dies); does not wait.
    pub fn kill(&self) {
        // SAFETY: pidfd_send_signal(2) through the pidfd: never another process.
        unsafe {
            libc::syscall(libc::SYS_pidfd_send_signal, self.init.as_raw_fd(), libc::SIGKILL, 0, 0);
        }
    }

    /// Kills every process of the namespaces and waits (up to 10 s) until the first one is gone.
    pub fn stop(&mut self) {
        // The first process dies with `unshare` (--kill-child); its end kills the namespace.
        self.holder.stop();
        let mut poll = libc::pollfd { fd: self.init.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll(2) on one pidfd this struct owns.
        if unsafe { libc::poll(&raw mut poll, 1, 5_000) } == 1 {
            return;
        }
        self.kill();
        // SAFETY: poll(2) on one pidfd this struct owns.
        unsafe {
            libc::poll(&raw mut poll, 1, 5_000);
        }
    }
}

impl Drop for NodeNamespaces {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Relays TCP connections: each listener's connections go to its target, connected from the
/// host's network namespace. Runs on a thread of its own until dropped (or the process ends).
#[derive(Debug)]
pub struct Forwarder {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    open: tokio::sync::watch::Sender<bool>,
}

/// Holds a [`Forwarder`]'s bytes back while closed: a stalled network. Connections stay open
/// and nothing is lost; what was read waits until the gate opens again.
#[derive(Debug, Clone)]
pub struct Gate(tokio::sync::watch::Sender<bool>);

impl Gate {
    /// Stops relaying bytes (each connection may still take one buffer in).
    pub fn close(&self) {
        self.0.send_replace(false);
    }

    /// Relays again.
    pub fn open(&self) {
        self.0.send_replace(true);
    }
}

impl Forwarder {
    /// Starts relaying every `(listener, target)` pair.
    ///
    /// # Errors
    /// The runtime thread could not start.
    pub fn start(pairs: Vec<(std::net::TcpListener, SocketAddr)>) -> anyhow::Result<Self> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (open, _) = tokio::sync::watch::channel(true);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let listeners = {
            let _entered = runtime.enter();
            pairs
                .into_iter()
                .map(|(l, target)| Ok((tokio::net::TcpListener::from_std(l)?, target)))
                .collect::<std::io::Result<Vec<_>>>()
                .context("registering a relay's listener")?
        };
        let gate = open.clone();
        std::thread::Builder::new().name("ferry-testbed-forwarder".into()).spawn(move || {
            runtime.block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for (listener, target) in listeners {
                    tasks.spawn(relay(listener, target, gate.clone()));
                }
                let _ = stopped.await;
                tasks.abort_all();
            });
        })?;
        Ok(Self { stop: Some(stop), open })
    }

    /// The gate of every connection this forwarder relays, open at first.
    #[must_use]
    pub fn gate(&self) -> Gate {
        Gate(self.open.clone())
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn relay(
    listener: tokio::net::TcpListener,
    target: SocketAddr,
    gate: tokio::sync::watch::Sender<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (up, down) = (gate.subscribe(), gate.subscribe());
        connections.spawn(async move {
            if let Ok(outbound) = tokio::net::TcpStream::connect(target).await {
                let (from_client, to_client) = inbound.into_split();
                let (from_server, to_server) = outbound.into_split();
                tokio::join!(pump(from_client, to_server, up), pump(from_server, to_client, down));
            }
        });
        while connections.try_join_next().is_some() {}
    }
}

/// Copies one direction of a relayed connection, waiting while the gate is closed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut open: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if open.wait_for(|open| *open).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
