//! Failover across etcd endpoints, under the etcd client.
//!
//! etcd-client's own multi-endpoint channel balances requests over every endpoint and fails
//! a request that it happens to route to a dead one (etcd-client#39): with one member of three
//! down, most calls failed. etcd's Go client instead pins one endpoint and moves on when it
//! fails. This channel does the same, below the client, so that every request of every
//! subcommand gets it:
//!
//! - All requests go to the pinned endpoint. A transport error, a timeout or an `Unavailable`
//!   answer (which, with `require_leader`, includes a member that has lost its quorum) moves
//!   the pin to the next endpoint.
//! - A unary request is buffered (they are small) and retried on the next endpoint when that
//!   is safe: always for reads, and for writes only when the request cannot have been applied
//!   (the connection was never made, or the member said it has no leader), as the Go client
//!   does. A write that may have been applied is never sent twice, so it gets the caller's
//!   whole command timeout; only a read is cut short to try the next endpoint in time.
//! - A stream (keepalives, watches) cannot be replayed: its owner reopens it, and the reopened
//!   stream goes to the new pin. [`Router::endpoint_failed`] lets the owner report an endpoint
//!   that stopped answering on a stream, which nothing below can see.
//!
//! The [`Router`] belongs to the client it routes for: the etcd scope ([`crate::election::Ctx`]) holds
//! both, and hands the router to the stream owners with the client.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tonic::body::Body;
use tonic::transport::channel::Change;
use tonic::transport::Endpoint;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceExt};

type Req = Request<Body>;
type Resp = Response<Body>;

/// The routing state shared by the client's channel and the stream owners.
pub struct Router {
    members: Mutex<Vec<Member>>,
    changes: Mutex<Option<mpsc::Receiver<Change<Uri, Endpoint>>>>,
    pinned: AtomicUsize,
    /// A bound on one attempt of a read when there is another endpoint to try.
    attempt_timeout: Duration,
    /// Counts pin moves, so that stream owners can reopen on the new endpoint.
    moves: tokio::sync::watch::Sender<u64>,
    /// The outage in progress: its first move is logged, the rest are counted until an
    /// endpoint answers (a partition would otherwise log a move every attempt of every
    /// request: half the lines of a 15-minute soak).
    outage: Mutex<Outage>,
    /// `outage` is open: an answer must close it. Read without the lock on every answer.
    in_outage: AtomicBool,
}

/// Endpoint moves since the last answer, for the log: one line when the first move starts
/// an outage, one when an answer ends it.
#[derive(Debug, Default)]
pub struct Outage {
    /// Moves since the last answer; 0: no outage.
    moves: u64,
    started: Option<std::time::Instant>,
}

impl Outage {
    /// A move off a failed endpoint: whether it starts an outage (and is worth a line).
    pub fn moved(&mut self, now: std::time::Instant) -> bool {
        self.moves += 1;
        if self.moves == 1 {
            self.started = Some(now);
            return true;
        }
        false
    }

    /// An answer: the outage it ends, as (moves, how long), if one was open.
    pub fn answered(&mut self, now: std::time::Instant) -> Option<(u64, Duration)> {
        let moves = std::mem::take(&mut self.moves);
        let started = self.started.take()?;
        Some((moves, now.saturating_duration_since(started)))
    }
}

struct Member {
    uri: Uri,
    endpoint: Endpoint,
    channel: tonic::transport::Channel,
}

impl Router {
    pub fn new(attempt_timeout: Duration) -> Arc<Router> {
        Arc::new(Router {
            members: Mutex::new(Vec::new()),
            changes: Mutex::new(None),
            pinned: AtomicUsize::new(0),
            attempt_timeout,
            moves: tokio::sync::watch::Sender::new(0),
            outage: Mutex::new(Outage::default()),
            in_outage: AtomicBool::new(false),
        })
    }

