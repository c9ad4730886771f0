//! The real `velero server` (v1.18.3, with its AWS plugin and its own CRDs) drives Ferry on the
//! real node: `velero backup create --snapshot-move-data --data-mover ferry`, then `velero
//! restore create` into another namespace, then in place after the application's namespace was
//! deleted, the data compared by pods; `velero backup delete` makes the agent forget the
//! backup's snapshots; the storage location stays `Available` by Velero's own validation
//! throughout. Velero runs as in a cluster: inside the
//! node's network (it reaches the API at the `kubernetes` Service and S3 where pods do).

use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::Namespace;
use ferry_testbed::VELERO_NAMESPACE;
use ferry_testbed::velero::{self, VeleroOptions, VeleroServer};
use kube::api::{Api, ApiResource, DynamicObject};

use crate::node::{self, TestResult, WAIT};
use crate::round_trip::{BLOCK_MANIFEST, BLOCK_WRITE, FS_MANIFEST, FS_WRITE};

fn velero_api<K: kube::Resource<DynamicType = ()>>(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), VELERO_NAMESPACE, &ApiResource::erase::<K>(&()))
}

/// The phase of a Backup or Restore.
async fn phase<K: kube::Resource<DynamicType = ()>>(
    client: &kube::Client,
    name: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let object = velero_api::<K>(client).get(name).await?;
    Ok(object.data["status"]["phase"].as_str().unwrap_or_default().to_owned())
}

/// Waits until Velero has validated location `default` since `after`, and requires it
/// `Available`.
async fn location_available(client: &kube::Client, after: jiff::Timestamp) -> TestResult {
    let api = velero_api::<ferry_api::BackupStorageLocation>(client);
    let deadline = Instant::now() + WAIT;
    loop {
        let status = api.get(node::BSL).await?.data["status"].clone();
        let validated =
            status["lastValidationTime"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok());
        if validated.is_some_and(|v| v > after) {
            let phase = status["phase"].as_str().unwrap_or_default();
            return if phase == "Available" {
                Ok(())
            } else {
                Err(format!("location {} is {phase:?}: {status}", node::BSL).into())
            };
        }
        if Instant::now() > deadline {
            return Err(format!(
                "Velero did not validate location {} in time: {status}",
                node::BSL
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn velero_backs_up_and_restores_through_ferry_on_the_real_node() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    velero::install_crds(node.cluster.control_plane())?;
    let mut server = VeleroServer::start_on_node(node.cluster, &VeleroOptions::default())?;

    let ns = node.namespace("shop").await?;
    node::create_pvc(&client, &ns, "files", "64Mi", "Filesystem").await?;
    node::create_pvc(&client, &ns, "disk", "32Mi", "Block").await?;
    let tree =
        node::run_pod(&client, &ns, "files", false, &format!("{FS_WRITE}\n{FS_MANIFEST}")).await?;
    let device =
        node::run_pod(&client, &ns, "disk", true, &format!("{BLOCK_WRITE}\n{BLOCK_MANIFEST}"))
            .await?;

    let backup = format!("{ns}-b1");
    let out = server.cli(
        &[
            "backup",
            "create",
            &backup,
            "--include-namespaces",
            &ns,
            "--snapshot-move-data",
            "--data-mover",
            "ferry",
            "--wait",
        ],
        WAIT,
    )?;
    let backed_up = phase::<ferry_api::Backup>(&client, &backup).await?;
    assert_eq!(backed_up, "Completed", "{out}\n{}", server.log_tail(40));
    let uploads: Vec<_> =
        Api::<ferry_api::DataUpload>::namespaced(client.clone(), VELERO_NAMESPACE)
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|du| {
                du.metadata.labels.as_ref().and_then(|l| l.get("velero.io/backup-name"))
                    == Some(&backup)
            })
            .collect();
    assert_eq!(uploads.len(), 2, "one DataUpload per PVC, by Velero's CSI plugin");
    assert!(uploads.iter().all(|du| du.spec.data_mover == "ferry"));
    let after = jiff::Timestamp::now();
    location_available(&client, after).await?;

    let target = format!("{ns}-restored");
    let restore = format!("{ns}-r1");
    let out = server.cli(
        &[
            "restore",
            "create",
            &restore,
            "--from-backup",
            &backup,
            "--namespace-mappings",
            &format!("{ns}:{target}"),
            "--wait",
        ],
        WAIT,
    )?;
    let restored = phase::<ferry_api::Restore>(&client, &restore).await?;
    assert_eq!(restored, "Completed", "{out}\n{}", server.log_tail(40));
    assert_eq!(node::run_pod(&client, &target, "files", false, FS_MANIFEST).await?, tree);
    assert_eq!(node::run_pod(&client, &target, "disk", true, BLOCK_MANIFEST).await?, device);
    location_available(&client, jiff::Timestamp::now()).await?;

    // Disaster: the application's namespace is deleted (its PVCs and volumes with it), then
    // restored from the same backup in place.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(&ns, &Default::default()).await?;
    let deadline = Instant::now() + WAIT;
    while namespaces.get_opt(&ns).await?.is_some() {
        assert!(Instant::now() < deadline, "namespace {ns} not gone after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let restore = format!("{ns}-r2");
    let out =
        server.cli(&["restore", "create", &restore, "--from-backup", &backup, "--wait"], WAIT)?;
    let restored = phase::<ferry_api::Restore>(&client, &restore).await?;
    assert_eq!(restored, "Completed", "{out}\n{}", server.log_tail(40));
    assert_eq!(node::run_pod(&client, &ns, "files", false, FS_MANIFEST).await?, tree);
    assert_eq!(node::run_pod(&client, &ns, "disk", true, BLOCK_MANIFEST).await?, device);
    location_available(&client, jiff::Timestamp::now()).await?;

    // `velero backup delete` with Ferry as installed (no plugin of Ferry's in Velero): the
    // agent forgets the backup's snapshots once Velero has deleted the backup.
    let snapshots = |listed: String| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(serde_json::from_str::<Vec<serde_json::Value>>(&listed)?.len())
    };
    let before = snapshots(node.ferry(&ns, &["snapshots", "--json"]).await?)?;
    assert_eq!(before, 2, "one snapshot per PVC");
    server.cli(&["backup", "delete", &backup, "--confirm"], WAIT)?;
    let backups = velero_api::<ferry_api::Backup>(&client);
    let deadline = Instant::now() + WAIT;
    loop {
        let gone = backups.get_opt(&backup).await?.is_none();
        let left = snapshots(node.ferry(&ns, &["snapshots", "--json"]).await?)?;
        if gone && left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{WAIT:?} after velero backup delete: Backup gone {gone}, {left} snapshots left\n{}",
            server.log_tail(30)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    location_available(&client, jiff::Timestamp::now()).await?;
    server.kill();
    Ok(())
}
