//! A candidacy: one lease, in line or holding a term. Also what comes before the first one
//! (start-up) and between two (the health gate, the backoff).

use std::time::Duration;
use tracing::Instrument;

use anyhow::Result;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::clock::BootInstant;
use crate::config::RunConfig;
use crate::election::campaign::{
    withdraw, Campaign, InLine, Joined, Joining, Learned, Outcome, Wait,
};
use crate::election::leader::LeaderWatch;
use crate::election::lease::{fresh_id, Lease, LeaseState};
use crate::election::{unix_ms, Candidate, Ctx};
use crate::exit::Exit;

use crate::supervisor::Standby;
use crate::{etcd, hooks, metrics, notify};

use super::env::{token_regressed, Env, Failure};
use super::events::{HealthFailures, Settings, TermEvents, Timer};
use super::health::{self, Health};
use super::lifecycle::Arrived;
use super::lifecycle::{BackoffEnd, CampaignEnd, Cause};
use super::signals;
use super::term::{already_done, Closing, EndAfterRevoke, Launcher, Term};

/// Our lease, in line or holding a term on it. Only [`Candidacy::revoke`] ends it.
pub struct Candidacy {
    pub lease: Lease,
    /// What the end of its term did to the key the lease holds.
    pub closing: Closing,
}

impl Candidacy {
    fn new(lease: Lease) -> Candidacy {
        Candidacy {
            lease,
            closing: Closing::Open,
        }
    }

    /// Revokes the lease, which deletes our key (and slot key): the next candidate takes
    /// over at once. A second at most before campaigning again or exiting; after that the
    /// revoke goes on in the background with whole command timeouts, which a slow link needs
    /// (see [`Lease::revoke`]). A term whose record waits for the revoke waits longer for it.
    pub async fn revoke(self, env: &Env) {
        let command_timeout = env.cfg.conn.command_timeout;
        let wait = command_timeout.min(Duration::from_secs(1));
        match self.closing {
            // Our key is gone already: nothing waits on this lease. If lead-exec exits
            // first, it simply expires.
            Closing::KeyDeleted => {
                tokio::spawn(self.lease.revoke(wait, command_timeout).in_current_span());
            }
            Closing::Open => {
                self.lease.revoke(wait, command_timeout).await;
            }
            Closing::RecordAfterRevoke(end) => {
                let EndAfterRevoke {
                    token,
                    start,
                    reason,
                } = *end;
                let timeout = env.ctx.timeout;
                if !self.lease.revoke(timeout, timeout).await {
                    // etcd took neither: a third wait for the record would only delay the exit.
                    tracing::warn!(token, "term end not recorded: etcd did not answer");
                    return;
                }
                let written = env
                    .ctx
                    .record_end_after_release(token, start.as_ref(), reason)
                    .await;
                match written {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::debug!(token, "term end not recorded: the record changed")
                    }
                    Err(e) => tracing::warn!("history: {e:#}"),
                }
            }
        }
    }
}

/// What start-up left in flight for the first campaign.
pub struct StartUp {
    /// The start-up probe, while the first lease grant is in flight beside it.
    probe: Option<JoinHandle<Result<()>>>,
    /// The first campaign's lease grant, sent beside the probe.
    first_lease: Option<JoinHandle<Result<Lease>>>,
    /// The endpoint moves counted when that grant went out: one more since, and the endpoint
    /// it went to has failed.
    moves_at_grant: u64,
    /// The first campaign's creating transaction, sent right behind that grant.
    early: Option<Early>,
}

/// A creating transaction sent before its lease was granted, naming the lease id the grant
/// asks for: the grant and the creation take one round trip between them.
struct Early {
    lease: i64,
    joined: JoinHandle<Result<Joined>>,
}

