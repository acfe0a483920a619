//! The arithmetic of `run --every`: which period a moment belongs to, and the names of that
//! period's start (the run key and RFC 3339), without a date library.
//!
//! Periods start at every multiple of PERIOD since the Unix epoch, shifted by OFFSET. A moment
//! belongs to the period whose start is *nearest* to it (halfway goes to the later one), not
//! to the one it falls in: cron fires a tick at a period's start on every worker, and a worker
//! whose clock runs a second late would otherwise name the period before. So clocks that read
//! within PERIOD/2 of a start all name that start.
//!
//! Everything is UTC. A Unix time has no time zone and no daylight saving time: every worker
//! names the same start whatever its local zone, and no local hour repeats or goes missing.
//!
//! Only [`now_unix_ms`] reads anything; the rest are pure functions.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The grid of period starts: every `period` since the Unix epoch, shifted by `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    period_ms: i128,
    offset_ms: i128,
}

/// One period, as the job and the run key name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    /// The start, in seconds since the Unix epoch.
    pub start_unix_s: i64,
    /// The start as a run key: compact UTC, `20261206T0100Z` (seconds only when the start is
    /// not on a whole minute: `20261206T010030Z`).
    pub key: String,
    /// The start in RFC 3339, UTC: `2026-12-06T01:00:00Z`.
    pub start: String,
    /// The period's length, in seconds.
    pub length_s: i64,
}

impl Period {
    /// When the period is over, in Unix milliseconds: the next one starts.
    pub fn over_at_ms(&self) -> i64 {
        self.start_unix_s
            .saturating_add(self.length_s)
            .saturating_mul(1000)
    }
}

impl Grid {
    /// A grid of whole seconds: `None` unless `period` is a positive whole number of seconds
    /// and `offset` a whole number of seconds shorter than it.
    pub fn new(period: Duration, offset: Duration) -> Option<Grid> {
        let whole = |d: Duration| d.subsec_nanos() == 0;
        if period.is_zero() || !whole(period) || !whole(offset) || offset >= period {
            return None;
        }
        Some(Grid {
            period_ms: i128::from(period.as_secs()) * 1000,
            offset_ms: i128::from(offset.as_secs()) * 1000,
        })
    }

    /// The start of the period that `unix_ms` (milliseconds since the Unix epoch, negative
    /// before it) belongs to: the start nearest to it, the later one at exactly halfway. In
    /// seconds since the epoch.
    pub fn start_of(&self, unix_ms: i64) -> i64 {
        let (p, o) = (self.period_ms, self.offset_ms);
        // The period is whole seconds, so its half is whole milliseconds.
        let k = (i128::from(unix_ms) - o + p / 2).div_euclid(p);
        let start_ms = o + k * p;
        // Within a period of `unix_ms`: far inside i64 seconds.
        i64::try_from(start_ms.div_euclid(1000)).unwrap_or(i64::MAX)
    }

    /// The period that `unix_ms` belongs to (see [`Grid::start_of`]), named.
    pub fn period_at(&self, unix_ms: i64) -> Period {
        let start_unix_s = self.start_of(unix_ms);
        Period {
            start_unix_s,
            key: run_key(start_unix_s),
            start: rfc3339(start_unix_s),
            length_s: i64::try_from(self.period_ms / 1000).unwrap_or(i64::MAX),
        }
    }
}

/// A moment in UTC, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utc {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

/// `unix_s` (seconds since the Unix epoch) in UTC, in the proleptic Gregorian calendar. No
/// leap seconds: Unix time has none.
pub fn utc(unix_s: i64) -> Utc {
    let days = unix_s.div_euclid(86_400);
    let secs = unix_s.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    Utc {
        year,
        month,
        day,
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
    }
}

