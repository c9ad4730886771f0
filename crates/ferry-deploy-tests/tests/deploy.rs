//! Ferry's deployment files against a real API server (RBAC authorization on): every plain
//! manifest and the Helm chart pass `kubectl apply --dry-run=server`, the chart's defaults
//! render exactly the plain manifests, values reach the objects, and the agent's
//! ServiceAccount may do exactly what the agent does (SubjectAccessReview).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry_api::node_agent_config::NodeAgentConfig;
use ferry_deploy_tests::{
    documents, helm_output, helm_template, helm_template_as_built, kubectl, kubectl_output,
    manifest_files, pinned_helm_version, read,
};
use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use serde_yaml::Value;

const AGENT: &str = "system:serviceaccount:velero:ferry-agent";

fn kind_and_name(doc: &Value) -> (String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (s(&doc["kind"]), s(&doc["metadata"]["name"]))
}

/// Held while the plain manifests are applied, for real or as a dry run: a dry-run create racing
/// the real create of the same object is refused with AlreadyExists.
static MANIFESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn manifests_lock() -> std::sync::MutexGuard<'static, ()> {
    MANIFESTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn every_plain_manifest_passes_server_dry_run() -> anyhow::Result<()> {
    let cp = ControlPlane::shared();
    let mut kinds = Vec::new();
    let applying = manifests_lock();
    for file in manifest_files()? {
        let path = file.to_string_lossy();
        let out = kubectl(cp, &["apply", "--dry-run=server", "-f", &path], None)?;
        assert!(out.contains("(server dry run)"), "{path}: {out}");
        kinds.extend(documents(&read(&file)?)?.iter().map(|d| kind_and_name(d).0));
    }
    drop(applying);
    kinds.sort();
    let expected = [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ];
    assert_eq!(kinds, expected);
    Ok(())
}

#[test]
fn example_config_map_is_velero_node_agent_config() -> anyhow::Result<()> {
    let file = ferry_deploy_tests::deploy_dir()?.join("manifests/node-agent-config.yaml");
    let docs = documents(&read(&file)?)?;
    let data: BTreeMap<String, String> = serde_yaml::from_value(docs[0]["data"].clone())?;
    let config = NodeAgentConfig::from_config_map_data("node-agent-config", &data)?;
    config.validate()?;
    assert_eq!(config.unknown_keys(), Vec::<String>::new());
    let big =
        BTreeMap::from([("node.kubernetes.io/instance-type".to_owned(), "m5.4xlarge".to_owned())]);
    assert_eq!(config.concurrency_for_node(&big), 4);
    assert_eq!(config.concurrency_for_node(&BTreeMap::new()), 1);
    Ok(())
}

/// Objects keyed by kind and name; a ConfigMap's JSON values parsed, so that formatting
/// (helm's toPrettyJson orders keys) does not count.
fn by_kind_and_name(docs: Vec<Value>) -> anyhow::Result<BTreeMap<(String, String), Value>> {
    let mut objects = BTreeMap::new();
    for mut doc in docs {
        if doc["kind"] == "ConfigMap"
            && let Some(data) = doc.get_mut("data").and_then(Value::as_mapping_mut)
        {
            for (_, v) in data.iter_mut() {
                let json: serde_json::Value = serde_json::from_str(v.as_str().unwrap_or("?"))?;
                *v = serde_yaml::to_value(json)?;
            }
        }
        objects.insert(kind_and_name(&doc), doc);
    }
    Ok(objects)
}

#[test]
fn chart_defaults_render_the_plain_manifests() -> anyhow::Result<()> {
    let rendered = by_kind_and_name(documents(&helm_template(&[])?)?)?;
    let mut plain = Vec::new();
    for file in manifest_files()? {
        plain.extend(documents(&read(&file)?)?);
    }
    let plain = by_kind_and_name(plain)?;
    assert_eq!(rendered.keys().collect::<Vec<_>>(), plain.keys().collect::<Vec<_>>());
    for (key, object) in &plain {
        assert_eq!(
            &rendered[key], object,
            "{key:?} differs between the chart and deploy/manifests"
        );
    }
    Ok(())
}

