//! The key scenario on a real S3 server (moto).

use std::sync::Arc;

use ferry_store::{ObjectStore, S3Config, S3Options, S3Store, StaticCredentials};
use ferry_testbed::S3Server;

/// Creates a bucket with a path-style `PUT /bucket` (moto accepts it unsigned).
fn create_bucket(endpoint: &str, bucket: &str) {
    use std::io::{Read, Write};
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "bucket creation failed: {response}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_and_gc_reclaim_space_on_s3() {
    ferry_testbed::install_crypto_provider();
    let s3 = S3Server::shared();
    create_bucket(s3.endpoint(), "gc-reclaim");
    let options = S3Options {
        endpoint: Some(s3.endpoint().to_owned()),
        region: Some("us-east-1".into()),
        force_path_style: true,
        credentials: Some(StaticCredentials {
            access_key_id: "ferry-test".into(),
            secret_access_key: "ferry-test-secret".into(),
            session_token: None,
        }),
        ..S3Options::default()
    };
    let config = S3Config { bucket: "gc-reclaim".into(), prefix: "ferry/gc".into(), options };
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::new(config).await.unwrap());
    crate::reclaim(store).await;
}
