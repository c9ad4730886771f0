//! Key wrapping by a key management service: small secrets encrypted under a key that never
//! leaves the service, so whoever holds the ciphertext also needs the service's permission to
//! read it.
//!
//! [`KeyWrapper`] is the narrow trait the repository uses; [`AwsKms`] implements it with AWS
//! KMS `Encrypt` and `Decrypt` (with the `s3` feature, beside the S3 backend), and
//! [`MemoryKms`] in memory for tests of the crates above this one. Each wrap is bound to an
//! encryption context the caller names: the service authenticates it, and an unwrap with
//! another context fails.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use rand::RngCore;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "s3")]
pub use aws::{AwsKms, KmsOptions};

/// A wrapped secret and the key that wrapped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrapped {
    /// The key's canonical id as the service reports it (for AWS KMS the key ARN, also when
    /// an alias was configured), to be stored beside the blob and given to
    /// [`KeyWrapper::unwrap`].
    pub key_id: String,
    /// The ciphertext; authenticated by the service.
    pub blob: Vec<u8>,
}

/// An encryption context: pairs the service binds to a ciphertext and checks on unwrap.
pub type WrapContext<'a> = &'a [(&'a str, &'a str)];

/// Wraps and unwraps small secrets with a key held by a key management service.
///
/// Implementations authenticate both the blob and the context: an altered blob, another
/// context, or a key id other than the one that wrapped the blob fails the unwrap.
#[async_trait]
pub trait KeyWrapper: fmt::Debug + Send + Sync {
    /// The key new secrets are wrapped with, as configured (for AWS KMS an id, ARN or alias).
    fn key_id(&self) -> &str;

    /// Encrypts `plaintext` (at most 4096 bytes) under [`KeyWrapper::key_id`], bound to
    /// `context`.
    ///
    /// # Errors
    /// Any [`KmsError`]; [`KmsError::Cancelled`] when `cancel` fires first.
    async fn wrap(
        &self,
        plaintext: &[u8],
        context: WrapContext<'_>,
        cancel: &CancellationToken,
    ) -> Result<Wrapped, KmsError>;

    /// Decrypts `blob`, which `key_id` wrapped with `context`.
    ///
    /// # Errors
    /// Any [`KmsError`]; [`KmsError::Cancelled`] when `cancel` fires first.
    async fn unwrap(
        &self,
        key_id: &str,
        blob: &[u8],
        context: WrapContext<'_>,
        cancel: &CancellationToken,
    ) -> Result<Vec<u8>, KmsError>;
}

/// What can go wrong wrapping or unwrapping. Every variant names the key and says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KmsError {
    /// The credentials were refused, missing, or lack the permission.
    #[error(
        "access to KMS key {key_id} denied for {operation} ({message}): grant this identity \
         kms:{operation} on the key (key policy or IAM), or check its credentials"
    )]
    AccessDenied {
        /// `Encrypt` or `Decrypt`.
        operation: &'static str,
        /// The key.
        key_id: String,
        /// The service's explanation.
        message: String,
    },
    /// The key is disabled, pending deletion, or otherwise not usable now.
    #[error(
        "KMS key {key_id} cannot be used ({message}): it is disabled or pending deletion; \
         enable it (or cancel its deletion) to {operation} with it"
    )]
    KeyDisabled {
        /// `Encrypt` or `Decrypt`.
        operation: &'static str,
        /// The key.
        key_id: String,
        /// The service's explanation.
        message: String,
    },
    /// No such key (or alias) in this account and region.
    #[error(
        "KMS key {key_id} not found ({message}): check the key id or alias, the account and \
         the region"
    )]
    KeyNotFound {
        /// The key.
        key_id: String,
        /// The service's explanation.
        message: String,
    },
    /// The service refused the ciphertext: altered, made by another key, or made for another
    /// context.
    #[error(
        "KMS key {key_id} refused the ciphertext ({message}): it is damaged, or was not \
         wrapped by this key for this purpose"
    )]
    InvalidCiphertext {
        /// The key named for the unwrap.
        key_id: String,
        /// The service's explanation.
        message: String,
    },
    /// The service could not be reached, timed out, or kept failing or throttling after
    /// retries; trying again later may succeed.
    #[error("KMS at {endpoint} unreachable for {operation} with key {key_id}: {message}")]
    Unreachable {
        /// `Encrypt` or `Decrypt`.
        operation: &'static str,
        /// The endpoint as shown to users.
        endpoint: String,
        /// The key.
        key_id: String,
        /// The last failure seen.
        message: String,
    },
    /// Any other failure of the service.
    #[error("KMS {operation} with key {key_id} failed: {message}")]
    Other {
        /// `Encrypt` or `Decrypt`.
        operation: &'static str,
        /// The key.
        key_id: String,
        /// The service's explanation.
        message: String,
    },
    /// The wrapper was configured with settings it cannot work with.
    #[error("invalid KMS settings: {message}")]
    InvalidConfig {
        /// What is wrong.
        message: String,
    },
    /// The call was cancelled through its token.
    #[error("cancelled")]
    Cancelled,
}

