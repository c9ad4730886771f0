//! The holding pods' tolerations: the agent's own (they must reach every node the agent
//! serves), never the cordon's.
//!
//! A DaemonSet's pods tolerate `node.kubernetes.io/unschedulable` (the kubelet's cordon
//! taint) and often everything (`operator: Exists` without a key). Holding pods are ordinary
//! pods: they must not be scheduled onto a node an operator cordoned, nor get the node-condition
//! tolerations (`node.kubernetes.io/*`) the DaemonSet controller adds to daemon pods. So each
//! other toleration of the agent is kept unless it tolerates the cordon: a toleration of the cordon's key is dropped,
//! and a keyless one is narrowed to the taints it must still tolerate: every effect but
//! `NoSchedule` as it was, and `NoSchedule` for each key nodes carry now except the cordon's.
//! The scheduler then keeps holding pods off cordoned nodes, and places them again once a node
//! is uncordoned.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{Node, Toleration};

/// The taint key of a cordoned node.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

const NO_SCHEDULE: &str = "NoSchedule";

fn keyless(t: &Toleration) -> bool {
    t.key.as_deref().unwrap_or_default().is_empty()
}

fn covers_no_schedule(t: &Toleration) -> bool {
    t.effect.as_deref().is_none_or(|e| e.is_empty() || e == NO_SCHEDULE)
}

/// Whether `t` tolerates the cordon taint (`node.kubernetes.io/unschedulable:NoSchedule`).
#[must_use]
pub fn tolerates_cordon(t: &Toleration) -> bool {
    let exists = t.operator.as_deref() == Some("Exists");
    covers_no_schedule(t)
        && ((keyless(t) && exists) || t.key.as_deref() == Some(UNSCHEDULABLE_TAINT))
}

/// The `NoSchedule` taint keys of `nodes`, the cordon's left out.
#[must_use]
pub fn no_schedule_keys(nodes: &[Node]) -> BTreeSet<String> {
    nodes
        .iter()
        .filter_map(|n| n.spec.as_ref()?.taints.as_ref())
        .flatten()
        .filter(|t| t.effect == NO_SCHEDULE && t.key != UNSCHEDULABLE_TAINT)
        .map(|t| t.key.clone())
        .collect()
}

/// How long the nodes' taint keys, once listed, serve later exposures.
pub(crate) const TAINTS_MAX_AGE: Duration = Duration::from_secs(30);

/// The nodes' `NoSchedule` taint keys, listed only when a keyless toleration needs them and
/// then at most once per [`TAINTS_MAX_AGE`] for all the exposures of one exposer (thirty CRs
/// exposed at once cost one LIST, not thirty). The LIST asks for any resource version, so the
/// API server answers from its watch cache without reading etcd; a taint added since is
/// tolerated by the holding pods of the next listing.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeTaints {
    last: Arc<tokio::sync::Mutex<Option<Listed>>>,
}

/// When the taint keys were listed, and what they were.
type Listed = (Instant, BTreeSet<String>);

impl NodeTaints {
    async fn no_schedule_keys(
        &self,
        client: &kube::Client,
    ) -> Result<BTreeSet<String>, crate::ExposeError> {
        let mut last = self.last.lock().await;
        if let Some((at, keys)) = &*last
            && at.elapsed() < TAINTS_MAX_AGE
        {
            return Ok(keys.clone());
        }
        let nodes: kube::Api<Node> = kube::Api::all(client.clone());
        let any_version = kube::api::ListParams {
            resource_version: Some("0".into()),
            version_match: Some(kube::api::VersionMatch::NotOlderThan),
            ..kube::api::ListParams::default()
        };
        let listed = nodes.list(&any_version).await.map_err(|e| crate::ExposeError::Api {
            step: "listing the nodes' taints for the holding pod's tolerations",
            source: Box::new(ferry_kube::ApiError::from_kube("Node", "", e)),
        })?;
        let keys = no_schedule_keys(&listed.items);
        *last = Some((Instant::now(), keys.clone()));
        Ok(keys)
    }
}

