//! Starting the job: a watchdog started ahead of it ([`Standby`]), then told to start it
//! ([`Standby::launch`]).

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::unix::pipe;

use super::ctl::Ctl;
use super::detach;
use super::job::Handshake;
use crate::clock::{BootInstant, BootTimer};
use crate::exit::{fail, Exit};
use crate::supervisor::wire::{self, Order, Report};
use crate::supervisor::{exec_error, watchdog, CgroupMode, Job, JobSpec};

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

/// Variables lead-exec reads that the job must not see: the password, and systemd's notify
/// and watchdog settings, which are lead-exec's (under `NotifyAccess=all` a job's `READY=1`
/// would be taken for the service's; under `NotifyAccess=main` its messages are refused, each
/// with a line in the journal).
const SECRET_ENV: [&str; 4] = [
    "LEAD_EXEC_PASSWORD",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
];

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
    ///
    /// `warned_uncontained` belongs to whoever starts the jobs, for the life of the process:
    /// that `--cgroup auto` found no cgroup is said with the first job started without one.
    pub async fn launch(
        mut self,
        spec: &JobSpec,
        d: BootInstant,
        answer_within: Duration,
        warned_uncontained: &mut bool,
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
        let argv: Vec<OsString> = spec.command.clone();
        let deadline = Order::Deadline {
            term_at: d.minus(grace).as_nanos(),
            kill_at: d.as_nanos(),
        };
        let start = wire::encode_start(&spec.env, deadline, &argv);
        let mut hs = Handshake {
            ctl,
            reports,
            watchdog,
            cgroup: None,
        };
        let answer = tokio::time::timeout(answer_within, async {
            if let Err(e) = hs.ctl.write_all(start.as_bytes()).await {
                return Err(Some(e));
            }
            loop {
                match hs.reports.next_line().await {
                    Ok(Some(line)) => match Report::decode(&line) {
                        Some(Report::Cgroup { path }) => hs.cgroup = Some(path.into()),
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
            // It may have been killed: the empty cgroup it made ahead is ours to remove.
            Ok(Err(Some(e))) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                let cgroup = hs
                    .cgroup
                    .take()
                    .or_else(|| reported_cgroup(&mut hs.reports));
                hs.reap();
                remove_empty_cgroup(cgroup.as_deref());
                return Ok(Launch::Gone);
            }
            other => {
                let why = match other {
                    Err(_) => "it did not answer in time".to_string(),
                    Ok(Err(Some(e))) => format!("its pipe failed: {e}"),
                    _ => "it closed its pipe".to_string(),
                };
                tracing::warn!("giving up the watchdog before the job started: {why}");
                hs.abandon();
                return Ok(Launch::NoAnswer);
            }
        };
        match first {
            Report::Spawned { pid, contained } => {
                if !contained && spec.cgroup == CgroupMode::Auto {
                    warn_uncontained(warned_uncontained);
                }
                let job = Job::spawned(hs, pid, contained, d, grace, backstop);
                Ok(Launch::Started(Box::new(job)))
            }
            Report::TooLate => {
                hs.reap();
                Ok(Launch::TooLate)
            }
            Report::ExecFailed { errno } => {
                hs.reap();
                Err(exec_error(&spec.command[0].to_string_lossy(), errno))
            }
            Report::SetupFailed { message } => {
                hs.reap();
                Err(fail(Exit::Software, message))
            }
            Report::Ended { .. } | Report::LeaderExited { .. } | Report::Cgroup { .. } => {
                hs.abandon();
                anyhow::bail!("watchdog reported an end before a start")
            }
        }
    }
}

/// Says once (`warned` is then set) that `--cgroup auto` found no cgroup for the job: its
/// process group and its process tree are what stops it then, without cgroup.kill's one write.
fn warn_uncontained(warned: &mut bool) {
    if !std::mem::replace(warned, true) {
        tracing::warn!(
            "the job runs without a cgroup of its own (none could be made here: cgroup v2 not mounted or not writable); its process group and process tree are stopped instead"
        );
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        // Never used: closing the pipe is the watchdog's cue to remove the cgroup it made
        // ahead and exit, which takes it a fraction of a millisecond. A kill would leave the
        // cgroup to the next job's sweep; it is only for a watchdog that does not go.
        if let Some(Waiting {
            ctl,
            watchdog,
            mut reports,
            ..
        }) = self.0.take()
        {
            drop(ctl);
            if !watchdog.exits_within(STANDBY_EXIT) {
                watchdog.kill();
                watchdog.wait();
            }
            // One that was killed (by us, or by someone before) could not remove its
            // cgroup: it told us where it is.
            remove_empty_cgroup(reported_cgroup(&mut reports).as_deref());
        }
    }
}

/// The job cgroup a watchdog made ahead, as its report still waiting in the pipe says: for
/// a watchdog that is gone without having removed it. Reads only what is there (the pipe is
/// non-blocking).
fn reported_cgroup(reports: &mut Lines<BufReader<pipe::Receiver>>) -> Option<std::path::PathBuf> {
    let fd = reports.get_mut().get_ref().as_raw_fd();
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| match Report::decode(l) {
            Some(Report::Cgroup { path }) => Some(path.into()),
            _ => None,
        })
}

/// Removes the job cgroup a dead watchdog made ahead, if it is there and empty: an rmdir,
/// which the kernel refuses for a cgroup that still holds a process.
fn remove_empty_cgroup(dir: Option<&std::path::Path>) {
    if let Some(dir) = dir {
        match std::fs::remove_dir(dir) {
            Ok(()) => {
                tracing::debug!(cgroup = %dir.display(), "removed the empty cgroup of a watchdog that is gone")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::debug!(cgroup = %dir.display(), "the cgroup of a watchdog that is gone stays: {e}")
            }
        }
    }
}

/// How long an unused watchdog gets to go on its own.
const STANDBY_EXIT: Duration = Duration::from_millis(200);

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
