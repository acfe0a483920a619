//! The lifecycle of one `lead-exec run`, as a pure state machine.
//!
//! ```text
//!             Elected                 Lost / Paused / Interrupted
//! Campaigning ───────▶ Leading ─────────────────────────────▶ Draining
//!   ▲   │                 │ JobEnded (on its own)               │ JobEnded
//!   │   │ CampaignFailed  ▼                                     ▼
//!   │   └──────────▶ BackingOff        Done(exit)  ◀── (interrupted, or --on-loss exit)
//!   └─────────────────────┘ BackoffDone        ▲
//!                          └── campaign again ─┘ (lost or paused, --on-loss campaign)
//! ```
//!
//! [`step`] maps (phase, event) to the next phase and the actions the driver performs. No I/O
//! happens here, so every transition is unit-tested below.

use std::time::Duration;

use crate::config::OnLoss;
use crate::election::lease::LossReason;
use crate::exit::Exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Campaigning { attempt: u32 },
    Leading { token: i64 },
    Draining { token: i64, why: StopWhy },
    BackingOff { attempt: u32 },
    Done(Exit),
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Campaigning { .. } => "campaigning",
            Phase::Leading { .. } => "leading",
            Phase::Draining { .. } => "draining",
            Phase::BackingOff { .. } => "backing-off",
            Phase::Done(_) => "done",
        }
    }
}

/// Why a running job is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopWhy {
    Lost(LossReason),
    Paused,
    /// An operator's `lead-exec resign`.
    Resigned,
    /// A signal to lead-exec itself (TERM, INT, HUP, QUIT).
    Interrupted(i32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The campaign won and was confirmed.
    Elected {
        token: i64,
    },
    /// Someone else leads and the wait policy gave up.
    NotAcquired,
    /// The campaign failed: etcd error, or our lease or key went away while queued.
    CampaignFailed,
    /// A stopping signal reached lead-exec.
    Interrupted {
        signal: i32,
    },
    /// Leadership ended while leading.
    Lost(LossReason),
    /// The election was paused while leading.
    Paused,
    /// An operator asked this leader to step down.
    ResignRequested,
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
    /// Revoke our lease (deletes our key: the next candidate takes over at once).
    Resign,
    /// Wait before campaigning again.
    Backoff(Duration),
    Exit(Exit),
}

