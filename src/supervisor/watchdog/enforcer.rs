//! The deadline enforcer: what the watchdog does to the job's group, decided without I/O.
//!
//! The watchdog's loop ([`super`]) turns the clock, lead-exec's orders and the
//! death of lead-exec into [`Input`]s, hands them to [`Enforcer::on`] with the time, and carries
//! out the [`GroupOp`] it gets back. Everything that makes the job stop in time is decided
//! here, so the invariants are tested below without a process:
//!
//! - D only moves forward: a stale or reordered extension cannot move it back;
//! - a stop is never revived: once the group is being stopped, no extension moves D;
//! - no job starts once SIGTERM is due ([`may_spawn`]), so never at or after D;
//! - SIGKILL goes out [`KILL_LEAD`] ahead of D, so the group is dead by D rather than just
//!   signalled at it.

use std::time::Duration;

use crate::clock::BootInstant;
use crate::supervisor::wire::{GroupEnd, Order};
use crate::supervisor::KILL_LEAD;

/// What happened, as the enforcer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Time passed: see what is due.
    Tick,
    /// An order from lead-exec.
    Order(Order),
    /// lead-exec is gone (pipe EOF or parent death): there is no leadership left to wait for.
    Orphaned,
    /// The job's main process exited but left members in its group (asked on every round of
    /// the loop while there are): they must not outlive the term.
    LeaderExited,
}

/// What to do to the job's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOp {
    Signal(i32),
    Kill,
}

/// Whether a job may still be started: not once SIGTERM is due, since it would be told to stop
/// at once (and never at or after D).
pub fn may_spawn(now: BootInstant, term_at: BootInstant) -> bool {
    now < term_at
}

/// The deadline schedule of one job and the stop under way, if any.
#[derive(Debug, Clone)]
pub struct Enforcer {
    grace: Duration,
    /// Lease deadlines from lead-exec: SIGTERM at `term_at`, SIGKILL ahead of `kill_at` (= D).
    term_at: BootInstant,
    kill_at: BootInstant,
    /// The lease deadline as lead-exec last renewed it, moved on after a stop too (where
    /// `kill_at` no longer moves): what a job's end is measured against, so that leftovers
    /// that outlive the deadline the stop began under, inside a lease still renewed, are not
    /// counted as past it.
    lease_until: BootInstant,
    /// SIGKILL time of a stop already under way (grace after its first signal).
    stop_kill_at: Option<BootInstant>,
    term_sent: bool,
    kill_sent: bool,
    /// Why the group is ending; `None` while the job runs normally.
    cause: Option<GroupEnd>,
}

impl Enforcer {
    pub fn new(grace: Duration, term_at: BootInstant, kill_at: BootInstant) -> Enforcer {
        Enforcer {
            grace,
            term_at,
            kill_at,
            lease_until: kill_at,
            stop_kill_at: None,
            term_sent: false,
            kill_sent: false,
            cause: None,
        }
    }

    /// The lease deadline D as it stands.
    pub fn deadline(&self) -> BootInstant {
        self.kill_at
    }

    /// The lease deadline as lead-exec last renewed it: the one a job's end is measured
    /// against (its slack), whether or not a stop froze [`Enforcer::deadline`].
    pub fn lease_deadline(&self) -> BootInstant {
        self.lease_until
    }

    /// Why the group is ending, once it is.
    pub fn cause(&self) -> Option<GroupEnd> {
        self.cause
    }

    /// When the loop must look again (`None` once SIGKILL went out: nothing is left to time).
    pub fn next_wake(&self) -> Option<BootInstant> {
        if self.kill_sent {
            return None;
        }
        let mut t = self.kill_by();
        if let Some(s) = self.stop_kill_at {
            t = t.min(s);
        }
        if !self.term_sent {
            t = t.min(self.term_at);
        }
        Some(t)
    }

