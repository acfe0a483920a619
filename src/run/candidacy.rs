//! A candidacy: one lease, in line or holding a term. Also what comes before the first one
//! (start-up) and between two (the health gate, the backoff).

use std::time::Duration;

use anyhow::Result;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::clock::BootInstant;
use crate::config::RunConfig;
use crate::election::campaign::{Campaign, Outcome, Wait};
use crate::election::leader::LeaderWatch;
use crate::election::lease::{Lease, LeaseState};
use crate::election::{unix_ms, Candidate, Ctx};
use crate::exit::Exit;
use crate::supervisor::Standby;
use crate::{etcd, metrics, notify};

use super::events::{HealthFailures, TermEvents, Timer};
use super::health::{self, Health};
use super::lifecycle::{BackoffEnd, CampaignEnd, Cause};
use super::term::{already_done, Term};
use super::{signals, token_regressed, Driver, Failure};

/// Our lease, in line or holding a term on it.
pub struct Candidacy {
    pub lease: Lease,
    /// The term we hold on this lease, once elected.
    pub term: Option<Term>,
    /// The end record also deleted our key: the lease holds nothing any more, so revoking
    /// it can wait in the background (or be left to expire when lead-exec exits).
    pub key_already_deleted: bool,
}

impl Candidacy {
    fn new(lease: Lease) -> Candidacy {
        Candidacy {
            lease,
            term: None,
            key_already_deleted: false,
        }
    }

    /// Revokes the lease: a second at most before campaigning again or exiting; after that
    /// the revoke goes on in the background with whole command timeouts, which a slow link
    /// needs (see [`Lease::revoke`]). A term's own end waits longer for it (see
    /// `Driver::record_end`).
    pub async fn revoke(self, command_timeout: Duration) {
        let wait = command_timeout.min(Duration::from_secs(1));
        if self.key_already_deleted {
            // Our key is gone already: nothing waits on this lease. If lead-exec exits
            // first, it simply expires.
            tokio::spawn(self.lease.revoke(wait, command_timeout));
        } else {
            self.lease.revoke(wait, command_timeout).await;
        }
    }
}

/// What start-up left in flight for the first campaign.
pub struct StartUp {
    /// The start-up probe, while the first lease grant is in flight beside it.
    probe: Option<JoinHandle<Result<()>>>,
    /// The first campaign's lease grant, sent beside the probe.
    first_lease: Option<JoinHandle<Result<Lease>>>,
}

/// Turns of the scheduler the connection gets before the watchdog is spawned (which holds
/// this thread for the watchdog's exec): enough for it to send its first bytes and wait on
/// the network.
const CONNECT_POLLS: usize = 4;

/// Connects, probes etcd and starts what the first campaign needs; `Err` is how the run
/// ended already (its run key was done).
pub async fn start_up(cfg: RunConfig) -> Result<Result<(Driver, StartUp), Exit>> {
    metrics::describe(cfg.election.name(), &cfg.id, cfg.slots, cfg.grace);
    if let Some(addr) = cfg.metrics_addr {
        metrics::serve(addr).await?;
    }
    // The first check runs while we connect.
    let health = cfg.health.clone().map(health::start);
    // A stop takes the grace, then the end record and the release (each within
    // --command-timeout), and the revoke that may follow.
    let stop_within = cfg.grace + 3 * cfg.conn.command_timeout;
    let (signals, job_control) = signals::listen(stop_within)?;
    let candidate = Candidate {
        priority: cfg.priority,
        ..Candidate::this_process(&cfg.id)
    };
    let ctx = Ctx::open(&cfg.conn, cfg.election.clone()).await?;
    let probe = {
        let (c, conn) = (ctx.client.clone(), cfg.conn.clone());
        tokio::spawn(async move { etcd::probe(&c, &conn).await })
    };
    // The server's version, beside the probe: a member's own answer, no commit, so it costs
    // no time on the way to the job.
    let version = {
        let (c, t) = (ctx.client.clone(), cfg.conn.dial_timeout);
        tokio::spawn(async move { etcd::server_version(&c, t).await })
    };
    // Without a health check or a run key to consult first, the first campaign's lease grant
    // goes out beside the probe, on the connection it opens.
    let grant_beside_probe = cfg.health.is_none() && cfg.run_key.is_none();
    let first_lease = grant_beside_probe.then(|| {
        let (c, ttl, grace, margin) = (ctx.clone(), cfg.ttl, cfg.grace, cfg.safety_margin);
        tokio::spawn(async move { Lease::grant(&c, ttl, grace, margin).await })
    });
    // The requests go out first: the watchdog the first campaign starts ahead (see
    // `Driver::campaign`) then overlaps their round trips instead of preceding them.
    for _ in 0..CONNECT_POLLS {
        tokio::task::yield_now().await;
    }
    let probe = if grant_beside_probe {
        Some(probe)
    } else {
        probe.await??;
        notify::ready();
        None
    };
    let etcd_warning = judge_version(version).await;
    if let Some(done) = already_done(&ctx, &cfg).await? {
        tracing::info!(
            election = cfg.election.name(),
            run_key = done,
            "run key already done; not running the job"
        );
        return Ok(Err(Exit::Ok));
    }
    let give_up_at = match cfg.wait {
        Wait::For(d) => Some(Instant::now() + d),
        _ => None,
    };
    let driver = Driver {
        cfg,
        ctx,
        candidate,
        health,
        standby: None,
        signals,
        job_control,
        give_up_at,
        last_token: None,
        warned_uncontained: false,
        etcd_warning,
        candidacy: None,
    };
    Ok(Ok((driver, StartUp { probe, first_lease })))
}

