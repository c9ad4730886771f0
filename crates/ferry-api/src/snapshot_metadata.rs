//! Kubernetes' SnapshotMetadataService (`cbt.storage.k8s.io/v1beta1`, KEP-3314): where a CSI
//! driver's changed-block tracking service listens and how a client proves who it is.
//!
//! The object is cluster-scoped and named after the CSI driver it serves. A backup application
//! reads it, asks the TokenRequest API for a token of its own service account scoped to
//! [`SnapshotMetadataServiceSpec::audience`], and calls the gRPC service at
//! [`SnapshotMetadataServiceSpec::address`] over TLS, trusting only
//! [`SnapshotMetadataServiceSpec::ca_cert`].

use k8s_openapi::ByteString;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Where a driver's SnapshotMetadata service is and how to reach it.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[kube(
    group = "cbt.storage.k8s.io",
    version = "v1beta1",
    kind = "SnapshotMetadataService",
    plural = "snapshotmetadataservices",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotMetadataServiceSpec {
    /// The service's TCP endpoint, `host:port`.
    pub address: String,
    /// The audience a client's token must be scoped to.
    pub audience: String,
    /// The PEM certificate(s) of the authority that signed the service's certificate (base64 in
    /// the object's JSON, as Kubernetes writes `[]byte`).
    pub ca_cert: ByteString,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_certificate_is_base64_in_json_and_bytes_in_rust() {
        let json = serde_json::json!({
            "apiVersion": "cbt.storage.k8s.io/v1beta1",
            "kind": "SnapshotMetadataService",
            "metadata": {"name": "hostpath.csi.k8s.io"},
            "spec": {"address": "10.1.0.1:6443", "audience": "backup", "caCert": "LS0tLS1CRUdJTg=="}
        });
        let sms: SnapshotMetadataService = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(sms.spec.ca_cert.0, b"-----BEGIN");
        assert_eq!(sms.spec.address, "10.1.0.1:6443");
        assert_eq!(serde_json::to_value(&sms).unwrap(), json);
    }

    #[test]
    fn a_certificate_that_is_not_base64_is_refused() {
        let spec = serde_json::json!({"address": "a:1", "audience": "b", "caCert": "not base64!"});
        assert!(serde_json::from_value::<SnapshotMetadataServiceSpec>(spec).is_err());
    }
}
