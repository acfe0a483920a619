//! Running the job: the watchdog process that owns the job's process group, and lead-exec's
//! handle on it.
//!
//! ```text
//! lead-exec ──ctl pipe (deadlines, signals)──▶ watchdog ──fork/exec──▶ job (own pgid, cgroup)
//!           ◀──report pipe (spawned, ended)───
//! ```
//!
//! The watchdog starts before its job exists ([`Standby`]): lead-exec starts one while it
//! connects and campaigns, and sends the job's variables, deadline and command in one write
//! once the term is won, so that a won term pays only for the job's own fork and exec. A
//! standby that is never used exits when its pipe closes: a candidate that waits further
//! back than next in line lets its standby go, and starts one again when it moves up
//! (`run::candidacy`'s `wait_lightly`).
//!
//! The watchdog is spawned from the main thread (the runtime is single-threaded), so
//! `PR_SET_PDEATHSIG` fires only when lead-exec itself exits, never when a worker thread does.
//! It is the small `lead-exec-watchdog` binary when that is installed beside lead-exec, and
//! lead-exec itself in its hidden `__watchdog` mode otherwise.
//!
//! lead-exec and the watchdog are two enforcers of the deadline, and must not fail together:
//! the watchdog gets a session (and so a process group) of its own before exec, and a name
//! that shares no three letters in a row with "lead-exec", so that no group signal and no
//! `pkill`/`killall` by name reaches both; and [`Job::wait`] kills the group at D itself when
//! the watchdog has not reported it gone. Nothing lead-exec does waits on the watchdog: its
//! pipe is non-blocking, and what a frozen watchdog cannot take yet waits in lead-exec, the
//! newest deadline in place of older ones.
//!
//! The folders are the two processes and what lies between them:
//! - [`handle`]: lead-exec's side (start the job, move its deadline, stop it, enforce D);
//! - [`watchdog`]: the watchdog's side (its main loop, the pure [`watchdog::enforcer`], the
//!   job's fork into its cgroup);
//! - [`wire`]: what the two pipes carry;
//! - [`procs`]: the job's processes as both sides reach them (group, cgroup, tree).

pub mod handle;
pub mod procs;
pub mod watchdog;
pub mod wire;

use std::time::Duration;

use crate::exit::JobStatus;
use wire::GroupEnd;

pub use handle::job::{Job, JobControl};
pub use handle::preflight::{exec_error, preflight};
pub use handle::standby::{Launch, Standby};

/// Whether the job gets a cgroup v2 of its own besides its process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// When one can be created.
    Auto,
    /// Required: no job without one.
    On,
    /// Process group only.
    Off,
}

impl CgroupMode {
    /// The word the watchdog's command line carries.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupMode::Auto => "auto",
            CgroupMode::On => "on",
            CgroupMode::Off => "off",
        }
    }

    pub fn parse(s: &str) -> Option<CgroupMode> {
        [CgroupMode::Auto, CgroupMode::On, CgroupMode::Off]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub command: Vec<std::ffi::OsString>,
    pub env: Vec<(String, String)>,
    pub grace: Duration,
    pub cgroup: CgroupMode,
}

/// How the job's group ended, as the watchdog saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobEnd {
    pub status: JobStatus,
    pub cause: GroupEnd,
    /// Lease deadline minus time of death.
    pub slack_ms: i64,
}

/// How long before D the group gets SIGKILL: delivering it and the group's exit take a few
/// hundred microseconds, more on a loaded host.
pub const KILL_LEAD: Duration = Duration::from_millis(25);
