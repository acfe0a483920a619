//! The keepalive schedule: when a renewal goes out, where, and when the lease is lost, decided
//! without I/O.
//!
//! The keepalive task ([`super::lease`]) turns its timer, renewal requests and the answers of
//! its attempts into [`Event`]s, hands them to [`Schedule::on`] with the time, and carries out
//! the [`Action`] it gets back: it owns the streams, the attempts in flight and the endpoint
//! router. Everything that keeps the lease renewed in time is decided here, so the invariants
//! are tested below without etcd:
//!
//! - [`RENEWAL_ATTEMPTS`](super::lease::RENEWAL_ATTEMPTS) attempts fit between a missed keepalive and SIGTERM, for every lease
//!   setting that [`check_lease_safety`](super::lease::check_lease_safety) accepts;
//! - D only moves forward: a late or reordered answer cannot move it back;
//! - an answer counts from its own request's send time, never from when it arrived;
//! - no answer is taken once D has passed (after a freeze, the job may already be dead).

use std::time::Duration;

use super::lease::renewal::{renewed, Loss, Renewal};
use crate::clock::BootInstant;

/// Most attempts in flight at once: enough to ride over a slow and a dead endpoint together.
pub const MAX_IN_FLIGHT: usize = 4;

/// What one renewal attempt learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Renewed: the lease lives at least until the attempt's send time + TTL.
    Alive,
    /// etcd says the lease does not exist any more.
    Gone,
    /// No answer in time, or an error: nothing is known about the lease.
    Failed,
}

/// What happened, as the schedule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Time passed: see what is due. `in_flight` attempts have not come back yet.
    Tick { in_flight: usize },
    /// A renewal is wanted now (before a spawn), ahead of the schedule.
    Renew,
    /// An attempt came back: sent at `sent` to `endpoint`.
    Answer {
        sent: BootInstant,
        endpoint: usize,
        reply: Reply,
    },
}

/// What the keepalive task must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send an attempt now. First report `overdue` to the router as failed: the last attempt
    /// went there and is overdue, so the endpoint is slow or gone. Then send where the pin is
    /// (a stream open to an endpoint the pin has left is dropped), and report the send with
    /// [`Schedule::sent`].
    Send { overdue: Option<usize> },
    /// The attempt on this endpoint failed: report it to the router, so the retry goes
    /// elsewhere.
    EndpointFailed(usize),
    /// The lease lives until this new D: publish it.
    Publish(BootInstant),
    /// The lease is lost; nothing more is sent.
    Lost(Loss),
}

/// The keepalive schedule of one lease.
#[derive(Debug, Clone)]
pub struct Schedule {
    plan: Renewal,
    /// A failure that came back at once (a refused connection, "no leader") is retried after
    /// this pause rather than in a tight loop.
    pause: Duration,
    deadline: BootInstant,
    /// When the next attempt is due.
    next: BootInstant,
    /// Send time of the newest attempt that renewed: older failures are old news.
    last_good: BootInstant,
    /// The endpoint of the newest attempt while it has no answer.
    awaiting: Option<usize>,
    lost: Option<Loss>,
}

impl Schedule {
    /// The schedule of a lease whose deadline is `deadline`, started at `now`: the first
    /// keepalive goes out one interval later.
    pub fn new(plan: Renewal, deadline: BootInstant, now: BootInstant) -> Schedule {
        Schedule {
            plan,
            pause: (plan.timeout / 8).clamp(Duration::from_millis(10), Duration::from_millis(50)),
            deadline,
            next: now.plus(plan.interval),
            last_good: now,
            awaiting: None,
            lost: None,
        }
    }

    /// The lease deadline D as it stands.
    pub fn deadline(&self) -> BootInstant {
        self.deadline
    }

    /// How long one attempt may wait for its answer. Beyond `plan.timeout` the next attempt
    /// goes out elsewhere while this one may still answer; but even a successful answer is
    /// worthless after D, so the attempt is bounded by the TTL.
    pub fn attempt_timeout(&self) -> Duration {
        self.plan.timeout.max(self.plan.ttl)
    }

    /// When the task must look again (`None` once the lease is lost).
    pub fn next_wake(&self) -> Option<BootInstant> {
        self.lost.is_none().then(|| self.next.min(self.deadline))
    }

