//! The audit record of terms: `lead-exec/meta/NAME/history/<token>`.
//!
//! The leader writes its own records in transactions guarded by its key's create revision, so
//! a leader whose key is gone (a stale one) cannot write history. A term whose end was never
//! written is judged by its leader key when the records are read: while the key exists the
//! term runs; once it is gone, the lease ran out (or was revoked) at a moment nobody recorded,
//! so the record says only that it ended before a bound (see [`infer_ends`]).

use std::time::Duration;

use anyhow::Result;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use serde::{Deserialize, Serialize};

use super::Writer;
use crate::election::unix_ms;
use crate::election::Candidate;
use crate::election::Ctx;

/// Where a term learns which old records its end trims: from a read beside its start record,
/// or already known (from the newest history keys that its creating transaction read, see
/// [`trim_from_newest`]).
#[derive(Debug, Clone)]
pub enum TrimFrom {
    Read,
    Known(Option<Vec<u8>>),
}

/// How a term ended, as its history record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermEnd {
    Exited(u8),
    LeaseLost,
    Resigned,
    Paused,
    Signal(i32),
    /// Stopped at `--timeout`.
    TimedOut,
    /// Stopped at `--timeout`, and a stopping signal to lead-exec cut the grace short.
    TimedOutThenSignal(i32),
    /// Stopped because the health check kept failing.
    Unhealthy,
    /// Handed over to a waiting candidate of higher `--priority` (who: [`Record::preempted_by`]).
    Preempted,
    /// The term was won but its job never started: its lease was lost or left too little
    /// time first, its watchdog did not answer, or the command could not run (126, 127).
    NotStarted,
}

impl TermEnd {
    /// Whether the job was gone before the term let go of its key: it exited, or lead-exec
    /// stopped it and saw its group end, or it never started. Only a lost lease is unclean;
    /// `--takeover-delay` waits after those.
    pub fn is_clean(self) -> bool {
        self != TermEnd::LeaseLost
    }
}

impl std::fmt::Display for TermEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TermEnd::Exited(c) => write!(f, "exit {c}"),
            TermEnd::LeaseLost => f.write_str("lease lost"),
            TermEnd::Resigned => f.write_str("resigned"),
            TermEnd::Paused => f.write_str("paused"),
            TermEnd::Signal(s) => write!(f, "signal {s} to lead-exec"),
            TermEnd::TimedOut => f.write_str("timed out"),
            TermEnd::TimedOutThenSignal(s) => write!(f, "timed out, then signal {s} to lead-exec"),
            TermEnd::Unhealthy => f.write_str("unhealthy"),
            TermEnd::Preempted => f.write_str("preempted"),
            TermEnd::NotStarted => f.write_str("not started"),
        }
    }
}

/// One term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub token: i64,
    pub id: String,
    pub host: String,
    pub pid: u32,
    pub started_ms: u64,
    #[serde(default)]
    pub ended_ms: Option<u64>,
    #[serde(default)]
    pub end: Option<String>,
    /// Whether the term ended cleanly (see [`TermEnd::is_clean`]); unset while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean: Option<bool>,
    /// The `--takeover-delay` this term waited out before its job started, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover_delay_ms: Option<u64>,
    /// Whether the job runs in a cgroup of its own (false: its process group and tree); unset
    /// when the record was written before the job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_cgroup: Option<bool>,
    /// The job's `--timeout`, in milliseconds, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Never written: set when read for a term whose end was not recorded and whose key is
    /// gone. It ended (its lease ran out) at some time before this, Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_before_ms: Option<u64>,
    /// With the end `preempted`: the candidate of higher `--priority` that asked for the term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<Preemptor>,
    /// The run key the term ran its job for (`--run-key`, `--every`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_key: Option<String>,
    /// With `--attempts`, which attempt at the run key the term made (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

/// A waiting candidate of higher `--priority` that asked a leader to hand over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemptor {
    pub id: String,
    pub priority: u32,
}

