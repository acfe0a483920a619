//! `lead-exec run`: the driver that carries out [`lifecycle`]'s decisions.
//!
//! The run is one `State`: its phase, holding exactly the scopes that phase has. A scope is
//! one lifetime and what lives as long as it does:
//!
//! | scope | lives | holds | its behaviour |
//! |---|---|---|---|
//! | [`Driver`] | the process | [`Env`] (config, etcd scope, our key's value), signals, health verdicts, the [`term::Launcher`], the last token | the loop: wait, step, act |
//! | [`candidacy::Candidacy`] | one lease | the lease, and how its term was closed | the campaign, which makes it; the revoke, which ends it |
//! | [`term::Term`] | one won election | token, key, slot, its [`events::TermEvents`], its start record | the job's start; the end record, which ends it |
//! | [`events::RunningJob`] | one job | the job under its watchdog, its start, its `--timeout` | its end |
//!
//! A job without its term, or a term without its lease, cannot be written: `State::Leading`
//! holds all three, `State::Campaigning` none. The driver waits for the next event of its
//! state (the state has the sources), asks the phase's step function what the event means,
//! and carries out the actions in order on what the state held ([`Held`]). Actions move
//! scopes out: the end record consumes the term, and only [`Action::RevokeLease`] gives up
//! the lease. What is left then makes the next state; a step that left scopes its next
//! phase cannot hold is a bug, and fails closed. All I/O of a run lives in this folder; the
//! decisions are [`lifecycle`]'s.
//!
//! - [`candidacy`]: start-up, the campaign and its lease, the health gate, the backoff.
//! - [`term`]: a won term's start (the job under its watchdog) and its end records.
//! - [`events`]: where a term's events come from.
//!
//! Adding a per-term control takes one field on [`term::Term`] (or a source in
//! [`events::TermEvents`]), one [`lifecycle::TermEvent`] variant, and one arm in
//! [`lifecycle::leading`].

pub mod candidacy;
pub mod env;
pub mod events;
pub mod health;
pub mod lifecycle;
pub mod signals;
pub mod term;

use std::time::Duration;

use anyhow::Result;

use crate::config::RunConfig;
use crate::election::campaign::Wait;
use crate::election::lease::Loss;

use crate::exit::{fail, Exit};
use crate::metrics;
use crate::metrics::textfile::{self, JobRun, RunOutcome};
use candidacy::{Campaigned, Candidacy, Process, StartUp};
pub use env::{Env, Failure};
use events::{Around, RunningJob};
use lifecycle::{Action, DrainEvent, Phase, Policy, StopReason, TermEvent};
use term::Term;

/// Runs until the job is done (or leadership is given up) and returns how it ended. Inside
/// the run's span ([`crate::logging::run_span`]), which carries the election and the id to
/// every line of it.
pub async fn run(cfg: RunConfig) -> Result<Exit> {
    let textfile = cfg.metrics_textfile.clone();
    let max_attempts = cfg.attempts.map(|a| a.max);
    let (election, period_s) = (
        cfg.election.name().to_string(),
        cfg.period.as_ref().map(|p| p.length_s),
    );
    let mut last_job = None;
    // Each phase's future is boxed where the driver awaits it (here, in `drive` and in
    // `perform`): held inline, every future that awaits one would be as large as the largest
    // phase, and so would the stack frame that polls them, touched again at each wake-up.
    let exit = match Box::pin(candidacy::start_up(cfg)).await {
        Ok(Ok((process, startup))) => {
            let mut driver = Driver {
                process,
                last_token: None,
                last_job: None,
            };
            let exit = Box::pin(driver.drive(startup)).await;
            last_job = driver.last_job;
            exit
        }
        Ok(Err(done)) => Ok(done),
        Err(e) => Err(e),
    };
    // Every way a run that reached etcd ends, a job run or not: the file says this worker
    // took part. One that failed (etcd unreachable, refused, a command that cannot run)
    // did not, and leaves the file to go stale.
    if let (Some(path), Ok(exit)) = (textfile, &exit) {
        let outcome = outcome_of(*exit, last_job, period_s, max_attempts);
        textfile::write_retrying(&path, &election, &outcome);
    }
    exit
}

