//! Running the job: the watchdog process that owns the job's process group, and lead-exec's
//! handle on it.
//!
//! ```text
//! lead-exec ──ctl pipe (deadlines, signals)──▶ watchdog ──fork/exec──▶ job (own pgid, cgroup)
//!           ◀──report pipe (spawned, ended)───
//! ```
//!
//! The watchdog starts before its job exists ([`Standby`]): lead-exec starts one while it
//! connects and campaigns, and sends the job's variables, deadline and command in one write
//! once the term is won, so that a won term pays only for the job's own fork and exec. A
//! standby that is never used exits when its pipe closes.
//!
//! The watchdog is spawned from the main thread (the runtime is single-threaded), so
//! `PR_SET_PDEATHSIG` fires only when lead-exec itself exits, never when a worker thread does.
//! It is the small `lead-exec-watchdog` binary when that is installed beside lead-exec, and
//! lead-exec itself in its hidden `__watchdog` mode otherwise.
//!
//! lead-exec and the watchdog are two enforcers of the deadline, and must not fail together:
//! the watchdog gets a session (and so a process group) of its own before exec, and a name
//! that shares no three letters in a row with "lead-exec", so that no group signal and no
//! `pkill`/`killall` by name reaches both; and [`Job::wait`] kills the group at D itself when
//! the watchdog has not reported it gone. Nothing lead-exec does waits on the watchdog: its
//! pipe is non-blocking, and what a frozen watchdog cannot take yet waits in lead-exec, the
//! newest deadline in place of older ones.

pub mod detach;
pub mod enforcer;
pub mod group;
pub mod protocol;
pub mod spawn;
pub mod watchdog;

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::unix::pipe;

use crate::clock::{BootInstant, BootTimer};
use crate::exit::{fail, Exit, JobStatus};
use protocol::{Command, GroupEnd, Report};

/// Whether the job gets a cgroup v2 of its own besides its process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// When one can be created.
    Auto,
    /// Required: no job without one.
    On,
    /// Process group only.
    Off,
}

impl CgroupMode {
    /// The word the watchdog's command line carries.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupMode::Auto => "auto",
            CgroupMode::On => "on",
            CgroupMode::Off => "off",
        }
    }

    pub fn parse(s: &str) -> Option<CgroupMode> {
        [CgroupMode::Auto, CgroupMode::On, CgroupMode::Off]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub grace: Duration,
    pub cgroup: CgroupMode,
}

/// How the job's group ended, as the watchdog saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub status: JobStatus,
    pub cause: GroupEnd,
    /// Lease deadline minus time of death.
    pub slack_ms: i64,
}

/// How long before D the group gets SIGKILL: delivering it and the group's exit take a few
/// hundred microseconds, more on a loaded host.
pub const KILL_LEAD: Duration = Duration::from_millis(25);

/// How long after a stop's grace (or a kill) lead-exec waits for the watchdog to have done
/// it, before it kills the group itself.
const STOP_SLACK: Duration = Duration::from_millis(200);

/// How long a watchdog that has not reported the group gone by the time lead-exec had to
/// kill it itself gets, before lead-exec kills the watchdog too and moves on.
const ABANDON_AFTER: Duration = Duration::from_secs(2);

/// A running job under its watchdog.
pub struct Job {
    pub pid: i32,
    /// Whether the job runs in a cgroup of its own, not only in its process group.
    pub contained: bool,
    ctl: Ctl,
    reports: Lines<BufReader<pipe::Receiver>>,
    watchdog: detach::Detached,
    /// The job's cgroup, as the watchdog reported it.
    cgroup: Option<PathBuf>,
    /// The lease deadline D last handed to the watchdog.
    kill_at: BootInstant,
    /// When a stop lead-exec asked for is due to be complete: the grace after it.
    stop_by: Option<BootInstant>,
    /// lead-exec's own timer at D: the second enforcer, for a watchdog that is frozen.
    backstop: AsyncFd<BootTimer>,
    backstop_fired: bool,
    /// When a watchdog that left the kill to lead-exec is killed in turn, if it still has not
    /// reported the group gone: one that is stopped would hold the term until continued.
    abandon_at: Option<BootInstant>,
}