    /// What `input` at `now` asks of the group.
    pub fn on(&mut self, now: BootInstant, input: Input) -> Option<GroupOp> {
        match input {
            Input::Tick => self.due(now),
            Input::Order(c) => self.order(c, now),
            Input::Orphaned => {
                if self.kill_sent {
                    return None;
                }
                self.cause.get_or_insert(GroupEnd::Orphaned);
                self.kill()
            }
            Input::LeaderExited if self.cause.is_none() => {
                self.stop(GroupEnd::SelfExit, libc::SIGTERM, now)
            }
            // Members still alive after a SIGKILL forked or moved since it went out (a chain
            // of processes that each fork and exit stays a step ahead of one walk of the
            // tree): kill again, on every round of the loop, until none is left. A process
            // with a SIGKILL pending cannot fork, so every round ends some chains.
            Input::LeaderExited if self.kill_sent => Some(GroupOp::Kill),
            Input::LeaderExited => None,
        }
    }

    fn kill_by(&self) -> BootInstant {
        self.kill_at.minus(KILL_LEAD)
    }

    fn due(&mut self, now: BootInstant) -> Option<GroupOp> {
        if self.kill_sent {
            return None;
        }
        if now >= self.kill_by() {
            self.cause.get_or_insert(GroupEnd::Deadline);
            return self.kill();
        }
        if self.stop_kill_at.is_some_and(|t| now >= t) {
            return self.kill();
        }
        if !self.term_sent && now >= self.term_at {
            return self.stop(GroupEnd::Deadline, libc::SIGTERM, now);
        }
        None
    }

    fn stop(&mut self, cause: GroupEnd, sig: i32, now: BootInstant) -> Option<GroupOp> {
        self.cause.get_or_insert(cause);
        self.term_sent = true;
        let t = now.plus(self.grace).min(self.kill_by());
        self.stop_kill_at = Some(self.stop_kill_at.map_or(t, |old| old.min(t)));
        Some(GroupOp::Signal(sig))
    }

    fn kill(&mut self) -> Option<GroupOp> {
        self.kill_sent = true;
        Some(GroupOp::Kill)
    }

