//! The plugin kinds this SDK serves, named as Velero's `ListPlugins` reports them.

use std::fmt;

/// A kind of plugin. [`PluginKind::as_str`] is the name on the wire (`ListPlugins`' `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PluginKind {
    /// `BackupItemAction`: version 1, synchronous (service `generated.BackupItemAction`).
    BackupItemAction,
    /// `BackupItemActionV2`: asynchronous operations (service `v2.BackupItemAction`).
    BackupItemActionV2,
    /// `RestoreItemAction`: version 1, synchronous (service `generated.RestoreItemAction`).
    RestoreItemAction,
    /// `RestoreItemActionV2`: asynchronous operations (service `v2.RestoreItemAction`).
    RestoreItemActionV2,
    /// `DeleteItemAction` (service `generated.DeleteItemAction`).
    DeleteItemAction,
    /// `VolumeSnapshotter`: version 1 (service `generated.VolumeSnapshotter`).
    VolumeSnapshotter,
    /// `VolumeSnapshotterV2`: Ferry's version 2 with `Progress` and `Cancel` (service
    /// `v2.VolumeSnapshotter`).
    VolumeSnapshotterV2,
}

impl PluginKind {
    /// Every kind, in the order `ListPlugins` reports them.
    pub const ALL: [Self; 7] = [
        Self::BackupItemAction,
        Self::BackupItemActionV2,
        Self::VolumeSnapshotter,
        Self::VolumeSnapshotterV2,
        Self::RestoreItemAction,
        Self::RestoreItemActionV2,
        Self::DeleteItemAction,
    ];

    /// The kind named `name` on the wire.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether Velero knows this kind. Velero's host rejects a `ListPlugins` answer naming a
    /// kind it does not know, failing the discovery of every plugin (and Velero's start), so
    /// the server lists Ferry's own kinds only to hosts that ask for them.
    pub fn is_velero_kind(self) -> bool {
        self != Self::VolumeSnapshotterV2
    }

    /// The kind's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BackupItemAction => "BackupItemAction",
            Self::BackupItemActionV2 => "BackupItemActionV2",
            Self::RestoreItemAction => "RestoreItemAction",
            Self::RestoreItemActionV2 => "RestoreItemActionV2",
            Self::DeleteItemAction => "DeleteItemAction",
            Self::VolumeSnapshotter => "VolumeSnapshotter",
            Self::VolumeSnapshotterV2 => "VolumeSnapshotterV2",
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_are_velero_kind_names_and_distinct() {
        let names: std::collections::BTreeSet<_> =
            PluginKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), PluginKind::ALL.len());
        assert_eq!(PluginKind::BackupItemActionV2.to_string(), "BackupItemActionV2");
        assert_eq!(PluginKind::VolumeSnapshotter.as_str(), "VolumeSnapshotter");
        for kind in PluginKind::ALL {
            assert_eq!(PluginKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(PluginKind::from_name("ObjectStore"), None);
        let extensions: Vec<_> =
            PluginKind::ALL.into_iter().filter(|k| !k.is_velero_kind()).collect();
        assert_eq!(extensions, [PluginKind::VolumeSnapshotterV2]);
    }
}
