//! Liveness gaps in a history, each with its cause: the periods when no job ran, and for
//! every one longer than the bound the fault or the etcd event that explains it.
//!
//! A cause explains a gap when it was going on during the gap and the gap ended by the time
//! that cause should have stopped costing anything: a fault's heal plus the bound (TTL + 2 s),
//! or an etcd leader change plus the TTL (the new etcd leader extends every lease by its full
//! TTL, so an unrenewed key can live that much longer) plus the bound. A gap over the bound
//! that no cause explains is a finding of its own.

use crate::chaos::Term;

/// Something that can keep every job from running for a while.
#[derive(Debug, Clone)]
pub struct Cause {
    pub name: String,
    pub begin_ns: i64,
    /// By when, at the latest, its cost should be over.
    pub explains_until_ns: i64,
}

/// A period with no job running.
#[derive(Debug, Clone)]
pub struct Gap {
    pub begin_ns: i64,
    pub end_ns: i64,
    /// The cause that explains the gap's end, then any others going on during it.
    pub causes: Vec<String>,
    /// Whether a cause explains it (always true for gaps within the bound).
    pub attributed: bool,
}

impl Gap {
    pub fn secs(&self) -> f64 {
        (self.end_ns - self.begin_ns) as f64 / 1e9
    }
}

/// Gaps between the first job's start and `until_ns` longer than `bound_ns`, with causes.
/// Also returns the longest gap of all, whatever its length.
pub fn gaps(terms: &[Term], causes: &[Cause], bound_ns: i64, until_ns: i64) -> (Vec<Gap>, f64) {
    let mut spans: Vec<(i64, i64)> = terms.iter().map(|t| (t.start_ns, t.end_ns)).collect();
    spans.sort();
    let Some(&(first, _)) = spans.first() else {
        return (Vec::new(), 0.0);
    };
    let mut covered_until = first;
    let mut holes = Vec::new();
    for &(s, e) in &spans {
        if s > covered_until {
            holes.push((covered_until, s));
        }
        covered_until = covered_until.max(e);
    }
    if until_ns > covered_until {
        holes.push((covered_until, until_ns));
    }
    let longest = holes
        .iter()
        .map(|(a, b)| (b - a) as f64 / 1e9)
        .fold(0.0, f64::max);
    let out = holes
        .into_iter()
        .filter(|(a, b)| b - a > bound_ns)
        .map(|(a, b)| attribute(a, b, causes))
        .collect();
    (out, longest)
}

fn attribute(a: i64, b: i64, causes: &[Cause]) -> Gap {
    let mut during: Vec<&Cause> = causes
        .iter()
        .filter(|c| c.begin_ns <= b && c.explains_until_ns >= a)
        .collect();
    // The one that explains the end first.
    during.sort_by_key(|c| std::cmp::Reverse(c.explains_until_ns));
    let attributed = during.first().is_some_and(|c| c.explains_until_ns >= b);
    Gap {
        begin_ns: a,
        end_ns: b,
        causes: during.iter().map(|c| c.name.clone()).collect(),
        attributed,
    }
}
