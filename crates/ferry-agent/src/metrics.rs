//! Prometheus metrics of one agent: outcomes per CR kind (named like Velero's node-agent
//! counters, with Ferry's prefix), bytes moved, movement durations and work in flight.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A terminal outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    Failure,
    Cancel,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    kind: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BlockReadLabels {
    node: String,
    path: String,
    fallback: String,
}

/// A CR kind and an outcome.
type OutcomeKey = (&'static str, Outcome);

/// The agent's metrics. Cheap to share; [`Metrics::encode`] renders the text format.
#[derive(Debug)]
pub struct Metrics {
    node: String,
    registry: Registry,
    outcomes: Vec<(OutcomeKey, Family<NodeLabels, Counter>)>,
    bytes: Family<KindLabels, Counter>,
    in_flight: Family<KindLabels, Gauge<i64, std::sync::atomic::AtomicI64>>,
    durations: Family<DurationLabels, Histogram>,
    block_reads: Family<BlockReadLabels, Counter>,
}

fn kind_prefix(kind: &str) -> &'static str {
    if kind == "DataDownload" { "data_download" } else { "data_upload" }
}

impl Metrics {
    /// Metrics for the agent of `node`.
    #[must_use]
    pub fn new(node: &str) -> Arc<Self> {
        let mut registry = Registry::with_prefix("ferry");
        let mut outcomes = Vec::new();
        for kind in ["DataUpload", "DataDownload"] {
            for (outcome, word, help) in [
                (Outcome::Success, "success", "completed"),
                (Outcome::Failure, "failure", "failed"),
                (Outcome::Cancel, "cancel", "canceled"),
            ] {
                let family = Family::<NodeLabels, Counter>::default();
                registry.register(
                    format!("{}_{word}", kind_prefix(kind)),
                    format!("{kind}s {help} by this node"),
                    family.clone(),
                );
                outcomes.push(((kind, outcome), family));
            }
        }
        let bytes = Family::<KindLabels, Counter>::default();
        registry.register(
            "data_moved_bytes",
            "Bytes of volume data moved (read for uploads, written for downloads)",
            bytes.clone(),
        );
        let in_flight = Family::<KindLabels, Gauge<i64, std::sync::atomic::AtomicI64>>::default();
        registry.register(
            "data_movements_in_flight",
            "Data movements running now",
            in_flight.clone(),
        );
        let durations = Family::<DurationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(1.0, 2.0, 16))
        });
        registry.register(
            "data_movement_duration_seconds",
            "Time from the start of a data movement to its end",
            durations.clone(),
        );
        let block_reads = Family::<BlockReadLabels, Counter>::default();
        registry.register(
            "block_backup_reads",
            "Completed block backups by what they read (path: allocated, delta or full) and why \
             changed-block tracking was not used (fallback; empty when it was)",
            block_reads.clone(),
        );
        // Every series exists from the start (at zero), so dashboards and alerts see them
        // before the first CR arrives.
        let node_labels = NodeLabels { node: node.to_owned() };
        for (_, family) in &outcomes {
            let _ = family.get_or_create(&node_labels);
        }
        for kind in ["DataUpload", "DataDownload"] {
            let labels = KindLabels { kind: kind_prefix(kind).into(), node: node.to_owned() };
            let _ = bytes.get_or_create(&labels);
            let _ = in_flight.get_or_create(&labels);
            for outcome in ["success", "failure", "cancel"] {
                let labels =
                    DurationLabels { kind: kind_prefix(kind).into(), outcome: outcome.into() };
                let _ = durations.get_or_create(&labels);
            }
        }
        Arc::new(Self {
            node: node.to_owned(),
            registry,
            outcomes,
            bytes,
            in_flight,
            durations,
            block_reads,
        })
    }

    pub(crate) fn outcome(&self, kind: &str, outcome: Outcome) {
        if let Some((_, family)) =
            self.outcomes.iter().find(|((k, o), _)| *k == kind && *o == outcome)
        {
            family.get_or_create(&NodeLabels { node: self.node.clone() }).inc();
        }
    }

    pub(crate) fn moved(&self, kind: &str, bytes: u64, took: Duration, outcome: Outcome) {
        let labels = KindLabels { kind: kind_prefix(kind).into(), node: self.node.clone() };
        self.bytes.get_or_create(&labels).inc_by(bytes);
        let word = match outcome {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Cancel => "cancel",
        };
        self.durations
            .get_or_create(&DurationLabels { kind: kind_prefix(kind).into(), outcome: word.into() })
            .observe(took.as_secs_f64());
    }

    /// Counts one completed block backup that read by `path`, having fallen back for
    /// `fallback`.
    pub(crate) fn block_reads(&self, path: &str, fallback: Option<&str>) {
        let labels = BlockReadLabels {
            node: self.node.clone(),
            path: path.to_owned(),
            fallback: fallback.unwrap_or_default().to_owned(),
        };
        self.block_reads.get_or_create(&labels).inc();
    }

    /// Counts one running movement of `kind` until the guard drops.
    pub(crate) fn running(self: &Arc<Self>, kind: &str) -> InFlight {
        let labels = KindLabels { kind: kind_prefix(kind).into(), node: self.node.clone() };
        self.in_flight.get_or_create(&labels).inc();
        InFlight { metrics: Arc::clone(self), labels }
    }

    /// The Prometheus text exposition of every metric.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Decrements the in-flight gauge when dropped.
pub(crate) struct InFlight {
    metrics: Arc<Metrics>,
    labels: KindLabels,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.metrics.in_flight.get_or_create(&self.labels).dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_bytes_and_in_flight_are_exported() {
        let m = Metrics::new("node-a");
        m.outcome("DataUpload", Outcome::Success);
        m.outcome("DataDownload", Outcome::Cancel);
        m.moved("DataUpload", 4096, Duration::from_secs(3), Outcome::Success);
        let guard = m.running("DataDownload");
        let text = m.encode();
        assert!(text.contains("ferry_data_upload_success_total{node=\"node-a\"} 1"), "{text}");
        assert!(text.contains("ferry_data_download_cancel_total{node=\"node-a\"} 1"), "{text}");
        assert!(
            text.contains(
                "ferry_data_moved_bytes_total{kind=\"data_upload\",node=\"node-a\"} 4096"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "ferry_data_movements_in_flight{kind=\"data_download\",node=\"node-a\"} 1"
            ),
            "{text}"
        );
        drop(guard);
        assert!(
            m.encode().contains(
                "ferry_data_movements_in_flight{kind=\"data_download\",node=\"node-a\"} 0"
            )
        );
        assert!(text.contains("ferry_data_movement_duration_seconds_count{kind=\"data_upload\",outcome=\"success\"} 1"), "{text}");
        m.block_reads("full", Some("no-service"));
        m.block_reads("allocated", None);
        let text = m.encode();
        assert!(text.contains("ferry_block_backup_reads_total{node=\"node-a\",path=\"full\",fallback=\"no-service\"} 1"), "{text}");
        assert!(
            text.contains(
                "ferry_block_backup_reads_total{node=\"node-a\",path=\"allocated\",fallback=\"\"} 1"
            ),
            "{text}"
        );
    }
}
