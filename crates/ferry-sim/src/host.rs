//! Real storage on the host: sparse images, loop devices, ext4, mounts. Every operation is a
//! standard tool (`losetup`, `mkfs.ext4`, `mount`, `cp`...), so what the simulator does can be
//! repeated by hand when a test needs debugging.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use tokio::process::Command;

use crate::SimError;

/// Runs `program args...`, returning its stdout.
pub(crate) async fn run<I, S>(program: &str, args: I) -> Result<String, SimError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_ok_up_to(program, args, 0).await
}

/// Runs `program args...`, taking exit codes up to `max_ok` as success (e2fsck's 1 means
/// "errors corrected", e.g. a journal replayed).
pub(crate) async fn run_ok_up_to<I, S>(
    program: &str,
    args: I,
    max_ok: i32,
) -> Result<String, SimError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let command = std::iter::once(program.to_owned())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new(program)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| SimError::Spawn { command: command.clone(), source })?;
    if !out.status.code().is_some_and(|c| (0..=max_ok).contains(&c)) {
        return Err(SimError::Command {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates a sparse file of `size` bytes (its parent folder too).
pub(crate) async fn create_sparse(path: &Path, size: u64) -> Result<(), SimError> {
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| SimError::io("creating folder", parent, e))?;
    }
    let file =
        tokio::fs::File::create(path).await.map_err(|e| SimError::io("creating image", path, e))?;
    file.set_len(size).await.map_err(|e| SimError::io("sizing image", path, e))
}

/// Grows an image to `size` bytes if it is smaller.
pub(crate) async fn grow(path: &Path, size: u64) -> Result<bool, SimError> {
    let file = tokio::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .await
        .map_err(|e| SimError::io("opening image", path, e))?;
    let len = file.metadata().await.map_err(|e| SimError::io("reading size of", path, e))?.len();
    if len >= size {
        return Ok(false);
    }
    file.set_len(size).await.map_err(|e| SimError::io("growing image", path, e))?;
    Ok(true)
}

/// The size of a file in bytes.
pub(crate) async fn file_size(path: &Path) -> Result<u64, SimError> {
    Ok(tokio::fs::metadata(path).await.map_err(|e| SimError::io("reading size of", path, e))?.len())
}

/// Copies an image, keeping holes (the "snapshot" of a volume, or a volume from a snapshot).
pub(crate) async fn copy_sparse(from: &Path, to: &Path) -> Result<(), SimError> {
    if let Some(parent) = to.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| SimError::io("creating folder", parent, e))?;
    }
    // `auto` keeps the source's holes (SEEK_DATA) and copies its data in the kernel
    // (copy_file_range, or a reflink where the file system has them) instead of scanning every
    // block for zeros in user space: a 1 GiB volume copies 2-3 times faster.
    let args = ["--sparse=auto", "--reflink=auto"].map(OsStr::new);
    run("cp", args.iter().copied().chain([from.as_os_str(), to.as_os_str()])).await.map(drop)
}

/// Attaches a loop device over `image` and returns its path (`/dev/loopN`).
pub(crate) async fn attach_loop(image: &Path) -> Result<PathBuf, SimError> {
    let out =
        run("losetup", [OsStr::new("--find"), OsStr::new("--show"), image.as_os_str()]).await?;
    Ok(PathBuf::from(out.trim()))
}

/// Detaches a loop device.
pub(crate) async fn detach_loop(device: &Path) -> Result<(), SimError> {
    run("losetup", [OsStr::new("--detach"), device.as_os_str()]).await.map(drop)
}

/// Makes an ext4 file system, quickly (lazy table initialisation, no reserved blocks).
pub(crate) async fn mkfs_ext4(device: &Path) -> Result<(), SimError> {
    run(
        "mkfs.ext4",
        [
            OsStr::new("-q"),
            OsStr::new("-F"),
            OsStr::new("-m"),
            OsStr::new("0"),
            OsStr::new("-E"),
            OsStr::new("lazy_itable_init=1,lazy_journal_init=1,nodiscard"),
            device.as_os_str(),
        ],
    )
    .await
    .map(drop)
}

/// Grows the ext4 file system on `device` to fill it.
pub(crate) async fn resize_ext4(device: &Path) -> Result<(), SimError> {
    // resize2fs insists on a freshly checked file system when offline. A snapshot of a
    // mounted file system needs its journal replayed: e2fsck then exits with 1 (corrected).
    run_ok_up_to("e2fsck", [OsStr::new("-f"), OsStr::new("-y"), device.as_os_str()], 2).await?;
    run("resize2fs", [device.as_os_str()]).await.map(drop)
}

/// Mounts the ext4 file system on `device` at `target` (created if missing).
pub(crate) async fn mount_ext4(
    device: &Path,
    target: &Path,
    read_only: bool,
) -> Result<(), SimError> {
    tokio::fs::create_dir_all(target)
        .await
        .map_err(|e| SimError::io("creating mount point", target, e))?;
    let options = if read_only { "ro,noinit_itable" } else { "rw,noinit_itable" };
    run(
        "mount",
        [
            OsStr::new("-t"),
            OsStr::new("ext4"),
            OsStr::new("-o"),
            OsStr::new(options),
            device.as_os_str(),
            target.as_os_str(),
        ],
    )
    .await
    .map(drop)
}

/// Bind-mounts the device file `device` onto the regular file `target` (created if missing),
/// as a CSI driver publishes a block volume.
pub(crate) async fn bind_device(device: &Path, target: &Path) -> Result<(), SimError> {
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| SimError::io("creating folder", parent, e))?;
    }
    tokio::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(target)
        .await
        .map_err(|e| SimError::io("creating publish file", target, e))?;
    run("mount", [OsStr::new("--bind"), device.as_os_str(), target.as_os_str()]).await.map(drop)
}

/// Unmounts `target`; a busy mount is detached lazily so cleanup never stalls.
pub(crate) async fn unmount(target: &Path) -> Result<(), SimError> {
    match run("umount", [target.as_os_str()]).await {
        Ok(_) => Ok(()),
        Err(first) => {
            if !crate::janitor::is_mount_point(target) {
                return Ok(());
            }
            run("umount", [OsStr::new("-l"), target.as_os_str()]).await.map(drop).map_err(|_| first)
        }
    }
}

/// Flushes a mounted file system's dirty data down to its device (`syncfs`).
pub(crate) async fn sync_fs(mount: &Path) -> Result<(), SimError> {
    run("sync", [OsStr::new("-f"), mount.as_os_str()]).await.map(drop)
}

/// Flushes a block device's buffers, so its backing file holds everything written to it.
pub(crate) async fn flush_device(device: &Path) -> Result<(), SimError> {
    run("blockdev", [OsStr::new("--flushbufs"), device.as_os_str()]).await.map(drop)
}
