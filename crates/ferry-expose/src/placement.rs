//! Where a holding pod may run, and what it carries besides Ferry's own metadata: the
//! node-agent ConfigMap's `loadAffinity`, `podLabels` and `podAnnotations`, applied as Velero
//! applies them to its data mover pods.
//!
//! - **Which rule**: the first `loadAffinity` entry naming the volume's storage class, else the
//!   first entry naming no class, else none. A backup looks up the backup PVC's class (the
//!   source's, or the one `backupPVC` maps it to); a restore looks up the target PVC's class
//!   and ignores the rule when the pod is pinned to the node the target's WaitForFirstConsumer
//!   binding selected.
//! - **How it becomes node affinity**: every `matchLabels` pair becomes an `In` requirement
//!   with that one value, every `matchExpressions` entry a requirement with the same key,
//!   operator and values; all of them form one required node selector term, so they must all
//!   hold. Ferry names nodes by their object name in `matchFields` of the same term: the node
//!   a WaitForFirstConsumer target selected (`metadata.name In`), and one `metadata.name NotIn`
//!   per node whose agent stopped (the API server accepts one value per node field
//!   requirement).
//! - **Labels**: the configured labels, under Ferry's own (which the exposers find their
//!   objects by); annotations as configured.

use std::collections::BTreeMap;

use ferry_api::k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The node field a node affinity names a node by.
pub(crate) const NODE_NAME_FIELD: &str = "metadata.name";

/// One `loadAffinity` entry: the nodes holding pods of some (or all) volumes may run on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadAffinity {
    /// The nodes, by label (validated when read from the ConfigMap).
    pub node_selector: LabelSelector,
    /// The storage class whose volumes the entry is for; `None` for every class.
    pub storage_class: Option<String>,
}

/// The rule for volumes of `storage_class` (empty: no class), by Velero's rule.
pub(crate) fn affinity_for<'a>(
    rules: &'a [LoadAffinity],
    storage_class: &str,
) -> Option<&'a LoadAffinity> {
    rules
        .iter()
        .find(|rule| rule.storage_class.as_deref().unwrap_or_default() == storage_class)
        .or_else(|| rules.iter().find(|rule| rule.storage_class.is_none()))
}

/// The node selector requirements a label selector stands for (Velero's conversion).
pub(crate) fn requirements(selector: &LabelSelector) -> Vec<NodeSelectorRequirement> {
    let pairs =
        selector.match_labels.iter().flatten().map(|(key, value)| NodeSelectorRequirement {
            key: key.clone(),
            operator: "In".to_owned(),
            values: Some(vec![value.clone()]),
        });
    let expressions =
        selector.match_expressions.iter().flatten().map(|e| NodeSelectorRequirement {
            key: e.key.clone(),
            operator: e.operator.clone(),
            values: e.values.clone().filter(|v| !v.is_empty()),
        });
    pairs.chain(expressions).collect()
}

/// The holding pod's required node affinity: the rule's requirements, the node it is pinned
/// to and the nodes to avoid, all in one term, and that term within each of `topology`'s
/// terms (the source volume's, see [`crate::topology`]: any one of them, and all of ours);
/// `None` when there is nothing to require. Nodes are named by their object name
/// (`matchFields` on `metadata.name`, as DaemonSets pin their pods), never by the hostname
/// label, which need not equal the node's name.
pub(crate) fn node_affinity(
    rule: Option<&LoadAffinity>,
    node: Option<&str>,
    avoid: &[String],
    topology: &[NodeSelectorTerm],
) -> Option<Affinity> {
    let labels = rule.map(|r| requirements(&r.node_selector)).unwrap_or_default();
    let by_name = |operator: &str, values: Vec<String>| NodeSelectorRequirement {
        key: NODE_NAME_FIELD.to_owned(),
        operator: operator.to_owned(),
        values: Some(values),
    };
    let mut names = Vec::new();
    if let Some(node) = node {
        names.push(by_name("In", vec![node.to_owned()]));
    }
    // One value per requirement: the API server refuses more in a node field selector.
    names.extend(avoid.iter().map(|n| by_name("NotIn", vec![n.clone()])));
    let topology: Vec<&NodeSelectorTerm> = topology.iter().filter(|t| !is_empty(t)).collect();
    if labels.is_empty() && names.is_empty() && topology.is_empty() {
        return None;
    }
    let ours = |mut term: NodeSelectorTerm| {
        let expressions = term.match_expressions.get_or_insert_with(Vec::new);
        expressions.extend(labels.iter().cloned());
        let fields = term.match_fields.get_or_insert_with(Vec::new);
        fields.extend(names.iter().cloned());
        NodeSelectorTerm {
            match_expressions: term.match_expressions.filter(|e| !e.is_empty()),
            match_fields: term.match_fields.filter(|f| !f.is_empty()),
        }
    };
    let terms = if topology.is_empty() {
        vec![ours(NodeSelectorTerm::default())]
    } else {
        topology.into_iter().map(|t| ours(t.clone())).collect()
    };
    Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    })
}

/// A term with no requirement. Kubernetes matches no node with it, so next to other terms it
/// changes nothing; a PV whose terms are all empty (a broken PV) adds no requirement here
/// rather than making the holding pod unschedulable for good.
fn is_empty(term: &NodeSelectorTerm) -> bool {
    term.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && term.match_fields.as_ref().is_none_or(Vec::is_empty)
}

