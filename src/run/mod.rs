//! `lead-exec run`: the driver that performs the actions of [`lifecycle`].
//!
//! All I/O of a run lives here: granting leases, campaigning, spawning the job under its
//! watchdog, forwarding deadlines and signals, resigning. The decisions are
//! [`step`]'s.

pub mod health;
pub mod lifecycle;
pub mod signals;

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Result;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::clock::BootInstant;
use crate::config::RunConfig;
use crate::election::campaign::{Campaign, Outcome, Wait};
use crate::election::leader::{LeaderEvent, LeaderWatch};
use crate::election::lease::{Lease, LeaseState, Loss};
use crate::election::Ctx;
use crate::election::{unix_ms, Candidate};
use crate::exit::Exit;
use crate::records;
use crate::records::history::{self, TermEnd};
use crate::supervisor::protocol::GroupEnd;
use crate::supervisor::{Job, JobSpec, Launch, Standby};
use crate::{etcd, fencing, metrics, notify};
use health::Health;
use lifecycle::{step, Action, Event, Phase, Policy, StopReason};

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub exit: Exit,
    /// It gave up ([`Exit::NotAcquired`]) because its own health check kept failing, not
    /// because someone else holds the election.
    pub unhealthy: bool,
}

/// Runs until the job is done (or leadership is given up) and returns how it ended.
pub async fn run(cfg: RunConfig) -> Result<Ended> {
    crate::supervisor::preflight(&cfg.command[0])?;
    metrics::describe(cfg.election.name(), &cfg.id, cfg.slots, cfg.grace);
    if let Some(addr) = cfg.metrics_addr {
        metrics::serve(addr).await?;
    }
    // The first check runs while we connect.
    let health = cfg.health.clone().map(health::start);
    let signals = signals::listen()?;
    // The watchdog starts while we connect and campaign: a won term then pays only for the
    // job's own fork and exec. The requests go first, so that the spawn (on this thread, see
    // `supervisor`) overlaps their round trips instead of preceding them.
    let ctx = Ctx::open(&cfg.conn, cfg.election.clone()).await?;
    let candidate = Candidate {
        priority: cfg.priority,
        ..Candidate::this_process(&cfg.id)
    };
    let probe = {
        let (c, conn) = (ctx.client.clone(), cfg.conn.clone());
        tokio::spawn(async move { etcd::probe(&c, &conn).await })
    };
    // Without a health check or a run key to consult first, the first campaign's lease grant
    // goes out beside the probe, on the connection it opens.
    let fast = cfg.health.is_none() && cfg.run_key.is_none();
    let first_lease = fast.then(|| {
        let (c, cfg) = (ctx.clone(), cfg.clone());
        tokio::spawn(async move { grant(&c, &cfg).await })
    });
    for _ in 0..CONNECT_POLLS {
        tokio::task::yield_now().await;
    }
    let standby = standby(&cfg);
    let probe = if fast {
        Some(probe)
    } else {
        probe.await??;
        notify::ready();
        None
    };
    if let Some(done) = already_done(&ctx, &cfg).await? {
        tracing::info!(
            election = cfg.election.name(),
            run_key = done,
            "run key already done; not running the job"
        );
        return Ok(Ended {
            exit: Exit::Ok,
            unhealthy: false,
        });
    }
    let give_up_at = match cfg.wait {
        Wait::For(d) => Some(Instant::now() + d),
        _ => None,
    };
    let mut d = Driver {
        cfg,
        ctx,
        candidate,
        health,
        standby,
        probe,
        first_lease,
        delayed: None,
        job_started_at: Instant::now(),
        preempt_at: None,
        signals,
        give_up_at,
        led: false,
        history_start: None,
        released: false,
        timeout_at: None,
        lease: None,
        job: None,
        term: None,
        leader_watch: None,
        last_token: None,
        failure: None,
        gave_up_unhealthy: false,
    };
    let exit = d.drive().await?;
    Ok(Ended {
        exit,
        unhealthy: d.gave_up_unhealthy && matches!(exit, Exit::NotAcquired(_)),
    })
}

/// The current term, while we lead.
struct Term {
    token: i64,
    key: String,
    /// `LEAD_EXEC_SLOT`; its key exists only with `--slots` above 1.
    slot: u32,
}