    /// Takes in the endpoints the client announced. Lazy channels: nothing connects until a
    /// request is routed there.
    fn absorb_changes(&self) {
        let mut rx = self.changes.lock().expect("router lock");
        let Some(rx) = rx.as_mut() else { return };
        let mut members = self.members.lock().expect("router lock");
        while let Ok(change) = rx.try_recv() {
            match change {
                Change::Insert(uri, ep) => {
                    members.retain(|m| m.uri != uri);
                    members.push(Member {
                        uri,
                        channel: ep.connect_lazy(),
                        endpoint: ep,
                    });
                }
                Change::Remove(uri) => members.retain(|m| m.uri != uri),
            }
        }
    }

    /// Connects the pinned endpoint now, its TLS handshake included, rather than when the
    /// first request routed there: requests queued behind a handshake leave together once it
    /// is done, and etcd may then take them in any order. Once connected, each request goes out
    /// as it is made. `false` when it did not connect within one read attempt's bound: the pin
    /// then moves on, as after a read that failed there.
    pub async fn connect_pinned(&self) -> bool {
        self.absorb_changes();
        let pinned = {
            let members = self.members.lock().expect("router lock");
            let i = self.pinned.load(Ordering::SeqCst) % members.len().max(1);
            members
                .get(i)
                .map(|m| (i, m.uri.clone(), m.endpoint.clone()))
        };
        let Some((i, uri, endpoint)) = pinned else {
            return false;
        };
        match tokio::time::timeout(self.attempt_timeout, endpoint.connect()).await {
            Ok(Ok(channel)) => {
                let mut members = self.members.lock().expect("router lock");
                match members.get_mut(i).filter(|m| m.uri == uri) {
                    Some(m) => {
                        m.channel = channel;
                        true
                    }
                    None => false,
                }
            }
            Ok(Err(e)) => {
                tracing::debug!("connecting to {uri}: {e}");
                self.failed(i);
                false
            }
            Err(_) => {
                self.failed(i);
                false
            }
        }
    }

    /// The pinned endpoint's index and channel.
    fn current(&self) -> Option<(usize, tonic::transport::Channel)> {
        let members = self.members.lock().expect("router lock");
        if members.is_empty() {
            return None;
        }
        let i = self.pinned.load(Ordering::SeqCst) % members.len();
        Some((i, members[i].channel.clone()))
    }

    /// Endpoint `j`'s channel, wherever the pin is.
    fn member(&self, j: usize) -> Option<(usize, tonic::transport::Channel)> {
        let members = self.members.lock().expect("router lock");
        members.get(j).map(|m| (j, m.channel.clone()))
    }

    fn len(&self) -> usize {
        self.members.lock().expect("router lock").len()
    }

    /// Moves the pin off endpoint `i`, unless someone already did.
    fn failed(&self, i: usize) {
        let n = self.len();
        if n < 2 {
            return;
        }
        let cur = self.pinned.load(Ordering::SeqCst) % n;
        if cur == i
            && self
                .pinned
                .compare_exchange(cur, (i + 1) % n, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            let members = self.members.lock().expect("router lock");
            let (from, to) = (&members[i].uri, &members[(i + 1) % n].uri);
            let first = {
                let mut outage = self.outage.lock().expect("router lock");
                self.in_outage.store(true, Ordering::SeqCst);
                outage.moved(std::time::Instant::now())
            };
            if first {
                tracing::info!(%from, %to, "etcd endpoint failed; moving to the next (further moves until one answers are logged at debug)");
            } else {
                tracing::debug!(%from, %to, "etcd endpoint failed; moving to the next");
            }
            crate::metrics::endpoint_failover();
            self.moves.send_modify(|m| *m += 1);
        }
    }

    /// Endpoint `i` answered: an outage that moved the pin is over, and says so once.
    fn answered(&self, i: usize) {
        if !self.in_outage.load(Ordering::SeqCst) {
            return;
        }
        let ended = {
            let mut outage = self.outage.lock().expect("router lock");
            self.in_outage.store(false, Ordering::SeqCst);
            outage.answered(std::time::Instant::now())
        };
        if let Some((moves, took)) = ended {
            let members = self.members.lock().expect("router lock");
            let at = members
                .get(i)
                .map(|m| m.uri.to_string())
                .unwrap_or_default();
            tracing::info!(
                at,
                moves,
                "etcd answers again, after {} and {moves} endpoint moves",
                crate::clock::human(took)
            );
        }
    }

