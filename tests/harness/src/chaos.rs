//! Fault injection with a history checker, Jepsen style.
//!
//! A [`Cluster`] is a three-member etcd, N workers (each `lead-exec run` behind its own fault
//! proxies, one per etcd member, in its own cgroup when possible, with `--slots` when the
//! cluster has more than one) and a fenced SQLite ledger that every job writes to, fenced per
//! slot. Jobs log start, write, rejection and exit with CLOCK_MONOTONIC
//! timestamps; a watcher thread records when each job process dies; the harness records every
//! fault. [`check`] then verifies the history mechanically.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::proxy::{Mode, Proxy};
use super::*;

/// CLOCK_MONOTONIC in nanoseconds: the clock the ledger and the jobs use.
pub fn mono_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// A fresh fenced ledger and an empty event log in `dir`: (the ledger's database, the log).
pub fn new_ledger(dir: &Path) -> (PathBuf, PathBuf) {
    let db = dir.join("ledger.db");
    let events = dir.join("events");
    fs::write(&events, "").unwrap();
    let st = Command::new(ledger_bin())
        .args(["--db", db.to_str().unwrap(), "init"])
        .status()
        .unwrap();
    assert!(st.success(), "ledger init failed");
    (db, events)
}

/// The fenced ledger binary (the example `examples/ledger/`), built beside lead-exec.
pub fn ledger_bin() -> PathBuf {
    let bin_dir = Path::new(bin())
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let beside_me = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("ledger")))
        .unwrap_or_default();
    for candidate in [bin_dir.join("examples/ledger"), beside_me] {
        if candidate.is_file() {
            return candidate;
        }
    }
    // `cargo test --test integration` alone does not build examples.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--example", "ledger"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .status()
        .expect("building the ledger example");
    assert!(status.success(), "cargo build --example ledger failed");
    bin_dir.join("examples/ledger")
}

/// A fault as the harness injected it, for the checker.
#[derive(Debug, Clone)]
pub struct Mark {
    pub name: String,
    pub begin_ns: i64,
    pub heal_ns: Option<i64>,
    /// The worker whose term this fault ends by force, if any: frozen whole (its job cannot
    /// be stopped while frozen), or its key deleted by an operator (its job is stopped at
    /// once, but the next term does not wait for that). Its job may overlap the next term;
    /// then none of its writes may be accepted after the next term's first write.
    pub deposed_worker: Option<String>,
    /// Whether liveness is owed after the heal (a quorum exists).
    pub expect_liveness: bool,
}

pub struct ChaosWorker {
    pub name: String,
    pub proxies: Vec<Proxy>,
    pub child: Option<Child>,
    pub cgroup: Option<PathBuf>,
    log: PathBuf,
}

impl ChaosWorker {
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn set(&self, mode: Mode) {
        for p in &self.proxies {
            p.set(mode);
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// One line of the jobs' event log.
#[derive(Debug, Clone)]
pub struct Ev {
    pub ns: i64,
    pub kind: String,
    pub token: i64,
    pub worker: String,
    pub pid: i32,
    /// The job's `LEAD_EXEC_SLOT`.
    pub slot: u32,
}

pub struct Cluster {
    pub etcd: Etcd,
    pub dir: tempfile::TempDir,
    pub db: PathBuf,
    pub events: PathBuf,
    pub workers: Vec<ChaosWorker>,
    pub ttl: Duration,
    pub election: String,
    pub marks: Vec<Mark>,
    /// Lease flags besides `--ttl` (lead-exec's defaults when empty).
    pub lease_args: Vec<String>,
    /// `--slots`: how many jobs may run at once.
    pub slots: u32,
    deaths: Arc<Mutex<HashMap<i32, i64>>>,
    stop: Arc<AtomicBool>,
    cg_root: Option<PathBuf>,
    /// The cgroups of workers' earlier lives (a restart gives a worker a new one while its old
    /// watchdog may still be stopping the old job): removed with the root at the end.
    retired: Vec<PathBuf>,
}

/// Where this process's cgroup v2 directory is, if it can hold children.
fn own_cgroup() -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2").then(|| left.split_whitespace().nth(4))?
    })?;
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
    Some(Path::new(mount).join(path.trim_start_matches('/')))
}

