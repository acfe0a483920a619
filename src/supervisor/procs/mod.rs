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