#[tokio::test]
async fn chart_values_reach_the_objects_and_pass_server_dry_run() -> anyhow::Result<()> {
    let cp = ControlPlane::shared();
    let ns = cp.unique_namespace("ferry-chart").await?;
    let dir = tempfile::tempdir()?;
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        format!(
            "namespace: {ns}
image: {{repository: registry.example/ferry, tag: '1.2.3', pullPolicy: Always}}
agent:
  privileged: false
  kubeletRoot: /var/lib/k0s/kubelet/
  cache: {{enabled: true, sizeMiB: 256, volumeSizeLimit: 1Gi}}
  restoreFidelity: full
  keepBaseSnapshot: true
  adoptVeleroKeyedRepositories: true
  extraArgs: [--deletion-interval, 45s]
  resources: {{requests: {{cpu: 250m, memory: 128Mi}}, limits: {{cpu: '1', memory: 1Gi}}}}
nodeSelector: {{backup: 'yes'}}
tolerations: [{{key: dedicated, operator: Equal, value: storage, effect: NoSchedule}}]
priorityClassName: system-node-critical
nodeAgentConfig: {{name: ferry-config, config: {{loadConcurrency: {{globalConfig: 3}}}}}}
"
        ),
    )?;
    let yaml = helm_template(&["--values", &values.to_string_lossy()])?;
    // Its cluster-scoped objects have the plain manifests' names.
    let out = {
        let _applying = manifests_lock();
        kubectl(cp, &["apply", "--dry-run=server", "-f", "-"], Some(&yaml))?
    };
    assert_eq!(out.matches("(server dry run)").count(), 11, "{out}");

    let objects = by_kind_and_name(documents(&yaml)?)?;
    for ((kind, name), object) in &objects {
        let namespaced = !kind.starts_with("Cluster") && !kind.starts_with("ValidatingAdmission");
        let got = object["metadata"]["namespace"].as_str();
        assert_eq!(got, namespaced.then_some(ns.as_str()), "{kind}/{name}");
    }
    let binding = &objects[&("ClusterRoleBinding".to_owned(), "ferry-agent".to_owned())];
    assert_eq!(binding["subjects"][0]["namespace"].as_str(), Some(ns.as_str()));
    let policy =
        &objects[&("ValidatingAdmissionPolicy".to_owned(), "ferry-agent-holding-pods".to_owned())];
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        format!("request.userInfo.username == 'system:serviceaccount:{ns}:ferry-agent'"),
        "the policy binds the agent's account in the release's namespace"
    );
    let pinned = policy["spec"]["validations"].as_sequence().is_some_and(|v| {
        v.iter().any(|r| {
            r["expression"].as_str().is_some_and(|e| {
                e.contains("object.spec.containers[0].image == 'registry.example/ferry:1.2.3'")
            })
        })
    });
    assert!(pinned, "the holding pods' image follows the values: {policy:?}");
    let secrets =
        &objects[&("ValidatingAdmissionPolicy".to_owned(), "ferry-agent-secrets".to_owned())];
    assert_eq!(
        secrets["spec"]["matchConditions"][0]["expression"],
        format!("request.userInfo.username == 'system:serviceaccount:{ns}:ferry-agent'"),
        "the secrets policy binds the agent's account in the release's namespace"
    );
    let config = &objects[&("ConfigMap".to_owned(), "ferry-config".to_owned())];
    assert_eq!(config["data"]["node-agent-config.json"]["loadConcurrency"]["globalConfig"], 3);

    let pod =
        &objects[&("DaemonSet".to_owned(), "ferry-agent".to_owned())]["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["nodeSelector"]["backup"], "yes");
    assert_eq!(pod["tolerations"][0]["value"], "storage");
    let agent = &pod["containers"][0];
    assert_eq!(agent["image"], "registry.example/ferry:1.2.3");
    assert_eq!(agent["imagePullPolicy"], "Always");
    let env = agent["env"].as_sequence().context("env")?;
    let image_env = env.iter().find(|e| e["name"] == "FERRY_IMAGE").context("FERRY_IMAGE")?;
    assert_eq!(image_env["value"], agent["image"], "holding pods run the agent's image");
    assert_eq!(agent["resources"]["limits"]["cpu"], "1");
    let security = &agent["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    let args: Vec<_> = agent["args"].as_sequence().context("args")?.iter().collect();
    assert_eq!(
        args,
        [
            "agent",
            "--kubelet-root",
            "/var/lib/k0s/kubelet",
            "--config-map",
            "ferry-config",
            "--cache-dir",
            "/var/cache/ferry",
            "--cache-size-mib",
            "256",
            "--restore-fidelity",
            "full",
            "--keep-base-snapshot",
            "--adopt-velero-keyed-repositories",
            "--deletion-interval",
            "45s"
        ]
    );
    let cache = pod["volumes"]
        .as_sequence()
        .context("volumes")?
        .iter()
        .find(|v| v["name"] == "cache")
        .context("cache volume")?;
    assert_eq!(cache["emptyDir"]["sizeLimit"], "1Gi");
    let paths: Vec<_> = pod["volumes"]
        .as_sequence()
        .context("volumes")?
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert_eq!(paths, ["/var/lib/k0s/kubelet/pods"], "no /dev or plugins without privileges");
    let mount = &agent["volumeMounts"][0];
    assert_eq!(mount["mountPropagation"], "HostToContainer");
    Ok(())
}

/// Every deployment form to check, by name: each plain manifest file, and the chart rendered
/// with its defaults.
fn every_deployment_form() -> anyhow::Result<Vec<(String, Vec<Value>)>> {
    let mut forms = Vec::new();
    for file in manifest_files()? {
        forms.push((file.display().to_string(), documents(&read(&file)?)?));
    }
    forms.push(("the chart (defaults)".to_owned(), documents(&helm_template(&[])?)?));
    Ok(forms)
}

/// The containers (init containers too) of every pod template among `docs`, with the pod
/// template's volumes.
fn containers(docs: &[Value]) -> Vec<(&Value, &Value)> {
    let mut found = Vec::new();
    for doc in docs {
        let pod = &doc["spec"]["template"]["spec"];
        for list in ["initContainers", "containers"] {
            for container in pod[list].as_sequence().into_iter().flatten() {
                found.push((container, &pod["volumes"]));
            }
        }
    }
    found
}

fn under_dev(path: &str) -> bool {
    path == "/dev" || path.starts_with("/dev/")
}

/// containerd refuses a container whose mount asks for propagation from a host path that is
/// not a shared or slave mount, as `/dev` is on some nodes; device nodes show through any
/// bind of the devtmpfs, so no `/dev` mount may ask for it. The kubelet's pods directory keeps
/// `HostToContainer`: volumes are mounted there after the agent starts. The plugins directory,
/// where the CSI drivers keep their sockets, is mounted read-only.
#[test]
fn no_dev_mount_asks_for_mount_propagation() -> anyhow::Result<()> {
    let mut dev_mounts = 0;
    let mut pods_mounts = 0;
    let mut plugins_mounts = 0;
    let mut wrong = Vec::new();
    for (form, docs) in every_deployment_form()? {
        for (container, volumes) in containers(&docs) {
            for mount in container["volumeMounts"].as_sequence().into_iter().flatten() {
                let volume = volumes
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .find(|v| v["name"] == mount["name"])
                    .with_context(|| format!("{form}: no volume for mount {mount:?}"))?;
                let host_path = volume["hostPath"]["path"].as_str().unwrap_or_default();
                let mount_path = mount["mountPath"].as_str().unwrap_or_default();
                let propagation = mount["mountPropagation"].as_str();
                if under_dev(host_path) || under_dev(mount_path) {
                    dev_mounts += 1;
                    if propagation.is_some_and(|p| p != "None") {
                        wrong.push(format!("{form}: {mount_path} asks for {propagation:?}"));
                    }
                }
                if host_path.ends_with("/kubelet/pods") {
                    pods_mounts += 1;
                    assert_eq!(propagation, Some("HostToContainer"), "{form}: {mount_path}");
                }
                if host_path.ends_with("/kubelet/plugins") {
                    plugins_mounts += 1;
                    assert_eq!(mount["readOnly"].as_bool(), Some(true), "{form}: {mount_path}");
                }
            }
        }
    }
    assert!(wrong.is_empty(), "/dev mounts asking for propagation:\n{}", wrong.join("\n"));
    assert_eq!(dev_mounts, 2, "one /dev mount in the manifest and one in the chart");
    assert_eq!(
        pods_mounts, 2,
        "one mount of the kubelet's pods directory in the manifest and one in the chart"
    );
    assert_eq!(plugins_mounts, 2, "one plugins mount in the manifest and one in the chart");
    Ok(())
}

/// The agent reads its log filter from `FERRY_LOG`; the manifests and chart set that, and the
/// chart's `agent.logLevel` reaches it.
#[test]
fn the_log_filter_is_set_in_ferry_log() -> anyhow::Result<()> {
    let mut forms = every_deployment_form()?;
    let dir = tempfile::tempdir()?;
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, "agent: {logLevel: 'debug,kube=warn'}\n")?;
    let with_level = documents(&helm_template(&["--values", &values.to_string_lossy()])?)?;
    forms.push(("the chart (agent.logLevel)".to_owned(), with_level));
    let mut filters = Vec::new();
    for (form, docs) in &forms {
        for (container, _) in containers(docs) {
            for var in container["env"].as_sequence().into_iter().flatten() {
                let name = var["name"].as_str().unwrap_or_default();
                assert_ne!(name, "RUST_LOG", "{form}: ferry reads FERRY_LOG");
                if name == "FERRY_LOG" {
                    filters.push((form.clone(), var["value"].as_str().unwrap_or_default()));
                }
            }
        }
    }
    let manifest = ferry_deploy_tests::deploy_dir()?.join("manifests/daemonset.yaml");
    let expected = [
        (manifest.display().to_string(), "info"),
        ("the chart (defaults)".to_owned(), "info"),
        ("the chart (agent.logLevel)".to_owned(), "debug,kube=warn"),
    ];
    assert_eq!(filters, expected);
    Ok(())
}

