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
//! without "lead-exec" in it, so that no group signal and no `pkill`/`killall` by name reaches
//! both; and [`Job::wait`] kills the group at D itself when the watchdog has not reported it
//! gone.

pub mod detach;
pub mod enforcer;
pub mod group;
pub mod protocol;
pub mod spawn;
pub mod watchdog;

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
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

/// A running job under its watchdog.
pub struct Job {
    pub pid: i32,
    ctl: std::fs::File,
    reports: Lines<BufReader<pipe::Receiver>>,
    watchdog: detach::Detached,
    /// The lease deadline D last handed to the watchdog.
    kill_at: BootInstant,
    /// lead-exec's own timer at D: the second enforcer, for a watchdog that is frozen.
    backstop: AsyncFd<BootTimer>,
    backstop_fired: bool,
}

/// Variables lead-exec reads that the job must not see.
const SECRET_ENV: [&str; 1] = ["LEAD_EXEC_PASSWORD"];

/// A watchdog started ahead of its job, waiting on its pipe: lead-exec starts one while it
/// campaigns, so that a won term pays only for the job's own fork and exec. Dropping it
/// closes the pipe, and the watchdog exits without starting anything.
pub struct Standby(Option<Waiting>);

struct Waiting {
    ctl: std::fs::File,
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
            ctl: std::fs::File::from(ctl_w),
            reports,
            watchdog,
            grace,
        })))
    }

    /// Starts the job; returns once it runs, or `None` when the watchdog found the deadline
    /// spent and started nothing. The deadline `d` is in force before the job's first
    /// instruction.
    pub async fn launch(mut self, spec: &JobSpec, d: BootInstant) -> Result<Option<Job>> {
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
        let mut job = Job {
            pid: 0,
            ctl,
            reports,
            watchdog,
            kill_at: d,
            backstop,
            backstop_fired: false,
        };
        let argv: Vec<OsString> = spec.command.iter().map(OsString::from).collect();
        let deadline = Command::Deadline {
            term_at: d.minus(grace).as_nanos(),
            kill_at: d.as_nanos(),
        };
        let start = protocol::encode_start(&spec.env, deadline, &argv);
        if let Err(e) = job.ctl.write_all(start.as_bytes()) {
            // No job runs yet: the watchdog waits for the command line.
            job.watchdog.kill();
            job.reap_watchdog();
            return Err(e).context("sending the job to the watchdog");
        }
        let first = loop {
            match job.reports.next_line().await? {
                None => anyhow::bail!("the watchdog closed its pipe before starting the job"),
                Some(line) => {
                    if let Some(r) = Report::decode(&line) {
                        break r;
                    }
                }
            }
        };
        match first {
            Report::Spawned { pid } => {
                job.pid = pid;
                Ok(Some(job))
            }
            Report::TooLate => {
                job.reap_watchdog();
                Ok(None)
            }
            Report::ExecFailed { errno } => {
                job.reap_watchdog();
                Err(exec_error(&spec.command[0], errno))
            }
            Report::SetupFailed { message } => {
                job.reap_watchdog();
                Err(fail(Exit::Software, message))
            }
            Report::Ended { .. } => anyhow::bail!("watchdog reported an end before a start"),
        }
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
        self.send(Command::Deadline {
            term_at: d.minus(grace).as_nanos(),
            kill_at: d.as_nanos(),
        });
    }

    pub fn forward(&mut self, sig: i32) {
        self.send(Command::Forward(sig));
    }

    /// `sig` now, SIGKILL after the grace.
    pub fn stop(&mut self, sig: i32) {
        self.send(Command::Stop(sig));
    }

    pub fn kill(&mut self) {
        self.send(Command::Kill);
    }

    fn send(&mut self, c: Command) {
        match self.ctl.write_all(c.encode().as_bytes()) {
            Ok(()) => {}
            // The watchdog exits right after the group is gone; its report is on its way.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                tracing::debug!("watchdog already gone: {c:?} not sent")
            }
            Err(e) => tracing::warn!("watchdog pipe: {e}"),
        }
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
            if let Err(e) = self
                .backstop
                .get_ref()
                .arm((!self.backstop_fired).then_some(due))
            {
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
                ready = self.backstop.readable() => {
                    if let Ok(mut guard) = ready {
                        self.backstop.get_ref().drain();
                        guard.clear_ready();
                    }
                    if !self.backstop_fired && BootInstant::now() >= due {
                        self.backstop_fired = true;
                        tracing::debug!(pid = self.pid, "deadline: lead-exec kills the job's group itself");
                        self.kill_directly();
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
        group::Cgroup::kill_by_watchdog(self.watchdog.id());
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
        // cgroup is ours to kill now. Without a cgroup, signal the group: nobody holds its
        // leader unreaped any more, so this is the one place a reused pid could be hit, and
        // only in the instant after the watchdog itself was killed.
        if !group::Cgroup::kill_orphaned(self.watchdog.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
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
