//! The watchdog: a small process that owns the job's process group and enforces the lease
//! deadline even when lead-exec is killed, frozen or starved.
//!
//! It runs as the `lead-exec-watchdog` binary, or as lead-exec re-executed in a hidden mode
//! (`lead-exec __watchdog ...`): single-threaded, no async runtime, no etcd. lead-exec sends it deadline extensions over a pipe
//! ([`super::protocol`]). It sends SIGTERM to the group at D − grace and SIGKILL at D, measured on
//! CLOCK_BOOTTIME with a timerfd, whatever lead-exec is doing. EOF on the pipe means lead-exec is
//! gone: there is no leadership left to wait for, so the group is killed at once.
//! `PR_SET_PDEATHSIG` is a second way to learn of the parent's death; the pipe is the first.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::group::{Cgroup, Group};
use super::protocol::{Cause, Command, Report};
use crate::clock::BootInstant;
use crate::exit::JobStatus;

/// argv[1] that selects this mode.
pub const ARG: &str = "__watchdog";

/// How long before D the group gets SIGKILL: delivering it and the group's exit take a few
/// hundred microseconds, more on a loaded host.
const KILL_LEAD: Duration = Duration::from_millis(25);

/// Signal the kernel sends us when the thread that forked us dies.
const PARENT_DEATH: i32 = libc::SIGUSR2;

/// The watchdog's fixed arguments, in order, before `--` and the command.
pub struct Args {
    pub parent: i32,
    pub ctl_fd: RawFd,
    pub report_fd: RawFd,
    pub grace: Duration,
    pub term_at: BootInstant,
    pub kill_at: BootInstant,
    pub cgroup: crate::cli::CgroupMode,
    pub command: Vec<OsString>,
}

impl Args {
    pub fn to_argv(&self) -> Vec<OsString> {
        let mode = match self.cgroup {
            crate::cli::CgroupMode::Auto => "auto",
            crate::cli::CgroupMode::On => "on",
            crate::cli::CgroupMode::Off => "off",
        };
        let mut v: Vec<OsString> = [
            ARG.to_string(),
            self.parent.to_string(),
            self.ctl_fd.to_string(),
            self.report_fd.to_string(),
            self.grace.as_nanos().to_string(),
            self.term_at.as_nanos().to_string(),
            self.kill_at.as_nanos().to_string(),
            mode.to_string(),
            "--".to_string(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        v.extend(self.command.iter().cloned());
        v
    }

    fn parse(argv: &[OsString]) -> Result<Args> {
        let s = |i: usize| -> Result<&str> {
            argv.get(i)
                .and_then(|a| a.to_str())
                .with_context(|| format!("watchdog argument {i} missing"))
        };
        let n = |i: usize| -> Result<u64> { Ok(s(i)?.parse()?) };
        if s(1)? != ARG || s(9)? != "--" || argv.len() < 11 {
            bail!("bad watchdog arguments");
        }
        Ok(Args {
            parent: s(2)?.parse()?,
            ctl_fd: s(3)?.parse()?,
            report_fd: s(4)?.parse()?,
            grace: Duration::from_nanos(n(5)?),
            term_at: BootInstant::from_nanos(n(6)?),
            kill_at: BootInstant::from_nanos(n(7)?),
            cgroup: match s(8)? {
                "on" => crate::cli::CgroupMode::On,
                "off" => crate::cli::CgroupMode::Off,
                _ => crate::cli::CgroupMode::Auto,
            },
            command: argv[10..].to_vec(),
        })
    }
}

/// Entry point of the hidden mode. Never returns into lead-exec's normal flow.
pub fn main(argv: Vec<OsString>) -> std::process::ExitCode {
    match run(&argv) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lead-exec: watchdog: {e:#}");
            std::process::ExitCode::from(70)
        }
    }
}

fn run(argv: &[OsString]) -> Result<()> {
    let a = Args::parse(argv)?;
    set_cloexec(a.ctl_fd)?;
    set_cloexec(a.report_fd)?;
    // SAFETY: lead-exec handed us these two descriptors and nothing else owns them.
    let mut ctl = unsafe { File::from_raw_fd(a.ctl_fd) };
    let mut report = unsafe { File::from_raw_fd(a.report_fd) };
    set_nonblocking(ctl.as_raw_fd())?;

    // Otherwise ps shows "exe" (we were started as /proc/self/exe).
    prctl(
        libc::PR_SET_NAME,
        c"lead-exec-wdog".as_ptr() as libc::c_ulong,
    )?;
    // Orphaned grandchildren come to us, so that we can reap them and see the group empty.
    prctl(libc::PR_SET_CHILD_SUBREAPER, 1)?;
    // The terminal and service managers signal whole groups; lead-exec decides what the job
    // gets, and the watchdog itself must neither die nor stop.
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGPIPE,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
    ] {
        // SAFETY: setting a disposition to SIG_IGN has no handler to race with.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let (mut wake_r, wake_w) = UnixStream::pair()?;
    wake_r.set_nonblocking(true)?;
    wake_w.set_nonblocking(true)?;
    signal_hook::low_level::pipe::register(libc::SIGCHLD, wake_w.try_clone()?)?;
    signal_hook::low_level::pipe::register(PARENT_DEATH, wake_w)?;
    prctl(libc::PR_SET_PDEATHSIG, PARENT_DEATH as libc::c_ulong)?;
    // The parent may have died before the prctl took effect.
    if nix::unistd::getppid().as_raw() != a.parent {
        return Ok(());
    }

    let cgroup = match a.cgroup {
        crate::cli::CgroupMode::Off => None,
        crate::cli::CgroupMode::Auto => Cgroup::create().ok(),
        crate::cli::CgroupMode::On => match Cgroup::create() {
            Ok(c) => Some(c),
            Err(e) => {
                let message = format!("--cgroup on: cannot create a cgroup v2 for the job: {e}");
                send(&mut report, &Report::SetupFailed { message });
                return Ok(());
            }
        },
    };

    let spawned = match super::spawn::spawn(&a.command, cgroup.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
            send(&mut report, &Report::ExecFailed { errno });
            if let Some(cg) = &cgroup {
                cg.remove();
            }
            return Ok(());
        }
    };
    let pid = spawned.pid;
    send(&mut report, &Report::Spawned { pid });
    let group = Group {
        leader: Pid::from_raw(pid),
        cgroup,
    };
    let pidfd = match spawned.pidfd {
        Some(fd) => fd,
        None => pidfd_open(pid)?,
    };
    let timer = timerfd()?;

