//! The plugins one process serves, by kind and name.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backup::{BackupItemAction, BackupItemActionV2};
use crate::delete::DeleteItemAction;
use crate::errors::{RegisterError, RequestError};
use crate::kind::PluginKind;
use crate::restore::{RestoreItemAction, RestoreItemActionV2};
use crate::snapshot::{VolumeSnapshotter, VolumeSnapshotterV2};

/// One plugin served by a process, as `ListPlugins` reports it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PluginIdentifier {
    /// The command that runs the plugin (the executable's path as the host launched it).
    pub command: String,
    /// The plugin's kind.
    pub kind: PluginKind,
    /// The plugin's registered name.
    pub name: String,
}

/// Checks `name` against Velero's rule for plugin names: `<DNS subdomain>/<non-empty name>`,
/// e.g. `ferry.dev/pvc-backup`.
///
/// # Errors
///
/// The rule broken, in words.
pub fn validate_plugin_name(name: &str) -> Result<(), String> {
    let Some((domain, rest)) = name.split_once('/') else {
        return Err("must have the form <DNS subdomain>/<name>, e.g. example.com/my-action".into());
    };
    if rest.contains('/') {
        return Err("must contain exactly one '/'".into());
    }
    if domain.is_empty() || rest.is_empty() {
        return Err("both parts around the '/' must be non-empty".into());
    }
    if domain.len() > 253 {
        return Err(format!("the first part {domain:?} is longer than 253 characters"));
    }
    for label in domain.split('.') {
        let alnum =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        let valid = alnum(label.chars().next())
            && alnum(label.chars().last())
            && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            return Err(format!(
                "the first part {domain:?} must be a DNS subdomain: lower-case letters, digits, \
                 '-' and '.', each dot-separated part starting and ending with a letter or digit"
            ));
        }
    }
    Ok(())
}

/// The plugins of one kind, by name.
pub(crate) struct Plugins<T: ?Sized> {
    kind: PluginKind,
    by_name: BTreeMap<String, Arc<T>>,
}

impl<T: ?Sized> Plugins<T> {
    fn new(kind: PluginKind) -> Self {
        Self { kind, by_name: BTreeMap::new() }
    }

    pub(crate) fn kind(&self) -> PluginKind {
        self.kind
    }

    fn insert(&mut self, name: &str, plugin: Arc<T>) -> Result<(), RegisterError> {
        validate_plugin_name(name).map_err(|reason| RegisterError::InvalidName {
            kind: self.kind,
            name: name.to_owned(),
            reason,
        })?;
        if self.by_name.contains_key(name) {
            return Err(RegisterError::Duplicate { kind: self.kind, name: name.to_owned() });
        }
        self.by_name.insert(name.to_owned(), plugin);
        Ok(())
    }

    /// The plugin registered as `name`.
    pub(crate) fn get(&self, name: &str) -> Result<Arc<T>, RequestError> {
        self.by_name.get(name).cloned().ok_or_else(|| RequestError::UnknownPlugin {
            kind: self.kind,
            name: name.to_owned(),
            registered: if self.by_name.is_empty() {
                "none".to_owned()
            } else {
                self.by_name.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
            },
        })
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

/// Every plugin a process serves.
pub(crate) struct Registry {
    pub(crate) backup_v1: Plugins<dyn BackupItemAction>,
    pub(crate) backup_v2: Plugins<dyn BackupItemActionV2>,
    pub(crate) restore_v1: Plugins<dyn RestoreItemAction>,
    pub(crate) restore_v2: Plugins<dyn RestoreItemActionV2>,
    pub(crate) delete: Plugins<dyn DeleteItemAction>,
    pub(crate) snapshotter_v1: Plugins<dyn VolumeSnapshotter>,
    pub(crate) snapshotter_v2: Plugins<dyn VolumeSnapshotterV2>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            backup_v1: Plugins::new(PluginKind::BackupItemAction),
            backup_v2: Plugins::new(PluginKind::BackupItemActionV2),
            restore_v1: Plugins::new(PluginKind::RestoreItemAction),
            restore_v2: Plugins::new(PluginKind::RestoreItemActionV2),
            delete: Plugins::new(PluginKind::DeleteItemAction),
            snapshotter_v1: Plugins::new(PluginKind::VolumeSnapshotter),
            snapshotter_v2: Plugins::new(PluginKind::VolumeSnapshotterV2),
        }
    }
}

impl Registry {
    pub(crate) fn add_backup_v1(
        &mut self,
        name: &str,
        p: Arc<dyn BackupItemAction>,
    ) -> Result<(), RegisterError> {
        self.backup_v1.insert(name, p)
    }

    pub(crate) fn add_backup_v2(
        &mut self,
        name: &str,
        p: Arc<dyn BackupItemActionV2>,
    ) -> Result<(), RegisterError> {
        self.backup_v2.insert(name, p)
    }

