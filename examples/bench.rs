//! Benchmarks lead-exec against `etcdctl lock` on one throwaway etcd.
//!
//! ```text
//! cargo run --release --example bench -- [--quick] [--keep-logs] [--candidates N] [--scenario NAME[,NAME...]]
//! ```
//!
//! `--keep-logs` keeps the temporary directory with every wrapper's stderr and etcd's log.
//!
//! Scenarios (each runs both tools on the same etcd, alternating runs, fresh election per run):
//!
//! - `acquire`: uncontended acquire, command started → job running.
//! - `handover`: SIGTERM to the leader → the standby's job running.
//! - `crash`: SIGKILL of the leader's whole worker → the standby's job running.
//! - `failclosed`: etcd becomes unreachable (a blackholing proxy) → how long the job lives on,
//!   compared with the earliest moment the server can expire the lease.
//! - `memory`: peak RSS of the wrapper processes.
//! - `scale`: 100 candidates (`--candidates N`) on one election: failover time, etcd requests
//!   per second while they wait, and the candidates' total RSS.
//! - `wholerun`: a whole cron-style run, `run X -- true` against `etcdctl lock X -- true`, from
//!   process start to exit, with lead-exec's time split into phases from its own log.
//! - `capacity`: what waiting candidates cost etcd (requests/s, watches, server memory per
//!   candidate, from etcd's own `/metrics`), etcd's write capacity here, and how many candidates
//!   one etcd serves before keepalives take a tenth of it.
//! - `floor`: the physical limit of an acquire on this etcd: a bare client's lease grant and
//!   creating transaction (two raft commits) plus a fork+exec, against lead-exec's acquire;
//!   and, to show where the rest goes, the same commits on a fresh connection and a bare
//!   client process (this binary re-executed) that starts, connects, commits both and starts
//!   the job.
//!
//! Every job writes to a FIFO that the harness polls, so "job running" is the moment the job's
//! first write arrives and "job dead" is the EOF seen once the last process of the job has
//! closed it: the harness synchronises on events, not on sleeps. It is a benchmark, not a test:
//! slow numbers are reported, never asserted. Everything it starts runs in a process group of
//! its own and is SIGKILLed on the way out, on success, error, panic or Ctrl-C.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use harness::FAST;

/// Lease settings for every scenario but `scale`: the tests' fast ones (`harness::FAST`),
/// TTL 3 s with grace and margin 0.5 s. `etcdctl lock --ttl 3` matches the TTL.
const TTL: Duration = Duration::from_secs(3);
const MARGIN: Duration = Duration::from_millis(500);
/// `scale` uses lead-exec's default TTL, so that the idle keepalive rate is the production one.
const SCALE_TTL_S: u64 = 10;
const SCENARIOS: [&str; 9] = [
    "acquire",
    "handover",
    "crash",
    "failclosed",
    "memory",
    "scale",
    "wholerun",
    "floor",
    "capacity",
];
/// lead-exec's default grace and safety margin: with `SCALE_TTL_S` they give the default
/// keepalive interval, (TTL − grace − margin)/3.
const DEFAULT_GRACE_S: u64 = 3;
const DEFAULT_MARGIN_S: u64 = 1;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(FLOOR_PROCESS) {
        return floor_process(&argv[2..]);
    }
    reap::install();
    let mut quick = false;
    let mut keep_logs = false;
    let mut only: Option<Vec<String>> = None;
    let mut candidates = 100usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--keep-logs" => keep_logs = true,
            "--candidates" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n >= 4 => candidates = n,
                _ => return usage(),
            },
            "--scenario" => match args.next() {
                Some(s) => only = Some(s.split(',').map(str::to_string).collect()),
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    if let Some(names) = &only {
        if names.iter().any(|n| !SCENARIOS.contains(&n.as_str())) {
            return usage();
        }
    }
    let result = run(quick, keep_logs, candidates, only);
    reap::kill_all();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: cargo run --release --example bench -- [--quick] [--keep-logs] [--candidates N] [--scenario {}]",
        SCENARIOS.join("|")
    );
    ExitCode::from(2)
}

fn run(quick: bool, keep_logs: bool, candidates: usize, only: Option<Vec<String>>) -> Result<()> {
    let bin = lead_exec_binary()?;
    let mut dir = tempfile::Builder::new()
        .prefix("lead-exec-bench-")
        .tempdir()?;
    if keep_logs {
        dir.disable_cleanup(true);
        eprintln!("logs (kept): {}/logs", dir.path().display());
    }
    fs::create_dir_all(dir.path().join("logs"))?;
    print_header(&bin, quick);
    let etcd = Etcd::start(dir.path())?;
    let cx = Cx {
        bin,
        etcd,
        dir: dir.path().to_path_buf(),
        quick,
        candidates,
        seq: AtomicU32::new(0),
    };
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    type Scenario = fn(&Cx) -> Result<Report>;
    let all: [(&str, Scenario); 9] = [
        ("acquire", acquire),
        ("handover", handover),
        ("crash", crash),
        ("failclosed", failclosed),
        ("memory", memory),
        ("scale", scale),
        ("wholerun", wholerun),
        ("floor", floor),
        ("capacity", capacity),
    ];
    for (name, f) in all {
        if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == name)) {
            continue;
        }
        eprintln!("[{:>6.1}s] {name} ...", started.elapsed().as_secs_f64());
        // A failing or panicking scenario is reported and the others still run; its guards
        // have already killed what it started.
        match catch_unwind(AssertUnwindSafe(|| f(&cx))) {
            Ok(Ok(r)) => {
                rows.extend(r.rows);
                notes.extend(r.notes);
            }
            Ok(Err(e)) => rows.push(Row::error(name, format!("{e:#}"))),
            Err(_) => rows.push(Row::error(name, "panicked (see stderr)".into())),
        }
    }
    let leaked = LEAKED_CGROUPS.load(SeqCst);
    if leaked > 0 {
        notes.push(format!(
            "{leaked} empty job cgroup(s) were left behind by lead-exec watchdogs that the \
             harness SIGKILLed (the crash scenario, and tearing down workers still leading); \
             the harness removed them."
        ));
    }
    println!();
    println!("| scenario | metric | lead-exec | etcdctl lock | goal | met? |");
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.scenario, r.metric, r.lead_exec, r.etcdctl, r.goal, r.met
        );
    }
    println!();
    println!("Notes:");
    for n in &notes {
        println!("- {n}");
    }
    println!(
        "- Total run time {:.0} s; load average at the end: {}",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    Ok(())
}

