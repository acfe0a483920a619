//! `handover`: SIGTERM to the leader → the standby's job running.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;
use harness::measure::report::{yes_no, Report, Row};
use harness::measure::stats::{fmt_ms, median, ms, summary_ms};
use harness::measure::worker::{Tool, TOOLS};

use super::{pids, start_pair, Cx, Pair, TTL};

/// Graceful handover: SIGTERM to the leader's wrapper → the standby's job running.
pub(crate) fn handover(cx: &Cx) -> Result<Report> {
    let n = cx.n(20, 5);
    let limit = TTL + Duration::from_secs(3);
    let mut samples: [Vec<f64>; 2] = [vec![], vec![]];
    let mut stop_ms = Vec::new(); // lead-exec: SIGTERM → old job dead
    let mut ctl_stuck = 0usize; // etcdctl: wrapper and job both still running at the timeout
    let mut overlap = [0usize; 2]; // new job started while the old one still ran
    let mut timeouts = 0usize;
    for _ in 0..n {
        for t in TOOLS {
            if t == Tool::Etcdctl && timeouts >= 2 {
                continue; // established: it does not hand over; save the time
            }
            let election = cx.unique("hand");
            let Pair {
                mut a,
                mut b,
                fa,
                mut fb,
            } = start_pair(cx, t, &election, "exit 0")?;
            // A's job death is watched on a thread, so its time is exact even if it comes
            // after B's start.
            let a_dead = thread::spawn(move || {
                let mut fa = fa;
                fa.wait_eof(Duration::from_secs(30))
            });
            let t0 = Instant::now();
            a.signal(libc::SIGTERM);
            let got = fb.line(limit);
            if let Ok((line, _)) = &got {
                b.adopt_job(pids(line)?.0);
            }
            let (a_running, t_kill) = (a.running(), Instant::now());
            // Now kill everything; an etcdctl job that outlived its wrapper's SIGTERM dies here.
            a.kill_all();
            b.kill_all();
            let a_death = a_dead.join().ok().flatten();
            match got {
                Ok((_, t1)) => {
                    samples[t.idx()].push(ms(t1 - t0));
                    if a_death.is_none_or(|d| d > t1) {
                        overlap[t.idx()] += 1;
                    }
                    if t == Tool::LeadExec {
                        if let Some(d) = a_death {
                            stop_ms.push(ms(d - t0));
                        }
                    }
                }
                Err(_) if t == Tool::Etcdctl => {
                    timeouts += 1;
                    if a_running && a_death.is_none_or(|d| d >= t_kill) {
                        ctl_stuck += 1;
                    }
                }
                Err(e) => return Err(anyhow::Error::from(e).context("lead-exec handover")),
            }
        }
    }
    let (le, ctl) = (&samples[0], &samples[1]);
    let ctl_cell = if ctl.is_empty() {
        format!(
            "n/a (does not hand over: no takeover within {limit:?}, {timeouts}/{timeouts} runs)"
        )
    } else {
        summary_ms(ctl)
    };
    let mut notes = vec![format!(
        "handover: job = `trap \"exit 0\" TERM; … sleep & wait` (exits at once on TERM). \
         lead-exec: SIGTERM → old job dead {} ms, old job dead → new job running {} ms (medians).",
        fmt_ms(median(&stop_ms)),
        fmt_ms(median(le) - median(&stop_ms))
    )];
    if ctl.is_empty() {
        notes.push(format!(
            "handover: `etcdctl lock` with a command catches SIGTERM but only cancels its \
             lock-acquire context: it neither forwards the signal nor releases the lock, so the \
             job and the lock stay put until the job ends by itself (here: etcdctl and its job \
             both still running {limit:?} after the SIGTERM in {ctl_stuck}/{timeouts} runs)."
        ));
    }
    let rows = vec![
        Row::new(
            "handover",
            &format!(
                "SIGTERM to leader → standby's job running, median (min–max), n={}",
                le.len()
            ),
            summary_ms(le),
            ctl_cell,
            "< 100 ms",
            yes_no(median(le) < 100.0),
        ),
        Row::new(
            "handover",
            "new job started while the old one still ran",
            format!("{}/{}", overlap[0], le.len()),
            if ctl.is_empty() {
                "–".into()
            } else {
                format!("{}/{}", overlap[1], ctl.len())
            },
            "0",
            yes_no(overlap[0] == 0),
        ),
    ];
    Ok(Report { rows, notes })
}
