//! The repository passwords the agent reads from secrets in Velero's namespace.
//!
//! Ferry keys every new repository with its own secret, [`PASSWORD_SECRET`]: 32 random bytes,
//! hex-encoded, created by the first node that needs it (create; on AlreadyExists read the
//! winner's back, so racing nodes agree). Velero's [`VELERO_PASSWORD_SECRET`] is only read,
//! never created: Velero's server writes a published default into it, and earlier Ferry
//! versions keyed their repositories with it: it recognizes those, which are refused unless
//! the agent adopts them (`BslRepositories::adopting_velero_keyed`).
//! Password values are never logged.
//!
//! Ferry's secret may also name a KMS key ([`KMS_KEY_ID_KEY`], and [`KMS_ENDPOINT_KEY`]) that
//! wraps new repositories' key files as well as the password (see `crate::kms`).

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
/// The key, in [`PASSWORD_SECRET`], of a KMS key (key ARN, key id or alias) that wraps the key
/// files of new repositories as well as the password; when set, every repository is opened
/// through KMS, so key files wrapped by a KMS key open (password-only ones still do).
pub const KMS_KEY_ID_KEY: &str = "kms-key-id";
/// The key, in [`PASSWORD_SECRET`], of the KMS endpoint URL to use instead of AWS's for the
/// BackupStorageLocation's region (a VPC or FIPS endpoint, a KMS-compatible service). Only
/// with [`KMS_KEY_ID_KEY`].
pub const KMS_ENDPOINT_KEY: &str = "kms-endpoint";

/// The KMS settings of Ferry's secret ([`KMS_KEY_ID_KEY`], [`KMS_ENDPOINT_KEY`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KmsSettings {
    /// The KMS key new key files are wrapped by.
    pub(crate) key_id: String,
    /// The endpoint instead of AWS's for the region.
    pub(crate) endpoint: Option<String>,
}

/// What a repository open depends on in Ferry's secret besides its passwords.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OwnSettings {
    /// The secret's `resourceVersion` (empty while there is no secret): it changes with any
    /// of its keys, passwords and KMS settings alike.
    pub(crate) version: String,
    /// The KMS envelope asked for; `None` for passwords only.
    pub(crate) kms: Option<KmsSettings>,
}

