//! The arithmetic of D, without I/O: when keepalives go out and how long each may take
//! ([`Renewal`]), which lease settings are safe, the deadline an answer buys, and how a lease
//! is lost ([`Loss`]).

use std::time::Duration;

use anyhow::Result;

use crate::clock::{human, BootInstant};
use crate::exit::{fail, Exit};

/// How many renewal attempts must fit between a missed keepalive and SIGTERM.
pub const RENEWAL_ATTEMPTS: u32 = 3;
/// The shortest time one renewal attempt may be given before it is retried elsewhere.
pub const MIN_RENEWAL_TIMEOUT: Duration = Duration::from_millis(100);
/// The longest: a keepalive answers in milliseconds; waiting longer only eats the budget.
const MAX_RENEWAL_TIMEOUT: Duration = Duration::from_secs(1);

/// When keepalives go out and how long each may take.
///
/// The job may run until SIGTERM at `D − grace = last good send + TTL − margin − grace`: call
/// `TTL − margin − grace` the window. A keepalive goes out every third of the window, so an
/// etcd outage (a leader election, a dead member) of up to two thirds of it costs nothing. If
/// one gets no answer within `timeout`, another goes out at once on the next endpoint, while
/// the first may still answer; `timeout` is chosen so that [`RENEWAL_ATTEMPTS`] of them fit
/// between the missed keepalive and SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    pub interval: Duration,
    pub timeout: Duration,
    /// The granted TTL and the safety margin, which turn a renewal's send time into D.
    pub ttl: Duration,
    pub margin: Duration,
}

impl Renewal {
    pub fn plan(ttl: Duration, grace: Duration, margin: Duration) -> Renewal {
        let interval = Renewal::window(ttl, grace, margin) / 3;
        let budget = Renewal::budget(ttl, grace, margin);
        Renewal {
            interval,
            timeout: (budget / RENEWAL_ATTEMPTS).min(MAX_RENEWAL_TIMEOUT),
            ttl,
            margin,
        }
    }

    /// From a renewal's send time to the SIGTERM it allows.
    pub fn window(ttl: Duration, grace: Duration, margin: Duration) -> Duration {
        ttl.saturating_sub(grace + margin)
    }

    /// Room before SIGTERM for the retries of one missed keepalive.
    pub fn budget(ttl: Duration, grace: Duration, margin: Duration) -> Duration {
        let w = Renewal::window(ttl, grace, margin);
        w - w / 3
    }
}

/// The lowest TTL etcd grants with default election timeouts.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// Refuses lease settings under which the job could outlive the lease, or could not survive
/// one lost keepalive.
///
/// The job gets SIGTERM at `D - grace` and SIGKILL at `D`, where
/// `D = send time of the last good keepalive + TTL - margin`. Keepalives go out every third of
/// the window `TTL - margin - grace` (see [`Renewal`]); the two thirds left after a missed one
/// must hold [`RENEWAL_ATTEMPTS`] attempts of at least [`MIN_RENEWAL_TIMEOUT`], so that one
/// lost reply or one etcd leader election does not cost the job.
pub fn check_lease_safety(ttl: Duration, grace: Duration, margin: Duration) -> Result<()> {
    if ttl < MIN_TTL {
        return Err(fail(
            Exit::Usage,
            format!(
                "--ttl {} is below etcd's minimum lease of 2s",
                crate::clock::human(ttl)
            ),
        ));
    }
    let budget = Renewal::budget(ttl, grace, margin);
    if budget < MIN_RENEWAL_TIMEOUT * RENEWAL_ATTEMPTS {
        // The smallest window whose last two thirds hold the attempts.
        let need = MIN_RENEWAL_TIMEOUT * RENEWAL_ATTEMPTS * 3 / 2;
        return Err(fail(
            Exit::Usage,
            format!(
                "unsafe lease settings: --ttl {} minus --grace {} and --safety-margin {} leaves {} before SIGTERM; at least {} is needed to renew with {} retries of {}",
                human(ttl),
                human(grace),
                human(margin),
                human(Renewal::window(ttl, grace, margin)),
                human(need),
                RENEWAL_ATTEMPTS,
                human(MIN_RENEWAL_TIMEOUT),
            ),
        ));
    }
    Ok(())
}

/// The deadline a renewal sent at `sent` and answered with `ttl` buys: the server cannot
/// have renewed before the request reached it, so its expiry is at least `sent + ttl`.
pub fn renewed_deadline(sent: BootInstant, ttl: Duration, margin: Duration) -> BootInstant {
    sent.plus(ttl).minus(margin)
}

/// Whether a job may start with deadline `d` at `now`: it must be able to run until SIGTERM
/// is due (`d − grace`) for at least one keepalive interval, so that one renewal can land
/// before that. Anything less, and the job would be told to stop the moment it starts.
pub fn enough_left(now: BootInstant, d: BootInstant, grace: Duration, interval: Duration) -> bool {
    d.saturating_since(now) >= grace + interval
}

/// The deadline a positive keepalive answer gives: `sent + ttl − margin`, if that moves D
/// forward. A late or reordered answer never moves it back.
pub fn renewed(
    current: BootInstant,
    sent: BootInstant,
    ttl: Duration,
    margin: Duration,
) -> Option<BootInstant> {
    let d = renewed_deadline(sent, ttl, margin);
    (ttl > Duration::ZERO && d > current).then_some(d)
}

