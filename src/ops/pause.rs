//! `lead-exec pause` / `resume`: the kill switch, stored in etcd.
//!
//! While `lead-exec/meta/NAME/paused` exists no candidate confirms a win, and a running
//! leader, which watches the key, stops its job and goes back in line.

use anyhow::Result;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use std::time::Duration;

use super::{Ctx, Entry, Pause};
use crate::cli::{ElectionArgs, PauseArgs};
use crate::election::unix_ms;
use crate::exit::{fail, Exit};
use crate::records::history::Record;
use crate::text::escape;

pub async fn pause(a: PauseArgs) -> Result<Exit> {
    crate::config::bounded_duration("--timeout", a.timeout)?;
    if a.reason.trim().is_empty() {
        return Err(fail(
            Exit::Usage,
            "--reason must not be empty: say why, for whoever finds the election paused",
        ));
    }
    crate::config::one_line("--reason", &a.reason)?;
    let ctx = Ctx::from_args(&a.election).await?;
    let user = operator(
        |v| std::env::var(v).ok(),
        nix::unistd::getuid(),
        |uid| {
            nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|u| u.name)
        },
    );
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
    // The pause is written: a stdout that fails now must not keep it from being waited on.
    if resp.succeeded() {
        let _ = super::emit(&format!("paused {}: {}\n", ctx.election.name(), a.reason));
    } else if let Some(old) = ctx.paused().await? {
        let _ = super::emit(&format!(
            "{} was already paused by {}: {}\n",
            ctx.election.name(),
            escape(&old.by),
            escape(&old.reason)
        ));
    }
    if !a.no_block {
        wait_stopped(&ctx, a.timeout).await?;
    }
    Ok(Exit::Ok)
}

/// How long a holder with no start record and no mark of its election may still be one whose
/// job just started: one of an older lead-exec, whose record goes out beside its job. A term
/// marked elected needs none of it: `ctx.history` counts its key as a running term.
const RECORD_GRACE: Duration = Duration::from_millis(1500);

/// Between two looks at the terms while a pause waits.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// Waits until no job of the election runs: every term whose record is open and whose key is
/// still there has ended (its leader, seeing the pause, stops its job, closes its record and
/// deletes its key in one commit). A holder with no record is one that has not started a job
/// (it waits for `resume` without one), unless its record is still on its way: it counts as
/// running for [`RECORD_GRACE`].
async fn wait_stopped(ctx: &Ctx, timeout: Duration) -> Result<()> {
    let started = tokio::time::Instant::now();
    let until = started + timeout;
    let slots = ctx.slots().await?;
    let (line, _) = ctx.candidates().await?;
    let heads: Vec<i64> = line.iter().take(slots as usize).map(|e| e.token).collect();
    let mut said = false;
    loop {
        let records = ctx.history(Some(heads.len() + HISTORY_LOOK)).await?;
        let (line, _) = ctx.candidates().await?;
        let fresh = started.elapsed() < RECORD_GRACE;
        let running = running_terms(&records, &line, &heads, fresh);
        if running.is_empty() {
            return Ok(());
        }
        let tokens: Vec<String> = running.iter().map(i64::to_string).collect();
        if !said {
            said = true;
            let _ = super::emit(&format!(
                "waiting for token {} to stop its job\n",
                tokens.join(", ")
            ));
        }
        if tokio::time::Instant::now() + LOOK_EVERY >= until {
            return Err(fail(
                Exit::Unavailable,
                format!(
                    "{} is paused, but token {} still runs after {}; its lease ends it if it is stuck",
                    ctx.election.name(),
                    tokens.join(", "),
                    crate::clock::human(timeout)
                ),
            ));
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// Past the holders' own, how many of the latest records a pause looks at: a term that ended
/// its candidacy and still drains has a record among them.
const HISTORY_LOOK: usize = 4;

/// The tokens of the terms that may still run a job: a record still open (its key is there),
/// and, while `fresh`, a holder of the line at the pause that has no record yet.
fn running_terms(records: &[Record], line: &[Entry], heads: &[i64], fresh: bool) -> Vec<i64> {
    let in_line = |t: i64| line.iter().any(|e| e.token == t);
    let mut out: Vec<i64> = records
        .iter()
        .filter(|r| r.end.is_none() && in_line(r.token))
        .map(|r| r.token)
        .collect();
    if fresh {
        for &t in heads {
            if in_line(t) && !records.iter().any(|r| r.token == t) && !out.contains(&t) {
                out.push(t);
            }
        }
    }
    out.sort_unstable();
    out
}

/// Who is pausing, for `status` and the history: the login names the environment gives
/// (`USER`, then `LOGNAME`, then the `SUDO_USER` behind a sudo), else the name of our uid (cron
/// and systemd set none of them), else the uid itself.
fn operator(
    var: impl Fn(&str) -> Option<String>,
    uid: nix::unistd::Uid,
    name_of: impl Fn(nix::unistd::Uid) -> Option<String>,
) -> String {
    ["USER", "LOGNAME", "SUDO_USER"]
        .into_iter()
        .filter_map(var)
        .find(|v| !v.trim().is_empty())
        .or_else(|| name_of(uid))
        .unwrap_or_else(|| format!("uid {uid}"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::unistd::Uid;

    fn record(token: i64, end: Option<&str>) -> Record {
        serde_json::from_value(serde_json::json!({
            "token": token, "id": "w", "host": "h", "pid": 1, "started_ms": 0, "end": end,
        }))
        .unwrap()
    }

    fn entry(token: i64) -> Entry {
        Entry {
            key: format!("k/{token}"),
            token,
            lease: 0,
            slot: None,
            candidate: crate::election::Candidate::parse(b"w"),
        }
    }

    #[test]
    fn a_pause_waits_for_open_terms_and_briefly_for_holders_without_a_record() {
        let line = [entry(7), entry(9)];
        // An open record whose key is there runs; a closed one does not.
        let recs = [record(5, Some("exit 0")), record(7, None)];
        assert_eq!(running_terms(&recs, &line, &[7], false), vec![7]);
        // The key gone: the term ended (its record is closed after its key, or never).
        assert_eq!(
            running_terms(&recs, &[entry(9)], &[7], false),
            Vec::<i64>::new()
        );
        // A holder without a record: running only while its record may still be on its way.
        let recs = [record(5, Some("exit 0"))];
        assert_eq!(running_terms(&recs, &line, &[7], true), vec![7]);
        assert_eq!(running_terms(&recs, &line, &[7], false), Vec::<i64>::new());
    }

    #[test]
    fn the_operator_is_named_by_the_environment_then_by_the_uid() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |v: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == v)
                    .map(|(_, x)| x.to_string())
            }
        };
        let root = |_: Uid| Some("root".to_string());
        let none = |_: Uid| None;
        let uid = Uid::from_raw(1234);
        assert_eq!(
            operator(env(&[("USER", "ann"), ("LOGNAME", "bob")]), uid, root),
            "ann"
        );
        assert_eq!(
            operator(env(&[("USER", ""), ("LOGNAME", "bob")]), uid, root),
            "bob"
        );
        assert_eq!(operator(env(&[("SUDO_USER", "cy")]), uid, root), "cy");
        assert_eq!(operator(env(&[]), uid, root), "root");
        assert_eq!(operator(env(&[]), uid, none), "uid 1234");
    }
}