/// lead-exec's end of the control pipe. It never blocks: a watchdog that does not read (it is
/// stopped, or starved) fills the pipe at 64 KiB, and a blocking write would then stop
/// lead-exec's only thread, its keepalives and its own timer at D with it. What the pipe
/// cannot take waits here, in order, and goes when the pipe is writable again: the newest
/// deadline stands for all older ones, a kill makes everything before it moot, and of the
/// signals to pass on only the first [`MAX_QUEUED`] are kept.
struct Ctl {
    /// Non-blocking. Written directly, not through tokio's readiness, so that what fits goes
    /// at once; the readiness only tells when to try again.
    tx: AsyncFd<OwnedFd>,
    deadline: Option<Command>,
    queue: VecDeque<Command>,
    /// Forwarded signals dropped because the queue was full.
    dropped: u64,
}

/// Commands (other than deadlines) that wait for a watchdog that does not read.
const MAX_QUEUED: usize = 64;

impl Ctl {
    fn new(fd: OwnedFd) -> std::io::Result<Ctl> {
        set_nonblocking(&fd)?;
        // SAFETY: the descriptor moves into the AsyncFd, which keeps it open for as long as
        // it is registered.
        let tx = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::WRITABLE) }
            .map_err(std::io::Error::from)?;
        Ok(Ctl {
            tx,
            deadline: None,
            queue: VecDeque::new(),
            dropped: 0,
        })
    }

    /// One write(2): with O_NONBLOCK, all of a message under `PIPE_BUF` or nothing.
    fn write(&self, bytes: &[u8]) -> std::io::Result<usize> {
        Ok(nix::unistd::write(self.tx.get_ref(), bytes)?)
    }

    /// Writes `bytes` whole, waiting for room as long as it takes: the start, which may be
    /// longer than `PIPE_BUF` and so go in pieces. The caller bounds the wait.
    async fn write_all(&self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            match self.write(bytes) {
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.tx.writable().await?.clear_ready();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Waits until the pipe may take more; then [`Ctl::flush`].
    async fn writable(&self) {
        match self.tx.writable().await {
            Ok(mut g) => g.clear_ready(),
            // Not registered any more: nothing will ever come, and flush reports it.
            Err(_) => std::future::pending().await,
        }
    }

    fn push(&mut self, c: Command) {
        if self.queue.contains(&Command::Kill) {
            return;
        }
        match c {
            Command::Deadline { .. } => self.deadline = Some(c),
            Command::Kill => {
                self.deadline = None;
                self.queue.clear();
                self.queue.push_back(c);
            }
            Command::Forward(_) if self.queue.len() >= MAX_QUEUED => {
                self.dropped += 1;
                if self.dropped == 1 {
                    tracing::warn!(
                        "the watchdog does not read its pipe; signals for the job are dropped"
                    );
                }
            }
            _ => self.queue.push_back(c),
        }
        self.flush();
    }

    fn pending(&self) -> bool {
        self.deadline.is_some() || !self.queue.is_empty()
    }

    /// Writes what waits, as far as the pipe takes it. Each message is one write of less
    /// than `PIPE_BUF`: all of it or nothing.
    fn flush(&mut self) {
        loop {
            let (c, from_queue) = match self.queue.front() {
                Some(c) => (*c, true),
                None => match self.deadline {
                    Some(d) => (d, false),
                    None => return,
                },
            };
            match self.write(c.encode().as_bytes()) {
                Ok(_) => {
                    if from_queue {
                        self.queue.pop_front();
                    } else {
                        self.deadline = None;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // The watchdog exits right after the group is gone; its report is on
                    // its way.
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        tracing::debug!("watchdog already gone: {c:?} not sent");
                    } else {
                        tracing::warn!("watchdog pipe: {e}");
                    }
                    self.deadline = None;
                    self.queue.clear();
                    return;
                }
            }
        }
    }
}

/// What became of a term's start.
pub enum Launch {
    /// The job runs.
    Started(Box<Job>),
    /// The watchdog found the deadline spent and started nothing.
    TooLate,
    /// The watchdog was gone before it got the job: nothing was started, another may be.
    Gone,
    /// The watchdog did not answer in time (stopped, starved) or died on the way: it has
    /// been killed, with whatever it may have started.
    NoAnswer,
}

/// Variables lead-exec reads that the job must not see.
const SECRET_ENV: [&str; 1] = ["LEAD_EXEC_PASSWORD"];

/// A watchdog started ahead of its job, waiting on its pipe: lead-exec starts one while it
/// campaigns, so that a won term pays only for the job's own fork and exec. Dropping it
/// closes the pipe, and the watchdog exits without starting anything.
pub struct Standby(Option<Waiting>);

struct Waiting {
    ctl: Ctl,
    reports: Lines<BufReader<pipe::Receiver>>,
    watchdog: detach::Detached,
    grace: Duration,
}

impl Standby {
    /// Starts a watchdog for a job with this grace and cgroup mode.
    pub fn start(grace: Duration, cgroup: CgroupMode) -> Result<Standby> {
        let (ctl_r, ctl_w) = pipe2()?;
        let (rep_r, rep_w) = pipe2()?;
        let args = watchdog::Args {
            parent: std::process::id() as i32,
            ctl_fd: ctl_r.as_raw_fd(),
            report_fd: rep_w.as_raw_fd(),
            grace,
            cgroup,
        };
        let argv: Vec<OsString> = std::iter::once(OsString::from(watchdog::NAME))
            .chain(args.to_argv())
            .collect();
        // A session (and so a process group) of its own from its first instruction, so that
        // no signal to lead-exec's group (job control, a supervisor) stops or kills both
        // enforcers at once; of our descriptors, only its two pipe ends.
        let watchdog = detach::spawn(
            &watchdog_program(),
            &argv,
            &SECRET_ENV,
            &[ctl_r.as_raw_fd(), rep_w.as_raw_fd()],
        )
        .context("starting the watchdog")?;
        drop(ctl_r);
        drop(rep_w);
        let reports = BufReader::new(pipe::Receiver::from_owned_fd(rep_r)?).lines();
        Ok(Standby(Some(Waiting {
            ctl: Ctl::new(ctl_w)?,
            reports,
            watchdog,
            grace,
        })))
    }

    /// Starts the job; returns once it runs. The deadline `d` is in force before the job's
    /// first instruction. A watchdog that does not answer within `answer_within` is killed,
    /// and the job is not started: a stopped watchdog would otherwise hold the term with no
    /// job for as long as it stays stopped.
    pub async fn launch(
        mut self,
        spec: &JobSpec,
        d: BootInstant,
        answer_within: Duration,
    ) -> Result<Launch> {
        let timer = BootTimer::new().context("timerfd_create")?;
        // SAFETY: the timer owns its descriptor and moves into the AsyncFd, which keeps it
        // open for as long as it is registered.
        let backstop = unsafe { AsyncFd::register(timer) }.map_err(std::io::Error::from)?;
        let Waiting {
            ctl,
            reports,
            watchdog,
            grace,
        } = self.0.take().expect("a standby is launched once");
        let argv: Vec<OsString> = spec.command.iter().map(OsString::from).collect();
        let deadline = Command::Deadline {
            term_at: d.minus(grace).as_nanos(),
            kill_at: d.as_nanos(),
        };
        let start = protocol::encode_start(&spec.env, deadline, &argv);
        let mut job = Job {
            pid: 0,
            contained: false,
            ctl,
            reports,
            watchdog,
            cgroup: None,
            kill_at: d,
            stop_by: None,
            backstop,
            backstop_fired: false,
            abandon_at: None,
        };
        let answer = tokio::time::timeout(answer_within, async {
            if let Err(e) = job.ctl.write_all(start.as_bytes()).await {
                return Err(Some(e));
            }
            loop {
                match job.reports.next_line().await {
                    Ok(Some(line)) => match Report::decode(&line) {
                        Some(Report::Cgroup { path }) => job.cgroup = Some(path.into()),
                        Some(r) => return Ok(r),
                        None => {}
                    },
                    Ok(None) | Err(_) => return Err(None),
                }
            }
        })
        .await;
        let first = match answer {
            Ok(Ok(r)) => r,
            // No job runs yet: the watchdog never got the command line.
            Ok(Err(Some(e))) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                job.reap_watchdog();
                return Ok(Launch::Gone);
            }
            other => {
                let why = match other {
                    Err(_) => "it did not answer in time".to_string(),
                    Ok(Err(Some(e))) => format!("its pipe failed: {e}"),
                    _ => "it closed its pipe".to_string(),
                };
                tracing::warn!("giving up the watchdog before the job started: {why}");
                job.abandon();
                return Ok(Launch::NoAnswer);
            }
        };
        match first {
            Report::Spawned { pid, contained } => {
                job.pid = pid;
                job.contained = contained;
                if !contained && spec.cgroup == CgroupMode::Auto {
                    warn_uncontained();
                }
                Ok(Launch::Started(Box::new(job)))
            }
            Report::TooLate => {
                job.reap_watchdog();
                Ok(Launch::TooLate)
            }
            Report::ExecFailed { errno } => {
                job.reap_watchdog();
                Err(exec_error(&spec.command[0], errno))
            }
            Report::SetupFailed { message } => {
                job.reap_watchdog();
                Err(fail(Exit::Software, message))
            }
            Report::Ended { .. } | Report::Cgroup { .. } => {
                job.abandon();
                anyhow::bail!("watchdog reported an end before a start")
            }
        }
    }
}

