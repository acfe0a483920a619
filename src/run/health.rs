//! `--health-cmd`: a check that gates leadership.
//!
//! The check runs with `/bin/sh -c` every `--health-interval`, with that interval as its
//! timeout, in a process group of its own: never in the job's group, so stopping the job
//! never stops a check and a hung check is killed whole. Its output goes to the log.
//!
//! Each check runs under a guard: lead-exec re-executed in a hidden mode ([`GUARD_ARG`]) and
//! named `lexec-health`, leading a process group of its own that the check shares, that
//! starts the check and holds the read end of a pipe whose
//! only writer is lead-exec. When the pipe closes (lead-exec exits, however it ends, SIGKILL
//! included, or gives up on a check that ran past its timeout), the guard SIGKILLs the check's
//! group. So no check outlives lead-exec: a cron job that runs lead-exec every minute does not
//! pile up shells. `PR_SET_PDEATHSIG` alone would not do: it reaches only the direct child,
//! and fires when the forking thread exits rather than the process. The guard also kills what
//! a check leaves behind in its group once the shell exits. A guard that is itself killed
//! cannot: lead-exec then kills the group (its id is the guard's pid) once the guard is seen
//! dead by a signal, or when the check runs out of time, whichever comes first.
//!
//! A worker campaigns only once a check has passed. It becomes unhealthy after
//! `--health-failures` failures in a row, and healthy again on the next pass: one flaky check
//! neither costs a waiting candidate its place in line nor stops a running job.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{ExitCode, Stdio};
use std::time::Duration;
use tracing::Instrument;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::HealthCheck;
use crate::metrics;
use crate::supervisor::procs::pollin;

/// What the checks say so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// No check has finished yet.
    Unknown,
    Healthy,
    /// Never passed yet, or failed `--health-failures` times in a row.
    Unhealthy,
}

/// Turns check results into [`Health`]; no I/O.
#[derive(Debug, Clone)]
pub struct Tracker {
    limit: u32,
    failures: u32,
    state: Health,
}

impl Tracker {
    pub fn new(limit: u32) -> Tracker {
        Tracker {
            limit: limit.max(1),
            failures: 0,
            state: Health::Unknown,
        }
    }

    pub fn observe(&mut self, passed: bool) -> Health {
        if passed {
            self.failures = 0;
            self.state = Health::Healthy;
        } else {
            self.failures = self.failures.saturating_add(1);
            // A worker that never passed is not healthy enough to campaign.
            if self.state == Health::Unknown || self.failures >= self.limit {
                self.state = Health::Unhealthy;
            }
        }
        self.state
    }
}

/// Starts checking in the background; the receiver follows [`Health`]. The checks stop when
/// the receiver is dropped.
pub fn start(check: HealthCheck) -> watch::Receiver<Health> {
    let (tx, rx) = watch::channel(Health::Unknown);
    metrics::health_checks_on();
    tokio::spawn(
        async move {
            let mut tracker = Tracker::new(check.failures);
            let mut streak = Streak::default();
            let mut next = Instant::now();
            loop {
                let result = run_once(&check).await;
                let passed = result.is_ok();
                let now = std::time::Instant::now();
                match result {
                    Ok(()) => {
                        if let Some(n) = streak.passed() {
                            tracing::info!(
                                "health check passes again, after {n} failures in a row"
                            );
                        }
                    }
                    Err(f) => match streak.failed(now) {
                        Some(0) => tracing::warn!(output = f.output, "{}", f.what),
                        Some(quiet) => tracing::warn!(
                            output = f.output,
                            "{} (and {quiet} more failures since the last such line)",
                            f.what
                        ),
                        None => tracing::debug!(output = f.output, "{}", f.what),
                    },
                }
                metrics::health_checked(passed);
                let health = tracker.observe(passed);
                metrics::healthy(health == Health::Healthy);
                tx.send_if_modified(|h| std::mem::replace(h, health) != health);
                if tx.is_closed() {
                    return;
                }
                next = (next + check.interval).max(Instant::now());
                tokio::time::sleep_until(next).await;
            }
        }
        .in_current_span(),
    );
    rx
}

