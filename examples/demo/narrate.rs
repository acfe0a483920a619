//! The narration (every line stamped with the time since the demo started), and Ctrl-C,
//! which must still run the cleanup guards.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Demo start: every printed line is stamped with the time since then.
pub(crate) fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

pub(crate) fn stamp(at: Instant) -> String {
    format!(
        "{:7.2}s",
        at.saturating_duration_since(start()).as_secs_f64()
    )
}

pub(crate) fn banner(n: u32, text: &str) {
    println!();
    println!("==> step {n}: {text}");
}

/// A line of narration, as opposed to a line a worker printed.
pub(crate) fn say(text: &str) {
    println!("{}  -- {text}", stamp(Instant::now()));
}

pub(crate) fn print_indented(text: &str) {
    for line in text.lines() {
        println!("             {line}");
    }
}

pub(crate) fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// Interrupts: Ctrl-C must still run the cleanup guards
// ---------------------------------------------------------------------------------------------

pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// The default action of SIGINT would skip every Drop guard and leave etcd and the workers
/// running; a flag lets the waiting loops fail instead, and the guards clean up.
pub(crate) fn catch_interrupts() {
    let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

pub(crate) fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; stopping everything");
    }
    Ok(())
}

pub(crate) fn sleep(d: Duration) -> Result<()> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        check_interrupted()?;
        std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
    }
    check_interrupted()
}
