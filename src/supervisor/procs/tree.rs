//! The job's process tree: every descendant of the watchdog, whatever process group, session
//! or cgroup it has moved to since.
//!
//! The watchdog is a child subreaper, so a process of the job that outlives its parent (a
//! daemon's double fork) is re-parented to the watchdog, never to init: the job's processes
//! are exactly the watchdog's descendants. `setsid`, `setpgid`, `su` through pam_systemd and
//! `systemd-run --scope` change a process's group, session or cgroup, never its parent. Two
//! questions are asked of the tree:
//!
//! - Is any of it alive? [`has_live_children`] needs no /proc: `waitid` on our children says
//!   ECHILD once only zombies (or nothing) are left, and every live descendant has a live
//!   ancestor among our children.
//! - Who is in it? [`walk`] reads `/proc/PID/task/*/children` from the root down. The /proc
//!   mounted may belong to an ancestor PID namespace (`unshare --pid --fork` without
//!   `--mount-proc`, a container that bind-mounts the host's /proc): its numbers are then
//!   translated into ours through each process's `NSpid` ([`ProcView`]). Each process found is
//!   pinned with a pidfd, then checked to still be a child of the process it was found under,
//!   so a pid reused meanwhile is never signalled: signals go through the pidfd.

use std::collections::HashSet;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// How this process's PID namespace is seen through the /proc that is mounted: at `depth`
/// levels below the namespace /proc belongs to (0: /proc is our namespace's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcView {
    depth: usize,
}

impl ProcView {
    /// Reads how /proc sees us. An error names why the job's processes cannot be seen here:
    /// no /proc, or one of a namespace in which this process does not exist (a sibling's, or
    /// a child's), where `/proc/self` names nobody.
    pub fn detect() -> Result<ProcView, String> {
        let status = super::read_text("/proc/self/status")
            .map_err(|e| format!("/proc/self/status cannot be read ({e})"))?;
        let ns = nspid(&status).ok_or("/proc/self/status has no NSpid line")?;
        let me = std::process::id() as i32;
        if ns.last() != Some(&me) {
            return Err(format!(
                "/proc/self is process {} of another PID namespace, not this one ({me})",
                ns.last().copied().unwrap_or(0)
            ));
        }
        Ok(ProcView {
            depth: ns.len() - 1,
        })
    }

    /// Whether /proc is our own namespace's (no translation needed).
    pub fn is_own(&self) -> bool {
        self.depth == 0
    }

    /// The pid in our namespace of the process that /proc calls `apid`; `None` when it is
    /// gone or lives outside our namespace (then it is no descendant of ours).
    fn here(&self, apid: i32) -> Option<i32> {
        if self.depth == 0 {
            return Some(apid);
        }
        let status = super::read_text(format!("/proc/{apid}/status")).ok()?;
        nspid(&status)?.get(self.depth).copied()
    }

    /// What /proc calls this process.
    fn own_apid(&self) -> Option<i32> {
        if self.depth == 0 {
            return Some(std::process::id() as i32);
        }
        stat(&super::read_text("/proc/self/stat").ok()?).map(|s| s.pid)
    }

    /// What /proc calls our child `pid` (in our numbering), found among our children.
    fn child_apid(&self, pid: i32) -> Option<i32> {
        if self.depth == 0 {
            return Some(pid);
        }
        let me = self.own_apid()?;
        children_of(me)
            .into_iter()
            .find(|&c| self.here(c) == Some(pid))
    }
}

/// The `NSpid:` field of a status file: the pid in /proc's namespace first, ours last.
fn nspid(status: &str) -> Option<Vec<i32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let v: Vec<i32> = line
        .split_whitespace()
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    (!v.is_empty()).then_some(v)
}

/// What a stat line says of its process.
struct Stat {
    pid: i32,
    state: char,
    ppid: i32,
    /// The status as waitpid reports it; only filled in for a zombie that we may read.
    exit_code: i32,
}

fn stat(line: &str) -> Option<Stat> {
    let pid = line.split_whitespace().next()?.parse().ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &line[line.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        pid,
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        // Field 52 overall; the fields here start at field 3.
        exit_code: f.get(49).and_then(|c| c.parse().ok()).unwrap_or(0),
    })
}

/// Whether any thread of `apid` other than an exited main thread still runs.
fn has_live_thread(apid: i32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{apid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        super::read_text(t.path().join("stat"))
            .ok()
            .and_then(|l| stat(&l))
            .is_some_and(|s| !matches!(s.state, 'Z' | 'X'))
    })
}

