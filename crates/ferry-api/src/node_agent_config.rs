//! Velero's node-agent configuration: the JSON document kept in the ConfigMap that
//! `velero install --node-agent-configmap=<name>` names, with Velero's key names.
//!
//! [`parse`] (or [`decode`] for raw bytes, [`NodeAgentConfig::from_config_map_data`] for a
//! ConfigMap's `data`) reads it; keys Velero does not define yet are kept in `other` maps
//! instead of failing, so a newer Velero's ConfigMap still loads. The pure helpers apply
//! Velero's rules: [`NodeAgentConfig::concurrency_for_node`] (the smallest number among the
//! per-node rules whose selector matches the node, else the global number, else 1),
//! [`NodeAgentConfig::load_affinity_for`] and [`NodeAgentConfig::validate`].
//!
//! Like Go's `encoding/json`, `null` stands for an absent value everywhere. Unlike it, key
//! names are matched exactly (Go also accepts `GlobalConfig` for `globalConfig`): such a key
//! lands in `other` and [`NodeAgentConfig::unknown_keys`] names it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// Data movements at once on a node when nothing (valid) configures it: Velero's default.
pub const DEFAULT_CONCURRENCY: usize = 1;

/// Keys this module does not know, kept as they were.
pub type OtherKeys = BTreeMap<String, Value>;

/// The whole node-agent configuration (Velero's `NodeAgentConfigs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgentConfig {
    /// `loadConcurrency`: data movements at once per node, and the prepare queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_concurrency: Option<LoadConcurrency>,
    /// `loadAffinity`: where holding pods may run, overall or per storage class.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "Vec::is_empty")]
    pub load_affinity: Vec<LoadAffinity>,
    /// `backupPVC`: settings of the backup PVC, keyed by the source PVC's storage class.
    #[serde(
        rename = "backupPVC",
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub backup_pvc: BTreeMap<String, BackupPvc>,
    /// `restorePVC`: settings of the restore PVC.
    #[serde(rename = "restorePVC", default, skip_serializing_if = "Option::is_none")]
    pub restore_pvc: Option<RestorePvc>,
    /// `podResources`: requests and limits of the holding pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_resources: Option<PodResources>,
    /// `priorityClassName` of the holding pods (empty: none).
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "String::is_empty")]
    pub priority_class_name: String,
    /// `privilegedFsBackup`: file-system backup pods run privileged (not used by Ferry).
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "is_false")]
    pub privileged_fs_backup: bool,
    /// `cachePVC`: the restore cache volume.
    #[serde(rename = "cachePVC", default, skip_serializing_if = "Option::is_none")]
    pub cache_pvc: Option<CachePvc>,
    /// `podAnnotations` added to the holding pods.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// `podLabels` added to the holding pods.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    /// Keys not defined above, kept as they were.
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// `loadConcurrency`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadConcurrency {
    /// `globalConfig`: the number for nodes no per-node rule matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_config: Option<i64>,
    /// `perNodeConfig`: numbers for the nodes a selector matches.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "Vec::is_empty")]
    pub per_node_config: Vec<RuledConfig>,
    /// `prepareQueueLength`: most CRs being prepared (exposed, not yet moving) at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepare_queue_length: Option<i64>,
    /// Keys not defined above.
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// One `perNodeConfig` rule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuledConfig {
    /// `nodeSelector`: the nodes the rule applies to (empty: every node).
    #[serde(default, deserialize_with = "or_default")]
    pub node_selector: LabelSelector,
    /// `number`: data movements at once on those nodes.
    #[serde(default, deserialize_with = "or_default")]
    pub number: i64,
    /// Keys not defined above.
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// One `loadAffinity` entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadAffinity {
    /// `nodeSelector`: the nodes holding pods may run on.
    #[serde(default, deserialize_with = "or_default")]
    pub node_selector: LabelSelector,
    /// `storageClass`: the entry applies to volumes of this class only (empty: to all).
    #[serde(default, deserialize_with = "or_default")]
    pub storage_class: String,
    /// Keys not defined above.
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// One `backupPVC` value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupPvc {
    /// `storageClass` of the backup PVC (empty: the source's).
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "String::is_empty")]
    pub storage_class: String,
    /// `readOnly`: the backup PVC is `ReadOnlyMany`.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "is_false")]
    pub read_only: bool,
    /// `spcNoRelabeling`: the holding pod runs as SELinux type `spc_t` (only with `readOnly`).
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "is_false")]
    pub spc_no_relabeling: bool,
    /// `annotations` of the backup PVC.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Keys not defined above.
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// `restorePVC`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestorePvc {
    /// `ignoreDelayBinding`: do not wait for a WaitForFirstConsumer target's selected node.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "is_false")]
    pub ignore_delay_binding: bool,
    /// Keys not defined above.
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// `podResources`: Kubernetes quantities as text (empty: not set).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodResources {
    /// `cpuRequest`.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "String::is_empty")]
    pub cpu_request: String,
    /// `cpuLimit`.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "String::is_empty")]
    pub cpu_limit: String,
    /// `memoryRequest`.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "String::is_empty")]
    pub memory_request: String,
    /// `memoryLimit`.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "String::is_empty")]
    pub memory_limit: String,
    /// `ephemeralStorageRequest`.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "String::is_empty")]
    pub ephemeral_storage_request: String,
    /// `ephemeralStorageLimit`.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "String::is_empty")]
    pub ephemeral_storage_limit: String,
    /// Keys not defined above.
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// `cachePVC`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachePvc {
    /// `storageClass` of the cache PVC.
    #[serde(default, deserialize_with = "or_default", skip_serializing_if = "String::is_empty")]
    pub storage_class: String,
    /// `residentThresholdInMB`: smallest backup (MiB) that gets a cache PVC. (Velero's docs
    /// call it `thresholdInGB`; its code reads this key, so `thresholdInGB` lands in `other`.)
    #[serde(rename = "residentThresholdInMB", default, skip_serializing_if = "Option::is_none")]
    pub resident_threshold_in_mb: Option<i64>,
    /// Keys not defined above.
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// Why a node-agent configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NodeAgentConfigError {
    /// The ConfigMap has no data at all.
    #[error("node-agent ConfigMap {config_map} has no data (Velero expects one key holding JSON)")]
    NoData {
        /// The ConfigMap's name.
        config_map: String,
    },
    /// The ConfigMap has more than one key; Velero refuses that too.
    #[error(
        "node-agent ConfigMap {config_map} has {} keys ({}); Velero expects exactly one",
        keys.len(),
        keys.join(", ")
    )]
    SeveralKeys {
        /// The ConfigMap's name.
        config_map: String,
        /// Its keys.
        keys: Vec<String>,
    },
    /// The text is not JSON of the configuration's shape.
    #[error("decoding the node-agent configuration{origin}: {source}")]
    Decode {
        /// Where the text came from (` from ConfigMap x key y`), or empty.
        origin: String,
        /// serde_json's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
}