    /// What `event` at `now` asks of the task.
    pub fn on(&mut self, now: BootInstant, event: Event) -> Option<Action> {
        if self.lost.is_some() {
            return None;
        }
        // Checked on every wake: after a freeze, an answer now could extend a lease whose job
        // the watchdog has already killed. Declare the loss instead.
        if now >= self.deadline {
            return self.lose(Loss::Deadline);
        }
        match event {
            Event::Tick { .. } if now < self.next => None,
            Event::Tick { in_flight } if in_flight >= MAX_IN_FLIGHT => {
                self.next = now.plus(self.pause);
                None
            }
            // The last attempt is overdue if it has no answer yet: the next one goes elsewhere
            // (a stream hides a silent endpoint from the channel's own failover).
            Event::Tick { .. } => Some(Action::Send {
                overdue: self.awaiting.take(),
            }),
            Event::Renew => {
                self.next = now;
                None
            }
            Event::Answer {
                reply: Reply::Gone, ..
            } => self.lose(Loss::Expired),
            Event::Answer {
                sent,
                reply: Reply::Alive,
                ..
            } => {
                let d = renewed(self.deadline, sent, self.plan.ttl, self.plan.margin);
                if sent >= self.last_good {
                    self.last_good = sent;
                    self.next = sent.plus(self.plan.interval);
                    self.awaiting = None;
                }
                let d = d?;
                self.deadline = d;
                Some(Action::Publish(d))
            }
            // A failure older than the last renewal says nothing about the endpoint now.
            Event::Answer { sent, .. } if sent < self.last_good => None,
            Event::Answer { endpoint, .. } => {
                if self.awaiting == Some(endpoint) {
                    self.awaiting = None;
                }
                self.next = self.next.min(now.plus(self.pause));
                Some(Action::EndpointFailed(endpoint))
            }
        }
    }

    /// An attempt went out at `at` to `endpoint` (after [`Action::Send`]). Unless it answers
    /// in time, the next one goes out a timeout later, on the next endpoint, while this one may
    /// still answer.
    pub fn sent(&mut self, at: BootInstant, endpoint: usize) {
        self.awaiting = Some(endpoint);
        self.next = at.plus(self.plan.timeout);
    }

    fn lose(&mut self, loss: Loss) -> Option<Action> {
        self.lost = Some(loss);
        Some(Action::Lost(loss))
    }
}

