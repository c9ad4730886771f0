//! The KMS envelope of the agent's repositories, as Ferry's secret asks for it.
//!
//! With [`KMS_KEY_ID_KEY`] set in [`PASSWORD_SECRET`], each repository of a
//! BackupStorageLocation is opened through AWS KMS ([`AwsKms`]) in the location's region (a
//! key ARN's own region wins), with the credentials its S3 store gets (the AWS chain when it
//! gets none), at [`KMS_ENDPOINT_KEY`] when set: a new repository's first key file is wrapped
//! by that key as well as the password, and so is every key file the agent adds later (a
//! rotation, a key for Ferry's password); key files wrapped by a KMS key open, password-only
//! ones open as before. Without it there is no KMS client, and a repository whose key files
//! all need one fails naming the key and the setting.

use std::sync::Arc;

use ferry_repo::{InitOptions, KeyId, OpenOptions, RepoError};
use ferry_store::{AwsKms, KeyWrapper, KmsError, KmsOptions, S3Options};

use crate::MoverError;
use crate::secrets::{KMS_ENDPOINT_KEY, KMS_KEY_ID_KEY, KmsSettings, PASSWORD_SECRET};

/// How the repositories of one location are opened and created: through a KMS or not.
#[derive(Debug, Clone)]
pub(crate) struct Envelope {
    /// Velero's namespace, where Ferry's secret is.
    namespace: String,
    /// The settings and the client made from them; `None` for passwords only.
    kms: Option<(KmsSettings, Arc<dyn KeyWrapper>)>,
}

impl Envelope {
    /// The envelope `settings` ask for, with a KMS client in the region and with the
    /// credentials of `s3` (the location's S3 store options). Makes no call to KMS.
    ///
    /// # Errors
    /// [`MoverError::Secret`] naming [`KMS_KEY_ID_KEY`] when no client can be made for it.
    pub(crate) async fn new(
        namespace: &str,
        settings: Option<&KmsSettings>,
        s3: &S3Options,
    ) -> Result<Self, MoverError> {
        let Some(settings) = settings else {
            return Ok(Self { namespace: namespace.to_owned(), kms: None });
        };
        let options = KmsOptions {
            endpoint: settings.endpoint.clone(),
            region: s3.region.clone(),
            credentials: s3.credentials.clone(),
            ..KmsOptions::new(settings.key_id.clone())
        };
        let client = AwsKms::new(options).await.map_err(|e| MoverError::Secret {
            namespace: namespace.to_owned(),
            name: PASSWORD_SECRET.to_owned(),
            key: KMS_KEY_ID_KEY.to_owned(),
            reason: format!("no KMS client for {}: {e}", settings.key_id),
        })?;
        let wrapper: Arc<dyn KeyWrapper> = Arc::new(client);
        Ok(Self { namespace: namespace.to_owned(), kms: Some((settings.clone(), wrapper)) })
    }

    /// The KMS, if any.
    fn wrapper(&self) -> Option<Arc<dyn KeyWrapper>> {
        self.kms.as_ref().map(|(_, wrapper)| Arc::clone(wrapper))
    }

    /// The KMS key new key files are wrapped by, if any.
    pub(crate) fn key_id(&self) -> Option<&str> {
        self.kms.as_ref().map(|(settings, _)| settings.key_id.as_str())
    }

    /// Options for an open trying `hint` first.
    pub(crate) fn open_options(&self, hint: Option<KeyId>) -> OpenOptions {
        OpenOptions { hint, key_wrapper: self.wrapper(), ..OpenOptions::default() }
    }

    /// `init` with this envelope's KMS.
    pub(crate) fn init_options(&self, init: &InitOptions) -> InitOptions {
        InitOptions { key_wrapper: self.wrapper(), ..init.clone() }
    }

