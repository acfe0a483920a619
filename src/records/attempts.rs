//! Attempts at a run key (`run --attempts N`): how many terms claimed one, shared by the fleet
//! in `lead-exec/meta/NAME/attempts/KEY`.
//!
//! A term claims the next attempt before its job starts, in one transaction guarded by its
//! leader key, by the run key's absence (not done) and by the record as the term read it (no
//! claim in between). So each attempt is counted once, by the term that runs it, and a claim
//! counts whatever follows it: a job that fails, is killed, times out, or whose term is lost
//! before or while it runs has used its attempt. Counting claims rather than failures needs no
//! write at the end of a term, which a lost term could not make. The record lives on a lease
//! of `--run-key-ttl`, granted with the first attempt and renewed by each claim: the count is
//! kept for `--run-key-ttl` after the last attempt.

use std::time::Duration;

use anyhow::{anyhow, Result};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::Writer;
use crate::election::{unix_ms, Ctx};

/// The attempts record: the last claim and how many there were.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempted {
    /// Attempts claimed so far, the last one included.
    pub count: u32,
    /// The token and worker of the last claim.
    pub token: i64,
    pub id: String,
    pub claimed_ms: u64,
}

/// What etcd holds for a run key's attempts, as read at one revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// A success is recorded: no attempt is left to make.
    pub done: bool,
    /// Attempts claimed so far.
    pub count: u32,
    /// The record's mod revision (0: no record), which a claim compares.
    mod_revision: i64,
    /// The record's lease (0: none), which later claims keep.
    lease: i64,
    /// The token of the last claim (0: none).
    last_token: i64,
}

/// An attempt a term claimed, as its claim wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    /// Which attempt (1-based).
    pub n: u32,
    /// The revision of the claim's write, which a give-back compares.
    revision: i64,
    lease: i64,
}

/// How a term's claim of an attempt went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This term runs this attempt.
    Attempt(Claimed),
    /// Another term's attempt succeeded: the run key is done.
    Done,
    /// N attempts were made and none succeeded: none may follow.
    Exhausted(u32),
    /// Our leader key is gone: the term is over, nothing was claimed.
    Lost,
}

/// Times a claim reads and tries again after the record changed under it (or its lease ran
/// out) before it gives up with an error.
const CLAIM_TRIES: u32 = 3;

impl Attempted {
    /// The record saying `count` attempts were claimed, the last by `writer` now, as a write of
    /// `key` on `lease`.
    fn put(writer: Writer<'_>, count: u32, key: &str, lease: i64) -> Result<TxnOp> {
        let rec = Attempted {
            count,
            token: writer.token,
            id: writer.id.to_string(),
            claimed_ms: unix_ms(),
        };
        let value = serde_json::to_string(&rec)?;
        Ok(TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(lease)),
        ))
    }
}

impl Ctx {
    /// The attempts at `run_key` so far, and whether one succeeded, read in one request.
    pub async fn attempts_of(&self, run_key: &str) -> Result<Tally> {
        let (mut c, e) = (self.client.clone(), &self.election);
        let txn = Txn::new().and_then([
            TxnOp::get(
                e.run_key(run_key),
                Some(GetOptions::new().with_count_only()),
            ),
            TxnOp::get(e.attempts_key(run_key), None),
        ]);
        let resp = self.bounded(c.txn(txn)).await?;
        let mut done = false;
        let mut tally = Tally {
            done: false,
            count: 0,
            mod_revision: 0,
            lease: 0,
            last_token: 0,
        };
        for (i, op) in resp.op_responses().into_iter().enumerate() {
            let etcd_client::TxnOpResponse::Get(r) = op else {
                continue;
            };
            if i == 0 {
                done = r.count() > 0;
            } else if let Some(kv) = r.kvs().first() {
                let rec: Attempted = serde_json::from_slice(kv.value())
                    .map_err(|err| anyhow!("the attempts record of run key {run_key}: {err}"))?;
                tally.count = rec.count;
                tally.mod_revision = kv.mod_revision();
                tally.lease = kv.lease();
                tally.last_token = rec.token;
            }
        }
        tally.done = done;
        Ok(tally)
    }

    /// Claims the next attempt at `run_key` for `writer`'s term, if one of `max` is left and
    /// no attempt succeeded: see the module's comment for what the transaction compares.
    ///
    /// A claim whose answer was lost (etcd stalled past the command timeout after it
    /// committed) is found again by the next read, by its token: the term runs the attempt it
    /// claimed rather than count it as someone else's.
    pub async fn claim_attempt(
        &self,
        writer: Writer<'_>,
        run_key: &str,
        max: u32,
        ttl: Duration,
    ) -> Result<Claim> {
        let mut granted = None;
        let claim = self
            .try_claims(writer, run_key, max, ttl, &mut granted)
            .await;
        // A lease granted for a record that was not written holds nothing: give it back.
        let used = matches!(&claim, Ok(Claim::Attempt(c)) if Some(c.lease) == granted);
        if let (Some(lease), false) = (granted, used) {
            let mut c = self.client.clone();
            let _ = self.bounded(c.lease_revoke(lease)).await;
        }
        claim
    }

