//! Prometheus metrics, served by `run --metrics-addr HOST:PORT` at `/metrics`.
//!
//! The values live in one process-wide registry; the election and supervisor code update them
//! through the small functions below, so no metrics type leaks into their signatures.

use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Result;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

struct Metrics {
    registry: Registry,
    is_leader: IntGauge,
    token: IntGauge,
    slot: IntGauge,
    ttl_remaining: Gauge,
    keepalive_rtt: Histogram,
    campaigns_won: IntCounter,
    campaign_seconds: Histogram,
    lost: IntCounterVec,
    job_starts: IntCounter,
    job_exits: IntCounterVec,
    slack: Gauge,
    failovers: IntCounter,
    token_regressions: IntCounter,
    timeouts: IntCounter,
    healthy: IntGauge,
    health_failures: IntCounter,
    takeover_delays: IntCounter,
    preemptions: IntCounter,
    /// `healthy` is in `registry`: only with `--health-cmd`.
    healthy_registered: std::sync::Once,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let m = metrics();
    init(&m);
    m
});

fn metrics() -> Metrics {
    let registry = Registry::new();
    let r = &registry;
    let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
        made(
            r,
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)),
        )
    };
    Metrics {
        is_leader: made(r, IntGauge::new("lead_exec_is_leader", "1 while this worker leads")),
        token: made(
            r,
            IntGauge::new(
                "lead_exec_fencing_token",
                "Fencing token of the current (or last) term",
            ),
        ),
        slot: made(
            r,
            IntGauge::new(
                "lead_exec_slot",
                "Slot (LEAD_EXEC_SLOT) this worker holds (0 with one slot); -1 while it holds none",
            ),
        ),
        ttl_remaining: made(
            r,
            Gauge::new(
                "lead_exec_lease_ttl_remaining_seconds",
                "Time left before the local lease deadline, at the election or the last renewal",
            ),
        ),
        keepalive_rtt: histogram(
            "lead_exec_keepalive_rtt_seconds",
            "Round trip of lease keepalives",
            vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ],
        ),
        campaigns_won: made(
            r,
            IntCounter::new("lead_exec_campaigns_won_total", "Campaigns won and confirmed"),
        ),
        campaign_seconds: histogram(
            "lead_exec_campaign_duration_seconds",
            "From lease grant to confirmed leadership",
            prometheus::exponential_buckets(0.005, 4.0, 10).unwrap(),
        ),
        lost: made(
            r,
            IntCounterVec::new(
                Opts::new(
                    "lead_exec_leadership_lost_total",
                    "Terms that ended without the job exiting on its own",
                ),
                &["reason"],
            ),
        ),
        job_starts: made(r, IntCounter::new("lead_exec_job_starts_total", "Jobs started")),
        job_exits: made(
            r,
            IntCounterVec::new(
                Opts::new("lead_exec_job_exits_total", "Job exits by exit code"),
                &["code"],
            ),
        ),
        slack: made(
            r,
            Gauge::new(
                "lead_exec_deadline_slack_seconds",
                "Lease deadline minus the time the last job's group died",
            ),
        ),
        failovers: made(
            r,
            IntCounter::new(
                "lead_exec_etcd_endpoint_failovers_total",
                "Times requests moved to the next etcd endpoint because the pinned one failed",
            ),
        ),
        timeouts: made(
            r,
            IntCounter::new(
                "lead_exec_job_timeouts_total",
                "Jobs stopped because they ran past --timeout",
            ),
        ),
        // Registered only with --health-cmd (see `health_checks_on`): without a check there is
        // nothing to be unhealthy about, and a 0 would alert.
        healthy: IntGauge::new(
            "lead_exec_healthy",
            "1 while --health-cmd says this worker may lead (0 before its first pass); absent without --health-cmd",
        )
        .expect("a valid metric"),
        health_failures: made(
            r,
            IntCounter::new(
                "lead_exec_health_check_failures_total",
                "Health checks that failed or timed out",
            ),
        ),
        takeover_delays: made(
            r,
            IntCounter::new(
                "lead_exec_takeover_delays_total",
                "Terms that waited out --takeover-delay after an unclean end",
            ),
        ),
        healthy_registered: std::sync::Once::new(),
        preemptions: made(
            r,
            IntCounter::new(
                "lead_exec_preemptions_requested_total",
                "Handovers this worker asked of a lower-priority leader",
            ),
        ),
        token_regressions: made(
            r,
            IntCounter::new(
                "lead_exec_token_regressions_total",
                "Terms whose fencing token was not above this process's previous one (etcd's revisions were reset)",
            ),
        ),
        registry,
    }
}

