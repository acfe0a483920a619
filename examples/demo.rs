//! The live demo: three workers, one settlement job, one SQLite ledger fenced by
//! `FENCING_TOKEN`.
//!
//! ```text
//! cargo run --release --example demo      # or: bash examples/demo.sh on a fresh machine
//! ```
//!
//! It starts a throwaway etcd, runs `lead-exec run settlement -- ledger settle` on three
//! workers, and then, narrating each step:
//!
//! 1. lets the first leader settle a few batches;
//! 2. `kill -9`s the leader's lead-exec: its watchdog kills the job at once, and another
//!    worker takes over when the old lease expires (about the TTL), with a larger token;
//! 3. sends SIGTERM to the new leader: it stops its job and resigns, and the last worker
//!    takes over at once;
//! 4. replays a write with the first leader's token, as a frozen old leader would: the ledger
//!    rejects it, because it has already seen a higher token;
//! 5. stops everything and prints the ledger and a summary.
//!
//! Everything it starts is killed on the way out, on success, error, panic or Ctrl-C.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, ensure, Context, Result};
use harness::Member;

const ELECTION: &str = "settlement";
const WORKERS: [&str; 3] = ["worker-a", "worker-b", "worker-c"];
/// Short lease settings so that the demo is quick; grace + margin stay well below the TTL.
const TTL: &str = "3s";
const GRACE: &str = "500ms";
const SAFETY_MARGIN: &str = "500ms";
/// Interval between two settlement batches, in milliseconds.
const EVERY_MS: &str = "300";
/// Batches each new leader settles before the next step, so every term is visible.
const BATCHES_PER_TERM: u32 = 5;
/// A pause between steps, only so that a person can read along.
const READING_PAUSE: Duration = Duration::from_millis(1500);
/// Exit codes that matter here (see lead-exec's `exit` module and the ledger's usage).
const EXIT_UNAVAILABLE: i32 = 69;
const EXIT_NO_LEADER: i32 = 3;
const EXIT_REJECTED: i32 = 3;

