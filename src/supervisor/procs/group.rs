//! The job's process group, and its cgroup when one could be made.
//!
//! The watchdog never reaps the group leader before its last signal to the group: while the
//! leader is an unreaped zombie its pid (= the pgid) cannot be reused, so `killpg` cannot hit a
//! stranger. Grandchildren that outlive their parents are reparented to the watchdog (it is a
//! child subreaper) and reaped here.

use std::ffi::CString;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use std::collections::HashSet;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use super::tree::{self, ProcView, Root};

/// A cgroup v2 directory that holds only the job's processes.
///
/// It is removed when dropped, on every path out of the watchdog: a cgroup still holding
/// processes refuses the removal, and is left to [`Cgroup::kill_orphaned`] or the next sweep.
///
/// Its watchdog holds an exclusive `flock` on the open directory for as long as it lives: that
/// lock, not a pid, is what tells a live job cgroup from a stale one. Pids say nothing across
/// PID namespaces (which share the cgroup tree) and get reused; a lock is released by the
/// kernel when its holder dies, whatever namespace it ran in.
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    /// The directory, open and locked: clone3 creates the job inside it.
    fd: OwnedFd,
    /// `DIR/cgroup.procs` as a C string, so the child can join without allocating.
    procs: CString,
}

impl Cgroup {
    /// Creates this watchdog's job cgroup inside the caller's own cgroup (lead-exec and its
    /// watchdog share one), if cgroup v2 is mounted and writable. A waiting candidate's
    /// watchdog makes it ahead, so that a won term pays only for the job's fork and exec; the
    /// stale ones beside it are left to [`Cgroup::sweep_stale`], once the job runs.
    pub fn create() -> std::io::Result<Cgroup> {
        Cgroup::create_in(&own_cgroup()?)
    }

    /// Creates a job cgroup under a name no other process uses (our pid and 64 random bits),
    /// and locks it. A name that is taken all the same is never used: the directory may hold
    /// someone else's job, so another name is drawn.
    pub fn create_in(parent: &Path) -> std::io::Result<Cgroup> {
        Cgroup::create_with(parent, |_| {})
    }

    /// [`Cgroup::create_in`], with `between` run after each mkdir and before the open: where
    /// a test plays the sweep that races with us.
    fn create_with(parent: &Path, mut between: impl FnMut(&Path)) -> std::io::Result<Cgroup> {
        let mut last = None;
        for _ in 0..8 {
            let dir = parent.join(unique_name()?);
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            }
            between(&dir);
            // Between mkdir and the lock, a sweep may take the empty directory for a stale
            // one and remove it: before the open (which then finds nothing), or before the
            // lock (which is then on a removed cgroup). Either way another name is drawn.
            let swept = || other("a sweep took the new job cgroup");
            let file = match fs::File::open(&dir) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    last = Some(swept());
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !try_lock(&file)? || !same_file(&file, &dir) {
                last = Some(swept());
                continue;
            }
            let procs = dir.join("cgroup.procs");
            let cg = Cgroup {
                procs: CString::new(procs.as_os_str().as_encoded_bytes()).map_err(other)?,
                fd: file.into(),
                dir,
            };
            // A cgroup we cannot move a process into (the "no internal processes" rule, or
            // delegation) is no use: find out now rather than in the child.
            if let Err(e) = fs::OpenOptions::new()
                .write(true)
                .open(cg.dir.join("cgroup.procs"))
            {
                drop(cg);
                return Err(e);
            }
            return Ok(cg);
        }
        Err(last.unwrap_or_else(|| other("no job cgroup could be made")))
    }

    /// The directory, as the watchdog reports it to lead-exec.
    pub fn path(&self) -> &Path {
        &self.dir
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
    /// watchdog whose job has started, not while it waits: a sweep by each of a thousand
    /// waiting candidates on its way in would try a million locks.
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

    /// Kills whatever is left in a dead watchdog's job cgroup `dir`, then removes it.
    pub fn kill_orphaned(dir: &Path) {
        if !kill_dir(dir) {
            return;
        }
        for _ in 0..200 {
            if fs::remove_dir(dir).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.dir);
    }
}

