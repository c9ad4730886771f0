//! The scheduler: places Pending pods on simulated nodes through `pods/binding`, or explains in
//! a `PodScheduled=False` condition why it cannot.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{State, World, name, namespace, uid};
use crate::select::{label_selector_matches, node_selector_matches};
use crate::sim::{Ctx, SimNode};
use crate::{HOSTNAME_LABEL, SELECTED_NODE_ANNOTATION, SIM_NODE_LABEL, SimError};

enum Decision {
    Bind(String),
    /// Ask for WaitForFirstConsumer provisioning of these claims on this node.
    SelectNode(String, Vec<String>),
    Wait,
    Unschedulable(String),
}

pub(super) async fn reconcile(ctx: &Ctx, state: &mut State, world: &World) {
    let mut load: HashMap<&str, usize> = ctx.nodes.iter().map(|n| (n.name.as_str(), 0)).collect();
    for pod in &world.pods {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if let Some(count) = node.and_then(|n| load.get_mut(n))
            && !matches!(phase, Some("Succeeded" | "Failed"))
        {
            *count += 1;
        }
    }
    for pod in &world.pods {
        let spec = pod.spec.clone().unwrap_or_default();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        if spec.node_name.is_some()
            || pod.metadata.deletion_timestamp.is_some()
            || phase != "Pending"
        {
            continue;
        }
        if !relevant(ctx, world, pod) {
            continue;
        }
        let result = match decide(ctx, state, world, pod, &load) {
            Decision::Bind(node) => {
                if let Some(c) = load.get_mut(node.as_str()) {
                    *c += 1;
                }
                bind(ctx, pod, &node).await
            }
            Decision::SelectNode(node, claims) => {
                if let Some(c) = load.get_mut(node.as_str()) {
                    *c += 1;
                }
                select_node(ctx, pod, &node, &claims).await
            }
            Decision::Wait => Ok(()),
            Decision::Unschedulable(message) => unschedulable(ctx, pod, &message).await,
        };
        if let Err(e) = result {
            let id = format!("{}/{}", namespace(&pod.metadata), name(&pod.metadata));
            tracing::warn!(pod = id, error = %e, "scheduling");
        }
    }
}

fn claims(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()))
        .collect()
}

/// Whether this simulator schedules the pod: it uses our volumes, names our nodes, or lives in
/// one of our namespaces.
fn relevant(ctx: &Ctx, world: &World, pod: &Pod) -> bool {
    let ns = namespace(&pod.metadata);
    if ctx.namespaces.iter().any(|n| n == ns) {
        return true;
    }
    let claims = claims(pod);
    if !claims.is_empty() {
        return claims
            .iter()
            .any(|c| world.pvc(ns, c).is_some_and(|pvc| world.pvc_is_ours(ctx, pvc)));
    }
    let selector = pod.spec.as_ref().and_then(|s| s.node_selector.clone()).unwrap_or_default();
    selector.get(HOSTNAME_LABEL).is_some_and(|h| ctx.node(h).is_some())
        || selector.get(SIM_NODE_LABEL) == Some(&ctx.names.id)
}

/// A node's labels: the built-in ones over the test's extra labels (which cannot name
/// `kubernetes.io/hostname` or the simulator label; [`SimConfig`](crate::SimConfig) checks).
pub(crate) fn node_labels(ctx: &Ctx, node: &SimNode) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from(
        [("kubernetes.io/os", "linux"), ("kubernetes.io/arch", "amd64")]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    labels.extend(node.extra_labels.clone());
    labels.insert(HOSTNAME_LABEL.to_owned(), node.name.clone());
    labels.insert(SIM_NODE_LABEL.to_owned(), ctx.names.id.clone());
    labels
}

