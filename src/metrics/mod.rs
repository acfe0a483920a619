//! Prometheus metrics, served by `run --metrics-addr HOST:PORT` at `/metrics`, and the
//! `/leader` check read off them.
//!
//! The values live in one process-wide registry; the election and supervisor code update them
//! through the small functions below, so no metrics type leaks into their signatures. The
//! registry holds metrics only: `/leader` (the `leader` module) answers from the same gauges.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use std::sync::{Mutex, OnceLock};

mod leader;
mod refusals;
mod serve;
pub mod textfile;

pub use refusals::{check_refused, CHECK_REFUSALS_VAR};
pub use serve::serve;

struct Metrics {
    registry: Registry,
    is_leader: IntGauge,
    token: IntGauge,
    slot: IntGauge,
    job_start: Gauge,
    ttl_remaining: Gauge,
    keepalive_rtt: Histogram,
    campaigns_won: IntCounter,
    campaign_seconds: Histogram,
    lost: IntCounterVec,
    job_starts: IntCounter,
    job_exits: IntCounterVec,
    /// In `registry` once a job has ended: a 0 before that would read as a job that died on
    /// its deadline.
    slack: Gauge,
    slack_registered: std::sync::Once,
    failovers: IntCounter,
    log_lines_dropped: IntCounter,
    token_regressions: IntCounter,
    timeouts: IntCounter,
    healthy: IntGauge,
    health_failures: IntCounter,
    takeover_delays: IntCounter,
    preemptions: IntCounter,
    /// `healthy` is in `registry`: only with `--health-cmd`.
    healthy_registered: std::sync::Once,
    /// The election this process runs, set once by [`describe`]: every series carries it.
    election: OnceLock<String>,
    /// The file this process counts its jobs' `check` refusals in: one byte per refusal,
    /// appended by `lead-exec check` (see [`check_refused`]). A file, not a pipe or a socket:
    /// it needs no listener in the run loop, survives the job closing its descriptors or
    /// exec'ing, and a refusal written while lead-exec is frozen is still counted when it wakes.
    check_file: OnceLock<refusals::CheckFile>,
    /// The file's size at the last scrape: counted refusals.
    checks_seen: Mutex<u64>,
    info: prometheus::IntGaugeVec,
    etcd_info: prometheus::IntGaugeVec,
    slots: IntGauge,
    lease_ttl: Gauge,
    grace: Gauge,
    keepalive_timeout: Gauge,
    keepalive_failures: IntCounter,
    handover: Histogram,
    check_refusals: IntCounter,
    deadline_stops: IntCounter,
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
        job_start: made(
            r,
            Gauge::new(
                "lead_exec_job_start_time_seconds",
                "Unix time the current (or last) term's job started; 0 before the first",
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
                    "Terms lost to their lease or key, by what was seen first",
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
        slack: Gauge::new(
            "lead_exec_deadline_slack_seconds",
            "Lease deadline minus the time the last job's group died; absent until a job has ended",
        )
        .expect("a valid metric"),
        slack_registered: std::sync::Once::new(),
        log_lines_dropped: made(
            r,
            IntCounter::new(
                "lead_exec_log_lines_dropped_total",
                "Log lines dropped because the log (stderr, or journald) was not being read",
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
        election: OnceLock::new(),
        check_file: OnceLock::new(),
        checks_seen: Mutex::new(0),
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
        info: made(
            r,
            prometheus::IntGaugeVec::new(
                Opts::new(
                    "lead_exec_info",
                    "Always 1: the worker's --id and lead-exec's version, to join on",
                ),
                &["id", "version"],
            ),
        ),
        etcd_info: made(
            r,
            prometheus::IntGaugeVec::new(
                Opts::new(
                    "lead_exec_etcd_server_info",
                    "Always 1: the etcd server's version, and whether it has the lease fixes lead-exec's fail-closed argument needs (absent until read)",
                ),
                &["version", "lease_fixes"],
            ),
        ),
        slots: made(
            r,
            IntGauge::new(
                "lead_exec_slots",
                "--slots: how many workers of the election may hold at once",
            ),
        ),
        lease_ttl: made(
            r,
            Gauge::new(
                "lead_exec_lease_ttl_seconds",
                "The TTL etcd granted the last lease (--ttl, or etcd's minimum)",
            ),
        ),
        grace: made(
            r,
            Gauge::new(
                "lead_exec_grace_seconds",
                "--grace: from SIGTERM to SIGKILL, which the lease deadline also leaves",
            ),
        ),
        keepalive_timeout: made(
            r,
            Gauge::new(
                "lead_exec_keepalive_timeout_seconds",
                "How long one keepalive may take before another goes out on the next endpoint",
            ),
        ),
        keepalive_failures: made(
            r,
            IntCounter::new(
                "lead_exec_keepalive_failures_total",
                "Keepalive attempts that failed or got no answer in time (each is retried)",
            ),
        ),
        handover: histogram(
            "lead_exec_handover_seconds",
            "From the deletion of the key this worker waited behind (the previous holder's end) to its job's start",
            vec![
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ],
        ),
        check_refusals: made(
            r,
            IntCounter::new(
                "lead_exec_check_refusals_total",
                "`lead-exec check` refusals (exit 4) in this worker's jobs",
            ),
        ),
        deadline_stops: made(
            r,
            IntCounter::new(
                "lead_exec_deadline_stops_total",
                "Jobs the watchdog stopped at the lease deadline: renewals did not come in time",
            ),
        ),
        registry,
    }
}

/// The metrics as a process starts: it holds no slot yet.
fn init(m: &Metrics) {
    m.slot.set(-1);
    // At 0 from the start, so that `increase()` sees a worker's first loss of each kind.
    for reason in LOSS_REASONS {
        m.lost.with_label_values(&[reason]);
    }
}

/// The `reason` values of `lead_exec_leadership_lost_total` (`Loss::label`).
const LOSS_REASONS: [&str; 3] = [
    "lease_expired",
    "renewal_deadline_passed",
    "leader_key_deleted",
];

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

pub fn log_line_dropped() {
    METRICS.log_lines_dropped.inc();
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

/// The term is lost (its key is gone, or will be before anything can be done about it):
/// this worker holds no slot from now on, while its job is still being stopped
/// (`lead_exec_is_leader` stays 1 until the job's group is gone). `/leader` answers 503 from
/// here, since the next holder's job may start at any moment.
pub fn term_lost() {
    METRICS.slot.set(-1);
}

pub fn ttl_remaining(d: Duration) {
    METRICS.ttl_remaining.set(d.as_secs_f64());
}

pub fn lost(reason: &str) {
    METRICS.lost.with_label_values(&[reason]).inc();
}

/// A job started; `handover_from` is when the key its term waited behind was deleted, for a
/// term won by waiting in line.
pub fn job_started(handover_from: Option<std::time::Instant>) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // Whole milliseconds, so that `/leader` reads back the time it was given.
    METRICS.job_start.set(now.as_millis() as f64 / 1000.0);
    METRICS.job_starts.inc();
    if let Some(gone) = handover_from {
        METRICS.handover.observe(gone.elapsed().as_secs_f64());
    }
}

pub fn job_exited(code: u8, slack_ms: i64) {
    METRICS
        .job_exits
        .with_label_values(&[&code.to_string()])
        .inc();
    METRICS.slack.set(slack_ms as f64 / 1000.0);
    METRICS.slack_registered.call_once(|| {
        METRICS
            .registry
            .register(Box::new(METRICS.slack.clone()))
            .expect("a metric registered once");
    });
}

/// The exposition text.
pub fn render() -> String {
    refusals::count_check_refusals();
    let mut families = METRICS.registry.gather();
    if let Some(election) = METRICS.election.get() {
        label_all(&mut families, "election", election);
    }
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut buf)
        .expect("text encoding cannot fail");
    String::from_utf8(buf).expect("exposition is UTF-8")
}

/// What a fleet's queries group and compare by: the election (a label on every series, so that
/// "leaders per election" needs no join), the worker's id and version (`lead_exec_info`), and
/// the settings its alerts measure against.
pub fn describe(election: &str, id: &str, slots: u32, grace: Duration) {
    let _ = METRICS.election.set(election.to_string());
    METRICS
        .info
        .with_label_values(&[id, env!("CARGO_PKG_VERSION")])
        .set(1);
    METRICS.slots.set(i64::from(slots));
    METRICS.grace.set(grace.as_secs_f64());
}

/// The etcd server's version, as read at start.
pub fn etcd_server(version: &str, lease_fixes: bool) {
    METRICS
        .etcd_info
        .with_label_values(&[version, if lease_fixes { "yes" } else { "no" }])
        .set(1);
}

/// Adds `name="value"` to every sample, keeping each sample's labels sorted by name as the
/// registry does.
fn label_all(families: &mut [prometheus::proto::MetricFamily], name: &str, value: &str) {
    for family in families {
        for m in family.mut_metric() {
            let mut labels = m.take_label();
            let mut pair = prometheus::proto::LabelPair::default();
            pair.set_name(name.to_string());
            pair.set_value(value.to_string());
            labels.push(pair);
            labels.sort_by(|a, b| a.name().cmp(b.name()));
            m.set_label(labels);
        }
    }
}

/// A lease was granted with `ttl`; each of its keepalives may take `keepalive_timeout`.
pub fn lease_granted(ttl: Duration, keepalive_timeout: Duration) {
    METRICS.lease_ttl.set(ttl.as_secs_f64());
    METRICS
        .keepalive_timeout
        .set(keepalive_timeout.as_secs_f64());
}

pub fn stopped_at_deadline() {
    METRICS.deadline_stops.inc();
}

pub fn keepalive_failed() {
    METRICS.keepalive_failures.inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loss_reason_is_shown_at_zero_from_the_start() {
        use crate::election::lease::Loss;
        for loss in [Loss::Expired, Loss::Deadline, Loss::KeyDeleted] {
            assert!(LOSS_REASONS.contains(&loss.label()), "{loss:?}");
        }
    }

    #[test]
    fn the_election_label_goes_on_every_sample_in_name_order() {
        let r = Registry::new();
        let exits = made(
            &r,
            IntCounterVec::new(Opts::new("exits_total", "h"), &["code"]),
        );
        exits.with_label_values(&["0"]).inc();
        made(&r, IntGauge::new("leader", "h")).set(1);
        let rtt = made(
            &r,
            Histogram::with_opts(HistogramOpts::new("rtt", "h").buckets(vec![1.0])),
        );
        rtt.observe(0.5);
        let mut families = r.gather();
        label_all(&mut families, "election", "settle");
        let mut buf = Vec::new();
        TextEncoder::new().encode(&families, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(
            text.contains(r#"exits_total{code="0",election="settle"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"leader{election="settle"} 1"#), "{text}");
        assert!(
            text.contains(r#"rtt_bucket{election="settle",le="1"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"rtt_count{election="settle"} 1"#), "{text}");
        let samples = text.lines().filter(|l| !l.starts_with('#'));
        for line in samples {
            assert!(line.contains(r#"election="settle""#), "{line}");
        }
    }
}