    /// The endpoint requests go to now, for a stream owner to report later.
    pub fn pinned(&self) -> usize {
        let n = self.len().max(1);
        self.pinned.load(Ordering::SeqCst) % n
    }

    /// Reports that endpoint `i` (as read from [`Router::pinned`] when a stream was opened)
    /// stopped answering: later requests and streams go elsewhere.
    pub fn endpoint_failed(&self, i: usize) {
        self.failed(i);
    }

    /// Changes whenever the pin moves: a watch opened before may sit on a dead endpoint (a
    /// stream to a blackholed member goes silent rather than failing), so its owner reopens it.
    pub fn moves(&self) -> tokio::sync::watch::Receiver<u64> {
        self.moves.subscribe()
    }
}

/// Waits for the next pin move (forever, if there can be none).
pub async fn moved(rx: &mut tokio::sync::watch::Receiver<u64>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Hands the client a channel that routes through `router`.
pub struct Builder(pub Arc<Router>);

impl etcd_client::BalancedChannelBuilder for Builder {
    type Error = etcd_client::Error;

    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<(etcd_client::Channel, mpsc::Sender<Change<Uri, Endpoint>>), Self::Error> {
        let (tx, rx) = mpsc::channel(buffer_size);
        *self.0.changes.lock().expect("router lock") = Some(rx);
        let svc = Failover { router: self.0 };
        Ok((
            etcd_client::Channel::Custom(BoxCloneSyncService::new(svc)),
            tx,
        ))
    }
}

#[derive(Clone)]
struct Failover {
    router: Arc<Router>,
}

impl Service<Req> for Failover {
    type Response = Resp;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Resp, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        // Each member channel is made ready when a request is routed to it.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        Box::pin(route(self.router.clone(), req))
    }
}

/// What kind of call a gRPC path is, for the retry rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A stream: sent once, reopened by its owner.
    Stream,
    /// A read: safe to send again anywhere.
    Read,
    /// A write: sent again only if it cannot have been applied.
    Write,
}

impl Kind {
    pub fn of(path: &str) -> Kind {
        match path {
            "/etcdserverpb.Watch/Watch"
            | "/etcdserverpb.Lease/LeaseKeepAlive"
            | "/v3electionpb.Election/Observe"
            | "/etcdserverpb.Maintenance/Snapshot" => Kind::Stream,
            "/etcdserverpb.KV/Range"
            | "/etcdserverpb.Lease/LeaseTimeToLive"
            | "/etcdserverpb.Lease/LeaseLeases"
            | "/etcdserverpb.Maintenance/Status"
            | "/etcdserverpb.Cluster/MemberList"
            | "/etcdserverpb.Auth/Authenticate" => Kind::Read,
            _ => Kind::Write,
        }
    }
}

/// What one attempt's answer means for routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Hand the answer to the caller.
    Done,
    /// The endpoint failed; hand the answer (or error) to the caller anyway.
    FailedFinal,
    /// The endpoint failed, and the request may go to the next one.
    FailedRetry,
}

/// How a request fared at one endpoint, as far as routing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// An answer that is not `Unavailable`.
    Answered,
    /// `Unavailable`; `no_leader` when the member said it has no leader (nothing applied).
    Unavailable { no_leader: bool },
    /// The connection could not be made: nothing was sent.
    NotConnected,
    /// Any other transport failure, or no answer in time: a write may have been applied.
    Lost,
}

/// The pure retry rule.
pub fn verdict(kind: Kind, delivery: Delivery, more_endpoints: bool) -> Verdict {
    let safe = match delivery {
        Delivery::Answered => return Verdict::Done,
        Delivery::NotConnected => true,
        Delivery::Unavailable { no_leader } => no_leader || kind == Kind::Read,
        Delivery::Lost => kind == Kind::Read,
    };
    if safe && more_endpoints && kind != Kind::Stream {
        Verdict::FailedRetry
    } else {
        Verdict::FailedFinal
    }
}

