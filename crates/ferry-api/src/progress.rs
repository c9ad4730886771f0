//! Velero's `shared.DataMoveOperationProgress`.

use serde::{Deserialize, Serialize};

/// Bytes moved so far and the total, as written to `status.progress`.
///
/// Velero serialises both fields with `omitempty`: a zero is absent on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataMoveOperationProgress {
    /// The volume's total bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub total_bytes: i64,
    /// Bytes processed so far.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_done: i64,
}

// serde's skip_serializing_if hands the field by reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_zero(v: &i64) -> bool {
    *v == 0
}