impl Early {
    /// What it answered, if it stands for the first creation of the campaign on `lease`: it
    /// named that lease and etcd took it. One that arrived before the grant wrote nothing (a
    /// put naming a lease that does not exist fails the whole transaction) and is sent again
    /// by the campaign. One that named another lease (ours was refused as taken, or its grant
    /// failed and was made again) and created a key has that key withdrawn: it is ours, on a
    /// lease we do not keep alive, and must not hold a place in line. A key it found there
    /// already is not ours, whoever's lease has our id: it stays.
    ///
    /// Still unanswered on another lease than ours, after a grant that etcd did not answer
    /// (the endpoint it went to hangs), it is not waited for: if that endpoint applies it
    /// later, it fails (no lease) or puts a key in line on a lease nobody renews, which
    /// expires with it. A grant refused as taken was answered, and so will this be.
    async fn settle(self, ctx: &Ctx, lease: &Lease, first: FirstGrant) -> Option<Joined> {
        if self.lease != lease.id && first == FirstGrant::Unanswered && !self.joined.is_finished() {
            tracing::debug!("creating transaction sent ahead of its lease: no answer; left");
            self.joined.abort();
            return None;
        }
        let answer = self.joined.await.ok()?;
        match answer {
            Ok(j) if self.lease == lease.id => Some(j),
            Ok(Joined { created: None, .. }) => None,
            Ok(j) => {
                if let Err(e) = withdraw(ctx, self.lease, j.rev).await {
                    tracing::warn!(
                        "a key created on a lease not ours stays until it expires: {e:#}"
                    );
                }
                None
            }
            Err(e) => {
                tracing::debug!("creating transaction sent ahead of its lease: {e:#}");
                None
            }
        }
    }
}

/// How the first lease grant, sent at start-up, ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstGrant {
    /// Granted, or refused with an answer (its id taken, say).
    Answered,
    /// No answer in time, or the connection failed: its endpoint may apply it later.
    Unanswered,
}

/// Turns of the scheduler the connection gets before the watchdog is spawned (which holds
/// this thread for the watchdog's exec): enough for it to send its first bytes and wait on
/// the network.
const CONNECT_POLLS: usize = 4;

/// Connects, probes etcd and starts what the first campaign needs; `Err` is how the run
/// ended already (its run key was done).
pub async fn start_up(cfg: RunConfig) -> Result<Result<(Process, StartUp), Exit>> {
    metrics::describe(cfg.election.name(), &cfg.id, cfg.slots, cfg.grace);
    let refusals = match cfg.metrics_addr {
        Some(addr) => metrics::serve(addr)?,
        None => None,
    };
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
    // Without a health check or a run key to consult first, the first campaign's lease grant
    // goes out beside the probe, on the connection it opens.
    // Nor with a splay, which would hold that lease idle through its wait.
    let grant_beside_probe = cfg.health.is_none() && cfg.run_key.is_none() && cfg.splay.is_zero();
    // And the transaction that puts us in line goes out behind the grant, without waiting
    // for its answer, if the connection is made first (see `Early`): etcd then gets the two in
    // the order they were sent. A connection that authenticating made is up already.
    // The grant goes out alone, the probe and the version request after the transaction:
    // etcd serves each request in a goroutine of its own, and with those two beside the
    // grant it proposed the transaction, sent 0.3 ms later, first in about one run of ten on
    // loopback (one in fifty with the grant alone; over TLS still one in ten); each such run
    // costs a commit and a round trip more.
    let dialing = Instant::now();
    let connected =
        grant_beside_probe && (cfg.conn.auth.is_some() || ctx.router.connect_pinned().await);
    let first_id = connected
        .then(|| hooks::value("LEAD_EXEC_TEST_FIRST_LEASE_ID").or_else(fresh_id))
        .flatten();
    let moves_at_grant = *ctx.router.moves().borrow();
    let first_lease = grant_beside_probe.then(|| {
        let (c, ttl, grace, margin) = (ctx.clone(), cfg.ttl, cfg.grace, cfg.safety_margin);
        // Tests send it after the creation behind it, as etcd may take them.
        let late = hooks::value("LEAD_EXEC_TEST_FIRST_GRANT_LATE_MS").map(Duration::from_millis);
        let grant = async move {
            if let Some(late) = late {
                tokio::time::sleep(late).await;
            }
            Lease::grant(&c, ttl, grace, margin, first_id).await
        };
        tokio::spawn(grant.in_current_span())
    });
    // The grant goes out first. Then, with nothing to consult before the first campaign,
    // its watchdog starts (see `start_watchdog_ahead`): its exec and set-up overlap the
    // first round trip instead of following it. Otherwise the campaign starts it.
    for _ in 0..CONNECT_POLLS {
        tokio::task::yield_now().await;
    }
    let standby = if grant_beside_probe {
        start_watchdog_ahead(&cfg)
    } else {
        None
    };
    // Behind the grant, on the id it asks for: the transaction that puts us in line. After
    // the watchdog's spawn, which leaves the grant's request time to reach etcd first.
    let early = first_id.map(|lease| Early {
        lease,
        joined: tokio::spawn(join_early(&ctx, &cfg, &candidate, lease).in_current_span()),
    });
    // Behind the grant and the transaction, the probe and the version request (see above).
    let probe = {
        // `--dial-timeout` counts from before connecting.
        let (c, conn) = (ctx.client.clone(), cfg.conn.clone());
        tokio::spawn(async move { etcd::probe(&c, &conn, dialing).await }.in_current_span())
    };
    // The server's version, beside the probe: a member's own answer, no commit, so it costs
    // no time on the way to the job.
    let version = {
        let (c, t) = (ctx.client.clone(), cfg.conn.dial_timeout);
        tokio::spawn(async move { etcd::server_version(&c, t).await }.in_current_span())
    };
    let probe = if grant_beside_probe {
        Some(probe)
    } else {
        probe.await??;
        notify::ready();
        None
    };
    let etcd_warning = judge_version(version).await;
    if let Some(done) = already_done(&ctx, &cfg).await? {
        tracing::info!(run_key = done, "run key already done; not running the job");
        return Ok(Err(Exit::Ok));
    }
    let give_up_at = match cfg.wait {
        Wait::For(d) => Some(Instant::now() + d),
        _ => None,
    };
    let process = Process {
        env: Env {
            cfg,
            ctx,
            candidate,
            refusals,
        },
        health,
        signals,
        launcher: Launcher {
            standby,
            job_control,
            warned_uncontained: false,
        },
        give_up_at,
        etcd_warning,
    };
    let startup = StartUp {
        probe,
        first_lease,
        moves_at_grant,
        early,
    };
    Ok(Ok((process, startup)))
}