fn classify_answer(resp: &Resp) -> Delivery {
    // Only trailers-only answers carry the status in the headers; those are the immediate
    // refusals (no leader, auth) that matter here.
    let h = resp.headers();
    if h.get("grpc-status").and_then(|v| v.to_str().ok()) != Some("14") {
        return Delivery::Answered;
    }
    let msg = h
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    Delivery::Unavailable {
        no_leader: msg.contains("no leader") || msg.contains("no%20leader"),
    }
}

fn classify_error(e: &BoxError) -> Delivery {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
    while let Some(s) = src {
        // Only failures to establish the connection: "connection closed before message
        // completed" and the like may come after the request went out.
        let text = s.to_string();
        if [
            "tcp connect error",
            "error trying to connect",
            "Connection refused",
            "dns error",
        ]
        .iter()
        .any(|m| text.contains(m))
        {
            return Delivery::NotConnected;
        }
        src = s.source();
    }
    Delivery::Lost
}

/// An attempt's result with what it means for routing.
fn classified(result: Result<Resp, BoxError>) -> (Result<Resp, BoxError>, Delivery) {
    let how = match &result {
        Ok(resp) => classify_answer(resp),
        Err(e) => classify_error(e),
    };
    (result, how)
}

async fn route(router: Arc<Router>, req: Req) -> Result<Resp, BoxError> {
    router.absorb_changes();
    let kind = Kind::of(req.uri().path());
    let n = router.len();
    if kind == Kind::Stream {
        let (i, ch) = router.current().ok_or("no etcd endpoint")?;
        return match ch.oneshot(req).await {
            Ok(resp) => {
                if classify_answer(&resp) == Delivery::Answered {
                    router.answered(i);
                } else {
                    router.failed(i);
                }
                Ok(resp)
            }
            Err(e) => {
                router.failed(i);
                Err(e.into())
            }
        };
    }
    let (parts, body) = req.into_parts();
    let bytes = body.collect().await?.to_bytes();
    let mut attempt = 0;
    // The first endpoint whose read was cut short: it answers, only slowly (a linearizable
    // read waits for commits in flight). If every other one fails, the read goes back to it
    // with the rest of the caller's time rather than failing on the last one tried.
    let mut slow: Option<usize> = None;
    loop {
        attempt += 1;
        let more = attempt < n;
        let (i, ch) = match slow.filter(|_| attempt > n) {
            Some(j) => router.member(j).ok_or("no etcd endpoint")?,
            None => router.current().ok_or("no etcd endpoint")?,
        };
        let mut b = Request::builder()
            .method(parts.method.clone())
            .uri(parts.uri.clone())
            .version(parts.version);
        if let Some(h) = b.headers_mut() {
            *h = parts.headers.clone();
        }
        let req = b.body(Body::new(http_body_util::Full::new(bytes.clone())))?;
        // Only a read is cut short for the next endpoint: a write that timed out may still
        // be applied and is never sent again, so a bound would only shorten the caller's
        // command timeout (a member with slow commits answered writes after 1.5 s). A write
        // the caller gives up on still moves the pin, through the guard.
        let guard = PinGuard {
            router: &router,
            endpoint: i,
            armed: kind == Kind::Write,
        };
        let (result, how) = if more && kind == Kind::Read {
            match tokio::time::timeout(router.attempt_timeout, ch.oneshot(req)).await {
                Ok(r) => classified(r.map_err(BoxError::from)),
                Err(_) => {
                    slow = slow.or(Some(i));
                    (
                        Err(BoxError::from(format!(
                            "no answer within {}ms",
                            router.attempt_timeout.as_millis()
                        ))),
                        Delivery::Lost,
                    )
                }
            }
        } else {
            classified(ch.oneshot(req).await.map_err(BoxError::from))
        };
        guard.disarm();
        match verdict(kind, how, more) {
            Verdict::Done => {
                router.answered(i);
                return result;
            }
            Verdict::FailedFinal if kind == Kind::Read && attempt == n && slow.is_some() => {
                tracing::debug!(
                    ?how,
                    "etcd read failed everywhere; back to the slow endpoint"
                );
                router.failed(i);
            }
            Verdict::FailedFinal => {
                router.failed(i);
                return result;
            }
            Verdict::FailedRetry => {
                tracing::debug!(
                    attempt,
                    ?how,
                    "etcd request failed; trying the next endpoint"
                );
                router.failed(i);
            }
        }
    }
}

