//! The lifecycle of one `lead-exec run`, as a pure state machine: one event type and one step
//! function per phase.
//!
//! ```text
//!             Elected           Spawned            Lost / Paused / Signal / Unhealthy / ...
//! Campaigning ───────▶ Elected  ───────▶ Leading ───────────────────────────▶ Draining
//!   ▲ │ │  │              ▲ │ NotStarted   │ JobEnded (on its own)              │ JobEnded
//!   │ │ │  │ Elected,     │ │ AlreadyDone  ▼                                    ▼
//!   │ │ │  │ unclean end  │ └──────▶ Done(exit)  ◀── (interrupted, or --on-loss exit)
//!   │ │ │  └─▶ Delaying ──┘ Done           ▲
//!   │ │ │ Failed                           └── campaign again (lost, paused, resigned,
//!   │ │ └──────────▶ BackingOff                unhealthy, --on-loss campaign)
//!   │ └── Unhealthy: leave the line, campaign again once healthy
//!   └─────────────────────┘ Done
//! ```
//!
//! | phase | what it waits for | its events | its step |
//! |---|---|---|---|
//! | `Campaigning` | the campaign | [`CampaignEnd`] | [`campaigned`] |
//! | `BackingOff` | the backoff | [`BackoffEnd`] | [`backed_off`] |
//! | `Delaying` | `--takeover-delay`, the term | [`DelayEnd`] | [`delaying`] |
//! | `Elected` | the job's start | [`StartEnd`] | [`started`] |
//! | `Leading` | the term, the job | [`TermEvent`] | [`leading`] |
//! | `Draining` | the job's end, signals, the loss of its lease or key | [`DrainEvent`] | [`draining`] |
//!
//! Each step function matches every event of its phase and nothing else, so no arm answers
//! "cannot happen", and a new event does not compile until its transition is decided. The
//! waiting itself is the driver's (see [`super::events`]), which waits only for the sources a
//! phase has: a phase cannot be told an event of another.
//!
//! `Delaying` is `--takeover-delay` (elected after a term that ended uncleanly) or
//! `--retry-delay` (elected after a failed attempt): the lease renewed, the job not started
//! yet. `Exhausted` (every `--attempts` made) ends the run from `Elected` as `AlreadyDone` does. A worker whose health check failed `--health-failures`
//! times in a row before the start gives the term up and campaigns again without a job.
//!
//! A step never gives up the lease itself: [`Action::RevokeLease`] says when. Leaving the
//! candidacy (a new campaign, a backoff, the end of the run) always revokes it, so that the
//! next candidate takes over at once; the tests below hold every transition to that.
//!
//! The errors a phase may end with (`E`) pass through untouched: the step decides whether the
//! run fails with one or reports it and retries, and hands it to the action that does so.

use std::time::Duration;

use crate::config::OnLoss;
use crate::election::lease::Loss;
use crate::exit::Exit;
use crate::records::history::TermEnd;

mod describe;
pub use describe::SignalName;

