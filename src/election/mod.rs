//! The etcd side of leadership: key layout, lease keepalive, the campaign, the leader's watch.
//!
//! # Key layout
//!
//! ```text
//! lead-exec/elections/NAME/<lease id, hex>   one key per candidate, attached to its lease;
//!                                             the lowest create revision leads. Same layout as
//!                                             etcd's own election, so `etcdctl elect --listen
//!                                             lead-exec/elections/NAME` shows the leader.
//! lead-exec/meta/NAME/paused                  the kill switch (`pause`/`resume`)
//! lead-exec/meta/NAME/resign                  a resign request: the leader's token
//! lead-exec/meta/NAME/priority/<lease hex>    a candidate's --priority, when above 0
//! lead-exec/meta/NAME/history/<token, 20 digits>  one record per term
//! lead-exec/meta/NAME/runs/<run key>          completed `--run-key`s, with their own lease
//! lead-exec/meta/NAME/attempts/<run key>      `--attempts` claimed at a run key, on a lease
//! lead-exec/meta/NAME/slots                   `--slots N` when N > 1 (absent: 1), no lease
//! lead-exec/meta/NAME/takeover-delay          `--takeover-delay` in ms when above 0, no lease
//! lead-exec/meta/NAME/slot/<i>                slot i of a holder, on its lease (N > 1 only)
//! ```
//!
//! Metadata lives outside `lead-exec/elections/NAME/` because every key under a candidate
//! prefix counts as a candidate. Names cannot contain `/`, so no election's prefix nests inside
//! another's.

pub mod campaign;
pub mod leader;
pub mod lease;
pub mod schedule;
pub mod scope;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::exit::{fail, Exit};

/// Top of every key this program writes (the connection probe reads it too).
pub use crate::etcd::ROOT;
pub use scope::Ctx;

/// A validated election name and the keys that belong to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Election {
    name: String,
}

impl Election {
    /// Accepts 1 to 128 letters, digits, `.`, `_` and `-`.
    pub fn new(name: &str) -> Result<Election> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if name.is_empty() || name.len() > 128 {
            return Err(fail(
                Exit::Usage,
                format!(
                    "invalid election name '{}': must be 1 to 128 characters",
                    crate::text::quoted(name)
                ),
            ));
        }
        if let Some(bad) = name.chars().find(|c| !ok_char(*c)) {
            return Err(fail(
                Exit::Usage,
                format!(
                    "invalid election name '{}': '{bad}' is not allowed (use letters, digits, '.', '_' and '-')",
                    crate::text::quoted(name)
                ),
            ));
        }
        if name == "." || name == ".." {
            return Err(fail(Exit::Usage, format!("invalid election name '{name}'")));
        }
        Ok(Election {
            name: name.to_string(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The candidates' prefix, without the trailing slash (what `etcdctl elect` takes).
    pub fn prefix(&self) -> String {
        format!("{ROOT}/elections/{}", self.name)
    }

    /// Range prefix that holds exactly this election's candidate keys.
    pub fn candidates(&self) -> String {
        format!("{}/", self.prefix())
    }

    /// The candidate key for a lease, as etcd's own election names it.
    pub fn candidate_key(&self, lease: i64) -> String {
        format!("{}/{:x}", self.prefix(), lease)
    }

    fn meta(&self) -> String {
        format!("{ROOT}/meta/{}", self.name)
    }

    pub fn paused_key(&self) -> String {
        format!("{}/paused", self.meta())
    }

    /// A resign request: holds the token of the leader asked to step down, on that leader's
    /// lease, so it vanishes with the term.
    pub fn resign_key(&self) -> String {
        format!("{}/resign", self.meta())
    }

    /// Priorities above 0 (`--priority`), one per candidate, on its lease.
    pub fn priority_prefix(&self) -> String {
        format!("{}/priority/", self.meta())
    }

    pub fn priority_key(&self, lease: i64) -> String {
        format!("{}{:x}", self.priority_prefix(), lease)
    }

    /// Workers out of line because their health check fails, one per worker, on its lease.
    pub fn unhealthy_key(&self, lease: i64) -> String {
        format!("{}/unhealthy/{:x}", self.meta(), lease)
    }

    pub fn unhealthy_prefix(&self) -> String {
        format!("{}/unhealthy/", self.meta())
    }

    pub fn history_prefix(&self) -> String {
        format!("{}/history/", self.meta())
    }

    /// History keys sort by token because the token is zero-padded.
    pub fn history_key(&self, token: i64) -> String {
        format!("{}{:020}", self.history_prefix(), token)
    }

    pub fn run_key(&self, key: &str) -> String {
        format!("{}/runs/{key}", self.meta())
    }

    /// The attempts claimed at a run key (`--attempts`): beside `runs/`, not under it, since
    /// a run key's presence there means done.
    pub fn attempts_key(&self, key: &str) -> String {
        format!("{}/attempts/{key}", self.meta())
    }

    /// The number of slots every candidate must agree on; absent means 1.
    pub fn slots_key(&self) -> String {
        format!("{}/slots", self.meta())
    }

    /// The `--takeover-delay` every candidate must agree on, in milliseconds; absent means
    /// none.
    pub fn takeover_delay_key(&self) -> String {
        format!("{}/takeover-delay", self.meta())
    }

    /// Range prefix of the slot keys that holders claim.
    pub fn slot_prefix(&self) -> String {
        format!("{}/slot/", self.meta())
    }

    pub fn slot_key(&self, slot: u32) -> String {
        format!("{}{slot}", self.slot_prefix())
    }
}

/// Run keys become part of an etcd key: same alphabet as names, plus ':' and '+' for timestamps.
pub fn validate_run_key(key: &str) -> Result<()> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '+');
    if key.is_empty() || key.len() > 256 || !key.chars().all(ok) {
        return Err(fail(
            Exit::Usage,
            format!(
                "invalid --run-key '{}': use 1 to 256 letters, digits, '.', '_', '-', ':' or '+'",
                crate::text::quoted(key)
            ),
        ));
    }
    Ok(())
}

/// What a candidate key's value says about its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub id: String,
    pub host: String,
    pub pid: u32,
    /// When this lead-exec process started, in Unix milliseconds.
    pub started_ms: u64,
    /// `--priority`; absent means 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u32,
    /// While a leader waits out `--takeover-delay`: when its job is due to start, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover_until_ms: Option<u64>,
    /// Set by the transaction that created the key when that same transaction elected it (one
    /// slot, no older key, no pause), at the time it was sent, Unix ms: the key's term may run
    /// a job before its start record is written (see `history::START_RECORD_HOLD`), and readers
    /// of the history count it as a running term until the record is there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elected_ms: Option<u64>,
}

