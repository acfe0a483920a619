//! The campaign: etcd's election protocol, plus a confirmation before any spawn.
//!
//! 1. Create `PREFIX/<lease hex>` with our lease, only if absent. Its create revision is our
//!    place in line and, if we win, our fencing token.
//! 2. While a key with a lower create revision exists, watch the nearest one until it is
//!    deleted (never poll). Watching only the predecessor keeps a deletion from waking every
//!    candidate at once.
//! 3. Confirm in one transaction that our key still has that create revision and that the
//!    election is not paused. A lease that expired while we queued fails here and never spawns.
//!    An uncontended candidate needs no separate confirmation: the transaction that creates its
//!    key also reads the head of the line and the pause switch, atomically.

use std::time::Duration;

use anyhow::Result;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::lease::{Lease, LeaseState, Loss};
use super::Election;
use crate::etcd::{bounded, classify};

/// How a campaign ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// We lead, confirmed. `token` is our key's create revision.
    Elected { token: i64, key: String },
    /// Someone else leads and the wait policy gave up.
    NotAcquired,
    /// Our lease or key went away while we waited.
    Lost(Loss),
}

/// How long a candidate waits in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Forever,
    No,
    For(Duration),
}

/// What we need to campaign.
pub struct Campaign<'a> {
    pub client: &'a Client,
    pub election: &'a Election,
    pub lease: &'a Lease,
    /// The candidate key's value (see [`super::Candidate`]).
    pub value: String,
    pub wait: Wait,
    /// When `--wait` gives up, if it does.
    pub give_up_at: Option<Instant>,
    pub timeout: Duration,
}

/// Why we are still waiting, for logs and `sd_notify` status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    Behind { key: String, value: Vec<u8> },
    Paused,
}

impl Campaign<'_> {
    pub async fn run(&self, mut on_wait: impl FnMut(&Waiting)) -> Result<Outcome> {
        let mut client = self.client.clone();
        let key = self.election.candidate_key(self.lease.id);
        // Create our key and, in the same transaction, read the head of the line and the
        // pause switch: an uncontended candidate is confirmed by this one round trip.
        let head = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let create = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.clone(),
                    self.value.clone(),
                    Some(PutOptions::new().with_lease(self.lease.id)),
                ),
                TxnOp::get(self.election.candidates(), Some(head)),
                TxnOp::get(
                    self.election.paused_key(),
                    Some(GetOptions::new().with_count_only()),
                ),
            ])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = bounded(self.timeout, "etcd", client.txn(create)).await?;
        let ops = resp.op_responses();
        let my_rev = if resp.succeeded() {
            resp.header().map(|h| h.revision()).unwrap_or(0)
        } else {
            existing_create_revision(&ops).unwrap_or(0)
        };
        anyhow::ensure!(
            my_rev > 0,
            "etcd returned no revision for our candidate key"
        );
        tracing::debug!(key, my_rev, "candidate key created");
        if resp.succeeded() && first_in_line_unpaused(&ops, my_rev) {
            return Ok(Outcome::Elected { token: my_rev, key });
        }
        let mut lease_rx = self.lease.subscribe();

        loop {
            if let LeaseState::Lost(r) = *lease_rx.borrow() {
                return Ok(Outcome::Lost(r));
            }
            let opts = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(my_rev - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1);
            let resp = bounded(
                self.timeout,
                "etcd",
                client.get(self.election.candidates(), Some(opts)),
            )
            .await?;
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            if let Some(pred) = resp.kvs().first() {
                if self.wait == Wait::No {
                    return Ok(Outcome::NotAcquired);
                }
                on_wait(&Waiting::Behind {
                    key: String::from_utf8_lossy(pred.key()).into_owned(),
                    value: pred.value().to_vec(),
                });
                match self
                    .wait_for_delete(&mut client, pred.key().to_vec(), rev, &mut lease_rx)
                    .await?
                {
                    Some(outcome) => return Ok(outcome),
                    None => continue,
                }
            }
            // First in line: confirm, and respect the kill switch.
            let confirm = Txn::new()
                .when([
                    Compare::create_revision(key.clone(), CompareOp::Equal, my_rev),
                    Compare::version(self.election.paused_key(), CompareOp::Equal, 0),
                ])
                .or_else([
                    TxnOp::get(key.clone(), None),
                    TxnOp::get(self.election.paused_key(), None),
                ]);
            let resp = bounded(self.timeout, "etcd", client.txn(confirm)).await?;
            if resp.succeeded() {
                return Ok(Outcome::Elected { token: my_rev, key });
            }
            let ops = resp.op_responses();
            if existing_create_revision(&ops[..1]) != Some(my_rev) {
                return Ok(Outcome::Lost(Loss::KeyDeleted));
            }
            if self.wait == Wait::No {
                return Ok(Outcome::NotAcquired);
            }
            on_wait(&Waiting::Paused);
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            if let Some(outcome) = self
                .wait_for_delete(
                    &mut client,
                    self.election.paused_key().into_bytes(),
                    rev,
                    &mut lease_rx,
                )
                .await?
            {
                return Ok(outcome);
            }
        }
    }

    /// Waits until `key` is deleted after revision `rev`. `None` means: look again (deleted,
    /// or the watch broke and a fresh read must decide).
    async fn wait_for_delete(
        &self,
        client: &mut Client,
        key: Vec<u8>,
        rev: i64,
        lease_rx: &mut watch::Receiver<LeaseState>,
    ) -> Result<Option<Outcome>> {
        let opts = WatchOptions::new()
            .with_start_revision(rev + 1)
            .with_filters([WatchFilterType::NoPut]);
        let mut stream =
            match tokio::time::timeout(self.timeout, client.watch(key, Some(opts))).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(classify(e)),
                Err(_) => return Ok(None),
            };
        let give_up = async {
            match self.give_up_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(give_up);
        let mut moves = crate::etcd::failover::moves();
        loop {
            tokio::select! {
                // The watch may sit on the endpoint just left: a fresh read decides.
                _ = crate::etcd::failover::moved(&mut moves) => return Ok(None),
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        if resp.canceled() || resp.compact_revision() != 0 {
                            // Compacted past our revision: a fresh read decides.
                            return Ok(None);
                        }
                        if resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
                            return Ok(None);
                        }
                    }
                    Ok(None) | Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        return Ok(None);
                    }
                },
                changed = lease_rx.changed() => {
                    if changed.is_err() {
                        return Ok(Some(Outcome::Lost(Loss::Deadline)));
                    }
                    if let LeaseState::Lost(r) = *lease_rx.borrow() {
                        return Ok(Some(Outcome::Lost(r)));
                    }
                }
                _ = &mut give_up => return Ok(Some(Outcome::NotAcquired)),
            }
        }
    }
}

/// Whether the creating transaction saw our key at the head of the line and no pause.
fn first_in_line_unpaused(ops: &[TxnOpResponse], my_rev: i64) -> bool {
    let head = match ops.get(1) {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    };
    let paused = match ops.get(2) {
        Some(TxnOpResponse::Get(g)) => g.count() > 0,
        _ => true,
    };
    head == Some(my_rev) && !paused
}

fn existing_create_revision(ops: &[TxnOpResponse]) -> Option<i64> {
    ops.iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    })
}