impl Cluster {
    /// Three etcd members and `n` workers, each with lease TTL `ttl` (grace and safety
    /// margin 500 ms).
    pub fn start(n: usize, ttl: Duration) -> Cluster {
        let lease = ["--grace", "500ms", "--safety-margin", "500ms"];
        Cluster::start_with(n, ttl, lease.iter().map(|s| s.to_string()).collect())
    }

    /// As [`Cluster::start`], with lead-exec's default lease settings (TTL 10 s, grace 3 s,
    /// margin 1 s), as operators run it.
    pub fn start_defaults(n: usize) -> Cluster {
        Cluster::start_with(n, secs(10), Vec::new())
    }

    pub fn start_with(n: usize, ttl: Duration, lease_args: Vec<String>) -> Cluster {
        Cluster::start_slots(n, ttl, lease_args, 1)
    }

    /// As [`Cluster::start_with`], with workers that run `--slots slots`.
    pub fn start_slots(n: usize, ttl: Duration, lease_args: Vec<String>, slots: u32) -> Cluster {
        let etcd = Etcd::start3();
        let dir = tempfile::tempdir().unwrap();
        let (db, events) = new_ledger(dir.path());
        let cg_root = own_cgroup().and_then(|own| {
            let root = own.join(format!(
                "lead-exec-chaos-{}-{}",
                std::process::id(),
                mono_ns()
            ));
            fs::create_dir(&root).ok().map(|_| root)
        });
        let deaths = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        watch_deaths(events.clone(), deaths.clone(), stop.clone());
        let mut c = Cluster {
            etcd,
            dir,
            db,
            events,
            workers: Vec::new(),
            ttl,
            election: "chaos".into(),
            marks: Vec::new(),
            lease_args,
            slots,
            deaths,
            stop,
            cg_root,
            retired: Vec::new(),
        };
        for i in 0..n {
            let proxies = c
                .etcd
                .members
                .iter()
                .map(|m| Proxy::start(m.endpoint()))
                .collect();
            let name = format!("w{i}");
            let log = c.dir.path().join(format!("{name}.log"));
            c.workers.push(ChaosWorker {
                name,
                proxies,
                child: None,
                cgroup: None,
                log,
            });
            c.start_worker(i);
        }
        c
    }

