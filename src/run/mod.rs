//! `lead-exec run`: the driver that carries out [`lifecycle`]'s decisions.
//!
//! The state of a run is held in scopes, one type per lifetime, each inside the one it cannot
//! outlive:
//!
//! | scope | lives | holds |
//! |---|---|---|
//! | [`Driver`] | the process | config, etcd scope, signals, health verdicts, the watchdog started ahead, the last token |
//! | [`candidacy::Candidacy`] | one lease | the lease, and whether our key is already gone |
//! | [`term::Term`] | one won election | token, key, slot, the term's [`events::TermEvents`], its start record |
//! | [`events::RunningJob`] | one job | the job under its watchdog, its start time and `--timeout` |
//!
//! Ending a scope is dropping it: a revoked lease takes its term and job with it. The driver
//! waits for the next event of the phase it is in (the phase says which sources exist), asks
//! the phase's step function what that means, and carries out the actions, in order. All I/O
//! of a run lives in this folder; the decisions are [`lifecycle`]'s.
//!
//! - [`candidacy`]: start-up, the campaign and its lease, the health gate, the backoff.
//! - [`term`]: a won term's start (the job under its watchdog) and its end records.
//! - [`events`]: where a term's events come from.
//!
//! Adding a per-term control takes one field on [`term::Term`] (or a source in
//! [`events::TermEvents`]), one [`lifecycle::TermEvent`] variant, and one arm in
//! [`lifecycle::leading`].

pub mod candidacy;
pub mod events;
pub mod health;
pub mod lifecycle;
pub mod signals;
pub mod term;

use anyhow::Result;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::RunConfig;
use crate::election::campaign::Wait;
use crate::election::{Candidate, Ctx};
use crate::exit::Exit;
use crate::metrics;
use candidacy::{Candidacy, StartUp};
use events::{next_drain_event, Around, Timer};
use health::Health;
use lifecycle::{Action, Phase, Policy, StopReason};

/// An etcd error on the way, with what was being done.
pub struct Failure {
    pub what: &'static str,
    pub error: anyhow::Error,
}

/// What failed, only: the event it travels in is printed on the phase line, and the error has
/// a line of its own ([`Action::Report`], or the run's error). An error's debug form would
/// put its whole stack backtrace on the phase line whenever RUST_BACKTRACE is set.
impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}

/// Runs until the job is done (or leadership is given up) and returns how it ended.
pub async fn run(cfg: RunConfig) -> Result<Exit> {
    let (mut driver, startup) = match candidacy::start_up(cfg).await? {
        Ok(started) => started,
        Err(done) => return Ok(done),
    };
    driver.drive(startup).await
}

/// The process's side of a run: what lives as long as lead-exec does.
pub struct Driver {
    cfg: RunConfig,
    /// The etcd scope: client, router, election, command timeout.
    ctx: Ctx,
    /// Our candidate key's value.
    candidate: Candidate,
    /// What `--health-cmd` says, if given.
    health: Option<watch::Receiver<Health>>,
    /// A watchdog started ahead of the next job.
    standby: Option<crate::supervisor::Standby>,
    signals: mpsc::UnboundedReceiver<i32>,
    /// Where the signal thread's Ctrl-Z reaches the running job.
    job_control: crate::supervisor::JobControl,
    /// When `--wait` gives up. A term that ran a job clears it: `--wait` bounds a wait in
    /// line, not the life of the process, so the next campaign counts afresh.
    give_up_at: Option<Instant>,
    /// The token of this process's previous term.
    last_token: Option<i64>,
    /// A job ran without a cgroup of its own, and the log said so: once per process.
    warned_uncontained: bool,
    /// What etcd's version is worth saying (it lacks a lease fix), until the first job starts.
    etcd_warning: Option<String>,
    /// Our lease, while we have one: in line, or holding a term on it.
    candidacy: Option<Candidacy>,
}

