//! The watchdog: a small process that owns the job's process group and enforces the lease
//! deadline even when lead-exec is killed, frozen or starved.
//!
//! It runs as the `lead-exec-watchdog` binary, or as lead-exec re-executed in a hidden mode
//! (`lead-exec __watchdog ...`): single-threaded, no async runtime, no etcd. Either way it
//! runs in a session of its own and calls itself [`NAME`]. lead-exec sends it deadline
//! extensions over a pipe ([`super::wire`]). It sends SIGTERM to the group at D − grace
//! and SIGKILL just before D, measured on CLOCK_BOOTTIME with a timerfd, whatever lead-exec is
//! doing. EOF on the pipe means lead-exec is gone: there is no leadership left to wait for, so
//! the group is killed at once. `PR_SET_PDEATHSIG` is a second way to learn of the parent's
//! death; the pipe is the first.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

pub mod enforcer;
mod spawn;

use crate::clock::{BootInstant, BootTimer};
use crate::exit::JobStatus;
use crate::supervisor::procs::group::{Cgroup, Group};
use crate::supervisor::procs::pollin;
use crate::supervisor::procs::tree::ProcView;
use crate::supervisor::wire::{decode_start_line, GroupEnd, Order, Report, StartLine};
use crate::supervisor::CgroupMode;
use enforcer::{may_spawn, Enforcer, GroupOp, Input};

/// `argv[1]` that selects this mode.
pub const ARG: &str = "__watchdog";

pub use crate::supervisor::wire::NAME;

/// Signal the kernel sends us when the thread that forked us dies.
const PARENT_DEATH: i32 = libc::SIGUSR2;

/// The watchdog's arguments, in order. The job's command, variables and deadline are not
/// among them: they come over the control pipe ([`super::wire::encode_start`]), because
/// the watchdog is started while lead-exec still campaigns, and so that the watchdog's own
/// command line never holds what the job's does (`pkill -f` matches it).
pub struct Args {
    pub parent: i32,
    pub ctl_fd: RawFd,
    pub report_fd: RawFd,
    pub grace: Duration,
    pub cgroup: CgroupMode,
}

impl Args {
    pub fn to_argv(&self) -> Vec<OsString> {
        [
            ARG.to_string(),
            self.parent.to_string(),
            self.ctl_fd.to_string(),
            self.report_fd.to_string(),
            self.grace.as_nanos().to_string(),
            self.cgroup.as_str().to_string(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect()
    }

    fn parse(argv: &[OsString]) -> Result<Args> {
        let s = |i: usize| -> Result<&str> {
            argv.get(i)
                .and_then(|a| a.to_str())
                .with_context(|| format!("watchdog argument {i} missing"))
        };
        let n = |i: usize| -> Result<u64> { Ok(s(i)?.parse()?) };
        if s(1)? != ARG || argv.len() != 7 {
            bail!("bad watchdog arguments");
        }
        Ok(Args {
            parent: s(2)?.parse()?,
            ctl_fd: s(3)?.parse()?,
            report_fd: s(4)?.parse()?,
            grace: Duration::from_nanos(n(5)?),
            // An unknown word is a version mismatch, not a wish for the default.
            cgroup: CgroupMode::parse(s(6)?)
                .with_context(|| format!("unknown cgroup mode '{}'", s(6).unwrap_or("")))?,
        })
    }
}

/// What starts the job, as lead-exec sends it.
struct Start {
    command: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    term_at: BootInstant,
    kill_at: BootInstant,
    /// Whatever was read past the command: orders already.
    rest: Vec<u8>,
}

/// Reads the job's start from the control pipe (blocking: nothing else can happen before
/// it). `None` on EOF: lead-exec went away, or never won a term.
fn read_start(ctl: &mut File) -> Result<Option<Start>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (mut env, mut deadline) = (Vec::new(), None);
    loop {
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let rest = buf.split_off(i + 1);
            let line = std::mem::replace(&mut buf, rest);
            match decode_start_line(&line).context("bad start from lead-exec")? {
                StartLine::Var(k, v) => env.push((k, v)),
                StartLine::Deadline { term_at, kill_at } => deadline = Some((term_at, kill_at)),
                StartLine::Command(command) => {
                    let (t, k) = deadline.context("no deadline before the command")?;
                    return Ok(Some(Start {
                        command,
                        env,
                        term_at: BootInstant::from_nanos(t),
                        kill_at: BootInstant::from_nanos(k),
                        rest: buf,
                    }));
                }
            }
        }
        match ctl.read(&mut chunk) {
            Ok(0) => return Ok(None),
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading the start"),
        }
    }
}

