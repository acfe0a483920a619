//! Signals to lead-exec itself, delivered into the async world.
//!
//! signal-hook's iterator runs on its own thread and forwards into a channel, so no handler
//! ever runs async code.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::Result;
use nix::sys::signal::Signal;
use signal_hook::consts::{
    SIGCONT, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP, SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2,
};
use tokio::sync::mpsc;

use crate::supervisor::JobControl;

use super::lifecycle::Arrived;

/// Signals that lead-exec catches. TERM, INT, HUP and QUIT stop (or cancel) the run; USR1 and
/// USR2 are only forwarded to a running job.
pub const CAUGHT: [i32; 6] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];

/// Whether `sig` was ignored when this process started: under `nohup` (HUP), or as a
/// background command of a shell without job control (INT, QUIT).
fn ignored(sig: i32) -> bool {
    // SAFETY: sigaction with no new action only reads the current one into ours.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// The first stopping signal that reached lead-exec, 0 before one has.
static STOPPED_BY: AtomicI32 = AtomicI32::new(0);

/// The first stopping signal (TERM, INT, HUP, QUIT) that reached lead-exec, if one has: see
/// [`crate::exit::Exit::dies_of`].
pub fn stopped_by() -> Option<i32> {
    Some(STOPPED_BY.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// Job control: the terminal's stop signals (Ctrl-Z, a background read or write), and the
/// continue that `fg` or `bg` sends.
const JOB_CONTROL: [i32; 4] = [SIGTSTP, SIGTTIN, SIGTTOU, SIGCONT];

/// Starts listening; the receiver yields signal numbers. A signal ignored at start stays
/// ignored, as POSIX shells and flock(1) leave it: neither forwarded nor ending the run, so
/// `nohup lead-exec run …` survives the logout's SIGHUP.
///
/// Job control is handled here, on the signal thread, as ssh and sudo do: a stop signal stops
/// the running job first (every process of it, through `control`), then lead-exec itself;
/// SIGCONT continues the job. A stop that outlasts the lease ends the term the fail-closed
/// way: the watchdog, which no terminal reaches, kills the stopped job at D, and lead-exec,
/// once continued, finds its lease lost and campaigns again.
///
/// A stopping signal is also said to systemd at once (STOPPING=1), with the longest the stop
/// may take, `stop_within`.
pub fn listen(stop_within: Duration) -> Result<(mpsc::UnboundedReceiver<Arrived>, JobControl)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (caught, kept): (Vec<i32>, Vec<i32>) = CAUGHT
        .into_iter()
        .chain(JOB_CONTROL)
        .partition(|&s| !ignored(s));
    for sig in kept {
        tracing::debug!(signal = sig, "ignored at start (nohup?); it stays ignored");
    }
    let mut signals = signal_hook::iterator::Signals::new(caught)?;
    let control = JobControl::default();
    let job = control.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                match sig {
                    SIGTSTP | SIGTTIN | SIGTTOU => {
                        job.signal(Signal::SIGSTOP);
                        let _ = nix::sys::signal::raise(Signal::SIGSTOP);
                    }
                    SIGCONT => job.signal(Signal::SIGCONT),
                    _ => {
                        let arrived = Arrived::of(sig);
                        if let Arrived::Stop(s) = arrived {
                            let _ = STOPPED_BY.compare_exchange(
                                0,
                                s,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            );
                            crate::notify::stopping(stop_within);
                        }
                        if tx.send(arrived).is_err() {
                            break;
                        }
                    }
                }
            }
        })?;
    Ok((rx, control))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usr_signals_are_forwarded_only() {
        for s in [SIGTERM, SIGINT, SIGHUP, SIGQUIT] {
            assert_eq!(Arrived::of(s), Arrived::Stop(s));
        }
        for s in [SIGUSR1, SIGUSR2] {
            assert_eq!(Arrived::of(s), Arrived::Forward(s));
        }
    }
}
