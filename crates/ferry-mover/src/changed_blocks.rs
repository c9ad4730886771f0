//! Which ranges a block backup reads: asked of the CSI driver's SnapshotMetadata service
//! (changed-block tracking) when it has one, else the whole device. The chain is delta (the
//! ranges changed since the parent's physical snapshot, kept for this) → allocated (the
//! snapshot's allocated ranges) → the whole device (Ferry's own hole and zero detection); the
//! path taken and the reason for every fallback are reported with the outcome.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ferry_agent::{BlockReads, CsiSnapshot};
use ferry_cbt::{BlockMap, CbtError, Connection, Retry, Service, ServiceAccount, Tokens};
use ferry_repo::ReadPlan;
use tokio_util::sync::CancellationToken;

/// How the agent asks for changed blocks: the API client it reads the service's object with
/// and the service account (bound to the agent's pod) whose tokens it presents.
#[derive(Clone)]
pub struct ChangedBlocks {
    client: kube::Client,
    account: ServiceAccount,
    pod: Option<(String, Option<String>)>,
    retry: Retry,
}

impl std::fmt::Debug for ChangedBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangedBlocks")
            .field("account", &self.account)
            .field("pod", &self.pod)
            .finish_non_exhaustive()
    }
}

/// What the parent of a block backup offers as the base of a delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Base<'a> {
    /// No parent: a first backup.
    None,
    /// A parent whose physical snapshot was not kept.
    NotKept,
    /// A parent whose physical snapshot, with this CSI handle, was kept for the next delta.
    Kept(&'a str),
    /// A parent whose kept snapshot is of another volume (or of one not recorded): the PVC
    /// was made again under the same name.
    OtherVolume,
}

impl Base<'_> {
    /// Why there is no delta to ask for, when that is worth telling (no fallback: nothing
    /// failed).
    fn remark(self) -> Option<&'static str> {
        match self {
            Self::NotKept => Some(
                "no delta: the previous backup's snapshot was not kept (the agent's \
                 --keep-base-snapshot, or the PVC's ferry.io/keep-base-snapshot annotation)",
            ),
            Self::OtherVolume => Some(
                "no delta: the previous backup's kept snapshot is of another volume (the PVC \
                 was made again), or its volume was not recorded",
            ),
            Self::None | Self::Kept(_) => None,
        }
    }
}

impl ChangedBlocks {
    /// Changed-block tracking with tokens of `account`, requested with `client` (which needs
    /// `create` on that account's `serviceaccounts/token` and `get` on
    /// `snapshotmetadataservices`).
    #[must_use]
    pub fn new(client: kube::Client, account: ServiceAccount) -> Self {
        Self { client, account, pod: None, retry: Retry::default() }
    }

    /// Binds every token to the pod `name` (with `uid`) in the account's namespace: the
    /// agent's own.
    #[must_use]
    pub fn bound_to_pod(mut self, name: &str, uid: Option<&str>) -> Self {
        self.pod = Some((name.to_owned(), uid.map(str::to_owned)));
        self
    }

    /// A connection to the SnapshotMetadata service of `driver`.
    async fn connect(&self, driver: &str) -> Result<Connection, CbtError> {
        let service = Service::discover(self.client.clone(), driver).await?;
        let mut tokens = Tokens::new(self.client.clone(), self.account.clone(), &service.audience);
        if let Some((name, uid)) = &self.pod {
            tokens = tokens.bound_to_pod(name, uid.as_deref());
        }
        let channel = service.connect().await?;
        Ok(Connection::new(channel, tokens, self.retry))
    }

    /// The plan for a backup of the volume exposed from `snapshot` (`None` when the exposer
    /// did not say), whose parent offers `base`.
    ///
    /// # Errors
    /// Only cancellation: every other failure is a fallback, down to reading the whole volume.
    pub(crate) async fn plan(
        &self,
        snapshot: Option<&CsiSnapshot>,
        base: Base<'_>,
        cancel: &CancellationToken,
    ) -> Result<Planned, Cancelled> {
        let mut planned = self.plan_after(snapshot, base, Vec::new(), cancel).await?;
        planned.remarks.extend(base.remark().map(str::to_owned));
        Ok(planned)
    }

