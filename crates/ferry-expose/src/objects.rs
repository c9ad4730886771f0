//! The objects the exposers create, built from what the CR and the cluster say.

use std::collections::BTreeMap;

use ferry_agent::VolumeMode;
use ferry_api::k8s_openapi::api::core::v1::{
    NodeSelectorTerm, PersistentVolumeClaim, Pod, Toleration,
};
use ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use ferry_api::{VolumeSnapshot, VolumeSnapshotContent};
use serde_json::json;

use crate::{ExposeError, ExposerConfig, placement};

/// Velero's name for the container path of an exposed file-system volume, kept for familiarity.
const MOUNT_PATH: &str = "/volume";
/// The device path of an exposed block volume inside the holding pod.
const DEVICE_PATH: &str = "/dev/volume";

fn from_json<T: serde::de::DeserializeOwned>(
    what: &str,
    value: serde_json::Value,
) -> Result<T, ExposeError> {
    serde_json::from_value(value)
        .map_err(|e| ExposeError::Invalid(format!("building the {what}: {e}")))
}

pub(crate) fn mode_text(mode: VolumeMode) -> &'static str {
    match mode {
        VolumeMode::Filesystem => "Filesystem",
        VolumeMode::Block => "Block",
    }
}

/// The label the snapshot-controller puts on a VolumeSnapshotContent when snapshots are
/// distributed (`--enable-distributed-snapshotting`): the node whose snapshotter sidecar
/// (`--node-deployment`) manages it, the one that holds a node-local snapshot. A sidecar
/// watches only the contents labelled with its node.
pub(crate) const MANAGED_BY_LABEL: &str = "snapshot.storage.kubernetes.io/managed-by";

/// A VolumeSnapshotContent that takes over the existing physical snapshot `snapshot_handle`, bound
/// ahead to VolumeSnapshot `namespace/name`; `managed_by` is the source content's
/// [`MANAGED_BY_LABEL`], kept so that the node that holds the snapshot manages the copy.
pub(crate) fn backup_content(
    name: &str,
    snapshot_handle: &str,
    driver: &str,
    class: Option<&str>,
    source_volume_mode: Option<&str>,
    namespace: &str,
    managed_by: Option<&str>,
) -> Result<VolumeSnapshotContent, ExposeError> {
    let mut spec = json!({
        "deletionPolicy": "Delete",
        "driver": driver,
        "source": { "snapshotHandle": snapshot_handle },
        "volumeSnapshotRef": {
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "namespace": namespace,
            "name": name,
        },
    });
    if let Some(class) = class.filter(|c| !c.is_empty()) {
        spec["volumeSnapshotClassName"] = json!(class);
    }
    if let Some(mode) = source_volume_mode {
        spec["sourceVolumeMode"] = json!(mode);
    }
    let mut labels = json!({ "ferry.io/created-by": "ferry" });
    if let Some(node) = managed_by.filter(|n| !n.is_empty()) {
        labels[MANAGED_BY_LABEL] = json!(node);
    }
    from_json(
        "backup VolumeSnapshotContent",
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotContent",
            "metadata": { "name": name, "labels": labels },
            "spec": spec,
        }),
    )
}

/// A VolumeSnapshot bound to the backup content.
pub(crate) fn backup_snapshot(
    namespace: &str,
    name: &str,
    content: &str,
    class: Option<&str>,
    owner: &OwnerReference,
    labels: &BTreeMap<String, String>,
) -> Result<VolumeSnapshot, ExposeError> {
    let mut spec = json!({ "source": { "volumeSnapshotContentName": content } });
    if let Some(class) = class.filter(|c| !c.is_empty()) {
        spec["volumeSnapshotClassName"] = json!(class);
    }
    from_json(
        "backup VolumeSnapshot",
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {
                "name": name, "namespace": namespace, "labels": labels,
                "ownerReferences": [owner],
            },
            "spec": spec,
        }),
    )
}

/// What a PVC the exposer creates looks like.
pub(crate) struct ClaimSpec<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub storage_class: Option<&'a str>,
    pub access_modes: Vec<String>,
    pub mode: VolumeMode,
    pub size: String,
    pub snapshot: Option<&'a str>,
    pub labels: &'a BTreeMap<String, String>,
    pub owner: &'a OwnerReference,
}

pub(crate) fn claim(c: &ClaimSpec<'_>) -> Result<PersistentVolumeClaim, ExposeError> {
    let mut spec = json!({
        "accessModes": c.access_modes,
        "volumeMode": mode_text(c.mode),
        "resources": { "requests": { "storage": c.size } },
    });
    if let Some(class) = c.storage_class {
        spec["storageClassName"] = json!(class);
    }
    if let Some(snapshot) = c.snapshot {
        spec["dataSource"] = json!({
            "apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": snapshot,
        });
    }
    from_json(
        "PersistentVolumeClaim",
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": c.name, "namespace": c.namespace, "labels": c.labels,
                "ownerReferences": [c.owner],
            },
            "spec": spec,
        }),
    )
}

