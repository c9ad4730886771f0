//! Saying what the agent waits for while an exposed volume is not usable on its node yet.
//!
//! The agent looks for the volume again and again ([`ferry_agent::Exposer::locate`]); most
//! waits end within seconds. One that lasts longer than [`ExposerConfig::volume_wait_grace`]
//! usually has a cause the user can fix (an image the holding pod cannot pull, a kubelet root
//! other than the one the agent reads), so it is told once, in a log line and a Warning Event
//! on the CR naming the pod, the volume and the path the agent expects.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferry_agent::ExposedVolume;
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};

use crate::backup::{Located, locate};
use crate::tell::tell;
use crate::{ExposeError, ExposerConfig};

/// The Event's reason.
pub const WAITING_FOR_VOLUME: &str = "WaitingForVolume";

/// When each CR's current wait began, and whether it has been told.
#[derive(Debug, Default)]
pub(crate) struct VolumeWaits {
    waits: Mutex<HashMap<String, Wait>>,
}

#[derive(Debug, Clone, Copy)]
struct Wait {
    since: Instant,
    told: bool,
}

impl VolumeWaits {
    /// Notes that CR `key` is still waiting at `now`; returns how long it has waited the first
    /// time that is at least `grace`, `None` before and after.
    pub(crate) fn still_waiting(
        &self,
        key: &str,
        now: Instant,
        grace: Duration,
    ) -> Option<Duration> {
        let mut waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        let wait = waits.entry(key.to_owned()).or_insert(Wait { since: now, told: false });
        let waited = now.saturating_duration_since(wait.since);
        if wait.told || waited < grace {
            return None;
        }
        wait.told = true;
        Some(waited)
    }

    /// The wait of CR `key` is over (found, failed, cleaned up).
    pub(crate) fn done(&self, key: &str) {
        self.waits.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
    }
}

/// Finds the volume exposed for `cr` (holding pod and PVC named after it) on `node`, and tells
/// what it still waits for once the wait outlasts the grace.
pub(crate) async fn locate_telling<K>(
    client: &Client,
    config: &ExposerConfig,
    waits: &VolumeWaits,
    cr: &K,
    node: &str,
) -> Result<Option<ExposedVolume>, ExposeError>
where
    K: Resource<DynamicType = ()>,
{
    let name = cr.name_any();
    let why = match locate(client, config, &name, node).await {
        Ok(Located::Ready(volume)) => {
            waits.done(&name);
            return Ok(Some(volume));
        }
        Ok(Located::Waiting(why)) => why,
        Err(e) => {
            waits.done(&name);
            return Err(e);
        }
    };
    let Some(waited) = waits.still_waiting(&name, Instant::now(), config.volume_wait_grace) else {
        return Ok(None);
    };
    let note = format!("still waiting after {}s on node {node}: {why}", waited.as_secs());
    tell(client, node, &cr.object_ref(&()), EventType::Warning, WAITING_FOR_VOLUME, note).await;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_told_once_after_the_grace() {
        let waits = VolumeWaits::default();
        let grace = Duration::from_secs(30);
        let start = Instant::now();
        let at = |s| start + Duration::from_secs(s);
        assert_eq!(waits.still_waiting("a", at(0), grace), None);
        assert_eq!(waits.still_waiting("a", at(29), grace), None);
        // Another CR's wait is its own.
        assert_eq!(waits.still_waiting("b", at(29), grace), None);
        assert_eq!(waits.still_waiting("a", at(31), grace), Some(Duration::from_secs(31)));
        assert_eq!(waits.still_waiting("a", at(90), grace), None);
        assert_eq!(waits.still_waiting("b", at(59), grace), Some(Duration::from_secs(30)));
        // A new wait (after the volume was found, or the CR was cleaned up) starts over.
        waits.done("a");
        assert_eq!(waits.still_waiting("a", at(100), grace), None);
        assert_eq!(waits.still_waiting("a", at(130), grace), Some(Duration::from_secs(30)));
    }

    #[test]
    fn no_grace_tells_at_the_first_look() {
        let waits = VolumeWaits::default();
        assert_eq!(waits.still_waiting("a", Instant::now(), Duration::ZERO), Some(Duration::ZERO));
    }
}
