//! The lease and its keepalive timer: the source of the local deadline D.
//!
//! D = send time of the last keepalive that got a positive TTL + that TTL − safety margin.
//! The server cannot expire the lease before the request reached it, and the request reached
//! it after we sent it, so D is never later than the server's expiry (up to clock-rate error,
//! which the margin covers). The etcd client gives us only a stream; the timer, the retries and
//! reopening a broken stream are ours: [`super::schedule`] decides them, the keepalive task here
//! carries them out.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::{watch, Notify};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::schedule::{reuse_stream, Action, Event, Reply, Schedule};
use crate::clock::{human, BootInstant};
use crate::election::Ctx;
use crate::etcd::failover::Router;
use crate::exit::{fail, Exit};

/// How many renewal attempts must fit between a missed keepalive and SIGTERM.
pub const RENEWAL_ATTEMPTS: u32 = 3;
/// The shortest time one renewal attempt may be given before it is retried elsewhere.
pub const MIN_RENEWAL_TIMEOUT: Duration = Duration::from_millis(100);
/// The longest: a keepalive answers in milliseconds; waiting longer only eats the budget.
const MAX_RENEWAL_TIMEOUT: Duration = Duration::from_secs(1);

/// When keepalives go out and how long each may take.
///
/// The job may run until SIGTERM at `D − grace = last good send + TTL − margin − grace`: call
/// `TTL − margin − grace` the window. A keepalive goes out every third of the window, so an
/// etcd outage (a leader election, a dead member) of up to two thirds of it costs nothing. If
/// one gets no answer within `timeout`, another goes out at once on the next endpoint, while
/// the first may still answer; `timeout` is chosen so that [`RENEWAL_ATTEMPTS`] of them fit
/// between the missed keepalive and SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    pub interval: Duration,
    pub timeout: Duration,
    /// The granted TTL and the safety margin, which turn a renewal's send time into D.
    pub ttl: Duration,
    pub margin: Duration,
}

impl Renewal {
    pub fn plan(ttl: Duration, grace: Duration, margin: Duration) -> Renewal {
        let interval = Renewal::window(ttl, grace, margin) / 3;
        let budget = Renewal::budget(ttl, grace, margin);
        Renewal {
            interval,
            timeout: (budget / RENEWAL_ATTEMPTS).min(MAX_RENEWAL_TIMEOUT),
            ttl,
            margin,
        }
    }

    /// From a renewal's send time to the SIGTERM it allows.
    pub fn window(ttl: Duration, grace: Duration, margin: Duration) -> Duration {
        ttl.saturating_sub(grace + margin)
    }

    /// Room before SIGTERM for the retries of one missed keepalive.
    pub fn budget(ttl: Duration, grace: Duration, margin: Duration) -> Duration {
        let w = Renewal::window(ttl, grace, margin);
        w - w / 3
    }
}

/// The lowest TTL etcd grants with default election timeouts.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// Refuses lease settings under which the job could outlive the lease, or could not survive
/// one lost keepalive.
///
/// The job gets SIGTERM at `D - grace` and SIGKILL at `D`, where
/// `D = send time of the last good keepalive + TTL - margin`. Keepalives go out every third of
/// the window `TTL - margin - grace` (see [`Renewal`]); the two thirds left after a missed one
/// must hold [`RENEWAL_ATTEMPTS`] attempts of at least [`MIN_RENEWAL_TIMEOUT`], so that one
/// lost reply or one etcd leader election does not cost the job.
pub fn check_lease_safety(ttl: Duration, grace: Duration, margin: Duration) -> Result<()> {
    if ttl < MIN_TTL {
        return Err(fail(
            Exit::Usage,
            format!(
                "--ttl {} is below etcd's minimum lease of 2s",
                humantime::format_duration(ttl)
            ),
        ));
    }
    let budget = Renewal::budget(ttl, grace, margin);
    if budget < MIN_RENEWAL_TIMEOUT * RENEWAL_ATTEMPTS {
        // The smallest window whose last two thirds hold the attempts.
        let need = MIN_RENEWAL_TIMEOUT * RENEWAL_ATTEMPTS * 3 / 2;
        return Err(fail(
            Exit::Usage,
            format!(
                "unsafe lease settings: --ttl {} minus --grace {} and --safety-margin {} leaves {} before SIGTERM; at least {} is needed to renew with {} retries of {}",
                human(ttl),
                human(grace),
                human(margin),
                human(Renewal::window(ttl, grace, margin)),
                human(need),
                RENEWAL_ATTEMPTS,
                human(MIN_RENEWAL_TIMEOUT),
            ),
        ));
    }
    Ok(())
}

