//! Discovery and tokens against a real API server: a driver without a service (also in a cluster
//! that does not serve the API at all), a service whose audience the API server itself accepts
//! (refused: the token would be an API credential), and tokens scoped to the service's
//! audience, bound to a pod, renewed on demand.

#![allow(clippy::unwrap_used)]

use base64::Engine as _;
use ferry_api::{SnapshotMetadataService, SnapshotMetadataServiceSpec};
use ferry_cbt::{CbtError, Service, ServiceAccount, Tokens};
use ferry_testbed::ControlPlane;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount as KubeServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const PEM: &[u8] = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

/// The shared control plane, with the SnapshotMetadataService API served (a permissive schema:
/// the real CRD's schema is checked on the real node).
async fn cluster() -> &'static ControlPlane {
    static CRD: OnceCell<()> = OnceCell::const_new();
    let cp = ControlPlane::shared();
    CRD.get_or_init(|| async {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            // A group under k8s.io needs the API review annotation, as the real CRD has.
            "metadata": {"name": "snapshotmetadataservices.cbt.storage.k8s.io",
                         "annotations": {"api-approved.kubernetes.io":
                             "https://github.com/kubernetes/enhancements/pull/4082"}},
            "spec": {
                "group": "cbt.storage.k8s.io",
                "scope": "Cluster",
                "names": {"kind": "SnapshotMetadataService", "plural": "snapshotmetadataservices",
                          "singular": "snapshotmetadataservice", "listKind": "SnapshotMetadataServiceList"},
                "versions": [{"name": "v1beta1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": {"type": "object",
                                  "x-kubernetes-preserve-unknown-fields": true}}}]
            }
        }))
        .unwrap();
        ferry_testbed::crds::install(&cp.client().unwrap(), &[crd]).await.unwrap();
    })
    .await;
    cp
}

async fn publish(client: &kube::Client, driver: &str, audience: &str) -> TestResult {
    let api: Api<SnapshotMetadataService> = Api::all(client.clone());
    let sms = SnapshotMetadataService::new(
        driver,
        SnapshotMetadataServiceSpec {
            address: "10.1.0.1:6444".into(),
            audience: audience.into(),
            ca_cert: ByteString(PEM.to_vec()),
        },
    );
    api.create(&PostParams::default(), &sms).await?;
    Ok(())
}

#[tokio::test]
async fn a_service_is_found_by_driver_and_refused_when_its_audience_is_the_api_servers()
-> TestResult {
    let cp = cluster().await;
    let client = cp.client()?;

    let err = Service::discover(client.clone(), "none.csi.example").await.unwrap_err();
    assert!(matches!(err, CbtError::NoService { .. }), "{err}");
    assert_eq!(err.reason().map(|r| r.as_str()), Some("no-service"));

    publish(&client, "own.csi.example", "ferry-test-snapshot-metadata").await?;
    let service = Service::discover(client.clone(), "own.csi.example").await?;
    assert_eq!(service.audience, "ferry-test-snapshot-metadata");
    assert_eq!(service.address, "10.1.0.1:6444");

    // The cluster's issuer is the API server's default audience: a token for it is a token
    // for the API server.
    for (driver, audience) in [
        ("issuer.csi.example", cp.url()),
        ("default.csi.example", "https://kubernetes.default.svc.cluster.local"),
    ] {
        publish(&client, driver, audience).await?;
        let err = Service::discover(client.clone(), driver).await.unwrap_err();
        assert!(
            matches!(&err, CbtError::BadService { reason, .. }
                if reason.contains("one the API server accepts")),
            "{driver}: {err}"
        );
        assert_eq!(err.reason().map(|r| r.as_str()), Some("unreachable"));
    }
    Ok(())
}

/// Most clusters serve no `cbt.storage.k8s.io` API at all (the CRD comes with the
/// external-snapshot-metadata sidecar): the API server answers 404 for the resource itself, and
/// that too is a driver without changed-block tracking, not an error of discovery.
#[tokio::test]
async fn a_cluster_without_the_snapshot_metadata_api_offers_no_service() -> TestResult {
    let cp = ControlPlane::start().await?;
    let client = cp.client()?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert!(
        crds.get_opt("snapshotmetadataservices.cbt.storage.k8s.io").await?.is_none(),
        "a fresh control plane serves the SnapshotMetadataService API: this test shows nothing"
    );
    let err = Service::discover(client, "hostpath.csi.k8s.io").await.unwrap_err();
    assert!(matches!(err, CbtError::NoService { .. }), "{err}");
    assert_eq!(err.reason().map(|r| r.as_str()), Some("no-service"));
    Ok(())
}

/// The claims of a JWT (not verified: the API server just issued it).
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn tokens_are_scoped_to_the_audience_bound_to_the_pod_and_renewed_when_forgotten()
-> TestResult {
    let cp = cluster().await;
    let client = cp.client()?;
    let ns = cp.unique_namespace("cbt-tokens").await?;
    let accounts: Api<KubeServiceAccount> = Api::namespaced(client.clone(), &ns);
    let mut account = KubeServiceAccount::default();
    account.metadata.name = Some("ferry-agent".into());
    accounts.create(&PostParams::default(), &account).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "ferry-agent-x"},
        "spec": {"serviceAccountName": "ferry-agent",
                 "containers": [{"name": "agent", "image": "ferry:test"}]}
    }))?;
    let pod = pods.create(&PostParams::default(), &pod).await?;
    let uid = pod.metadata.uid.clone().unwrap();

    let sa = ServiceAccount { namespace: ns.clone(), name: "ferry-agent".into() };
    let tokens = Tokens::new(client.clone(), sa.clone(), "ferry-test-snapshot-metadata")
        .bound_to_pod("ferry-agent-x", Some(&uid));
    let first = tokens.token().await?;
    let c = claims(&first);
    assert_eq!(c["aud"], json!(["ferry-test-snapshot-metadata"]), "{c}");
    assert_eq!(c["sub"], format!("system:serviceaccount:{ns}:ferry-agent"), "{c}");
    assert_eq!(c["kubernetes.io"]["pod"]["name"], "ferry-agent-x", "{c}");
    assert_eq!(c["kubernetes.io"]["pod"]["uid"], uid.as_str(), "{c}");
    let lifetime = c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap();
    assert!((600..=700).contains(&lifetime), "a token living {lifetime} s");
    assert!(!format!("{tokens:?}").contains(&first), "Debug shows the token");

    assert_eq!(tokens.token().await?, first, "a young token is reused");
    tokens.forget().await;
    let second = tokens.token().await?;
    assert_ne!(second, first, "a forgotten token came back");

    // A pod that is gone cannot have tokens.
    pods.delete(
        "ferry-agent-x",
        &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() },
    )
    .await?;
    let gone = Tokens::new(client.clone(), sa, "ferry-test-snapshot-metadata")
        .bound_to_pod("ferry-agent-x", Some(&uid));
    let mut refused = None;
    for _ in 0..50 {
        match gone.token().await {
            Err(e) => {
                refused = Some(e);
                break;
            }
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    let err = refused.ok_or("a token was issued for a deleted pod")?;
    assert!(matches!(err, CbtError::Token { .. }), "{err}");
    assert!(!err.to_string().contains(&second));
    Ok(())
}
