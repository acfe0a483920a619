//! Signals to lead-exec itself, delivered into the async world.
//!
//! signal-hook's iterator runs on its own thread and forwards into a channel, so no handler
//! ever runs async code.

use anyhow::Result;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use tokio::sync::mpsc;

/// Signals that lead-exec catches. TERM, INT, HUP and QUIT stop (or cancel) the run; USR1 and
/// USR2 are only forwarded to a running job.
pub const CAUGHT: [i32; 6] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];

/// Whether a signal ends the run (after forwarding it to the job).
pub fn is_stopping(sig: i32) -> bool {
    matches!(sig, SIGTERM | SIGINT | SIGHUP | SIGQUIT)
}

/// Starts listening; the receiver yields signal numbers.
pub fn listen() -> Result<mpsc::UnboundedReceiver<i32>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut signals = signal_hook::iterator::Signals::new(CAUGHT)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        })?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usr_signals_are_forwarded_only() {
        assert!(is_stopping(SIGTERM) && is_stopping(SIGINT));
        assert!(!is_stopping(SIGUSR1) && !is_stopping(SIGUSR2));
    }
}