#[cfg(test)]
mod tests;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// In line (or waiting for a passing health check first), on a lease of our own.
    Campaigning {
        attempt: u32,
    },
    /// Out of line after a failed campaign, waiting `wait` before the next.
    BackingOff {
        attempt: u32,
        wait: Duration,
    },
    /// Elected after an unclean end: waiting out `--takeover-delay` before the start.
    Delaying {
        token: i64,
    },
    /// The campaign won and was confirmed; the job is being started.
    Elected {
        token: i64,
    },
    Leading {
        token: i64,
    },
    /// The job is being stopped, for `why`. `lost`: the term is known lost to its lease or key
    /// (from the start, for `why` = `Lost`, or since, while the job was being stopped).
    Draining {
        token: i64,
        why: StopReason,
        lost: Option<Loss>,
    },
    Done(Exit),
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Campaigning { .. } => "campaigning",
            Phase::BackingOff { .. } => "backing-off",
            Phase::Delaying { .. } => "takeover-delay",
            Phase::Elected { .. } => "elected",
            Phase::Leading { .. } => "leading",
            Phase::Draining { .. } => "draining",
            Phase::Done(_) => "done",
        }
    }

    /// The fencing token of the term this phase belongs to.
    pub fn token(&self) -> Option<i64> {
        match *self {
            Phase::Delaying { token }
            | Phase::Elected { token }
            | Phase::Leading { token }
            | Phase::Draining { token, .. } => Some(token),
            Phase::Campaigning { .. } | Phase::BackingOff { .. } | Phase::Done(_) => None,
        }
    }

    /// Whether the term is known lost to its lease or key.
    pub fn lost(&self) -> Option<Loss> {
        match *self {
            Phase::Draining { lost, .. } => lost,
            _ => None,
        }
    }

    /// Whether a job may be running in this phase.
    pub fn has_job(&self) -> bool {
        matches!(self, Phase::Leading { .. } | Phase::Draining { .. })
    }

    /// Whether this phase holds a lease of ours (a candidacy, and maybe a term on it).
    pub fn has_lease(&self) -> bool {
        !matches!(self, Phase::BackingOff { .. } | Phase::Done(_))
    }
}

/// Why lead-exec is stopping a running job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Lost(Loss),
    Paused,
    /// An operator's `lead-exec resign`.
    Resigned,
    /// A waiting candidate of higher `--priority`, after `--min-term`.
    Preempted,
    /// A signal to lead-exec itself (TERM, INT, HUP, QUIT).
    Interrupted(i32),
    /// The job ran for `--timeout`.
    TimedOut,
    /// The job ran for `--timeout`, then a stopping signal reached lead-exec during the grace.
    TimedOutThenInterrupted(i32),
    /// The health check failed `--health-failures` times in a row.
    Unhealthy,
}

/// Why a campaign failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause<E> {
    /// etcd failed us: `--no-wait` reports it instead of retrying.
    Etcd(E),
    /// Our lease or key went away while we queued: only a retry helps.
    CandidacyLost(Loss),
}

/// How a campaign ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CampaignEnd<E> {
    /// Won and confirmed. `delay` is set when the previous term ended uncleanly and
    /// `--takeover-delay` asks for a wait before the start.
    Elected {
        token: i64,
        delay: bool,
    },
    /// The health check failed `--health-failures` times in a row while we queued.
    Unhealthy,
    /// Someone else leads and the wait policy (`--wait`, `--no-wait`) gave up; `unhealthy`
    /// when it gave up waiting for a passing health check instead.
    NotAcquired {
        unhealthy: bool,
    },
    Failed(Cause<E>),
    /// Refused in a way that a retry would only repeat (a `--slots` the election does not run
    /// with): the run ends with it.
    Refused(E),
    /// A stopping signal reached lead-exec.
    Interrupted {
        signal: i32,
    },
}

/// How a backoff ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffEnd {
    Done,
    Interrupted { signal: i32 },
}

/// What ends or disturbs a term while `--takeover-delay` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayEnd {
    /// The delay is over.
    Done,
    Lost(Loss),
    /// The keepalive task is gone without a word: nothing renews the lease any more.
    LeaseTaskEnded,
    Paused,
    ResignRequested,
    Unhealthy,
    Interrupted {
        signal: i32,
    },
    /// A signal for the job (USR1, USR2), with no job yet to pass it to.
    Forwarded(i32),
    /// A higher-priority candidate asks for the term.
    HandoverAsked,
    /// Whether a higher-priority candidate is still in line (`None`: etcd did not answer).
    Outranked(Option<bool>),
}

