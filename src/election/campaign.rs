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
//!
//! `--priority` changes who gets there first, never the rule itself (only the oldest key may
//! lead, which is what makes leadership exclusive). A candidate with priority P > 0 puts
//! `meta/NAME/priority/<lease hex>` = P beside its key and asks a lower-priority leader to hand
//! over (a resign request naming its token, see [`super::leader::preempt_request`]). At the
//! head of the line, a candidate that sees a younger candidate of higher priority lets it pass:
//! it deletes its key and queues again, behind it. Equal priorities never pass or preempt each
//! other, and the leader hands over only after its `--min-term`, so nothing loops.

use std::time::Duration;

use anyhow::Result;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::lease::{Lease, LeaseState, Loss};
use super::{Candidate, Election};
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
    /// `--priority`.
    pub priority: u32,
}

/// Why we are still waiting, for logs and `sd_notify` status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    Behind {
        key: String,
        value: Vec<u8>,
    },
    Paused,
    /// At the head of the line, letting a higher-priority candidate pass.
    Yielding,
}

impl Campaign<'_> {
    pub async fn run(&self, mut on_wait: impl FnMut(&Waiting)) -> Result<Outcome> {
        loop {
            match self.queue_once(&mut on_wait).await? {
                Some(outcome) => return Ok(outcome),
                None => on_wait(&Waiting::Yielding),
            }
        }
    }

    /// One place in line: from creating our key to an outcome, or (`None`) to letting a
    /// higher-priority candidate pass.
    async fn queue_once(&self, on_wait: &mut impl FnMut(&Waiting)) -> Result<Option<Outcome>> {
        let mut client = self.client.clone();
        let key = self.election.candidate_key(self.lease.id);
        // Create our key and, in the same transaction, read the head of the line and the
        // pause switch: an uncontended candidate is confirmed by this one round trip.
        let head = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let mut ops = vec![
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
        ];
        if self.priority > 0 {
            // Same transaction, so its mod revision is our key's create revision: others tell
            // by it whether we are younger than they are.
            ops.push(TxnOp::put(
                self.election.priority_key(self.lease.id),
                self.priority.to_string(),
                Some(PutOptions::new().with_lease(self.lease.id)),
            ));
        }
        let create = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then(ops)
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
            return Ok(Some(Outcome::Elected { token: my_rev, key }));
        }
        if self.priority > 0 {
            self.ask_for_handover(&mut client).await;
        }
        let mut lease_rx = self.lease.subscribe();

        loop {
            if let LeaseState::Lost(r) = *lease_rx.borrow() {
                return Ok(Some(Outcome::Lost(r)));
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
                    return Ok(Some(Outcome::NotAcquired));
                }
                on_wait(&Waiting::Behind {
                    key: String::from_utf8_lossy(pred.key()).into_owned(),
                    value: pred.value().to_vec(),
                });
                match self
                    .wait_for_delete(&mut client, pred.key().to_vec(), rev, &mut lease_rx)
                    .await?
                {
                    Some(outcome) => return Ok(Some(outcome)),
                    None => continue,
                }
            }
            // First in line: confirm, and respect the kill switch. The same read tells
            // whether a younger candidate of higher priority waits behind us.
            let confirm = Txn::new()
                .when([
                    Compare::create_revision(key.clone(), CompareOp::Equal, my_rev),
                    Compare::version(self.election.paused_key(), CompareOp::Equal, 0),
                ])
                .and_then([TxnOp::get(
                    self.election.priority_prefix(),
                    Some(GetOptions::new().with_prefix()),
                )])
                .or_else([
                    TxnOp::get(key.clone(), None),
                    TxnOp::get(self.election.paused_key(), None),
                ]);
            let resp = bounded(self.timeout, "etcd", client.txn(confirm)).await?;
            if resp.succeeded() {
                if !must_yield(&resp.op_responses(), my_rev, self.priority) {
                    return Ok(Some(Outcome::Elected { token: my_rev, key }));
                }
                // Out of line; the next creation puts us behind the one we let pass.
                let leave = Txn::new()
                    .when([Compare::create_revision(
                        key.clone(),
                        CompareOp::Equal,
                        my_rev,
                    )])
                    .and_then([TxnOp::delete(key.clone(), None)]);
                bounded(self.timeout, "etcd", client.txn(leave)).await?;
                return Ok(None);
            }
            let ops = resp.op_responses();
            if existing_create_revision(&ops[..1]) != Some(my_rev) {
                return Ok(Some(Outcome::Lost(Loss::KeyDeleted)));
            }
            if self.wait == Wait::No {
                return Ok(Some(Outcome::NotAcquired));
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
                return Ok(Some(outcome));
            }
        }
    }

    /// Asks the leader to hand over if its priority is below ours: a resign request naming its
    /// token, written only while it still leads with that token and the election is not
    /// paused. Best effort: a leader that already left needs no request, and a lower-priority
    /// head that has not confirmed yet lets us pass by itself.
    async fn ask_for_handover(&self, client: &mut Client) {
        let head = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let ask = async {
            let resp = bounded(
                self.timeout,
                "etcd",
                client.get(self.election.candidates(), Some(head)),
            )
            .await?;
            let Some(leader) = resp.kvs().first() else {
                return Ok(());
            };
            let who = Candidate::parse(leader.value());
            if leader.lease() == self.lease.id || who.priority >= self.priority {
                return Ok(());
            }
            let me = Candidate::parse(self.value.as_bytes());
            let token = leader.create_revision();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(leader.key(), CompareOp::Equal, token),
                    Compare::version(self.election.paused_key(), CompareOp::Equal, 0),
                ])
                .and_then([TxnOp::put(
                    self.election.resign_key(),
                    super::leader::preempt_request(token, self.priority, &me.id),
                    Some(PutOptions::new().with_lease(leader.lease())),
                )]);
            if bounded(self.timeout, "etcd", client.txn(txn))
                .await?
                .succeeded()
            {
                tracing::info!(
                    election = self.election.name(),
                    priority = self.priority,
                    "asked {} (priority {}, token {token}) to hand over",
                    who.id,
                    who.priority
                );
                crate::metrics::preemption_requested();
            }
            anyhow::Ok(())
        };
        if let Err(e) = ask.await {
            tracing::warn!(
                election = self.election.name(),
                "could not ask the leader to hand over: {e:#}"
            );
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

/// Whether a candidate younger than us (a priority key written after our key) has a higher
/// priority than ours.
fn must_yield(ops: &[TxnOpResponse], my_rev: i64, mine: u32) -> bool {
    let Some(TxnOpResponse::Get(g)) = ops.first() else {
        return false;
    };
    let others = g.kvs().iter().map(|kv| (kv.mod_revision(), kv.value()));
    outranked(others, my_rev, mine)
}

/// Whether any (priority key's revision, value) is younger than `my_rev` and above `mine`.
fn outranked<'a>(
    mut others: impl Iterator<Item = (i64, &'a [u8])>,
    my_rev: i64,
    mine: u32,
) -> bool {
    others.any(|(rev, value)| {
        rev > my_rev
            && std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
                .is_some_and(|p| p > mine)
    })
}

fn existing_create_revision(ops: &[TxnOpResponse]) -> Option<i64> {
    ops.iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_younger_candidate_of_higher_priority_is_let_pass() {
        let yields = |others: &[(i64, &str)], mine| {
            outranked(others.iter().map(|(r, v)| (*r, v.as_bytes())), 10, mine)
        };
        assert!(yields(&[(11, "5")], 0));
        assert!(!yields(&[(11, "5")], 5), "equal priorities never pass");
        assert!(!yields(&[(9, "50")], 0), "an older one is behind no one");
        assert!(!yields(&[(10, "50")], 0), "our own key");
        assert!(!yields(&[(11, "garbage")], 0));
        assert!(!yields(&[], 0));
        assert!(yields(&[(9, "1"), (12, "3")], 2));
    }
}