/// A configuration that parsed but that Velero would (partly) ignore.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid node-agent configuration: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidNodeAgentConfig {
    /// Every problem found, in document order.
    pub problems: Vec<ConfigProblem>,
}

/// One problem: where (a JSON path such as `loadConcurrency.perNodeConfig[1].number`) and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigProblem {
    /// JSON path of the offending value.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

/// A label selector Kubernetes would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// An operator other than `In`, `NotIn`, `Exists`, `DoesNotExist`.
    #[error("operator {operator:?} of key {key:?} is not In, NotIn, Exists or DoesNotExist")]
    UnknownOperator {
        /// The key of the requirement.
        key: String,
        /// The operator given.
        operator: String,
    },
    /// `In`/`NotIn` without values, or `Exists`/`DoesNotExist` with values.
    #[error("operator {operator} of key {key:?} {expectation}")]
    Values {
        /// The key of the requirement.
        key: String,
        /// The operator given.
        operator: String,
        /// What the operator needs.
        expectation: &'static str,
    },
    /// A key that is not a qualified name (`[prefix/]name`).
    #[error(
        "label key {0:?} is not a qualified name ([DNS subdomain/]name of at most 63 characters)"
    )]
    Key(String),
    /// A value that is not a label value.
    #[error("label value {value:?} of key {key:?} is not a valid label value")]
    Value {
        /// The key it belongs to.
        key: String,
        /// The value.
        value: String,
    },
}

/// Reads a configuration from JSON text.
///
/// # Errors
/// [`NodeAgentConfigError::Decode`] when the text is not JSON of the configuration's shape
/// (the message has serde_json's line and column).
pub fn parse(json: &str) -> Result<NodeAgentConfig, NodeAgentConfigError> {
    decode(json.as_bytes())
}

/// Reads a configuration from JSON bytes (untrusted input: never panics).
///
/// # Errors
/// As [`parse`].
pub fn decode(bytes: &[u8]) -> Result<NodeAgentConfig, NodeAgentConfigError> {
    serde_json::from_slice(bytes)
        .map_err(|source| NodeAgentConfigError::Decode { origin: String::new(), source })
}

