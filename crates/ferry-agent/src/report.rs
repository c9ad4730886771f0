//! Progress in words, for the CR's Events: how far the movement is, how fast it goes, when it
//! should end, and what became of the bytes (read, skipped as known, deduplicated, uploaded).
//! Velero's own mover reports only bytes done of total.

use std::time::Duration;

use crate::ProgressSnapshot;

/// Which way the data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    Upload,
    Download,
}

impl Direction {
    /// The direction of a CR kind: DataDownloads restore, everything else backs up.
    pub(crate) fn of(kind: &str) -> Self {
        if kind == "DataDownload" { Self::Download } else { Self::Upload }
    }
}

/// `bytes` in binary units, one decimal: `512 B`, `3.5 KiB`, `1.2 GiB`.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A duration for people: `45s`, `3m05s`, `2h07m`.
pub(crate) fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Bytes per second as `MB/s` (decimal, as disks and networks are rated).
fn throughput(bytes: u64, elapsed: Duration) -> Option<f64> {
    let secs = elapsed.as_secs_f64();
    (secs >= 0.001).then(|| bytes as f64 / secs / 1e6)
}

/// The time left at the average rate so far; `None` while the total or the rate is unknown.
pub(crate) fn eta(r: &ProgressSnapshot, elapsed: Duration) -> Option<Duration> {
    if r.total_bytes == 0 || r.bytes_done == 0 || r.bytes_done >= r.total_bytes {
        return None;
    }
    let per_byte = elapsed.as_secs_f64() / r.bytes_done as f64;
    let left = (r.total_bytes - r.bytes_done) as f64 * per_byte;
    left.is_finite().then(|| Duration::from_secs_f64(left.min(1e9)))
}

/// What became of the bytes so far, or `None` when the data path did not tell.
fn breakdown(direction: Direction, r: &ProgressSnapshot) -> Option<String> {
    if r.bytes_read == 0 && r.bytes_skipped == 0 && r.bytes_new == 0 {
        return None;
    }
    Some(match direction {
        Direction::Upload => {
            let deduplicated =
                r.bytes_done.saturating_sub(r.bytes_skipped).saturating_sub(r.bytes_new);
            format!(
                "read {}, skipped {} (unchanged, unallocated or zero), deduplicated {}, uploaded {} new",
                human(r.bytes_read),
                human(r.bytes_skipped),
                human(deduplicated),
                human(r.bytes_new)
            )
        }
        Direction::Download => format!(
            "written {}, skipped {} (zero ranges left unwritten)",
            human(r.bytes_read),
            human(r.bytes_skipped)
        ),
    })
}

/// A Progress event's note: `1.2 GiB of 4.0 GiB (30%) at 85.3 MB/s, about 35s left; read …`.
pub(crate) fn progress_note(
    direction: Direction,
    r: &ProgressSnapshot,
    elapsed: Duration,
) -> String {
    let mut note = if r.total_bytes > 0 {
        let percent =
            (r.bytes_done.min(r.total_bytes) as f64 * 100.0 / r.total_bytes as f64).floor();
        format!("{} of {} ({percent:.0}%)", human(r.bytes_done), human(r.total_bytes))
    } else {
        format!("{} so far, total not known yet", human(r.bytes_done))
    };
    if let Some(rate) = throughput(r.bytes_done, elapsed) {
        note.push_str(&format!(" at {rate:.1} MB/s"));
    }
    if let Some(left) = eta(r, elapsed) {
        note.push_str(&format!(", about {} left", human_duration(left)));
    }
    if let Some(b) = breakdown(direction, r) {
        note.push_str("; ");
        note.push_str(&b);
    }
    note
}

/// The Completed event's addition: `2.0 GiB in 24s (89.5 MB/s); read …`.
pub(crate) fn final_note(direction: Direction, r: &ProgressSnapshot, elapsed: Duration) -> String {
    let mut note = format!("{} in {}", human(r.bytes_done), human_duration(elapsed));
    if let Some(rate) = throughput(r.bytes_done, elapsed) {
        note.push_str(&format!(" ({rate:.1} MB/s)"));
    }
    if let Some(b) = breakdown(direction, r) {
        note.push_str("; ");
        note.push_str(&b);
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn reading(total: u64, done: u64, read: u64, skipped: u64, new: u64) -> ProgressSnapshot {
        ProgressSnapshot {
            total_bytes: total,
            bytes_done: done,
            bytes_read: read,
            bytes_skipped: skipped,
            bytes_new: new,
        }
    }

    #[test]
    fn sizes_and_durations_read_naturally() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(300 * MIB), "300.0 MiB");
        assert_eq!(human(5 << 30), "5.0 GiB");
        assert_eq!(human(u64::MAX), "16.0 EiB");
        assert_eq!(human_duration(Duration::from_secs(45)), "45s");
        assert_eq!(human_duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(human_duration(Duration::from_secs(7620)), "2h07m");
    }

    #[test]
    fn eta_follows_the_average_rate_and_is_absent_when_unknown() {
        let r = reading(400 * MIB, 100 * MIB, 0, 0, 0);
        assert_eq!(eta(&r, Duration::from_secs(10)), Some(Duration::from_secs(30)));
        assert_eq!(eta(&reading(0, 100, 0, 0, 0), Duration::from_secs(10)), None);
        assert_eq!(eta(&reading(100, 0, 0, 0, 0), Duration::from_secs(10)), None);
        assert_eq!(eta(&reading(100, 100, 0, 0, 0), Duration::from_secs(10)), None);
    }

    #[test]
    fn upload_note_divides_the_bytes() {
        // 1 GiB of 4 GiB done in 10 s: 256 MiB skipped, 512 MiB read of which 128 MiB new.
        let r = reading(4 << 30, 1 << 30, 768 * MIB, 256 * MIB, 128 * MIB);
        let note = progress_note(Direction::Upload, &r, Duration::from_secs(10));
        assert_eq!(
            note,
            "1.0 GiB of 4.0 GiB (25%) at 107.4 MB/s, about 30s left; read 768.0 MiB, skipped \
             256.0 MiB (unchanged, unallocated or zero), deduplicated 640.0 MiB, uploaded \
             128.0 MiB new"
        );
    }

    #[test]
    fn download_note_and_unknown_totals() {
        let r = reading(0, 3 * MIB, 0, 0, 0);
        assert_eq!(
            progress_note(Direction::Download, &r, Duration::ZERO),
            "3.0 MiB so far, total not known yet"
        );
        let r = reading(8 * MIB, 8 * MIB, 6 * MIB, 2 * MIB, 0);
        assert_eq!(
            final_note(Direction::Download, &r, Duration::from_secs(2)),
            "8.0 MiB in 2s (4.2 MB/s); written 6.0 MiB, skipped 2.0 MiB (zero ranges left \
             unwritten)"
        );
    }
}
