//! The C allocator's thresholds, set once at start (glibc only).
//!
//! glibc serves blocks above its mmap threshold with their own mappings and gives the top of an
//! arena back to the system once more than its trim threshold is free there. Both thresholds
//! start at 128 KiB and rise to the size of the largest mapped block freed (up to 32 MiB, the
//! trim threshold to twice that), so after the first large buffer is freed every thread's arena
//! keeps up to 64 MiB it no longer uses: a 1 M-file backup held 354 MB from the system for
//! 158 MB in use. Ferry reuses its large buffers (pack buffers, each worker's sealing buffers),
//! so fixed thresholds cost it no speed: blocks of 4 MiB and more are mapped (and unmapped when
//! freed), and an arena gives back its top once 4 MiB of it are free. Measured in
//! `benches/README.md` (the allocator table, last rows). A user's own thresholds
//! (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, or `glibc.malloc.mmap_threshold` and
//! `glibc.malloc.trim_threshold` in `GLIBC_TUNABLES`; glibc reads them itself) are left in force.

/// Blocks at least this large are mapped on their own.
pub const MMAP_THRESHOLD: i32 = 4 << 20;
/// Free memory at the top of an arena beyond this is given back.
pub const TRIM_THRESHOLD: i32 = 4 << 20;

/// Whether Ferry sets the thresholds, given the environment: not when the user set either of
/// glibc's own.
pub fn wanted<I, K, V>(vars: I) -> bool
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    !vars.into_iter().any(|(name, value)| {
        let name = name.as_ref();
        let tunables = || {
            let value = value.as_ref().to_string_lossy();
            ["glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold"]
                .iter()
                .any(|tunable| value.contains(tunable))
        };
        name == "MALLOC_MMAP_THRESHOLD_"
            || name == "MALLOC_TRIM_THRESHOLD_"
            || (name == "GLIBC_TUNABLES" && tunables())
    })
}

/// Sets the thresholds, unless the user set glibc's own. Call before any thread starts.
pub fn tune() {
    if wanted(std::env::vars_os()) {
        set();
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(unsafe_code, reason = "mallopt(3) is a C call on two integers")]
fn set() {
    // SAFETY: mallopt takes two integers and touches only the allocator's parameters, under
    // the allocator's own lock; no Rust invariant depends on them.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_own_threshold_is_left_in_force() {
        assert!(wanted([("PATH", "/bin"), ("HOME", "/root"), ("MALLOC_ARENA_MAX", "2")]));
        assert!(!wanted([("PATH", "/bin"), ("MALLOC_TRIM_THRESHOLD_", "1048576")]));
        assert!(!wanted([("MALLOC_MMAP_THRESHOLD_", "1048576")]));
        assert!(!wanted([(
            "GLIBC_TUNABLES",
            "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=9"
        )]));
        assert!(wanted([("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")]));
        assert!(wanted(Vec::<(String, String)>::new()));
    }
}
