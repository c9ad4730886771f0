//! The client against an in-process SnapshotMetadata server that follows a script: broken
//! streams resumed where they broke, errors that must not be retried, answers that must not be
//! trusted, cancellation, and TLS that trusts only the service's CA.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_cbt::{BlockType, CbtError, Connection, Range, Retry, Service, Tokens};
use ferry_proto::snapshotmetadata::snapshot_metadata_server::{
    SnapshotMetadata, SnapshotMetadataServer,
};
use ferry_proto::snapshotmetadata::{
    BlockMetadata, BlockMetadataType, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use futures::Stream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Identity, Server, ServerTlsConfig};
use tonic::{Code, Request, Response, Status};

const CAPACITY: i64 = 1 << 20;

/// What one stream does: send the blocks from the requested offset on, `per_message` at a
/// time, and fail with `fail` after `send` messages (or end normally when `fail` is `None`).
#[derive(Clone)]
struct Step {
    send: usize,
    fail: Option<Code>,
}

#[derive(Default)]
struct Script {
    blocks: Vec<BlockMetadata>,
    steps: Vec<Step>,
    /// Sent as they are, ignoring the offset (for answers that break rules).
    raw: Option<Vec<BlockMetadata>>,
    /// Responses without a range sent before the blocks.
    empties: usize,
    /// The call is answered but the stream never sends a message.
    hang: bool,
}

#[derive(Clone, Default)]
struct Fake {
    script: Arc<Mutex<Script>>,
    /// (starting_offset, token, snapshot or base/target) of every call.
    calls: Arc<Mutex<Vec<(i64, String, String)>>>,
}

type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl Fake {
    fn answers(&self, start: i64) -> Vec<Result<Vec<BlockMetadata>, Status>> {
        let mut script = self.script.lock().unwrap();
        if let Some(raw) = &script.raw {
            return vec![Ok(raw.clone())];
        }
        let step = if script.steps.is_empty() {
            Step { send: usize::MAX, fail: None }
        } else {
            script.steps.remove(0)
        };
        let pending: Vec<BlockMetadata> = script
            .blocks
            .iter()
            .filter(|b| b.byte_offset + b.size_bytes > start)
            .copied()
            .collect();
        let mut out: Vec<Result<Vec<BlockMetadata>, Status>> =
            (0..script.empties).map(|_| Ok(Vec::new())).collect();
        out.extend(pending.chunks(2).take(step.send).map(|c| Ok(c.to_vec())));
        if let Some(code) = step.fail {
            out.push(Err(Status::new(code, "scripted failure")));
        }
        out
    }
}

#[tonic::async_trait]
impl SnapshotMetadata for Fake {
    type GetMetadataAllocatedStream = Answers<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Answers<GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let r = request.into_inner();
        self.calls.lock().unwrap().push((r.starting_offset, r.security_token, r.snapshot_name));
        if self.script.lock().unwrap().hang {
            return Ok(Response::new(Box::pin(futures::stream::pending())));
        }
        let answers = self.answers(r.starting_offset).into_iter().map(|a| {
            a.map(|blocks| GetMetadataAllocatedResponse {
                block_metadata_type: BlockMetadataType::FixedLength.into(),
                volume_capacity_bytes: CAPACITY,
                block_metadata: blocks,
            })
        });
        Ok(Response::new(Box::pin(futures::stream::iter(answers.collect::<Vec<_>>()))))
    }

    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let r = request.into_inner();
        let what = format!("{}..{}", r.base_snapshot_id, r.target_snapshot_name);
        self.calls.lock().unwrap().push((r.starting_offset, r.security_token, what));
        let answers = self.answers(r.starting_offset).into_iter().map(|a| {
            a.map(|blocks| GetMetadataDeltaResponse {
                block_metadata_type: BlockMetadataType::VariableLength.into(),
                volume_capacity_bytes: CAPACITY,
                block_metadata: blocks,
            })
        });
        Ok(Response::new(Box::pin(futures::stream::iter(answers.collect::<Vec<_>>()))))
    }
}

fn blocks(list: &[(i64, i64)]) -> Vec<BlockMetadata> {
    list.iter().map(|&(o, s)| BlockMetadata { byte_offset: o, size_bytes: s }).collect()
}

async fn serve(fake: Fake, tls: Option<Identity>) -> SocketAddr {
    // rustls has two providers in this workspace; tonic's server takes the process default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut server = Server::builder();
    if let Some(identity) = tls {
        server = server.tls_config(ServerTlsConfig::new().identity(identity)).unwrap();
    }
    let router = server.add_service(SnapshotMetadataServer::new(fake));
    tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
    addr
}

const RETRY: Retry = Retry {
    attempts: 3,
    backoff: Duration::from_millis(10),
    max_results: 0,
    idle: Duration::from_secs(30),
    max_ranges: 1000,
};

async fn connection(fake: &Fake) -> Connection {
    connection_with(fake, RETRY).await
}