/// Shared state of one benchmark run.
struct Cx {
    bin: PathBuf,
    etcd: Etcd,
    dir: PathBuf,
    quick: bool,
    /// Candidates in the `scale` scenario.
    candidates: usize,
    seq: AtomicU32,
}

impl Cx {
    fn n(&self, full: usize, quick: usize) -> usize {
        if self.quick {
            quick
        } else {
            full
        }
    }

    fn unique(&self, what: &str) -> String {
        format!("{what}-{}", self.seq.fetch_add(1, SeqCst))
    }

    fn fifo(&self, shared: bool) -> Result<Fifo> {
        Fifo::new(self.dir.join(self.unique("fifo")), shared)
    }

    /// Starts one worker in a process group of its own, so that it can be killed whole.
    fn spawn(&self, w: WorkerSpec) -> Result<Worker> {
        let mut cmd = match w.tool {
            Tool::LeadExec => {
                let mut c = Command::new(&self.bin);
                c.args(["run", w.election, "--endpoints", w.endpoint, "--id", w.id]);
                c.args(w.lead_exec_args);
                c
            }
            Tool::Etcdctl => {
                let mut c = Command::new(etcd_bin("etcdctl"));
                c.arg(format!("--endpoints={}", w.endpoint));
                c.args(["lock", w.election, "--ttl", &w.ttl_s.to_string()]);
                c
            }
        };
        cmd.args(["--", "sh", "-c", w.script]);
        for (k, _) in std::env::vars() {
            if k.starts_with("LEAD_EXEC_") || k.starts_with("ETCDCTL_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("ETCDCTL_API", "3");
        let log = self
            .dir
            .join("logs")
            .join(format!("{}-{}.log", w.election, w.id));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", w.tool.name()))?;
        let pgid = child.id() as i32;
        reap::add(pgid);
        Ok(Worker {
            child,
            pgid,
            job_pgid: None,
            cgroup: None,
            log,
        })
    }

    /// Waits until `n` candidates' keys exist (everyone has queued).
    fn wait_keys(&self, prefix: &str, n: u64, limit: Duration) -> Result<()> {
        let until = Instant::now() + limit;
        loop {
            let c = self.etcd.count(prefix)?;
            if c == n {
                return Ok(());
            }
            if Instant::now() > until {
                bail!("{c} of {n} candidates queued under {prefix} after {limit:?}");
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tool {
    LeadExec,
    Etcdctl,
}

const TOOLS: [Tool; 2] = [Tool::LeadExec, Tool::Etcdctl];

impl Tool {
    fn idx(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            Tool::LeadExec => "lead-exec",
            Tool::Etcdctl => "etcdctl lock",
        }
    }

    /// Where the tool keeps the candidates' keys of `election`.
    fn prefix(self, election: &str) -> String {
        match self {
            Tool::LeadExec => format!("lead-exec/elections/{election}/"),
            Tool::Etcdctl => format!("{election}/"),
        }
    }
}

struct WorkerSpec<'a> {
    tool: Tool,
    election: &'a str,
    endpoint: &'a str,
    id: &'a str,
    /// Lease flags for lead-exec, and the matching TTL for etcdctl.
    lead_exec_args: &'a [&'a str],
    ttl_s: u64,
    script: &'a str,
}

impl<'a> WorkerSpec<'a> {
    fn fast(
        tool: Tool,
        election: &'a str,
        endpoint: &'a str,
        id: &'a str,
        script: &'a str,
    ) -> Self {
        WorkerSpec {
            tool,
            election,
            endpoint,
            id,
            lead_exec_args: &FAST,
            ttl_s: TTL.as_secs(),
            script,
        }
    }
}

/// The job most scenarios run: it reports "PID PPID" on its FIFO and keeps the FIFO open (fd 3,
/// inherited by its children) until the whole job is gone; `on_term` is its TERM trap.
fn job_script(fifo: &Path, on_term: &str) -> String {
    format!(
        "exec 3>\"{}\"; echo \"$$ $PPID\" >&3; trap '{on_term}' TERM; \
         while :; do sleep 1000 & wait; done",
        fifo.display()
    )
}

fn pids(line: &str) -> Result<(i32, i32)> {
    let mut it = line.split_whitespace().map(str::parse::<i32>);
    match (it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b))) => Ok((a, b)),
        _ => bail!("unexpected job line {line:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// Uncontended acquire: from spawning the command to the job's first write.
fn acquire(cx: &Cx) -> Result<Report> {
    let n = cx.n(200, 20);
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
        no_cgroup.push(acquire_once(cx, Tool::LeadExec, &["--cgroup", "off"])?);
    }
    let (le, ctl) = (&samples[0], &samples[1]);
    let goal_ok = median(le) <= median(ctl) / 2.0;
    let rows = vec![
        Row::new(
            "acquire",
            &format!("command started → job running, median (min–max), n={n}"),
            summary_ms(le),
            summary_ms(ctl),
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
        Row::new(
            "acquire",
            "diagnostic: lead-exec `--cgroup off`, median (min–max)",
            summary_ms(&no_cgroup),
            "–".into(),
            "",
            "",
        ),
    ];
    let notes = vec![format!(
        "acquire: job = `sh -c 'echo ok > FIFO'`; clock from just before spawn() of the wrapper \
         to the harness reading the job's line. Default `--cgroup auto` moves the job into a \
         fresh cgroup v2 before exec; the `--cgroup off` row isolates that cost ({} ms median \
         difference).",
        fmt_ms(median(le) - median(&no_cgroup))
    )];
    Ok(Report { rows, notes })
}

fn acquire_once(cx: &Cx, tool: Tool, extra: &[&str]) -> Result<f64> {
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

/// Two candidates, A leading and B queued behind it, each with its job FIFO.
struct Pair {
    a: Worker,
    b: Worker,
    fa: Fifo,
    fb: Fifo,
}

fn start_pair(cx: &Cx, tool: Tool, election: &str, on_term: &str) -> Result<Pair> {
    let ep = cx.etcd.endpoint.clone();
    let mut fa = cx.fifo(false)?;
    let fb = cx.fifo(false)?;
    let sa = job_script(&fa.path, on_term);
    let sb = job_script(&fb.path, on_term);
    let mut a = cx.spawn(WorkerSpec::fast(tool, election, &ep, "a", &sa))?;
    let (line, _) = fa.line(Duration::from_secs(10))?;
    a.adopt_job(pids(&line)?.0);
    let b = cx.spawn(WorkerSpec::fast(tool, election, &ep, "b", &sb))?;
    cx.wait_keys(&tool.prefix(election), 2, Duration::from_secs(10))?;
    // B's key exists; give it a moment to open its watch on A's key, so that the handover
    // measured is the steady-state one (both tools watch from B's read revision, so no event
    // can be missed either way).
    thread::sleep(Duration::from_millis(50));
    Ok(Pair { a, b, fa, fb })
}

/// Graceful handover: SIGTERM to the leader's wrapper → the standby's job running.
fn handover(cx: &Cx) -> Result<Report> {
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
                Err(e) => return Err(e.context("lead-exec handover")),
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

/// Crash failover: SIGKILL of the leader's wrapper, watchdog and job → the standby's job running.
/// The lease is left to expire on the server.
fn crash(cx: &Cx) -> Result<Report> {
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

/// Fail-closed: a proxy between worker and etcd starts dropping everything right after it has
/// delivered a keepalive answer (the worst case: the wrapper has just renewed its local
/// deadline from a keepalive that was *sent* earlier than the server *received* it).
fn failclosed(cx: &Cx) -> Result<Report> {
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
fn kill_detect_latency(cx: &Cx) -> Result<Vec<f64>> {
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

/// Peak RSS of the wrapper processes while the job runs.
fn memory(cx: &Cx) -> Result<Report> {
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
                .collect::<Result<_>>()?;
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

/// 100 candidates on one election: failover after SIGTERM to the leader, compared with 3; and
/// what etcd serves per second while they all wait.
fn scale(cx: &Cx) -> Result<Report> {
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

/// A whole cron-style run: process start → exit, `-- true` as the job.
fn wholerun(cx: &Cx) -> Result<Report> {
    let n = cx.n(25, 5);
    for t in TOOLS {
        wholerun_once(cx, t)?;
    }
    let mut total: [Vec<f64>; 2] = [vec![], vec![]];
    let mut phases: Vec<[f64; 5]> = Vec::new();
    for _ in 0..n {
        for t in TOOLS {
            let (ms_total, p) = wholerun_once(cx, t)?;
            total[t.idx()].push(ms_total);
            if let Some(p) = p {
                phases.push(p);
            }
        }
    }
    let (le, ctl) = (&total[0], &total[1]);
    let ratio = median(le) / median(ctl);
    let phase = |k: usize| median(&phases.iter().map(|p| p[k]).collect::<Vec<_>>());
    let rows = vec![
        Row::new(
            "whole run",
            &format!("`run X -- true`: process start → exit, median (min–max), n={n}"),
            summary_ms(le),
            summary_ms(ctl),
            "≤ ½ etcdctl",
            &format!("{} ({ratio:.2}×)", yes_no(ratio <= 0.5)),
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

/// One whole run: total ms, and for lead-exec the phase split from its log.
fn wholerun_once(cx: &Cx, tool: Tool) -> Result<(f64, Option<[f64; 5]>)> {
    let election = cx.unique("whole");
    let spec = WorkerSpec::fast(tool, &election, &cx.etcd.endpoint, "w", "true");
    let wall0 = std::time::SystemTime::now();
    let t0 = Instant::now();
    let mut w = cx.spawn(spec)?;
    w.wait_exit(Duration::from_secs(10));
    let total = ms(t0.elapsed());
    let wall1 = wall0 + t0.elapsed();
    if tool != Tool::LeadExec {
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
        at("elected on Elected"),
        at("job started"),
        at("job ended"),
        at("-> done"),
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

/// The physical limit of an acquire: two raft commits (lease grant, creating transaction)
/// from a client already connected, plus one fork+exec. Beside it, for where the rest goes:
/// the same commits on a fresh connection, and a bare client process that starts, connects,
/// commits both and starts the acquire's job, the least any wrapper process can do.
fn floor(cx: &Cx) -> Result<Report> {
    let n = cx.n(50, 10);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let ep = cx.etcd.endpoint.as_str();
    let (commits, fresh): (Vec<f64>, Vec<f64>) = rt.block_on(async {
        let mut c = etcd_client::Client::connect([ep], None).await?;
        let (mut warm, mut fresh) = (Vec::new(), Vec::new());
        for i in 0..n + 1 {
            let t0 = Instant::now();
            let lease = grant_and_create(&mut c, &format!("floor/{i}")).await?;
            let t_warm = ms(t0.elapsed());
            c.lease_revoke(lease).await?;
            let t0 = Instant::now();
            let mut f = etcd_client::Client::connect([ep], None).await?;
            let lease = grant_and_create(&mut f, &format!("floor/fresh/{i}")).await?;
            let t_fresh = ms(t0.elapsed());
            f.lease_revoke(lease).await?;
            // The first round warms etcd's first-use paths.
            if i > 0 {
                warm.push(t_warm);
                fresh.push(t_fresh);
            }
        }
        Ok::<_, anyhow::Error>((warm, fresh))
    })?;
    let mut forks = Vec::new();
    for _ in 0..n {
        let t0 = Instant::now();
        Command::new("true").status()?;
        forks.push(ms(t0.elapsed()));
    }
    let (mut acq, mut bare) = (Vec::new(), Vec::new());
    acquire_once(cx, Tool::LeadExec, &[])?;
    bare_process_once(cx)?;
    for _ in 0..n {
        acq.push(acquire_once(cx, Tool::LeadExec, &[])?);
        bare.push(bare_process_once(cx)?);
    }
    let fl = median(&commits) + median(&forks);
    let ratio = median(&acq) / fl;
    let row =
        |metric: String, v: &[f64]| Row::new("floor", &metric, summary_ms(v), "–".into(), "", "");
    let rows = vec![
        row(format!("bare client: lease grant + creating txn, median (min–max), n={n}"), &commits),
        row(format!("fork+exec of `true`, median (min–max), n={n}"), &forks),
        Row::new(
            "floor",
            "lead-exec acquire (as in `acquire`) against the floor (sum of the two medians)",
            format!(
                "{} ms vs {} ms = {ratio:.2}× the floor",
                fmt_ms(median(&acq)),
                fmt_ms(fl)
            ),
            "–".into(),
            "≤ 1.5× the floor",
            yes_no(ratio <= 1.5),
        ),
        row(format!("diagnostic: the same two commits on a fresh connection, median (min–max), n={n}"), &fresh),
        Row::new(
            "floor",
            &format!(
                "diagnostic: a bare client process, spawn → job running (start, connect, the two commits, the job's fork+exec), median (min–max), n={n}"
            ),
            format!(
                "{}; lead-exec's acquire is {:.2}× it",
                summary_ms(&bare),
                median(&acq) / median(&bare)
            ),
            "–".into(),
            "",
            "",
        ),
    ];
    let notes = vec![
        "floor: the bare client is etcd-client in the bench process, connected once; each sample \
         is a lease grant then a transaction creating a key on it, the two raft commits every \
         acquire needs. lead-exec's acquire also starts a process, connects (reading once to \
         check the cluster, beside the lease grant), starts its watchdog and the job. The bare \
         client process is this bench binary re-executed: a current-thread runtime, \
         etcd-client, the two commits, then `sh -c 'echo ok > FIFO'` as in `acquire`; no flags \
         to parse, no probe, no watchdog, no cgroup, no history."
            .to_string(),
    ];
    Ok(Report { rows, notes })
}

/// The two raft commits of an acquire: a lease grant, then the transaction that creates the
/// candidate key on it. Returns the lease.
async fn grant_and_create(c: &mut etcd_client::Client, key: &str) -> Result<i64> {
    let lease = c.lease_grant(TTL.as_secs() as i64, None).await?.id();
    let txn = etcd_client::Txn::new()
        .when([etcd_client::Compare::create_revision(
            key,
            etcd_client::CompareOp::Equal,
            0,
        )])
        .and_then([etcd_client::TxnOp::put(
            key,
            "x",
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )]);
    c.txn(txn).await?;
    Ok(lease)
}

/// The bench binary's hidden mode for the bare client process of `floor`.
const FLOOR_PROCESS: &str = "__floor-process";

/// One bare client process, timed like `acquire_once`: spawn → the job's line.
fn bare_process_once(cx: &Cx) -> Result<f64> {
    let mut fifo = cx.fifo(false)?;
    let key = cx.unique("floor/process");
    let script = format!("echo ok > \"{}\"", fifo.path.display());
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([FLOOR_PROCESS, cx.etcd.endpoint.as_str(), &key, &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("starting the bare client process")?;
    let (_, t1) = fifo.line(Duration::from_secs(10))?;
    let status = child.wait()?;
    if !status.success() {
        bail!("the bare client process failed: {status}");
    }
    Ok(ms(t1 - t0))
}

/// In the bare client process: connect, grant, create the key, run the job, revoke.
fn floor_process(args: &[String]) -> ExitCode {
    let [endpoint, key, script] = args else {
        return usage();
    };
    let run = async {
        let mut c = etcd_client::Client::connect([endpoint.as_str()], None).await?;
        let lease = grant_and_create(&mut c, key).await?;
        Command::new("sh").args(["-c", script]).status()?;
        c.lease_revoke(lease).await?;
        Ok::<_, anyhow::Error>(())
    };
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: bare client process: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The share of etcd's write capacity that keepalives may take in the sizing rule.
const KEEPALIVE_SHARE: f64 = 0.10;

/// What waiting candidates cost etcd, and how many one etcd can serve.
fn capacity(cx: &Cx) -> Result<Report> {
    let n = cx.n(200, 50);
    let window = Duration::from_secs(SCALE_TTL_S * 3);
    let before = cx.etcd.gauges()?;
    let election = cx.unique("cap");
    let ep = cx.etcd.endpoint.clone();
    let ttl = format!("{SCALE_TTL_S}s");
    let args = ["--ttl", ttl.as_str()];
    let mut workers = Vec::new();
    for i in 0..n {
        let id = format!("c{i}");
        let script = "trap 'exit 0' TERM; while :; do sleep 1000 & wait; done";
        workers.push(cx.spawn(WorkerSpec {
            lead_exec_args: &args,
            ttl_s: SCALE_TTL_S,
            ..WorkerSpec::fast(Tool::LeadExec, &election, &ep, &id, script)
        })?);
    }
    cx.wait_keys(
        &Tool::LeadExec.prefix(&election),
        n as u64,
        Duration::from_secs(60 + n as u64 / 10),
    )?;
    let rates = idle_rates(cx, window)?;
    let after = cx.etcd.gauges()?;
    drop(workers);
    let per = |k: &str| (after.get(k).unwrap_or(&0.0) - before.get(k).unwrap_or(&0.0)) / n as f64;
    let mem_kib = per("process_resident_memory_bytes") / 1024.0;
    let heap_kib = per("go_memstats_heap_inuse_bytes") / 1024.0;
    let watches = per("etcd_debugging_mvcc_watcher_total");
    let streams = per("etcd_debugging_mvcc_watch_stream_total");
    let req_per = (rates.keepalive + rates.other) / n as f64;
    let writes = write_capacity(cx)?;
    let max_candidates = KEEPALIVE_SHARE * writes / req_per;
    let rows = vec![
        Row::new(
            "capacity",
            &format!("per waiting candidate, {n} candidates (TTL {SCALE_TTL_S} s): requests/s, watchers, etcd memory"),
            format!(
                "{req_per:.3} req/s, {watches:.2} watchers ({streams:.2} streams), {mem_kib:.0} KiB RSS ({heap_kib:.0} KiB Go heap)"
            ),
            "–".into(),
            "",
            "",
        ),
        Row::new(
            "capacity",
            "etcd writes/s here (32 clients putting 64-byte values for 5 s)",
            format!("{writes:.0}/s"),
            "–".into(),
            "",
            "",
        ),
        Row::new(
            "capacity",
            &format!(
                "candidates one etcd serves with keepalives at {:.0}% of that",
                KEEPALIVE_SHARE * 100.0
            ),
            format!("{max_candidates:.0}"),
            "–".into(),
            "",
            "",
        ),
    ];
    let notes = vec![format!(
        "capacity: etcd's own /metrics before the candidates joined and after they had waited \
         {} s: process_resident_memory_bytes, go_memstats_heap_inuse_bytes, \
         etcd_debugging_mvcc_watcher_total and \
         _watch_stream_total, grpc_server_msg_received_total; divided by {n}. A keepalive is \
         not a raft write (the leader renews in memory), so counting it against the write \
         capacity overstates its cost: the rule is conservative. Elections do not add up: a \
         candidate costs the same whichever election it is in. Write capacity measured on \
         this one loopback member; a three-member cluster commits through its leader and \
         replicates, so measure yours the same way. Run it on a fresh etcd (alone, or \
         first): memory a larger crowd left behind makes the difference meaningless.",
        window.as_secs()
    )];
    Ok(Report { rows, notes })
}

/// Puts per second that etcd sustains: 32 concurrent clients for 5 s.
fn write_capacity(cx: &Cx) -> Result<f64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = etcd_client::Client::connect([cx.etcd.endpoint.as_str()], None).await?;
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..32 {
            let mut c = client.clone();
            tasks.spawn(async move {
                let mut n = 0u64;
                while tokio::time::Instant::now() < until {
                    c.put(format!("cap/{t}/{}", n % 100), vec![b'x'; 64], None)
                        .await?;
                    n += 1;
                }
                Ok::<_, etcd_client::Error>(n)
            });
        }
        let mut total = 0u64;
        while let Some(r) = tasks.join_next().await {
            total += r??;
        }
        Ok::<_, anyhow::Error>(total as f64 / 5.0)
    })
}

struct Rates {
    keepalive: f64,
    other: f64,
    detail: String,
}

/// `n` lead-exec candidates; `runs` SIGTERM failovers; optionally the idle request rate.
fn crowd_failover(
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
fn etcdctl_idle(cx: &Cx, n: usize, window: Duration) -> Result<Rates> {
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

fn idle_rates(cx: &Cx, window: Duration) -> Result<Rates> {
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

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// One wrapper process (lead-exec or etcdctl) in its own process group. Dropping it SIGKILLs
/// the group and the job's group.
struct Worker {
    child: Child,
    pgid: i32,
    job_pgid: Option<i32>,
    /// The wrapper's stderr.
    log: PathBuf,
    /// The job's cgroup v2 directory, if lead-exec made one: a SIGKILLed watchdog cannot
    /// remove it, so the harness does.
    cgroup: Option<PathBuf>,
}

static LEAKED_CGROUPS: AtomicU32 = AtomicU32::new(0);

impl Worker {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Learns the job's pid (from its FIFO line) so that its group dies with the worker.
    fn adopt_job(&mut self, job: i32) {
        // SAFETY: getpgid only reads.
        let pg = unsafe { libc::getpgid(job) };
        if pg > 0 && pg != self.pgid && self.job_pgid.is_none() {
            reap::add(pg);
            self.job_pgid = Some(pg);
        }
        if let Ok(s) = fs::read_to_string(format!("/proc/{job}/cgroup")) {
            let rel = s.lines().find_map(|l| l.strip_prefix("0::"));
            if let (Some(rel), Some(mount)) = (rel, cgroup2_mount()) {
                if rel.contains("lead-exec-job-") {
                    self.cgroup = Some(mount.join(rel.trim_start_matches('/')));
                }
            }
        }
    }

    /// lead-exec's own account of a deadline stop: `slack_ms` (its deadline D minus the job's
    /// death, as the watchdog saw it) from the log line of a job the watchdog stopped.
    /// Waits up to a second for lead-exec to write it.
    fn watchdog_slack_ms(&self) -> Option<f64> {
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let log = fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(line) = log.lines().find(|l| l.contains("watchdog stopped the job")) {
                return line
                    .split("slack_ms=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok();
            }
            thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Whether the wrapper has not exited yet.
    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// SIGKILL to the wrapper's group (wrapper, watchdog, etcdctl's job) and the job's group.
    fn kill_all(&mut self) {
        kill_groups(self.groups());
    }

    /// The worker's process group, and its job's once known.
    fn groups(&self) -> Vec<i32> {
        std::iter::once(self.pgid).chain(self.job_pgid).collect()
    }

    /// Waits for a normal exit; kills the worker if it does not come. A blocking wait, so that
    /// a timed run ends at the exit itself, not at the next turn of a polling loop.
    fn wait_exit(&mut self, limit: Duration) {
        let groups = self.groups();
        let (done, timer) = std::sync::mpsc::channel::<()>();
        let killer = thread::spawn(move || {
            if timer.recv_timeout(limit).is_err() {
                kill_groups(groups);
            }
        });
        let _ = self.child.wait();
        let _ = done.send(());
        let _ = killer.join();
    }
}

fn kill_groups(groups: Vec<i32>) {
    for pg in groups {
        // SAFETY: kill(2) on a process group we created; never 0 or our own.
        unsafe { libc::kill(-pg, libc::SIGKILL) };
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill_all();
        let _ = self.child.wait();
        reap::remove(self.pgid);
        if let Some(pg) = self.job_pgid {
            reap::remove(pg);
        }
        if let Some(dir) = &self.cgroup {
            // Its members may take a moment to be reaped after the SIGKILL.
            for _ in 0..50 {
                if !dir.exists() {
                    return;
                }
                if fs::remove_dir(dir).is_ok() {
                    LEAKED_CGROUPS.fetch_add(1, SeqCst);
                    return;
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn cgroup2_mount() -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Process groups to SIGKILL on the way out, kept where a signal handler can reach them
/// without locking.
mod reap {
    use std::sync::atomic::{AtomicI32, Ordering::SeqCst};

    static SLOTS: [AtomicI32; 4096] = [const { AtomicI32::new(0) }; 4096];

    pub fn add(pgid: i32) {
        for s in &SLOTS {
            if s.compare_exchange(0, pgid, SeqCst, SeqCst).is_ok() {
                return;
            }
        }
    }

    pub fn remove(pgid: i32) {
        for s in &SLOTS {
            if s.compare_exchange(pgid, 0, SeqCst, SeqCst).is_ok() {
                return;
            }
        }
    }

    /// Async-signal-safe: atomics and kill(2) only.
    pub fn kill_all() {
        for s in &SLOTS {
            let pg = s.swap(0, SeqCst);
            if pg > 0 {
                // SAFETY: kill(2) on a group this process created.
                unsafe { libc::kill(-pg, libc::SIGKILL) };
            }
        }
    }

    extern "C" fn on_signal(sig: libc::c_int) {
        kill_all();
        // SAFETY: restoring the default action and re-raising are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    /// Ctrl-C and friends: workers live in their own process groups, so the terminal's signal
    /// does not reach them; kill them before dying.
    pub fn install() {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the handler only does async-signal-safe work.
            unsafe {
                libc::signal(
                    sig,
                    on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
                )
            };
        }
    }
}

/// Finds target/release/lead-exec next to this example's binary, building it if missing.
fn lead_exec_binary() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let release = me
        .parent()
        .and_then(Path::parent)
        .context("unexpected location of the bench binary")?;
    let bin = release.join("lead-exec");
    // Always: a binary left from an older build would be measured instead of this tree's
    // (a no-op when it is fresh). Both binaries: lead-exec uses the watchdog beside it.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let ok = Command::new(cargo)
        .args(["build", "--release", "--bins"])
        .status()?
        .success();
    if !ok || !bin.is_file() {
        bail!("could not build {}", bin.display());
    }
    Ok(bin)
}

// ---------------------------------------------------------------------------------------------
// FIFO: how jobs report to the harness
// ---------------------------------------------------------------------------------------------

enum Ev {
    Line(String, Instant),
    Eof(Instant),
}

/// A FIFO the harness reads without blocking. Opened read-only, EOF means every writer has
/// closed it (the whole job is gone; Linux reports no hangup before the first writer).
/// `shared` opens it read-write instead, for many writers over time: it never reaches EOF.
struct Fifo {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    last_read: Instant,
    eof: Option<Instant>,
}

impl Fifo {
    fn new(path: PathBuf, shared: bool) -> Result<Fifo> {
        let c = CString::new(path.as_os_str().as_bytes())?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(std::io::Error::last_os_error()).context("mkfifo");
        }
        let file = OpenOptions::new()
            .read(true)
            .write(shared)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)?;
        Ok(Fifo {
            path,
            file,
            buf: Vec::new(),
            last_read: Instant::now(),
            eof: None,
        })
    }

    /// The next line or the EOF, timed when poll(2) woke; `None` once `until` has passed.
    fn next(&mut self, until: Instant) -> Option<Ev> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line).trim_end().to_string();
                return Some(Ev::Line(line, self.last_read));
            }
            if let Some(at) = self.eof {
                return Some(Ev::Eof(at));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut pfd = libc::pollfd {
                fd: self.file.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let timeout = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, timeout) };
            let woke = Instant::now();
            if r <= 0 {
                continue;
            }
            let mut tmp = [0u8; 4096];
            match self.file.read(&mut tmp) {
                Ok(0) => self.eof = Some(woke),
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    self.last_read = woke;
                }
                Err(_) => {}
            }
        }
    }

    fn line(&mut self, limit: Duration) -> Result<(String, Instant)> {
        match self.next(Instant::now() + limit) {
            Some(Ev::Line(l, at)) => Ok((l, at)),
            Some(Ev::Eof(_)) => bail!("the job closed {} without a line", self.path.display()),
            None => bail!("no line on {} within {limit:?}", self.path.display()),
        }
    }

    fn wait_eof(&mut self, limit: Duration) -> Option<Instant> {
        let until = Instant::now() + limit;
        loop {
            match self.next(until)? {
                Ev::Eof(at) => return Some(at),
                Ev::Line(..) => {}
            }
        }
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

// ---------------------------------------------------------------------------------------------
// etcd
// ---------------------------------------------------------------------------------------------

/// `etcd` or `etcdctl` as the tests find them: `$ETCD_BIN_DIR` when set, else PATH.
fn etcd_bin(name: &str) -> PathBuf {
    harness::locate(name, "etcd-client").unwrap_or_else(|_| PathBuf::from(name))
}

/// A throwaway single-member etcd on loopback, spoken to over its HTTP gateway so that the
/// harness needs no client library (and spawns no etcdctl while timing).
struct Etcd {
    member: harness::Member,
    port: u16,
    endpoint: String,
}

impl Etcd {
    fn start(dir: &Path) -> Result<Etcd> {
        harness::locate("etcd", "etcd-server").map_err(anyhow::Error::msg)?;
        let member = harness::Member::single(dir, "etcd", |cmd| {
            // In a group of its own, killed whole on the way out.
            cmd.process_group(0);
            // A connection per candidate: `--candidates 1000` needs more descriptors than the
            // usual soft limit of 1024.
            // SAFETY: getrlimit/setrlimit are async-signal-safe and touch only our own limits.
            unsafe {
                cmd.pre_exec(|| {
                    let mut r = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
                        r.rlim_cur = r.rlim_max;
                        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
                    }
                    Ok(())
                });
            }
        });
        reap::add(member.pid());
        let port = member.client_port;
        let log = member.log();
        let e = Etcd {
            member,
            port,
            endpoint: format!("127.0.0.1:{port}"),
        };
        let until = Instant::now() + Duration::from_secs(20);
        while !e
            .http("GET", "/health", "")
            .is_ok_and(|b| b.contains("\"true\""))
        {
            if Instant::now() > until {
                bail!("etcd did not become healthy; see {}", log.display());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(e)
    }

    fn http(&self, method: &str, path: &str, body: &str) -> Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let (_, b) = out
            .split_once("\r\n\r\n")
            .context("malformed HTTP response")?;
        Ok(b.to_string())
    }

    /// Number of keys under `prefix`.
    fn count(&self, prefix: &str) -> Result<u64> {
        let body = self.http(
            "POST",
            "/v3/kv/range",
            &range_json(prefix, ",\"count_only\":true"),
        )?;
        // proto3 JSON leaves out zero values, and writes int64 as a string.
        Ok(match body.split_once("\"count\":\"") {
            Some((_, rest)) => rest
                .split('"')
                .next()
                .unwrap_or("0")
                .parse()
                .context("count")?,
            None => 0,
        })
    }

    /// `grpc_server_msg_received_total` summed per grpc_method.
    fn msgs_received(&self) -> Result<BTreeMap<String, f64>> {
        let text = self.http("GET", "/metrics", "")?;
        let mut m = BTreeMap::new();
        for l in text.lines() {
            let Some(rest) = l.strip_prefix("grpc_server_msg_received_total{") else {
                continue;
            };
            let (labels, value) = rest.rsplit_once("} ").context("metrics line")?;
            let method = labels
                .split("grpc_method=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap_or("?");
            *m.entry(method.to_string()).or_insert(0.0) += value.trim().parse::<f64>()?;
        }
        Ok(m)
    }

    /// Unlabelled samples of etcd's `/metrics` (gauges and counters), by name.
    fn gauges(&self) -> Result<BTreeMap<String, f64>> {
        let text = self.http("GET", "/metrics", "")?;
        Ok(text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.contains('{'))
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect())
    }

    /// Streams the times at which keys under `prefix` are deleted, once the watch is in place.
    fn watch_deletes(&self, prefix: &str) -> Result<DeleteWatch> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        let body = format!("{{\"create_request\":{}}}", range_json(prefix, ""));
        write!(
            s,
            "POST /v3/watch HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut r = s.try_clone()?;
        thread::spawn(move || {
            let mut text = String::new();
            let (mut created, mut seen) = (false, 0);
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = r.read(&mut buf) {
                let at = Instant::now();
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                if !created && text.contains("\"created\":true") {
                    created = true;
                    let _ = ready_tx.send(());
                }
                let c = text.matches("\"DELETE\"").count();
                for _ in seen..c {
                    let _ = tx.send(at);
                }
                seen = c;
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .context("etcd watch not created")?;
        Ok(DeleteWatch { rx, stream: s })
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let pg = self.member.pid();
        // SAFETY: kill(2) on the group we created for etcd.
        unsafe { libc::kill(-pg, libc::SIGKILL) };
        self.member.kill();
        reap::remove(pg);
    }
}

struct DeleteWatch {
    rx: Receiver<Instant>,
    stream: TcpStream,
}

impl Drop for DeleteWatch {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

fn range_json(prefix: &str, extra: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    format!(
        "{{\"key\":\"{}\",\"range_end\":\"{}\"{extra}}}",
        base64(prefix.as_bytes()),
        base64(&end)
    )
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Fault proxy
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    /// Blackhole right after the next answer from etcd has been forwarded.
    Armed,
    Blackhole,
}

struct ProxyState {
    mode: Mode,
    /// When a client→etcd request was last forwarded.
    last_up: Option<Instant>,
    /// When the blackhole began, and `last_up` at that moment.
    blackholed: Option<(Instant, Instant)>,
}

struct ProxyShared {
    state: Mutex<ProxyState>,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

/// A TCP proxy in front of etcd. In blackhole mode it reads and discards in both directions
/// and keeps every connection open, as a partitioned network does.
struct Proxy {
    port: u16,
    shared: Arc<ProxyShared>,
}

impl Proxy {
    fn start(etcd_port: u16) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(ProxyShared {
            state: Mutex::new(ProxyState {
                mode: Mode::Pass,
                last_up: None,
                blackholed: None,
            }),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", etcd_port)) else {
                    continue;
                };
                for c in [&client, &server] {
                    let _ = c.set_nodelay(true);
                    let _ = c.set_read_timeout(Some(Duration::from_millis(20)));
                    if let Ok(c) = c.try_clone() {
                        s.conns.lock().unwrap().push(c);
                    }
                }
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                pump(s.clone(), client, server, true);
                pump(s.clone(), s2, c2, false);
            }
        });
        Ok(Proxy { port, shared })
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn arm(&self) {
        self.shared.state.lock().unwrap().mode = Mode::Armed;
    }

    /// (blackhole start, last request forwarded to etcd before it).
    fn wait_blackholed(&self, limit: Duration) -> Result<(Instant, Instant)> {
        let until = Instant::now() + limit;
        loop {
            if let Some(b) = self.shared.state.lock().unwrap().blackholed {
                return Ok(b);
            }
            if Instant::now() > until {
                bail!("no answer from etcd crossed the proxy within {limit:?}");
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        for c in self.shared.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        let _ = TcpStream::connect(("127.0.0.1", self.port)); // wakes the accept loop
    }
}

/// Whether a chunk holds an HTTP/2 DATA frame with a payload, i.e. a gRPC request or answer
/// rather than housekeeping (PING, WINDOW_UPDATE, SETTINGS). It assumes the chunk starts at a
/// frame boundary, as the small, sparse frames of an idle connection do; if not, the walk
/// finds no DATA frame and the chunk does not count.
fn has_grpc_message(chunk: &[u8]) -> bool {
    let mut rest = chunk;
    while rest.len() >= 9 {
        let len = (rest[0] as usize) << 16 | (rest[1] as usize) << 8 | rest[2] as usize;
        if rest[3] == 0 && len > 0 {
            return true;
        }
        rest = rest.get(9 + len..).unwrap_or(&[]);
    }
    false
}

fn pump(s: Arc<ProxyShared>, mut from: TcpStream, mut to: TcpStream, up: bool) {
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while !s.stop.load(SeqCst) {
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => break,
            };
            // Forwarding under the lock keeps the timestamps and the mode switch in order.
            let mut st = s.state.lock().unwrap();
            if st.mode == Mode::Blackhole {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            let now = Instant::now();
            let message = has_grpc_message(&buf[..n]);
            if up {
                if message {
                    st.last_up = Some(now);
                }
            } else if st.mode == Mode::Armed && message {
                st.mode = Mode::Blackhole;
                st.blackholed = Some((now, st.last_up.unwrap_or(now)));
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

// ---------------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------------

struct Report {
    rows: Vec<Row>,
    notes: Vec<String>,
}

struct Row {
    scenario: String,
    metric: String,
    lead_exec: String,
    etcdctl: String,
    goal: String,
    met: String,
}

impl Row {
    fn new(scenario: &str, metric: &str, le: String, ctl: String, goal: &str, met: &str) -> Row {
        Row {
            scenario: scenario.into(),
            metric: metric.into(),
            lead_exec: le,
            etcdctl: ctl,
            goal: goal.into(),
            met: met.into(),
        }
    }

    fn error(scenario: &str, e: String) -> Row {
        Row::new(
            scenario,
            &format!("error: {}", e.replace('|', "/")),
            "–".into(),
            "–".into(),
            "",
            "",
        )
    }
}

fn yes_no(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

fn print_header(bin: &Path, quick: bool) {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|s| s.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let nproc = thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|s| s.trim().to_string()))
        .unwrap_or_default();
    let first_line = |prog: &str, args: &[&str]| {
        Command::new(etcd_bin(prog))
            .args(args)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_else(|e| format!("{prog}: {e}"))
    };
    println!(
        "# lead-exec benchmark{}",
        if quick { " (--quick)" } else { "" }
    );
    println!();
    println!(
        "- machine: {nproc} CPUs, {model}, Linux {}, {mem} RAM; load average at start: {}",
        kernel.trim(),
        loadavg()
    );
    println!("- {}", first_line("etcd", &["--version"]));
    println!("- {}", first_line("etcdctl", &["version"]));
    println!(
        "- {} ({})",
        first_line(&bin.display().to_string(), &["--version"]),
        bin.display()
    );
    println!(
        "- date: {}",
        first_line("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"])
    );
    println!("- etcd: one member on loopback, default settings, fresh data dir in a temp dir");
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A `Key:   123 kB` line of /proc/PID/status, in KiB.
fn status_kib(pid: i32, key: &str) -> Result<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status"))?;
    kib_field(&s, key).with_context(|| format!("{key} of pid {pid}"))
}

fn pss_kib(pid: i32) -> Option<u64> {
    kib_field(
        &fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?,
        "Pss:",
    )
}

fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A uniformly random duration in [0, max), from a xorshift seeded by the clock.
fn random_below(max: Duration) -> Duration {
    static STATE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut x = STATE.load(SeqCst);
    if x == 0 {
        x = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, SeqCst);
    max.mul_f64((x >> 11) as f64 / (1u64 << 53) as f64)
}

/// `to − from` in seconds, negative when `to` is earlier.
fn signed_secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
        - from.saturating_duration_since(to).as_secs_f64()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s
}

fn median(v: &[f64]) -> f64 {
    let s = sorted(v);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Nearest-rank 99th percentile.
fn p99(v: &[f64]) -> f64 {
    let s = sorted(v);
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((0.99 * s.len() as f64).ceil() as usize).max(1);
    s[rank - 1]
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

fn fmt_ms(x: f64) -> String {
    if x.abs() < 10.0 {
        format!("{x:.2}")
    } else if x.abs() < 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

fn summary_ms(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    format!(
        "{} ms ({}–{})",
        fmt_ms(median(v)),
        fmt_ms(min(v)),
        fmt_ms(max(v))
    )
}
