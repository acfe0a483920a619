//! Connecting to etcd and classifying its failures into exit codes.
//!
//! The client's channel connects lazily, and a per-request gRPC timeout would also cut the
//! long-lived keepalive and watch streams, so every unary request is bounded here, with
//! [`bounded`], instead.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

pub mod failover;

use crate::exit::{fail, Exit};

/// Top of every key this program writes.
pub const ROOT: &str = "lead-exec";

/// The least one request attempt gets before it may go to the next endpoint.
const MIN_ATTEMPT: Duration = Duration::from_millis(50);

/// Above etcd's default `--grpc-keepalive-min-time` of 5 s.
const PING_INTERVAL: Duration = Duration::from_secs(10);

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct Conn {
    pub endpoints: Vec<String>,
    pub dial_timeout: Duration,
    pub command_timeout: Duration,
    pub tls: Option<Tls>,
    /// User name and password. The password is never logged (see the `Debug` impl of [`Secret`]).
    pub auth: Option<(String, Secret)>,
}

#[derive(Debug, Clone)]
pub struct Tls {
    pub cacert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// A password: printable only on purpose.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(password: String) -> Secret {
        Secret(password)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// An etcd client on the heap. `etcd_client::Client` is 3.7 KB (a handle for each of etcd's
/// services), and nearly every request clones one into its future: held inline, each clone
/// made that future, every future that awaits it and every stack frame that polls them 3.7 KB
/// larger. A waiting candidate's main thread then kept a third of a megabyte of stack
/// resident, touched again at each keepalive (which then woke the campaign). A clone of this
/// one is one pointer in a future.
#[derive(Clone)]
pub struct Client(Box<etcd_client::Client>);

impl std::ops::Deref for Client {
    type Target = etcd_client::Client;
    fn deref(&self) -> &etcd_client::Client {
        &self.0
    }
}

impl std::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut etcd_client::Client {
        &mut self.0
    }
}

/// A client with the router under its channel: the stream owners need the router, to report
/// the failures only they see and to follow the pin.
pub type Connection = (Client, std::sync::Arc<failover::Router>);

/// Connects and proves the cluster answers, within the dial timeout.
pub async fn connect(conn: &Conn) -> Result<Connection> {
    let (client, router) = open(conn).await?;
    probe(&client, conn, tokio::time::Instant::now()).await?;
    Ok((client, router))
}

/// Builds the client. Its channel connects lazily, on the first request: without
/// credentials to exchange, nothing is sent yet, so what goes first is the caller's choice.
pub async fn open(conn: &Conn) -> Result<Connection> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(conn.dial_timeout)
        // HTTP/2 pings close a connection that went silent. etcd refuses pings more often
        // than its --grpc-keepalive-min-time (5 s by default) with a GOAWAY "too_many_pings",
        // which reset every connection of an idle candidate every few seconds at 1 s: stay
        // above it. Fast failure detection is the keepalive loop's job (see
        // `election::lease`), which moves every stream to the next endpoint.
        .with_keep_alive(PING_INTERVAL, conn.dial_timeout)
        .with_keep_alive_while_idle(true)
        // A member cut off from its quorum refuses at once ("no leader") instead of hanging,
        // and cancels our watches: the failover channel then moves to a member that can serve.
        .with_require_leader(true);
    if let Some((user, password)) = &conn.auth {
        // etcd's auth tokens expire (5 minutes by default); a lease held for days must not
        // fail closed because of that.
        opts = opts
            .with_user(user, password.expose())
            .with_auto_token_refresh(true);
    }
    if let Some(tls) = &conn.tls {
        let mut t = TlsOptions::new();
        if let Some(ca) = &tls.cacert {
            let pem = std::fs::read(ca)
                .map_err(|e| fail(Exit::Usage, format!("--cacert {}: {e}", ca.display())))?;
            t = t.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            let c = std::fs::read(cert)
                .map_err(|e| fail(Exit::Usage, format!("--cert {}: {e}", cert.display())))?;
            let k = std::fs::read(key)
                .map_err(|e| fail(Exit::Usage, format!("--key {}: {e}", key.display())))?;
            t = t.identity(Identity::from_pem(c, k));
        }
        opts = opts.with_tls(t);
    }
    let endpoints: Vec<String> = conn
        .endpoints
        .iter()
        .map(|e| {
            if conn.tls.is_some() && !e.starts_with("http") {
                format!("https://{e}")
            } else {
                e.clone()
            }
        })
        .collect();
    // A healthy member answers a read in milliseconds: half the shorter timeout per attempt
    // lets a read (the probe below included) reach a second endpoint in time. Writes are not
    // cut short (see `failover`).
    let attempt = (conn.dial_timeout.min(conn.command_timeout) / 2).max(MIN_ATTEMPT);
    let router = failover::Router::new(attempt);
    let builder = failover::Builder(router.clone());
    let client = bounded_by(
        Bound::Dial(conn.dial_timeout),
        &what(conn),
        etcd_client::Client::connect_with_balanced_channel(&endpoints, Some(opts), builder),
    )
    .await
    .map_err(|e| explain(conn, e))?;
    Ok((Client(Box::new(client)), router))
}

