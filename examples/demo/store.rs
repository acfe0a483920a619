//! Where the ledger lives: a throwaway PostgreSQL when its server is installed, else a SQLite
//! file; `--ledger sqlite|postgres` chooses.

use std::path::Path;

use anyhow::{bail, Result};
use harness::postgres::{self, Postgres};

use crate::binaries::detach_and_tie;

/// What `--ledger` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
}

impl Kind {
    /// `--ledger sqlite|postgres`; without it, PostgreSQL if Debian's server package is there.
    pub(crate) fn from_args(args: &[String]) -> Result<Kind> {
        match args {
            [] => Ok(if postgres::bin_dir().is_ok() {
                Kind::Postgres
            } else {
                Kind::Sqlite
            }),
            [flag, v] if flag == "--ledger" && v == "sqlite" => Ok(Kind::Sqlite),
            [flag, v] if flag == "--ledger" && v == "postgres" => Ok(Kind::Postgres),
            _ => bail!("usage: demo [--ledger sqlite|postgres] (default: postgres if installed)"),
        }
    }
}

/// The ledger's database; a PostgreSQL server is stopped on drop.
pub(crate) enum Store {
    Sqlite(String),
    Postgres(Postgres),
}

impl Store {
    pub(crate) fn start(kind: Kind, dir: &Path) -> Result<Store> {
        Ok(match kind {
            Kind::Sqlite => Store::Sqlite(dir.join("ledger.db").display().to_string()),
            Kind::Postgres => {
                // Tied to the demo like the workers: its own group, so Ctrl-C reaches only
                // the demo, which then stops it in order.
                Store::Postgres(
                    Postgres::try_start_with(detach_and_tie).map_err(|e| {
                        anyhow::anyhow!("{e}\n(or run the demo with --ledger sqlite)")
                    })?,
                )
            }
        })
    }

    /// The ledger's arguments that select this database.
    pub(crate) fn args(&self) -> [String; 2] {
        match self {
            Store::Sqlite(path) => ["--db".into(), path.clone()],
            Store::Postgres(pg) => ["--pg".into(), pg.conninfo()],
        }
    }

    /// How the narration names it.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "SQLite",
            Store::Postgres(_) => "PostgreSQL",
        }
    }
}