    /// Starts (or restarts) worker `i`'s lead-exec.
    pub fn start_worker(&mut self, i: usize) {
        let ttl = format!("{}ms", self.ttl.as_millis());
        let endpoints = self.workers[i]
            .proxies
            .iter()
            .map(Proxy::endpoint)
            .collect::<Vec<_>>()
            .join(",");
        let ledger = ledger_bin();
        let cg = self.cg_root.as_ref().and_then(|root| {
            let d = root.join(format!("{}-{}", self.workers[i].name, mono_ns()));
            fs::create_dir(&d).ok().map(|_| d)
        });
        let mut cmd = Command::new(bin());
        cmd.args([
            "run",
            &self.election,
            "--endpoints",
            &endpoints,
            "--ttl",
            &ttl,
            "--id",
            &self.workers[i].name,
        ])
        .args(&self.lease_args)
        .args(if self.slots > 1 {
            vec!["--slots".to_string(), self.slots.to_string()]
        } else {
            vec![]
        })
        .arg("--")
        .arg(&ledger)
        .args([
            "--db",
            self.db.to_str().unwrap(),
            "settle",
            "--every",
            "50",
            "--events",
            self.events.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.workers[i].log)
                .unwrap(),
        );
        if let Some(d) = &cg {
            let procs = std::ffi::CString::new(d.join("cgroup.procs").to_str().unwrap()).unwrap();
            use std::os::unix::process::CommandExt;
            // SAFETY: open/write/close only, on a C string prepared before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    if fd >= 0 {
                        libc::write(fd, b"0".as_ptr().cast(), 1);
                        libc::close(fd);
                    }
                    Ok(())
                });
            }
        }
        self.workers[i].child = Some(cmd.spawn().unwrap());
        if let Some(old) = std::mem::replace(&mut self.workers[i].cgroup, cg) {
            self.retired.push(old);
        }
    }

    /// Parsed event log.
    pub fn events(&self) -> Vec<Ev> {
        parse_events(&fs::read_to_string(&self.events).unwrap_or_default())
    }

    /// Terms started so far: (token, worker), in start order.
    pub fn starts(&self) -> Vec<(i64, String)> {
        self.events()
            .into_iter()
            .filter(|e| e.kind == "start")
            .map(|e| (e.token, e.worker))
            .collect()
    }

    /// Waits until a term with a token above `above` is running; returns (worker index,
    /// token).
    pub fn wait_term_after(&self, above: i64, limit: Duration) -> (usize, i64) {
        let mut found = None;
        let ok = wait_until(limit, || {
            found = self
                .starts()
                .into_iter()
                .rfind(|(t, _)| *t > above)
                .map(|(t, w)| (self.index(&w), t));
            found.is_some()
        });
        assert!(
            ok,
            "no term after token {above} within {limit:?}\n{}",
            self.logs()
        );
        found.unwrap()
    }

    /// The running term: (worker index, token).
    pub fn wait_leader(&self) -> (usize, i64) {
        self.wait_term_after(0, secs(20))
    }

    pub fn index(&self, worker: &str) -> usize {
        self.workers.iter().position(|w| w.name == worker).unwrap()
    }

    pub fn last_token(&self) -> i64 {
        self.starts().last().map(|s| s.0).unwrap_or(0)
    }

    pub fn mark(&mut self, name: &str) -> usize {
        self.marks.push(Mark {
            name: name.into(),
            begin_ns: mono_ns(),
            heal_ns: None,
            deposed_worker: None,
            expect_liveness: true,
        });
        self.marks.len() - 1
    }

    pub fn heal(&mut self, mark: usize) {
        self.marks[mark].heal_ns = Some(mono_ns());
    }

    /// Freezes worker `i` whole: lead-exec, watchdog and job. cgroup.freeze when the worker
    /// has a cgroup (atomic), SIGSTOP to every process of its tree otherwise.
    pub fn freeze(&mut self, i: usize, on: bool) {
        let w = &self.workers[i];
        if let Some(cg) = &w.cgroup {
            fs::write(cg.join("cgroup.freeze"), if on { "1" } else { "0" }).unwrap();
            return;
        }
        let sig = if on { libc::SIGSTOP } else { libc::SIGCONT };
        for pid in tree(w.pid().unwrap()) {
            signal(pid, sig);
        }
    }

    /// SIGKILL worker `i`'s lead-exec.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.workers[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Terms started after token `t`: each one a job restart.
    pub fn terms_after(&self, t: i64) -> Vec<(i64, String)> {
        self.starts().into_iter().filter(|(k, _)| *k > t).collect()
    }

    /// Workers whose lead-exec has exited, with how.
    pub fn exited(&mut self) -> Vec<(String, std::process::ExitStatus)> {
        let mut out = Vec::new();
        for w in &mut self.workers {
            if let Some(st) = w.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                out.push((w.name.clone(), st));
            }
        }
        out
    }

    /// Whether etcd member `m` answers as a healthy member of a cluster with a quorum.
    pub fn member_healthy(&self, m: usize) -> bool {
        etcdctl_status(&self.etcd.members[m].endpoint(), &["endpoint", "health"]).success()
    }

    /// Restarts etcd member `m` (same data) and waits until it is healthy again.
    pub fn restart_member(&mut self, m: usize) {
        self.etcd.members[m].restart();
        let ok = wait_until(secs(30), || self.member_healthy(m));
        assert!(ok, "etcd member {m} not healthy after its restart");
    }

    /// The raft leader among the etcd members.
    pub fn raft_leader(&self) -> usize {
        self.etcd.raft_leader()
    }

    /// Stops every worker gracefully, waits for the jobs to be gone, and checks the history.
    pub fn finish(&mut self) -> Report {
        for w in &self.workers {
            if let Some(p) = w.pid() {
                if let Some(cg) = &w.cgroup {
                    let _ = fs::write(cg.join("cgroup.freeze"), "0");
                }
                signal(p, libc::SIGCONT);
                signal(p, libc::SIGTERM);
            }
        }
        for w in &mut self.workers {
            if let Some(mut c) = w.child.take() {
                let _ = wait_child(&mut c, secs(15));
            }
        }
        // Let the watcher see the last deaths.
        let evs = self.events();
        wait_until(secs(5), || {
            let d = self.deaths.lock().unwrap();
            evs.iter()
                .filter(|e| e.kind == "start")
                .all(|e| d.contains_key(&e.pid))
        });
        let deaths = self.deaths.lock().unwrap().clone();
        let (accepted, rejected) = read_ledger(&self.db);
        check(&History {
            events: self.events(),
            deaths,
            accepted,
            rejected,
            marks: self.marks.clone(),
            liveness_bound_ns: (self.ttl + secs(2)).as_nanos() as i64,
            slots: self.slots,
        })
    }

    pub fn logs(&self) -> String {
        self.workers
            .iter()
            .map(|w| format!("--- {}\n{}", w.name, w.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in &mut self.workers {
            if let Some(cg) = &w.cgroup {
                let _ = fs::write(cg.join("cgroup.freeze"), "0");
            }
            if let Some(mut c) = w.child.take() {
                signal(c.id() as i32, libc::SIGCONT);
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // The watchdogs kill the jobs once lead-exec is gone; then the cgroups can go, the
        // earlier lives' too, or the root stays behind.
        let current = self.workers.iter().filter_map(|w| w.cgroup.as_ref());
        for cg in current.chain(&self.retired) {
            wait_until(secs(5), || fs::remove_dir(cg).is_ok() || !cg.exists());
        }
        if let Some(root) = &self.cg_root {
            let _ = fs::remove_dir(root);
        }
    }
}

fn wait_child(c: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let mut st = None;
    wait_until(limit, || {
        st = c.try_wait().ok().flatten();
        st.is_some()
    });
    if st.is_none() {
        let _ = c.kill();
        st = c.wait().ok();
    }
    st
}

/// A process and all its descendants.
fn tree(root: i32) -> Vec<i32> {
    let mut all = vec![root];
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        if let Ok(dir) = fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                let ppid = stat
                    .rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<i32>().ok());
                if ppid == Some(parent) && !all.contains(&pid) {
                    all.push(pid);
                }
            }
        }
        i += 1;
    }
    all
}