fn is_zero(p: &u32) -> bool {
    *p == 0
}

impl Candidate {
    pub fn this_process(id: &str) -> Candidate {
        Candidate {
            id: id.to_string(),
            host: hostname(),
            pid: std::process::id(),
            started_ms: unix_ms(),
            priority: 0,
            takeover_until_ms: None,
            elected_ms: None,
        }
    }

    /// Reads a candidate value; values written by other tools (`etcdctl elect NAME VALUE`)
    /// become a candidate whose id is the raw value.
    pub fn parse(value: &[u8]) -> Candidate {
        serde_json::from_slice(value).unwrap_or_else(|_| Candidate {
            id: String::from_utf8_lossy(value).into_owned(),
            host: String::new(),
            pid: 0,
            started_ms: 0,
            priority: 0,
            takeover_until_ms: None,
            elected_ms: None,
        })
    }

    /// Whether both values were written by the same lead-exec process: same host, pid and
    /// start time (a pid reused later starts at another time). Foreign values never match.
    pub fn same_process(&self, other: &Candidate) -> bool {
        self.pid != 0
            && self.started_ms != 0
            && self.pid == other.pid
            && self.started_ms == other.started_ms
            && self.host == other.host
            && self.id == other.id
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("candidate serializes")
    }
}

/// Wall-clock milliseconds since the Unix epoch, for human-facing timestamps only.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// This machine's host name, for candidate identities.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for ok in ["a", "settlement", "eu-west.settle_1", &"x".repeat(128)] {
            Election::new(ok).unwrap();
        }
        for bad in ["", "a/b", "a b", "ünï", "..", &"x".repeat(129)] {
            let e = Election::new(bad).unwrap_err();
            assert!(
                e.to_string().contains("invalid election name"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn layout_matches_etcd_election() {
        let e = Election::new("settle").unwrap();
        assert_eq!(e.candidate_key(0x694d), "lead-exec/elections/settle/694d");
        assert!(e.candidate_key(1).starts_with(&e.candidates()));
    }

    #[test]
    fn metadata_is_outside_every_candidate_prefix() {
        let e = Election::new("settle").unwrap();
        for k in [
            e.paused_key(),
            e.resign_key(),
            e.priority_key(5),
            e.history_key(5),
            e.run_key("x"),
            e.slots_key(),
            e.takeover_delay_key(),
            e.slot_key(0),
        ] {
            assert!(!k.starts_with(&e.candidates()));
            assert!(!k.starts_with(&format!("{ROOT}/elections/")));
        }
    }

    #[test]
    fn sibling_names_do_not_share_a_prefix() {
        let a = Election::new("a").unwrap();
        let ab = Election::new("a-b").unwrap();
        assert!(!ab.candidate_key(1).starts_with(&a.candidates()));
    }

    #[test]
    fn history_keys_sort_by_token() {
        let e = Election::new("s").unwrap();
        assert!(e.history_key(9) < e.history_key(10));
    }

    #[test]
    fn foreign_values_parse_as_ids() {
        let c = Candidate::parse(b"etcdctl-proposal");
        assert_eq!(c.id, "etcdctl-proposal");
        let me = Candidate::this_process("w1");
        assert_eq!(Candidate::parse(me.encode().as_bytes()), me);
    }

    #[test]
    fn a_process_recognises_its_own_values_only() {
        let me = Candidate::this_process("w1");
        let mut later = me.clone();
        later.takeover_until_ms = Some(5);
        assert!(me.same_process(&later));
        let mut reused = me.clone();
        reused.started_ms += 1;
        assert!(!me.same_process(&reused), "a reused pid");
        let foreign = Candidate::parse(b"w1");
        assert!(!me.same_process(&foreign));
        assert!(
            !foreign.same_process(&foreign),
            "foreign values never match"
        );
    }

    #[test]
    fn run_keys_are_validated() {
        validate_run_key("20261202T1530").unwrap();
        assert!(validate_run_key("a/b").is_err());
        assert!(validate_run_key("").is_err());
    }
}
