//! Which ranges a block backup reads: asked of the CSI driver's SnapshotMetadata service
//! (changed-block tracking) when it has one, else the whole device; the path taken and the
//! reason for a fallback are reported with the outcome.

use std::fmt::Write as _;

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

    /// The allocated ranges of `snapshot`, or why they cannot be had.
    async fn allocated(
        &self,
        snapshot: &CsiSnapshot,
        cancel: &CancellationToken,
    ) -> Result<BlockMap, CbtError> {
        let service = Service::discover(self.client.clone(), &snapshot.driver).await?;
        let mut tokens = Tokens::new(self.client.clone(), self.account.clone(), &service.audience);
        if let Some((name, uid)) = &self.pod {
            tokens = tokens.bound_to_pod(name, uid.as_deref());
        }
        let channel = service.connect().await?;
        Connection::new(channel, tokens, self.retry)
            .allocated(&snapshot.namespace, &snapshot.name, cancel)
            .await
    }

    /// The plan for a backup of the volume exposed from `snapshot` (`None` when the exposer
    /// did not say).
    ///
    /// # Errors
    /// Only cancellation: every other failure is a fallback to reading the whole volume.
    pub(crate) async fn plan(
        &self,
        snapshot: Option<&CsiSnapshot>,
        cancel: &CancellationToken,
    ) -> Result<Planned, Cancelled> {
        let Some(snapshot) = snapshot else {
            return Ok(Planned::whole(
                "no-snapshot",
                "the exposer did not say which CSI snapshot the volume was made from".into(),
            ));
        };
        match self.allocated(snapshot, cancel).await {
            Ok(map) => Ok(Planned::allocated(snapshot, map)),
            Err(e) => match e.reason() {
                None => Err(Cancelled),
                Some(reason) => {
                    tracing::info!(
                        snapshot = %format!("{}/{}", snapshot.namespace, snapshot.name),
                        driver = %snapshot.driver,
                        reason = reason.as_str(),
                        error = %e,
                        "changed-block tracking not used; reading the whole volume"
                    );
                    Ok(Planned::whole(reason.as_str(), e.to_string()))
                }
            },
        }
    }
}

/// The backup was cancelled while the plan was asked for.
#[derive(Debug)]
pub(crate) struct Cancelled;

/// What a block backup will read, and how it came to that.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    /// The ranges to read.
    pub read_plan: ReadPlan,
    /// The volume size the ranges describe.
    pub plan_size: Option<u64>,
    path: &'static str,
    /// The driver and the bytes its ranges cover (changed-block tracking used).
    ranges: Option<(String, u64)>,
    /// Why not (a fallback): the metric's label and the full reason.
    fallback: Option<(&'static str, String)>,
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
        Self {
            read_plan: ReadPlan::Everything,
            plan_size: None,
            path: "full",
            ranges: None,
            fallback: Some((label, reason)),
        }
    }

    fn allocated(snapshot: &CsiSnapshot, map: BlockMap) -> Self {
        let bytes = map.bytes();
        let ranges = map.ranges.iter().map(|r| (r.offset, r.len)).collect();
        Self {
            read_plan: ReadPlan::Only(ranges),
            plan_size: map.capacity,
            path: "allocated",
            ranges: Some((snapshot.driver.clone(), bytes)),
            fallback: None,
        }
    }

    /// Whether the plan reads by the service's ranges.
    pub(crate) fn by_ranges(&self) -> bool {
        self.read_plan != ReadPlan::Everything
    }

    /// The whole device after all: the repository refused the ranges (`reason`) before
    /// reading anything.
    pub(crate) fn refused(&self, reason: &str) -> Self {
        tracing::warn!(%reason, "the changed-block ranges do not fit the volume; reading the whole volume");
        Self::whole("untrusted", format!("the service's ranges do not fit the volume: {reason}"))
    }

    /// What a backup that read `bytes_read` of a `size`-byte volume did, in words, for the
    /// outcome.
    pub(crate) fn report(&self, bytes_read: u64, size: u64) -> BlockReads {
        let mut note = match &self.ranges {
            Some((driver, bytes)) => format!(
                "read {} bytes of a {}-byte block volume: the snapshot's allocated ranges ({bytes} bytes), \
                 from the changed-block tracking of CSI driver {driver}",
                bytes_read, size
            ),
            None => format!(
                "read {} bytes of a {}-byte block volume: the whole device (holes and zeros found by Ferry)",
                bytes_read, size
            ),
        };
        if let Some((_, reason)) = &self.fallback {
            let _ = write!(note, "; changed-block tracking not used: {reason}");
        }
        BlockReads { path: self.path, fallback: self.fallback.as_ref().map(|f| f.0), note }
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
        }
    }

    #[test]
    fn allocated_ranges_become_the_plan_and_the_report_says_so() {
        let map = BlockMap {
            capacity: Some(64 << 20),
            block_type: Some(BlockType::FixedLength),
            ranges: vec![Range { offset: 0, len: 4096 }, Range { offset: 1 << 20, len: 8192 }],
        };
        let planned = Planned::allocated(&snapshot(), map);
        assert_eq!(planned.read_plan, ReadPlan::Only(vec![(0, 4096), (1 << 20, 8192)]));
        assert_eq!(planned.plan_size, Some(64 << 20));
        assert!(planned.by_ranges());
        let reads = planned.report(1 << 20, 64 << 20);
        assert_eq!((reads.path, reads.fallback), ("allocated", None));
        assert!(reads.note.contains("allocated ranges (12288 bytes)"), "{}", reads.note);
        assert!(reads.note.contains("hostpath.csi.k8s.io"), "{}", reads.note);
    }

    #[test]
    fn a_fallback_reads_everything_and_says_why() {
        let planned = Planned::off();
        assert!(!planned.by_ranges());
        let reads = planned.report(64 << 20, 64 << 20);
        assert_eq!((reads.path, reads.fallback), ("full", Some("off")));
        assert!(reads.note.contains("is off for this agent"), "{}", reads.note);

        let map = BlockMap { capacity: None, block_type: None, ranges: Vec::new() };
        let refused = Planned::allocated(&snapshot(), map).refused("too small");
        assert_eq!(refused.read_plan, ReadPlan::Everything);
        let reads = refused.report(64 << 20, 64 << 20);
        assert_eq!((reads.path, reads.fallback), ("full", Some("untrusted")));
        assert!(reads.note.contains("too small"), "{}", reads.note);
    }
}
