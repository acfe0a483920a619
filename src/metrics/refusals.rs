//! `lead-exec check` refusals, counted by the lead-exec that runs the job.
//!
//! The job's `check` is another process. It appends one byte per refusal to a file that this
//! lead-exec created (mode 600) and named in the job's environment, and a scrape counts the
//! bytes: an append needs no listener in this process, and two checks never merge counts.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

use super::METRICS;

/// The variable that tells a job's `lead-exec check` where to count a refusal.
pub const CHECK_REFUSALS_VAR: &str = "LEAD_EXEC_CHECK_REFUSALS";

/// The refusals file, kept open: counting reads the size of this file, whatever the path has
/// since become (deleted, replaced, a link somewhere else).
pub(super) struct CheckFile {
    path: PathBuf,
    file: File,
}

/// Creates the refusals file, readable and writable by this user only, in the service's
/// runtime directory (systemd's `RuntimeDirectory=`, removed when the service stops, even
/// after a SIGKILL), else the user's (a tmpfs cleared at logout or boot), else the temporary
/// one; removed at exit, and, left by a lead-exec that was killed, by the next one to make
/// its own in the same place. Returns its path, for the job's [`CHECK_REFUSALS_VAR`].
pub(super) fn create_check_file() -> std::io::Result<PathBuf> {
    // systemd lists several directories with ':'; the first is this service's own.
    let service = std::env::var_os("RUNTIME_DIRECTORY").and_then(|v| {
        let v = v.to_string_lossy().into_owned();
        v.split(':').next().map(PathBuf::from)
    });
    // Relative values are to be ignored (XDG base directory spec): the job may run elsewhere.
    let dir = service
        .into_iter()
        .chain(std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from))
        .find(|d| d.is_absolute() && d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    sweep_stale(&dir);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let path = dir.join(format!(
        "lead-exec-{}-{nonce:08x}.check-refusals",
        std::process::id()
    ));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    // Held for as long as the file is open, that is for this process's life, whatever ends
    // it: a later lead-exec that can take the lock knows the file is nobody's (see
    // `sweep_stale`).
    // SAFETY: flock on a descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    let named = path.clone();
    if METRICS.check_file.set(CheckFile { path, file }).is_ok() {
        extern "C" fn remove_check_file() {
            if let Some(c) = METRICS.check_file.get() {
                let _ = std::fs::remove_file(&c.path);
            }
        }
        // SAFETY: registers a plain function with no captured state, run by exit().
        unsafe { libc::atexit(remove_check_file) };
    }
    Ok(named)
}

/// The pid in the name of a refusals file (`lead-exec-PID-NONCE.check-refusals`), if `name`
/// is one.
fn check_file_pid(name: &str) -> Option<i32> {
    let rest = name
        .strip_prefix("lead-exec-")?
        .strip_suffix(".check-refusals")?;
    let (pid, nonce) = rest.split_once('-')?;
    let hex = nonce.len() == 8 && nonce.bytes().all(|b| b.is_ascii_hexdigit());
    let pid: i32 = pid.parse().ok().filter(|p| *p > 0)?;
    (hex && pid.to_string() == rest[..rest.len() - nonce.len() - 1]).then_some(pid)
}

/// Removes the refusals files in `dir` that a lead-exec which is gone left behind: one killed
/// (SIGKILL, or a signal it does not handle) runs no exit handler. A file is removed only
/// when it is this user's plain file, the process its name gives is gone, and nobody holds
/// its lock (each lead-exec holds its own for its life: a live one in another PID namespace,
/// where the pid means nothing, keeps its file).
fn sweep_stale(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid has no failure mode.
    let uid = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let Some(pid) = check_file_pid(&entry.file_name().to_string_lossy()) else {
            continue;
        };
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if !gone {
            continue;
        }
        let Ok(f) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(entry.path())
        else {
            continue;
        };
        let ours = f
            .metadata()
            .is_ok_and(|m| m.file_type().is_file() && m.uid() == uid && m.nlink() == 1);
        // SAFETY: flock on a descriptor we own; released when `f` closes.
        if ours && unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Brings the counter up to the refusals the file holds. A file cut short (truncated) counts
/// on from its new size; nothing counted is taken back.
pub(super) fn count_check_refusals() {
    let Some(c) = METRICS.check_file.get() else {
        return;
    };
    let Ok(len) = c.file.metadata().map(|m| m.len()) else {
        return;
    };
    let mut seen = METRICS.checks_seen.lock().expect("not poisoned");
    if len > *seen {
        METRICS.check_refusals.inc_by(len - *seen);
    }
    *seen = len;
}

/// Called by `lead-exec check` when it refuses a token: counts the refusal with the lead-exec
/// that runs this job, if it serves metrics (best effort: a job that cleared its environment,
/// or runs as a user who may not write the file, is not counted).
///
/// The path may be stale (a job that outlived its lead-exec) and the directory shared, so
/// nothing but a plain file with one link is written: no symlink is followed, a FIFO or
/// device neither blocks nor gets the byte, and no file is created.
pub fn check_refused() {
    use std::io::Write;
    let Some(path) = std::env::var_os(CHECK_REFUSALS_VAR).filter(|p| !p.is_empty()) else {
        return;
    };
    let Ok(mut f) = OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return;
    };
    match f.metadata() {
        Ok(m) if m.file_type().is_file() && m.nlink() == 1 => {
            // One byte in one append: concurrent checks never merge their counts.
            let _ = f.write_all(b"\n");
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_file_names_give_a_pid_to_sweep() {
        assert_eq!(
            check_file_pid("lead-exec-4242-0a1b2c3d.check-refusals"),
            Some(4242)
        );
        for other in [
            "lead-exec-4242-0a1b2c3.check-refusals",
            "lead-exec-4242-0a1b2c3g.check-refusals",
            "lead-exec-0-0a1b2c3d.check-refusals",
            "lead-exec--1-0a1b2c3d.check-refusals",
            "lead-exec-+42-0a1b2c3d.check-refusals",
            "lead-exec-42-0a1b2c3d.check-refusals.tmp",
            "other-42-0a1b2c3d.check-refusals",
            "lead-exec-x-0a1b2c3d.check-refusals",
        ] {
            assert_eq!(check_file_pid(other), None, "{other}");
        }
    }
}
