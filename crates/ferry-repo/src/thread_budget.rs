//! How many worker threads a backup or restore starts when the caller leaves it to us: one per
//! CPU plus one, but no more than the process's memory limit allows.
//!
//! CPUs come from [`std::thread::available_parallelism`], which on Linux already counts only
//! the CPUs of the process's affinity mask (so a cpuset) and caps them by a cgroup v1 or v2 CPU
//! quota (`cpu.max`, `cpu.cfs_quota_us`), and reads them afresh on every call. Nothing in std
//! looks at memory, so a node agent of 96 CPUs under a 2 GiB limit would start 97 workers that
//! each hold their buffers. The memory limit is the smallest `memory.max` (cgroup v2) or
//! `memory.limit_in_bytes` (cgroup v1) from the process's cgroup, as `/proc/self/cgroup` names
//! it, up to the root of the mounted hierarchy; no file or `max` means no limit.
//!
//! The budget gives the workers [`MEMORY_SHARE_DIVISOR`]⁻¹ of the limit less [`MEMORY_BASE`],
//! at [`MEMORY_PER_THREAD`] each; the rest is for what the plan does not model (the index of a
//! large repository, page cache that counts against the cgroup, the allocator's slack, other
//! work in the same process). The figures are measured by the `threads_memory` example
//! (`benches/results/2026-11-26-threads-memory.md`).
//!
//! Nothing here logs: [`default_threads`] returns the decision and why, for the caller to log.

use std::fmt;
use std::path::{Path, PathBuf};

/// Memory one data-path worker thread may hold at once. Measured (slope of peak RSS over 1–8
/// threads): up to 22.7 MiB a thread, for a file-tree backup of 16–32 MiB files into a store
/// slower than the workers; rounded up to cover what a backup worker can hold together: an
/// 8 MiB read buffer, a chunk of up to 4 MiB compressed and sealed in its two kept buffers,
/// zstd's context and a full 16 MiB pack it waits to hand to the uploader.
pub const MEMORY_PER_THREAD: u64 = 32 << 20;

/// Memory of a data path that does not grow with its threads (runtime, index, packs being
/// uploaded). Measured: intercepts up to 128 MiB and one-thread peaks up to 137 MiB (volume
/// backup into the slow store), rounded up; a repository's index adds to it as it grows. The
/// second open data pack (blobs are placed at random between two since these measurements)
/// adds up to one pack target, 16 MiB by default: within the 23 MiB the rounding left. A
/// restore holds no open pack but keeps up to 32 MiB of opened frames for its batches
/// (`restore::frames::KEEP_BYTES`) in its place.
pub const MEMORY_BASE: u64 = 160 << 20;

/// The workers are planned within `1 / MEMORY_SHARE_DIVISOR` of the memory limit.
pub const MEMORY_SHARE_DIVISOR: u64 = 2;

/// A value of `memory.limit_in_bytes` at or above this means no limit (cgroup v1 writes
/// `LONG_MAX` rounded down to a page).
const V1_UNLIMITED: u64 = 1 << 60;

/// Where the process's cgroups are listed.
const PROC_SELF_CGROUP: &str = "/proc/self/cgroup";

/// Where the cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A memory limit and the file it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    /// The limit in bytes.
    pub bytes: u64,
    /// The `memory.max` or `memory.limit_in_bytes` file that set it.
    pub file: PathBuf,
}

/// What bounded the thread count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitedBy {
    /// The CPUs: one thread per CPU plus one.
    Cpu,
    /// The memory limit.
    Memory,
}

/// The default number of worker threads, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadBudget {
    /// Worker threads to start (at least 1).
    pub threads: usize,
    /// CPUs available to the process ([`std::thread::available_parallelism`]).
    pub cpus: usize,
    /// The process's memory limit, if it has one.
    pub memory_limit: Option<MemoryLimit>,
    /// Most threads the memory limit allows (`None`: no limit).
    pub memory_threads: Option<usize>,
    /// Whichever of CPUs and memory gave the smaller count.
    pub limited_by: LimitedBy,
}

