//! Pods run to completion on the real node ([`crate::realnode`]), as an application or a user
//! runs them: create, wait until the container ends, delete, and wait until the node has let
//! go of the pod's volumes (an ended pod leaves the API before the kubelet unmounts them, so a
//! PVC deleted right after would lose its volume while it is still published).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

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
    let (ran, result) = loop {
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
                let failed = anyhow::anyhow!("pod {ns}/{name} failed ({}): {message}", t.exit_code);
                break (p, Err(failed));
            }
            break (p, Ok(message));
        }
        if Instant::now() > deadline {
            let late =
                anyhow::anyhow!("pod {ns}/{name} did not finish within {wait:?}: {:?}", p.status);
            break (p, Err(late));
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
    // The pod's own failure says more than a volume that stayed.
    let released = volumes_released(&ran, wait).await;
    let message = result?;
    released?;
    Ok(message)
}

/// Waits until the kubelet of the node `pod` ran on has let go of the pod's CSI volumes
/// ([`crate::realnode::kubelet_volumes`] lists nothing of the pod's any more). The node's
/// `status.volumesInUse` would not tell: the kubelet lists only volumes of drivers with attach
/// there, and the hostpath driver has none.
///
/// # Errors
/// The node is not one of this process's running real nodes, its folder could not be read,
/// or the volumes stayed for `wait`.
async fn volumes_released(pod: &Pod, wait: Duration) -> anyhow::Result<()> {
    let name = pod.name_any();
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { return Ok(()) };
    let uid = pod.uid().unwrap_or_default();
    let root = crate::realnode::kubelet_root_of(&node).with_context(|| {
        format!("pod {name} ran on {node}, not a running real node of this process")
    })?;
    let deadline = Instant::now() + wait;
    loop {
        let held: Vec<_> = crate::realnode::kubelet_volumes(&root)?
            .into_iter()
            .filter(|v| v.pod_uid == uid)
            .map(|v| v.path)
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("node {node} still has volumes of pod {name} after {wait:?}: {held:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
