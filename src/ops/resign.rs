//! `lead-exec resign [--token T]`: a manual transfer.
//!
//! Writes a resign request carrying the leader's token, in a transaction that succeeds only
//! while that key still leads with that token (compare-and-put, never blind). The leader sees
//! the request through its watch, stops its job (grace, then SIGKILL), revokes its lease and
//! queues again at the back; only then does the next candidate take over, so the two jobs
//! never overlap. The request lives on the leader's lease and vanishes with the term.

use anyhow::Result;
use etcd_client::{
    Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchFilterType, WatchOptions,
};

use super::Ctx;
use crate::cli::ResignArgs;
use crate::etcd::{bounded, classify};
use crate::exit::{fail, Exit};

pub async fn run(a: ResignArgs) -> Result<Exit> {
    let ctx = Ctx::connect(&a.election).await?;
    let (entries, _) = ctx.candidates().await?;
    let Some(leader) = entries.first() else {
        return Err(fail(
            Exit::NoLeader,
            format!("{}: no leader to resign", ctx.election.name()),
        ));
    };
    if let Some(t) = a.token {
        if t != leader.token {
            return Err(fail(
                Exit::StaleToken,
                format!(
                    "token {t} is not the leader's (the leader's token is {})",
                    leader.token
                ),
            ));
        }
    }
    let txn = Txn::new()
        .when([Compare::create_revision(
            leader.key.clone(),
            CompareOp::Equal,
            leader.token,
        )])
        .and_then([TxnOp::put(
            ctx.election.resign_key(),
            leader.token.to_string(),
            Some(PutOptions::new().with_lease(leader.lease)),
        )]);
    let mut c = ctx.client.clone();
    let resp = bounded(ctx.limit, "etcd", c.txn(txn)).await?;
    if !resp.succeeded() {
        return Err(fail(
            Exit::StaleToken,
            format!(
                "token {} stopped leading before the request was written",
                leader.token
            ),
        ));
    }
    let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
    println!(
        "asked {} (token {}) to resign; waiting for it to stop its job",
        leader.candidate.id, leader.token
    );
    let opts = WatchOptions::new()
        .with_start_revision(rev + 1)
        .with_filters([WatchFilterType::NoPut]);
    let mut stream = bounded(ctx.limit, "etcd", c.watch(leader.key.clone(), Some(opts))).await?;
    let gone = async {
        loop {
            match stream.message().await {
                Ok(Some(r))
                    if r.events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete) =>
                {
                    return Ok(())
                }
                Ok(Some(r)) if r.canceled() => return Ok(()),
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(()),
                Err(e) => return Err(classify(e)),
            }
        }
    };
    match tokio::time::timeout(a.timeout, gone).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(fail(
                Exit::Unavailable,
                format!(
                    "token {} still leads after {}; its lease ends it if it is stuck",
                    leader.token,
                    humantime::format_duration(a.timeout)
                ),
            ))
        }
    }
    let (after, _) = ctx.candidates().await?;
    match after.first() {
        Some(n) => println!(
            "resigned; next in line: {} (token {})",
            n.candidate.id, n.token
        ),
        None => println!("resigned; no candidate is waiting"),
    }
    Ok(Exit::Job(0))
}
