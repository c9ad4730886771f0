//! Node liveness: every agent renews a `coordination.k8s.io/v1` Lease in Velero's namespace,
//! and every agent watches the others' leases.
//!
//! A node is judged by what this agent *observed*, on its own clock: a lease whose
//! `renewTime` has not changed for longer than its `leaseDurationSeconds` belongs to a node
//! that stopped, whatever the clocks of the two nodes say. The CRs such a node was
//! responsible for are taken over by a live node (see the controllers).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use ferry_api::k8s_openapi::jiff::Timestamp;
use ferry_api::naming;
use ferry_kube::ApiError;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use crate::update::get_opt;

/// Label on every agent lease; its value is the data mover name the agent serves.
pub const LEASE_LABEL: &str = "ferry.io/agent-lease";

/// Longest object name Kubernetes accepts for a Lease.
const MAX_NAME_LEN: usize = 253;

/// The name of the lease of the agent for `data_mover` on `node`.
#[must_use]
pub fn lease_name(data_mover: &str, node: &str) -> String {
    let name = format!("{data_mover}-agent-{node}");
    if name.len() <= MAX_NAME_LEN {
        return name;
    }
    // Keep it unique: a long name becomes its start plus a hash of the whole.
    naming::valid_label_value(&name)
}

/// Writes this node's lease: creates it or moves its `renewTime` to now.
pub(crate) async fn renew(
    api: &Api<Lease>,
    name: &str,
    data_mover: &str,
    node: &str,
    duration: Duration,
) -> Result<(), ApiError> {
    let seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX).max(1);
    let now = MicroTime(Timestamp::now());
    match get_opt(api, name).await? {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_default();
            spec.holder_identity = Some(node.to_owned());
            spec.lease_duration_seconds = Some(seconds);
            spec.renew_time = Some(now);
            ferry_kube::replace(api, &lease).await?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    labels: Some(
                        [(LEASE_LABEL.to_owned(), naming::valid_label_value(data_mover))].into(),
                    ),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.to_owned()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..LeaseSpec::default()
                }),
            };
            match ferry_kube::create(api, &lease).await {
                Ok(_) => {}
                // Another incarnation of this agent created it first; the next renewal updates it.
                Err(ApiError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Renews the lease every `interval` until `stop` fires. Failures are logged and retried at
/// the next tick; conflicts only mean a concurrent renewal.
pub(crate) async fn keep_renewing(
    api: Api<Lease>,
    name: String,
    data_mover: String,
    node: String,
    duration: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(duration / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = renew(&api, &name, &data_mover, &node, duration).await
            && !e.is_conflict()
        {
            tracing::warn!(lease = %name, error = %e, "renewing the liveness lease failed");
        }
    }
}

#[derive(Debug)]
struct Seen {
    renew_time: Option<Timestamp>,
    observed: Instant,
    duration: Duration,
}

/// What this agent knows of the other agents' leases.
#[derive(Debug)]
pub(crate) struct Liveness {
    me: String,
    default_duration: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    seen: HashMap<String, Seen>,
    /// Nodes asked about before any lease of theirs was seen, and since when.
    unknown_since: HashMap<String, Instant>,
    synced: bool,
}

impl Liveness {
    pub(crate) fn new(me: &str, default_duration: Duration) -> Self {
        Self { me: me.to_owned(), default_duration, state: Mutex::new(State::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn observe(&self, lease: &Lease) {
        let Some(spec) = &lease.spec else { return };
        let Some(holder) = spec.holder_identity.clone() else { return };
        let renew_time = spec.renew_time.as_ref().map(|t| t.0);
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.default_duration, Duration::from_secs);
        let mut state = self.state();
        state.unknown_since.remove(&holder);
        match state.seen.get_mut(&holder) {
            Some(seen) if seen.renew_time == renew_time => seen.duration = duration,
            Some(seen) => {
                seen.renew_time = renew_time;
                seen.observed = Instant::now();
                seen.duration = duration;
            }
            None => {
                state.seen.insert(holder, Seen { renew_time, observed: Instant::now(), duration });
            }
        }
    }

    fn forget(&self, lease: &Lease) {
        if let Some(holder) = lease.spec.as_ref().and_then(|s| s.holder_identity.as_ref()) {
            self.state().seen.remove(holder);
        }
    }

    /// Whether the agent on `node` is alive as far as this agent can tell.
    ///
    /// This node is always alive. Nobody is judged gone while this agent's own view is in
    /// doubt: before the watch has listed every lease, or when this agent's own renewals
    /// have stopped showing up in it (a broken watch or a cut-off node would otherwise see
    /// everyone as dead). A node whose lease was never seen gets one lease duration from the
    /// first time it is asked about, since a CR can reach this agent before that node's lease.
    pub(crate) fn is_alive(&self, node: &str) -> bool {
        if node == self.me {
            return true;
        }
        let mut state = self.state();
        let own_view_fresh =
            state.seen.get(&self.me).is_some_and(|mine| mine.observed.elapsed() <= mine.duration);
        if !state.synced || !own_view_fresh {
            return true;
        }
        if let Some(seen) = state.seen.get(node) {
            return seen.observed.elapsed() <= seen.duration;
        }
        let first = *state.unknown_since.entry(node.to_owned()).or_insert_with(Instant::now);
        first.elapsed() <= self.default_duration
    }

    /// Follows the leases of `data_mover`'s agents until `stop` fires.
    pub(crate) async fn watch(&self, api: Api<Lease>, data_mover: &str, stop: CancellationToken) {
        let selector = format!("{LEASE_LABEL}={}", naming::valid_label_value(data_mover));
        let stream = watcher(api, watcher::Config::default().labels(&selector)).default_backoff();
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                event = stream.next() => event,
            };
            match event {
                None => return,
                Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) => {
                    self.observe(&lease);
                }
                Some(Ok(watcher::Event::Delete(lease))) => self.forget(&lease),
                Some(Ok(watcher::Event::InitDone)) => self.state().synced = true,
                Some(Ok(watcher::Event::Init)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "watching agent leases failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renew_secs: i64, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(duration),
                renew_time: Some(MicroTime(Timestamp::from_second(renew_secs).expect("ts"))),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn judged_by_observed_renewals() {
        let live = Liveness::new("me", Duration::from_millis(20));
        assert!(live.is_alive("me"));
        // Before the first full listing nobody is judged.
        live.observe(&lease("a", 100, 0));
        std::thread::sleep(Duration::from_millis(5));
        assert!(live.is_alive("a"));
        live.state().synced = true;
        // Nor while this agent's own lease has not been seen.
        assert!(live.is_alive("a"));
        live.observe(&lease("me", 100, 30));
        // A zero-second lease is expired as soon as time passes without a renewal.
        assert!(!live.is_alive("a"));
        live.observe(&lease("a", 101, 30));
        assert!(live.is_alive("a"), "a new renewTime refreshes the observation");
        // A node never seen gets one default lease duration (20 ms here) from the first ask.
        assert!(live.is_alive("stranger"));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!live.is_alive("stranger"));
    }

    #[test]
    fn a_stale_own_view_judges_nobody() {
        let live = Liveness::new("me", Duration::from_secs(15));
        live.state().synced = true;
        live.observe(&lease("me", 100, 0));
        live.observe(&lease("a", 100, 0));
        std::thread::sleep(Duration::from_millis(5));
        // Both leases look expired, but so does this agent's own: its view is stale.
        assert!(live.is_alive("a"));
    }

    #[test]
    fn lease_names_stay_valid() {
        assert_eq!(lease_name("ferry", "node-1"), "ferry-agent-node-1");
        let long = "n".repeat(300);
        let name = lease_name("ferry", &long);
        assert!(name.len() <= MAX_NAME_LEN);
        assert_ne!(name, lease_name("ferry", &"m".repeat(300)));
    }
}
