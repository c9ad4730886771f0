//! `generated.RestoreItemAction` (version 1) and `v2.RestoreItemAction`.

use std::sync::Arc;

use ferry_proto::generated::restore_item_action_server::RestoreItemAction as V1Service;
use ferry_proto::v2::restore_item_action_server::RestoreItemAction as V2Service;
use ferry_proto::{generated, v2};
use tonic::{Request, Response, Status};

use crate::errors::RequestError;
use crate::kind::PluginKind;
use crate::registry::Registry;
use crate::restore::RestoreItemInput;
use crate::status::Call;
use crate::types::{ResourceIdentifier, to_wire_ids};

fn input(
    call: &Call,
    item: Vec<u8>,
    item_from_backup: Vec<u8>,
    restore: Vec<u8>,
) -> Result<RestoreItemInput, Status> {
    Ok(RestoreItemInput {
        item: call.object("item", item)?,
        item_from_backup: call.object("itemFromBackup", item_from_backup)?,
        restore: call.object("restore", restore)?,
    })
}

/// Serves the registered version 1 restore item actions.
pub(crate) struct RestoreV1(pub(crate) Arc<Registry>);

#[tonic::async_trait]
impl V1Service for RestoreV1 {
    async fn applies_to(
        &self,
        request: Request<generated::RestoreItemActionAppliesToRequest>,
    ) -> Result<Response<generated::RestoreItemActionAppliesToResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::RestoreItemAction, &req.plugin, "AppliesTo");
        let action = call.lookup(&self.0.restore_v1)?;
        let selector = call.run(action.applies_to()).await?;
        Ok(Response::new(generated::RestoreItemActionAppliesToResponse {
            resource_selector: Some(selector.into()),
        }))
    }

    async fn execute(
        &self,
        request: Request<generated::RestoreItemActionExecuteRequest>,
    ) -> Result<Response<generated::RestoreItemActionExecuteResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::RestoreItemAction, &req.plugin, "Execute");
        let action = call.lookup(&self.0.restore_v1)?;
        let original = req.item.clone();
        let input = input(&call, req.item, req.item_from_backup, req.restore)?;
        let out = call.run(action.execute(input)).await?;
        Ok(Response::new(generated::RestoreItemActionExecuteResponse {
            item: call.item("item", out.item, original)?,
            additional_items: to_wire_ids(out.additional_items),
            skip_restore: out.skip_restore,
        }))
    }
}

/// Serves the registered version 2 restore item actions.
pub(crate) struct RestoreV2(pub(crate) Arc<Registry>);

#[tonic::async_trait]
impl V2Service for RestoreV2 {
    async fn applies_to(
        &self,
        request: Request<v2::RestoreItemActionAppliesToRequest>,
    ) -> Result<Response<v2::RestoreItemActionAppliesToResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::RestoreItemActionV2, &req.plugin, "AppliesTo");
        let action = call.lookup(&self.0.restore_v2)?;
        let selector = call.run(action.applies_to()).await?;
        Ok(Response::new(v2::RestoreItemActionAppliesToResponse {
            resource_selector: Some(selector.into()),
        }))
    }

    async fn execute(
        &self,
        request: Request<v2::RestoreItemActionExecuteRequest>,
    ) -> Result<Response<v2::RestoreItemActionExecuteResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::RestoreItemActionV2, &req.plugin, "Execute");
        let action = call.lookup(&self.0.restore_v2)?;
        let original = req.item.clone();
        let input = input(&call, req.item, req.item_from_backup, req.restore)?;
        let out = call.run(action.execute(input)).await?;
        let timeout = out
            .additional_items_ready_timeout
            .map(prost_types::Duration::try_from)
            .transpose()
            .map_err(|e| {
                call.request_status(&RequestError::EncodeResponse {
                    field: "additionalItemsReadyTimeout",
                    message: e.to_string(),
                })
            })?;
        Ok(Response::new(v2::RestoreItemActionExecuteResponse {
            item: call.item("item", out.item, original)?,
            additional_items: to_wire_ids(out.additional_items),
            skip_restore: out.skip_restore,
            operation_id: out.operation_id.unwrap_or_default(),
            wait_for_additional_items: out.wait_for_additional_items,
            additional_items_ready_timeout: timeout,
        }))
    }

    async fn progress(
        &self,
        request: Request<v2::RestoreItemActionProgressRequest>,
    ) -> Result<Response<v2::RestoreItemActionProgressResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::RestoreItemActionV2, &req.plugin, "Progress");
        let action = call.lookup(&self.0.restore_v2)?;
        let restore = call.object("restore", req.restore)?;
        let progress = call.run(action.progress(&req.operation_id, &restore)).await?;
        Ok(Response::new(v2::RestoreItemActionProgressResponse { progress: Some(progress.into()) }))
    }

    async fn cancel(
        &self,
        request: Request<v2::RestoreItemActionCancelRequest>,
    ) -> Result<Response<()>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::RestoreItemActionV2, &req.plugin, "Cancel");
        let action = call.lookup(&self.0.restore_v2)?;
        let restore = call.object("restore", req.restore)?;
        call.run(action.cancel(&req.operation_id, &restore)).await?;
        Ok(Response::new(()))
    }

    async fn are_additional_items_ready(
        &self,
        request: Request<v2::RestoreItemActionItemsReadyRequest>,
    ) -> Result<Response<v2::RestoreItemActionItemsReadyResponse>, Status> {
        let req = request.into_inner();
        let call =
            Call::new(PluginKind::RestoreItemActionV2, &req.plugin, "AreAdditionalItemsReady");
        let action = call.lookup(&self.0.restore_v2)?;
        let restore = call.object("restore", req.restore)?;
        let items: Vec<ResourceIdentifier> =
            req.additional_items.into_iter().map(Into::into).collect();
        let ready = call.run(action.are_additional_items_ready(&items, &restore)).await?;
        Ok(Response::new(v2::RestoreItemActionItemsReadyResponse { ready }))
    }
}