/// How the start of the job went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartEnd<E> {
    Spawned,
    /// Not started: the term's lease was lost, or left it too little time, or its watchdog
    /// did not answer.
    NotStarted,
    /// Not started: another worker already finished this run key.
    AlreadyDone,
    /// Not started: `--attempts` were all made at this run key, none successful.
    Exhausted,
    /// Not started: with `--attempts`, the `--every` period of the run key is over (the next
    /// tick's workers take the next key).
    PeriodOver,
    /// Not started: the health check failed since the election.
    Unhealthy,
    /// Not started, and the run ends with this error: the command cannot run (not found, not
    /// executable), or etcd failed the check of the run key.
    Failed(E),
}

/// What ended a job's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndedBy {
    /// The job: it exited, on its own or on a stop lead-exec ordered.
    Job,
    /// Its watchdog, at the lease's deadline: lead-exec had not renewed the lease in time.
    Deadline,
    /// The loss of its watchdog: lead-exec killed what was left (or the watchdog, orphaned,
    /// killed it).
    WatchdogGone,
}

impl EndedBy {
    /// Whether the job was killed without lead-exec ordering it: its term cannot be trusted
    /// to have lasted, and is recorded as lost.
    pub fn by_watchdog(self) -> bool {
        self != EndedBy::Job
    }
}

/// What ends or disturbs a term while its job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermEvent {
    /// The job's process group is gone. `exit` is what lead-exec would exit with for it.
    JobEnded {
        exit: Exit,
        by: EndedBy,
    },
    Lost(Loss),
    /// The keepalive task is gone without a word: nothing renews the lease any more.
    LeaseTaskEnded,
    Paused,
    /// An operator asked this leader to step down.
    ResignRequested,
    /// The job has run for `--timeout`.
    TimedOut,
    /// The health check failed `--health-failures` times in a row.
    Unhealthy,
    /// A signal reached lead-exec.
    Signal(Arrived),
    /// A higher-priority candidate asks for the term; the job's `--min-term` has this left.
    HandoverAsked {
        min_term_left: Duration,
    },
    /// Whether a higher-priority candidate is still in line (`None`: etcd did not answer).
    Outranked(Option<bool>),
}

/// A signal to lead-exec, typed where it arrives: on the signal thread ([`super::signals`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrived {
    /// TERM, INT, HUP or QUIT: the run ends, a running job stopped with this signal first.
    Stop(i32),
    /// USR1 or USR2: for the job alone. What it means while no job runs is each phase's to
    /// say.
    Forward(i32),
}

impl Arrived {
    /// What a caught signal is for.
    pub fn of(sig: i32) -> Arrived {
        if matches!(
            sig,
            libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT
        ) {
            Arrived::Stop(sig)
        } else {
            Arrived::Forward(sig)
        }
    }

    pub fn number(self) -> i32 {
        match self {
            Arrived::Stop(s) | Arrived::Forward(s) => s,
        }
    }
}

/// What reaches a term while its job is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainEvent {
    JobEnded {
        exit: Exit,
        by: EndedBy,
    },
    /// etcd says the lease or the key is gone, or the lease runs out unrenewed.
    Lost(Loss),
    Signal(Arrived),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<E> {
    /// Send this signal to the job's group, SIGKILL after the grace.
    StopJob { signal: i32 },
    /// SIGKILL the job's group now.
    KillJob,
    /// Pass a signal that does not stop the run (USR1, USR2) on to the job.
    Forward(i32),
    /// Ask whether a higher-priority candidate is still in line after this long.
    HandOverIn(Duration),
    /// Forget a handover request: nobody who outranks us waits any more.
    KeepTerm,
    /// Write how the term ended (and, on a success, the run key), while our key still guards
    /// the write.
    RecordEnd(TermEnd),
    /// Revoke our lease, which deletes our key: the next candidate takes over at once.
    RevokeLease,
    /// Log why the campaign failed; it is retried after the backoff.
    Report(E),
    /// End the run with this error.
    Fail(E),
}

/// A step: the next phase and what to do on the way there, in order.
pub type Step<E> = (Phase, Vec<Action<E>>);

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