    /// The next plan after the repository refused `planned`'s ranges (`reason`) before
    /// reading anything: a refused delta is followed by the allocated ranges, anything else
    /// by the whole device.
    ///
    /// # Errors
    /// Only cancellation.
    pub(crate) async fn after_refusal(
        &self,
        snapshot: Option<&CsiSnapshot>,
        planned: &Planned,
        refusal: Refusal<'_>,
        cancel: &CancellationToken,
    ) -> Result<Planned, Cancelled> {
        if !planned.is_delta() {
            return Ok(planned.refused(refusal));
        }
        tracing::warn!(
            reason = refusal.reason(),
            "the changed-block delta was refused; asking for the allocated ranges"
        );
        let mut next =
            self.plan_after(snapshot, Base::None, planned.refusals(refusal), cancel).await?;
        next.remarks.clone_from(&planned.remarks);
        Ok(next)
    }

    async fn plan_after(
        &self,
        snapshot: Option<&CsiSnapshot>,
        base: Base<'_>,
        mut fallbacks: Vec<(&'static str, String)>,
        cancel: &CancellationToken,
    ) -> Result<Planned, Cancelled> {
        let Some(snapshot) = snapshot else {
            return Ok(Planned::whole(
                "no-snapshot",
                "the exposer did not say which CSI snapshot the volume was made from".into(),
            ));
        };
        let connection = match self.connect(&snapshot.driver).await {
            Ok(c) => c,
            Err(e) => {
                return fallen(snapshot, "connecting", &e, fallbacks).map(Planned::whole_after);
            }
        };
        if let Base::Kept(handle) = base {
            let asked = Instant::now();
            match connection.delta(&snapshot.namespace, handle, &snapshot.name, cancel).await {
                Ok(map) => {
                    let took = asked.elapsed();
                    return Ok(Planned::ranges(snapshot, map, took, Path::Delta, fallbacks));
                }
                Err(e) => fallbacks = fallen(snapshot, "delta", &e, fallbacks)?,
            }
        }
        let asked = Instant::now();
        match connection.allocated(&snapshot.namespace, &snapshot.name, cancel).await {
            Ok(map) => {
                Ok(Planned::ranges(snapshot, map, asked.elapsed(), Path::Allocated, fallbacks))
            }
            Err(e) => fallen(snapshot, "allocated", &e, fallbacks).map(Planned::whole_after),
        }
    }
}

/// How long asking took (the token, the stream and its retries), in words: `850 ms`, `11.0 s`.
fn seconds(took: Duration) -> String {
    if took < Duration::from_secs(1) {
        format!("{} ms", took.as_millis())
    } else {
        format!("{:.1} s", took.as_secs_f64())
    }
}

/// `fallbacks` with the failure `e` of step `step` added (logged), or the cancellation.
fn fallen(
    snapshot: &CsiSnapshot,
    step: &str,
    e: &CbtError,
    mut fallbacks: Vec<(&'static str, String)>,
) -> Result<Vec<(&'static str, String)>, Cancelled> {
    let reason = e.reason().ok_or(Cancelled)?;
    tracing::info!(
        snapshot = %format!("{}/{}", snapshot.namespace, snapshot.name),
        driver = %snapshot.driver,
        step,
        reason = reason.as_str(),
        error = %e,
        "changed-block tracking fell back"
    );
    let what = match step {
        "delta" => "no delta from the parent's snapshot",
        "allocated" => "no allocated ranges",
        _ => "no changed-block tracking",
    };
    fallbacks.push((reason.as_str(), format!("{what}: {e}")));
    Ok(fallbacks)
}

/// Why the repository refused a plan before saving anything.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal<'a> {
    /// The ranges do not fit the volume, or the data showed them incomplete.
    Ranges(&'a str),
    /// The parent snapshot cannot lend its chunks (a delta only).
    Parent(&'a str),
}

impl<'a> Refusal<'a> {
    const fn reason(self) -> &'a str {
        match self {
            Self::Ranges(r) | Self::Parent(r) => r,
        }
    }
}

/// The backup was cancelled while the plan was asked for.
#[derive(Debug)]
pub(crate) struct Cancelled;

/// The path a block backup took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// The ranges changed since the parent's snapshot; the rest from the parent.
    Delta,
    /// The snapshot's allocated ranges.
    Allocated,
    /// The whole device.
    Full,
}

impl Path {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Delta => "delta",
            Self::Allocated => "allocated",
            Self::Full => "full",
        }
    }
}

