//! The step functions, one named case per behaviour ([`cases`]), and the invariants every
//! transition keeps, over every phase and event and over random runs ([`invariants`]).

use super::*;

mod cases;
mod invariants;

/// Errors in these tests are names.
type E = &'static str;

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
const NO_WAIT: Policy = Policy {
    no_wait: true,
    ..CAMPAIGN
};

const TOKEN: i64 = 42;
const STOP: Action<E> = Action::StopJob { signal: SIGTERM };
const REVOKE: Action<E> = Action::RevokeLease;

fn campaigning() -> Phase {
    Phase::Campaigning { attempt: 0 }
}

fn leading_phase() -> Phase {
    Phase::Leading { token: TOKEN }
}

fn draining_phase(why: StopReason) -> Phase {
    Phase::Draining {
        token: TOKEN,
        why,
        lost: lost_of(why),
    }
}

/// What a term draining for `why` alone knows of its loss.
fn lost_of(why: StopReason) -> Option<Loss> {
    match why {
        StopReason::Lost(r) => Some(r),
        _ => None,
    }
}

/// Any event of any phase, so that one list of phases and one of events cover them all.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Any {
    Campaign(CampaignEnd<E>),
    Backoff(BackoffEnd),
    Delay(DelayEnd),
    Start(StartEnd<E>),
    Term(TermEvent),
    Drain(DrainEvent),
}

/// The step for `phase`, if `ev` is one of its events; `Done` has none.
fn step(phase: Phase, ev: Any, p: &Policy) -> Option<Step<E>> {
    Some(match (phase, ev) {
        (Phase::Campaigning { attempt }, Any::Campaign(e)) => campaigned(attempt, e, p),
        (Phase::BackingOff { attempt, .. }, Any::Backoff(e)) => backed_off(attempt, e),
        (Phase::Delaying { token }, Any::Delay(e)) => delaying(token, e, p),
        (Phase::Elected { token }, Any::Start(e)) => started(token, e, p),
        (Phase::Leading { token }, Any::Term(e)) => leading(token, e, p),
        (Phase::Draining { token, why, lost }, Any::Drain(e)) => draining(token, why, lost, e, p),
        _ => return None,
    })
}

fn job_ended(exit: Exit, by: EndedBy) -> TermEvent {
    TermEvent::JobEnded { exit, by }
}

/// The job's group is gone after a SIGTERM.
fn drained(by: EndedBy) -> DrainEvent {
    DrainEvent::JobEnded {
        exit: Exit::Signal(15),
        by,
    }
}

/// The run ends: the term's end recorded, the lease given up.
fn assert_ends(step: Step<E>, record: TermEnd, exit: Exit) {
    assert_eq!(
        step,
        (Phase::Done(exit), vec![Action::RecordEnd(record), REVOKE])
    );
}

/// Back in line: the end recorded, the lease given up, a fresh campaign.
fn assert_requeued(step: Step<E>, record: TermEnd) {
    assert_eq!(
        step,
        (campaigning(), vec![Action::RecordEnd(record), REVOKE])
    );
}