impl NodeAgentConfig {
    /// Reads the configuration from a ConfigMap's `data` as Velero does: exactly one key,
    /// whatever its name, holding the JSON.
    ///
    /// # Errors
    /// [`NodeAgentConfigError::NoData`], [`NodeAgentConfigError::SeveralKeys`], or
    /// [`NodeAgentConfigError::Decode`] naming the ConfigMap and key.
    pub fn from_config_map_data(
        config_map: &str,
        data: &BTreeMap<String, String>,
    ) -> Result<Self, NodeAgentConfigError> {
        let mut entries = data.iter();
        let (Some((key, json)), None) = (entries.next(), entries.next()) else {
            return Err(if data.is_empty() {
                NodeAgentConfigError::NoData { config_map: config_map.to_owned() }
            } else {
                NodeAgentConfigError::SeveralKeys {
                    config_map: config_map.to_owned(),
                    keys: data.keys().cloned().collect(),
                }
            });
        };
        serde_json::from_str(json).map_err(|source| NodeAgentConfigError::Decode {
            origin: format!(" from ConfigMap {config_map} key {key}"),
            source,
        })
    }

    /// Data movements at once on a node with these labels, by Velero's rule: per-node rules
    /// with a valid selector and a number ≥ 1 that match the node give the smallest of their
    /// numbers; when none matches, `globalConfig` if ≥ 1; else [`DEFAULT_CONCURRENCY`].
    #[must_use]
    pub fn concurrency_for_node(&self, node_labels: &BTreeMap<String, String>) -> usize {
        let Some(load) = &self.load_concurrency else { return DEFAULT_CONCURRENCY };
        let global = load.global_config.and_then(positive).unwrap_or(DEFAULT_CONCURRENCY);
        load.per_node_config
            .iter()
            .filter(|rule| selector_matches(&rule.node_selector, node_labels) == Ok(true))
            .filter_map(|rule| positive(rule.number))
            .min()
            .unwrap_or(global)
    }

    /// The prepare queue length, when one (≥ 1) is set; `None` means no limit.
    #[must_use]
    pub fn prepare_queue_length(&self) -> Option<usize> {
        self.load_concurrency.as_ref()?.prepare_queue_length.and_then(positive)
    }

    /// The `loadAffinity` entry for volumes of `storage_class`, by Velero's rule: the first
    /// entry naming that class, else the first entry naming no class.
    #[must_use]
    pub fn load_affinity_for(&self, storage_class: &str) -> Option<&LoadAffinity> {
        self.load_affinity
            .iter()
            .find(|a| a.storage_class == storage_class)
            .or_else(|| self.load_affinity.iter().find(|a| a.storage_class.is_empty()))
    }

    /// Checks every number is ≥ 1 and every selector is one Kubernetes accepts.
    ///
    /// # Errors
    /// [`InvalidNodeAgentConfig`] listing each problem with its JSON path.
    pub fn validate(&self) -> Result<(), InvalidNodeAgentConfig> {
        let mut problems = Vec::new();
        let mut at_least_one = |path: String, value: i64| {
            if value < 1 {
                problems.push(ConfigProblem { path, message: format!("{value} is below 1") });
            }
        };
        if let Some(load) = &self.load_concurrency {
            if let Some(n) = load.global_config {
                at_least_one("loadConcurrency.globalConfig".into(), n);
            }
            for (i, rule) in load.per_node_config.iter().enumerate() {
                at_least_one(format!("loadConcurrency.perNodeConfig[{i}].number"), rule.number);
            }
            if let Some(n) = load.prepare_queue_length {
                at_least_one("loadConcurrency.prepareQueueLength".into(), n);
            }
        }
        if let Some(n) = self.cache_pvc.as_ref().and_then(|c| c.resident_threshold_in_mb)
            && n < 0
        {
            let path = "cachePVC.residentThresholdInMB".to_owned();
            problems.push(ConfigProblem { path, message: format!("{n} is negative") });
        }
        let selectors = self.load_concurrency.iter().flat_map(|load| {
            load.per_node_config.iter().enumerate().map(|(i, r)| {
                (format!("loadConcurrency.perNodeConfig[{i}].nodeSelector"), &r.node_selector)
            })
        });
        let affinities = self.load_affinity.iter().enumerate();
        let selectors = selectors.chain(
            affinities.map(|(i, a)| (format!("loadAffinity[{i}].nodeSelector"), &a.node_selector)),
        );
        for (path, selector) in selectors {
            if let Err(e) = validate_selector(selector) {
                problems.push(ConfigProblem { path, message: e.to_string() });
            }
        }
        if problems.is_empty() { Ok(()) } else { Err(InvalidNodeAgentConfig { problems }) }
    }

