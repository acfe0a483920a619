//! Starting the watchdog with `posix_spawn`.
//!
//! glibc's `posix_spawn` shares lead-exec's memory with the child until the child execs
//! (`CLONE_VM | CLONE_VFORK`), so the main thread is held only for the exec. A `fork` first
//! copies the page tables of a process that has a runtime and an etcd connection open, and
//! `std::process::Command` then waits for the exec too: 0.6 ms on the main thread while the
//! first lease grant's answer waited to be read.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// A started watchdog, by pid; lead-exec reaps it.
#[derive(Debug)]
pub struct Detached(Pid);

impl Detached {
    pub fn id(&self) -> u32 {
        self.0.as_raw() as u32
    }

    pub fn kill(&self) {
        let _ = kill(self.0, Signal::SIGKILL);
    }

    pub fn wait(&self) {
        let _ = waitpid(self.0, None);
    }

    /// Reaps it if it exits within `limit`; `false` if it is still running then.
    pub fn exits_within(&self, limit: Duration) -> bool {
        let until = std::time::Instant::now() + limit;
        loop {
            match waitpid(self.0, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) if std::time::Instant::now() < until => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Ok(WaitStatus::StillAlive) => return false,
                _ => return true,
            }
        }
    }
}

/// Runs `program` with `argv` (`argv[0]` included) in a session of its own, with default
/// signal dispositions and an empty mask, the environment minus `hidden`, and of lead-exec's
/// descriptors only `keep` (every other one is close-on-exec).
pub fn spawn(
    program: &Path,
    argv: &[OsString],
    hidden: &[&str],
    keep: &[RawFd],
) -> io::Result<Detached> {
    let cstr =
        |b: Vec<u8>| CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let path = cstr(program.as_os_str().as_bytes().to_vec())?;
    let argv: Vec<CString> = argv
        .iter()
        .map(|a| cstr(a.as_bytes().to_vec()))
        .collect::<io::Result<_>>()?;
    let envp: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| !hidden.iter().any(|h| k == h))
        .map(|(mut k, v)| {
            k.push("=");
            k.push(v);
            cstr(k.into_vec())
        })
        .collect::<io::Result<_>>()?;
    let ptrs = |v: &[CString]| -> Vec<*mut libc::c_char> {
        v.iter()
            .map(|c| c.as_ptr().cast_mut())
            .chain(std::iter::once(std::ptr::null_mut()))
            .collect()
    };
    let (argv_p, envp_p) = (ptrs(&argv), ptrs(&envp));
    let mut actions = Initialised::new(
        libc::posix_spawn_file_actions_init,
        libc::posix_spawn_file_actions_destroy,
    )?;
    for &fd in keep {
        // dup2 onto itself clears close-on-exec (POSIX.1-2024; glibc 2.29 and later).
        errno(unsafe { libc::posix_spawn_file_actions_adddup2(&mut actions.obj, fd, fd) })?;
    }
    let mut attr = Initialised::new(libc::posix_spawnattr_init, libc::posix_spawnattr_destroy)?;
    // SAFETY: plain calls on initialised attribute objects and sets owned here.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        // Rust ignores SIGPIPE in lead-exec, lead-exec's own caller may have ignored others
        // (`nohup`, `trap ''`), and glibc ignores its own 32 and 33 in the child unless told
        // otherwise: an ignored signal would survive the exec, into the watchdog and its job.
        let all = crate::supervisor::procs::every_signal();
        errno(libc::posix_spawnattr_setsigmask(&mut attr.obj, &none))?;
        errno(libc::posix_spawnattr_setsigdefault(&mut attr.obj, &all))?;
        let flags = libc::POSIX_SPAWN_SETSID as libc::c_int
            | libc::POSIX_SPAWN_SETSIGMASK
            | libc::POSIX_SPAWN_SETSIGDEF;
        errno(libc::posix_spawnattr_setflags(
            &mut attr.obj,
            flags as libc::c_short,
        ))?;
    }
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is to a NUL-terminated string or array that outlives the call.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            &actions.obj,
            &attr.obj,
            argv_p.as_ptr(),
            envp_p.as_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(Detached(Pid::from_raw(pid)))
}

/// A libc object that `init` fills in place and `destroy` frees: posix_spawn's attributes
/// and file actions.
struct Initialised<T> {
    obj: T,
    destroy: unsafe extern "C" fn(*mut T) -> libc::c_int,
}

impl<T> Initialised<T> {
    fn new(
        init: unsafe extern "C" fn(*mut T) -> libc::c_int,
        destroy: unsafe extern "C" fn(*mut T) -> libc::c_int,
    ) -> io::Result<Initialised<T>> {
        // SAFETY: both are plain C structs, valid zeroed, that `init` fills in place and that
        // hold no pointer to themselves, so they may move; Drop destroys them.
        let mut obj = unsafe { std::mem::zeroed() };
        errno(unsafe { init(&mut obj) })?;
        Ok(Initialised { obj, destroy })
    }
}

impl<T> Drop for Initialised<T> {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`.
        unsafe { (self.destroy)(&mut self.obj) };
    }
}

fn errno(rc: libc::c_int) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    /// The child gets the kept descriptor (and only it), a session of its own, and no
    /// hidden variable.
    #[test]
    fn keeps_only_the_named_descriptors_in_a_new_session() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let (other_r, _other_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        // A variable this process has (setting one here would race with other tests).
        let hidden = std::env::vars()
            .map(|(k, _)| k)
            .find(|k| k != "PATH" && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .expect("some environment variable");
        let script = format!(
            "echo \"$(cut -d' ' -f6 /proc/$$/stat) $$ ${{{hidden}:-none}}\" >&{w}; \
             [ -e /proc/self/fd/{o} ] && echo leaked >&{w}; exit 0",
            w = w.as_raw_fd(),
            o = other_r.as_raw_fd()
        );
        let argv: Vec<OsString> = vec!["sh".into(), "-c".into(), script.into()];
        let child = spawn(
            Path::new("/bin/sh"),
            &argv,
            &[hidden.as_str()],
            &[w.as_raw_fd()],
        )
        .expect("spawned");
        drop(w);
        child.wait();
        let mut out = String::new();
        std::fs::File::from(r).read_to_string(&mut out).unwrap();
        let fields: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(fields.len(), 3, "output: {out:?}");
        assert_eq!(fields[0], fields[1], "not a session leader: {out:?}");
        assert_eq!(fields[2], "none", "hidden variable passed on: {out:?}");
    }

    #[test]
    fn a_missing_program_is_an_error_from_spawn() {
        let argv: Vec<OsString> = vec!["x".into()];
        let err = spawn(Path::new("/nonexistent/program"), &argv, &[], &[]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }
}
