//! Launching a plugin binary as Velero does (hashicorp go-plugin's client): the magic cookie
//! and protocol environment, Velero's `--log-level` (and `--features`) flags, the handshake
//! line on stdout within the start timeout, gRPC over the socket it names, `ListPlugins`, and
//! `GRPCController/Shutdown` to stop it.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use ferry_proto::generated::PluginIdentifier;
use ferry_proto::generated::plugin_lister_client::PluginListerClient;
use ferry_proto::plugin::grpc_controller_client::GrpcControllerClient;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::{Channel, Endpoint};

/// Why a plugin could not be launched or talked to.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The binary could not be started.
    #[error("starting plugin {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No handshake line in time, or the plugin exited first.
    #[error("plugin {path} printed no handshake line within {timeout:?}{exited}")]
    NoHandshake {
        /// The binary.
        path: PathBuf,
        /// How long the host waited.
        timeout: Duration,
        /// `": it exited with …"` when it did.
        exited: String,
    },
    /// The handshake line is not go-plugin's.
    #[error("plugin {path}: bad handshake line {line:?}: {reason}")]
    BadHandshake {
        /// The binary.
        path: PathBuf,
        /// What it printed.
        line: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The socket named in the handshake cannot be reached.
    #[error("connecting to plugin {path} at {address}: {source}")]
    Connect {
        /// The binary.
        path: PathBuf,
        /// The address from the handshake.
        address: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// A call failed.
    #[error("plugin {path}: {call}: {source}")]
    Call {
        /// The binary.
        path: PathBuf,
        /// The gRPC method.
        call: &'static str,
        /// The status.
        #[source]
        source: Box<tonic::Status>,
    },
    /// Waiting for the process failed.
    #[error("waiting for plugin {path}: {source}")]
    Wait {
        /// The binary.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The parts of go-plugin's handshake line `CORE|APP|NETWORK|ADDRESS|PROTOCOL[|CERT]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// `unix` or `tcp`.
    pub network: String,
    /// Socket path or `host:port`.
    pub address: String,
}

impl Handshake {
    /// Reads the line as go-plugin's client does, for Velero's protocol version 2 over gRPC.
    ///
    /// # Errors
    /// The reason, for [`LaunchError::BadHandshake`].
    pub fn parse(line: &str) -> Result<Self, &'static str> {
        let parts: Vec<&str> = line.trim_end().splitn(6, '|').collect();
        if parts.len() < 5 {
            return Err("expected CORE|APP|NETWORK|ADDRESS|PROTOCOL");
        }
        if parts[0] != "1" {
            return Err("core protocol version is not 1");
        }
        if parts[1] != "2" {
            return Err("plugin protocol version is not 2 (Velero's)");
        }
        if parts[2] != "unix" && parts[2] != "tcp" {
            return Err("network is neither unix nor tcp");
        }
        if parts[3].is_empty() {
            return Err("no address");
        }
        if parts[4] != "grpc" {
            return Err("protocol is not grpc");
        }
        if parts.get(5).is_some_and(|cert| !cert.is_empty()) {
            return Err("the plugin asks for mutual TLS, which Velero does not use");
        }
        Ok(Self { network: parts[2].to_owned(), address: parts[3].to_owned() })
    }

    fn endpoint(&self) -> String {
        if self.network == "unix" {
            format!("unix:{}", self.address)
        } else {
            format!("http://{}", self.address)
        }
    }
}

/// How to launch plugins.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Velero's log level flag value.
    pub log_level: String,
    /// Velero's feature flags (`--features`, only when not empty).
    pub features: Vec<String>,
    /// Extra environment (the rest is inherited, as go-plugin does).
    pub env: Vec<(String, String)>,
    /// How long the plugin may take to print its handshake (go-plugin: one minute).
    pub start_timeout: Duration,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        Self {
            log_level: "info".to_owned(),
            features: Vec::new(),
            env: Vec::new(),
            start_timeout: Duration::from_secs(60),
        }
    }
}

/// A running plugin process; killed when dropped.
#[derive(Debug)]
pub struct PluginProcess {
    path: PathBuf,
    child: Child,
    channel: Channel,
    /// The handshake it printed.
    pub handshake: Handshake,
}

