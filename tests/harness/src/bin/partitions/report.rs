//! The report: the nemesis counts, the checker's table, the gaps with their causes.

use harness::netns::nemesis::{describe, FAULTS};
use harness::netns::soak::{Outcome, Settings};

/// The load averages (1, 5, 15 min): the machine is shared, and load stretches every timing.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

pub fn print(s: &Settings, o: &Outcome) {
    let r = &o.report;
    println!();
    println!("| fault | what | injected | at the leader |");
    println!("|---|---|---|---|");
    for f in FAULTS {
        let (n, at) = o.counts.get(f).copied().unwrap_or_default();
        println!("| {f} | {} | {n} | {at} |", describe(f));
    }
    println!();
    let stale = r.stale_writes();
    let overlaps = r.overlaps();
    let beats = r.late_beats - r.late_beats_deposed;
    let unattributed = o.gaps.iter().filter(|g| !g.attributed).count();
    println!("| check | result |");
    println!("|---|---|");
    println!(
        "| faults injected (seed {}) | {} in {:.1} min |",
        s.seed,
        o.faults.len(),
        o.wall.as_secs_f64() / 60.0
    );
    println!("| shaping | {} |", o.shaping);
    println!("| terms | {} |", r.terms.len());
    println!(
        "| ledger writes accepted / rejected | {} / {} |",
        r.accepted, r.rejected
    );
    println!(
        "| **overlaps** | **{overlaps}** (plus {} of a frozen worker's job, fenced) |",
        r.fenced_overlaps
    );
    println!(
        "| **beats of an old token after a newer token's start** | **{beats}** (plus {} by a frozen worker) |",
        r.late_beats_deposed
    );
    println!("| **stale writes accepted** | **{stale}** |");
    println!("| etcd leader changes seen | {} |", o.leader_changes.len());
    println!("| longest gap with no job | {:.2} s |", o.longest_gap_s);
    println!(
        "| gaps over TTL + 2 s ({:.0} s) | {} ({unattributed} with no cause) |",
        o.bound_s,
        o.gaps.len()
    );
    println!("| lead-exec restarted after exiting | {} |", o.revived);
    println!(
        "| a candidate's own key found in line, revoked at once (not waited behind) | {} |",
        o.own_keys_revoked
    );
    println!(
        "| a finished term's key left to its lease (etcd took no end) | {} |",
        o.ends_left_to_expire
    );
    println!("| load at the end (1, 5, 15 min) | {} |", o.load);
    if !o.gaps.is_empty() {
        println!();
        println!("| gap start s | length s | cause |");
        println!("|---|---|---|");
        let t0 = o.faults.first().map_or(0, |f| f.begin_ns);
        for g in &o.gaps {
            let cause = if g.attributed {
                // The first cause is the one that explains the gap's end.
                match g.causes.split_first() {
                    Some((first, [])) => first.clone(),
                    Some((first, rest)) => format!("{first} (also during it: {})", rest.join("; ")),
                    None => String::new(),
                }
            } else if g.causes.is_empty() {
                "**none**".into()
            } else {
                format!("**not explained** by {}", g.causes.join(", "))
            };
            println!(
                "| {:.2} | {:.2} | {cause} |",
                (g.begin_ns - t0) as f64 / 1e9,
                g.secs()
            );
        }
    }
    println!();
    if o.ok() {
        println!("verdict: OK");
    } else {
        println!("verdict: VIOLATIONS");
        for v in &r.violations {
            println!("  {v}");
        }
        for g in o.gaps.iter().filter(|g| !g.attributed) {
            println!("  liveness gap of {:.2} s with no cause", g.secs());
        }
    }
}