fn main() -> ExitCode {
    catch_interrupts();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lead-exec demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The whole demo. The guards are declared so that they drop in the right order: workers
/// first, then etcd, then the temporary directory.
fn run() -> Result<()> {
    // etcd first: no point in a build of several minutes if the demo cannot run anyway.
    require_etcd()?;
    let bins = locate_binaries()?;
    let dir = tempfile::Builder::new()
        .prefix("lead-exec-demo-")
        .tempdir()
        .context("creating a temporary directory")?;
    let db = dir.path().join("ledger.db");

    println!();
    println!("lead-exec demo: three workers, one settlement job, one SQLite ledger.");
    println!("  The job only runs on the leader and writes with the leader's FENCING_TOKEN;");
    println!("  the ledger rejects any token lower than the highest it has accepted.");
    println!("  lead-exec: {}", bins.lead_exec.display());
    println!("  ledger:    {}", bins.ledger.display());
    println!("  scratch:   {}", dir.path().display());

    start(); // timestamps count from here
    banner(
        1,
        "start a throwaway etcd and three workers; one leads and settles batches",
    );
    let etcd = start_etcd(dir.path());
    wait_until_etcd_answers(&bins, &etcd)?;
    say(&format!("etcd is up at {}", etcd.endpoint()));
    ledger(&bins, &db, &["init"]).context("ledger init")?;

    let (tx, rx) = mpsc::channel();
    let mut workers = Workers::default();
    for name in WORKERS {
        workers.spawn(name, &bins, &etcd.endpoint(), &db, tx.clone())?;
    }
    drop(tx);
    let mut mon = Monitor::new(rx);

    let first = first_leader(&mut mon)?;
    say(&format!(
        "{} leads with token {}. `lead-exec status {ELECTION}` says:",
        WORKERS[first.worker], first.token
    ));
    print_indented(&status(&bins, &etcd.endpoint())?);

    sleep(READING_PAUSE)?;
    banner(
        2,
        "kill -9 the leader's lead-exec (its watchdog kills the job at once)",
    );
    let crash = kill_leader(&mut mon, &mut workers, first, &bins, &etcd.endpoint())?;

    sleep(READING_PAUSE)?;
    banner(
        3,
        "graceful handover: SIGTERM the new leader (it stops its job and resigns)",
    );
    let handover = terminate_leader(&mut mon, &mut workers, crash.next)?;

    sleep(READING_PAUSE)?;
    banner(
        4,
        "a frozen old leader wakes up and writes with its old token",
    );
    let stale = stale_write(&bins, &db, first.token)?;

    sleep(READING_PAUSE)?;
    banner(5, "stop the remaining workers and look at the ledger");
    stop_all(&mut workers)?;
    let show = ledger(&bins, &db, &["show"])?;
    print_indented(&show.stdout);
    let check = ledger(&bins, &db, &["check"])?;

    summary(
        &mon,
        &Outcome {
            crash,
            handover,
            stale,
            check_ok: check.code == Some(0),
            check_text: check.stdout.trim().to_string(),
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Narration
// ---------------------------------------------------------------------------------------------

/// Demo start: every printed line is stamped with the time since then.
fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

fn stamp(at: Instant) -> String {
    format!(
        "{:7.2}s",
        at.saturating_duration_since(start()).as_secs_f64()
    )
}

fn banner(n: u32, text: &str) {
    println!();
    println!("==> step {n}: {text}");
}

/// A line of narration, as opposed to a line a worker printed.
fn say(text: &str) {
    println!("{}  -- {text}", stamp(Instant::now()));
}

fn print_indented(text: &str) {
    for line in text.lines() {
        println!("             {line}");
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// Interrupts: Ctrl-C must still run the cleanup guards
// ---------------------------------------------------------------------------------------------

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// The default action of SIGINT would skip every Drop guard and leave etcd and the workers
/// running; a flag lets the waiting loops fail instead, and the guards clean up.
fn catch_interrupts() {
    let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; stopping everything");
    }
    Ok(())
}

fn sleep(d: Duration) -> Result<()> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        check_interrupted()?;
        std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
    }
    check_interrupted()
}

// ---------------------------------------------------------------------------------------------
// Binaries
// ---------------------------------------------------------------------------------------------

struct Bins {
    lead_exec: PathBuf,
    ledger: PathBuf,
}

/// Finds lead-exec and the ledger next to this demo (target/<profile>/examples/demo), and
/// builds them first if they are missing or older than the sources: `cargo run --example
/// demo` builds only the demo itself.
fn locate_binaries() -> Result<Bins> {
    let exe = std::env::current_exe().context("locating the demo executable")?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("the demo is not inside a target/<profile>/examples directory")?
        .to_path_buf();
    let bins = Bins {
        lead_exec: profile_dir.join("lead-exec"),
        ledger: profile_dir.join("examples").join("ledger"),
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Both link the library; the ledger also has its own source file.
    let library = newest_mtime(&[
        root.join("src"),
        root.join("Cargo.toml"),
        root.join("Cargo.lock"),
    ]);
    let ledger_src = newest_mtime(&[root.join("examples").join("ledger.rs")]);
    let stale = |bin: &Path, sources: Option<SystemTime>| match (mtime(bin), sources) {
        (None, _) => true,
        (Some(built), Some(src)) => built < src,
        (Some(_), None) => false,
    };
    if stale(&bins.lead_exec, library) || stale(&bins.ledger, library.max(ledger_src)) {
        build(root, &profile_dir)?;
    }
    for p in [&bins.lead_exec, &bins.ledger] {
        ensure!(p.exists(), "{} is missing after the build", p.display());
    }
    Ok(bins)
}

/// Builds lead-exec and the ledger with the same profile as this demo.
fn build(root: &Path, profile_dir: &Path) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    // `cargo run` exports the demo's package variables (CARGO_PKG_*, CARGO_MANIFEST_DIR...).
    // Some build scripts (ring's) rerun when those change, so passing them on would make this
    // build and the next `cargo run` rebuild each other's dependencies every time.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || matches!(
                k.as_ref(),
                "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE" | "OUT_DIR"
            )
        {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.current_dir(root)
        .args(["build", "--bin", "lead-exec", "--example", "ledger"]);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
        None => {}
    }
    println!("lead-exec demo: building lead-exec and the ledger example (the first build takes a few minutes)...");
    let status = cmd
        .status()
        .with_context(|| format!("running {}", cargo.to_string_lossy()))?;
    ensure!(status.success(), "the build failed ({status})");
    Ok(())
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest modification time of these files and, recursively, of the files under these
/// directories.
fn newest_mtime(paths: &[PathBuf]) -> Option<SystemTime> {
    let mut newest = None;
    let mut todo: Vec<PathBuf> = paths.to_vec();
    while let Some(p) = todo.pop() {
        if p.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                todo.extend(rd.flatten().map(|e| e.path()));
            }
        } else if let Some(t) = mtime(&p) {
            newest = newest.max(Some(t));
        }
    }
    newest
}

/// The only external program the demo needs.
fn require_etcd() -> Result<()> {
    harness::locate("etcd", "etcd-server").map_err(anyhow::Error::msg)?;
    Ok(())
}

/// A command with a clean environment: stray LEAD_EXEC_*, ETCDCTL_* or ETCD_* variables from
/// the user's shell would change how lead-exec or etcd behave.
fn clean_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    clean_env(&mut cmd);
    cmd
}

