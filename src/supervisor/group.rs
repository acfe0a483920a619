//! The job's process group, and its cgroup when one could be made.
//!
//! The watchdog never reaps the group leader before its last signal to the group: while the
//! leader is an unreaped zombie its pid (= the pgid) cannot be reused, so `killpg` cannot hit a
//! stranger. Grandchildren that outlive their parents are reparented to the watchdog (it is a
//! child subreaper) and reaped here.

use std::ffi::CString;
use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

/// A cgroup v2 directory that holds only the job's processes.
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    /// The directory, open: clone3 creates the job inside it.
    fd: OwnedFd,
    /// `DIR/cgroup.procs` as a C string, so the child can join without allocating.
    procs: CString,
}

impl Cgroup {
    /// The job cgroup a watchdog with pid `watchdog` uses: `lead-exec-job-<pid>` beside the
    /// caller's own cgroup (lead-exec and its watchdog share one).
    pub fn path_for(watchdog: u32) -> std::io::Result<PathBuf> {
        let mount = cgroup2_mount()?;
        let own = fs::read_to_string("/proc/self/cgroup")?
            .lines()
            .find_map(|l| l.strip_prefix("0::").map(str::to_string))
            .ok_or_else(|| other("this process is in no cgroup v2"))?;
        let parent = mount.join(own.trim_start_matches('/'));
        Ok(parent.join(format!("{JOB}{watchdog}")))
    }

    /// Creates this watchdog's job cgroup, if cgroup v2 is mounted and writable. A waiting
    /// candidate's watchdog makes it ahead, so that a won term pays only for the job's fork
    /// and exec; the stale ones beside it are left to [`Cgroup::sweep_stale`], once the job
    /// runs.
    pub fn create() -> std::io::Result<Cgroup> {
        let dir = Cgroup::path_for(std::process::id())?;
        fs::create_dir(&dir)?;
        let procs = dir.join("cgroup.procs");
        let fd = fs::File::open(&dir)?.into();
        let cg = Cgroup {
            procs: CString::new(procs.as_os_str().as_encoded_bytes()).map_err(other)?,
            fd,
            dir,
        };
        // A cgroup we cannot move a process into (the "no internal processes" rule, or
        // delegation) is no use: find out now rather than in the child.
        fs::OpenOptions::new()
            .write(true)
            .open(cg.dir.join("cgroup.procs"))?;
        Ok(cg)
    }

