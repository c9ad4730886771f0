//! `generated.VolumeSnapshotter` (version 1) and Ferry's `v2.VolumeSnapshotter`.
//!
//! The two services share their first seven calls, with identical messages in two packages; the
//! shared helpers below do the work and each service only unpacks and packs its own messages.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ferry_proto::generated::volume_snapshotter_server::VolumeSnapshotter as V1Service;
use ferry_proto::v2::volume_snapshotter_server::VolumeSnapshotter as V2Service;
use ferry_proto::{generated, v2};
use tonic::{Request, Response, Status};

use crate::kind::PluginKind;
use crate::registry::Registry;
use crate::snapshot::{NewVolume, VolumeInfo, VolumeSnapshotter};
use crate::status::Call;

type Snapshotter = Arc<dyn VolumeSnapshotter>;

fn v1(
    registry: &Registry,
    plugin: &str,
    method: &'static str,
) -> Result<(Call, Snapshotter), Status> {
    let call = Call::new(PluginKind::VolumeSnapshotter, plugin, method);
    let s = call.lookup(&registry.snapshotter_v1)?;
    Ok((call, s))
}

fn v2(
    registry: &Registry,
    plugin: &str,
    method: &'static str,
) -> Result<(Call, Snapshotter), Status> {
    let call = Call::new(PluginKind::VolumeSnapshotterV2, plugin, method);
    let s: Snapshotter = call.lookup(&registry.snapshotter_v2)?;
    Ok((call, s))
}

async fn init(
    (call, s): (Call, Snapshotter),
    config: HashMap<String, String>,
) -> Result<(), Status> {
    call.run(s.init(config.into_iter().collect())).await
}

async fn create_volume(
    (call, s): (Call, Snapshotter),
    volume: NewVolume,
) -> Result<String, Status> {
    call.run(s.create_volume_from_snapshot(volume)).await
}

async fn volume_info(
    (call, s): (Call, Snapshotter),
    volume_id: &str,
    volume_az: &str,
) -> Result<VolumeInfo, Status> {
    call.run(s.get_volume_info(volume_id, volume_az)).await
}

async fn create_snapshot(
    (call, s): (Call, Snapshotter),
    volume_id: &str,
    volume_az: &str,
    tags: HashMap<String, String>,
) -> Result<String, Status> {
    let tags: BTreeMap<_, _> = tags.into_iter().collect();
    call.run(s.create_snapshot(volume_id, volume_az, tags)).await
}

async fn delete_snapshot((call, s): (Call, Snapshotter), snapshot_id: &str) -> Result<(), Status> {
    call.run(s.delete_snapshot(snapshot_id)).await
}

async fn volume_id((call, s): (Call, Snapshotter), pv: Vec<u8>) -> Result<String, Status> {
    let pv = call.object("persistentVolume", pv)?;
    call.run(s.get_volume_id(&pv)).await
}

async fn set_volume_id(
    (call, s): (Call, Snapshotter),
    pv: Vec<u8>,
    volume_id: &str,
) -> Result<Vec<u8>, Status> {
    let pv = call.object("persistentVolume", pv)?;
    let updated = call.run(s.set_volume_id(pv, volume_id)).await?;
    call.item("persistentVolume", Some(updated), Vec::new())
}

/// Velero sends 0 for "no IOPS".
fn iops(iops: i64) -> Option<i64> {
    (iops != 0).then_some(iops)
}

/// Serves the registered version 1 volume snapshotters.
pub(crate) struct SnapshotterV1(pub(crate) Arc<Registry>);

#[tonic::async_trait]
impl V1Service for SnapshotterV1 {
    async fn init(
        &self,
        request: Request<generated::VolumeSnapshotterInitRequest>,
    ) -> Result<Response<generated::Empty>, Status> {
        let req = request.into_inner();
        init(v1(&self.0, &req.plugin, "Init")?, req.config).await?;
        Ok(Response::new(generated::Empty {}))
    }

    async fn create_volume_from_snapshot(
        &self,
        request: Request<generated::CreateVolumeRequest>,
    ) -> Result<Response<generated::CreateVolumeResponse>, Status> {
        let r = request.into_inner();
        let target = v1(&self.0, &r.plugin, "CreateVolumeFromSnapshot")?;
        let volume = NewVolume {
            snapshot_id: r.snapshot_id,
            volume_type: r.volume_type,
            volume_az: r.volume_az,
            iops: iops(r.iops),
        };
        let volume_id = create_volume(target, volume).await?;
        Ok(Response::new(generated::CreateVolumeResponse { volume_id }))
    }

