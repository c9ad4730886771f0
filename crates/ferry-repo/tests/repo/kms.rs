//! Key files wrapped by a KMS key as well as the password: in memory (`MemoryKms`, for the
//! rules of opening and key changes) and against moto's KMS (moto serves it on the S3 port),
//! with the repository on moto's S3.

use crate::common;

use std::sync::Arc;

use common::{TestResult, options, s3_store};
use ferry_repo::format::{KeyFile, KeyWrap};
use ferry_repo::{InitOptions, InitOutcome, KdfParams, KeyId, OpenOptions, RepoError, Repository};
use ferry_store::{
    AwsKms, KeyWrapper, KmsError, KmsOptions, MemoryKms, MemoryStore, ObjectKey, ObjectStore,
    StaticCredentials,
};
use ferry_testbed::kms;
use tokio_util::sync::CancellationToken;

const PASSWORD: &[u8] = b"a long enough repository password";

fn with_kms(kms: Arc<dyn KeyWrapper>) -> InitOptions {
    InitOptions { key_wrapper: Some(kms), ..options() }
}

fn through(kms: Arc<dyn KeyWrapper>) -> OpenOptions {
    OpenOptions { key_wrapper: Some(kms), ..OpenOptions::default() }
}

/// The key files under `keys/`, decoded, with their object keys.
async fn key_files(store: &dyn ObjectStore) -> Vec<(ObjectKey, KeyFile)> {
    let cancel = CancellationToken::new();
    let mut files = Vec::new();
    for meta in store.list("keys/", &cancel).await.expect("list keys/") {
        let bytes = store.get(&meta.key, &cancel).await.expect("read a key file");
        files.push((meta.key, KeyFile::decode(&bytes).expect("a key file")));
    }
    files
}

/// The KMS's refusal behind a failed open, if that is why it failed.
fn kms_refusal(opened: &Result<Repository, RepoError>) -> Option<&KmsError> {
    match opened {
        Err(RepoError::Kms { source, .. }) => Some(source),
        _ => None,
    }
}

/// Puts `file` in place of the key file at `key` (same name: only the content changes).
async fn replace(store: &dyn ObjectStore, key: &ObjectKey, file: &KeyFile) {
    let cancel = CancellationToken::new();
    store.delete(key, &cancel).await.expect("delete the key file");
    store.put_if_absent(key, file.encode().into(), &cancel).await.expect("write it again");
}

#[tokio::test]
async fn a_kms_repository_opens_only_with_the_kms_and_says_which_key_it_needs() -> TestResult {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let kms = MemoryKms::new("arn:aws:kms:eu-west-1:111122223333:key/ferry-a");
    let wrapper: Arc<dyn KeyWrapper> = Arc::new(kms.clone());
    let (created, outcome) =
        Repository::init(Arc::clone(&store), PASSWORD, &with_kms(Arc::clone(&wrapper)), &cancel)
            .await?;
    assert_eq!(outcome, InitOutcome::Created);
    assert_eq!(created.kms_key_id(), Some(kms.key_id()));
    let files = key_files(store.as_ref()).await;
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].1.kms_layer().map(|(id, _)| id), Some(kms.key_id()));

    let opened = Repository::open_with(
        Arc::clone(&store),
        PASSWORD,
        &through(Arc::clone(&wrapper)),
        &cancel,
    )
    .await?;
    assert_eq!(opened.config().repo_id, created.config().repo_id);
    assert_eq!(opened.key_files_tried(), 1);

    // Without the KMS: not "wrong password", but the key it needs.
    match Repository::open(Arc::clone(&store), PASSWORD, &cancel).await {
        Err(e @ RepoError::KmsKeyNeeded { .. }) => {
            let text = e.to_string();
            assert!(text.contains(kms.key_id()) && !text.contains("wrong password"), "{text}");
        }
        other => panic!("expected KmsKeyNeeded, got {other:?}"),
    }
    // With the KMS and the wrong password: the password is wrong.
    let wrong = Repository::open_with(
        Arc::clone(&store),
        b"not it",
        &through(Arc::clone(&wrapper)),
        &cancel,
    )
    .await;
    assert!(
        matches!(wrong, Err(RepoError::WrongPassword { tried: 1, untried: None })),
        "{wrong:?}"
    );

    // `init` of the existing repository opens it through the KMS as well.
    let (again, outcome) =
        Repository::init(Arc::clone(&store), PASSWORD, &with_kms(wrapper), &cancel).await?;
    assert_eq!(
        (outcome, again.config().repo_id),
        (InitOutcome::AlreadyExisted, created.config().repo_id)
    );
    let refused = Repository::init(store, PASSWORD, &options(), &cancel).await;
    assert!(matches!(refused, Err(RepoError::KmsKeyNeeded { .. })), "{refused:?}");
    Ok(())
}