struct Driver {
    cfg: RunConfig,
    /// The etcd scope: client, router, election, command timeout.
    ctx: Ctx,
    /// Our candidate key's value.
    candidate: Candidate,
    /// What `--health-cmd` says, if given.
    health: Option<watch::Receiver<Health>>,
    /// A watchdog started ahead of the next job.
    standby: Option<Standby>,
    /// The start-up probe, while the first lease grant is in flight beside it.
    probe: Option<tokio::task::JoinHandle<Result<()>>>,
    /// The first campaign's lease grant, sent at start-up.
    first_lease: Option<tokio::task::JoinHandle<Result<Lease>>>,
    /// The takeover delay this term waited out.
    delayed: Option<Duration>,
    /// When this term's job started: `--min-term` counts from here, so that a job started
    /// after a `--takeover-delay` still gets its whole minimum.
    job_started_at: Instant,
    /// When a higher-priority candidate's request takes effect (after `--min-term`).
    preempt_at: Option<Instant>,
    signals: mpsc::UnboundedReceiver<i32>,
    give_up_at: Option<Instant>,
    /// Set once a term ran: `--wait` then counts again from the next campaign, since it
    /// bounds a wait in line, not the life of the process.
    led: bool,
    /// The term's start record, written beside the job (see [`Driver::spawn`]).
    history_start: Option<tokio::task::JoinHandle<Option<history::Started>>>,
    /// Set when the end record also deleted our key: the lease holds nothing any more, so
    /// revoking it can wait in the background (or be left to expire when lead-exec exits).
    released: bool,
    /// When the running job reaches `--timeout`.
    timeout_at: Option<Instant>,
    lease: Option<Lease>,
    job: Option<Job>,
    term: Option<Term>,
    leader_watch: Option<LeaderWatch>,
    /// The token of this process's previous term.
    last_token: Option<i64>,
    /// The etcd error behind the last failed campaign: retried after a backoff, or (under
    /// `--no-wait`) what the run ends with.
    failure: Option<(&'static str, anyhow::Error)>,
    /// The last campaign was given up while the health check was failing.
    gave_up_unhealthy: bool,
}

/// Whether a new term's token is not above the previous one's: etcd's revisions went back
/// (a wiped data directory, or a restore without `--bump-revision`), and the fencing contract
/// no longer holds for the resources this job writes to.
pub fn token_regressed(last: Option<i64>, token: i64) -> bool {
    last.is_some_and(|l| token <= l)
}

impl Driver {
    async fn drive(&mut self) -> Result<Exit> {
        let policy = Policy {
            on_loss: self.cfg.on_loss,
            conflict_exit_code: self.cfg.conflict_exit_code,
            no_wait: self.cfg.wait == Wait::No,
        };
        let mut phase = Phase::Campaigning { attempt: 0 };
        let mut pending: VecDeque<Action> = VecDeque::from([Action::Campaign]);
        loop {
            let mut event = None;
            while let Some(action) = pending.pop_front() {
                match action {
                    Action::Campaign => event = Some(self.campaign().await?),
                    Action::Spawn { token } => event = Some(self.spawn(token).await?),
                    Action::Delay(d) => event = Some(self.delay(d).await),
                    Action::StopJob { signal } => {
                        if let Some(j) = self.job.as_mut() {
                            j.stop(signal, self.cfg.grace);
                        }
                    }
                    Action::KillJob => {
                        if let Some(j) = self.job.as_mut() {
                            j.kill();
                        }
                    }
                    Action::RecordEnd(reason) => self.record_end(reason).await,
                    Action::Resign => self.resign().await,
                    Action::Backoff(d) => {
                        if let Some((what, e)) = self.failure.take() {
                            tracing::warn!(election = self.cfg.election.name(), "{what}: {e:#}");
                        }
                        event = Some(self.backoff(d).await)
                    }
                    Action::Exit(e) => return Ok(e),
                    Action::Fail => {
                        let (_, e) = self.failure.take().expect("a failure to end with");
                        return Err(e);
                    }
                }
            }
            let ev = match event {
                Some(e) => e,
                None => self.wait_leading(phase).await,
            };
            let (next, actions) = step(phase, ev, &policy);
            if let (
                Phase::Leading { .. },
                Phase::Draining {
                    why: StopReason::Lost(r),
                    ..
                },
            ) = (phase, next)
            {
                metrics::lost(r.as_str());
            }
            tracing::info!(
                election = self.cfg.election.name(),
                id = self.cfg.id,
                token = next.token().or(phase.token()),
                "{} -> {} on {ev:?}",
                phase.name(),
                next.name()
            );
            phase = next;
            pending.extend(actions);
        }
    }