/// Whether `apid`, just pinned, is still a child of one of `parents` (so the pin holds that
/// child, not a process that took its pid since): by its stat's parent, or, with no stat,
/// by the parents' lists of children. No stat means gone since, or hidden: a /proc mounted
/// with hidepid=2 (systemd's ProtectProc=invisible) hides a process that cannot be ptraced,
/// as one made non-dumpable or running a setuid program. Still listed once pinned, it is
/// the child that was read: a pid is not reused while its process is unreaped.
fn child_of(apid: i32, st: Option<&Stat>, parents: &[i32]) -> bool {
    match st {
        Some(st) => parents.contains(&st.ppid),
        None => parents.iter().any(|&p| children_of(p).contains(&apid)),
    }
}

/// Whether the process of `pidfd` has exited (every thread of it).
fn exited(pidfd: &OwnedFd) -> bool {
    let mut p = [super::pollin(pidfd.as_raw_fd())];
    // SAFETY: poll on one entry that lives on our stack, without waiting.
    let n = unsafe { libc::poll(p.as_mut_ptr(), 1, 0) };
    n > 0 && p[0].revents & libc::POLLIN != 0
}

fn read_stat(apid: i32) -> Option<Stat> {
    stat(&super::read_text(format!("/proc/{apid}/stat")).ok()?)
}

/// The children of every thread of `apid`, in /proc's numbering.
fn children_of(apid: i32) -> Vec<i32> {
    children_checked(apid).unwrap_or_default()
}

/// [`children_of`], or the error that kept a thread's list from being read: a process that
/// is gone has no `task` directory (`NotFound`), which is no failure of the caller's; any
/// other error means children may exist that were not read.
fn children_checked(apid: i32) -> std::io::Result<Vec<i32>> {
    let mut out = Vec::new();
    for task in fs::read_dir(format!("/proc/{apid}/task"))? {
        match super::read_text(task?.path().join("children")) {
            Ok(s) => out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok())),
            // The thread exited while we read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Whether /proc is procfs: a job run as root in our mount namespace can mount something
/// else over it, and an empty directory there reads as a tree with nobody in it.
fn proc_is_procfs() -> bool {
    nix::sys::statfs::statfs("/proc")
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC)
}

/// What one walk found.
pub struct Walk {
    pub members: Vec<Member>,
    /// Every process of the tree was read. Not so when /proc is not procfs (hidden under
    /// another mount), a list of children could not be read, or a process could not be
    /// pinned (no descriptor left: a frozen watchdog's zombies can use them up): then more
    /// may live than were found, and whoever judges the tree must count it as alive.
    pub complete: bool,
}

/// One process of the tree, pinned.
pub struct Member {
    /// Its pid in our namespace.
    pub pid: i32,
    /// Its pid in /proc's namespace.
    apid: i32,
    /// Held while it can run; a zombie's is closed at once, so that a tree full of zombies
    /// (whose reaper is frozen) does not use up the descriptors the live ones need.
    pidfd: Option<OwnedFd>,
    /// Exited, not yet reaped: nothing to signal.
    pub zombie: bool,
    /// For a zombie, its status in waitpid's form: `None` when /proc hides it (`hidepid`),
    /// 0 when its stat has no such field.
    exit_code: Option<i32>,
}

impl Member {
    /// Sends `sig` to this process, never to another that took its pid since.
    pub fn signal(&self, sig: i32) -> std::io::Result<()> {
        match &self.pidfd {
            Some(fd) => pidfd_send_signal(fd.as_raw_fd(), sig),
            None => Ok(()),
        }
    }

    /// Neither exited nor [`doomed`]: a process that can still run code of the job.
    pub fn live(&self) -> bool {
        !self.zombie && !doomed(self.apid)
    }
}

/// Whether the process /proc calls `apid` has a SIGKILL pending: it never returns to user
/// space again, so it can neither run code of the job nor fork. Most such processes are
/// zombies a moment later; one frozen by a cgroup freezer (v1's, which a job may join) stays
/// like this until it is thawed, and then dies at once. Waiting for it would hold the term
/// for as long as whoever froze it pleases.
pub fn doomed(apid: i32) -> bool {
    super::read_text(format!("/proc/{apid}/status")).is_ok_and(|s| sigkill_pending(&s))
}

/// Whether a status file shows SIGKILL pending, for the thread or the whole process.
fn sigkill_pending(status: &str) -> bool {
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("ShdPnd:")
                .or_else(|| l.strip_prefix("SigPnd:"))
        })
        .filter_map(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .any(|mask| mask & SIGKILL_BIT != 0)
}

/// Where a walk starts.
#[derive(Debug, Clone, Copy)]
pub enum Root {
    /// This process (the watchdog walks its own tree).
    Me,
    /// Our child with this pid (lead-exec walks its watchdog's tree).
    Child(i32),
}

