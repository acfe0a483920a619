//! `counts`: what one uncontended whole run asks of etcd, from etcd's own `/metrics`:
//! requests by gRPC method (`grpc_server_started_total`) and raft commits
//! (`etcd_server_proposals_committed_total`), before and after each tool's run.
//!
//! And `cpu`: the CPU time of one whole run, every process of it counted (the wrapper, its
//! watchdog, the job), from a cgroup that the run starts in. A run of its own: moving a
//! process into a cgroup costs milliseconds of wall time, which would blur the timed runs.
//! The bare client process of `floor` runs beside the tools, so that the report says how
//! much of lead-exec's CPU any wrapper on etcd-client would spend.

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use harness::measure::report::{Report, Row};
use harness::measure::stats::{fmt_ms, summary_p};
use harness::measure::worker::{self, Tool, TOOLS};

use super::floor::bare_run;
use super::wholerun::wholerun_once;
use super::Cx;

pub(crate) fn counts(cx: &Cx) -> Result<Report> {
    let runs = cx.n(5, 2);
    // Per tool, the counts of each measured run.
    let mut seen: [Vec<BTreeMap<String, f64>>; 2] = [vec![], vec![]];
    for t in TOOLS {
        wholerun_once(cx, t, None, false)?;
    }
    for _ in 0..runs {
        for t in TOOLS {
            // The lease the warm-up or the last run left behind expires on its own, and etcd
            // counts that as a commit: wait for quiet, then count.
            let before = quiet(cx)?;
            wholerun_once(cx, t, None, false)?;
            // What the wrapper sent is applied once it exits; anything still in flight lands
            // within a few milliseconds.
            thread::sleep(Duration::from_millis(300));
            let after = cx.etcd.requests()?;
            let d: BTreeMap<String, f64> = after
                .iter()
                .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v != 0.0)
                .collect();
            seen[t.idx()].push(d);
        }
    }
    let show = |runs: &[BTreeMap<String, f64>], key: Option<&str>| -> String {
        let vals = |k: &str| -> Vec<f64> {
            runs.iter()
                .map(|r| r.get(k).copied().unwrap_or(0.0))
                .collect()
        };
        let range = |v: Vec<f64>| {
            let (lo, hi) = (
                v.iter().copied().fold(f64::INFINITY, f64::min),
                v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            );
            if lo == hi {
                format!("{lo}")
            } else {
                // How often the most: a request or commit made only in some runs.
                let most = v.iter().filter(|x| **x == hi).count();
                format!("{lo}–{hi} ({hi} in {most} of {})", v.len())
            }
        };
        match key {
            Some(k) => range(vals(k)),
            None => {
                let mut methods: Vec<&String> = runs
                    .iter()
                    .flat_map(|r| r.keys())
                    .filter(|k| *k != "commits")
                    .collect();
                methods.sort();
                methods.dedup();
                let parts: Vec<String> = methods
                    .iter()
                    .map(|m| format!("{} {m}", range(vals(m))))
                    .collect();
                let total: Vec<f64> = runs
                    .iter()
                    .map(|r| {
                        r.iter()
                            .filter(|(k, _)| *k != "commits")
                            .map(|(_, v)| v)
                            .sum()
                    })
                    .collect();
                format!("{} ({})", range(total), parts.join(", "))
            }
        }
    };
    let rows = vec![
        Row::new(
            "counts",
            &format!("requests per uncontended whole run, by gRPC method ({runs} runs)"),
            show(&seen[0], None),
            show(&seen[1], None),
            "",
            "",
        ),
        Row::new(
            "counts",
            "raft commits (proposals committed) per run",
            show(&seen[0], Some("commits")),
            show(&seen[1], Some("commits")),
            "≤ 3",
            if seen[0]
                .iter()
                .all(|r| r.get("commits").copied().unwrap_or(0.0) <= 3.0)
            {
                "yes"
            } else {
                "**no**"
            },
        ),
    ];
    let notes = vec![
        "counts: etcd's `grpc_server_started_total` by method (a stream counts once, when it \
         opens) and `etcd_server_proposals_committed_total`, read before and 300 ms after each \
         tool's `run X -- true`, one tool at a time on a quiet etcd."
            .to_string(),
    ];
    Ok(Report { rows, notes })
}