/// Proves, within the dial timeout counted from `dialing` (when connecting began), that the
/// cluster answers and has a quorum: one cheap linearizable read. Members that answer "no
/// leader" are electing one (a member restarted, the raft leader lost): that takes a second
/// or two, so it is asked again within the dial timeout rather than reported at once.
pub async fn probe(client: &Client, conn: &Conn, dialing: tokio::time::Instant) -> Result<()> {
    let mut client = client.clone();
    let what = what(conn);
    let until = dialing + conn.dial_timeout;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let probe = client.get(
            format!("{ROOT}/"),
            Some(etcd_client::GetOptions::new().with_count_only()),
        );
        // The flag's value in the message, whatever is left of it.
        let Ok(answer) = tokio::time::timeout(left.max(MIN_ATTEMPT), probe).await else {
            let bound = Bound::Dial(conn.dial_timeout);
            return Err(fail(Exit::Unavailable, no_answer(&what, bound)));
        };
        match answered(&what, answer) {
            Ok(_) => return Ok(()),
            Err(e) if format!("{e:#}").contains("no leader") && left > NO_LEADER_RETRY => {
                tokio::time::sleep(NO_LEADER_RETRY).await;
            }
            Err(e) => return Err(explain(conn, e)),
        }
    }
}

fn what(conn: &Conn) -> String {
    format!("etcd at {}", conn.endpoints.join(","))
}

/// A server that refuses our client certificate just drops the handshake: say where to look.
fn explain(conn: &Conn, e: anyhow::Error) -> anyhow::Error {
    let text = format!("{e:#}");
    let vague = text.ends_with("canceled") || text.ends_with("transport error");
    if conn.tls.is_some() && vague {
        return fail(
            crate::exit::exit_of(&e),
            format!(
                "{text} (the TLS handshake failed: is --cert signed by a CA the server trusts?)"
            ),
        );
    }
    e
}

/// The etcd release `version` (as its status call gives it, "3.5.16") lacks a lease fix that
/// the fail-closed argument relies on: which, if so. Before 3.4.31 and 3.5.13 a stalled old
/// etcd leader could go on answering keepalives or revoke leases late (etcd#15247); before
/// 3.4.38, 3.5.23 and 3.6.5 a renewal could be reported as successful on a revoked lease.
pub fn lease_fix_missing(version: &str) -> Option<&'static str> {
    const STALE_LEADER: &str =
        "a stalled old etcd leader may answer keepalives (etcd#15247; fixed in 3.4.31 and 3.5.13)";
    const REVOKED: &str = "a renewal may be reported as successful on a revoked lease (fixed in 3.4.38, 3.5.23 and 3.6.5)";
    let mut parts = version.trim().split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    });
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    match (major, minor) {
        (3, 0..=3) => Some(STALE_LEADER),
        (3, 4) if patch < 31 => Some(STALE_LEADER),
        (3, 4) if patch < 38 => Some(REVOKED),
        (3, 5) if patch < 13 => Some(STALE_LEADER),
        (3, 5) if patch < 23 => Some(REVOKED),
        (3, 6) if patch < 5 => Some(REVOKED),
        (0..=2, _) => Some(STALE_LEADER),
        _ => None,
    }
}

/// The server's version, by the status call of the member the client is pinned to; `None` if
/// it does not answer within `timeout`.
pub async fn server_version(client: &Client, timeout: Duration) -> Option<String> {
    let mut c = client.clone();
    bounded(timeout, c.status())
        .await
        .ok()
        .map(|s| s.version().to_string())
}

/// How long to wait before asking again a cluster that has no leader at start-up.
const NO_LEADER_RETRY: Duration = Duration::from_millis(100);

/// Runs one etcd request, bounded by `timeout`, and classifies its failure; an error names
/// the server as "etcd".
pub fn bounded<'a, T: 'a>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, etcd_client::Error>> + 'a,
) -> impl Future<Output = Result<T>> + 'a {
    bounded_by(Bound::Other(timeout), "etcd", fut)
}

/// [`bounded`], with an error that names the server as `what` (its endpoints, at connect).
pub fn bounded_as<'a, T: 'a>(
    timeout: Duration,
    what: &'a str,
    fut: impl Future<Output = Result<T, etcd_client::Error>> + 'a,
) -> impl Future<Output = Result<T>> + 'a {
    bounded_by(Bound::Other(timeout), what, fut)
}

