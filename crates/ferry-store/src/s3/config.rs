//! Settings of the S3 backend and the SDK client built from them.

use std::fmt;
use std::time::Duration;

use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_smithy_http_client::tls::{TlsContext, TrustStore};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::{StoreError, StoreResult};

/// S3's smallest part size for every part but the last.
pub(super) const MIN_PART_SIZE: u64 = 5 << 20;
/// [`S3Options::multipart_threshold`]'s default.
const DEFAULT_MULTIPART_THRESHOLD: u64 = 64 << 20;
/// S3's largest part size.
const MAX_PART_SIZE: u64 = 5 << 30;
/// Region used when none is configured and the environment names none.
const FALLBACK_REGION: &str = "us-east-1";

/// Where a store lives in S3, and how to reach it.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// The bucket.
    pub bucket: String,
    /// Key prefix inside the bucket (`ferry/cluster-a`); empty for the bucket's root. Leading
    /// and trailing `/` are ignored.
    pub prefix: String,
    /// Endpoint, credentials and tuning.
    pub options: S3Options,
}

impl S3Config {
    /// A store at `bucket`/`prefix` with default options.
    #[must_use]
    pub fn new(bucket: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self { bucket: bucket.into(), prefix: prefix.into(), options: S3Options::default() }
    }
}

/// How to reach S3 and how to use it; everything but the bucket and prefix.
#[derive(Clone)]
pub struct S3Options {
    /// A custom endpoint (`http://127.0.0.1:9000`, an S3-compatible service); `None` for AWS.
    pub endpoint: Option<String>,
    /// The region; `None` takes it from the environment (`AWS_REGION`, profile), else
    /// `us-east-1`.
    pub region: Option<String>,
    /// Address buckets as `endpoint/bucket` rather than `bucket.endpoint` (most S3-compatible
    /// services need this).
    pub force_path_style: bool,
    /// Fixed credentials; `None` uses the standard AWS credential chain (environment,
    /// profile, web identity, container and instance metadata).
    pub credentials: Option<StaticCredentials>,
    /// Objects larger than this are uploaded in parts. The default, 64 MiB, keeps every pack a
    /// repository writes with default settings (16 MiB and at most one more blob) one
    /// `PutObject`: a multipart upload costs a HEAD, a create, a request per part and a
    /// complete.
    pub multipart_threshold: u64,
    /// Size of each part of a multipart upload (at least 5 MiB, S3's minimum); grown for
    /// objects that would otherwise need more than 10,000 parts.
    pub part_size: u64,
    /// Parts uploaded at once.
    pub part_concurrency: usize,
    /// Keys asked for per `ListObjectsV2` page; `None` leaves S3's default of 1,000.
    pub list_page_size: Option<u32>,
    /// Attempts per request, the first included (SDK standard retry mode).
    pub max_attempts: u32,
    /// First retry delay; later ones double up to `max_backoff`, each drawn with full jitter.
    pub initial_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// Limit for establishing a connection.
    pub connect_timeout: Duration,
    /// Limit from sending a request until the first byte of its response.
    pub read_timeout: Duration,
    /// PEM certificates (one or more) trusted for the endpoint's TLS in addition to the
    /// platform's roots: the CA of a server whose certificate a private CA signed (Velero's
    /// `objectStorage.caCert`). `None` trusts the platform's roots only.
    pub ca_bundle: Option<Vec<u8>>,
    /// Server-side encryption asked for on every object written (Velero's BSL
    /// `serverSideEncryption` and `kmsKeyId`); `None` leaves the bucket's default.
    pub server_side_encryption: Option<ServerSideEncryption>,
}

/// Server-side encryption of the objects written, as Velero's AWS plugin asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerSideEncryption {
    /// `x-amz-server-side-encryption` with this algorithm (`AES256`, `aws:kms`, ...).
    Algorithm(String),
    /// `aws:kms` with this KMS key (id, ARN or alias).
    KmsKey(String),
}

impl S3Options {
    /// The endpoint when it is plain HTTP to another host than this one (its loopback
    /// addresses and `localhost` excepted): object names, sizes and request signatures then
    /// cross the network readable, and anyone on the path can withhold or delete objects
    /// (Ferry's repository still encrypts and authenticates their contents).
    #[must_use]
    pub fn plain_http_endpoint(&self) -> Option<&str> {
        let endpoint = self.endpoint.as_deref()?;
        let uri: http::Uri = endpoint.parse().ok()?;
        if uri.scheme() != Some(&http::uri::Scheme::HTTP) {
            return None;
        }
        let host = uri.host()?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let loopback = host.trim_end_matches('.').eq_ignore_ascii_case("localhost")
            || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.to_canonical().is_loopback());
        (!loopback).then_some(endpoint)
    }
}

