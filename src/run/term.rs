//! A won term: its job's start under a watchdog, and the records of its start and end.

use std::time::Duration;
use tracing::Instrument;

use anyhow::Result;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::RunConfig;
use crate::election::lease::{Lease, LeaseState, MIN_RENEWAL_TIMEOUT};
use crate::election::{Candidate, Ctx};
use crate::records::attempts::{Claim, Claimed};
use crate::records::history::{
    self, OnLease, Record, Start, StartFacts, Started, TermEnd, TrimFrom,
};
use crate::records::Writer;
use crate::supervisor::{JobControl, JobSpec, Launch, Standby};
use crate::{fencing, metrics, notify};

use super::env::{Env, Failure};
use super::events::{RunningJob, TermEvents};
use super::health::Health;
use super::lifecycle::StartEnd;

/// What starts the jobs, for the life of the process.
pub struct Launcher {
    /// A watchdog started ahead of the next job.
    pub standby: Option<Standby>,
    /// Where the signal thread's Ctrl-Z reaches the running job.
    pub job_control: JobControl,
    /// A job ran without a cgroup of its own, and the log said so: once per process.
    pub warned_uncontained: bool,
}

/// Between two sends of the commit that closes a term, after one failed at once.
const CLOSE_PAUSE: Duration = Duration::from_millis(100);

/// The term we hold, from the confirmed election to the revoke of its lease.
pub struct Term {
    pub token: i64,
    pub key: String,
    /// `LEAD_EXEC_SLOT`; its key exists only with `--slots` above 1.
    pub slot: u32,
    /// Where the term's events come from (large: its watch streams live here).
    pub events: Box<TermEvents>,
    /// The term's start record: written before the job, or being written beside it (see
    /// `Driver::start`).
    pub start_record: Option<StartRecord>,
    /// The `--takeover-delay` this term waited out before its job, for its start record.
    pub takeover_delay_waited: Option<Duration>,
    /// The attempt at the run key this term claimed (`--attempts`), once it has.
    attempt: Option<Claimed>,
    /// When the key this term waited behind was deleted: its handover is timed from there.
    predecessor_gone: Option<std::time::Instant>,
    /// The newest history keys, read by the transaction that created our key and confirmed
    /// the term (none otherwise): what the end trims by when no start record was seen written.
    pub history_newest: Option<Vec<Vec<u8>>>,
    /// When the creating transaction wrote our key as elected (its `elected_ms`), if it did:
    /// readers then know the term by its key, and its start record can wait (see
    /// [`history::START_RECORD_HOLD`]).
    pub elected_ms: Option<u64>,
}

impl Term {
    pub fn new(
        token: i64,
        key: String,
        slot: u32,
        events: TermEvents,
        predecessor_gone: Option<std::time::Instant>,
    ) -> Term {
        Term {
            token,
            key,
            slot,
            events: Box::new(events),
            start_record: None,
            takeover_delay_waited: None,
            attempt: None,
            predecessor_gone,
            history_newest: None,
            elected_ms: None,
        }
    }

    /// The attempt at the run key this term claimed (`--attempts`), once it has.
    pub fn attempt(&self) -> Option<u32> {
        self.attempt.map(|c| c.n)
    }

    fn writer<'a>(&'a self, cfg: &'a RunConfig) -> Writer<'a> {
        Writer {
            token: self.token,
            key: &self.key,
            id: &cfg.id,
        }
    }

    /// Puts `value` in our candidate key while it is still this term's, for `status`. Best
    /// effort: what it shows holds whether or not this lands.
    pub async fn show_in_status(&self, ctx: &Ctx, lease: &Lease, value: &Candidate) {
        if let Err(e) = ctx
            .update_candidate(&self.key, self.token, lease.id, value)
            .await
        {
            tracing::debug!("not shown in status: {e:#}");
        }
    }

