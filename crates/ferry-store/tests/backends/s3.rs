//! The S3 store against a real moto server over HTTP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_store::{
    ObjectStore, PutOutcome, S3Config, S3Options, S3Store, StaticCredentials, StoreError,
};
use tokio_util::sync::CancellationToken;

use crate::support::moto::{MotoServer, free_port};
use crate::support::relay::{self, OnAnswer};
use crate::support::{admin_client, create_bucket, data, iam, key, s3_options, unique_bucket};

/// Key prefix the contract stores use inside their bucket.
const PREFIX: &str = "ferry/repo";

/// A store in a fresh bucket, below [`PREFIX`], on the shared moto server.
async fn fixture() -> (S3Store, Arc<MotoServer>) {
    let moto = MotoServer::shared();
    let bucket = unique_bucket();
    create_bucket(&admin_client(&moto.endpoint()), &bucket).await;
    let config = S3Config { bucket, prefix: PREFIX.into(), options: s3_options(&moto.endpoint()) };
    let store = S3Store::new(config).await.unwrap_or_else(|e| panic!("{e}"));
    (store, moto)
}

/// moto's `If-None-Match: *` is a check followed by a write without a lock, so racing
/// creates on moto can all succeed (verified: three concurrent conditional
/// `CompleteMultipartUpload`s of one key all return 200). AWS S3 performs the check and the
/// write atomically; that half of the racing cases cannot be tested on moto.
mod contract {
    crate::contract_tests!(super::fixture, non_atomic_conditional_writes);
}

/// A store on `bucket` (no prefix) that reaches moto through the relay at `relay`.
async fn store_through(relay: std::net::SocketAddr, bucket: &str) -> S3Store {
    let options = s3_options(&format!("http://{relay}"));
    let config = S3Config { bucket: bucket.to_owned(), prefix: String::new(), options };
    S3Store::new(config).await.unwrap_or_else(|e| panic!("{e}"))
}

fn live() -> CancellationToken {
    CancellationToken::new()
}

async fn pending_uploads(client: &aws_sdk_s3::Client, bucket: &str) -> usize {
    let out = client.list_multipart_uploads().bucket(bucket).send().await;
    out.unwrap_or_else(|e| panic!("{}", aws_sdk_s3::error::DisplayErrorContext(e))).uploads().len()
}

