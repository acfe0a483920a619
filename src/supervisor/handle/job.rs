//! The running job under its watchdog: moving its deadline, passing signals on, stopping and
//! killing it, and waiting for its end, with lead-exec as the second enforcer of D.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{BufReader, Lines};
use tokio::net::unix::pipe;

use std::os::fd::OwnedFd;

use super::ctl::Ctl;
use super::detach;
use crate::clock::{BootInstant, BootTimer};
use crate::exit::JobStatus;
use crate::supervisor::procs::group;
use crate::supervisor::procs::tree::{self, ProcView, Root};
use crate::supervisor::wire::{GroupEnd, Order, Report};
use crate::supervisor::{JobEnd, KILL_LEAD};

/// How long after a stop's grace (or a kill) lead-exec waits for the watchdog to have done
/// it, before it kills the group itself.
const STOP_SLACK: Duration = Duration::from_millis(200);

/// How long a watchdog that has not reported the group gone by the time lead-exec had to
/// kill it itself gets, before lead-exec kills the watchdog too and moves on.
const ABANDON_AFTER: Duration = Duration::from_secs(2);

/// How long lead-exec waits for the watchdog to say that the job's main process exited, once
/// its own pidfd says so, before it sends the watchdog SIGCONT (one stopped by hand, or by a
/// `pkill -STOP` by name).
const NUDGE_AFTER: Duration = Duration::from_millis(100);

/// How long after that SIGCONT a watchdog that still has not said (frozen in a cgroup,
/// stopped again) gets before lead-exec stops the rest of the job itself.
const TAKE_OVER_AFTER: Duration = Duration::from_millis(200);

/// How long a watchdog that has not reported the group gone gets, once lead-exec killed it
/// itself after the job's main process had exited: nothing is left for it to do.
const ABANDON_EXITED_AFTER: Duration = Duration::from_millis(500);

/// How often lead-exec says that the job's processes outlive its SIGKILLs.
const CHASE_WARN_EVERY: Duration = Duration::from_secs(10);

/// What lead-exec knows of the job's main process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leader {
    /// Running, as far as lead-exec knows.
    Running,
    /// Its pidfd says it exited, and the watchdog has not said so: it may be stopped.
    Unreported { since: BootInstant, nudged: bool },
    /// It exited with this status; the rest of the job is being stopped (by the watchdog, or
    /// by lead-exec when the watchdog never said).
    Exited(Option<JobStatus>),
}

/// lead-exec's job control (Ctrl-Z): stops and continues the running job from lead-exec's
/// signal thread, directly (the group, the cgroup and the tree through the watchdog's), so
/// that the job is stopped before lead-exec stops itself. Empty while no job runs: a job
/// clears it as it ends, before its group's id may be reused.
#[derive(Clone, Default)]
pub struct JobControl(Arc<Mutex<Option<Target>>>);

/// Where the running job's processes are, as lead-exec sees them.
struct Target {
    pid: i32,
    cgroup: Option<PathBuf>,
    watchdog: i32,
    view: Option<ProcView>,
}

impl JobControl {
    /// Sends `sig` to every process of the running job, if one runs.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = slot.as_ref() {
            group::Reach {
                leader: nix::unistd::Pid::from_raw(t.pid),
                cgroup: t.cgroup.as_deref(),
                tree: t.view.as_ref().map(|v| (v, Root::Child(t.watchdog))),
            }
            .signal(sig);
        }
    }

    fn set(&self, target: Option<Target>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }
}

/// A watchdog that has been handed its job and has not yet said that it runs: its pipes, and
/// the job's cgroup once reported. It becomes a [`Job`] on the watchdog's "spawned", and only
/// then, so that a job always has its pid.
pub(super) struct Handshake {
    pub(super) ctl: Ctl,
    pub(super) reports: Lines<BufReader<pipe::Receiver>>,
    pub(super) watchdog: detach::Detached,
    /// The job's cgroup, as the watchdog reported it ahead of the job.
    pub(super) cgroup: Option<PathBuf>,
}

impl Handshake {
    /// Waits for a watchdog that started nothing: it exits right after its last report.
    pub(super) fn reap(self) {
        self.watchdog.wait();
    }

    /// Kills a watchdog that did not start the job in time, and whatever it may have
    /// started: its job's main process dies with it (PR_SET_PDEATHSIG), the rest of the
    /// cgroup here.
    pub(super) fn abandon(self) {
        self.watchdog.kill();
        self.watchdog.wait();
        if let Some(cg) = &self.cgroup {
            group::Cgroup::kill_orphaned(cg);
        }
    }
}

