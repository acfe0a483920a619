//! Process groups to SIGKILL on the way out, kept where a signal handler can reach them
//! without locking.

use std::sync::atomic::{AtomicI32, Ordering::SeqCst};

static SLOTS: [AtomicI32; 4096] = [const { AtomicI32::new(0) }; 4096];

pub fn add(pgid: i32) {
    for s in &SLOTS {
        if s.compare_exchange(0, pgid, SeqCst, SeqCst).is_ok() {
            return;
        }
    }
}

pub fn remove(pgid: i32) {
    for s in &SLOTS {
        if s.compare_exchange(pgid, 0, SeqCst, SeqCst).is_ok() {
            return;
        }
    }
}

/// Async-signal-safe: atomics and kill(2) only.
pub fn kill_all() {
    for s in &SLOTS {
        let pg = s.swap(0, SeqCst);
        if pg > 0 {
            // SAFETY: kill(2) on a group this process created.
            unsafe { libc::kill(-pg, libc::SIGKILL) };
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    kill_all();
    // SAFETY: restoring the default action and re-raising are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Ctrl-C and friends: workers live in their own process groups, so the terminal's signal
/// does not reach them; kill them before dying.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only does async-signal-safe work.
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}
