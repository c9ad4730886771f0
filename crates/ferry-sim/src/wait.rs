//! Bounded waits on API objects.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use kube::Resource;
use kube::api::Api;
use serde::de::DeserializeOwned;

use crate::SimError;

const POLL: Duration = Duration::from_millis(100);

/// Polls `name` until `ready` holds for it, for at most `timeout`; returns the object.
///
/// # Errors
/// [`SimError::Timeout`] (with a short description of the last object seen), or the API
/// error of the last read if the server failed.
pub async fn wait_for<K, F>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    ready: F,
) -> Result<K, SimError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
    F: Fn(&K) -> bool,
{
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        match api.get_opt(name).await {
            Ok(Some(obj)) if ready(&obj) => return Ok(obj),
            Ok(Some(obj)) => last = Some(describe(&obj)),
            Ok(None) => last = Some("absent".to_owned()),
            Err(e) if Instant::now() > deadline => {
                return Err(SimError::api("reading", kind::<K>(), name, e));
            }
            Err(_) => {}
        }
        if Instant::now() > deadline {
            return Err(SimError::Timeout {
                what: format!("{} {name}", kind::<K>()),
                timeout,
                last,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls until `name` no longer exists, for at most `timeout`.
///
/// # Errors
/// [`SimError::Timeout`], or the API error of the last read.
pub async fn wait_gone<K>(api: &Api<K>, name: &str, timeout: Duration) -> Result<(), SimError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match api.get_opt(name).await {
            Ok(None) => return Ok(()),
            Ok(Some(obj)) => Some(describe(&obj)),
            Err(e) if Instant::now() > deadline => {
                return Err(SimError::api("reading", kind::<K>(), name, e));
            }
            Err(_) => None,
        };
        if Instant::now() > deadline {
            return Err(SimError::Timeout {
                what: format!("{} {name} to be deleted", kind::<K>()),
                timeout,
                last,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

fn kind<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()) {
        std::borrow::Cow::Borrowed(k) => k,
        std::borrow::Cow::Owned(_) => "object",
    }
}

/// The object's status (or whole object) as short JSON, for timeout messages.
fn describe<K: Debug>(obj: &K) -> String {
    let text = format!("{obj:?}");
    let start = text.find("status:").unwrap_or(0);
    text[start..].chars().take(600).collect()
}
