//! The etcd requests of the protocol: create our key if absent, wait for a key ahead to go,
//! and retry what is safe to retry. The order they run in is [`super::Campaign::run`]'s.

use std::time::Duration;

use crate::etcd::Client;
use anyhow::Result;
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::settings::{agree, disagree, disagree_delay, same};
use super::{Campaign, Joining, Learned, Outcome};
use crate::election::lease::Loss;
use crate::election::Candidate;
use crate::etcd::{bounded, classify};
use crate::exit::Exit;

/// What the creating transaction answered, when it created our key.
pub struct Created {
    /// Its reads, in the order `Joining::create` makes them.
    pub ops: Vec<TxnOpResponse>,
    /// When our key was written as elected (see [`Candidate::elected_ms`]), if it was.
    pub elected_ms: Option<u64>,
}

impl Joining<'_> {
    /// Our key's value, marked as elected at `elected_ms` (see [`Candidate::elected_ms`]).
    pub(super) fn elected_value(&self, elected_ms: u64) -> String {
        Candidate {
            elected_ms: Some(elected_ms),
            ..Candidate::parse(self.value.as_bytes())
        }
        .encode()
    }

    /// Creates our key, only if absent and only if the election runs with our slot count, and
    /// reads in the same transaction the head of the line and the pause switch, so that an
    /// uncontended candidate is confirmed by this one round trip. With one slot, the key's
    /// value then says so (`elected_ms`), decided by a transaction nested in this one whose
    /// compares see the same state as the reads. Returns those reads (`None` when an earlier
    /// attempt had created the key) and our key's create revision.
    pub(super) async fn create(
        &self,
        lease: i64,
        learned: &mut Learned,
    ) -> Result<(Option<Created>, i64)> {
        let (e, client) = (self.election, &mut self.client.clone());
        let key = e.candidate_key(lease);
        let key = key.as_str();
        let head = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(i64::from(self.slots))
            .with_keys_only();
        let put = |value: String| TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)));
        let elected_ms = crate::election::unix_ms();
        let create_key = if self.slots == 1 {
            // Evaluated with the outer compares, before any write: no key in line (ours is
            // not there yet) and no pause is exactly "the head read below finds us and no
            // pause" (`holds_unpaused`), which confirms this candidate.
            TxnOp::txn(
                Txn::new()
                    .when([
                        Compare::version(e.candidates(), CompareOp::Equal, 0).with_prefix(),
                        Compare::version(e.paused_key(), CompareOp::Equal, 0),
                    ])
                    .and_then([put(self.elected_value(elected_ms))])
                    .or_else([put(self.value.to_string())]),
            )
        } else {
            put(self.value.to_string())
        };
        let mut then = vec![
            create_key,
            TxnOp::get(e.candidates(), Some(head)),
            TxnOp::get(e.paused_key(), Some(GetOptions::new().with_count_only())),
        ];
        if self.priority > 0 {
            // Same transaction, so its mod revision is our key's create revision: others tell
            // by it whether we are younger than they are.
            then.push(TxnOp::put(
                e.priority_key(lease),
                self.priority.to_string(),
                Some(PutOptions::new().with_lease(lease)),
            ));
        }
        // Last: the newest history keys, which a term that this transaction confirms trims
        // by at its end, with no read of its own (see `history::trim_from_newest`).
        let newest = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Key, SortOrder::Descend)
            .with_limit(i64::from(self.history_keep.max(1)));
        then.push(TxnOp::get(e.history_prefix(), Some(newest)));
        let absent = Compare::create_revision(key, CompareOp::Equal, 0);
        let agreed = self.agreed();
        let create = Txn::new()
            .when([
                absent.clone(),
                agree(e.slots_key(), &agreed.slots),
                agree(e.takeover_delay_key(), &agreed.delay),
            ])
            .and_then(then.clone())
            .or_else([
                TxnOp::get(key, None),
                TxnOp::get(e.slots_key(), None),
                TxnOp::get(e.takeover_delay_key(), None),
            ]);
        // Nobody else is in the election: its settings are ours to set, in the same
        // transaction that makes us its first candidate.
        let set = |k: String, v: &Option<String>| match v {
            Some(v) => TxnOp::put(k, v.clone(), None),
            None => TxnOp::delete(k, None),
        };
        let sets = vec![
            set(e.slots_key(), &agreed.slots),
            set(e.takeover_delay_key(), &agreed.delay),
        ];
        let empty = Compare::version(e.candidates(), CompareOp::Equal, 0).with_prefix();
        let reset = Txn::new()
            .when([absent, empty])
            .and_then([sets, then.to_vec()].concat())
            .or_else([
                TxnOp::get(e.slots_key(), None),
                TxnOp::get(e.takeover_delay_key(), None),
            ]);
        // A retry only follows a concurrent change: candidates that arrived together on an
        // empty election with the same count, one of which set it first.
        let mut attempts = 0;
        let (resp, ops) = loop {
            attempts += 1;
            let resp = bounded(self.timeout, client.txn(create.clone())).await?;
            let ops = resp.op_responses();
            if resp.succeeded() {
                break (resp, ops);
            }
            // Created by an earlier attempt whose answer was lost: it passed the checks then.
            if let Some(rev) = existing_create_revision(&ops[..1]) {
                return Ok((None, rev));
            }
            let had_delay = matches!(ops.get(2), Some(TxnOpResponse::Get(g)) if g.count() > 0);
            let resp = bounded(self.timeout, client.txn(reset.clone())).await?;
            let ops = resp.op_responses();
            if resp.succeeded() {
                if !had_delay && agreed.delay.is_some() {
                    learned.delay_turned_on = true;
                }
                tracing::info!(
                    slots = self.slots,
                    takeover_delay = %crate::clock::human(self.takeover_delay),
                    "no other candidate: the election now runs with these settings"
                );
                // The rewrites went first: the rest answer as in the creating transaction.
                break (resp, ops[2..].to_vec());
            }
            let stored = |i: usize| match ops.get(i) {
                Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            };
            let (slots, delay) = (stored(0), stored(1));
            if !same(&slots, &agreed.slots) {
                return Err(disagree(e, slots.as_deref(), self.slots));
            }
            if !same(&delay, &agreed.delay) {
                return Err(disagree_delay(e, delay.as_deref(), self.takeover_delay));
            }
            if attempts >= 3 {
                return Err(disagree(e, slots.as_deref(), self.slots));
            }
        };
        let my_rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        anyhow::ensure!(
            my_rev > 0,
            "etcd returned no revision for our candidate key"
        );
        let marked = matches!(ops.first(), Some(TxnOpResponse::Txn(t)) if t.succeeded());
        let elected_ms = marked.then_some(elected_ms);
        Ok((Some(Created { ops, elected_ms }), my_rev))
    }
}

