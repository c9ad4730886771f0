//! Serves every generated service on 127.0.0.1, calls every method through the generated
//! clients, and checks the HTTP/2 path each call used against the literal path Velero and
//! go-plugin use (for example `/v2.BackupItemAction/Progress`). A call that reached the server
//! under any other path, or that the server did not route, fails the test.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use ferry_proto::{generated, plugin, v2};
use futures::StreamExt;
use futures::stream::BoxStream;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};

type BoxError = Box<dyn std::error::Error>;
type Seen = Arc<Mutex<Vec<String>>>;

/// Wraps a generated server and records the path of every request it receives.
#[derive(Debug, Clone)]
struct Recorded<S> {
    inner: S,
    seen: Seen,
}

impl<S: NamedService> NamedService for Recorded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for Recorded<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(request.uri().path().to_owned());
        }
        self.inner.call(request)
    }
}

fn recorded<S>(inner: S, seen: &Seen) -> Recorded<S> {
    Recorded { inner, seen: seen.clone() }
}

/// Answers every unary call with the default response.
#[derive(Debug, Clone, Copy)]
struct Trivial;

macro_rules! answer_defaults {
    ($trait:path { $($method:ident($request:ty) -> $response:ty;)* }) => {
        #[tonic::async_trait]
        impl $trait for Trivial {
            $(
                async fn $method(&self, _: Request<$request>) -> Result<Response<$response>, Status> {
                    Ok(Response::new(<$response>::default()))
                }
            )*
        }
    };
}

answer_defaults!(generated::delete_item_action_server::DeleteItemAction {
    applies_to(generated::DeleteItemActionAppliesToRequest) -> generated::DeleteItemActionAppliesToResponse;
    execute(generated::DeleteItemActionExecuteRequest) -> generated::Empty;
});

answer_defaults!(generated::backup_item_action_server::BackupItemAction {
    applies_to(generated::BackupItemActionAppliesToRequest) -> generated::BackupItemActionAppliesToResponse;
    execute(generated::ExecuteRequest) -> generated::ExecuteResponse;
});

answer_defaults!(generated::restore_item_action_server::RestoreItemAction {
    applies_to(generated::RestoreItemActionAppliesToRequest) -> generated::RestoreItemActionAppliesToResponse;
    execute(generated::RestoreItemActionExecuteRequest) -> generated::RestoreItemActionExecuteResponse;
});

answer_defaults!(generated::volume_snapshotter_server::VolumeSnapshotter {
    init(generated::VolumeSnapshotterInitRequest) -> generated::Empty;
    create_volume_from_snapshot(generated::CreateVolumeRequest) -> generated::CreateVolumeResponse;
    get_volume_info(generated::GetVolumeInfoRequest) -> generated::GetVolumeInfoResponse;
    create_snapshot(generated::CreateSnapshotRequest) -> generated::CreateSnapshotResponse;
    delete_snapshot(generated::DeleteSnapshotRequest) -> generated::Empty;
    get_volume_id(generated::GetVolumeIdRequest) -> generated::GetVolumeIdResponse;
    set_volume_id(generated::SetVolumeIdRequest) -> generated::SetVolumeIdResponse;
});

answer_defaults!(v2::backup_item_action_server::BackupItemAction {
    applies_to(v2::BackupItemActionAppliesToRequest) -> v2::BackupItemActionAppliesToResponse;
    execute(v2::ExecuteRequest) -> v2::ExecuteResponse;
    progress(v2::BackupItemActionProgressRequest) -> v2::BackupItemActionProgressResponse;
    cancel(v2::BackupItemActionCancelRequest) -> ();
});

answer_defaults!(v2::restore_item_action_server::RestoreItemAction {
    applies_to(v2::RestoreItemActionAppliesToRequest) -> v2::RestoreItemActionAppliesToResponse;
    execute(v2::RestoreItemActionExecuteRequest) -> v2::RestoreItemActionExecuteResponse;
    progress(v2::RestoreItemActionProgressRequest) -> v2::RestoreItemActionProgressResponse;
    cancel(v2::RestoreItemActionCancelRequest) -> ();
    are_additional_items_ready(v2::RestoreItemActionItemsReadyRequest) -> v2::RestoreItemActionItemsReadyResponse;
});

