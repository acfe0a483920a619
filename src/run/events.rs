//! Where a term's events come from: one [`TermEvents`] per term, asked for the next event of
//! the phase the term is in.
//!
//! Each source is a small type that waits forever when it is absent (no health check, no
//! `--timeout`, no handover asked for, no job yet), so a phase waits on all of its sources in
//! one `select!` without asking which exist. The `select!` arms only yield what arrived (a
//! [`Raw`] value); what the sources see on the way is handled after it, in one place: renewals
//! go on to the job's watchdog as they land, a deleted key is checked against the lease, a
//! handover that is due is checked against the line. What to do about an event is
//! [`super::lifecycle`]'s. The sources get the few settings they use ([`Settings`]), not the
//! run's config.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::RunConfig;
use crate::election::leader::{outranked_in_line, LeaderEvent, LeaderWatch};
use crate::election::lease::{Lease, LeaseState, Loss};
use crate::election::Ctx;
use crate::exit::Exit;
use crate::metrics;
use crate::supervisor::wire::GroupEnd;
use crate::supervisor::Job;
use crate::supervisor::JobEnd;

use super::health::{self, Health};
use super::lifecycle::Arrived;
use super::lifecycle::{DelayEnd, DrainEvent, EndedBy, TermEvent};

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

/// What a term's event sources use of the run's settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// `--grace`: renewals move the job's deadline to D, SIGTERM this long before.
    pub grace: Duration,
    /// `--min-term`: how long a job is safe from a handover to a higher priority.
    pub min_term: Duration,
    /// `--priority`: ours, to ask whether a higher one still waits.
    pub priority: u32,
    /// `--timeout`: how long the job may run.
    pub job_timeout: Option<Duration>,
    /// `--health-failures`, to say how many failures ended the term.
    pub health_failures: u32,
    /// How long a question to etcd on the way may take: the command timeout, at most a
    /// second, since the leader forwards no deadline while it waits.
    pub ask_within: Duration,
}

impl Settings {
    pub fn of(cfg: &RunConfig) -> Settings {
        Settings {
            grace: cfg.grace,
            min_term: cfg.min_term,
            priority: cfg.priority,
            job_timeout: cfg.timeout,
            health_failures: cfg.health.as_ref().map(|h| h.failures).unwrap_or(0),
            ask_within: cfg.conn.command_timeout.min(Duration::from_secs(1)),
        }
    }
}

/// What one wait on a term's sources yields, before anything is made of it: what every phase
/// of a term waits for ([`Shared`]), or what only this phase does (`O`).
enum Raw<O> {
    Lease(LeaseUpdate),
    Leader(LeaderEvent),
    HandoverDue,
    Signal(Arrived),
    Unhealthy,
    Own(O),
}

/// The sources every phase of a term waits on.
struct Shared {
    lease: LeaseUpdates,
    watch: LeaderWatch,
    health: HealthFailures,
    /// When to ask whether a higher-priority candidate still waits.
    handover: Timer,
}

impl Shared {
    /// The next of their events. Cancel-safe, as each source is.
    async fn next<O>(&mut self, signals: &mut mpsc::UnboundedReceiver<Arrived>) -> Raw<O> {
        tokio::select! {
            update = self.lease.next() => Raw::Lease(update),
            ev = self.watch.next() => Raw::Leader(ev),
            _ = self.handover.fired() => Raw::HandoverDue,
            Some(signal) = signals.recv() => Raw::Signal(signal),
            _ = self.health.failing() => Raw::Unhealthy,
        }
    }
}

/// The end of `--takeover-delay`: what only a delaying term waits for.
struct DelayOver;

/// What only a term with a job waits for.
enum JobNews {
    Ended(JobEnd),
    TimedOut,
}

/// The lease's renewals and its loss, seen from a term; `ended` once the keepalive task is
/// gone, which is news once.
struct LeaseUpdates {
    rx: watch::Receiver<LeaseState>,
    ended: bool,
}

enum LeaseUpdate {
    Renewed(crate::clock::BootInstant),
    Lost(Loss),
    /// The keepalive task is gone without a word.
    Silent,
}