impl Campaign<'_> {
    /// First in line: confirms that our key still has create revision `my_rev` and that the
    /// election is not paused. The same read tells whether a younger candidate of higher
    /// priority waits behind us (see [`super::priority::must_yield`]); on failure it reads our
    /// key and the pause switch instead. With one slot, the same transaction marks our key as
    /// elected at `elected_ms` (see [`Candidate::elected_ms`]): a candidate that then lets
    /// one of higher priority pass deletes the key it marked.
    pub(super) async fn confirm(
        &self,
        client: &Client,
        key: &str,
        my_rev: i64,
        elected_ms: u64,
    ) -> Result<TxnResponse> {
        let mut then = vec![TxnOp::get(
            self.line.election.priority_prefix(),
            Some(GetOptions::new().with_prefix()),
        )];
        if self.line.slots == 1 {
            then.push(TxnOp::put(
                key,
                self.line.elected_value(elected_ms),
                Some(PutOptions::new().with_lease(self.lease.id)),
            ));
        }
        let confirm = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, my_rev),
                Compare::version(self.line.election.paused_key(), CompareOp::Equal, 0),
            ])
            .and_then(then)
            .or_else([
                TxnOp::get(key, None),
                TxnOp::get(self.line.election.paused_key(), None),
            ]);
        patient(self.line.timeout, || {
            let (mut c, t) = (client.clone(), confirm.clone());
            async move { c.txn(t).await }
        })
        .await
    }

    /// Revokes the leases of older keys that this process created on leases it no longer
    /// holds: a campaign whose creating transaction was applied but whose answer was lost,
    /// or a revoke that did not get through. Such a key would keep us waiting behind
    /// ourselves until its lease expires. `true` when one was revoked (read the line again).
    pub(super) async fn revoke_orphans(&self, older: &[KeyValue]) -> Result<bool> {
        let me = Candidate::parse(self.line.value.as_bytes());
        let mut revoked = false;
        for kv in older {
            // Ours are always on a lease; a key without one was put by someone else.
            let ours = kv.lease() != 0 && me.same_process(&Candidate::parse(kv.value()));
            if !ours || kv.lease() == self.lease.id {
                continue;
            }
            let lease = kv.lease();
            tracing::info!(
                key = %String::from_utf8_lossy(kv.key()),
                "a key of ours from an earlier campaign is still in line; revoking its lease"
            );
            let gone: Result<()> = patient(self.line.timeout, || {
                let mut c = self.line.client.clone();
                async move {
                    match c.lease_revoke(lease).await {
                        Err(e) if crate::election::lease::says_gone(&e) => Ok(()),
                        r => r.map(|_| ()),
                    }
                }
            })
            .await;
            gone?;
            revoked = true;
        }
        Ok(revoked)
    }

    /// Waits until `key` (every key under it, with `prefix`) is deleted after revision `rev`,
    /// or, for the one candidate key we wait behind, until it is marked elected: its holder
    /// then is the one just ahead of us, and we are next in line (see [`Woke::LookAgain`]).
    pub(super) async fn wait_for_delete(
        &self,
        client: &mut Client,
        key: Vec<u8>,
        prefix: bool,
        rev: i64,
        lease_rx: &mut watch::Receiver<Option<Loss>>,
        learned: &mut Learned,
    ) -> Result<Woke> {
        // Subscribed before the watch opens: a pin move while it opens would leave the watch
        // on the endpoint just left, with nothing to tell us.
        let mut moves = self.router.moves();
        // A resume is not a holder's end: only a candidate or slot key's deletion times a handover.
        let holder = key != self.line.election.paused_key().as_bytes();
        // The key ahead is put again once, when its candidate is confirmed elected (with one
        // slot, see `confirm`): with the value it replaces, to tell that put from others.
        let opts = WatchOptions::new().with_start_revision(rev + 1);
        let opts = if prefix {
            opts.with_prefix().with_filters([WatchFilterType::NoPut])
        } else if holder {
            opts.with_prev_key()
        } else {
            opts.with_filters([WatchFilterType::NoPut])
        };
        let mut stream =
            match tokio::time::timeout(self.line.timeout, client.watch(key, Some(opts))).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    let e = classify(e);
                    if crate::exit::exit_of(&e) != Exit::Unavailable {
                        return Err(e);
                    }
                    // The read that follows waits out the trouble (see `patient`).
                    tokio::time::sleep(RETRY_PAUSE).await;
                    return Ok(Woke::LookAgain);
                }
                Err(_) => return Ok(Woke::LookAgain),
            };
        let give_up = crate::clock::until(self.give_up_at);
        tokio::pin!(give_up);
        loop {
            tokio::select! {
                // The watch may sit on the endpoint just left: a fresh read decides.
                _ = crate::etcd::failover::moved(&mut moves) => return Ok(Woke::LookAgain),
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        if resp.canceled() || resp.compact_revision() != 0 {
                            // Compacted past our revision: a fresh read decides.
                            return Ok(Woke::LookAgain);
                        }
                        if resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
                            if holder {
                                learned.predecessor_gone = Some(std::time::Instant::now());
                            }
                            return Ok(Woke::Deleted);
                        }
                        // Only the put that marks a lead-exec candidate elected, over a value
                        // without the mark: a value put by anyone else (an `etcdctl elect`
                        // leader's proclaim, one put again over a mark) changes nothing about
                        // our place, and must not wake us each time.
                        let marked = |kv: &etcd_client::KeyValue| {
                            Candidate::parse(kv.value()).elected_ms.is_some()
                        };
                        let elected = |e: &etcd_client::Event| {
                            e.kv().is_some_and(marked) && !e.prev_kv().is_some_and(marked)
                        };
                        if resp.events().iter().any(elected) {
                            return Ok(Woke::LookAgain);
                        }
                    }
                    Ok(None) | Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        return Ok(Woke::LookAgain);
                    }
                },
                changed = lease_rx.changed() => {
                    if changed.is_err() {
                        return Ok(Woke::Outcome(Outcome::Lost(Loss::Deadline)));
                    }
                    if let Some(r) = *lease_rx.borrow() {
                        return Ok(Woke::Outcome(Outcome::Lost(r)));
                    }
                }
                _ = &mut give_up => return Ok(Woke::Outcome(Outcome::NotAcquired)),
            }
        }
    }
}

