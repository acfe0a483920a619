//! The lease and its keepalive timer: the source of the local deadline D.
//!
//! D = send time of the last keepalive that got a positive TTL + that TTL − safety margin.
//! The server cannot expire the lease before the request reached it, and the request reached
//! it after we sent it, so D is never later than the server's expiry (up to clock-rate error,
//! which the margin covers). The etcd client gives us only a stream; the timer, the retries and
//! reopening a broken stream are ours.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use etcd_client::Client;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};

use crate::clock::BootInstant;
use crate::config::keepalive_interval;
use crate::etcd::bounded;

/// Why leadership (or candidacy) ended without us asking for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// etcd answered a keepalive with TTL 0: the lease is gone (expired or revoked).
    Expired,
    /// No keepalive succeeded in time; the local deadline D passed.
    Deadline,
    /// Our candidate key was deleted (an operator, `resign`, or a revoke).
    KeyDeleted,
}

impl LossReason {
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::Expired => "lease expired",
            LossReason::Deadline => "renewal deadline passed",
            LossReason::KeyDeleted => "leader key deleted",
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
    Lost(LossReason),
}

/// A granted lease with its keepalive task. Dropping it stops the keepalives (the lease then
/// expires on its own); [`Lease::revoke`] ends it at once.
pub struct Lease {
    pub id: i64,
    /// The TTL the server granted, which may exceed the one requested.
    pub ttl: Duration,
    state: watch::Receiver<LeaseState>,
    task: JoinHandle<()>,
    client: Client,
    /// Wakes the keepalive task for a renewal ahead of its schedule.
    renew: Arc<Notify>,
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
    let d = sent.plus(ttl).minus(margin);
    (d > current).then_some(d)
}

/// Whether etcd's error says the lease does not exist (any more).
pub fn says_gone(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("lease not found"))
}

impl Lease {
    /// Grants a lease and starts keeping it alive.
    pub async fn grant(
        client: &Client,
        ttl: Duration,
        margin: Duration,
        limit: Duration,
    ) -> Result<Lease> {
        let mut c = client.clone();
        let sent = BootInstant::now();
        let resp = bounded(
            limit,
            "etcd",
            c.lease_grant(ttl.as_secs().max(1) as i64, None),
        )
        .await?;
        let granted = Duration::from_secs(resp.ttl().max(0) as u64);
        let deadline = sent.plus(granted).minus(margin);
        let (tx, rx) = watch::channel(LeaseState::Alive { deadline });
        let renew = Arc::new(Notify::new());
        let task = tokio::spawn(keepalive_loop(
            client.clone(),
            resp.id(),
            granted,
            margin,
            deadline,
            tx,
            renew.clone(),
        ));
        Ok(Lease {
            id: resp.id(),
            ttl: granted,
            state: rx,
            task,
            client: client.clone(),
            renew,
        })
    }

    /// A deadline that leaves the job `grace` plus one keepalive interval, renewing the lease
    /// first if the current one does not (a lease granted or renewed late, after an etcd
    /// stall). `None` when no such deadline comes within `limit` or the lease is lost.
    pub async fn deadline_for_spawn(
        &self,
        grace: Duration,
        limit: Duration,
    ) -> Option<BootInstant> {
        let interval = keepalive_interval(self.ttl);
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
        timeout(limit, get).await.ok().flatten()
    }

