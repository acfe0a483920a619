//! Which database the ledger writes to: a SQLite file (`--db FILE`) or PostgreSQL
//! (`--pg CONNINFO`). Both keep the same tables and the same fencing rule.

use anyhow::Result;

use crate::store::{Rejection, Settlement, Verdict, Write};
use crate::{pg, store};

/// Where the ledger lives, as the command line said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Sqlite(String),
    /// A libpq connection string (`host=/run/postgresql dbname=ledger`); it should carry no
    /// password, since it is an argument that `ps` shows.
    Postgres(String),
}

pub(crate) enum Ledger {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

impl Ledger {
    pub(crate) fn open(target: &Target) -> Result<Ledger> {
        Ok(match target {
            Target::Sqlite(path) => Ledger::Sqlite(store::open(path)?),
            Target::Postgres(conninfo) => Ledger::Postgres(Box::new(pg::open(conninfo)?)),
        })
    }

    pub(crate) fn init(&mut self) -> Result<()> {
        match self {
            Ledger::Sqlite(c) => store::init(c),
            Ledger::Postgres(c) => pg::init(c),
        }
    }

    pub(crate) fn write(&mut self, w: &Write) -> Result<Verdict> {
        match self {
            Ledger::Sqlite(c) => store::write(c, w),
            Ledger::Postgres(c) => pg::write(c, w),
        }
    }

    pub(crate) fn settlements(&mut self) -> Result<Vec<Settlement>> {
        match self {
            Ledger::Sqlite(c) => store::settlements(c),
            Ledger::Postgres(c) => pg::settlements(c),
        }
    }

    pub(crate) fn rejections(&mut self) -> Result<Vec<Rejection>> {
        match self {
            Ledger::Sqlite(c) => store::rejections(c),
            Ledger::Postgres(c) => pg::rejections(c),
        }
    }
}
