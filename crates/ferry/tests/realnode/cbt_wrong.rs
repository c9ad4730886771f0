//! The real driver's changed blocks made wrong, or withheld, on their way to the agent: a
//! SnapshotMetadata proxy (TLS with a CA of its own) in front of the node's real
//! csi-snapshot-metadata sidecar, published in the driver's `SnapshotMetadataService` object
//! while the test runs (alone: no other test backs up meanwhile). It leaves most of a change
//! out of the delta, or breaks the API's rules, or cuts the stream (once, or every time), or
//! hands the sidecar a token that is none, or passes the answers through; at the end the
//! service object is deleted. Ferry must never save a backup from a wrong delta: each backup
//! takes the next path of the chain (delta, allocated ranges, whole device), says which and
//! why in its message, its Completed Event and the agent's metric, and every restore is bit
//! for bit. The delta left out is caught by the repository's sample of the chunks it calls
//! unchanged (spread evenly over the volume: with 95 of 128 MiB left out, at least five of its
//! eight chunks fall in the change whatever its start); the overlap by the client's checks of
//! the answer.

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
use crate::metrics;
use crate::node::{self, TestResult};

/// Where the nodes reach the proxy.
const PROXY_PORT: u16 = 6445;

/// How the proxy changes the delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Fault {
    /// Passed through.
    #[default]
    None,
    /// Only the first MiB of the change is reported; the rest is left out.
    LeaveOut,
    /// The first range is sent twice (ranges that overlap).
    Overlap,
    /// The first call passes on only the first range of the driver's first response, then
    /// breaks the stream (`Unavailable`); the calls after it pass through.
    CutOnce,
    /// Every call breaks before its first response (`Unavailable`).
    Broken,
    /// Every call reaches the driver with a token that is not one: the sidecar's own
    /// TokenReview refuses it.
    BadToken,
}

