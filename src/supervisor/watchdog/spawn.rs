//! Starting the job: clone3 (with fork semantics), own process group, default signals, exec.
//!
//! With a cgroup, the child is created directly inside it with `clone3(CLONE_INTO_CGROUP)`
//! (Linux 5.7+). Moving a running process into a cgroup instead (writing `cgroup.procs`)
//! waits for an RCU grace period: about 10 ms on the critical path of every job start.
//! Kernels without clone3 fall back to `std::process::Command` and that move, done in the
//! child before exec. Without a cgroup the job is started by clone3 too, the same path, which
//! also hands the watchdog the job's pidfd.

use crate::supervisor::procs::reset_signals;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;

use crate::supervisor::procs::group::Cgroup;

/// `struct clone_args` of clone3(2), up to and including `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The started job: its pid (= its process group id), when the kernel gave one a pidfd, and
/// whether it runs in the cgroup it was meant for.
pub struct Spawned {
    pub pid: i32,
    pub pidfd: Option<OwnedFd>,
    pub in_cgroup: bool,
}

/// Starts `command` in its own process group (and `cgroup`). An exec failure is returned as
/// the exec's `io::Error`, as `std::process::Command` does.
///
/// Unless the cgroup is `required` (`--cgroup on`), any failure to start the job inside it
/// falls back to a start without it: containment is best effort under `--cgroup auto`. An
/// exec failure fails the same way again and is reported then.
pub fn spawn(command: &[OsString], cgroup: Option<&Cgroup>, required: bool) -> io::Result<Spawned> {
    // No clone3 or no CLONE_INTO_CGROUP on this kernel: fork instead (and move the child).
    let unsupported = |e: &io::Error| {
        matches!(
            e.raw_os_error(),
            Some(libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EPERM)
        )
    };
    let first = match clone3(command, cgroup) {
        Err(e) if unsupported(&e) => plain(command, cgroup),
        other => other,
    };
    match first {
        Err(_) if cgroup.is_some() && !required => plain(command, None),
        other => other,
    }
}

/// fork and exec with `std::process::Command`; with a cgroup, the child moves into it first.
fn plain(command: &[OsString], cgroup: Option<&Cgroup>) -> io::Result<Spawned> {
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]).process_group(0);
    let procs = cgroup.map(|c| c.procs_path().clone());
    let watchdog = std::process::id() as i32;
    // SAFETY: the closure only calls async-signal-safe functions (sigaction, sigprocmask,
    // open, write, close) on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            die_with_parent(watchdog)?;
            reset_signals();
            if let Some(p) = &procs {
                Cgroup::join_self(p)?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    Ok(Spawned {
        pid: child.id() as i32,
        pidfd: None,
        in_cgroup: cgroup.is_some(),
    })
}

/// clone3 and exec, inside `cgroup` when there is one; the same path without a cgroup too,
/// as it is faster than `std::process::Command`'s fork with a `pre_exec` hook.
fn clone3(command: &[OsString], cgroup: Option<&Cgroup>) -> io::Result<Spawned> {
    let argv: Vec<CString> = command
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL)))
        .collect::<io::Result<_>>()?;
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let watchdog = std::process::id() as i32;
    // The child reports an exec failure's errno here; a successful exec closes it (CLOEXEC).
    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let mut pidfd: RawFd = -1;
    let into = cgroup.map_or(0, |_| CLONE_INTO_CGROUP);
    let mut args = CloneArgs {
        flags: into | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.map_or(0, |cg| cg.dir_fd().as_raw_fd() as u64),
        ..CloneArgs::default()
    };
    // SAFETY: clone3 with fork semantics (no CLONE_VM, no new stack). The watchdog is
    // single-threaded, so the child may run ordinary code; it only calls setpgid, sigaction,
    // sigprocmask, execvp, write and _exit on data prepared above.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if rc == 0 {
        // The child.
        unsafe {
            libc::setpgid(0, 0);
            if die_with_parent(watchdog).is_err() {
                libc::_exit(127);
            }
            reset_signals();
            libc::execvp(ptrs[0], ptrs.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(err_w.as_raw_fd(), (&errno as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    let pid = rc as i32;
    // Also from the parent, so the group exists before anyone signals it (as shells do).
    // SAFETY: plain syscall; EACCES after the child's exec is expected and harmless.
    unsafe { libc::setpgid(pid, pid) };
    drop(err_w);
    // SAFETY: the kernel wrote a fresh descriptor for us (CLONE_PIDFD).
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    let mut buf = [0u8; 4];
    let n = nix::unistd::read(err_r.as_raw_fd(), &mut buf).unwrap_or(0);
    if n == 4 {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(buf)));
    }
    Ok(Spawned {
        pid,
        pidfd,
        in_cgroup: cgroup.is_some(),
    })
}

/// In the child: SIGKILL the job's main process if the watchdog dies (it survives exec). Then
/// lead-exec, which sees the watchdog go, kills the rest of the job's cgroup or group.
fn die_with_parent(watchdog: i32) -> io::Result<()> {
    // SAFETY: prctl and getppid are async-signal-safe.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        // The watchdog may have died before the prctl.
        if libc::getppid() != watchdog {
            libc::_exit(137);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup removed after it was opened makes clone3 fail with an error outside the
    /// "no CLONE_INTO_CGROUP here" set; `--cgroup auto` must still start the job.
    #[test]
    fn cgroup_auto_starts_the_job_when_the_cgroup_refuses_it() {
        let Ok(cg) = Cgroup::create() else {
            eprintln!("no writable cgroup v2 here; nothing to check");
            return;
        };
        std::fs::remove_dir(cg.path()).unwrap();
        // An absolute path: the child of a multi-threaded test must not search PATH.
        let cmd: Vec<OsString> = vec!["/bin/true".into()];
        let err = spawn(&cmd, Some(&cg), true).err();
        eprintln!("--cgroup on, cgroup removed: {err:?}");
        assert!(err.is_some(), "started in a removed cgroup");
        let s = spawn(&cmd, Some(&cg), false).expect("--cgroup auto falls back");
        assert!(!s.in_cgroup);
        let st = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(s.pid), None).unwrap();
        assert_eq!(
            st,
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(s.pid), 0)
        );
    }
}