answer_defaults!(v2::volume_snapshotter_server::VolumeSnapshotter {
    init(v2::VolumeSnapshotterInitRequest) -> generated::Empty;
    create_volume_from_snapshot(v2::CreateVolumeRequest) -> v2::CreateVolumeResponse;
    get_volume_info(v2::GetVolumeInfoRequest) -> v2::GetVolumeInfoResponse;
    create_snapshot(v2::CreateSnapshotRequest) -> v2::CreateSnapshotResponse;
    delete_snapshot(v2::DeleteSnapshotRequest) -> generated::Empty;
    get_volume_id(v2::GetVolumeIdRequest) -> v2::GetVolumeIdResponse;
    set_volume_id(v2::SetVolumeIdRequest) -> v2::SetVolumeIdResponse;
    progress(v2::VolumeSnapshotterProgressRequest) -> v2::VolumeSnapshotterProgressResponse;
    cancel(v2::VolumeSnapshotterCancelRequest) -> ();
});

answer_defaults!(plugin::grpc_controller_server::GrpcController {
    shutdown(plugin::Empty) -> plugin::Empty;
});

fn listed_plugin() -> generated::PluginIdentifier {
    generated::PluginIdentifier {
        command: "/ferry".into(),
        kind: "BackupItemActionV2".into(),
        name: "ferry.io/data-mover".into(),
    }
}

#[tonic::async_trait]
impl generated::plugin_lister_server::PluginLister for Trivial {
    async fn list_plugins(
        &self,
        _: Request<generated::Empty>,
    ) -> Result<Response<generated::ListPluginsResponse>, Status> {
        let plugins = vec![listed_plugin()];
        Ok(Response::new(generated::ListPluginsResponse { plugins }))
    }
}

#[tonic::async_trait]
impl plugin::grpc_stdio_server::GrpcStdio for Trivial {
    type StreamStdioStream = BoxStream<'static, Result<plugin::StdioData, Status>>;

    async fn stream_stdio(
        &self,
        _: Request<()>,
    ) -> Result<Response<Self::StreamStdioStream>, Status> {
        let line = plugin::StdioData {
            channel: plugin::stdio_data::Channel::Stderr.into(),
            data: b"log line".to_vec(),
        };
        Ok(Response::new(futures::stream::iter([Ok(line)]).boxed()))
    }
}

#[tonic::async_trait]
impl plugin::grpc_broker_server::GrpcBroker for Trivial {
    type StartStreamStream = BoxStream<'static, Result<plugin::ConnInfo, Status>>;

    /// Echoes every connection offer back.
    async fn start_stream(
        &self,
        request: Request<Streaming<plugin::ConnInfo>>,
    ) -> Result<Response<Self::StartStreamStream>, Status> {
        Ok(Response::new(request.into_inner().boxed()))
    }
}