    let mut w = Watch {
        group,
        grace: a.grace,
        term_at: a.term_at,
        kill_at: a.kill_at,
        stop_kill_at: None,
        term_sent: false,
        kill_sent: false,
        cause: None,
        exited: None,
    };
    let mut ctl_open = true;
    let mut buf = Vec::new();
    loop {
        let now = BootInstant::now();
        w.enforce(now);
        if let Some(status) = w.exited {
            w.group.reap_orphans();
            if !w.group.has_live_members() {
                let end = w.finish(status);
                send(&mut report, &end);
                return Ok(());
            }
            if w.cause.is_none() {
                // The job exited but left processes in its group: they must not outlive the
                // term. Same stop sequence as for a lost lease.
                w.cause = Some(Cause::SelfExit);
                w.stop(libc::SIGTERM, now);
            }
        }
        arm(&timer, w.next_wake())?;

        let mut fds = vec![
            pollfd(wake_r.as_raw_fd()),
            pollfd(timer.as_raw_fd()),
            pollfd(pidfd.as_raw_fd()),
        ];
        if ctl_open {
            fds.push(pollfd(ctl.as_raw_fd()));
        }
        // After the leader exits, other members leave no event we could wait on: look again
        // every 10 ms until they are gone.
        let timeout = if w.exited.is_some() { 10 } else { -1 };
        // SAFETY: fds is a valid array of pollfd for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err).context("poll");
            }
            continue;
        }
        drain(&mut wake_r);
        drain_timer(&timer);
        let now = BootInstant::now();
        if w.exited.is_none() && fds[2].revents != 0 {
            w.exited = peek_exit(pid);
        }
        if ctl_open && fds.get(3).is_some_and(|f| f.revents != 0) {
            let mut chunk = [0u8; 512];
            loop {
                match ctl.read(&mut chunk) {
                    Ok(0) => {
                        ctl_open = false;
                        break;
                    }
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        ctl_open = false;
                        break;
                    }
                }
            }
            while let Some(i) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                if let Some(c) = Command::decode(&String::from_utf8_lossy(&line)) {
                    w.command(c, now);
                }
            }
            if !ctl_open {
                w.orphaned();
            }
        }
        if nix::unistd::getppid().as_raw() != a.parent {
            ctl_open = false;
            w.orphaned();
        }
    }
}

/// The watchdog's state for one job.
struct Watch {
    group: Group,
    grace: Duration,
    /// Lease deadlines from lead-exec: SIGTERM at `term_at`, SIGKILL at `kill_at` (= D).
    term_at: BootInstant,
    kill_at: BootInstant,
    /// SIGKILL time of a stop already under way (grace after its first signal).
    stop_kill_at: Option<BootInstant>,
    term_sent: bool,
    kill_sent: bool,
    /// Why the group is ending; `None` while the job runs normally.
    cause: Option<Cause>,
    /// The leader's status once it exited (still unreaped).
    exited: Option<JobStatus>,
}

impl Watch {
    /// When SIGKILL goes out: a little before D, so that the group is dead by D rather than
    /// just signalled at it.
    fn kill_by(&self) -> BootInstant {
        self.kill_at.minus(KILL_LEAD)
    }

    fn enforce(&mut self, now: BootInstant) {
        if self.kill_sent {
            return;
        }
        if now >= self.kill_by() {
            self.cause.get_or_insert(Cause::Deadline);
            self.kill();
        } else if self.stop_kill_at.is_some_and(|t| now >= t) {
            self.kill();
        } else if !self.term_sent && now >= self.term_at {
            self.cause.get_or_insert(Cause::Deadline);
            self.stop(libc::SIGTERM, now);
        }
    }

