//! What the exposers need to know about the cluster and the node, and how Velero's node-agent
//! ConfigMap sets it ([`ExposerConfig::apply_node_agent_config`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ferry_api::DEFAULT_VELERO_NAMESPACE;
use ferry_api::k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use ferry_api::k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use ferry_api::keys::{DATA_DOWNLOAD_LABEL, DATA_UPLOAD_LABEL};
use ferry_api::node_agent_config::{NodeAgentConfig, SelectorError, selector_matches};

use crate::placement::{self, LoadAffinity};
use crate::resources::{PodResourcesError, pod_resources};

/// Settings shared by both exposers.
#[derive(Debug, Clone, PartialEq)]
pub struct ExposerConfig {
    /// Velero's namespace: the backup/restore PVCs, pods and snapshots are created there.
    pub namespace: String,
    /// The kubelet's root directory as this agent sees it (a DaemonSet mounts the host's
    /// `/var/lib/kubelet` with `HostToContainer` propagation). Volumes are found under
    /// `<kubelet_root>/pods/<podUID>/`.
    pub kubelet_root: PathBuf,
    /// The node this agent runs on, whose kubelet's directory is the one at `kubelet_root`
    /// (`None`: taken to be the node of every holding pod).
    pub node_name: Option<String>,
    /// The image of the pods that hold exposed volumes (the agent's own image).
    pub pod_image: String,
    /// The command those pods run: it must only wait.
    pub pod_command: Vec<String>,
    /// Backup PVC storage class per source storage class (the node-agent ConfigMap's
    /// `backupPVC.<class>.storageClass`); unlisted classes keep their own.
    pub backup_storage_class: BTreeMap<String, String>,
    /// Source storage classes whose backup PVCs are read-only (`backupPVC.<class>.readOnly`):
    /// `ReadOnlyMany` access, a read-only mount.
    pub backup_read_only: Vec<String>,
    /// Restore without waiting for a WaitForFirstConsumer target PVC's selected node
    /// (`restorePVC.ignoreDelayBinding`).
    pub ignore_delay_binding: bool,
    /// A priority class for the pods, if any.
    pub priority_class_name: Option<String>,
    /// How long a holding pod may stay unschedulable before the CR fails with the
    /// scheduler's reason (instead of waiting out the whole operation timeout). Not counted
    /// while the scheduler only waits for the pod's claim to be bound (still provisioning):
    /// past it, that wait is told in a `WaitingForProvisioning` Event with what the cluster
    /// last said of the claim.
    pub unschedulable_grace: Duration,
    /// How long the agent looks for an exposed volume on its node before it says, in a log
    /// line and a Warning Event on the CR, what it is still waiting for (the holding pod, the
    /// bind, or the kubelet's mount at the path it expects).
    pub volume_wait_grace: Duration,
    /// Where holding pods may run (`loadAffinity`), per storage class or for all; see
    /// [`ExposerConfig::load_affinity_for`].
    pub load_affinity: Vec<LoadAffinity>,
    /// The holding pods' resources (`podResources`). Default: small requests (10m CPU, 16Mi
    /// memory) and limits (100m CPU, 64Mi memory: `ferry hold` keeps about 10 MiB resident),
    /// as the pods only wait; Ferry's agent moves the data.
    pub pod_resources: ResourceRequirements,
    /// Labels added to the holding pods (`podLabels`). Ferry's own labels (the CR's name,
    /// `ferry.io/created-by`) are set over them: the exposers find their objects by those.
    pub pod_labels: BTreeMap<String, String>,
    /// Annotations added to the holding pods (`podAnnotations`).
    pub pod_annotations: BTreeMap<String, String>,
    /// The agent's own tolerations (its DaemonSet's): the holding pods get them, except
    /// toleration of cordoned nodes (see [`crate::holder_tolerations`]). Empty: none.
    pub agent_tolerations: Vec<Toleration>,
    /// Keep the physical snapshot of each completed block backup (its VolumeSnapshotContent
    /// set to `Retain`, labelled [`crate::KEPT_BASE_LABEL`]) as the base of the next backup's
    /// changed-block delta, until a newer backup of the same PVC completes or the backup is
    /// deleted. Costs the storage one snapshot per block PVC between backups. `Some(default)`
    /// where a source PVC's [`crate::KEEP_BASE_ANNOTATION`] does not say; `None` (changed-block
    /// tracking off): never. Default `Some(false)`.
    pub keep_base_snapshot: Option<bool>,
}

