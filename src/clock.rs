//! A clock that keeps counting through system suspend.
//!
//! Lease deadlines are measured on `CLOCK_BOOTTIME`: `Instant` (`CLOCK_MONOTONIC`) stops while
//! the machine sleeps, but the etcd server's lease keeps running out, so a deadline on the
//! monotonic clock would be late by the length of the suspend.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
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

/// A one-shot timer on `CLOCK_BOOTTIME` (a timerfd), armed at absolute instants, so that a
/// deadline fires on time even across a suspend. Readable once it has fired.
pub struct BootTimer(OwnedFd);

impl BootTimer {
    pub fn new() -> std::io::Result<BootTimer> {
        // SAFETY: returns a new descriptor or -1.
        let fd = unsafe {
            libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK)
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that we own.
        Ok(BootTimer(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Arms the timer at `at` (or disarms it).
    pub fn arm(&self, at: Option<BootInstant>) -> std::io::Result<()> {
        let ns = at.map_or(0, |t| t.as_nanos().max(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: valid descriptor and itimerspec.
        let rc = unsafe {
            libc::timerfd_settime(
                self.0.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consumes a pending expiry, so that the descriptor is no longer readable.
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        // SAFETY: reading 8 bytes into our buffer from a non-blocking timerfd.
        unsafe { libc::read(self.0.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
    }
}

impl AsRawFd for BootTimer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Sleeps until `t` (a tokio instant), or forever without one: an optional deadline such as
/// `--wait`'s, as one arm of a `select!`.
pub async fn until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// A duration for people: to the nearest millisecond ("667ms", not "666ms 666us 666ns").
pub fn human(d: Duration) -> humantime::FormattedDuration {
    // To the nearest millisecond: a timer's remaining 1.999999913 s reads "2s", not
    // "1s 999ms 999us 913ns".
    let ms = if d < Duration::from_millis(1) {
        d
    } else {
        Duration::from_millis(((d.as_nanos() + 500_000) / 1_000_000).min(u64::MAX as u128) as u64)
    };
    humantime::format_duration(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_shown_to_the_nearest_millisecond() {
        assert_eq!(human(Duration::from_nanos(1_999_999_913)).to_string(), "2s");
        assert_eq!(
            human(Duration::from_micros(1_500_400)).to_string(),
            "1s 500ms"
        );
        assert_eq!(human(Duration::from_nanos(300)).to_string(), "300ns");
        // The longest duration there is still formats.
        assert!(!human(Duration::MAX).to_string().is_empty());
    }

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