impl Record {
    /// The start of `writer`'s term, now, on this host and process.
    pub fn start(writer: Writer<'_>, facts: StartFacts<'_>) -> Record {
        let StartFacts {
            takeover_delay,
            job_cgroup,
            job_timeout,
            run_key,
            attempt,
        } = facts;
        let host = crate::election::hostname();
        Record {
            takeover_delay_ms: takeover_delay.map(|d| d.as_millis() as u64),
            job_cgroup,
            timeout_ms: job_timeout.map(|d| d.as_millis() as u64),
            run_key: run_key.map(str::to_string),
            attempt,
            ..Record::open(
                writer.token,
                writer.id,
                &host,
                std::process::id(),
                unix_ms(),
            )
        }
    }

    /// A running term's record with nothing known beyond who holds it and since when.
    pub fn open(token: i64, id: &str, host: &str, pid: u32, started_ms: u64) -> Record {
        Record {
            token,
            id: id.to_string(),
            host: host.to_string(),
            pid,
            started_ms,
            ended_ms: None,
            end: None,
            clean: None,
            takeover_delay_ms: None,
            job_cgroup: None,
            timeout_ms: None,
            ended_before_ms: None,
            preempted_by: None,
            run_key: None,
            attempt: None,
        }
    }

    /// Marks the term ended now, for `reason`.
    fn close(&mut self, reason: TermEnd) {
        self.ended_ms = Some(unix_ms());
        self.end = Some(reason.to_string());
        self.clean = Some(reason.is_clean());
    }

    /// Whether this term ended cleanly. An open record is not: its worker died, froze or lost
    /// its key before it could close it. Records from before the `clean` field say so by
    /// their end.
    pub fn ended_cleanly(&self) -> bool {
        let lost = TermEnd::LeaseLost.to_string();
        self.clean
            .unwrap_or_else(|| self.end.as_deref().is_some_and(|e| e != lost))
    }
}

/// A start record as written, for the end record to build on without reading it back.
#[derive(Debug, Clone)]
pub struct Started {
    pub record: Record,
    /// The record's mod revision: the end record is written only if it is unchanged.
    pub rev: i64,
    /// Where the end record's transaction stops deleting old records (see `trim_end`).
    pub trim: Option<Vec<u8>>,
}

/// What the end of a term knows of its start record.
#[derive(Debug, Clone)]
pub enum Start {
    /// Written, and etcd said so.
    Written(Started),
    /// Not seen written (its writes failed, or were cut short at the term's end): an attempt
    /// may still have landed unseen, with these very fields.
    Unconfirmed(Record),
}

impl Start {
    pub fn record(&self) -> &Record {
        match self {
            Start::Written(s) => &s.record,
            Start::Unconfirmed(r) => r,
        }
    }

    /// The record the end is written into, to add what only the end knows.
    pub fn record_mut(&mut self) -> &mut Record {
        match self {
            Start::Written(s) => &mut s.record,
            Start::Unconfirmed(r) => r,
        }
    }
}

/// How long a term's start record waits beside its job before its first write. A job that
/// ends sooner needs none of its own: the closing transaction writes the record whole, so a
/// short run costs three raft commits (grant, creation, close), not four. What reads a
/// running term by its record copes with one this late: a blocking `pause` counts a holder
/// without a record as running for 1.5 s (see `ops::pause`), `status` shows the leader from
/// its key, and `history` shows the term from the hold's end or from its end record.
pub const START_RECORD_HOLD: Duration = Duration::from_millis(250);

/// [`START_RECORD_HOLD`], or in debug builds `LEAD_EXEC_TEST_START_RECORD_HOLD_MS`: tests
/// hold a record back for as long as they look at a term known by its key alone, or send it
/// at once to have it in flight at the term's end.
pub fn start_record_hold() -> Duration {
    crate::hooks::value("LEAD_EXEC_TEST_START_RECORD_HOLD_MS")
        .map_or(START_RECORD_HOLD, Duration::from_millis)
}

