//! The campaign: etcd's election protocol, plus a confirmation before any spawn.
//!
//! 1. Create `PREFIX/<lease hex>` with our lease, only if absent. Its create revision is our
//!    place in line and, if we win, our fencing token.
//! 2. While a key with a lower create revision exists, watch the nearest one until it is
//!    deleted (never poll). Watching only the predecessor keeps a deletion from waking every
//!    candidate at once. Its one put, when its candidate is confirmed elected, wakes only us:
//!    we are next in line then, and read the line again to say so (see [`InLine::next_in_line`]).
//! 3. Confirm in one transaction that our key still has that create revision and that the
//!    election is not paused. A lease that expired while we queued fails here and never spawns.
//!    An uncontended candidate needs no separate confirmation: the transaction that creates its
//!    key also reads the head of the line and the pause switch, atomically.
//!
//! [`protocol`] holds those requests. Two options bend the line without changing its rule:
//! [`slots`] lets the N oldest keys hold instead of the oldest alone, and [`priority`] lets a
//! candidate pass the head of the line to a younger one of higher priority. [`settings`] keeps
//! every candidate of an election on the same `--slots` and `--takeover-delay`.

pub mod priority;
pub mod protocol;
pub mod settings;
pub mod slots;

use std::fmt;
use std::time::Duration;

use crate::etcd::Client;
use anyhow::Result;
use etcd_client::{GetOptions, SortOrder, SortTarget};
use tokio::time::Instant;

use super::lease::{Lease, Loss};
use super::{Candidate, Election};
use priority::must_yield;
pub use protocol::Created;
use protocol::{existing_create_revision, history_newest, holds_unpaused, patient, Woke};
use slots::may_hold;

/// How a campaign ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// We lead, confirmed. `token` is our key's create revision; `slot` is ours among the
    /// holders (0 when there is one slot). `at_creation`: the transaction that created our key
    /// also confirmed us, so the term's state at revision `token` is known (see [`AtCreation`]).
    Elected {
        token: i64,
        key: String,
        slot: u32,
        at_creation: Option<AtCreation>,
        /// When the transaction that elected us also marked our key as elected (its value's
        /// `elected_ms`, see [`Candidate::elected_ms`]), if it did.
        elected_ms: Option<u64>,
    },
    /// Someone else leads and the wait policy gave up.
    NotAcquired,
    /// Our lease or key went away while we waited.
    Lost(Loss),
}

/// What the creating transaction of a candidate that it confirmed read, at revision `token`,
/// atomically with the creation: our key exists, the pause switch is off, and the newest
/// history keys (up to `--history-keep`, newest first) are these. A term needs no read of
/// its own for any of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtCreation {
    pub history_newest: Vec<Vec<u8>>,
}

impl Outcome {
    /// The outcome as known to a transaction that elected us before the slot was claimed:
    /// what the creation read (`seen`), and when it marked our key (`marked`), unless the
    /// slot's claim marked it (more than one slot).
    fn confirmed_by(self, seen: Option<AtCreation>, marked: Option<u64>) -> Outcome {
        match self {
            Outcome::Elected {
                token,
                key,
                slot,
                elected_ms,
                ..
            } => Outcome::Elected {
                token,
                key,
                slot,
                at_creation: seen,
                elected_ms: elected_ms.or(marked),
            },
            other => other,
        }
    }
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
    /// What our key goes in line with.
    pub line: Joining<'a>,
    /// The client's router: its pin moves strand our watches.
    pub router: &'a crate::etcd::failover::Router,
    pub lease: &'a Lease,
    pub wait: Wait,
    /// When `--wait` gives up, if it does.
    pub give_up_at: Option<Instant>,
}

