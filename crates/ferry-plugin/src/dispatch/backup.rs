//! `generated.BackupItemAction` (version 1) and `v2.BackupItemAction`.

use std::sync::Arc;

use ferry_proto::generated::backup_item_action_server::BackupItemAction as V1Service;
use ferry_proto::v2::backup_item_action_server::BackupItemAction as V2Service;
use ferry_proto::{generated, v2};
use tonic::{Request, Response, Status};

use crate::backup::BackupItemInput;
use crate::kind::PluginKind;
use crate::registry::Registry;
use crate::status::Call;
use crate::types::to_wire_ids;

/// Serves the registered version 1 backup item actions.
pub(crate) struct BackupV1(pub(crate) Arc<Registry>);

#[tonic::async_trait]
impl V1Service for BackupV1 {
    async fn applies_to(
        &self,
        request: Request<generated::BackupItemActionAppliesToRequest>,
    ) -> Result<Response<generated::BackupItemActionAppliesToResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::BackupItemAction, &req.plugin, "AppliesTo");
        let action = call.lookup(&self.0.backup_v1)?;
        let selector = call.run(action.applies_to()).await?;
        Ok(Response::new(generated::BackupItemActionAppliesToResponse {
            resource_selector: Some(selector.into()),
        }))
    }

    async fn execute(
        &self,
        request: Request<generated::ExecuteRequest>,
    ) -> Result<Response<generated::ExecuteResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::BackupItemAction, &req.plugin, "Execute");
        let action = call.lookup(&self.0.backup_v1)?;
        let original = req.item.clone();
        let input = BackupItemInput {
            item: call.object("item", req.item)?,
            backup: call.object("backup", req.backup)?,
        };
        let out = call.run(action.execute(input)).await?;
        Ok(Response::new(generated::ExecuteResponse {
            item: call.item("item", out.item, original)?,
            additional_items: to_wire_ids(out.additional_items),
        }))
    }
}

/// Serves the registered version 2 backup item actions.
pub(crate) struct BackupV2(pub(crate) Arc<Registry>);

#[tonic::async_trait]
impl V2Service for BackupV2 {
    async fn applies_to(
        &self,
        request: Request<v2::BackupItemActionAppliesToRequest>,
    ) -> Result<Response<v2::BackupItemActionAppliesToResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::BackupItemActionV2, &req.plugin, "AppliesTo");
        let action = call.lookup(&self.0.backup_v2)?;
        let selector = call.run(action.applies_to()).await?;
        Ok(Response::new(v2::BackupItemActionAppliesToResponse {
            resource_selector: Some(selector.into()),
        }))
    }

    async fn execute(
        &self,
        request: Request<v2::ExecuteRequest>,
    ) -> Result<Response<v2::ExecuteResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::BackupItemActionV2, &req.plugin, "Execute");
        let action = call.lookup(&self.0.backup_v2)?;
        let original = req.item.clone();
        let input = BackupItemInput {
            item: call.object("item", req.item)?,
            backup: call.object("backup", req.backup)?,
        };
        let out = call.run(action.execute(input)).await?;
        Ok(Response::new(v2::ExecuteResponse {
            item: call.item("item", out.item, original)?,
            additional_items: to_wire_ids(out.additional_items),
            operation_id: out.operation_id.unwrap_or_default(),
            post_operation_items: to_wire_ids(out.post_operation_items),
        }))
    }

    async fn progress(
        &self,
        request: Request<v2::BackupItemActionProgressRequest>,
    ) -> Result<Response<v2::BackupItemActionProgressResponse>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::BackupItemActionV2, &req.plugin, "Progress");
        let action = call.lookup(&self.0.backup_v2)?;
        let backup = call.object("backup", req.backup)?;
        let progress = call.run(action.progress(&req.operation_id, &backup)).await?;
        Ok(Response::new(v2::BackupItemActionProgressResponse { progress: Some(progress.into()) }))
    }

    async fn cancel(
        &self,
        request: Request<v2::BackupItemActionCancelRequest>,
    ) -> Result<Response<()>, Status> {
        let req = request.into_inner();
        let call = Call::new(PluginKind::BackupItemActionV2, &req.plugin, "Cancel");
        let action = call.lookup(&self.0.backup_v2)?;
        let backup = call.object("backup", req.backup)?;
        call.run(action.cancel(&req.operation_id, &backup)).await?;
        Ok(Response::new(()))
    }
}