/// The counters once no lease is left to expire (a lease left behind expires in a commit of
/// its own) and they have held still for a while.
fn quiet(cx: &Cx) -> Result<BTreeMap<String, f64>> {
    for _ in 0..200 {
        if !cx
            .etcd
            .http("POST", "/v3/lease/leases", "{}")?
            .contains("\"ID\"")
        {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let mut last = cx.etcd.requests()?;
    for _ in 0..100 {
        thread::sleep(Duration::from_millis(400));
        let now = cx.etcd.requests()?;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    bail!("etcd's counters never held still")
}

pub(crate) fn cpu(cx: &Cx) -> Result<Report> {
    let n = cx.n(100, 10);
    // lead-exec, etcdctl, and the bare etcd-client process.
    let mut samples: [Vec<f64>; 3] = [vec![], vec![], vec![]];
    let subjects = [Some(TOOLS[0]), Some(TOOLS[1]), None];
    for s in subjects {
        cpu_once(cx, s)?;
    }
    for _ in 0..n {
        for (i, s) in subjects.into_iter().enumerate() {
            samples[i].push(cpu_once(cx, s)?);
        }
    }
    let [le, ctl, bare] = &samples;
    let m = |v: &[f64]| harness::measure::stats::median(v);
    let ratio = m(le) / m(ctl);
    let rows = vec![
        Row::new(
            "cpu",
            &format!("CPU per whole run, every process (cgroup), median (p10–p90), n={n}"),
            summary_p(le),
            summary_p(ctl),
            "≤ 0.30× etcdctl",
            &format!(
                "{} ({ratio:.2}×)",
                harness::measure::report::yes_no(ratio <= 0.30)
            ),
        ),
        Row::new(
            "cpu",
            &format!(
                "diagnostic: a bare etcd-client process's whole run (start, connect, lease grant, \
                 creating txn, `sh -c true`, revoke; no watchdog), every process (cgroup), median \
                 (p10–p90), n={n}"
            ),
            format!(
                "{}; lead-exec is {:.2}× it",
                summary_p(bare),
                m(le) / m(bare)
            ),
            format!("{:.2}× etcdctl", m(bare) / m(ctl)),
            "",
            "",
        ),
    ];
    let notes = vec![format!(
        "cpu: user+system time of every process of one `run X -- true` at default verbosity \
         (wrapper, watchdog, `sh -c true`), from cpuacct.usage of a cgroup v1 (or cpu.stat of a \
         v2 one) that the wrapper starts in; medians {} against {} ms. The bare client is the \
         bench binary re-executed, as in `floor`: a current-thread runtime and etcd-client \
         making three commits as a run does (grant, creating transaction, and a revoke where \
         lead-exec closes with a transaction), and the job; what lead-exec spends beyond it is \
         its watchdog, the job's cgroup, argument parsing, logging, its pre-run checks and \
         records, and their requests.",
        fmt_ms(m(le)),
        fmt_ms(m(ctl))
    )];
    Ok(Report { rows, notes })
}

/// One whole run started in a fresh cgroup: of `tool`, or of the bare client process
/// (`None`); its CPU time in ms once every process is gone.
fn cpu_once(cx: &Cx, tool: Option<Tool>) -> Result<f64> {
    let dir = SampleCgroup::create(cgroup_root()?.join(cx.unique("lead-exec-bench-cpu")))?;
    let procs = fs::OpenOptions::new()
        .write(true)
        .open(dir.0.join("cgroup.procs"))?;
    let fd = procs.as_raw_fd();
    let enter = move |cmd: &mut std::process::Command| {
        // SAFETY: write(2) to a descriptor opened before the fork: async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    };
    let r = match tool {
        Some(t) => wholerun_once(cx, t, Some(&enter), false).map(drop),
        None => bare_run(cx, "true", &enter),
    };
    drop(procs);
    // The watchdog or the job may outlive the wrapper by a moment; a sample taken while one
    // still runs would miss the rest of its CPU.
    let mut left = String::new();
    for _ in 0..500 {
        left = fs::read_to_string(dir.0.join("cgroup.procs")).unwrap_or_default();
        if left.trim().is_empty() {
            break;
        }
        thread::sleep(Duration::from_millis(2));
    }
    r?;
    if !left.trim().is_empty() {
        for pid in left
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: kill(2) of a process in the cgroup this sample made.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        bail!(
            "processes of the run still in {} 1 s after it: {}",
            dir.0.display(),
            left.split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
    usage_ms(&dir.0)
}

/// The cgroup of one sample, removed on every way out (it can be, once its members are gone).
struct SampleCgroup(PathBuf);

impl SampleCgroup {
    fn create(dir: PathBuf) -> Result<SampleCgroup> {
        fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        Ok(SampleCgroup(dir))
    }
}

impl Drop for SampleCgroup {
    fn drop(&mut self) {
        worker::remove_cgroup(&self.0);
    }
}

fn cgroup_root() -> Result<PathBuf> {
    for d in [
        "/sys/fs/cgroup/cpuacct",
        "/sys/fs/cgroup/cpu,cpuacct",
        "/sys/fs/cgroup",
    ] {
        let p = PathBuf::from(d);
        if p.join("cpuacct.usage").exists() || p.join("cgroup.subtree_control").exists() {
            return Ok(p);
        }
    }
    bail!("no cgroup with CPU accounting found (cpuacct v1 or a cgroup v2 mount)")
}

fn usage_ms(dir: &std::path::Path) -> Result<f64> {
    if let Ok(ns) = fs::read_to_string(dir.join("cpuacct.usage")) {
        return Ok(ns.trim().parse::<f64>()? / 1e6);
    }
    let stat = fs::read_to_string(dir.join("cpu.stat"))?;
    let us = stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .context("cpu.stat without usage_usec")?;
    Ok(us.trim().parse::<f64>()? / 1e3)
}