/// The pause before the retry after `failures` failed start-record writes: 100 ms doubling up
/// to 1 s, short next to any term yet never a tight loop against an etcd that fails at once.
pub fn start_retry_pause(failures: u32) -> Duration {
    let ms = 100u64.saturating_mul(1 << failures.saturating_sub(1).min(4));
    Duration::from_millis(ms.min(1_000))
}

/// What a start record says about the term beyond who holds it.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartFacts<'a> {
    /// The `--takeover-delay` the term waited out.
    pub takeover_delay: Option<Duration>,
    /// Whether the job runs in a cgroup of its own; unknown before it starts.
    pub job_cgroup: Option<bool>,
    /// The job's `--timeout`.
    pub job_timeout: Option<Duration>,
    /// The run key the term runs for (`--run-key`, `--every`).
    pub run_key: Option<&'a str>,
    /// With `--attempts`, the attempt at it that the term claimed.
    pub attempt: Option<u32>,
}

/// What else a term's lease holds, for the commit that ends the term to delete with its key:
/// the revoke that follows is not awaited, and a lease that outlives lead-exec (until its TTL)
/// must hold nothing (lead-exec-safety(7), "Round trips").
#[derive(Clone, Copy, Debug)]
pub struct OnLease {
    /// The lease: a resign request written on it was for this term.
    pub lease: i64,
    /// Our slot, with `--slots` above 1.
    pub slot: Option<u32>,
    /// Whether we put a `--priority` key.
    pub priority: bool,
}

impl OnLease {
    fn deletes(self, e: &crate::election::Election) -> Vec<TxnOp> {
        let mut ops: Vec<TxnOp> = self
            .slot
            .map(|s| TxnOp::delete(e.slot_key(s), None))
            .into_iter()
            .collect();
        if self.priority {
            ops.push(TxnOp::delete(e.priority_key(self.lease), None));
        }
        // Only a request on our lease: with `--slots` above 1, one may be there for another
        // holder.
        ops.push(TxnOp::txn(
            Txn::new()
                .when([Compare::lease(e.resign_key(), CompareOp::Equal, self.lease)])
                .and_then([TxnOp::delete(e.resign_key(), None)]),
        ));
        ops
    }
}