/// The metrics as a process starts: it holds no slot yet.
fn init(m: &Metrics) {
    m.slot.set(-1);
}

/// A metric, registered: the names and help texts are constants, so failing is a bug.
fn made<T: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<T>,
) -> T {
    let metric = metric.expect("a valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("a metric registered once");
    metric
}

pub fn job_timed_out() {
    METRICS.timeouts.inc();
}

pub fn health_checked(passed: bool) {
    if !passed {
        METRICS.health_failures.inc();
    }
}

/// Shows `lead_exec_healthy`, at 0 until the first check passes.
pub fn health_checks_on() {
    METRICS.healthy_registered.call_once(|| {
        METRICS
            .registry
            .register(Box::new(METRICS.healthy.clone()))
            .expect("a metric registered once");
    });
}

pub fn healthy(on: bool) {
    METRICS.healthy.set(on as i64);
}

pub fn takeover_delayed() {
    METRICS.takeover_delays.inc();
}

pub fn preemption_requested() {
    METRICS.preemptions.inc();
}

pub fn endpoint_failover() {
    METRICS.failovers.inc();
}

pub fn keepalive_rtt(d: Duration) {
    METRICS.keepalive_rtt.observe(d.as_secs_f64());
}

pub fn elected(token: i64, slot: u32, campaign: Duration) {
    METRICS.campaigns_won.inc();
    METRICS.campaign_seconds.observe(campaign.as_secs_f64());
    METRICS.token.set(token);
    METRICS.slot.set(i64::from(slot));
}

pub fn token_regressed() {
    METRICS.token_regressions.inc();
}

pub fn leading(on: bool) {
    METRICS.is_leader.set(on as i64);
    if !on {
        // The term is over (or never began): holding no slot must not read as slot 0.
        METRICS.slot.set(-1);
    }
}

pub fn ttl_remaining(d: Duration) {
    METRICS.ttl_remaining.set(d.as_secs_f64());
}

pub fn lost(reason: &str) {
    METRICS.lost.with_label_values(&[reason]).inc();
}

pub fn job_started() {
    METRICS.job_starts.inc();
}

pub fn job_exited(code: u8, slack_ms: i64) {
    METRICS
        .job_exits
        .with_label_values(&[&code.to_string()])
        .inc();
    METRICS.slack.set(slack_ms as f64 / 1000.0);
}

/// The exposition text.
pub fn render() -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&METRICS.registry.gather(), &mut buf)
        .expect("text encoding cannot fail");
    String::from_utf8(buf).expect("exposition is UTF-8")
}

/// Connections served at once; more wait in the kernel's accept queue.
const MAX_CONNECTIONS: usize = 32;
/// A client that has not sent its request headers by then is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds now (so a bad address fails at start-up) and serves in the background, with hyper.
///
/// Each connection is a task of its own, so a slow or abusive client holds only that task,
/// never the run loop; headers must arrive within 5 s, and at most
/// 32 connections are served at once.
pub async fn serve(addr: SocketAddr) -> Result<()> {
    // A taken port or a foreign address is a setting to fix, not an internal error.
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        crate::exit::fail(
            crate::exit::Exit::Usage,
            format!("--metrics-addr {addr}: cannot listen: {e}"),
        )
    })?;
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(sock),
                        hyper::service::service_fn(answer),
                    );
                let _ = conn.await;
                drop(permit);
            });
        }
    });
    Ok(())
}

type Body = http_body_util::Full<hyper::body::Bytes>;

/// `GET` or `HEAD /metrics`; 404 elsewhere, 405 for other methods.
async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    use hyper::{Method, StatusCode};
    let reply = |status: StatusCode, body: String| {
        let mut r = hyper::Response::new(Body::new(body.into()));
        *r.status_mut() = status;
        r
    };
    let mut resp = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            let mut r = reply(StatusCode::OK, render());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        (_, "/metrics") => reply(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n".into()),
        _ => reply(StatusCode::NOT_FOUND, "not found: try /metrics\n".into()),
    };
    if req.method() == Method::HEAD {
        // hyper sends no body for HEAD; keep the length a GET would have.
        let len = hyper::body::Body::size_hint(resp.body())
            .exact()
            .unwrap_or(0);
        resp.headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, len.into());
    }
    Ok(resp)
}