    /// A start record for the term, as the term knows it now, started now. `job_cgroup` is
    /// whether its job runs in a cgroup of its own, once it runs.
    fn fresh_start_record(&self, cfg: &RunConfig, job_cgroup: Option<bool>) -> Record {
        let facts = StartFacts {
            takeover_delay: self.takeover_delay_waited,
            job_cgroup,
            job_timeout: cfg.timeout,
            run_key: cfg.run_key.as_deref(),
            attempt: self.attempt(),
        };
        Record::start(self.writer(cfg), facts)
    }

    /// Which old records the term's end trims, if the creating transaction told: it read the
    /// newest history keys at the term's token.
    fn trim_from(&self, ctx: &Ctx, cfg: &RunConfig) -> TrimFrom {
        match &self.history_newest {
            Some(newest) => TrimFrom::Known(history::trim_from_newest(
                newest,
                cfg.history_keep,
                &ctx.election.history_key(self.token),
            )),
            None => TrimFrom::Read,
        }
    }

    /// Writes the term's start record before its job, once: `None` if it was not written.
    async fn write_start_record(&self, ctx: &Ctx, cfg: &RunConfig) -> Option<Started> {
        let record = self.fresh_start_record(cfg, None);
        let trim = self.trim_from(ctx, cfg);
        match ctx
            .record_start(self.writer(cfg), cfg.history_keep, &record, &trim)
            .await
        {
            Ok(Some(s)) => Some(s),
            Ok(None) => {
                tracing::warn!("history: not written: our leader key is gone");
                None
            }
            Err(e) => {
                tracing::warn!("history: {e:#}");
                None
            }
        }
    }

    /// Writes the term's start record beside its job, in a task of its own (after
    /// [`history::START_RECORD_HOLD`] if our key says the term runs), and again after each
    /// failure (see [`history::start_retry_pause`]) until it lands, etcd says our key is
    /// gone, or the term's end stops it (see [`Writing::settle`]).
    fn start_record_task(&self, ctx: &Ctx, cfg: &RunConfig, job_cgroup: bool) -> Writing {
        // Made once, here: every attempt, and the term's end if none is seen to land, writes
        // the same record, started when the job did.
        let record = self.fresh_start_record(cfg, Some(job_cgroup));
        let trim = self.trim_from(ctx, cfg);
        let (ctx, cfg, rec) = (ctx.clone(), cfg.clone(), record.clone());
        let (token, key) = (self.token, self.key.clone());
        let hold = self.elected_ms.is_some();
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let term = Writer {
                token,
                key: &key,
                id: &cfg.id,
            };
            // A job that ends within the hold is recorded whole by the term's end alone. Only
            // a term whose key says it runs may wait: others are known by this record alone.
            if hold {
                tokio::select! {
                    _ = tokio::time::sleep(history::start_record_hold()) => {}
                    _ = stopped.wait_for(|s| *s) => return None,
                }
            }
            let mut failures = 0u32;
            loop {
                match ctx.record_start(term, cfg.history_keep, &rec, &trim).await {
                    Ok(Some(s)) => {
                        if failures > 0 {
                            tracing::info!(
                                token,
                                "history: start record written, after {failures} failed attempts"
                            );
                        }
                        return Some(s);
                    }
                    Ok(None) => {
                        tracing::warn!(
                            token,
                            "history: start record not written: our leader key is gone"
                        );
                        return None;
                    }
                    Err(e) if failures == 0 => tracing::warn!(
                        token,
                        "history: start record not written ({e:#}); retrying until it lands or the term ends"
                    ),
                    Err(e) => tracing::debug!(token, "history: start record not written yet: {e:#}"),
                }
                failures = failures.saturating_add(1);
                tokio::select! {
                    _ = tokio::time::sleep(history::start_retry_pause(failures)) => {}
                    // The term is ending, and writes the record with its end.
                    _ = stopped.wait_for(|s| *s) => return None,
                }
            }
        }.in_current_span());
        Writing { record, task, stop }
    }
}

