//! `failclosed`: etcd becomes unreachable → how long the job lives on, against the earliest
//! moment the server can expire the lease.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use harness::measure::blackhole::Proxy;
use harness::measure::fifo::Ev;
use harness::measure::reap;
use harness::measure::report::{yes_no, Report, Row};
use harness::measure::stats::{fmt_ms, max, median, min, ms, signed_secs};
use harness::measure::worker::{Tool, WorkerSpec, TOOLS};

use super::{job_script, pids, Cx, MARGIN, TTL};

/// Fail-closed: a proxy between worker and etcd starts dropping everything right after it has
/// delivered a keepalive answer (the worst case: the wrapper has just renewed its local
/// deadline from a keepalive that was *sent* earlier than the server *received* it).
pub(crate) fn failclosed(cx: &Cx) -> Result<Report> {
    let n = cx.n(5, 2);
    let ttl = TTL.as_secs_f64();
    let observe = TTL + Duration::from_secs(2);
    let mut term_s = Vec::new();
    let mut death_s = Vec::new();
    let mut slack_simple = Vec::new();
    let mut slack_server = Vec::new();
    let mut expiry_after_death = Vec::new();
    let mut le_alive = 0usize;
    let mut ctl_alive = 0usize;
    let mut ctl_expired_at = Vec::new();
    let mut watchdog_slack = Vec::new();
    for _ in 0..n {
        for t in TOOLS {
            let proxy = Proxy::start(cx.etcd.port)?;
            let ep = proxy.endpoint();
            let election = cx.unique("fail");
            let mut f = cx.fifo(false)?;
            let script = job_script(&f.path, "echo term >&3");
            let mut w = cx.spawn(WorkerSpec::fast(t, &election, &ep, "a", &script))?;
            let (line, _) = f.line(Duration::from_secs(10))?;
            w.adopt_job(pids(&line)?.0);
            // Watched directly on etcd, not through the proxy: when the server drops the key.
            let deletes = cx.etcd.watch_deletes(&t.prefix(&election))?;
            // Past the first keepalive round (TTL/3 after the grant) the only answers etcd
            // sends a leader are keepalive answers: the blackhole armed now starts right after
            // a renewal, not after the answer to some earlier request (the leader watch, say).
            thread::sleep(TTL / 3 + Duration::from_millis(200));
            proxy.arm();
            let (t_b, t_ka) = proxy.wait_blackholed(Duration::from_secs(5))?;
            let until = t_b + observe;
            let (mut t_term, mut t_death) = (None, None);
            while t_death.is_none() {
                match f.next(until) {
                    Some(Ev::Line(l, at)) if l.trim() == "term" => t_term = Some(at),
                    Some(Ev::Line(..)) => {}
                    Some(Ev::Eof(at)) => t_death = Some(at),
                    None => break,
                }
            }
            let t_del = deletes
                .rx
                .recv_timeout(until.saturating_duration_since(Instant::now()));
            match t {
                Tool::LeadExec => {
                    let Some(d) = t_death else {
                        le_alive += 1;
                        continue;
                    };
                    if let Some(tt) = t_term {
                        term_s.push((tt - t_b).as_secs_f64());
                    }
                    death_s.push((d - t_b).as_secs_f64());
                    watchdog_slack.extend(w.watchdog_slack_ms());
                    slack_simple.push(ttl - (d - t_b).as_secs_f64());
                    slack_server.push(signed_secs(d, t_ka + TTL));
                    if let Ok(x) = t_del {
                        expiry_after_death.push(x.saturating_duration_since(d).as_secs_f64());
                    }
                }
                Tool::Etcdctl => {
                    if t_death.is_none() {
                        ctl_alive += 1;
                    }
                    if let Ok(x) = t_del {
                        ctl_expired_at.push((x - t_b).as_secs_f64());
                    }
                }
            }
        }
    }
    let m = MARGIN.as_secs_f64();
    let slack_cell = |v: &[f64]| {
        if v.is_empty() {
            "–".to_string()
        } else {
            format!(
                "min {:.2} ms, median {:.2} ms",
                1e3 * min(v),
                1e3 * median(v)
            )
        }
    };
    let verdict = |v: &[f64]| -> String {
        if v.is_empty() {
            "**no**".into()
        } else if min(v) >= m {
            "yes".into()
        } else {
            format!("**no**, short by {:.2} ms", 1e3 * (m - min(v)))
        }
    };
    let detect = kill_detect_latency(cx)?;
    let rows = vec![
        Row::new(
            "failclosed",
            &format!("etcd unreachable → job SIGTERMed / dead, median, n={n}"),
            format!("{:.3} s / {:.3} s", median(&term_s), median(&death_s)),
            format!("never (job alive {ctl_alive}/{n} at TTL + 2 s)"),
            "job stopped before the lease can expire",
            yes_no(le_alive == 0 && death_s.len() == n),
        ),
        Row::new(
            "failclosed",
            "slack = TTL − (death − blackhole)",
            slack_cell(&slack_simple),
            "n/a (job never stopped)".into(),
            &format!("always ≥ margin {m:.1} s"),
            &verdict(&slack_simple),
        ),
        Row::new(
            "failclosed",
            "strict slack = (last keepalive delivered to etcd + TTL) − death",
            slack_cell(&slack_server),
            "n/a".into(),
            &format!("always ≥ margin {m:.1} s"),
            &verdict(&slack_server),
        ),
    ];
    let mut notes = vec![format!(
        "failclosed: lead-exec `--ttl 3s --grace 500ms --safety-margin 500ms`; the job ignores \
         TERM (it only reports it), so it dies at the SIGKILL, D = send time of the last good \
         keepalive + TTL − margin, the worst case. The proxy blackholes (connections stay \
         open) right after forwarding a keepalive answer; blackhole = that instant. `slack` is \
         TTL − (job dead − blackhole). `strict slack` uses instead the instant the proxy \
         forwarded the last request to etcd, after which the server cannot expire the lease \
         before + TTL. Both are lower bounds: death is timed when the harness sees the job's \
         FIFO close, which it does {} ms (median; max {} ms) after a kill(SIGKILL) of such a \
         job (calibrated without lead-exec). By design, slack = margin + (etcd's receive time \
         − lead-exec's send time of the last keepalive) − (watchdog timer → job dead): the \
         margin is what absorbs the signal latency.",
        fmt_ms(median(&detect)),
        fmt_ms(max(&detect))
    )];
    if !watchdog_slack.is_empty() {
        notes.push(format!(
            "failclosed: lead-exec's own log (`slack_ms` = its deadline D − the job's death, as \
             its watchdog saw it): {}.",
            watchdog_slack
                .iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !expiry_after_death.is_empty() {
        notes.push(format!(
            "failclosed: etcd actually deleted lead-exec's key {:.2} s (median; min {:.2} s) \
             after the job was dead (etcd sweeps expired leases every 500 ms).",
            median(&expiry_after_death),
            min(&expiry_after_death)
        ));
    }
    if !ctl_expired_at.is_empty() {
        notes.push(format!(
            "failclosed: etcdctl lock's key expired on the server {:.2} s after the blackhole \
             (median) while its job kept running ({ctl_alive}/{n} still alive at TTL + 2 s): a \
             second worker could take the lock and run the job concurrently.",
            median(&ctl_expired_at)
        ));
    }
    Ok(Report { rows, notes })
}

/// How long after kill(SIGKILL) of a job's process group the harness sees its FIFO close, in
/// ms: the resolution of every "job dead" time here.
pub(crate) fn kill_detect_latency(cx: &Cx) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    for _ in 0..10 {
        let mut f = cx.fifo(false)?;
        let mut job = Command::new("sh")
            .args(["-c", &job_script(&f.path, "echo term >&3")])
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()?;
        let pg = job.id() as i32;
        reap::add(pg);
        f.line(Duration::from_secs(5))?;
        let t0 = Instant::now();
        // SAFETY: kill(2) on the group just created.
        unsafe { libc::kill(-pg, libc::SIGKILL) };
        let t1 = f.wait_eof(Duration::from_secs(5));
        let _ = job.wait();
        reap::remove(pg);
        v.push(ms(t1.context("job FIFO never closed")? - t0));
    }
    Ok(v)
}
