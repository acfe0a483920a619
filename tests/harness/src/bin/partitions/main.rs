//! Partition soak: three etcd members and three workers, each in a network namespace of its
//! own on a bridge, under a seeded nemesis of kernel-level faults (nftables drops with no
//! RST, loss, delay, whole workers frozen, members killed). Every worker runs `lead-exec run`
//! with the fenced ledger as its job; at the end the history checker reports overlaps, beats
//! after a newer token, stale writes and liveness gaps, each gap with its cause.
//!
//! ```text
//! cargo run --release -p lead-exec-harness --bin partitions -- --minutes 60 --seed 7 [--ttl 4s] [--workers 3]
//! ```
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables). Exits 1 on a safety violation or a gap
//! over TTL + 2 s with no cause, 2 on bad arguments. The testbed and the checker are the
//! integration tests' own (this crate, `tests/harness`); this file parses and builds lead-exec
//! and the ledger example, `report.rs` prints.

mod report;

use std::process::ExitCode;
use std::time::Duration;

use harness::netns::soak::{run, Settings};

const USAGE: &str =
    "usage: partitions [--minutes N] [--seed S] [--ttl DURATION] [--workers N] [--members N]";

fn value(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .map(|i| args.get(i + 1).cloned().unwrap_or_default())
}

fn parse<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T, String> {
    match value(args, name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| format!("{name}: cannot parse {v:?}")),
    }
}

fn settings(args: &[String]) -> Result<Settings, String> {
    let known = ["--minutes", "--seed", "--ttl", "--workers", "--members"];
    for pair in args.chunks(2) {
        if !known.contains(&pair[0].as_str()) || pair.len() < 2 {
            return Err(format!("unexpected argument {:?}", pair[0]));
        }
    }
    let minutes: f64 = parse(args, "--minutes", 2.0)?;
    if !(minutes > 0.0 && minutes <= 24.0 * 60.0) {
        return Err("--minutes: between 0 and 1440".into());
    }
    let mut s = Settings::new(
        Duration::from_secs_f64(minutes * 60.0),
        parse(args, "--seed", 1)?,
    );
    if let Some(ttl) = value(args, "--ttl") {
        s.ttl = humantime::parse_duration(&ttl).map_err(|e| format!("--ttl: {e}"))?;
    }
    s.workers = parse(args, "--workers", s.workers)?;
    s.members = parse(args, "--members", s.members)?;
    if s.workers < 2 || s.members < 1 {
        return Err("at least 2 workers and 1 member".into());
    }
    Ok(s)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let s = match settings(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("partitions: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = harness::netns::net::require() {
        eprintln!("partitions: {e}");
        return ExitCode::FAILURE;
    }
    // lead-exec and the ledger, built beside this tool, where the harness finds them.
    if let Err(e) = harness::build_binaries(false, true) {
        eprintln!("partitions: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "partition soak: {} members, {} workers, ttl {}, {} min, seed {}, {} cores, load {}",
        s.members,
        s.workers,
        humantime::format_duration(s.ttl),
        s.duration.as_secs_f64() / 60.0,
        s.seed,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        report::load()
    );
    let etcd = harness::need("etcd", "etcd-server");
    let version = std::process::Command::new(&etcd)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default();
    println!("etcd: {} ({version})", etcd.display());
    let outcome = run(&s, &mut |line| println!("{line}"));
    report::print(&s, &outcome);
    if outcome.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
