//! Mapping SDK failures to [`StoreError`]. The SDK has already retried what it could when
//! one of these reaches us.

use std::error::Error;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use crate::{ObjectKey, StoreError};

/// Error codes that mean the credentials or their permissions were refused.
const ACCESS_CODES: &[&str] = &[
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
    "AccountProblem",
    "InvalidClientTokenId",
];

/// Error codes of transient server-side trouble.
const TRANSIENT_CODES: &[&str] = &[
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "ConditionalRequestConflict",
    "OperationAborted",
];

/// What an S3 call was doing when it failed; names the place in every error.
#[derive(Debug, Clone, Copy)]
pub(super) struct Site<'a> {
    /// The bucket.
    pub bucket: &'a str,
    /// The endpoint as shown to users.
    pub endpoint: &'a str,
}

impl Site<'_> {
    fn bucket_location(&self) -> String {
        format!("s3 bucket {} at {}", self.bucket, self.endpoint)
    }

    /// Maps `err`, raised by `operation` on `key` (if any), to a [`StoreError`].
    pub(super) fn error<E>(
        &self,
        operation: String,
        key: Option<&ObjectKey>,
        err: SdkError<E, HttpResponse>,
    ) -> StoreError
    where
        E: ProvideErrorMetadata + Error + Send + Sync + 'static,
    {
        let unavailable = |message: String| StoreError::Unavailable {
            location: self.endpoint.to_owned(),
            operation: operation.clone(),
            message,
        };
        if let Some(creds) = credentials_failure(&err) {
            let message = format!("loading credentials: {}", DisplayErrorContext(creds));
            return match creds {
                CredentialsError::CredentialsNotLoaded(_)
                | CredentialsError::InvalidConfiguration(_) => {
                    StoreError::AccessDenied { location: self.bucket_location(), message }
                }
                // A provider that was refused (STS denying a role, a web identity token
                // rejected) will be refused again: not worth retrying.
                CredentialsError::ProviderError(_) if refused_by_provider(&message) => {
                    StoreError::AccessDenied { location: self.bucket_location(), message }
                }
                _ => unavailable(message),
            };
        }
        if let Some(message) = refused_certificate(&err) {
            // Retrying will not make the certificate trusted: the settings must change.
            return StoreError::Backend { location: self.bucket_location(), operation, message };
        }
        match &err {
            SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => {
                return unavailable(DisplayErrorContext(&err).to_string());
            }
            SdkError::ConstructionFailure(_) | SdkError::ResponseError(_) => {
                let message = DisplayErrorContext(&err).to_string();
                return StoreError::Backend {
                    location: self.bucket_location(),
                    operation,
                    message,
                };
            }
            _ => {}
        }
        let code = err.code().unwrap_or_default();
        let status = status(&err);
        let message = match err.message() {
            Some(m) => format!("{code}: {m}"),
            None if code.is_empty() => {
                format!("HTTP status {}: {}", status.unwrap_or_default(), DisplayErrorContext(&err))
            }
            None => code.to_owned(),
        };
        if code == "NoSuchBucket" {
            return StoreError::LocationMissing { location: self.bucket_location() };
        }
        if let Some(key) = key
            && (matches!(code, "NoSuchKey" | "NotFound") || status == Some(404))
        {
            return StoreError::NotFound { key: key.clone() };
        }
        if ACCESS_CODES.contains(&code) || matches!(status, Some(401 | 403)) {
            return StoreError::AccessDenied { location: self.bucket_location(), message };
        }
        if TRANSIENT_CODES.contains(&code) || matches!(status, Some(429 | 500..=599)) {
            return unavailable(message);
        }
        StoreError::Backend { location: self.bucket_location(), operation, message }
    }
}

