//! Benchmarks lead-exec against `etcdctl lock` on one throwaway etcd.
//!
//! ```text
//! cargo run --release -p lead-exec-harness --bin bench -- [--quick] [--keep-logs] [--candidates N]
//!     [--n N] [--delay MS] [--tls] [--slow-disk MS] [--lead-exec PATH] [--scenario NAME[,NAME...]]
//! ```
//!
//! `--keep-logs` keeps the temporary directory with every wrapper's stderr and etcd's log.
//! `--n N` runs every scenario N times per tool (and leaves out `acquire`'s diagnostic runs).
//! `--lead-exec PATH` measures that lead-exec (its watchdog beside it) instead of building
//! this tree's: a build from before a change, against the same etcd conditions.
//!
//! Where etcd is, for both tools alike (the report's header says which):
//!
//! - `--delay MS`: a delay line in front of etcd adds MS to every round trip (MS/2 each way;
//!   see `harness::measure::delay`).
//! - `--tls`: mutual TLS, with a CA and certificates made for the run (`harness::tls`).
//! - `--slow-disk MS`: etcd's every fdatasync takes MS longer (strace), so every commit does.
//!
//! Only `acquire`, `wholerun`, `counts`, `cpu`, `handover`, `crash` and `memory` go through
//! them; the others speak to etcd directly.
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
//! - `counts`: requests by gRPC method and raft commits of one uncontended whole run of each
//!   tool, from etcd's own `/metrics`.
//! - `cpu`: CPU per whole run, every process of it counted (a cgroup it starts in), in runs
//!   of their own; beside the tools, `floor`'s bare client process making a run's three
//!   commits and starting the job, the least a wrapper on etcd-client can spend.
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
//!
//! Each scenario is a module of its own beside this file, which parses the flags and runs the
//! chosen ones. What they measure with (the etcd, the fault proxy, the FIFOs, the worker
//! processes, the statistics and the report table) is `harness::measure`.

mod acquire;
mod capacity;
mod counts;
mod crash;
mod failclosed;
mod floor;
mod handover;
mod memory;
mod scale;
mod wholerun;

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use harness::measure::etcd::HttpEtcd;
use harness::measure::fifo::Fifo;
use harness::measure::reap;
use harness::measure::report::{loadavg, print_header, print_table, Report, Row};
use harness::measure::worker::{self, Tool, Worker, WorkerSpec, FAST_TTL, LEAKED_CGROUPS};

/// Lease settings for every scenario but `scale`: the tests' fast ones (`harness::FAST`),
/// TTL 3 s with grace and margin 0.5 s. `etcdctl lock --ttl 3` matches the TTL.
const TTL: Duration = FAST_TTL;
const MARGIN: Duration = Duration::from_millis(500);
/// `scale` uses lead-exec's default TTL, so that the idle keepalive rate is the production one.
const SCALE_TTL_S: u64 = 10;
const SCENARIOS: [&str; 11] = [
    "acquire",
    "handover",
    "crash",
    "failclosed",
    "memory",
    "scale",
    "wholerun",
    "floor",
    "capacity",
    "counts",
    "cpu",
];
/// lead-exec's default grace and safety margin: with `SCALE_TTL_S` they give the default
/// keepalive interval, (TTL − grace − margin)/3.
const DEFAULT_GRACE_S: u64 = 3;
const DEFAULT_MARGIN_S: u64 = 1;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(floor::FLOOR_PROCESS) {
        return floor::floor_process(&argv[2..]);
    }
    reap::install();
    let mut quick = false;
    let mut keep_logs = false;
    let mut only: Option<Vec<String>> = None;
    let mut candidates = 100usize;
    let mut place = Place::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--keep-logs" => keep_logs = true,
            "--candidates" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n >= 4 => candidates = n,
                _ => return usage(),
            },
            "--n" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n >= 1 => place.n = Some(n),
                _ => return usage(),
            },
            "--delay" => match args.next().and_then(|n| n.parse().ok()) {
                Some(ms) => place.rtt = Duration::from_millis(ms),
                None => return usage(),
            },
            "--slow-disk" => match args.next().and_then(|n| n.parse().ok()) {
                Some(ms) => place.slow_disk = Some(Duration::from_millis(ms)),
                None => return usage(),
            },
            "--tls" => place.tls = true,
            "--lead-exec" => match args.next() {
                Some(p) => place.lead_exec = Some(PathBuf::from(p)),
                None => return usage(),
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
    let result = run(quick, keep_logs, candidates, only, place);
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
        "usage: cargo run --release -p lead-exec-harness --bin bench -- [--quick] [--keep-logs] [--candidates N] [--n N] [--delay MS] [--tls] [--slow-disk MS] [--lead-exec PATH] [--scenario {}]",
        SCENARIOS.join("|")
    );
    ExitCode::from(2)
}

