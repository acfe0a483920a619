//! Operator commands: status, watch, resign, pause/resume, history, check. They read the
//! records `run` keeps ([`crate::records`]).
//!
//! Every write here is a transaction guarded by a comparison, never a blind put or delete.

pub mod check;
pub mod history;
pub mod pause;
pub mod resign;
pub mod status;
pub mod watch;

use std::time::Duration;

use anyhow::Result;
use etcd_client::{Client, GetOptions, SortOrder, SortTarget};
use serde::{Deserialize, Serialize};

use crate::cli::ElectionArgs;
use crate::election::{Candidate, Election};
use crate::etcd::bounded;
use crate::etcd::Conn;

/// What every operator command starts from.
pub struct Ctx {
    pub client: Client,
    pub election: Election,
    pub timeout: Duration,
}

impl Ctx {
    pub async fn connect(a: &ElectionArgs) -> Result<Ctx> {
        let election = Election::new(&a.election)?;
        let conn = Conn::from_args(&a.conn)?;
        Ctx::open(&conn, election).await
    }

    pub async fn open(conn: &Conn, election: Election) -> Result<Ctx> {
        let client = crate::etcd::connect(conn).await?;
        Ok(Ctx {
            client,
            election,
            timeout: conn.command_timeout,
        })
    }

    /// Candidates in line order (the first one leads), read linearizably.
    pub async fn candidates(&self) -> Result<(Vec<Entry>, i64)> {
        let mut c = self.client.clone();
        let resp = bounded(
            self.timeout,
            "etcd",
            c.get(
                self.election.candidates(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend),
                ),
            ),
        )
        .await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        let entries = resp
            .kvs()
            .iter()
            .map(|kv| Entry {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                token: kv.create_revision(),
                lease: kv.lease(),
                candidate: Candidate::parse(kv.value()),
            })
            .collect();
        Ok((entries, rev))
    }

    /// The pause switch, if on.
    pub async fn paused(&self) -> Result<Option<Pause>> {
        let mut c = self.client.clone();
        let resp = bounded(
            self.timeout,
            "etcd",
            c.get(self.election.paused_key(), None),
        )
        .await?;
        Ok(resp.kvs().first().map(|kv| {
            serde_json::from_slice(kv.value()).unwrap_or(Pause {
                reason: String::from_utf8_lossy(kv.value()).into_owned(),
                since_ms: 0,
                by: String::new(),
            })
        }))
    }
}

/// The leader as every view shows it: the head of the line, unless the election is paused
/// (then nobody runs the job, whoever is first in line).
pub fn leader<'a>(entries: &'a [Entry], paused: Option<&Pause>) -> Option<&'a Entry> {
    entries.first().filter(|_| paused.is_none())
}

/// One candidate key.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub key: String,
    /// The key's create revision: the fencing token if it leads.
    pub token: i64,
    #[serde(skip)]
    pub lease: i64,
    #[serde(flatten)]
    pub candidate: Candidate,
}

/// The value of the pause switch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pause {
    pub reason: String,
    pub since_ms: u64,
    pub by: String,
}

/// Unix milliseconds as RFC 3339 (UTC, seconds).
pub fn fmt_ms(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}