/// How leadership (or candidacy) was lost, without us asking for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// etcd answered a keepalive with TTL 0: the lease is gone (expired or revoked).
    Expired,
    /// No keepalive succeeded in time; the local deadline D passed.
    Deadline,
    /// Our candidate key was deleted (an operator, `resign`, or a revoke).
    KeyDeleted,
}

impl Loss {
    pub fn as_str(self) -> &'static str {
        match self {
            Loss::Expired => "lease expired",
            Loss::Deadline => "renewal deadline passed",
            Loss::KeyDeleted => "leader key deleted",
        }
    }

    /// The value of the metrics' `reason` label: no spaces, as Prometheus label values go.
    pub fn label(self) -> &'static str {
        match self {
            Loss::Expired => "lease_expired",
            Loss::Deadline => "renewal_deadline_passed",
            Loss::KeyDeleted => "leader_key_deleted",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_safe() {
        check_lease_safety(secs(10), secs(3), secs(1)).unwrap();
    }

    #[test]
    fn ttl_below_two_seconds_is_refused() {
        let e = check_lease_safety(Duration::from_millis(1500), Duration::ZERO, Duration::ZERO)
            .unwrap_err();
        assert!(e.to_string().contains("below etcd's minimum"));
    }

    #[test]
    fn grace_plus_margin_must_leave_a_window_in_the_ttl() {
        let e = check_lease_safety(secs(4), secs(3), secs(1)).unwrap_err();
        assert!(e.to_string().contains("unsafe lease settings"), "{e}");
        check_lease_safety(secs(5), secs(3), secs(1)).unwrap();
    }

    #[test]
    fn three_renewal_attempts_must_fit_before_sigterm() {
        // A 400ms window: renewing every 133ms leaves 267ms, not 3 attempts of 100ms.
        let e = check_lease_safety(
            secs(3),
            Duration::from_millis(2400),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(e.to_string().contains("leaves 400ms before SIGTERM"), "{e}");
        assert!(e.to_string().contains("at least 450ms"), "{e}");
        check_lease_safety(
            secs(3),
            Duration::from_millis(2350),
            Duration::from_millis(200),
        )
        .unwrap();
    }

    fn secs(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn defaults_fit_three_renewal_attempts_before_sigterm() {
        let (ttl, grace, margin) = (ms(10_000), ms(3_000), ms(1_000));
        let p = Renewal::plan(ttl, grace, margin);
        assert_eq!(p.interval, ms(2_000));
        assert_eq!(p.timeout, MAX_RENEWAL_TIMEOUT);
        // The last attempt ends no later than D − grace, counted from the last good send.
        let last_done = p.interval + p.timeout * RENEWAL_ATTEMPTS;
        assert!(last_done <= ttl - margin - grace, "{last_done:?}");
    }

    #[test]
    fn an_outage_of_two_thirds_of_the_window_is_ridden_through() {
        // ttl 4 s, grace 1 s, margin 1 s: a keepalive every 667 ms; an etcd leader election
        // of 1.3 s between two of them still leaves a renewal before SIGTERM.
        let (ttl, grace, margin) = (ms(4_000), ms(1_000), ms(1_000));
        let p = Renewal::plan(ttl, grace, margin);
        let window = ttl - grace - margin;
        assert!(window - p.interval >= ms(1_333), "{p:?}");
        assert!(p.timeout * RENEWAL_ATTEMPTS <= window - p.interval);
        assert!(p.timeout >= MIN_RENEWAL_TIMEOUT);
    }

    #[test]
    fn the_timeout_is_capped_for_long_ttls() {
        let p = Renewal::plan(ms(60_000), ms(3_000), ms(1_000));
        assert_eq!(p.timeout, MAX_RENEWAL_TIMEOUT);
    }

    #[test]
    fn no_window_means_no_time_for_retries() {
        let p = Renewal::plan(ms(4_000), ms(3_000), ms(1_000));
        assert_eq!(p.timeout, Duration::ZERO);
        assert_eq!(p.interval, Duration::ZERO);
    }

    #[test]
    fn a_renewal_counts_from_its_send_time() {
        let sent = BootInstant::from_nanos(5_000_000_000);
        let d = renewed_deadline(sent, ms(10_000), ms(1_000));
        assert_eq!(d, BootInstant::from_nanos(14_000_000_000));
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn deadline_only_moves_forward() {
        let d = BootInstant::from_nanos(10_000_000_000);
        let margin = Duration::from_millis(500);
        // An answer to a request sent earlier than the one D came from: no change.
        let early = BootInstant::from_nanos(6_000_000_000);
        assert_eq!(renewed(d, early, 3 * S, margin), None);
        let later = BootInstant::from_nanos(9_000_000_000);
        assert_eq!(
            renewed(d, later, 3 * S, margin),
            Some(BootInstant::from_nanos(11_500_000_000))
        );
        assert_eq!(renewed(d, later, Duration::ZERO, margin), None);
    }

    #[test]
    fn no_spawn_without_grace_and_one_renewal_left() {
        let d = BootInstant::from_nanos(10_000_000_000);
        let grace = Duration::from_millis(500);
        let at = |ms: u64| BootInstant::from_nanos(ms * 1_000_000);
        assert!(enough_left(at(8_500), d, grace, S));
        assert!(!enough_left(at(8_501), d, grace, S));
        // Inside the grace window, at D and after it.
        assert!(!enough_left(at(9_600), d, grace, S));
        assert!(!enough_left(at(10_000), d, grace, S));
        assert!(!enough_left(at(12_000), d, grace, S));
    }
}