    /// Grants a fresh lease and campaigns on it, until elected, refused or interrupted.
    async fn campaign(&mut self) -> Result<Event> {
        let started = Instant::now();
        if std::mem::take(&mut self.led) {
            if let Wait::For(d) = self.cfg.wait {
                self.give_up_at = Some(started + d);
            }
        }
        // `--wait` also bounds retries after etcd trouble.
        if self.give_up_at.is_some_and(|t| started >= t) {
            return Ok(Event::NotAcquired);
        }
        if let Some(ev) = self.wait_healthy().await {
            return Ok(ev);
        }
        if self.standby.is_none() {
            self.standby = standby(&self.cfg);
        }
        let started = Instant::now();
        let granted = match self.first_lease.take() {
            Some(first) => self.first_grant(first).await?,
            None => grant(&self.ctx, &self.cfg).await,
        };
        let lease = match granted {
            Ok(l) => l,
            Err(e) => {
                self.failure = Some(("cannot grant a lease", e));
                return Ok(Event::CampaignFailed { etcd: true });
            }
        };
        let value = self.candidate.encode();
        let election = self.cfg.election.name().to_string();
        let (outcome, delay_turned_on) = {
            let camp = Campaign {
                client: &self.ctx.client,
                router: &self.ctx.router,
                election: &self.cfg.election,
                lease: &lease,
                value,
                wait: self.cfg.wait,
                give_up_at: self.give_up_at,
                timeout: self.cfg.conn.command_timeout,
                priority: self.cfg.priority,
                slots: self.cfg.slots,
                takeover_delay: self.cfg.takeover_delay,
                delay_turned_on: Default::default(),
            };
            let mut last_wait = None;
            let run = camp.run(|w| {
                if last_wait.as_ref() != Some(w) {
                    tracing::info!(election, "{w}");
                    if let Some(status) = w.status() {
                        notify::status(&status);
                    }
                    last_wait = Some(w.clone());
                }
            });
            let mut health = self.health.clone();
            let checked = health.is_some();
            let outcome = tokio::select! {
                out = run => Ok(out),
                ev = stopping(&mut self.signals) => Err(ev),
                _ = async { health::failing(health.as_mut().expect("checked")).await }, if checked => {
                    tracing::warn!(election, "the health check is failing; leaving the line until it passes");
                    Err(Event::Unhealthy)
                }
            };
            let turned_on = camp
                .delay_turned_on
                .load(std::sync::atomic::Ordering::Relaxed);
            (outcome, turned_on)
        };
        let outcome = match outcome {
            Ok(o) => o,
            Err(ev) => {
                // Resign revokes the lease, which takes our key out of the line.
                self.lease = Some(lease);
                return Ok(ev);
            }
        };
        let ev = match outcome {
            Ok(Outcome::Elected { token, key, slot }) => {
                if token_regressed(self.last_token, token) {
                    tracing::error!(
                        election = self.cfg.election.name(),
                        previous = self.last_token,
                        token,
                        "the fencing token went backwards: etcd's revisions were reset (wiped or restored without --bump-revision); resources that check tokens will reject this term"
                    );
                    metrics::token_regressed();
                }
                self.last_token = Some(token);
                metrics::elected(token, slot, started.elapsed());
                // A new term's lease is fresh: the gauge must not read 0 until the first renewal.
                if let LeaseState::Alive { deadline } = lease.state() {
                    metrics::ttl_remaining(deadline.remaining());
                }
                self.leader_watch = Some(LeaderWatch::new(&self.ctx, &key, token));
                self.term = Some(Term { token, key, slot });
                self.delayed = None;
                self.preempt_at = None;
                let delay = self.takeover_delay_for(token, delay_turned_on).await;
                Event::Elected { token, delay }
            }
            Ok(Outcome::NotAcquired) => Event::NotAcquired,
            Ok(Outcome::Lost(r)) => {
                tracing::warn!(
                    election = self.cfg.election.name(),
                    "candidacy lost while queued: {}",
                    r.as_str()
                );
                Event::CampaignFailed { etcd: false }
            }
            // A refusal (a slot count the election does not run with) would only repeat.
            Err(e) if crate::exit::exit_of(&e) == Exit::Usage => {
                let t = self.cfg.conn.command_timeout;
                lease.revoke(t, t).await;
                return Err(e);
            }
            Err(e) => {
                self.failure = Some(("campaign failed", e));
                Event::CampaignFailed { etcd: true }
            }
        };
        self.lease = Some(lease);
        Ok(ev)
    }

    /// The first campaign's lease, granted at start-up beside the probe. What etcd says to
    /// the probe still decides the start: unreachable or refusing us (exit 69 or 77; a lease
    /// grant may succeed where reading our keys is not allowed), or, if it answers and the
    /// grant did not (a leader election that the probe waited out), a grant again at once.
    /// The candidate key is created only after both, so a worker that gives up at start may
    /// leave an empty lease behind, never a key in line.
    async fn first_grant(
        &mut self,
        first: tokio::task::JoinHandle<Result<Lease>>,
    ) -> Result<Result<Lease>> {
        let lease = first.await?;
        if let Some(probe) = self.probe.take() {
            match probe.await? {
                // A granted lease proves a quorum that answers: a probe that only ran out of
                // time waited for that grant's commit (slow disks make a linearizable read
                // wait for the commits in flight).
                Err(e) if lease.is_ok() && crate::exit::exit_of(&e) == Exit::Unavailable => {
                    tracing::debug!("start-up probe: {e:#}; the lease was granted meanwhile");
                }
                r => r?,
            }
        }
        notify::ready();
        Ok(match lease {
            Ok(l) => Ok(l),
            Err(_) => grant(&self.ctx, &self.cfg).await,
        })
    }

