//! What every scope of a run may read ([`Env`]), and what the scopes hand back up when etcd
//! fails them ([`Failure`]): the bottom of `run/`, imported by every scope, importing none.

use std::path::PathBuf;

use crate::config::RunConfig;
use crate::election::{Candidate, Ctx};

/// What every scope may read of the run, lent to its behaviour for one call.
pub struct Env {
    pub cfg: RunConfig,
    /// The etcd scope: client, router, election, command timeout.
    pub ctx: Ctx,
    /// Our candidate key's value.
    pub candidate: Candidate,
    /// The file a job's `lead-exec check` counts its refusals in (`--metrics-addr`).
    pub refusals: Option<PathBuf>,
}

/// An etcd error on the way, with what was being done.
pub struct Failure {
    pub what: &'static str,
    pub error: anyhow::Error,
}

/// What failed, only: the event it travels in is printed on the phase line, and the error has
/// a line of its own ([`super::lifecycle::Action::Report`], or the run's error). An error's debug form would
/// put its whole stack backtrace on the phase line whenever RUST_BACKTRACE is set.
impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}

/// Whether a new term's token is not above the previous one's: etcd's revisions went back
/// (a wiped data directory, or a restore without `--bump-revision`), and the fencing contract
/// no longer holds for the resources this job writes to.
pub fn token_regressed(last: Option<i64>, token: i64) -> bool {
    last.is_some_and(|l| token <= l)
}