impl Driver {
    /// Grants a fresh lease and campaigns on it, until elected, refused or interrupted. The
    /// lease stays ours (`self.candidacy`) whatever the outcome: leaving the candidacy is a
    /// decision of the step, carried out by revoking it.
    pub(super) async fn campaign(
        &mut self,
        startup: Option<StartUp>,
    ) -> Result<CampaignEnd<Failure>> {
        let started = Instant::now();
        if let Wait::For(d) = self.cfg.wait {
            // `--wait` also bounds retries after etcd trouble; after a term it counts afresh.
            let give_up_at = *self.give_up_at.get_or_insert(started + d);
            if started >= give_up_at {
                return Ok(CampaignEnd::NotAcquired { unhealthy: false });
            }
        }
        if let Some(ev) = self.wait_healthy().await {
            return Ok(ev);
        }
        // The watchdog starts while we campaign: a won term then pays only for the job's own
        // fork and exec.
        if self.standby.is_none() {
            self.standby = start_watchdog_ahead(&self.cfg);
        }
        let started = Instant::now();
        let granted = match startup {
            Some(s) => self.first_grant(s).await?,
            None => grant(&self.ctx, &self.cfg).await,
        };
        let lease = match granted {
            Ok(l) => l,
            Err(error) => {
                return Ok(CampaignEnd::Failed(Cause::Etcd(Failure {
                    what: "cannot grant a lease",
                    error,
                })))
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
            let mut health = HealthFailures::new(self.health.clone());
            let outcome = tokio::select! {
                out = run => Ok(out),
                signal = stopping(&mut self.signals) => Err(CampaignEnd::Interrupted { signal }),
                _ = health.failing() => {
                    tracing::warn!(election, "the health check is failing; leaving the line until it passes");
                    Err(CampaignEnd::Unhealthy)
                }
            };
            let turned_on = camp
                .delay_turned_on
                .load(std::sync::atomic::Ordering::Relaxed);
            (outcome, turned_on)
        };
        // Ours until the step decides otherwise: the revoke takes our key out of the line.
        let mut candidacy = Candidacy::new(lease);
        let outcome = match outcome {
            Ok(o) => o,
            Err(ev) => {
                self.candidacy = Some(candidacy);
                return Ok(ev);
            }
        };
        let ev = match outcome {
            Ok(Outcome::Elected { token, key, slot }) => {
                if token_regressed(self.last_token, token) {
                    tracing::error!(
                        election,
                        previous = self.last_token,
                        token,
                        "the fencing token went backwards: etcd's revisions were reset (wiped or restored without --bump-revision); resources that check tokens will reject this term"
                    );
                    metrics::token_regressed();
                }
                self.last_token = Some(token);
                metrics::elected(token, slot, started.elapsed());
                // A new term's lease is fresh: the gauge must not read 0 until the first renewal.
                if let LeaseState::Alive { deadline } = candidacy.lease.state() {
                    metrics::ttl_remaining(deadline.remaining());
                }
                let watch = LeaderWatch::new(&self.ctx, &key, token);
                let health = HealthFailures::new(self.health.clone());
                let events = TermEvents::new(token, &candidacy.lease, watch, health);
                let mut term = Term::new(token, key, slot, events);
                let delay = self.takeover_delay_for(token, delay_turned_on).await;
                if let Some((d, why)) = &delay {
                    self.begin_takeover_delay(&candidacy.lease, &mut term, *d, why)
                        .await;
                }
                candidacy.term = Some(term);
                CampaignEnd::Elected {
                    token,
                    delay: delay.is_some(),
                }
            }
            Ok(Outcome::NotAcquired) => CampaignEnd::NotAcquired { unhealthy: false },
            Ok(Outcome::Lost(r)) => {
                tracing::warn!(election, "candidacy lost while queued: {}", r.as_str());
                CampaignEnd::Failed(Cause::CandidacyLost(r))
            }
            // A refusal (a slot count the election does not run with) would only repeat.
            Err(e) if crate::exit::exit_of(&e) == Exit::Usage => {
                let t = self.cfg.conn.command_timeout;
                candidacy.lease.revoke(t, t).await;
                return Err(e);
            }
            Err(error) => CampaignEnd::Failed(Cause::Etcd(Failure {
                what: "campaign failed",
                error,
            })),
        };
        self.candidacy = Some(candidacy);
        Ok(ev)
    }

    /// The first campaign's lease, granted at start-up beside the probe. What etcd says to
    /// the probe still decides the start: unreachable or refusing us (exit 69 or 77; a lease
    /// grant may succeed where reading our keys is not allowed), or, if it answers and the
    /// grant did not (a leader election that the probe waited out), a grant again at once.
    /// The candidate key is created only after both, so a worker that gives up at start may
    /// leave an empty lease behind, never a key in line.
    ///
    /// Start-up is bounded by `--dial-timeout`, the probe's bound: a grant still in flight
    /// when the probe gives up is abandoned (its lease, if the server grants it after all,
    /// holds no key and expires), not waited for through `--command-timeout`.
    async fn first_grant(&mut self, startup: StartUp) -> Result<Result<Lease>> {
        let Some(first) = startup.first_lease else {
            return Ok(grant(&self.ctx, &self.cfg).await);
        };
        let lease = match startup.probe {
            None => first.await?,
            Some(probe) => match probe.await? {
                Ok(()) => first.await?,
                // A granted lease proves a quorum that answers: a probe that only ran out of
                // time waited for that grant's commit (slow disks make a linearizable read
                // wait for the commits in flight).
                Err(e) if crate::exit::exit_of(&e) == Exit::Unavailable && first.is_finished() => {
                    match first.await? {
                        Ok(l) => {
                            tracing::debug!(
                                "start-up probe: {e:#}; the lease was granted meanwhile"
                            );
                            Ok(l)
                        }
                        Err(_) => return Err(e),
                    }
                }
                Err(e) => {
                    first.abort();
                    return Err(e);
                }
            },
        };
        notify::ready();
        Ok(match lease {
            Ok(l) => Ok(l),
            Err(_) => grant(&self.ctx, &self.cfg).await,
        })
    }

    /// The takeover delay a new term owes, with what was judged: `--takeover-delay` when the
    /// term before it ended uncleanly, or when that cannot be read (waiting is the safe side).
    async fn takeover_delay_for(&self, token: i64, turned_on: bool) -> Option<(Duration, String)> {
        let d = self.cfg.takeover_delay;
        if d.is_zero() {
            return None;
        }
        if turned_on {
            // Earlier terms ran without a delay, so without a start record before their jobs:
            // the last record need not be the last term's. Only an election that never ran
            // a term (no record at all) starts at once.
            let ran = self.ctx.history(Some(1)).await;
            if !ran.as_ref().is_ok_and(|r| r.is_empty()) {
                let why = "this election ran without --takeover-delay until now, so how its last term ended is unknown";
                return Some((d, why.to_string()));
            }
        }
        match self.ctx.previous_unclean(token).await {
            Ok(None) => None,
            Ok(Some(end)) => Some((d, format!("the previous term ended uncleanly ({end})"))),
            Err(err) => Some((
                d,
                format!("how the previous term ended cannot be read ({err:#})"),
            )),
        }
    }

    /// Starts `--takeover-delay` for the term just won: its end is the delaying phase's
    /// timer, and `status` shows when the job is due. `why` is what was judged.
    async fn begin_takeover_delay(&self, lease: &Lease, term: &mut Term, d: Duration, why: &str) {
        let token = term.token;
        tracing::warn!(
            election = self.cfg.election.name(),
            token,
            "{why}: waiting --takeover-delay {} before starting the job",
            crate::clock::human(d)
        );
        metrics::takeover_delayed();
        notify::status(&format!("takeover delay, token {token}"));
        term.takeover_delay_waited = Some(d);
        let value = Candidate {
            takeover_until_ms: Some(unix_ms() + d.as_millis() as u64),
            ..self.candidate.clone()
        };
        term.show_in_status(&self.ctx, lease, &value).await;
        // Counted from here: never shorter than asked, whatever the status write took.
        term.events.delay = Timer::after(d);
    }

    /// Before a campaign: waits until `--health-cmd` passes. `Some` is what ended the wait
    /// instead (a stopping signal, or `--wait`/`--no-wait` giving up).
    async fn wait_healthy(&mut self) -> Option<CampaignEnd<Failure>> {
        let Driver {
            health,
            signals,
            give_up_at,
            cfg,
            ctx,
            candidate,
            ..
        } = self;
        let rx = health.as_mut()?;
        let first = tokio::select! {
            h = health::settled(rx) => h,
            signal = stopping(signals) => return Some(CampaignEnd::Interrupted { signal }),
        };
        if first == Health::Healthy {
            return None;
        }
        let election = cfg.election.name();
        let gave_up = CampaignEnd::NotAcquired { unhealthy: true };
        if cfg.wait == Wait::No {
            // The one line that says so is the run's last (see `report_not_acquired`).
            return Some(gave_up);
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
                        signal = stopping(signals) => Some(CampaignEnd::Interrupted { signal }),
                        _ = crate::clock::until(*give_up_at) => Some(gave_up),
                    }
                } else {
                    tracing::info!(election, "the health check passes; campaigning");
                    None
                }
            }
            signal = stopping(signals) => Some(CampaignEnd::Interrupted { signal }),
            _ = give_up => Some(gave_up),
        };
        if let Some(lease) = shown {
            let timeout = cfg.conn.command_timeout.min(Duration::from_secs(1));
            lease.revoke(timeout, cfg.conn.command_timeout).await;
        }
        out
    }

    pub(super) async fn backoff(&mut self, d: Duration) -> BackoffEnd {
        // Jitter spreads the candidates of a cluster that came back at once.
        let jitter = Duration::from_millis(BootInstant::now().as_nanos() % 250);
        let mut until = Instant::now() + d + jitter;
        if let Some(t) = self.give_up_at {
            until = until.min(t);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => BackoffEnd::Done,
            signal = stopping(&mut self.signals) => BackoffEnd::Interrupted { signal },
        }
    }
}

