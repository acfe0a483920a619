//! A fenced ledger: a SQLite or PostgreSQL database that many workers write to, guarded by
//! fencing tokens.
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
//! `--pg CONNINFO` instead of `--db FILE` keeps the ledger in PostgreSQL
//! (`host=/run/postgresql dbname=ledger`), fenced by `contrib/postgres/fencing.sql`, which
//! `init` installs: there the check is `lead_exec_fence()` inside the write's transaction.
//!
//! `--token` defaults to `FENCING_TOKEN`, `--worker` to `LEAD_EXEC_ID` and the slot to
//! `LEAD_EXEC_SLOT`, as `lead-exec run` sets them for its job. Exit codes: 0 ok, 1 error or `check` found a decrease, 2 usage,
//! 3 write rejected by the fence.
//!
//! The modules beside this file: the fenced store, the commands, `settle`, the argument
//! parser and the clocks. Their unit tests run with `cargo test --example ledger`.

mod args;
mod clock;
mod commands;
mod db;
mod pg;
mod settle;
mod store;

use std::process::ExitCode;

use anyhow::Result;

use crate::args::{parse, usage, Usage};
use crate::commands::{cmd_check, cmd_show, cmd_write};
use crate::db::Ledger;
use crate::settle::cmd_settle;

/// Exit code of a write the fence rejected.
pub(crate) const EXIT_REJECTED: u8 = 3;
/// Exit code of bad arguments.
const EXIT_USAGE: u8 = 2;

const USAGE: &str = "usage: ledger --db FILE <command>
       ledger --pg CONNINFO <command>   (PostgreSQL; CONNINFO without a password)
commands:
  init                                          create the tables if missing
  write [--token T] [--worker W] [--note TEXT]  one fenced write (T defaults to FENCING_TOKEN)
  settle [--every MS] [--batches N] [--events FILE]
                                                write one batch every MS ms (default 300),
                                                logging start/write/reject/exit to FILE
  show [--all]                                  print settlements, rejections and a summary
  check                                         exit 1 if accepted tokens ever decreased";

fn run(args: &[String]) -> Result<u8> {
    let (db, cmd, opts) = parse(args)?;
    match cmd.as_str() {
        "init" => {
            Ledger::open(&db)?.init()?;
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