/// deploy/build-helm.sh stamps helm as helm's own release build does: `helm version` says the
/// pinned version, and without `--kube-version` helm assumes the Kubernetes version of the
/// client-go it was built with (unstamped, it assumes v1.20 and fails the chart's
/// `kubeVersion: >=1.30.0-0`).
#[test]
fn helm_is_built_with_its_version_and_kubernetes_version() -> anyhow::Result<()> {
    let rendered = helm_template_as_built(&[])?;
    let kinds: Vec<_> = documents(&rendered)?.iter().map(|d| kind_and_name(d).0).collect();
    assert!(kinds.contains(&"DaemonSet".to_owned()), "{kinds:?}");

    let pinned = pinned_helm_version()?;
    let out = helm_output(&["version", "--template", "{{.Version}} {{.GitTreeState}}"])?;
    assert!(out.status.success(), "helm version: {out:?}");
    assert_eq!(String::from_utf8(out.stdout)?, format!("{pinned} clean"));
    Ok(())
}

/// (verb, API group, resource, namespace or "" for cluster scope, allowed?)
const EXPECTED_ACCESS: &[(&str, &str, &str, &str, bool)] = &[
    ("get", "velero.io", "datauploads", "velero", true),
    ("list", "velero.io", "datauploads", "velero", true),
    ("watch", "velero.io", "datauploads", "velero", true),
    ("update", "velero.io", "datauploads", "velero", true),
    ("update", "velero.io", "datadownloads", "velero", true),
    ("create", "velero.io", "datauploads", "velero", false),
    ("delete", "velero.io", "datauploads", "velero", false),
    ("patch", "velero.io", "datadownloads", "velero", false),
    ("update", "velero.io", "datauploads", "workload", false),
    ("get", "velero.io", "backupstoragelocations", "velero", true),
    ("update", "velero.io", "backupstoragelocations", "velero", false),
    ("get", "velero.io", "deletebackuprequests", "velero", false),
    ("get", "velero.io", "backups", "velero", true),
    ("list", "velero.io", "backups", "velero", false),
    ("patch", "velero.io", "backups", "velero", false),
    ("delete", "velero.io", "backups", "velero", false),
    ("create", "coordination.k8s.io", "leases", "velero", true),
    ("update", "coordination.k8s.io", "leases", "velero", true),
    ("watch", "coordination.k8s.io", "leases", "velero", true),
    ("delete", "coordination.k8s.io", "leases", "velero", false),
    ("update", "coordination.k8s.io", "leases", "kube-node-lease", false),
    ("create", "events.k8s.io", "events", "velero", true),
    ("patch", "events.k8s.io", "events", "velero", true),
    ("list", "events.k8s.io", "events", "velero", true),
    ("list", "events.k8s.io", "events", "workload", false),
    ("watch", "events.k8s.io", "events", "velero", false),
    ("delete", "events.k8s.io", "events", "velero", false),
    ("get", "", "secrets", "velero", true),
    ("create", "", "secrets", "velero", true),
    ("list", "", "secrets", "velero", false),
    ("update", "", "secrets", "velero", false),
    ("delete", "", "secrets", "velero", false),
    ("get", "", "secrets", "workload", false),
    ("create", "", "pods", "velero", true),
    ("get", "", "pods", "velero", true),
    ("delete", "", "pods", "velero", true),
    ("list", "", "pods", "velero", false),
    ("get", "", "pods", "workload", false),
    ("delete", "", "pods", "workload", false),
    ("create", "", "pods", "workload", false),
    ("create", "", "persistentvolumeclaims", "velero", true),
    ("delete", "", "persistentvolumeclaims", "velero", true),
    ("get", "", "persistentvolumeclaims", "velero", true),
    ("get", "", "persistentvolumeclaims", "workload", true),
    ("delete", "", "persistentvolumeclaims", "workload", false),
    ("update", "", "persistentvolumeclaims", "workload", false),
    ("create", "snapshot.storage.k8s.io", "volumesnapshots", "velero", true),
    ("get", "snapshot.storage.k8s.io", "volumesnapshots", "workload", true),
    ("delete", "snapshot.storage.k8s.io", "volumesnapshots", "workload", true),
    ("create", "snapshot.storage.k8s.io", "volumesnapshots", "workload", false),
    ("create", "snapshot.storage.k8s.io", "volumesnapshotcontents", "", true),
    ("update", "snapshot.storage.k8s.io", "volumesnapshotcontents", "", true),
    ("delete", "snapshot.storage.k8s.io", "volumesnapshotcontents", "", true),
    ("list", "snapshot.storage.k8s.io", "volumesnapshotcontents", "", true),
    ("patch", "snapshot.storage.k8s.io", "volumesnapshotcontents", "", false),
    ("get", "", "persistentvolumes", "", true),
    ("list", "", "persistentvolumes", "", true),
    ("update", "", "persistentvolumes", "", true),
    ("delete", "", "persistentvolumes", "", true),
    ("create", "", "persistentvolumes", "", false),
    ("get", "storage.k8s.io", "storageclasses", "", true),
    ("update", "storage.k8s.io", "storageclasses", "", false),
    ("get", "", "nodes", "", true),
    ("list", "", "nodes", "", true),
    ("update", "", "nodes", "", false),
    ("get", "", "configmaps", "velero", true),
    ("list", "", "configmaps", "velero", true),
    ("delete", "", "configmaps", "velero", true),
    ("create", "", "configmaps", "velero", false),
    ("update", "", "configmaps", "velero", false),
    ("get", "", "configmaps", "workload", false),
    ("create", "", "events", "velero", false),
    ("create", "rbac.authorization.k8s.io", "rolebindings", "velero", false),
    ("get", "cbt.storage.k8s.io", "snapshotmetadataservices", "", true),
    ("list", "cbt.storage.k8s.io", "snapshotmetadataservices", "", false),
    ("update", "cbt.storage.k8s.io", "snapshotmetadataservices", "", false),
];

