//! Writes that return classified errors.

use std::fmt::Debug;

use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ApiError;

fn kind_of<K: Resource<DynamicType = ()>>() -> String {
    K::kind(&()).into_owned()
}

/// Replaces `obj` with a full-object update. The write carries `obj`'s `resourceVersion`, so
/// if anyone changed the object since it was read the result is [`ApiError::Conflict`] and
/// nothing is written.
///
/// # Errors
/// Classified as [`ApiError`].
pub async fn replace<K>(api: &Api<K>, obj: &K) -> Result<K, ApiError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = obj.name_any();
    api.replace(&name, &PostParams::default(), obj)
        .await
        .map_err(|e| ApiError::from_kube(&kind_of::<K>(), &name, e))
}

/// Creates `obj` (with `generateName` if it has no name).
///
/// # Errors
/// Classified as [`ApiError`].
pub async fn create<K>(api: &Api<K>, obj: &K) -> Result<K, ApiError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let name =
        obj.meta().name.clone().or_else(|| obj.meta().generate_name.clone()).unwrap_or_default();
    api.create(&PostParams::default(), obj)
        .await
        .map_err(|e| ApiError::from_kube(&kind_of::<K>(), &name, e))
}