/// Why the node-agent ConfigMap cannot configure the exposers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExposerConfigError {
    /// A `loadAffinity` node selector Kubernetes would refuse.
    #[error("loadAffinity[{index}].nodeSelector: {source}")]
    LoadAffinity {
        /// The entry's position in the list.
        index: usize,
        /// What is wrong with the selector.
        #[source]
        source: SelectorError,
    },
    /// `podResources` Velero would refuse (see [`crate::pod_resources`]).
    #[error(transparent)]
    PodResources(#[from] PodResourcesError),
    /// A `podLabels` entry that is not a valid label.
    #[error("podLabels: {source}")]
    PodLabel {
        /// The key given.
        key: String,
        /// What is wrong with the key or the value.
        #[source]
        source: SelectorError,
    },
    /// A `podAnnotations` key that is not a qualified name.
    #[error(
        "podAnnotations: key {key:?} is not a qualified name ([DNS subdomain/]name of at most \
         63 characters)"
    )]
    PodAnnotation {
        /// The key given.
        key: String,
    },
}

impl ExposerConfig {
    /// Defaults: Velero's namespace, `/var/lib/kubelet`, the given image running `ferry hold`.
    #[must_use]
    pub fn new(pod_image: impl Into<String>) -> Self {
        Self {
            namespace: DEFAULT_VELERO_NAMESPACE.to_owned(),
            kubelet_root: PathBuf::from("/var/lib/kubelet"),
            node_name: None,
            pod_image: pod_image.into(),
            pod_command: vec!["/ferry".into(), "hold".into()],
            backup_storage_class: BTreeMap::new(),
            backup_read_only: Vec::new(),
            ignore_delay_binding: false,
            priority_class_name: None,
            unschedulable_grace: Duration::from_secs(60),
            volume_wait_grace: Duration::from_secs(30),
            load_affinity: Vec::new(),
            pod_resources: ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity("10m".to_owned())),
                    ("memory".to_owned(), Quantity("16Mi".to_owned())),
                ])),
                limits: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity("100m".to_owned())),
                    ("memory".to_owned(), Quantity("64Mi".to_owned())),
                ])),
                ..ResourceRequirements::default()
            },
            pod_labels: BTreeMap::new(),
            pod_annotations: BTreeMap::new(),
            agent_tolerations: Vec::new(),
            keep_base_snapshot: Some(false),
        }
    }

    /// Applies what Velero's node-agent ConfigMap says about the pods and volumes the exposers
    /// create: `backupPVC` (storage class, read-only), `restorePVC.ignoreDelayBinding`,
    /// `priorityClassName`, `loadAffinity`, `podResources`, `podLabels` and `podAnnotations`.
    /// A setting the ConfigMap leaves out (or leaves empty) keeps its current value. Everything
    /// is checked first: on error nothing is changed.
    ///
    /// Labels that would replace Ferry's own on the pods are kept here but lose to Ferry's
    /// (a warning says so).
    ///
    /// # Errors
    /// [`ExposerConfigError`] for a node selector, resource quantity, label or annotation key
    /// the API server would refuse: a clear error at start instead of pods that never run.
    pub fn apply_node_agent_config(
        &mut self,
        config: &NodeAgentConfig,
    ) -> Result<(), ExposerConfigError> {
        let no_labels = BTreeMap::new();
        for (index, affinity) in config.load_affinity.iter().enumerate() {
            selector_matches(&affinity.node_selector, &no_labels)
                .map_err(|source| ExposerConfigError::LoadAffinity { index, source })?;
        }
        let resources = config.pod_resources.as_ref().map(pod_resources).transpose()?;
        for (key, value) in &config.pod_labels {
            let pair = BTreeMap::from([(key.clone(), value.clone())]);
            check_labels(&pair)
                .map_err(|source| ExposerConfigError::PodLabel { key: key.clone(), source })?;
        }
        for key in config.pod_annotations.keys() {
            check_labels(&BTreeMap::from([(key.clone(), String::new())]))
                .map_err(|_| ExposerConfigError::PodAnnotation { key: key.clone() })?;
        }

        if !config.backup_pvc.is_empty() {
            self.backup_storage_class = config
                .backup_pvc
                .iter()
                .filter(|(_, pvc)| !pvc.storage_class.is_empty())
                .map(|(class, pvc)| (class.clone(), pvc.storage_class.clone()))
                .collect();
            self.backup_read_only = config
                .backup_pvc
                .iter()
                .filter(|(_, pvc)| pvc.read_only)
                .map(|(class, _)| class.clone())
                .collect();
        }
        if let Some(restore) = &config.restore_pvc {
            self.ignore_delay_binding = restore.ignore_delay_binding;
        }
        if !config.priority_class_name.is_empty() {
            self.priority_class_name = Some(config.priority_class_name.clone());
        }
        if !config.load_affinity.is_empty() {
            self.load_affinity = config
                .load_affinity
                .iter()
                .map(|a| LoadAffinity {
                    node_selector: a.node_selector.clone(),
                    storage_class: Some(a.storage_class.clone()).filter(|c| !c.is_empty()),
                })
                .collect();
        }
        if let Some(resources) = resources {
            self.pod_resources = resources;
        }
        if !config.pod_labels.is_empty() {
            for key in [DATA_UPLOAD_LABEL, DATA_DOWNLOAD_LABEL, crate::labels::CREATED_BY] {
                if config.pod_labels.contains_key(key) {
                    tracing::warn!(label = key, "podLabels: Ferry sets this label itself");
                }
            }
            self.pod_labels.clone_from(&config.pod_labels);
        }
        if !config.pod_annotations.is_empty() {
            self.pod_annotations.clone_from(&config.pod_annotations);
        }
        Ok(())
    }

    /// The `loadAffinity` rule for volumes of `storage_class` (empty: no class): the first one
    /// naming the class, else the first one naming none (Velero's rule).
    #[must_use]
    pub fn load_affinity_for(&self, storage_class: &str) -> Option<&LoadAffinity> {
        placement::affinity_for(&self.load_affinity, storage_class)
    }

    /// The backup PVC's storage class for a source volume of `source_class`.
    pub(crate) fn backup_pvc_class(&self, source_class: &str) -> String {
        self.backup_storage_class.get(source_class).cloned().unwrap_or_else(|| source_class.into())
    }

    /// Whether the backup PVC for a source volume of `source_class` is read-only.
    pub(crate) fn backup_pvc_read_only(&self, source_class: &str) -> bool {
        self.backup_read_only.iter().any(|c| c == source_class)
    }
}