/// Moves the pin off an endpoint whose write was dropped unanswered: the caller's command
/// timeout passed, so that endpoint is slow or gone, and the next request should go elsewhere.
struct PinGuard<'a> {
    router: &'a Router,
    endpoint: usize,
    armed: bool,
}

impl PinGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for PinGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.router.failed(self.endpoint);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_logged_when_it_starts_and_when_an_answer_ends_it() {
        let t0 = std::time::Instant::now();
        let mut o = Outage::default();
        assert_eq!(o.answered(t0), None, "no outage: nothing to say");
        assert!(o.moved(t0), "the first move starts an outage");
        for _ in 0..1000 {
            assert!(!o.moved(t0), "moves during it are not lines of their own");
        }
        let later = t0 + Duration::from_secs(15);
        assert_eq!(o.answered(later), Some((1001, Duration::from_secs(15))));
        assert_eq!(o.answered(later), None, "said once");
        assert!(o.moved(later), "the next outage is a new one");
    }

    #[test]
    fn reads_are_retried_after_any_failure() {
        for how in [
            Delivery::NotConnected,
            Delivery::Lost,
            Delivery::Unavailable { no_leader: false },
        ] {
            assert_eq!(
                verdict(Kind::Read, how, true),
                Verdict::FailedRetry,
                "{how:?}"
            );
        }
    }

    #[test]
    fn writes_are_retried_only_when_nothing_can_have_been_applied() {
        for (how, want) in [
            (Delivery::NotConnected, Verdict::FailedRetry),
            (
                Delivery::Unavailable { no_leader: true },
                Verdict::FailedRetry,
            ),
            (Delivery::Lost, Verdict::FailedFinal),
            (
                Delivery::Unavailable { no_leader: false },
                Verdict::FailedFinal,
            ),
        ] {
            assert_eq!(verdict(Kind::Write, how, true), want, "{how:?}");
        }
    }

    #[test]
    fn streams_are_never_replayed() {
        assert_eq!(
            verdict(Kind::Stream, Delivery::NotConnected, true),
            Verdict::FailedFinal
        );
    }

    #[test]
    fn the_last_endpoint_gives_its_answer() {
        assert_eq!(
            verdict(Kind::Read, Delivery::Lost, false),
            Verdict::FailedFinal
        );
        assert_eq!(verdict(Kind::Read, Delivery::Answered, true), Verdict::Done);
    }

    #[test]
    fn only_connection_failures_count_as_not_sent() {
        let e = |m: &str| -> BoxError { m.to_string().into() };
        assert_eq!(
            classify_error(&e("tcp connect error")),
            Delivery::NotConnected
        );
        assert_eq!(
            classify_error(&e("Connection refused (os error 111)")),
            Delivery::NotConnected
        );
        assert_eq!(
            classify_error(&e("connection closed before message completed")),
            Delivery::Lost
        );
        assert_eq!(classify_error(&e("stream reset")), Delivery::Lost);
    }

    #[test]
    fn paths_are_classified() {
        assert_eq!(Kind::of("/etcdserverpb.KV/Range"), Kind::Read);
        assert_eq!(Kind::of("/etcdserverpb.KV/Txn"), Kind::Write);
        assert_eq!(Kind::of("/etcdserverpb.Lease/LeaseGrant"), Kind::Write);
        assert_eq!(Kind::of("/etcdserverpb.Watch/Watch"), Kind::Stream);
        assert_eq!(Kind::of("/etcdserverpb.Lease/LeaseKeepAlive"), Kind::Stream);
    }
}
