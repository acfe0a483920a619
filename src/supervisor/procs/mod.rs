//! The job's processes as both sides reach them: its process group and cgroup ([`group`]),
//! the tree of the watchdog's descendants ([`tree`]), and the clean signal state a child gets
//! before exec. The watchdog uses them to supervise; lead-exec uses them as the second
//! enforcer and for job control, through the watchdog's tree when the watchdog is stopped.

pub mod group;
pub mod tree;

/// Default dispositions and an empty mask for the job: ignored signals would otherwise survive
/// exec. Every signal up to SIGRTMAX, by the system call itself: the C library refuses to
/// touch the two it keeps for itself (32 and 33), and its posix_spawn leaves them ignored.
pub fn reset_signals() {
    // SAFETY: rt_sigaction and sigprocmask are async-signal-safe system calls; the action
    // is a plain struct on our stack.
    unsafe {
        for sig in 1..=libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                default_action(sig);
            }
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// The kernel's `struct sigaction` (not the C library's, which differs).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// SIG_DFL for `sig`, whichever signal it is.
///
/// # Safety
/// Changes a process-wide disposition: only for a child about to exec.
unsafe fn default_action(sig: libc::c_int) {
    let act = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    libc::syscall(
        libc::SYS_rt_sigaction,
        sig,
        &act as *const KernelSigaction,
        std::ptr::null_mut::<KernelSigaction>(),
        std::mem::size_of::<u64>(),
    );
}

/// A `poll(2)` entry waiting for `fd` to be readable (for a pidfd: its process to exit).
pub fn pollin(fd: std::os::fd::RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// A sigset with every signal from 1 to SIGRTMAX, the C library's own included (its
/// `sigaddset` refuses those): for posix_spawn's "default in the child" set.
pub fn every_signal() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is empty; its first 64 bits are signals 1 to 64 on Linux.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        let bits = &mut set as *mut libc::sigset_t as *mut u64;
        let max = libc::SIGRTMAX().clamp(1, 64) as u32;
        *bits = u64::MAX >> (64 - max);
        set
    }
}

/// A /proc or cgroup file, whole, as text. Read as bytes and converted with replacement
/// characters: a process names itself (`comm`, in `stat` and `status`: any bytes but NUL, or
/// the file name it was run by) and mounts and cgroups have the names they were given, so
/// these files need not be UTF-8, and a read that required it failed for a job's process
/// named with byte 0xff, which the tree then left out. The fields read from them are ASCII.
/// Read 4 KiB at a time where std's `read_to_string` stats the file, sees size 0 and starts
/// with 32 bytes.
pub fn read_text(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    let bytes = read_bytes(path)?;
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// A /proc or cgroup file, whole, as bytes (see [`read_text`]).
pub fn read_bytes(path: impl AsRef<std::path::Path>) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(len * 2, 0);
        }
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process's name may be any bytes: its stat line is still read, the name replaced
    /// where it is not UTF-8, the fields after it as they are; and a file longer than the
    /// first read is read whole.
    #[test]
    fn a_proc_file_that_is_not_utf8_or_is_long_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let stat = dir.path().join("stat");
        std::fs::write(&stat, b"4242 (\xffesc) S 1 4242 4242 0 -1\n").unwrap();
        let text = read_text(&stat).unwrap();
        assert!(text.starts_with("4242 (\u{fffd}esc) S 1 "), "{text:?}");
        let long = dir.path().join("long");
        let body: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&long, &body).unwrap();
        assert_eq!(read_bytes(&long).unwrap(), body);
        assert!(read_text(dir.path().join("missing")).is_err());
    }
}
