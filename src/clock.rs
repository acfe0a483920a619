//! A clock that keeps counting through system suspend.
//!
//! Lease deadlines are measured on `CLOCK_BOOTTIME`: `Instant` (`CLOCK_MONOTONIC`) stops while
//! the machine sleeps, but the etcd server's lease keeps running out, so a deadline on the
//! monotonic clock would be late by the length of the suspend.

use std::time::Duration;

/// A point on `CLOCK_BOOTTIME`, in nanoseconds since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(u64);

impl BootInstant {
    pub fn now() -> BootInstant {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we own.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        assert_eq!(
            rc, 0,
            "CLOCK_BOOTTIME is available on every supported kernel"
        );
        BootInstant(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }

    pub const fn from_nanos(ns: u64) -> BootInstant {
        BootInstant(ns)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: BootInstant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// Time left until `self`, zero if it has passed.
    pub fn remaining(self) -> Duration {
        self.saturating_since(BootInstant::now())
    }

    pub fn has_passed(self) -> bool {
        BootInstant::now() >= self
    }

    pub fn plus(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(d.as_nanos() as u64))
    }

    pub fn minus(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_sub(d.as_nanos() as u64))
    }

    /// Signed distance `self - other` in milliseconds (for logs and metrics).
    pub fn millis_after(self, other: BootInstant) -> i64 {
        (self.0 as i128 - other.0 as i128).clamp(i64::MIN as i128 * 1_000_000, i64::MAX as i128)
            as i64
            / 1_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = BootInstant::from_nanos(5_000_000_000);
        assert_eq!(t.minus(Duration::from_secs(10)).as_nanos(), 0);
        assert_eq!(
            t.plus(Duration::from_secs(1)).saturating_since(t),
            Duration::from_secs(1)
        );
        assert_eq!(
            t.saturating_since(t.plus(Duration::from_secs(1))),
            Duration::ZERO
        );
        assert_eq!(t.millis_after(t.plus(Duration::from_millis(250))), -250);
    }

    #[test]
    fn now_moves_forward() {
        let a = BootInstant::now();
        let b = BootInstant::now();
        assert!(b >= a);
    }
}
