//! Retention policies for `ferry forget --keep-*`: which snapshots of a group (same host and
//! source) to keep. Calendar buckets are in UTC.
//!
//! Each rule looks at the group's snapshots newest first and keeps, independently of the
//! other rules: `last` the N newest; `hourly`..`yearly` the newest snapshot of each of the N
//! most recent hours (days, ISO weeks, months, years) that have one; `within` every snapshot
//! no older than the span before the group's newest; `tags` every snapshot carrying one of
//! the tags. A snapshot no rule keeps is forgotten.

use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, Zoned};

/// The rules; an empty policy keeps nothing (callers refuse it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Policy {
    pub(crate) last: u32,
    pub(crate) hourly: u32,
    pub(crate) daily: u32,
    pub(crate) weekly: u32,
    pub(crate) monthly: u32,
    pub(crate) yearly: u32,
    pub(crate) within: Option<Span>,
    pub(crate) tags: Vec<(String, String)>,
}

impl Policy {
    /// Whether no rule is set.
    pub(crate) fn is_empty(&self) -> bool {
        let counts = [self.last, self.hourly, self.daily, self.weekly, self.monthly, self.yearly];
        counts.iter().all(|n| *n == 0) && self.within.is_none() && self.tags.is_empty()
    }
}

/// One snapshot as the policy sees it.
#[derive(Debug, Clone)]
pub(crate) struct Candidate<'a> {
    pub(crate) time: Timestamp,
    pub(crate) tags: &'a [(String, String)],
}

/// Why a snapshot is kept (the rules that chose it); empty: forget it.
pub(crate) type Reasons = Vec<&'static str>;

type Bucket = fn(&Zoned) -> (i32, i32, i32, i32);

const CALENDAR: [(&str, Bucket); 5] = [
    ("hourly", |z| {
        (i32::from(z.year()), i32::from(z.month()), i32::from(z.day()), i32::from(z.hour()))
    }),
    ("daily", |z| (i32::from(z.year()), i32::from(z.month()), i32::from(z.day()), 0)),
    ("weekly", |z| {
        let w = z.date().iso_week_date();
        (i32::from(w.year()), i32::from(w.week()), 0, 0)
    }),
    ("monthly", |z| (i32::from(z.year()), i32::from(z.month()), 0, 0)),
    ("yearly", |z| (i32::from(z.year()), 0, 0, 0)),
];

