//! A fenced ledger: a SQLite database that many workers write to, guarded by fencing tokens.
//!
//! # The fencing rule
//!
//! The ledger (the shared resource) remembers the highest fencing token it has ever accepted.
//! A write carrying a token at least that high is accepted and raises the mark; a write with a
//! lower token is rejected and recorded. The check and the write happen in one `BEGIN
//! IMMEDIATE` transaction, so no other writer can slip in between them.
//!
//! `lead-exec` gives every term a strictly larger `FENCING_TOKEN`. So once the resource has
//! seen a write from a newer leader, an old leader that was frozen (paused, swapped out, cut
//! off by a partition) and wakes up believing it still leads can do no harm: its late writes
//! carry an older token and bounce off. The lease makes overlap unlikely; the token makes it
//! harmless.
//!
//! With `lead-exec run --slots N` up to N jobs write at once, each with its own token. The
//! ledger is then N ledgers in one: each slot (`LEAD_EXEC_SLOT`, default 0) has its own mark,
//! so a holder is fenced only against the holders of its own slot.
//!
//! # Usage
//!
//! ```text
//! ledger --db FILE init
//! ledger --db FILE write [--token T] [--worker W] [--note TEXT]
//! ledger --db FILE settle [--every MS] [--batches N] [--events FILE]
//! ledger --db FILE show [--all]
//! ledger --db FILE check
//! ```
//!
//! `--token` defaults to `FENCING_TOKEN`, `--worker` to `LEAD_EXEC_ID` and the slot to
//! `LEAD_EXEC_SLOT`, as `lead-exec run` sets them for its job. Exit codes: 0 ok, 1 error or `check` found a decrease, 2 usage,
//! 3 write rejected by the fence.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// Exit code of a write the fence rejected.
const EXIT_REJECTED: u8 = 3;
/// Exit code of bad arguments.
const EXIT_USAGE: u8 = 2;

const USAGE: &str = "usage: ledger --db FILE <command>
commands:
  init                                          create the tables if missing
  write [--token T] [--worker W] [--note TEXT]  one fenced write (T defaults to FENCING_TOKEN)
  settle [--every MS] [--batches N] [--events FILE]
                                                write one batch every MS ms (default 300),
                                                logging start/write/reject/exit to FILE
  show [--all]                                  print settlements, rejections and a summary
  check                                         exit 1 if accepted tokens ever decreased";

// ---------------------------------------------------------------------------------------------
// The ledger itself
// ---------------------------------------------------------------------------------------------

/// What the fence decided about one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Written; `highest` is the mark after the write.
    Accepted { highest: i64 },
    /// Refused because an equal-or-newer term already wrote `highest`.
    Rejected { highest: i64 },
}

/// One write request.
struct Write<'a> {
    token: i64,
    /// The mark this write is fenced by (`LEAD_EXEC_SLOT`).
    slot: i64,
    worker: &'a str,
    note: &'a str,
}

/// Opens the database the way every command needs it: wait for other writers instead of
/// failing with SQLITE_BUSY, and use WAL so readers (`show`) never block the settling job.
fn open(path: &str) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {path}"))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    // journal_mode returns a row, so it is read rather than executed.
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.execute_batch("PRAGMA synchronous = NORMAL;")?;
    Ok(conn)
}

