//! The real node with Ferry installed, shared by the tests of this binary, and what tests do on
//! it: run pods, snapshot volumes, create Velero's objects and wait for them.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use ferry_api::{DataDownload, DataUpload, VolumeSnapshot};
use ferry_testbed::realnode::{self, RealCluster};
use ferry_testbed::{S3Server, VELERO_NAMESPACE};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::velero_crs::{self, Classes, Mover};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A Velero CR in Velero's namespace, read whole or as JSON (DataUpload, DataDownload).
pub trait VeleroCr:
    kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Clone
    + serde::Serialize
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> VeleroCr for K where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
{
}

/// The bound on every wait: generous, since the machine may be loaded.
pub const WAIT: Duration = Duration::from_secs(300);
/// The data mover name the chart's agent handles.
pub const MOVER: &str = "ferry";
/// The BackupStorageLocation (Velero's default name).
pub const BSL: &str = "default";
const BUCKET: &str = "ferry-realnode";
/// moto takes any key; the agents read these from Velero's `cloud-credentials` Secret, a
/// Velero server from its credentials file, the CLI from the env.
pub const CREDENTIALS: (&str, &str) = ("ferry-realnode", "ferry-realnode-secret");

/// The labels of the agent's pods, as the chart sets them.
pub const AGENT_LABELS: &str = "app.kubernetes.io/name=ferry,app.kubernetes.io/component=agent";
/// The agent's DaemonSet, as the chart names it.
pub const AGENT_DAEMONSET: &str = "ferry-agent";

/// Held for reading by every test, for writing by a test that disrupts the agent (deletes its
/// pod): the others never see their agent go away mid-test.
pub static AGENT: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The shared cluster with Ferry installed from its chart and a BSL on moto.
#[derive(Debug)]
pub struct Node {
    pub cluster: &'static RealCluster,
    /// The S3 endpoint as the host (and the `ferry` CLI in tests) reaches it.
    pub s3_endpoint: String,
    /// Relays S3 into every node while the set-up lives.
    _relay: ferry_testbed::netns::Forwarder,
}

/// The node, set up on first use.
///
/// # Panics
/// If the cluster, S3 or Ferry's installation fails; the message says why.
pub fn node() -> &'static Node {
    static NODE: OnceLock<Result<Node, String>> = OnceLock::new();
    let node = NODE.get_or_init(|| {
        ferry_testbed::process::run_on_own_thread(|| {
            set_up_on(RealCluster::shared(), S3Server::shared(), &[])
        })
    });
    match node {
        Ok(n) => n,
        Err(e) => panic!("real node unavailable: {e}"),
    }
}

/// Sets up `cluster` for the tests: a bucket on `s3` (the shared moto), relayed into every
/// node, the BackupStorageLocation, and Ferry installed from its chart (with `values` besides
/// the tests' own, `KEY=VALUE` as `helm --set` takes them).
pub async fn set_up_on(
    cluster: &'static RealCluster,
    s3: &S3Server,
    values: &[&str],
) -> anyhow::Result<Node> {
    let relay = install_on(cluster, s3, values).await?;
    Ok(Node { cluster, s3_endpoint: s3.endpoint().to_owned(), _relay: relay })
}

