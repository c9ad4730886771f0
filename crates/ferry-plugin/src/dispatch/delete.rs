//! `generated.DeleteItemAction`.

use std::sync::Arc;

use ferry_proto::generated;
use ferry_proto::generated::delete_item_action_server::DeleteItemAction as Service;
use tonic::{Request, Response, Status};

use crate::delete::DeleteItemInput;
use crate::kind::PluginKind;
use crate::registry::Registry;
use crate::status::Call;

/// Serves the registered delete item actions.
pub(crate) struct Delete(pub(crate) Arc<Registry>);

#[tonic::async_trait]
impl Service for Delete {
    async fn applies_to(
        &self,
        request: Request<generated::DeleteItemActionAppliesToRequest>,
    ) -> Result<Response<generated::DeleteItemActionAppliesToResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::DeleteItemAction, &req.plugin, "AppliesTo");
        let action = call.lookup(&self.0.delete)?;
        let selector = call.run(action.applies_to()).await?;
        Ok(Response::new(generated::DeleteItemActionAppliesToResponse {
            resource_selector: Some(selector.into()),
        }))
    }

    async fn execute(
        &self,
        request: Request<generated::DeleteItemActionExecuteRequest>,
    ) -> Result<Response<generated::Empty>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::DeleteItemAction, &req.plugin, "Execute");
        let action = call.lookup(&self.0.delete)?;
        let input = DeleteItemInput {
            item: call.object("item", req.item)?,
            backup: call.object("backup", req.backup)?,
        };
        call.run(action.execute(input)).await?;
        Ok(Response::new(generated::Empty {}))
    }
}