/// Creates the tables if missing. `fence` holds the highest accepted token of each slot, in
/// row `slot + 1`.
fn init(conn: &Connection) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS fence (
             id      INTEGER PRIMARY KEY CHECK (id >= 1),
             highest INTEGER NOT NULL
         );
         INSERT OR IGNORE INTO fence (id, highest) VALUES (1, 0);
         CREATE TABLE IF NOT EXISTS settlements (
             id     INTEGER PRIMARY KEY AUTOINCREMENT,
             token  INTEGER NOT NULL,
             slot   INTEGER NOT NULL DEFAULT 0,
             worker TEXT    NOT NULL,
             note   TEXT    NOT NULL,
             at_ns  INTEGER NOT NULL,
             wall   TEXT    NOT NULL
         );
         CREATE TABLE IF NOT EXISTS rejections (
             id      INTEGER PRIMARY KEY AUTOINCREMENT,
             token   INTEGER NOT NULL,
             slot    INTEGER NOT NULL DEFAULT 0,
             highest INTEGER NOT NULL,
             worker  TEXT    NOT NULL,
             note    TEXT    NOT NULL,
             at_ns   INTEGER NOT NULL,
             wall    TEXT    NOT NULL
         );",
    )?;
    Ok(())
}

/// The fenced write: read the mark, compare, then append and raise, or record the rejection.
/// `BEGIN IMMEDIATE` takes the write lock up front, so the read and the write are atomic with
/// respect to every other writer.
fn write(conn: &mut Connection, w: &Write) -> Result<Verdict> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let row = w.slot + 1;
    if row > 1 {
        tx.execute(
            "INSERT OR IGNORE INTO fence (id, highest) VALUES (?1, 0)",
            params![row],
        )?;
    }
    let highest: i64 = tx
        .query_row("SELECT highest FROM fence WHERE id = ?1", [row], |r| {
            r.get(0)
        })
        .optional()?
        .context("the ledger has no fence row: run `ledger init` first")?;
    let (at_ns, wall) = (monotonic_ns(), wall_clock());
    let verdict = if w.token >= highest {
        tx.execute(
            "INSERT INTO settlements (token, slot, worker, note, at_ns, wall) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![w.token, w.slot, w.worker, w.note, at_ns, wall],
        )?;
        tx.execute(
            "UPDATE fence SET highest = ?1 WHERE id = ?2",
            params![w.token, row],
        )?;
        Verdict::Accepted { highest: w.token }
    } else {
        tx.execute(
            "INSERT INTO rejections (token, slot, highest, worker, note, at_ns, wall)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![w.token, w.slot, highest, w.worker, w.note, at_ns, wall],
        )?;
        Verdict::Rejected { highest }
    };
    tx.commit()?;
    Ok(verdict)
}

/// One accepted row, in insertion order.
#[derive(Debug)]
struct Settlement {
    token: i64,
    slot: i64,
    worker: String,
    note: String,
    wall: String,
}

/// One rejected write.
#[derive(Debug)]
struct Rejection {
    token: i64,
    highest: i64,
    worker: String,
    note: String,
    wall: String,
}