/// The date (year, month 1-12, day 1-31) of day `z` counted from 1970-01-01 (day 0; negative
/// before it), in the proleptic Gregorian calendar. Howard Hinnant's `civil_from_days`: the
/// year is counted from March, so that the leap day is the last of its year, in eras of 400
/// years (146,097 days), which repeat exactly.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    // Day 0 of era 0 is 0000-03-01, 719,468 days before 1970-01-01.
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146_096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era, 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of the March year, 0..=365
    let mp = (5 * doy + 2) / 153; // month from March, 0..=11
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A period's start as a run key: `20261206T0100Z`, or `20261206T010030Z` when the start is
/// not on a whole minute (a shorter key never names a start with seconds, so no two starts
/// share a key).
pub fn run_key(unix_s: i64) -> String {
    let t = utc(unix_s);
    let hm = format!(
        "{:04}{:02}{:02}T{:02}{:02}",
        t.year, t.month, t.day, t.hour, t.minute
    );
    if t.second == 0 {
        format!("{hm}Z")
    } else {
        format!("{hm}{:02}Z", t.second)
    }
}

/// RFC 3339 in UTC, to the second: `2026-12-06T01:00:00Z`.
pub fn rfc3339(unix_s: i64) -> String {
    let t = utc(unix_s);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// Shifts the clock [`now_unix_ms`] reads, in milliseconds, in debug builds only: tests start
/// workers whose clocks disagree, or whose clock stands at a chosen period, with it.
const TEST_SKEW_VAR: &str = "LEAD_EXEC_TEST_CLOCK_SKEW_MS";

/// The wall clock in milliseconds since the Unix epoch (negative before it): what `--every`
/// reads, once, at start-up.
pub fn now_unix_ms() -> i64 {
    let now = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    };
    let skew = crate::hooks::value::<i64>(TEST_SKEW_VAR).unwrap_or(0);
    now.saturating_add(skew)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 3_600;

    fn grid(period_s: u64, offset_s: u64) -> Grid {
        Grid::new(Duration::from_secs(period_s), Duration::from_secs(offset_s)).unwrap()
    }

    /// Seconds since the epoch of a UTC date and time, counted independently of
    /// [`civil_from_days`] (day by day from 1970), for the dates the tests name.
    fn unix(y: i64, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let month_days = |y: i64, m: u32| match m {
            2 if leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let mut days: i64 = 0;
        let year_days = |y: i64| if leap(y) { 366 } else { 365 };
        days += (1970..y).map(year_days).sum::<i64>();
        days -= (y..1970).map(year_days).sum::<i64>();
        for m in 1..mo {
            days += month_days(y, m);
        }
        days += i64::from(d) - 1;
        days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s)
    }

    #[test]
    fn grids_take_whole_seconds_and_an_offset_shorter_than_the_period() {
        let s = Duration::from_secs;
        assert!(Grid::new(s(3600), s(0)).is_some());
        assert!(Grid::new(s(3600), s(3599)).is_some());
        assert!(Grid::new(s(0), s(0)).is_none());
        assert!(Grid::new(s(3600), s(3600)).is_none());
        assert!(Grid::new(s(60), s(61)).is_none());
        assert!(Grid::new(Duration::from_millis(1500), s(0)).is_none());
        assert!(Grid::new(s(60), Duration::from_millis(500)).is_none());
    }

    #[test]
    fn the_period_is_the_nearest_start_not_the_one_before() {
        let g = grid(3600, 0);
        let one = unix(2026, 12, 6, 1, 0, 0);
        let ms = |s: i64| s * 1000;
        assert_eq!(g.start_of(ms(one)), one);
        // A clock a second late names the tick it was fired for, not the hour before.
        assert_eq!(g.start_of(ms(one) - 1000), one);
        assert_eq!(g.start_of(ms(one) + 1000), one);
        // Halfway goes to the later start; just before it, to the earlier.
        assert_eq!(g.start_of(ms(one + HOUR / 2)), one + HOUR);
        assert_eq!(g.start_of(ms(one + HOUR / 2) - 1), one);
        assert_eq!(g.start_of(ms(one) - ms(HOUR / 2)), one);
        assert_eq!(g.start_of(ms(one) - ms(HOUR / 2) - 1), one - HOUR);
    }

    #[test]
    fn the_job_gets_the_start_as_a_compact_key_and_in_rfc_3339() {
        let p = grid(3600, 0).period_at(unix(2026, 12, 6, 0, 59, 58) * 1000);
        assert_eq!(p.key, "20261206T0100Z");
        assert_eq!(p.start, "2026-12-06T01:00:00Z");
        assert_eq!(p.start_unix_s, unix(2026, 12, 6, 1, 0, 0));
        crate::election::validate_run_key(&p.key).unwrap();
        // A start off the whole minute keeps its seconds, so it cannot share a key.
        let p = grid(90, 0).period_at(unix(2026, 12, 6, 1, 1, 31) * 1000);
        assert_eq!(p.key, "20261206T010130Z");
        assert_eq!(p.start, "2026-12-06T01:01:30Z");
        crate::election::validate_run_key(&p.key).unwrap();
    }

    #[test]
    fn an_offset_shifts_the_grid() {
        // Daily at 02:30 UTC.
        let g = grid(86_400, 2 * 3600 + 1800);
        let p = g.period_at(unix(2026, 12, 6, 2, 29, 0) * 1000);
        assert_eq!(p.start, "2026-12-06T02:30:00Z");
        assert_eq!(p.key, "20261206T0230Z");
        // Twelve hours later is still closer to that 02:30 than to the next (halfway is
        // 14:30).
        let p = g.period_at(unix(2026, 12, 6, 14, 29, 59) * 1000);
        assert_eq!(p.start, "2026-12-06T02:30:00Z");
        let p = g.period_at(unix(2026, 12, 6, 14, 30, 0) * 1000);
        assert_eq!(p.start, "2026-12-07T02:30:00Z");
        // Every 5 minutes at 2 past: 00:02, 00:07, ...
        let g = grid(300, 120);
        let p = g.period_at(unix(2026, 1, 1, 0, 6, 10) * 1000);
        assert_eq!(p.key, "20260101T0007Z");
    }

    #[test]
    fn civil_dates_match_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(31 + 28), (1970, 3, 1));
        // 2000 is a leap year (divisible by 400), 2100 is not (by 100).
        assert_eq!(
            civil_from_days(unix(2000, 2, 29, 0, 0, 0) / 86_400),
            (2000, 2, 29)
        );
        assert_eq!(
            civil_from_days(unix(2000, 3, 1, 0, 0, 0) / 86_400),
            (2000, 3, 1)
        );
        assert_eq!(
            civil_from_days(unix(2100, 2, 28, 0, 0, 0) / 86_400 + 1),
            (2100, 3, 1)
        );
        assert_eq!(
            civil_from_days(unix(2026, 12, 6, 0, 0, 0) / 86_400),
            (2026, 12, 6)
        );
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(1_000_000_000), "2001-09-09T01:46:40Z");
        assert_eq!(rfc3339(unix(2026, 12, 6, 1, 0, 0)), "2026-12-06T01:00:00Z");
    }

    #[test]
    fn consecutive_days_are_consecutive_dates_for_four_centuries() {
        // One whole era of the Gregorian calendar, from 1900 on: every day follows the one
        // before, and a year's last day is the last of December.
        let mut prev = civil_from_days(unix(1900, 1, 1, 0, 0, 0) / 86_400 - 1);
        assert_eq!(prev, (1899, 12, 31));
        for z in unix(1900, 1, 1, 0, 0, 0) / 86_400..unix(2300, 1, 1, 0, 0, 0) / 86_400 {
            let (y, m, d) = civil_from_days(z);
            let next_day = (prev.0, prev.1, prev.2 + 1);
            let next_month = (prev.0, prev.1 + 1, 1);
            let next_year = (prev.0 + 1, 1, 1);
            assert!(
                (y, m, d) == next_day || (y, m, d) == next_month || (y, m, d) == next_year,
                "day {z}: {prev:?} then {:?}",
                (y, m, d)
            );
            if (y, m, d) == next_year {
                assert_eq!((prev.1, prev.2), (12, 31));
            }
            prev = (y, m, d);
        }
    }

    #[test]
    fn daylight_saving_time_plays_no_part() {
        // The nights the clocks change in the EU (2026-03-29, 2026-10-25, 01:00 UTC) and in
        // the US (2026-03-08 and 2026-11-01, 2:00 local): hourly ticks through each get 24
        // distinct keys one hour apart, none repeated and none missing, whatever the local
        // zone (nothing here reads it).
        let g = grid(3600, 0);
        for (y, m, d) in [(2026, 3, 29), (2026, 10, 25), (2026, 3, 8), (2026, 11, 1)] {
            let midnight = unix(y, m, d, 0, 0, 0);
            let keys: Vec<String> = (0..24)
                .map(|h| g.period_at((midnight + h * HOUR) * 1000 + 20_000).key)
                .collect();
            for (h, key) in keys.iter().enumerate() {
                assert_eq!(key, &format!("{y:04}{m:02}{d:02}T{h:02}00Z"));
            }
        }
        // And the offset is UTC too: daily at 01:00 is 01:00 UTC on either side of a change.
        let g = grid(86_400, 3600);
        assert_eq!(
            g.period_at(unix(2026, 3, 28, 1, 0, 0) * 1000).start,
            "2026-03-28T01:00:00Z"
        );
        assert_eq!(
            g.period_at(unix(2026, 3, 29, 1, 0, 0) * 1000).start,
            "2026-03-29T01:00:00Z"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { failure_persistence: None, cases: 2048, ..Default::default() })]

        /// Workers whose clocks are up to PERIOD/3 apart either side of a start all get that
        /// start's key: one run for the period, not one per worker.
        #[test]
        fn clocks_skewed_by_a_third_of_the_period_around_a_start_share_its_key(
            period_s in 1u64..=400 * 86_400,
            offset_frac in 0.0f64..1.0,
            k in -1_000i64..100_000,
            skews in proptest::collection::vec(-1.0f64..=1.0, 3),
        ) {
            let offset_s = ((period_s as f64 * offset_frac) as u64).min(period_s - 1);
            let g = grid(period_s, offset_s);
            let start_ms = (k * period_s as i64 + offset_s as i64) * 1000;
            let third_ms = (period_s * 1000 / 3) as i64;
            let want = g.period_at(start_ms);
            proptest::prop_assert_eq!(want.start_unix_s * 1000, start_ms);
            for skew in skews {
                let at = start_ms + (skew * third_ms as f64) as i64;
                proptest::prop_assert_eq!(&g.period_at(at), &want);
            }
        }

        /// The start is a grid point within half a period of the moment.
        #[test]
        fn the_start_is_the_nearest_grid_point(
            period_s in 1u64..=100 * 366 * 86_400,
            offset_frac in 0.0f64..1.0,
            now_ms in -4_000_000_000_000i64..8_000_000_000_000,
        ) {
            let offset_s = ((period_s as f64 * offset_frac) as u64).min(period_s - 1);
            let start = grid(period_s, offset_s).start_of(now_ms);
            let (p, o) = (period_s as i64, offset_s as i64);
            proptest::prop_assert_eq!((start - o).rem_euclid(p), 0);
            let d = now_ms - start * 1000;
            proptest::prop_assert!(-(p * 500) <= d && d < p * 500, "{} from {}", d, start);
        }

        /// The RFC 3339 form agrees with humantime's, which is written independently.
        #[test]
        fn rfc_3339_agrees_with_humantime(unix_s in 0i64..253_402_300_800) {
            let t = UNIX_EPOCH + Duration::from_secs(unix_s as u64);
            proptest::prop_assert_eq!(
                rfc3339(unix_s),
                humantime::format_rfc3339_seconds(t).to_string()
            );
        }

        /// Every key is a valid run key, and the key and the RFC 3339 form name the same start.
        #[test]
        fn keys_are_valid_run_keys_of_the_same_start(unix_s in 0i64..253_402_300_800) {
            let key = run_key(unix_s);
            crate::election::validate_run_key(&key).unwrap();
            let compact: String = rfc3339(unix_s).chars().filter(|c| *c != '-' && *c != ':').collect();
            let compact = compact.strip_suffix("00Z").map(|c| format!("{c}Z"));
            if unix_s % 60 == 0 {
                proptest::prop_assert_eq!(Some(key), compact);
            } else {
                proptest::prop_assert_eq!(key, rfc3339(unix_s).chars().filter(|c| *c != '-' && *c != ':').collect::<String>());
            }
        }
    }
}
