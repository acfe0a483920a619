//! `memory`: peak RSS of the wrapper processes.

use std::fs::OpenOptions;
use std::io::Write;
use std::thread;
use std::time::Duration;

use anyhow::Result;
use harness::measure::report::{yes_no, Report, Row};
use harness::measure::stats::median;
use harness::measure::worker::{pss_kib, status_kib, Tool, WorkerSpec, TOOLS};

use super::{pids, Cx};

/// Peak RSS of the wrapper processes while the job runs.
pub(crate) fn memory(cx: &Cx) -> Result<Report> {
    let n = cx.n(5, 2);
    let mut hwm: [Vec<f64>; 2] = [vec![], vec![]];
    let mut pss: [Vec<f64>; 2] = [vec![], vec![]];
    let mut split: Vec<(f64, f64)> = Vec::new();
    for _ in 0..n {
        for t in TOOLS {
            let mut f = cx.fifo(false)?;
            let release = cx.fifo(false)?; // created by us, opened by the job
            let script = format!(
                "echo \"$$ $PPID\" > \"{}\"; read x < \"{}\"",
                f.path.display(),
                release.path.display()
            );
            let election = cx.unique("mem");
            let mut w = cx.spawn(WorkerSpec::fast(
                t,
                &election,
                &cx.etcd.endpoint,
                "a",
                &script,
            ))?;
            let (line, _) = f.line(Duration::from_secs(10))?;
            let (job, parent) = pids(&line)?;
            w.adopt_job(job);
            // Let a keepalive round or so happen (interval TTL/3 = 1 s) so the peak includes it.
            thread::sleep(Duration::from_millis(1500));
            let wrapper: Vec<i32> = match t {
                Tool::LeadExec => vec![w.pid(), parent], // lead-exec, and its watchdog
                Tool::Etcdctl => {
                    if parent == w.pid() {
                        vec![w.pid()]
                    } else {
                        vec![w.pid(), parent]
                    }
                }
            };
            let k: Vec<u64> = wrapper
                .iter()
                .map(|p| status_kib(*p, "VmHWM:"))
                .collect::<std::io::Result<_>>()?;
            let p: u64 = wrapper.iter().map(|p| pss_kib(*p).unwrap_or(0)).sum();
            hwm[t.idx()].push(k.iter().sum::<u64>() as f64 / 1024.0);
            pss[t.idx()].push(p as f64 / 1024.0);
            if t == Tool::LeadExec {
                split.push((k[0] as f64 / 1024.0, k[1] as f64 / 1024.0));
            }
            // Let the job end normally, as it would in production.
            OpenOptions::new()
                .write(true)
                .open(&release.path)?
                .write_all(b"done\n")?;
            w.wait_exit(Duration::from_secs(10));
        }
    }
    let (le, ctl) = (&hwm[0], &hwm[1]);
    let sl: Vec<f64> = split.iter().map(|s| s.0).collect();
    let sw: Vec<f64> = split.iter().map(|s| s.1).collect();
    let rows = vec![Row::new(
        "memory",
        &format!("peak RSS (VmHWM) of the wrapper processes, median, n={n}"),
        format!(
            "{:.1} MiB (lead-exec {:.1} + watchdog {:.1})",
            median(le),
            median(&sl),
            median(&sw)
        ),
        format!("{:.1} MiB", median(ctl)),
        "≤ ½ etcdctl",
        yes_no(median(le) <= median(ctl) / 2.0),
    )];
    let notes = vec![format!(
        "memory: VmHWM read from /proc/PID/status 1.5 s after the job started, while it still \
         runs; lead-exec = the lead-exec process + its watchdog (the job's parent), etcdctl = \
         the etcdctl process. The sum counts shared pages of the binary twice; proportional \
         set size (Pss, smaps_rollup) at the same moment: lead-exec {:.1} MiB, etcdctl {:.1} MiB.",
        median(&pss[0]),
        median(&pss[1])
    )];
    Ok(Report { rows, notes })
}
