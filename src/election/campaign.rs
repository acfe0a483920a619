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
//! # Slots
//!
//! With `--slots N` the N keys with the lowest create revisions hold, and a candidate holds
//! once fewer than N older keys exist. That stays true while its key lives, as "no older key"
//! does for N = 1: every key created later gets a larger create revision, so the set of older
//! keys only shrinks. The creating transaction reads the first N keys, and a waiting candidate
//! watches the whole candidate prefix for deletes and recounts on each: with N > 1 any delete
//! may free a place, so every waiting candidate wakes on every delete. That fan-out is the
//! cost of slots, and why N = 1 keeps watching only its predecessor.
//!
//! A holder then claims the lowest free slot key `lead-exec/meta/NAME/slot/<i>` on its lease,
//! which gives the job `LEAD_EXEC_SLOT`. Every candidate must run with the same N: the
//! creating transaction compares it with `lead-exec/meta/NAME/slots`, which only a candidate
//! that finds no other candidate may rewrite.
//!
//! # Priority
//!
//! `--priority` changes who gets there first, never the rule itself (only the oldest key may
//! lead, which is what makes leadership exclusive). A candidate with priority P > 0 puts
//! `meta/NAME/priority/<lease hex>` = P beside its key and asks a lower-priority leader to hand
//! over (a resign request naming its token, see [`super::leader::preempt_request`]). At the
//! head of the line, a candidate that sees a younger candidate of higher priority lets it pass:
//! it deletes its key and queues again, behind it. Equal priorities never pass or preempt each
//! other, and the leader hands over only after its job's `--min-term` and only if a
//! higher-priority candidate is still in line then (see
//! [`super::leader::outranked_in_line`]), so nothing loops.
//!
//! Every candidate must also agree on `--takeover-delay`, kept in
//! `lead-exec/meta/NAME/takeover-delay` as the slot count is: the next leader judges a term
//! by the start record that only a worker with a delay writes before its job.

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
use crate::exit::{fail, Exit};

/// How a campaign ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// We lead, confirmed. `token` is our key's create revision; `slot` is ours among the
    /// holders (0 when there is one slot).
    Elected { token: i64, key: String, slot: u32 },
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
    /// The client's router: its pin moves strand our watches.
    pub router: &'a crate::etcd::failover::Router,
    pub election: &'a Election,
    pub lease: &'a Lease,
    /// The candidate key's value (see [`super::Candidate`]).
    pub value: String,
    pub wait: Wait,
    /// When `--wait` gives up, if it does.
    pub give_up_at: Option<Instant>,
    pub timeout: Duration,
    /// `--slots`: how many candidates hold at once.
    pub slots: u32,
    /// `--priority` (only with one slot).
    pub priority: u32,
    /// `--takeover-delay` (only with one slot); every candidate must agree on it.
    pub takeover_delay: Duration,
    /// Set when this candidate turned a takeover delay on, for an election whose earlier
    /// terms ran without one: their workers wrote no start record before their jobs, so the
    /// history cannot say how the last of them ended.
    pub delay_turned_on: std::sync::atomic::AtomicBool,
}