/// The reasons to keep each of `group` (any order; answers in the same order).
///
/// # Errors
/// `within` reaches outside the representable time range.
pub(crate) fn apply(policy: &Policy, group: &[Candidate<'_>]) -> Result<Vec<Reasons>, String> {
    let mut order: Vec<usize> = (0..group.len()).collect();
    order.sort_by(|a, b| group[*b].time.cmp(&group[*a].time));
    let mut reasons = vec![Reasons::new(); group.len()];
    for &i in order.iter().take(policy.last as usize) {
        reasons[i].push("last");
    }
    let counts = [policy.hourly, policy.daily, policy.weekly, policy.monthly, policy.yearly];
    for ((name, bucket), count) in CALENDAR.iter().zip(counts) {
        let mut used = 0;
        let mut previous = None;
        for &i in &order {
            if used == count {
                break;
            }
            let key = bucket(&group[i].time.to_zoned(TimeZone::UTC));
            if previous != Some(key) {
                reasons[i].push(name);
                used += 1;
                previous = Some(key);
            }
        }
    }
    if let (Some(span), Some(&newest)) = (policy.within, order.first()) {
        let since = group[newest]
            .time
            .to_zoned(TimeZone::UTC)
            .checked_sub(span)
            .map_err(|e| format!("--keep-within {span}: {e}"))?
            .timestamp();
        for &i in &order {
            if group[i].time >= since {
                reasons[i].push("within");
            }
        }
    }
    for (i, c) in group.iter().enumerate() {
        if policy.tags.iter().any(|t| c.tags.contains(t)) {
            reasons[i].push("tag");
        }
    }
    Ok(reasons)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    fn kept(policy: &Policy, times: &[&str]) -> Vec<bool> {
        let group: Vec<Candidate<'_>> =
            times.iter().map(|t| Candidate { time: at(t), tags: &[] }).collect();
        apply(policy, &group).expect("apply").iter().map(|r| !r.is_empty()).collect()
    }

    #[test]
    fn last_keeps_the_newest_whatever_the_order() {
        let policy = Policy { last: 2, ..Policy::default() };
        let times = [
            "2026-01-02T00:00:00Z",
            "2026-01-04T00:00:00Z",
            "2026-01-01T00:00:00Z",
            "2026-01-03T00:00:00Z",
        ];
        assert_eq!(kept(&policy, &times), [false, true, false, true]);
    }

    #[test]
    fn daily_keeps_the_newest_of_each_recent_day_with_a_snapshot() {
        let policy = Policy { daily: 2, ..Policy::default() };
        let times = [
            "2026-03-10T23:00:00Z", // newest of the 10th: kept
            "2026-03-10T01:00:00Z",
            "2026-03-08T12:00:00Z", // the 9th has none: the 8th is the second day
            "2026-03-08T06:00:00Z",
            "2026-03-07T12:00:00Z", // a third day: beyond the count
        ];
        assert_eq!(kept(&policy, &times), [true, false, true, false, false]);
    }

    #[test]
    fn weeks_are_iso_weeks_and_months_and_years_are_calendar_ones() {
        // Sunday 2026-01-04 and Monday 2026-01-05 are in different ISO weeks.
        let weekly = Policy { weekly: 5, ..Policy::default() };
        let times = ["2026-01-05T00:00:00Z", "2026-01-04T23:59:59Z", "2026-01-01T00:00:00Z"];
        assert_eq!(kept(&weekly, &times), [true, true, false]);
        // Monday 2025-12-29 opens ISO week 2026-W01 (with New Year's Day); Sunday the 28th
        // closes 2025-W52.
        let times = ["2026-01-01T00:00:00Z", "2025-12-29T00:00:00Z", "2025-12-28T23:59:59Z"];
        assert_eq!(kept(&weekly, &times), [true, false, true]);
        let monthly = Policy { monthly: 5, ..Policy::default() };
        let times = ["2026-02-01T00:00:00Z", "2026-01-31T23:59:59Z", "2026-01-01T00:00:00Z"];
        assert_eq!(kept(&monthly, &times), [true, true, false]);
        let yearly = Policy { yearly: 1, ..Policy::default() };
        let times = ["2025-12-31T23:59:59Z", "2026-01-01T00:00:00Z"];
        assert_eq!(kept(&yearly, &times), [false, true]);
        let hourly = Policy { hourly: 2, ..Policy::default() };
        let times = [
            "2026-01-01T10:59:00Z",
            "2026-01-01T10:01:00Z",
            "2026-01-01T09:30:00Z",
            "2026-01-01T08:00:00Z",
        ];
        assert_eq!(kept(&hourly, &times), [true, false, true, false]);
    }

    #[test]
    fn within_counts_back_from_the_newest_snapshot_not_from_now() {
        let span: Span = "3 days".parse().expect("span");
        let policy = Policy { within: Some(span), ..Policy::default() };
        let times = ["2020-05-10T00:00:00Z", "2020-05-07T00:00:00Z", "2020-05-06T23:59:59Z"];
        assert_eq!(kept(&policy, &times), [true, true, false]);
        let months: Span = "1 month".parse().expect("span");
        let policy = Policy { within: Some(months), ..Policy::default() };
        let times = ["2020-03-31T00:00:00Z", "2020-02-29T00:00:00Z", "2020-02-28T00:00:00Z"];
        assert_eq!(kept(&policy, &times), [true, true, false]);
    }

    #[test]
    fn rules_add_up_and_tags_keep_regardless_of_age() {
        let keep = vec![("keep".to_owned(), "yes".to_owned())];
        let policy = Policy { last: 1, daily: 1, tags: keep.clone(), ..Policy::default() };
        let group = [
            Candidate { time: at("2026-01-03T00:00:00Z"), tags: &[] },
            Candidate { time: at("2000-01-01T00:00:00Z"), tags: &keep },
            Candidate { time: at("2026-01-02T00:00:00Z"), tags: &[] },
        ];
        let reasons = apply(&policy, &group).expect("apply");
        assert_eq!(reasons, [vec!["last", "daily"], vec!["tag"], vec![]]);
        assert!(Policy::default().is_empty() && !policy.is_empty());
        assert_eq!(apply(&policy, &[]).expect("empty group"), Vec::<Reasons>::new());
    }
}
