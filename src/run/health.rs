//! `--health-cmd`: a check that gates leadership.
//!
//! The check runs with `/bin/sh -c` every `--health-interval`, with that interval as its
//! timeout, in a process group of its own: never in the job's group, so stopping the job
//! never stops a check and a hung check is killed whole. Its output goes to the log.
//!
//! A worker campaigns only once a check has passed. It becomes unhealthy after
//! `--health-failures` failures in a row, and healthy again on the next pass: one flaky check
//! neither costs a waiting candidate its place in line nor stops a running job.

use std::os::unix::process::CommandExt;
use std::process::Stdio;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::HealthCheck;
use crate::metrics;

/// What the checks say so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// No check has finished yet.
    Unknown,
    Healthy,
    /// Never passed yet, or failed `--health-failures` times in a row.
    Unhealthy,
}

/// Turns check results into [`Health`]; no I/O.
#[derive(Debug, Clone)]
pub struct Tracker {
    limit: u32,
    failures: u32,
    state: Health,
}

impl Tracker {
    pub fn new(limit: u32) -> Tracker {
        Tracker {
            limit: limit.max(1),
            failures: 0,
            state: Health::Unknown,
        }
    }

    pub fn observe(&mut self, passed: bool) -> Health {
        if passed {
            self.failures = 0;
            self.state = Health::Healthy;
        } else {
            self.failures = self.failures.saturating_add(1);
            // A worker that never passed is not healthy enough to campaign.
            if self.state == Health::Unknown || self.failures >= self.limit {
                self.state = Health::Unhealthy;
            }
        }
        self.state
    }
}

/// Starts checking in the background; the receiver follows [`Health`]. The checks stop when
/// the receiver is dropped.
pub fn start(check: HealthCheck) -> watch::Receiver<Health> {
    let (tx, rx) = watch::channel(Health::Unknown);
    tokio::spawn(async move {
        let mut tracker = Tracker::new(check.failures);
        let mut next = Instant::now();
        loop {
            let passed = run_once(&check).await;
            metrics::health_checked(passed);
            let health = tracker.observe(passed);
            metrics::healthy(health == Health::Healthy);
            tx.send_if_modified(|h| std::mem::replace(h, health) != health);
            if tx.is_closed() {
                return;
            }
            next = (next + check.interval).max(Instant::now());
            tokio::time::sleep_until(next).await;
        }
    });
    rx
}

/// Waits until the checks say something other than [`Health::Unknown`].
pub async fn settled(rx: &mut watch::Receiver<Health>) -> Health {
    match rx.wait_for(|h| *h != Health::Unknown).await {
        Ok(h) => *h,
        // The checker is gone: nothing vouches for this worker any more.
        Err(_) => Health::Unhealthy,
    }
}

/// Waits until the checks say [`Health::Unhealthy`]; never returns otherwise.
pub async fn failing(rx: &mut watch::Receiver<Health>) {
    if rx.wait_for(|h| *h == Health::Unhealthy).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// One check: whether it exited 0 within the interval.
async fn run_once(check: &HealthCheck) -> bool {
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(&check.command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: reset_signals makes async-signal-safe system calls only. Signals ignored by
    // lead-exec's caller must not stay ignored in the check, as they do not in the job.
    unsafe {
        cmd.pre_exec(|| {
            crate::supervisor::spawn::reset_signals();
            Ok(())
        });
    }
    let child = cmd.spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("health check: cannot start /bin/sh: {e}");
            return false;
        }
    };
    let pgid = child.id() as i32;
    let waited = tokio::task::spawn_blocking(move || child.wait_with_output());
    match tokio::time::timeout(check.interval, waited).await {
        Ok(Ok(Ok(out))) => {
            let text = output_tail(&out.stdout, &out.stderr);
            if out.status.success() {
                tracing::debug!(output = text, "health check passed");
                true
            } else {
                tracing::warn!(output = text, "health check failed: {}", out.status);
                false
            }
        }
        Ok(Ok(Err(e))) => {
            tracing::warn!("health check: {e}");
            false
        }
        Ok(Err(e)) => {
            tracing::warn!("health check: {e}");
            false
        }
        Err(_) => {
            // Not reaped yet (the wait has not returned), so the group id is still this one's.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
            tracing::warn!(
                "health check timed out after {}; killed it",
                crate::clock::human(check.interval)
            );
            false
        }
    }
}

/// The end of a check's output, short enough for one log line.
fn output_tail(stdout: &[u8], stderr: &[u8]) -> String {
    const MAX: usize = 400;
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(stdout),
        String::from_utf8_lossy(stderr)
    );
    let all = all.trim();
    match all.char_indices().rev().nth(MAX) {
        Some((i, _)) => format!("…{}", &all[i..]),
        None => all.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_healthy_only_after_a_pass() {
        let mut t = Tracker::new(3);
        assert_eq!(t.observe(false), Health::Unhealthy);
        assert_eq!(t.observe(true), Health::Healthy);
    }

    #[test]
    fn it_takes_n_failures_in_a_row_to_become_unhealthy() {
        let mut t = Tracker::new(3);
        t.observe(true);
        assert_eq!(t.observe(false), Health::Healthy);
        assert_eq!(t.observe(false), Health::Healthy);
        assert_eq!(t.observe(true), Health::Healthy, "a pass resets the count");
        assert_eq!(t.observe(false), Health::Healthy);
        assert_eq!(t.observe(false), Health::Healthy);
        assert_eq!(t.observe(false), Health::Unhealthy);
        assert_eq!(
            t.observe(true),
            Health::Healthy,
            "one pass is enough to return"
        );
    }

    #[test]
    fn long_output_keeps_its_end() {
        let long = "x".repeat(1000) + "the end";
        let t = output_tail(long.as_bytes(), b"");
        assert!(t.ends_with("the end") && t.chars().count() <= 402, "{t}");
        assert_eq!(output_tail(b" ok\n", b""), "ok");
    }
}