/// Says once per process that `--cgroup auto` found no cgroup for the job: escapees from its
/// process group (a daemon that calls setsid) are then out of reach.
fn warn_uncontained() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "the job runs without a cgroup of its own (none could be made here: cgroup v2 not mounted or not writable); only its process group is killed"
        );
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        // Never used: closing the pipe is the watchdog's cue to remove the cgroup it made
        // ahead and exit, which takes it a fraction of a millisecond. A kill would leave the
        // cgroup to the next job's sweep; it is only for a watchdog that does not go.
        if let Some(Waiting { ctl, watchdog, .. }) = self.0.take() {
            drop(ctl);
            if !watchdog.exits_within(STANDBY_EXIT) {
                watchdog.kill();
                watchdog.wait();
            }
        }
    }
}

/// How long an unused watchdog gets to go on its own.
const STANDBY_EXIT: Duration = Duration::from_millis(200);

impl Job {
    /// Moves the deadline: SIGTERM at `d − grace`, SIGKILL at `d`. D only moves forward.
    pub fn extend(&mut self, d: BootInstant, grace: Duration) {
        if d <= self.kill_at {
            return;
        }
        self.kill_at = d;
        self.ctl.push(Command::Deadline {
            term_at: d.minus(grace).as_nanos(),
            kill_at: d.as_nanos(),
        });
    }

