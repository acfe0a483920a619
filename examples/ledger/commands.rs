//! `write`, `show` and `check`.

use anyhow::Result;

use crate::args::{slot_of, token_of, worker_of, Opts};
use crate::clock::short_time;
use crate::db::{Ledger, Target};
use crate::store::{first_decrease, Settlement, Verdict, Write};
use crate::EXIT_REJECTED;

pub(crate) fn cmd_write(db: &Target, opts: &Opts) -> Result<u8> {
    let token = token_of(opts)?;
    let worker = worker_of(opts);
    let note = opts.note.clone().unwrap_or_default();
    let mut ledger = Ledger::open(db)?;
    let w = Write {
        token,
        slot: slot_of()?,
        worker: &worker,
        note: &note,
    };
    match ledger.write(&w)? {
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

/// Rows kept at the start and at the end of a run from one term when `show` is compact.
pub(crate) const RUN_HEAD: usize = 2;
pub(crate) const RUN_TAIL: usize = 1;

/// Which settlement rows `show` prints: all of them, or, in each run of consecutive rows
/// from the same term, the first and last few and a count of the rest, so that a long
/// ledger still shows every term change.
pub(crate) fn visible_rows(rows: &[Settlement], all: bool) -> Vec<Result<&Settlement, usize>> {
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

pub(crate) fn cmd_show(db: &Target, all: bool) -> Result<u8> {
    let mut ledger = Ledger::open(db)?;
    let rows = ledger.settlements()?;
    let rejected = ledger.rejections()?;
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

pub(crate) fn cmd_check(db: &Target) -> Result<u8> {
    let rows = Ledger::open(db)?.settlements()?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