/// The choices that shape transitions.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub on_loss: OnLoss,
    pub conflict_exit_code: u8,
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
    let after_loss = |p: &Policy| match p.on_loss {
        OnLoss::Exit => (
            P::Done(Exit::LeadershipLost),
            vec![A::Resign, A::Exit(Exit::LeadershipLost)],
        ),
        OnLoss::Campaign => (P::Campaigning { attempt: 0 }, vec![A::Resign, A::Campaign]),
    };
    match (phase, event) {
        (P::Campaigning { .. }, E::Elected { token }) => {
            (P::Leading { token }, vec![A::Spawn { token }])
        }
        (P::Campaigning { .. }, E::NotAcquired) => {
            let exit = Exit::NotAcquired(p.conflict_exit_code);
            (P::Done(exit), vec![A::Resign, A::Exit(exit)])
        }
        (P::Campaigning { attempt }, E::CampaignFailed) => (
            P::BackingOff {
                attempt: attempt + 1,
            },
            vec![A::Resign, A::Backoff(backoff(attempt))],
        ),
        (P::Campaigning { .. } | P::BackingOff { .. }, E::Interrupted { signal }) => {
            let exit = Exit::Signal(signal);
            (P::Done(exit), vec![A::Resign, A::Exit(exit)])
        }
        (P::BackingOff { attempt }, E::BackoffDone) => {
            (P::Campaigning { attempt }, vec![A::Campaign])
        }

        (
            P::Leading { .. },
            E::JobEnded {
                by_watchdog: true, ..
            },
        ) => after_loss(p),
        (P::Leading { .. }, E::JobEnded { exit, .. }) => {
            (P::Done(exit), vec![A::Resign, A::Exit(exit)])
        }
        // etcd said the lease is gone: the next leader may already run, so no grace.
        (P::Leading { token }, E::Lost(LossReason::Expired)) => (
            P::Draining {
                token,
                why: StopWhy::Lost(LossReason::Expired),
            },
            vec![A::KillJob],
        ),
        (P::Leading { token }, E::Lost(r)) => (
            P::Draining {
                token,
                why: StopWhy::Lost(r),
            },
            vec![A::StopJob { signal: SIGTERM }],
        ),
        (P::Leading { token }, E::Paused) => (
            P::Draining {
                token,
                why: StopWhy::Paused,
            },
            vec![A::StopJob { signal: SIGTERM }],
        ),
        (P::Leading { token }, E::ResignRequested) => (
            P::Draining {
                token,
                why: StopWhy::Resigned,
            },
            vec![A::StopJob { signal: SIGTERM }],
        ),
        (P::Leading { token }, E::Interrupted { signal }) => (
            P::Draining {
                token,
                why: StopWhy::Interrupted(signal),
            },
            vec![A::StopJob { signal }],
        ),

        (
            P::Draining {
                why: StopWhy::Lost(_),
                ..
            },
            E::JobEnded { .. },
        ) => after_loss(p),
        (
            P::Draining {
                why: StopWhy::Paused | StopWhy::Resigned,
                ..
            },
            E::JobEnded { .. },
        ) => (P::Campaigning { attempt: 0 }, vec![A::Resign, A::Campaign]),
        (
            P::Draining {
                why: StopWhy::Interrupted(_),
                ..
            },
            E::JobEnded { exit, .. },
        ) => (P::Done(exit), vec![A::Resign, A::Exit(exit)]),
        // A second stopping signal while draining: stop waiting out the grace.
        (P::Draining { token, .. }, E::Interrupted { signal }) => (
            P::Draining {
                token,
                why: StopWhy::Interrupted(signal),
            },
            vec![A::KillJob],
        ),
        // A loss while already stopping for another reason: the stop is under way, and the
        // watchdog's deadline still holds.
        (phase @ P::Draining { .. }, E::Lost(_) | E::Paused | E::ResignRequested) => {
            (phase, vec![])
        }
        (phase, _) => (phase, vec![]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAMPAIGN: Policy = Policy {
        on_loss: OnLoss::Campaign,
        conflict_exit_code: 75,
    };
    const EXIT: Policy = Policy {
        on_loss: OnLoss::Exit,
        conflict_exit_code: 75,
    };

    fn leading() -> Phase {
        Phase::Leading { token: 42 }
    }

    #[test]
    fn elected_spawns_with_the_token() {
        let (p, a) = step(
            Phase::Campaigning { attempt: 0 },
            Event::Elected { token: 42 },
            &CAMPAIGN,
        );
        assert_eq!(p, leading());
        assert_eq!(a, vec![Action::Spawn { token: 42 }]);
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
            Event::CampaignFailed,
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
        let (p, a) = step(
            Phase::Campaigning { attempt: 0 },
            Event::Interrupted { signal: 15 },
            &CAMPAIGN,
        );
        assert_eq!(p, Phase::Done(Exit::Signal(15)));
        assert_eq!(a, vec![Action::Resign, Action::Exit(Exit::Signal(15))]);
    }

    #[test]
    fn job_exit_resigns_and_passes_the_code() {
        let ev = Event::JobEnded {
            exit: Exit::Job(7),
            by_watchdog: false,
        };
        let (p, a) = step(leading(), ev, &CAMPAIGN);
        assert_eq!(p, Phase::Done(Exit::Job(7)));
        assert_eq!(a, vec![Action::Resign, Action::Exit(Exit::Job(7))]);
    }

    #[test]
    fn a_lease_etcd_says_is_gone_kills_the_job_at_once() {
        let (p, a) = step(leading(), Event::Lost(LossReason::Expired), &CAMPAIGN);
        assert_eq!(
            p,
            Phase::Draining {
                token: 42,
                why: StopWhy::Lost(LossReason::Expired)
            }
        );
        assert_eq!(a, vec![Action::KillJob]);
    }

    #[test]
    fn loss_drains_then_campaigns_again() {
        let (p, a) = step(leading(), Event::Lost(LossReason::Deadline), &CAMPAIGN);
        assert_eq!(
            p,
            Phase::Draining {
                token: 42,
                why: StopWhy::Lost(LossReason::Deadline)
            }
        );
        assert_eq!(
            a,
            vec![Action::StopJob {
                signal: libc::SIGTERM
            }]
        );
        let ev = Event::JobEnded {
            exit: Exit::Signal(15),
            by_watchdog: false,
        };
        let (p, a) = step(p, ev, &CAMPAIGN);
        assert_eq!(p, Phase::Campaigning { attempt: 0 });
        assert_eq!(a, vec![Action::Resign, Action::Campaign]);
    }

    #[test]
    fn loss_with_on_loss_exit_exits_76() {
        let (p, _) = step(leading(), Event::Lost(LossReason::KeyDeleted), &EXIT);
        let ev = Event::JobEnded {
            exit: Exit::Signal(15),
            by_watchdog: false,
        };
        let (p, a) = step(p, ev, &EXIT);
        assert_eq!(p, Phase::Done(Exit::LeadershipLost));
        assert_eq!(a.last(), Some(&Action::Exit(Exit::LeadershipLost)));
    }

    #[test]
    fn watchdog_kill_counts_as_loss_not_as_job_exit() {
        let ev = Event::JobEnded {
            exit: Exit::Signal(9),
            by_watchdog: true,
        };
        let (p, a) = step(leading(), ev, &CAMPAIGN);
        assert_eq!(p, Phase::Campaigning { attempt: 0 });
        assert_eq!(a, vec![Action::Resign, Action::Campaign]);
    }

    #[test]
    fn interrupt_while_leading_forwards_then_exits_with_job_code() {
        let (p, a) = step(leading(), Event::Interrupted { signal: 2 }, &CAMPAIGN);
        assert_eq!(a, vec![Action::StopJob { signal: 2 }]);
        let (p2, a) = step(p, Event::Interrupted { signal: 15 }, &CAMPAIGN);
        assert_eq!(a, vec![Action::KillJob]);
        let ev = Event::JobEnded {
            exit: Exit::Job(0),
            by_watchdog: false,
        };
        let (p3, a) = step(p2, ev, &CAMPAIGN);
        assert_eq!(p3, Phase::Done(Exit::Job(0)));
        assert_eq!(a, vec![Action::Resign, Action::Exit(Exit::Job(0))]);
    }

    #[test]
    fn pause_drains_and_requeues() {
        let (p, a) = step(leading(), Event::Paused, &CAMPAIGN);
        assert_eq!(
            a,
            vec![Action::StopJob {
                signal: libc::SIGTERM
            }]
        );
        let ev = Event::JobEnded {
            exit: Exit::Signal(15),
            by_watchdog: false,
        };
        let (p, a) = step(p, ev, &EXIT);
        assert_eq!(p, Phase::Campaigning { attempt: 0 });
        assert_eq!(a, vec![Action::Resign, Action::Campaign]);
    }

    #[test]
    fn resign_stops_the_job_first_then_requeues() {
        let (p, a) = step(leading(), Event::ResignRequested, &EXIT);
        assert_eq!(
            p,
            Phase::Draining {
                token: 42,
                why: StopWhy::Resigned
            }
        );
        assert_eq!(
            a,
            vec![Action::StopJob {
                signal: libc::SIGTERM
            }]
        );
        let ev = Event::JobEnded {
            exit: Exit::Signal(15),
            by_watchdog: false,
        };
        let (p, a) = step(p, ev, &EXIT);
        assert_eq!(p, Phase::Campaigning { attempt: 0 });
        assert_eq!(a, vec![Action::Resign, Action::Campaign]);
    }

    #[test]
    fn loss_while_draining_changes_nothing() {
        let d = Phase::Draining {
            token: 1,
            why: StopWhy::Interrupted(15),
        };
        assert_eq!(
            step(d, Event::Lost(LossReason::Deadline), &CAMPAIGN),
            (d, vec![])
        );
    }
}
