//! The KMS envelope of the agent's repositories (real API server, moto's S3 and KMS on the same
//! endpoint): `kms-key-id` in Ferry's secret puts new repositories under that key, leaves
//! password-only ones opening as before, is picked up by repositories kept open, and a key the
//! KMS refuses fails the DataUpload naming the key and what to do.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{BSL, SOURCE_NS, World, fast};
use ferry_agent::{DataMover, ExposedVolume, ProgressSink, VolumeMode, WorkError, error_chain};
use ferry_api::k8s_openapi::api::core::v1::Secret;
use ferry_api::{DataDownload, DataUpload};
use ferry_mover::{
    KMS_ENDPOINT_KEY, KMS_KEY_ID_KEY, MoverError, PASSWORD_KEY, PASSWORD_SECRET,
    PREVIOUS_PASSWORD_KEY, RepoMover, RepositorySource,
};
use ferry_repo::{OpenOptions, RepoError, Repository};
use ferry_store::{AwsKms, KeyWrapper, KmsOptions, ObjectStore, StaticCredentials};
use ferry_testbed::S3Server;
use ferry_testbed::kms;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const PASSWORD: &str = "a long enough password for the agents' repositories";
/// Where the repository of namespace [`SOURCE_NS`] is in the world's bucket.
const REPOSITORY: &str = "velero/plugins/ferry/app";

/// moto's endpoint, which serves KMS beside S3.
fn moto() -> String {
    ferry_testbed::install_crypto_provider();
    S3Server::shared().endpoint().to_owned()
}

/// A KMS client for `key_id` at `endpoint`, as an operator's `ferry` would use it.
async fn aws_kms(endpoint: &str, key_id: &str) -> Arc<dyn KeyWrapper> {
    let options = KmsOptions {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        credentials: Some(StaticCredentials {
            access_key_id: "t".into(),
            secret_access_key: "s".into(),
            session_token: None,
        }),
        max_attempts: 1,
        ..KmsOptions::new(key_id)
    };
    Arc::new(AwsKms::new(options).await.expect("a KMS client"))
}

/// Creates Ferry's secret with [`PASSWORD`] and `extra` keys.
async fn own_secret(world: &World, extra: &[(&str, &str)]) {
    let mut data: BTreeMap<&str, &str> = extra.iter().copied().collect();
    data.insert(PASSWORD_KEY, PASSWORD);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": PASSWORD_SECRET, "namespace": world.namespace },
        "stringData": data,
    }))
    .expect("secret");
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &world.namespace);
    secrets.create(&PostParams::default(), &secret).await.expect("create Ferry's secret");
}

/// Sets keys of Ferry's secret.
async fn patch_own_secret(world: &World, keys: &[(&str, &str)]) {
    let data: BTreeMap<&str, &str> = keys.iter().copied().collect();
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &world.namespace);
    let patch = Patch::Merge(json!({ "stringData": data }));
    secrets.patch(PASSWORD_SECRET, &PatchParams::default(), &patch).await.expect("patch secret");
}

fn upload(name: &str) -> DataUpload {
    serde_json::from_value(json!({
        "apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
        "metadata": { "name": name, "namespace": "velero" },
        "spec": {
            "snapshotType": "CSI", "sourcePVC": "data", "datamover": "ferry",
            "backupStorageLocation": BSL, "sourceNamespace": SOURCE_NS,
            "operationTimeout": "10m0s",
        },
    }))
    .expect("DataUpload")
}

fn download(snapshot: &str) -> DataDownload {
    serde_json::from_value(json!({
        "apiVersion": "velero.io/v2alpha1", "kind": "DataDownload",
        "metadata": { "name": "dd-1", "namespace": "velero" },
        "spec": {
            "targetVolume": { "pvc": "data", "namespace": SOURCE_NS, "pv": "" },
            "datamover": "ferry", "backupStorageLocation": BSL,
            "sourceNamespace": SOURCE_NS, "snapshotID": snapshot, "operationTimeout": "10m0s",
        },
    }))
    .expect("DataDownload")
}

/// A file-system volume as the exposer hands it over: opened where it was found.
fn opened(path: &std::path::Path) -> ExposedVolume {
    let root = std::fs::File::open(path).expect("open the volume");
    ExposedVolume {
        node: "node-a".into(),
        path: path.to_path_buf(),
        root: Some(Arc::new(root.into())),
        holder: "pod-uid".into(),
        mode: VolumeMode::Filesystem,
        node_os: ferry_api::NodeOs::Linux,
        snapshot: None,
    }
}

