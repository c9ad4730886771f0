//! [`PluginContext`]: what every action of the plugin shares.

use std::time::Duration;

use ferry_api::{DEFAULT_DATA_MOVER, DEFAULT_VELERO_NAMESPACE};

/// How often the plugin looks at a new VolumeSnapshot while waiting for its snapshot handle
/// (Velero polls every 5 seconds).
pub const DEFAULT_SNAPSHOT_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// The client and settings every action of the plugin works with. Cheap to clone.
///
/// The plugin keeps no other state: every operation lives in the cluster as a DataUpload or
/// DataDownload labelled with its operation ID, so a restarted plugin process answers
/// `Progress` and `Cancel` exactly as the one that started the operation.
#[derive(Clone)]
pub struct PluginContext {
    pub(crate) client: kube::Client,
    pub(crate) velero_namespace: String,
    pub(crate) data_mover: String,
    pub(crate) snapshot_poll_interval: Duration,
}

impl std::fmt::Debug for PluginContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginContext")
            .field("velero_namespace", &self.velero_namespace)
            .field("data_mover", &self.data_mover)
            .field("snapshot_poll_interval", &self.snapshot_poll_interval)
            .finish_non_exhaustive()
    }
}

impl PluginContext {
    /// A context for Velero in namespace `velero`, claiming backups whose `spec.datamover` is
    /// `ferry`.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            velero_namespace: DEFAULT_VELERO_NAMESPACE.to_owned(),
            data_mover: DEFAULT_DATA_MOVER.to_owned(),
            snapshot_poll_interval: DEFAULT_SNAPSHOT_POLL_INTERVAL,
        }
    }

    /// Sets the namespace Velero runs in, where DataUploads and DataDownloads live. Velero's
    /// plugins take it from the `VELERO_NAMESPACE` environment variable of the Velero server.
    #[must_use]
    pub fn with_velero_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.velero_namespace = namespace.into();
        self
    }

    /// Sets the data mover name this plugin acts for (a Backup's `spec.datamover`).
    #[must_use]
    pub fn with_data_mover(mut self, name: impl Into<String>) -> Self {
        self.data_mover = name.into();
        self
    }

    /// Sets how often a new VolumeSnapshot is looked at while waiting for its handle.
    #[must_use]
    pub fn with_snapshot_poll_interval(mut self, interval: Duration) -> Self {
        self.snapshot_poll_interval = interval;
        self
    }

    /// The namespace Velero runs in.
    #[must_use]
    pub fn velero_namespace(&self) -> &str {
        &self.velero_namespace
    }

    /// The data mover name this plugin acts for.
    #[must_use]
    pub fn data_mover(&self) -> &str {
        &self.data_mover
    }
}
