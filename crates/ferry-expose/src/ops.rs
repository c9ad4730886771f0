//! Small idempotent API operations every exposer step is made of.

use std::fmt::Debug;

use ferry_kube::ApiError;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ExposeError;

/// The object, or `None` when it does not exist.
pub(crate) async fn get_opt<K>(
    api: &Api<K>,
    name: &str,
    step: &'static str,
) -> Result<Option<K>, ExposeError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    api.get_opt(name).await.map_err(|e| ExposeError::Api {
        step,
        source: Box::new(ApiError::from_kube(&K::kind(&()), name, e)),
    })
}

/// Creates the object; one that exists already (an earlier attempt made it) is read back.
pub(crate) async fn create_or_get<K>(
    api: &Api<K>,
    obj: &K,
    step: &'static str,
) -> Result<K, ExposeError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = obj.name_any();
    match api.create(&PostParams::default(), obj).await {
        Ok(created) => Ok(created),
        Err(e) => match ApiError::from_kube(&K::kind(&()), &name, e) {
            ApiError::AlreadyExists { .. } => get_opt(api, &name, step)
                .await?
                .ok_or_else(|| ExposeError::Unusable(format!("{step}: {name} vanished"))),
            source => Err(ExposeError::Api { step, source: Box::new(source) }),
        },
    }
}

/// Deletes the object if it exists (foreground propagation is not needed: nothing Ferry
/// creates owns anything).
pub(crate) async fn delete_if_present<K>(
    api: &Api<K>,
    name: &str,
    step: &'static str,
) -> Result<(), ExposeError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) => match ApiError::from_kube(&K::kind(&()), name, e) {
            ApiError::NotFound { .. } => Ok(()),
            source => Err(ExposeError::Api { step, source: Box::new(source) }),
        },
    }
}

/// Reads, changes and writes back an object, retrying when another writer got there first.
/// `change` returns `false` when nothing needs writing. `None` when the object is gone.
pub(crate) async fn update<K, F>(
    api: &Api<K>,
    name: &str,
    step: &'static str,
    mut change: F,
) -> Result<Option<K>, ExposeError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
    F: FnMut(&mut K) -> bool,
{
    for _ in 0..10 {
        let Some(mut obj) = get_opt(api, name, step).await? else { return Ok(None) };
        if !change(&mut obj) {
            return Ok(Some(obj));
        }
        match ferry_kube::replace(api, &obj).await {
            Ok(written) => return Ok(Some(written)),
            Err(ApiError::Conflict { .. }) => continue,
            Err(ApiError::NotFound { .. }) => return Ok(None),
            Err(source) => return Err(ExposeError::Api { step, source: Box::new(source) }),
        }
    }
    Err(ExposeError::Unusable(format!("{step}: {name} kept changing under 10 attempts")))
}

/// An owner reference to a Velero CR, so the cluster removes what Ferry made for it if the CR
/// itself is deleted while Ferry is away.
pub(crate) fn owner_of<K: Resource<DynamicType = ()>>(
    obj: &K,
) -> Result<ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference, ExposeError>
{
    obj.controller_owner_ref(&()).ok_or_else(|| {
        ExposeError::Invalid(format!("{} {} has no uid", K::kind(&()), obj.name_any()))
    })
}
