//! `lead-exec resign [--token T]`: a manual transfer. With `--slots` above 1, T names the
//! holder to move; the one resign request key serves every holder, since each acts only on a
//! request naming its own token and watches deliver every put in order.
//!
//! Writes a resign request carrying the leader's token, in a transaction that succeeds only
//! while that key still leads with that token (compare-and-put, never blind). The leader sees
//! the request through its watch, stops its job (grace, then SIGKILL), revokes its lease and
//! queues again at the back; only then does the next candidate take over, so the two jobs
//! never overlap. The request lives on the leader's lease and vanishes with the term; the
//! leader acts on it only if it names the leader's own token. A paused election has no
//! leader to resign, and a request that did not act within `--timeout` is taken back. A broken
//! watch (etcd restarted, a member gone) is no answer: the key is read and watched again.

use anyhow::Result;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, WatchFilterType, WatchOptions,
};

use super::{Ctx, Entry, Holders};
use crate::cli::ResignArgs;
use crate::election::leader::request_txn;
use crate::etcd::classify;
use crate::exit::{exit_of, fail, Exit};

pub async fn run(a: ResignArgs) -> Result<Exit> {
    let ctx = Ctx::from_args(&a.election).await?;
    let line = ctx.holders().await?;
    // A paused election has no leader: its head of line runs nothing, and a request left for
    // it would stop its first job after `resume`.
    let Some(leader) = pick(&line, a.token, ctx.election.name())? else {
        let why = if line.paused.is_some() {
            " (paused)"
        } else {
            ""
        };
        return Err(fail(
            Exit::NoLeader,
            format!("{}: no leader to resign{why}", ctx.election.name()),
        ));
    };
    let request = ctx.election.resign_key();
    let txn = request_txn(
        &ctx.election,
        leader.key.clone(),
        leader.token,
        leader.lease,
        leader.token.to_string(),
    );
    let mut c = ctx.client.clone();
    let resp = ctx.bounded(c.txn(txn)).await?;
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
    // The request is written: a stdout that fails now must not keep it from being waited on.
    let _ = super::emit(&format!(
        "asked {} (token {}) to resign; waiting for it to stop its job\n",
        crate::text::escape(&leader.candidate.id),
        leader.token
    ));
    let outcome = wait_gone(&ctx, &leader.key, rev, a.timeout).await;
    if outcome.is_err() {
        // Take back a request that did not act, unless it already did or another replaced
        // it: left behind, it would act whenever its term noticed it.
        let undo = Txn::new()
            .when([Compare::mod_revision(
                request.clone(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([TxnOp::delete(request, None)]);
        let _ = ctx.bounded(c.txn(undo)).await;
    }
    outcome?;
    let (after, _) = ctx.candidates().await?;
    match after.first() {
        Some(_) if line.slots > 1 => outln!(
            "resigned; holders now: {}",
            super::tokens(&after[..after.len().min(line.slots as usize)])
        ),
        Some(n) => outln!(
            "resigned; next in line: {} (token {})",
            crate::text::escape(&n.candidate.id),
            n.token
        ),
        None => outln!("resigned; no candidate is waiting"),
    };
    Ok(Exit::Ok)
}

/// The holder to resign: the one `token` names, or the only one. With several slots a
/// holder must be named, since any of them could be meant.
fn pick<'a>(line: &'a Holders, token: Option<i64>, name: &str) -> Result<Option<&'a Entry>> {
    let holders = line.holders();
    let Some(first) = holders.first() else {
        return Ok(None);
    };
    let Some(t) = token else {
        if line.slots > 1 {
            return Err(fail(
                Exit::Usage,
                format!(
                    "election {name} runs with --slots {}: name the holder to resign with --token T (the holders' tokens are {})",
                    line.slots,
                    super::tokens(holders)
                ),
            ));
        }
        return Ok(Some(first));
    };
    match holders.iter().find(|h| h.token == t) {
        Some(h) => Ok(Some(h)),
        None if line.slots == 1 => Err(fail(
            Exit::StaleToken,
            format!(
                "token {t} is not the leader's (the leader's token is {})",
                first.token
            ),
        )),
        None => Err(fail(
            Exit::StaleToken,
            format!(
                "token {t} is not a holder's (the holders' tokens are {})",
                super::tokens(holders)
            ),
        )),
    }
}

/// Waits until the leader's key is deleted, for at most `timeout`. A watch that breaks (etcd
/// restarted, a member left), is cancelled or closes says nothing about the leader: the key is
/// read again, its absence counts as success, and its presence is watched again from that
/// read, until `timeout`. Only a refusal (credentials, permissions) ends the wait early.
async fn wait_gone(ctx: &Ctx, key: &str, rev: i64, timeout: Duration) -> Result<()> {
    let until = tokio::time::Instant::now() + timeout;
    let mut rev = rev;
    loop {
        match tokio::time::timeout_at(until, deleted_after(ctx, key, rev)).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Err(e)) if refused(&e) => return Err(e),
            Ok(_) => {}
            Err(_) => break,
        }
        // Within the wait too: a hanging etcd must not stretch it.
        let mut c = ctx.client.clone();
        let read = ctx.bounded(c.get(key, Some(GetOptions::new().with_count_only())));
        match tokio::time::timeout_at(until, read).await {
            Ok(Ok(r)) if r.count() == 0 => return Ok(()),
            Ok(Ok(r)) => rev = r.header().map(|h| h.revision()).unwrap_or(rev),
            Ok(Err(e)) if refused(&e) => return Err(e),
            Ok(Err(e)) => tracing::debug!("waiting for {key} to go: {e:#}"),
            Err(_) => break,
        }
        // Paced: etcd may be restarting.
        if tokio::time::timeout_at(until, tokio::time::sleep(RETRY))
            .await
            .is_err()
        {
            break;
        }
    }
    // The last word is a read: the key may have gone as the wait ran out.
    let last = ctx
        .bounded(
            ctx.client
                .clone()
                .get(key, Some(GetOptions::new().with_count_only())),
        )
        .await;
    let why = match last {
        Ok(r) if r.count() == 0 => return Ok(()),
        Ok(_) => "its lease ends it if it is stuck".to_string(),
        Err(e) if refused(&e) => return Err(e),
        Err(e) => format!("etcd did not answer the last read: {e:#}"),
    };
    Err(fail(
        Exit::Unavailable,
        format!(
            "{key} still leads after {}: {why}",
            crate::clock::human(timeout)
        ),
    ))
}

/// Whether etcd refused us (credentials, permissions): no retry changes that.
fn refused(e: &anyhow::Error) -> bool {
    exit_of(e) == Exit::Auth
}

/// How long a broken wait rests before it reads the key again.
const RETRY: Duration = Duration::from_millis(250);

/// Watches `key` from just after `rev` until it is deleted (`true`), or the watch is
/// cancelled or closes (`false`).
async fn deleted_after(ctx: &Ctx, key: &str, rev: i64) -> Result<bool> {
    let mut c = ctx.client.clone();
    let opts = WatchOptions::new()
        .with_start_revision(rev + 1)
        .with_filters([WatchFilterType::NoPut]);
    let mut stream = ctx.bounded(c.watch(key, Some(opts))).await?;
    loop {
        match stream.message().await.map_err(classify)? {
            Some(r)
                if r.events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete) =>
            {
                return Ok(true)
            }
            Some(r) if r.canceled() => return Ok(false),
            Some(_) => continue,
            None => return Ok(false),
        }
    }
}