    /// Starts the job for a confirmed term.
    async fn spawn(&mut self, token: i64) -> Result<Event> {
        let lost = Event::NotStarted;
        let lease = self.lease.as_ref().expect("a term has a lease");
        if !matches!(lease.state(), LeaseState::Alive { deadline } if !deadline.has_passed()) {
            return Ok(lost);
        }
        // Another worker may have finished this run key while we queued.
        if let Some(k) = already_done(&self.ctx, &self.cfg).await? {
            tracing::info!(
                election = self.cfg.election.name(),
                run_key = k,
                "run key already done; not running the job"
            );
            self.term = None;
            return Ok(Event::AlreadyDone);
        }
        // With --takeover-delay, the next leader decides by this term's record, so it must
        // exist before the job does: a term that ran a job always has one.
        let recorded = if self.cfg.takeover_delay.is_zero() {
            None
        } else {
            match self.start_record(token).await.ok().flatten() {
                Some(s) => Some(s),
                None => {
                    tracing::warn!(
                        election = self.cfg.election.name(),
                        token,
                        "not starting the job: its history record, which --takeover-delay needs first, could not be written"
                    );
                    return Ok(lost);
                }
            }
        };
        // Read only now: the checks above can take up to --command-timeout, and a lease
        // granted or renewed late (etcd stalled) may leave too little time. Renew first.
        let Some(deadline) = lease
            .deadline_for_spawn(self.cfg.grace, self.cfg.conn.command_timeout)
            .await
        else {
            tracing::warn!(
                election = self.cfg.election.name(),
                token,
                "not starting the job: the lease could not be renewed in time to leave it --grace plus one keepalive interval"
            );
            return Ok(lost);
        };
        // The campaign left the line on a failing check, but the check may have failed since
        // (while the previous term was judged, a run key or the start record written): a
        // worker found unhealthy gives the term up rather than start a job it would stop.
        if self
            .health
            .as_ref()
            .is_some_and(|h| *h.borrow() == Health::Unhealthy)
        {
            tracing::warn!(
                election = self.cfg.election.name(),
                token,
                "not starting the job: the health check failed {} times in a row since the election; resigning",
                self.cfg.health.as_ref().map(|h| h.failures).unwrap_or(0)
            );
            // A start record already written is closed as this term's end.
            if let Some(s) = recorded {
                self.history_start = Some(tokio::spawn(async move { Some(s) }));
            }
            return Ok(Event::Unhealthy);
        }
        let term = self.term.as_ref().expect("a term was confirmed");
        let spec = JobSpec {
            command: self.cfg.command.clone(),
            env: fencing::job_env(&self.cfg, token, term.slot, &term.key, lease.id),
            grace: self.cfg.grace,
            cgroup: self.cfg.cgroup,
        };
        let answer_within = self.cfg.conn.command_timeout;
        let launched = match self.standby.take() {
            Some(s) => match s.launch(&spec, deadline, answer_within).await {
                // Killed while it waited: a fresh one takes its place, as if none had been
                // started ahead.
                Ok(Launch::Gone) => {
                    tracing::warn!("the watchdog started ahead is gone; starting another");
                    None
                }
                other => Some(other),
            },
            None => None,
        };
        let launched = match launched {
            Some(l) => l,
            None => {
                Standby::start(spec.grace, spec.cgroup)?
                    .launch(&spec, deadline, answer_within)
                    .await
            }
        };
        match launched {
            Ok(Launch::Started(job)) => {
                tracing::info!(
                    election = self.cfg.election.name(),
                    id = self.cfg.id,
                    token,
                    pid = job.pid,
                    "leading: job started"
                );
                metrics::leading(true);
                metrics::job_started();
                notify::status(&format!("leading, token {token}"));
                self.job = Some(*job);
                self.job_started_at = Instant::now();
                self.led = true;
                self.timeout_at = self.cfg.timeout.map(|t| Instant::now() + t);
                // Beside the job, not before it or in the driver's path: the audit record must
                // neither delay the job nor hold up the deadlines forwarded to the watchdog.
                self.history_start = Some(match recorded {
                    Some(s) => tokio::spawn(async move { Some(s) }),
                    None => self.start_record(token),
                });
                Ok(Event::Spawned)
            }
            Ok(Launch::TooLate) => {
                tracing::warn!(
                    election = self.cfg.election.name(),
                    token,
                    "not starting the job: the lease deadline was spent when the watchdog was about to start it"
                );
                Ok(lost)
            }
            Ok(Launch::Gone | Launch::NoAnswer) => {
                tracing::warn!(
                    election = self.cfg.election.name(),
                    token,
                    "not starting the job: its watchdog did not answer within --command-timeout; giving up this term"
                );
                Ok(lost)
            }
            Err(e) => {
                self.resign().await;
                Err(e)
            }
        }
    }

    /// Writes the term's start record, in a task of its own.
    fn start_record(&self, token: i64) -> tokio::task::JoinHandle<Option<history::Started>> {
        let (ctx, cfg) = (self.ctx.clone(), self.cfg.clone());
        let key = self
            .term
            .as_ref()
            .map(|t| t.key.clone())
            .unwrap_or_default();
        let delayed = self.delayed;
        let job_cgroup = self.job.as_ref().map(|j| j.contained);
        tokio::spawn(async move {
            let term = records::Term {
                token,
                key: &key,
                id: &cfg.id,
            };
            ctx.record_start(
                term,
                cfg.history_keep,
                history::StartFacts {
                    takeover_delay: delayed,
                    job_cgroup,
                    job_timeout: cfg.timeout,
                },
            )
            .await
            .inspect_err(|e| tracing::warn!("history: {e:#}"))
            .ok()
        })
    }

