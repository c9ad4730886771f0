//! `ferry volume backup NAMESPACE/PVC` and `ferry volume restore SNAPSHOT NAMESPACE/PVC`: a
//! volume backed up and restored into another namespace by the CLI alone (no Velero), with
//! the agents moving the data; and the refusals a user can act on.

use ferry_api::{Backup, Restore};
use ferry_sim::{Binding, FsTree, VolumeMode};
use ferry_testbed::VELERO_NAMESPACE;
use kube::api::{Api, ListParams};

use crate::harness::{Setup, TestResult, World};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The phases of the Backups or Restores `ferry volume` made (only this test runs it).
async fn phases<K>(world: &World) -> Result<Vec<String>, kube::Error>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let list = api.list(&ListParams::default().labels("ferry.io/created-by=ferry-volume")).await?;
    Ok(list
        .items
        .iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .map(|v| v["status"]["phase"].as_str().unwrap_or_default().to_owned())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pvc_is_backed_up_and_restored_by_the_cli_without_velero() -> TestResult {
    let setup = Setup { second_namespace: true, ..Setup::default() };
    let world = World::start_with("e2e-volcli", setup).await?;
    let tree = FsTree::sample(37);
    let sim = world.sim();
    sim.create_pvc(&world.ns, "data", "32Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
    sim.write_files(&world.ns, "data", &tree).await?;
    let common = [
        "--velero-namespace",
        VELERO_NAMESPACE,
        "--data-mover",
        &world.mover,
        "--poll-interval",
        "500ms",
    ];

    let target = format!("{}/data", world.ns);
    let mut args = vec!["volume", "backup", "--storage-location", &world.bsl, &target];
    args.extend(common);
    let out = world.ferry_with_repo(&args).await?;
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), world.agent_logs());
    let stdout = text(&out.stdout);
    let id = stdout.lines().last().unwrap_or_default().to_owned();
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("PVC {target} backed up")), "{stderr}");
    let listed = world.repo_snapshots().await?;
    assert!(listed.iter().any(|s| s["id"] == id.as_str()), "{id} not in {listed:?}");
    assert_eq!(phases::<Backup>(&world).await?, ["Completed"]);

    let ns2 = world.ns2.clone().ok_or("second namespace")?;
    let copy = format!("{ns2}/copy");
    let short = &id[..12];
    let mut args = vec!["volume", "restore", short, &copy];
    args.extend(common);
    let out = world.ferry_with_repo(&args).await?;
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), world.agent_logs());
    assert!(
        text(&out.stderr).contains(&format!("restored into PVC {copy}")),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(world.sim().read_files(&ns2, "copy").await?, tree);
    assert_eq!(phases::<Restore>(&world).await?, ["Completed"]);

    // Restoring over an existing PVC is refused before anything is made.
    let out = world.ferry_with_repo(&args).await?;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(&format!("PVC {copy} exists already")),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(phases::<Restore>(&world).await?, ["Completed"], "no second Restore");

    // A PVC that does not exist is named.
    let missing = format!("{}/nothing-here", world.ns);
    let mut args = vec!["volume", "backup", "--storage-location", &world.bsl, &missing];
    args.extend(common);
    let out = world.ferry_with_repo(&args).await?;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(&format!("reading PVC {missing}")), "{}", text(&out.stderr));
    world.shutdown().await
}