async fn connection_with(fake: &Fake, retry: Retry) -> Connection {
    let addr = serve(fake.clone(), None).await;
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    Connection::new(channel, Tokens::fixed("the-token".into(), "ferry"), retry)
}

fn fake(blocks: Vec<BlockMetadata>, steps: Vec<Step>) -> Fake {
    let fake = Fake::default();
    *fake.script.lock().unwrap() = Script { blocks, steps, ..Script::default() };
    fake
}

const LIST: &[(i64, i64)] =
    &[(0, 4096), (4096, 4096), (16384, 4096), (65536, 4096), (69632, 4096), (131072, 4096)];

#[tokio::test]
async fn a_broken_stream_resumes_after_the_last_range_received_and_loses_nothing() {
    let steps = vec![
        Step { send: 1, fail: Some(Code::Unavailable) },
        Step { send: 1, fail: Some(Code::Internal) },
        Step { send: usize::MAX, fail: None },
    ];
    let fake = fake(blocks(LIST), steps);
    let conn = connection(&fake).await;
    let map = conn.allocated("velero", "snap-1", &CancellationToken::new()).await.unwrap();
    assert_eq!(map.capacity, Some(1 << 20));
    assert_eq!(map.block_type, Some(BlockType::FixedLength));
    assert_eq!(
        map.ranges,
        [
            Range { offset: 0, len: 8192 },
            Range { offset: 16384, len: 4096 },
            Range { offset: 65536, len: 8192 },
            Range { offset: 131072, len: 4096 },
        ]
    );
    let calls = fake.calls.lock().unwrap().clone();
    let starts: Vec<i64> = calls.iter().map(|c| c.0).collect();
    assert_eq!(starts, [0, 8192, 69632], "each stream starts where the last range ended");
    assert!(calls.iter().all(|c| c.1 == "the-token" && c.2 == "snap-1"));
}

#[tokio::test]
async fn a_delta_names_its_base_by_handle_and_its_target_by_name() {
    let fake = fake(blocks(&[(8192, 100)]), Vec::new());
    let conn = connection(&fake).await;
    let map = conn.delta("velero", "handle-1", "snap-2", &CancellationToken::new()).await.unwrap();
    assert_eq!(map.ranges, [Range { offset: 8192, len: 100 }]);
    assert_eq!(map.block_type, Some(BlockType::VariableLength));
    assert_eq!(fake.calls.lock().unwrap()[0].2, "handle-1..snap-2");
}

#[tokio::test]
async fn a_stream_that_ends_without_a_response_means_nothing_changed() {
    // The hostpath driver answers an unchanged volume (or an empty one) this way.
    let fake = fake(Vec::new(), Vec::new());
    let conn = connection(&fake).await;
    let map = conn.delta("velero", "handle-1", "snap-2", &CancellationToken::new()).await.unwrap();
    assert_eq!((map.capacity, map.block_type, map.ranges.len()), (None, None, 0));
    let map = conn.allocated("velero", "snap-2", &CancellationToken::new()).await.unwrap();
    assert_eq!((map.capacity, map.bytes()), (None, 0));
    assert_eq!(fake.calls.lock().unwrap().len(), 2, "an empty answer was retried");
}