/// What `--metrics-textfile` says of a run that ended with `exit`, its last job `job`.
fn outcome_of(
    exit: Exit,
    mut job: Option<JobRun>,
    period_s: Option<i64>,
    max_attempts: Option<u32>,
) -> RunOutcome {
    // The job was stopped at --timeout: its code is the signal that stopped it, the run's 124.
    if let (Exit::TimedOut, Some((_, code))) = (exit, job.as_mut().and_then(|j| j.ended.as_mut())) {
        *code = exit.code();
    }
    // The last attempt failed here: every worker still in line will find them all made.
    let last_failed = job.is_some_and(|j| {
        j.attempt.is_some() && j.attempt == max_attempts && j.ended.is_none_or(|(_, c)| c != 0)
    });
    RunOutcome {
        now_ms: crate::election::unix_ms(),
        period_s,
        job,
        exhausted: exit == Exit::AttemptsExhausted || last_failed,
    }
}

/// The process's side of a run: what lives as long as lead-exec does.
pub struct Driver {
    /// What start-up made: the environment, health verdicts, signals, the launcher, the
    /// `--wait` limit (cleared by a term that ran a job: `--wait` bounds a wait in line, not
    /// the life of the process), the version warning (said when the first job starts).
    process: Process,
    /// The token of this process's previous term.
    last_token: Option<i64>,
    /// The job this process started last, for `--metrics-textfile`.
    last_job: Option<JobRun>,
}

/// The run between two steps: its phase, with exactly the scopes of that phase.
enum State {
    /// No lease yet: the campaign grants one.
    Campaigning {
        attempt: u32,
    },
    /// No lease: it was given up after a failed campaign.
    BackingOff {
        attempt: u32,
        wait: Duration,
    },
    /// Elected after an unclean end, waiting out `--takeover-delay`.
    Delaying(Candidacy, Term),
    /// Elected and confirmed; the job is to be started.
    Elected(Candidacy, Term),
    Leading(Candidacy, Term, RunningJob),
    /// The job being stopped for a reason; and whether the term is known lost.
    Draining(Candidacy, Term, RunningJob, StopReason, Option<Loss>),
    Done(Exit),
}

impl State {
    /// The phase, as [`lifecycle`] knows it: the token is the term's own.
    fn phase(&self) -> Phase {
        match self {
            State::Campaigning { attempt } => Phase::Campaigning { attempt: *attempt },
            State::BackingOff { attempt, wait } => Phase::BackingOff {
                attempt: *attempt,
                wait: *wait,
            },
            State::Delaying(_, t) => Phase::Delaying { token: t.token },
            State::Elected(_, t) => Phase::Elected { token: t.token },
            State::Leading(_, t, _) => Phase::Leading { token: t.token },
            State::Draining(_, t, _, why, lost) => Phase::Draining {
                token: t.token,
                why: *why,
                lost: *lost,
            },
            State::Done(exit) => Phase::Done(*exit),
        }
    }

    /// The state of phase `next`, made of what the step's actions left; `Err` when those are
    /// not what `next` holds.
    // One run holds one of these at a time, moved once per step: boxing would buy nothing.
    #[allow(clippy::result_large_err)]
    fn enter(next: Phase, held: Held) -> Result<State, (Phase, Held)> {
        Ok(match (next, held) {
            (Phase::Campaigning { attempt }, Held::Nothing) => State::Campaigning { attempt },
            (Phase::BackingOff { attempt, wait }, Held::Nothing) => {
                State::BackingOff { attempt, wait }
            }
            (Phase::Done(exit), Held::Nothing) => State::Done(exit),
            (Phase::Delaying { .. }, Held::Term(c, t)) => State::Delaying(c, t),
            (Phase::Elected { .. }, Held::Term(c, t)) => State::Elected(c, t),
            (Phase::Leading { .. }, Held::Job(c, t, j)) => State::Leading(c, t, j),
            (Phase::Draining { why, lost, .. }, Held::Job(c, t, j)) => {
                State::Draining(c, t, j, why, lost)
            }
            (next, held) => return Err((next, held)),
        })
    }
}

