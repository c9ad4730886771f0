//! Pods run to completion on the real node ([`crate::realnode`]), as an application or a user
//! runs them: create, wait until the container ends, delete, and wait until the node has let
//! go of the pod's volumes (an ended pod leaves the API before the kubelet unmounts them).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use crate::realnode::NODE_NAME;

/// Runs `pod` (which must not restart) until its container ends; deletes it and waits until
/// the node no longer uses its PVCs' volumes. Returns what the container wrote to
/// `/dev/termination-log`.
///
/// # Errors
/// The API refused the pod, the container failed (with its message) or did not end within
/// `wait`, or the node kept its volumes in use.
pub async fn run_to_completion(
    client: &Client,
    pod: &Pod,
    wait: Duration,
) -> anyhow::Result<String> {
    let ns = pod.namespace().context("the pod has no namespace")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let name = pods.create(&PostParams::default(), pod).await?.name_any();
    let deadline = Instant::now() + wait;
    let result = loop {
        let p = pods.get(&name).await?;
        let status = p.status.clone().unwrap_or_default();
        let terminated = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .find_map(|c| c.state.and_then(|s| s.terminated));
        if let Some(t) = terminated {
            let message = t.message.unwrap_or_default();
            if t.exit_code != 0 {
                break Err(anyhow::anyhow!("pod {ns}/{name} failed ({}): {message}", t.exit_code));
            }
            break Ok(message);
        }
        if Instant::now() > deadline {
            break Err(anyhow::anyhow!(
                "pod {ns}/{name} did not finish within {wait:?}: {:?}",
                p.status
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    pods.delete(&name, &Default::default()).await?;
    let deadline = Instant::now() + wait;
    while pods.get_opt(&name).await?.is_some() {
        if Instant::now() > deadline {
            bail!("pod {ns}/{name} still exists {wait:?} after it was deleted");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let claims = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()));
    for claim in claims {
        volume_released(client, &ns, &claim, wait).await?;
    }
    result
}

/// Waits until the node no longer lists the volume of PVC `ns/pvc` in use.
///
/// # Errors
/// The API failed, or the volume stayed in use for `wait`.
pub async fn volume_released(
    client: &Client,
    ns: &str,
    pvc: &str,
    wait: Duration,
) -> anyhow::Result<()> {
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns).get(pvc).await?;
    let Some(volume) = claim.spec.and_then(|s| s.volume_name) else { return Ok(()) };
    let pv = Api::<PersistentVolume>::all(client.clone()).get(&volume).await?;
    let handle = pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).unwrap_or(volume);
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + wait;
    loop {
        let in_use =
            nodes.get(NODE_NAME).await?.status.and_then(|s| s.volumes_in_use).unwrap_or_default();
        if !in_use.iter().any(|v| v.ends_with(&handle)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the node still uses {handle} after {wait:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
