//! Where a CR's repository is, and opening it (created on first use).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_api::BackupStorageLocation;
use ferry_api::k8s_openapi::ByteString;
use ferry_api::k8s_openapi::api::core::v1::Secret;
use ferry_repo::{CacheOptions, InitOptions, Repository};
use ferry_store::{ObjectStore, S3Config, S3Options, S3Store};
use kube::api::{Api, PostParams};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::{MoverError, aws_credentials, location_of};

/// Velero's repository password secret, which Ferry shares.
pub const PASSWORD_SECRET: &str = "velero-repo-credentials";
/// The key of the password in [`PASSWORD_SECRET`].
pub const PASSWORD_KEY: &str = "repository-password";

/// Finds and opens the repository for a BackupStorageLocation and source namespace.
#[async_trait]
pub trait RepositorySource: Send + Sync + 'static {
    /// The repository (created if it does not exist yet) and a description of where it is.
    ///
    /// # Errors
    /// [`MoverError`] naming the unusable location, secret or storage.
    async fn open(
        &self,
        location: &str,
        namespace: &str,
        cancel: &CancellationToken,
    ) -> Result<(Repository, String), MoverError>;
}

/// One repository for every location and namespace (a single-repository setup, the demo).
#[derive(Debug, Clone)]
pub struct FixedRepository {
    repo: Repository,
    location: String,
}

impl FixedRepository {
    /// Serves `repo`, described as `location` in messages.
    #[must_use]
    pub fn new(repo: Repository, location: impl Into<String>) -> Self {
        Self { repo, location: location.into() }
    }
}

#[async_trait]
impl RepositorySource for FixedRepository {
    async fn open(
        &self,
        _location: &str,
        _namespace: &str,
        _cancel: &CancellationToken,
    ) -> Result<(Repository, String), MoverError> {
        Ok((self.repo.clone(), self.location.clone()))
    }
}

/// Repositories per BackupStorageLocation and namespace, as Velero keeps them. See the crate
/// docs. Opened repositories are kept for reuse.
pub struct BslRepositories {
    client: kube::Client,
    namespace: String,
    init: InitOptions,
    cache: Option<CacheOptions>,
    open: Mutex<HashMap<(String, String), (Repository, String)>>,
}

impl std::fmt::Debug for BslRepositories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BslRepositories")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl BslRepositories {
    /// Reads BSLs and secrets in Velero's namespace `namespace`; new repositories get `init`.
    #[must_use]
    pub fn new(client: kube::Client, namespace: impl Into<String>, init: InitOptions) -> Self {
        Self { client, namespace: namespace.into(), init, cache: None, open: Mutex::default() }
    }

    /// Gives every repository opened a local cache in `cache` (see [`CacheOptions`]).
    #[must_use]
    pub fn with_cache(mut self, cache: Option<CacheOptions>) -> Self {
        self.cache = cache;
        self
    }

    async fn secret_value(&self, name: &str, key: &str) -> Result<Option<Vec<u8>>, MoverError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = secrets.get_opt(name).await.map_err(|e| MoverError::Api {
            step: "reading a secret",
            source: Box::new(ferry_kube::ApiError::from_kube("Secret", name, e)),
        })?;
        let Some(secret) = secret else { return Ok(None) };
        let value = secret.data.and_then(|d| d.get(key).cloned()).map(|b| b.0);
        match value {
            Some(v) => Ok(Some(v)),
            None => Err(MoverError::Secret {
                namespace: self.namespace.clone(),
                name: name.into(),
                key: key.into(),
                reason: "the secret has no such key".into(),
            }),
        }
    }

    /// The repository password; created (random) when the secret does not exist, and read
    /// back when another node created it first.
    async fn password(&self) -> Result<Vec<u8>, MoverError> {
        if let Some(p) = self.secret_value(PASSWORD_SECRET, PASSWORD_KEY).await? {
            return Ok(p);
        }
        let password = hex::encode(rand::random::<[u8; 32]>());
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(PASSWORD_SECRET.into()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            data: Some(
                [(PASSWORD_KEY.to_owned(), ByteString(password.clone().into_bytes()))].into(),
            ),
            ..Secret::default()
        };
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(password.into_bytes()),
            Err(e) => match ferry_kube::ApiError::from_kube("Secret", PASSWORD_SECRET, e) {
                ferry_kube::ApiError::AlreadyExists { .. } => self
                    .secret_value(PASSWORD_SECRET, PASSWORD_KEY)
                    .await?
                    .ok_or_else(|| MoverError::Secret {
                        namespace: self.namespace.clone(),
                        name: PASSWORD_SECRET.into(),
                        key: PASSWORD_KEY.into(),
                        reason: "created by another node and then deleted".into(),
                    }),
                source => Err(MoverError::Api {
                    step: "creating the password secret",
                    source: Box::new(source),
                }),
            },
        }
    }

    async fn store_for(
        &self,
        location: &str,
        namespace: &str,
    ) -> Result<(Arc<dyn ObjectStore>, String), MoverError> {
        let bsls: Api<BackupStorageLocation> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let bsl = bsls
            .get_opt(location)
            .await
            .map_err(|e| MoverError::Api {
                step: "reading the BackupStorageLocation",
                source: Box::new(ferry_kube::ApiError::from_kube(
                    "BackupStorageLocation",
                    location,
                    e,
                )),
            })?
            .ok_or_else(|| MoverError::Location {
                name: location.into(),
                reason: format!("not found in namespace {}", self.namespace),
            })?;
        let loc = location_of(&bsl)?;
        let (secret, key) = &loc.credential;
        let credentials = match self.secret_value(secret, key).await? {
            Some(text) => {
                Some(aws_credentials(&String::from_utf8_lossy(&text), &loc.profile).map_err(
                    |reason| MoverError::Secret {
                        namespace: self.namespace.clone(),
                        name: secret.clone(),
                        key: key.clone(),
                        reason,
                    },
                )?)
            }
            // No secret: the standard AWS chain (IRSA, instance roles, environment).
            None => None,
        };
        let prefix = [loc.prefix.trim_matches('/'), "ferry", namespace]
            .iter()
            .filter(|p| !p.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("/");
        let described = format!("s3://{}/{prefix}", loc.bucket);
        let config = S3Config {
            bucket: loc.bucket,
            prefix,
            options: S3Options {
                endpoint: loc.endpoint.clone(),
                region: loc.region,
                force_path_style: loc.force_path_style || loc.endpoint.is_some(),
                credentials,
                ..S3Options::default()
            },
        };
        let store = S3Store::new(config).await.map_err(|source| MoverError::Store {
            location: described.clone(),
            source: Box::new(source),
        })?;
        Ok((Arc::new(store), described))
    }
}

#[async_trait]
impl RepositorySource for BslRepositories {
    async fn open(
        &self,
        location: &str,
        namespace: &str,
        cancel: &CancellationToken,
    ) -> Result<(Repository, String), MoverError> {
        let key = (location.to_owned(), namespace.to_owned());
        let mut open = self.open.lock().await;
        if let Some(found) = open.get(&key) {
            return Ok(found.clone());
        }
        let (store, described) = self.store_for(location, namespace).await?;
        let password = self.password().await?;
        let (repo, _) =
            Repository::init(store, &password, &self.init, cancel).await.map_err(|source| {
                MoverError::Repo {
                    step: "opening or creating the repository",
                    location: described.clone(),
                    source: Box::new(source),
                }
            })?;
        if let Some(cache) = &self.cache {
            repo.set_cache(cache);
        }
        open.insert(key, (repo.clone(), described.clone()));
        Ok((repo, described))
    }
}