/// What start-up made that lives as long as the process: the driver is made of it.
pub struct Process {
    pub env: Env,
    pub health: Option<watch::Receiver<Health>>,
    pub signals: mpsc::UnboundedReceiver<Arrived>,
    pub launcher: Launcher,
    /// When `--wait` gives up, if it does.
    pub give_up_at: Option<Instant>,
    /// What etcd's version is worth saying, once the first job starts.
    pub etcd_warning: Option<String>,
}

/// What a campaign leaves: no lease, our lease (in line, or to be given up as the step
/// decides), or a term won on it.
// One per campaign, moved once into the driver's state: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Campaigned {
    Nothing,
    Lease(Candidacy),
    Term(Candidacy, Term),
}

/// What a campaign uses of the process, lent for one campaign.
pub struct Ask<'a> {
    pub env: &'a Env,
    pub signals: &'a mut mpsc::UnboundedReceiver<Arrived>,
    pub health: &'a mut Option<watch::Receiver<Health>>,
    /// When `--wait` gives up: set by the first campaign after a term.
    pub give_up_at: &'a mut Option<Instant>,
    /// The previous term's token, and after a won campaign, this one's.
    pub last_token: &'a mut Option<i64>,
    /// Where the watchdog for the next job is started ahead.
    pub launcher: &'a mut Launcher,
}

