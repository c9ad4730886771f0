//! Encodes protocol messages and compares the bytes with hand-computed protobuf encodings, so
//! that a field renumbered or retyped in `proto/` fails here even if both ends would still agree
//! with each other. Each expectation is written as (tag byte, payload) pieces: the tag byte is
//! `field_number << 3 | wire_type`, with wire type 0 for varints and 2 for length-delimited.

use ferry_proto::{generated, plugin, v2};
use prost::Message;

type BoxError = Box<dyn std::error::Error>;

/// A length-delimited field whose number and length fit in one byte each.
fn len_field(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![tag, u8::try_from(payload.len()).unwrap_or(u8::MAX)];
    out.extend_from_slice(payload);
    out
}

/// Checks that `message` encodes to `expected` and that `expected` decodes back to `message`.
fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(
    message: &M,
    expected: &[u8],
) -> Result<(), BoxError> {
    assert_eq!(message.encode_to_vec(), expected, "encoding of {message:?}");
    assert_eq!(&M::decode(expected)?, message, "decoding of {expected:02x?}");
    Ok(())
}

#[test]
fn operation_progress_with_every_field() -> Result<(), BoxError> {
    let progress = generated::OperationProgress {
        completed: true,
        err: "e".into(),
        n_completed: 300,
        n_total: -2,
        operation_units: "B".into(),
        description: "d".into(),
        started: Some(prost_types::Timestamp { seconds: 1, nanos: 2 }),
        updated: Some(prost_types::Timestamp { seconds: 3, nanos: 0 }),
    };
    let expected = [
        vec![0x08, 0x01],                           // 1 completed: varint true
        len_field(0x12, b"e"),                      // 2 err
        vec![0x18, 0xac, 0x02],                     // 3 nCompleted: varint 300
        vec![0x20, 0xfe, 0xff, 0xff, 0xff, 0xff],   // 4 nTotal: int64 -2 is a ten-byte varint...
        vec![0xff, 0xff, 0xff, 0xff, 0x01],         // ...(a sint64 would zigzag to one byte)
        len_field(0x2a, b"B"),                      // 5 operationUnits
        len_field(0x32, b"d"),                      // 6 description
        len_field(0x3a, &[0x08, 0x01, 0x10, 0x02]), // 7 started {seconds 1, nanos 2}
        len_field(0x42, &[0x08, 0x03]),             // 8 updated {seconds 3}
    ]
    .concat();
    assert_wire(&progress, &expected)
}

#[test]
fn backup_item_action_v2_execute() -> Result<(), BoxError> {
    let request =
        v2::ExecuteRequest { plugin: "p".into(), item: b"{}".to_vec(), backup: b"b".to_vec() };
    let expected = [
        len_field(0x0a, b"p"),  // 1 plugin
        len_field(0x12, b"{}"), // 2 item
        len_field(0x1a, b"b"),  // 3 backup
    ]
    .concat();
    assert_wire(&request, &expected)?;

    let response = v2::ExecuteResponse {
        item: b"i".to_vec(),
        additional_items: vec![generated::ResourceIdentifier {
            group: "g".into(),
            resource: "pods".into(),
            namespace: "ns".into(),
            name: "n".into(),
        }],
        operation_id: "op".into(),
        post_operation_items: vec![generated::ResourceIdentifier {
            name: "x".into(),
            ..Default::default()
        }],
    };
    let identifier = [
        len_field(0x0a, b"g"),    // 1 group
        len_field(0x12, b"pods"), // 2 resource
        len_field(0x1a, b"ns"),   // 3 namespace
        len_field(0x22, b"n"),    // 4 name
    ]
    .concat();
    let expected = [
        len_field(0x0a, b"i"),                   // 1 item
        len_field(0x12, &identifier),            // 2 additionalItems
        len_field(0x1a, b"op"),                  // 3 operationID
        len_field(0x22, &len_field(0x22, b"x")), // 4 postOperationItems {name "x"}
    ]
    .concat();
    assert_wire(&response, &expected)
}