/// Records the moment each job process dies (polls every 2 ms). Reads only what was appended
/// since the last poll, so that an hour's history costs no more per poll than a minute's.
pub(crate) fn watch_deaths(
    events: PathBuf,
    deaths: Arc<Mutex<HashMap<i32, i64>>>,
    stop: Arc<AtomicBool>,
) {
    std::thread::spawn(move || {
        use std::io::{Read, Seek, SeekFrom};
        let mut live: Vec<i32> = Vec::new();
        let mut offset = 0u64;
        let mut partial = String::new();
        while !stop.load(Ordering::SeqCst) {
            let mut fresh = String::new();
            if let Ok(mut f) = fs::File::open(&events) {
                if f.seek(SeekFrom::Start(offset)).is_ok() {
                    let _ = f.read_to_string(&mut fresh);
                }
            }
            offset += fresh.len() as u64;
            partial.push_str(&fresh);
            // Only whole lines: a job may be halfway through appending one.
            let whole = partial.rfind('\n').map_or(0, |i| i + 1);
            for e in parse_events(&partial[..whole]) {
                if e.kind == "start" {
                    live.push(e.pid);
                }
            }
            partial.drain(..whole);
            live.retain(|&pid| {
                if alive(pid) {
                    true
                } else {
                    deaths.lock().unwrap().insert(pid, mono_ns());
                    false
                }
            });
            std::thread::sleep(Duration::from_millis(2));
        }
    });
}

pub fn parse_events(text: &str) -> Vec<Ev> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(Ev {
                ns: f.next()?.parse().ok()?,
                kind: f.next()?.to_string(),
                token: f.next()?.parse().ok()?,
                worker: f.next()?.to_string(),
                pid: f.next()?.parse().ok()?,
                slot: f.next().and_then(|s| s.parse().ok()).unwrap_or(0),
            })
        })
        .collect()
}

/// Ledger writes as (token, CLOCK_MONOTONIC ns), in ledger order.
pub type Writes = Vec<(i64, i64)>;