    /// For the child between fork and exec: joins this cgroup. Only async-signal-safe calls.
    pub fn join_self(procs: &CString) -> std::io::Result<()> {
        // SAFETY: open/write/close on a C string we own; no allocation.
        unsafe {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if n != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Kills and removes the job cgroups beside this one whose watchdogs are gone. Run by a
    /// watchdog whose job has started, not while it waits: every waiting candidate's
    /// watchdog holds a cgroup, and a sweep by each of a thousand of them on its way in would
    /// read `/proc` a million times.
    pub fn sweep_stale(&self) {
        if let Some(parent) = self.dir.parent() {
            sweep_stale(parent);
        }
    }

    pub fn procs_path(&self) -> &CString {
        &self.procs
    }

    pub fn dir_fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn pids(&self) -> Vec<i32> {
        pids_in(&self.dir)
    }

    /// Kills every member at once, setsid escapees included.
    pub fn kill(&self) {
        kill_dir(&self.dir);
    }

    pub fn remove(&self) {
        let _ = fs::remove_dir(&self.dir);
    }

    /// SIGKILLs every member of the job cgroup of watchdog `watchdog`, if there is one.
    /// Returns the cgroup's directory when there was one.
    pub fn kill_by_watchdog(watchdog: u32) -> Option<PathBuf> {
        let dir = Cgroup::path_for(watchdog).ok()?;
        kill_dir(&dir).then_some(dir)
    }

    /// Kills whatever is left in a dead watchdog's job cgroup, then removes it. Returns
    /// whether there was such a cgroup.
    pub fn kill_orphaned(watchdog: u32) -> bool {
        let Some(dir) = Cgroup::kill_by_watchdog(watchdog) else {
            return false;
        };
        for _ in 0..200 {
            if fs::remove_dir(&dir).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        true
    }
}

/// Writes `cgroup.kill` in `dir`; false when there is no such cgroup.
fn kill_dir(dir: &Path) -> bool {
    match fs::write(dir.join("cgroup.kill"), "1") {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => dir.exists(),
        // Kernels before 5.14 have no cgroup.kill.
        Err(_) => {
            for pid in pids_in(dir) {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            true
        }
    }
}

fn pids_in(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Kills and removes the job cgroups of watchdogs that are gone. A watchdog SIGKILLed
/// together with lead-exec leaves its job's main process to PR_SET_PDEATHSIG, but any other
/// member runs on: nothing is left to stop it at the deadline, so it is killed here.
///
/// Every waiting candidate's watchdog holds a cgroup here, so the sweep is bounded: a pid
/// that no longer exists is stale at the cost of one syscall, and of the pids that do, at
/// most [`SWEEP_READS`] are read in `/proc` to tell a live watchdog from a zombie or a
/// stranger that reused the pid. With a thousand candidates waiting on the host, reading
/// every one took 5 ms of CPU beside each new job's start.
fn sweep_stale(parent: &Path) {
    let entries: Vec<(PathBuf, i32)> = fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.strip_prefix(JOB)?.parse().ok()?;
            Some((e.path(), pid))
        })
        .collect();
    let exists = |pid: i32| kill(Pid::from_raw(pid), None) != Err(nix::errno::Errno::ESRCH);
    let (live, gone): (Vec<_>, Vec<_>) = entries.into_iter().partition(|(_, pid)| exists(*pid));
    // A different window of the live ones for each watchdog (by its pid), so that repeated
    // sweeps come round to every entry.
    let from = std::process::id() as usize % live.len().max(1);
    let suspects = live
        .iter()
        .cycle()
        .skip(from)
        .take(live.len().min(SWEEP_READS))
        .filter(|(_, pid)| !watchdog_alive(*pid));
    for (dir, _) in gone.iter().chain(suspects) {
        if !pids_in(dir).is_empty() {
            tracing::warn!(
                cgroup = %dir.display(),
                "killing the rest of a job whose watchdog is gone"
            );
            kill_dir(dir);
        }
        // Succeeds once the killed members are gone; else the next sweep removes it.
        let _ = fs::remove_dir(dir);
    }
}

/// How many existing pids one sweep checks in `/proc`.
const SWEEP_READS: usize = 16;

/// Name prefix of a job cgroup.
const JOB: &str = "lead-exec-job-";

/// Whether `pid` is a live watchdog. A zombie is not: a watchdog SIGKILLed with lead-exec
/// is reparented to init, which may reap it late. Nor is a process that reused the pid: a
/// job cgroup is only created after the watchdog took its name.
fn watchdog_alive(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) state ...": comm may hold spaces and parentheses, so split at the last ')'.
    let Some((head, tail)) = stat.rsplit_once(')') else {
        return false;
    };
    let comm = head.split_once('(').map(|(_, c)| c).unwrap_or("");
    let state = tail.split_whitespace().next().unwrap_or("");
    comm == super::protocol::NAME && !matches!(state, "Z" | "X" | "x")
}

fn other<E: std::fmt::Display>(e: E) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Where cgroup v2 is mounted: `/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on
/// hybrid ones.
fn cgroup2_mount() -> std::io::Result<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    info.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let mount = left.split_whitespace().nth(4)?;
            (fstype == "cgroup2").then(|| PathBuf::from(mount))
        })
        .ok_or_else(|| other("no cgroup2 mount"))
}

/// The job: a process group led by `leader`, optionally inside a cgroup.
pub struct Group {
    pub leader: Pid,
    pub cgroup: Option<Cgroup>,
}

impl Group {
    /// Signals every member once: the process group, and the cgroup's escapees (members
    /// that left the group). Signalling the group's members through the cgroup as well would
    /// deliver a second SIGTERM, and a shell with a trap would run it twice.
    pub fn signal(&self, sig: Signal) {
        let _ = killpg(self.leader, sig);
        if let Some(cg) = &self.cgroup {
            for pid in cg.pids() {
                let pid = Pid::from_raw(pid);
                if nix::unistd::getpgid(Some(pid)) != Ok(self.leader) {
                    let _ = nix::sys::signal::kill(pid, sig);
                }
            }
        }
    }

    pub fn kill(&self) {
        let _ = killpg(self.leader, Signal::SIGKILL);
        if let Some(cg) = &self.cgroup {
            cg.kill();
        }
    }

    /// Whether any member other than the (exited) leader is still alive. With a cgroup its
    /// member list answers (exited processes leave it at once, and it includes escapees);
    /// without one, every process's stat has to be read.
    pub fn has_live_members(&self) -> bool {
        match &self.cgroup {
            Some(cg) => cg.pids().iter().any(|&p| p != self.leader.as_raw()),
            None => live_in_pgrp(self.leader.as_raw()),
        }
    }

    /// Reaps zombies reparented to us, never the leader.
    pub fn reap_orphans(&self) {
        for pid in own_children() {
            if pid != self.leader.as_raw() {
                let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            }
        }
    }
}

/// Our children, from `/proc/self/task/*/children` (cheap, unlike a scan of all of /proc).
fn own_children() -> Vec<i32> {
    let mut out = Vec::new();
    for task in fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(s) = fs::read_to_string(task.path().join("children")) {
            out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out
}

struct Stat {
    state: char,
    pgrp: i32,
}

fn procs() -> impl Iterator<Item = (i32, Stat)> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            Some((pid, read_stat(&e.path())?))
        })
}

fn read_stat(dir: &Path) -> Option<Stat> {
    let s = fs::read_to_string(dir.join("stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let _ppid = f.next()?;
    let pgrp = f.next()?.parse().ok()?;
    Some(Stat { state, pgrp })
}

fn live_in_pgrp(pgid: i32) -> bool {
    procs().any(|(pid, st)| pid != pgid && st.pgrp == pgid && st.state != 'Z')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup whose pid is gone is swept; one whose pid lives is read in `/proc`, and a
    /// process that is not a watchdog (init) does not keep it.
    #[test]
    fn the_sweep_removes_cgroups_of_gone_pids_and_of_strangers() {
        let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
        let gone = Cgroup::path_for(child.id());
        child.wait().unwrap();
        let Ok(gone) = gone else {
            eprintln!("no cgroup v2 here; nothing to check");
            return;
        };
        if fs::create_dir(&gone).is_err() {
            eprintln!("no writable cgroup v2 here; nothing to check");
            return;
        }
        let stranger = Cgroup::path_for(1).unwrap();
        fs::create_dir(&stranger).unwrap();
        sweep_stale(gone.parent().unwrap());
        let left = [&gone, &stranger].map(|d| d.exists());
        let _ = fs::remove_dir(&gone);
        let _ = fs::remove_dir(&stranger);
        assert_eq!(left, [false, false], "left: the gone pid's, init's");
    }

    #[test]
    fn only_a_live_process_named_as_a_watchdog_counts_as_one() {
        // This test process is alive but no watchdog: its cgroup would be swept.
        assert!(!watchdog_alive(std::process::id() as i32));
        assert!(!watchdog_alive(i32::MAX));
    }
}