/// The credential provider's failure behind `err`, if loading credentials is what failed (the
/// SDK reports it as a dispatch failure).
fn credentials_failure<'a>(err: &'a (dyn Error + 'static)) -> Option<&'a CredentialsError> {
    let mut current = err.source();
    // Error chains are short; the bound only guards against a cyclic one.
    for _ in 0..16 {
        let e = current?;
        if let Some(creds) = e.downcast_ref::<CredentialsError>() {
            return Some(creds);
        }
        current = e.source();
    }
    None
}

/// What to tell a user when the TLS handshake failed because the server's certificate was
/// refused; `None` for any other failure.
fn refused_certificate(err: &(dyn Error + 'static)) -> Option<String> {
    let refusal = chain(err).find_map(|e| match e.downcast_ref::<rustls::Error>() {
        Some(rustls::Error::InvalidCertificate(refusal)) => Some(refusal),
        _ => None,
    })?;
    let hint = match refusal {
        rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature => {
            "the server's TLS certificate is not signed by a trusted CA: if a private CA signed \
             it, give that CA's PEM certificate as the CA bundle (a BackupStorageLocation's \
             objectStorage.caCert)"
        }
        _ => "the server's TLS certificate was refused",
    };
    Some(format!("{hint}: {}", DisplayErrorContext(err)))
}

/// `err` and the errors behind it. After an `io::Error` comes its payload (`source` would skip
/// it: the SDK's TLS failures nest the `rustls::Error` two `io::Error`s deep). Bounded: error
/// chains are short, the bound only guards against a cyclic one.
fn chain<'a>(err: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(err), |&e| match e.downcast_ref::<std::io::Error>() {
        Some(io) => io.get_ref().map(|inner| inner as &(dyn Error + 'static)),
        None => e.source(),
    })
    .take(32)
}

/// HTTP status of the response behind `err`, if one arrived.
pub(super) fn status<E>(err: &SdkError<E, HttpResponse>) -> Option<u16> {
    err.raw_response().map(|r| r.status().as_u16())
}

/// The S3 error code of `err`, if the service sent one.
pub(super) fn code<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> Option<&str> {
    err.code()
}

/// Whether a credentials provider's error says it was refused (STS error codes), as opposed
/// to being unreachable.
fn refused_by_provider(message: &str) -> bool {
    const REFUSALS: [&str; 5] = [
        "AccessDenied",
        "InvalidIdentityToken",
        "ExpiredToken",
        "InvalidClientTokenId",
        "IDPRejectedClaim",
    ];
    REFUSALS.iter().any(|code| message.contains(code))
}

#[cfg(test)]
mod tests {
    use aws_sdk_s3::error::ConnectorError;
    use aws_sdk_s3::operation::get_object::GetObjectError;

    use super::*;

    fn map(source: CredentialsError) -> StoreError {
        let site = Site { bucket: "b", endpoint: "http://127.0.0.1:1" };
        let err: SdkError<GetObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::other(Box::new(source), None));
        site.error("get k".into(), None, err)
    }

    #[test]
    fn missing_credentials_are_access_denied() {
        let mapped = map(CredentialsError::not_loaded("no provider found credentials"));
        match mapped {
            StoreError::AccessDenied { location, message } => {
                assert!(location.contains("bucket b"), "{location}");
                assert!(message.contains("no provider found credentials"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_refused_credentials_provider_is_access_denied() {
        let mapped = map(CredentialsError::provider_error(
            "AccessDenied: Not authorized to perform sts:AssumeRoleWithWebIdentity",
        ));
        assert!(matches!(mapped, StoreError::AccessDenied { .. }), "{mapped:?}");
        assert!(!mapped.is_retryable());
    }

    #[test]
    fn credential_provider_outages_are_unavailable() {
        let mapped = map(CredentialsError::provider_timed_out(std::time::Duration::from_secs(5)));
        assert!(mapped.is_retryable(), "{mapped:?}");
    }

    #[test]
    fn refused_certificates_are_final_and_say_what_to_do() {
        let site = Site { bucket: "b", endpoint: "https://127.0.0.1:1" };
        let refused = |e| {
            let tls = rustls::Error::InvalidCertificate(e);
            let inner = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
            let io = std::io::Error::other(inner);
            let err: SdkError<GetObjectError, HttpResponse> =
                SdkError::dispatch_failure(ConnectorError::io(Box::new(io)));
            site.error("get k".into(), None, err)
        };
        let mapped = refused(rustls::CertificateError::UnknownIssuer);
        assert!(matches!(mapped, StoreError::Backend { .. }), "{mapped:?}");
        assert!(!mapped.is_retryable());
        let message = mapped.to_string();
        assert!(message.contains("https://127.0.0.1:1"), "{message}");
        assert!(message.contains("objectStorage.caCert"), "{message}");
        assert!(message.contains("UnknownIssuer"), "{message}");
        let expired = refused(rustls::CertificateError::Expired).to_string();
        assert!(expired.contains("refused") && !expired.contains("caCert"), "{expired}");
    }

    #[test]
    fn connection_failures_are_unavailable_and_name_the_endpoint() {
        let site = Site { bucket: "b", endpoint: "http://127.0.0.1:1" };
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err: SdkError<GetObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io(Box::new(io)));
        let mapped = site.error("get k".into(), None, err);
        assert!(mapped.is_retryable());
        assert!(mapped.to_string().contains("http://127.0.0.1:1"), "{mapped}");
    }
}
