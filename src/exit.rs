//! Exit codes: the contract with scripts, cron and systemd.
//!
//! Every way `lead-exec` can end maps to exactly one [`Exit`]. The numbers follow the shell
//! (126, 127, 128+N) and `sysexits.h` (64, 69, 70, 75, 77) so that scripts can branch on them.

use std::fmt;

/// How a `lead-exec` invocation ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// A command that runs no job succeeded (or a run key was already done).
    Ok,
    /// The job ran and exited with this code.
    Job(u8),
    /// The job (or `lead-exec` while campaigning) was killed by signal N: exit 128+N.
    Signal(i32),
    /// Someone else leads and `--no-wait` or `--wait` gave up. The number is
    /// `--conflict-exit-code` (default 75, `EX_TEMPFAIL`).
    NotAcquired(u8),
    /// Leadership was not acquired because this worker's `--health-cmd` kept failing
    /// (`--no-wait`, or `--wait` ran out while it failed): 79, not the conflict code, since
    /// nobody else need lead.
    Unhealthy,
    /// Leadership was lost while the job ran and `--on-loss exit` was given.
    LeadershipLost,
    /// `--attempts N`: N attempts at the run key failed, on whichever workers ran them, and
    /// none may run another. Every worker of the election exits with it.
    AttemptsExhausted,
    /// The job ran past `--timeout` and was stopped: 124, as timeout(1) exits.
    TimedOut,
    /// `status`, `resign`: the election has no leader right now (none, or paused).
    NoLeader,
    /// `check` or `resign --token`: the token is not the current leader's.
    StaleToken,
    /// Bad flags, durations, names or unsafe settings (`EX_USAGE`).
    Usage,
    /// etcd could not be reached or did not answer in time (`EX_UNAVAILABLE`).
    Unavailable,
    /// An internal error (`EX_SOFTWARE`).
    Software,
    /// An operator command could not write its output: stdout closed, a full disk
    /// (`EX_IOERR`).
    IoErr,
    /// etcd refused our credentials or certificate (`EX_NOPERM`).
    Auth,
    /// The command exists but cannot be executed (as shells do).
    NotExecutable,
    /// The command was not found (as shells do).
    NotFound,
}

impl Exit {
    /// Conventional `--conflict-exit-code` default.
    pub const DEFAULT_CONFLICT: u8 = 75;

    /// The process exit status.
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Job(code) => code,
            Exit::Signal(sig) => 128u8.saturating_add(sig.clamp(0, 127) as u8),
            Exit::NotAcquired(code) => code,
            Exit::LeadershipLost => 76,
            Exit::Unhealthy => 79,
            Exit::AttemptsExhausted => 80,
            Exit::TimedOut => 124,
            Exit::NoLeader => 3,
            Exit::StaleToken => 4,
            Exit::Usage => 64,
            Exit::Unavailable => 69,
            Exit::Software => 70,
            Exit::IoErr => 74,
            Exit::Auth => 77,
            Exit::NotExecutable => 126,
            Exit::NotFound => 127,
        }
    }

    /// The signal the process dies of instead of exiting with this code, when a stop signal
    /// (`stopped_by`) reached lead-exec: as timeout(1) does, a run that ends in 128+N because
    /// it was stopped ends by dying of N, so that a shell still sees 128+N and systemd sees a
    /// clean stop (`inactive`, not `failed`). Only HUP, INT and TERM, and only the one that
    /// stopped lead-exec: QUIT would dump core, and a job's death by another signal (one it
    /// raised itself, or someone else's) is the job's result, left as an exit code; dying of
    /// INT when TERM was sent would read to a calling shell as a Ctrl-C.
    pub fn dies_of(self, stopped_by: Option<i32>) -> Option<i32> {
        match self {
            Exit::Signal(sig @ (libc::SIGHUP | libc::SIGINT | libc::SIGTERM))
                if stopped_by == Some(sig) =>
            {
                Some(sig)
            }
            _ => None,
        }
    }

    /// The exit for a job that ended with a raw wait status already decoded.
    pub fn from_job(end: JobStatus) -> Exit {
        match end {
            JobStatus::Exited(code) => Exit::Job(code.clamp(0, 255) as u8),
            JobStatus::Signaled(sig) => Exit::Signal(sig),
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e.code())
    }
}