impl ThreadBudget {
    /// The budget for `cpus` CPUs under `memory_limit`: `cpus + 1` threads, at most
    /// `(limit / MEMORY_SHARE_DIVISOR - MEMORY_BASE) / MEMORY_PER_THREAD`, at least 1.
    #[must_use]
    pub fn plan(cpus: usize, memory_limit: Option<MemoryLimit>) -> Self {
        let cpus = cpus.max(1);
        let by_cpu = cpus.saturating_add(1);
        let memory_threads = memory_limit.as_ref().map(|m| threads_within(m.bytes));
        let (threads, limited_by) = match memory_threads {
            Some(m) if m < by_cpu => (m, LimitedBy::Memory),
            _ => (by_cpu, LimitedBy::Cpu),
        };
        Self { threads, cpus, memory_limit, memory_threads, limited_by }
    }
}

impl ThreadBudget {
    /// Threads for each of `jobs` data movements running at once in this process (an agent's
    /// concurrency): the memory share is divided among them, each with its own
    /// [`MEMORY_BASE`] (its uploads in flight, its repository's index) and its workers'
    /// buffers; the CPU allowance is not (a job waiting on the network leaves its CPUs to the
    /// others). At least 1; `per_job(1)` is [`Self::threads`].
    #[must_use]
    pub fn per_job(&self, jobs: usize) -> usize {
        let by_cpu = self.cpus.max(1).saturating_add(1);
        let Some(limit) = &self.memory_limit else { return by_cpu };
        let jobs = u64::try_from(jobs.max(1)).unwrap_or(u64::MAX);
        let usable =
            (limit.bytes / MEMORY_SHARE_DIVISOR).saturating_sub(MEMORY_BASE.saturating_mul(jobs));
        let each = usize::try_from(usable / MEMORY_PER_THREAD / jobs).unwrap_or(usize::MAX);
        by_cpu.min(each).max(1)
    }
}

impl ThreadBudget {
    /// Most data movements that fit at once in the memory share, each with its
    /// [`MEMORY_BASE`] and one worker's buffers (`None`: no memory limit). At least 1: one
    /// movement always runs, under any limit.
    #[must_use]
    pub fn max_jobs(&self) -> Option<usize> {
        let limit = self.memory_limit.as_ref()?;
        let each = MEMORY_BASE + MEMORY_PER_THREAD;
        Some(
            usize::try_from(limit.bytes / MEMORY_SHARE_DIVISOR / each).unwrap_or(usize::MAX).max(1),
        )
    }
}

impl fmt::Display for ThreadBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let by_cpu = self.cpus.saturating_add(1);
        write!(f, "{} worker threads: {} CPUs allow {by_cpu}", self.threads, self.cpus)?;
        match (&self.memory_limit, self.memory_threads) {
            (Some(limit), Some(n)) => write!(
                f,
                ", the memory limit of {} MiB ({}) allows {n} (1/{MEMORY_SHARE_DIVISOR} of it \
                 less {} MiB, at {} MiB a thread)",
                limit.bytes >> 20,
                limit.file.display(),
                MEMORY_BASE >> 20,
                MEMORY_PER_THREAD >> 20,
            ),
            _ => write!(f, ", no memory limit"),
        }
    }
}

/// Threads whose memory fits in the share of `limit`, at least 1.
fn threads_within(limit: u64) -> usize {
    let usable = (limit / MEMORY_SHARE_DIVISOR).saturating_sub(MEMORY_BASE);
    usize::try_from(usable / MEMORY_PER_THREAD).unwrap_or(usize::MAX).max(1)
}

/// The default worker-thread count of this process now: CPUs and memory limit are read afresh
/// on every call (a pod's limits can be resized in place).
#[must_use]
pub fn default_threads() -> ThreadBudget {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    ThreadBudget::plan(cpus, process_memory_limit())
}

