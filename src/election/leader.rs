//! What a leader watches while its job runs: its own key (an operator's delete, `resign`, a
//! revoke) and the election's pause switch. Watches can break or be compacted away; after any
//! break the current state is read again, so no change is missed.

use std::time::Duration;

use crate::etcd::Client;
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions, WatchStream,
};

use super::Election;
use crate::election::Ctx;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderEvent {
    KeyDeleted,
    Paused,
    ResignRequested,
    /// A waiting candidate with a higher `--priority` asks for the term (see
    /// [`preempt_request`]); the leader hands over once its job's `--min-term` is over, if
    /// a higher-priority candidate is still in line then ([`outranked_in_line`]).
    Preempted,
}

/// The value of a resign request from a higher-priority candidate: our token first, as every
/// request has, so that a leader reading only the token still acts on it.
pub fn preempt_request(token: i64, priority: u32, id: &str) -> String {
    format!("{token} preempt priority {priority} by {id}")
}

/// Writes a request (`value`: the leader's token first) for the term `token` of the leader
/// key `key`, only while that term leads and the election is not paused. It lives on the
/// leader's `lease`, so it goes with the term it was meant for.
pub fn request_txn(
    e: &Election,
    key: impl Into<Vec<u8>>,
    token: i64,
    lease: i64,
    value: String,
) -> Txn {
    Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, token),
            Compare::version(e.paused_key(), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put(
            e.resign_key(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        )])
}

/// Whether a candidate of priority above `mine` is in line behind the leader of term
/// `token`, by one linearizable read of the line and the priority keys. A preemption request
/// outlives the candidate that wrote it (it lives on the leader's lease); the candidate's key
/// and priority key do not (they live on its own), so this is what the leader decides by
/// when its `--min-term` is over. Bounded by `timeout`, which may be shorter than the scope's.
pub async fn outranked_in_line(
    ctx: &Ctx,
    token: i64,
    mine: u32,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let (mut c, e) = (ctx.client.clone(), &ctx.election);
    let prefix = GetOptions::new().with_prefix();
    let read = Txn::new().and_then([
        TxnOp::get(e.candidates(), Some(prefix.clone().with_keys_only())),
        TxnOp::get(e.priority_prefix(), Some(prefix)),
    ]);
    let resp = crate::etcd::bounded(timeout, c.txn(read)).await?;
    let ops = resp.op_responses();
    let kvs = |i: usize| match ops.get(i) {
        Some(TxnOpResponse::Get(g)) => g.kvs().to_vec(),
        _ => Vec::new(),
    };
    let (line, prios) = (kvs(0), kvs(1));
    let (cand, prio) = (e.candidates(), e.priority_prefix());
    let line = line.iter().filter_map(|kv| {
        let lease = std::str::from_utf8(kv.key()).ok()?.strip_prefix(&cand)?;
        Some((lease, kv.create_revision()))
    });
    let prios = prios.iter().filter_map(|kv| {
        let lease = std::str::from_utf8(kv.key()).ok()?.strip_prefix(&prio)?;
        let p = std::str::from_utf8(kv.value()).ok()?.trim().parse().ok()?;
        Some((lease, p))
    });
    Ok(outranked(line, prios.collect(), token, mine))
}

