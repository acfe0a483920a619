//! `scale`: many candidates on one election: failover time, etcd requests per second while
//! they wait, and their total RSS.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use harness::measure::fifo::Fifo;
use harness::measure::report::{yes_no, Report, Row};
use harness::measure::stats::{fmt_ms, median, ms};
use harness::measure::worker::{status_kib, Tool, Worker, WorkerSpec};

use super::{pids, Cx, DEFAULT_GRACE_S, DEFAULT_MARGIN_S, SCALE_TTL_S};

/// 100 candidates on one election: failover after SIGTERM to the leader, compared with 3; and
/// what etcd serves per second while they all wait.
pub(crate) fn scale(cx: &Cx) -> Result<Report> {
    let big = cx.candidates;
    let runs = cx.n(5, 2);
    // A whole number of keepalive intervals, so that the count does not depend on where the
    // window falls in the cycle: lead-exec renews every (TTL − grace − margin)/3 = 2 s at the
    // defaults, etcdctl every TTL/3.
    let window = Duration::from_secs(SCALE_TTL_S * 3);
    let (fbig, idle_le, rss) = crowd_failover(cx, big, runs, Some(window))?;
    let (f3, _, _) = crowd_failover(cx, 3, runs, None)?;
    let idle_ctl = etcdctl_idle(cx, big, window)?;
    let interval_s = (SCALE_TTL_S - DEFAULT_GRACE_S - DEFAULT_MARGIN_S) as f64 / 3.0;
    let expect = big as f64 / interval_s;
    let idle = idle_le.expect("measured");
    let rss = rss.expect("measured");
    let rate_cell = |r: &Rates| format!("{:.1} keepalive/s + {:.1} other/s", r.keepalive, r.other);
    let within = median(&fbig) <= 2.0 * median(&f3);
    let rows = vec![
        Row::new(
            "scale",
            &format!(
                "SIGTERM to leader → next job running, {big} vs 3 candidates, median, n={runs}"
            ),
            format!("{} ms vs {} ms", fmt_ms(median(&fbig)), fmt_ms(median(&f3))),
            "–".into(),
            &format!("{big} ≤ 2× 3"),
            yes_no(within),
        ),
        Row::new(
            "scale",
            &format!(
                "etcd requests/s while {big} candidates wait (TTL {SCALE_TTL_S} s, {}-s window)",
                window.as_secs()
            ),
            rate_cell(&idle),
            rate_cell(&idle_ctl),
            &format!("≈ {expect:.0} keepalives/s, nothing else"),
            yes_no((idle.keepalive - expect).abs() <= 0.2 * expect && idle.other < 0.5),
        ),
        Row::new(
            "scale",
            &format!("total RSS of the {big} waiting lead-exec processes"),
            format!(
                "{:.0} MiB ({:.1} MiB each)",
                rss as f64 / 1024.0,
                rss as f64 / 1024.0 / big as f64
            ),
            "–".into(),
            "",
            "",
        ),
    ];
    let notes = vec![
        format!(
            "scale: requests/s = delta of etcd's `grpc_server_msg_received_total` (every \
             message a client sends: one per unary call, one per stream message) over the \
             window, split into grpc_method=\"LeaseKeepAlive\" and all others. lead-exec \
             other: {}; etcdctl other: {}.",
            idle.detail, idle_ctl.detail
        ),
        format!(
            "scale: lead-exec candidates run with `--ttl {SCALE_TTL_S}s` (default grace and \
             margin), etcdctl with `--ttl {SCALE_TTL_S}`; each failover is followed by one new \
             candidate joining at the back, so the crowd stays at its size."
        ),
    ];
    Ok(Report { rows, notes })
}

/// What etcd received per second while candidates waited.
pub(crate) struct Rates {
    pub(crate) keepalive: f64,
    pub(crate) other: f64,
    detail: String,
}

