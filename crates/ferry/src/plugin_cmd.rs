//! `ferry plugin`: Ferry's Velero plugin process, served over go-plugin: beside a Velero server
//! the DataUpload delete action only (Velero's own CSI support creates Ferry's DataUploads);
//! with `FERRY_PLUGIN_ACTIONS=all` also the PVC backup/restore item actions and the
//! data-moving VolumeSnapshotter, for hosts without Velero's CSI support.
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
    let actions = plugin_actions(std::env::var("FERRY_PLUGIN_ACTIONS").ok().as_deref())?;
    tracing::debug!(?actions, "serving Ferry's plugin actions");
    let mut server = PluginServer::new();
    ferry_dmp::register(&mut server, &ctx, actions).context("registering Ferry's plugins")?;
    server.serve().await.context("serving Velero's plugin protocol")
}

/// The actions to serve, from `FERRY_PLUGIN_ACTIONS`: unset or `velero` (beside a Velero
/// server, whose own CSI support creates Ferry's DataUploads: the DataUpload delete action
/// only), `all` (every action, for hosts without Velero's CSI support).
fn plugin_actions(value: Option<&str>) -> anyhow::Result<ferry_dmp::Actions> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(ferry_dmp::Actions::default()),
        Some(text) => {
            text.parse().map_err(|e: String| anyhow::anyhow!("FERRY_PLUGIN_ACTIONS: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beside_velero_is_the_default_and_all_is_asked_for() -> anyhow::Result<()> {
        assert_eq!(plugin_actions(None)?, ferry_dmp::Actions::BesideVelero);
        assert_eq!(plugin_actions(Some(""))?, ferry_dmp::Actions::BesideVelero);
        assert_eq!(plugin_actions(Some("velero"))?, ferry_dmp::Actions::BesideVelero);
        assert_eq!(plugin_actions(Some("all"))?, ferry_dmp::Actions::All);
        let Err(err) = plugin_actions(Some("pvc")) else { anyhow::bail!("pvc accepted") };
        let err = err.to_string();
        assert!(err.contains("FERRY_PLUGIN_ACTIONS") && err.contains("`all`"), "{err}");
        Ok(())
    }
}