fn decide(
    ctx: &Ctx,
    state: &State,
    world: &World,
    pod: &Pod,
    load: &HashMap<&str, usize>,
) -> Decision {
    let spec = pod.spec.clone().unwrap_or_default();
    let ns = namespace(&pod.metadata);
    let total = ctx.nodes.len();
    let selector = spec.node_selector.clone().unwrap_or_default();
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    let mut nodes: Vec<&SimNode> = ctx
        .nodes
        .iter()
        .filter(|n| {
            let labels = node_labels(ctx, n);
            let sel = k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(selector.clone()),
                match_expressions: None,
            };
            label_selector_matches(&sel, &labels)
                && required.is_none_or(|r| node_selector_matches(r, &n.name, &labels))
        })
        .collect();
    if nodes.is_empty() {
        return Decision::Unschedulable(format!(
            "0/{total} nodes are available: {total} node(s) didn't match Pod's node affinity/selector."
        ));
    }
    let mut to_select = Vec::new();
    let mut waiting = false;
    for claim in claims(pod) {
        let Some(pvc) = world.pvc(ns, &claim) else {
            return Decision::Unschedulable(format!("persistentvolumeclaim \"{claim}\" not found"));
        };
        if pvc.metadata.deletion_timestamp.is_some() {
            return Decision::Unschedulable(format!(
                "persistentvolumeclaim \"{claim}\" is being deleted"
            ));
        }
        let bound_pv = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty())
            .and_then(|v| world.pv(v))
            .filter(|_| pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"));
        if let Some(pv) = bound_pv {
            if let Some(required) = pv
                .spec
                .as_ref()
                .and_then(|s| s.node_affinity.as_ref())
                .and_then(|a| a.required.as_ref())
            {
                nodes.retain(|n| node_selector_matches(required, &n.name, &node_labels(ctx, n)));
            }
            continue;
        }
        let delayed = pvc
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
            .and_then(|c| world.class(c))
            .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
        // kube-scheduler knows nothing of an Immediate claim's provisioning: whatever the
        // provisioner's trouble (told in Events on the claim), it says the claim is unbound.
        if !delayed {
            return Decision::Unschedulable(format!(
                "0/{total} nodes are available: pod has unbound immediate PersistentVolumeClaims."
            ));
        }
        if let Some(error) = state.provision_errors.get(uid(&pvc.metadata)) {
            return Decision::Unschedulable(format!(
                "0/{total} nodes are available: persistentvolumeclaim \"{claim}\" could not be provisioned: {error}"
            ));
        }
        match pvc.metadata.annotations.as_ref().and_then(|a| a.get(SELECTED_NODE_ANNOTATION)) {
            Some(selected) => {
                nodes.retain(|n| &n.name == selected);
                waiting = true;
            }
            None => to_select.push(claim),
        }
    }
    let Some(node) = nodes.iter().min_by_key(|n| load.get(n.name.as_str()).copied().unwrap_or(0))
    else {
        return Decision::Unschedulable(format!(
            "0/{total} nodes are available: {total} node(s) had volume node affinity conflict."
        ));
    };
    if !to_select.is_empty() {
        Decision::SelectNode(node.name.clone(), to_select)
    } else if waiting {
        Decision::Wait
    } else {
        Decision::Bind(node.name.clone())
    }
}

async fn bind(ctx: &Ctx, pod: &Pod, node: &str) -> Result<(), SimError> {
    let ns = namespace(&pod.metadata);
    let pod_name = name(&pod.metadata);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": { "name": pod_name, "namespace": ns, "uid": uid(&pod.metadata) },
        "target": { "apiVersion": "v1", "kind": "Node", "name": node }
    });
    let result: Result<serde_json::Value, _> =
        api.create_subresource("binding", pod_name, &PostParams::default(), &binding).await;
    match result {
        Ok(_) => Ok(()),
        // Bound meanwhile (by another simulator or a retry): nothing to do.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(SimError::api("binding", "Pod", format!("{ns}/{pod_name}"), e)),
    }
}

async fn select_node(ctx: &Ctx, pod: &Pod, node: &str, claims: &[String]) -> Result<(), SimError> {
    let ns = namespace(&pod.metadata);
    let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), ns);
    for claim in claims {
        let patch = json!({ "metadata": { "annotations": { SELECTED_NODE_ANNOTATION: node } } });
        api.patch(claim, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(|e| {
            SimError::api(
                "selecting a node for",
                "PersistentVolumeClaim",
                format!("{ns}/{claim}"),
                e,
            )
        })?;
    }
    Ok(())
}

async fn unschedulable(ctx: &Ctx, pod: &Pod, message: &str) -> Result<(), SimError> {
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    if current.is_some_and(|c| c.status == "False" && c.message.as_deref() == Some(message)) {
        return Ok(());
    }
    let ns = namespace(&pod.metadata);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    // The UID makes the patch a precondition: a pod made again under the same name is another.
    let status = json!({ "metadata": { "uid": super::uid(&pod.metadata) }, "status": { "phase": "Pending", "conditions": [ {
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": message, "lastTransitionTime": super::now(), "lastProbeTime": null } ] } });
    api.patch_status(name(&pod.metadata), &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map(drop)
        .map_err(|e| {
            SimError::api("patching status of", "Pod", format!("{ns}/{}", name(&pod.metadata)), e)
        })
}