/// The deadline a renewal sent at `sent` and answered with `ttl` buys: the server cannot
/// have renewed before the request reached it, so its expiry is at least `sent + ttl`.
pub fn renewed_deadline(sent: BootInstant, ttl: Duration, margin: Duration) -> BootInstant {
    sent.plus(ttl).minus(margin)
}

/// How leadership (or candidacy) was lost, without us asking for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// etcd answered a keepalive with TTL 0: the lease is gone (expired or revoked).
    Expired,
    /// No keepalive succeeded in time; the local deadline D passed.
    Deadline,
    /// Our candidate key was deleted (an operator, `resign`, or a revoke).
    KeyDeleted,
}

impl Loss {
    pub fn as_str(self) -> &'static str {
        match self {
            Loss::Expired => "lease expired",
            Loss::Deadline => "renewal deadline passed",
            Loss::KeyDeleted => "leader key deleted",
        }
    }
}

/// What the keepalive task knows about the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Renewed; the job may run until `deadline`.
    Alive {
        deadline: BootInstant,
    },
    Lost(Loss),
}

/// A granted lease with its keepalive task. Dropping it stops the keepalives (the lease then
/// expires on its own); [`Lease::revoke`] ends it at once.
pub struct Lease {
    pub id: i64,
    state: watch::Receiver<LeaseState>,
    task: JoinHandle<()>,
    client: Client,
    /// Wakes the keepalive task for a renewal ahead of its schedule.
    renew: Arc<Notify>,
    /// Between keepalives.
    interval: Duration,
}

/// Whether a job may start with deadline `d` at `now`: it must be able to run until SIGTERM
/// is due (`d − grace`) for at least one keepalive interval, so that one renewal can land
/// before that. Anything less, and the job would be told to stop the moment it starts.
pub fn enough_left(now: BootInstant, d: BootInstant, grace: Duration, interval: Duration) -> bool {
    d.saturating_since(now) >= grace + interval
}

/// The deadline a positive keepalive answer gives: `sent + ttl − margin`, if that moves D
/// forward. A late or reordered answer never moves it back.
pub fn renewed(
    current: BootInstant,
    sent: BootInstant,
    ttl: Duration,
    margin: Duration,
) -> Option<BootInstant> {
    let d = renewed_deadline(sent, ttl, margin);
    (ttl > Duration::ZERO && d > current).then_some(d)
}

/// Whether etcd's error says the lease does not exist (any more). Opening a keepalive stream
/// reports it in the client's own error.
pub fn says_gone(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        etcd_client::Error::GRpcStatus(s) => s.message().contains("lease not found"),
        _ => false,
    }
}

impl Lease {
    /// Grants a lease and starts keeping it alive.
    pub async fn grant(
        ctx: &Ctx,
        ttl: Duration,
        grace: Duration,
        margin: Duration,
    ) -> Result<Lease> {
        let client = &ctx.client;
        let mut c = client.clone();
        let sent = BootInstant::now();
        let resp = ctx
            .bounded(c.lease_grant(ttl.as_secs().max(1) as i64, None))
            .await?;
        let granted = Duration::from_secs(resp.ttl().max(0) as u64);
        let deadline = renewed_deadline(sent, granted, margin);
        let (tx, rx) = watch::channel(LeaseState::Alive { deadline });
        let renew = Arc::new(Notify::new());
        let plan = Renewal::plan(granted, grace, margin);
        crate::metrics::lease_granted(granted, plan.timeout);
        let task = tokio::spawn(keepalive_loop(
            client.clone(),
            ctx.router.clone(),
            resp.id(),
            plan,
            deadline,
            tx,
            renew.clone(),
        ));
        Ok(Lease {
            id: resp.id(),
            state: rx,
            task,
            client: client.clone(),
            renew,
            interval: plan.interval,
        })
    }

    /// A deadline that leaves the job `grace` plus one keepalive interval, renewing the lease
    /// first if the current one does not (a lease granted or renewed late, after an etcd
    /// stall). `None` when no such deadline comes within `timeout` or the lease is lost.
    pub async fn deadline_for_spawn(
        &self,
        grace: Duration,
        timeout: Duration,
    ) -> Option<BootInstant> {
        let interval = self.interval;
        let mut rx = self.subscribe();
        let get = async {
            loop {
                let state = *rx.borrow_and_update();
                match state {
                    LeaseState::Alive { deadline }
                        if enough_left(BootInstant::now(), deadline, grace, interval) =>
                    {
                        return Some(deadline);
                    }
                    LeaseState::Alive { .. } => {
                        self.renew.notify_one();
                        rx.changed().await.ok()?;
                    }
                    LeaseState::Lost(_) => return None,
                }
            }
        };
        tokio::time::timeout(timeout, get).await.ok().flatten()
    }