/// Polls (bounded) until an upload is in progress in `bucket`.
async fn wait_for_upload(client: &aws_sdk_s3::Client, bucket: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pending_uploads(client, bucket).await == 0 {
        assert!(Instant::now() < deadline, "no multipart upload started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn large_objects_go_up_in_parts_below_the_prefix() {
    let (store, moto) = fixture().await;
    let client = admin_client(&moto.endpoint());
    let k = key("packs/p1");
    let outcome = store.put_if_absent(&k, data((11 << 20) + 1, 4), &live()).await;
    assert!(matches!(outcome, Ok(PutOutcome::Created)), "{outcome:?}");
    let head =
        client.head_object().bucket(store.bucket()).key(format!("{PREFIX}/packs/p1")).send().await;
    let e_tag = head.ok().and_then(|h| h.e_tag).unwrap_or_default();
    // A multipart object's ETag ends in `-<number of parts>`.
    assert!(e_tag.trim_matches('"').ends_with("-3"), "ETag {e_tag}");
    assert_eq!(pending_uploads(&client, store.bucket()).await, 0);
}

/// With the default options a pack of a default repository (16 MiB, one more blob, its
/// header: well under 64 MiB) is one `PutObject`, not a multipart upload of three requests
/// more; only larger objects go up in parts.
#[tokio::test]
async fn pack_sized_objects_are_one_put_by_default() {
    let moto = MotoServer::shared();
    let client = admin_client(&moto.endpoint());
    let bucket = unique_bucket();
    create_bucket(&client, &bucket).await;
    let defaults = S3Options::default();
    let options = S3Options {
        multipart_threshold: defaults.multipart_threshold,
        part_size: defaults.part_size,
        ..s3_options(&moto.endpoint())
    };
    let config = S3Config { bucket: bucket.clone(), prefix: String::new(), options };
    let store = S3Store::new(config).await.unwrap_or_else(|e| panic!("{e}"));
    let e_tag = |name: &'static str| {
        let client = client.clone();
        let bucket = bucket.clone();
        async move {
            let head = client.head_object().bucket(bucket).key(name).send().await;
            head.ok().and_then(|h| h.e_tag).unwrap_or_default().trim_matches('"').to_owned()
        }
    };
    let pack = (33 << 20) + 5;
    store.put_if_absent(&key("pack"), data(pack, 1), &live()).await.expect("put");
    let single = e_tag("pack").await;
    assert!(!single.is_empty() && !single.contains('-'), "one PUT, ETag {single}");
    let above = usize::try_from(defaults.multipart_threshold).expect("fits") + 1;
    store.put_if_absent(&key("large"), data(above, 2), &live()).await.expect("put");
    let parts = e_tag("large").await;
    let count = (defaults.multipart_threshold + 1).div_ceil(defaults.part_size);
    assert!(parts.ends_with(&format!("-{count}")), "{above} bytes in {count} parts, ETag {parts}");
}

#[tokio::test]
async fn prefix_isolates_stores_and_foreign_objects_are_skipped() {
    let (store, moto) = fixture().await;
    let client = admin_client(&moto.endpoint());
    let mut other_config = S3Config::new(store.bucket(), "ferry/other");
    other_config.options = s3_options(&moto.endpoint());
    let other = S3Store::new(other_config).await.unwrap_or_else(|e| panic!("{e}"));
    store
        .put_if_absent(&key("config"), "mine".into(), &live())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for foreign in
        [format!("{PREFIX}/bad key"), format!("{PREFIX}/a//b"), "ferry/repository".into()]
    {
        let put =
            client.put_object().bucket(store.bucket()).key(&foreign).body(Vec::from("f").into());
        put.send()
            .await
            .unwrap_or_else(|e| panic!("{}", aws_sdk_s3::error::DisplayErrorContext(e)));
    }
    let listed = store.list("", &live()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(listed.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(), ["config"]);
    assert!(other.list("", &live()).await.ok().is_some_and(|l| l.is_empty()));
    assert_eq!(
        other.head(&key("config"), &live()).await.unwrap_or_else(|e| panic!("head: {e}")),
        None,
        "not visible under the other prefix"
    );
    assert_eq!(
        other.put_if_absent(&key("config"), "theirs".into(), &live()).await.ok(),
        Some(PutOutcome::Created)
    );
    assert_eq!(store.get(&key("config"), &live()).await.ok().as_deref(), Some(&b"mine"[..]));
}

/// Another writer creates the key while our multipart upload is in flight: the conditional
/// `CompleteMultipartUpload` refuses, the other object stays, our upload is aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_complete_loses_to_an_earlier_writer() {
    let moto = MotoServer::shared();
    let client = admin_client(&moto.endpoint());
    let bucket = unique_bucket();
    create_bucket(&client, &bucket).await;
    let mut config = S3Config::new(&bucket, "");
    config.options = S3Options { part_concurrency: 1, ..s3_options(&moto.endpoint()) };
    let store = S3Store::new(config).await.unwrap_or_else(|e| panic!("{e}"));
    let k = key("leases/big");
    let writer = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move { store.put_if_absent(&k, data(40 << 20, 1), &live()).await })
    };
    wait_for_upload(&client, &bucket).await;
    let put = client.put_object().bucket(&bucket).key("leases/big").body(Vec::from("other").into());
    put.send().await.unwrap_or_else(|e| panic!("{}", aws_sdk_s3::error::DisplayErrorContext(e)));
    let outcome = writer.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(outcome, Ok(PutOutcome::AlreadyExists)), "{outcome:?}");
    assert_eq!(store.get(&k, &live()).await.ok().as_deref(), Some(&b"other"[..]));
    assert_eq!(pending_uploads(&client, &bucket).await, 0, "upload not aborted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_multipart_upload_aborts_it() {
    let (store, moto) = fixture().await;
    let client = admin_client(&moto.endpoint());
    let k = key("packs/cancelled");
    let cancel = CancellationToken::new();
    let writer = {
        let (store, k, cancel) = (store.clone(), k.clone(), cancel.clone());
        tokio::spawn(async move { store.put_if_absent(&k, data(40 << 20, 2), &cancel).await })
    };
    wait_for_upload(&client, store.bucket()).await;
    cancel.cancel();
    let outcome = writer.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(outcome, Err(StoreError::Cancelled)), "{outcome:?}");
    assert_eq!(
        store.head(&k, &live()).await.unwrap_or_else(|e| panic!("head: {e}")),
        None,
        "nothing written"
    );
    assert_eq!(pending_uploads(&client, store.bucket()).await, 0, "upload not aborted");
}