/// How often a check that keeps failing is worth a warning: at 100 ms a failing check would
/// otherwise be ten lines a second.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// A run of failed checks, for the log: the first failure is a warning, then one a
/// [`WARN_EVERY`] saying how many were not shown, and a pass after failures says so once.
#[derive(Debug, Default)]
pub struct Streak {
    failures: u64,
    last_warned: Option<std::time::Instant>,
    quiet: u64,
}

impl Streak {
    /// A failure: `Some(n)` to warn, with `n` failures not shown since the last warning.
    pub fn failed(&mut self, now: std::time::Instant) -> Option<u64> {
        self.failures += 1;
        let due = self
            .last_warned
            .is_none_or(|t| now.saturating_duration_since(t) >= WARN_EVERY);
        if self.failures == 1 || due {
            self.last_warned = Some(now);
            return Some(std::mem::take(&mut self.quiet));
        }
        self.quiet += 1;
        None
    }

    /// A pass: `Some(n)` when it ends a run of `n` failures.
    pub fn passed(&mut self) -> Option<u64> {
        self.quiet = 0;
        self.last_warned = None;
        Some(std::mem::take(&mut self.failures)).filter(|n| *n > 0)
    }
}

/// A check that did not pass, for the log.
struct Failed {
    what: String,
    /// The tail of what the check printed.
    output: Option<String>,
}

impl Failed {
    fn new(what: String) -> Failed {
        Failed { what, output: None }
    }
}

/// Waits until the checks say something other than [`Health::Unknown`].
pub async fn settled(rx: &mut watch::Receiver<Health>) -> Health {
    match rx.wait_for(|h| *h != Health::Unknown).await {
        Ok(h) => *h,
        // The checker is gone: nothing vouches for this worker any more.
        Err(_) => Health::Unhealthy,
    }
}

/// Waits until the checks say [`Health::Unhealthy`]; never returns otherwise.
pub async fn failing(rx: &mut watch::Receiver<Health>) {
    if rx.wait_for(|h| *h == Health::Unhealthy).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// `argv[1]` that makes lead-exec a check's guard (see the module documentation).
pub const GUARD_ARG: &str = "__health_guard";

/// The guard's `argv[0]`: what `ps` shows for it.
const GUARD_NAME: &str = "lexec-health";

/// Variables lead-exec reads that a check must not see, as the job does not.
const SECRET_ENV: [&str; 1] = ["LEAD_EXEC_PASSWORD"];

/// One check: whether it exited 0 within the interval.
async fn run_once(check: &HealthCheck) -> Result<(), Failed> {
    // The guard's stdin; our end is close-on-exec, so no other child of ours holds it open.
    let (life_r, life_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            return Err(Failed::new(format!(
                "health check: cannot make a pipe: {e}"
            )))
        }
    };
    // stdout and stderr share one pipe, read as it fills and only its end kept: a check may
    // print without end until it is killed at the interval, and lead-exec keeps the lease.
    let (out_r, out_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(std::io::Error::from)
        .and_then(|(r, w)| Ok((r, (w.try_clone()?, w))))
    {
        Ok(p) => p,
        Err(e) => {
            return Err(Failed::new(format!(
                "health check: cannot make a pipe: {e}"
            )))
        }
    };
    let mut out_r = std::fs::File::from(out_r);
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0(GUARD_NAME)
        .arg(GUARD_ARG)
        .arg(&check.command)
        .stdin(Stdio::from(life_r))
        .stdout(Stdio::from(out_w.0))
        .stderr(Stdio::from(out_w.1))
        // Out of lead-exec's group: a ^C or a signal to that group must not kill the guard
        // before it has killed the check.
        .process_group(0);
    for v in SECRET_ENV {
        cmd.env_remove(v);
    }
    let spawned = cmd.spawn();
    // Our copies of the write end, which the command holds.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            return Err(Failed::new(format!(
                "health check: cannot start its guard: {e}"
            )))
        }
    };
    // The check runs in its guard's process group, whose id is the guard's pid.
    let group = child.id() as i32;
    // Unreaped until the wait below, so the pid is the guard's.
    let guard = crate::supervisor::procs::tree::pidfd_open(group).ok();
    let mut waited = tokio::task::spawn_blocking(move || {
        let tail = read_output(&mut out_r, guard);
        child.wait().map(|status| (status, tail))
    });
    let result = match tokio::time::timeout(check.interval, &mut waited).await {
        Ok(r) => r,
        Err(_) => {
            // The guard kills the check's group when its pipe closes, then exits. A guard
            // that was killed itself cannot: what it left in its group holds the output pipes
            // open, and the wait would never end. The guard is not reaped yet (the wait has
            // not returned), so its pid, the group's id, is nobody else's.
            if !waited.is_finished() {
                kill_group(group);
            }
            drop(life_w);
            // What it printed before it was killed says why it hung.
            let output = match tokio::time::timeout(Duration::from_secs(5), waited).await {
                Ok(Ok(Ok((_, tail)))) => Some(output_tail(&tail)).filter(|t| !t.is_empty()),
                _ => None,
            };
            return Err(Failed {
                what: format!(
                    "health check timed out after {}; killed it",
                    crate::clock::human(check.interval)
                ),
                output,
            });
        }
    };
    drop(life_w);
    if let Ok(Ok(out)) = &result {
        use std::os::unix::process::ExitStatusExt;
        // A guard killed by a signal (SIGKILL, the OOM killer) took only the shell with it
        // (PR_SET_PDEATHSIG): what the check started runs on in the group. While any of it
        // lives, the group's id cannot be reused.
        if out.0.signal().is_some() {
            kill_group(group);
        }
    }
    match result {
        Ok(Ok((status, output))) => {
            let text = output_tail(&output);
            if status.success() {
                tracing::debug!(output = text, "health check passed");
                Ok(())
            } else {
                Err(Failed {
                    what: format!("health check failed: {status}"),
                    output: Some(text),
                })
            }
        }
        Ok(Err(e)) => Err(Failed::new(format!("health check: {e}"))),
        Err(e) => Err(Failed::new(format!("health check: {e}"))),
    }
}

