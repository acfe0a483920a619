//! `GET /leader`: 200 while this worker holds a term and its job runs, 503 otherwise, with a
//! small JSON body; for load balancers and readiness probes that should reach the leader only.
//!
//! Read off the metrics, with no state of its own: the job runs (`lead_exec_is_leader`), its
//! term is held (`lead_exec_slot` is not -1: it goes to -1 as soon as a term is lost, while
//! the job is still being stopped), and the body's values are `lead_exec_fencing_token`,
//! `lead_exec_job_start_time_seconds`, the `election` label, `lead_exec_info`'s `id`, and,
//! with `--slots` above 1 (`lead_exec_slots`), the slot.

use std::time::{Duration, SystemTime};

use prometheus::core::Collector;
use serde::Serialize;

use super::METRICS;

/// What the gauges say about this worker's term.
#[derive(Debug, Clone, PartialEq)]
struct Gauges {
    election: String,
    id: String,
    slots: i64,
    is_leader: i64,
    slot: i64,
    token: i64,
    /// `lead_exec_job_start_time_seconds`.
    job_start: f64,
}

/// The body, in this order. `slot` is left out with one slot, and null without a term;
/// `token` and `since` are null without one.
#[derive(Debug, Serialize)]
struct Body<'a> {
    election: &'a str,
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    slot: Option<Option<i64>>,
    token: Option<i64>,
    /// RFC 3339, UTC, in milliseconds: when the term's job started.
    since: Option<String>,
}

fn gauges() -> Gauges {
    let m = &*METRICS;
    // The worker's --id is `lead_exec_info`'s label.
    let id = m
        .info
        .collect()
        .iter()
        .flat_map(|f| f.get_metric())
        .flat_map(|s| s.get_label())
        .find(|l| l.name() == "id")
        .map(|l| l.value().to_string())
        .unwrap_or_default();
    Gauges {
        election: m.election.get().cloned().unwrap_or_default(),
        id,
        slots: m.slots.get(),
        is_leader: m.is_leader.get(),
        slot: m.slot.get(),
        token: m.token.get(),
        job_start: m.job_start.get(),
    }
}

/// Whether this worker leads, and the JSON body that says so.
fn answer(g: &Gauges) -> (bool, String) {
    let leads = g.is_leader == 1 && g.slot >= 0;
    let since = Duration::from_millis((g.job_start * 1000.0).round().max(0.0) as u64);
    let body = Body {
        election: &g.election,
        id: &g.id,
        slot: (g.slots > 1).then_some(leads.then_some(g.slot)),
        token: leads.then_some(g.token),
        since: leads
            .then(|| humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + since).to_string()),
    };
    let mut text = serde_json::to_string(&body).expect("the body serializes");
    text.push('\n');
    (leads, text)
}

/// `/leader`'s answer now: whether this worker leads (200, else 503), and the body.
pub fn leader() -> (bool, String) {
    answer(&gauges())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leading() -> Gauges {
        Gauges {
            election: "settle".into(),
            id: "w1".into(),
            slots: 1,
            is_leader: 1,
            slot: 0,
            token: 42,
            job_start: 1_767_225_600.123,
        }
    }

    #[test]
    fn a_leader_answers_with_its_token_and_the_start_of_its_job() {
        let (leads, body) = answer(&leading());
        assert!(leads);
        assert_eq!(
            body,
            "{\"election\":\"settle\",\"id\":\"w1\",\"token\":42,\"since\":\"2026-01-01T00:00:00.123Z\"}\n"
        );
    }

    #[test]
    fn with_slots_the_body_names_the_slot_and_null_without_a_term() {
        let g = Gauges {
            slots: 3,
            slot: 2,
            ..leading()
        };
        let (_, body) = answer(&g);
        assert!(body.contains("\"slot\":2,\"token\":42"), "{body}");
        let waiting = Gauges {
            is_leader: 0,
            slot: -1,
            ..g
        };
        let (leads, body) = answer(&waiting);
        assert!(!leads);
        assert_eq!(
            body,
            "{\"election\":\"settle\",\"id\":\"w1\",\"slot\":null,\"token\":null,\"since\":null}\n"
        );
    }

    #[test]
    fn no_term_or_no_job_is_no_leader() {
        // Waiting in line, after a term (the last token stays on /metrics), elected with the
        // job not started yet, and a lost term whose job is still being stopped.
        for (is_leader, slot) in [(0, -1), (0, 0), (1, -1)] {
            let g = Gauges {
                is_leader,
                slot,
                ..leading()
            };
            let (leads, body) = answer(&g);
            assert!(!leads, "{g:?}");
            assert_eq!(
                body,
                "{\"election\":\"settle\",\"id\":\"w1\",\"token\":null,\"since\":null}\n"
            );
        }
    }
}