/// How soon a leader asks again whether a higher-priority candidate waits, when etcd did not
/// answer.
pub const HANDOVER_RETRY: Duration = Duration::from_secs(1);

const SIGTERM: i32 = libc::SIGTERM;

/// Back in line: the lease given up, a fresh campaign.
fn requeue<E>(record: Option<TermEnd>) -> Step<E> {
    let mut actions: Vec<Action<E>> = record.map(Action::RecordEnd).into_iter().collect();
    actions.push(Action::RevokeLease);
    (Phase::Campaigning { attempt: 0 }, actions)
}

/// The run ends: the lease given up (after the term's record, if a term ends).
fn done<E>(record: Option<TermEnd>, exit: Exit) -> Step<E> {
    let mut actions: Vec<Action<E>> = record.map(Action::RecordEnd).into_iter().collect();
    actions.push(Action::RevokeLease);
    (Phase::Done(exit), actions)
}

/// The term is lost: `--on-loss` says whether to campaign again or exit.
fn after_loss<E>(p: &Policy, record: Option<TermEnd>) -> Step<E> {
    match p.on_loss {
        OnLoss::Exit => done(record, Exit::LeadershipLost),
        OnLoss::Campaign => requeue(record),
    }
}

/// Whether the step from `phase` to `next`, on an event that ended the job as `ended` says
/// (if it did), is where the run learns that its term is lost, and why: the run says it and
/// counts it then, once per term.
///
/// lead-exec learns of most losses itself (its lease, the key): on the way into draining, or
/// while the job is being stopped for another reason. The one it may not: its watchdog killed
/// the job at the lease's deadline on its own, which lead-exec, frozen or starved until then,
/// first hears of as the job's end. That end is where the loss is learned, unless it was
/// known before.
pub fn loss_learned(phase: Phase, ended: Option<EndedBy>, next: Phase) -> Option<Loss> {
    if phase.lost().is_some() {
        return None;
    }
    next.lost()
        .or((ended == Some(EndedBy::Deadline)).then_some(Loss::Deadline))
}

fn stay<E>(phase: Phase, action: Action<E>) -> Step<E> {
    (phase, vec![action])
}

fn drain<E>(token: i64, why: StopReason, first: Action<E>) -> Step<E> {
    let lost = match why {
        StopReason::Lost(r) => Some(r),
        _ => None,
    };
    (Phase::Draining { token, why, lost }, vec![first])
}

pub fn campaigned<E>(attempt: u32, ev: CampaignEnd<E>, p: &Policy) -> Step<E> {
    use CampaignEnd as C;
    match ev {
        C::Elected {
            token,
            delay: false,
        } => (Phase::Elected { token }, vec![]),
        C::Elected { token, delay: true } => (Phase::Delaying { token }, vec![]),
        // Out of line until healthy again: the next campaign waits for a passing check.
        C::Unhealthy => requeue(None),
        // A worker kept out by its own health check says so in its exit code: it is not
        // that someone else leads.
        C::NotAcquired { unhealthy: true } => done(None, Exit::Unhealthy),
        C::NotAcquired { unhealthy: false } => done(None, Exit::NotAcquired(p.conflict_exit_code)),
        C::Failed(Cause::Etcd(e)) if p.no_wait => (
            Phase::Campaigning { attempt },
            vec![Action::RevokeLease, Action::Fail(e)],
        ),
        C::Failed(cause) => {
            let mut actions = vec![Action::RevokeLease];
            if let Cause::Etcd(e) = cause {
                actions.push(Action::Report(e));
            }
            let wait = backoff(attempt);
            let attempt = attempt + 1;
            (Phase::BackingOff { attempt, wait }, actions)
        }
        C::Refused(e) => (
            Phase::Done(Exit::Usage),
            vec![Action::RevokeLease, Action::Fail(e)],
        ),
        C::Interrupted { signal } => done(None, Exit::Signal(signal)),
    }
}

