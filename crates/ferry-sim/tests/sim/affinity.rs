//! Node labels from the configuration, and the scheduler's required node affinity on them.

use std::collections::BTreeMap;

use ferry_sim::{NodeSim, SimConfig};
use ferry_testbed::ControlPlane;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::support::{Env, T};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// A pod without volumes whose placement is constrained by `terms` (ORed).
fn pod(name: &str, terms: serde_json::Value) -> Pod {
    serde_json::from_value(json!({ "metadata": { "name": name }, "spec": {
        "containers": [ { "name": "c", "image": "idle" } ],
        "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms } } } } }))
    .unwrap()
}

#[tokio::test]
async fn required_node_affinity_selects_on_configured_node_labels() {
    let env = Env::with("affinity", |ns, config| {
        config.nodes = ["a", "b", "c"].map(|s| format!("{ns}-{s}")).to_vec();
        config.node_labels = BTreeMap::from([
            (format!("{ns}-b"), labels(&[("pool", "movers"), ("cores", "16")])),
            (
                format!("{ns}-c"),
                labels(&[("pool", "other"), ("cores", "4"), ("kubernetes.io/os", "plan9")]),
            ),
        ]);
    })
    .await;
    let nodes = env.sim.nodes();
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let node_api: Api<Node> = Api::all(env.client.clone());
    let stored = node_api.get(b).await.unwrap().metadata.labels.unwrap();
    assert_eq!(stored.get("pool").map(String::as_str), Some("movers"));
    assert_eq!(stored.get("kubernetes.io/hostname"), Some(b));
    let stored = node_api.get(c).await.unwrap().metadata.labels.unwrap();
    assert_eq!(stored.get("kubernetes.io/os").map(String::as_str), Some("plan9"));
    assert!(!node_api.get(a).await.unwrap().metadata.labels.unwrap().contains_key("pool"));

    let cases = [
        // Several pods on the one matching node: the spreading never overrides the affinity.
        (
            "in-1",
            json!([{ "matchExpressions": [{ "key": "pool", "operator": "In", "values": ["movers"] }] }]),
            b,
        ),
        (
            "in-2",
            json!([{ "matchExpressions": [{ "key": "pool", "operator": "In", "values": ["movers"] }] }]),
            b,
        ),
        (
            "in-3",
            json!([{ "matchExpressions": [{ "key": "pool", "operator": "In", "values": ["movers"] }] }]),
            b,
        ),
        // Expressions of a term are ANDed.
        (
            "and",
            json!([{ "matchExpressions": [
            { "key": "pool", "operator": "Exists" },
            { "key": "pool", "operator": "NotIn", "values": ["movers"] }] }]),
            c,
        ),
        (
            "gt",
            json!([{ "matchExpressions": [{ "key": "cores", "operator": "Gt", "values": ["8"] }] }]),
            b,
        ),
        (
            "lt",
            json!([{ "matchExpressions": [{ "key": "cores", "operator": "Lt", "values": ["8"] }] }]),
            c,
        ),
        (
            "absent",
            json!([{ "matchExpressions": [{ "key": "pool", "operator": "DoesNotExist" }] }]),
            a,
        ),
        // Terms are ORed: the first matches no node, the second one node.
        (
            "or",
            json!([
            { "matchExpressions": [{ "key": "pool", "operator": "In", "values": ["nowhere"] }] },
            { "matchExpressions": [{ "key": "kubernetes.io/os", "operator": "In", "values": ["plan9"] }] }]),
            c,
        ),
    ];
    for (name, terms, _) in &cases {
        env.pods().create(&PostParams::default(), &pod(name, terms.clone())).await.unwrap();
    }
    let nowhere = json!([{ "matchExpressions": [{ "key": "pool", "operator": "In", "values": ["nowhere"] }] }]);
    env.pods().create(&PostParams::default(), &pod("nowhere", nowhere)).await.unwrap();
    for (name, _, node) in &cases {
        let running = env.sim.wait_pod_running(&env.ns, name, T).await.unwrap();
        assert_eq!(running.spec.unwrap().node_name.as_ref(), Some(*node), "pod {name}");
    }
    let stuck = ferry_sim::wait_for(&env.pods(), "nowhere", T, |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "PodScheduled" && c.status == "False"))
    })
    .await
    .unwrap();
    assert!(stuck.spec.unwrap().node_name.is_none());
    env.finish().await;
}

#[tokio::test]
async fn node_labels_for_unknown_nodes_or_builtin_keys_are_refused() {
    let client = ControlPlane::shared().client().unwrap();
    let unknown = SimConfig {
        nodes: vec!["lbl-only-node".into()],
        node_labels: BTreeMap::from([("lbl-other-node".to_owned(), labels(&[("a", "b")]))]),
        ..SimConfig::default()
    };
    let err = NodeSim::start(client.clone(), unknown).await.expect_err("must be refused");
    assert!(err.to_string().contains("lbl-other-node"), "{err}");
    let builtin = SimConfig {
        nodes: vec!["lbl-only-node".into()],
        node_labels: BTreeMap::from([(
            "lbl-only-node".to_owned(),
            labels(&[("kubernetes.io/hostname", "elsewhere")]),
        )]),
        ..SimConfig::default()
    };
    let err = NodeSim::start(client, builtin).await.expect_err("must be refused");
    assert!(err.to_string().contains("kubernetes.io/hostname"), "{err}");
}
