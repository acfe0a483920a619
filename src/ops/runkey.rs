//! Run keys (`run --run-key KEY`): the job runs again until a success is recorded for KEY.
//!
//! The completion record is written in a transaction guarded by our leader key, so only the
//! leader that ran the job can record it, and it lives on a lease of `--run-key-ttl`. A failed
//! job, a success after the term was lost, and a record that could not be written all leave
//! KEY open: running twice is the failure mode chosen over never running.

use anyhow::Result;
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use crate::config::RunConfig;
use crate::election::unix_ms;
use crate::etcd::bounded;

/// `Some(key)` if `--run-key` was given and is already recorded as done.
pub async fn already_done(client: &Client, cfg: &RunConfig) -> Result<Option<String>> {
    let Some(k) = &cfg.run_key else {
        return Ok(None);
    };
    let mut c = client.clone();
    let resp = bounded(
        cfg.conn.command_timeout,
        "etcd",
        c.get(
            cfg.election.run_key(k),
            Some(GetOptions::new().with_count_only()),
        ),
    )
    .await?;
    Ok((resp.count() > 0).then(|| k.clone()))
}

/// Records `--run-key` as done, guarded by our leader key (create revision = token).
pub async fn mark_done(client: &Client, cfg: &RunConfig, key: &str, token: i64) -> Result<bool> {
    let Some(k) = &cfg.run_key else {
        return Ok(false);
    };
    let mut c = client.clone();
    let timeout = cfg.conn.command_timeout;
    let ttl = cfg.run_key_ttl.as_secs().max(1) as i64;
    let lease = bounded(timeout, "etcd", c.lease_grant(ttl, None)).await?;
    let value = serde_json::json!({ "token": token, "id": cfg.id, "done_ms": unix_ms() });
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, token)])
        .and_then([TxnOp::put(
            cfg.election.run_key(k),
            value.to_string(),
            Some(PutOptions::new().with_lease(lease.id())),
        )]);
    let ok = bounded(timeout, "etcd", c.txn(txn)).await?.succeeded();
    if !ok {
        let _ = bounded(timeout, "etcd", c.lease_revoke(lease.id())).await;
        tracing::warn!(run_key = k, "run key not recorded: our leader key is gone");
    }
    Ok(ok)
}