/// What [`set_up_on`] does, on a cluster the caller owns (a benchmark's, with MinIO started
/// with [`CREDENTIALS`]): S3 is relayed into the nodes while the returned forwarder lives.
pub async fn install_on(
    cluster: &RealCluster,
    s3: &S3Server,
    values: &[&str],
) -> anyhow::Result<ferry_testbed::netns::Forwarder> {
    s3.create_bucket(BUCKET)?;
    let port: u16 = s3.endpoint().rsplit(':').next().unwrap_or_default().parse()?;
    // Pods reach S3 on the host's loopback through the node's address.
    let relay = cluster.expose_host_port(port)?;
    let client = cluster.client()?;
    let endpoint = format!("http://{}:{port}", realnode::NODE_IP);
    velero_crs::create_bsl(&client, BSL, BUCKET, &endpoint, CREDENTIALS, velero_crs::VELERO_SECRET)
        .await
        .map_err(|e| anyhow::anyhow!("creating the storage location: {e}"))?;
    // The `velero` CLI runs on the host, outside the node's network: it downloads backup logs
    // and item operations by URLs Velero signs for `publicUrl`, as for a user's workstation.
    // The agents use `s3Url` only.
    Api::<ferry_api::BackupStorageLocation>::namespaced(client.clone(), VELERO_NAMESPACE)
        .patch(
            BSL,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({ "spec": { "config": { "publicUrl": s3.endpoint() } } }),
            ),
        )
        .await?;
    install_ferry(cluster, values).await?;
    Ok(relay)
}

/// Installs (or re-renders and applies) Ferry's chart with `values` besides the tests' own.
pub async fn install_ferry(cluster: &RealCluster, values: &[&str]) -> anyhow::Result<()> {
    let binary =
        ferry_testbed::paths::image_binary(std::path::Path::new(env!("CARGO_BIN_EXE_ferry")))?;
    let mut all = vec!["agent.logLevel=info\\,ferry=debug"];
    // A short grace: a restore volume that cannot be provisioned is told sooner.
    if !values.iter().any(|v| v.starts_with("agent.extraArgs=")) {
        all.push("agent.extraArgs={--progress-interval,1s,--unschedulable-grace,20s}");
    }
    all.extend(values);
    cluster.install_ferry(&binary, &all).await?;
    Ok(())
}

impl Node {
    /// What the agent pods (as they are now) logged, read where the kubelet keeps containers'
    /// logs on the node (as `kubectl logs` shows them, with the runtime's line prefixes).
    pub async fn agent_logs(&self) -> Result<String, Box<dyn std::error::Error>> {
        let pods: Api<Pod> = Api::namespaced(self.client()?, VELERO_NAMESPACE);
        let mut log = String::new();
        for pod in pods.list(&kube::api::ListParams::default().labels(AGENT_LABELS)).await?.items {
            let dir = self.cluster.nodes()[0].dir().join("var-log/pods").join(format!(
                "{VELERO_NAMESPACE}_{}_{}",
                pod.name_any(),
                pod.uid().unwrap_or_default()
            ));
            // The current log and rotated ones not yet compressed (`.gz`: older still).
            let mut files: Vec<_> = std::fs::read_dir(dir.join("agent"))?
                .map(|f| f.map(|f| f.path()))
                .collect::<Result<_, _>>()?;
            files.retain(|f| f.extension().is_none_or(|e| e != "gz"));
            files.sort();
            for file in files {
                log.push_str(&std::fs::read_to_string(file)?);
            }
        }
        Ok(log)
    }

    /// Runs the `ferry` CLI on the repository of `namespace`'s volumes in the BSL (see
    /// [`ferry_cli`]); returns its standard output.
    pub async fn ferry(
        &self,
        namespace: &str,
        args: &[&str],
    ) -> Result<String, Box<dyn std::error::Error>> {
        ferry_cli(self.cluster, &self.s3_endpoint, namespace, args).await
    }

    pub fn client(&self) -> Result<Client, Box<dyn std::error::Error>> {
        Ok(self.cluster.client()?)
    }

    pub async fn namespace(&self, prefix: &str) -> Result<String, Box<dyn std::error::Error>> {
        Ok(self.cluster.control_plane().unique_namespace(prefix).await?)
    }
}