/// (verb, resource, subresource, object name, namespace, allowed?): access to one object's
/// subresource.
const EXPECTED_NAMED_ACCESS: &[(&str, &str, &str, &str, &str, bool)] = &[
    ("create", "serviceaccounts", "token", "ferry-agent", "velero", true),
    ("create", "serviceaccounts", "token", "velero", "velero", false),
    ("create", "serviceaccounts", "token", "default", "velero", false),
    ("create", "serviceaccounts", "token", "ferry-agent", "workload", false),
    ("get", "serviceaccounts", "", "ferry-agent", "velero", false),
];

async fn allowed(
    reviews: &Api<SubjectAccessReview>,
    (verb, group, resource, namespace): (&str, &str, &str, &str),
) -> anyhow::Result<bool> {
    allowed_on(reviews, (verb, group, resource, namespace), ("", "")).await
}

/// As [`allowed`], for one object (`name`) and a subresource of it (`""`: the object).
async fn allowed_on(
    reviews: &Api<SubjectAccessReview>,
    (verb, group, resource, namespace): (&str, &str, &str, &str),
    (subresource, name): (&str, &str),
) -> anyhow::Result<bool> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(AGENT.to_owned()),
            groups: Some(vec![
                "system:serviceaccounts".to_owned(),
                "system:serviceaccounts:velero".to_owned(),
                "system:authenticated".to_owned(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
                subresource: (!subresource.is_empty()).then(|| subresource.to_owned()),
                name: (!name.is_empty()).then(|| name.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = reviews.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[tokio::test]
async fn the_agent_may_do_exactly_what_it_does() -> anyhow::Result<()> {
    let cp = ControlPlane::shared();
    assert_eq!(VELERO_NAMESPACE, "velero");
    let dir = ferry_deploy_tests::deploy_dir()?.join("manifests");
    {
        let _applying = manifests_lock();
        for file in ["serviceaccount.yaml", "rbac-namespace.yaml", "rbac-cluster.yaml"] {
            kubectl(cp, &["apply", "-f", &dir.join(file).to_string_lossy()], None)?;
        }
    }
    let reviews: Api<SubjectAccessReview> = Api::all(cp.client()?);
    // The authorizer learns of new bindings through its informers: wait, boundedly.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !allowed(&reviews, ("update", "velero.io", "datauploads", "velero")).await? {
        if Instant::now() > deadline {
            bail!("the agent's RoleBinding never took effect");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut wrong = Vec::new();
    for &(verb, group, resource, namespace, expected) in EXPECTED_ACCESS {
        let got = allowed(&reviews, (verb, group, resource, namespace)).await?;
        if got != expected {
            wrong.push(format!("{verb} {group}/{resource} in {namespace:?}: {got}"));
        }
    }
    for &(verb, resource, subresource, name, namespace, expected) in EXPECTED_NAMED_ACCESS {
        let got =
            allowed_on(&reviews, (verb, "", resource, namespace), (subresource, name)).await?;
        if got != expected {
            wrong.push(format!("{verb} {resource}/{subresource} {name} in {namespace:?}: {got}"));
        }
    }
    assert!(wrong.is_empty(), "unexpected access:\n{}", wrong.join("\n"));

    // The same answer through `kubectl auth can-i`, as an operator would check it.
    let as_agent = format!("--as={AGENT}");
    let out = kubectl(cp, &["auth", "can-i", "delete", "pods", "-n", "velero", &as_agent], None)?;
    assert_eq!(out.trim(), "yes");
    let out = kubectl_output(
        cp,
        &["auth", "can-i", "delete", "secrets", "-n", "velero", &as_agent],
        None,
    )?;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
    assert!(!out.status.success(), "kubectl auth can-i exits non-zero for no");
    Ok(())
}

/// A pod for the admission policy test: the holding pods' shape, changed by `tweak`.
fn pod_yaml(name: &str, tweak: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "velero",
            "labels": { "ferry.io/created-by": "ferry" } },
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": { "runAsNonRoot": true, "runAsUser": 65532,
                "seccompProfile": { "type": "RuntimeDefault" } },
            "containers": [{
                "name": "hold", "image": "ferry:latest", "command": ["/ferry", "hold"],
                "securityContext": { "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true, "capabilities": { "drop": ["ALL"] } },
                "volumeMounts": [{ "name": "volume", "mountPath": "/volume" }],
            }],
            "volumes": [{ "name": "volume", "persistentVolumeClaim": { "claimName": "c" } }],
        },
    });
    tweak(&mut pod);
    pod.to_string()
}

/// The second policy beside the agent's RBAC lets the agent's account create only its repository
/// password secret, of type Opaque: a service-account token secret (which the cluster would fill
/// in with a token of the account it names, Velero's among them) or any other secret is refused.
/// Other users are not affected.
#[test]
fn the_agent_may_create_only_its_password_secret() -> anyhow::Result<()> {
    let cp = ControlPlane::shared();
    apply_agent_policies(cp)?;
    let secret = |name: &str, kind: Option<&str>| {
        let mut s = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "namespace": "velero" },
            "data": { "password": "cGFzc3dvcmQ=" },
        });
        if let Some(kind) = kind {
            s["type"] = kind.into();
            if kind == "kubernetes.io/service-account-token" {
                s["metadata"]["annotations"] =
                    serde_json::json!({ "kubernetes.io/service-account.name": "velero" });
                s["data"] = serde_json::json!({});
            }
        }
        s.to_string()
    };
    let token = secret("ferry-repo-credentials", Some("kubernetes.io/service-account-token"));
    let out = refused_by(cp, "ferry-agent-secrets", &token)?;
    assert!(out.contains("only create its repository password secret"), "{out}");
    for (what, object) in [
        ("another name", secret("velero-token", None)),
        ("another type", secret("ferry-repo-credentials", Some("kubernetes.io/basic-auth"))),
    ] {
        let (admitted, out) = create_as(cp, Some(AGENT), &object)?;
        assert!(!admitted && out.contains("ferry-agent-secrets"), "{what}: {admitted}: {out}");
    }
    for object in
        [secret("ferry-repo-credentials", None), secret("ferry-repo-credentials", Some("Opaque"))]
    {
        let (admitted, out) = create_as(cp, Some(AGENT), &object)?;
        assert!(admitted, "the agent's password secret is refused: {out}");
    }
    // Anyone else is not bound by it.
    let (admitted, out) = create_as(cp, None, &token)?;
    assert!(admitted, "the policy binds only the agent's account: {out}");
    Ok(())
}

