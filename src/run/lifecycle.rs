//! The lifecycle of one `lead-exec run`, as a pure state machine.
//!
//! ```text
//!             Elected           Spawned            Lost / Paused / Interrupted / Unhealthy
//! Campaigning ───────▶ Elected ────────▶ Leading ───────────────────────────▶ Draining
//!   ▲ │ │  │              ▲ │ NotStarted   │ JobEnded (on its own)              │ JobEnded
//!   │ │ │  │ Elected,     │ │ AlreadyDone  ▼                                    ▼
//!   │ │ │  │ unclean end  │ └──────▶ Done(exit)  ◀── (interrupted, or --on-loss exit)
//!   │ │ │  └─▶ Delaying ──┘ DelayDone     ▲
//!   │ │ │ CampaignFailed                 └── campaign again (lost, paused, resigned,
//!   │ │ └──────────▶ BackingOff                unhealthy, --on-loss campaign)
//!   │ └── Unhealthy: leave the line, campaign again once healthy
//!   └─────────────────────┘ BackoffDone
//! ```
//!
//! `Delaying` is `--takeover-delay`: elected after a term that ended uncleanly, the lease
//! renewed, the job not started yet. An `Elected` worker whose health check failed
//! `--health-failures` times in a row before the start gives the term up and campaigns again
//! without starting the job.
//!
//! [`step`] maps (phase, event) to the next phase and the actions the driver performs, for
//! every pair: no catch-all, so a new event or phase does not compile until each transition
//! is decided. No I/O happens here, so every transition is unit-tested below.

use std::time::Duration;

use crate::config::OnLoss;
use crate::election::lease::Loss;
use crate::exit::Exit;
use crate::records::history::TermEnd;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Campaigning {
        attempt: u32,
    },
    /// The campaign won and was confirmed; the job is not running yet.
    Elected {
        token: i64,
    },
    /// Elected after an unclean end: waiting out `--takeover-delay` before the start.
    Delaying {
        token: i64,
    },
    Leading {
        token: i64,
    },
    Draining {
        token: i64,
        why: StopReason,
    },
    BackingOff {
        attempt: u32,
    },
    Done(Exit),
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Campaigning { .. } => "campaigning",
            Phase::Elected { .. } => "elected",
            Phase::Delaying { .. } => "takeover-delay",
            Phase::Leading { .. } => "leading",
            Phase::Draining { .. } => "draining",
            Phase::BackingOff { .. } => "backing-off",
            Phase::Done(_) => "done",
        }
    }

    /// The fencing token of the term this phase belongs to.
    pub fn token(&self) -> Option<i64> {
        match *self {
            Phase::Elected { token }
            | Phase::Delaying { token }
            | Phase::Leading { token }
            | Phase::Draining { token, .. } => Some(token),
            Phase::Campaigning { .. } | Phase::BackingOff { .. } | Phase::Done(_) => None,
        }
    }

    /// Whether a job may be running in this phase.
    pub fn has_job(&self) -> bool {
        matches!(self, Phase::Leading { .. } | Phase::Draining { .. })
    }
}

/// Why lead-exec is stopping a running job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Lost(Loss),
    Paused,
    /// An operator's `lead-exec resign`.
    Resigned,
    /// A signal to lead-exec itself (TERM, INT, HUP, QUIT).
    Interrupted(i32),
    /// The job ran for `--timeout`.
    TimedOut,
    /// The job ran for `--timeout`, then a stopping signal reached lead-exec during the grace.
    TimedOutThenInterrupted(i32),
    /// The health check failed `--health-failures` times in a row.
    Unhealthy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The campaign won and was confirmed. `delay` is set when the previous term ended
    /// uncleanly and `--takeover-delay` asks for a wait before the start.
    Elected {
        token: i64,
        delay: Option<Duration>,
    },
    /// The takeover delay is over.
    DelayDone,
    /// The health check failed `--health-failures` times in a row.
    Unhealthy,
    /// Someone else leads and the wait policy gave up.
    NotAcquired,
    /// The campaign failed: our lease or key went away while queued, or etcd failed.
    CampaignFailed {
        /// etcd failed (rather than our candidacy): `--no-wait` reports that instead of
        /// retrying.
        etcd: bool,
    },
    /// A stopping signal reached lead-exec.
    Interrupted {
        signal: i32,
    },
    /// Leadership ended while leading.
    Lost(Loss),
    /// The keepalive task is gone without a word: nothing renews the lease any more.
    LeaseTaskEnded,
    /// The election was paused while leading.
    Paused,
    /// An operator asked this leader to step down.
    ResignRequested,
    /// The job has run for `--timeout`.
    TimedOut,
    /// The job started.
    Spawned,
    /// The job was not started: the term's lease was lost, or left it too little time.
    NotStarted,
    /// The job was not started: another worker already finished this run key.
    AlreadyDone,
    /// The job's process group is gone. `exit` is what lead-exec would exit with for it;
    /// `by_watchdog` is set when the watchdog killed it on its own (deadline, or lost parent).
    JobEnded {
        exit: Exit,
        by_watchdog: bool,
    },
    BackoffDone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Grant a fresh lease and campaign on it.
    Campaign,
    /// Wait out the takeover delay (lease renewed, term watched).
    Delay(Duration),
    /// Start the job with this fencing token.
    Spawn {
        token: i64,
    },
    /// Send this signal to the job's group, SIGKILL after the grace.
    StopJob {
        signal: i32,
    },
    /// SIGKILL the job's group now.
    KillJob,
    /// Write how the term ended (and, on a success, the run key), while our key still guards
    /// the write.
    RecordEnd(TermEnd),
    /// Revoke our lease (deletes our key: the next candidate takes over at once).
    Resign,
    /// Wait before campaigning again.
    Backoff(Duration),
    Exit(Exit),
    /// End with the etcd error just met.
    Fail,
}