/// lead-exec's own enforcement of D: the second enforcer, for a watchdog that is frozen.
struct Backstop {
    /// Armed for the next moment lead-exec must look (see [`Job::wait`]).
    timer: AsyncFd<BootTimer>,
    state: Enforced,
}

/// Whether lead-exec has had to enforce the deadline itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enforced {
    /// Not yet: the watchdog is trusted until D (or the end of a stop's grace).
    Waiting,
    /// lead-exec killed the group itself, at D (`at_deadline`) or after a stop's grace. A
    /// watchdog that still has not reported the group gone at `abandon_at` is killed in turn:
    /// one that is stopped would hold the term until continued.
    Fired {
        at_deadline: bool,
        abandon_at: Option<BootInstant>,
    },
}

/// lead-exec's chase of the job's processes before it kills a watchdog that has not reported
/// the group gone. Kept on the job, not in one wait for it: a wait is dropped and made again
/// on every renewal, and the watchdog must be killed once the chase is done whichever wait
/// sees it end.
struct Abandoning {
    chased: tokio::sync::oneshot::Receiver<()>,
    stop: Arc<AtomicBool>,
}

impl Enforced {
    /// Whether the chase that ends in the watchdog's kill is due to begin now; true once.
    fn abandon_due(&mut self, now: BootInstant) -> bool {
        match self {
            Enforced::Fired { abandon_at, .. } if abandon_at.is_some_and(|t| now >= t) => {
                *abandon_at = None;
                true
            }
            _ => false,
        }
    }
}

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
    backstop: Backstop,
    /// A pidfd of the job's main process, lead-exec's own: a stopped watchdog cannot hold a
    /// term whose job has ended.
    leader_fd: Option<AsyncFd<OwnedFd>>,
    leader: Leader,
    /// How /proc shows us, to reach the job's tree through the watchdog's.
    view: Option<ProcView>,
    /// Whether lead-exec asked for a stop or a kill.
    stopping: bool,
    /// `--grace`: what the rest of the job gets once its main process exited.
    grace: Duration,
    /// The chase under way before the watchdog is killed, if one is.
    abandoning: Option<Abandoning>,
    /// Where Ctrl-Z finds this job, once [`Job::under_job_control`] put it there.
    control: Option<JobControl>,
}

impl Job {
    /// The job the watchdog of `hs` reported spawned as `pid`, with D at `kill_at` and
    /// lead-exec's own timer for it.
    pub(super) fn spawned(
        hs: Handshake,
        pid: i32,
        contained: bool,
        kill_at: BootInstant,
        grace: Duration,
        timer: AsyncFd<BootTimer>,
    ) -> Job {
        let Handshake {
            ctl,
            reports,
            watchdog,
            cgroup,
        } = hs;
        // lead-exec's own pidfd of the job's main process, pinned while the watchdog holds it
        // (it reaps it only once the whole job is gone).
        let view = ProcView::detect().ok();
        let wd = Root::Child(watchdog.id() as i32);
        let leader_fd = view
            .and_then(|v| tree::pin_child(&v, wd, pid))
            // SAFETY: the AsyncFd owns the descriptor and keeps it open for as long as it is
            // registered.
            .and_then(|fd| unsafe { AsyncFd::register(fd) }.ok());
        Job {
            pid,
            contained,
            ctl,
            reports,
            watchdog,
            cgroup,
            kill_at,
            stop_by: None,
            backstop: Backstop {
                timer,
                state: Enforced::Waiting,
            },
            leader_fd,
            leader: Leader::Running,
            view,
            stopping: false,
            grace,
            abandoning: None,
            control: None,
        }
    }

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

    /// Lets lead-exec's job control (see [`JobControl`]) reach this job until it ends.
    pub fn under_job_control(&mut self, control: &JobControl) {
        control.set(Some(Target {
            pid: self.pid,
            cgroup: self.cgroup.clone(),
            watchdog: self.watchdog.id() as i32,
            view: self.view,
        }));
        self.control = Some(control.clone());
    }

    pub fn forward(&mut self, sig: i32) {
        self.ctl.push(Order::Forward(sig));
    }

    /// `sig` now, SIGKILL after the grace. lead-exec kills the group itself once the grace
    /// is over, should the watchdog not have done it by then.
    pub fn stop(&mut self, sig: i32, grace: Duration) {
        self.stopping = true;
        self.stop_within(grace);
        self.ctl.push(Order::Stop(sig));
    }

    pub fn kill(&mut self) {
        self.stopping = true;
        self.stop_by = Some(BootInstant::now());
        self.ctl.push(Order::Kill);
    }

