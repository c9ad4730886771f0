//! Progress display: a bar on a terminal, a log line every few seconds otherwise.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_repo::{Progress, ProgressFn};
use indicatif::{ProgressBar, ProgressStyle};

/// A progress reporter for one operation (`verb` is "backup" or "restore").
pub fn reporter(verb: &'static str) -> (ProgressFn, Option<ProgressBar>) {
    if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(verb);
        let shown = bar.clone();
        let f: ProgressFn = Arc::new(move |p: &Progress| {
            shown.set_length(p.bytes_total_estimate.max(p.bytes_done));
            shown.set_position(p.bytes_done);
            shown.set_message(format!("{}{} new", files(p), human(p.bytes_new)));
        });
        (f, Some(bar))
    } else {
        let last = Mutex::new(None::<Instant>);
        let started = Instant::now();
        let f: ProgressFn = Arc::new(move |p: &Progress| {
            let mut last = last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(2));
            if due || p.finished {
                *last = Some(Instant::now());
                let secs = started.elapsed().as_secs_f64().max(0.001);
                #[allow(
                    clippy::cast_precision_loss,
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss
                )]
                let rate = (p.bytes_done as f64 / secs) as u64; // Display only.
                eprintln!(
                    "{verb}: {} of {}, {}{} new, {}/s{}",
                    human(p.bytes_done),
                    human(p.bytes_total_estimate.max(p.bytes_done)),
                    files(p),
                    human(p.bytes_new),
                    human(rate),
                    if p.finished { ", done" } else { "" },
                );
            }
        });
        (f, None)
    }
}

/// "`done` of `total` files, " for a file tree; nothing for a volume (no files to count).
fn files(p: &Progress) -> String {
    if p.files_done == 0 && p.files_total_estimate == 0 {
        return String::new();
    }
    format!("{} of {} files, ", p.files_done, p.files_total_estimate)
}

/// Bytes in binary units, one decimal.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    #[allow(clippy::cast_precision_loss)] // Display only.
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}