/// Grants a fresh lease and campaigns on it, until elected, refused or interrupted. The lease
/// stays ours (in what is returned) whatever the outcome: leaving the candidacy is a decision
/// of the step, carried out by revoking it.
pub async fn campaign(
    ask: Ask<'_>,
    startup: Option<StartUp>,
) -> Result<(CampaignEnd<Failure>, Campaigned)> {
    let Ask {
        env,
        signals,
        health,
        give_up_at,
        last_token,
        launcher,
    } = ask;
    let cfg = &env.cfg;
    // `--splay`, before the first campaign only (the one start-up leads to). `--wait` bounds
    // the wait in line, so it counts from the end of the splay.
    if startup.is_some() && !cfg.splay.is_zero() {
        if let Some(signal) = splay(cfg.splay, signals).await {
            return Ok((CampaignEnd::Interrupted { signal }, Campaigned::Nothing));
        }
        if let Wait::For(d) = cfg.wait {
            *give_up_at = Some(Instant::now() + d);
        }
    }
    let started = Instant::now();
    if let Wait::For(d) = cfg.wait {
        // `--wait` also bounds retries after etcd trouble; after a term it counts afresh.
        let give_up = *give_up_at.get_or_insert(started + d);
        if started >= give_up {
            return Ok((
                CampaignEnd::NotAcquired { unhealthy: false },
                Campaigned::Nothing,
            ));
        }
    }
    if let Some(ev) = wait_healthy(env, signals, health, *give_up_at).await {
        return Ok((ev, Campaigned::Nothing));
    }
    // The watchdog starts while we campaign: a won term then pays only for the job's own fork
    // and exec.
    if launcher.standby.is_none() {
        launcher.standby = start_watchdog_ahead(cfg);
    }
    let started = Instant::now();
    let (granted, early) = match startup {
        Some(mut s) => {
            let early = s.early.take();
            let (granted, first) = first_grant(env, s, early.is_some()).await?;
            (granted, early.map(|e| (e, first)))
        }
        None => (grant(&env.ctx, cfg).await, None),
    };
    let lease = match granted {
        Ok(l) => l,
        Err(error) => {
            let failed = CampaignEnd::Failed(Cause::Etcd(Failure {
                what: "cannot grant a lease",
                error,
            }));
            return Ok((failed, Campaigned::Nothing));
        }
    };
    let joined = match early {
        Some((e, first)) => e.settle(&env.ctx, &lease, first).await,
        None => None,
    };
    let value = env.candidate.encode();
    let outcome = {
        let camp = Campaign {
            line: line(&env.ctx.client, cfg, &value),
            router: &env.ctx.router,
            lease: &lease,
            wait: cfg.wait,
            give_up_at: *give_up_at,
        };
        // A wait is logged when its line changes: the same wait read again (the one ahead of
        // us now elected, so we are next) says nothing new.
        let mut last_line = None;
        let run = Box::pin(camp.run(joined, |w| {
            wait_lightly(launcher, cfg, w);
            let line = w.to_string();
            if *w == InLine::Rechecking {
                tracing::debug!("{line}");
            } else if last_line.as_ref() != Some(&line) {
                tracing::info!("{line}");
                if let Some(status) = w.status() {
                    notify::status(&status);
                }
                last_line = Some(line);
            }
        }));
        let mut failing = HealthFailures::new(health.clone());
        tokio::select! {
            out = run => Ok(out),
            signal = stopping(signals) => Err(CampaignEnd::Interrupted { signal }),
            _ = failing.failing() => {
                tracing::warn!("the health check is failing; leaving the line until it passes");
                Err(CampaignEnd::Unhealthy)
            }
        }
    };
    // Ours until the step decides otherwise: the revoke takes our key out of the line.
    let candidacy = Candidacy::new(lease);
    let outcome = match outcome {
        Ok(o) => o,
        Err(ev) => return Ok((ev, Campaigned::Lease(candidacy))),
    };
    let (token, key, slot, at_creation, elected_ms, learned) = match outcome {
        Ok((
            Outcome::Elected {
                token,
                key,
                slot,
                at_creation,
                elected_ms,
            },
            learned,
        )) => (token, key, slot, at_creation, elected_ms, learned),
        Ok((Outcome::NotAcquired, _)) => {
            let ev = CampaignEnd::NotAcquired { unhealthy: false };
            return Ok((ev, Campaigned::Lease(candidacy)));
        }
        Ok((Outcome::Lost(r), _)) => {
            tracing::warn!("candidacy lost while queued: {}", r.as_str());
            let ev = CampaignEnd::Failed(Cause::CandidacyLost(r));
            return Ok((ev, Campaigned::Lease(candidacy)));
        }
        // A refusal (a slot count the election does not run with) would only repeat.
        Err(error) if crate::exit::exit_of(&error) == Exit::Usage => {
            let ev = CampaignEnd::Refused(Failure {
                what: "campaign refused",
                error,
            });
            return Ok((ev, Campaigned::Lease(candidacy)));
        }
        Err(error) => {
            let ev = CampaignEnd::Failed(Cause::Etcd(Failure {
                what: "campaign failed",
                error,
            }));
            return Ok((ev, Campaigned::Lease(candidacy)));
        }
    };
    if token_regressed(*last_token, token) {
        tracing::error!(
            previous = *last_token,
            token,
            "the fencing token went backwards: etcd's revisions were reset (wiped or restored without --bump-revision); resources that check tokens will reject this term"
        );
        metrics::token_regressed();
    }
    *last_token = Some(token);
    metrics::elected(token, slot, started.elapsed());
    // A new term's lease is fresh: the gauge must not read 0 until the first renewal.
    if let LeaseState::Alive { deadline } = candidacy.lease.state() {
        metrics::ttl_remaining(deadline.remaining());
    }
    let watch = LeaderWatch::new(&env.ctx, &key, token, at_creation.is_some());
    let settings = Settings::of(&env.cfg);
    let events = TermEvents::new(
        settings,
        &candidacy.lease,
        watch,
        HealthFailures::new(health.clone()),
    );
    let mut term = Term::new(token, key, slot, events, learned.predecessor_gone);
    term.history_newest = at_creation.map(|a| a.history_newest);
    term.elected_ms = elected_ms;
    let takeover = takeover_delay_for(env, token, learned).await;
    let retry = retry_delay_for(env).await;
    // Both are waits before the job, whichever is longer covers the other.
    let delay = match (takeover, retry) {
        (Some((t, why)), Some((r, _))) if t >= r => Some(Delay::Takeover(t, why)),
        (_, Some((r, why))) => Some(Delay::Retry(r, why)),
        (Some((t, why)), None) => Some(Delay::Takeover(t, why)),
        (None, None) => None,
    };
    if let Some(delay) = &delay {
        begin_delay(env, &candidacy.lease, &mut term, delay).await;
    }
    let ev = CampaignEnd::Elected {
        token,
        delay: delay.is_some(),
    };
    Ok((ev, Campaigned::Term(candidacy, term)))
}