pub fn backed_off<E>(attempt: u32, ev: BackoffEnd) -> Step<E> {
    match ev {
        BackoffEnd::Done => (Phase::Campaigning { attempt }, vec![]),
        // The candidacy was given up before the backoff: nothing to revoke.
        BackoffEnd::Interrupted { signal } => (Phase::Done(Exit::Signal(signal)), vec![]),
    }
}

pub fn delaying<E>(token: i64, ev: DelayEnd, p: &Policy) -> Step<E> {
    let here = Phase::Delaying { token };
    match ev {
        DelayEnd::Done => (Phase::Elected { token }, vec![]),
        // No job runs yet, so there is nothing to stop or record.
        DelayEnd::Lost(_) | DelayEnd::LeaseTaskEnded => after_loss(p, None),
        DelayEnd::Paused | DelayEnd::ResignRequested | DelayEnd::Unhealthy => requeue(None),
        DelayEnd::Interrupted { signal } => done(None, Exit::Signal(signal)),
        // No job yet to pass it to, and not a reason to end the term: dropped, the delay
        // goes on. (Campaigning and backing off drop it the same way: no job, no term.)
        DelayEnd::Forwarded(_) => (here, vec![]),
        // No job runs yet: handing over costs nothing, so --min-term waits for none.
        DelayEnd::HandoverAsked => stay(here, Action::HandOverIn(Duration::ZERO)),
        DelayEnd::Outranked(Some(false)) => stay(here, Action::KeepTerm),
        // etcd trouble is no reason to keep a term that has not started.
        DelayEnd::Outranked(Some(true) | None) => requeue(None),
    }
}

pub fn started<E>(token: i64, ev: StartEnd<E>, p: &Policy) -> Step<E> {
    match ev {
        StartEnd::Spawned => (Phase::Leading { token }, vec![]),
        // Lost between the confirmation and the start: never run on an unconfirmed term. No
        // job ran, so the record says so, and the next leader has nothing to wait out.
        StartEnd::NotStarted => after_loss(p, Some(TermEnd::NotStarted)),
        StartEnd::AlreadyDone => done(None, Exit::Ok),
        // Every worker ends so: the next in line is elected at once and finds the same.
        StartEnd::Exhausted => done(None, Exit::AttemptsExhausted),
        // As when --wait runs out: the period this worker waited for is gone.
        StartEnd::PeriodOver => done(None, Exit::NotAcquired(p.conflict_exit_code)),
        // The check failed N times in a row between the election and the start: give the term
        // up without starting the job (closing a start record already written, as clean).
        StartEnd::Unhealthy => requeue(Some(TermEnd::Unhealthy)),
        // The error names the exit (126, 127, 69); the next candidate takes over at once, the
        // term's record (written ahead under --takeover-delay) closed as not started.
        StartEnd::Failed(e) => (
            Phase::Done(Exit::Software),
            vec![
                Action::RecordEnd(TermEnd::NotStarted),
                Action::RevokeLease,
                Action::Fail(e),
            ],
        ),
    }
}

