//! The real driver's changed blocks made wrong on their way to the agent: a SnapshotMetadata
//! proxy (TLS with a CA of its own) in front of the node's real csi-snapshot-metadata sidecar,
//! published in the driver's `SnapshotMetadataService` object while the test runs (alone: no
//! other test backs up meanwhile). It leaves most of a change out of the delta, or breaks the
//! API's rules, or passes the answers through. Ferry must never save a backup from a
//! wrong delta: it says what it refused and why, reads the allocated ranges instead, and the
//! restore is bit for bit. The delta left out is caught by the repository's sample of the
//! chunks it calls unchanged (spread evenly over the volume: with 95 of 128 MiB left out, at
//! least five of its eight chunks fall in the change whatever its start); the overlap by the
//! client's checks of the answer.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferry_proto::snapshotmetadata::snapshot_metadata_client::SnapshotMetadataClient;
use ferry_proto::snapshotmetadata::snapshot_metadata_server::{
    SnapshotMetadata, SnapshotMetadataServer,
};
use ferry_proto::snapshotmetadata::{
    BlockMetadata, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use ferry_testbed::realnode::{DRIVER, NODE_IP, snapshot_metadata};
use futures::{FutureExt, Stream, StreamExt};
use kube::Api;
use kube::api::{Patch, PatchParams};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server};
use tonic::{Request, Response, Status};

use crate::cbt::{MIB, back_up, kept_block_pvc, release_base, restored_md5, write};
use crate::node::{self, TestResult};

/// Where the nodes reach the proxy.
const PROXY_PORT: u16 = 6445;

/// How the proxy changes the delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Passed through.
    None,
    /// Only the first MiB of the change is reported; the rest is left out.
    LeaveOut,
    /// The first range is sent twice (ranges that overlap).
    Overlap,
}

#[derive(Clone)]
struct Proxy {
    upstream: SnapshotMetadataClient<Channel>,
    fault: Arc<Mutex<Fault>>,
    /// `GetMetadataDelta` calls relayed.
    deltas: Arc<AtomicUsize>,
}

type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl SnapshotMetadata for Proxy {
    type GetMetadataAllocatedStream = Answers<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Answers<GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let answers =
            self.upstream.clone().get_metadata_allocated(request.into_inner()).await?.into_inner();
        Ok(Response::new(Box::pin(answers)))
    }

    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let request = request.into_inner();
        let fault = *self.fault.lock().map_err(|_| Status::internal("poisoned"))?;
        self.deltas.fetch_add(1, Ordering::Relaxed);
        let answers = self.upstream.clone().get_metadata_delta(request).await?.into_inner();
        // Bytes of the change reported so far (LeaveOut), whether the overlap was sent.
        let mut reported = 0;
        let mut overlapped = false;
        let answers = answers.map(move |answer| {
            let mut answer = answer?;
            match fault {
                Fault::None => {}
                Fault::LeaveOut => {
                    answer.block_metadata = leave_out(&answer.block_metadata, &mut reported);
                }
                Fault::Overlap => {
                    if let Some(&first) = answer.block_metadata.first()
                        && !overlapped
                    {
                        answer.block_metadata.insert(0, first);
                        overlapped = true;
                    }
                }
            }
            Ok(answer)
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

/// `blocks` cut to what keeps the bytes reported in all at most 1 MiB.
fn leave_out(blocks: &[BlockMetadata], reported: &mut i64) -> Vec<BlockMetadata> {
    let budget = i64::try_from(MIB).unwrap_or(i64::MAX);
    let mut kept = Vec::new();
    for block in blocks {
        let size = block.size_bytes.min(budget - *reported);
        if size <= 0 {
            break;
        }
        kept.push(BlockMetadata { byte_offset: block.byte_offset, size_bytes: size });
        *reported += size;
    }
    kept
}

/// The proxy, serving on the host's loopback and relayed to `NODE_IP:PROXY_PORT` in every node,
/// with the service object pointing at it; [`Redirect::restore`] puts the object back.
struct Redirect {
    services: Api<ferry_api::SnapshotMetadataService>,
    original: serde_json::Value,
    _relay: ferry_testbed::netns::Forwarder,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Redirect {
    async fn start(
        node: &'static node::Node,
        fault: Arc<Mutex<Fault>>,
        deltas: Arc<AtomicUsize>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        // rustls has more than one provider in the build; tonic's server takes the default.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = node.client()?;
        let services: Api<ferry_api::SnapshotMetadataService> = Api::all(client);
        let original = serde_json::to_value(services.get(DRIVER).await?)?["spec"].take();
        let real_ca: k8s_openapi::ByteString = serde_json::from_value(original["caCert"].clone())?;

        // To the real sidecar, inside the node's network.
        let sidecar: SocketAddr = format!("{NODE_IP}:{}", snapshot_metadata::PORT).parse()?;
        let cluster = node.cluster;
        let connector = tower::service_fn(move |_: tonic::codegen::http::Uri| async move {
            let stream = cluster.connect(sidecar).map_err(std::io::Error::other)?;
            stream.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::TcpStream::from_std(
                stream,
            )?))
        });
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&real_ca.0))
            .domain_name(NODE_IP);
        let channel = Endpoint::from_shared(format!("https://{sidecar}"))?
            .tls_config(tls)?
            .connect_with_connector(connector)
            .await?;

        // The proxy, with a certificate for the node's address from a CA of its own.
        let dir = tempfile::tempdir()?;
        let own = snapshot_metadata::Tls::generate(dir.path())?;
        let identity = Identity::from_pem(std::fs::read(&own.cert)?, std::fs::read(&own.key)?);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let proxy = Proxy { upstream: SnapshotMetadataClient::new(channel), fault, deltas };
        let router = Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))?
            .add_service(SnapshotMetadataServer::new(proxy));
        let server = tokio::spawn(async move {
            let _ = router.serve_with_incoming(TcpIncoming::from(listener)).await;
        });
        let relay = node.cluster.relay_host_port(PROXY_PORT, port)?;

        let redirect = Self { services, original, _relay: relay, server, _dir: dir };
        let ca = k8s_openapi::ByteString(own.ca_pem.into_bytes());
        redirect
            .patch(&serde_json::json!({"address": format!("{NODE_IP}:{PROXY_PORT}"), "caCert": ca}))
            .await?;
        Ok(redirect)
    }

    async fn patch(&self, spec: &serde_json::Value) -> TestResult {
        let patch = serde_json::json!({ "spec": spec });
        self.services.patch(DRIVER, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }

    /// The service object as it was, and the proxy stopped.
    async fn restore(self) -> TestResult {
        let spec = serde_json::json!({
            "address": self.original["address"],
            "caCert": self.original["caCert"],
        });
        let patched = self.patch(&spec).await;
        self.server.abort();
        patched
    }
}