impl Driver {
    async fn drive(&mut self, startup: StartUp) -> Result<Exit> {
        let policy = Policy {
            on_loss: self.cfg.on_loss,
            conflict_exit_code: self.cfg.conflict_exit_code,
            no_wait: self.cfg.wait == Wait::No,
        };
        let mut startup = Some(startup);
        let mut phase = Phase::Campaigning { attempt: 0 };
        loop {
            let (next, actions, seen) = match phase {
                Phase::Campaigning { attempt } => {
                    let ev = self.campaign(startup.take()).await?;
                    let seen = ev.to_string();
                    let (next, actions) = lifecycle::campaigned(attempt, ev, &policy);
                    (next, actions, seen)
                }
                Phase::BackingOff { attempt, wait } => {
                    let ev = self.backoff(wait).await;
                    let (next, actions) = lifecycle::backed_off(attempt, ev);
                    (next, actions, ev.to_string())
                }
                Phase::Delaying { token } => {
                    let ev = self.next_while_delaying().await;
                    let (next, actions) = lifecycle::delaying(token, ev, &policy);
                    (next, actions, ev.to_string())
                }
                Phase::Elected { token } => {
                    let ev = self.start().await?;
                    let (next, actions) = lifecycle::started(token, ev, &policy);
                    (next, actions, ev.to_string())
                }
                Phase::Leading { token } => {
                    let ev = self.next_term_event().await;
                    let (next, actions) = lifecycle::leading(token, ev, &policy);
                    (next, actions, ev.to_string())
                }
                Phase::Draining { token, why } => {
                    let ev = self.next_drain_event().await;
                    let (next, actions) = lifecycle::draining(token, why, ev, &policy);
                    (next, actions, ev.to_string())
                }
                Phase::Done(exit) => return Ok(exit),
            };
            if let (
                Phase::Leading { .. },
                Phase::Draining {
                    why: StopReason::Lost(r),
                    ..
                },
            ) = (phase, next)
            {
                metrics::lost(r.label());
            }
            // A step that stays in its phase is quiet only when it passes a signal on or
            // judges a handover. One that reads the same phase but kills the job (a second
            // stop while draining) or gives up the lease (out of line on a failing health
            // check) changed the run, and says so.
            let quiet = actions.iter().all(|a| {
                matches!(
                    a,
                    Action::Forward(_) | Action::HandOverIn(_) | Action::KeepTerm
                )
            });
            // Below the default level: a cron line's successful run says that the job
            // started and how it ended (the term's own lines), not every step on the way.
            if next != phase || !quiet {
                tracing::debug!(
                    election = self.cfg.election.name(),
                    id = self.cfg.id,
                    token = next.token().or(phase.token()),
                    "{} -> {} on {seen}",
                    phase.name(),
                    next.name()
                );
            }
            for action in actions {
                self.perform(action).await?;
            }
            phase = next;
        }
    }

    /// Carries out one action of a step.
    async fn perform(&mut self, action: Action<Failure>) -> Result<()> {
        let grace = self.cfg.grace;
        let term = self.candidacy.as_mut().and_then(|c| c.term.as_mut());
        match action {
            Action::StopJob { signal } => {
                if let Some(j) = term.and_then(|t| t.job.as_mut()) {
                    j.job.stop(signal, grace);
                }
            }
            Action::KillJob => {
                if let Some(j) = term.and_then(|t| t.job.as_mut()) {
                    j.job.kill();
                }
            }
            Action::Forward(sig) => {
                if let Some(j) = term.and_then(|t| t.job.as_mut()) {
                    j.job.forward(sig);
                }
            }
            Action::HandOverIn(d) => {
                if let Some(t) = term {
                    t.events.handover = Timer::after(d);
                }
            }
            Action::KeepTerm => {
                if let Some(t) = term {
                    t.events.handover.clear();
                }
            }
            Action::RecordEnd(reason) => self.record_end(reason).await,
            Action::RevokeLease => self.revoke_lease().await,
            Action::Report(f) => {
                tracing::warn!(
                    election = self.cfg.election.name(),
                    "{}: {:#}",
                    f.what,
                    f.error
                )
            }
            Action::Fail(f) => return Err(f.error),
        }
        Ok(())
    }

    /// The term's sources and what they need around them, while a term is held.
    fn term_parts(&mut self) -> Option<(&mut term::Term, Around<'_>)> {
        let Driver {
            ctx,
            cfg,
            signals,
            candidacy,
            ..
        } = self;
        let c = candidacy.as_mut()?;
        let term = c.term.as_mut()?;
        let around = Around {
            ctx,
            cfg,
            lease: &c.lease,
            signals,
        };
        Some((term, around))
    }

    // A term phase finds its term in place: the campaign that won it made it, and only the
    // lease's revoke ends it, which leaves the term's phases. Were it missing, the lease
    // would be as good as gone, and that is what these say.

    async fn next_while_delaying(&mut self) -> lifecycle::DelayEnd {
        match self.term_parts() {
            Some((term, around)) => term.events.next_while_delaying(around).await,
            None => lifecycle::DelayEnd::LeaseTaskEnded,
        }
    }

    async fn next_term_event(&mut self) -> lifecycle::TermEvent {
        match self.term_parts() {
            Some((term, around)) => term.events.next_term_event(&mut term.job, around).await,
            None => lifecycle::TermEvent::LeaseTaskEnded,
        }
    }

    async fn next_drain_event(&mut self) -> lifecycle::DrainEvent {
        match self.candidacy.as_mut().and_then(|c| c.term.as_mut()) {
            Some(term) => next_drain_event(&mut term.job, &self.cfg, &mut self.signals).await,
            None => lifecycle::DrainEvent::JobEnded {
                exit: Exit::LeadershipLost,
                by_watchdog: true,
            },
        }
    }

    /// Ends the candidacy: revokes the lease, which deletes our key (and slot key), so the
    /// next candidate takes over at once; its term and job end with it.
    async fn revoke_lease(&mut self) {
        metrics::leading(false);
        let Some(c) = self.candidacy.take() else {
            return;
        };
        c.revoke(self.cfg.conn.command_timeout).await;
    }
}

/// Whether a new term's token is not above the previous one's: etcd's revisions went back
/// (a wiped data directory, or a restore without `--bump-revision`), and the fencing contract
/// no longer holds for the resources this job writes to.
pub fn token_regressed(last: Option<i64>, token: i64) -> bool {
    last.is_some_and(|l| token <= l)
}