/// What a holding pod looks like.
pub(crate) struct HolderSpec<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub claim: &'a str,
    pub mode: VolumeMode,
    pub read_only: bool,
    /// Pin to this node (the target PVC's selected node).
    pub node: Option<&'a str>,
    pub labels: &'a BTreeMap<String, String>,
    pub owner: &'a OwnerReference,
    /// Nodes the pod must not be placed on (their agents stopped).
    pub avoid: &'a [String],
    /// The storage class that picks the `loadAffinity` rule (empty: none); the rule is not
    /// used when the pod is pinned to `node`.
    pub storage_class: &'a str,
    /// Its tolerations (see [`crate::holder_tolerations`]).
    pub tolerations: &'a [Toleration],
    /// Where its volume can be provisioned: the source volume's node affinity terms, for a
    /// backup PVC that binds once the pod is scheduled (see [`crate::topology`]).
    pub topology: &'a [NodeSelectorTerm],
}

/// The holding pods' termination grace period, in seconds (see [`holder_pod`]).
pub(crate) const HOLDER_GRACE_SECONDS: i64 = 5;

/// The unprivileged user and group holding pods run as (the "nonroot" user of distroless
/// images).
pub(crate) const HOLDER_UID: i64 = 65532;

/// A pod that only holds the volume so the kubelet attaches and mounts it on its node.
/// The name of the pod holding the volume of CR `cr`: the CR's own name when it is at most
/// 63 characters (as Velero's CRs are), else Velero's shortened form (57 characters and a
/// hash). A real kubelet cannot run a pod with a much longer name: its log directory
/// `<namespace>_<pod>_<uid>` must fit in one file name (255 bytes).
#[must_use]
pub(crate) fn holder_name(cr: &str) -> String {
    ferry_api::naming::valid_label_value(cr)
}