pub fn leading<E>(token: i64, ev: TermEvent, p: &Policy) -> Step<E> {
    use TermEvent as T;
    let here = Phase::Leading { token };
    let stop = Action::StopJob { signal: SIGTERM };
    match ev {
        T::JobEnded { by, .. } if by.by_watchdog() => after_loss(p, Some(TermEnd::LeaseLost)),
        T::JobEnded { exit, .. } => done(Some(TermEnd::Exited(exit.code())), exit),
        // etcd said the lease is gone: the next leader may already run, so no grace.
        T::Lost(Loss::Expired) => drain(token, StopReason::Lost(Loss::Expired), Action::KillJob),
        T::Lost(r) => drain(token, StopReason::Lost(r), stop),
        // Without its renewals the lease runs out at D: as good as lost now.
        T::LeaseTaskEnded => drain(token, StopReason::Lost(Loss::Deadline), stop),
        T::Paused => drain(token, StopReason::Paused, stop),
        T::ResignRequested => drain(token, StopReason::Resigned, stop),
        T::TimedOut => drain(token, StopReason::TimedOut, stop),
        T::Unhealthy => drain(token, StopReason::Unhealthy, stop),
        T::Signal(Arrived::Stop(signal)) => drain(
            token,
            StopReason::Interrupted(signal),
            Action::StopJob { signal },
        ),
        T::Signal(Arrived::Forward(s)) => stay(here, Action::Forward(s)),
        // The job keeps its --min-term; the request is judged when it is over.
        T::HandoverAsked { min_term_left } => stay(here, Action::HandOverIn(min_term_left)),
        T::Outranked(Some(true)) => drain(token, StopReason::Preempted, stop),
        T::Outranked(Some(false)) => stay(here, Action::KeepTerm),
        // etcd did not answer: ask again soon rather than stop the job on a request that may
        // have lapsed.
        T::Outranked(None) => stay(here, Action::HandOverIn(HANDOVER_RETRY)),
    }
}

pub fn draining<E>(
    token: i64,
    why: StopReason,
    lost: Option<Loss>,
    ev: DrainEvent,
    p: &Policy,
) -> Step<E> {
    use StopReason as S;
    let here = |why| Phase::Draining { token, why, lost };
    match ev {
        DrainEvent::JobEnded { exit, by } => {
            // A term lost while its job was being stopped, or whose job the watchdog killed on
            // its own, is recorded as lost, whatever stopped it.
            let lost = lost.is_some() || by.by_watchdog();
            let record = |otherwise| Some(if lost { TermEnd::LeaseLost } else { otherwise });
            match why {
                S::Lost(_) => after_loss(p, Some(TermEnd::LeaseLost)),
                S::Paused => requeue(record(TermEnd::Paused)),
                S::Resigned => requeue(record(TermEnd::Resigned)),
                S::Preempted => requeue(record(TermEnd::Preempted)),
                S::Unhealthy => requeue(record(TermEnd::Unhealthy)),
                // A stop ends the run as its job's exit says; a lost term's as lost (76), so
                // that a job that exits 0 on the stop does not pass for a successful run.
                S::Interrupted(s) => done(
                    record(TermEnd::Signal(s)),
                    if lost { Exit::LeadershipLost } else { exit },
                ),
                // Stopped at --timeout: not a success (a run key stays open), and the next
                // candidate takes over at once.
                S::TimedOut => done(record(TermEnd::TimedOut), Exit::TimedOut),
                S::TimedOutThenInterrupted(s) => {
                    done(record(TermEnd::TimedOutThenSignal(s)), Exit::TimedOut)
                }
            }
        }
        // Known lost while the job is being stopped, whatever for. etcd said the lease is gone:
        // the next leader may already run, so the grace is cut short. Otherwise the stop
        // under way goes on, within the watchdog's deadline.
        DrainEvent::Lost(r) => {
            let next = Phase::Draining {
                token,
                why,
                lost: lost.or(Some(r)),
            };
            let kill = r == Loss::Expired && lost != Some(Loss::Expired);
            (next, kill.then_some(Action::KillJob).into_iter().collect())
        }
        // A stop (`systemctl stop`, ^C) during the timeout's grace: the job gets SIGKILL at
        // once, as for any second stop, but the run still ends as timed out (124), since that
        // is what stopped the job first; the record names both.
        DrainEvent::Signal(Arrived::Stop(signal)) => match why {
            S::TimedOut | S::TimedOutThenInterrupted(_) => (
                here(S::TimedOutThenInterrupted(signal)),
                vec![Action::KillJob],
            ),
            // A second stopping signal while draining: stop waiting out the grace. A lost
            // term stays lost.
            _ => (here(S::Interrupted(signal)), vec![Action::KillJob]),
        },
        DrainEvent::Signal(Arrived::Forward(s)) => stay(here(why), Action::Forward(s)),
    }
}
