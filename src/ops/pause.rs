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
