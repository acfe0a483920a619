//! `settle`: the settlement job, and its event log for the chaos tests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::args::{number, slot_of, token_of, worker_of, Opts};
use crate::clock::monotonic_ns;
use crate::db::{Ledger, Target};
use crate::store::{Verdict, Write};
use crate::EXIT_REJECTED;

/// Set by the SIGTERM/SIGINT handler; the settle loop checks it between batches.
pub(crate) static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Catches TERM and INT so that a batch in flight is committed or not started, never torn
/// (SQLite would roll a torn one back anyway), and so that the exit is a clean 0.
pub(crate) fn catch_stop_signals() {
    let handler = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

/// Sleeps up to `d`, waking early when a stop signal arrived. Returns true if stopping.
pub(crate) fn sleep_unless_stopped(d: Duration) -> bool {
    let until = Instant::now() + d;
    loop {
        if STOP.load(Ordering::SeqCst) {
            return true;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(20)));
    }
}

/// The settlement job: one fenced write per interval, one line of output per write.
pub(crate) fn cmd_settle(db: &Target, opts: &Opts) -> Result<u8> {
    let token = token_of(opts)?;
    let worker = worker_of(opts);
    let every = Duration::from_millis(number(&opts.every, "--every")?.unwrap_or(300));
    let batches = number(&opts.batches, "--batches")?;
    let slot = slot_of()?;
    catch_stop_signals();
    let events = EventLog::open(opts.events.as_deref(), token, slot, &worker)?;
    events.log("start");
    let mut ledger = Ledger::open(db)?;
    let mut k = 0u64;
    while batches.is_none_or(|n| k < n) {
        if STOP.load(Ordering::SeqCst) {
            break;
        }
        k += 1;
        let note = format!("batch {k}");
        let w = Write {
            token,
            slot,
            worker: &worker,
            note: &note,
        };
        match ledger.write(&w)? {
            Verdict::Accepted { .. } => {
                events.log("write");
                println!("[{worker}] token {token}: settled batch {k}");
            }
            Verdict::Rejected { highest } => {
                events.log("reject");
                println!("[{worker}] token {token}: rejected: token {token} < highest {highest}");
                events.log("exit");
                return Ok(EXIT_REJECTED);
            }
        }
        if batches.is_some_and(|n| k >= n) || sleep_unless_stopped(every) {
            break;
        }
    }
    if STOP.load(Ordering::SeqCst) {
        println!("[{worker}] token {token}: stop signal received, exiting after batch {k}");
    }
    events.log("exit");
    Ok(0)
}

/// `settle --events FILE`: one line per job start, write, rejection and exit,
/// `<CLOCK_MONOTONIC ns> <kind> <token> <worker> <pid> <slot>`, appended with O_APPEND so that the
/// jobs of all workers can share one file. The chaos tests check their history from it.
pub(crate) struct EventLog {
    pub(crate) file: Option<std::fs::File>,
    pub(crate) token: i64,
    pub(crate) slot: i64,
    pub(crate) worker: String,
}

impl EventLog {
    pub(crate) fn open(
        path: Option<&str>,
        token: i64,
        slot: i64,
        worker: &str,
    ) -> Result<EventLog> {
        let file = path
            .map(|p| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("--events {p}"))
            })
            .transpose()?;
        Ok(EventLog {
            file,
            token,
            slot,
            worker: worker.to_string(),
        })
    }

    pub(crate) fn log(&self, kind: &str) {
        use std::io::Write as _;
        if let Some(mut f) = self.file.as_ref() {
            let line = format!(
                "{} {kind} {} {} {} {}\n",
                monotonic_ns(),
                self.token,
                self.worker,
                std::process::id(),
                self.slot
            );
            // One write(2) per line: appends from several processes never interleave.
            let _ = f.write_all(line.as_bytes());
        }
    }
}