    /// JSON paths of the keys kept in `other` maps: keys this Ferry does not understand
    /// (misspelt, differently cased, or from a newer Velero). Worth a warning.
    #[must_use]
    pub fn unknown_keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        let mut add = |prefix: &str, other: &OtherKeys| {
            keys.extend(other.keys().map(|k| format!("{prefix}{k}")));
        };
        add("", &self.other);
        if let Some(load) = &self.load_concurrency {
            add("loadConcurrency.", &load.other);
            for (i, rule) in load.per_node_config.iter().enumerate() {
                add(&format!("loadConcurrency.perNodeConfig[{i}]."), &rule.other);
            }
        }
        for (i, affinity) in self.load_affinity.iter().enumerate() {
            add(&format!("loadAffinity[{i}]."), &affinity.other);
        }
        for (class, pvc) in &self.backup_pvc {
            add(&format!("backupPVC.{class}."), &pvc.other);
        }
        if let Some(pvc) = &self.restore_pvc {
            add("restorePVC.", &pvc.other);
        }
        if let Some(resources) = &self.pod_resources {
            add("podResources.", &resources.other);
        }
        if let Some(pvc) = &self.cache_pvc {
            add("cachePVC.", &pvc.other);
        }
        keys
    }
}

/// Whether a node (or any object) with `labels` matches `selector`, with Kubernetes'
/// semantics: every `matchLabels` pair and every `matchExpressions` requirement must hold;
/// an empty selector matches everything.
///
/// # Errors
/// [`SelectorError`] for a selector Kubernetes would refuse (it then matches nothing).
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    validate_selector(selector)?;
    let pairs = selector.match_labels.iter().flatten();
    let pairs_hold = pairs.clone().all(|(k, v)| labels.get(k) == Some(v));
    let exprs = selector.match_expressions.iter().flatten();
    Ok(pairs_hold && exprs.clone().all(|req| requirement_holds(req, labels)))
}

fn requirement_holds(req: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&req.key);
    let listed = || value.is_some_and(|v| req.values.iter().flatten().any(|x| x == v));
    match req.operator.as_str() {
        "In" => listed(),
        "NotIn" => !listed(),
        "Exists" => value.is_some(),
        // validate_selector admits no other operator.
        _ => value.is_none(),
    }
}

fn validate_selector(selector: &LabelSelector) -> Result<(), SelectorError> {
    for (key, value) in selector.match_labels.iter().flatten() {
        check_key(key)?;
        check_value(key, value)?;
    }
    for req in selector.match_expressions.iter().flatten() {
        check_key(&req.key)?;
        let values = req.values.as_deref().unwrap_or_default();
        let (needs_values, expectation) = match req.operator.as_str() {
            "In" | "NotIn" => (true, "needs at least one value"),
            "Exists" | "DoesNotExist" => (false, "takes no values"),
            other => {
                return Err(SelectorError::UnknownOperator {
                    key: req.key.clone(),
                    operator: other.to_owned(),
                });
            }
        };
        if values.is_empty() == needs_values {
            let (key, operator) = (req.key.clone(), req.operator.clone());
            return Err(SelectorError::Values { key, operator, expectation });
        }
        for value in values {
            check_value(&req.key, value)?;
        }
    }
    Ok(())
}

/// A qualified name: `[prefix/]name`, the prefix a DNS subdomain of at most 253 characters.
fn check_key(key: &str) -> Result<(), SelectorError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|part| {
                let lower =
                    part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
                lower && !part.is_empty() && !part.starts_with('-') && !part.ends_with('-')
            })
    });
    if prefix_ok && !name.is_empty() && is_label_value(name) {
        Ok(())
    } else {
        Err(SelectorError::Key(key.to_owned()))
    }
}

fn check_value(key: &str, value: &str) -> Result<(), SelectorError> {
    if is_label_value(value) {
        Ok(())
    } else {
        Err(SelectorError::Value { key: key.to_owned(), value: value.to_owned() })
    }
}

