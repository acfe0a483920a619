//! The records `run` writes beside the job, and the operator commands read: the history of
//! terms, completed run keys and their attempts, and the workers out of line for a failing health check.
//!
//! Every write is a transaction guarded by the leader key's create revision (the fencing
//! token), so only the leader of that term can write, never a stale one.
//!
//! Each record is read and written by a method of the etcd scope ([`crate::election::Ctx`]),
//! bounded by its command timeout.

pub mod attempts;
pub mod history;
pub mod runkey;
pub mod unhealthy;

/// Who writes a record: the holder of a term, by its token and leader key (which guard the
/// write) and its worker's id.
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    /// The fencing token: the create revision of `key`.
    pub token: i64,
    /// The leader key whose create revision guards every write.
    pub key: &'a str,
    /// The worker's `--id`.
    pub id: &'a str,
}
