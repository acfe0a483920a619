//! Workers out of line because their `--health-cmd` fails:
//! `lead-exec/meta/NAME/unhealthy/<lease hex>`, so that `status` can show them.
//!
//! A worker that withdraws holds no candidate key, so nothing else says it exists. The marker
//! lives on a lease of its own, kept alive while the worker waits for a passing check and
//! revoked when it passes, so a worker that dies leaves no marker beyond its TTL. It is outside
//! the candidates' prefix: it never counts as a candidate.

use anyhow::Result;
use etcd_client::{GetOptions, PutOptions};
use serde::{Deserialize, Serialize};

use crate::election::Ctx;
use crate::election::{unix_ms, Candidate};

/// One worker out of line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Unhealthy {
    #[serde(flatten)]
    pub candidate: Candidate,
    /// When it stopped campaigning, Unix milliseconds.
    pub unhealthy_since_ms: u64,
}

impl Ctx {
    /// Shows this worker as out of line, on `lease`.
    pub async fn mark_unhealthy(&self, lease: i64, candidate: &Candidate) -> Result<()> {
        let (mut c, e) = (self.client.clone(), &self.election);
        let value = Unhealthy {
            candidate: candidate.clone(),
            unhealthy_since_ms: unix_ms(),
        };
        let put = c.put(
            e.unhealthy_key(lease),
            serde_json::to_string(&value)?,
            Some(PutOptions::new().with_lease(lease)),
        );
        self.bounded(put).await?;
        Ok(())
    }

    /// The workers out of line now, oldest first.
    pub async fn unhealthy(&self) -> Result<Vec<Unhealthy>> {
        let (mut c, e) = (self.client.clone(), &self.election);
        let opts = GetOptions::new().with_prefix();
        let resp = self
            .bounded(c.get(e.unhealthy_prefix(), Some(opts)))
            .await?;
        let mut v: Vec<Unhealthy> = resp
            .kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect();
        v.sort_by_key(|u| u.unhealthy_since_ms);
        Ok(v)
    }
}