    pub fn forward(&mut self, sig: i32) {
        self.ctl.push(Command::Forward(sig));
    }

    /// `sig` now, SIGKILL after the grace. lead-exec kills the group itself once the grace
    /// is over, should the watchdog not have done it by then.
    pub fn stop(&mut self, sig: i32, grace: Duration) {
        let by = BootInstant::now().plus(grace);
        self.stop_by = Some(self.stop_by.map_or(by, |t| t.min(by)));
        self.ctl.push(Command::Stop(sig));
    }

    pub fn kill(&mut self) {
        self.stop_by = Some(BootInstant::now());
        self.ctl.push(Command::Kill);
    }

    /// Waits until the whole group is gone. Cancel-safe.
    ///
    /// Meanwhile lead-exec enforces D itself: if the group has not been reported gone when
    /// SIGKILL is due, it kills the group and the cgroup on its own. A healthy watchdog does
    /// the same at the same moment (a second SIGKILL is harmless); a frozen one cannot, and
    /// then this is what stops the job.
    pub async fn wait(&mut self) -> Ended {
        let ended = loop {
            let due = self.kill_at.minus(KILL_LEAD);
            // A stop is the watchdog's to carry out: lead-exec steps in a little later, only
            // for one that has not.
            let due = self.stop_by.map_or(due, |s| due.min(s.plus(STOP_SLACK)));
            let next = self
                .abandon_at
                .or_else(|| (!self.backstop_fired).then_some(due));
            if let Err(e) = self.backstop.get_ref().arm(next) {
                tracing::warn!("deadline timer: {e}; the watchdog alone enforces this deadline");
            }
            tokio::select! {
                line = self.reports.next_line() => match line {
                    Ok(Some(l)) => match Report::decode(&l) {
                        Some(Report::Ended { status, cause, slack_ms }) => {
                            break Ended { status, cause, slack_ms };
                        }
                        Some(other) => {
                            tracing::warn!("unexpected report from the watchdog: {other:?}");
                        }
                        None => {}
                    },
                    Ok(None) => break self.watchdog_lost("it closed its pipe"),
                    Err(e) => break self.watchdog_lost(&format!("{e:#}")),
                },
                // What a busy watchdog could not take yet goes as soon as it can.
                _ = self.ctl.writable(), if self.ctl.pending() => self.ctl.flush(),
                ready = self.backstop.readable() => {
                    if let Ok(mut guard) = ready {
                        self.backstop.get_ref().drain();
                        guard.clear_ready();
                    }
                    let now = BootInstant::now();
                    if !self.backstop_fired && now >= due {
                        self.backstop_fired = true;
                        self.abandon_at = Some(now.plus(ABANDON_AFTER));
                        tracing::debug!(pid = self.pid, "deadline: lead-exec kills the job's group itself");
                        self.kill_directly();
                    } else if self.abandon_at.is_some_and(|t| now >= t) {
                        self.abandon_at = None;
                        tracing::warn!(pid = self.pid, watchdog = self.watchdog.id(), "the watchdog has not reported the job's group gone; killing the watchdog");
                        self.watchdog.kill();
                    }
                }
            }
        };
        if ended.cause == GroupEnd::WatchdogLost {
            self.reap_watchdog();
        } else {
            // It reported the group gone and only exits now: nothing waits on that.
            let pid = nix::unistd::Pid::from_raw(self.watchdog.id() as i32);
            tokio::task::spawn_blocking(move || nix::sys::wait::waitpid(pid, None));
        }
        ended
    }

