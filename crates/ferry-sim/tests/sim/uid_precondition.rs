//! The simulator's kubelet and scheduler patch pod status with the pod's UID in the patch, as
//! the real kubelet does, so that a pod deleted and made again under the same name (Ferry moves
//! holding pods off lost nodes that way) never receives the old pod's status. This checks the
//! API server behaviour that relies on.

use ferry_testbed::ControlPlane;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "containers": [ { "name": "c", "image": "ferry:test" } ] },
    }))
    .unwrap()
}

#[tokio::test]
async fn a_status_patch_for_an_older_pod_of_the_same_name_is_refused() {
    let cp = ControlPlane::shared();
    let client = cp.client().unwrap();
    let ns = cp.unique_namespace("uid").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let first = pods.create(&PostParams::default(), &pod("p")).await.unwrap();
    let old_uid = first.metadata.uid.clone().unwrap();
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    pods.delete("p", &now).await.unwrap();
    let second = pods.create(&PostParams::default(), &pod("p")).await.unwrap();
    let new_uid = second.metadata.uid.clone().unwrap();
    assert_ne!(old_uid, new_uid);

    let running =
        |uid: &str| json!({ "metadata": { "uid": uid }, "status": { "phase": "Running" } });
    let stale =
        pods.patch_status("p", &PatchParams::default(), &Patch::Merge(running(&old_uid))).await;
    match stale {
        // Refused as a conflict or, as this API server does, as a change of an immutable field.
        Err(kube::Error::Api(e)) => {
            assert!(matches!(e.code, 409 | 422) && e.message.contains("uid"), "{e:?}");
        }
        other => panic!("a status patch naming the old UID was not refused: {other:?}"),
    }
    let now_pod = pods.get("p").await.unwrap();
    assert_ne!(now_pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));
    let current = pods
        .patch_status("p", &PatchParams::default(), &Patch::Merge(running(&new_uid)))
        .await
        .unwrap();
    assert_eq!(current.status.and_then(|s| s.phase).as_deref(), Some("Running"));
    pods.delete("p", &now).await.unwrap();
}
