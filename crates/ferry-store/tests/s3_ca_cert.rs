//! The S3 store with a CA bundle ([`S3Options::ca_bundle`]): moto behind a TLS front whose
//! certificate a private CA signed is reachable only by a store told to trust that CA, and a
//! bundle without a usable certificate is refused before anything is contacted.

use std::time::Duration;

use bytes::Bytes;
use ferry_store::{
    ObjectKey, ObjectStore, PutOutcome, S3Config, S3Options, S3Store, StaticCredentials, StoreError,
};
use ferry_testbed::{S3Server, TlsFront};
use tokio_util::sync::CancellationToken;

/// A bucket on the shared moto server, with a name no other test uses.
fn bucket(s3: &S3Server, name: &str) -> String {
    let bucket = format!("ferry-ca-{}-{name}", std::process::id());
    s3.create_bucket(&bucket).expect("creating the bucket on moto");
    bucket
}

/// moto behind a fresh TLS front. Fails, saying why, when moto or the front cannot start.
fn front() -> (&'static S3Server, TlsFront) {
    let s3 = S3Server::shared();
    let front = TlsFront::start(s3.endpoint()).expect("starting the TLS front for moto");
    (s3, front)
}

/// Options for `endpoint` trusting `ca_bundle`, with few, short retries.
fn options(endpoint: &str, ca_bundle: Option<Vec<u8>>) -> S3Options {
    S3Options {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        force_path_style: true,
        credentials: Some(StaticCredentials {
            access_key_id: "ferry-test".into(),
            secret_access_key: "ferry-test-secret".into(),
            session_token: None,
        }),
        max_attempts: 2,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        connect_timeout: Duration::from_secs(5),
        ca_bundle,
        ..S3Options::default()
    }
}

async fn store_at(bucket: &str, options: S3Options) -> Result<S3Store, StoreError> {
    S3Store::new(S3Config { bucket: bucket.to_owned(), prefix: "repo".into(), options }).await
}

fn key(text: &str) -> ObjectKey {
    ObjectKey::new(text).expect("a valid key")
}

#[tokio::test]
async fn objects_round_trip_through_an_endpoint_signed_by_a_private_ca() {
    let (s3, front) = front();
    let bucket = bucket(s3, "round-trip");
    let ca = front.ca_pem().as_bytes().to_vec();
    let store = store_at(&bucket, options(front.url(), Some(ca))).await.expect("store");
    let cancel = CancellationToken::new();

    store.check_bucket(&cancel).await.expect("the bucket is reachable over TLS");
    let data = Bytes::from_static(b"stored behind TLS");
    let put = store.put_if_absent(&key("data/a"), data.clone(), &cancel).await.expect("put");
    assert_eq!(put, PutOutcome::Created);
    let again = store.put_if_absent(&key("data/a"), Bytes::new(), &cancel).await.expect("put");
    assert_eq!(again, PutOutcome::AlreadyExists);
    assert_eq!(store.get(&key("data/a"), &cancel).await.expect("get"), data);
    let listed = store.list("data/", &cancel).await.expect("list");
    let keys: Vec<_> = listed.iter().map(|m| (m.key.to_string(), m.size)).collect();
    assert_eq!(keys, vec![("data/a".to_owned(), data.len() as u64)]);
}

#[tokio::test]
async fn a_bundle_of_several_certificates_trusts_each() {
    let (s3, front) = front();
    let other = TlsFront::start(s3.endpoint()).expect("starting a second TLS front");
    let bucket = bucket(s3, "bundle");
    let bundle = format!("{}\n{}", other.ca_pem(), front.ca_pem()).into_bytes();
    let cancel = CancellationToken::new();
    for url in [front.url(), other.url()] {
        let store = store_at(&bucket, options(url, Some(bundle.clone()))).await.expect("store");
        store.check_bucket(&cancel).await.unwrap_or_else(|e| panic!("through {url}: {e}"));
    }
}

#[tokio::test]
async fn without_the_ca_the_certificate_is_refused_with_a_hint() {
    let (s3, front) = front();
    let bucket = bucket(s3, "untrusted");
    let store = store_at(&bucket, options(front.url(), None)).await.expect("store");
    let cancel = CancellationToken::new();

    let err = store.check_bucket(&cancel).await.expect_err("an untrusted certificate");
    let message = err.to_string();
    assert!(message.contains("certificate"), "{message}");
    assert!(message.contains("UnknownIssuer"), "{message}");
    assert!(message.contains("CA bundle"), "no hint at the fix: {message}");
    assert!(message.contains(front.url()), "the endpoint is not named: {message}");
    assert!(!err.is_retryable(), "retrying will not make the certificate trusted: {err:?}");

    // A CA that did not sign the endpoint's certificate does not help either.
    let other = TlsFront::start(s3.endpoint()).expect("starting a second TLS front");
    let wrong = Some(other.ca_pem().as_bytes().to_vec());
    let store = store_at(&bucket, options(front.url(), wrong)).await.expect("store");
    let err = store.get(&key("data/a"), &cancel).await.expect_err("a CA that did not sign it");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}

#[tokio::test]
async fn a_bundle_without_a_usable_certificate_is_refused_at_construction() {
    let not_a_certificate = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
    let not_der = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    let cases: [(&str, &[u8], &str); 4] = [
        ("empty", b"", "no PEM certificate"),
        ("text", b"this is not PEM", "no PEM certificate"),
        ("a key only", not_a_certificate.as_bytes(), "no PEM certificate"),
        ("not a certificate inside", not_der.as_bytes(), "certificate 1 of 1"),
    ];
    for (name, pem, expected) in cases {
        // Nothing listens there: construction alone must refuse.
        let err = store_at("b", options("https://127.0.0.1:9", Some(pem.to_vec())))
            .await
            .expect_err(name);
        assert!(matches!(err, StoreError::InvalidConfig { .. }), "{name}: {err:?}");
        let message = err.to_string();
        assert!(message.contains("CA bundle") && message.contains(expected), "{name}: {message}");
    }
}