/// Runs the `ferry` CLI on the repository of `namespace`'s volumes in the BSL on `s3_endpoint`,
/// with the password the agents keep in `ferry-repo-credentials` and the cluster's kubeconfig;
/// returns its standard output.
pub async fn ferry_cli(
    cluster: &RealCluster,
    s3_endpoint: &str,
    namespace: &str,
    args: &[&str],
) -> Result<String, Box<dyn std::error::Error>> {
    let secrets: Api<Secret> = Api::namespaced(cluster.client()?, VELERO_NAMESPACE);
    let secret = secrets.get(ferry_mover::PASSWORD_SECRET).await?;
    let password = secret
        .data
        .and_then(|d| d.get(ferry_mover::PASSWORD_KEY).cloned())
        .ok_or("the repository password Secret has no password")?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .arg("--repo")
        .arg(format!("s3://{BUCKET}/{}", ferry_mover::repository_prefix("velero", namespace)))
        .args(["--s3-endpoint", s3_endpoint, "--s3-region", "us-east-1", "--no-cache"])
        .env("FERRY_PASSWORD", String::from_utf8(password.0)?)
        .env("AWS_ACCESS_KEY_ID", CREDENTIALS.0)
        .env("AWS_SECRET_ACCESS_KEY", CREDENTIALS.1)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        // `ferry volume` talks to the cluster.
        .env("KUBECONFIG", cluster.kubeconfig())
        .output()?;
    if !out.status.success() {
        return Err(
            format!("ferry {args:?} failed: {}", String::from_utf8_lossy(&out.stderr)).into()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// A PVC of the hostpath driver's class in `mode` (`Filesystem` or `Block`).
pub async fn create_pvc(
    client: &Client,
    ns: &str,
    name: &str,
    size: &str,
    mode: &str,
) -> Result<PersistentVolumeClaim, Box<dyn std::error::Error>> {
    create_pvc_of_class(client, ns, name, size, mode, realnode::STORAGE_CLASS).await
}

/// A PVC of storage class `class` in `mode` (`Filesystem` or `Block`).
pub async fn create_pvc_of_class(
    client: &Client,
    ns: &str,
    name: &str,
    size: &str,
    mode: &str,
    class: &str,
) -> Result<PersistentVolumeClaim, Box<dyn std::error::Error>> {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "volumeMode": mode,
            "resources": { "requests": { "storage": size } },
        },
    }))?;
    Ok(Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await?)
}

/// The MD5 of block PVC `ns/pvc`'s whole device, read by a pod.
pub async fn device_md5(
    client: &Client,
    ns: &str,
    pvc: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    run_pod(client, ns, pvc, true, "md5sum < /dev/volume | cut -d' ' -f1 > /dev/termination-log")
        .await
}

/// Runs `script` in a busybox pod with `pvc` at `/data` (Filesystem) or `/dev/volume`
/// (Block), waits until it ends, deletes it and returns what it wrote to
/// `/dev/termination-log`. A failed script fails with its message.
pub async fn run_pod(
    client: &Client,
    ns: &str,
    pvc: &str,
    block: bool,
    script: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    run_pod_on(client, ns, pvc, block, script, None).await
}

/// [`run_pod`], scheduled onto node `on` when given (by its hostname label, through the
/// scheduler: a WaitForFirstConsumer volume is then provisioned there).
pub async fn run_pod_on(
    client: &Client,
    ns: &str,
    pvc: &str,
    block: bool,
    script: &str,
    on: Option<&str>,
) -> Result<String, Box<dyn std::error::Error>> {
    let name = format!("run-{}", &uid()[..8]);
    let mut container = json!({
        "name": "run",
        "image": realnode::BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "terminationMessagePolicy": "File",
    });
    if block {
        container["volumeDevices"] = json!([{ "name": "v", "devicePath": "/dev/volume" }]);
    } else {
        container["volumeMounts"] = json!([{ "name": "v", "mountPath": "/data" }]);
    }
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
            "volumes": [{ "name": "v", "persistentVolumeClaim": { "claimName": pvc } }],
        },
    });
    if let Some(node) = on {
        pod["spec"]["nodeSelector"] = json!({ realnode::HOSTNAME_LABEL: node });
    }
    let pod: Pod = serde_json::from_value(pod)?;
    Ok(ferry_testbed::workload::run_to_completion(client, &pod, WAIT).await?)
}