/// The guard: runs `/bin/sh -c CHECK` (`argv[2]`) in the guard's process group, with the
/// guard's stdout and stderr, and exits with its status (128 + N for a signal). When its
/// stdin (lead-exec's pipe) closes or has data first, it SIGKILLs the rest of the group and
/// exits 137. Either way the rest of the group is killed before the guard exits.
pub fn guard_main(argv: Vec<OsString>) -> ExitCode {
    let Some(command) = argv.get(2) else {
        let _ = writeln!(std::io::stderr(), "lead-exec: {GUARD_ARG}: no command");
        return ExitCode::from(64);
    };
    // `ps -o comm`, `pgrep` and `top` show this name, not "exe" (it runs as /proc/self/exe).
    if let Ok(name) = std::ffi::CString::new(GUARD_NAME) {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string we own.
        unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong) };
    }
    let guard = nix::unistd::getpid();
    // lead-exec starts the guard as the leader of a group of its own; make sure of it, since
    // the end kills every other member of the group.
    if nix::unistd::getpgrp() != guard && nix::unistd::setpgid(guard, guard).is_err() {
        let _ = writeln!(
            std::io::stderr(),
            "lead-exec: {GUARD_ARG}: no process group"
        );
        return ExitCode::from(70);
    }
    // The check stays in the guard's process group (lead-exec made one for the guard), so
    // that lead-exec knows its id and can kill what is left should the guard be killed.
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c").arg(command).stdin(Stdio::null());
    // SAFETY: prctl, getppid and reset_signals' system calls are async-signal-safe. The guard has one thread, so the
    // death signal follows the guard itself: a SIGKILLed guard takes the shell with it.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != guard.as_raw() {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // Signals ignored by lead-exec's caller must not stay ignored in the check, as
            // they do not in the job.
            crate::supervisor::procs::reset_signals();
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // Not eprintln!, which panics when nobody reads stderr any more.
            let _ = writeln!(std::io::stderr(), "cannot start /bin/sh: {e}");
            return ExitCode::from(127);
        }
    };
    let pid = child.id() as i32;
    let exited = wait_exit_or_eof(pid);
    // The group is ours (its id is our pid): the kill reaches only the check and whatever
    // it left behind.
    kill_group_but_me();
    let status = child.wait();
    if !exited {
        return ExitCode::from(137);
    }
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => ExitCode::from(c as u8),
            (None, Some(sig)) => ExitCode::from((128 + sig) as u8),
            _ => ExitCode::from(1),
        },
        Err(_) => ExitCode::from(1),
    }
}

