//! A namespace playing Velero's, on the shared real API server, with a BSL over a fresh moto
//! bucket: what the `BslRepositories` tests start from.

#![allow(dead_code)] // Each test file uses a part.

use std::sync::Arc;

use ferry_api::k8s_openapi::api::core::v1::Secret;
use ferry_mover::{BslRepositories, PASSWORD_KEY};
use ferry_repo::{InitOptions, KdfParams};
use ferry_store::{ObjectStore, S3Config, S3Options, S3Store, StaticCredentials};
use ferry_testbed::{ControlPlane, S3Server};
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub const PREFIX: &str = "velero";
pub const BSL: &str = "default";
pub const SOURCE_NS: &str = "app";

/// Fast key derivation: these tests are not about the KDF.
pub fn fast() -> InitOptions {
    InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() }
}

/// A namespace playing Velero's, with a BSL `default` over a fresh moto bucket.
pub struct World {
    pub client: kube::Client,
    pub namespace: String,
    pub bucket: String,
}

impl World {
    pub async fn new(name: &str) -> Self {
        ferry_testbed::install_crypto_provider();
        let cp = ControlPlane::shared();
        let client = cp.client().expect("client");
        let namespace = cp.unique_namespace(name).await.expect("namespace");
        let bucket = namespace.clone();
        let s3 = S3Server::shared();
        s3.create_bucket(&bucket).expect("bucket");
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "cloud-credentials", "namespace": namespace },
            "stringData": {
                "cloud": "[default]\naws_access_key_id = t\naws_secret_access_key = s\n",
            },
        }))
        .expect("secret");
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        secrets.create(&PostParams::default(), &secret).await.expect("create secret");
        let world = Self { client, namespace, bucket };
        world.add_bsl(BSL, s3.endpoint()).await;
        world
    }

    /// Adds a BSL `name` over this world's bucket at `endpoint`.
    pub async fn add_bsl(&self, name: &str, endpoint: &str) {
        let bsl: ferry_api::BackupStorageLocation = serde_json::from_value(json!({
            "apiVersion": "velero.io/v1", "kind": "BackupStorageLocation",
            "metadata": { "name": name, "namespace": self.namespace },
            "spec": {
                "provider": "aws",
                "objectStorage": { "bucket": self.bucket, "prefix": PREFIX },
                "config": { "region": "us-east-1", "s3Url": endpoint },
            },
        }))
        .expect("bsl");
        let bsls: Api<ferry_api::BackupStorageLocation> =
            Api::namespaced(self.client.clone(), &self.namespace);
        bsls.create(&PostParams::default(), &bsl).await.expect("create bsl");
    }

    /// Merges `spec` into the BSL `name`'s spec.
    pub async fn patch_bsl(&self, name: &str, spec: serde_json::Value) {
        let bsls: Api<ferry_api::BackupStorageLocation> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let patch = kube::api::Patch::Merge(json!({ "spec": spec }));
        bsls.patch(name, &kube::api::PatchParams::default(), &patch).await.expect("patch bsl");
    }

    pub fn source(&self) -> BslRepositories {
        BslRepositories::new(self.client.clone(), &self.namespace, fast())
    }

    pub async fn store(&self, prefix: &str) -> Arc<dyn ObjectStore> {
        let config = S3Config {
            bucket: self.bucket.clone(),
            prefix: prefix.into(),
            options: S3Options {
                endpoint: Some(S3Server::shared().endpoint().into()),
                region: Some("us-east-1".into()),
                force_path_style: true,
                credentials: Some(StaticCredentials {
                    access_key_id: "t".into(),
                    secret_access_key: "s".into(),
                    session_token: None,
                }),
                ..S3Options::default()
            },
        };
        Arc::new(S3Store::new(config).await.expect("store"))
    }

    pub async fn keys(&self) -> Vec<String> {
        let cancel = CancellationToken::new();
        let listed = self.store("").await.list("", &cancel).await.expect("list");
        listed.into_iter().map(|m| m.key.as_str().to_owned()).collect()
    }

    pub async fn put_secret(&self, name: &str, password: &[u8]) {
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "namespace": self.namespace },
            "stringData": { PASSWORD_KEY: String::from_utf8_lossy(password) },
        }))
        .expect("secret");
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        secrets.create(&PostParams::default(), &secret).await.expect("create secret");
    }

    pub async fn secret(&self, name: &str) -> Option<Vec<u8>> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = secrets.get_opt(name).await.expect("get secret")?;
        Some(secret.data.expect("data")[PASSWORD_KEY].0.clone())
    }
}
