//! The values actions exchange with the host, and their wire forms.

use std::time::SystemTime;

use ferry_proto::generated;

/// The objects an action wants to see: namespace and resource include/exclude lists and a
/// label selector. Empty lists mean "no restriction"; Velero's `*` means "all".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceSelector {
    /// Namespaces to include.
    pub included_namespaces: Vec<String>,
    /// Namespaces to exclude.
    pub excluded_namespaces: Vec<String>,
    /// Resources to include, e.g. `persistentvolumeclaims` or `datauploads.velero.io`.
    pub included_resources: Vec<String>,
    /// Resources to exclude.
    pub excluded_resources: Vec<String>,
    /// A Kubernetes label selector, e.g. `app=db`; empty selects everything.
    pub label_selector: String,
}

impl ResourceSelector {
    /// A selector for the given resources in every namespace.
    pub fn resources<I, S>(resources: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            included_resources: resources.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// The same selector with `label_selector` set.
    #[must_use]
    pub fn with_label_selector(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = selector.into();
        self
    }
}

impl From<ResourceSelector> for generated::ResourceSelector {
    fn from(s: ResourceSelector) -> Self {
        Self {
            included_namespaces: s.included_namespaces,
            excluded_namespaces: s.excluded_namespaces,
            included_resources: s.included_resources,
            excluded_resources: s.excluded_resources,
            selector: s.label_selector,
        }
    }
}

impl From<generated::ResourceSelector> for ResourceSelector {
    fn from(s: generated::ResourceSelector) -> Self {
        Self {
            included_namespaces: s.included_namespaces,
            excluded_namespaces: s.excluded_namespaces,
            included_resources: s.included_resources,
            excluded_resources: s.excluded_resources,
            label_selector: s.selector,
        }
    }
}

/// Names one Kubernetes object: API group (empty for the core group), resource (plural,
/// lower case), namespace (empty for cluster-scoped objects) and name.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceIdentifier {
    /// API group, e.g. `velero.io`; empty for the core group.
    pub group: String,
    /// Resource, e.g. `persistentvolumes`.
    pub resource: String,
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ResourceIdentifier {
    /// A namespaced object.
    pub fn namespaced(
        group: impl Into<String>,
        resource: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            group: group.into(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// A cluster-scoped object.
    pub fn cluster_scoped(
        group: impl Into<String>,
        resource: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self::namespaced(group, resource, String::new(), name)
    }
}

impl From<ResourceIdentifier> for generated::ResourceIdentifier {
    fn from(r: ResourceIdentifier) -> Self {
        Self { group: r.group, resource: r.resource, namespace: r.namespace, name: r.name }
    }
}

impl From<generated::ResourceIdentifier> for ResourceIdentifier {
    fn from(r: generated::ResourceIdentifier) -> Self {
        Self { group: r.group, resource: r.resource, namespace: r.namespace, name: r.name }
    }
}

pub(crate) fn to_wire_ids(ids: Vec<ResourceIdentifier>) -> Vec<generated::ResourceIdentifier> {
    ids.into_iter().map(Into::into).collect()
}

/// The state of an asynchronous operation, as `Progress` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperationProgress {
    /// True once the operation has finished, successfully or not.
    pub completed: bool,
    /// Why the operation failed; `None` while it runs or when it succeeded.
    pub error: Option<String>,
    /// Units of work done so far.
    pub n_completed: i64,
    /// Units of work expected in total.
    pub n_total: i64,
    /// What the counts count, e.g. `bytes`.
    pub operation_units: String,
    /// A short human-readable status.
    pub description: String,
    /// When the operation started.
    pub started: Option<SystemTime>,
    /// When the progress was last updated.
    pub updated: Option<SystemTime>,
}

impl OperationProgress {
    /// A finished operation with nothing further to report.
    pub fn completed() -> Self {
        Self { completed: true, ..Self::default() }
    }
}

impl From<OperationProgress> for generated::OperationProgress {
    fn from(p: OperationProgress) -> Self {
        Self {
            completed: p.completed,
            err: p.error.unwrap_or_default(),
            n_completed: p.n_completed,
            n_total: p.n_total,
            operation_units: p.operation_units,
            description: p.description,
            started: p.started.map(Into::into),
            updated: p.updated.map(Into::into),
        }
    }
}

impl From<generated::OperationProgress> for OperationProgress {
    /// Timestamps outside `SystemTime`'s range become `None`.
    fn from(p: generated::OperationProgress) -> Self {
        Self {
            completed: p.completed,
            error: Some(p.err).filter(|e| !e.is_empty()),
            n_completed: p.n_completed,
            n_total: p.n_total,
            operation_units: p.operation_units,
            description: p.description,
            started: p.started.and_then(|t| SystemTime::try_from(t).ok()),
            updated: p.updated.and_then(|t| SystemTime::try_from(t).ok()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn progress_round_trips_through_the_wire_form() {
        let p = OperationProgress {
            completed: true,
            error: Some("boom".into()),
            n_completed: 10,
            n_total: 20,
            operation_units: "bytes".into(),
            description: "copying".into(),
            started: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            updated: Some(UNIX_EPOCH + Duration::new(1_700_000_060, 5)),
        };
        let wire = generated::OperationProgress::from(p.clone());
        assert_eq!(wire.err, "boom");
        assert_eq!(wire.started.as_ref().map(|t| t.seconds), Some(1_700_000_000));
        assert_eq!(wire.updated.as_ref().map(|t| t.nanos), Some(5));
        assert_eq!(OperationProgress::from(wire), p);

        let empty = generated::OperationProgress::from(OperationProgress::completed());
        assert!(empty.completed && empty.err.is_empty() && empty.started.is_none());
    }

    #[test]
    fn selector_and_identifier_map_field_by_field() {
        let s = ResourceSelector::resources(["pvc"]).with_label_selector("a=b");
        let wire = generated::ResourceSelector::from(s.clone());
        assert_eq!(wire.included_resources, ["pvc"]);
        assert_eq!(wire.selector, "a=b");
        assert_eq!(ResourceSelector::from(wire), s);

        let id = ResourceIdentifier::namespaced("velero.io", "datauploads", "velero", "du");
        let wire = generated::ResourceIdentifier::from(id.clone());
        assert_eq!(
            (
                wire.group.as_str(),
                wire.resource.as_str(),
                wire.namespace.as_str(),
                wire.name.as_str()
            ),
            ("velero.io", "datauploads", "velero", "du")
        );
        assert_eq!(ResourceIdentifier::from(wire), id);
        assert!(
            ResourceIdentifier::cluster_scoped("", "persistentvolumes", "pv").namespace.is_empty()
        );
    }
}
