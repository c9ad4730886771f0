//! [`PluginServer`]: several named plugins of different kinds, served to one plugin host.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::generated::backup_item_action_server::BackupItemActionServer as BackupV1Server;
use ferry_proto::generated::delete_item_action_server::DeleteItemActionServer;
use ferry_proto::generated::plugin_lister_server::PluginListerServer;
use ferry_proto::generated::restore_item_action_server::RestoreItemActionServer as RestoreV1Server;
use ferry_proto::generated::volume_snapshotter_server::VolumeSnapshotterServer as SnapshotterV1Server;
use ferry_proto::plugin::grpc_broker_server::GrpcBrokerServer;
use ferry_proto::plugin::grpc_controller_server::GrpcControllerServer;
use ferry_proto::plugin::grpc_stdio_server::GrpcStdioServer;
use ferry_proto::v2::backup_item_action_server::BackupItemActionServer as BackupV2Server;
use ferry_proto::v2::restore_item_action_server::RestoreItemActionServer as RestoreV2Server;
use ferry_proto::v2::volume_snapshotter_server::VolumeSnapshotterServer as SnapshotterV2Server;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Router;
use tonic_health::ServingStatus;

use crate::backup::{BackupItemAction, BackupItemActionV2};
use crate::delete::DeleteItemAction;
use crate::dispatch;
use crate::errors::{RegisterError, ServeError};
use crate::goplugin::{Broker, Controller, Stdio};
use crate::handshake::{self, HostEnv};
use crate::registry::{PluginIdentifier, Registry};
use crate::restore::{RestoreItemAction, RestoreItemActionV2};
use crate::snapshot::{VolumeSnapshotter, VolumeSnapshotterV2};
use crate::socket::{self, SocketDir};

/// The service name go-plugin's host checks with the gRPC health service.
const HEALTH_SERVICE: &str = "plugin";

/// How long open connections may take to finish after a shutdown request, by default.
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The plugins one process serves, and the go-plugin server that serves them.
///
/// Register each plugin under its kind and a name of the form `<DNS subdomain>/<name>`; one
/// process may serve any number of plugins of every kind (the same name may be used once per
/// kind). Then [`PluginServer::serve`] takes over until the host asks the plugin to exit.
pub struct PluginServer {
    registry: Registry,
    command: Option<String>,
    shutdown_grace: Duration,
}

impl Default for PluginServer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for PluginServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginServer")
            .field("plugins", &self.plugins())
            .field("shutdown_grace", &self.shutdown_grace)
            .finish()
    }
}