impl Default for S3Options {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: None,
            force_path_style: false,
            credentials: None,
            multipart_threshold: DEFAULT_MULTIPART_THRESHOLD,
            part_size: 8 << 20,
            part_concurrency: 4,
            list_page_size: None,
            max_attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(120),
            ca_bundle: None,
            server_side_encryption: None,
        }
    }
}

impl fmt::Debug for S3Options {
    /// Every field, the CA bundle by its size only. Destructured so a new field is not
    /// forgotten here.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            endpoint,
            region,
            force_path_style,
            credentials,
            multipart_threshold,
            part_size,
            part_concurrency,
            list_page_size,
            max_attempts,
            initial_backoff,
            max_backoff,
            connect_timeout,
            read_timeout,
            ca_bundle,
            server_side_encryption,
        } = self;
        f.debug_struct("S3Options")
            .field("endpoint", endpoint)
            .field("region", region)
            .field("force_path_style", force_path_style)
            .field("credentials", credentials)
            .field("multipart_threshold", multipart_threshold)
            .field("part_size", part_size)
            .field("part_concurrency", part_concurrency)
            .field("list_page_size", list_page_size)
            .field("max_attempts", max_attempts)
            .field("initial_backoff", initial_backoff)
            .field("max_backoff", max_backoff)
            .field("connect_timeout", connect_timeout)
            .field("read_timeout", read_timeout)
            .field(
                "ca_bundle",
                &ca_bundle.as_ref().map(|pem| format!("{} bytes of PEM", pem.len())),
            )
            .field("server_side_encryption", server_side_encryption)
            .finish()
    }
}

/// An access key pair. `Debug` shows the key id only.
#[derive(Clone)]
pub struct StaticCredentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field("session_token", &self.session_token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The key prefix as stored: no leading `/`, and a trailing `/` unless empty.
pub(super) fn normalized_prefix(prefix: &str) -> String {
    let trimmed = prefix.trim_matches('/');
    if trimmed.is_empty() { String::new() } else { format!("{trimmed}/") }
}

/// Rejects settings S3 cannot work with.
pub(super) fn validate(config: &S3Config) -> StoreResult<()> {
    let o = &config.options;
    let invalid = |message: String| {
        Err(StoreError::InvalidConfig { location: format!("bucket {}", config.bucket), message })
    };
    if config.bucket.is_empty() || config.bucket.contains('/') {
        return invalid(format!("bucket name {:?} is empty or holds `/`", config.bucket));
    }
    if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&o.part_size) {
        return invalid(format!("part size {} outside 5 MiB..=5 GiB", o.part_size));
    }
    if o.part_concurrency == 0 || o.max_attempts == 0 || o.list_page_size == Some(0) {
        return invalid("part concurrency, attempts and list page size must be positive".into());
    }
    if let Some(pem) = &o.ca_bundle {
        ca_certificates(pem).map_err(|message| StoreError::InvalidConfig {
            location: format!("bucket {}", config.bucket),
            message: format!("CA bundle: {message}"),
        })?;
    }
    Ok(())
}

/// Checks that the PEM bundle `pem` holds at least one certificate and that each is usable as
/// a trust anchor.
///
/// The SDK reads the bundle only when it connects, and panics on one it cannot use; this
/// check, the same parse, runs first so a bad bundle is refused with a message instead.
fn ca_certificates(pem: &[u8]) -> Result<(), String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate in it (a `-----BEGIN CERTIFICATE-----` block)".into());
    }
    let mut roots = rustls::RootCertStore::empty();
    for (n, cert) in certs.iter().enumerate() {
        roots.add(cert.clone()).map_err(|e| {
            format!("certificate {} of {} cannot be a trusted root: {e}", n + 1, certs.len())
        })?;
    }
    Ok(())
}

/// The SDK's HTTPS client trusting the platform's roots and the certificates of `pem`
/// (checked by [`validate`]).
fn client_trusting(
    options: &S3Options,
    pem: &[u8],
) -> StoreResult<aws_sdk_s3::config::SharedHttpClient> {
    let trust = TrustStore::default().with_native_roots(true).with_pem_certificate(pem);
    let tls = TlsContext::builder().with_trust_store(trust).build().map_err(|e| {
        StoreError::InvalidConfig {
            location: options.endpoint.clone().unwrap_or_else(|| "AWS S3".into()),
            message: format!("TLS settings with the CA bundle: {e}"),
        }
    })?;
    Ok(crate::https::client(Some(tls)))
}

