//! The settings every candidate of an election must share: `--slots` and `--takeover-delay`.
//!
//! They live in `lead-exec/meta/NAME/slots` and `lead-exec/meta/NAME/takeover-delay`. The
//! creating transaction compares them with ours, and only a candidate that finds no other
//! candidate may rewrite them. Two slot counts at once would let more jobs run than either
//! allows; and the next leader judges a term by the start record that only a worker with a
//! takeover delay writes before its job.

use std::time::Duration;

use etcd_client::{Compare, CompareOp};

use super::Joining;
use crate::election::Election;
use crate::exit::{fail, Exit};

/// What a candidate's settings store in the election's meta keys; `None` is the default,
/// stored as an absent key (as before the key existed).
pub(super) struct Agreed {
    /// `meta/NAME/slots`: N when above 1.
    pub(super) slots: Option<String>,
    /// `meta/NAME/takeover-delay`: milliseconds, when above 0.
    pub(super) delay: Option<String>,
}

impl Joining<'_> {
    pub(super) fn agreed(&self) -> Agreed {
        // Rounded up: any delay at all writes the start record first, which is what must agree.
        let ms = self.takeover_delay.as_nanos().div_ceil(1_000_000);
        Agreed {
            slots: (self.slots > 1).then(|| self.slots.to_string()),
            delay: (ms > 0).then(|| ms.to_string()),
        }
    }
}

/// The compare that holds when meta key `key` stores `value` (absent for `None`).
pub(super) fn agree(key: String, value: &Option<String>) -> Compare {
    match value {
        None => Compare::version(key, CompareOp::Equal, 0),
        Some(v) => Compare::value(key, CompareOp::Equal, v.clone()),
    }
}

/// Whether a stored meta value is the one we would store.
pub(super) fn same(stored: &Option<Vec<u8>>, ours: &Option<String>) -> bool {
    stored.as_deref() == ours.as_ref().map(|v| v.as_bytes())
}

/// Refuses a candidate whose `--slots` differs from the one the election's candidates run
/// with (`stored`, absent meaning 1): two counts at once would let more jobs run than either
/// allows.
pub(super) fn disagree(e: &Election, stored: Option<&[u8]>, ours: u32) -> anyhow::Error {
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
pub(super) fn disagree_delay(e: &Election, stored: Option<&[u8]>, ours: Duration) -> anyhow::Error {
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

#[cfg(test)]
mod tests {
    use super::*;

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
