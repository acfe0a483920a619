//! `lead-exec check`: for use inside a job, before an external call that cannot carry the
//! token. Exit 0 only if FENCING_TOKEN still belongs to the leader (with `--slots`, to one of
//! the holders), by a linearizable read. Nothing is printed on success; a refusal is one line
//! on stderr.

use anyhow::Result;

use super::Ctx;
use crate::cli::{CheckArgs, ElectionArgs};
use crate::exit::{fail, Exit};

pub async fn run(a: CheckArgs) -> Result<Exit> {
    let ctx = Ctx::from_args(&ElectionArgs {
        election: a.election.clone(),
        conn: a.conn.clone(),
    })
    .await?;
    let line = ctx.holders().await?;
    // The first N of the line, paused or not: a paused holder must stop, not look stale.
    let first = &line.entries[..line.entries.len().min(line.slots as usize)];
    let stale = |why: String| {
        crate::metrics::check_refused();
        Err(fail(Exit::StaleToken, format!("token {} {why}", a.token)))
    };
    match first.iter().find(|e| e.token == a.token) {
        // Silent, as test(1) is: a job's stdout is often its data stream.
        Some(_) if line.paused.is_none() => Ok(Exit::Ok),
        Some(_) => stale("must stop: the election is paused".into()),
        None if first.is_empty() => stale("is stale: there is no leader".into()),
        None if line.slots == 1 => stale(format!(
            "is stale: the leader's token is {}",
            first[0].token
        )),
        None => stale(format!(
            "is stale: the holders' tokens are {}",
            super::tokens(first)
        )),
    }
}

/// A holder's slot for people: "-" until it has claimed one.
pub fn slot_name(slot: Option<u32>) -> String {
    slot.map_or_else(|| "-".into(), |s| s.to_string())
}