impl PluginServer {
    /// A server with no plugins.
    pub fn new() -> Self {
        Self {
            registry: Registry::default(),
            command: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }

    /// Sets the command `ListPlugins` reports. The host runs this command to start the plugin
    /// again, so it must be the path the host launched; the default is the process's first
    /// argument (as the host passed it), which is exactly that.
    pub fn set_command(&mut self, command: impl Into<String>) -> &mut Self {
        self.command = Some(command.into());
        self
    }

    /// Sets how long open calls and connections may take to finish once shutdown is requested
    /// (default 5 seconds); after that they are dropped.
    pub fn set_shutdown_grace(&mut self, grace: Duration) -> &mut Self {
        self.shutdown_grace = grace;
        self
    }

    /// Registers a version 1 backup item action.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for an invalid or duplicate name.
    pub fn register_backup_item_action(
        &mut self,
        name: &str,
        action: Arc<dyn BackupItemAction>,
    ) -> Result<&mut Self, RegisterError> {
        self.registry.add_backup_v1(name, action).map(|()| self)
    }

    /// Registers a version 2 backup item action.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for an invalid or duplicate name.
    pub fn register_backup_item_action_v2(
        &mut self,
        name: &str,
        action: Arc<dyn BackupItemActionV2>,
    ) -> Result<&mut Self, RegisterError> {
        self.registry.add_backup_v2(name, action).map(|()| self)
    }

    /// Registers a version 1 restore item action.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for an invalid or duplicate name.
    pub fn register_restore_item_action(
        &mut self,
        name: &str,
        action: Arc<dyn RestoreItemAction>,
    ) -> Result<&mut Self, RegisterError> {
        self.registry.add_restore_v1(name, action).map(|()| self)
    }

    /// Registers a version 2 restore item action.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for an invalid or duplicate name.
    pub fn register_restore_item_action_v2(
        &mut self,
        name: &str,
        action: Arc<dyn RestoreItemActionV2>,
    ) -> Result<&mut Self, RegisterError> {
        self.registry.add_restore_v2(name, action).map(|()| self)
    }

    /// Registers a delete item action.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for an invalid or duplicate name.
    pub fn register_delete_item_action(
        &mut self,
        name: &str,
        action: Arc<dyn DeleteItemAction>,
    ) -> Result<&mut Self, RegisterError> {
        self.registry.add_delete(name, action).map(|()| self)
    }

    /// Registers a version 1 volume snapshotter.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for an invalid or duplicate name.
    pub fn register_volume_snapshotter(
        &mut self,
        name: &str,
        snapshotter: Arc<dyn VolumeSnapshotter>,
    ) -> Result<&mut Self, RegisterError> {
        self.registry.add_snapshotter_v1(name, snapshotter).map(|()| self)
    }

    /// Registers a version 2 volume snapshotter.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for an invalid or duplicate name.
    pub fn register_volume_snapshotter_v2(
        &mut self,
        name: &str,
        snapshotter: Arc<dyn VolumeSnapshotterV2>,
    ) -> Result<&mut Self, RegisterError> {
        self.registry.add_snapshotter_v2(name, snapshotter).map(|()| self)
    }

    /// Every registered plugin. `ListPlugins` reports those of Velero's kinds, and those of
    /// Ferry's own kinds only to a host that asks for them ([`HostEnv::extra_kinds`]).
    pub fn plugins(&self) -> Vec<PluginIdentifier> {
        self.registry.identifiers(&self.command())
    }

    fn command(&self) -> String {
        self.command.clone().unwrap_or_else(|| {
            std::env::args_os().next().map(|a| a.to_string_lossy().into_owned()).unwrap_or_default()
        })
    }

    /// Serves the registered plugins to the host that launched this process, until the host
    /// asks the plugin to exit (`GRPCController/Shutdown`) or the process receives `SIGTERM`.
    /// `SIGINT` is ignored, as go-plugin does: a Ctrl-C meant for the host reaches its plugins
    /// too, and the host stops them itself.
    ///
    /// Checks the environment ([`crate::check_environment`]), listens, prints the handshake line
    /// on stdout, serves, and removes the socket's directory before returning.
    ///
    /// # Errors
    ///
    /// [`ServeError`]: not launched by Velero, an unsupported host protocol, or a failure to
    /// listen, announce, serve or clean up.
    pub async fn serve(self) -> Result<(), ServeError> {
        let env = handshake::check_environment()?;
        let shutdown = CancellationToken::new();
        let signals = watch_signals(shutdown.clone())?;
        let result = self.serve_with_shutdown(&env, shutdown).await;
        signals.abort();
        result
    }

    /// Like [`PluginServer::serve`] with an environment already checked and without signal
    /// handling: serving stops when `shutdown` is cancelled (which `GRPCController/Shutdown`
    /// does too).
    ///
    /// # Errors
    ///
    /// As [`PluginServer::serve`], apart from the environment checks.
    pub async fn serve_with_shutdown(
        self,
        env: &HostEnv,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        let (socket_dir, listener) = SocketDir::bind(env)?;
        let socket = socket_dir.socket().to_owned();
        let (plugins, unlisted): (Vec<_>, Vec<_>) =
            self.plugins().into_iter().partition(|p| env.lists(p.kind));
        for p in &unlisted {
            tracing::info!(
                kind = %p.kind,
                name = %p.name,
                "not listing this plugin: Velero does not know its kind (a host that does sets \
                 FERRY_PLUGIN_EXTRA_KINDS); it is served all the same"
            );
        }
        let grace = self.shutdown_grace;
        let router = router(self.registry, plugins.clone(), &shutdown).await;

        handshake::announce(&handshake::handshake_line(&socket, env.multiplex_requested))?;
        tracing::info!(socket = %socket.display(), plugins = plugins.len(), "serving Velero plugins");

        let serving = router.serve_with_incoming_shutdown(
            socket::incoming(listener),
            shutdown.clone().cancelled_owned(),
        );
        let served = tokio::select! {
            result = serving => result.map_err(|source| ServeError::Serve { path: socket.clone(), source }),
            () = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
                tracing::warn!(?grace, "connections still open after the shutdown grace period; closing them");
                Ok(())
            }
        };
        tracing::info!("plugin server stopped");
        let removed = socket_dir.remove();
        served.and(removed)
    }
}

/// Every service the host may call: go-plugin's, health, and one per plugin kind.
async fn router(
    registry: Registry,
    plugins: Vec<PluginIdentifier>,
    shutdown: &CancellationToken,
) -> Router {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_service_status(HEALTH_SERVICE, ServingStatus::Serving).await;
    let registry = Arc::new(registry);
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(GrpcControllerServer::new(Controller { shutdown: shutdown.clone() }))
        .add_service(GrpcStdioServer::new(Stdio { shutdown: shutdown.clone() }))
        .add_service(GrpcBrokerServer::new(Broker { shutdown: shutdown.clone() }))
        .add_service(PluginListerServer::new(dispatch::Lister(plugins)))
        .add_service(BackupV1Server::new(dispatch::BackupV1(registry.clone())))
        .add_service(BackupV2Server::new(dispatch::BackupV2(registry.clone())))
        .add_service(RestoreV1Server::new(dispatch::RestoreV1(registry.clone())))
        .add_service(RestoreV2Server::new(dispatch::RestoreV2(registry.clone())))
        .add_service(DeleteItemActionServer::new(dispatch::Delete(registry.clone())))
        .add_service(SnapshotterV1Server::new(dispatch::SnapshotterV1(registry.clone())))
        .add_service(SnapshotterV2Server::new(dispatch::SnapshotterV2(registry)))
}

/// Cancels `shutdown` on `SIGTERM`; logs and ignores `SIGINT`.
fn watch_signals(shutdown: CancellationToken) -> Result<JoinHandle<()>, ServeError> {
    let mut term = signal(SignalKind::terminate())
        .map_err(|source| ServeError::Signals { signal: "SIGTERM", source })?;
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|source| ServeError::Signals { signal: "SIGINT", source })?;
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => {
                    tracing::info!("SIGTERM received; shutting down");
                    shutdown.cancel();
                    return;
                }
                _ = interrupt.recv() => {
                    tracing::debug!("ignoring SIGINT: the plugin host decides when its plugins stop");
                }
                () = shutdown.cancelled() => return,
            }
        }
    }))
}