/// What bounds a request, so that running out of time names the flag to raise.
#[derive(Debug, Clone, Copy)]
pub enum Bound {
    /// `--dial-timeout`: connecting and the start-up probe.
    Dial(Duration),
    /// `--command-timeout`: one request once connected.
    Command(Duration),
    /// A bound derived from them (a share of one, a retry's rest): no flag sets it alone.
    Other(Duration),
}

impl Bound {
    fn timeout(self) -> Duration {
        match self {
            Bound::Dial(d) | Bound::Command(d) | Bound::Other(d) => d,
        }
    }

    fn flag(self) -> Option<&'static str> {
        match self {
            Bound::Dial(_) => Some("--dial-timeout"),
            Bound::Command(_) => Some("--command-timeout"),
            Bound::Other(_) => None,
        }
    }
}

/// [`bounded_as`], with the bound's flag named when it runs out.
///
/// The request waits on the heap: a request's future is kilobytes (tonic's), and held inline
/// it would make every future that awaits one as large, and every stack frame that polls
/// them. Those frames are touched again at each poll of the run, and stay resident until a
/// settled wait gives them back (`run::candidacy`'s `wait_lightly`).
pub fn bounded_by<'a, T: 'a>(
    bound: Bound,
    what: &'a str,
    fut: impl Future<Output = Result<T, etcd_client::Error>> + 'a,
) -> impl Future<Output = Result<T>> + 'a {
    let fut = Box::pin(fut);
    async move {
        match tokio::time::timeout(bound.timeout(), fut).await {
            Err(_) => Err(fail(Exit::Unavailable, no_answer(what, bound))),
            Ok(answer) => answered(what, answer),
        }
    }
}

/// etcd's answer from `what`, an error coded and named (see [`classify`]).
fn answered<T>(what: &str, answer: Result<T, etcd_client::Error>) -> Result<T> {
    answer.map_err(|e| {
        let err = classify(e);
        let how = match crate::exit::exit_of(&err) {
            Exit::Auth => "refused the credentials",
            _ => "unavailable",
        };
        err.context(format!("{what} {how}"))
    })
}

/// "etcd unavailable: no answer within 5s (--command-timeout)": the flag to raise when the
/// cluster is slow rather than gone.
fn no_answer(what: &str, bound: Bound) -> String {
    let within = crate::clock::human(bound.timeout());
    match bound.flag() {
        Some(flag) => format!("{what} unavailable: no answer within {within} ({flag})"),
        None => format!("{what} unavailable: no answer within {within}"),
    }
}

/// Turns a client error into a coded error: credentials problems are [`Exit::Auth`], anything
/// else means the cluster could not serve us ([`Exit::Unavailable`]).
pub fn classify(e: etcd_client::Error) -> anyhow::Error {
    let auth = match &e {
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ) || s.message().contains("authentication failed")
                || s.message().contains("user name is empty")
                || s.message().contains("permission denied")
        }
        _ => false,
    };
    let msg = match &e {
        etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
        other => format!("{other}"),
    };
    let msg = if msg.is_empty() { format!("{e}") } else { msg };
    fail(if auth { Exit::Auth } else { Exit::Unavailable }, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a request's future holds of the client: one pointer, not etcd-client's 3.7 KB;
    /// and what one holds of the request it bounds: one pointer, not tonic's future.
    #[test]
    fn a_client_clone_and_a_bounded_request_are_a_pointer_in_a_future() {
        assert_eq!(std::mem::size_of::<Client>(), std::mem::size_of::<usize>());
        assert!(std::mem::size_of::<etcd_client::Client>() > 1024);
        let big = async {
            let kilobytes = [0u8; 8192];
            std::future::ready(()).await;
            Ok::<_, etcd_client::Error>(kilobytes[0])
        };
        let bounded = bounded(Duration::from_secs(1), big);
        assert!(
            std::mem::size_of_val(&bounded) < 1024,
            "{} bytes",
            std::mem::size_of_val(&bounded)
        );
    }

    #[test]
    fn versions_without_the_lease_fixes_are_named() {
        for v in ["3.4.23", "3.4.30", "3.5.12", "3.3.27", "2.3.8"] {
            assert!(lease_fix_missing(v).unwrap().contains("etcd#15247"), "{v}");
        }
        for v in [
            "3.4.31", "3.4.37", "3.5.13", "3.5.16", "3.5.22", "3.6.0", "3.6.4",
        ] {
            assert!(
                lease_fix_missing(v).unwrap().contains("revoked lease"),
                "{v}"
            );
        }
        for v in [
            "3.4.38", "3.5.23", "3.5.30", "3.6.5", "3.7.0", "4.0.0", "garbage", "",
        ] {
            assert_eq!(lease_fix_missing(v), None, "{v}");
        }
    }
}
