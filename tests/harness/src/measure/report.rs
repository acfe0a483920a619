//! The report: a Markdown table with one row per metric, then notes.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::thread;

use super::etcd::etcd_bin;

/// What one scenario found.
pub struct Report {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

/// One line of the table.
pub struct Row {
    pub scenario: String,
    pub metric: String,
    pub lead_exec: String,
    pub etcdctl: String,
    pub goal: String,
    pub met: String,
}

impl Row {
    pub fn new(
        scenario: &str,
        metric: &str,
        le: String,
        ctl: String,
        goal: &str,
        met: &str,
    ) -> Row {
        Row {
            scenario: scenario.into(),
            metric: metric.into(),
            lead_exec: le,
            etcdctl: ctl,
            goal: goal.into(),
            met: met.into(),
        }
    }

    pub fn error(scenario: &str, e: String) -> Row {
        Row::new(
            scenario,
            &format!("error: {}", e.replace('|', "/")),
            "–".into(),
            "–".into(),
            "",
            "",
        )
    }
}

/// The table of every scenario's rows, then the notes as a list.
pub fn print_table(rows: &[Row], notes: &[String]) {
    println!();
    println!("| scenario | metric | lead-exec | etcdctl lock | goal | met? |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.scenario, r.metric, r.lead_exec, r.etcdctl, r.goal, r.met
        );
    }
    println!();
    println!("Notes:");
    for n in notes {
        println!("- {n}");
    }
}

pub fn yes_no(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

pub fn print_header(bin: &Path, quick: bool) {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|s| s.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let nproc = thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|s| s.trim().to_string()))
        .unwrap_or_default();
    let first_line = |prog: &str, args: &[&str]| {
        Command::new(etcd_bin(prog))
            .args(args)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_else(|e| format!("{prog}: {e}"))
    };
    println!(
        "# lead-exec benchmark{}",
        if quick { " (--quick)" } else { "" }
    );
    println!();
    println!(
        "- machine: {nproc} CPUs, {model}, Linux {}, {mem} RAM; load average at start: {}",
        kernel.trim(),
        loadavg()
    );
    println!("- {}", first_line("etcd", &["--version"]));
    println!("- {}", first_line("etcdctl", &["version"]));
    println!(
        "- {} ({})",
        first_line(&bin.display().to_string(), &["--version"]),
        bin.display()
    );
    println!(
        "- date: {}",
        first_line("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"])
    );
    println!("- etcd: one member on loopback, default settings, fresh data dir in a temp dir");
}

pub fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