/// Every descendant of `root`, parents before their children, and whether all were read
/// (see [`Walk::complete`]). A process that forks while this reads may be missed; callers
/// that must leave nothing walk again.
pub fn walk(view: &ProcView, root: Root) -> Walk {
    let top = match root {
        Root::Me => view.own_apid(),
        Root::Child(pid) => view.child_apid(pid),
    };
    let mut complete = proc_is_procfs();
    // The root is alive (it is us, or our child not yet reaped): not finding it means /proc
    // does not show it.
    let Some(top) = top else {
        return Walk {
            members: Vec::new(),
            complete: false,
        };
    };
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut queue = vec![top];
    while let Some(parent) = queue.pop() {
        let children = match children_checked(parent) {
            Ok(c) => c,
            // A descendant that exited meanwhile: its children went to the root, and the
            // next walk finds them there. The root itself must be readable.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && parent != top => Vec::new(),
            Err(_) => {
                complete = false;
                Vec::new()
            }
        };
        for c in children {
            if !seen.insert(c) {
                continue;
            }
            let Some(pid) = view.here(c) else { continue };
            let pidfd = match pidfd_open(pid) {
                Ok(fd) => fd,
                // Gone since the list was read.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                // EMFILE, ENFILE, ENOMEM: it may well be alive.
                Err(_) => {
                    complete = false;
                    continue;
                }
            };
            // Pinned now; still the child we read (or re-parented to the root meanwhile)?
            let st = read_stat(c);
            if !child_of(c, st.as_ref(), &[parent, top]) {
                continue;
            }
            let zombie = match &st {
                // A process whose main thread exited while others run shows 'Z' too: it is
                // alive until its last thread is gone.
                Some(st) => matches!(st.state, 'Z' | 'X') && !has_live_thread(c),
                // Its pidfd turns readable once the whole process has exited.
                None => exited(&pidfd),
            };
            out.push(Member {
                pid,
                apid: c,
                pidfd: (!zombie).then_some(pidfd),
                zombie,
                exit_code: st.map(|s| s.exit_code),
            });
            if !zombie {
                queue.push(c);
            }
        }
    }
    Walk {
        members: out,
        complete,
    }
}

/// A pidfd of our child `root`'s child `pid`, checked to be that child once pinned: lead-exec's
/// own view of the job's main process, for when its watchdog cannot say that it ended.
pub fn pin_child(view: &ProcView, root: Root, pid: i32) -> Option<OwnedFd> {
    let top = match root {
        Root::Me => view.own_apid(),
        Root::Child(p) => view.child_apid(p),
    }?;
    let c = children_of(top)
        .into_iter()
        .find(|&c| view.here(c) == Some(pid))?;
    let fd = pidfd_open(pid).ok()?;
    child_of(c, read_stat(c).as_ref(), &[top]).then_some(fd)
}

