//! Chaos soak: mixes faults at random on a three-member etcd with several lead-exec workers
//! writing to a fenced SQLite ledger, then checks the history.
//!
//! ```text
//! cargo run --release -p lead-exec-harness --bin chaos -- --workers 4 --trials 50 --seed 1 [--ttl 3s] [--slots N]
//! ```
//!
//! Prints per-fault counts, failover times (min, median, max) and the checker's verdict; exits
//! 1 on any violation. It builds lead-exec and the ledger example first. The harness is the
//! integration tests' own (this crate, `tests/harness`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: cannot parse {v:?}"))
        })
        .unwrap_or(default)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("usage: chaos [--workers N] [--trials N] [--seed S] [--ttl DURATION] [--slots N]");
        return ExitCode::SUCCESS;
    }
    let workers: usize = arg(&args, "--workers", 4);
    let trials: usize = arg(&args, "--trials", 20);
    let seed: u64 = arg(&args, "--seed", 1);
    let slots: u32 = arg(&args, "--slots", 1);
    let ttl: String = arg(&args, "--ttl", "3s".to_string());
    let ttl = humantime::parse_duration(&ttl).expect("--ttl");

    // lead-exec and the ledger, built beside this tool, where the harness finds them.
    if let Err(e) = harness::build_binaries(false, true) {
        eprintln!("chaos: {e}");
        return ExitCode::FAILURE;
    }

    println!(
        "chaos soak: {workers} workers, {slots} slot(s), {trials} trials, seed {seed}, ttl {}",
        humantime::format_duration(ttl)
    );
    let start = Instant::now();
    let r = harness::chaos::soak(workers, slots, trials, seed, ttl, |line| println!("{line}"));
    let secs = |d: &Duration| d.as_secs_f64();
    println!();
    println!("| fault | injected | failovers | min s | median s | max s | job restarts |");
    println!("|---|---|---|---|---|---|---|");
    for (fault, n) in &r.per_fault {
        let mut f = r.failovers.get(fault).cloned().unwrap_or_default();
        f.sort();
        let (lo, mid, hi) = match f.len() {
            0 => ("-".into(), "-".into(), "-".into()),
            k => (
                format!("{:.2}", secs(&f[0])),
                format!("{:.2}", secs(&f[k / 2])),
                format!("{:.2}", secs(&f[k - 1])),
            ),
        };
        let restarts = if harness::chaos::RIDDEN.contains(fault) {
            r.restarts.get(fault).copied().unwrap_or(0).to_string()
        } else {
            "-".into()
        };
        println!(
            "| {fault} | {n} | {} | {lo} | {mid} | {hi} | {restarts} |",
            f.len()
        );
    }
    let stale = r
        .violations
        .iter()
        .filter(|v| v.starts_with("stale write") || v.contains("wrote after"))
        .count();
    let overlaps = r
        .violations
        .iter()
        .filter(|v| v.starts_with("overlap"))
        .count();
    println!();
    println!("trials: {}", r.trials);
    println!("faults injected: {}", r.faults_injected);
    println!("terms: {}", r.terms);
    println!(
        "ledger writes accepted: {}, rejected: {}",
        r.accepted, r.rejected
    );
    println!("stale writes accepted: {stale}");
    println!(
        "overlaps: {overlaps} (overlaps of deposed workers, all their writes fenced: {})",
        r.fenced_overlaps
    );
    println!(
        "job restarts under routine faults (ridden through by design): {}",
        r.restarts.values().sum::<usize>()
    );
    println!("wall time: {:.0} s", start.elapsed().as_secs_f64());
    if r.violations.is_empty() {
        println!("verdict: OK");
        ExitCode::SUCCESS
    } else {
        println!("verdict: VIOLATIONS");
        for v in &r.violations {
            println!("  {v}");
        }
        ExitCode::FAILURE
    }
}