pub(crate) fn holder_pod(config: &ExposerConfig, h: &HolderSpec<'_>) -> Result<Pod, ExposeError> {
    let mut container = json!({
        "name": "hold",
        "image": config.pod_image,
        "command": config.pod_command,
        "resources": config.pod_resources,
        // It only sleeps until told to stop: nothing to write, no privilege to keep. The
        // kubelet mounts or maps the volume whatever the container's user.
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "privileged": false,
            "readOnlyRootFilesystem": true,
            "capabilities": { "drop": ["ALL"] },
        },
    });
    match h.mode {
        VolumeMode::Filesystem => {
            container["volumeMounts"] =
                json!([{ "name": "volume", "mountPath": MOUNT_PATH, "readOnly": h.read_only }]);
        }
        VolumeMode::Block => {
            container["volumeDevices"] = json!([{ "name": "volume", "devicePath": DEVICE_PATH }]);
        }
    }
    let mut spec = json!({
        "containers": [container],
        "volumes": [{
            "name": "volume",
            "persistentVolumeClaim": { "claimName": h.claim, "readOnly": h.read_only },
        }],
        "restartPolicy": "Never",
        // Not 0: a pod whose grace period is 0 leaves the API at once, before the kubelet
        // has unmounted its volume; the PVC and its volume then go too, the CSI driver deletes
        // the volume under the kubelet, and NodeUnpublish fails for good (the mount, and for
        // block volumes the loop devices, stay on the node). With a grace period the kubelet
        // confirms the deletion after unmounting, and the PVC waits for that (PVC protection).
        // `ferry hold` ends at once on SIGTERM.
        "terminationGracePeriodSeconds": HOLDER_GRACE_SECONDS,
        "automountServiceAccountToken": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": HOLDER_UID,
            "runAsGroup": HOLDER_UID,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
    });
    if !h.tolerations.is_empty() {
        spec["tolerations"] = json!(h.tolerations);
    }
    // As Velero: a pod pinned to the node a WaitForFirstConsumer target selected ignores
    // the configured placement.
    let rule = if h.node.is_some() { None } else { config.load_affinity_for(h.storage_class) };
    if let Some(affinity) = placement::node_affinity(rule, h.node, h.avoid, h.topology) {
        spec["affinity"] = json!(affinity);
    }
    if let Some(class) = &config.priority_class_name {
        spec["priorityClassName"] = json!(class);
    }
    let mut metadata = json!({
        "name": h.name, "namespace": h.namespace,
        "labels": placement::pod_labels(&config.pod_labels, h.labels),
        "ownerReferences": [h.owner],
    });
    if !config.pod_annotations.is_empty() {
        metadata["annotations"] = json!(config.pod_annotations);
    }
    from_json(
        "holding Pod",
        json!({ "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec }),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use ferry_api::node_agent_config::parse;
    use serde_json::Value;

    fn config() -> ExposerConfig {
        let mut config = ExposerConfig::new("img");
        let json = r#"{
            "loadAffinity": [
                {"nodeSelector": {"matchLabels": {"pool": "any"}}},
                {"nodeSelector": {"matchLabels": {"pool": "fast"}}, "storageClass": "fast"}
            ],
            "podResources": {"cpuRequest": "0", "cpuLimit": "2", "memoryRequest": "1Gi",
                "memoryLimit": "0", "ephemeralStorageLimit": "1Gi"},
            "podLabels": {"team": "storage", "ferry.io/created-by": "someone-else"},
            "podAnnotations": {"note": "held by Ferry"}
        }"#;
        config.apply_node_agent_config(&parse(json).unwrap()).unwrap();
        config
    }

    fn pod(config: &ExposerConfig, node: Option<&str>, class: &str, avoid: &[String]) -> Value {
        let labels = BTreeMap::from([("ferry.io/created-by".to_owned(), "ferry".to_owned())]);
        let owner = OwnerReference {
            api_version: "velero.io/v2alpha1".into(),
            kind: "DataUpload".into(),
            name: "du".into(),
            uid: "u-1".into(),
            ..OwnerReference::default()
        };
        let spec = HolderSpec {
            namespace: "velero",
            name: "du",
            claim: "du",
            mode: VolumeMode::Filesystem,
            read_only: false,
            node,
            labels: &labels,
            owner: &owner,
            avoid,
            storage_class: class,
            tolerations: &[],
            topology: &[],
        };
        serde_json::to_value(holder_pod(config, &spec).unwrap()).unwrap()
    }

    fn pools(pod: &Value) -> Vec<Value> {
        let terms = &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        let fields = terms[0]["matchFields"].as_array().cloned().unwrap_or_default();
        terms[0]["matchExpressions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .chain(fields)
            .collect()
    }

    #[test]
    fn the_configured_metadata_and_resources_are_applied() {
        let pod = pod(&config(), None, "fast", &[]);
        assert_eq!(
            pod["metadata"]["labels"],
            json!({"team": "storage", "ferry.io/created-by": "ferry"}),
            "Ferry's label wins"
        );
        assert_eq!(pod["metadata"]["annotations"], json!({"note": "held by Ferry"}));
        assert_eq!(
            pod["spec"]["containers"][0]["resources"],
            json!({"requests": {"memory": "1Gi"}, "limits": {"cpu": "2", "ephemeral-storage": "1Gi"}})
        );
    }

    #[test]
    fn the_backup_content_stays_with_the_node_that_manages_the_snapshot() {
        let labels = |managed_by| {
            let content =
                backup_content("du", "h-1", "d", None, None, "velero", managed_by).unwrap();
            serde_json::to_value(content).unwrap()["metadata"]["labels"].clone()
        };
        assert_eq!(
            labels(Some("node-2")),
            json!({"ferry.io/created-by": "ferry", MANAGED_BY_LABEL: "node-2"})
        );
        assert_eq!(labels(None), json!({"ferry.io/created-by": "ferry"}));
        assert_eq!(labels(Some("")), json!({"ferry.io/created-by": "ferry"}));
    }

    #[test]
    fn the_storage_class_picks_the_affinity_rule() {
        let config = config();
        let expected = |pool: &str| json!({"key": "pool", "operator": "In", "values": [pool]});
        assert_eq!(pools(&pod(&config, None, "fast", &[])), [expected("fast")]);
        assert_eq!(pools(&pod(&config, None, "slow", &[])), [expected("any")]);
        let avoid = ["stopped".to_owned()];
        assert_eq!(
            pools(&pod(&config, None, "", &avoid)),
            [
                expected("any"),
                json!({"key": "metadata.name", "operator": "NotIn", "values": ["stopped"]})
            ]
        );
        // Pinned to the selected node, by the node's name (the hostname label may differ):
        // no rule, only the node.
        let pinned = pod(&config, Some("n1"), "fast", &avoid);
        assert_eq!(
            pools(&pinned),
            [
                json!({"key": "metadata.name", "operator": "In", "values": ["n1"]}),
                json!({"key": "metadata.name", "operator": "NotIn", "values": ["stopped"]})
            ]
        );
        assert_eq!(pinned["spec"]["nodeSelector"], Value::Null);
    }

    #[test]
    fn holding_pods_run_restricted() {
        let pod = pod(&config(), None, "fast", &[]);
        let spec = &pod["spec"];
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
        assert_eq!(spec["securityContext"]["runAsUser"], HOLDER_UID);
        assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        let container = &spec["containers"][0]["securityContext"];
        assert_eq!(container["allowPrivilegeEscalation"], false);
        assert_eq!(container["readOnlyRootFilesystem"], true);
        assert_eq!(container["capabilities"]["drop"], json!(["ALL"]));
        assert!(spec["hostNetwork"].is_null() && spec["hostPID"].is_null());
    }

    #[test]
    fn without_a_config_map_the_pod_is_small_and_bounded() {
        let pod = pod(&ExposerConfig::new("img"), None, "fast", &[]);
        assert_eq!(pod["metadata"]["labels"], json!({"ferry.io/created-by": "ferry"}));
        assert_eq!(pod["metadata"]["annotations"], Value::Null);
        assert_eq!(pod["spec"]["affinity"], Value::Null);
        assert_eq!(
            pod["spec"]["containers"][0]["resources"],
            json!({
                "requests": {"cpu": "10m", "memory": "16Mi"},
                "limits": {"cpu": "100m", "memory": "64Mi"}
            })
        );
    }
}
