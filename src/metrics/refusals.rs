//! `lead-exec check` refusals, counted by the lead-exec that runs the job.
//!
//! The job's `check` is another process. It appends one byte per refusal to a file that this
//! lead-exec created (mode 600) and named in the job's environment, and a scrape counts the
//! bytes: an append needs no listener in this process, and two checks never merge counts.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::METRICS;

/// The variable that tells a job's `lead-exec check` where to count a refusal.
pub const CHECK_REFUSALS_VAR: &str = "LEAD_EXEC_CHECK_REFUSALS";

/// The path for the job's [`CHECK_REFUSALS_VAR`], once [`super::serve`] has created the file.
pub fn check_refusals_path() -> Option<&'static Path> {
    METRICS.check_file.get().map(PathBuf::as_path)
}

/// Creates the refusals file, readable and writable by this user only, in the runtime
/// directory (a tmpfs cleared at logout or boot) or else the temporary one; removed at exit.
pub(super) fn create_check_file() -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let path = dir.join(format!(
        "lead-exec-{}-{nonce:08x}.check-refusals",
        std::process::id()
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    if METRICS.check_file.set(path).is_ok() {
        extern "C" fn remove_check_file() {
            if let Some(p) = METRICS.check_file.get() {
                let _ = std::fs::remove_file(p);
            }
        }
        // SAFETY: registers a plain function with no captured state, run by exit().
        unsafe { libc::atexit(remove_check_file) };
    }
    Ok(())
}

/// Brings the counter up to the refusals the file holds.
pub(super) fn count_check_refusals() {
    let Some(path) = METRICS.check_file.get() else {
        return;
    };
    let Ok(len) = std::fs::metadata(path).map(|m| m.len()) else {
        return;
    };
    let seen = METRICS.checks_seen.fetch_max(len, Ordering::Relaxed);
    if len > seen {
        METRICS.check_refusals.inc_by(len - seen);
    }
}

/// Called by `lead-exec check` when it refuses a token: counts the refusal with the lead-exec
/// that runs this job, if it serves metrics (best effort: a job that cleared its environment,
/// or runs as a user who may not write the file, is not counted).
pub fn check_refused() {
    use std::io::Write;
    let Some(path) = std::env::var_os(CHECK_REFUSALS_VAR).filter(|p| !p.is_empty()) else {
        return;
    };
    // Without create: a stale path from a lead-exec that has exited must not leave a file.
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path) {
        // One byte in one append: concurrent checks never merge their counts.
        let _ = f.write_all(b"\n");
    }
}