/// Cancelled while the server is creating the multipart upload (its answer is held back): the
/// store still learns the upload's id and aborts it, leaving no parts behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_while_an_upload_is_being_created_still_aborts_it() {
    let moto = MotoServer::shared();
    let client = admin_client(&moto.endpoint());
    let bucket = unique_bucket();
    create_bucket(&client, &bucket).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let line = format!("POST /{bucket}/packs/slow?uploads");
    let hold = OnAnswer::Hold(Arc::clone(&release));
    let (relay, held) = relay::intercept_answer(moto.addr(), line, hold).await;
    let store = store_through(relay, &bucket).await;
    let cancel = CancellationToken::new();
    let writer = {
        let (store, cancel) = (store.clone(), cancel.clone());
        tokio::spawn(async move {
            store.put_if_absent(&key("packs/slow"), data(12 << 20, 6), &cancel).await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while held.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the upload was never created");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(pending_uploads(&client, &bucket).await, 1, "created, its answer held");
    cancel.cancel();
    // Time for a store that gives up on the held answer to do so before it arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    release.notify_one();
    let outcome = tokio::time::timeout(Duration::from_secs(60), writer).await.expect("bounded");
    let outcome = outcome.unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(outcome, Err(StoreError::Cancelled)), "{outcome:?}");
    assert_eq!(pending_uploads(&client, &bucket).await, 0, "upload not aborted");
}

#[tokio::test]
async fn missing_bucket_is_location_missing() {
    let moto = MotoServer::shared();
    let mut config = S3Config::new("ferry-no-such-bucket", "x");
    config.options = s3_options(&moto.endpoint());
    let store = S3Store::new(config).await.unwrap_or_else(|e| panic!("{e}"));
    let k = key("config");
    let missing = |what: &str, r: Result<(), StoreError>| match r {
        Err(StoreError::LocationMissing { location }) => {
            assert!(location.contains("ferry-no-such-bucket"), "{what}: {location}");
        }
        other => panic!("{what}: expected LocationMissing, got {other:?}"),
    };
    missing("put", store.put_if_absent(&k, "x".into(), &live()).await.map(drop));
    missing("multipart put", store.put_if_absent(&k, data(7 << 20, 0), &live()).await.map(drop));
    missing("get", store.get(&k, &live()).await.map(drop));
    missing("get_range", store.get_range(&k, 0, 1, &live()).await.map(drop));
    missing("head", store.head(&k, &live()).await.map(drop));
    missing("list", store.list("", &live()).await.map(drop));
    missing("delete", store.delete(&k, &live()).await);
    missing("check_bucket", store.check_bucket(&live()).await);
}

/// Nothing listens on the port: every call fails as `Unavailable` naming the endpoint, after
/// the configured (bounded) attempts.
#[tokio::test]
async fn unreachable_endpoint_is_unavailable() {
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let mut config = S3Config::new("bucket", "");
    config.options = s3_options(&endpoint);
    let store = S3Store::new(config).await.unwrap_or_else(|e| panic!("{e}"));
    let unavailable = |what: &str, r: Result<(), StoreError>| match r {
        Err(e @ StoreError::Unavailable { .. }) => {
            assert!(e.is_retryable());
            assert!(e.to_string().contains(&endpoint), "{what}: {e}");
        }
        other => panic!("{what}: expected Unavailable, got {other:?}"),
    };
    unavailable("put", store.put_if_absent(&key("k"), "x".into(), &live()).await.map(drop));
    unavailable("get", store.get(&key("k"), &live()).await.map(drop));
    unavailable("list", store.list("", &live()).await.map(drop));
}

/// moto in authenticating mode checks SigV4 signatures against its IAM keys and IAM
/// policies against actions, so each kind of credential failure is real here.
#[tokio::test]
async fn rejected_credentials_are_access_denied() {
    let moto = MotoServer::start(&[]);
    let bucket = unique_bucket();
    create_bucket(&admin_client(&moto.endpoint()), &bucket).await;
    let user = iam::create_user_without_policy(moto.addr(), "ferry-no-rights");
    iam::enable_auth(moto.addr());
    let attempts = [
        ("unknown key id", "AKIAFERRYUNKNOWN0000", "whatever", "InvalidAccessKeyId"),
        ("wrong secret", user.id.as_str(), "not-the-secret", "SignatureDoesNotMatch"),
        ("no permission", user.id.as_str(), user.secret.as_str(), "AccessDenied"),
    ];
    for (what, id, secret, code) in attempts {
        let mut config = S3Config::new(&bucket, "");
        config.options = s3_options(&moto.endpoint());
        config.options.credentials = Some(StaticCredentials {
            access_key_id: id.into(),
            secret_access_key: secret.into(),
            session_token: None,
        });
        let store = S3Store::new(config).await.unwrap_or_else(|e| panic!("{e}"));
        for (op, result) in [
            ("put", store.put_if_absent(&key("k"), "x".into(), &live()).await.map(drop)),
            ("list", store.list("", &live()).await.map(drop)),
        ] {
            match result {
                Err(StoreError::AccessDenied { location, message }) => {
                    assert!(location.contains(&bucket), "{what} {op}: {location}");
                    assert!(message.contains(code), "{what} {op}: {message}");
                }
                other => panic!("{what} {op}: expected AccessDenied, got {other:?}"),
            }
        }
    }
}

/// The store's listing really crosses pages here: moto honours the small page size the
/// tests configure, so `list` must follow continuation tokens to see everything.
#[tokio::test]
async fn listing_follows_continuation_tokens() {
    let (store, moto) = fixture().await;
    for i in 0..20 {
        let outcome = store.put_if_absent(&key(&format!("idx/{i:03}")), "x".into(), &live()).await;
        assert!(matches!(outcome, Ok(PutOutcome::Created)), "{outcome:?}");
    }
    let client = admin_client(&moto.endpoint());
    let first = client.list_objects_v2().bucket(store.bucket()).max_keys(7).send().await;
    let first = first.unwrap_or_else(|e| panic!("{}", aws_sdk_s3::error::DisplayErrorContext(e)));
    assert_eq!((first.contents().len(), first.is_truncated()), (7, Some(true)));
    let listed = store.list("idx/", &live()).await.unwrap_or_else(|e| panic!("{e}"));
    let want: Vec<String> = (0..20).map(|i| format!("idx/{i:03}")).collect();
    assert_eq!(listed.iter().map(|m| m.key.to_string()).collect::<Vec<_>>(), want);
}

/// The answer to a conditional PUT that committed is lost; the SDK retries and meets the
/// object with 412. The write is still this writer's: `Created`, not `AlreadyExists` (which
/// would make a repository init that won its race give up its key file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_write_that_had_committed_is_still_created() {
    let moto = MotoServer::shared();
    let bucket = unique_bucket();
    create_bucket(&admin_client(&moto.endpoint()), &bucket).await;
    let line = format!("PUT /{bucket}/config?");
    let (relay, dropped) = relay::intercept_answer(moto.addr(), line, OnAnswer::Drop).await;
    let store = store_through(relay, &bucket).await;
    let outcome = store.put_if_absent(&key("config"), data(100, 3), &live()).await;
    assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 1, "the answer was dropped");
    assert!(matches!(outcome, Ok(PutOutcome::Created)), "{outcome:?}");
    let again = store.put_if_absent(&key("config"), data(100, 4), &live()).await;
    assert!(matches!(again, Ok(PutOutcome::AlreadyExists)), "another write: {again:?}");
    assert_eq!(store.get(&key("config"), &live()).await.ok(), Some(data(100, 3)));
}