/// Whether any candidate younger than `token` (by its key's create revision) has a priority
/// above `mine`. Candidates and priorities are matched by lease (their keys' last segment);
/// a candidate without a priority key has priority 0.
fn outranked<'a>(
    mut line: impl Iterator<Item = (&'a str, i64)>,
    prios: Vec<(&'a str, u32)>,
    token: i64,
    mine: u32,
) -> bool {
    line.any(|(lease, rev)| rev > token && prios.iter().any(|(l, p)| *l == lease && *p > mine))
}

pub struct LeaderWatch {
    client: Client,
    /// `--command-timeout`, for the re-read and for opening the watch.
    timeout: Duration,
    key: String,
    paused: String,
    resign: String,
    token: i64,
    /// Who asked in the last preemption request: (priority, id).
    preemptor: Option<(u32, String)>,
    /// The mod revision of the preemption request already reported: the re-read after a
    /// broken watch finds it again, and reporting it twice would make the leader judge it
    /// again in a loop.
    preempt_seen: Option<i64>,
    /// Last revision we know the state at.
    rev: i64,
    /// The state at `rev` is known without a read, for the first opening only: the term was
    /// confirmed by the transaction that created its key, which saw, at revision `token`, our
    /// key present and the pause switch off; and no resign request can name a token before
    /// the token exists. A watch from `token + 1` then reports every change since, exactly as
    /// the re-read and a watch from after it would. Any reopening reads again (the revision
    /// may be compacted, the endpoint changed).
    known: bool,
    /// Only the key's deletion is news (the term's job is being stopped already): a re-read
    /// after a break asks for the key alone, and then watches again whatever the pause switch
    /// or a resign request say, which were acted on.
    deletion_only: bool,
    stream: Option<WatchStream>,
    /// Pin moves of the etcd channel: the stream may sit on the endpoint just left.
    moves: tokio::sync::watch::Receiver<u64>,
}

impl LeaderWatch {
    /// Watches the term whose key is `key` and whose token is `token`; `at_creation` when the
    /// transaction that created the key confirmed the term (see `known`).
    pub fn new(ctx: &Ctx, key: &str, token: i64, at_creation: bool) -> LeaderWatch {
        LeaderWatch {
            client: ctx.client.clone(),
            timeout: ctx.timeout,
            key: key.to_string(),
            paused: ctx.election.paused_key(),
            resign: ctx.election.resign_key(),
            token,
            preempt_seen: None,
            preemptor: None,
            rev: token,
            known: at_creation,
            deletion_only: false,
            stream: None,
            moves: ctx.router.moves(),
        }
    }

    /// From now on, only the key's deletion is news: a pause or a resign request already in
    /// force is not reported again by a re-read after a break (which would otherwise answer at
    /// once, from the read, each time it is asked).
    pub fn deletion_only(&mut self) {
        self.deletion_only = true;
    }

    /// Waits for the next event. Never fails: etcd trouble is retried, and the lease deadline
    /// is what bounds a leader that cannot reach etcd.
    pub async fn next(&mut self) -> LeaderEvent {
        loop {
            if self.stream.is_none() {
                match self.open().await {
                    Ok(Some(ev)) => return ev,
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!("leader watch: {e}");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                }
            }
            let stream = self.stream.as_mut().expect("opened above");
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = crate::etcd::failover::moved(&mut self.moves) => {
                    // Re-read and watch again, on the endpoint requests now go to.
                    self.stream = None;
                    continue;
                }
            };
            match msg {
                Ok(Some(resp)) => {
                    if resp.canceled() || resp.compact_revision() != 0 {
                        self.stream = None;
                        continue;
                    }
                    if let Some(h) = resp.header() {
                        self.rev = self.rev.max(h.revision());
                    }
                    for e in resp.events() {
                        let Some(kv) = e.kv() else { continue };
                        if kv.key() == self.key.as_bytes() && e.event_type() == EventType::Delete {
                            return LeaderEvent::KeyDeleted;
                        }
                        if kv.key() == self.paused.as_bytes() && e.event_type() == EventType::Put {
                            return LeaderEvent::Paused;
                        }
                        if kv.key() == self.resign.as_bytes() {
                            if let Some(ev) = self.request(kv) {
                                return ev;
                            }
                        }
                    }
                }
                Ok(None) | Err(_) => {
                    self.stream = None;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// The candidate that asked for the term in the last preemption request: (priority, id).
    pub fn preemptor(&self) -> Option<(u32, String)> {
        self.preemptor.clone()
    }

    /// What a resign request asks of us, if it names our token and was not reported yet.
    fn request(&mut self, kv: &etcd_client::KeyValue) -> Option<LeaderEvent> {
        let v = std::str::from_utf8(kv.value()).ok()?;
        let mut words = v.split_whitespace();
        if words.next()?.parse::<i64>().ok()? != self.token {
            return None;
        }
        Some(match words.next() {
            Some("preempt") => {
                if self.preempt_seen == Some(kv.mod_revision()) {
                    return None;
                }
                self.preempt_seen = Some(kv.mod_revision());
                // "preempt priority P by ID" (see `preempt_request`).
                let priority = words.nth(1).and_then(|p| p.parse().ok());
                let id = words.skip(1).collect::<Vec<_>>().join(" ");
                self.preemptor = priority.map(|p| (p, id));
                LeaderEvent::Preempted
            }
            _ => LeaderEvent::ResignRequested,
        })
    }

    /// Re-reads the state, then watches from just after it.
    async fn open(&mut self) -> Result<Option<LeaderEvent>, etcd_client::Error> {
        let timeout = self.timeout;
        if std::mem::take(&mut self.known) {
            let rev = self.rev;
            return self.watch_from(rev).await;
        }
        if self.deletion_only {
            let own = tokio::time::timeout(
                timeout,
                self.client
                    .get(self.key.clone(), Some(GetOptions::new().with_count_only())),
            )
            .await
            .map_err(|_| etcd_client::Error::WatchError("re-read timed out".into()))??;
            if own.count() == 0 {
                return Ok(Some(LeaderEvent::KeyDeleted));
            }
            let rev = own.header().map(|h| h.revision()).unwrap_or(self.rev);
            return self.watch_from(rev).await;
        }
        let read = async {
            let own = self
                .client
                .get(self.key.clone(), Some(GetOptions::new().with_count_only()))
                .await?;
            let paused = self
                .client
                .get(
                    self.paused.clone(),
                    Some(GetOptions::new().with_count_only()),
                )
                .await?;
            let resign = self.client.get(self.resign.clone(), None).await?;
            Ok::<_, etcd_client::Error>((own, paused, resign))
        };
        let (own, paused, resign) = tokio::time::timeout(timeout, read)
            .await
            .map_err(|_| etcd_client::Error::WatchError("re-read timed out".into()))??;
        if own.count() == 0 {
            return Ok(Some(LeaderEvent::KeyDeleted));
        }
        if paused.count() > 0 {
            return Ok(Some(LeaderEvent::Paused));
        }
        if let Some(ev) = resign.kvs().first().and_then(|kv| self.request(kv)) {
            return Ok(Some(ev));
        }
        let rev = own.header().map(|h| h.revision()).unwrap_or(self.rev);
        self.watch_from(rev).await
    }

    /// Watches our key, the pause switch and resign requests from just after `rev`, the
    /// revision the state is known at.
    async fn watch_from(&mut self, rev: i64) -> Result<Option<LeaderEvent>, etcd_client::Error> {
        let timeout = self.timeout;
        let opts = WatchOptions::new()
            .with_start_revision(rev + 1)
            .with_filters([WatchFilterType::NoPut]);
        let mut stream =
            tokio::time::timeout(timeout, self.client.watch(self.key.clone(), Some(opts)))
                .await
                .map_err(|_| etcd_client::Error::WatchError("watch timed out".into()))??;
        let opts = WatchOptions::new()
            .with_start_revision(rev + 1)
            .with_filters([WatchFilterType::NoDelete]);
        stream.watch(self.paused.clone(), Some(opts)).await?;
        let opts = WatchOptions::new()
            .with_start_revision(rev + 1)
            .with_filters([WatchFilterType::NoDelete]);
        stream.watch(self.resign.clone(), Some(opts)).await?;
        self.rev = rev;
        self.stream = Some(stream);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_younger_candidate_of_higher_priority_still_in_line_outranks_the_leader() {
        let judge = |line: &[(&str, i64)], prios: &[(&str, u32)], mine| {
            outranked(line.iter().copied(), prios.to_vec(), 10, mine)
        };
        assert!(judge(&[("a", 10), ("b", 12)], &[("b", 5)], 0));
        assert!(
            !judge(&[("a", 10)], &[("b", 5)], 0),
            "its key is gone: it left the line"
        );
        assert!(!judge(&[("a", 10), ("b", 12)], &[], 0), "no priority key");
        assert!(!judge(&[("a", 10), ("b", 12)], &[("b", 5)], 5), "equal");
        assert!(!judge(&[("a", 10)], &[("a", 9)], 0), "the leader itself");
        assert!(judge(
            &[("a", 10), ("b", 11), ("c", 12)],
            &[("b", 1), ("c", 3)],
            2
        ));
    }
}
