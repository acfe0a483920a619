//! `lead-exec check`: for use inside a job, before an external call that cannot carry the
//! token. Exit 0 only if FENCING_TOKEN still belongs to the leader, by a linearizable read.

use anyhow::Result;

use super::Ctx;
use crate::cli::{CheckArgs, ElectionArgs};
use crate::exit::{fail, Exit};

pub async fn run(a: CheckArgs) -> Result<Exit> {
    let ctx = Ctx::connect(&ElectionArgs {
        election: a.election.clone(),
        conn: a.conn.clone(),
    })
    .await?;
    let (entries, _) = ctx.candidates().await?;
    let paused = ctx.paused().await?;
    match entries.first() {
        Some(l) if l.token == a.token && paused.is_none() => {
            println!("token {} is the leader's", a.token);
            Ok(Exit::Ok)
        }
        Some(l) if l.token == a.token => Err(fail(
            Exit::StaleToken,
            format!("token {} must stop: the election is paused", a.token),
        )),
        Some(l) => Err(fail(
            Exit::StaleToken,
            format!(
                "token {} is stale: the leader's token is {}",
                a.token, l.token
            ),
        )),
        None => Err(fail(
            Exit::StaleToken,
            format!("token {} is stale: there is no leader", a.token),
        )),
    }
}