/// Entry point of the hidden mode. Never returns into lead-exec's normal flow.
pub fn main(argv: Vec<OsString>) -> std::process::ExitCode {
    match run(&argv) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Not eprintln!, which panics when nobody reads stderr any more.
            let _ = writeln!(std::io::stderr(), "lead-exec: watchdog: {e:#}");
            std::process::ExitCode::from(70)
        }
    }
}

fn run(argv: &[OsString]) -> Result<()> {
    // First, before anything can fail or a job exists: a name that no `pkill` pattern for
    // lead-exec matches (otherwise the file name, or "exe" when started as /proc/self/exe).
    let name = std::ffi::CString::new(NAME).expect("no NUL in the name");
    prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong)?;
    let a = Args::parse(argv)?;
    set_cloexec(a.ctl_fd)?;
    set_cloexec(a.report_fd)?;
    // SAFETY: lead-exec handed us these two descriptors and nothing else owns them.
    let mut ctl = unsafe { File::from_raw_fd(a.ctl_fd) };
    let mut report = unsafe { File::from_raw_fd(a.report_fd) };
    // Everything that does not depend on the job is set up while lead-exec campaigns, its
    // cgroup included (below), so a won term pays only for the job's fork and exec.
    //
    // Orphaned grandchildren come to us, so that we can reap them and see the group empty.
    prctl(libc::PR_SET_CHILD_SUBREAPER, 1)?;
    // We run in a session of our own (lead-exec calls setsid before exec), so no group signal
    // aimed at lead-exec reaches us; these are ignored in case one is aimed at us directly:
    // lead-exec decides what the job gets, and the watchdog itself must neither die nor stop.
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
    let (wake_r, wake_w) = UnixStream::pair()?;
    wake_r.set_nonblocking(true)?;
    wake_w.set_nonblocking(true)?;
    signal_hook::low_level::pipe::register(libc::SIGCHLD, wake_w.try_clone()?)?;
    signal_hook::low_level::pipe::register(PARENT_DEATH, wake_w)?;
    prctl(libc::PR_SET_PDEATHSIG, PARENT_DEATH as libc::c_ulong)?;
    // The parent may have died before the prctl took effect.
    if nix::unistd::getppid().as_raw() != a.parent {
        return Ok(());
    }
    // Everything that can fail is set up before the fork, so that no job runs unsupervised.
    let timer = BootTimer::new().context("timerfd_create")?;
    // lead-exec refuses to run where /proc cannot show our namespace; a watchdog started
    // otherwise still has the group, the cgroup and the tree's liveness.
    let view = ProcView::detect().ok();
    let prepared = (a.cgroup != CgroupMode::Off).then(Cgroup::create);
    // lead-exec learns the cgroup's name now, not with the job: should we stop or die from
    // here on, it can still kill whatever we started in it.
    if let Some(Ok(cg)) = &prepared {
        let path = cg.path().as_os_str().to_owned();
        send(&mut report, &Report::Cgroup { path });
    }
    let start = match read_start(&mut ctl) {
        Ok(Some(start)) => start,
        // Never used (lead-exec gave up, or exited); the cgroup made ahead goes with it.
        other => return other.map(|_| ()),
    };
    let cgroup = match prepared {
        None => None,
        Some(Ok(cg)) => Some(cg),
        Some(Err(_)) if a.cgroup == CgroupMode::Auto => None,
        Some(Err(e)) => {
            let message = format!("--cgroup on: cannot create a cgroup v2 for the job: {e}");
            send(&mut report, &Report::SetupFailed { message });
            return Ok(());
        }
    };
    // Single-threaded here, so changing the environment races with nothing; the job
    // inherits it.
    for (k, v) in &start.env {
        std::env::set_var(k, v);
    }
    let (command, pending) = (start.command, start.rest);
    set_nonblocking(ctl.as_raw_fd())?;

    // Right before the fork: lead-exec checked the deadline too, but it may have been frozen
    // or starved since, and the deadline it passed may be spent by now.
    if !may_spawn(BootInstant::now(), start.term_at) {
        send(&mut report, &Report::TooLate);
        return Ok(());
    }
    let required = a.cgroup == CgroupMode::On;
    let spawned = match spawn::spawn(&command, cgroup.as_ref(), required) {
        Ok(s) => s,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
            send(&mut report, &Report::ExecFailed { errno });
            return Ok(());
        }
    };
    let cgroup = match cgroup {
        Some(cg) if !spawned.in_cgroup => {
            drop(cg);
            None
        }
        other => other,
    };
    let pid = spawned.pid;
    let contained = cgroup.is_some();
    send(&mut report, &Report::Spawned { pid, contained });
    if let Some(cg) = &cgroup {
        cg.sweep_stale();
    }
    let mut w = Supervision {
        group: Group {
            leader: Pid::from_raw(pid),
            cgroup,
            view,
        },
        enforcer: Enforcer::new(a.grace, start.term_at, start.kill_at),
        exited: None,
    };
    let io = Io {
        parent: a.parent,
        ctl,
        report,
        wake_r,
        timer,
    };
    or_kill(&mut w, |w| supervise(w, io, spawned.pidfd, pending))
}

