//! The ledger itself: the SQLite tables and the fenced write (`pg.rs` has the PostgreSQL ones).

use std::time::Duration;

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::clock::{monotonic_ns, wall_clock};

/// What the fence decided about one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Written; `highest` is the mark after the write.
    Accepted { highest: i64 },
    /// Refused because an equal-or-newer term already wrote `highest`.
    Rejected { highest: i64 },
}

/// One write request.
pub(crate) struct Write<'a> {
    pub(crate) token: i64,
    /// The mark this write is fenced by (`LEAD_EXEC_SLOT`).
    pub(crate) slot: i64,
    pub(crate) worker: &'a str,
    pub(crate) note: &'a str,
}

/// Opens the database the way every command needs it: wait for other writers instead of
/// failing with SQLITE_BUSY, and use WAL so readers (`show`) never block the settling job.
pub(crate) fn open(path: &str) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {path}"))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    // journal_mode returns a row, so it is read rather than executed.
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.execute_batch("PRAGMA synchronous = NORMAL;")?;
    Ok(conn)
}

/// Creates the tables if missing. `fence` holds the highest accepted token of each slot, in
/// row `slot + 1`.
pub(crate) fn init(conn: &Connection) -> Result<()> {
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
pub(crate) fn write(conn: &mut Connection, w: &Write) -> Result<Verdict> {
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
pub(crate) struct Settlement {
    pub(crate) token: i64,
    pub(crate) slot: i64,
    pub(crate) worker: String,
    pub(crate) note: String,
    pub(crate) wall: String,
}

/// One rejected write.
#[derive(Debug)]
pub(crate) struct Rejection {
    pub(crate) token: i64,
    pub(crate) highest: i64,
    pub(crate) worker: String,
    pub(crate) note: String,
    pub(crate) wall: String,
}

pub(crate) fn settlements(conn: &Connection) -> Result<Vec<Settlement>> {
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

pub(crate) fn rejections(conn: &Connection) -> Result<Vec<Rejection>> {
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
pub(crate) fn first_decrease(rows: &[Settlement]) -> Option<(usize, i64, i64)> {
    let mut last = std::collections::HashMap::new();
    rows.iter().enumerate().find_map(|(i, r)| {
        let before = last.insert(r.slot, r.token)?;
        (r.token < before).then_some((i, before, r.token))
    })
}

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
}
