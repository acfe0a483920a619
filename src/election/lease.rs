//! The lease and its keepalive timer: the source of the local deadline D.
//!
//! D = send time of the last keepalive that got a positive TTL + that TTL − safety margin.
//! The server cannot expire the lease before the request reached it, and the request reached
//! it after we sent it, so D is never later than the server's expiry (up to clock-rate error,
//! which the margin covers). The etcd client gives us only a stream; the timer, the retries and
//! reopening a broken stream are ours.

use std::time::Duration;

use anyhow::Result;
use etcd_client::Client;
use tokio::sync::watch;
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
        let task = tokio::spawn(keepalive_loop(
            client.clone(),
            resp.id(),
            granted,
            margin,
            deadline,
            tx,
        ));
        Ok(Lease {
            id: resp.id(),
            ttl: granted,
            state: rx,
            task,
            client: client.clone(),
        })
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
        Ok(Err(etcd_client::Error::GRpcStatus(s))) if s.message().contains("not found") => true,
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
) {
    let interval = keepalive_interval(ttl);
    let retry = (interval / 8).clamp(Duration::from_millis(50), Duration::from_millis(500));
    let mut stream = None;
    let mut next = Instant::now() + interval;
    let lease = format!("{id:x}");
    loop {
        sleep_until(next).await;
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
                let renewed = sent
                    .plus(Duration::from_secs(resp.ttl() as u64))
                    .minus(margin);
                if renewed > deadline {
                    deadline = renewed;
                    tx.send_replace(LeaseState::Alive { deadline });
                }
                next = sent_mono + interval;
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