#[tokio::test]
async fn a_refusing_kms_is_reported_and_an_unreachable_one_is_retryable() -> TestResult {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let kms = MemoryKms::new("alias/ferry");
    let wrapper: Arc<dyn KeyWrapper> = Arc::new(kms.clone());
    Repository::init(Arc::clone(&store), PASSWORD, &with_kms(Arc::clone(&wrapper)), &cancel)
        .await?;

    kms.set_disabled("alias/ferry", true);
    let through_kms = through(wrapper);
    let open = || Repository::open_with(Arc::clone(&store), PASSWORD, &through_kms, &cancel);
    let disabled = open().await;
    match (&disabled, kms_refusal(&disabled)) {
        (
            Err(RepoError::Kms { key: Some(key), .. }),
            Some(KmsError::KeyDisabled { key_id, .. }),
        ) => {
            assert_eq!(key_id, "alias/ferry");
            assert!(key.starts_with("keys/"), "{key}");
        }
        _ => panic!("expected a disabled key, got {disabled:?}"),
    }
    kms.set_disabled("alias/ferry", false);
    kms.set_denied("alias/ferry", true);
    let denied = open().await;
    assert!(matches!(kms_refusal(&denied), Some(KmsError::AccessDenied { .. })), "{denied:?}");
    assert!(!denied.as_ref().is_err_and(RepoError::is_retryable));
    kms.set_denied("alias/ferry", false);
    kms.set_unreachable(true);
    let unreachable = open().await;
    assert!(unreachable.as_ref().is_err_and(RepoError::is_retryable), "{unreachable:?}");
    kms.set_unreachable(false);
    open().await?;
    Ok(())
}

#[tokio::test]
async fn key_changes_of_a_kms_repository_stay_under_a_kms_key() -> TestResult {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let kms = MemoryKms::new("key-a");
    let a: Arc<dyn KeyWrapper> = Arc::new(kms.clone());
    let (repo, _) =
        Repository::init(Arc::clone(&store), PASSWORD, &with_kms(Arc::clone(&a)), &cancel).await?;
    let second = b"a second repository password";
    repo.add_password(second, KdfParams::insecure_for_tests(), &cancel).await?;
    let third = b"a third repository password!";
    repo.change_password(third, KdfParams::insecure_for_tests(), &cancel).await?;
    let listed = repo.key_files(&cancel).await?;
    assert_eq!(listed.len(), 2);
    for key in &listed {
        let details = key.file.as_ref().expect("readable");
        assert_eq!(details.kms_key_id.as_deref(), Some("key-a"), "{key:?}");
    }
    for password in [&second[..], &third[..]] {
        Repository::open_with(Arc::clone(&store), password, &through(Arc::clone(&a)), &cancel)
            .await?;
        let refused = Repository::open(Arc::clone(&store), password, &cancel).await;
        assert!(matches!(refused, Err(RepoError::KmsKeyNeeded { .. })), "{refused:?}");
    }

    // Moving to another KMS key: open with a KMS wrapping under key-b (key-a's files still
    // decrypt with key-a, which they name), change the password.
    let b: Arc<dyn KeyWrapper> = Arc::new(kms.using("key-b"));
    let repo =
        Repository::open_with(Arc::clone(&store), third, &through(Arc::clone(&b)), &cancel).await?;
    let moved = repo.change_password(PASSWORD, KdfParams::insecure_for_tests(), &cancel).await?;
    let details = repo.key_files(&cancel).await?;
    let moved = details.iter().find(|k| k.id == moved).expect("the new key is listed");
    assert_eq!(moved.file.as_ref().expect("readable").kms_key_id.as_deref(), Some("key-b"));
    kms.set_disabled("key-a", true);
    Repository::open_with(store, PASSWORD, &through(b), &cancel).await?;
    Ok(())
}

#[tokio::test]
async fn a_password_repository_goes_under_a_kms_key_by_a_password_change() -> TestResult {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (plain, _) = Repository::init(Arc::clone(&store), PASSWORD, &options(), &cancel).await?;
    let kept = b"the password of a key left as it is";
    let kept_id = plain.add_password(kept, KdfParams::insecure_for_tests(), &cancel).await?;
    let kms: Arc<dyn KeyWrapper> = Arc::new(MemoryKms::new("key-a"));
    let repo =
        Repository::open_with(Arc::clone(&store), PASSWORD, &through(Arc::clone(&kms)), &cancel)
            .await?;
    let new = b"the new password under the KMS";
    let new_id = repo.change_password(new, KdfParams::insecure_for_tests(), &cancel).await?;
    let refused = Repository::open(Arc::clone(&store), new, &cancel).await;
    assert!(matches!(refused, Err(RepoError::KmsKeyNeeded { .. })), "{refused:?}");
    // A password-only key file still opens without a KMS: the hint goes straight to it, and
    // listing skips the KMS one without calling anything.
    let other =
        Repository::open_with_hint(Arc::clone(&store), kept, Some(kept_id), &cancel).await?;
    assert_eq!((other.key_id(), other.key_files_tried()), (kept_id, 1));
    let other = Repository::open(Arc::clone(&store), kept, &cancel).await?;
    assert_eq!(other.key_id(), kept_id);
    let hinted =
        OpenOptions { hint: Some(new_id), key_wrapper: Some(kms), ..OpenOptions::default() };
    let opened = Repository::open_with(store, new, &hinted, &cancel).await?;
    assert_eq!((opened.key_id(), opened.key_files_tried()), (new_id, 1));
    let _: KeyId = new_id;
    Ok(())
}

