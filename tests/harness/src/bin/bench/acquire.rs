//! `acquire`: uncontended acquire, command started → job running.

use std::time::{Duration, Instant};

use anyhow::Result;
use harness::measure::report::{yes_no, Report, Row};
use harness::measure::stats::{fmt_ms, median, ms, p99, summary_ms, summary_p};
use harness::measure::worker::{Tool, WorkerSpec, TOOLS};
use harness::FAST;

use super::Cx;

/// Uncontended acquire: from spawning the command to the job's first write.
pub(crate) fn acquire(cx: &Cx) -> Result<Report> {
    let n = cx.n(200, 20);
    let with_diagnostic = !cx.lean;
    // One unmeasured run each fills the page cache and etcd's first-use paths.
    for t in TOOLS {
        acquire_once(cx, t, &[])?;
    }
    let mut samples: [Vec<f64>; 2] = [vec![], vec![]];
    let mut no_cgroup = Vec::new();
    for _ in 0..n {
        for t in TOOLS {
            samples[t.idx()].push(acquire_once(cx, t, &[])?);
        }
        // Diagnostic: lead-exec without a job cgroup, to show what moving the job costs.
        if with_diagnostic {
            no_cgroup.push(acquire_once(cx, Tool::LeadExec, &["--cgroup", "off"])?);
        }
    }
    let (le, ctl) = (&samples[0], &samples[1]);
    let goal_ok = median(le) <= median(ctl) / 2.0;
    let mut rows = vec![
        Row::new(
            "acquire",
            &format!("command started → job running, median (p10–p90), n={n}"),
            summary_p(le),
            summary_p(ctl),
            "≤ ½ etcdctl median",
            yes_no(goal_ok),
        ),
        Row::new(
            "acquire",
            "same, p99",
            format!("{} ms", fmt_ms(p99(le))),
            format!("{} ms", fmt_ms(p99(ctl))),
            "",
            "",
        ),
    ];
    if !with_diagnostic {
        return Ok(Report {
            rows,
            notes: vec![
                "acquire: job = `sh -c 'echo ok > FIFO'`; clock from just before spawn() \
                 of the wrapper to the harness reading the job's line."
                    .to_string(),
            ],
        });
    }
    rows.push(Row::new(
        "acquire",
        "diagnostic: lead-exec `--cgroup off`, median (min–max)",
        summary_ms(&no_cgroup),
        "–".into(),
        "",
        "",
    ));
    let notes = vec![format!(
        "acquire: job = `sh -c 'echo ok > FIFO'`; clock from just before spawn() of the wrapper \
         to the harness reading the job's line. Default `--cgroup auto` moves the job into a \
         fresh cgroup v2 before exec; the `--cgroup off` row isolates that cost ({} ms median \
         difference).",
        fmt_ms(median(le) - median(&no_cgroup))
    )];
    Ok(Report { rows, notes })
}

pub(crate) fn acquire_once(cx: &Cx, tool: Tool, extra: &[&str]) -> Result<f64> {
    let mut fifo = cx.fifo(false)?;
    let election = cx.unique("acq");
    let script = format!("echo ok > \"{}\"", fifo.path.display());
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend_from_slice(extra);
    let spec = WorkerSpec {
        lead_exec_args: &args,
        ..WorkerSpec::fast(tool, &election, &cx.etcd.endpoint, "a", &script)
    };
    let t0 = Instant::now();
    let mut w = cx.spawn(spec)?;
    let (_, t1) = fifo.line(Duration::from_secs(10))?;
    w.wait_exit(Duration::from_secs(10));
    Ok(ms(t1 - t0))
}