/// A delta that leaves out most of a change, and one whose ranges overlap: each is refused,
/// the backup says so and reads the allocated ranges, the repository checks clean and the
/// restores are bit for bit.
#[tokio::test]
async fn a_wrong_delta_from_the_real_driver_is_refused_and_the_backup_reads_the_allocated_ranges()
-> TestResult {
    let node = node::node();
    // Alone: every backup's changed-block requests go through the proxy while it runs.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let ns = node.namespace("cbt-wrong").await?;
    let fault = Arc::new(Mutex::new(Fault::None));
    let deltas = Arc::new(AtomicUsize::new(0));
    let redirect = Redirect::start(node, Arc::clone(&fault), Arc::clone(&deltas)).await?;
    // The service object is put back also when an assertion fails: every later changed-block
    // test of this cluster needs it.
    let result =
        AssertUnwindSafe(wrong_deltas(node, &client, &ns, &fault, &deltas)).catch_unwind().await;
    let restored = redirect.restore().await;
    match result {
        Ok(result) => result?,
        Err(panic) => std::panic::resume_unwind(panic),
    }
    restored?;
    node::delete_pvc(&client, &ns, "disk").await
}

async fn wrong_deltas(
    node: &'static node::Node,
    client: &kube::Client,
    ns: &str,
    fault: &Mutex<Fault>,
    deltas: &AtomicUsize,
) -> TestResult {
    let set = |f: Fault| -> TestResult {
        *fault.lock().map_err(|_| "poisoned")? = f;
        Ok(())
    };
    kept_block_pvc(client, ns, "128Mi").await?;
    write(client, ns, "dd if=/dev/urandom of=/dev/volume bs=1M count=120 conv=fsync 2>/dev/null")
        .await?;
    let first = back_up(client, ns, "cbt-wrong-1").await?;
    let message = first.status.clone().unwrap_or_default().message;
    assert!(message.contains("allocated ranges"), "a first backup: {message}");

    // 96 MiB rewritten; the delta reports 1 MiB of it. The chunks the repository samples
    // among those called unchanged are spread evenly over the volume: most fall in the
    // change, and differ from the parent's.
    set(Fault::LeaveOut)?;
    let written = write(
        client,
        ns,
        "dd if=/dev/urandom of=/dev/volume bs=1M count=96 seek=16 conv=fsync 2>/dev/null",
    )
    .await?;
    let second = back_up(client, ns, "cbt-wrong-2").await?;
    assert!(deltas.load(Ordering::Relaxed) >= 1, "the agent did not ask the proxy for the delta");
    let message = second.status.clone().unwrap_or_default().message;
    assert!(
        message.contains("the service's delta ranges were refused")
            && message.contains("the ranges are incomplete")
            && message.contains("allocated ranges"),
        "a delta leaving out most of the change was not refused, or not said: {message}"
    );
    node.ferry(ns, &["check", "--read-data"]).await?;
    assert_eq!(restored_md5(node, client, &second).await?, written, "restore differs");

    // Ranges that overlap break the API's rules: refused as soon as they arrive.
    set(Fault::Overlap)?;
    let written = write(
        client,
        ns,
        "dd if=/dev/urandom of=/dev/volume bs=1M count=2 seek=40 conv=fsync 2>/dev/null",
    )
    .await?;
    let third = back_up(client, ns, "cbt-wrong-3").await?;
    let message = third.status.clone().unwrap_or_default().message;
    assert!(
        message.contains("no delta from the parent's snapshot")
            && message.contains("cannot trust")
            && message.contains("allocated ranges"),
        "overlapping delta ranges were not refused, or not said: {message}"
    );
    node.ferry(ns, &["check", "--read-data"]).await?;
    assert_eq!(restored_md5(node, client, &third).await?, written, "restore differs");

    // Through the same proxy, the driver's own answer is used: the path itself works.
    set(Fault::None)?;
    let asked = deltas.load(Ordering::Relaxed);
    let written = write(
        client,
        ns,
        "dd if=/dev/urandom of=/dev/volume bs=1M count=1 seek=8 conv=fsync 2>/dev/null",
    )
    .await?;
    let fourth = back_up(client, ns, "cbt-wrong-4").await?;
    let message = fourth.status.clone().unwrap_or_default().message;
    assert!(
        message.contains("changed since the parent's snapshot")
            && !message.contains("no delta from"),
        "the proxied delta was not used: {message}"
    );
    assert!(deltas.load(Ordering::Relaxed) > asked, "the delta did not come through the proxy");
    assert_eq!(restored_md5(node, client, &fourth).await?, written, "restore differs");
    release_base(client, &fourth).await
}
