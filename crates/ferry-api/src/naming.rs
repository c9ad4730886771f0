//! Velero's naming rules: label values and asynchronous operation IDs.

use sha2::{Digest, Sha256};

/// Longest label value Kubernetes accepts (a DNS-1035 label).
pub const MAX_LABEL_VALUE_LEN: usize = 63;

/// Velero's rule for turning any string into a valid label value: a value of at most 63
/// bytes is kept; a longer one becomes its first 57 bytes followed by the first 6 hex digits
/// of the SHA-256 of the whole value.
///
/// Velero cuts bytes, not characters; the values it applies this to (names, UIDs) are ASCII.
/// For non-ASCII input this function cuts at the last character boundary at or before byte 57
/// rather than produce invalid UTF-8.
#[must_use]
pub fn valid_label_value(value: &str) -> String {
    if value.len() <= MAX_LABEL_VALUE_LEN {
        return value.to_owned();
    }
    let digest = hex::encode(Sha256::digest(value.as_bytes()));
    let mut cut = MAX_LABEL_VALUE_LEN - 6;
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{}", &value[..cut], &digest[..6])
}

/// The operation ID (and `velero.io/async-operation-id` label value) of the DataUpload that
/// backs up the PVC with UID `pvc_uid` for the Backup with UID `backup_uid`.
#[must_use]
pub fn data_upload_operation_id(backup_uid: &str, pvc_uid: &str) -> String {
    valid_label_value(&format!(
        "{}{backup_uid}.{pvc_uid}",
        crate::keys::DATA_UPLOAD_OPERATION_PREFIX
    ))
}

/// The operation ID of the DataDownload that restores the PVC with UID `pvc_uid` for the
/// Restore with UID `restore_uid`.
#[must_use]
pub fn data_download_operation_id(restore_uid: &str, pvc_uid: &str) -> String {
    valid_label_value(&format!(
        "{}{restore_uid}.{pvc_uid}",
        crate::keys::DATA_DOWNLOAD_OPERATION_PREFIX
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_kept() {
        assert_eq!(valid_label_value("backup-1"), "backup-1");
        let exactly = "a".repeat(63);
        assert_eq!(valid_label_value(&exactly), exactly);
    }

    #[test]
    fn long_values_get_57_bytes_and_a_hash() {
        let long = "b".repeat(64);
        let got = valid_label_value(&long);
        assert_eq!(got.len(), 63);
        assert_eq!(&got[..57], &long[..57]);
        // sha256("b" x 64), computed independently with `printf 'b%.0s' {1..64} | sha256sum`.
        assert_eq!(&got[57..], "a0fab1");
    }

    #[test]
    fn operation_ids_follow_velero() {
        let id = data_upload_operation_id(
            "6a0d4e5c-1c39-4a7c-9f4e-1d2f0b8c7a11",
            "0b7c2d1e-8f3a-4b5c-9d6e-7f8a9b0c1d2e",
        );
        // 57 bytes of the text, then sha256 of the whole text (computed with sha256sum).
        assert_eq!(id, "du-6a0d4e5c-1c39-4a7c-9f4e-1d2f0b8c7a11.0b7c2d1e-8f3a-4b582d0fd");
        let dd = data_download_operation_id("r", "p");
        assert_eq!(dd, "dd-r.p");
    }

    #[test]
    fn non_ascii_never_splits_a_character() {
        let v = "é".repeat(40);
        let got = valid_label_value(&v);
        assert!(got.len() <= 63);
    }
}
