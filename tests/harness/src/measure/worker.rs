//! The wrappers under measurement, lead-exec or `etcdctl lock`, each in a process group of its
//! own so that it dies whole, job included, on the way out.

use std::fs::{self, File};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::thread;
use std::time::{Duration, Instant};

use super::etcd::etcd_bin;
use super::{reap, Context};
use crate::FAST;

/// Connection flags every wrapper gets (`--cacert`, `--cert`, `--key` with `--tls`: both tools
/// spell them alike), set once before the first spawn.
pub static CONN_ARGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// The TTL of [`FAST`]; `etcdctl lock --ttl 3` matches it.
pub const FAST_TTL: Duration = Duration::from_secs(3);

/// The two wrappers compared.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Tool {
    LeadExec,
    Etcdctl,
}

/// Both tools, in the order the scenarios alternate them.
pub const TOOLS: [Tool; 2] = [Tool::LeadExec, Tool::Etcdctl];

impl Tool {
    pub fn idx(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Tool::LeadExec => "lead-exec",
            Tool::Etcdctl => "etcdctl lock",
        }
    }

    /// Where the tool keeps the candidates' keys of `election`.
    pub fn prefix(self, election: &str) -> String {
        match self {
            Tool::LeadExec => format!("lead-exec/elections/{election}/"),
            Tool::Etcdctl => format!("{election}/"),
        }
    }
}

/// One wrapper to start: which tool, on which election, running `sh -c script`.
pub struct WorkerSpec<'a> {
    pub tool: Tool,
    pub election: &'a str,
    pub endpoint: &'a str,
    pub id: &'a str,
    /// Lease flags for lead-exec, and the matching TTL for etcdctl.
    pub lead_exec_args: &'a [&'a str],
    pub ttl_s: u64,
    pub script: &'a str,
    /// Applied to the wrapper's command before it starts (a cgroup to start in, say).
    pub setup: Option<&'a dyn Fn(&mut Command)>,
}

impl<'a> WorkerSpec<'a> {
    /// With the tests' fast lease settings, [`FAST`] (TTL [`FAST_TTL`]).
    pub fn fast(
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
            ttl_s: FAST_TTL.as_secs(),
            script,
            setup: None,
        }
    }
}

/// Starts one worker in a process group of its own, so that it can be killed whole. `bin` is
/// lead-exec; the wrapper's stderr goes to `logs/ELECTION-ID.log`.
pub fn spawn(bin: &Path, logs: &Path, w: WorkerSpec) -> io::Result<Worker> {
    let mut cmd = match w.tool {
        Tool::LeadExec => {
            let mut c = Command::new(bin);
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
    cmd.args(CONN_ARGS.get().map_or(&[][..], Vec::as_slice));
    cmd.args(["--", "sh", "-c", w.script]);
    for (k, _) in std::env::vars() {
        // RUST_LOG too: it would change lead-exec's verbosity, and what its log costs.
        if k.starts_with("LEAD_EXEC_") || k.starts_with("ETCDCTL_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.env("ETCDCTL_API", "3");
    let log = logs.join(format!("{}-{}.log", w.election, w.id));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log)?)
        .process_group(0);
    if let Some(setup) = w.setup {
        setup(&mut cmd);
    }
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

/// One wrapper process (lead-exec or etcdctl) in its own process group. Dropping it SIGKILLs
/// the group and the job's group.
pub struct Worker {
    pub child: Child,
    pgid: i32,
    job_pgid: Option<i32>,
    /// The wrapper's stderr.
    pub log: PathBuf,
    /// The job's cgroup v2 directory, if lead-exec made one: a SIGKILLed watchdog cannot
    /// remove it, so the harness does.
    cgroup: Option<PathBuf>,
}

pub static LEAKED_CGROUPS: AtomicU32 = AtomicU32::new(0);

impl Worker {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Learns the job's pid (from its FIFO line) so that its group dies with the worker.
    pub fn adopt_job(&mut self, job: i32) {
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
    pub fn watchdog_slack_ms(&self) -> Option<f64> {
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
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// SIGKILL to the wrapper's group (wrapper, watchdog, etcdctl's job) and the job's group.
    pub fn kill_all(&mut self) {
        kill_groups(self.groups());
    }

    /// The worker's process group, and its job's once known.
    pub fn groups(&self) -> Vec<i32> {
        std::iter::once(self.pgid).chain(self.job_pgid).collect()
    }

    /// Waits for a normal exit; kills the worker if it does not come.
    pub fn wait_exit(&mut self, limit: Duration) {
        let groups = self.groups();
        let _ = wait_or_kill(&mut self.child, groups, limit);
    }
}

/// Waits for `child`, and SIGKILLs `groups` if it has not exited within `limit`. A blocking
/// wait, so that a timed run ends at the exit itself, not at the next turn of a polling loop.
pub fn wait_or_kill(
    child: &mut Child,
    groups: Vec<i32>,
    limit: Duration,
) -> io::Result<std::process::ExitStatus> {
    let (done, timer) = std::sync::mpsc::channel::<()>();
    let killer = thread::spawn(move || {
        if timer.recv_timeout(limit).is_err() {
            kill_groups(groups);
        }
    });
    let status = child.wait();
    let _ = done.send(());
    let _ = killer.join();
    status
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
            if remove_cgroup(dir) {
                LEAKED_CGROUPS.fetch_add(1, SeqCst);
            }
        }
    }
}

/// Removes the cgroup `dir` once its members are gone, trying for half a second (killed
/// members take a moment to be reaped); whether it removed it (false: it was not there).
pub fn remove_cgroup(dir: &Path) -> bool {
    for _ in 0..50 {
        if !dir.exists() {
            return false;
        }
        if fs::remove_dir(dir).is_ok() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    false
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

/// A `Key:   123 kB` line of /proc/PID/status, in KiB.
pub fn status_kib(pid: i32, key: &str) -> io::Result<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status"))?;
    kib_field(&s, key).with_context(|| format!("{key} of pid {pid}"))
}

pub fn pss_kib(pid: i32) -> Option<u64> {
    kib_field(
        &fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?,
        "Pss:",
    )
}

/// Private_Clean + Private_Dirty from smaps_rollup: what the process costs whatever else runs.
pub fn private_kib(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    Some(kib_field(&text, "Private_Clean:")? + kib_field(&text, "Private_Dirty:")?)
}

/// A field of one mapping in /proc/PID/smaps, the first named `mapping` (`[stack]`: the main
/// thread's stack), in KiB.
pub fn mapping_kib(pid: i32, mapping: &str, key: &str) -> Option<u64> {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let at = smaps.find(&format!(" {mapping}\n"))?;
    kib_field(&smaps[at..], key)
}

fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}