/// Applies the agent's account, its RBAC and the admission policies from the plain manifests.
fn apply_agent_policies(cp: &ControlPlane) -> anyhow::Result<()> {
    let dir = ferry_deploy_tests::deploy_dir()?.join("manifests");
    let _applying = manifests_lock();
    for file in
        ["serviceaccount.yaml", "rbac-namespace.yaml", "rbac-cluster.yaml", "admission-policy.yaml"]
    {
        kubectl(cp, &["apply", "-f", &dir.join(file).to_string_lossy()], None)?;
    }
    Ok(())
}

/// Creates `object` (server dry run) as the agent until `policy` refuses it, the API server's
/// answer: it learns of policies, bindings and RBAC rules through its informers, so an early
/// answer may admit it or refuse it for want of a role. Bounded: 60 s.
fn refused_by(cp: &ControlPlane, policy: &str, object: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (admitted, out) = create_as(cp, Some(AGENT), object)?;
        if !admitted && out.contains(policy) {
            return Ok(out);
        }
        if Instant::now() > deadline {
            bail!("{policy} never took effect: {out}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Creates `pod` (server dry run) as `user` (`None`: the admin); the API server's answer.
fn create_as(cp: &ControlPlane, user: Option<&str>, pod: &str) -> anyhow::Result<(bool, String)> {
    let as_user = user.map(|u| format!("--as={u}"));
    let mut args = vec!["create", "--dry-run=server", "-f", "-"];
    args.extend(as_user.as_deref());
    let out = kubectl_output(cp, &args, Some(pod))?;
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), text))
}

