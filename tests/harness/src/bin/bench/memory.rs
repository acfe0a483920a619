//! `memory`: peak RSS of the wrapper processes, and what a waiting candidate keeps.

use std::fs::OpenOptions;
use std::io::Write;
use std::thread;
use std::time::Duration;

use anyhow::Result;
use harness::measure::report::{yes_no, Report, Row};
use harness::measure::stats::median;
use harness::measure::worker::{private_kib, pss_kib, status_kib, Tool, WorkerSpec, TOOLS};

use super::{pids, Cx};

/// Peak RSS of the wrapper processes while the job runs.
pub(crate) fn memory(cx: &Cx) -> Result<Report> {
    let n = cx.n(5, 2);
    let mut hwm: [Vec<f64>; 2] = [vec![], vec![]];
    let mut pss: [Vec<f64>; 2] = [vec![], vec![]];
    let mut split: Vec<(f64, f64)> = Vec::new();
    // One of the candidates waiting behind the running job: (PSS, private, and lead-exec's
    // next in line's PSS).
    let mut waiting: [Vec<(f64, f64, Option<f64>)>; 2] = [vec![], vec![]];
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
            waiting[t.idx()].push(waiting_candidate(cx, t, &election)?);
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
    let wait = |i: usize| {
        let p: Vec<f64> = waiting[i].iter().map(|w| w.0).collect();
        let u: Vec<f64> = waiting[i].iter().map(|w| w.1).collect();
        (median(&p), median(&u))
    };
    let (wl, wc) = (wait(0), wait(1));
    let next: Vec<f64> = waiting[0].iter().filter_map(|w| w.2).collect();
    let rows = vec![
        Row::new(
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
        ),
        Row::new(
            "memory",
            &format!("one of {WAITING} waiting candidates (its watchdog included, if it has one): PSS (private), median, n={n}"),
            format!("{:.2} MiB ({:.2} MiB)", wl.0, wl.1),
            format!("{:.2} MiB ({:.2} MiB)", wc.0, wc.1),
            "PSS ≤ 1 MiB",
            yes_no(wl.0 <= 1.0),
        ),
        Row::new(
            "memory",
            &format!("the next in line of the {WAITING}, with the watchdog it keeps standing by: PSS, median"),
            if next.is_empty() {
                "none had a watchdog".to_string()
            } else {
                format!("{:.2} MiB", median(&next))
            },
            "–".to_string(),
            "",
            "",
        ),
    ];
    let notes =
        vec![format!(
        "memory: VmHWM read from /proc/PID/status 1.5 s after the job started, while it still \
         runs; lead-exec = the lead-exec process + its watchdog (the job's parent), etcdctl = \
         the etcdctl process. The sum counts shared pages of the binary twice; proportional \
         set size (Pss, smaps_rollup) at the same moment: lead-exec {:.1} MiB, etcdctl {:.1} MiB.",
        median(&pss[0]),
        median(&pss[1])
    ), "memory: waiting candidates are ten more workers on the same election, read 1.5 s after \
         their keys are in line, beside the running one (the binary's pages shared between the \
         eleven and their watchdogs, as on a host that runs one per job it can take); of \
         lead-exec's, only the next in line keeps a watchdog standing by; private = \
         Private_Clean + Private_Dirty, what one costs whatever else runs.".to_string()];
    Ok(Report { rows, notes })
}

/// How many candidates wait behind the running job: a host that runs one per job it can take
/// shares the binary's pages between them all, as PSS counts.
const WAITING: usize = 10;

/// [`WAITING`] more candidates of `election`'s, waiting behind the running job: (PSS,
/// private) in MiB of one of them (the median of the ten), its watchdog included if it has
/// one, and the PSS of lead-exec's next in line, the one that keeps a watchdog standing by.
/// They are stopped before the job is released.
fn waiting_candidate(cx: &Cx, t: Tool, election: &str) -> Result<(f64, f64, Option<f64>)> {
    let mut workers = Vec::new();
    for i in 0..WAITING {
        let id = format!("w{i}");
        workers.push(cx.spawn(WorkerSpec::fast(
            t,
            election,
            &cx.etcd.endpoint,
            &id,
            "true",
        ))?);
    }
    cx.wait_keys(
        &t.prefix(election),
        WAITING as u64 + 1,
        Duration::from_secs(20),
    )?;
    thread::sleep(Duration::from_millis(1500));
    let (mut pss, mut private) = (Vec::new(), Vec::new());
    let mut next = None;
    for w in &workers {
        let mut procs = vec![w.pid()];
        let children = harness::children(w.pid());
        let has_watchdog = !children.is_empty();
        procs.extend(children);
        let p = procs.iter().map(|p| pss_kib(*p).unwrap_or(0)).sum::<u64>() as f64 / 1024.0;
        pss.push(p);
        private.push(
            procs
                .iter()
                .map(|p| private_kib(*p).unwrap_or(0))
                .sum::<u64>() as f64
                / 1024.0,
        );
        if has_watchdog && t == Tool::LeadExec {
            next = Some(p);
        }
    }
    for w in &workers {
        w.signal(libc::SIGTERM);
    }
    for mut w in workers {
        w.wait_exit(Duration::from_secs(10));
    }
    Ok((median(&pss), median(&private), next))
}
