//! Phases of DataUploads and DataDownloads, and the node OS enum.

use serde::{Deserialize, Deserializer, Serialize};

macro_rules! phase_enum {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// On the wire these are the exact strings of Velero's CRD enum. An empty or missing
        /// phase means [`Self::New`], as in Velero.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
        pub enum $name {
            /// Created, not yet taken by any node.
            #[default]
            New,
            /// One node took the object lock and is exposing the volume.
            Accepted,
            /// The volume is exposed on a node, ready to move data.
            Prepared,
            /// Data is moving.
            InProgress,
            /// Cancel requested; the mover is stopping.
            Canceling,
            /// Stopped on request (terminal).
            Canceled,
            /// Done (terminal).
            Completed,
            /// Failed, with a message (terminal).
            Failed,
        }

        impl $name {
            /// Every phase, in lifecycle order.
            pub const ALL: [Self; 8] = [
                Self::New,
                Self::Accepted,
                Self::Prepared,
                Self::InProgress,
                Self::Canceling,
                Self::Canceled,
                Self::Completed,
                Self::Failed,
            ];

            /// The wire string.
            #[must_use]
            pub fn as_str(self) -> &'static str {
                match self {
                    Self::New => "New",
                    Self::Accepted => "Accepted",
                    Self::Prepared => "Prepared",
                    Self::InProgress => "InProgress",
                    Self::Canceling => "Canceling",
                    Self::Canceled => "Canceled",
                    Self::Completed => "Completed",
                    Self::Failed => "Failed",
                }
            }

            /// Completed, Failed and Canceled are terminal: nothing moves a CR out of them.
            #[must_use]
            pub fn is_terminal(self) -> bool {
                matches!(self, Self::Completed | Self::Failed | Self::Canceled)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                if s.is_empty() {
                    return Ok(Self::New);
                }
                Self::ALL
                    .into_iter()
                    .find(|p| p.as_str() == s)
                    .ok_or_else(|| format!("unknown phase {s:?}"))
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

phase_enum!(
    /// The phase of a [`crate::DataUpload`].
    DataUploadPhase
);
phase_enum!(
    /// The phase of a [`crate::DataDownload`].
    DataDownloadPhase
);

/// The operating system of the node that moves the data (`auto`, `linux`, `windows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeOs {
    /// Chosen by the mover.
    Auto,
    /// Linux nodes.
    Linux,
    /// Windows nodes.
    Windows,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_as_velero_strings() {
        for p in DataUploadPhase::ALL {
            let json = serde_json::to_string(&p).expect("serialize");
            assert_eq!(json, format!("\"{}\"", p.as_str()));
            let back: DataUploadPhase = serde_json::from_str(&json).expect("deserialize");
            assert_eq!(back, p);
        }
        assert_eq!(
            serde_json::from_str::<DataDownloadPhase>("\"\"").expect("empty"),
            DataDownloadPhase::New
        );
        assert!(serde_json::from_str::<DataUploadPhase>("\"Done\"").is_err());
    }

    #[test]
    fn terminal_phases() {
        let terminal: Vec<_> =
            DataUploadPhase::ALL.into_iter().filter(|p| p.is_terminal()).collect();
        assert_eq!(
            terminal,
            [DataUploadPhase::Canceled, DataUploadPhase::Completed, DataUploadPhase::Failed]
        );
    }
}
