//! Full-object status updates that re-read and retry when another writer got there first.
//!
//! DataUploads and DataDownloads have no status subresource: every status change is a
//! full-object update carrying the `resourceVersion` it was based on. Where the writer
//! legitimately owns the CR (it is the responsible node), a Conflict only means someone else
//! touched the object meanwhile (Velero setting `spec.cancel`, a progress write): re-read,
//! check the precondition again, and retry.

use std::fmt::Debug;

use ferry_kube::ApiError;
use kube::api::Api;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How many times an update is tried before a run of Conflicts is reported as an error.
pub(crate) const MAX_ATTEMPTS: usize = 5;

/// What [`update_status`] did.
#[derive(Debug)]
pub(crate) enum Updated<K> {
    /// The change was written; the object as the server stored it.
    Written(K),
    /// The change function declined (its precondition no longer holds); the object it saw.
    Declined(K),
    /// The object no longer exists.
    Missing,
}

/// Reads `name`, `None` if it does not exist.
pub(crate) async fn get_opt<K>(api: &Api<K>, name: &str) -> Result<Option<K>, ApiError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    api.get_opt(name).await.map_err(|e| ApiError::from_kube(&K::kind(&()), name, e))
}

/// Applies `change` to the object and writes it with a full-object update, starting from
/// `start` when given (saving a read) or from a fresh read. `change` returns `false` to
/// decline (nothing is written). On Conflict the object is read again and `change` applied
/// to the fresh copy, up to [`MAX_ATTEMPTS`] times.
pub(crate) async fn update_status<K, F>(
    api: &Api<K>,
    name: &str,
    start: Option<K>,
    mut change: F,
) -> Result<Updated<K>, ApiError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
    F: FnMut(&mut K) -> bool,
{
    let mut current = match start {
        Some(obj) => obj,
        None => match get_opt(api, name).await? {
            Some(obj) => obj,
            None => return Ok(Updated::Missing),
        },
    };
    let mut attempt = 1;
    loop {
        let mut next = current.clone();
        if !change(&mut next) {
            return Ok(Updated::Declined(current));
        }
        match ferry_kube::replace(api, &next).await {
            Ok(written) => return Ok(Updated::Written(written)),
            Err(e) if e.is_not_found() => return Ok(Updated::Missing),
            Err(e) if e.is_conflict() && attempt < MAX_ATTEMPTS => {
                tracing::debug!(name = %next.name_any(), attempt, "update conflicted; re-reading");
                attempt += 1;
                current = match get_opt(api, name).await? {
                    Some(obj) => obj,
                    None => return Ok(Updated::Missing),
                };
            }
            Err(e) => return Err(e),
        }
    }
}
