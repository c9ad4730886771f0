//! The node-agent ConfigMap's `podResources` as a container's resource requirements, by
//! Velero's rules.
//!
//! Velero reads all six values as Kubernetes quantities: `cpuRequest`, `cpuLimit`,
//! `memoryRequest` and `memoryLimit` must be given (`"0"` for none), the two ephemeral-storage
//! values default to `"0"`; a zero value sets nothing (no request, or an unbounded limit); a
//! request above its non-zero limit is refused. Where Velero logs a warning and runs its pods
//! without any resources, Ferry refuses the configuration with the reason, so a typo is found
//! at start instead of silently changing how the pods are scheduled. Negative values, which
//! Velero passes on to a pod the API server then rejects, are refused too.

use std::collections::BTreeMap;

use ferry_api::k8s_openapi::api::core::v1::ResourceRequirements;
use ferry_api::k8s_openapi::apimachinery::pkg::api::resource::Quantity as KubeQuantity;
use ferry_api::node_agent_config::PodResources;

use crate::quantity::{Quantity, QuantityError};

/// Why `podResources` cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodResourcesError {
    /// A value Velero needs is missing or empty.
    #[error(
        "podResources.{field} is missing; Velero needs cpuRequest, cpuLimit, memoryRequest and \
         memoryLimit (\"0\" for none) and would ignore the whole podResources"
    )]
    Missing {
        /// The JSON key, e.g. `cpuRequest`.
        field: &'static str,
    },
    /// A value is not a Kubernetes quantity.
    #[error("podResources.{field}: {value:?} is not a Kubernetes quantity: {source}")]
    Quantity {
        /// The JSON key.
        field: &'static str,
        /// The text given.
        value: String,
        /// What is wrong with it.
        #[source]
        source: QuantityError,
    },
    /// A value is below zero.
    #[error("podResources.{field}: {value:?} is negative")]
    Negative {
        /// The JSON key.
        field: &'static str,
        /// The text given.
        value: String,
    },
    /// A request is above its (non-zero) limit.
    #[error("podResources: {resource} request {request:?} is above its limit {limit:?}")]
    RequestAboveLimit {
        /// `cpu`, `memory` or `ephemeral-storage`.
        resource: &'static str,
        /// The request as given.
        request: String,
        /// The limit as given.
        limit: String,
    },
}

/// One resource's request and limit: JSON keys and texts.
struct Pair<'a> {
    resource: &'static str,
    request: (&'static str, &'a str),
    limit: (&'static str, &'a str),
}

/// The resource requirements `podResources` stands for.
///
/// # Errors
/// [`PodResourcesError`] for the first value Velero would refuse, checked in Velero's order
/// (every value read, requests first, then each request against its limit).
pub fn pod_resources(config: &PodResources) -> Result<ResourceRequirements, PodResourcesError> {
    fn or_zero(text: &str) -> &str {
        if text.is_empty() { "0" } else { text }
    }
    let pairs = [
        Pair {
            resource: "cpu",
            request: ("cpuRequest", &config.cpu_request),
            limit: ("cpuLimit", &config.cpu_limit),
        },
        Pair {
            resource: "memory",
            request: ("memoryRequest", &config.memory_request),
            limit: ("memoryLimit", &config.memory_limit),
        },
        Pair {
            resource: "ephemeral-storage",
            request: ("ephemeralStorageRequest", or_zero(&config.ephemeral_storage_request)),
            limit: ("ephemeralStorageLimit", or_zero(&config.ephemeral_storage_limit)),
        },
    ];
    let requests = pairs.iter().map(|p| parse(p.request)).collect::<Result<Vec<_>, _>>()?;
    let limits = pairs.iter().map(|p| parse(p.limit)).collect::<Result<Vec<_>, _>>()?;
    let mut result = ResourceRequirements::default();
    for ((pair, request), limit) in pairs.iter().zip(requests).zip(limits) {
        if !limit.is_zero() && request > limit {
            return Err(PodResourcesError::RequestAboveLimit {
                resource: pair.resource,
                request: pair.request.1.to_owned(),
                limit: pair.limit.1.to_owned(),
            });
        }
        for (quantity, (_, text), side) in
            [(request, pair.request, &mut result.requests), (limit, pair.limit, &mut result.limits)]
        {
            if !quantity.is_zero() {
                side.get_or_insert_with(BTreeMap::new)
                    .insert(pair.resource.to_owned(), KubeQuantity(text.to_owned()));
            }
        }
    }
    Ok(result)
}