/// What a block backup will read, and how it came to that.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    /// The ranges to read.
    pub read_plan: ReadPlan,
    /// The volume size the ranges describe.
    pub plan_size: Option<u64>,
    path: Path,
    /// The driver, the bytes its ranges cover and how long it took to answer (changed-block
    /// tracking used).
    ranges: Option<(String, u64, Duration)>,
    /// Every fallback on the way, in order: the metric's label and the full reason.
    fallbacks: Vec<(&'static str, String)>,
    /// What else the report tells (why no delta was asked for), no fallback.
    remarks: Vec<String>,
}

impl Planned {
    /// The whole device, changed-block tracking being switched off.
    pub(crate) fn off() -> Self {
        Self::whole(
            "off",
            "changed-block tracking is off for this agent (--changed-blocks off, or no POD_NAME \
             to take its service account from)"
                .into(),
        )
    }

    fn whole(label: &'static str, reason: String) -> Self {
        Self::whole_after(vec![(label, reason)])
    }

    fn whole_after(fallbacks: Vec<(&'static str, String)>) -> Self {
        Self {
            read_plan: ReadPlan::Everything,
            plan_size: None,
            path: Path::Full,
            ranges: None,
            fallbacks,
            remarks: Vec::new(),
        }
    }

    /// A plan by the service's answer: its ranges, given in `took` all told.
    fn ranges(
        snapshot: &CsiSnapshot,
        map: BlockMap,
        took: Duration,
        path: Path,
        fallbacks: Vec<(&'static str, String)>,
    ) -> Self {
        let bytes = map.bytes();
        tracing::info!(
            snapshot = %format!("{}/{}", snapshot.namespace, snapshot.name),
            driver = %snapshot.driver,
            path = path.as_str(),
            ranges = map.ranges.len(),
            bytes,
            seconds = took.as_secs_f64(),
            "the changed-block tracking service answered"
        );
        let ranges = map.ranges.iter().map(|r| (r.offset, r.len)).collect();
        Self {
            read_plan: match path {
                Path::Delta => ReadPlan::ChangedSinceParent(ranges),
                _ => ReadPlan::Only(ranges),
            },
            plan_size: map.capacity,
            path,
            ranges: Some((snapshot.driver.clone(), bytes, took)),
            fallbacks,
            remarks: Vec::new(),
        }
    }

    /// Whether the plan reads by the service's ranges.
    pub(crate) fn by_ranges(&self) -> bool {
        self.read_plan != ReadPlan::Everything
    }

    /// Whether the plan takes unchanged chunks from the parent.
    pub(crate) const fn is_delta(&self) -> bool {
        matches!(self.path, Path::Delta)
    }

    /// The whole device after all: the repository refused the ranges (`reason`) before
    /// reading anything.
    pub(crate) fn refused(&self, refusal: Refusal<'_>) -> Self {
        tracing::warn!(
            reason = refusal.reason(),
            path = self.path.as_str(),
            "the changed-block plan was refused; reading the whole volume"
        );
        let mut next = Self::whole_after(self.refusals(refusal));
        next.remarks.clone_from(&self.remarks);
        next
    }

    /// The fallbacks so far and the repository's refusal of this plan.
    fn refusals(&self, refusal: Refusal<'_>) -> Vec<(&'static str, String)> {
        let mut fallbacks = self.fallbacks.clone();
        fallbacks.push(match refusal {
            Refusal::Ranges(reason) => (
                "untrusted",
                format!("the service's {} ranges were refused: {reason}", self.path.as_str()),
            ),
            Refusal::Parent(reason) => {
                ("parent-unusable", format!("the parent snapshot cannot lend its chunks: {reason}"))
            }
        });
        fallbacks
    }

    /// What a backup that read `bytes_read` of a `size`-byte volume did, in words, for the
    /// outcome.
    pub(crate) fn report(&self, bytes_read: u64, size: u64) -> BlockReads {
        let mut note = format!("read {bytes_read} bytes of a {size}-byte block volume: ");
        let _ = match (&self.ranges, self.path) {
            (Some((driver, bytes, took)), Path::Delta) => write!(
                note,
                "the ranges changed since the parent's snapshot ({bytes} bytes), from the \
                 changed-block tracking of CSI driver {driver} (answered in {}); the rest taken \
                 from the parent",
                seconds(*took)
            ),
            (Some((driver, bytes, took)), _) => write!(
                note,
                "the snapshot's allocated ranges ({bytes} bytes), from the changed-block \
                 tracking of CSI driver {driver} (answered in {})",
                seconds(*took)
            ),
            (None, _) => write!(note, "the whole device (holes and zeros found by Ferry)"),
        };
        for reason in self.remarks.iter().chain(self.fallbacks.iter().map(|(_, r)| r)) {
            let _ = write!(note, "; {reason}");
        }
        BlockReads { path: self.path.as_str(), fallback: self.fallbacks.last().map(|f| f.0), note }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ferry_cbt::{BlockType, Range};

    fn snapshot() -> CsiSnapshot {
        CsiSnapshot {
            namespace: "velero".into(),
            name: "du-1".into(),
            driver: "hostpath.csi.k8s.io".into(),
            handle: "h-1".into(),
            kept: false,
            source_volume: None,
        }
    }

    #[test]
    fn allocated_ranges_become_the_plan_and_the_report_says_so() {
        let map = BlockMap {
            capacity: Some(64 << 20),
            block_type: Some(BlockType::FixedLength),
            ranges: vec![Range { offset: 0, len: 4096 }, Range { offset: 1 << 20, len: 8192 }],
        };
        let took = Duration::from_millis(850);
        let planned = Planned::ranges(&snapshot(), map, took, Path::Allocated, Vec::new());
        assert_eq!(planned.read_plan, ReadPlan::Only(vec![(0, 4096), (1 << 20, 8192)]));
        assert_eq!(planned.plan_size, Some(64 << 20));
        assert!(planned.by_ranges());
        let reads = planned.report(1 << 20, 64 << 20);
        assert_eq!((reads.path, reads.fallback), ("allocated", None));
        assert!(reads.note.contains("allocated ranges (12288 bytes)"), "{}", reads.note);
        assert!(reads.note.contains("hostpath.csi.k8s.io (answered in 850 ms)"), "{}", reads.note);
    }

    #[test]
    fn a_fallback_reads_everything_and_says_why() {
        let planned = Planned::off();
        assert!(!planned.by_ranges());
        let reads = planned.report(64 << 20, 64 << 20);
        assert_eq!((reads.path, reads.fallback), ("full", Some("off")));
        assert!(reads.note.contains("is off for this agent"), "{}", reads.note);

        let map = BlockMap { capacity: None, block_type: None, ranges: Vec::new() };
        let refused =
            Planned::ranges(&snapshot(), map, Duration::ZERO, Path::Allocated, Vec::new())
                .refused(Refusal::Ranges("too small"));
        assert_eq!(refused.read_plan, ReadPlan::Everything);
        let reads = refused.report(64 << 20, 64 << 20);
        assert_eq!((reads.path, reads.fallback), ("full", Some("untrusted")));
        assert!(reads.note.contains("too small"), "{}", reads.note);
    }

    #[test]
    fn a_delta_takes_the_rest_from_the_parent_and_a_fallback_says_every_reason() {
        let map = BlockMap {
            capacity: Some(64 << 20),
            block_type: Some(BlockType::FixedLength),
            ranges: vec![Range { offset: 8192, len: 4096 }],
        };
        let took = Duration::from_secs(3);
        let delta = Planned::ranges(&snapshot(), map.clone(), took, Path::Delta, Vec::new());
        assert_eq!(delta.read_plan, ReadPlan::ChangedSinceParent(vec![(8192, 4096)]));
        assert!(delta.is_delta() && delta.by_ranges());
        let reads = delta.report(4096, 64 << 20);
        assert_eq!((reads.path, reads.fallback), ("delta", None));
        assert!(
            reads.note.contains("changed since the parent's snapshot (4096 bytes)")
                && reads.note.contains("(answered in 3.0 s); the rest taken from the parent"),
            "{}",
            reads.note
        );

        // The base was gone: allocated ranges, saying why not the delta.
        let gone =
            vec![("snapshot-not-found", "no delta from the parent's snapshot: gone".to_owned())];
        let allocated = Planned::ranges(&snapshot(), map, Duration::ZERO, Path::Allocated, gone);
        assert!(!allocated.is_delta());
        let reads = allocated.report(4096, 64 << 20);
        assert_eq!((reads.path, reads.fallback), ("allocated", Some("snapshot-not-found")));
        assert!(
            reads.note.ends_with("no delta from the parent's snapshot: gone"),
            "{}",
            reads.note
        );

        // Then the ranges were refused as well: the last reason labels the metric, both are told.
        let reads = allocated.refused(Refusal::Ranges("too small")).report(64 << 20, 64 << 20);
        assert_eq!((reads.path, reads.fallback), ("full", Some("untrusted")));
        assert!(reads.note.contains("gone") && reads.note.contains("too small"), "{}", reads.note);
    }
}