/// The holding pods' tolerations for an agent tolerating `agent`, with the nodes' taints read
/// (through `taints`) only when a keyless toleration needs them.
///
/// # Errors
/// Listing the nodes failed.
pub(crate) async fn for_holders(
    client: &kube::Client,
    agent: &[Toleration],
    taints: &NodeTaints,
) -> Result<Vec<Toleration>, crate::ExposeError> {
    let keys = if agent.iter().any(|t| keyless(t) && tolerates_cordon(t)) {
        taints.no_schedule_keys(client).await?
    } else {
        BTreeSet::new()
    };
    Ok(holder_tolerations(agent, &keys))
}

/// The holding pods' tolerations given the agent's own (`agent`) and the `NoSchedule` taint
/// keys nodes carry now (`no_schedule_keys`). See the module docs.
#[must_use]
pub fn holder_tolerations(
    agent: &[Toleration],
    no_schedule_keys: &BTreeSet<String>,
) -> Vec<Toleration> {
    let mut out: Vec<Toleration> = Vec::new();
    let mut push = |t: Toleration| {
        if !out.contains(&t) {
            out.push(t);
        }
    };
    for t in agent {
        // The node-condition tolerations the DaemonSet controller gives every daemon pod
        // (not-ready, unreachable, disk/memory/pid pressure, ...): an ordinary pod gets none.
        if t.key.as_deref().is_some_and(|k| k.starts_with("node.kubernetes.io/")) {
            continue;
        }
        if !tolerates_cordon(t) {
            push(t.clone());
            continue;
        }
        if !keyless(t) {
            continue; // The cordon's own key.
        }
        // A keyless Exists, for NoSchedule or every effect: the other effects stay as they
        // were, NoSchedule only for the keys in use.
        if t.effect.as_deref().is_none_or(str::is_empty) {
            for effect in ["PreferNoSchedule", "NoExecute"] {
                push(Toleration {
                    operator: Some("Exists".into()),
                    effect: Some(effect.into()),
                    toleration_seconds: None,
                    ..Toleration::default()
                });
            }
        }
        for key in no_schedule_keys {
            push(Toleration {
                key: Some(key.clone()),
                operator: Some("Exists".into()),
                effect: Some(NO_SCHEDULE.into()),
                ..Toleration::default()
            });
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn t(json: serde_json::Value) -> Toleration {
        serde_json::from_value(json).unwrap()
    }

    fn node(taints: serde_json::Value) -> Node {
        serde_json::from_value(
            serde_json::json!({ "metadata": { "name": "n" }, "spec": { "taints": taints } }),
        )
        .unwrap()
    }

    #[test]
    fn the_cordon_is_never_tolerated() {
        let nodes = [
            node(serde_json::json!([
                { "key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule" },
                { "key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule" },
                { "key": "gpu", "value": "yes", "effect": "NoExecute" },
            ])),
            node(
                serde_json::json!([{ "key": "dedicated", "value": "db", "effect": "NoSchedule" }]),
            ),
        ];
        let keys = no_schedule_keys(&nodes);
        assert_eq!(
            keys.iter().map(String::as_str).collect::<Vec<_>>(),
            ["dedicated", "node-role.kubernetes.io/control-plane"]
        );

        let wildcard = [t(serde_json::json!({ "operator": "Exists" }))];
        let held = holder_tolerations(&wildcard, &keys);
        assert!(held.iter().all(|h| !tolerates_cordon(h)), "{held:?}");
        assert_eq!(held.len(), 4, "two other effects, two keys: {held:?}");

        let daemonset = [
            t(
                serde_json::json!({ "key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule" }),
            ),
            t(
                serde_json::json!({ "key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute" }),
            ),
            t(
                serde_json::json!({ "key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule" }),
            ),
        ];
        let held = holder_tolerations(&daemonset, &keys);
        assert_eq!(held, daemonset[2..].to_vec(), "the cordon's and the node conditions' dropped");

        let no_schedule_only =
            [t(serde_json::json!({ "operator": "Exists", "effect": "NoSchedule" }))];
        let held = holder_tolerations(&no_schedule_only, &keys);
        assert_eq!(held.len(), 2, "{held:?}");
        assert!(held.iter().all(|h| h.effect.as_deref() == Some("NoSchedule") && !keyless(h)));
        assert!(holder_tolerations(&[], &keys).is_empty(), "no wider than the agent's");
    }
}
