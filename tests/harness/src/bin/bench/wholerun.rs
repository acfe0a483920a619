//! `wholerun`: a whole cron-style run, process start → exit, split into phases.

use std::fs;
use std::time::{Duration, Instant};

use anyhow::Result;
use harness::measure::report::{yes_no, Report, Row};
use harness::measure::stats::{fmt_ms, median, ms, summary_p};
use harness::measure::worker::{Tool, WorkerSpec, TOOLS};

use super::Cx;

/// A whole cron-style run: process start → exit, `-- true` as the job.
pub(crate) fn wholerun(cx: &Cx) -> Result<Report> {
    let n = cx.n(100, 5);
    for t in TOOLS {
        wholerun_once(cx, t, None, true)?;
    }
    let mut total: [Vec<f64>; 2] = [vec![], vec![]];
    let mut phases: Vec<[f64; 5]> = Vec::new();
    for _ in 0..n {
        for t in TOOLS {
            let (ms_total, p) = wholerun_once(cx, t, None, true)?;
            total[t.idx()].push(ms_total);
            if let Some(p) = p {
                phases.push(p);
            }
        }
    }
    let (le, ctl) = (&total[0], &total[1]);
    let ratio = median(le) / median(ctl);
    let goal = cx.whole_run_goal;
    let phase = |k: usize| median(&phases.iter().map(|p| p[k]).collect::<Vec<_>>());
    let rows = vec![
        Row::new(
            "whole run",
            &format!("`run X -- true`: process start → exit, median (p10–p90), n={n}"),
            summary_p(le),
            summary_p(ctl),
            &goal.map_or("none here".into(), |g| format!("≤ {g:.2}× etcdctl")),
            &match goal {
                Some(g) => format!("{} ({ratio:.2}×)", yes_no(ratio <= g)),
                None => format!("{ratio:.2}×"),
            },
        ),
        Row::new(
            "whole run",
            "lead-exec by phase, medians: start → elected / → job started / job / → term ended / → exit",
            format!(
                "{} / {} / {} / {} / {} ms",
                fmt_ms(phase(0)),
                fmt_ms(phase(1)),
                fmt_ms(phase(2)),
                fmt_ms(phase(3)),
                fmt_ms(phase(4))
            ),
            "–".into(),
            "",
            "",
        ),
    ];
    let notes = vec![
        "whole run: both tools run `sh -c true`; clock from just before spawn() to the wrapper's \
         exit. Phases come from lead-exec's own log timestamps (wall clock, the harness's too): \
         process start → \"elected\" (connect, lease grant, creating transaction), → \"job \
         started\" (run-key check, watchdog, fork+exec), the job until \"job ended\" (as the \
         watchdog reports it), → the \"done\" transition, → exit (the history end record and \
         the key's release in one commit, teardown)."
            .to_string(),
    ];
    Ok(Report { rows, notes })
}

/// One whole run: total ms, and with `split` lead-exec's phases from its log.
pub(crate) fn wholerun_once(
    cx: &Cx,
    tool: Tool,
    setup: Option<&dyn Fn(&mut std::process::Command)>,
    split: bool,
) -> Result<(f64, Option<[f64; 5]>)> {
    let election = cx.unique("whole");
    // -v: the steps ("campaigning -> elected", "leading -> done") are debug lines. Without
    // the split, the run an operator makes: default verbosity.
    let verbose: &[&str] = if split { &["-v"] } else { &[] };
    let args = [&harness::FAST[..], verbose].concat();
    let spec = WorkerSpec {
        lead_exec_args: &args,
        setup,
        ..WorkerSpec::fast(tool, &election, &cx.etcd.endpoint, "w", "true")
    };
    let wall0 = std::time::SystemTime::now();
    let t0 = Instant::now();
    let mut w = cx.spawn(spec)?;
    w.wait_exit(Duration::from_secs(10));
    let total = ms(t0.elapsed());
    let wall1 = wall0 + t0.elapsed();
    if tool != Tool::LeadExec || !split {
        return Ok((total, None));
    }
    let log = fs::read_to_string(&w.log)?;
    let at = |needle: &str| -> Option<std::time::SystemTime> {
        let line = log.lines().find(|l| l.contains(needle))?;
        humantime::parse_rfc3339(line.split_whitespace().next()?).ok()
    };
    let since = |a: std::time::SystemTime, b: std::time::SystemTime| {
        b.duration_since(a).map(ms).unwrap_or(0.0)
    };
    let (Some(e), Some(s), Some(x), Some(d)) = (
        at("-> elected on"),
        at("job started"),
        at("job ended"),
        at("leading -> done"),
    ) else {
        return Ok((total, None));
    };
    Ok((
        total,
        Some([
            since(wall0, e),
            since(e, s),
            since(s, x),
            since(x, d),
            since(d, wall1),
        ]),
    ))
}
