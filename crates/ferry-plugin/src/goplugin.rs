//! go-plugin's own services, which every gRPC plugin serves beside its plugin services.
//!
//! What the host (go-plugin's client) does with them:
//! - `GRPCController/Shutdown` is its request to exit, sent when Velero is done with the process
//!   (before it kills the process for good a couple of seconds later).
//! - `GRPCStdio/StreamStdio` is opened as soon as the host connects; go-plugin forwards the
//!   plugin's captured stdout and stderr through it. This server writes logs to stderr
//!   directly, so the stream carries nothing: it stays open until shutdown, then ends cleanly
//!   (the host treats the end of the stream as "no more output").
//! - `GRPCBroker/StartStream` is opened as soon as the host connects too; it negotiates extra
//!   connections for plugins that pass callbacks, which Velero's plugins never do. This server
//!   reads and ignores what the host sends and closes its side at shutdown.

use std::pin::Pin;

use ferry_proto::plugin;
use ferry_proto::plugin::grpc_broker_server::GrpcBroker;
use ferry_proto::plugin::grpc_controller_server::GrpcController;
use ferry_proto::plugin::grpc_stdio_server::GrpcStdio;
use futures::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// A stream that yields nothing and ends when `shutdown` is cancelled.
fn silent_until<T: Send + 'static>(shutdown: CancellationToken) -> BoxStream<T> {
    Box::pin(futures::stream::once(shutdown.cancelled_owned()).filter_map(|()| async { None }))
}

/// `plugin.GRPCController`: `Shutdown` cancels the server's shutdown token.
#[derive(Debug)]
pub(crate) struct Controller {
    pub(crate) shutdown: CancellationToken,
}

#[tonic::async_trait]
impl GrpcController for Controller {
    async fn shutdown(&self, _: Request<plugin::Empty>) -> Result<Response<plugin::Empty>, Status> {
        tracing::info!("the plugin host asked the plugin to shut down");
        self.shutdown.cancel();
        Ok(Response::new(plugin::Empty {}))
    }
}

/// `plugin.GRPCStdio`: an empty stream that ends at shutdown.
#[derive(Debug)]
pub(crate) struct Stdio {
    pub(crate) shutdown: CancellationToken,
}

#[tonic::async_trait]
impl GrpcStdio for Stdio {
    type StreamStdioStream = BoxStream<plugin::StdioData>;

    async fn stream_stdio(
        &self,
        _: Request<()>,
    ) -> Result<Response<Self::StreamStdioStream>, Status> {
        tracing::debug!("the plugin host opened the stdio stream");
        Ok(Response::new(silent_until(self.shutdown.clone())))
    }
}

/// `plugin.GRPCBroker`: ignores what the host sends; the stream ends when the host closes its
/// side or at shutdown.
#[derive(Debug)]
pub(crate) struct Broker {
    pub(crate) shutdown: CancellationToken,
}

#[tonic::async_trait]
impl GrpcBroker for Broker {
    type StartStreamStream = BoxStream<plugin::ConnInfo>;

    async fn start_stream(
        &self,
        request: Request<Streaming<plugin::ConnInfo>>,
    ) -> Result<Response<Self::StartStreamStream>, Status> {
        tracing::debug!("the plugin host opened the broker stream");
        let incoming = request.into_inner();
        let ignored = incoming.filter_map(|message| async move {
            match message {
                Ok(info) => {
                    tracing::debug!(service_id = info.service_id, "ignoring a broker message");
                    None
                }
                // The host's side ended abnormally; end ours too.
                Err(status) => Some(Err(status)),
            }
        });
        let until_shutdown = ignored.take_until(self.shutdown.clone().cancelled_owned());
        Ok(Response::new(Box::pin(until_shutdown)))
    }
}
