//! `generated.PluginLister`: the first call a host makes, to learn what a process serves.

use ferry_proto::generated;
use ferry_proto::generated::plugin_lister_server::PluginLister as Service;
use tonic::{Request, Response, Status};

use crate::registry::PluginIdentifier;

/// Answers `ListPlugins` with a fixed list.
pub(crate) struct Lister(pub(crate) Vec<PluginIdentifier>);

#[tonic::async_trait]
impl Service for Lister {
    async fn list_plugins(
        &self,
        _: Request<generated::Empty>,
    ) -> Result<Response<generated::ListPluginsResponse>, Status> {
        tracing::debug!(plugins = self.0.len(), "ListPlugins");
        let plugins = self
            .0
            .iter()
            .map(|id| generated::PluginIdentifier {
                command: id.command.clone(),
                kind: id.kind.as_str().to_owned(),
                name: id.name.clone(),
            })
            .collect();
        Ok(Response::new(generated::ListPluginsResponse { plugins }))
    }
}