    /// The takeover delay a new term owes: `--takeover-delay` when the term before it ended
    /// uncleanly, or when that cannot be read (waiting is the safe side).
    async fn takeover_delay_for(&self, token: i64, turned_on: bool) -> Option<Duration> {
        let d = self.cfg.takeover_delay;
        if d.is_zero() {
            return None;
        }
        let e = &self.cfg.election;
        if turned_on {
            // Earlier terms ran without a delay, so without a start record before their jobs:
            // the last record need not be the last term's. Only an election that never ran
            // a term (no record at all) starts at once.
            let ran = self.ctx.history(1).await;
            if !ran.as_ref().is_ok_and(|r| r.is_empty()) {
                tracing::warn!(
                    election = e.name(),
                    "this election ran without --takeover-delay until now: how its last term ended is unknown"
                );
                return Some(d);
            }
        }
        match self.ctx.previous_unclean(token).await {
            Ok(false) => None,
            Ok(true) => Some(d),
            Err(err) => {
                tracing::warn!(
                    election = e.name(),
                    "cannot read how the previous term ended ({err:#}); waiting out --takeover-delay"
                );
                Some(d)
            }
        }
    }

    /// Before a campaign: waits until `--health-cmd` passes. `Some` is what ended the wait
    /// instead (a stopping signal, or `--wait`/`--no-wait` giving up).
    async fn wait_healthy(&mut self) -> Option<Event> {
        let Driver {
            health,
            signals,
            give_up_at,
            cfg,
            ctx,
            candidate,
            gave_up_unhealthy,
            ..
        } = self;
        let rx = health.as_mut()?;
        let first = tokio::select! {
            h = health::settled(rx) => h,
            ev = stopping(signals) => return Some(ev),
        };
        if first == Health::Healthy {
            return None;
        }
        let election = cfg.election.name();
        if cfg.wait == Wait::No {
            // The one line that says so is the run's last (see `report_not_acquired`).
            *gave_up_unhealthy = true;
            return Some(Event::NotAcquired);
        }
        tracing::warn!(election, "not campaigning until the health check passes");
        notify::status("unhealthy: waiting for the health check to pass");
        // Bounded tighter than a request: a pass or a signal must not wait on an etcd in trouble.
        let bound = cfg.conn.command_timeout.min(Duration::from_secs(1));
        let shown = tokio::time::timeout(bound, show_unhealthy(ctx, cfg, candidate))
            .await
            .ok()
            .flatten();
        let give_up = crate::clock::until(*give_up_at);
        let out = tokio::select! {
            passed = rx.wait_for(|h| *h == Health::Healthy) => {
                if passed.is_err() {
                    // The checks stopped running (a bug): no pass can come any more, but a
                    // stop signal and --wait must still end the wait.
                    tracing::error!(election, "the health check stopped running; waiting for a stop signal");
                    tokio::select! {
                        ev = stopping(signals) => Some(ev),
                        _ = crate::clock::until(*give_up_at) => {
                            *gave_up_unhealthy = true;
                            Some(Event::NotAcquired)
                        }
                    }
                } else {
                    tracing::info!(election, "the health check passes; campaigning");
                    None
                }
            }
            ev = stopping(signals) => Some(ev),
            _ = give_up => {
                *gave_up_unhealthy = true;
                Some(Event::NotAcquired)
            }
        };
        if let Some(lease) = shown {
            let timeout = cfg.conn.command_timeout.min(Duration::from_secs(1));
            lease.revoke(timeout, cfg.conn.command_timeout).await;
        }
        out
    }