impl LeaseUpdates {
    async fn next(&mut self) -> LeaseUpdate {
        if self.ended {
            // Said already: asked again (a draining term waits on it), it would answer at
            // once, each time.
            return std::future::pending().await;
        }
        if self.rx.changed().await.is_err() {
            self.ended = true;
            return LeaseUpdate::Silent;
        }
        match *self.rx.borrow_and_update() {
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

    /// The job's end, or its `--timeout`.
    async fn next(&mut self) -> JobNews {
        tokio::select! {
            _ = self.timeout.fired() => JobNews::TimedOut,
            ended = self.job.wait() => JobNews::Ended(ended),
        }
    }
}

/// Logs and counts how the job's group ended; what lead-exec exits with for it, and what
/// ended it.
fn job_ended(ended: JobEnd) -> (Exit, EndedBy) {
    let exit = Exit::from_job(ended.status);
    metrics::leading(false);
    metrics::job_exited(exit.code(), ended.slack_ms);
    let by = match ended.cause {
        GroupEnd::Deadline => {
            metrics::stopped_at_deadline();
            tracing::error!(
                slack_ms = ended.slack_ms,
                "the watchdog stopped the job at the lease deadline ({}): lead-exec could not renew in time",
                ended.status
            );
            EndedBy::Deadline
        }
        GroupEnd::WatchdogLost | GroupEnd::Orphaned => {
            tracing::error!("the job was killed because its watchdog died; giving up this term");
            EndedBy::WatchdogGone
        }
        GroupEnd::SelfExit | GroupEnd::Stop => {
            tracing::info!(slack_ms = ended.slack_ms, "job ended: {}", ended.status);
            EndedBy::Job
        }
    };
    (exit, by)
}

/// What a term's sources need from around it, lent for one wait.
pub struct Around<'a> {
    pub ctx: &'a Ctx,
    pub lease: &'a Lease,
    pub signals: &'a mut mpsc::UnboundedReceiver<Arrived>,
}

/// The sources of one term's events.
pub struct TermEvents {
    settings: Settings,
    shared: Shared,
    /// The end of `--takeover-delay`.
    pub delay: Timer,
}

impl TermEvents {
    /// The candidate that asked for this term, if one of higher `--priority` did: for the
    /// end record of a term handed over to it.
    pub fn preemptor(&self) -> Option<crate::records::history::Preemptor> {
        self.shared
            .watch
            .preemptor()
            .map(|(priority, id)| crate::records::history::Preemptor { id, priority })
    }

    pub fn new(
        settings: Settings,
        lease: &Lease,
        watch: LeaderWatch,
        health: HealthFailures,
    ) -> TermEvents {
        TermEvents {
            settings,
            shared: Shared {
                lease: LeaseUpdates {
                    rx: lease.subscribe(),
                    ended: false,
                },
                watch,
                health,
                handover: Timer::default(),
            },
            delay: Timer::default(),
        }
    }

    /// Asks, once `d` from now, whether a higher-priority candidate still waits.
    pub fn judge_handover_in(&mut self, d: Duration) {
        self.shared.handover = Timer::after(d);
    }

    /// No handover to judge: the request was judged, or the term is kept.
    pub fn no_handover(&mut self) {
        self.shared.handover.clear();
    }

