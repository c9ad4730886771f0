//! Choosing the VolumeSnapshotClass for a PVC, in Velero's order:
//!
//! 1. the PVC's annotation `velero.io/csi-volumesnapshot-class` naming a class;
//! 2. the Backup's annotation `velero.io/csi-volumesnapshot-class_<driver in lower case>`;
//! 3. the driver's class labelled `velero.io/csi-volumesnapshot-class`, else the one annotated
//!    `snapshot.storage.kubernetes.io/is-default-class`, else the driver's only class.
//!
//! Names and drivers compare without regard to case, as in Velero. A class named by an
//! annotation that does not exist, or belongs to another driver, is skipped (Velero logs it and
//! falls through to the next rule).

use std::collections::BTreeMap;

use ferry_api::VolumeSnapshotClass;

use crate::keys::{SNAPSHOT_CLASS_DEFAULT, SNAPSHOT_CLASS_SELECTOR};

/// Picks the class for a PVC of CSI driver `driver`; `Err` explains why none fits.
///
/// # Errors
/// A sentence naming the labels and annotations that would have chosen a class.
pub fn select_snapshot_class<'a>(
    classes: &'a [VolumeSnapshotClass],
    driver: &str,
    pvc_annotations: &BTreeMap<String, String>,
    backup_annotations: &BTreeMap<String, String>,
) -> Result<&'a VolumeSnapshotClass, String> {
    if let Some(class) = pvc_annotations
        .get(SNAPSHOT_CLASS_SELECTOR)
        .and_then(|name| named_class(classes, name, driver, "the PVC's annotation"))
    {
        return Ok(class);
    }
    let backup_key = format!("{SNAPSHOT_CLASS_SELECTOR}_{}", driver.to_lowercase());
    if let Some(class) = backup_annotations
        .get(&backup_key)
        .and_then(|name| named_class(classes, name, driver, "the backup's annotation"))
    {
        return Ok(class);
    }
    default_class(classes, driver).ok_or_else(|| {
        format!(
            "no VolumeSnapshotClass for this driver has the {SNAPSHOT_CLASS_SELECTOR} label or \
             the {SNAPSHOT_CLASS_DEFAULT} annotation, and there is not exactly one; label the \
             one to use, or name it in the PVC annotation {SNAPSHOT_CLASS_SELECTOR} or the backup \
             annotation {backup_key}"
        )
    })
}

fn named_class<'a>(
    classes: &'a [VolumeSnapshotClass],
    name: &str,
    driver: &str,
    source: &str,
) -> Option<&'a VolumeSnapshotClass> {
    let found = classes
        .iter()
        .find(|c| c.metadata.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(name)));
    match found {
        Some(class) if class.driver.eq_ignore_ascii_case(driver) => Some(class),
        Some(class) => {
            tracing::debug!(class = name, class_driver = %class.driver, driver, "VolumeSnapshotClass named by {source} is for another driver");
            None
        }
        None => {
            tracing::debug!(class = name, driver, "no VolumeSnapshotClass named by {source}");
            None
        }
    }
}

fn default_class<'a>(
    classes: &'a [VolumeSnapshotClass],
    driver: &str,
) -> Option<&'a VolumeSnapshotClass> {
    let for_driver: Vec<_> = classes.iter().filter(|c| c.driver == driver).collect();
    let has_label = |c: &&&VolumeSnapshotClass| {
        c.metadata.labels.as_ref().is_some_and(|l| l.contains_key(SNAPSHOT_CLASS_SELECTOR))
    };
    let has_default = |c: &&&VolumeSnapshotClass| {
        c.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(SNAPSHOT_CLASS_DEFAULT))
    };
    for_driver
        .iter()
        .find(has_label)
        .or_else(|| for_driver.iter().find(has_default))
        .or_else(|| if for_driver.len() == 1 { for_driver.first() } else { None })
        .copied()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn class(name: &str, driver: &str, label: bool, default: bool) -> VolumeSnapshotClass {
        let mut c = VolumeSnapshotClass::new(name, driver, "Delete");
        if label {
            c.metadata.labels =
                Some([(SNAPSHOT_CLASS_SELECTOR.to_owned(), "true".to_owned())].into());
        }
        if default {
            c.metadata.annotations =
                Some([(SNAPSHOT_CLASS_DEFAULT.to_owned(), "true".to_owned())].into());
        }
        c
    }

    fn name(c: Result<&VolumeSnapshotClass, String>) -> String {
        c.map(|c| c.metadata.name.clone().unwrap()).unwrap_or_else(|e| format!("error: {e}"))
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn the_label_wins_over_the_default_annotation_and_order() {
        let classes = [
            class("plain", "csi.a", false, false),
            class("default", "csi.a", false, true),
            class("labelled", "csi.a", true, false),
            class("other-driver", "csi.b", true, false),
        ];
        let none = BTreeMap::new();
        assert_eq!(name(select_snapshot_class(&classes, "csi.a", &none, &none)), "labelled");
        assert_eq!(name(select_snapshot_class(&classes[..2], "csi.a", &none, &none)), "default");
        assert_eq!(name(select_snapshot_class(&classes[..1], "csi.a", &none, &none)), "plain");
        let two_plain = [class("p1", "csi.a", false, false), class("p2", "csi.a", false, false)];
        let err = name(select_snapshot_class(&two_plain, "csi.a", &none, &none));
        assert!(err.starts_with("error: ") && err.contains(SNAPSHOT_CLASS_SELECTOR), "{err}");
        assert!(name(select_snapshot_class(&classes, "csi.c", &none, &none)).starts_with("error"));
    }

    #[test]
    fn annotations_name_a_class_pvc_first() {
        let classes = [
            class("labelled", "csi.a", true, false),
            class("fast", "csi.a", false, false),
            class("Slow", "csi.a", false, false),
            class("foreign", "csi.b", false, false),
        ];
        let pvc = map(&[(SNAPSHOT_CLASS_SELECTOR, "FAST")]);
        let backup = map(&[("velero.io/csi-volumesnapshot-class_csi.a", "slow")]);
        let none = BTreeMap::new();
        assert_eq!(name(select_snapshot_class(&classes, "csi.a", &pvc, &backup)), "fast");
        assert_eq!(name(select_snapshot_class(&classes, "csi.a", &none, &backup)), "Slow");
        // The backup annotation's key carries the driver in lower case.
        let upper = [class("x", "CSI.A", false, false), class("y", "CSI.A", true, false)];
        let backup_upper = map(&[("velero.io/csi-volumesnapshot-class_csi.a", "x")]);
        assert_eq!(name(select_snapshot_class(&upper, "CSI.A", &none, &backup_upper)), "x");
        // A class of another driver, or a missing one, falls through to the label.
        let wrong = map(&[(SNAPSHOT_CLASS_SELECTOR, "foreign")]);
        assert_eq!(name(select_snapshot_class(&classes, "csi.a", &wrong, &none)), "labelled");
        let missing = map(&[(SNAPSHOT_CLASS_SELECTOR, "gone")]);
        assert_eq!(name(select_snapshot_class(&classes, "csi.a", &missing, &none)), "labelled");
    }
}