/// `n` lead-exec candidates; `runs` SIGTERM failovers; optionally the idle request rate.
pub(crate) fn crowd_failover(
    cx: &Cx,
    n: usize,
    runs: usize,
    idle: Option<Duration>,
) -> Result<(Vec<f64>, Option<Rates>, Option<u64>)> {
    let election = cx.unique("scale");
    let ep = cx.etcd.endpoint.clone();
    let mut f = cx.fifo(true)?; // every candidate's job writes "IDX PID" here
    let fpath = f.path.clone();
    let ttl = format!("{SCALE_TTL_S}s");
    let args = ["--ttl", ttl.as_str()];
    let mut workers: Vec<Option<Worker>> = Vec::new();
    let spawn = |i: usize| -> Result<Worker> {
        let script = format!(
            "trap 'exit 0' TERM; echo \"{i} $$\" > \"{}\"; while :; do sleep 1000 & wait; done",
            fpath.display()
        );
        let id = format!("c{i}");
        cx.spawn(WorkerSpec {
            lead_exec_args: &args,
            ttl_s: SCALE_TTL_S,
            ..WorkerSpec::fast(Tool::LeadExec, &election, &ep, &id, &script)
        })
    };
    for i in 0..n {
        workers.push(Some(spawn(i)?));
    }
    let prefix = Tool::LeadExec.prefix(&election);
    let read_leader =
        |f: &mut Fifo, workers: &mut Vec<Option<Worker>>| -> Result<(usize, Instant)> {
            let (line, at) = f.line(Duration::from_secs(30))?;
            let (i, job) = pids(&line)?;
            let i = i as usize;
            workers[i]
                .as_mut()
                .context("unknown candidate")?
                .adopt_job(job);
            Ok((i, at))
        };
    let (mut leader, _) = read_leader(&mut f, &mut workers)?;
    cx.wait_keys(&prefix, n as u64, Duration::from_secs(60 + n as u64 / 10))?;
    let rates = match idle {
        Some(window) => Some(idle_rates(cx, window)?),
        None => None,
    };
    // The waiting candidates' resident memory (the leader's watchdog and job excluded).
    let rss = idle.map(|_| {
        workers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != leader)
            .filter_map(|(_, w)| w.as_ref())
            .filter_map(|w| status_kib(w.child.id() as i32, "VmRSS:").ok())
            .sum::<u64>()
    });
    let mut samples = Vec::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        workers[leader]
            .as_ref()
            .expect("leader")
            .signal(libc::SIGTERM);
        let (next, t1) = read_leader(&mut f, &mut workers)?;
        samples.push(ms(t1 - t0));
        if let Some(mut old) = workers[leader].take() {
            old.wait_exit(Duration::from_secs(10));
        }
        leader = next;
        workers.push(Some(spawn(workers.len())?));
        cx.wait_keys(&prefix, n as u64, Duration::from_secs(30))?;
    }
    Ok((samples, rates, rss))
}

/// `n` etcdctl lock waiters on one lock: the idle request rate only.
pub(crate) fn etcdctl_idle(cx: &Cx, n: usize, window: Duration) -> Result<Rates> {
    let election = cx.unique("scalectl");
    let ep = cx.etcd.endpoint.clone();
    let mut f = cx.fifo(true)?;
    let script = format!(
        "echo \"x $$\" > \"{}\"; while :; do sleep 1000 & wait; done",
        f.path.display()
    );
    let mut workers = Vec::new();
    for i in 0..n {
        let id = format!("c{i}");
        workers.push(cx.spawn(WorkerSpec {
            ttl_s: SCALE_TTL_S,
            ..WorkerSpec::fast(Tool::Etcdctl, &election, &ep, &id, &script)
        })?);
    }
    f.line(Duration::from_secs(30))?;
    cx.wait_keys(
        &Tool::Etcdctl.prefix(&election),
        n as u64,
        Duration::from_secs(60 + n as u64 / 10),
    )?;
    let r = idle_rates(cx, window);
    drop(workers);
    r
}

pub(crate) fn idle_rates(cx: &Cx, window: Duration) -> Result<Rates> {
    // Let the joiners' startup traffic and first keepalive round pass; nothing of ours talks
    // to etcd meanwhile.
    thread::sleep(Duration::from_secs(SCALE_TTL_S) / 3 + Duration::from_secs(2));
    let (m0, t0) = (cx.etcd.msgs_received()?, Instant::now());
    thread::sleep(window);
    let (m1, t1) = (cx.etcd.msgs_received()?, Instant::now());
    let secs = (t1 - t0).as_secs_f64();
    let mut keepalive = 0.0;
    let mut other = 0.0;
    let mut detail = Vec::new();
    for (method, v1) in &m1 {
        let d = v1 - m0.get(method).copied().unwrap_or(0.0);
        if method == "LeaseKeepAlive" {
            keepalive = d / secs;
        } else if d > 0.0 {
            other += d / secs;
            detail.push(format!("{method} {:.2}/s", d / secs));
        }
    }
    Ok(Rates {
        keepalive,
        other,
        detail: if detail.is_empty() {
            "none".into()
        } else {
            detail.join(", ")
        },
    })
}