    /// Waits out `--takeover-delay` with the lease renewed, watching the term as a running
    /// one is watched; status shows when the job is due.
    async fn delay(&mut self, d: Duration) -> Event {
        let election = self.cfg.election.name().to_string();
        let token = self.term.as_ref().map(|t| t.token).unwrap_or(0);
        tracing::warn!(
            election,
            token,
            "the previous term ended uncleanly: waiting --takeover-delay {} before starting the job",
            crate::clock::human(d)
        );
        metrics::takeover_delayed();
        notify::status(&format!("takeover delay, token {token}"));
        self.delayed = Some(d);
        let until = Instant::now() + d;
        self.show_takeover(unix_ms() + d.as_millis() as u64).await;
        let Driver {
            ctx,
            cfg,
            lease,
            leader_watch,
            signals,
            health,
            ..
        } = self;
        let mut lease_rx = lease.as_ref().map(|l| l.subscribe());
        let checked = health.is_some();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return Event::DelayDone,
                changed = async { lease_rx.as_mut().expect("lease").changed().await }, if lease_rx.is_some() => {
                    if changed.is_err() {
                        return Event::LeaseTaskEnded;
                    }
                    if let LeaseState::Lost(r) = *lease_rx.as_ref().expect("lease").borrow() {
                        return Event::Lost(r);
                    }
                }
                ev = async { leader_watch.as_mut().expect("leader watch").next().await }, if leader_watch.is_some() => {
                    return match ev {
                        LeaderEvent::KeyDeleted => Event::Lost(Loss::KeyDeleted),
                        LeaderEvent::Paused => Event::Paused,
                        LeaderEvent::ResignRequested => Event::ResignRequested,
                        // No job runs yet: handing over costs nothing, so --min-term waits for
                        // none (and etcd trouble is no reason to keep the term); but a request
                        // whose candidate has left the line is ignored.
                        LeaderEvent::Preempted => match outranked(ctx, cfg, token).await {
                            Some(false) => continue,
                            _ => Event::ResignRequested,
                        },
                    };
                }
                ev = stopping(signals) => return ev,
                _ = async { health::failing(health.as_mut().expect("checked")).await }, if checked => {
                    return Event::Unhealthy;
                }
            }
        }
    }

    /// Puts when the delayed job is due into our candidate value, for `status`. Best effort:
    /// the delay holds whether or not this lands.
    async fn show_takeover(&mut self, due_ms: u64) {
        let (Some(term), Some(lease)) = (self.term.as_ref(), self.lease.as_ref()) else {
            return;
        };
        let value = Candidate {
            takeover_until_ms: Some(due_ms),
            ..self.candidate.clone()
        };
        let txn = etcd_client::Txn::new()
            .when([etcd_client::Compare::create_revision(
                term.key.clone(),
                etcd_client::CompareOp::Equal,
                term.token,
            )])
            .and_then([etcd_client::TxnOp::put(
                term.key.clone(),
                value.encode(),
                Some(etcd_client::PutOptions::new().with_lease(lease.id)),
            )]);
        let mut c = self.ctx.client.clone();
        if let Err(e) = self.ctx.bounded(c.txn(txn)).await {
            tracing::debug!("takeover delay not shown in status: {e:#}");
        }
    }

    /// Waits for what ends or disturbs the term.
    async fn wait_leading(&mut self, phase: Phase) -> Event {
        let draining = matches!(phase, Phase::Draining { .. });
        let Driver {
            ctx,
            job,
            lease,
            leader_watch,
            signals,
            cfg,
            timeout_at,
            health,
            job_started_at,
            preempt_at,
            ..
        } = self;
        let token = phase.token().unwrap_or(0);
        let job_ref = job.as_mut().expect("leading means a job");
        let mut lease_rx = lease.as_ref().map(|l| l.subscribe());
        // A renewal that landed since the last call (during the spawn, say) is marked seen
        // by subscribe(): pass it on now, or the watchdog's deadline would lag by a renewal.
        if let (false, Some(LeaseState::Alive { deadline })) =
            (draining, lease_rx.as_ref().map(|rx| *rx.borrow()))
        {
            job_ref.extend(deadline, cfg.grace);
        }
        let timeout_at = *timeout_at;
        let checked = health.is_some();
        loop {
            tokio::select! {
                _ = async { tokio::time::sleep_until(preempt_at.expect("checked")).await }, if !draining && preempt_at.is_some() => {
                    match outranked(ctx, cfg, token).await {
                        Some(true) => {
                            tracing::info!(
                                election = cfg.election.name(),
                                id = cfg.id,
                                "--min-term {} is over: handing over to the higher-priority candidate",
                                crate::clock::human(cfg.min_term)
                            );
                            return Event::ResignRequested;
                        }
                        Some(false) => *preempt_at = None,
                        // etcd did not answer: ask again soon rather than restart the job on
                        // a request that may have lapsed.
                        None => *preempt_at = Some(Instant::now() + PREEMPT_RETRY),
                    }
                }
                _ = async { health::failing(health.as_mut().expect("checked")).await }, if !draining && checked => {
                    tracing::warn!(
                        election = cfg.election.name(),
                        id = cfg.id,
                        "the health check failed {} times in a row; stopping the job and resigning",
                        cfg.health.as_ref().map(|h| h.failures).unwrap_or(0)
                    );
                    return Event::Unhealthy;
                }
                _ = async { tokio::time::sleep_until(timeout_at.expect("checked")).await }, if !draining && timeout_at.is_some() => {
                    tracing::warn!(
                        election = cfg.election.name(),
                        id = cfg.id,
                        "the job ran for --timeout {}; stopping it",
                        crate::clock::human(cfg.timeout.unwrap_or_default())
                    );
                    metrics::job_timed_out();
                    return Event::TimedOut;
                }
                ended = job_ref.wait() => {
                    *job = None;
                    let exit = Exit::from_job(ended.status);
                    metrics::leading(false);
                    metrics::job_exited(exit.code(), ended.slack_ms);
                    let by_watchdog = matches!(ended.cause, GroupEnd::Deadline | GroupEnd::Orphaned | GroupEnd::WatchdogLost);
                    if matches!(ended.cause, GroupEnd::Deadline) { metrics::stopped_at_deadline(); }
                    match ended.cause {
                        GroupEnd::Deadline => tracing::error!(
                            election = cfg.election.name(),
                            id = cfg.id,
                            slack_ms = ended.slack_ms,
                            "the watchdog stopped the job at the lease deadline ({}): lead-exec could not renew in time",
                            ended.status
                        ),
                        GroupEnd::WatchdogLost | GroupEnd::Orphaned => tracing::error!(
                            election = cfg.election.name(),
                            id = cfg.id,
                            "the job was killed because its watchdog died; giving up this term"
                        ),
                        GroupEnd::SelfExit | GroupEnd::Stop => tracing::info!(election = cfg.election.name(), id = cfg.id, slack_ms = ended.slack_ms, "job ended: {}", ended.status),
                    }
                    return Event::JobEnded { exit, by_watchdog };
                }
                changed = async { lease_rx.as_mut().expect("lease").changed().await }, if !draining && lease_rx.is_some() => {
                    if changed.is_err() {
                        return Event::LeaseTaskEnded;
                    }
                    let state = *lease_rx.as_ref().expect("lease").borrow();
                    match state {
                        LeaseState::Alive { deadline } => {
                            job_ref.extend(deadline, cfg.grace);
                            metrics::ttl_remaining(deadline.remaining());
                        }
                        LeaseState::Lost(r) => return Event::Lost(r),
                    }
                }
                ev = async { leader_watch.as_mut().expect("leader watch").next().await }, if !draining && leader_watch.is_some() => {
                    return match ev {
                        LeaderEvent::KeyDeleted => {
                            // A revoked or expired lease deletes the key too, and then the next
                            // leader may already run: ask, so the job gets SIGKILL at once.
                            let timeout = cfg.conn.command_timeout.min(Duration::from_secs(1));
                            let gone = match lease.as_ref() {
                                Some(l) => l.is_gone(timeout).await,
                                None => false,
                            };
                            Event::Lost(if gone { Loss::Expired } else { Loss::KeyDeleted })
                        }
                        LeaderEvent::Paused => Event::Paused,
                        LeaderEvent::ResignRequested => Event::ResignRequested,
                        LeaderEvent::Preempted => {
                            let at = *job_started_at + cfg.min_term;
                            tracing::info!(
                                election = cfg.election.name(),
                                id = cfg.id,
                                "a higher-priority candidate asks for the term; handing over {}",
                                if at <= Instant::now() { "now".to_string() } else { format!("once --min-term {} is over", crate::clock::human(cfg.min_term)) }
                            );
                            *preempt_at = Some(at);
                            continue;
                        }
                    };
                }
                Some(sig) = signals.recv() => {
                    if signals::is_stopping(sig) {
                        return Event::Interrupted { signal: sig };
                    }
                    job_ref.forward(sig);
                }
            }
        }
    }

    async fn resign(&mut self) {
        self.leader_watch = None;
        self.term = None;
        metrics::leading(false);
        // A second at most before campaigning again or exiting; after that the revoke goes
        // on in the background with whole command timeouts, which a slow link needs (see
        // `Lease::revoke`). A term's own end waits longer for it (see `record_end`).
        let attempt = self.cfg.conn.command_timeout;
        let wait = attempt.min(Duration::from_secs(1));
        if let Some(lease) = self.lease.take() {
            if std::mem::take(&mut self.released) {
                // Our key is gone already: nothing waits on this lease. If lead-exec exits
                // first, it simply expires.
                tokio::spawn(lease.revoke(wait, attempt));
            } else {
                lease.revoke(wait, attempt).await;
            }
        }
    }

    async fn backoff(&mut self, d: Duration) -> Event {
        // Jitter spreads the candidates of a cluster that came back at once.
        let jitter = Duration::from_millis(BootInstant::now().as_nanos() % 250);
        let mut until = Instant::now() + d + jitter;
        if let Some(t) = self.give_up_at {
            until = until.min(t);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => Event::BackoffDone,
            ev = stopping(&mut self.signals) => ev,
        }
    }

    /// Writes how the term ended, while our key still guards the write; also the run key.
    async fn record_end(&mut self, reason: TermEnd) {
        // The end record goes after the start record.
        let started = match self.history_start.take() {
            Some(start) => start.await.ok().flatten(),
            None => None,
        };
        let Some(term) = self.term.as_ref() else {
            return;
        };
        let (cfg, ctx) = (&self.cfg, &self.ctx);
        let timeout = ctx.timeout;
        let slot = (cfg.slots > 1).then_some(term.slot);
        let term = records::Term {
            token: term.token,
            key: &term.key,
            id: &cfg.id,
        };
        // The run key first: it is guarded by our leader key, which the end record deletes.
        if let (TermEnd::Exited(0), Some(k)) = (reason, &cfg.run_key) {
            if let Err(e) = ctx.mark_run_key_done(term, k, cfg.run_key_ttl).await {
                tracing::warn!("run key: {e:#}");
            }
        }
        // One commit closes the record and hands over leadership.
        let released = match &started {
            Some(s) => ctx.record_end_and_release(term, slot, s, reason).await,
            None => Ok(false),
        };
        match released {
            Ok(true) => {
                self.released = true;
                return;
            }
            // Our key is gone or the record changed: nothing of ours to close; the revoke
            // (resign) ends the lease.
            Ok(false) if started.is_some() => return,
            Ok(false) => {}
            Err(e) => tracing::warn!(
                "could not close the term and hand over in one commit: {e:#}; revoking the lease first"
            ),
        }
        // The key goes first, so that the next term does not wait for the record: revoking
        // the lease deletes it (and our slot key). The record follows, as a record guarded by
        // itself, since the key that guarded it is gone.
        let token = term.token;
        let gone = match self.lease.take() {
            Some(lease) => lease.revoke(timeout, timeout).await,
            None => true,
        };
        self.released = true;
        if !gone {
            // etcd took neither: a third wait for the record would only delay the exit.
            tracing::warn!(token, "term end not recorded: etcd did not answer");
            return;
        }
        let written = self
            .ctx
            .record_end_after_release(token, started.as_ref(), reason)
            .await;
        match written {
            Ok(true) => {}
            Ok(false) => tracing::debug!(token, "term end not recorded: the record changed"),
            Err(e) => tracing::warn!("history: {e:#}"),
        }
    }
}

