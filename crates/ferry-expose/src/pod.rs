//! Reading a holding pod's state: placed, running, or never going to be.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use tokio_util::sync::CancellationToken;

use crate::ExposeError;
use crate::ops::{create_or_get, get_opt};
use crate::provisioning::SlowClaim;
use crate::wait::{Look, until};

/// What the scheduler says of a pod it has not placed, look after look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Its claim is not bound yet.
    Unbound,
    /// Any other reason.
    Rejected,
}

/// Tracks since when the scheduler has held a pod back for the same kind of reason.
#[derive(Debug, Default)]
pub(crate) struct Unschedulable {
    since: Mutex<Option<(Held, Instant)>>,
}

impl Unschedulable {
    /// Notes this look's reason (`None`: not held back); returns since when the pod has been
    /// held for it.
    fn note(&self, held: Option<Held>) -> Option<Instant> {
        let mut since = self.since.lock().unwrap_or_else(PoisonError::into_inner);
        *since = match (held, *since) {
            (Some(now), Some((before, at))) if now == before => Some((now, at)),
            (Some(now), _) => Some((now, Instant::now())),
            (None, _) => None,
        };
        since.map(|(_, at)| at)
    }

    /// How long the scheduler has said, look after look, that the pod's claim is unbound.
    fn unbound_for(&self) -> Option<Duration> {
        match *self.since.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((Held::Unbound, at)) => Some(at.elapsed()),
            _ => None,
        }
    }
}

/// Waits until holding pod `name` is placed on a node and returns the node. While its claim
/// `slow` stays unbound past the grace, what the cluster says of the claim is told and kept
/// for the timeout's message.
pub(crate) async fn wait_placed(
    pods: &Api<Pod>,
    name: &str,
    slow: &SlowClaim<'_>,
    timeout: Duration,
    grace: Duration,
    cancel: &CancellationToken,
) -> Result<String, ExposeError> {
    let unschedulable = Unschedulable::default();
    let unschedulable = &unschedulable;
    until(&format!("pod {name} to be scheduled"), timeout, cancel, || async move {
        let pod = get_opt(pods, name, "reading the holding pod")
            .await?
            .ok_or_else(|| ExposeError::Unusable(format!("pod {name} was deleted")))?;
        match placed(&pod, grace, unschedulable)? {
            Look::NotYet(seen) => match unschedulable.unbound_for().filter(|w| *w >= grace) {
                Some(waited) => Ok(Look::NotYet(format!("{seen}; {}", slow.news(waited).await))),
                None => Ok(Look::NotYet(seen)),
            },
            ready => Ok(ready),
        }
    })
    .await
}

/// What kube-scheduler (its VolumeBinding plugin) says of a pod whose claim of an Immediate
/// binding class is not bound yet. The volume is still being provisioned, not refused: made
/// from a snapshot, that can take minutes (the hostpath driver copies the whole snapshot, a
/// cloud disk is hydrated). Only the operation's timeout bounds that wait, as in Velero,
/// which fails no pod for being unschedulable.
const UNBOUND_CLAIM: &str = "pod has unbound immediate PersistentVolumeClaims";

/// The node the pod was placed on, once it is; a failed pod, or one the scheduler has
/// rejected for longer than `grace` for another reason than its claim not bound yet, is an
/// error carrying the cluster's reason.
pub(crate) fn placed(
    pod: &Pod,
    grace: Duration,
    unschedulable: &Unschedulable,
) -> Result<Look<String>, ExposeError> {
    failed(pod)?;
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        return Ok(Look::Ready(node));
    }
    let rejected = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False"))
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default()
            )
        });
    match rejected {
        Some(reason) if reason.contains(UNBOUND_CLAIM) => {
            unschedulable.note(Some(Held::Unbound));
            Ok(Look::NotYet(format!(
                "pod {} waits for its volume to be provisioned ({reason})",
                pod.name_any()
            )))
        }
        Some(reason) => {
            let since = unschedulable.note(Some(Held::Rejected)).unwrap_or_else(Instant::now);
            if since.elapsed() >= grace {
                return Err(ExposeError::Unusable(format!(
                    "pod {} cannot be scheduled ({reason}) for {:?}",
                    pod.name_any(),
                    since.elapsed()
                )));
            }
            Ok(Look::NotYet(format!("pod {} not scheduled: {reason}", pod.name_any())))
        }
        None => {
            unschedulable.note(None);
            Ok(Look::NotYet(format!("pod {} not scheduled yet", pod.name_any())))
        }
    }
}

/// An error when the pod has failed or succeeded (it should hold the volume forever).
pub(crate) fn failed(pod: &Pod) -> Result<(), ExposeError> {
    let status = pod.status.as_ref();
    match status.and_then(|s| s.phase.as_deref()) {
        Some(phase @ ("Failed" | "Succeeded")) => Err(ExposeError::Unusable(format!(
            "pod {}/{} holding the volume is {phase}: {} {}",
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            status.and_then(|s| s.reason.clone()).unwrap_or_default(),
            status.and_then(|s| s.message.clone()).unwrap_or_default()
        ))),
        _ => Ok(()),
    }
}