/// Awaits one call and checks that exactly `path` reached the server for it.
async fn expect_path<T>(
    seen: &Seen,
    path: &str,
    call: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<T, BoxError> {
    let result = call.await;
    let paths = std::mem::take(&mut *seen.lock().map_err(|_| "path log poisoned")?);
    assert_eq!(paths, [path], "request paths for the call expected at {path}");
    Ok(result.map_err(|status| format!("{path}: {status}"))?.into_inner())
}

/// Calls `client.method(Type::default())` and checks the path that reached the server.
macro_rules! check {
    ($seen:expr, $path:literal => $client:ident.$method:ident($request:path)) => {
        expect_path($seen, $path, $client.$method(<$request>::default())).await?
    };
}

async fn call_everything(channel: Channel, seen: &Seen) -> Result<(), BoxError> {
    use generated::{
        backup_item_action_client::BackupItemActionClient as Bia1,
        delete_item_action_client::DeleteItemActionClient as Dia,
        plugin_lister_client::PluginListerClient as Lister,
        restore_item_action_client::RestoreItemActionClient as Ria1,
        volume_snapshotter_client::VolumeSnapshotterClient as Vs1,
    };
    use plugin::{
        grpc_broker_client::GrpcBrokerClient as Broker,
        grpc_controller_client::GrpcControllerClient as Controller,
        grpc_stdio_client::GrpcStdioClient as Stdio,
    };
    use v2::{
        backup_item_action_client::BackupItemActionClient as Bia2,
        restore_item_action_client::RestoreItemActionClient as Ria2,
        volume_snapshotter_client::VolumeSnapshotterClient as Vs2,
    };

    let mut lister = Lister::new(channel.clone());
    let listed = expect_path(
        seen,
        "/generated.PluginLister/ListPlugins",
        lister.list_plugins(generated::Empty {}),
    )
    .await?;
    assert_eq!(listed.plugins, [listed_plugin()]);

    let mut dia = Dia::new(channel.clone());
    check!(seen, "/generated.DeleteItemAction/AppliesTo" => dia.applies_to(generated::DeleteItemActionAppliesToRequest));
    check!(seen, "/generated.DeleteItemAction/Execute" => dia.execute(generated::DeleteItemActionExecuteRequest));

    let mut bia1 = Bia1::new(channel.clone());
    check!(seen, "/generated.BackupItemAction/AppliesTo" => bia1.applies_to(generated::BackupItemActionAppliesToRequest));
    check!(seen, "/generated.BackupItemAction/Execute" => bia1.execute(generated::ExecuteRequest));

    let mut ria1 = Ria1::new(channel.clone());
    check!(seen, "/generated.RestoreItemAction/AppliesTo" => ria1.applies_to(generated::RestoreItemActionAppliesToRequest));
    check!(seen, "/generated.RestoreItemAction/Execute" => ria1.execute(generated::RestoreItemActionExecuteRequest));

    let mut vs1 = Vs1::new(channel.clone());
    check!(seen, "/generated.VolumeSnapshotter/Init" => vs1.init(generated::VolumeSnapshotterInitRequest));
    check!(seen, "/generated.VolumeSnapshotter/CreateVolumeFromSnapshot" => vs1.create_volume_from_snapshot(generated::CreateVolumeRequest));
    check!(seen, "/generated.VolumeSnapshotter/GetVolumeInfo" => vs1.get_volume_info(generated::GetVolumeInfoRequest));
    check!(seen, "/generated.VolumeSnapshotter/CreateSnapshot" => vs1.create_snapshot(generated::CreateSnapshotRequest));
    check!(seen, "/generated.VolumeSnapshotter/DeleteSnapshot" => vs1.delete_snapshot(generated::DeleteSnapshotRequest));
    check!(seen, "/generated.VolumeSnapshotter/GetVolumeID" => vs1.get_volume_id(generated::GetVolumeIdRequest));
    check!(seen, "/generated.VolumeSnapshotter/SetVolumeID" => vs1.set_volume_id(generated::SetVolumeIdRequest));

    let mut bia2 = Bia2::new(channel.clone());
    check!(seen, "/v2.BackupItemAction/AppliesTo" => bia2.applies_to(v2::BackupItemActionAppliesToRequest));
    check!(seen, "/v2.BackupItemAction/Execute" => bia2.execute(v2::ExecuteRequest));
    check!(seen, "/v2.BackupItemAction/Progress" => bia2.progress(v2::BackupItemActionProgressRequest));
    check!(seen, "/v2.BackupItemAction/Cancel" => bia2.cancel(v2::BackupItemActionCancelRequest));

    let mut ria2 = Ria2::new(channel.clone());
    check!(seen, "/v2.RestoreItemAction/AppliesTo" => ria2.applies_to(v2::RestoreItemActionAppliesToRequest));
    check!(seen, "/v2.RestoreItemAction/Execute" => ria2.execute(v2::RestoreItemActionExecuteRequest));
    check!(seen, "/v2.RestoreItemAction/Progress" => ria2.progress(v2::RestoreItemActionProgressRequest));
    check!(seen, "/v2.RestoreItemAction/Cancel" => ria2.cancel(v2::RestoreItemActionCancelRequest));
    check!(seen, "/v2.RestoreItemAction/AreAdditionalItemsReady" => ria2.are_additional_items_ready(v2::RestoreItemActionItemsReadyRequest));

    let mut vs2 = Vs2::new(channel.clone());
    check!(seen, "/v2.VolumeSnapshotter/Init" => vs2.init(v2::VolumeSnapshotterInitRequest));
    check!(seen, "/v2.VolumeSnapshotter/CreateVolumeFromSnapshot" => vs2.create_volume_from_snapshot(v2::CreateVolumeRequest));
    check!(seen, "/v2.VolumeSnapshotter/GetVolumeInfo" => vs2.get_volume_info(v2::GetVolumeInfoRequest));
    check!(seen, "/v2.VolumeSnapshotter/CreateSnapshot" => vs2.create_snapshot(v2::CreateSnapshotRequest));
    check!(seen, "/v2.VolumeSnapshotter/DeleteSnapshot" => vs2.delete_snapshot(v2::DeleteSnapshotRequest));
    check!(seen, "/v2.VolumeSnapshotter/GetVolumeID" => vs2.get_volume_id(v2::GetVolumeIdRequest));
    check!(seen, "/v2.VolumeSnapshotter/SetVolumeID" => vs2.set_volume_id(v2::SetVolumeIdRequest));
    check!(seen, "/v2.VolumeSnapshotter/Progress" => vs2.progress(v2::VolumeSnapshotterProgressRequest));
    check!(seen, "/v2.VolumeSnapshotter/Cancel" => vs2.cancel(v2::VolumeSnapshotterCancelRequest));

    let mut controller = Controller::new(channel.clone());
    expect_path(seen, "/plugin.GRPCController/Shutdown", controller.shutdown(plugin::Empty {}))
        .await?;

    let mut stdio = Stdio::new(channel.clone());
    let mut lines =
        expect_path(seen, "/plugin.GRPCStdio/StreamStdio", stdio.stream_stdio(())).await?;
    let line = lines.message().await?.ok_or("stdio stream ended early")?;
    assert_eq!(
        (line.channel(), line.data.as_slice()),
        (plugin::stdio_data::Channel::Stderr, &b"log line"[..])
    );
    assert!(lines.message().await?.is_none(), "stdio stream has one message");

    let mut broker = Broker::new(channel);
    let offer = plugin::ConnInfo {
        service_id: 3,
        network: "unix".into(),
        address: "/tmp/broker.sock".into(),
        knock: None,
    };
    let mut echoed = expect_path(
        seen,
        "/plugin.GRPCBroker/StartStream",
        broker.start_stream(futures::stream::iter([offer.clone()])),
    )
    .await?;
    assert_eq!(echoed.message().await?, Some(offer));
    assert!(echoed.message().await?.is_none(), "broker stream ends with the request stream");
    Ok(())
}

#[tokio::test]
async fn every_method_uses_the_wire_path() -> Result<(), BoxError> {
    let seen = Seen::default();
    let router = Server::builder()
        .add_service(recorded(
            generated::plugin_lister_server::PluginListerServer::new(Trivial),
            &seen,
        ))
        .add_service(recorded(
            generated::delete_item_action_server::DeleteItemActionServer::new(Trivial),
            &seen,
        ))
        .add_service(recorded(
            generated::backup_item_action_server::BackupItemActionServer::new(Trivial),
            &seen,
        ))
        .add_service(recorded(
            generated::restore_item_action_server::RestoreItemActionServer::new(Trivial),
            &seen,
        ))
        .add_service(recorded(
            generated::volume_snapshotter_server::VolumeSnapshotterServer::new(Trivial),
            &seen,
        ))
        .add_service(recorded(
            v2::backup_item_action_server::BackupItemActionServer::new(Trivial),
            &seen,
        ))
        .add_service(recorded(
            v2::restore_item_action_server::RestoreItemActionServer::new(Trivial),
            &seen,
        ))
        .add_service(recorded(
            v2::volume_snapshotter_server::VolumeSnapshotterServer::new(Trivial),
            &seen,
        ))
        .add_service(recorded(
            plugin::grpc_controller_server::GrpcControllerServer::new(Trivial),
            &seen,
        ))
        .add_service(recorded(plugin::grpc_stdio_server::GrpcStdioServer::new(Trivial), &seen))
        .add_service(recorded(plugin::grpc_broker_server::GrpcBrokerServer::new(Trivial), &seen));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server =
        tokio::spawn(router.serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
            let _ = stopped.await;
        }));

    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        let channel = Endpoint::from_shared(format!("http://{address}"))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect()
            .await?;
        call_everything(channel, &seen).await
    })
    .await;

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), server).await???;
    outcome.map_err(|_| "calls did not finish within 60 s")?
}