/// On a server that ignores `If-None-Match`, racing writers could overwrite each other: the
/// store finds out with a probe before its first create and refuses to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_conditional_writes_is_refused_before_any_write() {
    let moto = MotoServer::shared();
    let bucket = unique_bucket();
    create_bucket(&admin_client(&moto.endpoint()), &bucket).await;
    let relay = relay::condition_stripping(moto.addr()).await;
    let store = store_through(relay, &bucket).await;
    let refused = store.put_if_absent(&key("config"), data(10, 1), &live()).await;
    let message = match refused {
        Err(e @ StoreError::Backend { .. }) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(message.contains("If-None-Match"), "{message}");
    assert_eq!(store.head(&key("config"), &live()).await.ok(), Some(None), "nothing written");
    let listed = admin_client(&moto.endpoint()).list_objects_v2().bucket(&bucket).send().await;
    let listed = listed.unwrap_or_else(|e| panic!("{}", aws_sdk_s3::error::DisplayErrorContext(e)));
    assert_eq!(listed.key_count(), Some(0), "the probe is cleaned up");
}

/// The probe before a store's first create costs two writes and a delete: the refusal of its
/// second write is the answer, with no `HeadObject` to ask whose object it met (a server that
/// overwrites would overwrite on a retry too); the create itself follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conditional_write_probe_asks_no_more_than_it_needs() {
    let moto = MotoServer::shared();
    let bucket = unique_bucket();
    create_bucket(&admin_client(&moto.endpoint()), &bucket).await;
    // A request line nothing sends: the relay only logs.
    let (relay, seen) = relay::conflict_injecting(moto.addr(), "NONE /".into()).await;
    let store = store_through(relay, &bucket).await;
    let created = store.put_if_absent(&key("config"), data(10, 1), &live()).await;
    assert!(matches!(created, Ok(PutOutcome::Created)), "{created:?}");
    let probe = format!("/{bucket}/probe/conditional-");
    assert_eq!(seen.count(&format!("PUT {probe}")), 2, "{:?}", seen.requests);
    assert_eq!(seen.count(&format!("DELETE {probe}")), 1, "{:?}", seen.requests);
    assert_eq!(seen.count("HEAD "), 0, "{:?}", seen.requests);
    assert_eq!(seen.count(&format!("PUT /{bucket}/config")), 1, "{:?}", seen.requests);
}