    /// The error of `step` on the repository at `location`: [`MoverError::Kms`] when the KMS
    /// envelope failed, naming the settings of Ferry's secret and what to do, else
    /// [`MoverError::Repo`].
    pub(crate) fn error(
        &self,
        step: &'static str,
        location: &str,
        source: RepoError,
    ) -> MoverError {
        let secret = format!("{}/{PASSWORD_SECRET}", self.namespace);
        let kms = match (&source, &self.kms) {
            (RepoError::Kms { source: kms_error, .. }, Some((settings, _))) => {
                let endpoint = settings.endpoint.as_deref().map_or_else(
                    || "AWS KMS of the BackupStorageLocation's region".to_owned(),
                    |e| format!("{KMS_ENDPOINT_KEY} {e}"),
                );
                let fix = match kms_error.as_ref() {
                    KmsError::Unreachable { .. } => format!(
                        ": check {KMS_ENDPOINT_KEY} in {secret} and that the agents' nodes reach \
                         it; the next attempt may succeed"
                    ),
                    KmsError::AccessDenied { .. } => ": the agents call KMS with the \
                        BackupStorageLocation's credentials, which need kms:Encrypt and \
                        kms:Decrypt on the key"
                        .to_owned(),
                    _ => String::new(),
                };
                format!(
                    "KMS key {} from {KMS_KEY_ID_KEY} in {secret}, at {endpoint}{fix}",
                    settings.key_id
                )
            }
            (RepoError::Kms { .. }, None) => format!("no {KMS_KEY_ID_KEY} in {secret}"),
            (RepoError::KmsKeyNeeded { .. }, None) => format!(
                "{secret} has no {KMS_KEY_ID_KEY}: set it to a KMS key (and {KMS_ENDPOINT_KEY} \
                 for an endpoint other than AWS's) so that the agents open repositories \
                 through KMS, and grant the BackupStorageLocation's credentials kms:Decrypt \
                 on the key named here"
            ),
            _ => {
                return MoverError::Repo {
                    step,
                    location: location.to_owned(),
                    source: Box::new(source),
                };
            }
        };
        MoverError::Kms { step, location: location.to_owned(), kms, source: Box::new(source) }
    }
}

#[cfg(test)]
mod tests {
    use ferry_store::MemoryKms;

    use super::*;

    fn envelope(kms: Option<(&str, Option<&str>)>) -> Envelope {
        Envelope {
            namespace: "velero".into(),
            kms: kms.map(|(key_id, endpoint)| {
                let settings =
                    KmsSettings { key_id: key_id.into(), endpoint: endpoint.map(str::to_owned) };
                let wrapper: Arc<dyn KeyWrapper> = Arc::new(MemoryKms::new(key_id));
                (settings, wrapper)
            }),
        }
    }

    fn refused(source: KmsError) -> RepoError {
        RepoError::Kms { step: "wrap a new key file", key: None, source: Box::new(source) }
    }

    #[test]
    fn kms_failures_name_the_key_the_setting_and_what_to_do() {
        let key = "arn:aws:kms:eu-west-1:111122223333:key/ferry";
        let with_kms = envelope(Some((key, None)));
        let denied = refused(KmsError::AccessDenied {
            operation: "Encrypt",
            key_id: key.into(),
            message: "not authorized".into(),
        });
        let err = with_kms.error("creating", "s3://b/p", denied);
        assert!(matches!(err, MoverError::Kms { .. }), "{err:?}");
        let text = ferry_agent::error_chain(&err);
        for part in [key, "kms-key-id in velero/ferry-repo-credentials", "kms:Encrypt", "s3://b/p"]
        {
            assert!(text.contains(part), "{part:?} not in: {text}");
        }
        assert_eq!(text.matches("not authorized").count(), 1, "the cause once: {text}");

        let at = envelope(Some((key, Some("https://kms.internal"))));
        let unreachable = refused(KmsError::Unreachable {
            operation: "Decrypt",
            endpoint: "https://kms.internal".into(),
            key_id: key.into(),
            message: "connection refused".into(),
        });
        let text = at.error("opening", "s3://b/p", unreachable).to_string();
        assert!(text.contains("check kms-endpoint") && text.contains(key), "{text}");

        let needed = RepoError::KmsKeyNeeded { key_ids: vec![key.into()] };
        let text = envelope(None).error("opening", "s3://b/p", needed).to_string();
        assert!(text.contains("has no kms-key-id: set it") && text.contains(key), "{text}");

        let other = envelope(Some((key, None))).error(
            "opening",
            "s3://b/p",
            RepoError::WrongPassword { tried: 1, untried: None },
        );
        assert!(matches!(other, MoverError::Repo { .. }), "{other:?}");
    }
}