/// How soon a leader asks again whether a higher-priority candidate waits, when etcd did not
/// answer.
const PREEMPT_RETRY: Duration = Duration::from_secs(1);

/// Whether a higher-priority candidate is still in line behind term `token` (see
/// [`crate::election::leader::outranked_in_line`]); `None` when etcd did not answer. The
/// read is bounded by a second, since the leader forwards no deadline while it waits.
async fn outranked(ctx: &Ctx, cfg: &RunConfig, token: i64) -> Option<bool> {
    let timeout = ctx.timeout.min(Duration::from_secs(1));
    let e = &cfg.election;
    match crate::election::leader::outranked_in_line(ctx, token, cfg.priority, timeout).await {
        Ok(true) => Some(true),
        Ok(false) => {
            tracing::info!(
                election = e.name(),
                id = cfg.id,
                token,
                "no higher-priority candidate is in line any more; keeping the term"
            );
            Some(false)
        }
        Err(err) => {
            tracing::warn!(
                election = e.name(),
                "cannot tell whether a higher-priority candidate still waits: {err:#}"
            );
            None
        }
    }
}

/// Turns of the scheduler the connection gets before the watchdog is spawned (which holds
/// this thread for the watchdog's exec): enough for it to send its first bytes and wait on
/// the network.
const CONNECT_POLLS: usize = 4;

