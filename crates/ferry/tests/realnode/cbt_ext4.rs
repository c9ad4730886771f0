//! Changed-block tracking on a block PVC holding an ext4 file system of real files: the first
//! backup reads the allocated ranges the driver reports, the incrementals after a small and a
//! large change read the driver's delta, and every restore is the same device bit for bit and
//! a clean file system holding the same files.
//!
//! The file system is made and changed with e2fsprogs on the volume's backing file (the
//! hostpath driver keeps a block volume as a file on the node) while no pod uses it: the bytes
//! are exactly what a kernel mount would leave, without a privileged pod.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;

use crate::cbt::{MIB, back_up, kept_block_pvc, release_base, restore_block};
use crate::node::{self, TestResult};

/// A volume of a few GiB, as #22 asks. The hostpath driver writes every volume made from a
/// snapshot whole (`dd`): each backup's volume costs 2 GiB of disk writes.
const SIZE: &str = "2Gi";
const SIZE_BYTES: u64 = 2048 * MIB;

/// The file backing block PVC `ns/pvc` on the node, once it is provisioned.
async fn backing_file(
    node: &node::Node,
    client: &kube::Client,
    ns: &str,
    pvc: &str,
) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns).get(pvc).await?;
    let volume = claim.spec.and_then(|s| s.volume_name).ok_or("the PVC is not bound")?;
    let pv = Api::<PersistentVolume>::all(client.clone()).get(&volume).await?;
    let handle = pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).ok_or("no CSI handle")?;
    let file = node.cluster.nodes()[0].hostpath_volume(&handle);
    if !file.is_file() {
        return Err(format!("{} is not the block volume's file", file.display()).into());
    }
    Ok(file)
}

