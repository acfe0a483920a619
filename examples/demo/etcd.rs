//! The throwaway etcd.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use harness::Member;

use crate::binaries::{capture, clean_command, clean_env, detach_and_tie, Bins};
use crate::narrate::{check_interrupted, sleep};
use crate::{ELECTION, EXIT_NO_LEADER, EXIT_UNAVAILABLE};

/// A single-member etcd in the scratch directory (the shared harness's launcher), detached
/// and tied to the demo like the workers, killed on drop.
pub(crate) fn start_etcd(dir: &Path) -> Member {
    Member::single(dir, "demo", |cmd| {
        clean_env(cmd);
        detach_and_tie(cmd);
    })
}

/// The end of etcd's log, for error messages.
pub(crate) fn log_tail(etcd: &Member) -> String {
    let text = std::fs::read_to_string(etcd.log()).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// etcd takes a moment to elect itself; `lead-exec status` exits 69 until it answers.
pub(crate) fn wait_until_etcd_answers(bins: &Bins, etcd: &Member) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        check_interrupted()?;
        let mut cmd = clean_command(&bins.lead_exec);
        cmd.args(["status", ELECTION, "--endpoints", &etcd.endpoint()])
            .args(["--dial-timeout", "1s"]);
        let out = capture(&mut cmd)?;
        match out.code {
            Some(0 | EXIT_NO_LEADER) => return Ok(()),
            Some(EXIT_UNAVAILABLE) if Instant::now() < until => sleep(Duration::from_millis(200))?,
            _ => bail!(
                "etcd does not answer at {}: {}\netcd log:\n{}",
                etcd.endpoint(),
                out.stderr.trim(),
                log_tail(etcd)
            ),
        }
    }
}
