//! `BslRepositories` against a real API server and moto: where repositories go, what happens
//! to one left where earlier versions kept it, which password keys them, and the CA that
//! signs a TLS endpoint.

mod common;

use std::sync::Arc;

use common::{BSL, SOURCE_NS, World, fast};
use ferry_api::k8s_openapi::api::core::v1::Secret;
use ferry_mover::{
    MoverError, PASSWORD_KEY, PASSWORD_SECRET, PREVIOUS_PASSWORD_KEY, RepositorySource,
    VELERO_PASSWORD_SECRET,
};
use ferry_repo::{RepoError, Repository};
use ferry_testbed::S3Server;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const VELERO_DEFAULT: &[u8] = b"static-passw0rd";

#[tokio::test]
async fn a_repository_lands_under_plugins_ferry_and_nothing_else_at_the_top() {
    let world = World::new("mover-layout").await;
    let cancel = CancellationToken::new();
    let opened = world.source().open(BSL, SOURCE_NS, &cancel).await.expect("open");
    assert_eq!(opened.location, format!("s3://{}/velero/plugins/ferry/app", world.bucket));
    let keys = world.keys().await;
    assert!(keys.iter().any(|k| k == "velero/plugins/ferry/app/config"), "{keys:?}");
    let top: std::collections::BTreeSet<_> =
        keys.iter().map(|k| k.split('/').take(2).collect::<Vec<_>>().join("/")).collect();
    assert_eq!(top.into_iter().collect::<Vec<_>>(), ["velero/plugins"], "{keys:?}");
}

#[tokio::test]
async fn a_repository_at_the_old_place_fails_the_open_naming_repo_move() {
    let world = World::new("mover-old").await;
    let cancel = CancellationToken::new();
    let old = world.store("velero/ferry/app").await;
    Repository::init(old, b"an-old-ferry-password", &fast(), &cancel).await.expect("old repo");

    let err = world.source().open(BSL, SOURCE_NS, &cancel).await.expect_err("not moved");
    assert!(matches!(err, MoverError::RepositoryNotMoved { .. }), "{err:?}");
    let message = err.to_string();
    let (old_url, new_url) = (
        format!("s3://{}/velero/ferry/app", world.bucket),
        format!("s3://{}/velero/plugins/ferry/app", world.bucket),
    );
    assert!(
        message.contains(&format!("ferry repo move --repo {old_url} --to {new_url}")),
        "{message}"
    );
    let keys = world.keys().await;
    assert!(keys.iter().all(|k| k.starts_with("velero/ferry/app/")), "nothing new: {keys:?}");
}

#[tokio::test]
async fn new_repositories_are_keyed_by_ferrys_own_secret_not_veleros_default() {
    let world = World::new("mover-own").await;
    let cancel = CancellationToken::new();
    world.put_secret(VELERO_PASSWORD_SECRET, VELERO_DEFAULT).await;
    let opened = world.source().open(BSL, SOURCE_NS, &cancel).await.expect("open");
    assert!(opened.warning.is_none(), "{:?}", opened.warning);

    let own = world.secret(PASSWORD_SECRET).await.expect("Ferry's secret created");
    assert_eq!(own.len(), 64, "32 bytes, hex");
    assert!(own.iter().all(u8::is_ascii_hexdigit));
    let store = world.store("velero/plugins/ferry/app").await;
    let with_default = Repository::open(Arc::clone(&store), VELERO_DEFAULT, &cancel).await;
    assert!(matches!(with_default, Err(RepoError::WrongPassword { .. })), "{with_default:?}");
    Repository::open(store, &own, &cancel).await.expect("Ferry's password opens it");
    assert_eq!(world.secret(VELERO_PASSWORD_SECRET).await.as_deref(), Some(VELERO_DEFAULT));
}

