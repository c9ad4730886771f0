//! Helpers shared by the contract tests.

pub mod http;
pub mod iam;
pub mod moto;
pub mod relay;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use bytes::Bytes;
use ferry_store::{ObjectKey, S3Options, StaticCredentials};

/// A key from a literal.
pub fn key(text: &str) -> ObjectKey {
    ObjectKey::new(text).unwrap_or_else(|e| panic!("{e}"))
}

/// `len` bytes that differ by `seed` and by position, so misplaced ranges show.
pub fn data(len: usize, seed: u8) -> Bytes {
    (0..len).map(|i| (i % 251) as u8 ^ seed.wrapping_mul(31) ^ ((i >> 16) as u8)).collect()
}

/// Credentials moto accepts when it does not check them.
pub fn test_credentials() -> StaticCredentials {
    StaticCredentials {
        access_key_id: "ferry-test".into(),
        secret_access_key: "ferry-test-secret".into(),
        session_token: None,
    }
}

/// Options for a store on moto at `endpoint`: small multipart threshold and part size
/// (5 MiB, S3's minimum) and small list pages, so those paths run on small data.
pub fn s3_options(endpoint: &str) -> S3Options {
    S3Options {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        force_path_style: true,
        credentials: Some(test_credentials()),
        multipart_threshold: 6 << 20,
        part_size: 5 << 20,
        list_page_size: Some(7),
        max_attempts: 3,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        connect_timeout: Duration::from_secs(2),
        ..S3Options::default()
    }
}

/// A plain SDK client for test setup and for looking behind the store's back.
pub fn admin_client(endpoint: &str) -> aws_sdk_s3::Client {
    let creds = test_credentials();
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(ferry_store::aws_http_client())
        .region(Region::from_static("us-east-1"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(
            creds.access_key_id,
            creds.secret_access_key,
            None,
            None,
            "test",
        ))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// A bucket name no other test in this process uses.
pub fn unique_bucket() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("ferry-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Creates `bucket`.
pub async fn create_bucket(client: &aws_sdk_s3::Client, bucket: &str) {
    client.create_bucket().bucket(bucket).send().await.unwrap_or_else(|e| {
        panic!("creating bucket {bucket}: {}", aws_sdk_s3::error::DisplayErrorContext(e))
    });
}