#[tokio::test]
async fn a_wrong_password_is_said_before_a_kms_refusal_of_another_key_file() -> TestResult {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    Repository::init(Arc::clone(&store), PASSWORD, &options(), &cancel).await?;
    let kms = MemoryKms::new("key-a");
    let wrapper: Arc<dyn KeyWrapper> = Arc::new(kms.clone());
    let repo = Repository::open_with(
        Arc::clone(&store),
        PASSWORD,
        &through(Arc::clone(&wrapper)),
        &cancel,
    )
    .await?;
    let second = b"a second password, its key file under key-a";
    repo.add_password(second, KdfParams::insecure_for_tests(), &cancel).await?;
    kms.set_disabled("key-a", true);

    for password in [&b"neither password"[..], &second[..]] {
        let opened = Repository::open_with(
            Arc::clone(&store),
            password,
            &through(Arc::clone(&wrapper)),
            &cancel,
        )
        .await;
        let Err(RepoError::WrongPassword { tried: 1, untried: Some(untried) }) = &opened else {
            panic!("expected a wrong password with the refusal alongside, got {opened:?}");
        };
        assert!(matches!(**untried, RepoError::Kms { .. }), "{untried:?}");
        let text = opened.as_ref().err().map(ToString::to_string).unwrap_or_default();
        assert!(
            text.starts_with("wrong password")
                && text.contains("could not be tried")
                && text.contains("key-a"),
            "{text}"
        );
    }
    // Only the KMS key file left to try: its refusal is the error.
    kms.set_disabled("key-a", false);
    let second_repo =
        Repository::open_with(Arc::clone(&store), second, &through(Arc::clone(&wrapper)), &cancel)
            .await?;
    for key in second_repo.key_files(&cancel).await? {
        if key.file.as_ref().is_ok_and(|f| f.kms_key_id.is_none()) {
            second_repo.remove_key(&key.id, &cancel).await?;
        }
    }
    kms.set_disabled("key-a", true);
    let opened = Repository::open_with(store, second, &through(wrapper), &cancel).await;
    assert!(matches!(kms_refusal(&opened), Some(KmsError::KeyDisabled { .. })), "{opened:?}");
    Ok(())
}

// ---- moto ----

/// moto's endpoint (S3 and KMS share it); fails the test, saying why, when moto cannot start.
fn moto_endpoint() -> String {
    ferry_testbed::install_crypto_provider();
    ferry_testbed::S3Server::shared().endpoint().to_owned()
}