#[tokio::test]
async fn a_repository_keyed_by_veleros_default_is_refused_unless_adoption_is_asked_for() {
    let world = World::new("mover-default").await;
    let cancel = CancellationToken::new();
    world.put_secret(VELERO_PASSWORD_SECRET, VELERO_DEFAULT).await;
    // An earlier version's repository, keyed by Velero's secret (or one planted so).
    let store = world.store("velero/plugins/ferry/app").await;
    let (old, _) =
        Repository::init(Arc::clone(&store), VELERO_DEFAULT, &fast(), &cancel).await.expect("old");
    let old_key = old.key_id();

    // By default it is refused, saying how to adopt it, and nothing is added to it.
    let refused = world.source().open(BSL, SOURCE_NS, &cancel).await.expect_err("adopted");
    let message = refused.to_string();
    assert!(message.contains("published default password"), "{message}");
    assert!(message.contains("--adopt-velero-keyed-repositories"), "{message}");
    assert_eq!(old.key_files(&cancel).await.expect("keys").len(), 1, "no key was added");

    // A weak password of Ferry's is never given a key, even when adopting.
    let own = world.secret(PASSWORD_SECRET).await.expect("Ferry's secret");
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &world.namespace);
    let set_own = |password: &[u8]| {
        let patch = json!({ "stringData": { PASSWORD_KEY: String::from_utf8_lossy(password) } });
        let secrets = secrets.clone();
        async move {
            let params = kube::api::PatchParams::default();
            secrets.patch(PASSWORD_SECRET, &params, &kube::api::Patch::Merge(&patch)).await
        }
    };
    set_own(b"short").await.expect("patch");
    let weak = world.source().adopting_velero_keyed(true).open(BSL, SOURCE_NS, &cancel).await;
    let weak = weak.expect_err("a weak password was given a key").to_string();
    assert!(weak.contains("too weak") && weak.contains("at least 16"), "{weak}");
    assert_eq!(old.key_files(&cancel).await.expect("keys").len(), 1, "no key was added");
    set_own(&own).await.expect("patch");

    let adopting = world.source().adopting_velero_keyed(true);
    let opened = adopting.open(BSL, SOURCE_NS, &cancel).await.expect("opens when adopting");
    let warning = opened.warning.expect("a warning");
    assert!(warning.contains("published default"), "{warning}");
    assert!(
        warning.contains(&format!("ferry repo key remove --repo {} {old_key}", opened.location)),
        "{warning}"
    );
    let own = world.secret(PASSWORD_SECRET).await.expect("Ferry's secret");
    let repo = Repository::open(Arc::clone(&store), &own, &cancel).await.expect("own key added");
    let keys = repo.key_files(&cancel).await.expect("keys");
    assert_eq!(keys.len(), 2, "the old key stays until the operator removes it");
    assert!(keys.iter().any(|k| k.id == old_key));

    // Another agent (no cache, not adopting) opens it with Ferry's password: no warning, no
    // further key.
    let again = world.source().open(BSL, SOURCE_NS, &cancel).await.expect("open again");
    assert!(again.warning.is_none(), "{:?}", again.warning);
    assert_eq!(repo.key_files(&cancel).await.expect("keys").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sources_racing_to_create_ferrys_secret_agree() {
    let world = Arc::new(World::new("mover-race").await);
    let cancel = CancellationToken::new();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (world, cancel) = (Arc::clone(&world), cancel.clone());
        tasks.push(tokio::spawn(async move {
            world.source().open(BSL, SOURCE_NS, &cancel).await.map(|o| o.repo.config().repo_id)
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.expect("task").expect("every racer opens the same repository"));
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "one repository");
    let own = world.secret(PASSWORD_SECRET).await.expect("secret");
    let store = world.store("velero/plugins/ferry/app").await;
    Repository::open(store, &own, &cancel).await.expect("the secret's password opens it");
}

#[tokio::test]
async fn the_agent_refuses_to_create_a_repository_with_a_weak_password() {
    let world = World::new("mover-weak").await;
    let cancel = CancellationToken::new();
    world.put_secret(PASSWORD_SECRET, b"short").await;
    let err = world.source().open(BSL, SOURCE_NS, &cancel).await.expect_err("weak");
    assert!(err.to_string().contains("at least 16"), "{err}");
    assert!(world.keys().await.is_empty(), "nothing created");
}

/// A location whose `spec.credential` names a secret that does not exist fails saying so;
/// it never falls back to another identity (the node's own, or Velero's default secret).
#[tokio::test]
async fn a_location_naming_a_missing_credential_secret_fails_with_that_message() {
    let world = World::new("mover-nocred").await;
    let cancel = CancellationToken::new();
    let bsls: Api<ferry_api::BackupStorageLocation> =
        Api::namespaced(world.client.clone(), &world.namespace);
    bsls.patch(
        BSL,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({
            "spec": { "credential": { "name": "team-a-credentials", "key": "cloud" } }
        })),
    )
    .await
    .expect("name a credential");
    let err = world.source().open(BSL, SOURCE_NS, &cancel).await.expect_err("no secret");
    let message = err.to_string();
    assert!(
        message.contains("team-a-credentials")
            && message.contains("does not exist")
            && message.contains("spec.credential"),
        "{message}"
    );
    assert!(matches!(err, MoverError::Secret { .. }), "{err:?}");
    assert!(world.keys().await.is_empty(), "nothing created");
}

/// A location whose `s3Url` is served over TLS with a certificate a private CA signed: without
/// `objectStorage.caCert` the open fails naming the location and what to set; with the CA
/// there (base64, as Velero's API holds a Go `[]byte`) the repository is created, and opened
/// again by another agent.
#[tokio::test]
async fn a_location_behind_a_private_ca_opens_with_its_ca_cert_only() {
    use base64::Engine as _;

    let world = World::new("mover-ca").await;
    let front = ferry_testbed::TlsFront::start(S3Server::shared().endpoint())
        .expect("starting a TLS front for moto");
    let cancel = CancellationToken::new();
    world.patch_bsl(BSL, json!({ "config": { "s3Url": front.url() } })).await;

    let err = world.source().open(BSL, SOURCE_NS, &cancel).await.expect_err("untrusted");
    let message = err.to_string();
    let location = format!("s3://{}/velero/plugins/ferry/app", world.bucket);
    assert!(message.contains(&location), "the location is not named: {message}");
    assert!(message.contains(front.url()), "the endpoint is not named: {message}");
    assert!(message.contains("objectStorage.caCert"), "no hint at the fix: {message}");
    assert!(world.keys().await.is_empty(), "nothing created");

    let ca = base64::engine::general_purpose::STANDARD.encode(front.ca_pem());
    world.patch_bsl(BSL, json!({ "objectStorage": { "caCert": ca } })).await;
    let opened = world.source().open(BSL, SOURCE_NS, &cancel).await.expect("opens over TLS");
    assert_eq!(opened.location, location);
    let keys = world.keys().await;
    assert!(keys.iter().any(|k| k == "velero/plugins/ferry/app/config"), "{keys:?}");
    let again = world.source().open(BSL, SOURCE_NS, &cancel).await.expect("opens again");
    assert_eq!(again.repo.config().repo_id, opened.repo.config().repo_id);
}

#[tokio::test]
async fn a_ca_bundle_from_ca_cert_ref_is_read_from_its_secret_when_it_changes() {
    let world = World::new("mover-ca-ref").await;
    let front = ferry_testbed::TlsFront::start(S3Server::shared().endpoint())
        .expect("starting a TLS front for moto");
    let cancel = CancellationToken::new();
    // The secret is named before it exists: a clear error naming it.
    world
        .patch_bsl(
            BSL,
            json!({
                "config": { "s3Url": front.url() },
                "objectStorage": { "caCertRef": { "name": "s3-ca", "key": "ca.pem" } },
            }),
        )
        .await;
    let source = world.source();
    let err = source.open(BSL, SOURCE_NS, &cancel).await.expect_err("no secret yet");
    assert!(matches!(err, MoverError::Secret { .. }), "{err:?}");
    assert!(err.to_string().contains("objectStorage.caCertRef"), "{err}");

    // The secret holds a CA that did not sign the endpoint: refused as untrusted.
    let other = ferry_testbed::TlsFront::start(S3Server::shared().endpoint()).expect("front");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "s3-ca", "namespace": world.namespace },
        "stringData": { "ca.pem": other.ca_pem() },
    }))
    .expect("secret");
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &world.namespace);
    secrets.create(&PostParams::default(), &secret).await.expect("create secret");
    let err = source.open(BSL, SOURCE_NS, &cancel).await.expect_err("wrong CA");
    assert!(err.to_string().contains("not signed by a trusted CA"), "{err}");

    // The operator puts the right CA in the secret: the same agent opens over TLS.
    let fixed = json!({ "stringData": { "ca.pem": front.ca_pem() } });
    secrets
        .patch("s3-ca", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&fixed))
        .await
        .expect("patch secret");
    let opened = source.open(BSL, SOURCE_NS, &cancel).await.expect("opens over TLS");
    assert_eq!(opened.location, format!("s3://{}/velero/plugins/ferry/app", world.bucket));
}