/// A pod being deleted (by a user, an eviction, a preemption) is about to lose its volumes.
pub(crate) fn not_deleted(pod: &Pod) -> Result<(), ExposeError> {
    match &pod.metadata.deletion_timestamp {
        Some(since) => Err(ExposeError::Unusable(format!(
            "pod {}/{} holding the volume is being deleted (since {}): deleted, evicted or \
             preempted",
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            since.0
        ))),
        None => Ok(()),
    }
}

/// Whether the pod runs (its volumes are set up by the kubelet).
pub(crate) fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Why a pod is not running yet, for a message: its phase and what its container waits for
/// (`ContainerCreating`, `ImagePullBackOff: …`).
pub(crate) fn not_running_because(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("without a phase");
    let waiting = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .find_map(|c| c.state.as_ref().and_then(|s| s.waiting.as_ref()));
    match waiting {
        Some(w) => {
            let reason = w.reason.as_deref().unwrap_or("waiting");
            match w.message.as_deref().filter(|m| !m.is_empty()) {
                Some(message) => format!("{phase}, container {reason}: {message}"),
                None => format!("{phase}, container {reason}"),
            }
        }
        None => phase.to_owned(),
    }
}

/// Creates the holding pod, or finds it from an earlier attempt; a pod found on a node to
/// avoid (its agent stopped) is removed at once and made again, kept off those nodes.
pub(crate) async fn ensure_holder(
    pods: &Api<Pod>,
    pod: &Pod,
    avoid: &[String],
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<(), ExposeError> {
    let existing = create_or_get(pods, pod, "creating the holding pod").await?;
    let node = existing.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    if node.is_empty() || !avoid.contains(&node) {
        return Ok(());
    }
    let name = pod.name_any();
    tracing::warn!(pod = %name, node = %node, "moving the holding pod off a stopped node");
    let params = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    let uid = existing.uid();
    match pods.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            return Err(ExposeError::Api {
                step: "deleting the holding pod on a stopped node",
                source: Box::new(ferry_kube::ApiError::from_kube("Pod", &name, e)),
            });
        }
    }
    until(&format!("pod {name} on stopped node {node} to be deleted"), timeout, cancel, || async {
        let now = get_opt(pods, &name, "reading the holding pod").await?;
        Ok(match now {
            Some(p) if p.uid() == uid => Look::NotYet("still there".into()),
            _ => Look::Ready(()),
        })
    })
    .await?;
    create_or_get(pods, pod, "creating the holding pod again").await?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pod_not_running_says_what_its_container_waits_for() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "p" },
            "status": { "phase": "Pending", "containerStatuses": [{
                "name": "hold", "image": "ferry", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": { "waiting": { "reason": "ImagePullBackOff",
                                        "message": "Back-off pulling image \"ferry\"" } },
            }] },
        }))
        .unwrap();
        assert_eq!(
            not_running_because(&pod),
            "Pending, container ImagePullBackOff: Back-off pulling image \"ferry\""
        );
        let pod: Pod =
            serde_json::from_value(json!({ "metadata": { "name": "p" }, "status": {} })).unwrap();
        assert_eq!(not_running_because(&pod), "without a phase");
    }

    fn rejected(message: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "hold" },
            "status": { "phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": message,
            }] },
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_still_provisioning_is_waited_for_past_the_grace_and_a_rejection_is_not() {
        let unschedulable = Unschedulable::default();
        // Bound only after the grace (a volume made from a large snapshot): still waiting.
        let provisioning =
            rejected("0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.");
        for _ in 0..2 {
            match placed(&provisioning, Duration::ZERO, &unschedulable).unwrap() {
                Look::NotYet(why) => assert!(why.contains("waits for its volume"), "{why}"),
                Look::Ready(node) => panic!("placed on {node}"),
            }
        }
        // How long the claim has been unbound is kept, from the first such look: past the
        // grace, the wait tells what the cluster says of the claim.
        std::thread::sleep(Duration::from_millis(5));
        placed(&provisioning, Duration::ZERO, &unschedulable).unwrap();
        assert!(unschedulable.unbound_for().unwrap() >= Duration::from_millis(5));
        // Any other rejection fails once the grace is over, with the scheduler's words.
        let cordoned = rejected("0/1 nodes are available: 1 node(s) were unschedulable.");
        let Err(err) = placed(&cordoned, Duration::ZERO, &unschedulable) else {
            panic!("a rejection past the grace was not an error")
        };
        let err = err.to_string();
        assert!(err.contains("cannot be scheduled") && err.contains("were unschedulable"), "{err}");
        // A pod rejected for another reason, or no longer rejected, has no claim waiting.
        assert_eq!(unschedulable.unbound_for(), None);
        placed(&provisioning, Duration::ZERO, &unschedulable).unwrap();
        let pending: Pod =
            serde_json::from_value(json!({ "metadata": { "name": "hold" }, "status": {} }))
                .unwrap();
        placed(&pending, Duration::ZERO, &unschedulable).unwrap();
        assert_eq!(unschedulable.unbound_for(), None);
        assert!(matches!(
            placed(&cordoned, Duration::from_secs(60), &Unschedulable::default()),
            Ok(Look::NotYet(_))
        ));
    }
}