/// Accepted and rejected writes.
pub fn read_ledger(db: &Path) -> (Writes, Writes) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let read = |sql: &str| -> Vec<(i64, i64)> {
        let mut st = conn.prepare(sql).unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    (
        read("SELECT token, at_ns FROM settlements ORDER BY id"),
        read("SELECT token, at_ns FROM rejections ORDER BY id"),
    )
}

/// Everything the checker reads.
pub struct History {
    pub events: Vec<Ev>,
    /// Job pid → when the watcher saw it dead.
    pub deaths: HashMap<i32, i64>,
    pub accepted: Writes,
    pub rejected: Writes,
    pub marks: Vec<Mark>,
    pub liveness_bound_ns: i64,
    /// How many jobs may run at once (`--slots`).
    pub slots: u32,
}

/// One term as the history shows it.
#[derive(Debug, Clone)]
pub struct Term {
    pub token: i64,
    pub slot: u32,
    pub worker: String,
    pub start_ns: i64,
    pub end_ns: i64,
}

#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub terms: Vec<Term>,
    pub accepted: usize,
    pub rejected: usize,
    /// Overlaps of a deposed worker's job with the next term (allowed: its writes were fenced).
    pub fenced_overlaps: usize,
    /// Beats (writes tried, accepted or rejected) of a token after a newer token of its slot
    /// started. Each is a violation unless its worker was deposed by force.
    pub late_beats: usize,
    /// Those of `late_beats` by a worker deposed by force (frozen whole, its key deleted).
    pub late_beats_deposed: usize,
}

impl Report {
    /// Stale writes the ledger accepted.
    pub fn stale_writes(&self) -> usize {
        self.violations
            .iter()
            .filter(|v| v.starts_with("stale write") || v.contains("wrote after"))
            .count()
    }

    /// More jobs at once than slots.
    pub fn overlaps(&self) -> usize {
        self.violations
            .iter()
            .filter(|v| v.starts_with("overlap"))
            .count()
    }

    pub fn assert_ok(&self, context: &str) {
        assert!(
            self.violations.is_empty(),
            "checker found violations:\n{}\nterms: {:#?}\n{context}",
            self.violations.join("\n"),
            self.terms
        );
    }
}