/// This process's memory limit now (see the module's documentation), if it has one.
#[must_use]
pub fn process_memory_limit() -> Option<MemoryLimit> {
    let cgroups = std::fs::read_to_string(PROC_SELF_CGROUP).unwrap_or_default();
    memory_limit(&cgroups, Path::new(CGROUP_ROOT))
}

/// `requested`, or [`default_threads`] when it is 0.
pub(crate) fn threads_or_default(requested: usize) -> usize {
    if requested == 0 { default_threads().threads } else { requested }
}

/// The smallest memory limit over the cgroups listed in `cgroups` (the text of
/// `/proc/<pid>/cgroup`) and their ancestors, with the hierarchies mounted under `root`: cgroup
/// v2 (`0::<path>`) at `root`, the v1 memory controller (`<n>:…memory…:<path>`) at
/// `root/memory`. Ancestors are read too, since a limit on any of them applies; a directory
/// that does not exist is skipped (without a cgroup namespace a container sees its own cgroup
/// at the mount's root, under the host's path).
fn memory_limit(cgroups: &str, root: &Path) -> Option<MemoryLimit> {
    let mut smallest: Option<MemoryLimit> = None;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let found = if id == "0" && controllers.is_empty() {
            smallest_in(root, path, "memory.max", parse_v2)
        } else if controllers.split(',').any(|c| c == "memory") {
            smallest_in(&root.join("memory"), path, "memory.limit_in_bytes", parse_v1)
        } else {
            None
        };
        if let Some(found) = found
            && smallest.as_ref().is_none_or(|s| found.bytes < s.bytes)
        {
            smallest = Some(found);
        }
    }
    smallest
}

/// The smallest limit in `file` of the cgroup at `path` below `mount` and of its ancestors up
/// to `mount`. A path leaving the mount (`..`: the cgroup lies outside this namespace's view)
/// has none that can be read.
fn smallest_in(
    mount: &Path,
    path: &str,
    file: &str,
    parse: fn(&str) -> Option<u64>,
) -> Option<MemoryLimit> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return None;
    }
    let mut smallest: Option<MemoryLimit> = None;
    for depth in 0..=parts.len() {
        let mut candidate = mount.to_path_buf();
        candidate.extend(&parts[..depth]);
        candidate.push(file);
        let Some(bytes) = std::fs::read_to_string(&candidate).ok().as_deref().and_then(parse)
        else {
            continue;
        };
        if smallest.as_ref().is_none_or(|s| bytes < s.bytes) {
            smallest = Some(MemoryLimit { bytes, file: candidate });
        }
    }
    smallest
}