    async fn try_claims(
        &self,
        writer: Writer<'_>,
        run_key: &str,
        max: u32,
        ttl: Duration,
        granted: &mut Option<i64>,
    ) -> Result<Claim> {
        let (mut c, e) = (self.client.clone(), &self.election);
        let Writer { token, key, .. } = writer;
        let record_key = e.attempts_key(run_key);
        let ttl = ttl.as_secs().max(1) as i64;
        for _ in 0..CLAIM_TRIES {
            let tally = self.attempts_of(run_key).await?;
            if tally.last_token == token {
                return Ok(Claim::Attempt(Claimed {
                    n: tally.count,
                    revision: tally.mod_revision,
                    lease: tally.lease,
                }));
            }
            if tally.done {
                return Ok(Claim::Done);
            }
            if tally.count >= max {
                return Ok(Claim::Exhausted(tally.count));
            }
            // The record lives --run-key-ttl from its last claim: its lease is renewed here,
            // or granted with the first.
            let lease = match tally.lease {
                0 => match *granted {
                    Some(l) => l,
                    None => {
                        let l = self.bounded(c.lease_grant(ttl, None)).await?.id();
                        *granted = Some(l);
                        l
                    }
                },
                l => {
                    if !self.renew_once(l).await? {
                        // It ran out since the read, and the record with it: read again.
                        continue;
                    }
                    l
                }
            };
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key, CompareOp::Equal, token),
                    Compare::create_revision(e.run_key(run_key), CompareOp::Equal, 0),
                    Compare::mod_revision(
                        record_key.as_str(),
                        CompareOp::Equal,
                        tally.mod_revision,
                    ),
                ])
                .and_then([Attempted::put(writer, tally.count + 1, &record_key, lease)?])
                .or_else([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
            let resp = match self.bounded(c.txn(txn)).await {
                Ok(r) => r,
                // Unanswered, or refused (the lease ran out meanwhile): whether it landed is
                // what the next read says.
                Err(err) => {
                    tracing::debug!("attempts record: {err:#}; reading it again");
                    continue;
                }
            };
            if resp.succeeded() {
                let revision = resp.header().map_or(0, |h| h.revision());
                return Ok(Claim::Attempt(Claimed {
                    n: tally.count + 1,
                    revision,
                    lease,
                }));
            }
            // Our key, as created at our token: a key of the same name made since is not.
            let ours = resp.op_responses().into_iter().any(|op| {
                matches!(op, etcd_client::TxnOpResponse::Get(r)
                    if r.kvs().first().is_some_and(|kv| kv.create_revision() == token))
            });
            if !ours {
                return Ok(Claim::Lost);
            }
            // The run key was recorded, or the record changed: the next read says which.
        }
        Err(anyhow!(
            "the attempts record of run key {run_key} could not be claimed in {CLAIM_TRIES} tries"
        ))
    }

    /// Renews `lease` once: `false` if it is gone.
    async fn renew_once(&self, lease: i64) -> Result<bool> {
        let mut c = self.client.clone();
        let ttl = self
            .bounded(async move {
                let (mut keeper, mut answers) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                Ok(answers.message().await?.map_or(0, |a| a.ttl()))
            })
            .await?;
        Ok(ttl > 0)
    }

    /// Gives back the attempt `claimed` for `writer`'s term, which ended by an operator's
    /// move (pause, resign, a handover to a higher priority) rather than a failure: the next
    /// term makes the same attempt again. Only while our key still guards the write and the
    /// record is still our claim's; `Ok(false)` if not.
    pub async fn give_back_attempt(
        &self,
        writer: Writer<'_>,
        run_key: &str,
        claimed: Claimed,
    ) -> Result<bool> {
        let (mut c, e) = (self.client.clone(), &self.election);
        let Writer { token, key, .. } = writer;
        let record_key = e.attempts_key(run_key);
        let back = Attempted::put(writer, claimed.n - 1, &record_key, claimed.lease)?;
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, token),
                Compare::mod_revision(record_key.as_str(), CompareOp::Equal, claimed.revision),
            ])
            .and_then([back]);
        Ok(self.bounded(c.txn(txn)).await?.succeeded())
    }
}