impl PluginProcess {
    /// Starts `program` as Velero does and connects to it.
    ///
    /// # Errors
    /// [`LaunchError`] naming the step and the binary.
    pub async fn launch(program: &Path, options: &LaunchOptions) -> Result<Self, LaunchError> {
        let path = program.to_path_buf();
        let mut cmd = Command::new(program);
        cmd.args(["--log-level", &options.log_level]);
        if !options.features.is_empty() {
            cmd.args(["--features", &options.features.join(",")]);
        }
        cmd.env("VELERO_PLUGIN", "hello")
            .env("PLUGIN_PROTOCOL_VERSIONS", "2")
            .env("PLUGIN_MIN_PORT", "10000")
            .env("PLUGIN_MAX_PORT", "25000")
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child =
            cmd.spawn().map_err(|source| LaunchError::Spawn { path: path.clone(), source })?;
        let name =
            program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if let Some(stderr) = child.stderr.take() {
            let name = name.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(plugin = %name, "{line}");
                }
            });
        }
        let stdout = child.stdout.take();
        let first = async {
            let mut lines = BufReader::new(stdout?).lines();
            let line = lines.next_line().await.ok().flatten();
            // go-plugin logs whatever else the plugin prints on stdout.
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(plugin = %name, stdout = %line);
                }
            });
            line
        };
        let line = match tokio::time::timeout(options.start_timeout, first).await {
            Ok(Some(line)) => line,
            _ => {
                let exited = match child.try_wait() {
                    Ok(Some(status)) => format!(": it exited with {status}"),
                    _ => String::new(),
                };
                return Err(LaunchError::NoHandshake {
                    path,
                    timeout: options.start_timeout,
                    exited,
                });
            }
        };
        let handshake = Handshake::parse(&line).map_err(|reason| LaunchError::BadHandshake {
            path: path.clone(),
            line: line.clone(),
            reason,
        })?;
        let address = handshake.endpoint();
        let channel = Endpoint::from_shared(address.clone())
            .map_err(|source| LaunchError::Connect {
                path: path.clone(),
                address: address.clone(),
                source,
            })?
            .connect()
            .await
            .map_err(|source| LaunchError::Connect { path: path.clone(), address, source })?;
        Ok(Self { path, child, channel, handshake })
    }

    /// A channel to the plugin's gRPC server.
    #[must_use]
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The process ID (while it runs).
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The plugins the process serves (`PluginLister/ListPlugins`).
    ///
    /// # Errors
    /// [`LaunchError::Call`].
    pub async fn list_plugins(&self) -> Result<Vec<PluginIdentifier>, LaunchError> {
        let reply = PluginListerClient::new(self.channel())
            .list_plugins(ferry_proto::generated::Empty {})
            .await
            .map_err(|s| self.call_error("ListPlugins", s))?;
        Ok(reply.into_inner().plugins)
    }

    /// Asks the plugin to exit (`GRPCController/Shutdown`) and waits up to `grace`, then kills it.
    ///
    /// # Errors
    /// [`LaunchError::Wait`] when the process cannot be waited for.
    pub async fn shutdown(mut self, grace: Duration) -> Result<ExitStatus, LaunchError> {
        let asked =
            GrpcControllerClient::new(self.channel()).shutdown(ferry_proto::plugin::Empty {}).await;
        if let Err(e) = asked {
            tracing::debug!(plugin = %self.path.display(), error = %e, "shutdown call failed");
        }
        let path = self.path.clone();
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.map_err(|source| LaunchError::Wait { path, source }),
            Err(_) => {
                let _ = self.child.start_kill();
                self.child.wait().await.map_err(|source| LaunchError::Wait { path, source })
            }
        }
    }

    /// Kills the process at once (SIGKILL), as a crash would, and reaps it.
    ///
    /// # Errors
    /// [`LaunchError::Wait`].
    pub async fn kill(mut self) -> Result<ExitStatus, LaunchError> {
        let _ = self.child.start_kill();
        let path = self.path.clone();
        self.child.wait().await.map_err(|source| LaunchError::Wait { path, source })
    }

    pub(crate) fn call_error(&self, call: &'static str, status: tonic::Status) -> LaunchError {
        LaunchError::Call { path: self.path.clone(), call, source: Box::new(status) }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn handshake_lines_are_read_as_go_plugin_reads_them() {
        let ok = Handshake::parse("1|2|unix|/tmp/p/plugin.sock|grpc\n").unwrap();
        assert_eq!(ok.endpoint(), "unix:/tmp/p/plugin.sock");
        let tcp = Handshake::parse("1|2|tcp|127.0.0.1:10001|grpc|").unwrap();
        assert_eq!(tcp.endpoint(), "http://127.0.0.1:10001");
        for (line, reason) in [
            ("", "expected CORE|APP|NETWORK|ADDRESS|PROTOCOL"),
            ("hello world", "expected CORE|APP|NETWORK|ADDRESS|PROTOCOL"),
            ("2|2|unix|/s|grpc", "core protocol version is not 1"),
            ("1|1|unix|/s|grpc", "plugin protocol version is not 2 (Velero's)"),
            ("1|2|pipe|/s|grpc", "network is neither unix nor tcp"),
            ("1|2|unix||grpc", "no address"),
            ("1|2|unix|/s|netrpc", "protocol is not grpc"),
            ("1|2|unix|/s|grpc|MIIB", "the plugin asks for mutual TLS, which Velero does not use"),
        ] {
            assert_eq!(Handshake::parse(line), Err(reason), "{line:?}");
        }
    }
}