    fn order(&mut self, c: Order, now: BootInstant) -> Option<GroupOp> {
        match c {
            Order::Deadline { term_at, kill_at } => {
                self.lease_until = self.lease_until.max(BootInstant::from_nanos(kill_at));
                // Once a stop is under way no extension revives the job; and D only moves
                // forward, so a stale or reordered extension cannot move it back and forth.
                if self.cause.is_none() {
                    self.term_at = self.term_at.max(BootInstant::from_nanos(term_at));
                    self.kill_at = self.kill_at.max(BootInstant::from_nanos(kill_at));
                }
                None
            }
            Order::Forward(sig) => Some(GroupOp::Signal(sig)),
            Order::Stop(sig) => self.stop(GroupEnd::Stop, sig, now),
            Order::Kill => {
                self.cause.get_or_insert(GroupEnd::Stop);
                if self.kill_sent {
                    return None;
                }
                self.kill()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_nanos(ms * 1_000_000)
    }

    /// SIGTERM at 9.5 s, D at 10 s, grace 0.5 s.
    fn enforcer() -> Enforcer {
        Enforcer::new(Duration::from_millis(500), at(9_500), at(10_000))
    }

    fn deadline(term_ms: u64, kill_ms: u64) -> Input {
        Input::Order(Order::Deadline {
            term_at: at(term_ms).as_nanos(),
            kill_at: at(kill_ms).as_nanos(),
        })
    }

    const TICK: Input = Input::Tick;

    #[test]
    fn sigterm_at_d_minus_grace_then_sigkill_ahead_of_d() {
        let mut e = enforcer();
        assert_eq!(e.on(at(9_000), TICK), None);
        assert_eq!(e.on(at(9_500), TICK), Some(GroupOp::Signal(libc::SIGTERM)));
        let kill = e.next_wake().unwrap();
        assert!(
            kill < at(10_000),
            "SIGKILL is due at {kill:?}, not before D"
        );
        assert_eq!(kill, at(10_000).minus(KILL_LEAD));
        assert_eq!(e.on(kill.minus(Duration::from_nanos(1)), TICK), None);
        assert_eq!(e.on(kill, TICK), Some(GroupOp::Kill));
        assert_eq!(e.cause(), Some(GroupEnd::Deadline));
        assert_eq!(e.next_wake(), None);
    }

    #[test]
    fn a_stop_is_never_revived() {
        let mut e = enforcer();
        assert_eq!(
            e.on(at(5_000), Input::Order(Order::Stop(libc::SIGTERM))),
            Some(GroupOp::Signal(libc::SIGTERM))
        );
        // An extension that was in flight when the stop began changes nothing.
        assert_eq!(e.on(at(5_001), deadline(60_000, 61_000)), None);
        assert_eq!(e.deadline(), at(10_000));
        assert_eq!(e.next_wake(), Some(at(5_500)));
        assert_eq!(e.on(at(5_500), TICK), Some(GroupOp::Kill));
        assert_eq!(e.on(at(5_600), deadline(60_000, 61_000)), None);
        assert_eq!(e.on(at(70_000), TICK), None);
        assert_eq!(e.cause(), Some(GroupEnd::Stop));
    }

    /// A stop freezes D for the group, not the lease: a renewal after it still counts for
    /// the slack of the job's end.
    #[test]
    fn slack_after_a_stop_is_measured_against_the_renewed_deadline() {
        let mut e = enforcer();
        e.on(at(5_000), Input::LeaderExited);
        assert_eq!(e.on(at(9_000), deadline(19_500, 20_000)), None);
        assert_eq!(e.deadline(), at(10_000), "the stop's deadline stays");
        assert_eq!(e.lease_deadline(), at(20_000));
        assert_eq!(e.lease_deadline().millis_after(at(12_000)), 8_000);
        // Stale renewals do not move it back.
        e.on(at(9_100), deadline(14_500, 15_000));
        assert_eq!(e.lease_deadline(), at(20_000));
    }

    #[test]
    fn d_only_moves_forward() {
        let mut e = enforcer();
        e.on(at(8_000), deadline(12_500, 13_000));
        assert_eq!((e.term_at, e.deadline()), (at(12_500), at(13_000)));
        e.on(at(8_100), deadline(9_500, 10_000));
        assert_eq!((e.term_at, e.deadline()), (at(12_500), at(13_000)));
        assert_eq!(e.on(at(12_000), TICK), None);
    }

    #[test]
    fn a_stop_close_to_d_still_kills_ahead_of_d() {
        let mut e = enforcer();
        e.on(at(9_900), Input::Order(Order::Stop(libc::SIGINT)));
        assert_eq!(e.next_wake(), Some(at(10_000).minus(KILL_LEAD)));
    }

    #[test]
    fn losing_lead_exec_kills_at_once_and_only_once() {
        let mut e = enforcer();
        assert_eq!(e.on(at(1), Input::Orphaned), Some(GroupOp::Kill));
        assert_eq!(e.cause(), Some(GroupEnd::Orphaned));
        assert_eq!(e.on(at(1), Input::Orphaned), None);
        assert_eq!(e.on(at(1), Input::Order(Order::Kill)), None);
    }

    #[test]
    fn members_left_behind_by_the_job_are_stopped_like_a_lost_lease() {
        let mut e = enforcer();
        assert_eq!(
            e.on(at(1_000), Input::LeaderExited),
            Some(GroupOp::Signal(libc::SIGTERM))
        );
        assert_eq!(e.cause(), Some(GroupEnd::SelfExit));
        assert_eq!(e.next_wake(), Some(at(1_500)));
        // Asked again on the next round of the loop: the stop is already under way.
        assert_eq!(e.on(at(1_010), Input::LeaderExited), None);
    }

    #[test]
    fn members_alive_after_the_sigkill_are_killed_again_on_every_round() {
        let mut e = enforcer();
        assert_eq!(
            e.on(at(1_000), Input::LeaderExited),
            Some(GroupOp::Signal(libc::SIGTERM))
        );
        assert_eq!(e.on(at(1_500), Input::Tick), Some(GroupOp::Kill));
        for t in [1_510, 1_520, 1_530] {
            assert_eq!(e.on(at(t), Input::LeaderExited), Some(GroupOp::Kill));
        }
        // Only the members left decide it: the timer and orders do not kill twice.
        assert_eq!(e.on(at(1_540), Input::Tick), None);
        assert_eq!(e.on(at(1_540), Input::Order(Order::Kill)), None);
    }

    #[test]
    fn no_spawn_once_sigterm_is_due() {
        assert!(may_spawn(at(9_499), at(9_500)));
        assert!(!may_spawn(at(9_500), at(9_500)));
        // After D, too.
        assert!(!may_spawn(at(10_001), at(9_500)));
    }

    fn input() -> impl Strategy<Value = Input> {
        prop_oneof![
            4 => Just(Input::Tick),
            4 => (0u64..30_000, 0u64..2_000)
                .prop_map(|(kill, lead)| deadline(kill.saturating_sub(lead), kill)),
            1 => Just(Input::Order(Order::Forward(libc::SIGHUP))),
            1 => Just(Input::Order(Order::Stop(libc::SIGTERM))),
            1 => Just(Input::Order(Order::Kill)),
            1 => Just(Input::Orphaned),
            1 => Just(Input::LeaderExited),
        ]
    }

    proptest! {
        // A failure prints its minimal input; no regressions file is written into the tree.
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// Random inputs at random, non-decreasing times, with the loop also waking whenever
        /// [`Enforcer::next_wake`] asks (as the timerfd makes it).
        #[test]
        fn the_deadline_invariants_hold_for_any_inputs(
            steps in proptest::collection::vec((0u64..3_000, input()), 0..60)
        ) {
            let mut e = enforcer();
            let mut now = at(0);
            let mut kills = 0;
            let mut stopped_at_d: Option<BootInstant> = None;
            for (gap, input) in steps {
                let next = now.plus(Duration::from_millis(gap));
                // The timer fires first if it is due before the next input.
                while let Some(w) = e.next_wake().filter(|w| *w <= next) {
                    let before = e.deadline();
                    if e.on(w.max(now), Input::Tick) == Some(GroupOp::Kill) {
                        kills += 1;
                        // SIGKILL ahead of D, never at or after it.
                        prop_assert!(w.max(now) < e.deadline());
                    }
                    prop_assert_eq!(e.deadline(), before);
                    now = w.max(now);
                }
                now = next;
                let before = e.deadline();
                let was_stopping = e.cause().is_some();
                let was_killed = e.kill_sent;
                match e.on(now, input) {
                    // Members left alive after the SIGKILL: killed again, every round.
                    Some(GroupOp::Kill) if input == Input::LeaderExited && was_killed => {}
                    Some(GroupOp::Kill) => kills += 1,
                    _ => prop_assert!(!(input == Input::LeaderExited && was_killed)),
                }
                // D only moves forward, and not at all once a stop is under way.
                prop_assert!(e.deadline() >= before);
                if was_stopping {
                    prop_assert_eq!(e.deadline(), before);
                    stopped_at_d.get_or_insert(before);
                }
                // Never past D without SIGKILL sent (the loop woke in time).
                if now >= e.deadline() {
                    prop_assert!(e.kill_sent);
                }
            }
            // SIGKILL goes out once at most, but for members it left alive.
            prop_assert!(kills <= 1);
            if let Some(d) = stopped_at_d {
                prop_assert_eq!(e.deadline(), d);
            }
        }
    }
}