/// Rotating Ferry's password for a whole BSL: the operator puts the new password in
/// `repository-password` and the old one in `previous-repository-password`; each repository
/// gets a key for the new password (proven) and loses the old one when an agent opens it, and
/// one not opened yet still opens with the old password meanwhile (no downtime). An agent that
/// keeps a repository open sees the rotation at its next open too.
#[tokio::test]
async fn a_password_rotation_rekeys_each_repository_as_it_is_opened() {
    let world = World::new("mover-rotate").await;
    let (old, new) = (b"the first password of ferry", b"the second password of ferry");
    world.put_secret(PASSWORD_SECRET, old).await;
    let cancel = CancellationToken::new();
    // One agent, keeping both repositories open across the rotation.
    let source = world.source();
    for ns in ["one", "two"] {
        source.open(BSL, ns, &cancel).await.expect("create");
    }
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &world.namespace);
    let rotate = json!({ "stringData": {
        PASSWORD_KEY: String::from_utf8_lossy(new),
        PREVIOUS_PASSWORD_KEY: String::from_utf8_lossy(old),
    } });
    let params = kube::api::PatchParams::default();
    secrets
        .patch(PASSWORD_SECRET, &params, &kube::api::Patch::Merge(&rotate))
        .await
        .expect("patch");

    source.open(BSL, "one", &cancel).await.expect("open one after the rotation");
    let (one, two) = (
        world.store("velero/plugins/ferry/one").await,
        world.store("velero/plugins/ferry/two").await,
    );
    let keys_of = |store: Arc<dyn ferry_store::ObjectStore>| {
        let cancel = cancel.clone();
        async move { store.list("keys/", &cancel).await.expect("list keys").len() }
    };
    assert_eq!(keys_of(Arc::clone(&one)).await, 1, "the old key removed");
    Repository::open(Arc::clone(&one), new, &cancel).await.expect("the new password opens it");
    let refused = Repository::open(Arc::clone(&one), old, &cancel).await.expect_err("old refused");
    assert!(matches!(refused, RepoError::WrongPassword { .. }), "{refused:?}");
    // Not opened since: the old password still opens it.
    Repository::open(Arc::clone(&two), old, &cancel).await.expect("two untouched so far");
    source.open(BSL, "two", &cancel).await.expect("open two after the rotation");
    assert_eq!(keys_of(Arc::clone(&two)).await, 1);
    Repository::open(Arc::clone(&two), new, &cancel).await.expect("rotated too");

    // A rotation to a weak password is refused; the repository keeps its key.
    let weak = json!({ "stringData": {
        PASSWORD_KEY: "short",
        PREVIOUS_PASSWORD_KEY: String::from_utf8_lossy(new),
    } });
    secrets.patch(PASSWORD_SECRET, &params, &kube::api::Patch::Merge(&weak)).await.expect("patch");
    let refused = world.source().open(BSL, "two", &cancel).await.expect_err("rotated to weak");
    assert!(refused.to_string().contains("too weak"), "{refused}");
    assert_eq!(keys_of(Arc::clone(&two)).await, 1);
    Repository::open(two, new, &cancel).await.expect("still the second password's");
}