/// Runs `f`, and kills the group if it fails: a job we can no longer supervise must not run
/// on.
fn or_kill(w: &mut Supervision, f: impl FnOnce(&mut Supervision) -> Result<()>) -> Result<()> {
    let res = f(w);
    if res.is_err() {
        w.group.kill();
    }
    res
}

/// The descriptors of the supervision loop.
struct Io {
    parent: i32,
    ctl: File,
    report: File,
    wake_r: UnixStream,
    timer: BootTimer,
}

/// Enforces the schedule until the group is gone. On error the caller kills the group.
fn supervise(
    w: &mut Supervision,
    mut io: Io,
    pidfd: Option<OwnedFd>,
    mut buf: Vec<u8>,
) -> Result<()> {
    let pid = w.group.leader.as_raw();
    let pidfd = match pidfd {
        Some(fd) => fd,
        None => crate::supervisor::procs::tree::pidfd_open(pid)
            .context("pidfd_open (needs Linux 5.3)")?,
    };
    let mut ctl_open = true;
    w.take_orders(&mut buf, BootInstant::now());
    loop {
        let now = BootInstant::now();
        w.on(now, Input::Tick);
        // Orphans reparented to us are reaped as soon as they exit, whatever the job's main
        // process is doing.
        w.group.reap_orphans();
        if let Some(status) = w.exited {
            if !w.group.has_live_members() {
                let end = w.finish(status);
                // Empty by now; its removal (when the supervision is dropped) need not hold
                // up lead-exec's handover.
                send(&mut io.report, &end);
                return Ok(());
            }
            w.on(now, Input::LeaderExited);
        }
        io.timer
            .arm(w.enforcer.next_wake())
            .context("timerfd_settime")?;

        let mut fds = vec![pollin(io.wake_r.as_raw_fd()), pollin(io.timer.as_raw_fd())];
        // An exited (unreaped) leader leaves its pidfd readable for good: polling it then
        // would return at once, every time.
        if w.exited.is_none() {
            fds.push(pollin(pidfd.as_raw_fd()));
        }
        let ctl_slot = fds.len();
        if ctl_open {
            fds.push(pollin(io.ctl.as_raw_fd()));
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
            // A signal (the SIGCHLD of the job's exit, delivered when a stopped watchdog is
            // continued) says nothing about what is ready: look at everything, every read
            // being non-blocking. Going straight back to the deadline check instead judged a
            // watchdog continued after a stop by the deadline it had before it: the
            // extensions waiting in the pipe unread, a job that had exited on its own was
            // reported stopped at the deadline, and lead-exec ran it again on a new term.
            for f in &mut fds {
                f.revents = libc::POLLIN;
            }
        }
        drain(&mut io.wake_r);
        io.timer.drain();
        let now = BootInstant::now();
        if w.exited.is_none() && fds[2].revents != 0 {
            w.exited = peek_exit(pid);
            // Said at once: should we be stopped from here on, lead-exec knows how the job
            // ended and ends the term itself.
            if let Some(status) = w.exited {
                send(&mut io.report, &Report::LeaderExited { status });
            }
        }
        if ctl_open && fds.get(ctl_slot).is_some_and(|f| f.revents != 0) {
            let mut chunk = [0u8; 512];
            loop {
                match io.ctl.read(&mut chunk) {
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
            w.take_orders(&mut buf, now);
            if !ctl_open {
                w.on(now, Input::Orphaned);
            }
        }
        if nix::unistd::getppid().as_raw() != io.parent {
            ctl_open = false;
            w.on(now, Input::Orphaned);
        }
    }
}

/// The watchdog's state for one job: the group, and the enforcer that decides what it gets.
struct Supervision {
    group: Group,
    enforcer: Enforcer,
    /// The leader's status once it exited (still unreaped).
    exited: Option<JobStatus>,
}

impl Supervision {
    /// Carries out what the enforcer decides for `input`.
    fn on(&mut self, now: BootInstant, input: Input) {
        match self.enforcer.on(now, input) {
            Some(GroupOp::Kill) => self.group.kill(),
            Some(GroupOp::Signal(sig)) => {
                if let Ok(s) = Signal::try_from(sig) {
                    self.group.signal(s);
                }
            }
            None => {}
        }
    }

    /// Carries out the complete order lines in `buf`, leaving a partial one there.
    fn take_orders(&mut self, buf: &mut Vec<u8>, now: BootInstant) {
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            if let Some(c) = Order::decode(&String::from_utf8_lossy(&line)) {
                self.on(now, Input::Order(c));
            }
        }
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
        Report::Ended {
            status,
            cause: self.enforcer.cause().unwrap_or(GroupEnd::SelfExit),
            slack_ms: self.enforcer.lease_deadline().millis_after(died),
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

fn drain(s: &mut UnixStream) {
    let mut b = [0u8; 64];
    while matches!(s.read(&mut b), Ok(n) if n > 0) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn a_failed_supervision_kills_the_group() {
        use std::os::unix::process::CommandExt;
        let mut job = std::process::Command::new("/bin/sh")
            .args(["-c", "sleep 30 & exec sleep 30"])
            .process_group(0)
            .spawn()
            .unwrap();
        let leader = Pid::from_raw(job.id() as i32);
        let mut w = Supervision {
            group: Group {
                leader,
                cgroup: None,
                // Not the tree: the test process's children are other tests' too.
                view: None,
            },
            enforcer: Enforcer::new(Duration::from_millis(500), at(9_500), at(10_000)),
            exited: None,
        };
        let res = or_kill(&mut w, |_| bail!("poll: broken"));
        assert!(res.is_err());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(job.wait().unwrap().signal(), Some(libc::SIGKILL));
        // The group's other member got it too (once its new parent reaps it, the group is
        // empty).
        let until = BootInstant::now().plus(Duration::from_secs(5));
        while nix::sys::signal::killpg(leader, None).is_ok() && !until.has_passed() {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            nix::sys::signal::killpg(leader, None),
            Err(nix::errno::Errno::ESRCH)
        );
    }

    #[test]
    fn an_unknown_cgroup_mode_is_refused_not_taken_for_auto() {
        let args = |mode: &str| -> Vec<OsString> {
            [ARG, ARG, "1", "3", "4", "5", mode]
                .iter()
                .map(OsString::from)
                .collect()
        };
        assert_eq!(Args::parse(&args("off")).unwrap().cgroup, CgroupMode::Off);
        let e = Args::parse(&args("bogus")).err().expect("refused");
        assert!(e.to_string().contains("bogus"), "{e}");
    }
}