#[tokio::test]
async fn a_silent_stream_is_resumed_then_given_up() {
    let fake = Fake::default();
    fake.script.lock().unwrap().hang = true;
    let retry = Retry { idle: Duration::from_millis(200), ..RETRY };
    let conn = connection_with(&fake, retry).await;
    let err = conn.allocated("velero", "snap-1", &CancellationToken::new()).await.unwrap_err();
    assert!(
        matches!(&err, CbtError::Broken { attempts: 3, code: Code::DeadlineExceeded, message, .. }
            if message.contains("sent nothing")),
        "{err}"
    );
    assert_eq!(fake.calls.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn answers_past_the_bounds_are_refused() {
    // Too many separate ranges to read one by one.
    let scattered = fake(blocks(LIST), Vec::new());
    let conn = connection_with(&scattered, Retry { max_ranges: 3, ..RETRY }).await;
    let err = conn.allocated("velero", "snap-1", &CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, CbtError::TooFragmented { limit: 3, .. }), "{err}");
    assert_eq!(err.reason().map(|r| r.as_str()), Some("too-fragmented"));
    // A stream kept busy with responses that say nothing.
    let busy = fake(blocks(LIST), Vec::new());
    busy.script.lock().unwrap().empties = 1001;
    let conn = connection(&busy).await;
    let err = conn.allocated("velero", "snap-1", &CancellationToken::new()).await.unwrap_err();
    assert!(
        matches!(&err, CbtError::Untrusted { reason, .. } if reason.contains("carried no range")),
        "{err}"
    );
    // A thousand is still patience, not abuse.
    let patient = fake(blocks(LIST), Vec::new());
    patient.script.lock().unwrap().empties = 1000;
    let conn = connection(&patient).await;
    let map = conn.allocated("velero", "snap-1", &CancellationToken::new()).await.unwrap();
    assert_eq!(map.bytes(), 6 * 4096);
}

#[tokio::test]
async fn errors_retrying_cannot_fix_are_not_retried() {
    for code in [Code::NotFound, Code::PermissionDenied, Code::InvalidArgument, Code::OutOfRange] {
        let fake = fake(blocks(LIST), vec![Step { send: 0, fail: Some(code) }]);
        let conn = connection(&fake).await;
        let err = conn.allocated("velero", "snap-1", &CancellationToken::new()).await.unwrap_err();
        assert!(matches!(err, CbtError::Refused { code: c, .. } if c == code), "{err}");
        assert_eq!(fake.calls.lock().unwrap().len(), 1, "{code:?} was retried");
    }
    // An expired token gets one more try, then the refusal stands. (That the retry carries a
    // new token is shown on the real node: a fixed token cannot change.)
    let unauth = Step { send: 0, fail: Some(Code::Unauthenticated) };
    let fake = fake(blocks(LIST), vec![unauth.clone(), unauth]);
    let conn = connection(&fake).await;
    let err = conn.allocated("velero", "snap-1", &CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, CbtError::Refused { code: Code::Unauthenticated, .. }), "{err}");
    assert_eq!(err.reason().map(|r| r.as_str()), Some("unauthorized"));
    assert_eq!(fake.calls.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_stream_that_keeps_breaking_without_progress_fails_after_the_attempts() {
    let broken = Step { send: 0, fail: Some(Code::Unavailable) };
    let fake = fake(blocks(LIST), vec![broken; 10]);
    let conn = connection(&fake).await;
    let err = conn.allocated("velero", "snap-1", &CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, CbtError::Broken { attempts: 3, .. }), "{err}");
    assert_eq!(err.reason().map(|r| r.as_str()), Some("stream-failed"));
    assert_eq!(fake.calls.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn an_answer_that_breaks_a_rule_is_refused_whole() {
    for (list, want) in [
        (vec![(0, 4096), (0, 4096)], "overlaps"),
        (vec![(CAPACITY - 4096, 8192)], "ends past"),
        (vec![(4096, 0)], "empty"),
        (vec![(-4096, 4096)], "negative"),
    ] {
        let fake = Fake::default();
        fake.script.lock().unwrap().raw = Some(blocks(&list));
        let conn = connection(&fake).await;
        let err = conn.allocated("velero", "snap-1", &CancellationToken::new()).await.unwrap_err();
        assert!(
            matches!(&err, CbtError::Untrusted { reason, .. } if reason.contains(want)),
            "{err}"
        );
        assert_eq!(err.reason().map(|r| r.as_str()), Some("untrusted"));
    }
}

#[tokio::test]
async fn cancelling_stops_a_stream_that_never_ends() {
    let fake = Fake::default();
    fake.script.lock().unwrap().hang = true;
    let conn = connection(&fake).await;
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.cancel();
    });
    let outcome =
        tokio::time::timeout(Duration::from_secs(10), conn.allocated("velero", "snap-1", &cancel))
            .await
            .expect("cancellation did not stop the stream");
    assert!(matches!(outcome, Err(CbtError::Cancelled)));
}

fn authority(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
}

fn service(addr: SocketAddr, ca_pem: &str) -> Service {
    Service {
        driver: "hostpath.csi.k8s.io".into(),
        address: addr.to_string(),
        audience: "ferry".into(),
        ca_pem: ca_pem.as_bytes().to_vec(),
    }
}

#[tokio::test]
async fn tls_trusts_the_services_ca_and_nothing_else() {
    let ca = authority("snapshot-metadata CA");
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let identity = Identity::from_pem(cert.pem(), key.serialize_pem());
    let fake = fake(blocks(&[(0, 4096)]), Vec::new());
    let addr = serve(fake, Some(identity)).await;

    let channel = service(addr, &ca.pem()).connect().await.expect("the right CA connects");
    let retry = Retry::default();
    let conn = Connection::new(channel, Tokens::fixed("t".into(), "ferry"), retry);
    let map = conn.allocated("velero", "s", &CancellationToken::new()).await.unwrap();
    assert_eq!(map.bytes(), 4096);

    let other = authority("some other CA");
    let refused = async {
        let channel = service(addr, &other.pem()).connect().await?;
        Connection::new(channel, Tokens::fixed("t".into(), "ferry"), retry)
            .allocated("velero", "s", &CancellationToken::new())
            .await
    };
    let err = refused.await.expect_err("a certificate from another CA was trusted");
    assert!(matches!(err, CbtError::Connect { .. }), "{err}");
}

#[tokio::test]
async fn tls_refuses_a_certificate_for_another_host() {
    let ca = authority("snapshot-metadata CA");
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["sms.elsewhere.example".to_owned()]).unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let identity = Identity::from_pem(cert.pem(), key.serialize_pem());
    let addr = serve(fake(blocks(&[(0, 4096)]), Vec::new()), Some(identity)).await;
    let err = service(addr, &ca.pem()).connect().await.expect_err("a certificate for another host");
    assert!(matches!(err, CbtError::Connect { .. }), "{err}");
}