pub async fn wait_gone<K>(api: &Api<K>, name: &str) -> Result<(), Box<dyn std::error::Error>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + WAIT;
    while api.get_opt(name).await?.is_some() {
        if Instant::now() > deadline {
            return Err(format!("{name} still exists after {WAIT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// A ready CSI VolumeSnapshot of `pvc`.
pub async fn snapshot(
    client: &Client,
    ns: &str,
    pvc: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let name = format!("{pvc}-{}", &uid()[..8]);
    let vs: VolumeSnapshot = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "volumeSnapshotClassName": realnode::SNAPSHOT_CLASS,
            "source": { "persistentVolumeClaimName": pvc },
        },
    }))?;
    let api: Api<VolumeSnapshot> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &vs).await?;
    let deadline = Instant::now() + WAIT;
    loop {
        let vs = api.get(&name).await?;
        if vs.status.as_ref().and_then(|s| s.ready_to_use) == Some(true) {
            return Ok(name);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "VolumeSnapshot {ns}/{name} not ready after {WAIT:?}: {:?}",
                vs.status
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The node's storage and snapshot classes, as DataUploads name them.
pub const CLASSES: Classes<'static> = Classes {
    storage_class: realnode::STORAGE_CLASS,
    snapshot_class: realnode::SNAPSHOT_CLASS,
    driver: realnode::DRIVER,
};

/// Creates the DataUpload Velero's CSI plugin would for `pvc` snapshotted as `snapshot`.
pub async fn data_upload(
    client: &Client,
    ns: &str,
    pvc: &str,
    snapshot: &str,
    backup: &str,
) -> Result<DataUpload, Box<dyn std::error::Error>> {
    data_upload_to(client, BSL, ns, pvc, snapshot, backup).await
}

/// [`data_upload`] into the storage location `bsl`.
pub async fn data_upload_to(
    client: &Client,
    bsl: &str,
    ns: &str,
    pvc: &str,
    snapshot: &str,
    backup: &str,
) -> Result<DataUpload, Box<dyn std::error::Error>> {
    let source = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns).get(pvc).await?;
    let mover = Mover { datamover: MOVER, bsl };
    // Velero's plugin names the source PVC's class.
    let class = source.spec.as_ref().and_then(|s| s.storage_class_name.clone());
    let classes =
        Classes { storage_class: class.as_deref().unwrap_or(CLASSES.storage_class), ..CLASSES };
    let du = velero_crs::data_upload(&mover, &classes, backup, &uid(), &source, snapshot)?;
    Ok(Api::<DataUpload>::namespaced(client.clone(), VELERO_NAMESPACE)
        .create(&PostParams::default(), &du)
        .await?)
}

/// Creates the target PVC Velero's restore leaves and the DataDownload restoring `from` into it.
pub async fn data_download(
    client: &Client,
    ns: &str,
    target: &str,
    size: &str,
    mode: &str,
    from: &DataUpload,
    restore: &str,
) -> Result<DataDownload, Box<dyn std::error::Error>> {
    let pvc = target_pvc(client, ns, target, size, mode).await?;
    data_download_into(client, &pvc, from, restore, None).await
}

/// Creates the target PVC `ns/target` as Velero's restore leaves it.
pub async fn target_pvc(
    client: &Client,
    ns: &str,
    target: &str,
    size: &str,
    mode: &str,
) -> Result<PersistentVolumeClaim, Box<dyn std::error::Error>> {
    let pvc = velero_crs::target_pvc(
        ns,
        target,
        size,
        mode,
        realnode::STORAGE_CLASS,
        &format!("{ns}.{target}"),
    )?;
    Ok(Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await?)
}