/// The checker, for `slots` jobs at once (one: a single leader):
/// 1. accepted writes never go down in token, within each slot (the ledger fences per slot);
/// 2. with one slot, every spawn's token is larger than every earlier spawn's; with more,
///    no token is spawned twice;
/// 3. never more than `slots` jobs alive at once (with one: two terms never overlap), except
///    where a fault deposed an older one by force (its whole worker frozen, its key deleted):
///    then none of its writes after the first write of a newer term of its slot was accepted;
/// 4. after a fault heals with a quorum, a job runs within TTL + 2 s;
/// 5. no job beats (tries a write) after a newer token of its slot started, unless its worker
///    was deposed by force (then 3 holds for it).
pub fn check(h: &History) -> Report {
    let mut r = Report {
        accepted: h.accepted.len(),
        rejected: h.rejected.len(),
        ..Report::default()
    };
    let slot_of: HashMap<i64, u32> = h.events.iter().map(|e| (e.token, e.slot)).collect();
    let slot = |token: i64| slot_of.get(&token).copied().unwrap_or(0);
    let mut last: HashMap<u32, i64> = HashMap::new();
    for &(t, _) in &h.accepted {
        let before = last.insert(slot(t), t);
        if let Some(b) = before.filter(|&b| t < b) {
            r.violations
                .push(format!("stale write accepted: token {t} after {b}"));
        }
    }
    let now = mono_ns();
    let mut terms: Vec<Term> = h
        .events
        .iter()
        .filter(|e| e.kind == "start")
        .map(|e| Term {
            token: e.token,
            slot: e.slot,
            worker: e.worker.clone(),
            start_ns: e.ns,
            end_ns: *h.deaths.get(&e.pid).unwrap_or(&now),
        })
        .collect();
    terms.sort_by_key(|t| t.start_ns);
    if h.slots <= 1 {
        for w in terms.windows(2) {
            if w[1].token <= w[0].token {
                r.violations.push(format!(
                    "spawn token did not increase: {} after {}",
                    w[1].token, w[0].token
                ));
            }
        }
    } else {
        let mut seen = std::collections::HashSet::new();
        for t in &terms {
            if !seen.insert(t.token) {
                r.violations
                    .push(format!("spawn token {} spawned twice", t.token));
            }
        }
    }
    let slots = h.slots.max(1) as usize;
    for (j, b) in terms.iter().enumerate() {
        // The jobs still alive when b started, other than deposed ones.
        let mut alive = Vec::new();
        for a in terms[..j].iter().filter(|a| a.end_ns > b.start_ns) {
            let deposed = h.marks.iter().any(|m| {
                m.deposed_worker.as_deref() == Some(a.worker.as_str())
                    && m.begin_ns <= b.start_ns
                    && m.heal_ns.is_none_or(|heal| heal >= a.start_ns)
            });
            if !deposed {
                alive.push(a);
                continue;
            }
            r.fenced_overlaps += 1;
            if a.slot != b.slot {
                continue;
            }
            let first_new = h
                .accepted
                .iter()
                .find(|&&(t, _)| t == b.token)
                .map(|&(_, at)| at);
            let late_accepted = first_new
                .is_some_and(|first| h.accepted.iter().any(|&(t, at)| t == a.token && at > first));
            if late_accepted {
                r.violations.push(format!(
                    "deposed worker {}'s token {} wrote after token {} did",
                    a.worker, a.token, b.token
                ));
            }
        }
        if alive.len() < slots {
            continue;
        }
        if slots == 1 {
            for a in alive {
                r.violations.push(format!(
                    "overlap: token {} ({}) alive until {} ms after token {} ({}) started",
                    a.token,
                    a.worker,
                    (a.end_ns - b.start_ns) / 1_000_000,
                    b.token,
                    b.worker
                ));
            }
        } else {
            let others: Vec<String> = alive.iter().map(|a| a.token.to_string()).collect();
            r.violations.push(format!(
                "overlap: {} jobs at once with {slots} slots: token {} ({}) started while tokens {} ran",
                alive.len() + 1,
                b.token,
                b.worker,
                others.join(", ")
            ));
        }
    }
    late_beats(h, &terms, &mut r);
    for m in &h.marks {
        let (Some(heal), true) = (m.heal_ns, m.expect_liveness) else {
            continue;
        };
        let by = heal + h.liveness_bound_ns;
        if by > now {
            continue;
        }
        // A later fault that begins inside the window may legitimately stop every job: then
        // it is enough that some job ran between the heal and that fault.
        let next = h
            .marks
            .iter()
            .map(|n| n.begin_ns)
            .filter(|&b| b > heal)
            .min();
        let live = match next {
            Some(next) if next < by => terms.iter().any(|t| t.start_ns <= next && t.end_ns >= heal),
            _ => {
                terms.iter().any(|t| t.start_ns <= by && t.end_ns >= by)
                    || terms.iter().any(|t| t.start_ns >= heal && t.start_ns <= by)
            }
        };
        if !live {
            r.violations.push(format!(
                "liveness: no job ran within {} ms of healing {}",
                h.liveness_bound_ns / 1_000_000,
                m.name
            ));
        }
    }
    r.terms = terms;
    r
}

/// Check 5: beats of an old token after a newer token's start.
fn late_beats(h: &History, terms: &[Term], r: &mut Report) {
    let beats = h
        .events
        .iter()
        .filter(|e| e.kind == "write" || e.kind == "reject");
    for e in beats {
        let Some(newer) = terms
            .iter()
            .filter(|t| t.token > e.token && t.slot == e.slot && t.start_ns < e.ns)
            .min_by_key(|t| t.start_ns)
        else {
            continue;
        };
        r.late_beats += 1;
        let own_start = terms
            .iter()
            .find(|t| t.token == e.token)
            .map_or(i64::MIN, |t| t.start_ns);
        let deposed = h.marks.iter().any(|m| {
            m.deposed_worker.as_deref() == Some(e.worker.as_str())
                && m.begin_ns <= newer.start_ns
                && m.heal_ns.is_none_or(|heal| heal >= own_start)
        });
        if deposed {
            r.late_beats_deposed += 1;
        } else {
            r.violations.push(format!(
                "beat after a newer token: token {} ({}) {} {} ms after token {} ({}) started",
                e.token,
                e.worker,
                e.kind,
                (e.ns - newer.start_ns) / 1_000_000,
                newer.token,
                newer.worker
            ));
        }
    }
}