/// SIGKILLs every member of the job cgroup `dir`: lead-exec's own kill, by the path its
/// watchdog reported. False when there is no such cgroup.
pub fn kill_dir(dir: &Path) -> bool {
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

/// The members of the cgroup `dir`, as pids of our namespace.
pub fn pids_in(dir: &Path) -> Vec<i32> {
    super::read_text(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// `flock(LOCK_EX | LOCK_NB)`: whether we got it.
fn try_lock(f: &fs::File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(e),
    }
}

/// Whether `path` still names the directory `f` has open.
fn same_file(f: &fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// `lead-exec-job-<pid>-<16 hex digits>`: the pid for people reading `ps` and cgroup trees,
/// the random part because a pid is unique neither over time nor across PID namespaces.
fn unique_name() -> std::io::Result<String> {
    let mut r = [0u8; 8];
    // SAFETY: getrandom fills the buffer we own.
    let n = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
    if n != r.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(format!(
        "{JOB}{}-{:016x}",
        std::process::id(),
        u64::from_ne_bytes(r)
    ))
}

/// Whether a directory name is one [`unique_name`] makes. Others are left alone: they are no
/// job cgroups of ours to judge.
fn is_job_name(name: &str) -> bool {
    let Some((pid, random)) = name.strip_prefix(JOB).and_then(|r| r.split_once('-')) else {
        return false;
    };
    !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && random.len() == 16
        && random.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Kills and removes the job cgroups of watchdogs that are gone. A watchdog SIGKILLed
/// together with lead-exec leaves its job's main process to PR_SET_PDEATHSIG, but any other
/// member runs on: nothing is left to stop it at the deadline, so it is killed here.
///
/// A job cgroup is stale exactly when its lock can be taken: a live watchdog holds it from
/// the cgroup's creation to its own exit, in whatever PID namespace it runs. We hold the lock
/// while we kill and remove, so no watchdog can take the directory meanwhile.
fn sweep_stale(parent: &Path) {
    let entries = fs::read_dir(parent).into_iter().flatten().flatten();
    for e in entries {
        if !e.file_name().to_str().is_some_and(is_job_name) {
            continue;
        }
        let dir = e.path();
        let Ok(f) = fs::File::open(&dir) else {
            continue;
        };
        if !matches!(try_lock(&f), Ok(true)) {
            continue;
        }
        if !pids_in(&dir).is_empty() {
            tracing::warn!(
                cgroup = %dir.display(),
                "killing the rest of a job whose watchdog is gone"
            );
            kill_dir(&dir);
        }
        // Succeeds once the killed members are gone; else the next sweep removes it.
        let _ = fs::remove_dir(&dir);
    }
}

/// Name prefix of a job cgroup.
const JOB: &str = "lead-exec-job-";

/// The cgroup v2 directory this process is in. Paths as bytes: a cgroup, or another mount
/// on the host, may have a name that is not UTF-8.
fn own_cgroup() -> std::io::Result<PathBuf> {
    let mount = cgroup2_mount()?;
    let own = super::read_bytes("/proc/self/cgroup")?;
    let own = own
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"0::"))
        .ok_or_else(|| other("this process is in no cgroup v2"))?;
    let own = own.strip_prefix(b"/").unwrap_or(own);
    Ok(mount.join(std::ffi::OsStr::from_bytes(own)))
}

fn other<E: std::fmt::Display>(e: E) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Where cgroup v2 is mounted: `/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on
/// hybrid ones.
fn cgroup2_mount() -> std::io::Result<PathBuf> {
    let info = super::read_bytes("/proc/self/mountinfo")?;
    info.split(|&b| b == b'\n')
        .find_map(|l| {
            // The optional fields end at a lone "-"; then come the type and the source.
            let sep = l.windows(3).position(|w| w == b" - ")?;
            let mount = *words(&l[..sep]).get(4)?;
            (*words(&l[sep + 3..]).first()? == b"cgroup2")
                .then(|| PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(mount))))
        })
        .ok_or_else(|| other("no cgroup2 mount"))
}

/// A mountinfo path as it is: the kernel writes a space, tab, newline or backslash in it as
/// `\ooo` (octal).
fn unescape(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let octal = path
            .get(i + 1..i + 4)
            .filter(|d| path[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |n, c| n * 8 + u32::from(c - b'0')));
        match octal {
            Some(n) if n <= 0xff => {
                out.push(n as u8);
                i += 4;
            }
            _ => {
                out.push(path[i]);
                i += 1;
            }
        }
    }
    out
}

/// The words of a part of a mountinfo line (whose paths have their spaces escaped).
fn words(s: &[u8]) -> Vec<&[u8]> {
    s.split(|&b| b == b' ').filter(|w| !w.is_empty()).collect()
}

/// The job: a process group led by `leader`, its cgroup when one could be made, and the tree
/// of the watchdog's descendants (see [`super::tree`]). Containment is the union of the three:
/// a process that left the group (setsid) is still in the cgroup and the tree; one that left
/// the cgroup (`su` through pam_systemd, `systemd-run --scope`) is still in the group and the
/// tree; a daemon's double fork is re-parented to the watchdog, into the tree.
pub struct Group {
    pub leader: Pid,
    pub cgroup: Option<Cgroup>,
    /// How /proc shows our namespace; `None` where it cannot (lead-exec refuses to run there,
    /// so only a watchdog started by hand gets here).
    pub view: Option<ProcView>,
}

/// One look at the job's processes: every pid of the tree (exited ones too) and of the
/// cgroup, and whether any of them can still run (neither exited nor [`tree::doomed`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Sighting {
    pids: Vec<i32>,
    alive: bool,
}

/// Where the job's processes are, for whoever signals them: the watchdog, or lead-exec when
/// the watchdog is stopped or gone.
pub struct Reach<'a> {
    pub leader: Pid,
    pub cgroup: Option<&'a Path>,
    /// The tree: how /proc shows us, and whose descendants the job's processes are.
    pub tree: Option<(&'a ProcView, Root)>,
}

impl Reach<'_> {
    /// Signals every process of the job once: the process group, then the cgroup's members
    /// and the tree's that left the group. A second SIGTERM to one process would run a
    /// shell's trap twice.
    pub fn signal(&self, sig: Signal) {
        let _ = killpg(self.leader, sig);
        let in_group = |pid: i32| nix::unistd::getpgid(Some(Pid::from_raw(pid))) == Ok(self.leader);
        let mut done = HashSet::new();
        if let Some(dir) = self.cgroup {
            for pid in pids_in(dir) {
                if !in_group(pid) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
                }
                done.insert(pid);
            }
        }
        if let Some((view, root)) = self.tree {
            for m in tree::walk(view, root).members {
                if m.live() && !done.contains(&m.pid) && !in_group(m.pid) {
                    let _ = m.signal(sig as i32);
                }
            }
        }
    }

    /// What one look at the job finds (see [`Sighting`]). Without a view of /proc, nothing
    /// can be seen, and the job counts as alive.
    pub fn sight(&self) -> Sighting {
        let Some((view, root)) = self.tree else {
            return Sighting {
                pids: Vec::new(),
                alive: true,
            };
        };
        let leader = self.leader.as_raw();
        let tree::Walk { members, complete } = tree::walk(view, root);
        let cgroup = self.cgroup.map(pids_in).unwrap_or_default();
        // A member of the cgroup is judged as the tree found it (whatever /proc numbers it);
        // one the tree did not find, by /proc when /proc is ours, else as alive.
        let cgroup_alive = |p: i32| match members.iter().find(|m| m.pid == p) {
            Some(m) => m.live(),
            None => !(view.is_own() && tree::doomed(p)),
        };
        // A walk that could not read everything fails closed: what it missed may run.
        let alive = !complete
            || members.iter().any(tree::Member::live)
            || cgroup.iter().any(|&p| p != leader && cgroup_alive(p));
        let mut pids: Vec<i32> = members.iter().map(|m| m.pid).chain(cgroup).collect();
        pids.sort_unstable();
        Sighting { pids, alive }
    }

    /// Whether nothing of the job but its exited leader can run any more, by two looks a few
    /// milliseconds apart that find the same processes and none of them able to run. One
    /// look is not enough: a process that exits while its parent's children are read leaves
    /// its child, re-parented after that read, unseen; but its exit leaves a zombie that the
    /// second look finds (a stopped or frozen watchdog reaps nothing), and so does any fork.
    pub fn settled(&self) -> bool {
        let first = self.sight();
        if first.alive {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        self.sight() == first
    }

    /// SIGKILL to all three: the group, the cgroup, and the tree until a walk finds it empty.
    pub fn kill(&self) {
        let _ = killpg(self.leader, Signal::SIGKILL);
        if let Some(dir) = self.cgroup {
            kill_dir(dir);
        }
        if let Some((view, root)) = self.tree {
            tree::kill_all(view, root, &[]);
        }
    }
}

impl Group {
    fn reach(&self) -> Reach<'_> {
        Reach {
            leader: self.leader,
            cgroup: self.cgroup.as_ref().map(|c| c.path()),
            tree: self.view.as_ref().map(|v| (v, Root::Me)),
        }
    }

    pub fn signal(&self, sig: Signal) {
        self.reach().signal(sig);
    }

    pub fn kill(&self) {
        self.reach().kill();
    }

    /// Whether any process of the job other than its (exited) leader is still alive, wherever
    /// it moved: a live child of ours (the tree, asked without /proc), or a member of the
    /// cgroup. The kernel's answer, never a reading of /proc that a fork could outrun.
    pub fn has_live_members(&self) -> bool {
        tree::has_live_children()
            || self
                .cgroup
                .as_ref()
                .is_some_and(|cg| cg.pids().iter().any(|&p| p != self.leader.as_raw()))
    }

    /// Reaps zombies reparented to us, never the leader.
    pub fn reap_orphans(&self) {
        // The kernel names the next exited child without reaping it; chains of processes that
        // fork and exit leave them faster than /proc can be read for each. The leader's turn
        // ends this (it stays unreaped), and the rest is found by reading /proc.
        while let Some(pid) = tree::next_zombie() {
            if pid == self.leader.as_raw() {
                break;
            }
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
        let Some(view) = &self.view else { return };
        for pid in tree::zombie_children(view) {
            if pid != self.leader.as_raw() {
                let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mountinfo writes a space in a path as `\040`: a cgroup2 mount at `/tmp/c g` is found
    /// there, not at `/tmp/c\040g`.
    #[test]
    fn a_mountinfo_path_is_unescaped() {
        assert_eq!(unescape(br"/tmp/c\040g"), b"/tmp/c g");
        assert_eq!(unescape(br"/a\134b\011"), b"/a\\b\t");
        assert_eq!(unescape(br"/plain/\9x\"), br"/plain/\9x\");
    }

    /// A parent cgroup of the test's own, so that its sweeps see no other job.
    fn parent(name: &str) -> Option<PathBuf> {
        let dir = own_cgroup()
            .ok()?
            .join(format!("unit-{name}-{}", std::process::id()));
        fs::create_dir(&dir).ok().map(|()| dir)
    }

    /// A job cgroup whose lock is free is swept; one whose watchdog holds it is not,
    /// whatever pid its name carries; a directory named otherwise is not ours to judge.
    #[test]
    fn the_sweep_removes_unlocked_job_cgroups_only() {
        let Some(parent) = parent("sweep") else {
            eprintln!("no writable cgroup v2 here; nothing to check");
            return;
        };
        let live = Cgroup::create_in(&parent).unwrap();
        let stale = parent.join(format!("{JOB}1-0123456789abcdef"));
        fs::create_dir(&stale).unwrap();
        let foreign = parent.join(format!("{JOB}1"));
        fs::create_dir(&foreign).unwrap();
        sweep_stale(&parent);
        let left = [live.path(), &stale, &foreign].map(|d| d.exists());
        drop(live);
        let _ = fs::remove_dir(&stale);
        let _ = fs::remove_dir(&foreign);
        let _ = fs::remove_dir(&parent);
        assert_eq!(left, [true, false, true], "left: live, stale, foreign");
    }

    /// The guard removes its cgroup on every way out of the watchdog: dropping it is the
    /// removal.
    #[test]
    fn a_job_cgroup_is_removed_when_its_guard_is_dropped() {
        let Some(parent) = parent("guard") else {
            eprintln!("no writable cgroup v2 here; nothing to check");
            return;
        };
        let cg = Cgroup::create_in(&parent).unwrap();
        let dir = cg.path().to_path_buf();
        let made = dir.exists();
        drop(cg);
        let gone = !dir.exists();
        let _ = fs::remove_dir(&parent);
        assert!(made && gone, "made: {made}, removed on drop: {gone}");
    }

    /// Two job cgroups made by one process get different names, each locked.
    #[test]
    fn each_job_cgroup_gets_a_name_of_its_own() {
        let Some(parent) = parent("names") else {
            eprintln!("no writable cgroup v2 here; nothing to check");
            return;
        };
        let (a, b) = (
            Cgroup::create_in(&parent).unwrap(),
            Cgroup::create_in(&parent).unwrap(),
        );
        let names = [a.path(), b.path()].map(|p| p.file_name().unwrap().to_owned());
        let locked = [a.path(), b.path()].map(|p| try_lock(&fs::File::open(p).unwrap()).unwrap());
        drop((a, b));
        let _ = fs::remove_dir(&parent);
        assert_ne!(names[0], names[1]);
        assert!(
            names.iter().all(|n| is_job_name(n.to_str().unwrap())),
            "{names:?}"
        );
        assert_eq!(locked, [false, false], "a job cgroup's lock was free");
    }

    /// A sweep that removes the new directory between its mkdir and its open costs a name,
    /// not the job's cgroup: another name is drawn.
    #[test]
    fn a_job_cgroup_swept_before_it_was_opened_is_made_again_under_another_name() {
        let Some(parent) = parent("swept") else {
            eprintln!("no writable cgroup v2 here; nothing to check");
            return;
        };
        let mut swept = Vec::new();
        let cg = Cgroup::create_with(&parent, |dir| {
            if swept.is_empty() {
                fs::remove_dir(dir).unwrap();
                swept.push(dir.to_path_buf());
            }
        });
        let made = cg
            .as_ref()
            .map(|c| c.path().to_path_buf())
            .map_err(|e| e.to_string());
        drop(cg);
        let _ = fs::remove_dir(&parent);
        let made = made.expect("a swept directory failed the job's cgroup");
        assert_eq!(swept.len(), 1);
        assert_ne!(made, swept[0]);
    }

    #[test]
    fn job_cgroup_names_are_told_from_others() {
        assert!(is_job_name("lead-exec-job-12-00ff00ff00ff00ff"));
        for n in [
            "lead-exec-job-12",
            "lead-exec-job--00ff00ff00ff00ff",
            "lead-exec-job-12-00ff",
            "lead-exec-job-x-00ff00ff00ff00ff",
            "other",
        ] {
            assert!(!is_job_name(n), "{n}");
        }
    }
}
