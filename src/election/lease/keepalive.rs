//! The keepalive task: carries out the [`Schedule`] with the etcd client's stream, one
//! attempt per task, on the endpoint the router pins.

use std::sync::Arc;
use std::time::Duration;

use crate::etcd::Client;
use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use super::{says_gone, LeaseState, Loss, Renewal};
use crate::clock::BootInstant;
use crate::election::schedule::{reuse_stream, Action, Event, Reply, Schedule};
use crate::etcd::failover::Router;

type KeepAlive = (LeaseKeeper, LeaseKeepAliveStream);

/// One renewal attempt, as its own task so that a slow one keeps counting while the next
/// one goes out elsewhere.
struct RenewalAttempt {
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
pub(super) async fn keepalive_loop(
    client: Client,
    router: Arc<Router>,
    id: i64,
    plan: Renewal,
    deadline: BootInstant,
    (tx, lost_tx): (watch::Sender<LeaseState>, watch::Sender<Option<Loss>>),
    renew: Arc<Notify>,
) {
    let lease = format!("{id:x}");
    let mut schedule = Schedule::new(plan, deadline, BootInstant::now());
    let mut inflight: JoinSet<RenewalAttempt> = JoinSet::new();
    let mut idle: Option<Idle> = None;
    // Attempts already counted as failed when they went overdue (their send times), so a late
    // error is not counted twice; at most a handful are ever in flight.
    let mut counted: Vec<BootInstant> = Vec::new();
    let mut last_sent: Option<BootInstant> = None;
    while let Some(wake) = schedule.next_wake() {
        let (event, why) = tokio::select! {
            _ = tokio::time::sleep(wake.remaining()) => {
                (Event::Tick { in_flight: inflight.len() }, None)
            }
            _ = renew.notified() => (Event::Renew, None),
            Some(joined) = inflight.join_next(), if !inflight.is_empty() => {
                let Ok(a) = joined else { continue };
                let overdue_counted = counted
                    .iter()
                    .position(|&s| s == a.sent)
                    .map(|i| counted.swap_remove(i))
                    .is_some();
                if let Ok(Reply::Alive) = a.result {
                    crate::metrics::keepalive_rtt(BootInstant::now().saturating_since(a.sent));
                    if idle.is_none() && a.endpoint == router.pinned() {
                        idle = a.stream.map(|stream| Idle { stream, endpoint: a.endpoint });
                    }
                }
                let (reply, why) = match a.result {
                    Ok(r) => (r, None),
                    Err(why) => {
                        if !overdue_counted {
                            crate::metrics::keepalive_failed();
                        }
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
                    // Counted now: against a stalled etcd its error comes only after the
                    // deadline, when this loop has ended.
                    crate::metrics::keepalive_failed();
                    counted.extend(last_sent);
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
                    RenewalAttempt {
                        sent,
                        endpoint,
                        result,
                        stream,
                    }
                });
                schedule.sent(sent, endpoint);
                last_sent = Some(sent);
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
                lost_tx.send_replace(Some(loss));
            }
        }
    }
}