    pub(crate) fn add_restore_v1(
        &mut self,
        name: &str,
        p: Arc<dyn RestoreItemAction>,
    ) -> Result<(), RegisterError> {
        self.restore_v1.insert(name, p)
    }

    pub(crate) fn add_restore_v2(
        &mut self,
        name: &str,
        p: Arc<dyn RestoreItemActionV2>,
    ) -> Result<(), RegisterError> {
        self.restore_v2.insert(name, p)
    }

    pub(crate) fn add_delete(
        &mut self,
        name: &str,
        p: Arc<dyn DeleteItemAction>,
    ) -> Result<(), RegisterError> {
        self.delete.insert(name, p)
    }

    pub(crate) fn add_snapshotter_v1(
        &mut self,
        name: &str,
        p: Arc<dyn VolumeSnapshotter>,
    ) -> Result<(), RegisterError> {
        self.snapshotter_v1.insert(name, p)
    }

    pub(crate) fn add_snapshotter_v2(
        &mut self,
        name: &str,
        p: Arc<dyn VolumeSnapshotterV2>,
    ) -> Result<(), RegisterError> {
        self.snapshotter_v2.insert(name, p)
    }

    /// Every registered plugin, in [`PluginKind::ALL`] order, then by name.
    pub(crate) fn identifiers(&self, command: &str) -> Vec<PluginIdentifier> {
        let mut ids = Vec::new();
        for kind in PluginKind::ALL {
            let names: Vec<&str> = match kind {
                PluginKind::BackupItemAction => self.backup_v1.names().collect(),
                PluginKind::BackupItemActionV2 => self.backup_v2.names().collect(),
                PluginKind::RestoreItemAction => self.restore_v1.names().collect(),
                PluginKind::RestoreItemActionV2 => self.restore_v2.names().collect(),
                PluginKind::DeleteItemAction => self.delete.names().collect(),
                PluginKind::VolumeSnapshotter => self.snapshotter_v1.names().collect(),
                PluginKind::VolumeSnapshotterV2 => self.snapshotter_v2.names().collect(),
            };
            ids.extend(names.into_iter().map(|name| PluginIdentifier {
                command: command.to_owned(),
                kind,
                name: name.to_owned(),
            }));
        }
        ids
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn accepts_velero_style_names() {
        for name in ["ferry.dev/pvc-backup", "velero.io/csi-pvc-backupper", "a/b", "x-1.y/Any Name"]
        {
            assert_eq!(validate_plugin_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn rejects_names_velero_rejects() {
        for name in [
            "",
            "no-slash",
            "/empty-domain",
            "empty-name/",
            "a/b/c",
            "Upper.dev/x",
            "-dash.dev/x",
            "dash-.dev/x",
            "double..dot/x",
            "under_score.dev/x",
        ] {
            assert!(validate_plugin_name(name).is_err(), "{name:?} should be rejected");
        }
        assert!(validate_plugin_name(&format!("{}/x", "a".repeat(254))).is_err());
    }

    struct Nothing;

    #[async_trait::async_trait]
    impl DeleteItemAction for Nothing {
        async fn applies_to(&self) -> Result<crate::ResourceSelector, crate::PluginError> {
            Ok(crate::ResourceSelector::default())
        }
        async fn execute(&self, _: crate::DeleteItemInput) -> Result<(), crate::PluginError> {
            Ok(())
        }
    }

    #[test]
    fn rejects_duplicates_per_kind_and_names_the_registered_ones() {
        let mut r = Registry::default();
        r.add_delete("ferry.dev/b", Arc::new(Nothing)).unwrap();
        r.add_delete("ferry.dev/a", Arc::new(Nothing)).unwrap();
        let dup = r.add_delete("ferry.dev/a", Arc::new(Nothing)).unwrap_err();
        assert!(matches!(dup, RegisterError::Duplicate { kind: PluginKind::DeleteItemAction, .. }));
        let bad = r.add_delete("bad", Arc::new(Nothing)).unwrap_err();
        assert!(bad.to_string().contains("\"bad\""), "{bad}");

        let err = r.delete.get("ferry.dev/c").err().unwrap();
        let msg = err.to_string();
        assert!(msg.contains("DeleteItemAction") && msg.contains("\"ferry.dev/c\""), "{msg}");
        assert!(msg.contains("ferry.dev/a, ferry.dev/b"), "{msg}");
        assert!(r.backup_v2.get("ferry.dev/a").err().unwrap().to_string().contains("none"));

        let ids = r.identifiers("/plugins/ferry");
        let names: Vec<_> = ids.iter().map(|i| (i.kind, i.name.as_str())).collect();
        assert_eq!(
            names,
            [
                (PluginKind::DeleteItemAction, "ferry.dev/a"),
                (PluginKind::DeleteItemAction, "ferry.dev/b")
            ]
        );
        assert!(ids.iter().all(|i| i.command == "/plugins/ferry"));
    }
}