/// SIGKILLs every descendant of `root` except `spare` (pids), walking again until a walk
/// finds none [`Member::live`], so that what forked during a walk is found by the next. A
/// process with a SIGKILL pending cannot fork, so each walk ends the chains it reaches (a
/// process that forks the next and exits at once stays a step ahead of one walk, not of
/// several); one killed takes a moment to show it, so a walk that finds only processes
/// already signalled waits a little before the next. Bounded in time: a tree still alive
/// after that is left to the caller's next attempt.
pub fn kill_all(view: &ProcView, root: Root, spare: &[i32]) {
    let until = std::time::Instant::now() + KILL_ALL_FOR;
    let mut signalled: HashSet<i32> = HashSet::new();
    loop {
        let w = walk(view, root);
        let live: Vec<Member> = w
            .members
            .into_iter()
            .filter(|m| m.live() && !spare.contains(&m.pid))
            .collect();
        if (live.is_empty() && w.complete) || std::time::Instant::now() >= until {
            return;
        }
        let mut new = false;
        for m in &live {
            let _ = m.signal(libc::SIGKILL);
            new |= signalled.insert(m.pid);
        }
        // Nothing new to kill (or nothing readable): give what was killed time to show it,
        // and free the descriptors its zombies no longer hold.
        if !new {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

/// How long [`kill_all`] walks a tree that is still dying. Short: lead-exec calls it from its
/// only thread when it must kill the job itself, and its callers look again later.
const KILL_ALL_FOR: std::time::Duration = std::time::Duration::from_millis(100);

/// The status of our child `root`'s exited child `pid`, in waitpid's form, while it is an
/// unreaped zombie: how a job ended whose watchdog cannot say.
pub fn zombie_status(view: &ProcView, root: Root, pid: i32) -> Option<i32> {
    walk(view, root)
        .members
        .into_iter()
        .find(|m| m.pid == pid && m.zombie)
        .and_then(|m| m.exit_code)
}

/// Whether any child of ours is alive (zombies do not count). No /proc: waitid's ECHILD
/// answers for our own namespace, whatever /proc is mounted.
pub fn has_live_children() -> bool {
    // SAFETY: waitid fills the siginfo we own. Without WEXITED a zombie is neither reported
    // nor counted, so ECHILD means no live child; WNOWAIT leaves a stopped one as it is.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT,
        );
        !(rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
    }
}

/// Our next exited child, by pid in our numbering, left unreaped (WNOWAIT): the kernel's
/// answer, as [`has_live_children`]'s.
pub fn next_zombie() -> Option<i32> {
    // SAFETY: waitid fills the siginfo we own.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        (rc == 0 && info.si_pid() != 0).then(|| info.si_pid())
    }
}

/// The pids of our children that are zombies, in our numbering, for reaping by pid.
pub fn zombie_children(view: &ProcView) -> Vec<i32> {
    let Some(me) = view.own_apid() else {
        return Vec::new();
    };
    children_of(me)
        .into_iter()
        .filter(|&c| read_stat(c).is_some_and(|s| s.state == 'Z'))
        .filter_map(|c| view.here(c))
        .collect()
}

pub fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: the syscall returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn pidfd_send_signal(fd: RawFd, sig: i32) -> std::io::Result<()> {
    // SAFETY: plain syscall on a descriptor we own; no siginfo.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd,
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name that was not UTF-8 reaches the parser with replacement characters, and may
    /// hold spaces and parentheses: the fields are read after the last ')'.
    #[test]
    fn a_stat_line_is_read_whatever_the_name() {
        let line = "4242 (\u{fffd}a) b) (c) S 17 4242 4242 0 -1\n";
        let st = stat(line).unwrap();
        assert_eq!((st.pid, st.state, st.ppid), (4242, 'S', 17));
    }

    #[test]
    fn nspid_lists_the_outer_namespace_first() {
        let status = "Name:\tsh\nPid:\t4242\nNSpid:\t4242\t7\t1\nNSpgid:\t1\n";
        assert_eq!(nspid(status), Some(vec![4242, 7, 1]));
        assert_eq!(nspid("Name:\tsh\n"), None);
        assert_eq!(nspid("NSpid:\tx\n"), None);
    }

    #[test]
    fn a_pending_sigkill_is_read_from_either_mask() {
        let status = |sig: &str, shd: &str| format!("Name:\tx\nSigPnd:\t{sig}\nShdPnd:\t{shd}\n");
        assert!(!sigkill_pending(&status(
            "0000000000000000",
            "0000000000000000"
        )));
        assert!(sigkill_pending(&status(
            "0000000000000000",
            "0000000000000100"
        )));
        assert!(sigkill_pending(&status(
            "0000000000000100",
            "0000000000000000"
        )));
        // SIGTERM (bit 15) and SIGSTOP (bit 19) pending are no SIGKILL.
        assert!(!sigkill_pending(&status(
            "0000000000004000",
            "0000000000040000"
        )));
        assert!(!sigkill_pending("Name:\tx\n"));
        // Our own process has none.
        assert!(!doomed(std::process::id() as i32));
    }

    #[test]
    fn a_stat_line_is_read_past_a_name_with_spaces_and_parentheses() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[0] = "Z".into();
        fields[1] = "77".into();
        fields[49] = "768".into();
        let line = format!("123 (a (b) c) {}\n", fields.join(" "));
        let s = stat(&line).unwrap();
        assert_eq!((s.pid, s.state, s.ppid, s.exit_code), (123, 'Z', 77, 768));
    }

    /// In the namespace the tests run in, /proc is our own.
    #[test]
    fn the_test_processes_proc_is_their_own() {
        let v = ProcView::detect().unwrap();
        assert!(v.is_own(), "{v:?}");
        assert_eq!(
            v.here(std::process::id() as i32),
            Some(std::process::id() as i32)
        );
    }

    /// A child that left its process group and session and one that did not are both found
    /// by a walk from their parent; kill_all leaves neither.
    #[test]
    fn a_walk_finds_every_descendant_and_kill_all_leaves_none() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "setsid sleep 30 & sleep 30"])
            .process_group(0)
            .spawn()
            .unwrap();
        let view = ProcView::detect().unwrap();
        // Never `Root::Me` here: the test process has other tests' children.
        let root = Root::Child(child.id() as i32);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while walk(&view, root)
            .members
            .iter()
            .filter(|m| !m.zombie)
            .count()
            < 2
        {
            assert!(std::time::Instant::now() < until, "the tree never grew");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        kill_all(&view, root, &[]);
        // kill_all returns once a walk finds every process dead or no time is left; under a
        // loaded machine the last exits may still be under way, so look again for a while.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while walk(&view, root).members.iter().any(Member::live) {
            assert!(std::time::Instant::now() < until, "a descendant survived");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.wait();
    }
}
