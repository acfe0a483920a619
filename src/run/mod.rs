//! `lead-exec run`: the driver that performs the actions of [`lifecycle`].
//!
//! All I/O of a run lives here: granting leases, campaigning, spawning the job under its
//! watchdog, forwarding deadlines and signals, resigning. The decisions are
//! [`step`]'s.

pub mod lifecycle;
pub mod signals;

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Result;
use etcd_client::Client;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::clock::BootInstant;
use crate::config::RunConfig;
use crate::election::campaign::{Campaign, Outcome, Wait, Waiting};
use crate::election::leader::{LeaderEvent, LeaderWatch};
use crate::election::lease::{Lease, LeaseState, Loss};
use crate::election::Candidate;
use crate::exit::Exit;
use crate::records::history::{self, TermEnd};
use crate::records::{self, runkey};
use crate::supervisor::protocol::GroupEnd;
use crate::supervisor::{Job, JobSpec};
use crate::{etcd, fencing, metrics, notify};
use lifecycle::{step, Action, Event, Phase, Policy, StopReason};

/// Runs until the job is done (or leadership is given up) and returns the exit code.
pub async fn run(cfg: RunConfig) -> Result<Exit> {
    crate::supervisor::preflight(&cfg.command[0])?;
    if let Some(addr) = cfg.metrics_addr {
        metrics::serve(addr).await?;
    }
    let signals = signals::listen()?;
    let client = etcd::connect(&cfg.conn).await?;
    if let Some(done) = already_done(&client, &cfg).await? {
        tracing::info!(
            election = cfg.election.name(),
            run_key = done,
            "run key already done; not running the job"
        );
        return Ok(Exit::Ok);
    }
    let give_up_at = match cfg.wait {
        Wait::For(d) => Some(Instant::now() + d),
        _ => None,
    };
    let mut d = Driver {
        cfg,
        client,
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
    };
    notify::ready();
    d.drive().await
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
    client: Client,
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
                    Action::StopJob { signal } => {
                        if let Some(j) = self.job.as_mut() {
                            j.stop(signal);
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
        let lease = match Lease::grant(
            &self.client,
            self.cfg.ttl,
            self.cfg.grace,
            self.cfg.safety_margin,
            self.cfg.conn.command_timeout,
        )
        .await
        {
            Ok(l) => l,
            Err(e) => {
                self.failure = Some(("cannot grant a lease", e));
                return Ok(Event::CampaignFailed { etcd: true });
            }
        };
        let value = Candidate::this_process(&self.cfg.id).encode();
        let election = self.cfg.election.name().to_string();
        let outcome = {
            let camp = Campaign {
                client: &self.client,
                election: &self.cfg.election,
                lease: &lease,
                value,
                wait: self.cfg.wait,
                give_up_at: self.give_up_at,
                timeout: self.cfg.conn.command_timeout,
                slots: self.cfg.slots,
            };
            let mut last_wait = None;
            let run = camp.run(|w| {
                if last_wait.as_ref() != Some(w) {
                    match w {
                        Waiting::Behind { value, .. } => {
                            let who = Candidate::parse(value).id;
                            tracing::info!(election, "waiting behind {who}");
                            notify::status(&format!("waiting behind {who}"));
                        }
                        Waiting::SlotsFull { ahead } => {
                            let n = self.cfg.slots;
                            tracing::info!(
                                election,
                                "waiting for one of {n} slots ({ahead} ahead)"
                            );
                            notify::status(&format!("waiting for one of {n} slots"));
                        }
                        Waiting::SlotKeysTaken => {
                            tracing::info!(
                                election,
                                "holding; waiting for a draining holder to free its slot"
                            );
                            notify::status("waiting for a slot to be freed");
                        }
                        Waiting::Paused => {
                            tracing::info!(election, "election paused; waiting for resume");
                            notify::status("paused");
                        }
                    }
                    last_wait = Some(w.clone());
                }
            });
            tokio::pin!(run);
            loop {
                tokio::select! {
                    out = &mut run => break Ok(out),
                    Some(sig) = self.signals.recv() => {
                        if signals::is_stopping(sig) {
                            break Err(sig);
                        }
                    }
                }
            }
        };
        let outcome = match outcome {
            Ok(o) => o,
            Err(signal) => {
                self.lease = Some(lease);
                return Ok(Event::Interrupted { signal });
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
                self.leader_watch = Some(LeaderWatch::new(
                    &self.client,
                    &self.cfg.election,
                    &key,
                    token,
                ));
                self.term = Some(Term { token, key, slot });
                Event::Elected { token }
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
                lease.revoke(self.cfg.conn.command_timeout).await;
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

    /// Starts the job for a confirmed term.
    async fn spawn(&mut self, token: i64) -> Result<Event> {
        let lost = Event::NotStarted;
        let lease = self.lease.as_ref().expect("a term has a lease");
        if !matches!(lease.state(), LeaseState::Alive { deadline } if !deadline.has_passed()) {
            return Ok(lost);
        }
        // Another worker may have finished this run key while we queued.
        if let Some(k) = already_done(&self.client, &self.cfg).await? {
            tracing::info!(
                election = self.cfg.election.name(),
                run_key = k,
                "run key already done; not running the job"
            );
            self.term = None;
            return Ok(Event::AlreadyDone);
        }
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
        let term = self.term.as_ref().expect("a term was confirmed");
        let spec = JobSpec {
            command: self.cfg.command.clone(),
            env: fencing::job_env(&self.cfg, token, term.slot, &term.key, lease.id),
            grace: self.cfg.grace,
            cgroup: self.cfg.cgroup,
        };
        match Job::spawn(&spec, deadline).await {
            Ok(Some(job)) => {
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
                self.job = Some(job);
                self.led = true;
                self.timeout_at = self.cfg.timeout.map(|t| Instant::now() + t);
                // Beside the job, not before it or in the driver's path: the audit record must
                // neither delay the job nor hold up the deadlines forwarded to the watchdog.
                let (client, cfg) = (self.client.clone(), self.cfg.clone());
                let key = term.key.clone();
                self.history_start = Some(tokio::spawn(async move {
                    let term = records::Term {
                        token,
                        key: &key,
                        id: &cfg.id,
                    };
                    let timeout = cfg.conn.command_timeout;
                    let keep = cfg.history_keep;
                    history::record_start(&client, &cfg.election, timeout, term, keep)
                        .await
                        .inspect_err(|e| tracing::warn!("history: {e:#}"))
                        .ok()
                }));
                Ok(Event::Spawned)
            }
            Ok(None) => {
                tracing::warn!(
                    election = self.cfg.election.name(),
                    token,
                    "not starting the job: the lease deadline was spent when the watchdog was about to start it"
                );
                Ok(lost)
            }
            Err(e) => {
                self.resign().await;
                Err(e)
            }
        }
    }

    /// Waits for what ends or disturbs the term.
    async fn wait_leading(&mut self, phase: Phase) -> Event {
        let draining = matches!(phase, Phase::Draining { .. });
        let Driver {
            job,
            lease,
            leader_watch,
            signals,
            cfg,
            timeout_at,
            ..
        } = self;
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
        loop {
            tokio::select! {
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
        let timeout = self.cfg.conn.command_timeout.min(Duration::from_secs(1));
        if let Some(lease) = self.lease.take() {
            if std::mem::take(&mut self.released) {
                // Our key is gone already: nothing waits on this lease. If lead-exec exits
                // first, it simply expires.
                tokio::spawn(lease.revoke(timeout));
            } else {
                lease.revoke(timeout).await;
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
        let sleep = tokio::time::sleep_until(until);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => return Event::BackoffDone,
                Some(sig) = self.signals.recv() => {
                    if signals::is_stopping(sig) {
                        return Event::Interrupted { signal: sig };
                    }
                }
            }
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
        let (cfg, client) = (&self.cfg, &self.client);
        let (e, timeout) = (&cfg.election, cfg.conn.command_timeout);
        let slot = (cfg.slots > 1).then_some(term.slot);
        let term = records::Term {
            token: term.token,
            key: &term.key,
            id: &cfg.id,
        };
        // The run key first: it is guarded by our leader key, which the end record deletes.
        if let (TermEnd::Exited(0), Some(k)) = (reason, &cfg.run_key) {
            if let Err(e) = runkey::mark_done(client, e, timeout, term, k, cfg.run_key_ttl).await {
                tracing::warn!("run key: {e:#}");
            }
        }
        // One commit closes the record and hands over leadership; without the start record
        // (its write failed) the end is written on its own and the revoke hands over.
        let released = match &started {
            Some(s) => {
                history::record_end_and_release(client, e, timeout, term, slot, s, reason).await
            }
            None => history::record_end(client, e, timeout, term, reason)
                .await
                .map(|()| false),
        };
        match released {
            Ok(r) => self.released = r,
            Err(e) => tracing::warn!("history: {e:#}"),
        }
    }
}

/// `Some(key)` if `--run-key` was given and is already recorded as done.
async fn already_done(client: &Client, cfg: &RunConfig) -> Result<Option<String>> {
    let Some(k) = &cfg.run_key else {
        return Ok(None);
    };
    let done = runkey::already_done(client, &cfg.election, cfg.conn.command_timeout, k).await?;
    Ok(done.then(|| k.clone()))
}