/// Runs an e2fsprogs command; its standard output, or the error with its output.
fn e2fs(program: &str, args: &[&str], image: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let out = Command::new(program).args(args).arg(image).output().map_err(|e| {
        format!("{program} (e2fsprogs) could not run: {e}; the test needs it on the host")
    })?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?} {}: {}\n{}\n{}",
            image.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    // debugfs exits 0 when its request fails: anything on stderr but its banner is a failure.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failed = stderr.lines().find(|l| !l.trim().is_empty() && !l.starts_with(program));
    if let Some(line) = failed.filter(|_| program == "debugfs") {
        return Err(format!("{program} {args:?} {}: {line}", image.display()).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `debugfs -w -R "write SOURCE NAME"`: a file of the host copied into the file system.
fn put_file(image: &Path, source: &Path, name: &str) -> TestResult {
    let request = format!("write {} {name}", source.display());
    e2fs("debugfs", &["-w", "-R", &request], image)?;
    Ok(())
}

/// `len` bytes of random data in a new file under `dir`.
fn random_file(dir: &Path, name: &str, len: usize) -> Result<PathBuf, Box<dyn std::error::Error>> {
    use std::io::Read as _;
    let path = dir.join(name);
    let mut data = vec![0; len];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut data)?;
    std::fs::write(&path, data)?;
    Ok(path)
}

/// The MD5 of a file, as `md5sum` prints it.
fn md5(path: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let out = Command::new("md5sum").arg(path).output()?;
    if !out.status.success() {
        return Err(format!("md5sum {}: {}", path.display(), out.status).into());
    }
    let text = String::from_utf8(out.stdout)?;
    Ok(text.split_whitespace().next().ok_or("md5sum printed nothing")?.to_owned())
}

/// Restores `du` into a new PVC; checks the device's MD5 (read by a pod), that the restored
/// file system is clean (`e2fsck -fn`), that its file `name` is `expected` byte for byte and
/// that the files `gone` are not there.
async fn restore_and_compare(
    node: &node::Node,
    client: &kube::Client,
    du: &ferry_api::DataUpload,
    written: &str,
    name: &str,
    expected: &Path,
    gone: &[&str],
) -> TestResult {
    let (target_ns, restored) = restore_block(node, client, du, SIZE).await?;
    assert_eq!(restored.trim(), written, "the restored device differs from the backed-up one");
    let image = backing_file(node, client, &target_ns, "disk").await?;
    e2fs("e2fsck", &["-fn"], &image)?;
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("out");
    e2fs("debugfs", &["-R", &format!("dump {name} {}", copy.display())], &image)?;
    assert_eq!(std::fs::read(&copy)?, std::fs::read(expected)?, "{name} differs after restore");
    for file in gone {
        let found = e2fs("debugfs", &["-R", &format!("stat {file}")], &image);
        assert!(found.is_err(), "{file}, removed before the backup, is in the restored volume");
    }
    node::delete_pvc(client, &target_ns, "disk").await?;
    Ok(())
}

#[tokio::test]
async fn an_ext4_volume_backs_up_by_allocated_ranges_then_by_delta_and_restores_bit_for_bit()
-> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("cbt-ext4").await?;
    let _bases = crate::cbt::ReleaseBases(ns.clone());
    kept_block_pvc(&client, &ns, SIZE).await?;
    // Provisioned on first use.
    node::run_pod(&client, &ns, "disk", true, "true").await?;
    let image = backing_file(node, &client, &ns, "disk").await?;

    // Real files: Ferry's own sources and 24 MiB of random data.
    let host = tempfile::tempdir()?;
    let tree = host.path().join("tree");
    std::fs::create_dir(&tree)?;
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let copied = Command::new("cp").arg("-r").arg(&sources).arg(tree.join("src")).status()?;
    assert!(copied.success(), "copying {} failed", sources.display());
    let data = random_file(&tree, "data", 24 << 20)?;
    e2fs("mkfs.ext4", &["-F", "-q", "-b", "4096", "-d", &tree.display().to_string()], &image)?;
    e2fs("e2fsck", &["-fn"], &image)?;
    let written = md5(&image)?;

    let first = back_up(&client, &ns, "cbt-ext4-1").await?;
    let message = first.status.clone().unwrap_or_default().message;
    assert!(message.contains("allocated ranges"), "not by the allocated ranges: {message}");
    let read =
        node::number_after(&message, "read ").ok_or_else(|| format!("no count in {message:?}"))?;
    // The data, the metadata mkfs wrote and the sample: nowhere near the 2 GiB device.
    assert!((24 * MIB..160 * MIB).contains(&read), "read {read} bytes: {message}");
    restore_and_compare(node, &client, &first, &written, "data", &data, &[]).await?;

    // A small change: one 100 KiB file added, one removed.
    let small = random_file(host.path(), "small", 100 << 10)?;
    put_file(&image, &small, "small")?;
    e2fs("debugfs", &["-w", "-R", "rm src/main.rs"], &image)?;
    let written = md5(&image)?;
    let second = back_up(&client, &ns, "cbt-ext4-2").await?;
    let message = second.status.clone().unwrap_or_default().message;
    assert!(
        message.contains("changed since the parent's snapshot") && !message.contains("no delta"),
        "the small change was not read by the delta: {message}"
    );
    let read =
        node::number_after(&message, "read ").ok_or_else(|| format!("no count in {message:?}"))?;
    let check = ferry_repo::default_delta_check(SIZE_BYTES, ferry_repo::DEFAULT_VOLUME_CHUNK);
    assert!(read < check + 16 * MIB, "read {read} bytes for a 100 KiB change: {message}");
    restore_and_compare(node, &client, &second, &written, "small", &small, &["src/main.rs"])
        .await?;

    // A large change: 256 MiB of new data.
    let large = random_file(host.path(), "large", 256 << 20)?;
    put_file(&image, &large, "large")?;
    let written = md5(&image)?;
    let third = back_up(&client, &ns, "cbt-ext4-3").await?;
    let message = third.status.clone().unwrap_or_default().message;
    assert!(
        message.contains("changed since the parent's snapshot") && !message.contains("no delta"),
        "the large change was not read by the delta: {message}"
    );
    let read =
        node::number_after(&message, "read ").ok_or_else(|| format!("no count in {message:?}"))?;
    assert!(
        (256 * MIB..check + 300 * MIB).contains(&read),
        "read {read} bytes for a 256 MiB change: {message}"
    );
    restore_and_compare(node, &client, &third, &written, "large", &large, &["src/main.rs"]).await?;
    node.ferry(&ns, &["check", "--read-data"]).await?;
    release_base(&client, &third).await?;
    node::delete_pvc(&client, &ns, "disk").await
}
