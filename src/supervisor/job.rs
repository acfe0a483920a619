//! The running job under its watchdog: moving its deadline, passing signals on, stopping and
//! killing it, and waiting for its end, with lead-exec as the second enforcer of D.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{BufReader, Lines};
use tokio::net::unix::pipe;

use super::ctl::Ctl;
use super::protocol::{GroupEnd, Order, Report};
use super::{detach, group, JobEnd, KILL_LEAD};
use crate::clock::{BootInstant, BootTimer};
use crate::exit::JobStatus;

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
    pub(super) ctl: Ctl,
    pub(super) reports: Lines<BufReader<pipe::Receiver>>,
    pub(super) watchdog: detach::Detached,
    /// The job's cgroup, as the watchdog reported it.
    pub(super) cgroup: Option<PathBuf>,
    /// The lease deadline D last handed to the watchdog.
    pub(super) kill_at: BootInstant,
    /// When a stop lead-exec asked for is due to be complete: the grace after it.
    pub(super) stop_by: Option<BootInstant>,
    /// lead-exec's own timer at D: the second enforcer, for a watchdog that is frozen.
    pub(super) backstop: AsyncFd<BootTimer>,
    pub(super) backstop_fired: bool,
    /// When a watchdog that left the kill to lead-exec is killed in turn, if it still has not
    /// reported the group gone: one that is stopped would hold the term until continued.
    pub(super) abandon_at: Option<BootInstant>,
}

impl Job {
    /// Moves the deadline: SIGTERM at `d − grace`, SIGKILL at `d`. D only moves forward.
    pub fn extend(&mut self, d: BootInstant, grace: Duration) {
        if d <= self.kill_at {
            return;
        }
        self.kill_at = d;
        self.ctl.push(Order::Deadline {
            term_at: d.minus(grace).as_nanos(),
            kill_at: d.as_nanos(),
        });
    }

    pub fn forward(&mut self, sig: i32) {
        self.ctl.push(Order::Forward(sig));
    }

    /// `sig` now, SIGKILL after the grace. lead-exec kills the group itself once the grace
    /// is over, should the watchdog not have done it by then.
    pub fn stop(&mut self, sig: i32, grace: Duration) {
        let by = BootInstant::now().plus(grace);
        self.stop_by = Some(self.stop_by.map_or(by, |t| t.min(by)));
        self.ctl.push(Order::Stop(sig));
    }

    pub fn kill(&mut self) {
        self.stop_by = Some(BootInstant::now());
        self.ctl.push(Order::Kill);
    }

    /// Waits until the whole group is gone. Cancel-safe.
    ///
    /// Meanwhile lead-exec enforces D itself: if the group has not been reported gone when
    /// SIGKILL is due, it kills the group and the cgroup on its own. A healthy watchdog does
    /// the same at the same moment (a second SIGKILL is harmless); a frozen one cannot, and
    /// then this is what stops the job.
    pub async fn wait(&mut self) -> JobEnd {
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
                            break JobEnd { status, cause, slack_ms };
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

    fn watchdog_lost(&mut self, why: &str) -> JobEnd {
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
        JobEnd {
            status: JobStatus::Signaled(libc::SIGKILL),
            cause: GroupEnd::WatchdogLost,
            slack_ms: 0,
        }
    }

    pub(super) fn reap_watchdog(&mut self) {
        // It exits right after its last report.
        self.watchdog.wait();
    }

    /// Kills a watchdog that did not start the job in time, and whatever it may have
    /// started: its job's main process dies with it (PR_SET_PDEATHSIG), the rest of the
    /// cgroup here.
    pub(super) fn abandon(&mut self) {
        self.watchdog.kill();
        self.watchdog.wait();
        if let Some(cg) = &self.cgroup {
            group::Cgroup::kill_orphaned(cg);
        }
    }
}