/// Leaves out the caller's lead-exec and etcd settings, so that they cannot steer the demo.
fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("LEAD_EXEC_")
            || k.starts_with("ETCDCTL_")
            || k.starts_with("ETCD_")
            || k == "FENCING_TOKEN"
            || k == "RUST_LOG"
        {
            cmd.env_remove(k.as_ref());
        }
    }
}

/// Children get their own process group (so Ctrl-C reaches only the demo, which then cleans
/// up in order) and die with the demo even if it is killed outright.
fn detach_and_tie(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: prctl is async-signal-safe. Children are spawned from the main thread, whose
    // exit is the demo's exit.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// What a short command printed and how it exited.
struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn capture(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    Ok(Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs the ledger; fails unless it exits 0, 1 or 3 (the answers, as opposed to errors).
fn ledger(bins: &Bins, db: &Path, args: &[&str]) -> Result<Output> {
    let mut cmd = clean_command(&bins.ledger);
    cmd.arg("--db").arg(db).args(args);
    let out = capture(&mut cmd)?;
    if !matches!(out.code, Some(0 | 1 | EXIT_REJECTED)) {
        bail!(
            "ledger {} failed ({:?}): {}",
            args.join(" "),
            out.code,
            out.stderr.trim()
        );
    }
    Ok(out)
}

fn status(bins: &Bins, endpoint: &str) -> Result<String> {
    let mut cmd = clean_command(&bins.lead_exec);
    cmd.args(["status", ELECTION, "--endpoints", endpoint]);
    let out = capture(&mut cmd)?;
    Ok(format!("{}{}", out.stdout, out.stderr))
}

// ---------------------------------------------------------------------------------------------
// etcd
// ---------------------------------------------------------------------------------------------

/// A single-member etcd in the scratch directory (the shared harness's launcher), detached
/// and tied to the demo like the workers, killed on drop.
fn start_etcd(dir: &Path) -> Member {
    Member::single(dir, "demo", |cmd| {
        clean_env(cmd);
        detach_and_tie(cmd);
    })
}

/// The end of etcd's log, for error messages.
fn log_tail(etcd: &Member) -> String {
    let text = std::fs::read_to_string(etcd.log()).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// etcd takes a moment to elect itself; `lead-exec status` exits 69 until it answers.
fn wait_until_etcd_answers(bins: &Bins, etcd: &Member) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        check_interrupted()?;
        let mut cmd = clean_command(&bins.lead_exec);
        cmd.args(["status", ELECTION, "--endpoints", &etcd.endpoint()])
            .args(["--dial-timeout", "1s"]);
        let out = capture(&mut cmd)?;
        match out.code {
            Some(0 | EXIT_NO_LEADER) => return Ok(()),
            Some(EXIT_UNAVAILABLE) if Instant::now() < until => sleep(Duration::from_millis(200))?,
            _ => bail!(
                "etcd does not answer at {}: {}\netcd log:\n{}",
                etcd.endpoint(),
                out.stderr.trim(),
                log_tail(etcd)
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Workers and what they print
// ---------------------------------------------------------------------------------------------

/// A line or the end of a worker's output. Reader threads print lines as they arrive and
/// send them here, so the demo can wait for events instead of sleeping.
#[derive(Debug, Clone)]
enum What {
    /// A line the job printed (stdout).
    Job(String),
    /// A line lead-exec logged (stderr), timestamp removed.
    Log(String),
    /// Both of the worker's pipes closed: lead-exec, its watchdog and the job are all gone.
    Closed,
}

#[derive(Debug, Clone)]
struct Event {
    worker: usize,
    at: Instant,
    what: What,
}

impl Event {
    /// `(token, batch)` of a `[worker-x] token T: settled batch K` line.
    fn settled(&self) -> Option<(i64, u64)> {
        let What::Job(line) = &self.what else {
            return None;
        };
        let rest = line.split_once("] token ")?.1;
        let (token, rest) = rest.split_once(": settled batch ")?;
        Some((token.parse().ok()?, rest.trim().parse().ok()?))
    }

    /// The token of lead-exec's `leading: job started ... token=T` log line.
    fn leading(&self) -> Option<i64> {
        let What::Log(line) = &self.what else {
            return None;
        };
        if !line.contains("leading: job started") {
            return None;
        }
        field(line, "token")?.parse().ok()
    }

    fn is_closed(&self) -> bool {
        matches!(self.what, What::Closed)
    }
}

/// The value of `name=value` in a log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .map(|v| v.trim_matches('"'))
}

/// Everything the workers printed so far, and the channel the rest arrives on.
struct Monitor {
    rx: Receiver<Event>,
    seen: Vec<Event>,
}

impl Monitor {
    fn new(rx: Receiver<Event>) -> Monitor {
        Monitor {
            rx,
            seen: Vec::new(),
        }
    }

    /// A position in the event history: waits from here on ignore what came before.
    fn mark(&mut self) -> usize {
        while let Ok(ev) = self.rx.try_recv() {
            self.seen.push(ev);
        }
        self.seen.len()
    }

    /// The first event at or after `since` for which `f` says yes; fails after `timeout`.
    fn wait_for<T>(
        &mut self,
        since: usize,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Event) -> Option<T>,
    ) -> Result<T> {
        let until = Instant::now() + timeout;
        let mut i = since;
        loop {
            while i < self.seen.len() {
                if let Some(t) = f(&self.seen[i]) {
                    return Ok(t);
                }
                i += 1;
            }
            check_interrupted()?;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("timed out after {} waiting for {what}", secs(timeout));
            }
            match self.rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(ev) => self.seen.push(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("every worker exited while waiting for {what}")
                }
            }
        }
    }

    /// The terms in the order lead-exec started them: `(worker, token)`.
    fn terms(&self) -> Vec<(usize, i64)> {
        self.seen
            .iter()
            .filter_map(|e| e.leading().map(|t| (e.worker, t)))
            .collect()
    }
}

/// One worker: `lead-exec run settlement ... -- ledger settle`.
struct Worker {
    name: &'static str,
    child: Child,
    exited: Option<ExitStatus>,
}

/// The workers, killed on drop if still running.
#[derive(Default)]
struct Workers(Vec<Worker>);

impl Workers {
    fn spawn(
        &mut self,
        name: &'static str,
        bins: &Bins,
        endpoint: &str,
        db: &Path,
        tx: Sender<Event>,
    ) -> Result<()> {
        let mut cmd = clean_command(&bins.lead_exec);
        cmd.args(["run", ELECTION, "--endpoints", endpoint])
            .args([
                "--ttl",
                TTL,
                "--grace",
                GRACE,
                "--safety-margin",
                SAFETY_MARGIN,
            ])
            .args(["--id", name, "--"])
            .arg(&bins.ledger)
            .arg("--db")
            .arg(db)
            .args(["settle", "--every", EVERY_MS])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        detach_and_tie(&mut cmd);
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let index = self.0.len();
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        forward(index, name, out, err, tx);
        self.0.push(Worker {
            name,
            child,
            exited: None,
        });
        Ok(())
    }

    fn signal(&self, i: usize, sig: libc::c_int) -> Result<()> {
        let w = &self.0[i];
        ensure!(w.exited.is_none(), "{} already exited", w.name);
        // SAFETY: plain kill(2) on a child we have not reaped yet, so the pid is still ours.
        if unsafe { libc::kill(w.child.id() as libc::pid_t, sig) } != 0 {
            bail!(
                "cannot signal {}: {}",
                w.name,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Waits up to `timeout` for worker `i`'s lead-exec to exit.
    fn wait_exit(&mut self, i: usize, timeout: Duration) -> Result<ExitStatus> {
        let until = Instant::now() + timeout;
        let w = &mut self.0[i];
        loop {
            if let Some(s) = w.exited {
                return Ok(s);
            }
            if let Some(s) = w.child.try_wait()? {
                w.exited = Some(s);
                return Ok(s);
            }
            if Instant::now() >= until {
                bail!(
                    "{}'s lead-exec did not exit within {}",
                    w.name,
                    secs(timeout)
                );
            }
            sleep(Duration::from_millis(10))?;
        }
    }

    fn running(&mut self) -> Vec<usize> {
        (0..self.0.len())
            .filter(|&i| {
                let w = &mut self.0[i];
                if w.exited.is_none() {
                    w.exited = w.child.try_wait().ok().flatten();
                }
                w.exited.is_none()
            })
            .collect()
    }
}

impl Drop for Workers {
    /// SIGKILL is enough: lead-exec's watchdog then kills each job's process group at once.
    fn drop(&mut self) {
        for w in &mut self.0 {
            if w.exited.is_none() {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
    }
}

/// Reads a worker's stdout (the job's lines) and stderr (lead-exec's log) on two threads,
/// prints what is worth showing, and reports every line and the end of both pipes.
fn forward(
    index: usize,
    name: &'static str,
    out: impl Read + Send + 'static,
    err: impl Read + Send + 'static,
    tx: Sender<Event>,
) {
    let reader = |stream: Box<dyn Read + Send>, is_log: bool, tx: Sender<Event>| {
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                let at = Instant::now();
                let what = if is_log {
                    let line = tidy_log(&line, name);
                    if interesting(&line) {
                        println!("{}  {name} | {line}", stamp(at));
                    }
                    What::Log(line)
                } else {
                    println!("{}  {name} | {line}", stamp(at));
                    What::Job(line)
                };
                let _ = tx.send(Event {
                    worker: index,
                    at,
                    what,
                });
            }
        })
    };
    let a = reader(Box::new(out), false, tx.clone());
    let b = reader(Box::new(err), true, tx.clone());
    // The pipes close when the last process holding them (lead-exec, watchdog, job) is gone.
    std::thread::spawn(move || {
        let _ = a.join();
        let _ = b.join();
        let _ = tx.send(Event {
            worker: index,
            at: Instant::now(),
            what: What::Closed,
        });
    });
}

/// Drops the timestamp and the fields the prefix already says (election and id).
fn tidy_log(line: &str, name: &str) -> String {
    let rest = match line.split_once(' ') {
        Some((first, rest)) if first.contains('T') && first.ends_with('Z') => rest.trim_start(),
        _ => line,
    };
    rest.replace(&format!(" election=\"{ELECTION}\""), "")
        .replace(&format!(" election={ELECTION}"), "")
        .replace(&format!(" id=\"{name}\""), "")
        .replace(&format!(" id={name}"), "")
}

/// lead-exec logs every state change; the demo shows only the lines that tell the story,
/// plus anything that went wrong.
fn interesting(line: &str) -> bool {
    const KEEP: [&str; 5] = [
        "leading: job started",
        "waiting behind",
        "job ended",
        "watchdog",
        "-> done",
    ];
    KEEP.iter().any(|k| line.contains(k))
        || line.starts_with("WARN")
        || line.starts_with("ERROR")
        || line.starts_with("lead-exec:")
}

// ---------------------------------------------------------------------------------------------
// The steps
// ---------------------------------------------------------------------------------------------

/// A term: which worker led, with which token.
#[derive(Debug, Clone, Copy)]
struct Term {
    worker: usize,
    token: i64,
}

/// What the kill -9 step measured.
struct Crash {
    victim: Term,
    next: Term,
    /// From the kill to the moment the victim's job group was gone (its pipes closed).
    group_gone: Duration,
    /// From the kill to the new leader's job start.
    failover: Duration,
    /// Job lines from the victim read after the kill.
    late_lines: usize,
}

/// What the SIGTERM step measured.
struct Handover {
    from: Term,
    next: Term,
    took: Duration,
    exit: ExitStatus,
}

struct Stale {
    token: i64,
    message: String,
}

struct Outcome {
    crash: Crash,
    handover: Handover,
    stale: Stale,
    check_ok: bool,
    check_text: String,
}

/// Step 1: wait until one worker has settled a few batches.
fn first_leader(mon: &mut Monitor) -> Result<Term> {
    let mut batches = [0u32; WORKERS.len()];
    mon.wait_for(
        0,
        "a leader to settle a few batches",
        Duration::from_secs(30),
        |ev| {
            let (token, _) = ev.settled()?;
            batches[ev.worker] += 1;
            (batches[ev.worker] >= BATCHES_PER_TERM).then_some(Term {
                worker: ev.worker,
                token,
            })
        },
    )
}

/// Waits for another worker than `old.worker` to start a term, and checks its token.
fn next_term(
    mon: &mut Monitor,
    since: usize,
    old: Term,
    timeout: Duration,
) -> Result<(Term, Instant)> {
    let (next, at) = mon.wait_for(since, "another worker to take over", timeout, |ev| {
        let token = ev.leading()?;
        (ev.worker != old.worker).then_some((
            Term {
                worker: ev.worker,
                token,
            },
            ev.at,
        ))
    })?;
    ensure!(
        next.token > old.token,
        "the new term's token {} is not larger than the old term's {}",
        next.token,
        old.token
    );
    Ok((next, at))
}

/// Waits until `term`'s job has settled a few batches, so that the next step starts from a
/// working leader and every term shows up in the ledger.
fn let_it_settle(mon: &mut Monitor, since: usize, term: Term) -> Result<()> {
    let mut n = 0;
    let timeout = Duration::from_secs(15);
    mon.wait_for(since, "the new leader's batches", timeout, |ev| {
        if ev.worker == term.worker && ev.settled().is_some_and(|(t, _)| t == term.token) {
            n += 1;
        }
        (n >= BATCHES_PER_TERM).then_some(())
    })
}

/// Step 2: SIGKILL the leader's lead-exec. Nothing of it can resign: its watchdog sees the
/// control pipe close and kills the job's group, and the lease runs out on the server.
fn kill_leader(
    mon: &mut Monitor,
    workers: &mut Workers,
    victim: Term,
    bins: &Bins,
    endpoint: &str,
) -> Result<Crash> {
    let name = WORKERS[victim.worker];
    let since = mon.mark();
    say(&format!(
        "kill -9 {name}'s lead-exec (pid {})",
        workers.0[victim.worker].child.id()
    ));
    let t0 = Instant::now();
    workers.signal(victim.worker, libc::SIGKILL)?;
    workers.wait_exit(victim.worker, Duration::from_secs(5))?;
    let gone_at = mon.wait_for(
        since,
        &format!("{name}'s job to stop"),
        Duration::from_secs(5),
        |ev| (ev.worker == victim.worker && ev.is_closed()).then_some(ev.at),
    )?;
    let group_gone = gone_at.saturating_duration_since(t0);
    say(&format!(
        "{name}'s job and watchdog are gone {} ms after the kill; no more batches from it",
        group_gone.as_millis()
    ));
    // Nobody could revoke the lease, so etcd still names the dead worker until it expires.
    say(&format!(
        "until its lease expires (TTL {TTL}), etcd still names {name}, and no job runs anywhere:"
    ));
    print_indented(&status(bins, endpoint)?);
    let (next, at) = next_term(mon, since, victim, Duration::from_secs(20))?;
    let failover = at.saturating_duration_since(t0);
    let_it_settle(mon, since, next)?;
    let late_lines = mon.seen[since..]
        .iter()
        .filter(|e| e.worker == victim.worker && e.settled().is_some())
        .count();
    say(&format!(
        "{} took over with token {} (> {}) {} after the kill; lines from {name} since the kill: {late_lines}",
        WORKERS[next.worker],
        next.token,
        victim.token,
        secs(failover)
    ));
    Ok(Crash {
        victim,
        next,
        group_gone,
        failover,
        late_lines,
    })
}

/// Step 3: SIGTERM the leader's lead-exec: it stops the job (TERM, then KILL after the
/// grace), revokes its lease and exits, so the next candidate need not wait for a TTL.
fn terminate_leader(mon: &mut Monitor, workers: &mut Workers, from: Term) -> Result<Handover> {
    let name = WORKERS[from.worker];
    let since = mon.mark();
    say(&format!(
        "SIGTERM {name}'s lead-exec (pid {})",
        workers.0[from.worker].child.id()
    ));
    let t0 = Instant::now();
    workers.signal(from.worker, libc::SIGTERM)?;
    let (next, at) = next_term(mon, since, from, Duration::from_secs(15))?;
    let took = at.saturating_duration_since(t0);
    let exit = workers.wait_exit(from.worker, Duration::from_secs(10))?;
    let_it_settle(mon, since, next)?;
    say(&format!(
        "{} took over with token {} (> {}) {} after the SIGTERM; {name}'s lead-exec exited with {}",
        WORKERS[next.worker],
        next.token,
        from.token,
        secs(took),
        describe(exit)
    ));
    Ok(Handover {
        from,
        next,
        took,
        exit,
    })
}

/// Step 4: what a leader that froze in step 1 and woke up now would do: write with its old
/// token. The ledger has seen higher tokens since, so it must refuse.
fn stale_write(bins: &Bins, db: &Path, token: i64) -> Result<Stale> {
    let tok = token.to_string();
    say(&format!(
        "ledger write --token {tok} --worker zombie --note \"late write from a frozen leader\""
    ));
    let out = ledger(
        bins,
        db,
        &[
            "write",
            "--token",
            &tok,
            "--worker",
            "zombie",
            "--note",
            "late write from a frozen leader",
        ],
    )?;
    let message = out.stdout.trim().to_string();
    print_indented(&format!(
        "{message}\n(exit code {})",
        out.code.unwrap_or(-1)
    ));
    ensure!(
        out.code == Some(EXIT_REJECTED),
        "the stale write was not rejected (exit {:?}): {message}",
        out.code
    );
    say("rejected: the ledger keeps the highest token it accepted and refuses lower ones");
    Ok(Stale { token, message })
}

/// Step 5: SIGTERM whoever still runs and wait for them.
fn stop_all(workers: &mut Workers) -> Result<()> {
    for i in workers.running() {
        say(&format!("SIGTERM {}'s lead-exec", WORKERS[i]));
        workers.signal(i, libc::SIGTERM)?;
    }
    for i in workers.running() {
        let s = workers.wait_exit(i, Duration::from_secs(10))?;
        say(&format!(
            "{}'s lead-exec exited with {}",
            WORKERS[i],
            describe(s)
        ));
    }
    sleep(Duration::from_millis(100))?;
    Ok(())
}

fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => format!("{s}"),
    }
}

fn row(label: &str, value: String) {
    println!("  {label:<32} {value}");
}

fn summary(mon: &Monitor, o: &Outcome) -> Result<()> {
    let terms = mon.terms();
    let increasing = terms.windows(2).all(|w| w[1].1 > w[0].1);
    let listed: Vec<String> = terms
        .iter()
        .map(|(w, t)| format!("{} token {t}", WORKERS[*w]))
        .collect();
    let (c, h) = (&o.crash, &o.handover);
    banner(6, "summary");
    row("terms, in order:", listed.join(" -> "));
    row(
        "tokens grew with every term:",
        if increasing { "yes" } else { "NO" }.to_string(),
    );
    row(
        "failover after kill -9:",
        format!(
            "{} ({} -> {}; lease TTL {TTL})",
            secs(c.failover),
            WORKERS[c.victim.worker],
            WORKERS[c.next.worker]
        ),
    );
    row(
        "old job stopped after kill -9:",
        format!(
            "{} ms (lines from it afterwards: {})",
            c.group_gone.as_millis(),
            c.late_lines
        ),
    );
    row(
        "handover after SIGTERM:",
        format!(
            "{} ({} -> {}; {}'s lead-exec: {})",
            secs(h.took),
            WORKERS[h.from.worker],
            WORKERS[h.next.worker],
            WORKERS[h.from.worker],
            describe(h.exit)
        ),
    );
    row(
        "stale writes rejected:",
        format!(
            "1 (the first term's token {}; the ledger said \"{}\")",
            o.stale.token, o.stale.message
        ),
    );
    row(
        "accepted tokens ever decreased:",
        format!(
            "{} (ledger check: {})",
            if o.check_ok { "no" } else { "YES" },
            o.check_text
        ),
    );
    ensure!(increasing, "tokens did not grow with every term");
    ensure!(
        o.check_ok,
        "the ledger saw a token decrease: {}",
        o.check_text
    );
    println!();
    println!("lead-exec demo: done.");
    Ok(())
}