/// `prepare_creates` makes that probe ahead of the first create, once: a second preparation
/// sends nothing, and the create then sends only its own write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preparing_creates_probes_once_ahead_of_the_first_create() {
    let moto = MotoServer::shared();
    let bucket = unique_bucket();
    create_bucket(&admin_client(&moto.endpoint()), &bucket).await;
    // A request line nothing sends: the relay only logs.
    let (relay, seen) = relay::conflict_injecting(moto.addr(), "NONE /".into()).await;
    let store = store_through(relay, &bucket).await;
    let sent = || seen.count("");
    store.prepare_creates(&live()).await.expect("probe");
    let probe = format!("/{bucket}/probe/conditional-");
    assert_eq!(seen.count(&format!("PUT {probe}")), 2, "{:?}", seen.requests);
    assert_eq!(seen.count(&format!("DELETE {probe}")), 1, "{:?}", seen.requests);
    let after_probe = sent();
    store.prepare_creates(&live()).await.expect("probed already");
    assert_eq!(sent(), after_probe, "{:?}", seen.requests);
    let created = store.put_if_absent(&key("config"), data(10, 1), &live()).await;
    assert!(matches!(created, Ok(PutOutcome::Created)), "{created:?}");
    assert_eq!(sent(), after_probe + 1, "{:?}", seen.requests);
    assert_eq!(seen.count(&format!("PUT /{bucket}/config")), 1, "{:?}", seen.requests);
}

/// S3 answers a `CompleteMultipartUpload` that raced another conditional write with `409
/// ConditionalRequestConflict`; that upload is spent. The store aborts it and uploads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_on_completion_restarts_the_upload() {
    let moto = MotoServer::shared();
    let client = admin_client(&moto.endpoint());
    let bucket = unique_bucket();
    create_bucket(&client, &bucket).await;
    let completion = format!("POST /{bucket}/packs/big?uploadId=");
    let (relay, seen) = relay::conflict_injecting(moto.addr(), completion.clone()).await;
    let store = store_through(relay, &bucket).await;
    let (k, cancel) = (key("packs/big"), live());
    let put = store.put_if_absent(&k, data(12 << 20, 5), &cancel);
    let outcome = tokio::time::timeout(Duration::from_secs(120), put).await.expect("bounded");
    assert!(matches!(outcome, Ok(PutOutcome::Created)), "{outcome:?}");
    assert_eq!(seen.answered.load(std::sync::atomic::Ordering::SeqCst), 1, "409 injected");
    let started = seen.count(&format!("POST /{bucket}/packs/big?uploads"));
    assert_eq!((started, seen.count(&completion)), (2, 2), "a second upload, completed");
    assert_eq!(store.get(&key("packs/big"), &live()).await.ok(), Some(data(12 << 20, 5)));
    assert_eq!(pending_uploads(&client, &bucket).await, 0, "the spent upload is aborted");
}