    /// The next event of term `token` while `--takeover-delay` runs.
    pub async fn next_while_delaying(&mut self, token: i64, a: Around<'_>) -> DelayEnd {
        loop {
            let raw = tokio::select! {
                _ = self.delay.fired() => Raw::Own(DelayOver),
                raw = self.shared.next(a.signals) => raw,
            };
            return match raw {
                Raw::Own(DelayOver) => DelayEnd::Done,
                Raw::Lease(LeaseUpdate::Renewed(_)) => continue,
                Raw::Lease(LeaseUpdate::Lost(r)) => DelayEnd::Lost(r),
                Raw::Lease(LeaseUpdate::Silent) => DelayEnd::LeaseTaskEnded,
                Raw::Leader(LeaderEvent::KeyDeleted) => DelayEnd::Lost(Loss::KeyDeleted),
                Raw::Leader(LeaderEvent::Paused) => DelayEnd::Paused,
                Raw::Leader(LeaderEvent::ResignRequested) => DelayEnd::ResignRequested,
                Raw::Leader(LeaderEvent::Preempted) => DelayEnd::HandoverAsked,
                Raw::HandoverDue => {
                    self.shared.handover.clear();
                    DelayEnd::Outranked(self.outranked(a.ctx, token).await)
                }
                Raw::Signal(Arrived::Stop(signal)) => DelayEnd::Interrupted { signal },
                Raw::Signal(Arrived::Forward(signal)) => DelayEnd::Forwarded(signal),
                Raw::Unhealthy => DelayEnd::Unhealthy,
            };
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
        let s = self.settings;
        loop {
            let raw = tokio::select! {
                news = job.next() => Raw::Own(news),
                raw = self.shared.next(a.signals) => raw,
            };
            return match raw {
                Raw::Own(JobNews::Ended(ended)) => {
                    let (exit, by) = job_ended(ended);
                    TermEvent::JobEnded { exit, by }
                }
                Raw::Own(JobNews::TimedOut) => {
                    job.timeout.clear();
                    tracing::warn!(
                        "the job ran for --timeout {}; stopping it",
                        crate::clock::human(s.job_timeout.unwrap_or_default())
                    );
                    metrics::job_timed_out();
                    TermEvent::TimedOut
                }
                Raw::Lease(LeaseUpdate::Renewed(deadline)) => {
                    job.job.extend(deadline, s.grace);
                    metrics::ttl_remaining(deadline.remaining());
                    continue;
                }
                Raw::Lease(LeaseUpdate::Lost(r)) => TermEvent::Lost(r),
                Raw::Lease(LeaseUpdate::Silent) => TermEvent::LeaseTaskEnded,
                Raw::Leader(LeaderEvent::KeyDeleted) => {
                    // Whatever the answer below, the term is over: the next holder may
                    // start while we ask, so `/leader` must not say 200 meanwhile.
                    metrics::term_lost();
                    // A revoked or expired lease deletes the key too, and then the next
                    // leader may already run: ask, so the job gets SIGKILL at once.
                    let gone = a.lease.is_gone(s.ask_within).await;
                    TermEvent::Lost(if gone {
                        Loss::Expired
                    } else {
                        Loss::KeyDeleted
                    })
                }
                Raw::Leader(LeaderEvent::Paused) => TermEvent::Paused,
                Raw::Leader(LeaderEvent::ResignRequested) => TermEvent::ResignRequested,
                Raw::Leader(LeaderEvent::Preempted) => {
                    let min_term_left =
                        (job.started_at + s.min_term).saturating_duration_since(Instant::now());
                    tracing::info!(
                        "a higher-priority candidate asks for the term; handing over {}",
                        if min_term_left.is_zero() {
                            "now".to_string()
                        } else {
                            format!(
                                "once --min-term {} is over",
                                crate::clock::human(s.min_term)
                            )
                        }
                    );
                    TermEvent::HandoverAsked { min_term_left }
                }
                Raw::HandoverDue => {
                    self.shared.handover.clear();
                    let outranked = self.outranked(a.ctx, token).await;
                    if outranked == Some(true) {
                        tracing::info!(
                            "--min-term {} is over: handing over to the higher-priority candidate",
                            crate::clock::human(s.min_term)
                        );
                    }
                    TermEvent::Outranked(outranked)
                }
                Raw::Signal(signal) => TermEvent::Signal(signal),
                Raw::Unhealthy => {
                    tracing::warn!(
                        "the health check failed {} times in a row; stopping the job and resigning",
                        s.health_failures
                    );
                    TermEvent::Unhealthy
                }
            };
        }
    }

    /// The next event while the job is being stopped: its end, signals, and the loss of the
    /// term (etcd says the lease or the key is gone: the grace is then cut short). Renewals no
    /// longer reach the watchdog, whose deadline holds whatever etcd says meanwhile; pauses,
    /// resign requests, handovers, the health check and `--timeout` no longer count.
    ///
    /// `known_lost`: the term is known lost already. The watch is then left alone (a watch
    /// re-opened after a break would find the key gone from a read each time, and read again
    /// at once), and so is the end of the keepalive task, which follows a loss it reported.
    /// The lease's own news (gone) still comes.
    pub async fn next_while_draining(
        &mut self,
        job: &mut RunningJob,
        a: Around<'_>,
        known_lost: bool,
    ) -> DrainEvent {
        let s = self.settings;
        let shared = &mut self.shared;
        // Only the key's deletion counts from the watch now: its other events were acted on
        // already (the stop under way).
        shared.watch.deletion_only();
        loop {
            let lost = tokio::select! {
                ended = job.job.wait() => {
                    let (exit, by) = job_ended(ended);
                    return DrainEvent::JobEnded { exit, by };
                }
                Some(signal) = a.signals.recv() => return DrainEvent::Signal(signal),
                update = shared.lease.next() => match update {
                    LeaseUpdate::Renewed(_) => continue,
                    LeaseUpdate::Lost(r) => r,
                    LeaseUpdate::Silent if known_lost => continue,
                    LeaseUpdate::Silent => Loss::Deadline,
                },
                ev = shared.watch.next(), if !known_lost => match ev {
                    LeaderEvent::KeyDeleted => {
                        metrics::term_lost();
                        if a.lease.is_gone(s.ask_within).await {
                            Loss::Expired
                        } else {
                            Loss::KeyDeleted
                        }
                    }
                    _ => continue,
                },
            };
            return DrainEvent::Lost(lost);
        }
    }

    /// Whether a higher-priority candidate is still in line behind term `token` (see
    /// [`outranked_in_line`]); `None` when etcd did not answer.
    async fn outranked(&self, ctx: &Ctx, token: i64) -> Option<bool> {
        let s = self.settings;
        match outranked_in_line(ctx, token, s.priority, s.ask_within).await {
            Ok(true) => Some(true),
            Ok(false) => {
                tracing::info!(
                    token,
                    "no higher-priority candidate is in line any more; keeping the term"
                );
                Some(false)
            }
            Err(err) => {
                tracing::warn!(
                    "cannot tell whether a higher-priority candidate still waits: {err:#}"
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keepalive task's end is news once: a draining term asks again after it, and an
    /// answer at once each time was a busy loop until the job was reaped.
    #[tokio::test]
    async fn the_end_of_the_keepalive_task_is_news_once() {
        let (tx, rx) = watch::channel(LeaseState::Lost(Loss::Expired));
        let mut updates = LeaseUpdates { rx, ended: false };
        drop(tx);
        assert!(matches!(updates.next().await, LeaseUpdate::Silent));
        let again = tokio::time::timeout(Duration::from_millis(50), updates.next()).await;
        assert!(again.is_err(), "the end was news again");
    }
}