    fn stop(&mut self, sig: i32, now: BootInstant) {
        if let Ok(s) = Signal::try_from(sig) {
            self.group.signal(s);
        }
        self.term_sent = true;
        let t = now.plus(self.grace).min(self.kill_by());
        self.stop_kill_at = Some(self.stop_kill_at.map_or(t, |old| old.min(t)));
    }

    fn kill(&mut self) {
        self.group.kill();
        self.kill_sent = true;
    }

    fn orphaned(&mut self) {
        if !self.kill_sent {
            self.cause.get_or_insert(Cause::Orphaned);
            self.kill();
        }
    }

    fn command(&mut self, c: Command, now: BootInstant) {
        match c {
            Command::Deadline { term_at, kill_at } => {
                // Once a stop is under way no extension revives the job.
                if self.cause.is_none() {
                    self.term_at = BootInstant::from_nanos(term_at);
                    self.kill_at = BootInstant::from_nanos(kill_at);
                }
            }
            Command::Forward(sig) => {
                if let Ok(s) = Signal::try_from(sig) {
                    self.group.signal(s);
                }
            }
            Command::Stop(sig) => {
                self.cause.get_or_insert(Cause::Stop);
                self.stop(sig, now);
            }
            Command::Kill => {
                self.cause.get_or_insert(Cause::Stop);
                self.kill();
            }
        }
    }

    fn next_wake(&self) -> Option<BootInstant> {
        if self.kill_sent {
            return None;
        }
        let mut t = self.kill_by();
        if let Some(s) = self.stop_kill_at {
            t = t.min(s);
        }
        if !self.term_sent {
            t = t.min(self.term_at);
        }
        Some(t)
    }

    /// Reaps the leader (only now: its pid could be reused afterwards), sweeps up
    /// escapees and orphans, and says how it ended.
    fn finish(&mut self, status: JobStatus) -> Report {
        let died = BootInstant::now();
        if let Some(cg) = &self.group.cgroup {
            cg.kill();
        }
        let _ = nix::sys::wait::waitpid(self.group.leader, None);
        let until = BootInstant::now().plus(Duration::from_secs(2));
        loop {
            match nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
                Ok(nix::sys::wait::WaitStatus::StillAlive) => {
                    let cg_busy = self
                        .group
                        .cgroup
                        .as_ref()
                        .is_some_and(|c| !c.pids().is_empty());
                    if !cg_busy || until.has_passed() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        if let Some(cg) = &self.group.cgroup {
            cg.remove();
        }
        Report::Ended {
            status,
            cause: self.cause.unwrap_or(Cause::SelfExit),
            slack_ms: self.kill_at.millis_after(died),
        }
    }
}

fn send(report: &mut File, r: &Report) {
    // lead-exec may be gone; the job is handled either way.
    let _ = report.write_all(r.encode().as_bytes());
}

/// The leader's exit status, without reaping it (WNOWAIT).
fn peek_exit(pid: i32) -> Option<JobStatus> {
    // SAFETY: waitid fills the siginfo we own.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
        );
        if rc != 0 || info.si_pid() == 0 {
            return None;
        }
        Some(match info.si_code {
            libc::CLD_EXITED => JobStatus::Exited(info.si_status()),
            _ => JobStatus::Signaled(info.si_status()),
        })
    }
}

fn prctl(option: libc::c_int, arg: libc::c_ulong) -> Result<()> {
    // SAFETY: plain prctl with integer arguments.
    let rc = unsafe { libc::prctl(option, arg, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("prctl");
    }
    Ok(())
}

fn set_cloexec(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a descriptor number; failure is reported.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("fd {fd}"));
    }
    Ok(())
}

fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: as above.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) != 0 {
            return Err(std::io::Error::last_os_error()).context("O_NONBLOCK");
        }
    }
    Ok(())
}

fn pidfd_open(pid: i32) -> Result<OwnedFd> {
    // SAFETY: the syscall returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("pidfd_open (needs Linux 5.3)");
    }
    // SAFETY: a fresh descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn timerfd() -> Result<OwnedFd> {
    // SAFETY: returns a new descriptor or -1.
    let fd = unsafe {
        libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("timerfd_create");
    }
    // SAFETY: a fresh descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Arms the timer at an absolute CLOCK_BOOTTIME instant (or disarms it).
fn arm(timer: &OwnedFd, at: Option<BootInstant>) -> Result<()> {
    let ns = at.map_or(0, |t| t.as_nanos().max(1));
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        },
    };
    // SAFETY: valid descriptor and itimerspec.
    let rc = unsafe {
        libc::timerfd_settime(
            timer.as_raw_fd(),
            libc::TFD_TIMER_ABSTIME,
            &spec,
            std::ptr::null_mut(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("timerfd_settime");
    }
    Ok(())
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn drain(s: &mut UnixStream) {
    let mut b = [0u8; 64];
    while matches!(s.read(&mut b), Ok(n) if n > 0) {}
}

fn drain_timer(t: &OwnedFd) {
    let mut b = [0u8; 8];
    // SAFETY: reading 8 bytes into our buffer from a non-blocking timerfd.
    unsafe { libc::read(t.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
}