/// What a state held, while a step's actions work on it.
// One at a time, moved once per action: boxing the scopes would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Held {
    Nothing,
    /// Our lease, with no term on it: in line, or its term just ended.
    Lease(Candidacy),
    Term(Candidacy, Term),
    Job(Candidacy, Term, RunningJob),
}

impl Held {
    fn name(&self) -> &'static str {
        match self {
            Held::Nothing => "nothing",
            Held::Lease(_) => "a lease",
            Held::Term(..) => "a term",
            Held::Job(..) => "a job",
        }
    }
}

impl Driver {
    async fn drive(&mut self, startup: StartUp) -> Result<Exit> {
        let policy = Policy {
            on_loss: self.process.env.cfg.on_loss,
            conflict_exit_code: self.process.env.cfg.conflict_exit_code,
            no_wait: self.process.env.cfg.wait == Wait::No,
        };
        let mut startup = Some(startup);
        let mut state = State::Campaigning { attempt: 0 };
        loop {
            let phase = state.phase();
            // What ended the job, if this step's event was its end.
            let mut ended = None;
            let (held, step, seen) = match state {
                State::Campaigning { attempt } => {
                    let ask = candidacy::Ask {
                        env: &self.process.env,
                        signals: &mut self.process.signals,
                        health: &mut self.process.health,
                        give_up_at: &mut self.process.give_up_at,
                        last_token: &mut self.last_token,
                        launcher: &mut self.process.launcher,
                    };
                    let (ev, campaigned) =
                        Box::pin(candidacy::campaign(ask, startup.take())).await?;
                    let held = match campaigned {
                        Campaigned::Nothing => Held::Nothing,
                        Campaigned::Lease(c) => Held::Lease(c),
                        Campaigned::Term(c, t) => Held::Term(c, t),
                    };
                    let seen = ev.to_string();
                    (held, lifecycle::campaigned(attempt, ev, &policy), seen)
                }
                State::BackingOff { attempt, wait } => {
                    let ev = candidacy::backoff(
                        wait,
                        self.process.give_up_at,
                        &mut self.process.signals,
                    )
                    .await;
                    let step = lifecycle::backed_off(attempt, ev);
                    (Held::Nothing, step, ev.to_string())
                }
                State::Delaying(c, mut t) => {
                    let around = Around {
                        ctx: &self.process.env.ctx,
                        lease: &c.lease,
                        signals: &mut self.process.signals,
                    };
                    let ev = t.events.next_while_delaying(t.token, around).await;
                    let step = lifecycle::delaying(t.token, ev, &policy);
                    (Held::Term(c, t), step, ev.to_string())
                }
                State::Elected(c, mut t) => {
                    let health = self.process.health.as_ref();
                    let (ev, job) = Box::pin(t.start(
                        &self.process.env,
                        &c.lease,
                        &mut self.process.launcher,
                        health,
                    ))
                    .await;
                    let seen = ev.to_string();
                    let step = lifecycle::started(t.token, ev, &policy);
                    let held = match job {
                        Some(j) => {
                            self.last_job = Some(JobRun {
                                token: t.token,
                                attempt: t.attempt(),
                                started_ms: crate::election::unix_ms(),
                                ended: None,
                            });
                            self.job_started();
                            Held::Job(c, t, j)
                        }
                        None => Held::Term(c, t),
                    };
                    (held, step, seen)
                }
                State::Leading(c, mut t, mut j) => {
                    let around = Around {
                        ctx: &self.process.env.ctx,
                        lease: &c.lease,
                        signals: &mut self.process.signals,
                    };
                    let ev = t.events.next_term_event(t.token, &mut j, around).await;
                    let step = lifecycle::leading(t.token, ev, &policy);
                    if let TermEvent::JobEnded { by, .. } = ev {
                        ended = Some(by);
                    }
                    self.job_ended(ev);
                    // An ended job's group is gone: the term goes on without it.
                    let held = match ev {
                        TermEvent::JobEnded { .. } => Held::Term(c, t),
                        _ => Held::Job(c, t, j),
                    };
                    (held, step, ev.to_string())
                }
                State::Draining(c, mut t, mut j, why, lost) => {
                    let around = Around {
                        ctx: &self.process.env.ctx,
                        lease: &c.lease,
                        signals: &mut self.process.signals,
                    };
                    let known_lost = lost.is_some();
                    let ev = t
                        .events
                        .next_while_draining(&mut j, around, known_lost)
                        .await;
                    let step = lifecycle::draining(t.token, why, lost, ev, &policy);
                    if let DrainEvent::JobEnded { exit, by } = ev {
                        ended = Some(by);
                        self.job_ended(TermEvent::JobEnded { exit, by });
                    }
                    let held = match ev {
                        DrainEvent::JobEnded { .. } => Held::Term(c, t),
                        DrainEvent::Signal(_) | DrainEvent::Lost(_) => Held::Job(c, t, j),
                    };
                    (held, step, ev.to_string())
                }
                State::Done(exit) => return Ok(exit),
            };
            if let Some(r) = lifecycle::loss_learned(phase, ended, step.0) {
                // Before the job is stopped: the next holder may start at any moment.
                metrics::term_lost();
                metrics::lost(r.label());
                // At the default level, whatever --on-loss does next: the phase lines that
                // say why are below it.
                let what = match step.0 {
                    Phase::Draining { .. } => "stopping the job",
                    _ => "its watchdog killed the job",
                };
                tracing::warn!(
                    token = phase.token(),
                    reason = r.label(),
                    "leadership lost: {}; {what}",
                    r.as_str()
                );
            }
            let (next, actions) = step;
            // A step that stays in its phase is quiet only when it passes a signal on or
            // judges a handover. One that reads the same phase but kills the job (a second
            // stop while draining) or gives up the lease (out of line on a failing health
            // check) changed the run, and says so; so does one that does nothing (a signal
            // for the job dropped, with no job yet to pass it to).
            let quiet = !actions.is_empty()
                && actions.iter().all(|a| {
                    matches!(
                        a,
                        Action::Forward(_) | Action::HandOverIn(_) | Action::KeepTerm
                    )
                });
            // Below the default level: a cron line's successful run says that the job
            // started and how it ended (the term's own lines), not every step on the way.
            if next != phase || !quiet {
                tracing::debug!(
                    token = next.token().or(phase.token()),
                    "{} -> {} on {seen}",
                    phase.name(),
                    next.name()
                );
            }
            let mut held = held;
            for action in actions {
                held = Box::pin(self.perform(held, action)).await?;
            }
            state = match State::enter(next, held) {
                Ok(s) => s,
                // A step's actions left what its next phase cannot hold. Dropping it fails
                // closed: a lease no longer renewed runs out, and a job's watchdog, its pipe
                // closed, kills the job at once.
                Err((next, held)) => {
                    return Err(fail(
                        Exit::Software,
                        format!(
                            "internal error: the {} phase was left holding {}",
                            next.name(),
                            held.name()
                        ),
                    ))
                }
            };
        }
    }