    /// SIGKILL to the job's group and cgroup, without the watchdog. The watchdog holds the
    /// group leader unreaped until the group is empty, so the pgid belongs to the job unless
    /// the group ended in the instant before this, with its report still in the pipe.
    fn kill_directly(&self) {
        if let Some(cg) = &self.cgroup {
            group::kill_dir(cg);
        }
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    fn watchdog_lost(&mut self, why: &str) -> Ended {
        // One line, whatever the error holds: this goes to the log as is.
        let why = why.replace('\n', " ");
        tracing::error!(
            pid = self.pid,
            "the watchdog died ({why}); killing what is left of the job"
        );
        // The job's main process dies with its parent (PR_SET_PDEATHSIG); the rest of its
        // cgroup and of its group is ours to kill now. The group too, cgroup or not: a member
        // the cgroup does not hold must not run on. Nobody holds the group's leader unreaped
        // any more, so this is the one place a reused pgid could be hit, and only in the
        // instant after the watchdog itself was killed.
        if let Some(cg) = &self.cgroup {
            group::Cgroup::kill_orphaned(cg);
        }
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        Ended {
            status: JobStatus::Signaled(libc::SIGKILL),
            cause: GroupEnd::WatchdogLost,
            slack_ms: 0,
        }
    }

    fn reap_watchdog(&mut self) {
        // It exits right after its last report.
        self.watchdog.wait();
    }

    /// Kills a watchdog that did not start the job in time, and whatever it may have
    /// started: its job's main process dies with it (PR_SET_PDEATHSIG), the rest of the
    /// cgroup here.
    fn abandon(&mut self) {
        self.watchdog.kill();
        self.watchdog.wait();
        if let Some(cg) = &self.cgroup {
            group::Cgroup::kill_orphaned(cg);
        }
    }
}

/// The watchdog binary installed beside us, else ourselves (`lead-exec __watchdog` is the
/// same code, in a process that maps the whole binary).
fn watchdog_program() -> std::path::PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|me| {
            let small = me.parent()?.join("lead-exec-watchdog");
            small.is_file().then_some(small)
        })
        .unwrap_or_else(|| "/proc/self/exe".into())
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