/// Creates the DataDownload restoring `from` into `pvc`, with `config` as its
/// `dataMoverConfig` when given.
pub async fn data_download_into(
    client: &Client,
    pvc: &PersistentVolumeClaim,
    from: &DataUpload,
    restore: &str,
    config: Option<std::collections::BTreeMap<String, String>>,
) -> Result<DataDownload, Box<dyn std::error::Error>> {
    let bsl = from.spec.backup_storage_location.as_str();
    let mut dd =
        velero_crs::data_download(&Mover { datamover: MOVER, bsl }, restore, &uid(), pvc, from)?;
    if config.is_some() {
        dd.spec.data_mover_config = config;
    }
    Ok(Api::<DataDownload>::namespaced(client.clone(), VELERO_NAMESPACE)
        .create(&PostParams::default(), &dd)
        .await?)
}

/// Waits until the DataUpload `name` is Completed; fails at once on Failed or Canceled with
/// the CR's message.
pub async fn wait_upload(
    client: &Client,
    name: &str,
) -> Result<DataUpload, Box<dyn std::error::Error>> {
    use ferry_api::DataUploadPhase as P;
    wait_done(client, name, |du: &DataUpload| {
        let status = du.status.clone().unwrap_or_default();
        match status.phase {
            Some(P::Completed) => Some(Ok(())),
            Some(p @ (P::Failed | P::Canceled)) => Some(Err(format!("{p:?}: {}", status.message))),
            _ => None,
        }
    })
    .await
}

/// Waits until the DataDownload `name` is Completed; fails at once on Failed or Canceled.
pub async fn wait_download(
    client: &Client,
    name: &str,
) -> Result<DataDownload, Box<dyn std::error::Error>> {
    use ferry_api::DataDownloadPhase as P;
    wait_done(client, name, |dd: &DataDownload| {
        let status = dd.status.clone().unwrap_or_default();
        match status.phase {
            Some(P::Completed) => Some(Ok(())),
            Some(p @ (P::Failed | P::Canceled)) => Some(Err(format!("{p:?}: {}", status.message))),
            _ => None,
        }
    })
    .await
}

/// Polls the CR `name` in Velero's namespace until `outcome` says it ended (`Ok`: as hoped).
async fn wait_done<K: VeleroCr>(
    client: &Client,
    name: &str,
    outcome: impl Fn(&K) -> Option<Result<(), String>>,
) -> Result<K, Box<dyn std::error::Error>> {
    let api: Api<K> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let deadline = Instant::now() + WAIT;
    loop {
        let object = api.get(name).await?;
        match outcome(&object) {
            Some(Ok(())) => return Ok(object),
            Some(Err(why)) => return Err(format!("{} {name} {why}", K::kind(&())).into()),
            None => {}
        }
        if Instant::now() > deadline {
            return Err(
                format!("{} {name} not done after {WAIT:?}: {object:?}", K::kind(&())).into()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A fresh 32-hex-digit identifier (std's per-instance random hash keys).
pub fn uid() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    let a = h.finish();
    h.write_u64(a);
    format!("{a:016x}{:016x}", h.finish())
}

/// Names a CR by what the API server generated.
pub fn name_of<K: ResourceExt>(object: &K) -> String {
    object.name_any()
}

/// Waits (up to a minute: the kubelet unmounts and unmaps asynchronously) until the node holds
/// nothing of a volume that no longer exists: no loop device over its backing file, no entry
/// for it in the kubelet's pod directories (a file-system volume's mount directory, a block
/// volume's device entry). Fails naming what stays: a volume was deleted while the kubelet
/// still had it published, which the kubelet can never undo (the driver no longer knows it).
pub async fn no_leaked_devices(node: &Node) -> TestResult {
    use ferry_api::k8s_openapi::api::core::v1::PersistentVolume;
    let volumes: Api<PersistentVolume> = Api::all(node.client()?);
    let kubelet =
        node.cluster.node_path(std::path::Path::new(ferry_testbed::realnode::KUBELET_ROOT));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let live: Vec<String> = volumes
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .flat_map(|pv| {
                let handle =
                    pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).unwrap_or_default();
                [pv.metadata.name.unwrap_or_default(), handle]
            })
            .filter(|s| !s.is_empty())
            .collect();
        let mut leaked: Vec<(String, String)> = node
            .cluster
            .loop_devices()
            .into_iter()
            .filter(|(_, file)| !live.iter().any(|v| file.contains(v.as_str())))
            .collect();
        leaked.extend(
            realnode::kubelet_volumes(&kubelet)?
                .into_iter()
                .filter(|v| !live.contains(&v.pv))
                .map(|v| (v.pv, v.path.display().to_string())),
        );
        if leaked.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the node still holds volumes that were deleted (loop devices, kubelet entries): \
                 {leaked:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes the PVC `ns/name` and waits until it is gone.
pub async fn delete_pvc(client: &Client, ns: &str, name: &str) -> TestResult {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    api.delete(name, &Default::default()).await?;
    wait_gone(&api, name).await
}

/// Requires `pod`'s spec to pass the API server's Pod Security admission at level
/// `restricted`: created (server-side dry run) in a namespace that enforces it.
pub async fn admitted_as_restricted(client: &Client, pod: &Pod) -> TestResult {
    use ferry_api::k8s_openapi::api::core::v1::Namespace;
    static RESTRICTED: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    let ns = RESTRICTED
        .get_or_try_init(|| async {
            let name = format!("restricted-{}", &uid()[..8]);
            let namespace: Namespace = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": { "name": name, "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                } },
            }))?;
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &namespace)
                .await?;
            Ok::<_, Box<dyn std::error::Error>>(name)
        })
        .await?;
    let copy: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": pod.metadata.name, "namespace": ns },
        "spec": pod.spec,
    }))?;
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    Api::<Pod>::namespaced(client.clone(), ns).create(&dry_run, &copy).await.map_err(|e| {
        format!(
            "holding pod {} is not admitted as restricted: {e}",
            pod.metadata.name.as_deref().unwrap_or_default()
        )
    })?;
    Ok(())
}

