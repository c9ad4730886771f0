//! The wire contract: every message field (number, name, type) and every
//! gRPC method path of the `.proto` files under `proto/`, in a canonical sorted listing.
//!
//! The expected listing below was checked against the protocol files Velero and go-plugin ship
//! (Velero's `pkg/plugin/proto/` and go-plugin's `internal/plugin/`); the `snapshotmetadata`
//! part is also compared, on every run, with external-snapshot-metadata's own `schema.proto`.
//! Renumbering, retyping or renaming anything that reaches the wire makes this test fail.

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto};
use std::path::Path;

mod support;

use support::{BoxError, proto_files, proto_root};

fn type_name(field: &FieldDescriptorProto) -> String {
    let scalar = match field.r#type() {
        Type::Message | Type::Enum | Type::Group => return field.type_name().to_owned(),
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
    };
    scalar.to_owned()
}

fn render_enum(scope: &str, value: &EnumDescriptorProto, lines: &mut Vec<(String, i32, String)>) {
    let name = format!("{scope}.{}", value.name());
    for item in &value.value {
        lines.push((
            name.clone(),
            item.number(),
            format!("enum {name} {} = {}", item.name(), item.number()),
        ));
    }
}

fn render_message(scope: &str, message: &DescriptorProto, lines: &mut Vec<(String, i32, String)>) {
    let name = format!("{scope}.{}", message.name());
    if message.field.is_empty() {
        lines.push((name.clone(), 0, format!("message {name} {{}}")));
    }
    for field in &message.field {
        let repeated = if field.label() == Label::Repeated { "repeated " } else { "" };
        let line = format!(
            "message {name} {} = {repeated}{} {}",
            field.number(),
            type_name(field),
            field.name()
        );
        lines.push((name.clone(), field.number(), line));
    }
    for nested in &message.nested_type {
        render_message(&name, nested, lines);
    }
    for nested in &message.enum_type {
        render_enum(&name, nested, lines);
    }
}