    async fn get_volume_info(
        &self,
        request: Request<generated::GetVolumeInfoRequest>,
    ) -> Result<Response<generated::GetVolumeInfoResponse>, Status> {
        let r = request.into_inner();
        let target = v1(&self.0, &r.plugin, "GetVolumeInfo")?;
        let info = volume_info(target, &r.volume_id, &r.volume_az).await?;
        Ok(Response::new(generated::GetVolumeInfoResponse {
            volume_type: info.volume_type,
            iops: info.iops.unwrap_or(0),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<generated::CreateSnapshotRequest>,
    ) -> Result<Response<generated::CreateSnapshotResponse>, Status> {
        let r = request.into_inner();
        let target = v1(&self.0, &r.plugin, "CreateSnapshot")?;
        let snapshot_id = create_snapshot(target, &r.volume_id, &r.volume_az, r.tags).await?;
        Ok(Response::new(generated::CreateSnapshotResponse { snapshot_id }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<generated::DeleteSnapshotRequest>,
    ) -> Result<Response<generated::Empty>, Status> {
        let r = request.into_inner();
        delete_snapshot(v1(&self.0, &r.plugin, "DeleteSnapshot")?, &r.snapshot_id).await?;
        Ok(Response::new(generated::Empty {}))
    }

    async fn get_volume_id(
        &self,
        request: Request<generated::GetVolumeIdRequest>,
    ) -> Result<Response<generated::GetVolumeIdResponse>, Status> {
        let r = request.into_inner();
        let volume_id =
            volume_id(v1(&self.0, &r.plugin, "GetVolumeID")?, r.persistent_volume).await?;
        Ok(Response::new(generated::GetVolumeIdResponse { volume_id }))
    }

    async fn set_volume_id(
        &self,
        request: Request<generated::SetVolumeIdRequest>,
    ) -> Result<Response<generated::SetVolumeIdResponse>, Status> {
        let r = request.into_inner();
        let target = v1(&self.0, &r.plugin, "SetVolumeID")?;
        let persistent_volume = set_volume_id(target, r.persistent_volume, &r.volume_id).await?;
        Ok(Response::new(generated::SetVolumeIdResponse { persistent_volume }))
    }
}

/// Serves the registered version 2 volume snapshotters.
pub(crate) struct SnapshotterV2(pub(crate) Arc<Registry>);

#[tonic::async_trait]
impl V2Service for SnapshotterV2 {
    async fn init(
        &self,
        request: Request<v2::VolumeSnapshotterInitRequest>,
    ) -> Result<Response<generated::Empty>, Status> {
        let req = request.into_inner();
        init(v2(&self.0, &req.plugin, "Init")?, req.config).await?;
        Ok(Response::new(generated::Empty {}))
    }

    async fn create_volume_from_snapshot(
        &self,
        request: Request<v2::CreateVolumeRequest>,
    ) -> Result<Response<v2::CreateVolumeResponse>, Status> {
        let r = request.into_inner();
        let target = v2(&self.0, &r.plugin, "CreateVolumeFromSnapshot")?;
        let volume = NewVolume {
            snapshot_id: r.snapshot_id,
            volume_type: r.volume_type,
            volume_az: r.volume_az,
            iops: iops(r.iops),
        };
        let volume_id = create_volume(target, volume).await?;
        Ok(Response::new(v2::CreateVolumeResponse { volume_id }))
    }

    async fn get_volume_info(
        &self,
        request: Request<v2::GetVolumeInfoRequest>,
    ) -> Result<Response<v2::GetVolumeInfoResponse>, Status> {
        let r = request.into_inner();
        let target = v2(&self.0, &r.plugin, "GetVolumeInfo")?;
        let info = volume_info(target, &r.volume_id, &r.volume_az).await?;
        Ok(Response::new(v2::GetVolumeInfoResponse {
            volume_type: info.volume_type,
            iops: info.iops.unwrap_or(0),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<v2::CreateSnapshotRequest>,
    ) -> Result<Response<v2::CreateSnapshotResponse>, Status> {
        let r = request.into_inner();
        let target = v2(&self.0, &r.plugin, "CreateSnapshot")?;
        let snapshot_id = create_snapshot(target, &r.volume_id, &r.volume_az, r.tags).await?;
        Ok(Response::new(v2::CreateSnapshotResponse { snapshot_id }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<v2::DeleteSnapshotRequest>,
    ) -> Result<Response<generated::Empty>, Status> {
        let r = request.into_inner();
        delete_snapshot(v2(&self.0, &r.plugin, "DeleteSnapshot")?, &r.snapshot_id).await?;
        Ok(Response::new(generated::Empty {}))
    }

    async fn get_volume_id(
        &self,
        request: Request<v2::GetVolumeIdRequest>,
    ) -> Result<Response<v2::GetVolumeIdResponse>, Status> {
        let r = request.into_inner();
        let volume_id =
            volume_id(v2(&self.0, &r.plugin, "GetVolumeID")?, r.persistent_volume).await?;
        Ok(Response::new(v2::GetVolumeIdResponse { volume_id }))
    }

    async fn set_volume_id(
        &self,
        request: Request<v2::SetVolumeIdRequest>,
    ) -> Result<Response<v2::SetVolumeIdResponse>, Status> {
        let r = request.into_inner();
        let target = v2(&self.0, &r.plugin, "SetVolumeID")?;
        let persistent_volume = set_volume_id(target, r.persistent_volume, &r.volume_id).await?;
        Ok(Response::new(v2::SetVolumeIdResponse { persistent_volume }))
    }

    async fn progress(
        &self,
        request: Request<v2::VolumeSnapshotterProgressRequest>,
    ) -> Result<Response<v2::VolumeSnapshotterProgressResponse>, Status> {
        let r = request.into_inner();
        let call = Call::new(PluginKind::VolumeSnapshotterV2, &r.plugin, "Progress");
        let s = call.lookup(&self.0.snapshotter_v2)?;
        let progress = call.run(s.progress(&r.snapshot_id)).await?;
        Ok(Response::new(v2::VolumeSnapshotterProgressResponse { progress: Some(progress.into()) }))
    }

    async fn cancel(
        &self,
        request: Request<v2::VolumeSnapshotterCancelRequest>,
    ) -> Result<Response<()>, Status> {
        let r = request.into_inner();
        let call = Call::new(PluginKind::VolumeSnapshotterV2, &r.plugin, "Cancel");
        let s = call.lookup(&self.0.snapshotter_v2)?;
        call.run(s.cancel(&r.operation_id)).await?;
        Ok(Response::new(()))
    }
}
