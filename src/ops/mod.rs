//! Operator commands: status, watch, resign, pause/resume, history, check. They read the
//! records `run` keeps ([`crate::records`]).
//!
//! Every write here is a transaction guarded by a comparison, never a blind put or delete.
//!
//! Output goes through [`emit`] (the `outln!` and `out!` macros), so that a reader that goes
//! away ends a command quietly instead of with a panic. Values read from etcd are shown with
//! [`crate::text::escape`]: each stays on its line.

/// `println!` for the operator commands: see [`emit`]. Evaluates to its [`Reader`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::ops::emit(&format!("{}\n", format_args!($($arg)*)))?
    };
}

/// `print!` for the operator commands: see [`emit`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::ops::emit(&format!($($arg)*))?
    };
}

pub mod check;
pub mod history;
pub mod pause;
pub mod resign;
pub mod status;
pub mod watch;

use std::time::Duration;

use anyhow::Result;
use etcd_client::{GetOptions, SortOrder, SortTarget};
use serde::{Deserialize, Serialize};

use crate::cli::ElectionArgs;
use crate::election::{Candidate, Election};
use crate::etcd::Conn;
use crate::exit::{fail, Exit};

pub use crate::election::Ctx;

/// What every operator command starts from.
impl Ctx {
    /// Connects (see [`Ctx::connect`]) to the election the flags name.
    pub async fn from_args(a: &ElectionArgs) -> Result<Ctx> {
        let election = Election::new(&a.election)?;
        let conn = Conn::from_args(&a.conn)?;
        Ctx::connect(&conn, election).await
    }

    /// Candidates in line order (the first one leads), read linearizably.
    pub async fn candidates(&self) -> Result<(Vec<Entry>, i64)> {
        let mut c = self.client.clone();
        let resp = self
            .bounded(
                c.get(
                    self.election.candidates(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend),
                    ),
                ),
            )
            .await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        let entries = resp
            .kvs()
            .iter()
            .map(|kv| Entry {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                token: kv.create_revision(),
                lease: kv.lease(),
                slot: None,
                candidate: Candidate::parse(kv.value()),
            })
            .collect();
        Ok((entries, rev))
    }

    /// The slot count the election's candidates run with (`--slots`; absent means 1).
    pub async fn slots(&self) -> Result<u32> {
        let mut c = self.client.clone();
        let resp = self.bounded(c.get(self.election.slots_key(), None)).await?;
        Ok(resp
            .kvs()
            .first()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.trim().parse().ok())
            .unwrap_or(1))
    }

    /// The holders as every view shows them (see [`holders`]), each with the slot it claimed.
    pub async fn holders(&self) -> Result<Holders> {
        let (mut entries, rev) = self.candidates().await?;
        let paused = self.paused().await?;
        let slots = self.slots().await?;
        let held = holders(&entries, paused.as_ref(), slots).len();
        let mut draining = Vec::new();
        if slots == 1 {
            if let Some(h) = entries.first_mut().filter(|_| held == 1) {
                h.slot = Some(0);
            }
        } else {
            let mut c = self.client.clone();
            let prefix = self.election.slot_prefix();
            let opts = GetOptions::new().with_prefix();
            let resp = self.bounded(c.get(prefix.clone(), Some(opts))).await?;
            for kv in resp.kvs() {
                let slot = std::str::from_utf8(kv.key())
                    .ok()
                    .and_then(|k| k.strip_prefix(&prefix)?.parse().ok());
                let token = std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|v| v.parse::<i64>().ok());
                match entries[..held].iter_mut().find(|h| Some(h.token) == token) {
                    Some(h) => h.slot = slot,
                    // A slot key whose holder's candidate key is gone (deleted by an operator,
                    // say): its job still drains, and the slot stays taken until it ends.
                    None => {
                        if let (Some(slot), Some(token)) = (slot, token) {
                            draining.push(Draining { slot, token });
                        }
                    }
                }
            }
        }
        Ok(Holders {
            entries,
            held,
            slots,
            paused,
            rev,
            draining,
        })
    }

    /// The pause switch, if on.
    pub async fn paused(&self) -> Result<Option<Pause>> {
        let mut c = self.client.clone();
        let resp = self
            .bounded(c.get(self.election.paused_key(), None))
            .await?;
        Ok(resp.kvs().first().map(|kv| {
            serde_json::from_slice(kv.value()).unwrap_or(Pause {
                reason: String::from_utf8_lossy(kv.value()).into_owned(),
                since_ms: 0,
                by: String::new(),
            })
        }))
    }
}

/// The holders as every view shows them: the first `slots` of the line (the head alone with
/// one slot), unless the election is paused (then nobody runs the job, whoever is first).
pub fn holders<'a>(entries: &'a [Entry], paused: Option<&Pause>, slots: u32) -> &'a [Entry] {
    match paused {
        Some(_) => &[],
        None => &entries[..entries.len().min(slots as usize)],
    }
}

/// The line of candidates and who of it holds, as one operator command read it.
pub struct Holders {
    /// Every candidate in line order; the first `held` hold.
    pub entries: Vec<Entry>,
    pub held: usize,
    pub slots: u32,
    pub paused: Option<Pause>,
    /// The revision the line was read at.
    pub rev: i64,
    /// With `--slots` above 1: slots still taken by a job whose candidate key is gone.
    pub draining: Vec<Draining>,
}

/// A slot taken by a job whose candidate key is gone: it frees when that job ends.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Draining {
    pub slot: u32,
    pub token: i64,
}

impl Holders {
    pub fn holders(&self) -> &[Entry] {
        &self.entries[..self.held]
    }

    pub fn waiting(&self) -> &[Entry] {
        &self.entries[self.held..]
    }
}

/// Candidates' tokens, for messages: "5, 9".
pub fn tokens(entries: &[Entry]) -> String {
    let t: Vec<String> = entries.iter().map(|h| h.token.to_string()).collect();
    t.join(", ")
}

/// One candidate key.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub key: String,
    /// The key's create revision: the fencing token if it leads.
    pub token: i64,
    #[serde(skip)]
    pub lease: i64,
    /// `LEAD_EXEC_SLOT` of a holder, once claimed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    #[serde(flatten)]
    pub candidate: Candidate,
}

/// The value of the pause switch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pause {
    pub reason: String,
    pub since_ms: u64,
    pub by: String,
}

/// Unix milliseconds as RFC 3339 (UTC, seconds).
pub fn fmt_ms(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Whether stdout still has a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    There,
    /// It closed its end (`status | head -1`): the rest of the output is not wanted.
    Gone,
}

/// Writes `text` to stdout. A reader that has gone away is not an error (the command exits as
/// it would have, quietly, the way `git log | head` does without the signal); any other
/// failure to write is, with one line and [`Exit::IoErr`]. So is a stdout that was closed when
/// the process started (`status >&-`), which Rust's runtime quietly points at /dev/null.
pub fn emit(text: &str) -> Result<Reader> {
    use std::io::Write;
    if crate::STDOUT_CLOSED_AT_START.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(fail(
            Exit::IoErr,
            "cannot write the output: stdout was closed when lead-exec started",
        ));
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(Reader::There),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Reader::Gone),
        Err(e) => Err(fail(Exit::IoErr, format!("cannot write the output: {e}"))),
    }
}

/// Whether stdout's reader has gone away, as `poll` tells without writing: the write end of a
/// pipe whose reader closed reports POLLERR, a hung-up terminal or socket POLLHUP.
pub fn stdout_gone() -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::empty())];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) if n > 0 => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP)),
        _ => false,
    }
}
