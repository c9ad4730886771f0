//! Nothing of a simulator survives it: not after shutdown, not after a drop, not after its
//! process died.

use ferry_sim::janitor::{DIR_PREFIX, leftovers_under, sweep_stale};
use ferry_sim::{Binding, FsTree, VolumeMode, pod_object};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

use crate::support::{Env, T, mount_points};

/// A simulator with a mounted file system, a mapped block device and a snapshot.
async fn busy(env: &Env) {
    env.sim
        .create_pvc(&env.ns, "fs", "16Mi", VolumeMode::Filesystem, Binding::Immediate)
        .await
        .unwrap();
    env.sim
        .create_pvc(&env.ns, "raw", "8Mi", VolumeMode::Block, Binding::WaitForFirstConsumer)
        .await
        .unwrap();
    env.sim.write_files(&env.ns, "fs", &FsTree::sample(9)).await.unwrap();
    env.pods()
        .create(
            &PostParams::default(),
            &pod_object("fs-user", "fs", VolumeMode::Filesystem).unwrap(),
        )
        .await
        .unwrap();
    env.pods()
        .create(&PostParams::default(), &pod_object("raw-user", "raw", VolumeMode::Block).unwrap())
        .await
        .unwrap();
    env.sim.wait_pod_running(&env.ns, "fs-user", T).await.unwrap();
    env.sim.wait_pod_running(&env.ns, "raw-user", T).await.unwrap();
    env.sim.snapshot_pvc(&env.ns, "fs", "snap").await.unwrap();
    env.sim.wait_snapshot_ready(&env.ns, "snap", T).await.unwrap();
    let left = env.sim.leftovers();
    assert_eq!(left.loop_devices.len(), 2, "{left:?}");
    assert_eq!(left.mounts.len(), 2, "{left:?}");
}

#[tokio::test]
async fn shutdown_removes_every_mount_loop_device_and_image() {
    let env = Env::new("shutdown").await;
    busy(&env).await;
    let nodes = env.sim.nodes();
    let client = env.client.clone();
    env.finish().await; // asserts no mounts, loop devices or folder left
    let api: Api<Node> = Api::all(client);
    for node in nodes {
        assert!(api.get_opt(&node).await.unwrap().is_none(), "node {node} unregistered");
    }
}

#[tokio::test]
async fn dropping_the_simulator_cleans_the_host_too() {
    let env = Env::new("drop").await;
    busy(&env).await;
    let dir = env.sim.dir().to_path_buf();
    drop(env);
    let left = leftovers_under(&dir);
    assert!(left.is_empty(), "{left:?}");
    assert!(!dir.exists());
}

/// A folder left by a process that no longer exists, holding a mounted loop device, is
/// cleaned by the sweep every simulator start runs.
#[tokio::test]
async fn sweep_cleans_the_folder_of_a_dead_process() {
    let tmp = std::env::temp_dir();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let dir = tmp.join(format!("{DIR_PREFIX}{dead}-sweeptest"));
    let guard = CleanOnDrop(dir.clone());
    std::fs::create_dir_all(dir.join("mnt")).unwrap();
    let image = dir.join("volume.img");
    std::fs::File::create(&image).unwrap().set_len(8 << 20).unwrap();
    run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
    let device = run("losetup", &["--find", "--show", image.to_str().unwrap()]);
    run("mount", &[device.trim(), dir.join("mnt").to_str().unwrap()]);
    assert!(!leftovers_under(&dir).is_empty());

    let cleaned = sweep_stale(&tmp);
    assert!(cleaned.contains(&dir), "{cleaned:?}");
    assert!(leftovers_under(&dir).is_empty());
    assert!(!mount_points().contains(&dir.join("mnt").display().to_string()));
    assert!(!dir.exists());
    drop(guard);
}

struct CleanOnDrop(std::path::PathBuf);

impl Drop for CleanOnDrop {
    fn drop(&mut self) {
        ferry_sim::janitor::cleanup_dir(&self.0);
    }
}

fn run(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}