/// The admission policy shipped beside the agent's RBAC lets the agent's account create only
/// pods of the holding pods' shape: a pod with host access, another service account's token,
/// extra containers or root is refused with the policy's message. Other users are not
/// affected.
#[test]
fn the_agent_may_create_only_holding_pods() -> anyhow::Result<()> {
    let cp = ControlPlane::shared();
    apply_agent_policies(cp)?;
    let host_path = pod_yaml("host-path", |p| {
        p["spec"]["volumes"] =
            serde_json::json!([{ "name": "volume", "hostPath": { "path": "/" } }]);
    });
    let out = refused_by(cp, "ferry-agent-holding-pods", &host_path)?;
    assert!(out.contains("mounts only PersistentVolumeClaims"), "{out}");
    let (admitted, out) = create_as(cp, Some(AGENT), &pod_yaml("holder", |_| {}))?;
    assert!(admitted, "a holding pod is refused: {out}");
    type Tweak = fn(&mut serde_json::Value);
    let refused: [(&str, Tweak, &str); 13] = [
        (
            "other-image",
            |p| p["spec"]["containers"][0]["image"] = "registry.example/tools:1".into(),
            "runs `/ferry hold` in Ferry's image",
        ),
        (
            "other-command",
            |p| p["spec"]["containers"][0]["command"] = serde_json::json!(["/bin/sh", "-c", "x"]),
            "runs `/ferry hold` in Ferry's image",
        ),
        (
            "extra-args",
            |p| p["spec"]["containers"][0]["args"] = serde_json::json!(["--x"]),
            "runs `/ferry hold` in Ferry's image",
        ),
        (
            "unconfined",
            |p| p["spec"]["securityContext"]["seccompProfile"]["type"] = "Unconfined".into(),
            "default seccomp profile",
        ),
        (
            "unconfined-container",
            |p| {
                p["spec"]["containers"][0]["securityContext"]["seccompProfile"] =
                    serde_json::json!({ "type": "Unconfined" });
            },
            "default seccomp profile",
        ),
        (
            "as-velero",
            |p| {
                p["spec"]["serviceAccountName"] = "velero".into();
                p["spec"]["automountServiceAccountToken"] = true.into();
            },
            "without a service account token",
        ),
        ("host-net", |p| p["spec"]["hostNetwork"] = true.into(), "shares no host namespace"),
        (
            "root",
            |p| p["spec"]["securityContext"] = serde_json::json!({ "runAsUser": 0 }),
            "runs as non-root",
        ),
        (
            "root-at-pod-level",
            |p| p["spec"]["securityContext"]["runAsUser"] = 0.into(),
            "runs as non-root",
        ),
        (
            "root-in-container",
            // The pod says non-root, its one container overrides it (and runs as the image's
            // user, root in many images).
            |p| {
                p["spec"]["securityContext"]["runAsNonRoot"] = true.into();
                p["spec"]["securityContext"].as_object_mut().map(|c| c.remove("runAsUser"));
                p["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = false.into();
            },
            "is unprivileged",
        ),
        (
            "capable",
            |p| {
                p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                    serde_json::json!(["SYS_ADMIN"]);
            },
            "is unprivileged",
        ),
        (
            "unlabelled",
            |p| p["metadata"]["labels"] = serde_json::json!({ "app": "x" }),
            "only create holding pods",
        ),
        (
            "sidecar",
            |p| {
                let mut second = p["spec"]["containers"][0].clone();
                second["name"] = "first".into();
                p["spec"]["initContainers"] = serde_json::json!([second]);
            },
            "exactly one container",
        ),
    ];
    for (name, tweak, reason) in refused {
        let (admitted, out) = create_as(cp, Some(AGENT), &pod_yaml(name, tweak))?;
        assert!(!admitted && out.contains(reason), "{name}: admitted {admitted}: {out}");
        assert!(out.contains("ferry-agent-holding-pods"), "{name}: names the policy: {out}");
    }
    // Anyone else is not bound by it.
    let (admitted, out) = create_as(cp, None, &host_path)?;
    assert!(admitted, "the policy binds only the agent's account: {out}");
    Ok(())
}