/// Builds the SDK client: standard retry mode (exponential backoff with full jitter, bounded
/// attempts, throttling, 5xx, timeouts and connection failures retried), the configured
/// timeouts, and with a CA bundle an HTTPS client that trusts it too.
///
/// # Errors
/// [`StoreError::InvalidConfig`] if the TLS settings cannot be built.
pub(super) async fn client(options: &S3Options) -> StoreResult<aws_sdk_s3::Client> {
    let retry = RetryConfig::standard()
        .with_max_attempts(options.max_attempts)
        .with_initial_backoff(options.initial_backoff)
        .with_max_backoff(options.max_backoff);
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(options.connect_timeout)
        .read_timeout(options.read_timeout)
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(crate::aws_http_client())
        .retry_config(retry)
        .timeout_config(timeouts);
    // A custom endpoint rarely cares about the region; don't probe instance metadata for one.
    match (&options.region, &options.endpoint) {
        (Some(region), _) => loader = loader.region(Region::new(region.clone())),
        (None, Some(_)) => loader = loader.region(Region::from_static(FALLBACK_REGION)),
        (None, None) => {}
    }
    if let Some(c) = &options.credentials {
        loader = loader.credentials_provider(Credentials::new(
            c.access_key_id.clone(),
            c.secret_access_key.clone(),
            c.session_token.clone(),
            None,
            "ferry-static",
        ));
    }
    let shared = loader.load().await;
    let mut builder =
        aws_sdk_s3::config::Builder::from(&shared).force_path_style(options.force_path_style);
    if shared.region().is_none() {
        builder = builder.region(Region::from_static(FALLBACK_REGION));
    }
    if let Some(endpoint) = &options.endpoint {
        builder = builder.endpoint_url(endpoint.clone());
    }
    // For S3 calls only: credential providers (STS, instance metadata) keep the default.
    if let Some(pem) = &options.ca_bundle {
        builder = builder.http_client(client_trusting(options, pem)?);
    }
    Ok(aws_sdk_s3::Client::from_conf(builder.build()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_told_apart_from_tls_and_loopback() {
        let at =
            |endpoint: &str| S3Options { endpoint: Some(endpoint.into()), ..S3Options::default() };
        for told in ["http://minio.velero.svc:9000", "HTTP://10.0.0.7", "http://u@[fd00::1]:9000/x"]
        {
            assert_eq!(at(told).plain_http_endpoint(), Some(told), "{told}");
        }
        for quiet in [
            "https://minio.velero.svc:9000",
            "http://127.0.0.1:9000",
            "http://127.8.0.1",
            "http://localhost:9000/",
            "http://[::1]:9000",
            "http://[::ffff:127.0.0.1]:9000",
            "http://localhost.:9000",
        ] {
            assert_eq!(at(quiet).plain_http_endpoint(), None, "{quiet}");
        }
        assert_eq!(S3Options::default().plain_http_endpoint(), None);
    }

    #[test]
    fn prefixes_are_normalized() {
        assert_eq!(normalized_prefix(""), "");
        assert_eq!(normalized_prefix("/"), "");
        assert_eq!(normalized_prefix("a/b"), "a/b/");
        assert_eq!(normalized_prefix("/a/b/"), "a/b/");
    }

    #[test]
    fn bad_settings_are_rejected() {
        let mut config = S3Config::new("bucket", "");
        assert!(validate(&config).is_ok());
        config.options.part_size = 1 << 20;
        assert!(matches!(validate(&config), Err(StoreError::InvalidConfig { .. })));
        let config = S3Config::new("a/b", "");
        assert!(validate(&config).is_err());
    }

    #[test]
    fn ca_bundles_without_a_usable_certificate_are_rejected() {
        let no_cert = ca_certificates(b"not PEM at all").expect_err("text");
        assert!(no_cert.contains("no PEM certificate"), "{no_cert}");
        let key_only = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(ca_certificates(key_only).is_err());
        let bad_der = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let bad = ca_certificates(bad_der).expect_err("not a certificate");
        assert!(bad.contains("certificate 1 of 1"), "{bad}");
        let mut config = S3Config::new("bucket", "");
        config.options.ca_bundle = Some(Vec::new());
        match validate(&config) {
            Err(StoreError::InvalidConfig { message, .. }) => {
                assert!(message.starts_with("CA bundle"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn debug_shows_the_ca_bundle_by_size() {
        let options = S3Options { ca_bundle: Some(vec![b'x'; 1234]), ..S3Options::default() };
        let shown = format!("{options:?}");
        assert!(shown.contains("1234 bytes of PEM") && !shown.contains("120, 120"), "{shown}");
    }

    #[test]
    fn debug_hides_secrets() {
        let creds = StaticCredentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "very-secret".into(),
            session_token: Some("token-secret".into()),
        };
        let shown = format!("{creds:?}");
        assert!(shown.contains("AKIDEXAMPLE"));
        assert!(!shown.contains("very-secret") && !shown.contains("token-secret"));
    }
}
