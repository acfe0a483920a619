//! The same ledger on PostgreSQL, fenced by `contrib/postgres/fencing.sql`: the settlement
//! and the fence check share one READ COMMITTED transaction.

use anyhow::{Context, Result};
use postgres::{Client, IsolationLevel, NoTls};

use crate::clock::{monotonic_ns, wall_clock};
use crate::store::{Rejection, Settlement, Verdict, Write};

/// The fencing SQL as shipped, run by `init`.
pub(crate) const FENCING_SQL: &str = include_str!("../../contrib/postgres/fencing.sql");

/// The SQLSTATE `lead_exec_fence` raises for a stale token.
pub(crate) const STALE: &str = "FENCE";

pub(crate) fn open(conninfo: &str) -> Result<Client> {
    Client::connect(conninfo, NoTls).context("connecting to PostgreSQL")
}

/// The fence's resource for a slot: each slot has its own mark.
pub(crate) fn resource(slot: i64) -> String {
    format!("settlement/{slot}")
}

pub(crate) fn init(client: &mut Client) -> Result<()> {
    client.batch_execute(FENCING_SQL)?;
    client.batch_execute(
        "CREATE TABLE IF NOT EXISTS settlements (
             id     bigserial PRIMARY KEY,
             token  bigint NOT NULL,
             slot   bigint NOT NULL DEFAULT 0,
             worker text   NOT NULL,
             note   text   NOT NULL,
             at_ns  bigint NOT NULL,
             wall   text   NOT NULL
         );
         CREATE TABLE IF NOT EXISTS rejections (
             id      bigserial PRIMARY KEY,
             token   bigint NOT NULL,
             slot    bigint NOT NULL DEFAULT 0,
             highest bigint NOT NULL,
             worker  text   NOT NULL,
             note    text   NOT NULL,
             at_ns   bigint NOT NULL,
             wall    text   NOT NULL
         );",
    )?;
    Ok(())
}

/// The fenced write. The fence call comes first, so a stale writer does no work and a
/// current one holds the resource's row lock while it writes: ids are then handed out in
/// token order. A rejection is recorded in a transaction of its own, after the rollback.
pub(crate) fn write(client: &mut Client, w: &Write) -> Result<Verdict> {
    let resource = resource(w.slot);
    let mut tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()?;
    match tx.query_one("SELECT lead_exec_fence($1, $2)", &[&resource, &w.token]) {
        Ok(row) => {
            tx.execute(
                "INSERT INTO settlements (token, slot, worker, note, at_ns, wall)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &w.token,
                    &w.slot,
                    &w.worker,
                    &w.note,
                    &monotonic_ns(),
                    &wall_clock(),
                ],
            )?;
            tx.commit()?;
            Ok(Verdict::Accepted {
                highest: row.get(0),
            })
        }
        Err(e) if e.code().map(|c| c.code()) == Some(STALE) => {
            tx.rollback()?;
            let highest: i64 = client
                .query_one(
                    "SELECT highest FROM lead_exec_fence WHERE resource = $1",
                    &[&resource],
                )?
                .get(0);
            client.execute(
                "INSERT INTO rejections (token, slot, highest, worker, note, at_ns, wall)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &w.token,
                    &w.slot,
                    &highest,
                    &w.worker,
                    &w.note,
                    &monotonic_ns(),
                    &wall_clock(),
                ],
            )?;
            Ok(Verdict::Rejected { highest })
        }
        Err(e) => Err(e).context("the fenced write"),
    }
}

pub(crate) fn settlements(client: &mut Client) -> Result<Vec<Settlement>> {
    let rows = client.query(
        "SELECT token, slot, worker, note, wall FROM settlements ORDER BY id",
        &[],
    )?;
    Ok(rows
        .iter()
        .map(|r| Settlement {
            token: r.get(0),
            slot: r.get(1),
            worker: r.get(2),
            note: r.get(3),
            wall: r.get(4),
        })
        .collect())
}

pub(crate) fn rejections(client: &mut Client) -> Result<Vec<Rejection>> {
    let rows = client.query(
        "SELECT token, highest, worker, note, wall FROM rejections ORDER BY id",
        &[],
    )?;
    Ok(rows
        .iter()
        .map(|r| Rejection {
            token: r.get(0),
            highest: r.get(1),
            worker: r.get(2),
            note: r.get(3),
            wall: r.get(4),
        })
        .collect())
}