impl Ctx {
    /// Writes the start record `rec` of our term, guarded by our key, and, unless `trim` says
    /// them already, reads beside it which old records the end of the term trims: a round trip
    /// the start would otherwise wait for. `Ok(None)`: our key is gone (the term is over),
    /// nothing was written.
    pub async fn record_start(
        &self,
        writer: Writer<'_>,
        keep: u32,
        rec: &Record,
        trim: &TrimFrom,
    ) -> Result<Option<Started>> {
        let (client, e) = (&self.client, &self.election);
        let mut c = client.clone();
        let Writer { token, key, .. } = writer;
        let hk = e.history_key(token);
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, token)])
            .and_then([TxnOp::put(hk.clone(), serde_json::to_string(rec)?, None)]);
        if let TrimFrom::Known(trim) = trim {
            let resp = self.bounded(c.txn(txn)).await?;
            if !resp.succeeded() {
                return Ok(None);
            }
            return Ok(Some(Started {
                record: rec.clone(),
                rev: resp.header().map(|h| h.revision()).unwrap_or(0),
                trim: trim.clone(),
            }));
        }
        let keys_only = GetOptions::new()
            .with_keys_only()
            .with_sort(SortTarget::Key, SortOrder::Ascend);
        let (resp, existing) =
            tokio::join!(self.bounded(c.txn(txn)), self.history_records(keys_only),);
        let resp = resp?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        // Without the list, nothing is trimmed this term; the next one does it.
        let trim = existing.ok().and_then(|r| {
            let keys: Vec<Vec<u8>> = r
                .kvs()
                .iter()
                .map(|kv| kv.key().to_vec())
                .filter(|k| *k != hk.as_bytes())
                .collect();
            trim_end(&keys, keep as usize, &hk)
        });
        Ok(Some(Started {
            record: rec.clone(),
            rev,
            trim,
        }))
    }

    /// Writes the end of our term and deletes our leader key in one transaction, guarded by the
    /// key (and by a start record seen written being unchanged): one commit hands over
    /// leadership and closes the record. The same commit deletes the other keys our lease holds
    /// ([`OnLease`]), so the next holder finds our slot free at once and the revoke that follows
    /// need not land, and trims the records beyond `--history-keep` (from the list read beside a
    /// start record seen written).
    /// `Ok(false)` when the guard failed and nothing was written.
    ///
    /// A start record not seen written goes in whole, closed. That is a put whatever is there,
    /// and it is right whether or not an attempt landed unseen: while our key exists, only its
    /// holder writes this term's record. Every write of a record before the release is guarded
    /// by the key's create revision (this one and [`Ctx::record_start`]), the writes after it
    /// ([`Ctx::record_end_after_release`]) run only once the key is gone, and the operator
    /// commands write no history (`pause` and `resign` put keys of their own, which the leader
    /// acts on; `history` and `status` only read). So the only record that can be there is an
    /// attempt of ours, with the very fields put here, which the put completes.
    pub async fn record_end_and_release(
        &self,
        writer: Writer<'_>,
        on_lease: OnLease,
        start: &Start,
        reason: TermEnd,
        trim_unconfirmed: Option<Vec<u8>>,
    ) -> Result<bool> {
        let (client, e) = (&self.client, &self.election);
        let mut c = client.clone();
        let hk = e.history_key(writer.token);
        let mut rec = start.record().clone();
        rec.close(reason);
        let ours = Compare::create_revision(writer.key, CompareOp::Equal, writer.token);
        let (guard, trim) = match start {
            Start::Written(s) => (
                vec![
                    ours,
                    Compare::mod_revision(hk.clone(), CompareOp::Equal, s.rev),
                ],
                s.trim.clone(),
            ),
            // The list the creating transaction read, if it confirmed the term; without one,
            // nothing is trimmed this term (the next one does it).
            Start::Unconfirmed(_) => (vec![ours], trim_unconfirmed),
        };
        let txn = Txn::new().when(guard).and_then(
            [
                TxnOp::put(hk, serde_json::to_string(&rec)?, None),
                TxnOp::delete(writer.key, None),
            ]
            .into_iter()
            .chain(on_lease.deletes(e))
            .chain(trim.map(|end| {
                TxnOp::delete(
                    e.history_prefix(),
                    Some(DeleteOptions::new().with_range(end)),
                )
            }))
            .collect::<Vec<_>>(),
        );
        Ok(self.bounded(c.txn(txn)).await?.succeeded())
    }

    /// The history's records, as `opts` selects and orders them.
    async fn history_records(&self, opts: GetOptions) -> Result<etcd_client::GetResponse> {
        let mut c = self.client.clone();
        let opts = Some(opts.with_prefix());
        self.bounded(c.get(self.election.history_prefix(), opts))
            .await
    }

    /// Writes the end of our term once our key is gone: the term ended while etcd could not take
    /// [`Ctx::record_end_and_release`], and the lease was revoked first so that the next term does not
    /// wait for this write. Guarded by the start record being unchanged since we wrote it (or,
    /// without it, since read here): a record someone else closed meanwhile is left alone. A
    /// start record not seen written goes in whole if there is none, else the one there (an
    /// attempt of ours that landed unseen) is closed.
    pub async fn record_end_after_release(
        &self,
        token: i64,
        start: Option<&Start>,
        reason: TermEnd,
    ) -> Result<bool> {
        let (client, e) = (&self.client, &self.election);
        let hk = e.history_key(token);
        let any = || Compare::create_revision(hk.clone(), CompareOp::Greater, 0);
        let started = match start {
            // Any record of this term will do: the read in `finish` guards the write.
            None => return self.finish(token, reason, any()).await,
            Some(Start::Unconfirmed(rec)) => {
                let mut rec = rec.clone();
                rec.close(reason);
                if self.record_if_absent(token, &rec).await? {
                    return Ok(true);
                }
                return self.finish(token, reason, any()).await;
            }
            Some(Start::Written(s)) => s,
        };
        let mut rec = started.record.clone();
        rec.close(reason);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                hk.clone(),
                CompareOp::Equal,
                started.rev,
            )])
            .and_then([TxnOp::put(hk, serde_json::to_string(&rec)?, None)]);
        let mut c = client.clone();
        Ok(self.bounded(c.txn(txn)).await?.succeeded())
    }

    /// Writes `rec` as its term's record if the term has none; whether it was written. For a
    /// term whose key is gone, so that no key guards it: a record already there is left alone.
    pub async fn record_if_absent(&self, token: i64, rec: &Record) -> Result<bool> {
        let hk = self.election.history_key(token);
        let txn = Txn::new()
            .when([Compare::create_revision(hk.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(hk, serde_json::to_string(rec)?, None)]);
        let mut c = self.client.clone();
        Ok(self.bounded(c.txn(txn)).await?.succeeded())
    }

    /// Marks a term ended, in one transaction with `guard` (and the record unchanged since read).
    /// Returns whether it was written.
    pub async fn finish(&self, token: i64, reason: TermEnd, guard: Compare) -> Result<bool> {
        let (client, e) = (&self.client, &self.election);
        let mut c = client.clone();
        let hk = e.history_key(token);
        let resp = self.bounded(c.get(hk.clone(), None)).await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(false);
        };
        let mut rec: Record = serde_json::from_slice(kv.value())?;
        rec.close(reason);
        let txn = Txn::new()
            .when([
                guard,
                Compare::mod_revision(hk.clone(), CompareOp::Equal, kv.mod_revision()),
            ])
            .and_then([TxnOp::put(hk, serde_json::to_string(&rec)?, None)]);
        Ok(self.bounded(c.txn(txn)).await?.succeeded())
    }

    /// The last `n` records (`None`: all), oldest first, with the ends of open records inferred (see
    /// [`infer_ends`]). The records, the line of candidates and the slot count are read in one
    /// transaction, so that they describe the same moment.
    pub async fn history(&self, n: Option<usize>) -> Result<Vec<Record>> {
        let (client, e) = (&self.client, &self.election);
        let mut c = client.clone();
        // etcd's limit 0 means no limit: `None`, every record kept.
        let history = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Key, SortOrder::Descend)
            .with_limit(n.map_or(0, |n| n.max(1) as i64));
        // With values: a key written as elected is a running term before its record is.
        let line = GetOptions::new().with_prefix();
        let txn = Txn::new().and_then([
            TxnOp::get(e.history_prefix(), Some(history)),
            TxnOp::get(e.candidates(), Some(line)),
            TxnOp::get(e.slots_key(), None),
        ]);
        let resp = self.bounded(c.txn(txn)).await?;
        let observed_ms = unix_ms();
        let gets: Vec<etcd_client::GetResponse> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let [hist, line, slots] = gets.as_slice() else {
            anyhow::bail!("etcd answered {} of 3 reads", gets.len());
        };
        let mut recs: Vec<Record> = hist
            .kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect();
        recs.reverse();
        let keys: Vec<(i64, Candidate)> = line
            .kvs()
            .iter()
            .map(|kv| (kv.create_revision(), Candidate::parse(kv.value())))
            .collect();
        with_elected_keys(&mut recs, &keys, n);
        let live: Vec<i64> = keys.iter().map(|(t, _)| *t).collect();
        let slots: u32 = slots
            .kvs()
            .first()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.trim().parse().ok())
            .unwrap_or(1);
        infer_ends(&mut recs, &live, slots <= 1, observed_ms);
        Ok(recs)
    }

    /// How the last term before `token` ended, if uncleanly (see [`Record::ended_cleanly`]):
    /// its end as recorded, or "not recorded" for a record left open. No earlier term, or none
    /// that ran a job, is a clean start (`None`).
    pub async fn previous_unclean(&self, token: i64) -> Result<Option<String>> {
        let (client, e) = (&self.client, &self.election);
        let mut c = client.clone();
        let opts = GetOptions::new()
            .with_range(e.history_key(token))
            .with_sort(SortTarget::Key, SortOrder::Descend)
            .with_limit(1);
        let resp = self.bounded(c.get(e.history_prefix(), Some(opts))).await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        Ok(match serde_json::from_slice::<Record>(kv.value()) {
            Ok(r) if r.ended_cleanly() => None,
            Ok(r) => Some(format!(
                "term {} ended: {}",
                r.token,
                r.end
                    .as_deref()
                    .unwrap_or("not recorded (its worker died, froze or lost its key)")
            )),
            Err(_) => Some("its record cannot be read".to_string()),
        })
    }
}

