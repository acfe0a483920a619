//! The kernel's side of the testbed: network namespaces, veth pairs on a bridge, nftables
//! rules and qdiscs, each driven through `ip`, `nft` and `tc`.
//!
//! Every namespace is named `lxnet-<owner pid>-<testbed>-<role>`, so that parallel testbeds
//! (in one process or many) never share a name and [`sweep`] can tell a dead owner's
//! leftovers from a live one's. Interfaces live inside the namespaces only (the bridge in a
//! hub namespace of its own), so the host's own network is never touched and every testbed
//! can use the same addresses.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

/// Every namespace this harness creates starts with this.
pub const PREFIX: &str = "lxnet-";

/// The testbed's subnet, the same in every testbed: each one has its own bridge.
pub const SUBNET: &str = "10.77.0";

/// What the testbed needs from the host, checked before anything is created. A missing
/// piece is a failure that names it, never a skip.
pub fn require() -> Result<(), String> {
    let mut missing = Vec::new();
    for (tool, package) in [("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")] {
        if find(tool).is_none() {
            missing.push(format!(
                "`{tool}` (install the Debian package `{package}`; bash .ci/run does this)"
            ));
        }
    }
    if !missing.is_empty() {
        return Err(format!(
            "the network-namespace testbed needs {}",
            missing.join(" and ")
        ));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the network-namespace testbed needs root (ip netns add)".into());
    }
    let probe = scratch("probe");
    let made = run(&["ip", "netns", "add", &probe]);
    let nft = made.and_then(|_| {
        nft(
            &probe,
            "add table inet probe\nadd chain inet probe c { type filter hook output priority 0; policy accept; }\nadd rule inet probe c numgen random mod 100 < 1 drop",
        )
    });
    let _ = run(&["ip", "netns", "del", &probe]);
    match nft {
        Ok(()) => Ok(()),
        Err(e) => Err(format!(
            "the network-namespace testbed needs `ip netns` and nftables inside a namespace: {e}"
        )),
    }
}

/// Where `tool` is: PATH, then the sbin directories a non-login root shell may lack.
pub fn tool(tool: &str) -> std::path::PathBuf {
    find(tool).unwrap_or_else(|| tool.into())
}

fn find(tool: &str) -> Option<std::path::PathBuf> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// A name for a throwaway namespace, unique across the threads of this process.
fn scratch(what: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("{PREFIX}{}-{what}{n}", std::process::id())
}

/// Runs a command to completion; its stderr is the error.
pub fn run(argv: &[&str]) -> Result<(), String> {
    let tool = find(argv[0]).ok_or_else(|| format!("`{}` not found", argv[0]))?;
    let out = Command::new(tool)
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", argv.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// As [`run`], panicking on failure: for set-up steps the testbed cannot do without.
pub fn must(argv: &[&str]) {
    run(argv).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `argv` inside namespace `ns`.
pub fn run_in(ns: &str, argv: &[&str]) -> Result<(), String> {
    let first = tool(argv[0]);
    let mut all = vec!["ip", "netns", "exec", ns, first.to_str().unwrap_or(argv[0])];
    all.extend_from_slice(&argv[1..]);
    run(&all)
}

/// Feeds an nft script to `nft -f -` inside `ns`.
pub fn nft(ns: &str, script: &str) -> Result<(), String> {
    use std::io::Write;
    let ip = find("ip").ok_or("`ip` not found")?;
    let mut child = Command::new(ip)
        .args(["netns", "exec", ns])
        .arg(tool("nft"))
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft in {ns}: {}\n{script}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Pids of every process whose network namespace is `ns`.
pub fn pids(ns: &str) -> Vec<i32> {
    let Some(ip) = find("ip") else {
        return Vec::new();
    };
    Command::new(ip)
        .args(["netns", "pids", ns])
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Names of the existing namespaces that this harness made.
pub fn ours() -> Vec<String> {
    fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with(PREFIX))
                .collect()
        })
        .unwrap_or_default()
}

/// The owner pid in a namespace name made by this harness.
pub fn owner(name: &str) -> Option<i32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Kills every process in `ns`, then deletes it.
pub fn remove(ns: &str) {
    for pid in pids(ns) {
        crate::signal(pid, libc::SIGCONT);
        crate::signal(pid, libc::SIGKILL);
    }
    let _ = run(&["ip", "netns", "del", ns]);
}

/// Removes the leftovers of testbeds whose owner process is gone (a run that crashed or was
/// killed before its drop ran). Returns how many namespaces went.
pub fn sweep() -> usize {
    let dead: Vec<String> = ours()
        .into_iter()
        .filter(|n| owner(n).is_some_and(|pid| !crate::alive(pid)))
        .collect();
    for n in &dead {
        remove(n);
    }
    dead.len()
}

/// Whether the kernel has `sch_netem`: tried on a veth pair in a throwaway namespace.
pub fn has_netem() -> bool {
    let ns = scratch("netem");
    let ok = run(&["ip", "netns", "add", &ns])
        .and_then(|_| {
            run_in(
                &ns,
                &[
                    "ip", "link", "add", "a", "type", "veth", "peer", "name", "b",
                ],
            )
        })
        .and_then(|_| {
            run_in(
                &ns,
                &[
                    "tc", "qdisc", "add", "dev", "a", "root", "netem", "delay", "1ms",
                ],
            )
        })
        .is_ok();
    let _ = run(&["ip", "netns", "del", &ns]);
    ok
}