/// The agents' Events on the CR `name` in Velero's namespace, counted by reason.
/// [`agent_events`] once the agent published the `reason` Event (it publishes each one right
/// after the status write it tells of), waiting up to a minute.
pub async fn agent_events_after(
    client: &Client,
    name: &str,
    reason: &str,
) -> Result<std::collections::BTreeMap<String, i32>, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events = agent_events(client, name).await?;
        if events.contains_key(reason) || Instant::now() > deadline {
            return Ok(events);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub async fn agent_events(
    client: &Client,
    name: &str,
) -> Result<std::collections::BTreeMap<String, i32>, Box<dyn std::error::Error>> {
    let mut by_reason = std::collections::BTreeMap::new();
    for e in agent_event_list(client, name).await? {
        let count = e.series.as_ref().map_or(1, |s| s.count);
        *by_reason.entry(e.reason.unwrap_or_default()).or_insert(0) += count;
    }
    Ok(by_reason)
}

/// The note of the agents' `reason` Event on the CR `name`, waiting up to a minute for it.
pub async fn agent_event_note(
    client: &Client,
    name: &str,
    reason: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events = agent_event_list(client, name).await?;
        if let Some(e) = events.iter().find(|e| e.reason.as_deref() == Some(reason)) {
            return Ok(e.note.clone().unwrap_or_default());
        }
        if Instant::now() > deadline {
            let reasons: Vec<_> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
            return Err(format!("no {reason} Event on {name} within 60 s: {reasons:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Events the agents published on the CR `name` in Velero's namespace.
pub async fn agent_event_list(
    client: &Client,
    name: &str,
) -> Result<Vec<ferry_api::k8s_openapi::api::events::v1::Event>, Box<dyn std::error::Error>> {
    use ferry_api::k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reporting_controller.as_deref() == Some("ferry-agent"))
        .collect())
}

/// The number after `prefix` in `text` (`read 123 bytes` → 123).
pub fn number_after(text: &str, prefix: &str) -> Option<u64> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}