/// How a wait in line ended.
pub(super) enum Woke {
    /// With the campaign's outcome: the lease lost, or `--wait` over.
    Outcome(Outcome),
    /// A key we waited on was deleted: our place may have moved up, or be ours.
    Deleted,
    /// The key ahead was marked elected by its lead-exec candidate (we are next in line
    /// now), or the watch broke or sits on an endpoint just left: a fresh read decides.
    LookAgain,
}

/// Pause between tries of a request that found etcd unavailable.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Runs an etcd request that is safe to repeat (a read, a compare-and-read, a guarded
/// delete, a revoke), again after each `Unavailable` failure, until it succeeds or `timeout`
/// has passed since the first try. A waiting candidate keeps its place in line through an
/// etcd leader election or a failover this way, instead of giving it up on one failed read.
pub(super) async fn patient<T, F, Fut>(timeout: Duration, mut request: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let until = Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let e = match bounded(left.max(RETRY_PAUSE), request()).await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if crate::exit::exit_of(&e) != Exit::Unavailable || Instant::now() + RETRY_PAUSE >= until {
            return Err(e);
        }
        tracing::debug!("etcd request failed, trying again: {e:#}");
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// Whether the creating transaction saw our key among the first N of the line (the head
/// was read with limit N) and no pause.
pub(super) fn holds_unpaused(ops: &[TxnOpResponse], my_rev: i64) -> bool {
    let holds = match ops.get(1) {
        Some(TxnOpResponse::Get(g)) => g.kvs().iter().any(|kv| kv.create_revision() == my_rev),
        _ => false,
    };
    let paused = match ops.get(2) {
        Some(TxnOpResponse::Get(g)) => g.count() > 0,
        _ => true,
    };
    holds && !paused
}

/// The history keys the creating transaction read (its last operation), newest first.
pub(super) fn history_newest(ops: &[TxnOpResponse]) -> Vec<Vec<u8>> {
    match ops.last() {
        Some(TxnOpResponse::Get(g)) => g.kvs().iter().map(|kv| kv.key().to_vec()).collect(),
        _ => Vec::new(),
    }
}

/// The create revision of the key that the first read in `ops` found, if it found one.
pub(super) fn existing_create_revision(ops: &[TxnOpResponse]) -> Option<i64> {
    ops.iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    })
}