/// The first campaign's lease, granted at start-up beside the probe. What etcd says to the
/// probe still decides the start: unreachable or refusing us (exit 69 or 77; a lease grant may
/// succeed where reading our keys is not allowed), or, if it answers and the grant did not (a
/// leader election that the probe waited out), a grant again at once. The creating
/// transaction sent behind the grant (`ahead`) may have put our key in line by then: a worker
/// that etcd refuses at start revokes the lease ([`give_up_first`]).
///
/// Start-up is bounded by `--dial-timeout` (connecting first included), the probe's bound,
/// and, after a refusal, by a second more for the grant's answer; a grant unanswered by then
/// is abandoned, not waited for through `--command-timeout`.
async fn first_grant(
    env: &Env,
    startup: StartUp,
    ahead: bool,
) -> Result<(Result<Lease>, FirstGrant)> {
    let Some(first) = startup.first_lease else {
        return Ok((grant(&env.ctx, &env.cfg).await, FirstGrant::Answered));
    };
    let lease = match startup.probe {
        None => first.await?,
        Some(probe) => match probe.await? {
            // The probe answered at the next endpoint after the grant's had failed: a write is
            // not sent twice, so that grant would hold on to its caller for the whole
            // `--command-timeout`. It is abandoned, and made again where etcd answers.
            Ok(())
                if *env.ctx.router.moves().borrow() > startup.moves_at_grant
                    && !first.is_finished() =>
            {
                first.abort();
                Err(crate::exit::fail(
                    Exit::Unavailable,
                    "the first lease grant went to an endpoint that failed since",
                ))
            }
            Ok(()) => first.await?,
            // A granted lease proves a quorum that answers: a probe that only ran out of
            // time waited for that grant's commit (slow disks make a linearizable read wait
            // for the commits in flight).
            Err(e) if crate::exit::exit_of(&e) == Exit::Unavailable && first.is_finished() => {
                match first.await? {
                    Ok(l) => {
                        tracing::debug!("start-up probe: {e:#}; the lease was granted meanwhile");
                        Ok(l)
                    }
                    Err(_) => return Err(e),
                }
            }
            // Refused (no permission, bad credentials): etcd answers, so the grant's answer
            // is worth a wait when a creation went out behind it.
            Err(e) if ahead && crate::exit::exit_of(&e) != Exit::Unavailable => {
                give_up_first(env, first).await;
                return Err(e);
            }
            Err(e) => {
                first.abort();
                return Err(e);
            }
        },
    };
    notify::ready();
    Ok(match lease {
        Ok(l) => (Ok(l), FirstGrant::Answered),
        Err(e) => {
            let first = match crate::exit::exit_of(&e) {
                Exit::Unavailable if !format!("{e:#}").contains("lease already exists") => {
                    FirstGrant::Unanswered
                }
                _ => FirstGrant::Answered,
            };
            (grant(&env.ctx, &env.cfg).await, first)
        }
    })
}