fn pipe2() -> Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

/// 127 for a command that does not exist, 126 for one that cannot be executed, as shells do.
pub fn exec_error(cmd: &str, errno: i32) -> anyhow::Error {
    let err = std::io::Error::from_raw_os_error(errno);
    match errno {
        libc::ENOENT | libc::ENOTDIR => fail(Exit::NotFound, format!("{cmd}: command not found")),
        _ => fail(Exit::NotExecutable, format!("{cmd}: cannot execute: {err}")),
    }
}

/// A script whose `#!` interpreter is missing fails exec with ENOENT, which would read as
/// "command not found" for a file that exists: name the interpreter instead (126, as bash's
/// "bad interpreter").
fn check_interpreter(cmd: &str, path: &std::path::Path) -> Result<()> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return Ok(());
    };
    let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let Some(interp) = line.split_whitespace().next() else {
        return Ok(());
    };
    if std::path::Path::new(interp).exists() {
        return Ok(());
    }
    Err(fail(
        Exit::NotExecutable,
        format!("{cmd}: bad interpreter {interp}: no such file"),
    ))
}

/// Checks the command before campaigning, so a typo is reported at once instead of after
/// winning an election.
pub fn preflight(cmd: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let candidates: Vec<std::path::PathBuf> = if cmd.contains('/') {
        vec![cmd.into()]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(cmd)).collect())
            .unwrap_or_default()
    };
    let mut found_unexecutable = false;
    for c in candidates {
        if let Ok(m) = std::fs::metadata(&c) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return check_interpreter(cmd, &c);
            }
            found_unexecutable = true;
        }
    }
    Err(if found_unexecutable {
        exec_error(cmd, libc::EACCES)
    } else {
        exec_error(cmd, libc::ENOENT)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything the pipe holds now, read without blocking.
    fn drain(r: &OwnedFd) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match nix::unistd::read(r.as_raw_fd(), &mut buf) {
                Ok(n) if n > 0 => out.extend_from_slice(&buf[..n]),
                _ => return String::from_utf8(out).unwrap(),
            }
        }
    }

    /// A watchdog that does not read: sends return at once, the newest deadline stands for
    /// the others, signals to pass on are capped, a stop is kept, and a kill wins.
    #[tokio::test]
    async fn a_full_pipe_never_blocks_and_keeps_what_matters() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        set_nonblocking(&r).unwrap();
        let mut ctl = Ctl::new(w).unwrap();
        let mut written = 0;
        while !ctl.pending() {
            ctl.push(Command::Forward(10));
            written += 1;
        }
        assert!(written > 10_000, "the pipe took only {written}");
        let deadline = |i: u64| Command::Deadline {
            term_at: i,
            kill_at: i + 1,
        };
        for i in 1..=100_000 {
            ctl.push(deadline(i));
        }
        assert_eq!(ctl.deadline, Some(deadline(100_000)));
        for _ in 0..1000 {
            ctl.push(Command::Forward(10));
        }
        ctl.push(Command::Stop(15));
        assert!(ctl.queue.len() <= MAX_QUEUED + 1);
        assert_eq!(ctl.queue.back(), Some(&Command::Stop(15)));
        // Once the watchdog reads again, all of it goes, the newest deadline last.
        drain(&r);
        ctl.flush();
        assert!(!ctl.pending());
        let sent = drain(&r);
        assert!(sent.ends_with("T 15\nD 100000 100001\n"), "{sent:?}");

        while !ctl.pending() {
            ctl.push(Command::Forward(10));
        }
        ctl.push(deadline(200_000));
        ctl.push(Command::Stop(15));
        ctl.push(Command::Kill);
        ctl.push(deadline(300_000));
        ctl.push(Command::Forward(1));
        assert_eq!(ctl.queue, [Command::Kill]);
        assert_eq!(ctl.deadline, None);
        drain(&r);
        ctl.flush();
        assert_eq!(drain(&r), "K\n");
    }
}
