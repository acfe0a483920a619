//! `crash`: SIGKILL of the leader's whole worker → the standby's job running.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use harness::measure::report::{yes_no, Report, Row};
use harness::measure::stats::{max, median, min, random_below};
use harness::measure::worker::TOOLS;

use super::{pids, start_pair, Cx, TTL};

/// Crash failover: SIGKILL of the leader's wrapper, watchdog and job → the standby's job running.
/// The lease is left to expire on the server.
pub(crate) fn crash(cx: &Cx) -> Result<Report> {
    let n = cx.n(10, 3);
    let limit = TTL * 2 + Duration::from_secs(3);
    let mut s: [Vec<f64>; 2] = [vec![], vec![]];
    for _ in 0..n {
        for t in TOOLS {
            let election = cx.unique("crash");
            let mut p = start_pair(cx, t, &election, "exit 0")?;
            // Land the crash at a random point of the keepalive cycle (both tools renew every
            // TTL/3), as a real crash would; otherwise every kill would follow a fresh grant.
            thread::sleep(random_below(TTL / 3));
            let t0 = Instant::now();
            p.a.kill_all();
            let (line, t1) =
                p.fb.line(limit)
                    .with_context(|| format!("{}: no takeover after crash", t.name()))?;
            p.b.adopt_job(pids(&line)?.0);
            s[t.idx()].push((t1 - t0).as_secs_f64());
            drop(p);
        }
    }
    let ttl = TTL.as_secs_f64();
    let cell = |v: &[f64]| {
        format!(
            "{:.2} s = {:.2} TTL ({:.2}–{:.2})",
            median(v),
            median(v) / ttl,
            min(v),
            max(v)
        )
    };
    let goal = ttl + 0.6;
    let rows = vec![Row::new(
        "crash",
        &format!("SIGKILL leader's process groups → standby's job running, median (min–max), n={n}, TTL 3 s"),
        cell(&s[0]),
        cell(&s[1]),
        &format!("≤ TTL + 0.6 s = {goal:.1} s"),
        yes_no(median(&s[0]) <= goal),
    )];
    let notes = vec![format!(
        "crash: the kill lands at a uniformly random point of the keepalive cycle, so the \
         leader's lease was last renewed 0–1 s (TTL/3) before it, and etcd revokes expired \
         leases in a sweep every 500 ms: expect TTL − 1 s … TTL + 0.5 s for both tools. \
         lead-exec max {:.2} s vs goal {goal:.1} s.",
        max(&s[0])
    )];
    Ok(Report { rows, notes })
}