async fn aws_kms(endpoint: &str, key_id: &str) -> Arc<dyn KeyWrapper> {
    let options = KmsOptions {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        credentials: Some(StaticCredentials {
            access_key_id: "ferry-test".into(),
            secret_access_key: "ferry-test-secret".into(),
            session_token: None,
        }),
        max_attempts: 1,
        ..KmsOptions::new(key_id)
    };
    Arc::new(AwsKms::new(options).await.expect("a KMS client"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_moto_the_kms_key_guards_the_repository_and_its_blob() -> TestResult {
    let endpoint = moto_endpoint();
    let cancel = CancellationToken::new();
    let store = s3_store("repo-kms", "team/a").await;
    let arn = kms::create_kms_key(&endpoint).expect("a KMS key on moto");
    let kms = aws_kms(&endpoint, &arn).await;
    let (created, _) =
        Repository::init(Arc::clone(&store), PASSWORD, &with_kms(Arc::clone(&kms)), &cancel)
            .await?;
    let files = key_files(store.as_ref()).await;
    let [(key, file)] = files.as_slice() else { panic!("one key file: {files:?}") };
    assert_eq!(file.kms_layer().map(|(id, _)| id), Some(arn.as_str()));

    let opened =
        Repository::open_with(Arc::clone(&store), PASSWORD, &through(Arc::clone(&kms)), &cancel)
            .await?;
    assert_eq!(opened.config().repo_id, created.config().repo_id);
    let wrong =
        Repository::open_with(Arc::clone(&store), b"wrong", &through(Arc::clone(&kms)), &cancel)
            .await;
    assert!(matches!(wrong, Err(RepoError::WrongPassword { .. })), "{wrong:?}");
    match Repository::open(Arc::clone(&store), PASSWORD, &cancel).await {
        Err(RepoError::KmsKeyNeeded { key_ids }) => assert_eq!(key_ids, vec![arn.clone()]),
        other => panic!("expected KmsKeyNeeded, got {other:?}"),
    }

    // A flipped byte in the KMS ciphertext: the KMS refuses it.
    let mut tampered = file.clone();
    let KeyWrap::PasswordAndKms { kms_blob, .. } = &mut tampered.wrap else {
        panic!("a KMS key file")
    };
    let middle = kms_blob.len() / 2;
    kms_blob[middle] ^= 0x40;
    replace(store.as_ref(), key, &tampered).await;
    let refused =
        Repository::open_with(Arc::clone(&store), PASSWORD, &through(Arc::clone(&kms)), &cancel)
            .await;
    assert!(
        matches!(kms_refusal(&refused), Some(KmsError::InvalidCiphertext { .. })),
        "expected the KMS to refuse the ciphertext, got {refused:?}"
    );
    let text = refused.expect_err("refused").to_string();
    assert!(text.contains(&key.to_string()), "{text}");

    // Another key named in clear: the KMS refuses to decrypt with it.
    let other = kms::create_kms_key(&endpoint).expect("a KMS key on moto");
    let mut renamed = file.clone();
    let KeyWrap::PasswordAndKms { kms_key_id, .. } = &mut renamed.wrap else {
        panic!("a KMS key file")
    };
    kms_key_id.clone_from(&other);
    replace(store.as_ref(), key, &renamed).await;
    let refused =
        Repository::open_with(Arc::clone(&store), PASSWORD, &through(Arc::clone(&kms)), &cancel)
            .await;
    assert!(matches!(refused, Err(RepoError::Kms { .. })), "{refused:?}");

    replace(store.as_ref(), key, file).await;
    Repository::open_with(store, PASSWORD, &through(kms), &cancel).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_moto_a_password_change_keeps_the_kms_and_an_alias_stores_the_arn() -> TestResult {
    let endpoint = moto_endpoint();
    let cancel = CancellationToken::new();
    let store = s3_store("repo-kms-passwd", "ns").await;
    let arn = kms::create_kms_key(&endpoint).expect("a KMS key on moto");
    let alias = "alias/ferry-repo-kms-test";
    kms::moto_kms(
        &endpoint,
        "CreateAlias",
        &format!(r#"{{"AliasName":"{alias}","TargetKeyId":"{arn}"}}"#),
    )
    .expect("moto\'s KMS");
    let kms = aws_kms(&endpoint, alias).await;
    let (repo, _) =
        Repository::init(Arc::clone(&store), PASSWORD, &with_kms(Arc::clone(&kms)), &cancel)
            .await?;
    let new = b"the repository's next password";
    let id = repo.change_password(new, KdfParams::insecure_for_tests(), &cancel).await?;
    let listed = repo.key_files(&cancel).await?;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);
    let details = listed[0].file.as_ref().expect("readable");
    assert_eq!(details.kms_key_id.as_deref(), Some(arn.as_str()), "the key's ARN, not the alias");
    Repository::open_with(store, new, &through(kms), &cancel).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_right_password_a_disabled_kms_key_fails_saying_so() -> TestResult {
    let endpoint = moto_endpoint();
    let cancel = CancellationToken::new();
    let store = s3_store("repo-kms-disabled", "ns").await;
    let arn = kms::create_kms_key(&endpoint).expect("a KMS key on moto");
    let kms = aws_kms(&endpoint, &arn).await;
    Repository::init(Arc::clone(&store), PASSWORD, &with_kms(kms), &cancel).await?;
    // moto records the disable (by key id: it fails on an ARN here) but still decrypts, so
    // AWS's answer from then on is played by `disabled_kms`.
    let key_id = arn.rsplit('/').next().expect("the key id at the ARN's end");
    kms::moto_kms(&endpoint, "DisableKey", &format!(r#"{{"KeyId":"{key_id}"}}"#))
        .expect("moto\'s KMS");

    let disabled = aws_kms(&kms::kms_disabled(&arn).await, &arn).await;
    let refused = Repository::open_with(store, PASSWORD, &through(disabled), &cancel).await;
    assert!(
        matches!(kms_refusal(&refused), Some(KmsError::KeyDisabled { .. })),
        "expected a disabled key, got {refused:?}"
    );
    let e = refused.expect_err("refused");
    let text = e.to_string();
    assert!(text.contains(&arn) && text.contains("disabled"), "{text}");
    assert!(!text.contains("wrong password") && !e.is_retryable(), "{text}");
    Ok(())
}
