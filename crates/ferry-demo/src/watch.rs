//! Following a DataUpload or DataDownload to its end with a live line: phase, node, bytes
//! done of total, throughput. On a terminal the line redraws in place; otherwise a plain line
//! is printed each second something changed.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry_api::{DataDownload, DataUpload};
use ferry_testbed::VELERO_NAMESPACE;
use indicatif::{ProgressBar, ProgressStyle};
use kube::api::Api;

/// The bound on one transfer, from creation to a terminal phase.
const WAIT: Duration = Duration::from_secs(900);
const POLL: Duration = Duration::from_millis(250);

/// What the live line shows of a CR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub phase: String,
    pub node: String,
    pub done: u64,
    pub total: u64,
    pub terminal: bool,
    pub message: String,
}

/// The status of either kind of CR.
pub trait Watched:
    kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
{
    fn status_line(&self) -> Status;
}

fn node(node: &str, accepted: &str) -> String {
    if node.is_empty() { accepted.to_owned() } else { node.to_owned() }
}

fn bytes(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Watched for DataUpload {
    fn status_line(&self) -> Status {
        let s = self.status.clone().unwrap_or_default();
        let phase = self.phase();
        Status {
            phase: phase.to_string(),
            node: node(&s.node, &s.accepted_by_node),
            done: bytes(s.progress.bytes_done),
            total: bytes(s.progress.total_bytes),
            terminal: phase.is_terminal(),
            message: s.message,
        }
    }
}

impl Watched for DataDownload {
    fn status_line(&self) -> Status {
        let s = self.status.clone().unwrap_or_default();
        let phase = s.phase.unwrap_or_default();
        Status {
            phase: phase.to_string(),
            node: node(&s.node, &s.accepted_by_node),
            done: bytes(s.progress.bytes_done),
            total: bytes(s.progress.total_bytes),
            terminal: phase.is_terminal(),
            message: s.message,
        }
    }
}

/// What a finished transfer took.
#[derive(Debug, Clone)]
pub struct Finished<K> {
    pub object: K,
    pub status: Status,
    /// From creation to the terminal phase.
    pub elapsed: Duration,
    /// From the first `InProgress` seen to the terminal phase.
    pub moving: Duration,
    /// From the first `InProgress` seen to the first `bytesDone` above zero seen while still
    /// InProgress; `None` if the CR finished before showing any.
    pub first_progress: Option<Duration>,
}

/// Polls CR `name` (Velero's namespace) until it is terminal, showing its progress; fails
/// after [`WAIT`] or when `alive` reports a problem (e.g. an agent died).
///
/// # Errors
/// The wait timed out, the API server failed, or `alive` returned an error.
pub async fn follow<K: Watched>(
    client: kube::Client,
    name: &str,
    mut alive: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Finished<K>> {
    let api: Api<K> = Api::namespaced(client, VELERO_NAMESPACE);
    let tty = std::io::stdout().is_terminal();
    let bar = if tty { ProgressBar::new(0) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template(
            "  {spinner} {msg:28} [{bar:30.cyan/blue}] {binary_bytes:>10}/{binary_total_bytes:<10} {binary_bytes_per_sec:>12} {elapsed}",
        )?
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let start = Instant::now();
    let mut moving_since = None;
    let mut first_progress = None;
    let mut printed = Instant::now() - Duration::from_secs(10);
    let mut last_line = None;
    let mut last_bytes = (Instant::now(), 0u64);
    let result = loop {
        if start.elapsed() > WAIT {
            break Err(anyhow::anyhow!("{name} did not finish within {WAIT:?}"));
        }
        if let Err(e) = alive() {
            break Err(e);
        }
        let obj = match api.get(name).await.with_context(|| format!("reading {name}")) {
            Ok(obj) => obj,
            Err(e) => break Err(e),
        };
        let st = obj.status_line();
        if moving_since.is_none() && (st.phase == "InProgress" || st.terminal) {
            moving_since = Some(Instant::now());
        }
        if first_progress.is_none() && st.phase == "InProgress" && st.done > 0 {
            first_progress = moving_since.map(|t: Instant| t.elapsed());
        }
        let where_ = if st.node.is_empty() { "no node yet".to_owned() } else { st.node.clone() };
        bar.set_message(format!("{:<10} on {where_}", st.phase));
        if st.total > 0 {
            bar.set_length(st.total);
        }
        bar.set_position(st.done);
        if !tty && printed.elapsed() >= Duration::from_secs(1) && last_line.as_ref() != Some(&st) {
            let (at, before) = last_bytes;
            let rate = st.done.saturating_sub(before) as f64 / at.elapsed().as_secs_f64() / 1e6;
            println!(
                "  {:>5.1}s  {:<10} on {where_:<8} {:>8.1}/{:.1} MB  {rate:>6.1} MB/s",
                start.elapsed().as_secs_f64(),
                st.phase,
                st.done as f64 / 1e6,
                st.total as f64 / 1e6,
            );
            printed = Instant::now();
            last_bytes = (Instant::now(), st.done);
            last_line = Some(st.clone());
        }
        if st.terminal {
            let moving = moving_since.map_or(Duration::ZERO, |t| t.elapsed());
            let elapsed = start.elapsed();
            break Ok(Finished { object: obj, status: st, elapsed, moving, first_progress });
        }
        tokio::time::sleep(POLL).await;
    };
    bar.finish_and_clear();
    let done = result?;
    if done.status.phase != "Completed" {
        bail!("{name} ended {}: {}", done.status.phase, done.status.message);
    }
    Ok(done)
}