/// Shows etcd's version in the metrics, and returns the warning it is worth when it lacks a
/// lease fix the fail-closed argument needs: said when the first job starts, where it
/// matters, so that a refusal stays one line and a worker that loses the race stays silent.
/// Waits for the answer at most a moment past the probe's (a member answers its status at
/// once).
async fn judge_version(version: JoinHandle<Option<String>>) -> Option<String> {
    let Ok(Ok(Some(v))) = tokio::time::timeout(VERSION_WAIT, version).await else {
        return None;
    };
    let missing = etcd::lease_fix_missing(&v);
    metrics::etcd_server(&v, missing.is_none());
    missing.map(|why| {
        format!("etcd {v} lacks a lease fix: {why}; upgrade to 3.6.5, 3.5.23 or 3.4.38 or later")
    })
}

/// How long the version's answer is waited for once the probe has answered.
const VERSION_WAIT: Duration = Duration::from_millis(200);

/// A lease for one campaign, kept alive from now on.
pub async fn grant(ctx: &Ctx, cfg: &RunConfig) -> Result<Lease> {
    Lease::grant(ctx, cfg.ttl, cfg.grace, cfg.safety_margin).await
}

/// A watchdog for the next job, or none if it cannot start now (the start is tried again
/// when the job is due, and fails there with its reason).
pub fn start_watchdog_ahead(cfg: &RunConfig) -> Option<Standby> {
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
async fn stopping(signals: &mut mpsc::UnboundedReceiver<i32>) -> i32 {
    loop {
        match signals.recv().await {
            Some(signal) if signals::is_stopping(signal) => return signal,
            Some(_) => {}
            None => std::future::pending::<()>().await,
        }
    }
}