    /// Asks etcd whether the lease still exists. `true` only on etcd's word that it is gone;
    /// no answer within `limit` counts as not known.
    pub async fn is_gone(&self, limit: Duration) -> bool {
        let mut c = self.client.clone();
        match timeout(limit, c.lease_time_to_live(self.id, None)).await {
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
    /// candidate takes over at once.
    ///
    /// If etcd does not answer within `limit` (no quorum, say), the revoke is retried in the
    /// background: etcd extends every lease by its full TTL when it elects a new leader, so a
    /// lease we merely abandon would hold up the next term for a TTL after the quorum returns.
    pub async fn revoke(self, limit: Duration) {
        self.task.abort();
        let id = self.id;
        let mut c = self.client.clone();
        if try_revoke(&mut c, id, limit).await {
            return;
        }
        let give_up = Instant::now() + REVOKE_RETRY_FOR;
        tokio::spawn(async move {
            while Instant::now() < give_up {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if try_revoke(&mut c, id, limit).await {
                    return;
                }
            }
        });
    }
}

/// How long an abandoned lease keeps being revoked in the background.
const REVOKE_RETRY_FOR: Duration = Duration::from_secs(300);

/// Revokes a lease; true when it is gone (revoked now, or already expired).
async fn try_revoke(c: &mut Client, id: i64, limit: Duration) -> bool {
    let lease = format!("{id:x}");
    match tokio::time::timeout(limit, c.lease_revoke(id)).await {
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

async fn keepalive_loop(
    mut client: Client,
    id: i64,
    ttl: Duration,
    margin: Duration,
    mut deadline: BootInstant,
    tx: watch::Sender<LeaseState>,
    renew: Arc<Notify>,
) {
    let interval = keepalive_interval(ttl);
    let retry = (interval / 8).clamp(Duration::from_millis(50), Duration::from_millis(500));
    let mut stream = None;
    let mut next = Instant::now() + interval;
    let lease = format!("{id:x}");
    loop {
        tokio::select! {
            _ = sleep_until(next) => {}
            _ = renew.notified() => {}
        }
        // Checked before every send: after a freeze, a keepalive sent now could renew a lease
        // whose job the watchdog has already killed. Declare the loss instead.
        if deadline.has_passed() {
            tracing::warn!(lease, "no keepalive succeeded before the deadline");
            tx.send_replace(LeaseState::Lost(LossReason::Deadline));
            return;
        }
        if stream.is_none() {
            match timeout(deadline.remaining(), client.lease_keep_alive(id)).await {
                Ok(Ok(s)) => stream = Some(s),
                Ok(Err(e)) => {
                    tracing::debug!(lease, "keepalive stream: {e}");
                    next = Instant::now() + retry;
                    continue;
                }
                Err(_) => {
                    next = Instant::now();
                    continue;
                }
            }
        }
        let (keeper, responses) = stream.as_mut().expect("opened above");
        let sent = BootInstant::now();
        let sent_mono = Instant::now();
        if let Err(e) = keeper.keep_alive().await {
            tracing::debug!(lease, "keepalive send: {e}");
            stream = None;
            next = Instant::now() + retry;
            continue;
        }
        let wait = deadline.remaining().min(interval);
        match timeout(wait, responses.message()).await {
            Ok(Ok(Some(resp))) if resp.ttl() <= 0 => {
                tracing::warn!(lease, "etcd says the lease is gone");
                tx.send_replace(LeaseState::Lost(LossReason::Expired));
                return;
            }
            Ok(Ok(Some(resp))) => {
                crate::metrics::keepalive_rtt(sent_mono.elapsed());
                let ttl = Duration::from_secs(resp.ttl() as u64);
                if let Some(d) = renewed(deadline, sent, ttl, margin) {
                    deadline = d;
                    tx.send_replace(LeaseState::Alive { deadline });
                }
                next = sent_mono + interval;
            }
            Ok(Err(e)) if says_gone(&e) => {
                tracing::warn!(lease, "etcd says the lease is gone: {e}");
                tx.send_replace(LeaseState::Lost(LossReason::Expired));
                return;
            }
            other => {
                // A late answer on this stream would be matched to the wrong request: start a
                // fresh stream.
                match other {
                    Ok(Err(e)) => tracing::debug!(lease, "keepalive answer: {e}"),
                    Ok(Ok(None)) => tracing::debug!(lease, "keepalive stream closed"),
                    _ => tracing::debug!(lease, "keepalive answer timed out"),
                }
                stream = None;
                next = Instant::now() + retry;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