/// Where etcd is for the tools: `--delay`, `--tls`, `--slow-disk`; and `--n`.
#[derive(Default)]
struct Place {
    rtt: Duration,
    tls: bool,
    slow_disk: Option<Duration>,
    n: Option<usize>,
    lead_exec: Option<PathBuf>,
}

/// The whole run's goal against etcdctl's, where one is set: 0.40× on loopback, 0.45× over
/// mutual TLS on loopback, 0.45× at 2 ms and 0.60× at 10 ms (both plain). The farther etcd
/// is, the more of both tools' time is round trips that neither can shorten. Other places
/// (other delays, TLS with a delay, a slow disk) have no goal: the ratio is shown alone.
fn whole_run_goal(place: &Place) -> Option<f64> {
    if place.slow_disk.is_some() {
        return None;
    }
    match (place.rtt.as_millis(), place.tls) {
        (0, false) => Some(0.40),
        (0, true) => Some(0.45),
        (2, false) => Some(0.45),
        (10, false) => Some(0.60),
        _ => None,
    }
}

fn run(
    quick: bool,
    keep_logs: bool,
    candidates: usize,
    only: Option<Vec<String>>,
    place: Place,
) -> Result<()> {
    let bin = match &place.lead_exec {
        Some(p) => p.clone(),
        None => lead_exec_binary()?,
    };
    let mut dir = tempfile::Builder::new()
        .prefix("lead-exec-bench-")
        .tempdir()?;
    if keep_logs {
        dir.disable_cleanup(true);
        eprintln!("logs (kept): {}/logs", dir.path().display());
    }
    fs::create_dir_all(dir.path().join("logs"))?;
    print_header(&bin, quick);
    let mut opts = harness::MemberOpts {
        slow_fsync: place.slow_disk,
        ..Default::default()
    };
    if place.tls {
        let certs = dir.path().join("certs");
        fs::create_dir_all(&certs)?;
        harness::tls::ca(&certs, "ca");
        harness::tls::cert(&certs, "ca", "server", "127.0.0.1");
        harness::tls::cert(&certs, "ca", "client", "client");
        let p = |f: &str| certs.join(f).display().to_string();
        let conn = [
            "--cacert",
            &p("ca.crt"),
            "--cert",
            &p("client.crt"),
            "--key",
            &p("client.key"),
        ];
        let _ = worker::CONN_ARGS.set(conn.map(String::from).to_vec());
        opts.tls = Some(certs);
    }
    let etcd = HttpEtcd::start_with(dir.path(), &opts, place.rtt)?;
    println!(
        "- etcd reached by both tools {}{}{}",
        if place.rtt.is_zero() {
            "directly on loopback".to_string()
        } else {
            format!(
                "through a delay line adding {} ms to every round trip ({} ms each way; TCP handshakes not delayed)",
                place.rtt.as_millis(),
                place.rtt.as_secs_f64() * 500.0
            )
        },
        if place.tls {
            ", over mutual TLS (generated v3 certificates, EC P-256)"
        } else {
            ", plain http"
        },
        match place.slow_disk {
            Some(d) => format!(", every fdatasync delayed {} ms (strace)", d.as_millis()),
            None => String::new(),
        }
    );
    let cx = Cx {
        bin,
        etcd,
        dir: dir.path().to_path_buf(),
        quick,
        candidates,
        seq: AtomicU32::new(0),
        n_override: place.n,
        lean: place.n.is_some(),
        whole_run_goal: whole_run_goal(&place),
    };
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    type Scenario = fn(&Cx) -> Result<Report>;
    let all: [(&str, Scenario); 11] = [
        ("acquire", acquire::acquire),
        ("handover", handover::handover),
        ("crash", crash::crash),
        ("failclosed", failclosed::failclosed),
        ("memory", memory::memory),
        ("scale", scale::scale),
        ("wholerun", wholerun::wholerun),
        ("floor", floor::floor),
        ("capacity", capacity::capacity),
        ("counts", counts::counts),
        ("cpu", counts::cpu),
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
    print_table(&rows, &notes);
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
    etcd: HttpEtcd,
    dir: PathBuf,
    quick: bool,
    /// Candidates in the `scale` scenario.
    candidates: usize,
    seq: AtomicU32,
    /// `--n`: runs per tool in every scenario.
    n_override: Option<usize>,
    /// Leave out diagnostic runs (with `--n`), so that a run with delay stays short.
    lean: bool,
    /// The most a whole run may take against etcdctl's, for where etcd is, if a goal is set.
    whole_run_goal: Option<f64>,
}

impl Cx {
    fn n(&self, full: usize, quick: usize) -> usize {
        if let Some(n) = self.n_override {
            n
        } else if self.quick {
            quick
        } else {
            full
        }
    }

    fn unique(&self, what: &str) -> String {
        format!("{what}-{}", self.seq.fetch_add(1, SeqCst))
    }

    fn fifo(&self, shared: bool) -> Result<Fifo> {
        Ok(Fifo::new(self.dir.join(self.unique("fifo")), shared)?)
    }

    /// Starts one worker in a process group of its own, so that it can be killed whole.
    fn spawn(&self, w: WorkerSpec) -> Result<Worker> {
        Ok(worker::spawn(&self.bin, &self.dir.join("logs"), w)?)
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

/// The job most scenarios run: it reports "PID PPID" on its FIFO and keeps the FIFO open (fd 3,
/// inherited by its children) until the whole job is gone; `on_term` is its TERM trap.
pub(crate) fn job_script(fifo: &Path, on_term: &str) -> String {
    format!(
        "exec 3>\"{}\"; echo \"$$ $PPID\" >&3; trap '{on_term}' TERM; \
         while :; do sleep 1000 & wait; done",
        fifo.display()
    )
}

pub(crate) fn pids(line: &str) -> Result<(i32, i32)> {
    let mut it = line.split_whitespace().map(str::parse::<i32>);
    match (it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b))) => Ok((a, b)),
        _ => bail!("unexpected job line {line:?}"),
    }
}

/// Two candidates, A leading and B queued behind it, each with its job FIFO.
pub(crate) struct Pair {
    a: Worker,
    b: Worker,
    fa: Fifo,
    fb: Fifo,
}

pub(crate) fn start_pair(cx: &Cx, tool: Tool, election: &str, on_term: &str) -> Result<Pair> {
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

/// Builds the release lead-exec and its watchdog (lead-exec uses the watchdog beside it) into
/// this tool's target directory and returns lead-exec's path: always, so that a binary left
/// from an older build is never measured instead of this tree's (a no-op when it is fresh).
fn lead_exec_binary() -> Result<PathBuf> {
    let dir = harness::build_binaries(true, false).map_err(anyhow::Error::msg)?;
    Ok(dir.join("lead-exec"))
}