    /// Asks etcd whether the lease still exists. `true` only on etcd's word that it is gone;
    /// no answer within `timeout` counts as not known.
    pub async fn is_gone(&self, timeout: Duration) -> bool {
        let mut c = self.client.clone();
        match tokio::time::timeout(timeout, c.lease_time_to_live(self.id, None)).await {
            Ok(Ok(r)) => r.ttl() <= 0,
            Ok(Err(e)) => says_gone(&e),
            Err(_) => false,
        }
    }

    pub fn state(&self) -> LeaseState {
        *self.state.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.state.clone()
    }

    /// Stops the keepalives and revokes the lease, which deletes our candidate key so the next
    /// candidate takes over at once. Tried again after each failure for up to `wait`; `true`
    /// when the lease is gone.
    ///
    /// If etcd did not take it by then (no quorum, a lossy link), the revoke goes on in the
    /// background for as long as this process lives: etcd extends every lease by its full
    /// TTL when it elects a new leader, so a lease we merely abandon could hold up the next
    /// term well past its TTL. Each background attempt gets `attempt` (the command timeout):
    /// on a slow link, shorter attempts never got an answer.
    pub async fn revoke(self, wait: Duration, attempt: Duration) -> bool {
        self.task.abort();
        let id = self.id;
        let mut c = self.client.clone();
        let until = Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if try_revoke(&mut c, id, left.max(MIN_RENEWAL_TIMEOUT)).await {
                return true;
            }
            if Instant::now() + REVOKE_PAUSE >= until {
                break;
            }
            tokio::time::sleep(REVOKE_PAUSE).await;
        }
        tracing::info!(
            lease = format!("{id:x}"),
            "etcd did not take the revoke in time; retrying in the background"
        );
        let give_up = Instant::now() + REVOKE_RETRY_FOR;
        tokio::spawn(async move {
            while Instant::now() < give_up {
                tokio::time::sleep(REVOKE_PAUSE).await;
                if try_revoke(&mut c, id, attempt).await {
                    return;
                }
            }
        });
        false
    }
}

/// Between revoke attempts that failed at once.
const REVOKE_PAUSE: Duration = Duration::from_millis(200);

/// How long an abandoned lease keeps being revoked in the background.
const REVOKE_RETRY_FOR: Duration = Duration::from_secs(300);