/// The DataUpload's failure message, as the agent writes it into `status.message`.
fn failure(result: Result<impl std::fmt::Debug, WorkError>) -> String {
    match result {
        Err(e @ WorkError::Failed(_)) => error_chain(&e),
        other => panic!("expected the data movement to fail, got {other:?}"),
    }
}

/// The first DataUpload with `kms-key-id` set creates the repository under that key: the
/// password alone no longer opens it (the error names the key), the password and the key do,
/// and a DataDownload through the agent restores from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_backup_creates_the_repository_under_the_kms_key() {
    let endpoint = moto();
    let world = World::new("kms-new").await;
    let cancel = CancellationToken::new();
    let arn = kms::create_kms_key(&endpoint).expect("a KMS key on moto");
    own_secret(&world, &[(KMS_KEY_ID_KEY, &arn), (KMS_ENDPOINT_KEY, &endpoint)]).await;

    let mover = RepoMover::new(Arc::new(world.source()));
    let volume = tempfile::tempdir().expect("a volume");
    std::fs::write(volume.path().join("f"), b"tenant data").expect("write");
    let outcome = mover
        .backup(&upload("du-1"), &opened(volume.path()), ProgressSink::new(), cancel.clone())
        .await
        .expect("the first backup");

    let store: Arc<dyn ObjectStore> = world.store(REPOSITORY).await;
    match Repository::open(Arc::clone(&store), PASSWORD.as_bytes(), &cancel).await {
        Err(e @ RepoError::KmsKeyNeeded { .. }) => {
            assert!(e.to_string().contains(&arn), "the key is not named: {e}");
        }
        other => panic!("the password alone must not open it, got {other:?}"),
    }
    let through =
        OpenOptions { key_wrapper: Some(aws_kms(&endpoint, &arn).await), ..OpenOptions::default() };
    let repo = Repository::open_with(store, PASSWORD.as_bytes(), &through, &cancel)
        .await
        .expect("the password and the KMS key open it");
    let snapshots = repo.snapshots(&cancel).await.expect("snapshots");
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    let keys = repo.key_files(&cancel).await.expect("key files");
    assert!(
        keys.iter()
            .all(|k| k.file.as_ref().is_ok_and(|d| d.kms_key_id.as_deref() == Some(arn.as_str()))),
        "every key file wrapped by {arn}: {keys:?}"
    );

    let target = tempfile::tempdir().expect("a target volume");
    let restored = download(&outcome.snapshot_id);
    mover
        .restore(&restored, &opened(target.path()), ProgressSink::new(), cancel)
        .await
        .expect("the restore opens the repository through KMS");
    assert_eq!(std::fs::read(target.path().join("f")).expect("restored"), b"tenant data");
}

/// A repository created with the password only keeps opening once `kms-key-id` is set, and a
/// repository kept open is opened again through KMS when the setting appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_only_repository_keeps_opening_once_kms_is_set() {
    let endpoint = moto();
    let world = World::new("kms-old").await;
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = world.store(REPOSITORY).await;
    let (old, _) = Repository::init(Arc::clone(&store), PASSWORD.as_bytes(), &fast(), &cancel)
        .await
        .expect("a repository of passwords only");
    own_secret(&world, &[]).await;

    let source = world.source();
    let before = source.open(BSL, SOURCE_NS, &cancel).await.expect("opens without KMS");
    assert_eq!(before.repo.kms_key_id(), None);

    let arn = kms::create_kms_key(&endpoint).expect("a KMS key on moto");
    patch_own_secret(&world, &[(KMS_KEY_ID_KEY, &arn), (KMS_ENDPOINT_KEY, &endpoint)]).await;
    let after = source.open(BSL, SOURCE_NS, &cancel).await.expect("still opens");
    assert_eq!(after.repo.config().repo_id, old.config().repo_id, "the same repository");
    assert_eq!(after.repo.kms_key_id(), Some(arn.as_str()), "opened again, through KMS");
    assert!(after.warning.is_none(), "{:?}", after.warning);
    let fresh = world.source().open(BSL, SOURCE_NS, &cancel).await.expect("another agent");
    assert_eq!(fresh.repo.config().repo_id, old.config().repo_id);

    // Its key file is untouched: the password alone opens it as before.
    let plain = Repository::open(store, PASSWORD.as_bytes(), &cancel).await.expect("plain");
    assert_eq!(plain.key_id(), old.key_id());
}