/// A location asking for SSE-KMS (`config.kmsKeyId`, as Velero's AWS plugin reads it): every
/// object of the repository is written with it.
#[tokio::test]
async fn a_location_asking_for_server_side_encryption_gets_it_on_every_object() {
    let world = World::new("mover-sse").await;
    world.patch_bsl(BSL, json!({ "config": { "kmsKeyId": "alias/ferry-at-rest" } })).await;
    let cancel = CancellationToken::new();
    world.source().open(BSL, SOURCE_NS, &cancel).await.expect("create");
    let admin = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .http_client(ferry_store::aws_http_client())
            .region(aws_sdk_s3::config::Region::from_static("us-east-1"))
            .endpoint_url(S3Server::shared().endpoint())
            .force_path_style(true)
            .credentials_provider(aws_sdk_s3::config::Credentials::new(
                "t", "s", None, None, "test",
            ))
            .build(),
    );
    let keys = world.keys().await;
    assert!(keys.len() >= 2, "config and a key file: {keys:?}");
    for key in keys {
        let head = admin.head_object().bucket(&world.bucket).key(&key).send().await.expect("head");
        let sse = head.server_side_encryption().map(|s| s.as_str().to_owned());
        assert_eq!(sse.as_deref(), Some("aws:kms"), "{key}");
    }
}