/// Gives up the first lease at a start-up that etcd refused. The creating transaction sent
/// behind its grant may have put our key in line on it, so the grant's answer is waited for
/// (a second at most: a probe refused for want of permission answers before a commit does),
/// and a lease granted is revoked, which takes the key with it. A grant unanswered by then is
/// abandoned: if etcd takes it later, a key on it stands in line until the lease expires.
async fn give_up_first(env: &Env, mut first: JoinHandle<Result<Lease>>) {
    let wait = env.cfg.conn.command_timeout.min(Duration::from_secs(1));
    match tokio::time::timeout(wait, &mut first).await {
        Ok(Ok(Ok(lease))) => {
            lease.revoke(wait, wait).await;
        }
        Ok(_) => {}
        Err(_) => first.abort(),
    }
}

/// What our key goes in line with, from the flags.
fn line<'a>(client: &'a crate::etcd::Client, cfg: &'a RunConfig, value: &'a str) -> Joining<'a> {
    Joining {
        client,
        election: &cfg.election,
        value,
        timeout: cfg.conn.command_timeout,
        slots: cfg.slots,
        priority: cfg.priority,
        takeover_delay: cfg.takeover_delay,
        history_keep: cfg.history_keep,
    }
}

/// The first creating transaction, owning what it needs, for [`Early`].
fn join_early(
    ctx: &Ctx,
    cfg: &RunConfig,
    candidate: &Candidate,
    lease: i64,
) -> impl std::future::Future<Output = Result<Joined>> + 'static {
    let (client, cfg, value) = (ctx.client.clone(), cfg.clone(), candidate.encode());
    async move { line(&client, &cfg, &value).join(lease).await }
}

/// The takeover delay a new term owes, with what was judged: `--takeover-delay` when the term
/// before it ended uncleanly, or when that cannot be read (waiting is the safe side).
async fn takeover_delay_for(env: &Env, token: i64, learned: Learned) -> Option<(Duration, String)> {
    let d = env.cfg.takeover_delay;
    if d.is_zero() {
        return None;
    }
    if learned.delay_turned_on {
        // Earlier terms ran without a delay, so without a start record before their jobs:
        // the last record need not be the last term's. Only an election that never ran a
        // term (no record at all) starts at once.
        // Our own term, known by its key, may be the newest: an earlier one is a record
        // of another token.
        let ran = env.ctx.history(Some(2)).await;
        if !ran
            .as_ref()
            .is_ok_and(|r| r.iter().all(|rec| rec.token == token))
        {
            let why = "this election ran without --takeover-delay until now, so how its last term ended is unknown";
            return Some((d, why.to_string()));
        }
    }
    match env.ctx.previous_unclean(token).await {
        Ok(None) => None,
        Ok(Some(end)) => Some((d, format!("the previous term ended uncleanly ({end})"))),
        Err(err) => Some((
            d,
            format!("how the previous term ended cannot be read ({err:#})"),
        )),
    }
}

/// `--retry-delay`, with what was judged, when the term just won follows a failed attempt at
/// its run key that leaves another to make. Not when the attempts cannot be read: the start
/// reads them again, and fails on what it cannot read.
async fn retry_delay_for(env: &Env) -> Option<(Duration, String)> {
    let (Some(k), Some(a)) = (&env.cfg.run_key, env.cfg.attempts) else {
        return None;
    };
    if a.retry_delay.is_zero() {
        return None;
    }
    match env.ctx.attempts_of(k).await {
        Ok(t) if !t.done && t.count >= 1 && t.count < a.max => Some((
            a.retry_delay,
            format!("attempt {} of {} at run key {k} failed", t.count, a.max),
        )),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!("attempts of run key {k}: {e:#}");
            None
        }
    }
}

/// A wait the term just won owes before its job, with what was judged.
enum Delay {
    /// `--takeover-delay`, after an unclean end.
    Takeover(Duration, String),
    /// `--retry-delay`, after a failed attempt.
    Retry(Duration, String),
}