/// A lease for one campaign, kept alive from now on.
async fn grant(ctx: &Ctx, cfg: &RunConfig) -> Result<Lease> {
    Lease::grant(ctx, cfg.ttl, cfg.grace, cfg.safety_margin).await
}

/// A watchdog for the next job, or none if it cannot start now (the start is tried again
/// when the job is due, and fails there with its reason).
fn standby(cfg: &RunConfig) -> Option<Standby> {
    Standby::start(cfg.grace, cfg.cgroup)
        .inspect_err(|e| tracing::debug!("watchdog not started ahead: {e:#}"))
        .ok()
}

/// Shows this worker in `status` as out of line, on a lease of its own, kept alive until it is
/// revoked. Best effort: the worker stays out of line whether or not this lands.
async fn show_unhealthy(ctx: &Ctx, cfg: &RunConfig, candidate: &Candidate) -> Option<Lease> {
    let lease = grant(ctx, cfg)
        .await
        .inspect_err(|e| tracing::debug!("not shown as unhealthy in status: {e:#}"))
        .ok()?;
    if let Err(err) = ctx.mark_unhealthy(lease.id, candidate).await {
        tracing::debug!("not shown as unhealthy in status: {err:#}");
    }
    Some(lease)
}

/// Waits for a signal that stops the run; others (USR1, USR2) have no job to go to.
async fn stopping(signals: &mut mpsc::UnboundedReceiver<i32>) -> Event {
    loop {
        match signals.recv().await {
            Some(sig) if signals::is_stopping(sig) => return Event::Interrupted { signal: sig },
            Some(_) => {}
            None => std::future::pending::<()>().await,
        }
    }
}

/// `Some(key)` if `--run-key` was given and is already recorded as done.
async fn already_done(ctx: &Ctx, cfg: &RunConfig) -> Result<Option<String>> {
    let Some(k) = &cfg.run_key else {
        return Ok(None);
    };
    let done = ctx.run_key_done(k).await?;
    Ok(done.then(|| k.clone()))
}
