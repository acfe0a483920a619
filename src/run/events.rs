//! Where a term's events come from: one [`TermEvents`] per term, asked for the next event of
//! the phase the term is in.
//!
//! Each source is a small type that waits forever when it is absent (no health check, no
//! `--timeout`, no handover asked for, no job yet), so a phase waits on all of its sources in
//! one `select!` without asking which exist. What the sources see on the way is I/O and stays
//! here: renewals go on to the job's watchdog as they land, a deleted key is checked against
//! the lease, a handover that is due is checked against the line. What to do about an event
//! is [`super::lifecycle`]'s.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::RunConfig;
use crate::election::leader::{outranked_in_line, LeaderEvent, LeaderWatch};
use crate::election::lease::{Lease, LeaseState, Loss};
use crate::election::Ctx;
use crate::exit::Exit;
use crate::metrics;
use crate::supervisor::protocol::GroupEnd;
use crate::supervisor::Job;

use super::health::{self, Health};
use super::lifecycle::{DelayEnd, DrainEvent, TermEvent};
use super::{signals, Env};

/// A deadline that may not be set; unset, it never fires.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timer(Option<Instant>);

impl Timer {
    pub fn at(at: Instant) -> Timer {
        Timer(Some(at))
    }

    pub fn after(d: Duration) -> Timer {
        Timer::at(Instant::now() + d)
    }

    pub fn clear(&mut self) {
        self.0 = None;
    }