/// A capped read of an object far over the cap is refused by its `Content-Length`: the body
/// is not downloaded (the relay passes on less than the cap, what the sockets buffer before
/// the store drops the connection; a store that read up to the cap would pass more), while an
/// uncapped read of it passes it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_over_the_cap_is_refused_without_downloading_it() {
    let moto = MotoServer::shared();
    let client = admin_client(&moto.endpoint());
    let bucket = unique_bucket();
    create_bucket(&client, &bucket).await;
    let size = 64 << 20;
    let put = client.put_object().bucket(&bucket).key("snapshots/huge").body(data(size, 8).into());
    put.send().await.unwrap_or_else(|e| panic!("{}", aws_sdk_s3::error::DisplayErrorContext(e)));
    let (relay, relayed) = relay::counting(moto.addr()).await;
    let store = store_through(relay, &bucket).await;
    let k = key("snapshots/huge");
    let cap = 8 << 20;
    let refused = store.get_at_most(&k, cap as u64, &live()).await;
    match refused {
        Err(StoreError::TooLarge { key: got, size: s, max }) => {
            assert_eq!((got, s, max), (k.clone(), size as u64, cap as u64));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // Let whatever was in flight arrive before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after_refusal = relayed.load(std::sync::atomic::Ordering::SeqCst);
    assert!(after_refusal < cap, "{after_refusal} of {size} bytes came through");
    let whole = store.get(&k, &live()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(whole.len(), size);
    let after_whole = relayed.load(std::sync::atomic::Ordering::SeqCst);
    assert!(after_whole - after_refusal >= size, "the relay counts what it passes on");
}

/// Velero's `serverSideEncryption` and `kmsKeyId`: every object written, in one part or in
/// several, asks for that encryption (a bucket policy requiring it would refuse the rest).
#[tokio::test]
async fn objects_are_written_with_the_server_side_encryption_asked_for() {
    use ferry_store::ServerSideEncryption;
    let moto = MotoServer::shared();
    let admin = admin_client(&moto.endpoint());
    let cases = [
        (ServerSideEncryption::Algorithm("AES256".into()), "AES256", None),
        (
            ServerSideEncryption::KmsKey("alias/ferry-backups".into()),
            "aws:kms",
            Some("alias/ferry-backups"),
        ),
    ];
    for (sse, algorithm, kms_key) in cases {
        let bucket = unique_bucket();
        create_bucket(&admin, &bucket).await;
        let mut options = s3_options(&moto.endpoint());
        options.server_side_encryption = Some(sse);
        options.multipart_threshold = 5 << 20;
        options.part_size = 5 << 20;
        let config = S3Config { bucket: bucket.clone(), prefix: String::new(), options };
        let store = S3Store::new(config).await.unwrap_or_else(|e| panic!("{e}"));
        let (small, large) = (key("small"), key("large"));
        store.put_if_absent(&small, data(1000, 1), &live()).await.expect("small put");
        store.put_if_absent(&large, data(11 << 20, 2), &live()).await.expect("multipart put");
        for k in ["small", "large"] {
            let head = admin.head_object().bucket(&bucket).key(k).send().await.expect("head");
            let got = head.server_side_encryption().map(|s| s.as_str().to_owned());
            assert_eq!(got.as_deref(), Some(algorithm), "{k}");
            if let Some(kms_key) = kms_key {
                assert!(
                    head.ssekms_key_id()
                        .is_some_and(|id| id.contains(kms_key.trim_start_matches("alias/"))),
                    "{k}: {:?}",
                    head.ssekms_key_id()
                );
            }
        }
    }
}