    /// The job's stop is due to be complete `grace` from now, at the latest.
    fn stop_within(&mut self, grace: Duration) {
        let by = BootInstant::now().plus(grace);
        self.stop_by = Some(self.stop_by.map_or(by, |t| t.min(by)));
    }

    /// Waits until the whole group is gone. Cancel-safe.
    ///
    /// Meanwhile lead-exec enforces D itself: if the group has not been reported gone when
    /// SIGKILL is due, it kills the group and the cgroup on its own. A healthy watchdog does
    /// the same at the same moment (a second SIGKILL is harmless); a frozen one cannot, and
    /// then this is what stops the job.
    pub async fn wait(&mut self) -> JobEnd {
        let grace = self.grace;
        let ended = loop {
            if let Some(end) = self.abandon().await {
                break end;
            }
            let due = self.kill_at.minus(KILL_LEAD);
            // A stop is the watchdog's to carry out: lead-exec steps in a little later, only
            // for one that has not.
            let due = self.stop_by.map_or(due, |s| due.min(s.plus(STOP_SLACK)));
            let next = match self.backstop.state {
                Enforced::Waiting => Some(due),
                Enforced::Fired { abandon_at, .. } => abandon_at,
            };
            let next = match (next, self.unreported_check()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Err(e) = self.backstop.timer.get_ref().arm(next) {
                tracing::warn!("deadline timer: {e}; the watchdog alone enforces this deadline");
            }
            let watch_leader = self.leader == Leader::Running;
            tokio::select! {
                line = self.reports.next_line() => match line {
                    Ok(Some(l)) => match Report::decode(&l) {
                        Some(Report::Ended { status, cause, slack_ms }) => {
                            break JobEnd { status, cause, slack_ms };
                        }
                        // The watchdog stops the rest now, SIGKILL after the grace; lead-exec
                        // steps in should it stop meanwhile.
                        Some(Report::LeaderExited { status })
                            if !matches!(self.leader, Leader::Exited(_)) =>
                        {
                            self.leader = Leader::Exited(Some(status));
                            self.stop_within(grace);
                        }
                        Some(Report::LeaderExited { .. }) => {}
                        Some(other) => {
                            tracing::warn!("unexpected report from the watchdog: {}", other.name());
                        }
                        None => {}
                    },
                    Ok(None) => break self.watchdog_lost("it closed its pipe"),
                    Err(e) => break self.watchdog_lost(&format!("{e:#}")),
                },
                // What a busy watchdog could not take yet goes as soon as it can.
                _ = self.ctl.writable(), if self.ctl.pending() => self.ctl.flush(),
                _ = leader_exit(&self.leader_fd), if watch_leader => {
                    self.leader = Leader::Unreported { since: BootInstant::now(), nudged: false };
                }
                ready = self.backstop.timer.readable() => {
                    if let Ok(mut guard) = ready {
                        self.backstop.timer.get_ref().drain();
                        guard.clear_ready();
                    }
                    let now = BootInstant::now();
                    if self.unreported_check().is_some_and(|t| now >= t) {
                        self.watchdog_silent(now, grace);
                    } else if self.backstop.state == Enforced::Waiting && now >= due {
                        let after = match self.leader {
                            Leader::Exited(_) => ABANDON_EXITED_AFTER,
                            _ => ABANDON_AFTER,
                        };
                        self.backstop.state = Enforced::Fired {
                            at_deadline: now >= self.kill_at.minus(KILL_LEAD),
                            abandon_at: Some(now.plus(after)),
                        };
                        tracing::debug!(pid = self.pid, "deadline: lead-exec kills the job's group itself");
                        self.reach().kill();
                    } else if self.backstop.state.abandon_due(now) {
                        tracing::warn!(pid = self.pid, watchdog = self.watchdog.id(), "the watchdog has not reported the job's group gone; killing the watchdog");
                        let stop = Arc::new(AtomicBool::new(false));
                        let chased = self.chase_the_tree(stop.clone());
                        self.abandoning = Some(Abandoning { chased, stop });
                    }
                }
            }
        };
        // Its group's id is free once the watchdog reaps the leader: no more job control.
        if let Some(c) = self.control.take() {
            c.set(None);
        }
        if ended.cause == GroupEnd::WatchdogLost {
            self.reap_watchdog();
        } else {
            // It reported the group gone and only exits now: nothing waits on that.
            // A thread of its own, not tokio's pool, which panics when no thread can be made
            // (a full pids cgroup): then only a look now, and a zombie left for the exit.
            let pid = nix::unistd::Pid::from_raw(self.watchdog.id() as i32);
            let waiter = std::thread::Builder::new()
                .name("reap-watchdog".into())
                .spawn(move || nix::sys::wait::waitpid(pid, None));
            if waiter.is_err() {
                let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
            }
        }
        ended
    }

    /// The chase before the watchdog is killed, if one is under way, carried on to its end
    /// (cancel-safe: a wait dropped meanwhile leaves it to the next): its tree first, to the
    /// last process, since what it re-parented would go to init with it; then the watchdog,
    /// whose pipe's end then ends the term. A watchdog that reports the group gone meanwhile
    /// (what lead-exec could not see, it could: its children are its to wait for) ends the
    /// chase, and the term ends as it says.
    async fn abandon(&mut self) -> Option<JobEnd> {
        let a = self.abandoning.as_mut()?;
        let reported = loop {
            tokio::select! {
                _ = &mut a.chased => break None,
                line = self.reports.next_line() => match line {
                    Ok(Some(l)) => {
                        if let Some(Report::Ended { status, cause, slack_ms }) = Report::decode(&l) {
                            break Some(JobEnd { status, cause, slack_ms });
                        }
                    }
                    // Gone: the chase goes on alone.
                    _ => {
                        let _ = (&mut a.chased).await;
                        break None;
                    }
                },
            }
        };
        a.stop.store(true, Ordering::Relaxed);
        self.abandoning = None;
        if reported.is_none() {
            self.watchdog.kill();
        }
        reported
    }

    /// When the next look is due at a job's main process that exited while the watchdog said
    /// nothing.
    fn unreported_check(&self) -> Option<BootInstant> {
        match self.leader {
            Leader::Unreported { since, nudged } => Some(if nudged {
                since.plus(NUDGE_AFTER + TAKE_OVER_AFTER)
            } else {
                since.plus(NUDGE_AFTER)
            }),
            _ => None,
        }
    }

    /// The job's main process exited and the watchdog has not said so: first a SIGCONT (it
    /// may only be stopped), then lead-exec stops the rest of the job itself, SIGKILL after
    /// the grace, and kills the watchdog once the job is gone. The exit status is read from
    /// the zombie the watchdog holds.
    fn watchdog_silent(&mut self, now: BootInstant, grace: Duration) {
        let Leader::Unreported { since, nudged } = self.leader else {
            return;
        };
        let wd = self.watchdog.id() as i32;
        if !nudged {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(wd),
                nix::sys::signal::Signal::SIGCONT,
            );
            self.leader = Leader::Unreported {
                since,
                nudged: true,
            };
            return;
        }
        let status = self
            .view
            .and_then(|v| tree::zombie_status(&v, Root::Child(wd), self.pid))
            .map(JobStatus::from_wait);
        let silent = now.saturating_since(since);
        self.leader = Leader::Exited(status);
        if self.anything_left() {
            tracing::warn!(
                pid = self.pid,
                watchdog = wd,
                "the job's main process exited and its watchdog has not said so in {} (stopped or frozen?); lead-exec stops the rest of the job itself",
                crate::clock::human(silent)
            );
            self.reach().signal(nix::sys::signal::Signal::SIGTERM);
            self.stop_within(grace);
        } else {
            // Nothing left to stop: the watchdog goes now, and its pipe's end ends the wait.
            tracing::warn!(
                pid = self.pid,
                watchdog = wd,
                "the job has ended and its watchdog has not said so in {} (stopped or frozen?); killing the watchdog",
                crate::clock::human(silent)
            );
            self.backstop.state = Enforced::Fired {
                at_deadline: false,
                abandon_at: None,
            };
            self.watchdog.kill();
        }
    }