/// How the job's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    Exited(i32),
    Signaled(i32),
}

impl JobStatus {
    /// A status in waitpid's form (as /proc's `exit_code` gives it).
    pub fn from_wait(status: i32) -> JobStatus {
        if libc::WIFSIGNALED(status) {
            JobStatus::Signaled(libc::WTERMSIG(status))
        } else {
            JobStatus::Exited(libc::WEXITSTATUS(status))
        }
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobStatus::Exited(c) => write!(f, "exit code {c}"),
            JobStatus::Signaled(s) => write!(f, "signal {s}"),
        }
    }
}

/// An error that carries the exit code it must end the process with.
///
/// Created with [`fail`]; found again anywhere in an `anyhow` chain by [`exit_of`].
#[derive(Debug)]
pub struct Coded {
    pub exit: Exit,
    pub message: String,
}

impl fmt::Display for Coded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Coded {}

/// An error that ends the process with `exit`.
pub fn fail(exit: Exit, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Coded {
        exit,
        message: message.into(),
    })
}

/// The exit code an error ends the process with: the first [`Coded`] met walking the chain from
/// the outermost error inward (`anyhow`'s chain order), or [`Exit::Software`] for errors nobody classified.
pub fn exit_of(err: &anyhow::Error) -> Exit {
    err.chain()
        .find_map(|e| e.downcast_ref::<Coded>().map(|c| c.exit))
        .unwrap_or(Exit::Software)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct() {
        let all = [
            Exit::NotAcquired(Exit::DEFAULT_CONFLICT),
            Exit::LeadershipLost,
            Exit::TimedOut,
            Exit::NoLeader,
            Exit::StaleToken,
            Exit::Usage,
            Exit::Unavailable,
            Exit::Software,
            Exit::Auth,
            Exit::NotExecutable,
            Exit::NotFound,
        ];
        let mut codes: Vec<u8> = all.iter().map(|e| e.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
    }

    #[test]
    fn signals_map_to_128_plus_n() {
        assert_eq!(Exit::Signal(15).code(), 143);
        assert_eq!(Exit::Signal(9).code(), 137);
        assert_eq!(Exit::from_job(JobStatus::Signaled(2)).code(), 130);
    }

    #[test]
    fn a_stopped_run_dies_of_its_stop_signal_and_nothing_else_does() {
        let term = Some(libc::SIGTERM);
        assert_eq!(Exit::Signal(15).dies_of(term), Some(15));
        assert_eq!(
            Exit::Signal(2).dies_of(term),
            None,
            "the job died of another signal than the one that stopped lead-exec"
        );
        assert_eq!(Exit::Signal(15).dies_of(Some(3)), None, "stopped by QUIT");
        assert_eq!(Exit::Signal(1).dies_of(Some(1)), Some(1));
        assert_eq!(
            Exit::Signal(15).dies_of(None),
            None,
            "the job was killed by someone else"
        );
        assert_eq!(Exit::Signal(3).dies_of(Some(3)), None, "QUIT dumps core");
        assert_eq!(Exit::Signal(9).dies_of(term), None);
        assert_eq!(
            Exit::Job(143).dies_of(term),
            None,
            "the job's own exit code"
        );
        assert_eq!(Exit::Job(0).dies_of(term), None);
        assert_eq!(Exit::TimedOut.dies_of(term), None);
    }

    #[test]
    fn job_codes_pass_through() {
        assert_eq!(Exit::from_job(JobStatus::Exited(7)).code(), 7);
        assert_eq!(Exit::from_job(JobStatus::Exited(0)).code(), 0);
    }

    #[test]
    fn shell_and_sysexits_numbers() {
        assert_eq!(Exit::Usage.code(), 64);
        assert_eq!(Exit::Unavailable.code(), 69);
        assert_eq!(Exit::NotExecutable.code(), 126);
        assert_eq!(Exit::NotFound.code(), 127);
        assert_eq!(Exit::NotAcquired(75).code(), 75);
    }

    #[test]
    fn coded_errors_are_found_through_context() {
        let err = fail(Exit::Unavailable, "no etcd").context("connecting");
        assert_eq!(exit_of(&err), Exit::Unavailable);
        assert_eq!(format!("{err:#}"), "connecting: no etcd");
        assert_eq!(exit_of(&anyhow::anyhow!("plain")), Exit::Software);
    }
}