/// Mode helpers re-exported for the fault tests.
pub use super::proxy::Mode as ProxyMode;

/// What a soak run saw.
#[derive(Debug, Default)]
pub struct SoakReport {
    pub trials: usize,
    pub faults_injected: usize,
    pub per_fault: std::collections::BTreeMap<&'static str, usize>,
    /// Fault start → next job running, per fault that moved leadership.
    pub failovers: std::collections::BTreeMap<&'static str, Vec<Duration>>,
    pub violations: Vec<String>,
    pub accepted: usize,
    pub rejected: usize,
    pub fenced_overlaps: usize,
    pub terms: usize,
    /// Job restarts caused by faults that lead-exec is meant to ride through.
    pub restarts: std::collections::BTreeMap<&'static str, usize>,
}

/// Routine etcd operations and network blips: the term should survive these.
pub const RIDDEN: [&str; 5] = [
    "raft-leader-kill",
    "member-down",
    "rolling-restart",
    "reply-hold",
    "endpoint-blackhole",
];

/// xorshift64*: a deterministic generator, so a seed replays the same fault schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub const FAULTS: [&str; 13] = [
    "leader-sigkill",
    "leader-freeze",
    "worker-freeze",
    "blackhole",
    "latency-over",
    "resets",
    "raft-leader-kill",
    "quorum-loss",
    "member-down",
    "rolling-restart",
    "reply-hold",
    "endpoint-blackhole",
    "key-delete",
];

impl Cluster {
    /// The running term: the newest start whose job is alive.
    pub fn current(&self, limit: Duration) -> (usize, i64) {
        let mut found = None;
        let ok = wait_until(limit, || {
            found = self
                .events()
                .into_iter()
                .filter(|e| e.kind == "start" && alive(e.pid))
                .max_by_key(|e| e.token)
                .map(|e| (self.index(&e.worker), e.token));
            found.is_some()
        });
        assert!(ok, "no job running within {limit:?}\n{}", self.logs());
        found.unwrap()
    }

    /// Start time of the first term above `token`, relative to `since_ns`.
    fn failover_since(&self, since_ns: i64, token: i64) -> Option<Duration> {
        self.events()
            .into_iter()
            .find(|e| e.kind == "start" && e.token > token)
            .map(|e| Duration::from_nanos((e.ns - since_ns).max(0) as u64))
    }
}