/// The KMS settings in the data of Ferry's secret: `None` without [`KMS_KEY_ID_KEY`]. Values
/// are trimmed (a file given to `kubectl create secret --from-file` often ends in a newline).
///
/// # Errors
/// The key and what is wrong with its value: not UTF-8, empty, an endpoint that is not an
/// http(s) URL, or an endpoint without a key id.
fn kms_settings(
    data: &std::collections::BTreeMap<String, ByteString>,
) -> Result<Option<KmsSettings>, (&'static str, String)> {
    let text = |key: &'static str| -> Result<Option<String>, (&'static str, String)> {
        let Some(value) = data.get(key) else { return Ok(None) };
        let value = std::str::from_utf8(&value.0)
            .map_err(|_| (key, "the value is not UTF-8 text".to_owned()))?
            .trim();
        if value.is_empty() {
            return Err((key, "the value is empty: remove the key, or set it".to_owned()));
        }
        Ok(Some(value.to_owned()))
    };
    let (key_id, endpoint) = (text(KMS_KEY_ID_KEY)?, text(KMS_ENDPOINT_KEY)?);
    if let Some(endpoint) = &endpoint {
        let url = endpoint.to_ascii_lowercase();
        let (scheme, rest) = url.split_once("://").unwrap_or(("", &url));
        // Checked first and never echoed: it may carry a password. The agents sign KMS
        // requests with the BackupStorageLocation's credentials.
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err((
                KMS_ENDPOINT_KEY,
                "the URL carries credentials (user@host): remove them; KMS requests are signed \
                 with the BackupStorageLocation's credentials"
                    .to_owned(),
            ));
        }
        if scheme != "https" && scheme != "http" {
            return Err((
                KMS_ENDPOINT_KEY,
                format!("{endpoint:?} is not an http:// or https:// URL"),
            ));
        }
    }
    match (key_id, endpoint) {
        (Some(key_id), endpoint) => Ok(Some(KmsSettings { key_id, endpoint })),
        (None, Some(_)) => Err((
            KMS_ENDPOINT_KEY,
            format!("it is set without {KMS_KEY_ID_KEY}: set the KMS key too, or remove it"),
        )),
        (None, None) => Ok(None),
    }
}

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

    /// The `resourceVersion` and KMS settings of Ferry's secret (defaults while it does not
    /// exist: the first open creates it, with a password only).
    pub(crate) async fn own_settings(&self) -> Result<OwnSettings, MoverError> {
        let secret = self.api().get_opt(PASSWORD_SECRET).await.map_err(|e| MoverError::Api {
            step: "reading a secret",
            source: Box::new(ferry_kube::ApiError::from_kube("Secret", PASSWORD_SECRET, e)),
        })?;
        let Some(secret) = secret else { return Ok(OwnSettings::default()) };
        let version = secret.metadata.resource_version.unwrap_or_default();
        let kms = kms_settings(&secret.data.unwrap_or_default())
            .map_err(|(key, reason)| self.missing_key(PASSWORD_SECRET, key, &reason))?;
        Ok(OwnSettings { version, kms })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &[u8])]) -> std::collections::BTreeMap<String, ByteString> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec()))).collect()
    }

    #[test]
    fn kms_settings_are_read_trimmed_and_checked() {
        assert_eq!(kms_settings(&data(&[(PASSWORD_KEY, b"pw")])), Ok(None));
        assert_eq!(
            kms_settings(&data(&[(KMS_KEY_ID_KEY, b" alias/ferry\n")])),
            Ok(Some(KmsSettings { key_id: "alias/ferry".into(), endpoint: None }))
        );
        assert_eq!(
            kms_settings(&data(&[
                (KMS_KEY_ID_KEY, b"alias/ferry"),
                (KMS_ENDPOINT_KEY, b"https://kms-fips.us-east-1.amazonaws.com\n"),
            ])),
            Ok(Some(KmsSettings {
                key_id: "alias/ferry".into(),
                endpoint: Some("https://kms-fips.us-east-1.amazonaws.com".into()),
            }))
        );
        let refused = |pairs: &[(&str, &[u8])]| kms_settings(&data(pairs)).expect_err("refused");
        assert_eq!(refused(&[(KMS_KEY_ID_KEY, b" \n")]).0, KMS_KEY_ID_KEY);
        assert_eq!(refused(&[(KMS_KEY_ID_KEY, b"\xff")]).0, KMS_KEY_ID_KEY);
        let (key, reason) = refused(&[(KMS_ENDPOINT_KEY, b"https://kms.example")]);
        assert!(key == KMS_ENDPOINT_KEY && reason.contains(KMS_KEY_ID_KEY), "{reason}");
        let (key, reason) =
            refused(&[(KMS_KEY_ID_KEY, b"alias/ferry"), (KMS_ENDPOINT_KEY, b"kms.example:443")]);
        assert!(key == KMS_ENDPOINT_KEY && reason.contains("not an http"), "{reason}");
        let (key, reason) = refused(&[
            (KMS_KEY_ID_KEY, b"alias/ferry"),
            (KMS_ENDPOINT_KEY, b"https://admin:hunter2@kms.example/x"),
        ]);
        assert!(key == KMS_ENDPOINT_KEY && reason.contains("carries credentials"), "{reason}");
        assert!(!reason.contains("hunter2"), "the password is never echoed: {reason}");
        let (key, reason) = refused(&[
            (KMS_KEY_ID_KEY, b"alias/ferry"),
            (KMS_ENDPOINT_KEY, b"admin:hunter2@kms.example"),
        ]);
        assert!(
            key == KMS_ENDPOINT_KEY && !reason.contains("hunter2"),
            "without a scheme: {reason}"
        );
        let query = data(&[
            (KMS_KEY_ID_KEY, b"alias/ferry"),
            (KMS_ENDPOINT_KEY, b"https://kms.example/?u=a@b"),
        ]);
        assert!(kms_settings(&query).is_ok(), "an @ after the host is not a credential");
    }
}
