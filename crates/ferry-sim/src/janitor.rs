//! Cleanup that cannot be forgotten. Every simulator keeps all its state (images, mount points,
//! kubelet roots) under one folder named `ferry-sim-<pid>-<random>` in the temp dir, so
//! "everything of this simulator" is "every mount under that folder and every loop device whose
//! backing file is under it". [`cleanup_dir`] removes exactly that, synchronously (it runs from
//! `Drop`); [`sweep_stale`] does it for the folders of processes that are gone; a detached
//! janitor process ([`spawn_janitor`]) does it once the test process exits, however it exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The prefix of every simulator folder in the temp dir.
pub const DIR_PREFIX: &str = "ferry-sim-";

/// Mounts and loop devices that belong to simulator folders.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Mount points under a simulator folder.
    pub mounts: Vec<PathBuf>,
    /// Loop devices (`/dev/loopN`, backing file) whose backing file is under one.
    pub loop_devices: Vec<(PathBuf, PathBuf)>,
}

impl Leftovers {
    /// Whether nothing is left.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty() && self.loop_devices.is_empty()
    }
}

/// The mounts and loop devices under `dir` right now.
#[must_use]
pub fn leftovers_under(dir: &Path) -> Leftovers {
    let within = |p: &Path| p.starts_with(dir);
    Leftovers {
        mounts: mount_points().into_iter().filter(|m| within(m)).collect(),
        loop_devices: loop_devices().into_iter().filter(|(_, back)| within(back)).collect(),
    }
}

/// The mounts and loop devices of every simulator folder in the temp dir (of any process).
#[must_use]
pub fn leftovers_all() -> Leftovers {
    let tmp = std::env::temp_dir();
    let ours = |p: &Path| {
        p.strip_prefix(&tmp)
            .ok()
            .and_then(|rest| rest.components().next())
            .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with(DIR_PREFIX))
    };
    Leftovers {
        mounts: mount_points().into_iter().filter(|m| ours(m)).collect(),
        loop_devices: loop_devices().into_iter().filter(|(_, back)| ours(back)).collect(),
    }
}

/// Whether `path` is a mount point right now.
#[must_use]
pub fn is_mount_point(path: &Path) -> bool {
    mount_points().iter().any(|m| m == path)
}

/// Unmounts everything under `dir` (deepest first, lazily if busy), detaches every loop device
/// backed by a file under it, then removes the folder. Safe to call repeatedly. The folder is
/// kept if a mount under it could not be removed, so nothing mounted is ever deleted through.
pub fn cleanup_dir(dir: &Path) {
    let mut mounts: Vec<_> = mount_points().into_iter().filter(|m| m.starts_with(dir)).collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in &mounts {
        if !quiet("umount", &[m.as_os_str()]) {
            quiet("umount", &["-l".as_ref(), m.as_os_str()]);
        }
    }
    for (device, _) in loop_devices().into_iter().filter(|(_, back)| back.starts_with(dir)) {
        quiet("losetup", &["--detach".as_ref(), device.as_os_str()]);
    }
    if mount_points().iter().any(|m| m.starts_with(dir)) {
        tracing::warn!(dir = %dir.display(), "mounts remain under the simulator folder; keeping it");
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "removing the simulator folder");
    }
}

/// Cleans up the simulator folders in `tmp` whose owning process is gone (a test binary that
/// was killed). Returns the folders cleaned.
#[must_use = "the folders cleaned are worth logging"]
pub fn sweep_stale(tmp: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(tmp) else { return Vec::new() };
    let mut cleaned = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(DIR_PREFIX).and_then(|r| r.split('-').next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        cleanup_dir(&dir);
        cleaned.push(dir);
    }
    cleaned
}

/// Starts a detached shell that waits for this process to end and then cleans `dir` the way
/// [`cleanup_dir`] does (it ends early once `dir` is gone). It covers SIGKILLed test binaries.
///
/// # Errors
/// `sh` could not be started.
pub fn spawn_janitor(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    // $1 = pid to wait for, $2 = folder. Mount points come from field 5 of mountinfo.
    let script = r#"
i=0
while [ "$i" -lt 172800 ] && [ -d "$2" ] && kill -0 "$1" 2>/dev/null; do sleep 1; i=$((i+1)); done
[ -d "$2" ] || exit 0
awk -v d="$2/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
losetup -n -l -O NAME,BACK-FILE | awk -v d="$2/" 'index($2, d) == 1 { print $1 }' | while read -r l; do losetup -d "$l"; done
awk -v d="$2/" 'index($5, d) == 1 { found = 1 } END { exit found }' /proc/self/mountinfo && rm -rf -- "$2"
"#;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("ferry-sim-janitor")
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map(drop)
}

fn quiet(program: &str, args: &[&std::ffi::OsStr]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Every mount point in this process's mount namespace (octal escapes decoded).
fn mount_points() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mount(field)))
        .collect()
}

fn unescape_mount(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every attached loop device with its backing file, from `losetup --json`.
fn loop_devices() -> Vec<(PathBuf, PathBuf)> {
    let Ok(out) = Command::new("losetup")
        .args(["--list", "--json", "--output", "NAME,BACK-FILE"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return Vec::new();
    };
    let devices = json.get("loopdevices").and_then(|d| d.as_array()).cloned().unwrap_or_default();
    devices
        .iter()
        .filter_map(|d| {
            let name = d.get("name")?.as_str()?;
            let back = d.get("back-file")?.as_str()?;
            let back = back.strip_suffix(" (deleted)").unwrap_or(back);
            Some((PathBuf::from(name), PathBuf::from(back)))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_decode() {
        assert_eq!(unescape_mount(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mount(r"/tmp/x\"), r"/tmp/x\");
        assert_eq!(unescape_mount("/plain"), "/plain");
    }
}