/// Canonical listing of the protocol: one line per field, enum value and method, sorted.
fn render(root: &Path) -> Result<String, BoxError> {
    let descriptors = protox::compile(proto_files(root)?, [root])?;
    let mut lines = Vec::new();
    for file in &descriptors.file {
        if file.package().starts_with("google.") {
            continue;
        }
        let scope = format!(".{}", file.package());
        for message in &file.message_type {
            render_message(&scope, message, &mut lines);
        }
        for value in &file.enum_type {
            render_enum(&scope, value, &mut lines);
        }
        for service in &file.service {
            for method in &service.method {
                let stream = |on: bool| if on { "stream " } else { "" };
                let line = format!(
                    "rpc /{}.{}/{}({}{}) returns ({}{})",
                    file.package(),
                    service.name(),
                    method.name(),
                    stream(method.client_streaming()),
                    method.input_type(),
                    stream(method.server_streaming()),
                    method.output_type()
                );
                lines.push((format!("~{line}"), 0, line));
            }
        }
    }
    lines.sort();
    let mut out = String::new();
    for (_, _, line) in lines {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

const EXPECTED: &str = r#"message .generated.BackupItemActionAppliesToRequest 1 = string plugin
message .generated.BackupItemActionAppliesToResponse 1 = .generated.ResourceSelector ResourceSelector
message .generated.CreateSnapshotRequest 1 = string plugin
message .generated.CreateSnapshotRequest 2 = string volumeID
message .generated.CreateSnapshotRequest 3 = string volumeAZ
message .generated.CreateSnapshotRequest 4 = repeated .generated.CreateSnapshotRequest.TagsEntry tags
message .generated.CreateSnapshotRequest.TagsEntry 1 = string key
message .generated.CreateSnapshotRequest.TagsEntry 2 = string value
message .generated.CreateSnapshotResponse 1 = string snapshotID
message .generated.CreateVolumeRequest 1 = string plugin
message .generated.CreateVolumeRequest 2 = string snapshotID
message .generated.CreateVolumeRequest 3 = string volumeType
message .generated.CreateVolumeRequest 4 = string volumeAZ
message .generated.CreateVolumeRequest 5 = int64 iops
message .generated.CreateVolumeResponse 1 = string volumeID
message .generated.DeleteItemActionAppliesToRequest 1 = string plugin
message .generated.DeleteItemActionAppliesToResponse 1 = .generated.ResourceSelector ResourceSelector
message .generated.DeleteItemActionExecuteRequest 1 = string plugin
message .generated.DeleteItemActionExecuteRequest 2 = bytes item
message .generated.DeleteItemActionExecuteRequest 3 = bytes backup
message .generated.DeleteSnapshotRequest 1 = string plugin
message .generated.DeleteSnapshotRequest 2 = string snapshotID
message .generated.Empty {}
message .generated.ExecuteRequest 1 = string plugin
message .generated.ExecuteRequest 2 = bytes item
message .generated.ExecuteRequest 3 = bytes backup
message .generated.ExecuteResponse 1 = bytes item
message .generated.ExecuteResponse 2 = repeated .generated.ResourceIdentifier additionalItems
message .generated.GetVolumeIDRequest 1 = string plugin
message .generated.GetVolumeIDRequest 2 = bytes persistentVolume
message .generated.GetVolumeIDResponse 1 = string volumeID
message .generated.GetVolumeInfoRequest 1 = string plugin
message .generated.GetVolumeInfoRequest 2 = string volumeID
message .generated.GetVolumeInfoRequest 3 = string volumeAZ
message .generated.GetVolumeInfoResponse 1 = string volumeType
message .generated.GetVolumeInfoResponse 2 = int64 iops
message .generated.ListPluginsResponse 1 = repeated .generated.PluginIdentifier plugins
message .generated.OperationProgress 1 = bool completed
message .generated.OperationProgress 2 = string err
message .generated.OperationProgress 3 = int64 nCompleted
message .generated.OperationProgress 4 = int64 nTotal
message .generated.OperationProgress 5 = string operationUnits
message .generated.OperationProgress 6 = string description
message .generated.OperationProgress 7 = .google.protobuf.Timestamp started
message .generated.OperationProgress 8 = .google.protobuf.Timestamp updated
message .generated.PluginIdentifier 1 = string command
message .generated.PluginIdentifier 2 = string kind
message .generated.PluginIdentifier 3 = string name
message .generated.ResourceIdentifier 1 = string group
message .generated.ResourceIdentifier 2 = string resource
message .generated.ResourceIdentifier 3 = string namespace
message .generated.ResourceIdentifier 4 = string name
message .generated.ResourceSelector 1 = repeated string includedNamespaces
message .generated.ResourceSelector 2 = repeated string excludedNamespaces
message .generated.ResourceSelector 3 = repeated string includedResources
message .generated.ResourceSelector 4 = repeated string excludedResources
message .generated.ResourceSelector 5 = string selector
message .generated.RestoreItemActionAppliesToRequest 1 = string plugin
message .generated.RestoreItemActionAppliesToResponse 1 = .generated.ResourceSelector ResourceSelector
message .generated.RestoreItemActionExecuteRequest 1 = string plugin
message .generated.RestoreItemActionExecuteRequest 2 = bytes item
message .generated.RestoreItemActionExecuteRequest 3 = bytes restore
message .generated.RestoreItemActionExecuteRequest 4 = bytes itemFromBackup
message .generated.RestoreItemActionExecuteResponse 1 = bytes item
message .generated.RestoreItemActionExecuteResponse 2 = repeated .generated.ResourceIdentifier additionalItems
message .generated.RestoreItemActionExecuteResponse 3 = bool skipRestore
message .generated.SetVolumeIDRequest 1 = string plugin
message .generated.SetVolumeIDRequest 2 = bytes persistentVolume
message .generated.SetVolumeIDRequest 3 = string volumeID
message .generated.SetVolumeIDResponse 1 = bytes persistentVolume
message .generated.Stack 1 = repeated .generated.StackFrame frames
message .generated.StackFrame 1 = string file
message .generated.StackFrame 2 = int32 line
message .generated.StackFrame 3 = string function
message .generated.VolumeSnapshotterInitRequest 1 = string plugin
message .generated.VolumeSnapshotterInitRequest 2 = repeated .generated.VolumeSnapshotterInitRequest.ConfigEntry config
message .generated.VolumeSnapshotterInitRequest.ConfigEntry 1 = string key
message .generated.VolumeSnapshotterInitRequest.ConfigEntry 2 = string value
message .plugin.ConnInfo 1 = uint32 service_id
message .plugin.ConnInfo 2 = string network
message .plugin.ConnInfo 3 = string address
message .plugin.ConnInfo 4 = .plugin.ConnInfo.Knock knock
message .plugin.ConnInfo.Knock 1 = bool knock
message .plugin.ConnInfo.Knock 2 = bool ack
message .plugin.ConnInfo.Knock 3 = string error
message .plugin.Empty {}
message .plugin.StdioData 1 = .plugin.StdioData.Channel channel
message .plugin.StdioData 2 = bytes data
enum .plugin.StdioData.Channel INVALID = 0
enum .plugin.StdioData.Channel STDOUT = 1
enum .plugin.StdioData.Channel STDERR = 2
message .snapshotmetadata.BlockMetadata 1 = int64 byte_offset
message .snapshotmetadata.BlockMetadata 2 = int64 size_bytes
enum .snapshotmetadata.BlockMetadataType UNKNOWN = 0
enum .snapshotmetadata.BlockMetadataType FIXED_LENGTH = 1
enum .snapshotmetadata.BlockMetadataType VARIABLE_LENGTH = 2
message .snapshotmetadata.GetMetadataAllocatedRequest 1 = string security_token
message .snapshotmetadata.GetMetadataAllocatedRequest 2 = string namespace
message .snapshotmetadata.GetMetadataAllocatedRequest 3 = string snapshot_name
message .snapshotmetadata.GetMetadataAllocatedRequest 4 = int64 starting_offset
message .snapshotmetadata.GetMetadataAllocatedRequest 5 = int32 max_results
message .snapshotmetadata.GetMetadataAllocatedResponse 1 = .snapshotmetadata.BlockMetadataType block_metadata_type
message .snapshotmetadata.GetMetadataAllocatedResponse 2 = int64 volume_capacity_bytes
message .snapshotmetadata.GetMetadataAllocatedResponse 3 = repeated .snapshotmetadata.BlockMetadata block_metadata
message .snapshotmetadata.GetMetadataDeltaRequest 1 = string security_token
message .snapshotmetadata.GetMetadataDeltaRequest 2 = string namespace
message .snapshotmetadata.GetMetadataDeltaRequest 3 = string base_snapshot_id
message .snapshotmetadata.GetMetadataDeltaRequest 4 = string target_snapshot_name
message .snapshotmetadata.GetMetadataDeltaRequest 5 = int64 starting_offset
message .snapshotmetadata.GetMetadataDeltaRequest 6 = int32 max_results
message .snapshotmetadata.GetMetadataDeltaResponse 1 = .snapshotmetadata.BlockMetadataType block_metadata_type
message .snapshotmetadata.GetMetadataDeltaResponse 2 = int64 volume_capacity_bytes
message .snapshotmetadata.GetMetadataDeltaResponse 3 = repeated .snapshotmetadata.BlockMetadata block_metadata
message .v2.BackupItemActionAppliesToRequest 1 = string plugin
message .v2.BackupItemActionAppliesToResponse 1 = .generated.ResourceSelector ResourceSelector
message .v2.BackupItemActionCancelRequest 1 = string plugin
message .v2.BackupItemActionCancelRequest 2 = string operationID
message .v2.BackupItemActionCancelRequest 3 = bytes backup
message .v2.BackupItemActionProgressRequest 1 = string plugin
message .v2.BackupItemActionProgressRequest 2 = string operationID
message .v2.BackupItemActionProgressRequest 3 = bytes backup
message .v2.BackupItemActionProgressResponse 1 = .generated.OperationProgress progress
message .v2.CreateSnapshotRequest 1 = string plugin
message .v2.CreateSnapshotRequest 2 = string volumeID
message .v2.CreateSnapshotRequest 3 = string volumeAZ
message .v2.CreateSnapshotRequest 4 = repeated .v2.CreateSnapshotRequest.TagsEntry tags
message .v2.CreateSnapshotRequest.TagsEntry 1 = string key
message .v2.CreateSnapshotRequest.TagsEntry 2 = string value
message .v2.CreateSnapshotResponse 1 = string snapshotID
message .v2.CreateVolumeRequest 1 = string plugin
message .v2.CreateVolumeRequest 2 = string snapshotID
message .v2.CreateVolumeRequest 3 = string volumeType
message .v2.CreateVolumeRequest 4 = string volumeAZ
message .v2.CreateVolumeRequest 5 = int64 iops
message .v2.CreateVolumeResponse 1 = string volumeID
message .v2.DeleteSnapshotRequest 1 = string plugin
message .v2.DeleteSnapshotRequest 2 = string snapshotID
message .v2.ExecuteRequest 1 = string plugin
message .v2.ExecuteRequest 2 = bytes item
message .v2.ExecuteRequest 3 = bytes backup
message .v2.ExecuteResponse 1 = bytes item
message .v2.ExecuteResponse 2 = repeated .generated.ResourceIdentifier additionalItems
message .v2.ExecuteResponse 3 = string operationID
message .v2.ExecuteResponse 4 = repeated .generated.ResourceIdentifier postOperationItems
message .v2.GetVolumeIDRequest 1 = string plugin
message .v2.GetVolumeIDRequest 2 = bytes persistentVolume
message .v2.GetVolumeIDResponse 1 = string volumeID
message .v2.GetVolumeInfoRequest 1 = string plugin
message .v2.GetVolumeInfoRequest 2 = string volumeID
message .v2.GetVolumeInfoRequest 3 = string volumeAZ
message .v2.GetVolumeInfoResponse 1 = string volumeType
message .v2.GetVolumeInfoResponse 2 = int64 iops
message .v2.RestoreItemActionAppliesToRequest 1 = string plugin
message .v2.RestoreItemActionAppliesToResponse 1 = .generated.ResourceSelector ResourceSelector
message .v2.RestoreItemActionCancelRequest 1 = string plugin
message .v2.RestoreItemActionCancelRequest 2 = string operationID
message .v2.RestoreItemActionCancelRequest 3 = bytes restore
message .v2.RestoreItemActionExecuteRequest 1 = string plugin
message .v2.RestoreItemActionExecuteRequest 2 = bytes item
message .v2.RestoreItemActionExecuteRequest 3 = bytes restore
message .v2.RestoreItemActionExecuteRequest 4 = bytes itemFromBackup
message .v2.RestoreItemActionExecuteResponse 1 = bytes item
message .v2.RestoreItemActionExecuteResponse 2 = repeated .generated.ResourceIdentifier additionalItems
message .v2.RestoreItemActionExecuteResponse 3 = bool skipRestore
message .v2.RestoreItemActionExecuteResponse 4 = string operationID
message .v2.RestoreItemActionExecuteResponse 5 = bool waitForAdditionalItems
message .v2.RestoreItemActionExecuteResponse 6 = .google.protobuf.Duration additionalItemsReadyTimeout
message .v2.RestoreItemActionItemsReadyRequest 1 = string plugin
message .v2.RestoreItemActionItemsReadyRequest 2 = bytes restore
message .v2.RestoreItemActionItemsReadyRequest 3 = repeated .generated.ResourceIdentifier additionalItems
message .v2.RestoreItemActionItemsReadyResponse 1 = bool ready
message .v2.RestoreItemActionProgressRequest 1 = string plugin
message .v2.RestoreItemActionProgressRequest 2 = string operationID
message .v2.RestoreItemActionProgressRequest 3 = bytes restore
message .v2.RestoreItemActionProgressResponse 1 = .generated.OperationProgress progress
message .v2.SetVolumeIDRequest 1 = string plugin
message .v2.SetVolumeIDRequest 2 = bytes persistentVolume
message .v2.SetVolumeIDRequest 3 = string volumeID
message .v2.SetVolumeIDResponse 1 = bytes persistentVolume
message .v2.VolumeSnapshotterCancelRequest 1 = string plugin
message .v2.VolumeSnapshotterCancelRequest 2 = string operationID
message .v2.VolumeSnapshotterInitRequest 1 = string plugin
message .v2.VolumeSnapshotterInitRequest 2 = repeated .v2.VolumeSnapshotterInitRequest.ConfigEntry config
message .v2.VolumeSnapshotterInitRequest.ConfigEntry 1 = string key
message .v2.VolumeSnapshotterInitRequest.ConfigEntry 2 = string value
message .v2.VolumeSnapshotterProgressRequest 1 = string plugin
message .v2.VolumeSnapshotterProgressRequest 2 = string snapshotID
message .v2.VolumeSnapshotterProgressResponse 1 = .generated.OperationProgress progress
rpc /generated.BackupItemAction/AppliesTo(.generated.BackupItemActionAppliesToRequest) returns (.generated.BackupItemActionAppliesToResponse)
rpc /generated.BackupItemAction/Execute(.generated.ExecuteRequest) returns (.generated.ExecuteResponse)
rpc /generated.DeleteItemAction/AppliesTo(.generated.DeleteItemActionAppliesToRequest) returns (.generated.DeleteItemActionAppliesToResponse)
rpc /generated.DeleteItemAction/Execute(.generated.DeleteItemActionExecuteRequest) returns (.generated.Empty)
rpc /generated.PluginLister/ListPlugins(.generated.Empty) returns (.generated.ListPluginsResponse)
rpc /generated.RestoreItemAction/AppliesTo(.generated.RestoreItemActionAppliesToRequest) returns (.generated.RestoreItemActionAppliesToResponse)
rpc /generated.RestoreItemAction/Execute(.generated.RestoreItemActionExecuteRequest) returns (.generated.RestoreItemActionExecuteResponse)
rpc /generated.VolumeSnapshotter/CreateSnapshot(.generated.CreateSnapshotRequest) returns (.generated.CreateSnapshotResponse)
rpc /generated.VolumeSnapshotter/CreateVolumeFromSnapshot(.generated.CreateVolumeRequest) returns (.generated.CreateVolumeResponse)
rpc /generated.VolumeSnapshotter/DeleteSnapshot(.generated.DeleteSnapshotRequest) returns (.generated.Empty)
rpc /generated.VolumeSnapshotter/GetVolumeID(.generated.GetVolumeIDRequest) returns (.generated.GetVolumeIDResponse)
rpc /generated.VolumeSnapshotter/GetVolumeInfo(.generated.GetVolumeInfoRequest) returns (.generated.GetVolumeInfoResponse)
rpc /generated.VolumeSnapshotter/Init(.generated.VolumeSnapshotterInitRequest) returns (.generated.Empty)
rpc /generated.VolumeSnapshotter/SetVolumeID(.generated.SetVolumeIDRequest) returns (.generated.SetVolumeIDResponse)
rpc /plugin.GRPCBroker/StartStream(stream .plugin.ConnInfo) returns (stream .plugin.ConnInfo)
rpc /plugin.GRPCController/Shutdown(.plugin.Empty) returns (.plugin.Empty)
rpc /plugin.GRPCStdio/StreamStdio(.google.protobuf.Empty) returns (stream .plugin.StdioData)
rpc /snapshotmetadata.SnapshotMetadata/GetMetadataAllocated(.snapshotmetadata.GetMetadataAllocatedRequest) returns (stream .snapshotmetadata.GetMetadataAllocatedResponse)
rpc /snapshotmetadata.SnapshotMetadata/GetMetadataDelta(.snapshotmetadata.GetMetadataDeltaRequest) returns (stream .snapshotmetadata.GetMetadataDeltaResponse)
rpc /v2.BackupItemAction/AppliesTo(.v2.BackupItemActionAppliesToRequest) returns (.v2.BackupItemActionAppliesToResponse)
rpc /v2.BackupItemAction/Cancel(.v2.BackupItemActionCancelRequest) returns (.google.protobuf.Empty)
rpc /v2.BackupItemAction/Execute(.v2.ExecuteRequest) returns (.v2.ExecuteResponse)
rpc /v2.BackupItemAction/Progress(.v2.BackupItemActionProgressRequest) returns (.v2.BackupItemActionProgressResponse)
rpc /v2.RestoreItemAction/AppliesTo(.v2.RestoreItemActionAppliesToRequest) returns (.v2.RestoreItemActionAppliesToResponse)
rpc /v2.RestoreItemAction/AreAdditionalItemsReady(.v2.RestoreItemActionItemsReadyRequest) returns (.v2.RestoreItemActionItemsReadyResponse)
rpc /v2.RestoreItemAction/Cancel(.v2.RestoreItemActionCancelRequest) returns (.google.protobuf.Empty)
rpc /v2.RestoreItemAction/Execute(.v2.RestoreItemActionExecuteRequest) returns (.v2.RestoreItemActionExecuteResponse)
rpc /v2.RestoreItemAction/Progress(.v2.RestoreItemActionProgressRequest) returns (.v2.RestoreItemActionProgressResponse)
rpc /v2.VolumeSnapshotter/Cancel(.v2.VolumeSnapshotterCancelRequest) returns (.google.protobuf.Empty)
rpc /v2.VolumeSnapshotter/CreateSnapshot(.v2.CreateSnapshotRequest) returns (.v2.CreateSnapshotResponse)
rpc /v2.VolumeSnapshotter/CreateVolumeFromSnapshot(.v2.CreateVolumeRequest) returns (.v2.CreateVolumeResponse)
rpc /v2.VolumeSnapshotter/DeleteSnapshot(.v2.DeleteSnapshotRequest) returns (.generated.Empty)
rpc /v2.VolumeSnapshotter/GetVolumeID(.v2.GetVolumeIDRequest) returns (.v2.GetVolumeIDResponse)
rpc /v2.VolumeSnapshotter/GetVolumeInfo(.v2.GetVolumeInfoRequest) returns (.v2.GetVolumeInfoResponse)
rpc /v2.VolumeSnapshotter/Init(.v2.VolumeSnapshotterInitRequest) returns (.generated.Empty)
rpc /v2.VolumeSnapshotter/Progress(.v2.VolumeSnapshotterProgressRequest) returns (.v2.VolumeSnapshotterProgressResponse)
rpc /v2.VolumeSnapshotter/SetVolumeID(.v2.SetVolumeIDRequest) returns (.v2.SetVolumeIDResponse)
"#;

#[test]
fn protocol_matches_the_written_contract() -> Result<(), BoxError> {
    let actual = render(&proto_root())?;
    if actual != EXPECTED {
        let missing: Vec<&str> =
            EXPECTED.lines().filter(|line| !actual.lines().any(|a| a == *line)).collect();
        let unexpected: Vec<&str> =
            actual.lines().filter(|line| !EXPECTED.lines().any(|e| e == *line)).collect();
        panic!(
            "the protocol in proto/ differs from the wire contract.\nmissing:\n  {}\nunexpected:\n  {}\nfull listing:\n{actual}",
            missing.join("\n  "),
            unexpected.join("\n  ")
        );
    }
    Ok(())
}

/// The lines of a listing that belong to the package `snapshotmetadata`.
fn snapshot_metadata_lines(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .filter(|l| l.contains(" .snapshotmetadata.") || l.contains("/snapshotmetadata."))
        .collect()
}

/// Ferry's `proto/snapshotmetadata/schema.proto` has the wire contract of the one
/// external-snapshot-metadata v1.1.0 ships (read from its release archive in the third-party
/// folder beside the workspace, `FERRY_THIRD_PARTY` to override).
#[test]
fn snapshot_metadata_matches_the_sidecars_release() -> Result<(), BoxError> {
    const RELEASE: &str = "external-snapshot-metadata-v1.1.0";
    let third_party = std::env::var_os("FERRY_THIRD_PARTY").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/third-party"),
        Into::into,
    );
    let archive = third_party.join(format!("{RELEASE}.tar.gz"));
    assert!(
        archive.is_file(),
        "{} is missing: the release's schema.proto is the reference (see ../shared/third-party/README.md)",
        archive.display()
    );
    let scratch = tempfile::tempdir()?;
    let out = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(scratch.path())
        .arg(format!("{RELEASE}/proto/schema.proto"))
        .output()?;
    assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
    let theirs = render(&scratch.path().join(RELEASE).join("proto"))?;
    let ours = render(&proto_root())?;
    let (theirs, ours) = (snapshot_metadata_lines(&theirs), snapshot_metadata_lines(&ours));
    assert!(theirs.len() > 20, "the release's listing is too short:\n{}", theirs.join("\n"));
    assert_eq!(ours, theirs, "proto/snapshotmetadata differs from {RELEASE}'s schema.proto");
    Ok(())
}
