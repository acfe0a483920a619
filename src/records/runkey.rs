//! Run keys (`run --run-key KEY`): the job runs again until a success is recorded for KEY.
//!
//! The completion record is written in a transaction guarded by our leader key, so only the
//! leader that ran the job can record it, and it lives on a lease of `--run-key-ttl`. A failed
//! job, a success after the term was lost, and a record that could not be written all leave
//! KEY open: running twice is the failure mode chosen over never running.

use std::time::Duration;

use anyhow::Result;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::Writer;
use crate::election::unix_ms;
use crate::election::Ctx;

impl Ctx {
    /// Whether `run_key` is already recorded as done.
    pub async fn run_key_done(&self, run_key: &str) -> Result<bool> {
        let (mut c, e) = (self.client.clone(), &self.election);
        let resp = self
            .bounded(c.get(
                e.run_key(run_key),
                Some(GetOptions::new().with_count_only()),
            ))
            .await?;
        Ok(resp.count() > 0)
    }

    /// Records `run_key` as done for `ttl`, guarded by the term's leader key.
    pub async fn mark_run_key_done(
        &self,
        writer: Writer<'_>,
        run_key: &str,
        ttl: Duration,
    ) -> Result<bool> {
        let (mut c, e) = (self.client.clone(), &self.election);
        let Writer { token, key, id } = writer;
        let ttl = ttl.as_secs().max(1) as i64;
        let lease = self.bounded(c.lease_grant(ttl, None)).await?;
        let value = serde_json::json!({ "token": token, "id": id, "done_ms": unix_ms() });
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, token)])
            .and_then([TxnOp::put(
                e.run_key(run_key),
                value.to_string(),
                Some(PutOptions::new().with_lease(lease.id())),
            )]);
        let ok = self.bounded(c.txn(txn)).await?.succeeded();
        if !ok {
            let _ = self.bounded(c.lease_revoke(lease.id())).await;
            tracing::warn!(run_key, "run key not recorded: our leader key is gone");
        }
        Ok(ok)
    }
}
