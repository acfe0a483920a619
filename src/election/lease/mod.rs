//! The lease and its keepalive timer: the source of the local deadline D.
//!
//! D = send time of the last keepalive that got a positive TTL + that TTL − safety margin.
//! The server cannot expire the lease before the request reached it, and the request reached
//! it after we sent it, so D is never later than the server's expiry (up to clock-rate error,
//! which the margin covers). The etcd client gives us only a stream; the timer, the retries and
//! reopening a broken stream are ours: [`super::schedule`] decides them, the task in
//! [`keepalive`] carries them out.
//!
//! [`renewal`] is the arithmetic of D, pure and unit-tested; this file is the lease itself:
//! its grant, what it says of its state, and its revoke.

pub mod keepalive;
pub mod renewal;

use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use crate::etcd::Client;
use anyhow::Result;
use etcd_client::LeaseGrantOptions;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::clock::BootInstant;
use crate::election::Ctx;
use keepalive::keepalive_loop;
pub use renewal::{
    check_lease_safety, enough_left, renewed, renewed_deadline, Loss, Renewal, MIN_RENEWAL_TIMEOUT,
    MIN_TTL, RENEWAL_ATTEMPTS,
};

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
    /// The loss alone, without the renewals: for a candidate waiting in line, which would
    /// otherwise wake at every keepalive to find it still holds its place.
    lost: watch::Receiver<Option<Loss>>,
    task: JoinHandle<()>,
    client: Client,
    /// Wakes the keepalive task for a renewal ahead of its schedule.
    renew: Arc<Notify>,
    /// Between keepalives.
    interval: Duration,
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

/// A lease id of our own choosing, for a grant whose id requests name before it is answered:
/// 63 random bits (etcd's ids are positive), so that one taken already is as likely as
/// guessing a live lease's. `None` if the kernel gives no random bytes.
pub fn fresh_id() -> Option<i64> {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into the buffer it is given.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    if n != b.len() as isize {
        return None;
    }
    let id = i64::from_ne_bytes(b) & i64::MAX;
    (id != 0).then_some(id)
}

impl Lease {
    /// Grants a lease and starts keeping it alive. With `id`, the lease gets that id (see
    /// [`fresh_id`]), so that requests naming it can go out before the answer; etcd refuses
    /// an id that a live lease has ("lease already exists").
    pub async fn grant(
        ctx: &Ctx,
        ttl: Duration,
        grace: Duration,
        margin: Duration,
        id: Option<i64>,
    ) -> Result<Lease> {
        let client = &ctx.client;
        let mut c = client.clone();
        let sent = BootInstant::now();
        let opts = id.map(|id| LeaseGrantOptions::new().with_id(id));
        let resp = ctx
            .bounded(c.lease_grant(ttl.as_secs().max(1) as i64, opts))
            .await?;
        let granted = Duration::from_secs(resp.ttl().max(0) as u64);
        let plan = Renewal::plan(granted, grace, margin);
        crate::metrics::lease_granted(granted, plan.timeout);
        let deadline = renewed_deadline(sent, granted, margin);
        let (tx, rx) = watch::channel(LeaseState::Alive { deadline });
        let (lost_tx, lost) = watch::channel(None);
        let renew = Arc::new(Notify::new());
        let task = tokio::spawn(
            keepalive_loop(
                client.clone(),
                ctx.router.clone(),
                resp.id(),
                plan,
                deadline,
                (tx, lost_tx),
                renew.clone(),
            )
            .in_current_span(),
        );
        Ok(Lease {
            id: resp.id(),
            state: rx,
            lost,
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

    /// Changes once, when the lease is lost (as [`Lease::subscribe`]'s `Lost`); closed when
    /// the keepalive task ends without a loss (the lease dropped or revoked).
    pub fn losses(&self) -> watch::Receiver<Option<Loss>> {
        self.lost.clone()
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
        // Each attempt gets a third of the wait: a request lost on its way to an etcd leader
        // that was just cut off is never answered, and the next one, once the members have
        // elected another, is. A revoke sent twice is harmless.
        let per_try = (wait / 3).max(MIN_RENEWAL_TIMEOUT);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if try_revoke(&mut c, id, left.min(per_try).max(MIN_RENEWAL_TIMEOUT)).await {
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
        tokio::spawn(
            async move {
                while Instant::now() < give_up {
                    tokio::time::sleep(REVOKE_PAUSE).await;
                    if try_revoke(&mut c, id, attempt).await {
                        return;
                    }
                }
            }
            .in_current_span(),
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_lease_id_is_positive_and_another_each_time() {
        let ids: Vec<i64> = (0..64).map(|_| fresh_id().expect("random bytes")).collect();
        assert!(ids.iter().all(|id| *id > 0), "{ids:?}");
        let mut distinct = ids.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    }
}
