//! `--priority`: who gets to the head of the line first.
//!
//! Priority changes who gets there first, never the rule itself (only the oldest key may
//! lead, which is what makes leadership exclusive). A candidate with priority P > 0 puts
//! `meta/NAME/priority/<lease hex>` = P beside its key (in the creating transaction) and asks
//! a lower-priority leader to hand over (a resign request naming its token, see
//! [`crate::election::leader::preempt_request`]). At the head of the line, a candidate that
//! sees a younger candidate of higher priority lets it pass: it deletes its key and queues
//! again, behind it. Equal priorities never pass or preempt each other, and the leader hands
//! over only after its job's `--min-term` and only if a higher-priority candidate is still in
//! line then (see [`crate::election::leader::outranked_in_line`]), so nothing loops.

use crate::etcd::Client;
use anyhow::Result;
use etcd_client::{
    Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};

use super::Campaign;
use crate::election::Candidate;
use crate::etcd::bounded;

impl Campaign<'_> {
    /// Asks the leader to hand over if its priority is below ours: a resign request naming its
    /// token, written only while it still leads with that token and the election is not
    /// paused. Best effort: a leader that already left needs no request, and a lower-priority
    /// head that has not confirmed yet lets us pass by itself.
    pub(super) async fn ask_for_handover(&self, client: &mut Client) {
        let head = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let ask = async {
            let resp = bounded(
                self.line.timeout,
                client.get(self.line.election.candidates(), Some(head)),
            )
            .await?;
            let Some(leader) = resp.kvs().first() else {
                return Ok(());
            };
            let who = Candidate::parse(leader.value());
            if leader.lease() == self.lease.id || who.priority >= self.line.priority {
                return Ok(());
            }
            let me = Candidate::parse(self.line.value.as_bytes());
            let token = leader.create_revision();
            let txn = crate::election::leader::request_txn(
                self.line.election,
                leader.key(),
                token,
                leader.lease(),
                crate::election::leader::preempt_request(token, self.line.priority, &me.id),
            );
            if bounded(self.line.timeout, client.txn(txn))
                .await?
                .succeeded()
            {
                tracing::info!(
                    priority = self.line.priority,
                    "asked {} (priority {}, token {token}) to hand over",
                    who.id,
                    who.priority
                );
                crate::metrics::preemption_requested();
            }
            anyhow::Ok(())
        };
        if let Err(e) = ask.await {
            tracing::warn!("could not ask the leader to hand over: {e:#}");
        }
    }

    /// Takes our key out of line, if it is still the one created at `my_rev`, to let a
    /// higher-priority candidate pass: the next creation puts us behind it.
    pub(super) async fn leave_line(
        &self,
        client: &mut Client,
        key: &str,
        my_rev: i64,
    ) -> Result<()> {
        let leave = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, my_rev)])
            .and_then([TxnOp::delete(key, None)]);
        bounded(self.line.timeout, client.txn(leave)).await?;
        Ok(())
    }
}

/// Whether a candidate younger than us (a priority key written after our key) has a higher
/// priority than ours.
pub(super) fn must_yield(ops: &[TxnOpResponse], my_rev: i64, mine: u32) -> bool {
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