/// Checks keys and values against Kubernetes' label rules (the selector check applies them).
fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), SelectorError> {
    let selector = LabelSelector { match_labels: Some(labels.clone()), match_expressions: None };
    selector_matches(&selector, labels).map(drop)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use ferry_api::node_agent_config::parse;

    fn applied(json: &str) -> Result<ExposerConfig, ExposerConfigError> {
        let mut config = ExposerConfig::new("img");
        config.apply_node_agent_config(&parse(json).unwrap()).map(|()| config)
    }

    #[test]
    fn every_exposer_setting_is_mapped() {
        let config = applied(
            r#"{
            "backupPVC": {
                "fast": {"storageClass": "fast-backup", "readOnly": true},
                "slow": {"readOnly": true},
                "other": {"storageClass": "other-backup"}
            },
            "restorePVC": {"ignoreDelayBinding": true},
            "priorityClassName": "movers",
            "loadAffinity": [
                {"nodeSelector": {"matchLabels": {"pool": "movers"}}},
                {"nodeSelector": {"matchExpressions": [{"key": "zone", "operator": "In",
                    "values": ["a"]}]}, "storageClass": "fast-backup"}
            ],
            "podResources": {"cpuRequest": "100m", "cpuLimit": "1", "memoryRequest": "64Mi",
                "memoryLimit": "512Mi"},
            "podLabels": {"team": "storage", "velero.io/data-upload": "x"},
            "podAnnotations": {"prometheus.io/scrape": "false"},
            "loadConcurrency": {"globalConfig": 2}
        }"#,
        )
        .unwrap();
        assert_eq!(
            config.backup_storage_class,
            BTreeMap::from([
                ("fast".into(), "fast-backup".into()),
                ("other".into(), "other-backup".into())
            ])
        );
        assert_eq!(config.backup_read_only, ["fast", "slow"]);
        assert_eq!(config.backup_pvc_class("fast"), "fast-backup");
        assert_eq!(config.backup_pvc_class("unlisted"), "unlisted");
        // Read-only is keyed by the source class, as Velero does, not by the backup class.
        assert!(config.backup_pvc_read_only("fast"));
        assert!(!config.backup_pvc_read_only("fast-backup"));
        assert!(!config.backup_pvc_read_only("other"));
        assert!(config.ignore_delay_binding);
        assert_eq!(config.priority_class_name.as_deref(), Some("movers"));
        assert_eq!(config.load_affinity.len(), 2);
        assert_eq!(config.load_affinity[0].storage_class, None);
        assert_eq!(config.load_affinity_for("fast-backup"), Some(&config.load_affinity[1]));
        assert_eq!(config.load_affinity_for("slow"), Some(&config.load_affinity[0]));
        let requests = config.pod_resources.requests.clone().unwrap();
        assert_eq!(requests["cpu"], Quantity("100m".into()));
        assert_eq!(
            config.pod_resources.limits.clone().unwrap()["memory"],
            Quantity("512Mi".into())
        );
        assert_eq!(config.pod_labels["team"], "storage");
        assert_eq!(config.pod_annotations["prometheus.io/scrape"], "false");
    }

    #[test]
    fn absent_settings_keep_their_values() {
        let mut config = ExposerConfig::new("img");
        config.priority_class_name = Some("kept".into());
        config.ignore_delay_binding = true;
        let before = config.clone();
        config.apply_node_agent_config(&parse(r#"{"loadConcurrency": {}}"#).unwrap()).unwrap();
        assert_eq!(config, before);
        let requests = config.pod_resources.requests.unwrap();
        assert_eq!(requests["cpu"], Quantity("10m".into()), "Ferry's default");
        let limits = config.pod_resources.limits.unwrap();
        assert_eq!(limits["memory"], Quantity("64Mi".into()), "Ferry's default");
    }

    #[test]
    fn bad_settings_are_refused_and_change_nothing() {
        let cases = [
            (
                r#"{"loadAffinity": [{"nodeSelector": {}}, {"nodeSelector": {"matchExpressions":
                    [{"key": "zone", "operator": "Near", "values": ["a"]}]}}]}"#,
                "loadAffinity[1].nodeSelector: operator \"Near\" of key \"zone\" is not In, \
                 NotIn, Exists or DoesNotExist",
            ),
            (
                r#"{"podResources": {"cpuRequest": "1", "cpuLimit": "1", "memoryRequest": "1 Gi",
                    "memoryLimit": "2Gi"}}"#,
                "podResources.memoryRequest: \"1 Gi\" is not a Kubernetes quantity: unknown \
                 suffix \" Gi\" (expected Ki…Ei, n, u, m, k, M, G, T, P, E or an exponent like e3)",
            ),
            (
                r#"{"podResources": {"cpuRequest": "1"}}"#,
                "podResources.memoryRequest is missing; Velero needs cpuRequest, cpuLimit, \
                 memoryRequest and memoryLimit (\"0\" for none) and would ignore the whole \
                 podResources",
            ),
            (
                r#"{"podLabels": {"team": "storage team"}}"#,
                "podLabels: label value \"storage team\" of key \"team\" is not a valid label value",
            ),
            (
                r#"{"podLabels": {"Team/x": "a"}}"#,
                "podLabels: label key \"Team/x\" is not a qualified name ([DNS subdomain/]name \
                 of at most 63 characters)",
            ),
            (
                r#"{"podAnnotations": {"has space": "any value is fine"}}"#,
                "podAnnotations: key \"has space\" is not a qualified name ([DNS subdomain/]name \
                 of at most 63 characters)",
            ),
        ];
        for (json, message) in cases {
            let mut config = ExposerConfig::new("img");
            let mut parsed = parse(json).unwrap();
            parsed.priority_class_name = "would-be-set".into();
            let err = config.apply_node_agent_config(&parsed).unwrap_err();
            assert_eq!(err.to_string(), message);
            assert_eq!(config, ExposerConfig::new("img"), "unchanged after {message}");
        }
        let err = applied(r#"{"podLabels": {"a": "-"}}"#).unwrap_err();
        assert!(matches!(err, ExposerConfigError::PodLabel { ref key, .. } if key == "a"));
        assert!(std::error::Error::source(&err).is_some());
    }
}
