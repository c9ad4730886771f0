//! Services started by the testbed never outlive the process that started them, however it
//! ends: a clean stop, or SIGKILL.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Up {
    child: Child,
    pids: Vec<u32>,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

fn up() -> Up {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry-testbed"))
        .args(["up", "--s3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start ferry-testbed");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
    let info: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    let pids = info["pids"]
        .as_array()
        .expect("pids")
        .iter()
        .map(|p| u32::try_from(p.as_u64().expect("pid")).expect("pid fits"))
        .collect();
    let path = |k: &str| PathBuf::from(info[k].as_str().expect(k));
    Up { pids, dir: path("dir"), kubeconfig: path("kubeconfig"), child }
}

fn alive(pid: u32) -> bool {
    // A zombie is dead for our purposes; /proc/PID/stat's third field is the state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

fn wait_gone(up: &Up) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if up.pids.iter().all(|p| !alive(*p)) && !up.dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<_> = up.pids.iter().filter(|p| alive(**p)).collect();
    panic!("left behind: pids {left:?}, dir exists: {}", up.dir.exists());
}

#[test]
fn services_run_while_up_and_vanish_on_sigkill() {
    let mut up = up();
    assert_eq!(up.pids.len(), 3, "etcd, kube-apiserver and moto");
    assert!(up.pids.iter().all(|p| alive(*p)));
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&up.kubeconfig)
        .args(["get", "crd", "datauploads.velero.io", "-o", "name"])
        .output()
        .expect("kubectl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "customresourcedefinition.apiextensions.k8s.io/datauploads.velero.io"
    );
    up.child.kill().expect("SIGKILL");
    up.child.wait().expect("reap");
    wait_gone(&up);
}

#[test]
fn services_vanish_on_clean_stop() {
    let mut up = up();
    drop(up.child.stdin.take().map(|mut s| s.flush()));
    let status = up.child.wait().expect("wait");
    assert!(status.success());
    wait_gone(&up);
}

/// The loop devices attached now.
/// The attached loop devices as `(name, backing file)`.
fn loop_devices() -> std::collections::BTreeSet<(String, String)> {
    std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let file = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            name.starts_with("loop").then(|| (name, file.trim().to_owned()))
        })
        .collect()
}

/// The loop devices of the nodes in `node_dirs`: the CSI driver's (backed by a file under a
/// node's `hostpath/` folder) and the kubelet's references to them (backed by one of those
/// devices). Other test binaries may attach loop devices of their own meanwhile.
fn cluster_loop_devices(node_dirs: &[PathBuf]) -> std::collections::BTreeSet<(String, String)> {
    let all = loop_devices();
    let marks: Vec<String> = node_dirs
        .iter()
        .filter_map(|d| d.file_name())
        .map(|n| format!("/{}/hostpath/", n.to_string_lossy()))
        .collect();
    let drivers: Vec<(String, String)> =
        all.iter().filter(|(_, file)| marks.iter().any(|m| file.contains(m))).cloned().collect();
    // A reference is backed by the device node of one of them: the same file system and inode.
    let listed = Command::new("losetup")
        .args(["-n", "-l", "-O", "NAME,BACK-MAJ:MIN,BACK-INO"])
        .output()
        .expect("losetup");
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let stat_ids: Vec<String> = drivers
        .iter()
        .filter_map(|(name, _)| {
            let out = Command::new("stat")
                .args(["-c", "%Hd:%Ld %i", &format!("/dev/{name}")])
                .output()
                .ok()?;
            Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        })
        .collect();
    let references: Vec<String> = listed
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (dev, majmin, ino) = (f.next()?, f.next()?, f.next()?);
            stat_ids
                .contains(&format!("{majmin} {ino}"))
                .then(|| dev.trim_start_matches("/dev/").to_owned())
        })
        .collect();
    all.into_iter().filter(|d| drivers.contains(d) || references.contains(&d.0)).collect()
}

/// A real cluster of two nodes SIGKILLed with a block volume mapped into a pod (the CSI
/// driver's loop device and the kubelet's reference to it) leaves no process, folder (the
/// cluster's and each node's), cgroup (each node's) or loop device.
#[test]
fn a_real_cluster_vanishes_on_sigkill() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry-testbed"))
        .args(["node", "--nodes", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start ferry-testbed node");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
    let info: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("one JSON line from ferry-testbed node ({e}): {line:?}"));
    let pids: Vec<u32> = info["pids"]
        .as_array()
        .expect("pids")
        .iter()
        .map(|p| u32::try_from(p.as_u64().expect("pid")).expect("pid fits"))
        .collect();
    let nodes = info["nodes"].as_array().expect("nodes").clone();
    assert_eq!(nodes.len(), 2, "{info}");
    let mut dirs = vec![PathBuf::from(info["dir"].as_str().expect("dir"))];
    dirs.extend(nodes.iter().map(|n| PathBuf::from(n["dir"].as_str().expect("node dir"))));
    let node_cgroups: Vec<String> =
        nodes.iter().map(|n| n["cgroup"].as_str().expect("cgroup").to_owned()).collect();
    assert!(dirs.iter().all(|d| d.exists()), "every folder exists while it runs: {dirs:?}");
    let kubeconfig = PathBuf::from(info["kubeconfig"].as_str().expect("kubeconfig"));
    let manifest = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: disk, namespace: default}
spec: {accessModes: [ReadWriteOnce], volumeMode: Block, resources: {requests: {storage: 8Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: user, namespace: default}
spec:
  containers:
  - {name: user, image: "ferry.local/busybox:1", imagePullPolicy: Never, command: [sleep, "3600"],
     volumeDevices: [{name: d, devicePath: /dev/volume}]}
  volumes: [{name: d, persistentVolumeClaim: {claimName: disk}}]
"#;
    let kubectl = ferry_testbed::paths::kubectl().expect("kubectl");
    let mut apply = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("kubectl apply");
    apply.stdin.take().expect("stdin").write_all(manifest.as_bytes()).expect("write");
    assert!(apply.wait().expect("kubectl").success());
    let status = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["wait", "--for=condition=Ready", "pod/user", "-n", "default", "--timeout=120s"])
        .status()
        .expect("kubectl wait");
    assert!(status.success(), "the pod with the block volume runs");
    let node_dirs = &dirs[1..];
    let mapped = cluster_loop_devices(node_dirs);
    assert!(mapped.len() >= 2, "the driver's device and the kubelet's reference: {mapped:?}");

    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let deadline = Instant::now() + Duration::from_secs(30);
    let cgroups = || -> Vec<PathBuf> {
        std::fs::read_dir("/sys/fs/cgroup")
            .map(|d| {
                d.filter_map(Result::ok)
                    .flat_map(|e| node_cgroups.iter().map(move |c| e.path().join(c)))
                    .filter(|p| p.exists())
                    .collect()
            })
            .unwrap_or_default()
    };
    loop {
        let alive: Vec<_> = pids.iter().filter(|p| alive(**p)).collect();
        // The same device with the same backing file: a number reused since is someone else's.
        let loops: Vec<_> = loop_devices().intersection(&mapped).cloned().collect();
        let left = cgroups();
        let folders: Vec<_> = dirs.iter().filter(|d| d.exists()).collect();
        if alive.is_empty() && loops.is_empty() && left.is_empty() && folders.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: pids {alive:?}, loop devices {loops:?}, cgroups {left:?}, folders \
             {folders:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