/// A term's start record, as far as the term knows it.
pub enum StartRecord {
    /// Written before the job (`--takeover-delay`), and seen written.
    Written(Started),
    /// Being written beside the job.
    Writing(Writing),
}

/// A start record's writes beside the job: its task, the record it writes, and how the term's
/// end stops it. Dropping it aborts the task, so that a term that ends without its end record
/// (a revoked lease, a failed run) leaves no writer behind.
pub struct Writing {
    record: Record,
    task: JoinHandle<Option<Started>>,
    stop: watch::Sender<bool>,
}

impl Writing {
    /// What the term's end knows of its start record, at once: written, if an attempt was seen
    /// to land; otherwise unconfirmed, to go in whole with the end. An attempt still in flight
    /// is not waited for (the end would take its round trip on top of its own): it is guarded
    /// by our key, which the end's commit deletes, so it either lands before that commit,
    /// which then overwrites it whole, or finds the key gone and writes nothing.
    async fn settle(mut self) -> Start {
        let _ = self.stop.send(true);
        if self.task.is_finished() {
            if let Ok(Some(s)) = (&mut self.task).await {
                return Start::Written(s);
            }
        }
        self.task.abort();
        Start::Unconfirmed(self.record.clone())
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Term {
    /// Starts the job for the confirmed term: `Spawned` comes with the running job. A worker
    /// that `health` finds unhealthy (its check failed `--health-failures` times since the
    /// election) gives the term up instead.
    pub async fn start(
        &mut self,
        env: &Env,
        lease: &Lease,
        launcher: &mut Launcher,
        health: Option<&watch::Receiver<Health>>,
    ) -> (StartEnd<Failure>, Option<RunningJob>) {
        let lost = (StartEnd::NotStarted, None);
        let (cfg, ctx) = (&env.cfg, &env.ctx);
        let token = self.token;
        if !matches!(lease.state(), LeaseState::Alive { deadline } if !deadline.has_passed()) {
            return lost;
        }
        // Another worker may have finished this run key while we queued; with --attempts,
        // this term claims its attempt (or finds none left). A worker already found unhealthy
        // does not spend an attempt on a job it would not start.
        if cfg.attempts.is_some() && unhealthy(health, cfg, token) {
            return (StartEnd::Unhealthy, None);
        }
        match self.claim_run(ctx, cfg).await {
            Ok(None) => {}
            Ok(Some(end)) => return (end, None),
            Err(error) => {
                let what = "cannot read the run key";
                return (StartEnd::Failed(Failure { what, error }), None);
            }
        }
        // With --takeover-delay, the next leader decides by this term's record, so it must
        // exist before the job does: a term that ran a job always has one. So must the record
        // of a term its key does not mark as elected (one that waited out a delay): readers
        // know it by nothing else.
        let recorded = if cfg.takeover_delay.is_zero() && self.elected_ms.is_some() {
            None
        } else {
            match self.write_start_record(ctx, cfg).await {
                Some(s) => Some(s),
                None => {
                    tracing::warn!(
                        token,
                        "not starting the job: its history record, which must exist before this job, could not be written"
                    );
                    return lost;
                }
            }
        };
        // Whatever keeps the job from starting now, the end record closes the record written
        // ahead, in the commit that lets the key go: the next leader judges this term by it.
        self.start_record = recorded.clone().map(StartRecord::Written);
        // Read only now: the checks above can take up to --command-timeout, and a lease
        // granted or renewed late (etcd stalled) may leave too little time. Renew first.
        let Some(deadline) = lease
            .deadline_for_spawn(cfg.grace, cfg.conn.command_timeout)
            .await
        else {
            tracing::warn!(
                token,
                "not starting the job: the lease could not be renewed in time to leave it --grace plus one keepalive interval"
            );
            return lost;
        };
        // The campaign left the line on a failing check, but the check may have failed since
        // (while the previous term was judged, a run key or the start record written): a
        // worker found unhealthy gives the term up rather than start a job it would stop. Read
        // only now, after those waits.
        if unhealthy(health, cfg, token) {
            return (StartEnd::Unhealthy, None);
        }
        let spec = JobSpec {
            command: cfg.command.clone(),
            env: fencing::job_env(
                cfg,
                fencing::TermFacts {
                    token,
                    slot: self.slot,
                    key: &self.key,
                    lease: lease.id,
                    attempt: self.attempt(),
                },
                env.refusals.as_deref(),
            ),
            grace: cfg.grace,
            cgroup: cfg.cgroup,
        };
        let job = match launcher
            .launch(&spec, deadline, cfg.conn.command_timeout)
            .await
        {
            Ok(Launch::Started(job)) => job,
            Ok(Launch::TooLate) => {
                tracing::warn!(
                    token,
                    "not starting the job: the lease deadline was spent when the watchdog was about to start it"
                );
                return lost;
            }
            Ok(Launch::Gone | Launch::NoAnswer) => {
                tracing::warn!(
                    token,
                    "not starting the job: its watchdog did not answer within --command-timeout; giving up this term"
                );
                return lost;
            }
            Err(error) => {
                let what = "cannot start the job";
                return (StartEnd::Failed(Failure { what, error }), None);
            }
        };
        match self.attempt() {
            Some(attempt) => {
                tracing::info!(token, pid = job.pid, attempt, "leading: job started")
            }
            None => tracing::info!(token, pid = job.pid, "leading: job started"),
        }
        // The start time first: `/leader` reads it as soon as the worker leads.
        metrics::job_started(self.predecessor_gone);
        metrics::leading(true);
        notify::status(&format!("leading, token {token}"));
        let mut job = *job;
        job.under_job_control(&launcher.job_control);
        let contained = job.contained;
        // Beside the job, not before it or in the driver's path: the audit record must neither
        // delay the job nor hold up the deadlines forwarded to the watchdog.
        self.start_record = Some(match recorded {
            Some(s) => StartRecord::Written(s),
            None => StartRecord::Writing(self.start_record_task(ctx, cfg, contained)),
        });
        (StartEnd::Spawned, Some(RunningJob::new(job, cfg.timeout)))
    }

    /// Writes how the term ended, while our key still guards the write; also the run key.
    /// This ends the term: what is left is its lease, whose revoke follows, told by what is
    /// returned what it must do.
    pub async fn end(mut self, env: &Env, lease: i64, reason: TermEnd) -> Closing {
        // The end record goes after the start record, or in its place: one still being written
        // is stopped, and goes in whole with the end.
        let mut start = match self.start_record.take() {
            Some(StartRecord::Written(s)) => Some(Start::Written(s)),
            Some(StartRecord::Writing(w)) => Some(w.settle().await),
            None => None,
        };
        if let (TermEnd::Preempted, Some(s)) = (reason, start.as_mut()) {
            s.record_mut().preempted_by = self.events.preemptor();
        }
        let (cfg, ctx) = (&env.cfg, &env.ctx);
        let timeout = ctx.timeout;
        let on_lease = OnLease {
            lease,
            slot: (cfg.slots > 1).then_some(self.slot),
            priority: cfg.priority > 0,
        };
        let id = self.writer(cfg);
        let trim_unconfirmed = match self.trim_from(ctx, cfg) {
            TrimFrom::Known(t) => t,
            TrimFrom::Read => None,
        };
        // The run key first: it is guarded by our leader key, which the end record deletes.
        if let (TermEnd::Exited(0), Some(k)) = (reason, &cfg.run_key) {
            if let Err(e) = ctx.mark_run_key_done(id, k, cfg.run_key_ttl).await {
                tracing::warn!("run key: {e:#}");
            }
        }
        // An attempt stopped by an operator's move did not fail: the next term makes it again.
        if let (Some(c), Some(k), TermEnd::Paused | TermEnd::Resigned | TermEnd::Preempted) =
            (self.attempt, &cfg.run_key, reason)
        {
            match ctx.give_back_attempt(id, k, c).await {
                Ok(true) => tracing::info!(
                    run_key = k,
                    "attempt {} given back: the term was {reason}, not failed",
                    c.n
                ),
                Ok(false) => tracing::debug!("attempt {} not given back: no longer ours", c.n),
                Err(e) => tracing::warn!("attempt {} not given back: {e:#}", c.n),
            }
        }
        // One commit closes the record and hands over leadership. Sent again after a third
        // of the command timeout without an answer: a write lost on its way to an etcd leader
        // that was just cut off is never answered, while the next one, once the members have
        // elected another, is (measured: the handover took the whole command timeout). The
        // commit is guarded by our key, which it deletes, so a second one that finds the first
        // applied changes nothing and answers "not ours".
        let released = match &start {
            Some(s) => {
                let until = tokio::time::Instant::now() + timeout;
                let per_try = (timeout / 3).max(MIN_RENEWAL_TIMEOUT);
                loop {
                    let left = until.saturating_duration_since(tokio::time::Instant::now());
                    let attempt = Ctx {
                        timeout: left.min(per_try).max(MIN_RENEWAL_TIMEOUT),
                        ..ctx.clone()
                    };
                    let r = attempt
                        .record_end_and_release(id, on_lease, s, reason, trim_unconfirmed.clone())
                        .await;
                    let again = r
                        .as_ref()
                        .is_err_and(|e| crate::exit::exit_of(e) == crate::exit::Exit::Unavailable);
                    if !again || tokio::time::Instant::now() + CLOSE_PAUSE >= until {
                        break r;
                    }
                    tracing::debug!("closing the term: {:#}; sending it again", r.unwrap_err());
                    tokio::time::sleep(CLOSE_PAUSE).await;
                }
            }
            None => Ok(false),
        };
        match (released, &start) {
            (Ok(true), _) => return Closing::KeyDeleted,
            // Our key is gone or the record changed: nothing of ours to close; the revoke
            // ends the lease.
            (Ok(false), Some(Start::Written(_))) => return Closing::Open,
            // Our key is gone: the term ended unseen, as one whose record was written and never
            // closed. Its start record goes in as that (open, read as a lost lease) if none of
            // its attempts landed, so that history shows the term ran; the revoke follows.
            (Ok(false), Some(Start::Unconfirmed(rec))) => {
                match ctx.record_if_absent(self.token, rec).await {
                    Ok(true) => {}
                    Ok(false) => tracing::debug!("history: the start record had landed"),
                    Err(e) => tracing::warn!("history: {e:#}"),
                }
                return Closing::Open;
            }
            // No start record to close: the record is written whole, after the revoke.
            (Ok(false), None) => {}
            (Err(e), _) => tracing::warn!(
                "could not close the term and hand over in one commit: {e:#}; revoking the lease first"
            ),
        }
        // The key goes first, so that the next term does not wait for the record: the revoke
        // deletes it (and our slot key), and the record follows it.
        Closing::RecordAfterRevoke(Box::new(EndAfterRevoke {
            token: self.token,
            start,
            reason,
        }))
    }
}

/// How a term's end left the lease it ran on, for the revoke that follows.
pub enum Closing {
    /// Our key is still in line (or there was no term).
    Open,
    /// The end record also deleted our key and the lease's other keys (`OnLease`): the lease
    /// holds nothing any more, so revoking
    /// it can wait in the background (or be left to expire when lead-exec exits).
    KeyDeleted,
    /// The end record could not close the term in one commit with the key: the revoke
    /// deletes the key first, so that the next term does not wait for the record, and the
    /// record follows, guarded by itself since the key that guarded it is gone.
    RecordAfterRevoke(Box<EndAfterRevoke>),
}

/// A term's end record, to be written once its lease is revoked.
pub struct EndAfterRevoke {
    pub token: i64,
    pub start: Option<Start>,
    pub reason: TermEnd,
}

impl Launcher {
    /// Starts the job under the watchdog started ahead, or under a fresh one if none was
    /// started or that one is gone.
    async fn launch(
        &mut self,
        spec: &JobSpec,
        deadline: crate::clock::BootInstant,
        answer_within: Duration,
    ) -> Result<Launch> {
        if let Some(s) = self.standby.take() {
            match s
                .launch(spec, deadline, answer_within, &mut self.warned_uncontained)
                .await
            {
                // Killed while it waited: a fresh one takes its place, as if none had been
                // started ahead.
                Ok(Launch::Gone) => {
                    tracing::warn!("the watchdog started ahead is gone; starting another");
                }
                other => return other,
            }
        }
        Standby::start(spec.grace, spec.cgroup)?
            .launch(spec, deadline, answer_within, &mut self.warned_uncontained)
            .await
    }
}

impl Term {
    /// What the run key says before the job starts: `None` to start it (with `--attempts`,
    /// as the attempt this term claimed), else how the start ends instead.
    async fn claim_run(&mut self, ctx: &Ctx, cfg: &RunConfig) -> Result<Option<StartEnd<Failure>>> {
        let (Some(k), Some(attempts)) = (&cfg.run_key, cfg.attempts) else {
            return Ok(already_done(ctx, cfg).await?.map(|k| {
                tracing::info!(run_key = k, "run key already done; not running the job");
                StartEnd::AlreadyDone
            }));
        };
        // A retry waited behind a long attempt, or its --retry-delay, past the tick: the
        // next tick's workers take the next key, and this one is not retried into it.
        if let Some(p) = cfg
            .period
            .as_ref()
            .filter(|p| p.over_at_ms() <= crate::period::now_unix_ms())
        {
            tracing::info!(
                run_key = k,
                "the period of the run key ended at {}; not starting an attempt",
                crate::period::rfc3339(p.start_unix_s + p.length_s)
            );
            return Ok(Some(StartEnd::PeriodOver));
        }
        let claim = ctx
            .claim_attempt(self.writer(cfg), k, attempts.max, cfg.run_key_ttl)
            .await?;
        Ok(match claim {
            Claim::Attempt(c) => {
                self.attempt = Some(c);
                None
            }
            Claim::Done => {
                tracing::info!(run_key = k, "run key already done; not running the job");
                Some(StartEnd::AlreadyDone)
            }
            Claim::Exhausted(n) => {
                tracing::warn!(
                    run_key = k,
                    "{n} attempts at the run key failed (--attempts {}); not running the job",
                    attempts.max
                );
                Some(StartEnd::Exhausted)
            }
            Claim::Lost => Some(StartEnd::NotStarted),
        })
    }
}

/// Whether the health check has failed `--health-failures` times in a row since the
/// election; says so, as the term is given up for it.
fn unhealthy(health: Option<&watch::Receiver<Health>>, cfg: &RunConfig, token: i64) -> bool {
    let failing = health.is_some_and(|h| *h.borrow() == Health::Unhealthy);
    if failing {
        tracing::warn!(
            token,
            "not starting the job: the health check failed {} times in a row since the election; resigning",
            cfg.health.as_ref().map(|h| h.failures).unwrap_or(0)
        );
    }
    failing
}

/// `Some(key)` if `--run-key` was given and is already recorded as done.
pub async fn already_done(ctx: &Ctx, cfg: &RunConfig) -> Result<Option<String>> {
    let Some(k) = &cfg.run_key else {
        return Ok(None);
    };
    let done = ctx.run_key_done(k).await?;
    Ok(done.then(|| k.clone()))
}