/// Where to stop deleting old records so that `keep` remain with the new one (`new_key`):
/// the first existing key kept, or the new key itself when none is. `None`: nothing to trim.
/// The range never reaches the new key, which etcd would refuse in the same transaction.
fn trim_end(existing: &[Vec<u8>], keep: usize, new_key: &str) -> Option<Vec<u8>> {
    let drop = (existing.len() + 1).checked_sub(keep.max(1))?;
    if drop == 0 {
        return None;
    }
    Some(
        existing
            .get(drop)
            .cloned()
            .unwrap_or_else(|| new_key.as_bytes().to_vec()),
    )
}

/// [`trim_end`] from the newest history keys only (newest first, read with limit `keep`), as
/// the creating transaction reads them: where to stop deleting so that `keep` records remain
/// with `new_key`. Fewer than `keep` keys read means all of them were, and none goes.
pub fn trim_from_newest(newest: &[Vec<u8>], keep: u32, new_key: &str) -> Option<Vec<u8>> {
    let keep = keep.max(1) as usize;
    let newest: Vec<&Vec<u8>> = newest.iter().filter(|k| *k != new_key.as_bytes()).collect();
    if newest.len() < keep {
        return None;
    }
    Some(match keep {
        1 => new_key.as_bytes().to_vec(),
        k => newest[k - 2].clone(),
    })
}