/// Starts the delay for the term just won: its end is the delaying phase's timer. `status`
/// shows when the job is due after an unclean end.
async fn begin_delay(env: &Env, lease: &Lease, term: &mut Term, delay: &Delay) {
    let token = term.token;
    let (d, why, flag) = match delay {
        Delay::Takeover(d, why) => (*d, why, "--takeover-delay"),
        Delay::Retry(d, why) => (*d, why, "--retry-delay"),
    };
    tracing::warn!(
        token,
        "{why}: waiting {flag} {} before starting the job",
        crate::clock::human(d)
    );
    // A term waiting out a delay runs no job: its key no longer says it was elected (readers
    // would show it running), and its record is written before its job instead.
    term.elected_ms = None;
    let value = if let Delay::Takeover(..) = delay {
        metrics::takeover_delayed();
        notify::status(&format!("takeover delay, token {token}"));
        term.takeover_delay_waited = Some(d);
        Candidate {
            takeover_until_ms: Some(unix_ms() + d.as_millis() as u64),
            ..env.candidate.clone()
        }
    } else {
        notify::status(&format!("retry delay, token {token}"));
        env.candidate.clone()
    };
    term.show_in_status(&env.ctx, lease, &value).await;
    // Counted from here: never shorter than asked, whatever the status write took.
    term.events.delay = Timer::after(d);
}

