//! `ferry plugin`: Ferry's Velero plugin process (the PVC backup/restore item actions, the
//! DataUpload delete action and the data-moving VolumeSnapshotter), served over go-plugin.
//!
//! Velero starts every executable in its plugins directory with its own flags
//! (`--log-level`, `--features`, …), never with a subcommand; so the binary also runs in this
//! mode when its file name starts with `velero-plugin` (the image installs it so).

use std::ffi::OsString;

use anyhow::Context;
use ferry_dmp::PluginContext;
use ferry_plugin::{HostArgs, PluginServer};

/// Whether the program was started under a plugin name.
pub fn started_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|n| n.starts_with("velero-plugin"))
}

/// Serves the plugins until Velero stops them. `args` are Velero's flags, read leniently.
pub async fn run(args: Vec<OsString>) -> anyhow::Result<()> {
    let host = HostArgs::parse(args);
    tracing::debug!(level = ?host.log_level, features = ?host.features, "plugin started");
    ferry_plugin::check_environment().context("ferry plugin")?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API server (in-cluster or KUBECONFIG)")?;
    let mut ctx = PluginContext::new(client);
    if let Ok(ns) = std::env::var("VELERO_NAMESPACE")
        && !ns.is_empty()
    {
        ctx = ctx.with_velero_namespace(ns);
    }
    if let Ok(mover) = std::env::var("FERRY_DATA_MOVER")
        && !mover.is_empty()
    {
        ctx = ctx.with_data_mover(mover);
    }
    let mut server = PluginServer::new();
    ferry_dmp::register(&mut server, &ctx).context("registering Ferry's plugins")?;
    server.serve().await.context("serving Velero's plugin protocol")
}