/// `kms-key-id` set in the same update as a password rotation moves a password-only
/// repository under the key: the agent's rotation writes the new key file wrapped by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_with_kms_set_moves_a_repository_under_the_key() {
    let endpoint = moto();
    let world = World::new("kms-rotate").await;
    let cancel = CancellationToken::new();
    let old_password = "the password before the rotation, long enough";
    let store: Arc<dyn ObjectStore> = world.store(REPOSITORY).await;
    Repository::init(Arc::clone(&store), old_password.as_bytes(), &fast(), &cancel)
        .await
        .expect("a repository of passwords only");
    let arn = kms::create_kms_key(&endpoint).expect("a KMS key on moto");
    let extra = [
        (PREVIOUS_PASSWORD_KEY, old_password),
        (KMS_KEY_ID_KEY, arn.as_str()),
        (KMS_ENDPOINT_KEY, endpoint.as_str()),
    ];
    own_secret(&world, &extra).await;

    let opened = world.source().open(BSL, SOURCE_NS, &cancel).await.expect("rotated");
    assert_eq!(opened.repo.kms_key_id(), Some(arn.as_str()));
    let through =
        OpenOptions { key_wrapper: Some(aws_kms(&endpoint, &arn).await), ..OpenOptions::default() };
    let repo = Repository::open_with(Arc::clone(&store), PASSWORD.as_bytes(), &through, &cancel)
        .await
        .expect("the new password and the KMS key open it");
    let keys = repo.key_files(&cancel).await.expect("key files");
    let wrapped_by =
        |k: &ferry_repo::KeyInfo| k.file.as_ref().ok().and_then(|d| d.kms_key_id.clone());
    assert_eq!(keys.iter().map(wrapped_by).collect::<Vec<_>>(), [Some(arn.clone())], "{keys:?}");
    // The previous password's key file is gone: even through KMS it opens nothing.
    let old =
        Repository::open_with(Arc::clone(&store), old_password.as_bytes(), &through, &cancel).await;
    assert!(matches!(old, Err(RepoError::WrongPassword { .. })), "{old:?}");
    let alone = Repository::open(store, PASSWORD.as_bytes(), &cancel).await;
    assert!(matches!(alone, Err(RepoError::KmsKeyNeeded { .. })), "{alone:?}");
}

/// A KMS key moto does not know fails the first DataUpload naming the key and the setting,
/// and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_kms_key_fails_the_backup_naming_it() {
    let endpoint = moto();
    let world = World::new("kms-unknown").await;
    let cancel = CancellationToken::new();
    let missing = "arn:aws:kms:us-east-1:123456789012:key/0badc0de-0000-4000-8000-000000000000";
    own_secret(&world, &[(KMS_KEY_ID_KEY, missing), (KMS_ENDPOINT_KEY, &endpoint)]).await;

    let mover = RepoMover::new(Arc::new(world.source()));
    let volume = tempfile::tempdir().expect("a volume");
    let result =
        mover.backup(&upload("du-1"), &opened(volume.path()), ProgressSink::new(), cancel).await;
    let message = failure(result);
    for part in [missing, "kms-key-id in", PASSWORD_SECRET, "not found", "check the key id"] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(world.keys().await.is_empty(), "nothing created: {:?}", world.keys().await);
}

/// A repository under a KMS key the KMS then refuses as disabled: the repository kept open is
/// opened again when `kms-endpoint` changes, and the DataUpload fails naming the key and that
/// it must be enabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_kms_key_fails_the_backup_naming_it() {
    let endpoint = moto();
    let world = World::new("kms-disabled").await;
    let cancel = CancellationToken::new();
    let arn = kms::create_kms_key(&endpoint).expect("a KMS key on moto");
    own_secret(&world, &[(KMS_KEY_ID_KEY, &arn), (KMS_ENDPOINT_KEY, &endpoint)]).await;
    let source = Arc::new(world.source());
    let created = source.open(BSL, SOURCE_NS, &cancel).await.expect("created under KMS");
    assert_eq!(created.repo.kms_key_id(), Some(arn.as_str()));

    let key_id = arn.rsplit('/').next().expect("the key id at the ARN's end");
    kms::moto_kms(&endpoint, "DisableKey", &format!(r#"{{"KeyId":"{key_id}"}}"#))
        .expect("moto\'s KMS");
    patch_own_secret(&world, &[(KMS_ENDPOINT_KEY, &kms::kms_disabled(&arn).await)]).await;

    let err = source.open(BSL, SOURCE_NS, &cancel).await.expect_err("the key is disabled");
    assert!(matches!(err, MoverError::Kms { .. }), "{err:?}");
    let mover = RepoMover::new(source);
    let volume = tempfile::tempdir().expect("a volume");
    let result =
        mover.backup(&upload("du-2"), &opened(volume.path()), ProgressSink::new(), cancel).await;
    let message = failure(result);
    for part in [arn.as_str(), "kms-key-id in", "disabled", "enable it"] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(!message.contains(PASSWORD), "no secret value in the message: {message}");
}