/// Before a campaign: waits until `--health-cmd` passes. `Some` is what ended the wait instead
/// (a stopping signal, or `--wait`/`--no-wait` giving up).
async fn wait_healthy(
    env: &Env,
    signals: &mut mpsc::UnboundedReceiver<Arrived>,
    health: &mut Option<watch::Receiver<Health>>,
    give_up_at: Option<Instant>,
) -> Option<CampaignEnd<Failure>> {
    let cfg = &env.cfg;
    let rx = health.as_mut()?;
    let first = tokio::select! {
        h = health::settled(rx) => h,
        signal = stopping(signals) => return Some(CampaignEnd::Interrupted { signal }),
    };
    if first == Health::Healthy {
        return None;
    }
    let gave_up = CampaignEnd::NotAcquired { unhealthy: true };
    if cfg.wait == Wait::No {
        // The one line that says so is the run's last (see `report_not_acquired`).
        return Some(gave_up);
    }
    tracing::warn!("not campaigning until the health check passes");
    notify::status("unhealthy: waiting for the health check to pass");
    // Bounded tighter than a request: a pass or a signal must not wait on an etcd in trouble.
    let bound = cfg.conn.command_timeout.min(Duration::from_secs(1));
    let shown = tokio::time::timeout(bound, show_unhealthy(&env.ctx, cfg, &env.candidate))
        .await
        .ok()
        .flatten();
    let give_up = crate::clock::until(give_up_at);
    let out = tokio::select! {
        passed = rx.wait_for(|h| *h == Health::Healthy) => {
            if passed.is_err() {
                // The checks stopped running (a bug): no pass can come any more, but a stop
                // signal and --wait must still end the wait.
                tracing::error!("the health check stopped running; waiting for a stop signal");
                tokio::select! {
                    signal = stopping(signals) => Some(CampaignEnd::Interrupted { signal }),
                    _ = crate::clock::until(give_up_at) => Some(gave_up),
                }
            } else {
                tracing::info!("the health check passes; campaigning");
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

/// Waits a random time under `max` (`--splay`); `Some` is the stopping signal that cut it
/// short.
async fn splay(max: Duration, signals: &mut mpsc::UnboundedReceiver<Arrived>) -> Option<i32> {
    use std::hash::BuildHasher;
    // Seeded from the system's randomness once per process: a draw apart from every other
    // worker's, which a seed from the clock, the same tick everywhere, would not be.
    let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    let d = splay_of(max, random);
    tracing::info!(
        "waiting {} (--splay {}) before campaigning",
        crate::clock::human(d),
        crate::clock::human(max)
    );
    tokio::select! {
        _ = tokio::time::sleep(d) => None,
        signal = stopping(signals) => Some(signal),
    }
}

/// `random` (uniform over u64) scaled to a wait in `[0, max)`.
fn splay_of(max: Duration, random: u64) -> Duration {
    // max is at most 100 years, under 2^62 ns: the product fits, and the quotient is below max.
    let ns = (max.as_nanos() * u128::from(random)) >> 64;
    Duration::from_nanos(ns as u64)
}

/// Waits out the backoff between two campaigns (with jitter, and never past `--wait`), or a
/// stopping signal.
pub async fn backoff(
    d: Duration,
    give_up_at: Option<Instant>,
    signals: &mut mpsc::UnboundedReceiver<Arrived>,
) -> BackoffEnd {
    // Jitter spreads the candidates of a cluster that came back at once.
    let jitter = Duration::from_millis(BootInstant::now().as_nanos() % 250);
    let mut until = Instant::now() + d + jitter;
    if let Some(t) = give_up_at {
        until = until.min(t);
    }
    tokio::select! {
        _ = tokio::time::sleep_until(until) => BackoffEnd::Done,
        signal = stopping(signals) => BackoffEnd::Interrupted { signal },
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
    Lease::grant(ctx, cfg.ttl, cfg.grace, cfg.safety_margin, None).await
}

/// What a candidate keeps while it waits in line, which may be for hours.
///
/// A watchdog stands by for the next job while we are next in line, and none while we are
/// further back: an idle watchdog is a process and about 0.2 MiB, for a job that cannot start
/// before the one ahead of us has run. One further back starts one when it moves up: when the
/// candidate ahead of it is elected, or, ahead of the read that tells, when that one's key
/// goes, so that the exec overlaps the requests that confirm the place.
///
/// And the stack: the run's start-up went some 64 KiB deep (the connection, the campaign's
/// first requests), which the main thread would keep resident while it waits. Released from
/// a task of its own, polled from the runtime's loop, where the run's frames are not on the
/// stack; a wait touches again only the little it polls (the keepalives, on a task of their
/// own, do not wake the campaign: it hears of the lease only when it is lost).
fn wait_lightly(launcher: &mut Launcher, cfg: &RunConfig, w: &InLine) {
    match w.next_in_line() {
        Some(true) if launcher.standby.is_none() => launcher.standby = start_watchdog_ahead(cfg),
        Some(false) if launcher.standby.take().is_some() => {
            tracing::debug!("not next in line: the watchdog started ahead is let go");
        }
        _ => {}
    }
    tokio::spawn(async {
        // Once the wait has settled: until its watch is open the run is polled deep again.
        tokio::time::sleep(SETTLED).await;
        release_stack_below_here();
    });
}

/// How long after a wait in line begins its stack is released.
const SETTLED: Duration = Duration::from_secs(1);

/// Gives the thread's stack pages below this function's frame back to the kernel.
#[inline(never)]
fn release_stack_below_here() {
    // Below the innermost frame nothing is live (a signal handler that ran there has
    // returned); a page of margin keeps clear of this frame and the call below. Under the
    // main thread's stack is its guard gap, where nothing is mapped: madvise passes over what
    // is not mapped (and answers ENOMEM), so the span need not know where the stack ends.
    const SPAN: usize = 256 * 1024;
    const PAGE: usize = 4096;
    let marker = 0u8;
    let sp = std::hint::black_box(&marker) as *const u8 as usize;
    let top = (sp - PAGE) & !(PAGE - 1);
    // SAFETY: [top - SPAN, top) lies wholly below the current frame, where no live data is;
    // MADV_DONTNEED only makes the pages read back as zeros when next touched.
    unsafe { libc::madvise((top - SPAN) as *mut libc::c_void, SPAN, libc::MADV_DONTNEED) };
}

/// A watchdog for the next job, or none if it cannot start now (the start is tried again
/// when the job is due, and fails there with its reason).
fn start_watchdog_ahead(cfg: &RunConfig) -> Option<Standby> {
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

/// Waits for a signal that stops the run. One for the job (USR1, USR2) is dropped while
/// campaigning or backing off: there is no job to pass it to, and no term (a delaying term
/// decides the same in its step, [`super::lifecycle::delaying`]).
async fn stopping(signals: &mut mpsc::UnboundedReceiver<Arrived>) -> i32 {
    loop {
        match signals.recv().await {
            Some(Arrived::Stop(signal)) => return signal,
            Some(Arrived::Forward(signal)) => {
                tracing::debug!(signal, "no job runs: a signal for the job is dropped");
            }
            None => std::future::pending::<()>().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_splay_is_under_its_bound_and_spread_over_it() {
        let max = Duration::from_secs(300);
        assert_eq!(splay_of(max, 0), Duration::ZERO);
        assert!(splay_of(max, u64::MAX) < max);
        assert!(splay_of(max, u64::MAX) > max - Duration::from_micros(1));
        assert_eq!(splay_of(max, 1 << 63), max / 2);
        assert_eq!(splay_of(Duration::ZERO, u64::MAX), Duration::ZERO);
        let longest = crate::config::MAX_DURATION;
        assert!(splay_of(longest, u64::MAX) < longest);
    }
}