/// The choices that shape transitions.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub on_loss: OnLoss,
    pub conflict_exit_code: u8,
    /// `--no-wait`: report an etcd outage instead of retrying (it is for cron).
    pub no_wait: bool,
}

/// Exponential backoff between failed campaigns: 250 ms doubling to at most 2 s, short
/// next to any usable TTL so that a cluster that comes back is used at once.
pub fn backoff(attempt: u32) -> Duration {
    let ms = 250u64.saturating_mul(1 << attempt.min(5));
    Duration::from_millis(ms.min(2_000))
}

const SIGTERM: i32 = libc::SIGTERM;

pub fn step(phase: Phase, event: Event, p: &Policy) -> (Phase, Vec<Action>) {
    use Action as A;
    use Event as E;
    use Phase as P;
    let done = |exit: Exit| (P::Done(exit), vec![A::Resign, A::Exit(exit)]);
    // The same, for a term: its end is recorded first, while our key still guards the write.
    let ended = |reason: TermEnd, exit: Exit| {
        (
            P::Done(exit),
            vec![A::RecordEnd(reason), A::Resign, A::Exit(exit)],
        )
    };
    let after_loss = |p: &Policy, record: Option<TermEnd>| {
        let mut actions: Vec<Action> = record.map(A::RecordEnd).into_iter().collect();
        let next = match p.on_loss {
            OnLoss::Exit => {
                actions.extend([A::Resign, A::Exit(Exit::LeadershipLost)]);
                P::Done(Exit::LeadershipLost)
            }
            OnLoss::Campaign => {
                actions.extend([A::Resign, A::Campaign]);
                P::Campaigning { attempt: 0 }
            }
        };
        (next, actions)
    };
    let drain =
        |token: i64, why: StopReason, first: Action| (P::Draining { token, why }, vec![first]);
    let stop = A::StopJob { signal: SIGTERM };
    match (phase, event) {
        (P::Campaigning { .. }, E::Elected { token, delay: None }) => {
            (P::Elected { token }, vec![A::Spawn { token }])
        }
        (
            P::Campaigning { .. },
            E::Elected {
                token,
                delay: Some(d),
            },
        ) => (P::Delaying { token }, vec![A::Delay(d)]),
        // Out of line until healthy again: the next campaign waits for a passing check.
        (P::Campaigning { .. }, E::Unhealthy) => {
            (P::Campaigning { attempt: 0 }, vec![A::Resign, A::Campaign])
        }
        (P::Campaigning { .. }, E::NotAcquired) => done(Exit::NotAcquired(p.conflict_exit_code)),
        (P::Campaigning { .. }, E::CampaignFailed { etcd: true }) if p.no_wait => {
            (phase, vec![A::Resign, A::Fail])
        }
        (P::Campaigning { attempt }, E::CampaignFailed { .. }) => (
            P::BackingOff {
                attempt: attempt + 1,
            },
            vec![A::Resign, A::Backoff(backoff(attempt))],
        ),
        (P::Campaigning { .. } | P::BackingOff { .. }, E::Interrupted { signal }) => {
            done(Exit::Signal(signal))
        }
        (P::BackingOff { attempt }, E::BackoffDone) => {
            (P::Campaigning { attempt }, vec![A::Campaign])
        }
        // Only a term has these; a campaign or a backoff cannot be told them.
        (
            P::Campaigning { .. } | P::BackingOff { .. },
            E::Lost(_)
            | E::LeaseTaskEnded
            | E::Paused
            | E::ResignRequested
            | E::TimedOut
            | E::Spawned
            | E::NotStarted
            | E::AlreadyDone
            | E::JobEnded { .. }
            | E::DelayDone,
        ) => (phase, vec![]),
        (P::Campaigning { .. }, E::BackoffDone) => (phase, vec![]),
        // The campaign after the backoff waits for a passing check.
        (P::BackingOff { .. }, E::Unhealthy) => (phase, vec![]),
        (P::BackingOff { .. }, E::Elected { .. } | E::NotAcquired | E::CampaignFailed { .. }) => {
            (phase, vec![])
        }

        (P::Delaying { token }, E::DelayDone) => (P::Elected { token }, vec![A::Spawn { token }]),
        // No job runs yet, so there is nothing to stop or record.
        (P::Delaying { .. }, E::Lost(_) | E::LeaseTaskEnded) => after_loss(p, None),
        (P::Delaying { .. }, E::Paused | E::ResignRequested | E::Unhealthy) => {
            (P::Campaigning { attempt: 0 }, vec![A::Resign, A::Campaign])
        }
        (P::Delaying { .. }, E::Interrupted { signal }) => done(Exit::Signal(signal)),
        (
            P::Delaying { .. },
            E::Elected { .. }
            | E::NotAcquired
            | E::CampaignFailed { .. }
            | E::TimedOut
            | E::Spawned
            | E::NotStarted
            | E::AlreadyDone
            | E::JobEnded { .. }
            | E::BackoffDone,
        ) => (phase, vec![]),

        (P::Elected { token }, E::Spawned) => (P::Leading { token }, vec![]),
        // Lost between the confirmation and the start: never run on an unconfirmed term.
        (P::Elected { .. }, E::NotStarted) => after_loss(p, Some(TermEnd::LeaseLost)),
        (P::Elected { .. }, E::AlreadyDone) => done(Exit::Ok),
        // The check failed N times in a row between the election and the start: give the term
        // up without starting the job (closing a start record already written, as clean).
        (P::Elected { .. }, E::Unhealthy) => (
            P::Campaigning { attempt: 0 },
            vec![A::RecordEnd(TermEnd::Unhealthy), A::Resign, A::Campaign],
        ),
        (P::Elected { .. }, E::Interrupted { signal }) => done(Exit::Signal(signal)),
        // The start itself checks the lease once more; a loss is seen there, as NotStarted.
        // The rest is seen by the running term, which starts at once.
        (
            P::Elected { .. },
            E::Lost(_)
            | E::LeaseTaskEnded
            | E::Paused
            | E::ResignRequested
            | E::TimedOut
            | E::DelayDone,
        ) => (phase, vec![]),
        (
            P::Elected { .. },
            E::Elected { .. }
            | E::NotAcquired
            | E::CampaignFailed { .. }
            | E::JobEnded { .. }
            | E::BackoffDone,
        ) => (phase, vec![]),

        (
            P::Leading { .. },
            E::JobEnded {
                by_watchdog: true, ..
            },
        ) => after_loss(p, Some(TermEnd::LeaseLost)),
        (P::Leading { .. }, E::JobEnded { exit, .. }) => ended(TermEnd::Exited(exit.code()), exit),
        // etcd said the lease is gone: the next leader may already run, so no grace.
        (P::Leading { token }, E::Lost(Loss::Expired)) => {
            drain(token, StopReason::Lost(Loss::Expired), A::KillJob)
        }
        (P::Leading { token }, E::Lost(r)) => drain(token, StopReason::Lost(r), stop),
        // Without its renewals the lease runs out at D: as good as lost now.
        (P::Leading { token }, E::LeaseTaskEnded) => {
            drain(token, StopReason::Lost(Loss::Deadline), stop)
        }
        (P::Leading { token }, E::Paused) => drain(token, StopReason::Paused, stop),
        (P::Leading { token }, E::ResignRequested) => drain(token, StopReason::Resigned, stop),
        (P::Leading { token }, E::TimedOut) => drain(token, StopReason::TimedOut, stop),
        (P::Leading { token }, E::Unhealthy) => drain(token, StopReason::Unhealthy, stop),
        (P::Leading { token }, E::Interrupted { signal }) => drain(
            token,
            StopReason::Interrupted(signal),
            A::StopJob { signal },
        ),
        // Only a campaign, a start or a backoff has these; a running term cannot be told them.
        (
            P::Leading { .. } | P::Draining { .. },
            E::Elected { .. }
            | E::NotAcquired
            | E::CampaignFailed { .. }
            | E::Spawned
            | E::NotStarted
            | E::AlreadyDone
            | E::BackoffDone
            | E::DelayDone,
        ) => (phase, vec![]),

        (
            P::Draining {
                why: StopReason::Lost(_),
                ..
            },
            E::JobEnded { .. },
        ) => after_loss(p, Some(TermEnd::LeaseLost)),
        (
            P::Draining {
                why: why @ (StopReason::Paused | StopReason::Resigned | StopReason::Unhealthy),
                ..
            },
            E::JobEnded { by_watchdog, .. },
        ) => {
            let reason = match why {
                _ if by_watchdog => TermEnd::LeaseLost,
                StopReason::Paused => TermEnd::Paused,
                StopReason::Unhealthy => TermEnd::Unhealthy,
                _ => TermEnd::Resigned,
            };
            (
                P::Campaigning { attempt: 0 },
                vec![A::RecordEnd(reason), A::Resign, A::Campaign],
            )
        }
        (
            P::Draining {
                why: StopReason::Interrupted(s),
                ..
            },
            E::JobEnded { exit, by_watchdog },
        ) => {
            let reason = if by_watchdog {
                TermEnd::LeaseLost
            } else {
                TermEnd::Signal(s)
            };
            ended(reason, exit)
        }
        // Stopped at --timeout: not a success (a run key stays open), and the next candidate
        // takes over at once.
        (
            P::Draining {
                why: StopReason::TimedOut,
                ..
            },
            E::JobEnded { by_watchdog, .. },
        ) => {
            let reason = if by_watchdog {
                TermEnd::LeaseLost
            } else {
                TermEnd::TimedOut
            };
            ended(reason, Exit::TimedOut)
        }
        (
            P::Draining {
                why: StopReason::TimedOutThenInterrupted(s),
                ..
            },
            E::JobEnded { by_watchdog, .. },
        ) => {
            let reason = if by_watchdog {
                TermEnd::LeaseLost
            } else {
                TermEnd::TimedOutThenSignal(s)
            };
            ended(reason, Exit::TimedOut)
        }
        // A stop (`systemctl stop`, ^C) during the timeout's grace: the job gets SIGKILL at
        // once, as for any second stop, but the run still ends as timed out (124), since that
        // is what stopped the job first; the record names both.
        (
            P::Draining {
                token,
                why: StopReason::TimedOut | StopReason::TimedOutThenInterrupted(_),
            },
            E::Interrupted { signal },
        ) => drain(
            token,
            StopReason::TimedOutThenInterrupted(signal),
            A::KillJob,
        ),
        // A second stopping signal while draining: stop waiting out the grace.
        (P::Draining { token, .. }, E::Interrupted { signal }) => {
            drain(token, StopReason::Interrupted(signal), A::KillJob)
        }
        // A loss while already stopping for another reason: the stop is under way, and the
        // watchdog's deadline still holds.
        (
            P::Draining { .. },
            E::Lost(_)
            | E::LeaseTaskEnded
            | E::Paused
            | E::ResignRequested
            | E::TimedOut
            | E::Unhealthy,
        ) => (phase, vec![]),

        // The run is over; whatever still comes in changes nothing.
        (P::Done(_), E::Elected { .. } | E::NotAcquired | E::CampaignFailed { .. }) => {
            (phase, vec![])
        }
        (P::Done(_), E::Interrupted { .. } | E::Lost(_) | E::LeaseTaskEnded) => (phase, vec![]),
        (P::Done(_), E::Paused | E::ResignRequested | E::TimedOut | E::Spawned | E::NotStarted) => {
            (phase, vec![])
        }
        (P::Done(_), E::AlreadyDone | E::JobEnded { .. } | E::BackoffDone) => (phase, vec![]),
        (P::Done(_), E::DelayDone | E::Unhealthy) => (phase, vec![]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CAMPAIGN: Policy = Policy {
        on_loss: OnLoss::Campaign,
        conflict_exit_code: 75,
        no_wait: false,
    };
    const EXIT: Policy = Policy {
        on_loss: OnLoss::Exit,
        conflict_exit_code: 75,
        no_wait: false,
    };

    fn campaigning() -> Phase {
        Phase::Campaigning { attempt: 0 }
    }

    fn leading() -> Phase {
        Phase::Leading { token: 42 }
    }

    fn draining(why: StopReason) -> Phase {
        Phase::Draining { token: 42, why }
    }

    fn job_ended(exit: Exit, by_watchdog: bool) -> Event {
        Event::JobEnded { exit, by_watchdog }
    }

    /// The job's group is gone after a SIGTERM.
    fn ended(by_watchdog: bool) -> Event {
        job_ended(Exit::Signal(15), by_watchdog)
    }

    const STOP: Action = Action::StopJob {
        signal: libc::SIGTERM,
    };

    /// The run ends: the term's end recorded, the lease given up, the exit.
    fn assert_ends(p: Phase, a: &[Action], record: TermEnd, exit: Exit) {
        assert_eq!(p, Phase::Done(exit));
        assert_eq!(
            a,
            [
                Action::RecordEnd(record),
                Action::Resign,
                Action::Exit(exit)
            ]
        );
    }

    /// Back in line: the end recorded, the lease given up, a fresh campaign.
    fn assert_requeued(p: Phase, a: &[Action]) {
        assert_eq!(p, Phase::Campaigning { attempt: 0 });
        assert!(matches!(a[0], Action::RecordEnd(_)), "{a:?}");
        assert_eq!(a[1..], [Action::Resign, Action::Campaign]);
    }

    #[test]
    fn elected_spawns_with_the_token() {
        let (p, a) = step(
            campaigning(),
            Event::Elected {
                token: 42,
                delay: None,
            },
            &CAMPAIGN,
        );
        assert_eq!(p, Phase::Elected { token: 42 });
        assert_eq!(a, vec![Action::Spawn { token: 42 }]);
        assert_eq!(step(p, Event::Spawned, &CAMPAIGN), (leading(), vec![]));
    }

    #[test]
    fn a_term_lost_before_the_start_runs_nothing_and_counts_as_lost() {
        let elected = Phase::Elected { token: 42 };
        let (p, a) = step(elected, Event::NotStarted, &CAMPAIGN);
        assert_eq!(p, Phase::Campaigning { attempt: 0 });
        assert_eq!(
            a,
            vec![
                Action::RecordEnd(TermEnd::LeaseLost),
                Action::Resign,
                Action::Campaign
            ]
        );
        let (p, a) = step(elected, Event::NotStarted, &EXIT);
        assert_eq!(p, Phase::Done(Exit::LeadershipLost));
        assert_eq!(a.last(), Some(&Action::Exit(Exit::LeadershipLost)));
    }

    #[test]
    fn a_run_key_done_elsewhere_ends_with_success_and_no_record() {
        let (p, a) = step(Phase::Elected { token: 42 }, Event::AlreadyDone, &CAMPAIGN);
        assert_eq!(p, Phase::Done(Exit::Ok));
        assert_eq!(a, vec![Action::Resign, Action::Exit(Exit::Ok)]);
    }

    #[test]
    fn no_wait_ends_on_an_etcd_failure_but_retries_a_lost_candidacy() {
        let p = Policy {
            no_wait: true,
            ..CAMPAIGN
        };
        let c = Phase::Campaigning { attempt: 0 };
        assert_eq!(
            step(c, Event::CampaignFailed { etcd: true }, &p),
            (c, vec![Action::Resign, Action::Fail])
        );
        let (next, _) = step(c, Event::CampaignFailed { etcd: false }, &p);
        assert_eq!(next, Phase::BackingOff { attempt: 1 });
    }

    #[test]
    fn a_silent_lease_task_counts_as_a_deadline_loss() {
        let (p, a) = step(leading(), Event::LeaseTaskEnded, &CAMPAIGN);
        assert_eq!(p, draining(StopReason::Lost(Loss::Deadline)));
        assert_eq!(a, vec![Action::StopJob { signal: SIGTERM }]);
    }

    #[test]
    fn each_end_is_recorded_with_its_reason() {
        let ended = |by_watchdog| Event::JobEnded {
            exit: Exit::Signal(15),
            by_watchdog,
        };
        let draining = |why| Phase::Draining { token: 42, why };
        let cases = [
            (leading(), ended(false), TermEnd::Exited(143)),
            (leading(), ended(true), TermEnd::LeaseLost),
            (
                draining(StopReason::Lost(Loss::KeyDeleted)),
                ended(false),
                TermEnd::LeaseLost,
            ),
            (draining(StopReason::Paused), ended(false), TermEnd::Paused),
            (
                draining(StopReason::Paused),
                ended(true),
                TermEnd::LeaseLost,
            ),
            (
                draining(StopReason::Resigned),
                ended(false),
                TermEnd::Resigned,
            ),
            (
                draining(StopReason::Interrupted(2)),
                ended(false),
                TermEnd::Signal(2),
            ),
            (
                draining(StopReason::Interrupted(2)),
                ended(true),
                TermEnd::LeaseLost,
            ),
        ];
        for (phase, ev, reason) in cases {
            let (_, a) = step(phase, ev, &CAMPAIGN);
            assert_eq!(a.first(), Some(&Action::RecordEnd(reason)), "{phase:?}");
        }
    }

    #[test]
    fn not_acquired_resigns_and_exits_with_conflict_code() {
        let p = Policy {
            conflict_exit_code: 9,
            ..CAMPAIGN
        };
        let (ph, a) = step(Phase::Campaigning { attempt: 0 }, Event::NotAcquired, &p);
        assert_eq!(ph, Phase::Done(Exit::NotAcquired(9)));
        assert_eq!(a, vec![Action::Resign, Action::Exit(Exit::NotAcquired(9))]);
    }

    #[test]
    fn failed_campaign_backs_off_then_campaigns() {
        let (p, a) = step(
            Phase::Campaigning { attempt: 2 },
            Event::CampaignFailed { etcd: true },
            &CAMPAIGN,
        );
        assert_eq!(p, Phase::BackingOff { attempt: 3 });
        assert_eq!(a, vec![Action::Resign, Action::Backoff(backoff(2))]);
        let (p, a) = step(p, Event::BackoffDone, &CAMPAIGN);
        assert_eq!(p, Phase::Campaigning { attempt: 3 });
        assert_eq!(a, vec![Action::Campaign]);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_millis(250));
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(30), Duration::from_secs(2));
    }

    #[test]
    fn interrupt_while_campaigning_exits_128_plus_n() {
        let (p, a) = step(campaigning(), Event::Interrupted { signal: 15 }, &CAMPAIGN);
        assert_eq!(p, Phase::Done(Exit::Signal(15)));
        assert_eq!(a, vec![Action::Resign, Action::Exit(Exit::Signal(15))]);
    }

    #[test]
    fn job_exit_resigns_and_passes_the_code() {
        let (p, a) = step(leading(), job_ended(Exit::Job(7), false), &CAMPAIGN);
        assert_ends(p, &a, TermEnd::Exited(7), Exit::Job(7));
    }

    #[test]
    fn a_lease_etcd_says_is_gone_kills_the_job_at_once() {
        let (p, a) = step(leading(), Event::Lost(Loss::Expired), &CAMPAIGN);
        assert_eq!(p, draining(StopReason::Lost(Loss::Expired)));
        assert_eq!(a, vec![Action::KillJob]);
    }

    #[test]
    fn loss_with_on_loss_exit_exits_76() {
        let (p, _) = step(leading(), Event::Lost(Loss::KeyDeleted), &EXIT);
        let ev = ended(false);
        let (p, a) = step(p, ev, &EXIT);
        assert_eq!(p, Phase::Done(Exit::LeadershipLost));
        assert_eq!(a.last(), Some(&Action::Exit(Exit::LeadershipLost)));
    }

    #[test]
    fn watchdog_kill_counts_as_loss_not_as_job_exit() {
        let (p, a) = step(leading(), job_ended(Exit::Signal(9), true), &CAMPAIGN);
        assert_requeued(p, &a);
    }

    #[test]
    fn interrupt_while_leading_forwards_then_exits_with_job_code() {
        let (p, a) = step(leading(), Event::Interrupted { signal: 2 }, &CAMPAIGN);
        assert_eq!(a, vec![Action::StopJob { signal: 2 }]);
        let (p2, a) = step(p, Event::Interrupted { signal: 15 }, &CAMPAIGN);
        assert_eq!(a, vec![Action::KillJob]);
        let ev = job_ended(Exit::Job(0), false);
        let (p3, a) = step(p2, ev, &CAMPAIGN);
        assert_ends(p3, &a, TermEnd::Signal(15), Exit::Job(0));
    }

    #[test]
    fn a_loss_a_pause_or_a_resign_stops_the_job_then_requeues() {
        let cases = [
            (
                Event::Lost(Loss::Deadline),
                StopReason::Lost(Loss::Deadline),
                CAMPAIGN,
            ),
            (Event::Paused, StopReason::Paused, EXIT),
            (Event::ResignRequested, StopReason::Resigned, EXIT),
        ];
        for (ev, why, policy) in cases {
            let (p, a) = step(leading(), ev, &policy);
            assert_eq!(p, draining(why));
            assert_eq!(a, vec![STOP]);
            let (p, a) = step(p, ended(false), &policy);
            assert_requeued(p, &a);
        }
    }

    #[test]
    fn a_job_past_its_timeout_is_stopped_then_the_term_ends_with_124_and_no_success() {
        for policy in [CAMPAIGN, EXIT] {
            let (p, a) = step(leading(), Event::TimedOut, &policy);
            assert_eq!(p, draining(StopReason::TimedOut));
            assert_eq!(a, vec![STOP]);
            // Whatever the job exits with (0 included), it is not recorded as a success.
            let (p2, a) = step(p, job_ended(Exit::Job(0), false), &policy);
            assert_ends(p2, &a, TermEnd::TimedOut, Exit::TimedOut);
            let (p3, a) = step(p, job_ended(Exit::Signal(9), true), &policy);
            assert_ends(p3, &a, TermEnd::LeaseLost, Exit::TimedOut);
        }
        // Only a running job times out.
        let e = Phase::Elected { token: 1 };
        assert_eq!(step(e, Event::TimedOut, &CAMPAIGN), (e, vec![]));
    }

    #[test]
    fn a_stop_signal_during_the_timeouts_grace_kills_at_once_but_the_run_still_times_out() {
        for policy in [CAMPAIGN, EXIT] {
            let (p, _) = step(leading(), Event::TimedOut, &policy);
            let (p, a) = step(p, Event::Interrupted { signal: 15 }, &policy);
            assert_eq!(p, draining(StopReason::TimedOutThenInterrupted(15)));
            assert_eq!(a, vec![Action::KillJob]);
            // A third signal keeps the timeout too, and names the last signal.
            let (p2, a) = step(p, Event::Interrupted { signal: 2 }, &policy);
            assert_eq!(p2, draining(StopReason::TimedOutThenInterrupted(2)));
            assert_eq!(a, vec![Action::KillJob]);
            let (end, a) = step(p, job_ended(Exit::Signal(9), false), &policy);
            assert_ends(end, &a, TermEnd::TimedOutThenSignal(15), Exit::TimedOut);
            let (end, a) = step(p, job_ended(Exit::Signal(9), true), &policy);
            assert_ends(end, &a, TermEnd::LeaseLost, Exit::TimedOut);
        }
        assert_eq!(
            TermEnd::TimedOutThenSignal(15).to_string(),
            "timed out, then signal 15 to lead-exec"
        );
        assert!(TermEnd::TimedOutThenSignal(15).is_clean());
    }

    #[test]
    fn an_unclean_end_delays_the_start_and_a_stop_during_the_delay_runs_nothing() {
        let d = Duration::from_secs(5);
        let ev = Event::Elected {
            token: 42,
            delay: Some(d),
        };
        let (p, a) = step(campaigning(), ev, &CAMPAIGN);
        assert_eq!(p, Phase::Delaying { token: 42 });
        assert_eq!(a, vec![Action::Delay(d)]);
        assert_eq!(
            step(p, Event::DelayDone, &CAMPAIGN),
            (
                Phase::Elected { token: 42 },
                vec![Action::Spawn { token: 42 }]
            )
        );
        for ev in [Event::Paused, Event::ResignRequested, Event::Unhealthy] {
            assert_eq!(
                step(p, ev, &EXIT),
                (campaigning(), vec![Action::Resign, Action::Campaign]),
                "{ev:?}"
            );
        }
        let (next, a) = step(p, Event::Lost(Loss::Expired), &EXIT);
        assert_eq!(next, Phase::Done(Exit::LeadershipLost));
        assert!(
            !a.iter().any(|a| matches!(a, Action::RecordEnd(_))),
            "{a:?}"
        );
    }

    #[test]
    fn an_unhealthy_leader_stops_its_job_records_it_and_requeues() {
        for policy in [CAMPAIGN, EXIT] {
            let (p, a) = step(leading(), Event::Unhealthy, &policy);
            assert_eq!(p, draining(StopReason::Unhealthy));
            assert_eq!(a, vec![STOP]);
            let (p, a) = step(p, ended(false), &policy);
            assert_requeued(p, &a);
            assert_eq!(a[0], Action::RecordEnd(TermEnd::Unhealthy));
        }
    }

    #[test]
    fn a_leader_found_unhealthy_before_its_start_gives_the_term_up_without_a_job() {
        for policy in [CAMPAIGN, EXIT] {
            let (p, a) = step(Phase::Elected { token: 42 }, Event::Unhealthy, &policy);
            assert_requeued(p, &a);
            assert_eq!(a[0], Action::RecordEnd(TermEnd::Unhealthy));
            assert!(!a.iter().any(|a| matches!(a, Action::Spawn { .. })));
        }
    }

    #[test]
    fn an_unhealthy_candidate_leaves_the_line() {
        let (p, a) = step(campaigning(), Event::Unhealthy, &CAMPAIGN);
        assert_eq!(p, campaigning());
        assert_eq!(a, vec![Action::Resign, Action::Campaign]);
    }

    #[test]
    fn loss_while_draining_changes_nothing() {
        let d = Phase::Draining {
            token: 1,
            why: StopReason::Interrupted(15),
        };
        assert_eq!(step(d, Event::Lost(Loss::Deadline), &CAMPAIGN), (d, vec![]));
    }

    const SIGNAL: i32 = libc::SIGINT;

    /// One of each event (and each payload that steers a transition).
    fn all_events() -> Vec<Event> {
        let mut v = vec![
            Event::Elected {
                token: 43,
                delay: None,
            },
            Event::Elected {
                token: 43,
                delay: Some(Duration::from_secs(5)),
            },
            Event::DelayDone,
            Event::Unhealthy,
            Event::NotAcquired,
            Event::CampaignFailed { etcd: true },
            Event::CampaignFailed { etcd: false },
            Event::Interrupted { signal: SIGNAL },
            Event::LeaseTaskEnded,
            Event::Paused,
            Event::ResignRequested,
            Event::TimedOut,
            Event::Spawned,
            Event::NotStarted,
            Event::AlreadyDone,
            Event::BackoffDone,
        ];
        v.extend([Loss::Expired, Loss::Deadline, Loss::KeyDeleted].map(Event::Lost));
        for by_watchdog in [false, true] {
            for exit in [Exit::Job(0), Exit::Job(3), Exit::Signal(9)] {
                v.push(Event::JobEnded { exit, by_watchdog });
            }
        }
        v
    }

    /// One of each phase (and each reason to drain).
    fn all_phases() -> Vec<Phase> {
        let mut v = vec![
            Phase::Campaigning { attempt: 1 },
            Phase::Elected { token: 42 },
            Phase::Delaying { token: 42 },
            leading(),
            Phase::BackingOff { attempt: 1 },
            Phase::Done(Exit::Job(0)),
        ];
        v.extend(
            [
                StopReason::Lost(Loss::Expired),
                StopReason::Lost(Loss::Deadline),
                StopReason::Paused,
                StopReason::Resigned,
                StopReason::Interrupted(libc::SIGTERM),
                StopReason::TimedOut,
                StopReason::TimedOutThenInterrupted(libc::SIGTERM),
                StopReason::Unhealthy,
            ]
            .map(|why| Phase::Draining { token: 42, why }),
        );
        v
    }

    fn all_policies() -> Vec<Policy> {
        let no_wait = |p: Policy| Policy { no_wait: true, ..p };
        vec![CAMPAIGN, EXIT, no_wait(CAMPAIGN), no_wait(EXIT)]
    }

    /// What must hold for any one transition.
    fn check_transition(
        phase: Phase,
        ev: Event,
        next: Phase,
        actions: &[Action],
    ) -> Result<(), String> {
        let t = format!("{phase:?} --{ev:?}--> {next:?} {actions:?}");
        let fail = |what: &str| Err(format!("{what}: {t}"));
        // Done is final.
        if let Phase::Done(_) = phase {
            if next != phase || !actions.is_empty() {
                return fail("left Done");
            }
        }
        // A job is started only by a won campaign, and only once per election.
        let spawns = actions
            .iter()
            .filter(|a| matches!(a, Action::Spawn { .. }))
            .count();
        if spawns > 0
            && !(spawns == 1
                && matches!(phase, Phase::Campaigning { .. } | Phase::Delaying { .. })
                && matches!(next, Phase::Elected { .. }))
        {
            return fail("spawn outside an election");
        }
        // A job is running only after it started.
        if matches!(next, Phase::Leading { .. })
            && !matches!(phase, Phase::Leading { .. })
            && !(matches!(phase, Phase::Elected { .. }) && ev == Event::Spawned)
        {
            return fail("leading without a start");
        }
        // A stop is never revived: a draining term ends only with its job.
        if matches!(phase, Phase::Draining { .. }) && matches!(next, Phase::Leading { .. }) {
            return fail("a stop was revived");
        }
        // A term whose job may run is left only once the job is gone.
        if phase.has_job() && !next.has_job() && !matches!(ev, Event::JobEnded { .. }) {
            return fail("a term left while its job may run");
        }
        // An exit is the last action, and exactly the phase's.
        let exits: Vec<_> = actions
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Action::Exit(_) | Action::Fail))
            .collect();
        match (next, exits.as_slice()) {
            (Phase::Done(_), _) if phase == next => {}
            (Phase::Done(e), [(i, Action::Exit(x))]) if *x == e && i + 1 == actions.len() => {}
            (Phase::Done(_), _) => return fail("Done without its exit last"),
            (_, []) => {}
            (_, [(i, Action::Fail)]) if i + 1 == actions.len() => {}
            _ => return fail("an exit that does not end the run"),
        }
        // Leaving a term (or a campaign) for good, or for another campaign, gives up the lease
        // first, so that the next candidate takes over at once.
        let ends = actions
            .iter()
            .position(|a| matches!(a, Action::Exit(_) | Action::Fail | Action::Campaign));
        if let Some(i) = ends {
            let from_backoff =
                matches!(phase, Phase::BackingOff { .. }) && ev == Event::BackoffDone;
            if !from_backoff && !actions[..i].contains(&Action::Resign) {
                return fail("no resign before ending or campaigning again");
            }
        }
        // An end record only when a term ends, and first, while our key still guards it.
        if let Some(i) = actions
            .iter()
            .position(|a| matches!(a, Action::RecordEnd(_)))
        {
            if i != 0 || phase.token().is_none() || next.token().is_some() {
                return fail("an end record outside a term's end");
            }
        }
        // A job's tokens come from its own election.
        if let (Some(a), Some(b)) = (phase.token(), next.token()) {
            if a != b {
                return fail("the token changed within a term");
            }
        }
        Ok(())
    }

    #[test]
    fn every_phase_and_event_keeps_the_invariants() {
        let mut pairs = 0;
        for p in all_policies() {
            for phase in all_phases() {
                for ev in all_events() {
                    let (next, actions) = step(phase, ev, &p);
                    if let Err(e) = check_transition(phase, ev, next, &actions) {
                        panic!("{e} (policy {p:?})");
                    }
                    pairs += 1;
                }
            }
        }
        assert!(pairs >= 4 * 10 * 20);
    }

    fn event() -> impl Strategy<Value = Event> {
        proptest::sample::select(all_events())
    }

    proptest! {
        // A failure prints its minimal input; no regressions file is written into the tree.
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// Any sequence of events from the start of a run: each transition keeps the
        /// invariants, a job runs at most once per won election, and a run that ended stays
        /// ended.
        #[test]
        fn any_event_sequence_keeps_the_invariants(
            events in proptest::collection::vec(event(), 0..80),
            on_exit in any::<bool>(),
            no_wait in any::<bool>(),
        ) {
            let p = Policy {
                on_loss: if on_exit { OnLoss::Exit } else { OnLoss::Campaign },
                conflict_exit_code: 75,
                no_wait,
            };
            let mut phase = Phase::Campaigning { attempt: 0 };
            let mut failed = false;
            for ev in events {
                let (next, actions) = step(phase, ev, &p);
                prop_assert!(check_transition(phase, ev, next, &actions).is_ok(),
                    "{}", check_transition(phase, ev, next, &actions).unwrap_err());
                // After Fail the driver is gone: nothing may follow it.
                prop_assert!(!failed);
                failed = actions.contains(&Action::Fail);
                if failed {
                    break;
                }
                phase = next;
            }
        }
    }
}
