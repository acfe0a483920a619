//! A won term: its job's start under a watchdog, and the records of its start and end.

use std::time::Duration;

use anyhow::Result;
use tokio::task::JoinHandle;

use crate::config::RunConfig;
use crate::election::lease::{Lease, LeaseState};
use crate::election::{Candidate, Ctx};
use crate::records::history::{self, TermEnd};
use crate::records::Writer;
use crate::supervisor::{JobSpec, Launch, Standby};
use crate::{fencing, metrics, notify};

use super::events::{RunningJob, TermEvents};
use super::health::Health;
use super::lifecycle::StartEnd;
use super::Driver;

/// The term we hold, from the confirmed election to the revoke of its lease.
pub struct Term {
    pub token: i64,
    pub key: String,
    /// `LEAD_EXEC_SLOT`; its key exists only with `--slots` above 1.
    pub slot: u32,
    /// Where the term's events come from.
    pub events: TermEvents,
    /// The term's start record, written beside the job (see `Driver::start`).
    pub start_record_task: Option<JoinHandle<Option<history::Started>>>,
    /// The `--takeover-delay` this term waited out before its job, for its start record.
    pub takeover_delay_waited: Option<Duration>,
    /// The job, once started; gone once its group is.
    pub job: Option<RunningJob>,
}

impl Term {
    pub fn new(token: i64, key: String, slot: u32, events: TermEvents) -> Term {
        Term {
            token,
            key,
            slot,
            events,
            start_record_task: None,
            takeover_delay_waited: None,
            job: None,
        }
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
        let txn = etcd_client::Txn::new()
            .when([etcd_client::Compare::create_revision(
                self.key.clone(),
                etcd_client::CompareOp::Equal,
                self.token,
            )])
            .and_then([etcd_client::TxnOp::put(
                self.key.clone(),
                value.encode(),
                Some(etcd_client::PutOptions::new().with_lease(lease.id)),
            )]);
        let mut c = ctx.client.clone();
        if let Err(e) = ctx.bounded(c.txn(txn)).await {
            tracing::debug!("not shown in status: {e:#}");
        }
    }

    /// Writes the term's start record, in a task of its own.
    fn start_record_task(
        &self,
        ctx: &Ctx,
        cfg: &RunConfig,
    ) -> JoinHandle<Option<history::Started>> {
        let (ctx, cfg) = (ctx.clone(), cfg.clone());
        let (token, key) = (self.token, self.key.clone());
        let facts = history::StartFacts {
            takeover_delay: self.takeover_delay_waited,
            job_cgroup: self.job.as_ref().map(|j| j.job.contained),
            job_timeout: cfg.timeout,
        };
        tokio::spawn(async move {
            let term = Writer {
                token,
                key: &key,
                id: &cfg.id,
            };
            ctx.record_start(term, cfg.history_keep, facts)
                .await
                .inspect_err(|e| tracing::warn!("history: {e:#}"))
                .ok()
        })
    }
}