/// Empty, or at most 63 of `[A-Za-z0-9._-]` beginning and ending alphanumeric.
fn is_label_value(v: &str) -> bool {
    let edge = |b: Option<&u8>| b.is_none_or(u8::is_ascii_alphanumeric);
    v.len() <= 63
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && edge(v.as_bytes().first())
        && edge(v.as_bytes().last())
}

fn positive(n: i64) -> Option<usize> {
    usize::try_from(n).ok().filter(|&n| n >= 1)
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference.
fn is_false(b: &bool) -> bool {
    !*b
}

/// `null` reads as the default, as Go's `encoding/json` leaves a field untouched on `null`.
fn or_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// The "Complete Configuration Example" of Velero's node-agent ConfigMap documentation,
    /// as `kubectl create cm <name> --from-file=node-agent-config.json` stores it.
    const VELERO_DOCS_EXAMPLE: &str = r#"{
  "loadConcurrency": {
    "globalConfig": 2,
    "prepareQueueLength": 15,
    "perNodeConfig": [
      { "nodeSelector": { "matchLabels": { "kubernetes.io/hostname": "node1" } }, "number": 3 }
    ]
  },
  "loadAffinity": [
    {
      "nodeSelector": {
        "matchLabels": { "node-type": "backup" },
        "matchExpressions": [ { "key": "critical-workload", "operator": "DoesNotExist" } ]
      }
    },
    { "nodeSelector": { "matchLabels": { "environment": "staging" } }, "storageClass": "fast-ssd" }
  ],
  "podResources": {
    "cpuRequest": "500m", "cpuLimit": "1000m",
    "ephemeralStorageRequest": "5Gi", "ephemeralStorageLimit": "10Gi",
    "memoryRequest": "1Gi", "memoryLimit": "2Gi"
  },
  "priorityClassName": "backup-priority",
  "backupPVC": {
    "fast-storage": { "storageClass": "backup-optimized-class", "readOnly": true, "spcNoRelabeling": true },
    "slow-storage": { "storageClass": "backup-storage-2" }
  },
  "restorePVC": { "ignoreDelayBinding": true },
  "privilegedFsBackup": true,
  "cachePVC": { "thresholdInGB": 1, "storageClass": "cache-optimized-storage" },
  "podLabels": { "spectrocloud.com/connection": "proxy", "gnp/k8s-api-access": "" },
  "podAnnotations": { "iam.amazonaws.com/role": "velero-backup-role", "prometheus.io/scrape": "true" }
}"#;

    #[test]
    fn reads_velero_documented_config_map() -> Result<(), Box<dyn std::error::Error>> {
        let data = labels(&[("node-agent-config.json", VELERO_DOCS_EXAMPLE)]);
        let config = NodeAgentConfig::from_config_map_data("node-agent-config", &data)?;
        let load = config.load_concurrency.as_ref().ok_or("no loadConcurrency")?;
        assert_eq!(load.global_config, Some(2));
        assert_eq!(load.prepare_queue_length, Some(15));
        assert_eq!(load.per_node_config[0].number, 3);
        assert_eq!(config.concurrency_for_node(&labels(&[("kubernetes.io/hostname", "node1")])), 3);
        assert_eq!(config.concurrency_for_node(&labels(&[("kubernetes.io/hostname", "node2")])), 2);
        assert_eq!(config.prepare_queue_length(), Some(15));
        assert_eq!(config.load_affinity.len(), 2);
        assert_eq!(
            config.load_affinity_for("fast-ssd").map(|a| a.storage_class.as_str()),
            Some("fast-ssd")
        );
        let general = config.load_affinity_for("other").ok_or("no general affinity")?;
        assert!(selector_matches(&general.node_selector, &labels(&[("node-type", "backup")]))?);
        assert!(!selector_matches(
            &general.node_selector,
            &labels(&[("node-type", "backup"), ("critical-workload", "x")])
        )?);
        let resources = config.pod_resources.as_ref().ok_or("no podResources")?;
        assert_eq!(resources.cpu_request, "500m");
        assert_eq!(resources.ephemeral_storage_limit, "10Gi");
        assert_eq!(config.priority_class_name, "backup-priority");
        let fast = &config.backup_pvc["fast-storage"];
        assert!(fast.read_only && fast.spc_no_relabeling);
        assert_eq!(fast.storage_class, "backup-optimized-class");
        assert!(!config.backup_pvc["slow-storage"].read_only);
        assert!(config.restore_pvc.as_ref().is_some_and(|r| r.ignore_delay_binding));
        assert!(config.privileged_fs_backup);
        assert_eq!(config.pod_labels["gnp/k8s-api-access"], "");
        assert_eq!(config.pod_annotations["prometheus.io/scrape"], "true");
        // The docs' `thresholdInGB` is not what Velero's code reads: it is kept, and reported.
        let cache = config.cache_pvc.as_ref().ok_or("no cachePVC")?;
        assert_eq!(cache.resident_threshold_in_mb, None);
        assert_eq!(config.unknown_keys(), vec!["cachePVC.thresholdInGB".to_owned()]);
        config.validate()?;
        Ok(())
    }

    #[test]
    fn unknown_keys_are_kept_and_written_back() -> Result<(), Box<dyn std::error::Error>> {
        let json = r#"{"futureKnob":{"a":[1,2]},"loadConcurrency":{"GlobalConfig":4,"globalConfig":2},
            "podResources":{"gpuLimit":"1"}}"#;
        let config = parse(json)?;
        assert_eq!(config.other["futureKnob"], serde_json::json!({"a": [1, 2]}));
        assert_eq!(
            config.unknown_keys(),
            ["futureKnob", "loadConcurrency.GlobalConfig", "podResources.gpuLimit"]
        );
        let again: serde_json::Value = serde_json::to_value(&config)?;
        assert_eq!(again, serde_json::from_str::<serde_json::Value>(json)?);
        Ok(())
    }

    #[test]
    fn null_means_absent_as_in_go() -> Result<(), Box<dyn std::error::Error>> {
        let config = parse(
            r#"{"loadConcurrency":{"globalConfig":null,"perNodeConfig":null},"loadAffinity":null,
                "backupPVC":null,"priorityClassName":null,"podLabels":null}"#,
        )?;
        assert_eq!(config.load_concurrency, Some(LoadConcurrency::default()));
        assert_eq!(
            config,
            NodeAgentConfig {
                load_concurrency: Some(LoadConcurrency::default()),
                ..NodeAgentConfig::default()
            }
        );
        assert_eq!(parse("{}")?, NodeAgentConfig::default());
        Ok(())
    }

    #[test]
    fn bad_documents_get_clear_errors() {
        let err =
            parse(r#"{"loadConcurrency":{"globalConfig":"two"}}"#).expect_err("must be refused");
        let text = err.to_string();
        assert!(
            text.starts_with("decoding the node-agent configuration: invalid type: string"),
            "{text}"
        );
        assert!(text.contains("line 1 column"), "{text}");
        assert!(parse("[1]").is_err());
        assert!(parse(r#"{"loadConcurrency":{"globalConfig":1.5}}"#).is_err());
        assert!(parse(r#"{"loadAffinity":{"nodeSelector":{}}}"#).is_err());
        assert!(decode(b"\xff\xfe").is_err());

        let data = labels(&[("a.json", "{"), ("b.json", "{}")]);
        let err = NodeAgentConfig::from_config_map_data("cfg", &data).expect_err("must be refused");
        assert_eq!(
            err.to_string(),
            "node-agent ConfigMap cfg has 2 keys (a.json, b.json); Velero expects exactly one"
        );
        let err = NodeAgentConfig::from_config_map_data("cfg", &BTreeMap::new())
            .expect_err("must be refused");
        assert!(
            matches!(err, NodeAgentConfigError::NoData { ref config_map } if config_map == "cfg")
        );
        let data = labels(&[("a.json", "{")]);
        let err = NodeAgentConfig::from_config_map_data("cfg", &data).expect_err("must be refused");
        assert!(
            err.to_string().starts_with(
                "decoding the node-agent configuration from ConfigMap cfg key a.json: "
            ),
            "{err}"
        );
    }

    fn rule(selector: serde_json::Value, number: i64) -> RuledConfig {
        let node_selector = serde_json::from_value(selector).unwrap_or_default();
        RuledConfig { node_selector, number, other: OtherKeys::new() }
    }

    fn with_rules(global: Option<i64>, rules: Vec<RuledConfig>) -> NodeAgentConfig {
        let load = LoadConcurrency {
            global_config: global,
            per_node_config: rules,
            ..LoadConcurrency::default()
        };
        NodeAgentConfig { load_concurrency: Some(load), ..NodeAgentConfig::default() }
    }

    #[test]
    fn concurrency_follows_velero() {
        let node = labels(&[("zone", "a"), ("size", "big")]);
        assert_eq!(NodeAgentConfig::default().concurrency_for_node(&node), 1);
        assert_eq!(with_rules(None, vec![]).concurrency_for_node(&node), 1);
        assert_eq!(with_rules(Some(0), vec![]).concurrency_for_node(&node), 1);
        assert_eq!(with_rules(Some(-3), vec![]).concurrency_for_node(&node), 1);
        assert_eq!(with_rules(Some(4), vec![]).concurrency_for_node(&node), 4);
        let rules = vec![
            rule(serde_json::json!({"matchLabels": {"zone": "a"}}), 8),
            rule(serde_json::json!({"matchLabels": {"size": "big"}}), 5),
            rule(serde_json::json!({"matchLabels": {"zone": "b"}}), 2),
        ];
        // Several match: the smallest of theirs, even when above the global number.
        assert_eq!(with_rules(Some(3), rules.clone()).concurrency_for_node(&node), 5);
        assert_eq!(with_rules(Some(3), rules).concurrency_for_node(&labels(&[("zone", "c")])), 3);
        // Invalid rules are skipped: a number below 1, a selector Kubernetes refuses.
        let rules = vec![
            rule(serde_json::json!({"matchLabels": {"zone": "a"}}), 0),
            rule(serde_json::json!({"matchExpressions": [{"key": "zone", "operator": "In"}]}), 1),
            rule(serde_json::json!({}), 6),
        ];
        let config = with_rules(Some(2), rules);
        assert_eq!(config.concurrency_for_node(&node), 6);
        let problems = config.validate().expect_err("must be refused").problems;
        let paths: Vec<_> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "loadConcurrency.perNodeConfig[0].number",
                "loadConcurrency.perNodeConfig[1].nodeSelector"
            ]
        );
        assert_eq!(problems[0].message, "0 is below 1");
    }

    #[test]
    fn validation_names_every_problem() {
        let config = parse(
            r#"{"loadConcurrency":{"globalConfig":0,"prepareQueueLength":-1},
                "cachePVC":{"residentThresholdInMB":-5},
                "loadAffinity":[{"nodeSelector":{"matchLabels":{"bad key!":"x"}}}]}"#,
        );
        let err = config.map(|c| c.validate()).unwrap_or(Ok(())).expect_err("must be refused");
        assert_eq!(
            err.to_string(),
            "invalid node-agent configuration: loadConcurrency.globalConfig: 0 is below 1; \
             loadConcurrency.prepareQueueLength: -1 is below 1; cachePVC.residentThresholdInMB: -5 is negative; \
             loadAffinity[0].nodeSelector: label key \"bad key!\" is not a qualified name \
             ([DNS subdomain/]name of at most 63 characters)"
        );
    }

    #[test]
    fn selectors_match_like_kubernetes() -> Result<(), SelectorError> {
        let sel =
            |v: serde_json::Value| serde_json::from_value::<LabelSelector>(v).unwrap_or_default();
        let node = labels(&[("zone", "a"), ("kubernetes.io/os", "linux")]);
        assert!(selector_matches(&sel(serde_json::json!({})), &node)?);
        assert!(selector_matches(
            &sel(serde_json::json!({"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
            {"key": "gpu", "operator": "NotIn", "values": ["yes"]},
            {"key": "kubernetes.io/os", "operator": "Exists"},
            {"key": "gpu", "operator": "DoesNotExist"}]})),
            &node
        )?);
        assert!(!selector_matches(
            &sel(serde_json::json!({"matchExpressions": [
            {"key": "zone", "operator": "NotIn", "values": ["a"]}]})),
            &node
        )?);
        assert!(!selector_matches(&sel(serde_json::json!({"matchLabels": {"zone": "b"}})), &node)?);
        let bad = [
            (
                serde_json::json!({"matchExpressions": [{"key": "z", "operator": "Gt", "values": ["1"]}]}),
                "operator \"Gt\" of key \"z\" is not In, NotIn, Exists or DoesNotExist",
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "z", "operator": "Exists", "values": ["1"]}]}),
                "operator Exists of key \"z\" takes no values",
            ),
            (
                serde_json::json!({"matchLabels": {"z": "-x"}}),
                "label value \"-x\" of key \"z\" is not a valid label value",
            ),
            (
                serde_json::json!({"matchLabels": {"Example.com/z": "x"}}),
                "label key \"Example.com/z\" is not a qualified name ([DNS subdomain/]name of at most 63 characters)",
            ),
        ];
        for (selector, message) in bad {
            let err = selector_matches(&sel(selector), &node).expect_err("must be refused");
            assert_eq!(err.to_string(), message);
        }
        Ok(())
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,10}"
    }

    fn selector() -> impl Strategy<Value = LabelSelector> {
        let req = (
            name(),
            prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist"]),
            prop::collection::vec(name(), 1..3),
        )
            .prop_map(|(key, op, values)| LabelSelectorRequirement {
                key,
                operator: op.to_owned(),
                values: matches!(op, "In" | "NotIn").then_some(values),
            });
        (
            prop::option::of(prop::collection::btree_map(name(), name(), 0..3)),
            prop::option::of(prop::collection::vec(req, 0..3)),
        )
            .prop_map(|(match_labels, match_expressions)| LabelSelector {
                match_labels,
                match_expressions,
            })
    }

    fn other() -> impl Strategy<Value = OtherKeys> {
        prop::collection::btree_map("x[A-Za-z]{0,6}", any::<i64>().prop_map(Value::from), 0..2)
    }

    fn config() -> impl Strategy<Value = NodeAgentConfig> {
        let load = (
            prop::option::of(any::<i64>()),
            prop::collection::vec((selector(), any::<i64>(), other()), 0..3),
            prop::option::of(any::<i64>()),
            other(),
        )
            .prop_map(|(global_config, rules, prepare_queue_length, other)| {
                LoadConcurrency {
                    global_config,
                    per_node_config: rules
                        .into_iter()
                        .map(|(node_selector, number, other)| RuledConfig {
                            node_selector,
                            number,
                            other,
                        })
                        .collect(),
                    prepare_queue_length,
                    other,
                }
            });
        let affinity = (selector(), prop_oneof![Just(String::new()), name()], other()).prop_map(
            |(node_selector, storage_class, other)| LoadAffinity {
                node_selector,
                storage_class,
                other,
            },
        );
        let backup = (
            prop_oneof![Just(String::new()), name()],
            any::<bool>(),
            any::<bool>(),
            prop::collection::btree_map(name(), name(), 0..2),
            other(),
        )
            .prop_map(
                |(storage_class, read_only, spc_no_relabeling, annotations, other)| BackupPvc {
                    storage_class,
                    read_only,
                    spc_no_relabeling,
                    annotations,
                    other,
                },
            );
        let resources = (
            prop::collection::vec(prop_oneof![Just(String::new()), "[0-9]{1,4}(m|Mi|Gi)?"], 6),
            other(),
        )
            .prop_map(|(q, other)| PodResources {
                cpu_request: q[0].clone(),
                cpu_limit: q[1].clone(),
                memory_request: q[2].clone(),
                memory_limit: q[3].clone(),
                ephemeral_storage_request: q[4].clone(),
                ephemeral_storage_limit: q[5].clone(),
                other,
            });
        let cache =
            (prop_oneof![Just(String::new()), name()], prop::option::of(any::<i64>()), other())
                .prop_map(|(storage_class, resident_threshold_in_mb, other)| CachePvc {
                    storage_class,
                    resident_threshold_in_mb,
                    other,
                });
        let maps = (
            prop::collection::btree_map(name(), name(), 0..2),
            prop::collection::btree_map(name(), name(), 0..2),
            other(),
        );
        (
            prop::option::of(load),
            prop::collection::vec(affinity, 0..3),
            prop::collection::btree_map(name(), backup, 0..3),
            prop::option::of((any::<bool>(), other()).prop_map(|(ignore_delay_binding, other)| {
                RestorePvc { ignore_delay_binding, other }
            })),
            prop::option::of(resources),
            (prop_oneof![Just(String::new()), name()], any::<bool>(), prop::option::of(cache)),
            maps,
        )
            .prop_map(
                |(
                    load_concurrency,
                    load_affinity,
                    backup_pvc,
                    restore_pvc,
                    pod_resources,
                    (priority_class_name, privileged_fs_backup, cache_pvc),
                    (pod_annotations, pod_labels, other),
                )| NodeAgentConfig {
                    load_concurrency,
                    load_affinity,
                    backup_pvc,
                    restore_pvc,
                    pod_resources,
                    priority_class_name,
                    privileged_fs_backup,
                    cache_pvc,
                    pod_annotations,
                    pod_labels,
                    other,
                },
            )
    }

    proptest! {
        #[test]
        fn round_trips_through_json(config in config()) {
            let json = serde_json::to_string(&config).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let back = parse(&json).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, config);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn concurrency_is_at_least_one(config in config(), node in prop::collection::btree_map(name(), name(), 0..4)) {
            prop_assert!(config.concurrency_for_node(&node) >= 1);
        }
    }
}
