//! The repository passwords the agent reads from secrets in Velero's namespace.
//!
//! Ferry keys every new repository with its own secret, [`PASSWORD_SECRET`]: 32 random bytes,
//! hex-encoded, created by the first node that needs it (create; on AlreadyExists read the
//! winner's back, so racing nodes agree). Velero's [`VELERO_PASSWORD_SECRET`] is only read,
//! never created: Velero's server writes a published default into it, and earlier Ferry
//! versions keyed their repositories with it, so it is the fallback that opens those.
//! Password values are never logged.

use ferry_api::k8s_openapi::ByteString;
use ferry_api::k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

use crate::MoverError;

/// Ferry's own repository password secret in Velero's namespace.
pub const PASSWORD_SECRET: &str = "ferry-repo-credentials";
/// The key of the password in [`PASSWORD_SECRET`] (and in [`VELERO_PASSWORD_SECRET`]).
pub const PASSWORD_KEY: &str = "repository-password";
/// The key, in [`PASSWORD_SECRET`], of the password being rotated away from: a repository
/// only it opens gets a key for [`PASSWORD_KEY`]'s, proven, and loses the old one.
pub const PREVIOUS_PASSWORD_KEY: &str = "previous-repository-password";
/// Velero's repository password secret: read only to open repositories created with it.
pub const VELERO_PASSWORD_SECRET: &str = "velero-repo-credentials";

/// Reads the secrets of one namespace.
pub(crate) struct Secrets<'a> {
    pub(crate) client: &'a kube::Client,
    pub(crate) namespace: &'a str,
}

impl Secrets<'_> {
    fn api(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), self.namespace)
    }

    fn missing_key(&self, name: &str, key: &str, reason: &str) -> MoverError {
        MoverError::Secret {
            namespace: self.namespace.to_owned(),
            name: name.into(),
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The value of `key` in secret `name`; `None` when the secret does not exist.
    pub(crate) async fn value(&self, name: &str, key: &str) -> Result<Option<Vec<u8>>, MoverError> {
        Ok(self.versioned_value(name, key).await?.map(|(value, _)| value))
    }

    /// The value of `key` in secret `name` and the secret's `resourceVersion` (which changes
    /// whenever the secret does); `None` when the secret does not exist.
    pub(crate) async fn versioned_value(
        &self,
        name: &str,
        key: &str,
    ) -> Result<Option<(Vec<u8>, String)>, MoverError> {
        let secret = self.api().get_opt(name).await.map_err(|e| MoverError::Api {
            step: "reading a secret",
            source: Box::new(ferry_kube::ApiError::from_kube("Secret", name, e)),
        })?;
        let Some(secret) = secret else { return Ok(None) };
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        match secret.data.and_then(|d| d.get(key).cloned()).map(|b| b.0) {
            Some(v) if !v.is_empty() => Ok(Some((v, version))),
            Some(_) => Err(self.missing_key(name, key, "the password is empty")),
            None => Err(self.missing_key(name, key, "the secret has no such key")),
        }
    }

    /// Ferry's own repository password: [`PASSWORD_SECRET`], created with 32 random bytes
    /// (hex) when missing, and read back when another node created it first.
    pub(crate) async fn own_password(&self) -> Result<Vec<u8>, MoverError> {
        if let Some(p) = self.value(PASSWORD_SECRET, PASSWORD_KEY).await? {
            return Ok(p);
        }
        let password = hex::encode(rand::random::<[u8; 32]>()).into_bytes();
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(PASSWORD_SECRET.into()),
                namespace: Some(self.namespace.to_owned()),
                labels: Some([("app.kubernetes.io/name".to_owned(), "ferry".to_owned())].into()),
                ..Default::default()
            },
            data: Some([(PASSWORD_KEY.to_owned(), ByteString(password.clone()))].into()),
            ..Secret::default()
        };
        match self.api().create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(namespace = %self.namespace, secret = PASSWORD_SECRET, "created Ferry's repository password secret");
                Ok(password)
            }
            Err(e) => match ferry_kube::ApiError::from_kube("Secret", PASSWORD_SECRET, e) {
                ferry_kube::ApiError::AlreadyExists { .. } => {
                    self.value(PASSWORD_SECRET, PASSWORD_KEY).await?.ok_or_else(|| {
                        self.missing_key(
                            PASSWORD_SECRET,
                            PASSWORD_KEY,
                            "created by another node and then deleted",
                        )
                    })
                }
                source => Err(MoverError::Api {
                    step: "creating Ferry's repository password secret",
                    source: Box::new(source),
                }),
            },
        }
    }

    /// The previous password of Ferry's secret ([`PREVIOUS_PASSWORD_KEY`]), if one is set.
    pub(crate) async fn previous_password(&self) -> Result<Option<Vec<u8>>, MoverError> {
        let secret = self.api().get_opt(PASSWORD_SECRET).await.map_err(|e| MoverError::Api {
            step: "reading a secret",
            source: Box::new(ferry_kube::ApiError::from_kube("Secret", PASSWORD_SECRET, e)),
        })?;
        let data = secret.and_then(|s| s.data).unwrap_or_default();
        Ok(data.get(PREVIOUS_PASSWORD_KEY).map(|b| b.0.clone()).filter(|p| !p.is_empty()))
    }

    /// The password in Velero's [`VELERO_PASSWORD_SECRET`], if that secret exists.
    pub(crate) async fn velero_password(&self) -> Result<Option<Vec<u8>>, MoverError> {
        self.value(VELERO_PASSWORD_SECRET, PASSWORD_KEY).await
    }
}