/// Adds to `recs` (oldest first) an open record for each candidate key (`keys`: create
/// revision and value) written as elected whose term has no record yet (see
/// [`START_RECORD_HOLD`]), started when it was elected; then keeps the last `n`. Such a term
/// runs, or is about to, as long as its key exists; once it ends, its record is written in
/// the commit that deletes the key.
pub fn with_elected_keys(recs: &mut Vec<Record>, keys: &[(i64, Candidate)], n: Option<usize>) {
    let before = recs.len();
    for (token, c) in keys {
        let Some(elected_ms) = c.elected_ms else {
            continue;
        };
        if recs[..before].iter().any(|r| r.token == *token) {
            continue;
        }
        recs.push(Record::open(*token, &c.id, &c.host, c.pid, elected_ms));
    }
    if recs.len() == before {
        return;
    }
    recs.sort_by_key(|r| r.token);
    if let Some(n) = n {
        let extra = recs.len().saturating_sub(n);
        recs.drain(..extra);
    }
}

/// Fills in the ends of open records (`recs` oldest first), from what is known: the
/// create revisions of the candidate keys that exist (`live`) and when they were read
/// (`observed_ms`).
///
/// An open record whose leader key still exists is a running term: left open, whatever came
/// after it (with `--slots`, later holders run beside it). One whose key is gone ended by
/// losing its lease, at a time nobody recorded: it is marked `lease lost`, unclean, with no
/// `ended_ms`, and `ended_before_ms` is a bound known to be late enough: when the key was seen
/// gone, or with one slot, when the next term was elected (its start minus the takeover
/// delay it waited out), since a term is elected only once the key before it is gone.
pub fn infer_ends(recs: &mut [Record], live: &[i64], one_slot: bool, observed_ms: u64) {
    for i in 0..recs.len() {
        if recs[i].end.is_some() || live.contains(&recs[i].token) {
            continue;
        }
        let next_elected = recs.get(i + 1).filter(|_| one_slot).map(|n| {
            n.started_ms
                .saturating_sub(n.takeover_delay_ms.unwrap_or(0))
        });
        let r = &mut recs[i];
        r.end = Some(TermEnd::LeaseLost.to_string());
        r.ended_ms = None;
        r.clean = Some(false);
        r.ended_before_ms = Some(
            next_elected
                .unwrap_or(observed_ms)
                .min(observed_ms)
                .max(r.started_ms),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(token: i64, end: Option<&str>) -> Record {
        Record {
            end: end.map(str::to_string),
            ..Record::open(token, "w", "h", 1, token as u64 * 1000)
        }
    }

    #[test]
    fn a_key_written_as_elected_is_a_running_term_until_its_record_is_there() {
        let key = |token: i64, elected_ms: Option<u64>| {
            let c = Candidate {
                elected_ms,
                ..Candidate::parse(b"w")
            };
            (token, c)
        };
        // Record 9 is stored; key 12 was elected at creation and has none yet; key 15 waits.
        let mut r = vec![rec(5, Some("exit 0")), rec(9, None)];
        let keys = [key(9, Some(9_000)), key(12, Some(12_345)), key(15, None)];
        with_elected_keys(&mut r, &keys, Some(3));
        let tokens: Vec<i64> = r.iter().map(|x| x.token).collect();
        assert_eq!(tokens, [5, 9, 12]);
        assert_eq!((r[2].started_ms, r[2].end.clone()), (12_345, None));
        assert_eq!(r[1].started_ms, 9_000, "a stored record is kept as it is");
        infer_ends(&mut r, &[9, 12, 15], true, 60_000);
        assert!(r[1].end.is_none() && r[2].end.is_none(), "both run");
        // The last n are kept, the newest term among them.
        let mut r = vec![rec(5, Some("exit 0")), rec(9, Some("exit 0"))];
        with_elected_keys(&mut r, &keys[1..2], Some(2));
        let tokens: Vec<i64> = r.iter().map(|x| x.token).collect();
        assert_eq!(tokens, [9, 12]);
        // Nothing written as elected: nothing added, nothing dropped.
        let mut r = vec![rec(5, Some("exit 0")), rec(9, Some("exit 0"))];
        with_elected_keys(&mut r, &keys[2..], Some(1));
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn an_open_record_whose_key_exists_runs_and_one_whose_key_is_gone_ended_before_a_bound() {
        let mut r = vec![rec(5, None), rec(9, Some("exit 0")), rec(12, None)];
        infer_ends(&mut r, &[12], true, 60_000);
        assert_eq!(r[0].end.as_deref(), Some("lease lost"));
        assert_eq!(r[0].ended_ms, None, "nobody saw it end");
        assert_eq!(r[0].ended_before_ms, Some(9000), "before the next term");
        assert_eq!(r[1].end.as_deref(), Some("exit 0"));
        assert_eq!(r[1].ended_before_ms, None);
        assert_eq!(r[2].end, None, "its key exists: it runs");

        // No successor: the bound is when the key was seen gone.
        let mut r = vec![rec(5, None)];
        infer_ends(&mut r, &[], true, 60_000);
        assert_eq!(r[0].ended_before_ms, Some(60_000));
        assert_eq!(r[0].clean, Some(false));
    }

    #[test]
    fn the_bound_is_the_successors_election_not_its_delayed_start() {
        let mut next = rec(9, None);
        next.takeover_delay_ms = Some(4000);
        let mut r = vec![rec(5, None), next];
        infer_ends(&mut r, &[9], true, 60_000);
        assert_eq!(r[0].ended_before_ms, Some(5000));
        assert_eq!(r[1].end, None);
    }

    #[test]
    fn with_slots_later_holders_say_nothing_about_an_earlier_ones_end() {
        let mut r = vec![rec(5, None), rec(9, None), rec(12, None), rec(14, None)];
        infer_ends(&mut r, &[5, 9, 14], false, 60_000);
        for i in [0, 1, 3] {
            assert_eq!(r[i].end, None, "holder {i} runs");
        }
        assert_eq!(r[2].end.as_deref(), Some("lease lost"));
        assert_eq!(
            r[2].ended_before_ms,
            Some(60_000),
            "not the next holder's start"
        );
    }

    /// The creating transaction reads only the newest `keep` keys: the trim it gives is the
    /// one the whole list gives, for every length and `keep`.
    #[test]
    fn trimming_from_the_newest_keys_matches_trimming_from_all_of_them() {
        for len in 0..8usize {
            let all: Vec<Vec<u8>> = (0..len).map(|i| format!("h/{i:04}").into_bytes()).collect();
            let new_key = "h/9999";
            for keep in 1..10u32 {
                let newest: Vec<Vec<u8>> = all.iter().rev().take(keep as usize).cloned().collect();
                assert_eq!(
                    trim_from_newest(&newest, keep, new_key),
                    trim_end(&all, keep as usize, new_key),
                    "len {len} keep {keep}"
                );
            }
        }
    }

    #[test]
    fn trimming_keeps_n_records_with_the_new_one() {
        let keys: Vec<Vec<u8>> = ["h1", "h2", "h3"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        assert_eq!(trim_end(&keys, 100, "h4"), None);
        assert_eq!(trim_end(&keys, 4, "h4"), None);
        assert_eq!(trim_end(&keys, 3, "h4"), Some(b"h2".to_vec()));
        assert_eq!(trim_end(&keys, 1, "h4"), Some(b"h4".to_vec()));
        assert_eq!(trim_end(&[], 1, "h1"), None);
    }

    #[test]
    fn only_a_lost_lease_or_an_open_record_is_unclean() {
        assert!(rec(1, Some("exit 3")).ended_cleanly());
        assert!(rec(1, Some("resigned")).ended_cleanly());
        assert!(rec(1, Some("timed out")).ended_cleanly());
        assert!(!rec(1, Some("lease lost")).ended_cleanly());
        assert!(
            !rec(1, None).ended_cleanly(),
            "never closed: its worker died"
        );
        let mut r = vec![rec(5, None), rec(9, None)];
        infer_ends(&mut r, &[9], true, 60_000);
        assert_eq!(r[0].clean, Some(false));
        for end in [
            TermEnd::Exited(0),
            TermEnd::Resigned,
            TermEnd::Paused,
            TermEnd::Unhealthy,
            TermEnd::NotStarted,
        ] {
            assert!(end.is_clean());
        }
        assert!(!TermEnd::LeaseLost.is_clean());
    }

    #[test]
    fn start_record_retries_pause_100ms_doubling_to_1s() {
        let ms: Vec<u128> = (0..8).map(|n| start_retry_pause(n).as_millis()).collect();
        assert_eq!(ms, [100, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(start_retry_pause(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn reasons_read_well() {
        assert_eq!(TermEnd::Exited(3).to_string(), "exit 3");
        assert_eq!(TermEnd::Signal(15).to_string(), "signal 15 to lead-exec");
    }
}
