//! What a restore recreates of what can grant privileges on the node or in the pod that later
//! mounts the volume: device nodes, set-ID bits of root-owned files, and extended attributes
//! of the `security.` and `trusted.` namespaces (file capabilities, security labels).
//!
//! The CLI restores everything a snapshot recorded ([`Fidelity::FULL`]); a node agent restoring
//! a tenant's snapshot into a tenant's volume withholds these unless asked
//! ([`Fidelity::CONFINED`]), and says how many it withheld ([`Withheld`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::format::{Metadata, Xattr};

/// Which privilege-bearing parts of a snapshot a restore recreates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fidelity {
    /// Character and block device nodes (fifos and sockets are always restored).
    pub device_nodes: bool,
    /// Set-user-ID bits of files owned by uid 0 and set-group-ID bits of files owned by
    /// gid 0 (directories keep theirs: on a directory they only pass the group on).
    pub root_setid_bits: bool,
    /// Extended attributes named `security.*` or `trusted.*`.
    pub privileged_xattrs: bool,
}

impl Fidelity {
    /// Everything the snapshot recorded.
    pub const FULL: Self =
        Self { device_nodes: true, root_setid_bits: true, privileged_xattrs: true };
    /// None of the privilege-bearing parts.
    pub const CONFINED: Self =
        Self { device_nodes: false, root_setid_bits: false, privileged_xattrs: false };
}

impl Default for Fidelity {
    fn default() -> Self {
        Self::FULL
    }
}

/// What a restore left out under its [`Fidelity`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Withheld {
    /// Device nodes not created.
    pub device_nodes: u64,
    /// Files restored without their set-user-ID or set-group-ID bit.
    pub setid_files: u64,
    /// Extended attributes not set.
    pub xattrs: u64,
}

impl Withheld {
    /// Whether anything was left out.
    #[must_use]
    pub fn any(&self) -> bool {
        self.device_nodes + self.setid_files + self.xattrs > 0
    }
}

/// A restore's [`Fidelity`] and its running count of what it withheld.
#[derive(Debug, Default)]
pub(crate) struct Policy {
    pub(crate) fidelity: Fidelity,
    device_nodes: AtomicU64,
    setid_files: AtomicU64,
    xattrs: AtomicU64,
}

const SETUID: u32 = 0o4000;
const SETGID: u32 = 0o2000;

impl Policy {
    pub(crate) fn new(fidelity: Fidelity) -> Self {
        Self { fidelity, ..Self::default() }
    }

    /// Whether a device node is created (counts it when not).
    pub(crate) fn creates_device(&self) -> bool {
        if !self.fidelity.device_nodes {
            self.device_nodes.fetch_add(1, Ordering::Relaxed);
        }
        self.fidelity.device_nodes
    }

    /// The permission bits to set on a non-directory with metadata `meta`.
    pub(crate) fn file_mode(&self, meta: &Metadata) -> u32 {
        let mut mode = meta.mode & 0o7777;
        if !self.fidelity.root_setid_bits {
            let mut strip = 0;
            if meta.uid == 0 {
                strip |= mode & SETUID;
            }
            if meta.gid == 0 {
                strip |= mode & SETGID;
            }
            if strip != 0 {
                self.setid_files.fetch_add(1, Ordering::Relaxed);
                mode &= !strip;
            }
        }
        mode
    }

    /// Whether the extended attribute `x` is set (counts it when not).
    pub(crate) fn sets_xattr(&self, x: &Xattr) -> bool {
        let privileged = x.name.starts_with(b"security.") || x.name.starts_with(b"trusted.");
        let sets = self.fidelity.privileged_xattrs || !privileged;
        if !sets {
            self.xattrs.fetch_add(1, Ordering::Relaxed);
        }
        sets
    }

    pub(crate) fn withheld(&self) -> Withheld {
        Withheld {
            device_nodes: self.device_nodes.load(Ordering::Relaxed),
            setid_files: self.setid_files.load(Ordering::Relaxed),
            xattrs: self.xattrs.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Timestamp;

    fn meta(mode: u32, uid: u32, gid: u32) -> Metadata {
        let t = Timestamp { sec: 0, nsec: 0 };
        Metadata { mode, uid, gid, mtime: t, atime: t, ctime: t, xattrs: Vec::new() }
    }

    #[test]
    fn confined_strips_set_id_bits_of_root_only() {
        let p = Policy::new(Fidelity::CONFINED);
        assert_eq!(p.file_mode(&meta(0o4755, 0, 0)), 0o755);
        assert_eq!(p.file_mode(&meta(0o6755, 0, 50)), 0o2755, "setgid of another group stays");
        assert_eq!(p.file_mode(&meta(0o6755, 1000, 0)), 0o4755, "setuid of another user stays");
        assert_eq!(p.file_mode(&meta(0o6755, 1000, 1000)), 0o6755);
        assert_eq!(p.file_mode(&meta(0o1777, 0, 0)), 0o1777, "sticky is no privilege");
        assert_eq!(p.withheld().setid_files, 3);
        let full = Policy::new(Fidelity::FULL);
        assert_eq!(full.file_mode(&meta(0o6755, 0, 0)), 0o6755);
        assert!(!full.withheld().any());
    }

    #[test]
    fn confined_skips_security_and_trusted_xattrs_only() {
        let p = Policy::new(Fidelity::CONFINED);
        let x = |name: &str| Xattr { name: name.as_bytes().to_vec(), value: vec![1] };
        assert!(!p.sets_xattr(&x("security.capability")));
        assert!(!p.sets_xattr(&x("trusted.overlay.opaque")));
        assert!(p.sets_xattr(&x("user.mime_type")));
        assert!(p.sets_xattr(&x("system.posix_acl_access")));
        assert!(!p.creates_device());
        assert_eq!(p.withheld(), Withheld { device_nodes: 1, setid_files: 0, xattrs: 2 });
    }
}