    /// Carries out one action of a step on what the state holds, and returns what is left.
    async fn perform(&mut self, held: Held, action: Action<Failure>) -> Result<Held> {
        let grace = self.process.env.cfg.grace;
        match (action, held) {
            (Action::StopJob { signal }, Held::Job(c, t, mut j)) => {
                j.job.stop(signal, grace);
                Ok(Held::Job(c, t, j))
            }
            (Action::KillJob, Held::Job(c, t, mut j)) => {
                j.job.kill();
                Ok(Held::Job(c, t, j))
            }
            (Action::Forward(sig), Held::Job(c, t, mut j)) => {
                j.job.forward(sig);
                Ok(Held::Job(c, t, j))
            }
            (Action::HandOverIn(d), held) => Ok(match held {
                Held::Term(c, mut t) => {
                    t.events.judge_handover_in(d);
                    Held::Term(c, t)
                }
                Held::Job(c, mut t, j) => {
                    t.events.judge_handover_in(d);
                    Held::Job(c, t, j)
                }
                other => unheld("a handover", other)?,
            }),
            (Action::KeepTerm, held) => Ok(match held {
                Held::Term(c, mut t) => {
                    t.events.no_handover();
                    Held::Term(c, t)
                }
                Held::Job(c, mut t, j) => {
                    t.events.no_handover();
                    Held::Job(c, t, j)
                }
                other => unheld("keeping the term", other)?,
            }),
            // The term ends here: its record closes it, and what is left is its lease.
            (Action::RecordEnd(reason), Held::Term(mut c, t)) => {
                c.closing = Box::pin(t.end(&self.process.env, c.lease.id, reason)).await;
                Ok(Held::Lease(c))
            }
            (Action::RevokeLease, held) => {
                metrics::leading(false);
                match held {
                    Held::Nothing => {}
                    // A term given up before its job ran needs no end record.
                    Held::Lease(c) | Held::Term(c, _) => {
                        Box::pin(c.revoke(&self.process.env)).await
                    }
                    job @ Held::Job(..) => return unheld("giving the lease up", job),
                }
                Ok(Held::Nothing)
            }
            (Action::Report(f), held) => {
                tracing::warn!("{}: {:#}", f.what, f.error);
                Ok(held)
            }
            (Action::Fail(f), _) => Err(f.error),
            (action, held) => unheld(&format!("{action:?}"), held),
        }
    }