fn settlements(conn: &Connection) -> Result<Vec<Settlement>> {
    let mut stmt =
        conn.prepare("SELECT token, worker, note, wall, slot FROM settlements ORDER BY id")?;
    let rows = stmt.query_map([], |r| {
        Ok(Settlement {
            token: r.get(0)?,
            slot: r.get(4)?,
            worker: r.get(1)?,
            note: r.get(2)?,
            wall: r.get(3)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

fn rejections(conn: &Connection) -> Result<Vec<Rejection>> {
    let mut stmt =
        conn.prepare("SELECT token, highest, worker, note, wall FROM rejections ORDER BY id")?;
    let rows = stmt.query_map([], |r| {
        Ok(Rejection {
            token: r.get(0)?,
            highest: r.get(1)?,
            worker: r.get(2)?,
            note: r.get(3)?,
            wall: r.get(4)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The first place where an accepted token is lower than the one accepted before it in the
/// same slot: `(index, previous, token)`. `None` means tokens never decreased.
fn first_decrease(rows: &[Settlement]) -> Option<(usize, i64, i64)> {
    let mut last = std::collections::HashMap::new();
    rows.iter().enumerate().find_map(|(i, r)| {
        let before = last.insert(r.slot, r.token)?;
        (r.token < before).then_some((i, before, r.token))
    })
}

// ---------------------------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------------------------

/// Command-line options after `--db FILE COMMAND`.
#[derive(Debug, Default)]
struct Opts {
    token: Option<String>,
    worker: Option<String>,
    note: Option<String>,
    every: Option<String>,
    batches: Option<String>,
    /// `settle --events FILE`: the job's event log.
    events: Option<String>,
    /// `show --all`: every row instead of the ends of each long run.
    all: bool,
}

/// A usage error: printed with the usage text, exit 2.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(msg.into()))
}

/// Parses `--db FILE COMMAND [--flag VALUE]...` by hand; flags may come in any order.
fn parse(args: &[String]) -> Result<(String, String, Opts)> {
    let (mut db, mut cmd, mut opts) = (None, None, Opts::default());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| usage(format!("{name} needs a value")))
        };
        match a.as_str() {
            "--db" => db = Some(value("--db")?),
            "--token" => opts.token = Some(value("--token")?),
            "--worker" => opts.worker = Some(value("--worker")?),
            "--note" => opts.note = Some(value("--note")?),
            "--every" => opts.every = Some(value("--every")?),
            "--batches" => opts.batches = Some(value("--batches")?),
            "--events" => opts.events = Some(value("--events")?),
            "--all" => opts.all = true,
            "-h" | "--help" => return Err(usage("")),
            s if s.starts_with('-') => return Err(usage(format!("unknown option {s}"))),
            s if cmd.is_none() => cmd = Some(s.to_string()),
            s => return Err(usage(format!("unexpected argument {s}"))),
        }
    }
    let db = db.ok_or_else(|| usage("--db FILE is required"))?;
    let cmd = cmd.ok_or_else(|| usage("a command is required"))?;
    Ok((db, cmd, opts))
}

/// The token of a write: `--token`, else `FENCING_TOKEN` as lead-exec sets it.
fn token_of(opts: &Opts) -> Result<i64> {
    let raw = match &opts.token {
        Some(t) => t.clone(),
        None => std::env::var("FENCING_TOKEN")
            .map_err(|_| usage("no --token and no FENCING_TOKEN in the environment"))?,
    };
    raw.trim()
        .parse()
        .map_err(|_| usage(format!("token {raw:?} is not an integer")))
}

/// The slot of a write: `LEAD_EXEC_SLOT` as lead-exec sets it, else 0.
fn slot_of() -> Result<i64> {
    match std::env::var("LEAD_EXEC_SLOT") {
        Err(_) => Ok(0),
        Ok(raw) => raw
            .trim()
            .parse()
            .ok()
            .filter(|s| *s >= 0)
            .ok_or_else(|| usage(format!("LEAD_EXEC_SLOT {raw:?} is not a slot"))),
    }
}

fn worker_of(opts: &Opts) -> String {
    opts.worker
        .clone()
        .or_else(|| std::env::var("LEAD_EXEC_ID").ok())
        .unwrap_or_else(|| "unknown".to_string())
}

fn number(raw: &Option<String>, name: &str) -> Result<Option<u64>> {
    raw.as_ref()
        .map(|s| {
            s.parse()
                .map_err(|_| usage(format!("{name} {s:?} is not a number")))
        })
        .transpose()
}

fn cmd_write(db: &str, opts: &Opts) -> Result<u8> {
    let token = token_of(opts)?;
    let worker = worker_of(opts);
    let note = opts.note.clone().unwrap_or_default();
    let mut conn = open(db)?;
    let w = Write {
        token,
        slot: slot_of()?,
        worker: &worker,
        note: &note,
    };
    match write(&mut conn, &w)? {
        Verdict::Accepted { .. } => {
            println!("[{worker}] token {token}: accepted");
            Ok(0)
        }
        Verdict::Rejected { highest } => {
            println!("rejected: token {token} < highest {highest}");
            Ok(EXIT_REJECTED)
        }
    }
}

/// Set by the SIGTERM/SIGINT handler; the settle loop checks it between batches.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Catches TERM and INT so that a batch in flight is committed or not started, never torn
/// (SQLite would roll a torn one back anyway), and so that the exit is a clean 0.
fn catch_stop_signals() {
    let handler = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

/// Sleeps up to `d`, waking early when a stop signal arrived. Returns true if stopping.
fn sleep_unless_stopped(d: Duration) -> bool {
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
fn cmd_settle(db: &str, opts: &Opts) -> Result<u8> {
    let token = token_of(opts)?;
    let worker = worker_of(opts);
    let every = Duration::from_millis(number(&opts.every, "--every")?.unwrap_or(300));
    let batches = number(&opts.batches, "--batches")?;
    let slot = slot_of()?;
    catch_stop_signals();
    let events = EventLog::open(opts.events.as_deref(), token, slot, &worker)?;
    events.log("start");
    let mut conn = open(db)?;
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
        match write(&mut conn, &w)? {
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
struct EventLog {
    file: Option<std::fs::File>,
    token: i64,
    slot: i64,
    worker: String,
}

impl EventLog {
    fn open(path: Option<&str>, token: i64, slot: i64, worker: &str) -> Result<EventLog> {
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

    fn log(&self, kind: &str) {
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

/// Rows kept at the start and at the end of a run from one term when `show` is compact.
const RUN_HEAD: usize = 2;
const RUN_TAIL: usize = 1;

/// Which settlement rows `show` prints: all of them, or, in each run of consecutive rows
/// from the same term, the first and last few and a count of the rest, so that a long
/// ledger still shows every term change.
fn visible_rows(rows: &[Settlement], all: bool) -> Vec<Result<&Settlement, usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < rows.len() {
        let same = |r: &Settlement| r.token == rows[start].token && r.worker == rows[start].worker;
        let len = rows[start..].iter().take_while(|r| same(r)).count();
        let run = &rows[start..start + len];
        if all || len <= RUN_HEAD + RUN_TAIL + 1 {
            out.extend(run.iter().map(Ok));
        } else {
            out.extend(run[..RUN_HEAD].iter().map(Ok));
            out.push(Err(len - RUN_HEAD - RUN_TAIL));
            out.extend(run[len - RUN_TAIL..].iter().map(Ok));
        }
        start += len;
    }
    out
}

fn cmd_show(db: &str, all: bool) -> Result<u8> {
    let conn = open(db)?;
    let rows = settlements(&conn)?;
    let rejected = rejections(&conn)?;
    let notes = rows.iter().map(|r| r.note.len());
    let note_w = notes
        .chain(rejected.iter().map(|r| r.note.len()))
        .chain([4])
        .max()
        .unwrap_or(4);
    println!("settlements ({}):", rows.len());
    println!(
        "  {:>8}  {:<10}  {:<note_w$}  time",
        "token", "worker", "note"
    );
    for row in visible_rows(&rows, all) {
        match row {
            Ok(r) => println!(
                "  {:>8}  {:<10}  {:<note_w$}  {}",
                r.token,
                r.worker,
                r.note,
                short_time(&r.wall)
            ),
            Err(hidden) => println!("  {:>8}  ({hidden} more rows like these)", "..."),
        }
    }
    println!("rejections ({}):", rejected.len());
    if !rejected.is_empty() {
        println!(
            "  {:>8}  {:<10}  {:<note_w$}  {:<12}  highest then",
            "token", "worker", "note", "time"
        );
    }
    for r in &rejected {
        println!(
            "  {:>8}  {:<10}  {:<note_w$}  {}  {}",
            r.token,
            r.worker,
            r.note,
            short_time(&r.wall),
            r.highest
        );
    }
    let highest = rows.iter().map(|r| r.token).max().unwrap_or(0);
    let never = if first_decrease(&rows).is_none() {
        "yes"
    } else {
        "no"
    };
    println!(
        "accepted {}, rejected {}, highest token {highest}, tokens never decreased: {never}",
        rows.len(),
        rejected.len()
    );
    Ok(0)
}

fn cmd_check(db: &str) -> Result<u8> {
    let conn = open(db)?;
    let rows = settlements(&conn)?;
    match first_decrease(&rows) {
        None => {
            println!("ok: {} accepted tokens, never decreasing", rows.len());
            Ok(0)
        }
        Some((i, prev, token)) => {
            let r = &rows[i];
            println!(
                "violation: settlement #{} (worker {}, {}) has token {token} after token {prev}",
                i + 1,
                r.worker,
                r.note
            );
            Ok(1)
        }
    }
}

fn run(args: &[String]) -> Result<u8> {
    let (db, cmd, opts) = parse(args)?;
    match cmd.as_str() {
        "init" => {
            init(&open(&db)?)?;
            Ok(0)
        }
        "write" => cmd_write(&db, &opts),
        "settle" => cmd_settle(&db, &opts),
        "show" => cmd_show(&db, opts.all),
        "check" => cmd_check(&db),
        other => Err(usage(format!("unknown command {other}"))),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => match e.downcast_ref::<Usage>() {
            Some(u) => {
                if !u.0.is_empty() {
                    eprintln!("ledger: {u}");
                }
                eprintln!("{USAGE}");
                ExitCode::from(EXIT_USAGE)
            }
            None => {
                eprintln!("ledger: {e:#}");
                ExitCode::from(1)
            }
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Clocks
// ---------------------------------------------------------------------------------------------

/// CLOCK_MONOTONIC in nanoseconds: comparable across processes on this machine (the demo
/// uses it to line writes up with the moment it killed a worker), unaffected by clock steps.
fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // time_t and c_long are only 32 bits on some targets.
    #[allow(clippy::unnecessary_cast)]
    let (sec, nsec) = (ts.tv_sec as i64, ts.tv_nsec as i64);
    sec * 1_000_000_000 + nsec
}

/// Local wall time as `YYYY-MM-DD HH:MM:SS.mmm`, for people reading the table.
fn wall_clock() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as libc::time_t;
    // SAFETY: an all-zero tm is valid; localtime_r fills it and is thread-safe.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&secs, &mut tm) };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_millis()
    )
}

/// The time of day part of a stored wall time.
fn short_time(wall: &str) -> &str {
    wall.split_once(' ').map_or(wall, |(_, t)| t)
}

// ---------------------------------------------------------------------------------------------
// Tests (`cargo test --example ledger`)
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let conn = open(path.to_str().unwrap()).unwrap();
        init(&conn).unwrap();
        (dir, conn)
    }

    fn put(conn: &mut Connection, token: i64, worker: &str) -> Verdict {
        put_slot(conn, token, 0, worker)
    }

    fn put_slot(conn: &mut Connection, token: i64, slot: i64, worker: &str) -> Verdict {
        write(
            conn,
            &Write {
                token,
                slot,
                worker,
                note: "test",
            },
        )
        .unwrap()
    }

    #[test]
    fn a_decrease_counts_only_within_a_slot() {
        let (_dir, mut conn) = ledger();
        put_slot(&mut conn, 9, 0, "a");
        put_slot(&mut conn, 5, 1, "b");
        assert_eq!(first_decrease(&settlements(&conn).unwrap()), None);
    }

    #[test]
    fn each_slot_has_its_own_mark() {
        let (_dir, mut conn) = ledger();
        let accepted = |highest| Verdict::Accepted { highest };
        let rejected = |highest| Verdict::Rejected { highest };
        for (token, slot, verdict) in [
            (9, 0, accepted(9)),
            (5, 1, accepted(5)),
            (4, 1, rejected(5)),
            (8, 0, rejected(9)),
        ] {
            assert_eq!(put_slot(&mut conn, token, slot, "w"), verdict, "{token}");
        }
    }

    #[test]
    fn equal_and_higher_tokens_are_accepted() {
        let (_dir, mut conn) = ledger();
        assert_eq!(put(&mut conn, 5, "a"), Verdict::Accepted { highest: 5 });
        assert_eq!(put(&mut conn, 5, "a"), Verdict::Accepted { highest: 5 });
        assert_eq!(put(&mut conn, 9, "b"), Verdict::Accepted { highest: 9 });
        assert_eq!(settlements(&conn).unwrap().len(), 3);
        assert!(rejections(&conn).unwrap().is_empty());
    }

    #[test]
    fn a_lower_token_is_rejected_and_recorded() {
        let (_dir, mut conn) = ledger();
        put(&mut conn, 5, "a");
        put(&mut conn, 9, "b");
        assert_eq!(put(&mut conn, 5, "a"), Verdict::Rejected { highest: 9 });
        let rows = settlements(&conn).unwrap();
        assert_eq!(rows.len(), 2, "the stale write left no settlement");
        let rej = rejections(&conn).unwrap();
        assert_eq!((rej.len(), rej[0].token, rej[0].highest), (1, 5, 9));
        // The mark is unchanged: the next write from the new term still goes through.
        assert_eq!(put(&mut conn, 9, "b"), Verdict::Accepted { highest: 9 });
    }

    #[test]
    fn init_is_idempotent_and_keeps_the_mark() {
        let (_dir, mut conn) = ledger();
        put(&mut conn, 7, "a");
        init(&conn).unwrap();
        assert_eq!(put(&mut conn, 6, "z"), Verdict::Rejected { highest: 7 });
    }

    #[test]
    fn writes_without_init_fail() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(dir.path().join("x.db").to_str().unwrap()).unwrap();
        let w = Write {
            token: 1,
            slot: 0,
            worker: "a",
            note: "",
        };
        assert!(write(&mut conn, &w).is_err());
    }

    #[test]
    fn check_finds_a_decrease() {
        let (_dir, mut conn) = ledger();
        put(&mut conn, 3, "a");
        put(&mut conn, 4, "b");
        assert_eq!(first_decrease(&settlements(&conn).unwrap()), None);
        // Bypass the fence to simulate an unfenced resource.
        conn.execute(
            "INSERT INTO settlements (token, worker, note, at_ns, wall) VALUES (2, 'z', 'x', 0, '')",
            [],
        )
        .unwrap();
        assert_eq!(
            first_decrease(&settlements(&conn).unwrap()),
            Some((2, 4, 2))
        );
    }

    #[test]
    fn show_keeps_the_ends_of_long_runs() {
        let row = |token, worker: &str| Settlement {
            token,
            slot: 0,
            worker: worker.to_string(),
            note: String::new(),
            wall: String::new(),
        };
        let mut rows: Vec<Settlement> = (0..10).map(|_| row(2, "a")).collect();
        rows.extend((0..3).map(|_| row(4, "b")));
        let shown = visible_rows(&rows, false);
        let tokens: Vec<Option<i64>> = shown
            .iter()
            .map(|r| r.as_ref().ok().map(|s| s.token))
            .collect();
        assert_eq!(
            tokens,
            [Some(2), Some(2), None, Some(2), Some(4), Some(4), Some(4)]
        );
        assert_eq!(shown[2].as_ref().err(), Some(&7));
        assert_eq!(visible_rows(&rows, true).len(), 13);
    }

    #[test]
    fn arguments_parse_in_any_order() {
        let args: Vec<String> = ["write", "--token", "4", "--db", "f.db", "--note", "n"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (db, cmd, opts) = parse(&args).unwrap();
        assert_eq!((db.as_str(), cmd.as_str()), ("f.db", "write"));
        assert_eq!(token_of(&opts).unwrap(), 4);
        assert!(parse(&["init".to_string()]).is_err());
    }
}
