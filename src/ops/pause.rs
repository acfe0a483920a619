//! `lead-exec pause` / `resume`: the kill switch, stored in etcd.
//!
//! While `lead-exec/meta/NAME/paused` exists no candidate confirms a win, and a running
//! leader, which watches the key, stops its job and goes back in line.

use anyhow::Result;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::{Ctx, Pause};
use crate::cli::{ElectionArgs, PauseArgs};
use crate::election::unix_ms;
use crate::exit::{fail, Exit};
use crate::text::escape;

pub async fn pause(a: PauseArgs) -> Result<Exit> {
    if a.reason.trim().is_empty() {
        return Err(fail(
            Exit::Usage,
            "--reason must not be empty: say why, for whoever finds the election paused",
        ));
    }
    crate::config::one_line("--reason", &a.reason)?;
    let ctx = Ctx::from_args(&a.election).await?;
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let p = Pause {
        reason: a.reason.clone(),
        since_ms: unix_ms(),
        by: format!("{user}@{}", crate::election::hostname()),
    };
    let key = ctx.election.paused_key();
    let txn = Txn::new()
        .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key, serde_json::to_string(&p)?, None)]);
    let mut c = ctx.client.clone();
    let resp = ctx.bounded(c.txn(txn)).await?;
    if resp.succeeded() {
        outln!("paused {}: {}", ctx.election.name(), a.reason);
    } else if let Some(old) = ctx.paused().await? {
        outln!(
            "{} was already paused by {}: {}",
            ctx.election.name(),
            escape(&old.by),
            escape(&old.reason)
        );
    }
    Ok(Exit::Ok)
}

pub async fn resume(a: ElectionArgs) -> Result<Exit> {
    let ctx = Ctx::from_args(&a).await?;
    let key = ctx.election.paused_key();
    let txn = Txn::new()
        .when([Compare::version(key.clone(), CompareOp::Greater, 0)])
        .and_then([TxnOp::delete(key, None)]);
    let mut c = ctx.client.clone();
    let resp = ctx.bounded(c.txn(txn)).await?;
    if resp.succeeded() {
        outln!("resumed {}", ctx.election.name());
    } else {
        outln!("{} was not paused", ctx.election.name());
    };
    Ok(Exit::Ok)
}