/// Mixes faults at random (seeded) for `trials` rounds on a fresh cluster of `workers` that
/// run `--slots slots`, then runs the checker. `say` receives one progress line per trial.
pub fn soak(
    workers: usize,
    slots: u32,
    trials: usize,
    seed: u64,
    ttl: Duration,
    mut say: impl FnMut(&str),
) -> SoakReport {
    let mut rng = Rng(seed.max(1));
    let lease = ["--grace", "500ms", "--safety-margin", "500ms"].map(String::from);
    // One more worker than slots, so that a fault always has a candidate to hand over to.
    let n = workers.max(2).max(slots as usize + 1);
    let mut c = Cluster::start_slots(n, ttl, lease.to_vec(), slots);
    let mut rep = SoakReport {
        trials,
        ..SoakReport::default()
    };
    let recover = ttl + secs(15);
    for trial in 0..trials {
        let (i, t) = c.current(recover);
        let fault = FAULTS[rng.below(FAULTS.len())];
        let m = c.mark(fault);
        let begin = c.marks[m].begin_ns;
        let mut moved = true;
        match fault {
            "leader-sigkill" => {
                c.kill(i);
                c.wait_term_after(t, recover);
                c.start_worker(i);
            }
            "leader-freeze" => {
                let pid = c.workers[i].pid().unwrap();
                signal(pid, libc::SIGSTOP);
                c.wait_term_after(t, recover);
                signal(pid, libc::SIGCONT);
            }
            "worker-freeze" => {
                c.marks[m].deposed_worker = Some(c.workers[i].name.clone());
                c.freeze(i, true);
                c.wait_term_after(t, recover);
                std::thread::sleep(Duration::from_millis(200));
                c.freeze(i, false);
            }
            "blackhole" | "latency-over" => {
                let mode = if fault == "blackhole" {
                    Mode::Blackhole
                } else {
                    Mode::Delay(ttl.as_millis() as u64)
                };
                c.workers[i].set(mode);
                c.wait_term_after(t, recover);
                c.workers[i].set(Mode::Pass);
            }
            "resets" => {
                moved = false;
                for _ in 0..3 {
                    c.workers[i].set(Mode::Reset);
                    std::thread::sleep(Duration::from_millis(150));
                    c.workers[i].set(Mode::Pass);
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
            "raft-leader-kill" => {
                moved = false;
                let r = c.raft_leader();
                c.etcd.members[r].kill();
                std::thread::sleep(Duration::from_millis(500 + rng.below(1500) as u64));
                c.etcd.members[r].restart();
                c.etcd.wait_healthy(secs(20));
            }
            "member-down" => {
                moved = false;
                let k = rng.below(3);
                c.etcd.members[k].kill();
                std::thread::sleep(ttl);
                c.restart_member(k);
            }
            "rolling-restart" => {
                moved = false;
                for k in 0..3 {
                    c.restart_member(k);
                }
            }
            "reply-hold" => {
                // On one endpoint of the leader's: a lost reply if it is the one in use.
                moved = false;
                let k = rng.below(3);
                c.workers[i].proxies[k].set(Mode::HoldReplies);
                std::thread::sleep(ttl / 2);
                c.workers[i].proxies[k].set(Mode::Pass);
            }
            "endpoint-blackhole" => {
                moved = false;
                let k = rng.below(3);
                for w in &c.workers {
                    w.proxies[k].set(Mode::Blackhole);
                }
                std::thread::sleep(ttl);
                for w in &c.workers {
                    w.proxies[k].set(Mode::Pass);
                }
            }
            "quorum-loss" => {
                let keep = rng.below(3);
                for (k, mem) in c.etcd.members.iter().enumerate() {
                    if k != keep {
                        mem.stop();
                    }
                }
                std::thread::sleep(ttl + Duration::from_millis(rng.below(1000) as u64));
                for (k, mem) in c.etcd.members.iter().enumerate() {
                    if k != keep {
                        mem.cont();
                    }
                }
                c.wait_term_after(t, recover);
            }
            _ => {
                // The oldest key, a holder's: with one slot, the leader's (worker i).
                let prefix = format!("lead-exec/elections/{}/", c.election);
                let out = c
                    .etcd
                    .ctl(&["get", "--prefix", "--sort-by=CREATE", &prefix]);
                let mut kv = out.lines().filter(|l| !l.is_empty());
                if let (Some(k), Some(v)) = (kv.next(), kv.next()) {
                    let id = serde_json::from_str::<serde_json::Value>(v).ok();
                    let id = id.as_ref().and_then(|v| v["id"].as_str());
                    c.marks[m].deposed_worker =
                        Some(id.unwrap_or(c.workers[i].name.as_str()).to_string());
                    c.etcd.ctl(&["del", k]);
                }
                c.wait_term_after(t, recover);
            }
        }
        c.heal(m);
        if RIDDEN.contains(&fault) {
            let restarts = c.terms_after(t).len();
            if restarts > 0 {
                *rep.restarts.entry(fault).or_default() += restarts;
            }
        }
        *rep.per_fault.entry(fault).or_default() += 1;
        rep.faults_injected += 1;
        let took = if moved {
            c.failover_since(begin, t)
        } else {
            None
        };
        if let Some(d) = took {
            rep.failovers.entry(fault).or_default().push(d);
        }
        say(&format!(
            "trial {:>3}: {fault:<16} leader w{i} token {t}{}",
            trial + 1,
            took.map(|d| format!(" -> new term after {:.2} s", d.as_secs_f64()))
                .unwrap_or_default()
        ));
        // Some writes under the new (or same) term before the next fault.
        c.current(recover);
        std::thread::sleep(Duration::from_millis(300));
    }
    let r = c.finish();
    rep.violations = r.violations;
    rep.accepted = r.accepted;
    rep.rejected = r.rejected;
    rep.fenced_overlaps = r.fenced_overlaps;
    rep.terms = r.terms.len();
    rep
}