/// What a candidate goes in line with: all a campaign needs but its lease, so that the
/// transaction that puts it in line can go out beside the lease's grant, naming the id the
/// grant asks for (see [`super::lease::Lease::grant`]'s `id`, and lead-exec-safety(7),
/// "Round trips").
pub struct Joining<'a> {
    pub client: &'a Client,
    pub election: &'a Election,
    /// The candidate key's value (see [`super::Candidate`]).
    pub value: &'a str,
    pub timeout: Duration,
    /// `--slots`: how many candidates hold at once.
    pub slots: u32,
    /// `--priority` (only with one slot).
    pub priority: u32,
    /// `--takeover-delay` (only with one slot); every candidate must agree on it.
    pub takeover_delay: Duration,
    /// `--history-keep`: how many history keys the creating transaction reads, newest first.
    pub history_keep: u32,
}

/// What a creating transaction sent ahead of the campaign answered: see [`Campaign::run`].
pub struct Joined {
    pub created: Option<Created>,
    /// Our key's create revision.
    pub rev: i64,
    pub learned: Learned,
}

impl Joining<'_> {
    /// Creates our key on `lease`, as a campaign does first (`create`), for one that follows.
    pub async fn join(&self, lease: i64) -> Result<Joined> {
        let mut learned = Learned::default();
        let (created, rev) = self.create(lease, &mut learned).await?;
        Ok(Joined {
            created,
            rev,
            learned,
        })
    }
}

/// Deletes our key on `lease` if its create revision is still `rev`, with the `--priority`
/// key put beside it: what a creating transaction put in line on a lease the campaign does
/// not keep alive (see [`Joining`]).
pub async fn withdraw(ctx: &super::Ctx, lease: i64, rev: i64) -> Result<()> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let e = &ctx.election;
    let key = e.candidate_key(lease);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
        .and_then([
            TxnOp::delete(key, None),
            TxnOp::delete(e.priority_key(lease), None),
        ]);
    let mut c = ctx.client.clone();
    ctx.bounded(c.txn(txn)).await?;
    Ok(())
}

/// What a campaign learned on its way to the outcome, for the term it may win.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Learned {
    /// This candidate turned a takeover delay on, for an election whose earlier terms ran
    /// without one: their workers wrote no start record before their jobs, so the history
    /// cannot say how the last of them ended.
    pub delay_turned_on: bool,
    /// When the key we last waited behind was deleted (the previous holder's end, or its
    /// lease running out): a handover is timed from here to the job's start.
    pub predecessor_gone: Option<std::time::Instant>,
}

/// Why we are still waiting. Its `Display` is the log line; [`InLine::status`] the shorter
/// `sd_notify` status; [`InLine::next_in_line`] whether a watchdog should stand by for us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InLine {
    Behind {
        key: String,
        value: Vec<u8>,
        /// The key we wait behind is the oldest, the holder's: its end frees our place.
        next: bool,
    },
    /// Every one of `slots` is held by an older candidate (`ahead` of them, at least N).
    SlotsFull {
        ahead: usize,
        slots: u32,
        /// Only the holders are ahead of us: the next slot freed is ours.
        next: bool,
    },
    /// We hold, but every slot key is still taken (a holder whose key went is draining).
    SlotKeysTaken,
    Paused,
    /// At the head of the line, letting a higher-priority candidate pass.
    Yielding,
    /// The key we waited behind is gone (one slot): we look again at our place, and may hold.
    Rechecking,
}

impl fmt::Display for InLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InLine::Behind { value, .. } => {
                write!(f, "waiting behind {}", Candidate::parse(value).id)
            }
            InLine::SlotsFull { ahead, slots, .. } => {
                write!(f, "waiting for one of {slots} slots ({ahead} ahead)")
            }
            InLine::SlotKeysTaken => {
                f.write_str("holding; waiting for a draining holder to free its slot")
            }
            InLine::Paused => f.write_str("election paused; waiting for resume"),
            InLine::Yielding => {
                f.write_str("letting a higher-priority candidate pass; queueing again")
            }
            InLine::Rechecking => f.write_str("the key ahead is gone; checking our place"),
        }
    }
}

impl InLine {
    /// The systemd status text, if this wait changes it.
    pub fn status(&self) -> Option<String> {
        match self {
            InLine::Behind { .. } => Some(self.to_string()),
            InLine::SlotsFull { slots, .. } => Some(format!("waiting for one of {slots} slots")),
            InLine::SlotKeysTaken => Some("waiting for a slot to be freed".into()),
            InLine::Paused => Some("paused".into()),
            InLine::Yielding | InLine::Rechecking => None,
        }
    }