/// Why we are still waiting, for logs and `sd_notify` status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    Behind {
        key: String,
        value: Vec<u8>,
    },
    /// Every slot is held by an older candidate (`ahead` of them, at least N).
    SlotsFull {
        ahead: usize,
    },
    /// We hold, but every slot key is still taken (a holder whose key went is draining).
    SlotKeysTaken,
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
        let (created, my_rev) = self.create(&mut client, &key).await?;
        tracing::debug!(key, my_rev, "candidate key created");
        let mut lease_rx = self.lease.subscribe();
        if created.is_some_and(|ops| holds_unpaused(&ops, my_rev)) {
            return self
                .elected(&mut client, key, my_rev, &mut lease_rx, on_wait)
                .await
                .map(Some);
        }
        if self.priority > 0 {
            self.ask_for_handover(&mut client).await;
        }

        loop {
            if let LeaseState::Lost(r) = *lease_rx.borrow() {
                return Ok(Some(Outcome::Lost(r)));
            }
            // The older keys, nearest first, as many as can keep us out. With their values:
            // one of them may be ours, from a campaign whose outcome we never heard.
            let opts = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(my_rev - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(i64::from(self.slots));
            let prefix = self.election.candidates();
            let resp = patient(self.timeout, || {
                let (mut c, opts, prefix) = (client.clone(), opts.clone(), prefix.clone());
                async move { c.get(prefix, Some(opts)).await }
            })
            .await?;
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            let older = resp.kvs();
            if self.revoke_orphans(older).await? {
                continue;
            }
            if !may_hold(older.len(), self.slots) {
                if self.wait == Wait::No {
                    return Ok(Some(Outcome::NotAcquired));
                }
                // One slot: wait for the predecessor only. Several: any delete may free one.
                let (watched, prefix) = if self.slots == 1 {
                    let pred = &older[0];
                    on_wait(&Waiting::Behind {
                        key: String::from_utf8_lossy(pred.key()).into_owned(),
                        value: pred.value().to_vec(),
                    });
                    (pred.key().to_vec(), false)
                } else {
                    on_wait(&Waiting::SlotsFull { ahead: older.len() });
                    (self.election.candidates().into_bytes(), true)
                };
                match self
                    .wait_for_delete(&mut client, watched, prefix, rev, &mut lease_rx)
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
            let resp = patient(self.timeout, || {
                let (mut c, t) = (client.clone(), confirm.clone());
                async move { c.txn(t).await }
            })
            .await?;
            if resp.succeeded() && must_yield(&resp.op_responses(), my_rev, self.priority) {
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
            if resp.succeeded() {
                return self
                    .elected(&mut client, key, my_rev, &mut lease_rx, on_wait)
                    .await
                    .map(Some);
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
                    false,
                    rev,
                    &mut lease_rx,
                )
                .await?
            {
                return Ok(Some(outcome));
            }
        }
    }

    /// Creates our key, only if absent and only if the election runs with our slot count, and
    /// reads in the same transaction the head of the line and the pause switch, so that an
    /// uncontended candidate is confirmed by this one round trip. Returns those reads (`None`
    /// when an earlier attempt had created the key) and our key's create revision.
    async fn create(
        &self,
        client: &mut Client,
        key: &str,
    ) -> Result<(Option<Vec<TxnOpResponse>>, i64)> {
        let e = self.election;
        let head = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(i64::from(self.slots))
            .with_keys_only();
        let mut then = vec![
            TxnOp::put(
                key,
                self.value.clone(),
                Some(PutOptions::new().with_lease(self.lease.id)),
            ),
            TxnOp::get(e.candidates(), Some(head)),
            TxnOp::get(e.paused_key(), Some(GetOptions::new().with_count_only())),
        ];
        if self.priority > 0 {
            // Same transaction, so its mod revision is our key's create revision: others tell
            // by it whether we are younger than they are.
            then.push(TxnOp::put(
                e.priority_key(self.lease.id),
                self.priority.to_string(),
                Some(PutOptions::new().with_lease(self.lease.id)),
            ));
        }
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
            let resp = bounded(self.timeout, "etcd", client.txn(create.clone())).await?;
            let ops = resp.op_responses();
            if resp.succeeded() {
                break (resp, ops);
            }
            // Created by an earlier attempt whose answer was lost: it passed the checks then.
            if let Some(rev) = existing_create_revision(&ops[..1]) {
                return Ok((None, rev));
            }
            let had_delay = matches!(ops.get(2), Some(TxnOpResponse::Get(g)) if g.count() > 0);
            let resp = bounded(self.timeout, "etcd", client.txn(reset.clone())).await?;
            let ops = resp.op_responses();
            if resp.succeeded() {
                if !had_delay && agreed.delay.is_some() {
                    self.delay_turned_on
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                tracing::info!(
                    election = e.name(),
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
        Ok((Some(ops), my_rev))
    }

    /// A confirmed holder: with one slot it is slot 0; with more it claims the lowest free
    /// slot key, waiting (bounded by the lease and `--wait`) while every one is taken.
    async fn elected(
        &self,
        client: &mut Client,
        key: String,
        token: i64,
        lease_rx: &mut watch::Receiver<LeaseState>,
        on_wait: &mut impl FnMut(&Waiting),
    ) -> Result<Outcome> {
        if self.slots == 1 {
            return Ok(Outcome::Elected {
                token,
                key,
                slot: 0,
            });
        }
        let e = self.election;
        loop {
            if let LeaseState::Lost(r) = *lease_rx.borrow() {
                return Ok(Outcome::Lost(r));
            }
            let opts = GetOptions::new().with_prefix().with_keys_only();
            let resp = bounded(
                self.timeout,
                "etcd",
                client.get(e.slot_prefix(), Some(opts)),
            )
            .await?;
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            let prefix = e.slot_prefix();
            let taken: Vec<u32> = resp
                .kvs()
                .iter()
                .filter_map(|kv| {
                    std::str::from_utf8(kv.key())
                        .ok()?
                        .strip_prefix(&prefix)?
                        .parse()
                        .ok()
                })
                .collect();
            let Some(slot) = lowest_free(&taken, self.slots) else {
                if self.wait == Wait::No {
                    return Ok(Outcome::NotAcquired);
                }
                on_wait(&Waiting::SlotKeysTaken);
                let watched = prefix.into_bytes();
                match self
                    .wait_for_delete(client, watched, true, rev, lease_rx)
                    .await?
                {
                    Some(outcome) => return Ok(outcome),
                    None => continue,
                }
            };
            let claim = Txn::new()
                .when([
                    Compare::create_revision(key.clone(), CompareOp::Equal, token),
                    Compare::version(e.slot_key(slot), CompareOp::Equal, 0),
                ])
                .and_then([TxnOp::put(
                    e.slot_key(slot),
                    token.to_string(),
                    Some(PutOptions::new().with_lease(self.lease.id)),
                )])
                .or_else([TxnOp::get(
                    key.clone(),
                    Some(GetOptions::new().with_keys_only()),
                )]);
            let resp = bounded(self.timeout, "etcd", client.txn(claim)).await?;
            if resp.succeeded() {
                return Ok(Outcome::Elected { token, key, slot });
            }
            if existing_create_revision(&resp.op_responses()) != Some(token) {
                return Ok(Outcome::Lost(Loss::KeyDeleted));
            }
            // Another holder took that slot first: look again.
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
            let txn = super::leader::request_txn(
                self.election,
                leader.key(),
                token,
                leader.lease(),
                super::leader::preempt_request(token, self.priority, &me.id),
            );
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

    /// Revokes the leases of older keys that this process created on leases it no longer
    /// holds: a campaign whose creating transaction was applied but whose answer was lost,
    /// or a revoke that did not get through. Such a key would keep us waiting behind
    /// ourselves until its lease expires. `true` when one was revoked (read the line again).
    async fn revoke_orphans(&self, older: &[etcd_client::KeyValue]) -> Result<bool> {
        let me = Candidate::parse(self.value.as_bytes());
        let mut revoked = false;
        for kv in older {
            // Ours are always on a lease; a key without one was put by someone else.
            let ours = kv.lease() != 0 && me.same_process(&Candidate::parse(kv.value()));
            if !ours || kv.lease() == self.lease.id {
                continue;
            }
            let lease = kv.lease();
            tracing::info!(
                election = self.election.name(),
                key = %String::from_utf8_lossy(kv.key()),
                "a key of ours from an earlier campaign is still in line; revoking its lease"
            );
            let gone: Result<()> = patient(self.timeout, || {
                let mut c = self.client.clone();
                async move {
                    match c.lease_revoke(lease).await {
                        Err(e) if super::lease::says_gone(&e) => Ok(()),
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

    /// Waits until `key` (every key under it, with `prefix`) is deleted after revision `rev`.
    /// `None` means: look again (deleted, or the watch broke and a fresh read must decide).
    async fn wait_for_delete(
        &self,
        client: &mut Client,
        key: Vec<u8>,
        prefix: bool,
        rev: i64,
        lease_rx: &mut watch::Receiver<LeaseState>,
    ) -> Result<Option<Outcome>> {
        // Subscribed before the watch opens: a pin move while it opens would leave the watch
        // on the endpoint just left, with nothing to tell us.
        let mut moves = self.router.moves();
        let opts = WatchOptions::new()
            .with_start_revision(rev + 1)
            .with_filters([WatchFilterType::NoPut]);
        let opts = if prefix { opts.with_prefix() } else { opts };
        let mut stream =
            match tokio::time::timeout(self.timeout, client.watch(key, Some(opts))).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    let e = classify(e);
                    if crate::exit::exit_of(&e) != Exit::Unavailable {
                        return Err(e);
                    }
                    // The read that follows waits out the trouble (see `patient`).
                    tokio::time::sleep(RETRY_PAUSE).await;
                    return Ok(None);
                }
                Err(_) => return Ok(None),
            };
        let give_up = crate::clock::until(self.give_up_at);
        tokio::pin!(give_up);
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

/// Pause between tries of a request that found etcd unavailable.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Runs an etcd request that is safe to repeat (a read, a compare-and-read, a guarded
/// delete, a revoke), again after each `Unavailable` failure, until it succeeds or `timeout`
/// has passed since the first try. A waiting candidate keeps its place in line through an
/// etcd leader election or a failover this way, instead of giving it up on one failed read.
async fn patient<T, F, Fut>(timeout: Duration, mut request: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let until = Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let e = match bounded(left.max(RETRY_PAUSE), "etcd", request()).await {
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
fn holds_unpaused(ops: &[TxnOpResponse], my_rev: i64) -> bool {
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

/// Whether a candidate with `older` keys created before its own may hold one of `slots`.
/// Safe to act on once true: no key created later can be older, so `older` only shrinks.
pub fn may_hold(older: usize, slots: u32) -> bool {
    older < slots as usize
}

/// The lowest slot index below `slots` that no key in `taken` holds.
pub fn lowest_free(taken: &[u32], slots: u32) -> Option<u32> {
    (0..slots).find(|i| !taken.contains(i))
}

/// What a candidate's settings store in the election's meta keys; `None` is the default,
/// stored as an absent key (as before the key existed).
struct Agreed {
    /// `meta/NAME/slots`: N when above 1.
    slots: Option<String>,
    /// `meta/NAME/takeover-delay`: milliseconds, when above 0.
    delay: Option<String>,
}

impl Campaign<'_> {
    fn agreed(&self) -> Agreed {
        // Rounded up: any delay at all writes the start record first, which is what must agree.
        let ms = self.takeover_delay.as_nanos().div_ceil(1_000_000);
        Agreed {
            slots: (self.slots > 1).then(|| self.slots.to_string()),
            delay: (ms > 0).then(|| ms.to_string()),
        }
    }
}

/// The compare that holds when meta key `key` stores `value` (absent for `None`).
fn agree(key: String, value: &Option<String>) -> Compare {
    match value {
        None => Compare::version(key, CompareOp::Equal, 0),
        Some(v) => Compare::value(key, CompareOp::Equal, v.clone()),
    }
}

/// Whether a stored meta value is the one we would store.
fn same(stored: &Option<Vec<u8>>, ours: &Option<String>) -> bool {
    stored.as_deref() == ours.as_ref().map(|v| v.as_bytes())
}

/// Refuses a candidate whose `--slots` differs from the one the election's candidates run
/// with (`stored`, absent meaning 1): two counts at once would let more jobs run than either
/// allows.
fn disagree(e: &Election, stored: Option<&[u8]>, ours: u32) -> anyhow::Error {
    let theirs = stored.map_or_else(|| "1".into(), String::from_utf8_lossy);
    fail(
        Exit::Usage,
        format!(
            "election {} runs with --slots {theirs}; this worker has --slots {ours}: all candidates of an election must agree (stop them all to change it)",
            e.name()
        ),
    )
}

/// Refuses a candidate whose `--takeover-delay` differs from the election's (`stored`, in
/// milliseconds, absent meaning none). The next leader judges a term by its start record,
/// which only a worker with a delay writes before its job: a worker without one, leading
/// among workers with one, could leave a job that ran with no record to judge.
fn disagree_delay(e: &Election, stored: Option<&[u8]>, ours: Duration) -> anyhow::Error {
    let theirs = stored
        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    fail(
        Exit::Usage,
        format!(
            "election {} runs with --takeover-delay {}; this worker has --takeover-delay {}: all candidates of an election must agree (stop them all to change it)",
            e.name(),
            crate::clock::human(theirs),
            crate::clock::human(ours)
        ),
    )
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

    #[test]
    fn a_candidate_holds_once_fewer_than_n_keys_are_older() {
        assert!(may_hold(0, 1));
        assert!(!may_hold(1, 1));
        assert!(may_hold(2, 3));
        assert!(!may_hold(3, 3));
        assert!(
            !may_hold(4, 3),
            "a read of more keys than asked for still keeps us out"
        );
    }

    #[test]
    fn the_lowest_free_slot_is_claimed() {
        assert_eq!(lowest_free(&[], 3), Some(0));
        assert_eq!(lowest_free(&[0, 2], 3), Some(1));
        assert_eq!(lowest_free(&[1, 0], 3), Some(2));
        assert_eq!(lowest_free(&[0, 1, 2], 3), None);
        assert_eq!(lowest_free(&[5, 0], 2), Some(1), "keys past N are ignored");
    }

    #[test]
    fn a_takeover_delay_disagreement_names_both_delays_and_is_a_usage_error() {
        let e = Election::new("settle").unwrap();
        let err = disagree_delay(&e, Some(b"2000"), Duration::ZERO);
        assert_eq!(crate::exit::exit_of(&err), Exit::Usage);
        assert_eq!(
            err.to_string(),
            "election settle runs with --takeover-delay 2s; this worker has --takeover-delay 0s: all candidates of an election must agree (stop them all to change it)"
        );
        assert!(disagree_delay(&e, None, Duration::from_millis(1500))
            .to_string()
            .contains("runs with --takeover-delay 0s; this worker has --takeover-delay 1s 500ms"));
        assert!(same(&None, &None));
        assert!(same(&Some(b"2000".to_vec()), &Some("2000".into())));
        assert!(!same(&None, &Some("2000".into())));
        assert!(!same(&Some(b"2000".to_vec()), &None));
    }

    #[test]
    fn a_disagreement_names_both_counts_and_is_a_usage_error() {
        let e = Election::new("settle").unwrap();
        let err = disagree(&e, Some(b"3"), 2);
        assert_eq!(crate::exit::exit_of(&err), Exit::Usage);
        assert_eq!(
            err.to_string(),
            "election settle runs with --slots 3; this worker has --slots 2: all candidates of an election must agree (stop them all to change it)"
        );
        assert!(disagree(&e, None, 2)
            .to_string()
            .contains("runs with --slots 1;"));
    }
}