impl Driver {
    /// Starts the job for the confirmed term.
    pub(super) async fn start(&mut self) -> Result<StartEnd> {
        let lost = StartEnd::NotStarted;
        let Some(c) = self.candidacy.as_mut() else {
            return Ok(lost);
        };
        let Some(term) = c.term.as_mut() else {
            return Ok(lost);
        };
        let (cfg, ctx, lease) = (&self.cfg, &self.ctx, &c.lease);
        let (election, token) = (cfg.election.name(), term.token);
        if !matches!(lease.state(), LeaseState::Alive { deadline } if !deadline.has_passed()) {
            return Ok(lost);
        }
        // Another worker may have finished this run key while we queued.
        if let Some(k) = already_done(ctx, cfg).await? {
            tracing::info!(
                election,
                run_key = k,
                "run key already done; not running the job"
            );
            return Ok(StartEnd::AlreadyDone);
        }
        // With --takeover-delay, the next leader decides by this term's record, so it must
        // exist before the job does: a term that ran a job always has one.
        let recorded = if cfg.takeover_delay.is_zero() {
            None
        } else {
            match term.start_record_task(ctx, cfg).await.ok().flatten() {
                Some(s) => Some(s),
                None => {
                    tracing::warn!(
                        election,
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
            .deadline_for_spawn(cfg.grace, cfg.conn.command_timeout)
            .await
        else {
            tracing::warn!(
                election,
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
                election,
                token,
                "not starting the job: the health check failed {} times in a row since the election; resigning",
                cfg.health.as_ref().map(|h| h.failures).unwrap_or(0)
            );
            // A start record already written is closed as this term's end.
            if let Some(s) = recorded {
                term.start_record_task = Some(tokio::spawn(async move { Some(s) }));
            }
            return Ok(StartEnd::Unhealthy);
        }
        let spec = JobSpec {
            command: cfg.command.clone(),
            env: fencing::job_env(cfg, token, term.slot, &term.key, lease.id),
            grace: cfg.grace,
            cgroup: cfg.cgroup,
        };
        let answer_within = cfg.conn.command_timeout;
        let launched = match self.standby.take() {
            Some(s) => match s
                .launch(&spec, deadline, answer_within, &mut self.warned_uncontained)
                .await
            {
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
            None => match Standby::start(spec.grace, spec.cgroup) {
                Ok(s) => {
                    s.launch(&spec, deadline, answer_within, &mut self.warned_uncontained)
                        .await
                }
                Err(e) => Err(e),
            },
        };
        match launched {
            Ok(Launch::Started(job)) => {
                tracing::info!(
                    election,
                    id = cfg.id,
                    token,
                    pid = job.pid,
                    "leading: job started"
                );
                metrics::leading(true);
                metrics::job_started();
                notify::status(&format!("leading, token {token}"));
                let mut job = job;
                job.under_job_control(&self.job_control);
                term.job = Some(RunningJob::new(*job, cfg.timeout));
                // Beside the job, not before it or in the driver's path: the audit record must
                // neither delay the job nor hold up the deadlines forwarded to the watchdog.
                term.start_record_task = Some(match recorded {
                    Some(s) => tokio::spawn(async move { Some(s) }),
                    None => term.start_record_task(ctx, cfg),
                });
                // A term ran: `--wait` counts afresh from the next campaign.
                self.give_up_at = None;
                Ok(StartEnd::Spawned)
            }
            Ok(Launch::TooLate) => {
                tracing::warn!(
                    election,
                    token,
                    "not starting the job: the lease deadline was spent when the watchdog was about to start it"
                );
                Ok(lost)
            }
            Ok(Launch::Gone | Launch::NoAnswer) => {
                tracing::warn!(
                    election,
                    token,
                    "not starting the job: its watchdog did not answer within --command-timeout; giving up this term"
                );
                Ok(lost)
            }
            Err(e) => {
                self.revoke_lease().await;
                Err(e)
            }
        }
    }

    /// Writes how the term ended, while our key still guards the write; also the run key.
    pub(super) async fn record_end(&mut self, reason: TermEnd) {
        let Some(c) = self.candidacy.as_mut() else {
            return;
        };
        let Some(term) = c.term.as_mut() else {
            return;
        };
        // The end record goes after the start record.
        let started = match term.start_record_task.take() {
            Some(start) => start.await.ok().flatten(),
            None => None,
        };
        let (cfg, ctx) = (&self.cfg, &self.ctx);
        let timeout = ctx.timeout;
        let slot = (cfg.slots > 1).then_some(term.slot);
        let id = term.writer(cfg);
        // The run key first: it is guarded by our leader key, which the end record deletes.
        if let (TermEnd::Exited(0), Some(k)) = (reason, &cfg.run_key) {
            if let Err(e) = ctx.mark_run_key_done(id, k, cfg.run_key_ttl).await {
                tracing::warn!("run key: {e:#}");
            }
        }
        // One commit closes the record and hands over leadership.
        let released = match &started {
            Some(s) => ctx.record_end_and_release(id, slot, s, reason).await,
            None => Ok(false),
        };
        match released {
            Ok(true) => {
                c.key_already_deleted = true;
                return;
            }
            // Our key is gone or the record changed: nothing of ours to close; the revoke
            // ends the lease.
            Ok(false) if started.is_some() => return,
            Ok(false) => {}
            Err(e) => tracing::warn!(
                "could not close the term and hand over in one commit: {e:#}; revoking the lease first"
            ),
        }
        // The key goes first, so that the next term does not wait for the record: revoking
        // the lease deletes it (and our slot key), and ends the candidacy here. The record
        // follows, as a record guarded by itself, since the key that guarded it is gone.
        let token = term.token;
        let Some(c) = self.candidacy.take() else {
            return;
        };
        if !c.lease.revoke(timeout, timeout).await {
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

/// `Some(key)` if `--run-key` was given and is already recorded as done.
pub async fn already_done(ctx: &Ctx, cfg: &RunConfig) -> Result<Option<String>> {
    let Some(k) = &cfg.run_key else {
        return Ok(None);
    };
    let done = ctx.run_key_done(k).await?;
    Ok(done.then(|| k.clone()))
}