impl KmsError {
    /// Whether retrying the same call later may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }
}

/// A key service in memory, for tests: wraps under any key id, and can be told to refuse
/// (a disabled key, denied access, an unreachable service). Clones share their keys and
/// blobs; [`MemoryKms::using`] gives one that wraps under another key.
#[derive(Debug, Clone)]
pub struct MemoryKms {
    key_id: String,
    shared: Arc<Mutex<MemoryKeys>>,
}

/// What [`MemoryKms`] keeps of one wrap.
#[derive(Debug)]
struct MemoryBlob {
    key_id: String,
    context: Vec<(String, String)>,
    plaintext: Vec<u8>,
}

#[derive(Debug, Default)]
struct MemoryKeys {
    /// By the handle given out as the blob.
    blobs: HashMap<Vec<u8>, MemoryBlob>,
    disabled: HashSet<String>,
    denied: HashSet<String>,
    unreachable: bool,
    unwraps: usize,
}

impl MemoryKms {
    /// A service that wraps under `key_id`.
    #[must_use]
    pub fn new(key_id: impl Into<String>) -> Self {
        Self { key_id: key_id.into(), shared: Arc::default() }
    }

    /// The same service, wrapping under `key_id`.
    #[must_use]
    pub fn using(&self, key_id: impl Into<String>) -> Self {
        Self { key_id: key_id.into(), shared: Arc::clone(&self.shared) }
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, MemoryKeys> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Disables (or enables again) `key_id`.
    pub fn set_disabled(&self, key_id: &str, disabled: bool) {
        toggle(&mut self.keys().disabled, key_id, disabled);
    }

    /// Denies (or allows again) every use of `key_id`.
    pub fn set_denied(&self, key_id: &str, denied: bool) {
        toggle(&mut self.keys().denied, key_id, denied);
    }

    /// Makes every call fail as [`KmsError::Unreachable`] (or work again).
    pub fn set_unreachable(&self, unreachable: bool) {
        self.keys().unreachable = unreachable;
    }

    /// How many unwraps were asked for, refused ones included.
    #[must_use]
    pub fn unwraps(&self) -> usize {
        self.keys().unwraps
    }

    fn check(keys: &MemoryKeys, operation: &'static str, key_id: &str) -> Result<(), KmsError> {
        let (key_id, message) = (key_id.to_owned(), "refused by MemoryKms".to_owned());
        if keys.unreachable {
            let endpoint = "memory".to_owned();
            return Err(KmsError::Unreachable { operation, endpoint, key_id, message });
        }
        if keys.denied.contains(&key_id) {
            return Err(KmsError::AccessDenied { operation, key_id, message });
        }
        if keys.disabled.contains(&key_id) {
            return Err(KmsError::KeyDisabled { operation, key_id, message });
        }
        Ok(())
    }
}

fn toggle(set: &mut HashSet<String>, key_id: &str, on: bool) {
    if on {
        set.insert(key_id.to_owned());
    } else {
        set.remove(key_id);
    }
}

fn owned(context: WrapContext<'_>) -> Vec<(String, String)> {
    context.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[async_trait]
impl KeyWrapper for MemoryKms {
    fn key_id(&self) -> &str {
        &self.key_id
    }

    async fn wrap(
        &self,
        plaintext: &[u8],
        context: WrapContext<'_>,
        cancel: &CancellationToken,
    ) -> Result<Wrapped, KmsError> {
        if cancel.is_cancelled() {
            return Err(KmsError::Cancelled);
        }
        let mut keys = self.keys();
        Self::check(&keys, "Encrypt", &self.key_id)?;
        let mut handle = vec![0u8; 32];
        rand::rng().fill_bytes(&mut handle);
        let entry = MemoryBlob {
            key_id: self.key_id.clone(),
            context: owned(context),
            plaintext: plaintext.to_vec(),
        };
        keys.blobs.insert(handle.clone(), entry);
        Ok(Wrapped { key_id: self.key_id.clone(), blob: handle })
    }

    async fn unwrap(
        &self,
        key_id: &str,
        blob: &[u8],
        context: WrapContext<'_>,
        cancel: &CancellationToken,
    ) -> Result<Vec<u8>, KmsError> {
        if cancel.is_cancelled() {
            return Err(KmsError::Cancelled);
        }
        let mut keys = self.keys();
        keys.unwraps += 1;
        Self::check(&keys, "Decrypt", key_id)?;
        match keys.blobs.get(blob) {
            Some(wrap) if wrap.key_id == key_id && wrap.context == owned(context) => {
                Ok(wrap.plaintext.clone())
            }
            _ => Err(KmsError::InvalidCiphertext {
                key_id: key_id.to_owned(),
                message: "not a blob this key wrapped with this context".into(),
            }),
        }
    }
}

#[cfg(feature = "s3")]
mod aws {
    //! AWS KMS (or a service speaking its API) through the AWS SDK.

    use std::error::Error;
    use std::time::Duration;

    use async_trait::async_trait;
    use aws_credential_types::provider::error::CredentialsError;
    use aws_sdk_kms::config::retry::RetryConfig;
    use aws_sdk_kms::config::timeout::TimeoutConfig;
    use aws_sdk_kms::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_kms::error::{ProvideErrorMetadata, SdkError};
    use aws_sdk_kms::primitives::Blob;
    use tokio_util::sync::CancellationToken;

    use super::{KeyWrapper, KmsError, WrapContext, Wrapped};
    use crate::StaticCredentials;

    /// Region used with a custom endpoint when none is configured or in the key's ARN, and
    /// when neither they nor the environment name one.
    const FALLBACK_REGION: &str = "us-east-1";

    /// How to reach AWS KMS and which key wraps new secrets.
    #[derive(Debug, Clone)]
    pub struct KmsOptions {
        /// The key new secrets are wrapped with: a key id, key ARN, alias name
        /// (`alias/ferry`) or alias ARN.
        pub key_id: String,
        /// A custom endpoint (a KMS-compatible service, a test server); `None` for AWS.
        pub endpoint: Option<String>,
        /// The region for a `key_id` that is no ARN (an ARN's own region is used); `None`
        /// takes `us-east-1` with a custom endpoint, else the environment's (`AWS_REGION`,
        /// profile), else `us-east-1`.
        pub region: Option<String>,
        /// Fixed credentials; `None` uses the standard AWS credential chain.
        pub credentials: Option<StaticCredentials>,
        /// Attempts per request, the first included (SDK standard retry mode: throttling,
        /// 5xx, timeouts and connection failures retried with jittered backoff).
        pub max_attempts: u32,
        /// Limit for establishing a connection.
        pub connect_timeout: Duration,
        /// Limit from sending a request until the first byte of its response.
        pub read_timeout: Duration,
    }

    impl KmsOptions {
        /// Options for wrapping with `key_id`, everything else default.
        #[must_use]
        pub fn new(key_id: impl Into<String>) -> Self {
            Self {
                key_id: key_id.into(),
                endpoint: None,
                region: None,
                credentials: None,
                max_attempts: 4,
                connect_timeout: Duration::from_secs(10),
                read_timeout: Duration::from_secs(30),
            }
        }
    }

    /// The region named in a KMS key or alias ARN (`arn:aws:kms:eu-west-1:…`).
    pub(super) fn arn_region(key_id: &str) -> Option<&str> {
        let mut parts = key_id.split(':');
        let (arn, _partition, service, region) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        (arn == "arn" && service == "kms" && !region.is_empty()).then_some(region)
    }

    /// AWS KMS `Encrypt` and `Decrypt` of small secrets.
    #[derive(Clone)]
    pub struct AwsKms {
        client: aws_sdk_kms::Client,
        key_id: String,
        endpoint: String,
    }

    impl std::fmt::Debug for AwsKms {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("AwsKms")
                .field("key_id", &self.key_id)
                .field("endpoint", &self.endpoint)
                .finish_non_exhaustive()
        }
    }

    impl AwsKms {
        /// A client for `options`; loads the region and credentials from the environment
        /// where the options leave them open. Makes no call to KMS.
        ///
        /// # Errors
        /// [`KmsError::InvalidConfig`] for an empty key id or no attempts.
        pub async fn new(options: KmsOptions) -> Result<Self, KmsError> {
            if options.key_id.trim().is_empty() || options.max_attempts == 0 {
                return Err(KmsError::InvalidConfig {
                    message: "the KMS key id is empty, or attempts are 0".into(),
                });
            }
            let retry = RetryConfig::standard().with_max_attempts(options.max_attempts);
            let timeouts = TimeoutConfig::builder()
                .connect_timeout(options.connect_timeout)
                .read_timeout(options.read_timeout)
                .build();
            let mut loader = aws_config::defaults(BehaviorVersion::latest())
                .http_client(crate::aws_http_client())
                .retry_config(retry)
                .timeout_config(timeouts);
            // A key ARN says where the key is: calls elsewhere could not find it.
            let region = arn_region(&options.key_id)
                .map(str::to_owned)
                .or_else(|| options.region.clone())
                .or_else(|| options.endpoint.as_ref().map(|_| FALLBACK_REGION.to_owned()));
            if let Some(region) = region {
                loader = loader.region(Region::new(region));
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
            let mut builder = aws_sdk_kms::config::Builder::from(&shared);
            let region = shared.region().map_or(FALLBACK_REGION.to_owned(), ToString::to_string);
            if shared.region().is_none() {
                builder = builder.region(Region::from_static(FALLBACK_REGION));
            }
            if let Some(endpoint) = &options.endpoint {
                builder = builder.endpoint_url(endpoint.clone());
            }
            let endpoint =
                options.endpoint.clone().unwrap_or_else(|| format!("AWS KMS in {region}"));
            let client = aws_sdk_kms::Client::from_conf(builder.build());
            Ok(Self { client, key_id: options.key_id, endpoint })
        }

        /// Maps the SDK's `err` for `operation` with `key_id` to a [`KmsError`]. The SDK has
        /// already retried what it could.
        fn error<E>(
            &self,
            operation: &'static str,
            key_id: &str,
            err: &SdkError<E, aws_sdk_kms::config::http::HttpResponse>,
        ) -> KmsError
        where
            E: ProvideErrorMetadata + Error + Send + Sync + 'static,
        {
            let key_id = key_id.to_owned();
            let context = causes(err);
            if let Some(creds) = credentials_failure(err) {
                let message = format!("loading credentials: {}", causes(creds));
                // Missing or refused credentials will not come by retrying; a provider that
                // could not be reached (STS, instance metadata) may answer later.
                let refused = matches!(
                    creds,
                    CredentialsError::CredentialsNotLoaded(_)
                        | CredentialsError::InvalidConfiguration(_)
                ) || [
                    "AccessDenied",
                    "InvalidIdentityToken",
                    "ExpiredToken",
                    "IDPRejectedClaim",
                ]
                .iter()
                .any(|code| message.contains(code));
                if refused {
                    return KmsError::AccessDenied { operation, key_id, message };
                }
                let endpoint = self.endpoint.clone();
                return KmsError::Unreachable { operation, endpoint, key_id, message };
            }
            match err {
                SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => {
                    let endpoint = self.endpoint.clone();
                    return KmsError::Unreachable { operation, endpoint, key_id, message: context };
                }
                SdkError::ConstructionFailure(_) | SdkError::ResponseError(_) => {
                    return KmsError::Other { operation, key_id, message: context };
                }
                _ => {}
            }
            let code = err.code().unwrap_or_default();
            let status = err.raw_response().map(|r| r.status().as_u16());
            let message = match err.message() {
                Some(m) => format!("{code}: {m}"),
                None if code.is_empty() => context,
                None => code.to_owned(),
            };
            match classify(code, status) {
                Class::Denied => KmsError::AccessDenied { operation, key_id, message },
                Class::Disabled => KmsError::KeyDisabled { operation, key_id, message },
                Class::NotFound => KmsError::KeyNotFound { key_id, message },
                Class::Ciphertext => KmsError::InvalidCiphertext { key_id, message },
                Class::Transient => {
                    let endpoint = self.endpoint.clone();
                    KmsError::Unreachable { operation, endpoint, key_id, message }
                }
                Class::Other => KmsError::Other { operation, key_id, message },
            }
        }
    }

    /// What an error code (or, without one, an HTTP status) means for the caller.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Class {
        Denied,
        Disabled,
        NotFound,
        Ciphertext,
        Transient,
        Other,
    }

    pub(super) fn classify(code: &str, status: Option<u16>) -> Class {
        match code {
            "AccessDeniedException"
            | "UnrecognizedClientException"
            | "InvalidSignatureException"
            | "IncompleteSignature"
            | "ExpiredTokenException"
            | "InvalidClientTokenId"
            | "MissingAuthenticationToken" => Class::Denied,
            "DisabledException" | "KMSInvalidStateException" | "KeyUnavailableException" => {
                Class::Disabled
            }
            "NotFoundException" => Class::NotFound,
            "InvalidCiphertextException" | "IncorrectKeyException" => Class::Ciphertext,
            "ThrottlingException"
            | "LimitExceededException"
            | "KMSInternalException"
            | "DependencyTimeoutException"
            | "ServiceUnavailable"
            | "InternalFailure" => Class::Transient,
            _ => match status {
                Some(401 | 403) => Class::Denied,
                Some(404) => Class::NotFound,
                Some(429 | 500..=599) => Class::Transient,
                _ => Class::Other,
            },
        }
    }

    /// `err` and its causes on one line, each said once (the SDK's own rendering appends a
    /// debug dump a user cannot act on).
    fn causes(err: &(dyn Error + 'static)) -> String {
        let mut text = err.to_string();
        let mut current = err.source();
        // Error chains are short; the bound only guards against a cyclic one.
        for _ in 0..16 {
            let Some(e) = current else { break };
            let cause = e.to_string();
            if !text.contains(&cause) {
                text = format!("{text}: {cause}");
            }
            current = e.source();
        }
        text
    }

    /// The credential provider's failure behind `err`, if loading credentials is what failed.
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

    async fn until_cancelled<T>(
        cancel: &CancellationToken,
        work: impl Future<Output = Result<T, KmsError>>,
    ) -> Result<T, KmsError> {
        if cancel.is_cancelled() {
            return Err(KmsError::Cancelled);
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(KmsError::Cancelled),
            result = work => result,
        }
    }

    #[async_trait]
    impl KeyWrapper for AwsKms {
        fn key_id(&self) -> &str {
            &self.key_id
        }

        async fn wrap(
            &self,
            plaintext: &[u8],
            context: WrapContext<'_>,
            cancel: &CancellationToken,
        ) -> Result<Wrapped, KmsError> {
            let mut call =
                self.client.encrypt().key_id(&self.key_id).plaintext(Blob::new(plaintext));
            for (k, v) in context {
                call = call.encryption_context(*k, *v);
            }
            until_cancelled(cancel, async {
                let out = call.send().await.map_err(|e| self.error("Encrypt", &self.key_id, &e))?;
                let missing = |what: &str| KmsError::Other {
                    operation: "Encrypt",
                    key_id: self.key_id.clone(),
                    message: format!("the answer has no {what}"),
                };
                let blob = out.ciphertext_blob().ok_or_else(|| missing("ciphertext"))?;
                let key_id = out.key_id().ok_or_else(|| missing("key id"))?;
                Ok(Wrapped { key_id: key_id.to_owned(), blob: blob.as_ref().to_vec() })
            })
            .await
        }

        async fn unwrap(
            &self,
            key_id: &str,
            blob: &[u8],
            context: WrapContext<'_>,
            cancel: &CancellationToken,
        ) -> Result<Vec<u8>, KmsError> {
            let mut call = self.client.decrypt().key_id(key_id).ciphertext_blob(Blob::new(blob));
            for (k, v) in context {
                call = call.encryption_context(*k, *v);
            }
            until_cancelled(cancel, async {
                let out = call.send().await.map_err(|e| self.error("Decrypt", key_id, &e))?;
                let plaintext = out.plaintext().ok_or_else(|| KmsError::Other {
                    operation: "Decrypt",
                    key_id: key_id.to_owned(),
                    message: "the answer has no plaintext".into(),
                })?;
                Ok(plaintext.as_ref().to_vec())
            })
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTEXT: WrapContext<'static> = &[("ferry:purpose", "test")];

    #[tokio::test]
    async fn memory_kms_round_trips_and_refuses_like_a_service() -> Result<(), KmsError> {
        let cancel = CancellationToken::new();
        let kms = MemoryKms::new("key-a");
        let wrapped = kms.wrap(b"secret", CONTEXT, &cancel).await?;
        assert_eq!(wrapped.key_id, "key-a");
        assert_eq!(kms.unwrap("key-a", &wrapped.blob, CONTEXT, &cancel).await?, b"secret");
        let other_context: WrapContext<'_> = &[("ferry:purpose", "other")];
        let refused = kms.unwrap("key-a", &wrapped.blob, other_context, &cancel).await;
        assert!(matches!(refused, Err(KmsError::InvalidCiphertext { .. })), "{refused:?}");
        let refused = kms.using("key-b").unwrap("key-b", &wrapped.blob, CONTEXT, &cancel).await;
        assert!(matches!(refused, Err(KmsError::InvalidCiphertext { .. })), "{refused:?}");
        let mut altered = wrapped.blob.clone();
        altered[0] ^= 1;
        let refused = kms.unwrap("key-a", &altered, CONTEXT, &cancel).await;
        assert!(matches!(refused, Err(KmsError::InvalidCiphertext { .. })), "{refused:?}");

        kms.set_disabled("key-a", true);
        let refused = kms.unwrap("key-a", &wrapped.blob, CONTEXT, &cancel).await;
        assert!(matches!(refused, Err(KmsError::KeyDisabled { .. })), "{refused:?}");
        kms.set_disabled("key-a", false);
        kms.set_denied("key-a", true);
        let refused = kms.wrap(b"x", CONTEXT, &cancel).await;
        assert!(matches!(refused, Err(KmsError::AccessDenied { .. })), "{refused:?}");
        kms.set_denied("key-a", false);
        kms.set_unreachable(true);
        let refused = kms.unwrap("key-a", &wrapped.blob, CONTEXT, &cancel).await;
        assert!(refused.as_ref().is_err_and(KmsError::is_retryable), "{refused:?}");
        kms.set_unreachable(false);
        assert_eq!(kms.unwraps(), 6);

        cancel.cancel();
        let refused = kms.unwrap("key-a", &wrapped.blob, CONTEXT, &cancel).await;
        assert!(matches!(refused, Err(KmsError::Cancelled)), "{refused:?}");
        Ok(())
    }

    #[test]
    fn only_unreachable_is_retryable() {
        let denied = KmsError::AccessDenied {
            operation: "Decrypt",
            key_id: "k".into(),
            message: "no".into(),
        };
        assert!(!denied.is_retryable());
        assert!(denied.to_string().contains("grant this identity kms:Decrypt"), "{denied}");
    }

    #[cfg(feature = "s3")]
    mod aws {
        //! `AwsKms` against moto's KMS (moto serves it on the S3 port) and, for answers moto
        //! does not give (a disabled key refusing `Decrypt`: moto 5 ignores the key state),
        //! against a one-answer HTTP server playing AWS's reply.

        use std::time::Duration;

        use aws_sdk_kms::config::{BehaviorVersion, Credentials, Region};

        use super::super::aws::{Class, arn_region, classify};
        use super::*;
        use crate::StaticCredentials;

        const PURPOSE: WrapContext<'static> = &[("ferry:purpose", "repository key file")];

        fn options(endpoint: &str, key_id: &str) -> KmsOptions {
            KmsOptions {
                endpoint: Some(endpoint.to_owned()),
                region: Some("us-east-1".into()),
                credentials: Some(StaticCredentials {
                    access_key_id: "ferry-test".into(),
                    secret_access_key: "ferry-test-secret".into(),
                    session_token: None,
                }),
                max_attempts: 1,
                connect_timeout: Duration::from_secs(5),
                read_timeout: Duration::from_secs(20),
                ..KmsOptions::new(key_id)
            }
        }

        /// moto's endpoint and an admin client for it.
        fn moto() -> (String, aws_sdk_kms::Client) {
            ferry_testbed::install_crypto_provider();
            let endpoint = ferry_testbed::S3Server::shared().endpoint().to_owned();
            let config = aws_sdk_kms::Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .http_client(crate::aws_http_client())
                .region(Region::new("us-east-1"))
                .credentials_provider(Credentials::new("ferry-test", "secret", None, None, "t"))
                .endpoint_url(&endpoint)
                .build();
            (endpoint, aws_sdk_kms::Client::from_conf(config))
        }

        /// A new key's ARN.
        async fn create_key(admin: &aws_sdk_kms::Client) -> String {
            let out = admin.create_key().send().await.expect("CreateKey on moto");
            out.key_metadata().and_then(|m| m.arn()).expect("a key ARN").to_owned()
        }

        #[tokio::test]
        async fn wraps_under_an_alias_and_unwraps_by_the_key_arn() -> Result<(), KmsError> {
            let (endpoint, admin) = moto();
            let arn = create_key(&admin).await;
            let alias = "alias/ferry-store-kms-test";
            admin
                .create_alias()
                .alias_name(alias)
                .target_key_id(&arn)
                .send()
                .await
                .expect("CreateAlias on moto");
            let cancel = CancellationToken::new();
            let kms = AwsKms::new(options(&endpoint, alias)).await?;
            assert_eq!(kms.key_id(), alias);
            let wrapped = kms.wrap(b"sealed secret", PURPOSE, &cancel).await?;
            assert_eq!(wrapped.key_id, arn, "the canonical id is stored, not the alias");
            assert_eq!(kms.unwrap(&arn, &wrapped.blob, PURPOSE, &cancel).await?, b"sealed secret");

            let other: WrapContext<'_> = &[("ferry:purpose", "something else")];
            let refused = kms.unwrap(&arn, &wrapped.blob, other, &cancel).await;
            assert!(matches!(refused, Err(KmsError::InvalidCiphertext { .. })), "{refused:?}");
            let mut altered = wrapped.blob.clone();
            let last = altered.len() - 1;
            altered[last] ^= 1;
            let refused = kms.unwrap(&arn, &altered, PURPOSE, &cancel).await;
            assert!(matches!(refused, Err(KmsError::InvalidCiphertext { .. })), "{refused:?}");
            Ok(())
        }

        #[tokio::test]
        async fn a_missing_key_and_another_key_are_refused() -> Result<(), KmsError> {
            let (endpoint, admin) = moto();
            let cancel = CancellationToken::new();
            let missing =
                "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000";
            let kms = AwsKms::new(options(&endpoint, missing)).await?;
            let refused = kms.wrap(b"x", PURPOSE, &cancel).await;
            match &refused {
                Err(e @ KmsError::KeyNotFound { key_id, .. }) => {
                    assert_eq!(key_id, missing);
                    assert!(e.to_string().contains("check the key id"), "{e}");
                }
                other => panic!("expected KeyNotFound, got {other:?}"),
            }
            let (a, b) = (create_key(&admin).await, create_key(&admin).await);
            let kms = AwsKms::new(options(&endpoint, &a)).await?;
            let wrapped = kms.wrap(b"x", PURPOSE, &cancel).await?;
            // moto answers AccessDenied here, AWS IncorrectKeyException: both refuse.
            let refused = kms.unwrap(&b, &wrapped.blob, PURPOSE, &cancel).await;
            assert!(
                matches!(
                    refused,
                    Err(KmsError::AccessDenied { .. } | KmsError::InvalidCiphertext { .. })
                ),
                "{refused:?}"
            );
            Ok(())
        }

        #[tokio::test]
        async fn a_disabled_key_and_denied_access_say_what_to_do() -> Result<(), KmsError> {
            ferry_testbed::install_crypto_provider();
            let cancel = CancellationToken::new();
            let arn = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555";
            let disabled = ferry_testbed::kms::kms_disabled(arn).await;
            let kms = AwsKms::new(options(&disabled, arn)).await?;
            match kms.unwrap(arn, b"blob", PURPOSE, &cancel).await {
                Err(e @ KmsError::KeyDisabled { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains(arn) && text.contains("enable it"), "{text}");
                    assert!(!e.is_retryable());
                }
                other => panic!("expected KeyDisabled, got {other:?}"),
            }
            let denied =
                ferry_testbed::kms::kms_answering(400, "AccessDeniedException", "not authorized")
                    .await;
            let kms = AwsKms::new(options(&denied, arn)).await?;
            let refused = kms.unwrap(arn, b"blob", PURPOSE, &cancel).await;
            assert!(
                matches!(refused, Err(KmsError::AccessDenied { operation: "Decrypt", .. })),
                "{refused:?}"
            );
            Ok(())
        }

        #[tokio::test]
        async fn an_unreachable_service_is_retryable_and_names_the_endpoint() -> Result<(), KmsError>
        {
            ferry_testbed::install_crypto_provider();
            let port = {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
                listener.local_addr().expect("its address").port()
            };
            let endpoint = format!("http://127.0.0.1:{port}");
            let kms = AwsKms::new(options(&endpoint, "alias/any")).await?;
            let refused = kms.wrap(b"x", PURPOSE, &CancellationToken::new()).await;
            match refused {
                Err(e @ KmsError::Unreachable { .. }) => {
                    assert!(e.is_retryable());
                    assert!(e.to_string().contains(&endpoint), "{e}");
                }
                other => panic!("expected Unreachable, got {other:?}"),
            }
            let cancel = CancellationToken::new();
            cancel.cancel();
            let refused = kms.wrap(b"x", PURPOSE, &cancel).await;
            assert!(matches!(refused, Err(KmsError::Cancelled)), "{refused:?}");
            Ok(())
        }

        #[test]
        fn codes_and_statuses_are_classified() {
            assert_eq!(classify("DisabledException", Some(400)), Class::Disabled);
            assert_eq!(classify("KMSInvalidStateException", Some(400)), Class::Disabled);
            assert_eq!(classify("AccessDeniedException", Some(400)), Class::Denied);
            assert_eq!(classify("NotFoundException", Some(400)), Class::NotFound);
            assert_eq!(classify("IncorrectKeyException", Some(400)), Class::Ciphertext);
            assert_eq!(classify("ThrottlingException", Some(400)), Class::Transient);
            assert_eq!(classify("", Some(503)), Class::Transient);
            assert_eq!(classify("", Some(403)), Class::Denied);
            assert_eq!(classify("ValidationException", Some(400)), Class::Other);
        }

        #[test]
        fn the_region_of_an_arn_is_found() {
            assert_eq!(arn_region("arn:aws:kms:eu-west-1:1:key/abc"), Some("eu-west-1"));
            assert_eq!(arn_region("arn:aws:kms:eu-west-1:1:alias/ferry"), Some("eu-west-1"));
            assert_eq!(arn_region("alias/ferry"), None);
            assert_eq!(arn_region("arn:aws:s3:::bucket"), None);
            assert_eq!(arn_region("1234abcd-12ab-34cd-56ef-1234567890ab"), None);
        }
    }
}