    /// Whether any process of the job but its exited main process may still be alive: a live
    /// one in the watchdog's tree, or a member of the cgroup. Without a view of /proc, yes.
    fn anything_left(&self) -> bool {
        !self.reach().settled()
    }

    /// Kills the job's processes, walking the watchdog's tree again and again until nothing of
    /// the job can run (or `stop` is set), before the watchdog itself is killed: while it lives, whatever the job
    /// re-parents goes to it and stays in reach; once it is dead, to init, out of reach. Off
    /// lead-exec's thread, since a tree that keeps forking takes many walks; it takes as long
    /// as the job's processes live, which is the promise (the term does not end before).
    ///
    /// The chase runs on a thread of its own; where none can be made (a full pids cgroup,
    /// which a job's zombies under a frozen watchdog can fill), on this one, holding up the
    /// rest of lead-exec until it is done, rather than giving up on the job's processes.
    fn chase_the_tree(&self, stop: Arc<AtomicBool>) -> tokio::sync::oneshot::Receiver<()> {
        let (pid, cgroup, view) = (self.pid, self.cgroup.clone(), self.view);
        let wd = self.watchdog.id() as i32;
        let (done, chased) = tokio::sync::oneshot::channel();
        // The run's span goes along: the chase's lines carry its election and id too.
        let span = tracing::Span::current();
        let chase = move || {
            let _in_run = span.enter();
            let reach = group::Reach {
                leader: nix::unistd::Pid::from_raw(pid),
                cgroup: cgroup.as_deref(),
                tree: view.as_ref().map(|v| (v, Root::Child(wd))),
            };
            let started = std::time::Instant::now();
            let mut said = std::time::Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                reach.kill();
                // Without a view of /proc there is no tree to walk: the group and the cgroup
                // got their SIGKILL.
                if reach.tree.is_none() || reach.settled() {
                    return;
                }
                let spent = started.elapsed();
                if spent >= said + CHASE_WARN_EVERY {
                    said = spent;
                    tracing::warn!(pid, "processes of the job are still alive (or /proc cannot show them all) after {} of SIGKILLs; the term goes on until they are gone", crate::clock::human(spent));
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        // Handed over through a slot: a thread that could not be made leaves the work in it.
        let slot = Arc::new(Mutex::new(Some((chase, done))));
        let theirs = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("chase".into())
            .spawn(move || {
                let work = theirs.lock().map(|mut w| w.take()).ok().flatten();
                if let Some((chase, done)) = work {
                    chase();
                    let _ = done.send(());
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no thread for the chase ({e}); chasing the job's processes on lead-exec's own thread");
            let work = slot.lock().map(|mut w| w.take()).ok().flatten();
            if let Some((chase, done)) = work {
                chase();
                let _ = done.send(());
            }
        }
        chased
    }

    /// Where the job's processes are: its group (the watchdog holds the group's leader
    /// unreaped until the group is empty, so the pgid belongs to the job unless the group
    /// ended in the instant before this, with its report still in the pipe), its cgroup, and
    /// the watchdog's tree.
    fn reach(&self) -> group::Reach<'_> {
        group::Reach {
            leader: nix::unistd::Pid::from_raw(self.pid),
            cgroup: self.cgroup.as_deref(),
            tree: self
                .view
                .as_ref()
                .map(|v| (v, Root::Child(self.watchdog.id() as i32))),
        }
    }

    fn watchdog_lost(&mut self, why: &str) -> JobEnd {
        // The job's main process had ended and lead-exec stopped the rest, or the watchdog
        // said how it ended: the term ends as the job did, once what is left is killed.
        if let Leader::Exited(Some(status)) = self.leader {
            self.kill_orphaned();
            let at_deadline = matches!(
                self.backstop.state,
                Enforced::Fired {
                    at_deadline: true,
                    ..
                }
            );
            let cause = if at_deadline {
                GroupEnd::Deadline
            } else if self.stopping {
                GroupEnd::Stop
            } else {
                GroupEnd::SelfExit
            };
            return JobEnd {
                status,
                cause,
                slack_ms: self.kill_at.millis_after(BootInstant::now()),
            };
        }
        // One line, whatever the error holds: this goes to the log as is.
        let why = why.replace('\n', " ");
        tracing::error!(
            pid = self.pid,
            "the watchdog died ({why}); killing what is left of the job"
        );
        self.kill_orphaned();
        JobEnd {
            status: JobStatus::Signaled(libc::SIGKILL),
            cause: GroupEnd::WatchdogLost,
            slack_ms: 0,
        }
    }

    /// Kills what is left of a job whose watchdog is gone. The job's main process dies with
    /// its parent (PR_SET_PDEATHSIG); the rest of its cgroup and of its group is ours to kill
    /// now. The group too, cgroup or not: a member the cgroup does not hold must not run on.
    /// Nobody holds the group's leader unreaped any more, so this is the one place a reused
    /// pgid could be hit, and only in the instant after the watchdog itself was killed. What
    /// left both the group and the cgroup went to init with the watchdog's death, out of
    /// reach: lead-exec-safety(7)'s escape table says so.
    fn kill_orphaned(&self) {
        if let Some(cg) = &self.cgroup {
            group::Cgroup::kill_orphaned(cg);
        }
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    fn reap_watchdog(&mut self) {
        // It exits right after its last report.
        self.watchdog.wait();
    }
}

/// Resolves once the job's main process has exited (its pidfd turns readable); never without
/// a pidfd.
async fn leader_exit(fd: &Option<AsyncFd<OwnedFd>>) {
    match fd {
        Some(fd) => {
            let _ = fd.readable().await;
        }
        None => std::future::pending().await,
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(c) = self.control.take() {
            c.set(None);
        }
    }
}