    /// Notes how the last job ended, for `--metrics-textfile`.
    fn job_ended(&mut self, ev: TermEvent) {
        if let (TermEvent::JobEnded { exit, .. }, Some(job)) = (ev, self.last_job.as_mut()) {
            job.ended = Some((crate::election::unix_ms(), exit.code()));
        }
    }

    /// A job started: what the process says and resets once its first job runs.
    fn job_started(&mut self) {
        if let Some(w) = self.process.etcd_warning.take() {
            tracing::warn!("{w}");
        }
        // A term ran: `--wait` counts afresh from the next campaign.
        self.process.give_up_at = None;
    }
}

/// An action that found the state without what it acts on: a bug in a step. It fails closed,
/// as a state that cannot be entered does.
fn unheld(what: &str, held: Held) -> Result<Held> {
    Err(fail(
        Exit::Software,
        format!("internal error: {what} while holding {}", held.name()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(attempt: Option<u32>, code: Option<u8>) -> JobRun {
        JobRun {
            token: 5,
            attempt,
            started_ms: 1,
            ended: code.map(|c| (2, c)),
        }
    }

    #[test]
    fn the_textfile_says_124_for_a_timed_out_job_and_exhausted_for_the_last_failed_attempt() {
        let o = outcome_of(Exit::TimedOut, Some(job(None, Some(143))), None, None);
        assert_eq!(o.job.unwrap().ended, Some((2, 124)));
        assert!(!o.exhausted);
        // The last of 3 attempts failed here (its code, or its term lost before it ended).
        for last in [Some(3), None] {
            let o = outcome_of(Exit::Job(3), Some(job(Some(3), last)), Some(60), Some(3));
            assert!(o.exhausted, "{last:?}");
        }
        // An earlier attempt, or the last one succeeding, is not.
        assert!(!outcome_of(Exit::Job(3), Some(job(Some(2), Some(3))), None, Some(3)).exhausted);
        assert!(!outcome_of(Exit::Ok, Some(job(Some(3), Some(0))), None, Some(3)).exhausted);
        assert!(outcome_of(Exit::AttemptsExhausted, None, None, Some(3)).exhausted);
    }
}