/// Whether an open stream to `stream_endpoint` carries the next attempt, which goes to `pin`:
/// a stream stays on its endpoint whatever the pin does since, so one the pin has left is
/// dropped, and a failure is blamed on the endpoint that had the request.
pub fn reuse_stream(stream_endpoint: usize, pin: usize) -> bool {
    stream_endpoint == pin
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::lease::{check_lease_safety, renewed_deadline, RENEWAL_ATTEMPTS};
    use proptest::prelude::*;

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_nanos(ms * 1_000_000)
    }

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    /// ttl 10 s, grace 3 s, margin 1 s: a keepalive every 2 s, retries after 1 s, pause 50 ms.
    /// Started at 0 with D at 9 s.
    fn schedule() -> Schedule {
        let plan = Renewal::plan(ms(10_000), ms(3_000), ms(1_000));
        Schedule::new(plan, at(9_000), at(0))
    }

    fn tick(n: usize) -> Event {
        Event::Tick { in_flight: n }
    }

    fn answer(sent: u64, endpoint: usize, reply: Reply) -> Event {
        Event::Answer {
            sent: at(sent),
            endpoint,
            reply,
        }
    }

    #[test]
    fn a_keepalive_goes_out_every_interval_and_counts_from_its_send_time() {
        let mut s = schedule();
        assert_eq!(s.next_wake(), Some(at(2_000)));
        assert_eq!(s.on(at(1_999), tick(0)), None);
        assert_eq!(
            s.on(at(2_000), tick(0)),
            Some(Action::Send { overdue: None })
        );
        s.sent(at(2_001), 0);
        assert_eq!(s.next_wake(), Some(at(3_001)));
        // Answered at 2.5 s: D counts from 2.001 s.
        assert_eq!(
            s.on(at(2_500), answer(2_001, 0, Reply::Alive)),
            Some(Action::Publish(at(11_001)))
        );
        assert_eq!(s.next_wake(), Some(at(4_001)));
    }

    #[test]
    fn an_overdue_answer_sends_the_next_attempt_elsewhere() {
        let mut s = schedule();
        s.on(at(2_000), tick(0));
        s.sent(at(2_000), 0);
        assert_eq!(
            s.on(at(3_000), tick(1)),
            Some(Action::Send { overdue: Some(0) })
        );
        s.sent(at(3_000), 1);
        // The late answer from endpoint 0 still renews, from its own send time.
        assert_eq!(
            s.on(at(3_100), answer(2_000, 0, Reply::Alive)),
            Some(Action::Publish(at(11_000)))
        );
        // And the one on endpoint 1 too, later.
        assert_eq!(
            s.on(at(3_200), answer(3_000, 1, Reply::Alive)),
            Some(Action::Publish(at(12_000)))
        );
        assert_eq!(s.next_wake(), Some(at(5_000)));
    }

    #[test]
    fn a_failure_is_retried_after_a_pause_and_blames_its_endpoint() {
        let mut s = schedule();
        s.on(at(2_000), tick(0));
        s.sent(at(2_000), 0);
        assert_eq!(
            s.on(at(2_005), answer(2_000, 0, Reply::Failed)),
            Some(Action::EndpointFailed(0))
        );
        assert_eq!(s.next_wake(), Some(at(2_055)));
        // Not overdue: its failure was already reported.
        assert_eq!(
            s.on(at(2_055), tick(0)),
            Some(Action::Send { overdue: None })
        );
    }

    #[test]
    fn failures_older_than_the_last_renewal_are_ignored() {
        let mut s = schedule();
        s.on(at(2_000), tick(0));
        s.sent(at(2_000), 0);
        s.on(at(3_000), tick(1));
        s.sent(at(3_000), 1);
        s.on(at(3_010), answer(3_000, 1, Reply::Alive));
        assert_eq!(s.on(at(3_020), answer(2_000, 0, Reply::Failed)), None);
        assert_eq!(s.next_wake(), Some(at(5_000)));
        // And an older success does not move D back.
        assert_eq!(s.on(at(3_030), answer(2_000, 0, Reply::Alive)), None);
        assert_eq!(s.deadline(), at(12_000));
        assert_eq!(s.next_wake(), Some(at(5_000)));
    }

    #[test]
    fn at_most_four_attempts_are_in_flight() {
        let mut s = schedule();
        assert_eq!(s.on(at(2_000), tick(MAX_IN_FLIGHT)), None);
        assert_eq!(s.next_wake(), Some(at(2_050)));
        assert_eq!(
            s.on(at(2_050), tick(MAX_IN_FLIGHT - 1)),
            Some(Action::Send { overdue: None })
        );
    }

    #[test]
    fn a_renewal_request_sends_at_once() {
        let mut s = schedule();
        assert_eq!(s.on(at(500), Event::Renew), None);
        assert_eq!(s.next_wake(), Some(at(500)));
        assert_eq!(s.on(at(500), tick(0)), Some(Action::Send { overdue: None }));
    }

    #[test]
    fn the_lease_is_lost_at_d_even_if_an_answer_arrives_then() {
        let mut s = schedule();
        s.on(at(2_000), tick(0));
        s.sent(at(2_000), 0);
        // After a freeze: the answer comes when D has passed.
        assert_eq!(
            s.on(at(9_000), answer(2_000, 0, Reply::Alive)),
            Some(Action::Lost(Loss::Deadline))
        );
        assert_eq!(s.next_wake(), None);
        assert_eq!(s.on(at(9_001), tick(0)), None);
        assert_eq!(s.deadline(), at(9_000));
    }

    #[test]
    fn etcd_saying_gone_loses_the_lease() {
        let mut s = schedule();
        assert_eq!(
            s.on(at(100), answer(0, 0, Reply::Gone)),
            Some(Action::Lost(Loss::Expired))
        );
        assert_eq!(s.on(at(200), Event::Renew), None);
        assert_eq!(s.next_wake(), None);
    }

    #[test]
    fn the_attempt_is_bounded_by_the_ttl() {
        assert_eq!(schedule().attempt_timeout(), ms(10_000));
    }

    #[test]
    fn a_stream_the_pin_has_left_is_dropped() {
        assert!(reuse_stream(1, 1));
        assert!(!reuse_stream(0, 1));
    }

    /// Lease settings that [`check_lease_safety`] accepts, as `lease_ttl` rounds them: TTLs
    /// of whole seconds up to etcd's maximum, grace and margin to the millisecond.
    fn accepted_settings() -> impl Strategy<Value = (Duration, Duration, Duration)> {
        let ttl = prop_oneof![
            3 => 2u64..30,
            1 => 30u64..=crate::config::MAX_LEASE_TTL.as_secs(),
        ];
        (ttl, 0u32..=1_000, 0u32..=1_000)
            .prop_map(|(ttl, g, m)| {
                // Grace and margin as shares of the TTL, the margin a share of what grace
                // leaves: many settings near the edge of what is accepted.
                let ttl = Duration::from_secs(ttl);
                let grace = ttl * g / 1_000;
                (ttl, grace, (ttl - grace) * m / 1_000)
            })
            .prop_filter("accepted", |(ttl, grace, margin)| {
                check_lease_safety(*ttl, *grace, *margin).is_ok()
            })
    }

    /// How an attempt that does not renew comes back: with a failure after a delay (a share of
    /// the retry timeout), or not before its bound (a blackholed endpoint).
    fn fate() -> impl Strategy<Value = Option<u32>> {
        prop_oneof![1 => Just(None), 1 => (0u32..=1_000).prop_map(Some)]
    }

    /// One attempt in flight in a simulation: when it comes back, and how.
    #[derive(Debug, Clone, Copy)]
    struct Flight {
        back: BootInstant,
        sent: BootInstant,
        endpoint: usize,
        reply: Reply,
    }

    /// Advances to the earliest of the schedule's wake and the answers in flight, and feeds it.
    /// Returns the event's time and the action, or `None` if there is nothing left to wait for.
    fn step(
        s: &mut Schedule,
        flights: &mut Vec<Flight>,
        now: &mut BootInstant,
    ) -> Option<(BootInstant, Event, Option<Action>)> {
        let wake = s.next_wake()?;
        let first = (0..flights.len()).min_by_key(|&i| flights[i].back);
        let (t, event) = match first {
            Some(i) if flights[i].back < wake => {
                let f = flights.remove(i);
                let e = Event::Answer {
                    sent: f.sent,
                    endpoint: f.endpoint,
                    reply: f.reply,
                };
                (f.back, e)
            }
            _ => (wake, tick(flights.len())),
        };
        *now = t.max(*now);
        Some((*now, event, s.on(*now, event)))
    }

    proptest! {
        // A failure prints its minimal input; no regressions file is written into the tree.
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// After the last renewal, with no answer renewing again (each attempt fails after a
        /// while or hangs until its bound), at least [`RENEWAL_ATTEMPTS`] attempts go out with
        /// their whole retry timeout before SIGTERM at D − grace.
        #[test]
        fn three_attempts_fit_before_sigterm_for_every_accepted_setting(
            (ttl, grace, margin) in accepted_settings(),
            fates in proptest::collection::vec(fate(), 8),
        ) {
            let plan = Renewal::plan(ttl, grace, margin);
            // The lease was just renewed by an attempt sent at 1 s.
            let t0 = at(1_000);
            let d = renewed_deadline(t0, ttl, margin);
            let term = d.minus(grace);
            let mut s = Schedule::new(plan, d, t0);
            let mut flights = Vec::new();
            let mut now = t0;
            let mut fitting = 0;
            let mut sends = 0;
            for _ in 0..1_000 {
                if fitting == RENEWAL_ATTEMPTS {
                    break;
                }
                let (t, _, action) = step(&mut s, &mut flights, &mut now)
                    .expect("the lease is not lost before SIGTERM");
                prop_assert!(t < term, "only {fitting} attempts fit before SIGTERM: {plan:?}");
                match action {
                    Some(Action::Send { .. }) => {
                        s.sent(t, sends % 3);
                        if t.plus(plan.timeout) <= term {
                            fitting += 1;
                        }
                        let back = match fates[sends % fates.len()] {
                            Some(share) => t.plus(plan.timeout * share / 1_000),
                            None => t.plus(s.attempt_timeout()),
                        };
                        flights.push(Flight { back, sent: t, endpoint: sends % 3, reply: Reply::Failed });
                        sends += 1;
                    }
                    Some(Action::EndpointFailed(_)) | None => {}
                    Some(a) => prop_assert!(false, "{a:?} before SIGTERM"),
                }
                prop_assert!(flights.len() <= MAX_IN_FLIGHT);
            }
            prop_assert_eq!(fitting, RENEWAL_ATTEMPTS);
        }

        /// Answers of every kind, late and out of order, and renewal requests, at any time: D
        /// never moves back, every new D is its own answer's send time + TTL − margin (so D is
        /// the latest of these), and the lease is lost exactly when D passes or etcd says so.
        #[test]
        fn d_never_moves_back_and_counts_from_each_answers_send_time(
            ops in proptest::collection::vec((0u64..1_500, 0u8..8, 0usize..8, 0usize..3), 0..80)
        ) {
            let (ttl, margin) = (ms(4_000), ms(1_000));
            let plan = Renewal::plan(ttl, ms(1_000), margin);
            let mut s = Schedule::new(plan, at(3_000), at(0));
            // Sent and not yet answered: (send time, endpoint).
            let mut flights: Vec<(BootInstant, usize)> = Vec::new();
            let mut now = at(0);
            let mut latest = s.deadline();
            let mut lost = None;
            for (gap, kind, pick, endpoint) in ops {
                let next = now.plus(ms(gap));
                // The timer fires first if it is due before the next event.
                while let Some(w) = s.next_wake().filter(|w| *w <= next) {
                    now = w.max(now);
                    match s.on(now, tick(flights.len())) {
                        Some(Action::Send { .. }) => {
                            prop_assert!(flights.len() < MAX_IN_FLIGHT);
                            s.sent(now, endpoint);
                            flights.push((now, endpoint));
                        }
                        Some(Action::Lost(l)) => {
                            prop_assert_eq!(l, Loss::Deadline);
                            prop_assert!(now >= s.deadline());
                            lost = Some(l);
                        }
                        None => {}
                        Some(a) => prop_assert!(false, "{a:?} on a tick"),
                    }
                    prop_assert_ne!(s.next_wake(), Some(w), "woken again for nothing");
                }
                now = next;
                let before = s.deadline();
                let event = if kind == 0 || flights.is_empty() {
                    Event::Renew
                } else {
                    let (sent, endpoint) = flights.remove(pick % flights.len());
                    let reply = match kind {
                        1 => Reply::Gone,
                        2..=4 => Reply::Failed,
                        _ => Reply::Alive,
                    };
                    Event::Answer { sent, endpoint, reply }
                };
                let action = s.on(now, event);
                prop_assert!(s.deadline() >= before, "D moved back");
                if lost.is_some() {
                    prop_assert_eq!(action, None);
                    prop_assert_eq!(s.deadline(), before);
                    continue;
                }
                match (event, action) {
                    (_, Some(Action::Lost(Loss::Deadline))) => {
                        prop_assert!(now >= before);
                        lost = Some(Loss::Deadline);
                    }
                    (_, _) if now >= before => prop_assert!(false, "an event past D was taken"),
                    (Event::Answer { reply: Reply::Gone, .. }, a) => {
                        prop_assert_eq!(a, Some(Action::Lost(Loss::Expired)));
                        lost = Some(Loss::Expired);
                    }
                    (Event::Answer { sent, reply: Reply::Alive, .. }, a) => {
                        let own = renewed_deadline(sent, ttl, margin);
                        latest = latest.max(own);
                        if let Some(Action::Publish(d)) = a {
                            prop_assert_eq!(d, own, "counted from another send time");
                            prop_assert!(d > before);
                        } else {
                            prop_assert_eq!(a, None);
                            prop_assert!(own <= before);
                        }
                    }
                    (Event::Answer { endpoint, reply: Reply::Failed, .. }, a) => {
                        prop_assert!(a.is_none() || a == Some(Action::EndpointFailed(endpoint)));
                    }
                    (Event::Renew, a) => {
                        prop_assert_eq!(a, None);
                        prop_assert_eq!(s.next_wake(), Some(now));
                    }
                    (e, a) => prop_assert!(false, "{a:?} for {e:?}"),
                }
                if lost.is_none() {
                    prop_assert_eq!(s.deadline(), latest);
                }
            }
        }
    }
}