/// `memory.max`: bytes, or `max` for none.
fn parse_v2(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `memory.limit_in_bytes`: bytes, a huge value for none.
fn parse_v1(text: &str) -> Option<u64> {
    text.trim().parse().ok().filter(|b| *b < V1_UNLIMITED)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// Writes `content` to `root/rel`, creating the directories.
    fn put(root: &Path, rel: &str, content: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("a file has a parent"))
            .expect("create cgroup directories");
        std::fs::write(&path, content).expect("write cgroup file");
    }

    fn limit(bytes: u64) -> Option<MemoryLimit> {
        Some(MemoryLimit { bytes, file: PathBuf::from("memory.max") })
    }

    #[test]
    fn ninety_six_cpus_under_two_gib_get_twenty_seven_threads() {
        // (1024 MiB - 160 MiB) / 32 MiB = 27.
        let budget = ThreadBudget::plan(96, limit(2 * GIB));
        assert_eq!(budget.threads, 27);
        assert_eq!(budget.memory_threads, Some(27));
        assert_eq!(budget.limited_by, LimitedBy::Memory);
    }

    #[test]
    fn no_memory_limit_gives_cpus_plus_one() {
        let budget = ThreadBudget::plan(96, None);
        assert_eq!(budget.threads, 97);
        assert_eq!(budget.memory_threads, None);
        assert_eq!(budget.limited_by, LimitedBy::Cpu);
    }

    #[test]
    fn few_cpus_under_a_large_limit_are_bounded_by_the_cpus() {
        let budget = ThreadBudget::plan(2, limit(2 * GIB));
        assert_eq!(budget.threads, 3);
        assert_eq!(budget.limited_by, LimitedBy::Cpu);
        assert_eq!(ThreadBudget::plan(0, None).threads, 2, "no CPU count still means one");
    }

    #[test]
    fn concurrent_jobs_share_the_memory_allowance_not_the_cpus() {
        // 2 GiB: a 1024 MiB share; 8 CPUs: 9 threads by CPU.
        let budget = ThreadBudget::plan(8, limit(2 * GIB));
        assert_eq!(budget.per_job(1), budget.threads, "one job: the plan itself");
        assert_eq!(budget.per_job(1), 9, "one job: (1024 - 160) / 32 = 27, the CPUs bound it");
        assert_eq!(budget.per_job(0), 9, "no concurrency counts as one");
        assert_eq!(budget.per_job(3), 5, "(1024 - 3 x 160) / 32 = 17, 5 each");
        assert_eq!(budget.per_job(4), 3, "(1024 - 4 x 160) / 32 = 12, 3 each");
        assert_eq!(budget.per_job(100), 1, "never none");
        assert_eq!(budget.max_jobs(), Some(5), "1024 / (160 + 32) = 5 movements at once");
        assert_eq!(ThreadBudget::plan(8, None).max_jobs(), None, "no limit");
        let tiny = ThreadBudget::plan(8, Some(MemoryLimit { bytes: 64 << 20, file: "m".into() }));
        assert_eq!(tiny.max_jobs(), Some(1), "one always runs");
        assert_eq!(ThreadBudget::plan(8, None).per_job(4), 9, "no limit: the CPUs");
        let small = ThreadBudget::plan(96, limit(GIB));
        assert_eq!(small.per_job(1), small.threads, "memory-bound plan: (512 - 160) / 32 = 11");
    }

    #[test]
    fn a_tiny_limit_gives_one_thread() {
        for bytes in [0, 64 * MIB, 2 * MEMORY_BASE, 2 * (MEMORY_BASE + MEMORY_PER_THREAD) - 1] {
            let budget = ThreadBudget::plan(96, limit(bytes));
            assert_eq!(budget.threads, 1, "{bytes} bytes");
            assert_eq!(budget.limited_by, LimitedBy::Memory);
        }
    }

    #[test]
    fn the_memory_bound_is_the_share_less_the_base_by_the_thread() {
        assert_eq!(threads_within(2 * (MEMORY_BASE + 3 * MEMORY_PER_THREAD)), 3);
        assert_eq!(threads_within(GIB), 11);
        assert_eq!(threads_within(4 * GIB), 59);
    }

    #[test]
    fn cgroup_v2_limit_of_the_process_cgroup() {
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "kubepods/pod1/ctr/memory.max", "2147483648\n");
        let found = memory_limit("0::/kubepods/pod1/ctr\n", root.path()).expect("a limit");
        assert_eq!(found.bytes, 2 * GIB);
        assert_eq!(found.file, root.path().join("kubepods/pod1/ctr/memory.max"));
        assert_eq!(ThreadBudget::plan(96, Some(found)).threads, 27);
    }

    #[test]
    fn cgroup_v2_max_or_missing_is_no_limit() {
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "ctr/memory.max", "max\n");
        assert_eq!(memory_limit("0::/ctr\n", root.path()), None);
        assert_eq!(memory_limit("0::/elsewhere\n", root.path()), None);
        assert_eq!(memory_limit("", root.path()), None);
        let budget = ThreadBudget::plan(8, memory_limit("0::/ctr\n", root.path()));
        assert_eq!(budget.threads, 9);
    }

    #[test]
    fn the_smallest_limit_on_the_way_to_the_root_applies() {
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "kubepods/memory.max", "8589934592\n");
        put(root.path(), "kubepods/pod1/memory.max", "1073741824\n");
        put(root.path(), "kubepods/pod1/ctr/memory.max", "max\n");
        let found = memory_limit("0::/kubepods/pod1/ctr\n", root.path()).expect("a limit");
        assert_eq!(found.bytes, GIB);
        assert_eq!(found.file, root.path().join("kubepods/pod1/memory.max"));
    }

    #[test]
    fn a_namespaced_container_reads_the_mount_root() {
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "memory.max", "536870912\n");
        let found = memory_limit("0::/\n", root.path()).expect("a limit");
        assert_eq!(found.bytes, 512 * MIB);
    }

    #[test]
    fn a_path_outside_the_namespace_reads_nothing() {
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "memory.max", "536870912\n");
        assert_eq!(memory_limit("0::/../other\n", root.path()), None);
    }

    #[test]
    fn unreadable_values_are_ignored() {
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "ctr/memory.max", "lots\n");
        put(root.path(), "memory.max", "-1\n");
        assert_eq!(memory_limit("0::/ctr\n", root.path()), None);
        assert_eq!(memory_limit("garbage\n0:x\n", root.path()), None);
    }

    #[test]
    fn cgroup_v1_memory_controller() {
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "memory/kubepods/ctr/memory.limit_in_bytes", "1073741824\n");
        let cgroups = "5:cpu,cpuacct:/kubepods/ctr\n4:memory:/kubepods/ctr\n0::/\n";
        let found = memory_limit(cgroups, root.path()).expect("a limit");
        assert_eq!(found.bytes, GIB);
        assert_eq!(found.file, root.path().join("memory/kubepods/ctr/memory.limit_in_bytes"));
    }

    #[test]
    fn cgroup_v1_unlimited_is_no_limit() {
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "memory/memory.limit_in_bytes", "9223372036854771712\n");
        put(root.path(), "memory/job/memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(memory_limit("4:memory:/job\n0::/\n", root.path()), None);
    }

    #[test]
    fn cgroup_v1_container_without_namespace_reads_its_mount_root() {
        // The container sees the host's path, but its own cgroup mounted at the root.
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "memory/memory.limit_in_bytes", "2147483648\n");
        let found =
            memory_limit("4:memory:/kubepods/burstable/pod1/abc\n", root.path()).expect("a limit");
        assert_eq!(found.bytes, 2 * GIB);
    }

    #[test]
    fn both_hierarchies_give_the_smaller_limit() {
        let root = tempfile::tempdir().expect("temp dir");
        put(root.path(), "ctr/memory.max", "3221225472\n");
        put(root.path(), "memory/ctr/memory.limit_in_bytes", "2147483648\n");
        let found = memory_limit("4:memory:/ctr\n0::/ctr\n", root.path()).expect("a limit");
        assert_eq!(found.bytes, 2 * GIB);
    }

    #[test]
    fn the_decision_reads_as_a_sentence() {
        let budget = ThreadBudget::plan(
            96,
            Some(MemoryLimit { bytes: 2 * GIB, file: PathBuf::from("/sys/fs/cgroup/memory.max") }),
        );
        assert_eq!(
            budget.to_string(),
            "27 worker threads: 96 CPUs allow 97, the memory limit of 2048 MiB \
             (/sys/fs/cgroup/memory.max) allows 27 (1/2 of it less 160 MiB, at 32 MiB a thread)"
        );
        assert_eq!(
            ThreadBudget::plan(4, None).to_string(),
            "5 worker threads: 4 CPUs allow 5, no memory limit"
        );
    }

    #[test]
    fn this_host_gets_at_least_one_thread() {
        let budget = default_threads();
        assert!(budget.threads >= 1);
        assert!(budget.threads <= budget.cpus + 1);
        assert_eq!(threads_or_default(3), 3);
        assert!(threads_or_default(0) >= 1);
    }
}