#[derive(Clone)]
struct Proxy {
    upstream: SnapshotMetadataClient<Channel>,
    fault: Arc<Mutex<Fault>>,
    /// `GetMetadataDelta` calls relayed.
    deltas: Arc<AtomicUsize>,
    /// The `starting_offset` of every `GetMetadataDelta` call.
    starts: Arc<Mutex<Vec<i64>>>,
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
        let mut request = request.into_inner();
        let fault = {
            let mut fault = self.fault.lock().map_err(|_| Status::internal("poisoned"))?;
            let now = *fault;
            if now == Fault::CutOnce {
                *fault = Fault::None;
            }
            now
        };
        self.deltas.fetch_add(1, Ordering::Relaxed);
        self.starts.lock().map_err(|_| Status::internal("poisoned"))?.push(request.starting_offset);
        match fault {
            Fault::Broken => return Err(Status::unavailable("the proxy broke the stream")),
            Fault::BadToken => request.security_token = "not-a-token".into(),
            Fault::None | Fault::LeaveOut | Fault::Overlap | Fault::CutOnce => {}
        }
        let answers = self.upstream.clone().get_metadata_delta(request).await?.into_inner();
        if fault == Fault::CutOnce {
            let first = answers.take(1).map(|answer| {
                let mut answer = answer?;
                answer.block_metadata.truncate(1);
                Ok(answer)
            });
            let cut = futures::stream::once(async {
                Err(Status::unavailable("the proxy cut the stream after its first range"))
            });
            return Ok(Response::new(Box::pin(first.chain(cut))));
        }
        // Bytes of the change reported so far (LeaveOut), whether the overlap was sent.
        let mut reported = 0;
        let mut overlapped = false;
        let answers = answers.map(move |answer| {
            let mut answer = answer?;
            match fault {
                Fault::None | Fault::CutOnce | Fault::Broken | Fault::BadToken => {}
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
    /// The object as the test found it (made again if a step deleted it).
    object: ferry_api::SnapshotMetadataService,
    original: serde_json::Value,
    _relay: ferry_testbed::netns::Forwarder,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Redirect {
    async fn start(
        node: &'static node::Node,
        control: &ProxyControl,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        // rustls has more than one provider in the build; tonic's server takes the default.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = node.client()?;
        let services: Api<ferry_api::SnapshotMetadataService> = Api::all(client);
        let object = services.get(DRIVER).await?;
        let original = serde_json::to_value(&object)?["spec"].take();
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
        let proxy = Proxy {
            upstream: SnapshotMetadataClient::new(channel),
            fault: Arc::clone(&control.fault),
            deltas: Arc::clone(&control.deltas),
            starts: Arc::clone(&control.starts),
        };
        let router = Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))?
            .add_service(SnapshotMetadataServer::new(proxy));
        let server = tokio::spawn(async move {
            let _ = router.serve_with_incoming(TcpIncoming::from(listener)).await;
        });
        let relay = node.cluster.relay_host_port(PROXY_PORT, port)?;

        let redirect = Self { services, object, original, _relay: relay, server, _dir: dir };
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

    /// The driver's service object deleted: the driver no longer offers changed-block
    /// tracking, as on most clusters today.
    async fn withdraw(&self) -> TestResult {
        self.services.delete(DRIVER, &kube::api::DeleteParams::default()).await?;
        Ok(())
    }

    /// The service object as it was (made again, as found, when it was withdrawn), and the
    /// proxy stopped.
    async fn restore(self) -> TestResult {
        self.server.abort();
        // Every later changed-block test of the cluster needs the object: a passing API error
        // is tried again.
        let mut found = self.services.get_opt(DRIVER).await;
        for _ in 0..5 {
            if found.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            found = self.services.get_opt(DRIVER).await;
        }
        if found?.is_none() {
            let mut object = self.object.clone();
            object.metadata.resource_version = None;
            object.metadata.uid = None;
            object.metadata.creation_timestamp = None;
            object.metadata.managed_fields = None;
            self.services.create(&kube::api::PostParams::default(), &object).await?;
            return Ok(());
        }
        let spec = serde_json::json!({
            "address": self.original["address"],
            "caCert": self.original["caCert"],
        });
        self.patch(&spec).await
    }
}

/// What the proxy is told to do, and what it saw.
#[derive(Default)]
struct ProxyControl {
    fault: Arc<Mutex<Fault>>,
    /// `GetMetadataDelta` calls relayed.
    deltas: Arc<AtomicUsize>,
    /// Their `starting_offset`s, in order.
    starts: Arc<Mutex<Vec<i64>>>,
}

impl ProxyControl {
    fn set(&self, fault: Fault) -> TestResult {
        *self.fault.lock().map_err(|_| "poisoned")? = fault;
        Ok(())
    }

    fn deltas(&self) -> usize {
        self.deltas.load(Ordering::Relaxed)
    }

    /// The `starting_offset`s of the calls after the first `calls`.
    fn starts_after(&self, calls: usize) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
        Ok(self.starts.lock().map_err(|_| "poisoned")?[calls..].to_vec())
    }
}

/// The series of `ferry_block_backup_reads_total` the test counts: (path, fallback).
const COUNTED: [(&str, &str); 5] = [
    ("delta", ""),
    ("allocated", "untrusted"),
    ("allocated", "stream-failed"),
    ("allocated", "unauthorized"),
    ("full", "no-service"),
];

/// Every series of [`COUNTED`] summed over the agents' `/metrics`, and the agents scraped.
async fn block_reads(
    node: &node::Node,
    client: &kube::Client,
) -> Result<(Vec<f64>, Vec<String>), Box<dyn std::error::Error>> {
    let scraped = metrics::scrape(node, client).await?;
    let counts = COUNTED
        .iter()
        .map(|(path, fallback)| {
            let path = format!("path=\"{path}\"");
            let fallback = format!("fallback=\"{fallback}\"");
            metrics::value(&scraped.text, "ferry_block_backup_reads_total", &[&path, &fallback])
        })
        .collect();
    Ok((counts, scraped.agents))
}

/// A delta that leaves out most of a change, one whose ranges overlap, a stream that breaks
/// once and one that keeps breaking, a token the sidecar refuses, and no service at all: each
/// backup takes the next path in the chain (a broken stream resumed keeps the delta), says
/// which and why in its message, its Completed Event and the agent's metric, the repository
/// checks clean and every restore is bit for bit.
#[tokio::test]
async fn a_wrong_broken_or_refused_delta_falls_back_along_the_chain_and_says_why() -> TestResult {
    let node = node::node();
    // Alone: every backup's changed-block requests go through the proxy while it runs.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let ns = node.namespace("cbt-wrong").await?;
    let _bases = crate::cbt::ReleaseBases(ns.clone());
    let proxy = ProxyControl::default();
    let redirect = Redirect::start(node, &proxy).await?;
    // The service object is put back also when an assertion fails: every later changed-block
    // test of this cluster needs it.
    let result = AssertUnwindSafe(every_fallback(node, &client, &ns, &proxy, &redirect))
        .catch_unwind()
        .await;
    let restored = redirect.restore().await;
    match result {
        Ok(result) => result?,
        Err(panic) => std::panic::resume_unwind(panic),
    }
    restored?;
    node::delete_pvc(&client, &ns, "disk").await
}

async fn every_fallback(
    node: &'static node::Node,
    client: &kube::Client,
    ns: &str,
    proxy: &ProxyControl,
    redirect: &Redirect,
) -> TestResult {
    let (counted_before, agents) = block_reads(node, client).await?;
    kept_block_pvc(client, ns, "128Mi").await?;
    write(client, ns, "dd if=/dev/urandom of=/dev/volume bs=1M count=120 conv=fsync 2>/dev/null")
        .await?;
    let first = back_up(client, ns, "cbt-wrong-1").await?;
    let message = first.status.clone().unwrap_or_default().message;
    assert!(message.contains("allocated ranges"), "a first backup: {message}");

    wrong_answers(node, client, ns, proxy).await?;
    broken_or_refused(node, client, ns, proxy).await?;
    passed_through(node, client, ns, proxy).await?;

    // No SnapshotMetadataService for the driver (most clusters today): the whole device,
    // Ferry's own hole and zero detection, and the reason.
    redirect.withdraw().await?;
    let said = ["the whole device", "offers no changed-block tracking", DRIVER];
    let unserved = changed_and_told(node, client, ns, 70, "cbt-wrong-none", &said).await?;
    node.ferry(ns, &["check", "--read-data"]).await?;

    // The agents counted every path and reason.
    let (counted, agents_after) = block_reads(node, client).await?;
    assert_eq!(
        agents_after, agents,
        "an agent was restarted or replaced during the test: its counters started again"
    );
    let added: Vec<f64> = counted.iter().zip(&counted_before).map(|(a, b)| a - b).collect();
    assert_eq!(
        added,
        [2.0, 2.0, 1.0, 1.0, 1.0],
        "ferry_block_backup_reads_total added for {COUNTED:?}"
    );
    // The older bases were released as each newer backup completed: this is the last.
    release_base(client, &unserved).await
}

/// A delta that leaves out most of a change, and one whose ranges overlap: both refused, the
/// allocated ranges read instead.
async fn wrong_answers(
    node: &'static node::Node,
    client: &kube::Client,
    ns: &str,
    proxy: &ProxyControl,
) -> TestResult {
    // 96 MiB rewritten; the delta reports 1 MiB of it. The chunks the repository samples
    // among those called unchanged are spread evenly over the volume: most fall in the
    // change, and differ from the parent's.
    proxy.set(Fault::LeaveOut)?;
    let written = write(
        client,
        ns,
        "dd if=/dev/urandom of=/dev/volume bs=1M count=96 seek=16 conv=fsync 2>/dev/null",
    )
    .await?;
    let second = back_up(client, ns, "cbt-wrong-2").await?;
    assert!(proxy.deltas() >= 1, "the agent did not ask the proxy for the delta");
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
    proxy.set(Fault::Overlap)?;
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
    Ok(())
}

/// A stream cut once (resumed: the delta is used), one that keeps breaking and a token the
/// sidecar refuses (both: the allocated ranges).
async fn broken_or_refused(
    node: &'static node::Node,
    client: &kube::Client,
    ns: &str,
    proxy: &ProxyControl,
) -> TestResult {
    // A stream cut after the first range of the change at 10 MiB is resumed where it broke,
    // before the change at 50 MiB, and the delta is whole.
    proxy.set(Fault::CutOnce)?;
    let asked = proxy.deltas();
    let written = write(
        client,
        ns,
        "dd if=/dev/urandom of=/dev/volume bs=1M count=1 seek=10 conv=fsync 2>/dev/null
dd if=/dev/urandom of=/dev/volume bs=1M count=1 seek=50 conv=fsync 2>/dev/null",
    )
    .await?;
    let cut = back_up(client, ns, "cbt-wrong-cut").await?;
    let (message, note) = told(client, &cut).await?;
    let whole = format!("changed since the parent's snapshot ({} bytes)", 2 * MIB);
    for text in [&message, &note] {
        assert!(
            text.contains(&whole) && !text.contains("no delta from"),
            "a stream broken once was not resumed into the whole delta: {text}"
        );
    }
    let starts = proxy.starts_after(asked)?;
    let mib = i64::try_from(MIB)?;
    assert!(
        starts.len() >= 2 && starts[0] == 0 && (10 * mib + 1..=11 * mib).contains(&starts[1]),
        "the broken stream was not resumed right after the range that had arrived: starting \
         offsets {starts:?}"
    );
    assert_eq!(restored_md5(node, client, &cut).await?, written, "restore differs");

    // A stream that breaks at every attempt: given up after the client's retries, the backup
    // reads the allocated ranges and says why.
    proxy.set(Fault::Broken)?;
    let attempts = format!("broke {} times in a row", ferry_cbt::Retry::default().attempts);
    let said =
        ["no delta from the parent's snapshot", "GetMetadataDelta", &attempts, "allocated ranges"];
    changed_and_told(node, client, ns, 30, "cbt-wrong-broken", &said).await?;

    // A token the real sidecar's TokenReview refuses (after one fresh token): no delta.
    proxy.set(Fault::BadToken)?;
    let said = ["no delta from the parent's snapshot", "Unauthenticated", "allocated ranges"];
    changed_and_told(node, client, ns, 31, "cbt-wrong-token", &said).await?;
    Ok(())
}

/// Through the same proxy, the driver's own answer is used: the path itself works.
async fn passed_through(
    node: &'static node::Node,
    client: &kube::Client,
    ns: &str,
    proxy: &ProxyControl,
) -> TestResult {
    proxy.set(Fault::None)?;
    let asked = proxy.deltas();
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
    assert!(proxy.deltas() > asked, "the delta did not come through the proxy");
    assert_eq!(restored_md5(node, client, &fourth).await?, written, "restore differs");
    Ok(())
}

/// The status message of DataUpload `du`, and the note of its Completed Event.
async fn told(
    client: &kube::Client,
    du: &ferry_api::DataUpload,
) -> Result<(String, String), Box<dyn std::error::Error>> {
    let message = du.status.clone().unwrap_or_default().message;
    let note = node::agent_event_note(client, &node::name_of(du), "Completed").await?;
    Ok((message, note))
}

/// Rewrites 1 MiB of `ns/disk` at `seek_mib` MiB and backs it up as `backup`: the DataUpload's
/// message and its Completed Event must both hold every one of `said`, and its restore what
/// was written.
async fn changed_and_told(
    node: &'static node::Node,
    client: &kube::Client,
    ns: &str,
    seek_mib: u32,
    backup: &str,
    said: &[&str],
) -> Result<ferry_api::DataUpload, Box<dyn std::error::Error>> {
    let script = format!(
        "dd if=/dev/urandom of=/dev/volume bs=1M count=1 seek={seek_mib} conv=fsync 2>/dev/null"
    );
    let written = write(client, ns, &script).await?;
    let du = back_up(client, ns, backup).await?;
    let (message, note) = told(client, &du).await?;
    for text in [&message, &note] {
        let missing: Vec<_> = said.iter().filter(|s| !text.contains(**s)).collect();
        assert!(missing.is_empty(), "{backup}: {missing:?} not said in {text:?}");
    }
    assert_eq!(restored_md5(node, client, &du).await?, written, "{backup}: the restore differs");
    Ok(du)
}