    async fn fired(&self) {
        match self.0 {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// The lease's renewals and its loss, seen from a term.
struct LeaseUpdates(watch::Receiver<LeaseState>);

enum LeaseUpdate {
    Renewed(crate::clock::BootInstant),
    Lost(Loss),
    /// The keepalive task is gone without a word.
    Silent,
}

impl LeaseUpdates {
    async fn next(&mut self) -> LeaseUpdate {
        if self.0.changed().await.is_err() {
            return LeaseUpdate::Silent;
        }
        match *self.0.borrow_and_update() {
            LeaseState::Alive { deadline } => LeaseUpdate::Renewed(deadline),
            LeaseState::Lost(r) => LeaseUpdate::Lost(r),
        }
    }
}

/// `--health-cmd`'s verdicts, if there is a check.
#[derive(Clone)]
pub struct HealthFailures(Option<watch::Receiver<Health>>);

impl HealthFailures {
    pub fn new(rx: Option<watch::Receiver<Health>>) -> HealthFailures {
        HealthFailures(rx)
    }

    /// Waits until the check fails `--health-failures` times in a row.
    pub async fn failing(&mut self) {
        match self.0.as_mut() {
            Some(rx) => health::failing(rx).await,
            None => std::future::pending().await,
        }
    }
}

/// The job of a term, once started, with its `--timeout`.
pub struct RunningJob {
    pub job: Job,
    /// `--min-term` counts from here, so that a job started after a `--takeover-delay` still
    /// gets its whole minimum.
    pub started_at: Instant,
    timeout: Timer,
}

impl RunningJob {
    pub fn new(job: Job, timeout: Option<Duration>) -> RunningJob {
        RunningJob {
            job,
            started_at: Instant::now(),
            timeout: timeout.map(Timer::after).unwrap_or_default(),
        }
    }
}

/// The job's end, and its `--timeout`. After `JobEnded`, the job is gone: its owner drops it.
async fn job_event(running: &mut RunningJob, cfg: &RunConfig) -> TermEvent {
    let ended = tokio::select! {
        _ = running.timeout.fired() => None,
        ended = running.job.wait() => Some(ended),
    };
    match ended {
        Some(ended) => {
            let (exit, by_watchdog) = job_ended(ended, cfg);
            TermEvent::JobEnded { exit, by_watchdog }
        }
        None => {
            running.timeout.clear();
            tracing::warn!(
                election = cfg.election.name(),
                id = cfg.id,
                "the job ran for --timeout {}; stopping it",
                crate::clock::human(cfg.timeout.unwrap_or_default())
            );
            metrics::job_timed_out();
            TermEvent::TimedOut
        }
    }
}

/// Logs and counts how the job's group ended; what lead-exec exits with for it, and whether
/// the watchdog killed it on its own.
fn job_ended(ended: crate::supervisor::JobEnd, cfg: &RunConfig) -> (Exit, bool) {
    let exit = Exit::from_job(ended.status);
    metrics::leading(false);
    metrics::job_exited(exit.code(), ended.slack_ms);
    let (election, id) = (cfg.election.name(), &cfg.id);
    let by_watchdog = match ended.cause {
        GroupEnd::Deadline => {
            metrics::stopped_at_deadline();
            tracing::error!(
                election,
                id,
                slack_ms = ended.slack_ms,
                "the watchdog stopped the job at the lease deadline ({}): lead-exec could not renew in time",
                ended.status
            );
            true
        }
        GroupEnd::WatchdogLost | GroupEnd::Orphaned => {
            tracing::error!(
                election,
                id,
                "the job was killed because its watchdog died; giving up this term"
            );
            true
        }
        GroupEnd::SelfExit | GroupEnd::Stop => {
            tracing::info!(
                election,
                id,
                slack_ms = ended.slack_ms,
                "job ended: {}",
                ended.status
            );
            false
        }
    };
    (exit, by_watchdog)
}

/// What a term's sources need from around it, lent for one wait.
pub struct Around<'a> {
    pub env: &'a Env,
    pub lease: &'a Lease,
    pub signals: &'a mut mpsc::UnboundedReceiver<i32>,
}

/// The sources of one term's events.
pub struct TermEvents {
    lease: LeaseUpdates,
    watch: LeaderWatch,
    health: HealthFailures,
    /// The end of `--takeover-delay`.
    pub delay: Timer,
    /// When to ask whether a higher-priority candidate still waits.
    pub handover: Timer,
}

impl TermEvents {
    /// The candidate that asked for this term, if one of higher `--priority` did: for the
    /// end record of a term handed over to it.
    pub fn preemptor(&self) -> Option<crate::records::history::Preemptor> {
        self.watch
            .preemptor()
            .map(|(priority, id)| crate::records::history::Preemptor { id, priority })
    }

    pub fn new(lease: &Lease, watch: LeaderWatch, health: HealthFailures) -> TermEvents {
        TermEvents {
            lease: LeaseUpdates(lease.subscribe()),
            watch,
            health,
            delay: Timer::default(),
            handover: Timer::default(),
        }
    }

    /// The next event of term `token` while `--takeover-delay` runs. Signals that do not stop
    /// the run have no job to go to yet.
    pub async fn next_while_delaying(&mut self, token: i64, a: Around<'_>) -> DelayEnd {
        loop {
            tokio::select! {
                _ = self.delay.fired() => return DelayEnd::Done,
                update = self.lease.next() => match update {
                    LeaseUpdate::Renewed(_) => {}
                    LeaseUpdate::Lost(r) => return DelayEnd::Lost(r),
                    LeaseUpdate::Silent => return DelayEnd::LeaseTaskEnded,
                },
                ev = self.watch.next() => return match ev {
                    LeaderEvent::KeyDeleted => DelayEnd::Lost(Loss::KeyDeleted),
                    LeaderEvent::Paused => DelayEnd::Paused,
                    LeaderEvent::ResignRequested => DelayEnd::ResignRequested,
                    LeaderEvent::Preempted => DelayEnd::HandoverAsked,
                },
                _ = self.handover.fired() => {
                    self.handover.clear();
                    return DelayEnd::Outranked(outranked(&a.env.ctx, &a.env.cfg, token).await);
                }
                Some(signal) = a.signals.recv() => {
                    if signals::is_stopping(signal) {
                        return DelayEnd::Interrupted { signal };
                    }
                }
                _ = self.health.failing() => return DelayEnd::Unhealthy,
            }
        }
    }

    /// The next event of term `token` while its job runs. Renewals go on to the job's
    /// watchdog on the way.
    pub async fn next_term_event(
        &mut self,
        token: i64,
        job: &mut RunningJob,
        a: Around<'_>,
    ) -> TermEvent {
        let cfg = &a.env.cfg;
        let (election, id) = (cfg.election.name(), &cfg.id);
        loop {
            tokio::select! {
                ev = job_event(job, cfg) => return ev,
                update = self.lease.next() => match update {
                    LeaseUpdate::Renewed(deadline) => {
                        job.job.extend(deadline, cfg.grace);
                        metrics::ttl_remaining(deadline.remaining());
                    }
                    LeaseUpdate::Lost(r) => return TermEvent::Lost(r),
                    LeaseUpdate::Silent => return TermEvent::LeaseTaskEnded,
                },
                ev = self.watch.next() => return match ev {
                    LeaderEvent::KeyDeleted => {
                        // A revoked or expired lease deletes the key too, and then the next
                        // leader may already run: ask, so the job gets SIGKILL at once.
                        let timeout = cfg.conn.command_timeout.min(Duration::from_secs(1));
                        let gone = a.lease.is_gone(timeout).await;
                        TermEvent::Lost(if gone { Loss::Expired } else { Loss::KeyDeleted })
                    }
                    LeaderEvent::Paused => TermEvent::Paused,
                    LeaderEvent::ResignRequested => TermEvent::ResignRequested,
                    LeaderEvent::Preempted => {
                        let min_term_left = (job.started_at + cfg.min_term).saturating_duration_since(Instant::now());
                        tracing::info!(
                            election,
                            id,
                            "a higher-priority candidate asks for the term; handing over {}",
                            if min_term_left.is_zero() {
                                "now".to_string()
                            } else {
                                format!("once --min-term {} is over", crate::clock::human(cfg.min_term))
                            }
                        );
                        TermEvent::HandoverAsked { min_term_left }
                    }
                },
                _ = self.handover.fired() => {
                    self.handover.clear();
                    let outranked = outranked(&a.env.ctx, cfg, token).await;
                    if outranked == Some(true) {
                        tracing::info!(
                            election,
                            id,
                            "--min-term {} is over: handing over to the higher-priority candidate",
                            crate::clock::human(cfg.min_term)
                        );
                    }
                    return TermEvent::Outranked(outranked);
                }
                Some(signal) = a.signals.recv() => return TermEvent::Signal(signal),
                _ = self.health.failing() => {
                    tracing::warn!(
                        election,
                        id,
                        "the health check failed {} times in a row; stopping the job and resigning",
                        cfg.health.as_ref().map(|h| h.failures).unwrap_or(0)
                    );
                    return TermEvent::Unhealthy;
                }
            }
        }
    }
}

/// The next event while the job is being stopped: only its end and signals count now; the
/// watchdog's deadline holds whatever etcd says meanwhile.
pub async fn next_drain_event(
    job: &mut RunningJob,
    cfg: &RunConfig,
    signals: &mut mpsc::UnboundedReceiver<i32>,
) -> DrainEvent {
    tokio::select! {
        ev = job_event_end(job, cfg) => ev,
        Some(signal) = signals.recv() => DrainEvent::Signal(signal),
    }
}

/// The job's end alone (its `--timeout` no longer counts once it is being stopped).
async fn job_event_end(running: &mut RunningJob, cfg: &RunConfig) -> DrainEvent {
    let ended = running.job.wait().await;
    let (exit, by_watchdog) = job_ended(ended, cfg);
    DrainEvent::JobEnded { exit, by_watchdog }
}

/// Whether a higher-priority candidate is still in line behind term `token` (see
/// [`outranked_in_line`]); `None` when etcd did not answer. The read is bounded by a second,
/// since the leader forwards no deadline while it waits.
async fn outranked(ctx: &Ctx, cfg: &RunConfig, token: i64) -> Option<bool> {
    let timeout = ctx.timeout.min(Duration::from_secs(1));
    let election = cfg.election.name();
    match outranked_in_line(ctx, token, cfg.priority, timeout).await {
        Ok(true) => Some(true),
        Ok(false) => {
            tracing::info!(
                election,
                id = cfg.id,
                token,
                "no higher-priority candidate is in line any more; keeping the term"
            );
            Some(false)
        }
        Err(err) => {
            tracing::warn!(
                election,
                "cannot tell whether a higher-priority candidate still waits: {err:#}"
            );
            None
        }
    }
}