fn parse((field, text): (&'static str, &str)) -> Result<Quantity, PodResourcesError> {
    if text.is_empty() {
        return Err(PodResourcesError::Missing { field });
    }
    let quantity = Quantity::parse(text).map_err(|source| PodResourcesError::Quantity {
        field,
        value: text.to_owned(),
        source,
    })?;
    if quantity.is_negative() {
        return Err(PodResourcesError::Negative { field, value: text.to_owned() });
    }
    Ok(quantity)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn resources(values: [&str; 6]) -> PodResources {
        let [cpu_request, cpu_limit, memory_request, memory_limit, eph_request, eph_limit] =
            values.map(str::to_owned);
        PodResources {
            cpu_request,
            cpu_limit,
            memory_request,
            memory_limit,
            ephemeral_storage_request: eph_request,
            ephemeral_storage_limit: eph_limit,
            other: BTreeMap::new(),
        }
    }

    fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, KubeQuantity>> {
        (!pairs.is_empty()).then(|| {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), KubeQuantity((*v).to_owned()))).collect()
        })
    }

    #[test]
    fn all_values_become_requests_and_limits() {
        let r = pod_resources(&resources(["500m", "1", "128Mi", "1Gi", "1Gi", "2Gi"])).unwrap();
        assert_eq!(
            r.requests,
            map(&[("cpu", "500m"), ("ephemeral-storage", "1Gi"), ("memory", "128Mi")])
        );
        assert_eq!(r.limits, map(&[("cpu", "1"), ("ephemeral-storage", "2Gi"), ("memory", "1Gi")]));
        assert!(r.claims.is_none());
    }

    #[test]
    fn zero_means_unset_and_ephemeral_storage_defaults_to_zero() {
        let r = pod_resources(&resources(["100m", "0", "0", "256Mi", "", ""])).unwrap();
        assert_eq!(r.requests, map(&[("cpu", "100m")]));
        assert_eq!(r.limits, map(&[("memory", "256Mi")]));
        // A request above an unbounded (zero) limit is fine.
        let r = pod_resources(&resources(["2", "0", "0", "0", "5Gi", "0"])).unwrap();
        assert_eq!(r.requests, map(&[("cpu", "2"), ("ephemeral-storage", "5Gi")]));
        assert_eq!(r.limits, None);
        let r = pod_resources(&resources(["0", "0", "0", "0", "", ""])).unwrap();
        assert_eq!(r, ResourceRequirements::default(), "all zero: Velero's BestEffort pods");
        // Equal request and limit, written differently.
        assert!(pod_resources(&resources(["1000m", "1", "1Gi", "1024Mi", "", ""])).is_ok());
    }

    #[test]
    fn refusals_name_the_value() {
        let err = |values| pod_resources(&resources(values)).unwrap_err();
        assert_eq!(
            err(["", "1", "1Gi", "1Gi", "", ""]),
            PodResourcesError::Missing { field: "cpuRequest" }
        );
        assert_eq!(
            err(["1", "1", "1Gi", "", "", ""]),
            PodResourcesError::Missing { field: "memoryLimit" }
        );
        let e = err(["1", "1", "1GB", "2Gi", "", ""]);
        assert_eq!(
            e.to_string(),
            "podResources.memoryRequest: \"1GB\" is not a Kubernetes quantity: unknown suffix \"GB\" \
             (expected Ki…Ei, n, u, m, k, M, G, T, P, E or an exponent like e3)"
        );
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(
            err(["1", "1", "1Gi", "1Gi", "-1Gi", ""]),
            PodResourcesError::Negative { field: "ephemeralStorageRequest", value: "-1Gi".into() }
        );
        assert_eq!(
            err(["2", "1500m", "1Gi", "1Gi", "", ""]).to_string(),
            "podResources: cpu request \"2\" is above its limit \"1500m\""
        );
        assert_eq!(
            err(["1", "1", "1Gi", "1G", "", ""]),
            PodResourcesError::RequestAboveLimit {
                resource: "memory",
                request: "1Gi".into(),
                limit: "1G".into()
            }
        );
        // Velero reads every value before comparing: a bad limit wins over a bad pair.
        assert_eq!(
            err(["2", "1", "1Gi", "1Gi", "", "x"]),
            PodResourcesError::Quantity {
                field: "ephemeralStorageLimit",
                value: "x".into(),
                source: QuantityError::NoDigits
            }
        );
    }
}
