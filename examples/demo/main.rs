//! The live demo: three workers, one settlement job, one ledger fenced by `FENCING_TOKEN`.
//!
//! ```text
//! cargo run --release --example demo [-- --ledger sqlite|postgres]
//! bash examples/demo.sh [--ledger sqlite|postgres]     # on a fresh machine
//! ```
//!
//! The ledger is a throwaway PostgreSQL, fenced by `contrib/postgres/fencing.sql`, when
//! Debian's `postgresql` package is installed, and a SQLite file otherwise. It starts a
//! throwaway etcd, runs `lead-exec run settlement -- ledger settle` on three workers, and
//! then, narrating each step:
//!
//! 1. lets the first leader settle a few batches;
//! 2. `kill -9`s the leader's lead-exec: its watchdog kills the job at once, and another
//!    worker takes over when the old lease expires (about the TTL), with a larger token;
//! 3. sends SIGTERM to the new leader: it stops its job and resigns, and the last worker
//!    takes over at once;
//! 4. replays a write with the first leader's token, as a frozen old leader would: the ledger
//!    rejects it, because it has already seen a higher token;
//! 5. stops the workers;
//! 6. runs one cron tick on the three workers with `--every 1h --attempts 3`: the first
//!    leader's attempt fails (exit 1), the next worker retries it with a larger token and
//!    succeeds, and the last finds the tick done (exit 0);
//! 7. prints the ledger and a summary.
//!
//! Everything it starts is killed on the way out, on success, error, panic or Ctrl-C.
//!
//! This file runs the steps in order; the modules beside it hold the steps, the workers and
//! what they print, the binaries, etcd, the narration and the summary.

mod binaries;
mod etcd;
mod narrate;
mod steps;
mod store;
mod summary;
mod workers;

use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::binaries::{ledger, locate_binaries, require_etcd, status};
use crate::etcd::{start_etcd, wait_until_etcd_answers};
use crate::narrate::{banner, catch_interrupts, print_indented, say, sleep, start};
use crate::steps::{
    first_leader, kill_leader, retried_attempt, stale_write, stop_all, terminate_leader, Outcome,
};
use crate::store::{Kind, Store};
use crate::summary::summary;
use crate::workers::{Monitor, Workers};

pub(crate) const ELECTION: &str = "settlement";
pub(crate) const WORKERS: [&str; 3] = ["worker-a", "worker-b", "worker-c"];
/// Short lease settings so that the demo is quick; grace + margin stay well below the TTL.
pub(crate) const TTL: &str = "3s";
pub(crate) const GRACE: &str = "500ms";
pub(crate) const SAFETY_MARGIN: &str = "500ms";
/// The lease flags every worker of the demo runs with.
pub(crate) const LEASE: [&str; 6] = [
    "--ttl",
    TTL,
    "--grace",
    GRACE,
    "--safety-margin",
    SAFETY_MARGIN,
];
/// Interval between two settlement batches, in milliseconds.
pub(crate) const EVERY_MS: &str = "300";
/// Batches each new leader settles before the next step, so every term is visible.
pub(crate) const BATCHES_PER_TERM: u32 = 5;
/// A pause between steps, only so that a person can read along.
const READING_PAUSE: Duration = Duration::from_millis(1500);
/// Exit codes that matter here (see lead-exec's `exit` module and the ledger's usage).
pub(crate) const EXIT_UNAVAILABLE: i32 = 69;
pub(crate) const EXIT_NO_LEADER: i32 = 3;
pub(crate) const EXIT_REJECTED: i32 = 3;

fn main() -> ExitCode {
    catch_interrupts();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lead-exec demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The whole demo. The guards are declared so that they drop in the right order: workers
/// first, then etcd and the ledger's server, then the temporary directory.
fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let kind = Kind::from_args(&args)?;
    // etcd first: no point in a build of several minutes if the demo cannot run anyway.
    require_etcd()?;
    let bins = locate_binaries()?;
    let dir = tempfile::Builder::new()
        .prefix("lead-exec-demo-")
        .tempdir()
        .context("creating a temporary directory")?;
    let db = Store::start(kind, dir.path())?;

    println!();
    println!(
        "lead-exec demo: three workers, one settlement job, one {} ledger.",
        db.describe()
    );
    println!("  The job only runs on the leader and writes with the leader's FENCING_TOKEN;");
    println!("  the ledger rejects any token lower than the highest it has accepted.");
    println!("  lead-exec: {}", bins.lead_exec.display());
    println!("  ledger:    {}", bins.ledger.display());
    println!("  scratch:   {}", dir.path().display());

    start(); // timestamps count from here
    banner(
        1,
        "start a throwaway etcd and three workers; one leads and settles batches",
    );
    let etcd = start_etcd(dir.path());
    wait_until_etcd_answers(&bins, &etcd)?;
    say(&format!("etcd is up at {}", etcd.endpoint()));
    ledger(&bins, &db, &["init"]).context("ledger init")?;

    let (tx, rx) = mpsc::channel();
    let mut workers = Workers::default();
    for name in WORKERS {
        workers.spawn(name, &bins, &etcd.endpoint(), &db, tx.clone())?;
    }
    drop(tx);
    let mut mon = Monitor::new(rx);

    let first = first_leader(&mut mon)?;
    say(&format!(
        "{} leads with token {}. `lead-exec status {ELECTION}` says:",
        WORKERS[first.worker], first.token
    ));
    print_indented(&status(&bins, &etcd.endpoint())?);

    sleep(READING_PAUSE)?;
    banner(
        2,
        "kill -9 the leader's lead-exec (its watchdog kills the job at once)",
    );
    let crash = kill_leader(&mut mon, &mut workers, first, &bins, &etcd.endpoint())?;

    sleep(READING_PAUSE)?;
    banner(
        3,
        "graceful handover: SIGTERM the new leader (it stops its job and resigns)",
    );
    let handover = terminate_leader(&mut mon, &mut workers, crash.next)?;

    sleep(READING_PAUSE)?;
    banner(
        4,
        "a frozen old leader wakes up and writes with its old token",
    );
    let stale = stale_write(&bins, &db, first.token)?;

    sleep(READING_PAUSE)?;
    banner(5, "stop the remaining workers");
    stop_all(&mut workers)?;

    sleep(READING_PAUSE)?;
    banner(
        6,
        "a cron tick with --attempts 3: the first attempt fails, another worker retries it",
    );
    let retry = retried_attempt(&bins, &db, &etcd.endpoint(), dir.path())?;
    say("the ledger:");
    let show = ledger(&bins, &db, &["show"])?;
    print_indented(&show.stdout);
    let check = ledger(&bins, &db, &["check"])?;

    summary(
        &mon,
        &Outcome {
            crash,
            handover,
            stale,
            retry,
            check_ok: check.code == Some(0),
            check_text: check.stdout.trim().to_string(),
        },
    )
}