/// Blocks until the check (`pid`) exits (`true`, left unreaped) or stdin is readable or
/// closed (`false`).
/// SIGKILL to a check's group (the guard's), from lead-exec.
fn kill_group(pgid: i32) {
    if pgid > 1 {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The guard's end: SIGKILL to every other member of its process group (the check and what
/// it left behind). `killpg` would kill the guard too, so the members are found in /proc,
/// again until none is left: a member killed cannot fork any more, and one forked before the
/// kill is found on the next pass.
fn kill_group_but_me() {
    let me = std::process::id() as i32;
    let pgrp = nix::unistd::getpgrp().as_raw();
    for _ in 0..100 {
        let mut found = false;
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if pid == me {
                continue;
            }
            let Ok(stat) = crate::supervisor::procs::read_text(e.path().join("stat")) else {
                continue;
            };
            // Fields after the command name, which may hold spaces and parentheses.
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            let mut f = rest.split_whitespace();
            let state = f.next().unwrap_or("Z");
            let group = f.nth(1).and_then(|g| g.parse::<i32>().ok());
            if group == Some(pgrp) && state != "Z" && state != "X" {
                found = true;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_exit_or_eof(pid: i32) -> bool {
    use std::os::fd::AsRawFd;
    let pinned = crate::supervisor::procs::tree::pidfd_open(pid).ok();
    let pidfd = pinned.as_ref().map_or(-1, |fd| fd.as_raw_fd());
    loop {
        let mut fds = [pollin(0), pollin(pidfd)];
        // Without pidfds (before Linux 5.3), look for the exit every 20 ms.
        let (n, wait_ms) = if pidfd >= 0 { (2, -1) } else { (1, 20) };
        // SAFETY: `fds` holds `n` initialised pollfds and outlives the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), n, wait_ms) };
        if ready < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return false;
        }
        if fds[0].revents != 0 {
            return false;
        }
        if pidfd >= 0 && fds[1].revents != 0 {
            return true;
        }
        if pidfd < 0 {
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `info` is a valid siginfo_t to fill; WNOWAIT leaves the child unreaped.
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: waitid filled `info` (si_pid stays 0 while the child runs).
            if r != 0 || unsafe { info.si_pid() } != 0 {
                return true;
            }
        }
    }
}

/// Bytes of a check's output kept: more than its log line shows (the last 400 characters,
/// which may take 4 bytes each).
const OUTPUT_KEPT: usize = 4096;

/// Reads the check's output until the pipe's end, or until the guard (`guard`, a pidfd) has
/// exited: a process the check started out of its group (`setsid`) may hold the pipe open
/// for as long as it likes, and the guard's end is the check's. What the pipe holds then is
/// read without waiting for more. Only the last [`OUTPUT_KEPT`] bytes are kept.
fn read_output(out: &mut std::fs::File, guard: Option<OwnedFd>) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    let Some(guard) = guard else {
        // No pidfd (Linux before 5.3): to the pipe's end.
        return read_tail(out, OUTPUT_KEPT);
    };
    let mut tail = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let mut fds = [pollin(out.as_raw_fd()), pollin(guard.as_raw_fd())];
        // SAFETY: fds is a valid array of two pollfd for the duration of the call.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if fds[1].revents != 0 {
            break;
        }
        if fds[0].revents != 0 {
            match std::io::Read::read(out, &mut chunk) {
                Ok(0) => return tail,
                Ok(n) => keep_tail(&mut tail, &chunk[..n], OUTPUT_KEPT),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return tail,
            }
        }
    }
    // The guard is gone: what is in the pipe, and no more. Bounded too, since what holds the
    // pipe open may still be writing (`setsid yes &`), as fast as we read.
    let _ = nix::fcntl::fcntl(
        out.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    );
    let rest = read_tail(&mut std::io::Read::take(out, DRAIN_AT_MOST), OUTPUT_KEPT);
    keep_tail(&mut tail, &rest, OUTPUT_KEPT);
    tail
}

/// What is read of a check's output after its guard exited: a pipe's worth, and more.
const DRAIN_AT_MOST: u64 = 1 << 20;

/// Appends `bytes` to `tail`, keeping its last `keep` bytes.
fn keep_tail(tail: &mut Vec<u8>, bytes: &[u8], keep: usize) {
    tail.extend_from_slice(bytes);
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
}

/// Reads `r` to its end (or its first error: a non-blocking pipe's `WouldBlock`), keeping
/// only the last `keep` bytes of it.
fn read_tail(r: &mut impl std::io::Read, keep: usize) -> Vec<u8> {
    let mut tail = Vec::with_capacity(2 * keep);
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => keep_tail(&mut tail, &chunk[..n], keep),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    tail
}

/// The end of a check's output, short enough for one log line.
fn output_tail(output: &[u8]) -> String {
    const MAX: usize = 400;
    let all = String::from_utf8_lossy(output);
    let all = all.trim();
    match all.char_indices().rev().nth(MAX) {
        Some((i, _)) => format!("…{}", &all[i..]),
        None => all.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_check_warns_once_a_minute_and_a_pass_says_it_ended() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = Streak::default();
        assert_eq!(s.passed(), None, "nothing failed");
        assert_eq!(s.failed(at(0)), Some(0), "the first failure warns");
        // Ten a second for a minute: all quiet.
        for i in 1..600 {
            assert_eq!(s.failed(at(i * 100)), None);
        }
        assert_eq!(
            s.failed(at(60_000)),
            Some(599),
            "a minute on: one line, with the count"
        );
        assert_eq!(s.failed(at(60_100)), None);
        assert_eq!(s.passed(), Some(602));
        assert_eq!(s.passed(), None, "said once");
        assert_eq!(s.failed(at(60_200)), Some(0), "a new run warns at once");
    }

    #[test]
    fn a_worker_is_healthy_only_after_a_pass() {
        let mut t = Tracker::new(3);
        assert_eq!(t.observe(false), Health::Unhealthy);
        assert_eq!(t.observe(true), Health::Healthy);
    }

    #[test]
    fn it_takes_n_failures_in_a_row_to_become_unhealthy() {
        let mut t = Tracker::new(3);
        t.observe(true);
        assert_eq!(t.observe(false), Health::Healthy);
        assert_eq!(t.observe(false), Health::Healthy);
        assert_eq!(t.observe(true), Health::Healthy, "a pass resets the count");
        assert_eq!(t.observe(false), Health::Healthy);
        assert_eq!(t.observe(false), Health::Healthy);
        assert_eq!(t.observe(false), Health::Unhealthy);
        assert_eq!(
            t.observe(true),
            Health::Healthy,
            "one pass is enough to return"
        );
    }

    #[test]
    fn long_output_keeps_its_end() {
        let long = "x".repeat(1000) + "the end";
        let t = output_tail(long.as_bytes());
        assert!(t.ends_with("the end") && t.chars().count() <= 402, "{t}");
        assert_eq!(output_tail(b" ok\n"), "ok");
    }

    #[test]
    fn only_the_end_of_endless_output_is_kept() {
        let mut endless = std::io::Read::chain(
            std::io::Read::take(std::io::repeat(b'x'), 10 * OUTPUT_KEPT as u64 + 7),
            &b"the end"[..],
        );
        let tail = read_tail(&mut endless, OUTPUT_KEPT);
        assert_eq!(tail.len(), OUTPUT_KEPT);
        assert!(tail.ends_with(b"xthe end"));
        let mut short = &b"short"[..];
        assert_eq!(read_tail(&mut short, OUTPUT_KEPT), b"short");
    }
}