    /// Whether the next place to be freed is ours (`Some(true)`), or not (`Some(false)`), as
    /// far as this wait tells (`None`: it does not). A candidate next in line keeps a watchdog
    /// standing by for its job, so that its handover pays only for the job's exec; one
    /// further back waits without (see lead-exec-operations(7), "Installation").
    pub fn next_in_line(&self) -> Option<bool> {
        match self {
            InLine::Behind { next, .. } | InLine::SlotsFull { next, .. } => Some(*next),
            // Holding already, or the one ahead just went: likely to run next.
            InLine::SlotKeysTaken | InLine::Rechecking => Some(true),
            InLine::Paused | InLine::Yielding => None,
        }
    }
}

impl Campaign<'_> {
    /// Campaigns until an outcome. `joined`: what a creating transaction sent ahead of this
    /// call on our lease answered ([`Joining::join`]), which stands for the first one.
    pub async fn run(
        &self,
        mut joined: Option<Joined>,
        mut on_wait: impl FnMut(&InLine),
    ) -> Result<(Outcome, Learned)> {
        let mut learned = Learned::default();
        loop {
            match self
                .queue_once(joined.take(), &mut on_wait, &mut learned)
                .await?
            {
                Some(outcome) => return Ok((outcome, learned)),
                None => on_wait(&InLine::Yielding),
            }
        }
    }

    /// One place in line: from creating our key to an outcome, or (`None`) to letting a
    /// higher-priority candidate pass.
    async fn queue_once(
        &self,
        joined: Option<Joined>,
        on_wait: &mut impl FnMut(&InLine),
        learned: &mut Learned,
    ) -> Result<Option<Outcome>> {
        let mut client = self.line.client.clone();
        let key = self.line.election.candidate_key(self.lease.id);
        let (created, my_rev) = match joined {
            Some(j) => {
                learned.delay_turned_on |= j.learned.delay_turned_on;
                (j.created, j.rev)
            }
            None => self.line.create(self.lease.id, learned).await?,
        };
        // A new place in line: only a key ahead of this one times our handover.
        learned.predecessor_gone = None;
        tracing::debug!(key, my_rev, "candidate key created");
        let mut lease_rx = self.lease.losses();
        if let Some(c) = created.filter(|c| holds_unpaused(&c.ops, my_rev)) {
            let seen = AtCreation {
                history_newest: history_newest(&c.ops),
            };
            return self
                .claim_slot(&mut client, key, my_rev, &mut lease_rx, on_wait, learned)
                .await
                .map(|o| Some(o.confirmed_by(Some(seen), c.elected_ms)));
        }
        if self.line.priority > 0 {
            self.ask_for_handover(&mut client).await;
        }

        loop {
            if let Some(r) = *lease_rx.borrow() {
                return Ok(Some(Outcome::Lost(r)));
            }
            // The older keys, nearest first, as many as can keep us out and one more, which
            // tells whether only holders are ahead. With their values: one of them may be
            // ours, from a campaign whose outcome we never heard.
            let opts = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(my_rev - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(i64::from(self.line.slots) + 1);
            let prefix = self.line.election.candidates();
            let resp = patient(self.line.timeout, || {
                let (mut c, opts, prefix) = (client.clone(), opts.clone(), prefix.clone());
                async move { c.get(prefix, Some(opts)).await }
            })
            .await?;
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            let older = resp.kvs();
            if self.revoke_orphans(older).await? {
                continue;
            }
            if !may_hold(older.len(), self.line.slots) {
                if self.wait == Wait::No {
                    return Ok(Some(Outcome::NotAcquired));
                }
                let (why, watched, prefix) = self.ahead_of_us(older);
                on_wait(&why);
                match self
                    .wait_for_delete(&mut client, watched, prefix, rev, &mut lease_rx, learned)
                    .await?
                {
                    Woke::Outcome(outcome) => return Ok(Some(outcome)),
                    // With one slot we watched only the key ahead, so whether it held when
                    // it went is not known: we may hold now. (With more, every waiting
                    // candidate wakes on every delete and the count that follows says.)
                    Woke::Deleted if self.line.slots == 1 => on_wait(&InLine::Rechecking),
                    Woke::Deleted | Woke::LookAgain => {}
                }
                continue;
            }
            let elected_ms = crate::election::unix_ms();
            let resp = self.confirm(&client, &key, my_rev, elected_ms).await?;
            if resp.succeeded() && must_yield(&resp.op_responses(), my_rev, self.line.priority) {
                // Out of line; the next creation puts us behind the one we let pass.
                self.leave_line(&mut client, &key, my_rev).await?;
                return Ok(None);
            }
            if resp.succeeded() {
                let marked = (self.line.slots == 1).then_some(elected_ms);
                return self
                    .claim_slot(&mut client, key, my_rev, &mut lease_rx, on_wait, learned)
                    .await
                    .map(|o| Some(o.confirmed_by(None, marked)));
            }
            let ops = resp.op_responses();
            if existing_create_revision(&ops[..1]) != Some(my_rev) {
                return Ok(Some(Outcome::Lost(Loss::KeyDeleted)));
            }
            if self.wait == Wait::No {
                return Ok(Some(Outcome::NotAcquired));
            }
            on_wait(&InLine::Paused);
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            if let Woke::Outcome(outcome) = self
                .wait_for_delete(
                    &mut client,
                    self.line.election.paused_key().into_bytes(),
                    false,
                    rev,
                    &mut lease_rx,
                    learned,
                )
                .await?
            {
                return Ok(Some(outcome));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_wait_logs_its_line_and_sets_its_status() {
        let behind = InLine::Behind {
            key: "lead-exec/elections/settle/1".into(),
            value: Candidate::this_process("w1").encode().into_bytes(),
            next: true,
        };
        let cases = [
            (behind, "waiting behind w1", Some("waiting behind w1")),
            (
                InLine::Behind {
                    key: "k".into(),
                    value: b"etcdctl-elect".to_vec(),
                    next: false,
                },
                "waiting behind etcdctl-elect",
                Some("waiting behind etcdctl-elect"),
            ),
            (
                InLine::SlotsFull {
                    ahead: 3,
                    slots: 2,
                    next: false,
                },
                "waiting for one of 2 slots (3 ahead)",
                Some("waiting for one of 2 slots"),
            ),
            (
                InLine::SlotKeysTaken,
                "holding; waiting for a draining holder to free its slot",
                Some("waiting for a slot to be freed"),
            ),
            (
                InLine::Paused,
                "election paused; waiting for resume",
                Some("paused"),
            ),
            (
                InLine::Yielding,
                "letting a higher-priority candidate pass; queueing again",
                None,
            ),
            (
                InLine::Rechecking,
                "the key ahead is gone; checking our place",
                None,
            ),
        ];
        for (wait, line, status) in cases {
            assert_eq!(wait.to_string(), line);
            assert_eq!(wait.status().as_deref(), status, "{line}");
        }
    }

    #[test]
    fn only_a_wait_next_in_line_keeps_a_watchdog_standing_by() {
        let behind = |next| InLine::Behind {
            key: "k".into(),
            value: b"w1".to_vec(),
            next,
        };
        let slots = |next| InLine::SlotsFull {
            ahead: 2,
            slots: 2,
            next,
        };
        let cases = [
            (behind(true), Some(true)),
            (behind(false), Some(false)),
            (slots(true), Some(true)),
            (slots(false), Some(false)),
            (InLine::SlotKeysTaken, Some(true)),
            (InLine::Rechecking, Some(true)),
            // Neither says where we stand: whatever stands by stays.
            (InLine::Paused, None),
            (InLine::Yielding, None),
        ];
        for (wait, next) in cases {
            assert_eq!(wait.next_in_line(), next, "{wait:?}");
        }
    }
}
