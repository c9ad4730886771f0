//! Finding a driver's SnapshotMetadata service and connecting to it.

use std::time::Duration;

use ferry_api::SnapshotMetadataService;
use kube::Api;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::CbtError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 pings on a quiet connection, so a service (or a path to it) that died without a word
/// is noticed while a stream waits.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Audiences the API server accepts in every cluster Ferry knows of (kubeadm, managed
/// clusters, the API's own default); the cluster's issuer is added when it can be read.
const API_AUDIENCES: &[&str] = &[
    "https://kubernetes.default.svc.cluster.local",
    "https://kubernetes.default.svc",
    "kubernetes.default.svc",
    "kubernetes",
    "api",
];

/// A driver's SnapshotMetadata service, as its SnapshotMetadataService object describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// The CSI driver (the object's name).
    pub driver: String,
    /// `host:port` of the gRPC service.
    pub address: String,
    /// The audience a token must be scoped to.
    pub audience: String,
    /// The PEM certificates of the authority the service's certificate must chain to.
    pub ca_pem: Vec<u8>,
}

impl Service {
    /// Reads the SnapshotMetadataService named `driver`.
    ///
    /// # Errors
    /// [`CbtError::NoService`] when there is none (or the API is not served),
    /// [`CbtError::Discover`] when the read fails, [`CbtError::BadService`] when the object
    /// lacks what a client needs, or when its audience is one the API server itself accepts
    /// (a token for it would let whoever runs the service act as Ferry's service account
    /// against the API server).
    pub async fn discover(client: kube::Client, driver: &str) -> Result<Self, CbtError> {
        let api: Api<SnapshotMetadataService> = Api::all(client.clone());
        let found = match api.get_opt(driver).await {
            Ok(found) => found,
            // A cluster that does not serve the API at all (no CRD, as on most clusters today)
            // answers 404 for the resource with a plain-text body, which `get_opt` does not
            // take for an absent object: the driver offers no service either way.
            Err(kube::Error::Api(status)) if status.code == 404 => None,
            Err(source) => return Err(CbtError::Discover { driver: driver.to_owned(), source }),
        };
        let sms = found.ok_or_else(|| CbtError::NoService { driver: driver.to_owned() })?;
        let service = Self::from_object(driver, &sms)?;
        let issuer = issuer(&client).await;
        if API_AUDIENCES.contains(&service.audience.as_str())
            || issuer.as_deref() == Some(service.audience.as_str())
        {
            return Err(CbtError::BadService {
                driver: driver.to_owned(),
                reason: format!(
                    "its audience {:?} is one the API server accepts: a token for it would let the service act as Ferry's service account; give the service an audience of its own",
                    service.audience
                ),
            });
        }
        Ok(service)
    }

    /// Checks an object's fields.
    ///
    /// # Errors
    /// [`CbtError::BadService`]: an address without a port, no audience, or no PEM
    /// certificate.
    pub fn from_object(driver: &str, sms: &SnapshotMetadataService) -> Result<Self, CbtError> {
        let bad = |reason: &str| CbtError::BadService {
            driver: driver.to_owned(),
            reason: reason.into(),
        };
        let spec = &sms.spec;
        let service = Self {
            driver: driver.to_owned(),
            address: spec.address.trim().to_owned(),
            audience: spec.audience.clone(),
            ca_pem: spec.ca_cert.0.clone(),
        };
        if service.host().is_none() {
            return Err(bad(&format!("address {:?} is not HOST:PORT", spec.address)));
        }
        if service.audience.is_empty() {
            return Err(bad("its audience is empty"));
        }
        if !service.ca_pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
            return Err(bad("its caCert holds no PEM certificate"));
        }
        Ok(service)
    }

    /// The address's host, without brackets; `None` when the address is not `HOST:PORT`.
    #[must_use]
    pub fn host(&self) -> Option<&str> {
        let (host, port) = self.address.rsplit_once(':')?;
        port.parse::<u16>().ok().filter(|p| *p > 0)?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        (!host.is_empty()).then_some(host)
    }

    /// A TLS connection to the service that trusts only its CA and checks the certificate
    /// against the address's host.
    ///
    /// # Errors
    /// [`CbtError::Connect`]: refused, timed out, or the certificate did not verify.
    pub async fn connect(&self) -> Result<Channel, CbtError> {
        let failed = |source| CbtError::Connect {
            driver: self.driver.clone(),
            address: self.address.clone(),
            source,
        };
        let host = self.host().unwrap_or_default();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name(host);
        Endpoint::from_shared(format!("https://{}", self.address))
            .map_err(failed)?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_keepalive(Some(Duration::from_secs(30)))
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tls_config(tls)
            .map_err(failed)?
            .connect()
            .await
            .map_err(failed)
    }
}

/// The cluster's service account issuer (the API server's default audience), from its OIDC
/// discovery document; `None` when it cannot be read.
async fn issuer(client: &kube::Client) -> Option<String> {
    let request = http::Request::get("/.well-known/openid-configuration").body(Vec::new()).ok()?;
    match client.request::<serde_json::Value>(request).await {
        Ok(document) => document.get("issuer")?.as_str().map(str::to_owned),
        Err(e) => {
            tracing::debug!(error = %e, "the service account issuer could not be read");
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ferry_api::SnapshotMetadataServiceSpec;
    use k8s_openapi::ByteString;

    fn object(address: &str, audience: &str, ca: &[u8]) -> SnapshotMetadataService {
        SnapshotMetadataService::new(
            "hostpath.csi.k8s.io",
            SnapshotMetadataServiceSpec {
                address: address.into(),
                audience: audience.into(),
                ca_cert: ByteString(ca.to_vec()),
            },
        )
    }

    const PEM: &[u8] = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn a_usable_object_gives_host_audience_and_ca() {
        let s = Service::from_object("d", &object("10.1.0.1:6443", "ferry", PEM)).unwrap();
        assert_eq!(s.host(), Some("10.1.0.1"));
        let s = Service::from_object("d", &object("[fd00::1]:443", "ferry", PEM)).unwrap();
        assert_eq!(s.host(), Some("fd00::1"));
        let s = Service::from_object("d", &object("sms.csi.svc:6443", "ferry", PEM)).unwrap();
        assert_eq!(s.host(), Some("sms.csi.svc"));
    }

    #[test]
    fn an_unusable_object_says_what_it_lacks() {
        for (address, audience, ca, want) in [
            ("10.1.0.1", "a", PEM, "not HOST:PORT"),
            ("10.1.0.1:0", "a", PEM, "not HOST:PORT"),
            (":443", "a", PEM, "not HOST:PORT"),
            ("h:443", "", PEM, "audience is empty"),
            ("h:443", "a", b"not a certificate".as_slice(), "no PEM certificate"),
        ] {
            let err = Service::from_object("d", &object(address, audience, ca)).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
        }
    }
}