/// The pod's labels: the configured ones, with Ferry's own set over them.
pub(crate) fn pod_labels(
    configured: &BTreeMap<String, String>,
    own: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels = configured.clone();
    labels.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(class: Option<&str>, selector: serde_json::Value) -> LoadAffinity {
        LoadAffinity {
            node_selector: serde_json::from_value(selector).unwrap(),
            storage_class: class.map(str::to_owned),
        }
    }

    #[test]
    fn the_class_rule_wins_else_the_first_global_one() {
        let rules = [
            rule(None, json!({"matchLabels": {"pool": "global-1"}})),
            rule(Some("fast"), json!({"matchLabels": {"pool": "fast-1"}})),
            rule(None, json!({"matchLabels": {"pool": "global-2"}})),
            rule(Some("fast"), json!({"matchLabels": {"pool": "fast-2"}})),
            rule(Some("slow"), json!({"matchLabels": {"pool": "slow"}})),
        ];
        assert_eq!(affinity_for(&rules, "fast"), Some(&rules[1]), "named class, even listed later");
        assert_eq!(affinity_for(&rules, "slow"), Some(&rules[4]));
        assert_eq!(affinity_for(&rules, "other"), Some(&rules[0]), "first classless rule");
        assert_eq!(affinity_for(&rules, ""), Some(&rules[0]), "a volume without a class");
        assert_eq!(affinity_for(&rules[3..], "other"), None, "no classless rule: none");
        assert_eq!(affinity_for(&[], "fast"), None);
    }

    #[test]
    fn labels_and_expressions_become_one_anded_term() {
        let selector: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"zone": "b", "pool": "movers"},
            "matchExpressions": [
                {"key": "cores", "operator": "Gt", "values": ["8"]},
                {"key": "gpu", "operator": "DoesNotExist"},
                {"key": "tier", "operator": "NotIn", "values": ["spot", "preemptible"]},
                {"key": "disk", "operator": "Exists", "values": []},
            ]
        }))
        .unwrap();
        let affinity = node_affinity(
            Some(&LoadAffinity { node_selector: selector, storage_class: None }),
            None,
            &["dead-node".to_owned()],
            &[],
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&affinity).unwrap(),
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "pool", "operator": "In", "values": ["movers"]},
                    {"key": "zone", "operator": "In", "values": ["b"]},
                    {"key": "cores", "operator": "Gt", "values": ["8"]},
                    {"key": "gpu", "operator": "DoesNotExist"},
                    {"key": "tier", "operator": "NotIn", "values": ["spot", "preemptible"]},
                    {"key": "disk", "operator": "Exists"},
                ], "matchFields": [
                    {"key": "metadata.name", "operator": "NotIn", "values": ["dead-node"]},
                ]}]
            }}})
        );
    }

    #[test]
    fn nothing_to_require_means_no_affinity() {
        assert_eq!(node_affinity(None, None, &[], &[]), None);
        assert_eq!(
            node_affinity(Some(&LoadAffinity::default()), None, &[], &[]),
            None,
            "empty selector"
        );
        let two =
            node_affinity(None, Some("n0"), &["n1".to_owned(), "n2".to_owned()], &[]).unwrap();
        let fields = serde_json::to_value(&two).unwrap()["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchFields"]
            .clone();
        assert_eq!(
            fields,
            json!([
                {"key": "metadata.name", "operator": "In", "values": ["n0"]},
                {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]},
                {"key": "metadata.name", "operator": "NotIn", "values": ["n2"]},
            ]),
            "one value per node field requirement, as the API server requires"
        );
        let only_avoid = node_affinity(None, None, &["n1".to_owned()], &[]).unwrap();
        let required = only_avoid.node_affinity.unwrap();
        let terms = required.required_during_scheduling_ignored_during_execution.unwrap();
        assert_eq!(terms.node_selector_terms.len(), 1);
    }

    #[test]
    fn the_source_topology_is_required_with_each_of_its_terms() {
        let topology: Vec<NodeSelectorTerm> = serde_json::from_value(json!([
            {"matchExpressions": [{"key": "topology.hostpath.csi/node", "operator": "In", "values": ["n1"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            {},
        ]))
        .unwrap();
        let rule = LoadAffinity {
            node_selector: serde_json::from_value(json!({"matchLabels": {"pool": "movers"}}))
                .unwrap(),
            storage_class: None,
        };
        let affinity = node_affinity(Some(&rule), None, &["dead".to_owned()], &topology).unwrap();
        assert_eq!(
            serde_json::to_value(&affinity).unwrap()["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"],
            json!([
                {"matchExpressions": [
                    {"key": "topology.hostpath.csi/node", "operator": "In", "values": ["n1"]},
                    {"key": "pool", "operator": "In", "values": ["movers"]},
                ], "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["dead"]}]},
                {"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["b"]},
                    {"key": "pool", "operator": "In", "values": ["movers"]},
                ], "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["dead"]}]},
            ]),
            "each source term with all of ours; the empty term dropped"
        );
        let alone = node_affinity(None, None, &[], &topology[..1]).unwrap();
        assert_eq!(
            serde_json::to_value(&alone).unwrap()["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"],
            json!([{"matchExpressions": [
                {"key": "topology.hostpath.csi/node", "operator": "In", "values": ["n1"]},
            ]}])
        );
        assert_eq!(node_affinity(None, None, &[], &topology[2..]), None, "only an empty term");
    }

    #[test]
    fn ferry_labels_override_configured_ones() {
        let configured = BTreeMap::from([
            ("team".to_owned(), "storage".to_owned()),
            ("velero.io/data-upload".to_owned(), "spoofed".to_owned()),
        ]);
        let own = BTreeMap::from([("velero.io/data-upload".to_owned(), "du-1".to_owned())]);
        let labels = pod_labels(&configured, &own);
        assert_eq!(labels["velero.io/data-upload"], "du-1");
        assert_eq!(labels["team"], "storage");
        assert_eq!(labels.len(), 2);
    }
}