/// Revokes a lease; true when it is gone (revoked now, or already expired).
async fn try_revoke(c: &mut Client, id: i64, timeout: Duration) -> bool {
    let lease = format!("{id:x}");
    match tokio::time::timeout(timeout, c.lease_revoke(id)).await {
        Ok(Ok(_)) => {
            tracing::debug!(lease, "lease revoked");
            true
        }
        Ok(Err(e)) if says_gone(&e) => true,
        Ok(Err(e)) => {
            tracing::debug!(lease, "lease not revoked yet: {e}");
            false
        }
        Err(_) => {
            tracing::debug!(lease, "lease not revoked yet: no answer");
            false
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type KeepAlive = (LeaseKeeper, LeaseKeepAliveStream);

/// One renewal attempt, as its own task so that a slow one keeps counting while the next
/// one goes out elsewhere.
struct Attempt {
    sent: BootInstant,
    endpoint: usize,
    result: Result<Reply, String>,
    /// The stream, back in step (its one request answered), for the next attempt to reuse.
    stream: Option<KeepAlive>,
}

/// An open keepalive stream and the endpoint it was opened to: a stream stays on its
/// endpoint whatever the pin does since, so failures on it are that endpoint's.
struct Idle {
    stream: KeepAlive,
    endpoint: usize,
}

/// Sends one keepalive: on `stream` if there is one, else by opening a stream (which sends
/// one and waits for its answer). Never answers [`Reply::Failed`]: failures come as `Err`
/// with their reason.
async fn attempt(
    mut client: Client,
    id: i64,
    stream: Option<KeepAlive>,
    timeout: Duration,
) -> (Result<Reply, String>, Option<KeepAlive>) {
    let Some((mut keeper, mut responses)) = stream else {
        return match tokio::time::timeout(timeout, client.lease_keep_alive(id)).await {
            Ok(Ok(ka)) => (Ok(Reply::Alive), Some(ka)),
            Ok(Err(e)) if says_gone(&e) => (Ok(Reply::Gone), None),
            Ok(Err(e)) => (Err(format!("keepalive stream: {e}")), None),
            Err(_) => (Err("keepalive stream: no answer".into()), None),
        };
    };
    if let Err(e) = keeper.keep_alive().await {
        return (Err(format!("keepalive send: {e}")), None);
    }
    match tokio::time::timeout(timeout, responses.message()).await {
        Ok(Ok(Some(r))) if r.ttl() <= 0 => (Ok(Reply::Gone), None),
        Ok(Ok(Some(_))) => (Ok(Reply::Alive), Some((keeper, responses))),
        Ok(Err(e)) if says_gone(&e) => (Ok(Reply::Gone), None),
        Ok(Err(e)) => (Err(format!("keepalive answer: {e}")), None),
        Ok(Ok(None)) => (Err("keepalive stream closed".into()), None),
        Err(_) => (Err("keepalive answer: no answer".into()), None),
    }
}

/// Carries out the [`Schedule`]: the timer, the attempts in flight, their streams and the
/// endpoint router are here; every decision is the schedule's.
async fn keepalive_loop(
    client: Client,
    router: Arc<Router>,
    id: i64,
    plan: Renewal,
    deadline: BootInstant,
    tx: watch::Sender<LeaseState>,
    renew: Arc<Notify>,
) {
    let lease = format!("{id:x}");
    let mut schedule = Schedule::new(plan, deadline, BootInstant::now());
    let mut inflight: JoinSet<Attempt> = JoinSet::new();
    let mut idle: Option<Idle> = None;
    while let Some(wake) = schedule.next_wake() {
        let (event, why) = tokio::select! {
            _ = tokio::time::sleep(wake.remaining()) => {
                (Event::Tick { in_flight: inflight.len() }, None)
            }
            _ = renew.notified() => (Event::Renew, None),
            Some(joined) = inflight.join_next(), if !inflight.is_empty() => {
                let Ok(a) = joined else { continue };
                if let Ok(Reply::Alive) = a.result {
                    crate::metrics::keepalive_rtt(BootInstant::now().saturating_since(a.sent));
                    if idle.is_none() && a.endpoint == router.pinned() {
                        idle = a.stream.map(|stream| Idle { stream, endpoint: a.endpoint });
                    }
                }
                let (reply, why) = match a.result {
                    Ok(r) => (r, None),
                    Err(why) => {
                        crate::metrics::keepalive_failed();
                        (Reply::Failed, Some(why))
                    }
                };
                (Event::Answer { sent: a.sent, endpoint: a.endpoint, reply }, why)
            }
        };
        match schedule.on(BootInstant::now(), event) {
            None => {}
            Some(Action::Send { overdue }) => {
                if let Some(e) = overdue {
                    tracing::debug!(lease, "keepalive answer overdue; trying the next endpoint");
                    router.endpoint_failed(e);
                }
                let endpoint = router.pinned();
                let stream = idle
                    .take()
                    .filter(|i| reuse_stream(i.endpoint, endpoint))
                    .map(|i| i.stream);
                let (c, timeout) = (client.clone(), schedule.attempt_timeout());
                let sent = BootInstant::now();
                inflight.spawn(async move {
                    let (result, stream) = attempt(c, id, stream, timeout).await;
                    Attempt {
                        sent,
                        endpoint,
                        result,
                        stream,
                    }
                });
                schedule.sent(sent, endpoint);
            }
            Some(Action::EndpointFailed(e)) => {
                let why = why.unwrap_or_default();
                tracing::debug!(lease, "{why}; retrying on the next endpoint");
                router.endpoint_failed(e);
            }
            Some(Action::Publish(deadline)) => {
                tx.send_replace(LeaseState::Alive { deadline });
            }
            Some(Action::Lost(loss)) => {
                match loss {
                    Loss::Expired => tracing::warn!(lease, "etcd says the lease is gone"),
                    _ => tracing::warn!(lease, "no keepalive succeeded before the deadline"),
                }
                tx.send_replace(LeaseState::Lost(loss));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_safe() {
        check_lease_safety(secs(10), secs(3), secs(1)).unwrap();
    }

    #[test]
    fn ttl_below_two_seconds_is_refused() {
        let e = check_lease_safety(Duration::from_millis(1500), Duration::ZERO, Duration::ZERO)
            .unwrap_err();
        assert!(e.to_string().contains("below etcd's minimum"));
    }

    #[test]
    fn grace_plus_margin_must_leave_a_window_in_the_ttl() {
        let e = check_lease_safety(secs(4), secs(3), secs(1)).unwrap_err();
        assert!(e.to_string().contains("unsafe lease settings"), "{e}");
        check_lease_safety(secs(5), secs(3), secs(1)).unwrap();
    }

    #[test]
    fn three_renewal_attempts_must_fit_before_sigterm() {
        // A 400ms window: renewing every 133ms leaves 267ms, not 3 attempts of 100ms.
        let e = check_lease_safety(
            secs(3),
            Duration::from_millis(2400),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(e.to_string().contains("leaves 400ms before SIGTERM"), "{e}");
        assert!(e.to_string().contains("at least 450ms"), "{e}");
        check_lease_safety(
            secs(3),
            Duration::from_millis(2350),
            Duration::from_millis(200),
        )
        .unwrap();
    }

    fn secs(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn defaults_fit_three_renewal_attempts_before_sigterm() {
        let (ttl, grace, margin) = (ms(10_000), ms(3_000), ms(1_000));
        let p = Renewal::plan(ttl, grace, margin);
        assert_eq!(p.interval, ms(2_000));
        assert_eq!(p.timeout, MAX_RENEWAL_TIMEOUT);
        // The last attempt ends no later than D − grace, counted from the last good send.
        let last_done = p.interval + p.timeout * RENEWAL_ATTEMPTS;
        assert!(last_done <= ttl - margin - grace, "{last_done:?}");
    }

    #[test]
    fn an_outage_of_two_thirds_of_the_window_is_ridden_through() {
        // ttl 4 s, grace 1 s, margin 1 s: a keepalive every 667 ms; an etcd leader election
        // of 1.3 s between two of them still leaves a renewal before SIGTERM.
        let (ttl, grace, margin) = (ms(4_000), ms(1_000), ms(1_000));
        let p = Renewal::plan(ttl, grace, margin);
        let window = ttl - grace - margin;
        assert!(window - p.interval >= ms(1_333), "{p:?}");
        assert!(p.timeout * RENEWAL_ATTEMPTS <= window - p.interval);
        assert!(p.timeout >= MIN_RENEWAL_TIMEOUT);
    }

    #[test]
    fn the_timeout_is_capped_for_long_ttls() {
        let p = Renewal::plan(ms(60_000), ms(3_000), ms(1_000));
        assert_eq!(p.timeout, MAX_RENEWAL_TIMEOUT);
    }

    #[test]
    fn no_window_means_no_time_for_retries() {
        let p = Renewal::plan(ms(4_000), ms(3_000), ms(1_000));
        assert_eq!(p.timeout, Duration::ZERO);
        assert_eq!(p.interval, Duration::ZERO);
    }

    #[test]
    fn a_renewal_counts_from_its_send_time() {
        let sent = BootInstant::from_nanos(5_000_000_000);
        let d = renewed_deadline(sent, ms(10_000), ms(1_000));
        assert_eq!(d, BootInstant::from_nanos(14_000_000_000));
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn deadline_only_moves_forward() {
        let d = BootInstant::from_nanos(10_000_000_000);
        let margin = Duration::from_millis(500);
        // An answer to a request sent earlier than the one D came from: no change.
        let early = BootInstant::from_nanos(6_000_000_000);
        assert_eq!(renewed(d, early, 3 * S, margin), None);
        let later = BootInstant::from_nanos(9_000_000_000);
        assert_eq!(
            renewed(d, later, 3 * S, margin),
            Some(BootInstant::from_nanos(11_500_000_000))
        );
        assert_eq!(renewed(d, later, Duration::ZERO, margin), None);
    }

    #[test]
    fn no_spawn_without_grace_and_one_renewal_left() {
        let d = BootInstant::from_nanos(10_000_000_000);
        let grace = Duration::from_millis(500);
        let at = |ms: u64| BootInstant::from_nanos(ms * 1_000_000);
        assert!(enough_left(at(8_500), d, grace, S));
        assert!(!enough_left(at(8_501), d, grace, S));
        // Inside the grace window, at D and after it.
        assert!(!enough_left(at(9_600), d, grace, S));
        assert!(!enough_left(at(10_000), d, grace, S));
        assert!(!enough_left(at(12_000), d, grace, S));
    }
}
