//! The partition soak: a [`Testbed`], the [`Nemesis`] for a while, then the checker over the
//! history, with every liveness gap attributed to a cause. Shared by the integration test and
//! the `partitions` tool (`src/bin/partitions`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::nemesis::{Injected, Nemesis};
use super::observe::{LeaderChange, LeaderWatch};
use super::{Shaping, Testbed};
use crate::chaos::{mono_ns, Report};
use crate::liveness::{gaps, Cause, Gap};

pub struct Settings {
    pub members: usize,
    pub workers: usize,
    pub ttl: Duration,
    pub lease_args: Vec<String>,
    pub duration: Duration,
    pub seed: u64,
}

impl Settings {
    /// Three members, three workers, TTL 4 s, grace and margin 500 ms.
    pub fn new(duration: Duration, seed: u64) -> Settings {
        Settings {
            members: 3,
            workers: 3,
            ttl: Duration::from_secs(4),
            lease_args: ["--grace", "500ms", "--safety-margin", "500ms"]
                .map(String::from)
                .to_vec(),
            duration,
            seed,
        }
    }
}

/// What a soak saw.
pub struct Outcome {
    pub shaping: Shaping,
    pub report: Report,
    pub faults: Vec<Injected>,
    pub leader_changes: Vec<LeaderChange>,
    /// Gaps longer than TTL + 2 s, each with its causes.
    pub gaps: Vec<Gap>,
    pub longest_gap_s: f64,
    pub bound_s: f64,
    pub revived: usize,
    /// Campaigns that found a key of their own process still in line and revoked it, instead
    /// of waiting behind it until its lease expired.
    pub own_keys_revoked: usize,
    /// Terms whose end etcd did not take: their key was left to its lease, and the next term
    /// waited for the expiry.
    pub ends_left_to_expire: usize,
    pub wall: Duration,
    /// Per fault: (injected, of which at the leader).
    pub counts: BTreeMap<&'static str, (usize, usize)>,
    /// (1, 5, 15 min) load averages at the end.
    pub load: String,
}

impl Outcome {
    /// Safety held and every long gap has a cause.
    pub fn ok(&self) -> bool {
        self.report.violations.is_empty() && self.gaps.iter().all(|g| g.attributed)
    }
}

/// Runs the soak. `say` gets the nemesis's log lines as they happen.
pub fn run(s: &Settings, say: &mut dyn FnMut(&str)) -> Outcome {
    let started = Instant::now();
    let mut tb = Testbed::start(s.members, s.workers, s.ttl, s.lease_args.clone());
    say(&format!("shaping: {}", tb.shaping));
    let watch = LeaderWatch::start(&tb);
    let first = tb.wait_term_after(0, Duration::from_secs(60));
    assert!(first.is_some(), "no first term\n{}", tb.logs());
    let mut nemesis = Nemesis::new(s.seed);
    let end = Instant::now() + s.duration;
    while Instant::now() < end {
        nemesis.step(&mut tb, say);
    }
    tb.heal_all();
    // The last fault's cost, then the end of the history.
    let _ = tb.wait_term_after(0, s.ttl * 3);
    std::thread::sleep(s.ttl);
    let end_ns = mono_ns();
    let leader_changes = watch.changes();
    drop(watch);
    let logs = tb.logs();
    let own_keys_revoked = logs
        .matches("a key of ours from an earlier campaign is still in line")
        .count();
    let ends_left_to_expire = logs
        .matches("term end not recorded: etcd did not answer")
        .count();
    let (_, report) = tb.finish();
    let bound = s.ttl + Duration::from_secs(2);
    let bound_ns = bound.as_nanos() as i64;
    let ttl_ns = s.ttl.as_nanos() as i64;
    let mut causes: Vec<Cause> = nemesis
        .log
        .iter()
        .filter(|f| f.at_leader || !f.target.starts_with('w') || f.target.contains('+'))
        .map(|f| Cause {
            name: format!("{} {}", f.fault, f.target),
            begin_ns: f.begin_ns,
            explains_until_ns: f.heal_ns + bound_ns,
        })
        .collect();
    causes.extend(leader_changes.iter().map(|c| Cause {
        name: format!("etcd leader change ({}): lease extension", c.what),
        begin_ns: c.ns - ttl_ns,
        explains_until_ns: c.ns + ttl_ns + bound_ns,
    }));
    let (gaps, longest_gap_s) = gaps(&report.terms, &causes, bound_ns, end_ns);
    let mut counts: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    for f in &nemesis.log {
        let c = counts.entry(f.fault).or_default();
        c.0 += 1;
        c.1 += usize::from(f.at_leader);
    }
    Outcome {
        shaping: tb.shaping,
        report,
        faults: nemesis.log.clone(),
        leader_changes,
        gaps,
        longest_gap_s,
        bound_s: bound.as_secs_f64(),
        revived: nemesis.revived,
        own_keys_revoked,
        ends_left_to_expire,
        wall: started.elapsed(),
        counts,
        load: std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
    }
}