#[test]
fn restore_item_action_v2_execute_response() -> Result<(), BoxError> {
    let response = v2::RestoreItemActionExecuteResponse {
        item: b"i".to_vec(),
        additional_items: vec![],
        skip_restore: true,
        operation_id: "op".into(),
        wait_for_additional_items: true,
        additional_items_ready_timeout: Some(prost_types::Duration { seconds: 600, nanos: 0 }),
    };
    let expected = [
        len_field(0x0a, b"i"),                // 1 item
        vec![0x18, 0x01],                     // 3 skipRestore
        len_field(0x22, b"op"),               // 4 operationID
        vec![0x28, 0x01],                     // 5 waitForAdditionalItems
        len_field(0x32, &[0x08, 0xd8, 0x04]), // 6 additionalItemsReadyTimeout {seconds 600}
    ]
    .concat();
    assert_wire(&response, &expected)
}

#[test]
fn plugin_identifier_list() -> Result<(), BoxError> {
    let response = generated::ListPluginsResponse {
        plugins: vec![
            generated::PluginIdentifier {
                command: "/p".into(),
                kind: "BackupItemActionV2".into(),
                name: "ferry.io/a".into(),
            },
            generated::PluginIdentifier {
                command: "/p".into(),
                kind: "VolumeSnapshotterV2".into(),
                name: "ferry.io/b".into(),
            },
        ],
    };
    let first = [
        len_field(0x0a, b"/p"),                 // 1 command
        len_field(0x12, b"BackupItemActionV2"), // 2 kind
        len_field(0x1a, b"ferry.io/a"),         // 3 name
    ]
    .concat();
    let second = [
        len_field(0x0a, b"/p"),
        len_field(0x12, b"VolumeSnapshotterV2"),
        len_field(0x1a, b"ferry.io/b"),
    ]
    .concat();
    let expected = [len_field(0x0a, &first), len_field(0x0a, &second)].concat(); // 1 plugins
    assert_wire(&response, &expected)
}

#[test]
fn volume_snapshotter_v2_progress_and_cancel() -> Result<(), BoxError> {
    let progress =
        v2::VolumeSnapshotterProgressRequest { plugin: "p".into(), snapshot_id: "s".into() };
    assert_wire(&progress, &[len_field(0x0a, b"p"), len_field(0x12, b"s")].concat())?;
    let cancel =
        v2::VolumeSnapshotterCancelRequest { plugin: "p".into(), operation_id: "s".into() };
    assert_wire(&cancel, &[len_field(0x0a, b"p"), len_field(0x12, b"s")].concat())?;
    let init = v2::VolumeSnapshotterInitRequest {
        plugin: "p".into(),
        config: [("k".to_owned(), "v".to_owned())].into(),
    };
    // A map entry is a nested message {1 key, 2 value} under the map's field number.
    let entry = [len_field(0x0a, b"k"), len_field(0x12, b"v")].concat();
    assert_wire(&init, &[len_field(0x0a, b"p"), len_field(0x12, &entry)].concat())
}

#[test]
fn go_plugin_messages() -> Result<(), BoxError> {
    let stdio = plugin::StdioData {
        channel: plugin::stdio_data::Channel::Stderr.into(),
        data: b"x".to_vec(),
    };
    assert_wire(&stdio, &[vec![0x08, 0x02], len_field(0x12, b"x")].concat())?;
    let conn = plugin::ConnInfo {
        service_id: 7,
        network: "unix".into(),
        address: "/s".into(),
        knock: Some(plugin::conn_info::Knock { knock: true, ack: true, error: "e".into() }),
    };
    let knock = [vec![0x08, 0x01, 0x10, 0x01], len_field(0x1a, b"e")].concat();
    let expected = [
        vec![0x08, 0x07],         // 1 service_id
        len_field(0x12, b"unix"), // 2 network
        len_field(0x1a, b"/s"),   // 3 address
        len_field(0x22, &knock),  // 4 knock {knock, ack, error}
    ]
    .concat();
    assert_wire(&conn, &expected)
}

#[test]
fn truncated_bytes_are_an_error_not_a_panic() -> Result<(), BoxError> {
    let full = v2::ExecuteRequest {
        plugin: "plugin".into(),
        item: b"{\"kind\":\"Pod\"}".to_vec(),
        backup: vec![],
    }
    .encode_to_vec();
    // Field boundaries: after nothing, after `plugin` (2 + 6 bytes), after `item` (2 + 14).
    let boundaries = [0, 8, 24];
    assert_eq!(full.len(), 24);
    for cut in 0..=full.len() {
        let prefix = full.get(..cut).ok_or("cut past the end")?;
        let decoded = v2::ExecuteRequest::decode(prefix);
        assert_eq!(decoded.is_ok(), boundaries.contains(&cut), "cut at {cut}: {decoded:?}");
    }
    Ok(())
}
