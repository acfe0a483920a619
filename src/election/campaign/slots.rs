//! `--slots N`: N-of-M leadership on top of the protocol.
//!
//! The N keys with the lowest create revisions hold, and a candidate holds once fewer than N
//! older keys exist. That stays true while its key lives, as "no older key" does for N = 1:
//! every key created later gets a larger create revision, so the set of older keys only
//! shrinks. The creating transaction reads the first N keys, and a waiting candidate watches
//! the whole candidate prefix for deletes and recounts on each: with N > 1 any delete may free
//! a place, so every waiting candidate wakes on every delete. That fan-out is the cost of
//! slots, and why N = 1 keeps watching only its predecessor.
//!
//! A holder then claims the lowest free slot key `lead-exec/meta/NAME/slot/<i>` on its lease,
//! which gives the job `LEAD_EXEC_SLOT`. Every candidate must run with the same N (see
//! [`super::settings`]).

use crate::etcd::Client;
use anyhow::Result;
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp};
use tokio::sync::watch;

use super::protocol::{existing_create_revision, Woke};
use super::{Campaign, InLine, Learned, Outcome, Wait};
use crate::election::lease::Loss;
use crate::etcd::bounded;

impl Campaign<'_> {
    /// Why a candidate that may not hold yet waits, and what it watches for a delete (with
    /// `true`: every key under it). `older` are the keys ahead of it, nearest first: at least
    /// as many as there are slots, and one more if there are more.
    pub(super) fn ahead_of_us(&self, older: &[KeyValue]) -> (InLine, Vec<u8>, bool) {
        let slots = self.line.slots as usize;
        // Only the holders are ahead: the next place freed is ours.
        let next = older.len() <= slots;
        // One slot: wait for the predecessor only. Several: any delete may free one.
        if slots == 1 {
            let pred = &older[0];
            let why = InLine::Behind {
                key: String::from_utf8_lossy(pred.key()).into_owned(),
                value: pred.value().to_vec(),
                next,
            };
            (why, pred.key().to_vec(), false)
        } else {
            let why = InLine::SlotsFull {
                ahead: older.len().min(slots),
                slots: self.line.slots,
                next,
            };
            (why, self.line.election.candidates().into_bytes(), true)
        }
    }

    /// A confirmed holder: with one slot it is slot 0; with more it claims the lowest free
    /// slot key, waiting (bounded by the lease and `--wait`) while every one is taken.
    pub(super) async fn claim_slot(
        &self,
        client: &mut Client,
        key: String,
        token: i64,
        lease_rx: &mut watch::Receiver<Option<Loss>>,
        on_wait: &mut impl FnMut(&InLine),
        learned: &mut Learned,
    ) -> Result<Outcome> {
        if self.line.slots == 1 {
            return Ok(Outcome::Elected {
                token,
                key,
                slot: 0,
                at_creation: None,
                elected_ms: None,
            });
        }
        let e = self.line.election;
        loop {
            if let Some(r) = *lease_rx.borrow() {
                return Ok(Outcome::Lost(r));
            }
            let opts = GetOptions::new().with_prefix().with_keys_only();
            let resp = bounded(self.line.timeout, client.get(e.slot_prefix(), Some(opts))).await?;
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
            let Some(slot) = lowest_free(&taken, self.line.slots) else {
                if self.wait == Wait::No {
                    return Ok(Outcome::NotAcquired);
                }
                on_wait(&InLine::SlotKeysTaken);
                let watched = prefix.into_bytes();
                match self
                    .wait_for_delete(client, watched, true, rev, lease_rx, learned)
                    .await?
                {
                    Woke::Outcome(outcome) => return Ok(outcome),
                    Woke::Deleted | Woke::LookAgain => continue,
                }
            };
            // The claim also marks our key as elected (see `Candidate::elected_ms`).
            let elected_ms = crate::election::unix_ms();
            let on_lease = || Some(PutOptions::new().with_lease(self.lease.id));
            let claim = Txn::new()
                .when([
                    Compare::create_revision(key.clone(), CompareOp::Equal, token),
                    Compare::version(e.slot_key(slot), CompareOp::Equal, 0),
                ])
                .and_then([
                    TxnOp::put(e.slot_key(slot), token.to_string(), on_lease()),
                    TxnOp::put(key.clone(), self.line.elected_value(elected_ms), on_lease()),
                ])
                .or_else([TxnOp::get(
                    key.clone(),
                    Some(GetOptions::new().with_keys_only()),
                )]);
            let resp = bounded(self.line.timeout, client.txn(claim)).await?;
            if resp.succeeded() {
                return Ok(Outcome::Elected {
                    token,
                    key,
                    slot,
                    at_creation: None,
                    elected_ms: Some(elected_ms),
                });
            }
            if existing_create_revision(&resp.op_responses()) != Some(token) {
                return Ok(Outcome::Lost(Loss::KeyDeleted));
            }
            // Another holder took that slot first: look again.
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
