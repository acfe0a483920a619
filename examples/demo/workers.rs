//! The workers and what they print: reader threads forward their lines, so that the demo
//! waits for events instead of sleeping.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::binaries::{clean_command, detach_and_tie, Bins};
use crate::narrate::{check_interrupted, secs, sleep, stamp};
use crate::store::Store;
use crate::{ELECTION, EVERY_MS, LEASE};

/// A line or the end of a worker's output. Reader threads print lines as they arrive and
/// send them here, so the demo can wait for events instead of sleeping.
#[derive(Debug, Clone)]
pub(crate) enum What {
    /// A line the job printed (stdout).
    Job(String),
    /// A line lead-exec logged (stderr), timestamp removed.
    Log(String),
    /// Both of the worker's pipes closed: lead-exec, its watchdog and the job are all gone.
    Closed,
}

#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) worker: usize,
    pub(crate) at: Instant,
    pub(crate) what: What,
}

impl Event {
    /// `(token, batch)` of a `[worker-x] token T: settled batch K` line.
    pub(crate) fn settled(&self) -> Option<(i64, u64)> {
        let What::Job(line) = &self.what else {
            return None;
        };
        let rest = line.split_once("] token ")?.1;
        let (token, rest) = rest.split_once(": settled batch ")?;
        Some((token.parse().ok()?, rest.trim().parse().ok()?))
    }

    /// The token of lead-exec's `leading: job started ... token=T` log line.
    pub(crate) fn leading(&self) -> Option<i64> {
        let What::Log(line) = &self.what else {
            return None;
        };
        if !line.contains("leading: job started") {
            return None;
        }
        field(line, "token")?.parse().ok()
    }

    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.what, What::Closed)
    }
}

/// The value of `name=value` in a log line.
pub(crate) fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .map(|v| v.trim_matches('"'))
}

/// Everything the workers printed so far, and the channel the rest arrives on.
pub(crate) struct Monitor {
    pub(crate) rx: Receiver<Event>,
    pub(crate) seen: Vec<Event>,
}

impl Monitor {
    pub(crate) fn new(rx: Receiver<Event>) -> Monitor {
        Monitor {
            rx,
            seen: Vec::new(),
        }
    }

    /// A position in the event history: waits from here on ignore what came before.
    pub(crate) fn mark(&mut self) -> usize {
        while let Ok(ev) = self.rx.try_recv() {
            self.seen.push(ev);
        }
        self.seen.len()
    }

    /// The first event at or after `since` for which `f` says yes; fails after `timeout`.
    pub(crate) fn wait_for<T>(
        &mut self,
        since: usize,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Event) -> Option<T>,
    ) -> Result<T> {
        let until = Instant::now() + timeout;
        let mut i = since;
        loop {
            while i < self.seen.len() {
                if let Some(t) = f(&self.seen[i]) {
                    return Ok(t);
                }
                i += 1;
            }
            check_interrupted()?;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("timed out after {} waiting for {what}", secs(timeout));
            }
            match self.rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(ev) => self.seen.push(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("every worker exited while waiting for {what}")
                }
            }
        }
    }

    /// The terms in the order lead-exec started them: `(worker, token)`.
    pub(crate) fn terms(&self) -> Vec<(usize, i64)> {
        self.seen
            .iter()
            .filter_map(|e| e.leading().map(|t| (e.worker, t)))
            .collect()
    }
}

/// One worker: `lead-exec run settlement ... -- ledger settle`.
pub(crate) struct Worker {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) exited: Option<ExitStatus>,
}

/// The workers, killed on drop if still running.
#[derive(Default)]
pub(crate) struct Workers(pub(crate) Vec<Worker>);

impl Workers {
    pub(crate) fn spawn(
        &mut self,
        name: &'static str,
        bins: &Bins,
        endpoint: &str,
        store: &Store,
        tx: Sender<Event>,
    ) -> Result<()> {
        let mut cmd = clean_command(&bins.lead_exec);
        cmd.args(["run", ELECTION, "--endpoints", endpoint])
            .args(LEASE)
            .args(["--id", name, "--"])
            .arg(&bins.ledger)
            .args(store.args())
            .args(["settle", "--every", EVERY_MS])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        detach_and_tie(&mut cmd);
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let index = self.0.len();
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        forward(index, name, out, err, tx);
        self.0.push(Worker {
            name,
            child,
            exited: None,
        });
        Ok(())
    }

    pub(crate) fn signal(&self, i: usize, sig: libc::c_int) -> Result<()> {
        let w = &self.0[i];
        ensure!(w.exited.is_none(), "{} already exited", w.name);
        // SAFETY: plain kill(2) on a child we have not reaped yet, so the pid is still ours.
        if unsafe { libc::kill(w.child.id() as libc::pid_t, sig) } != 0 {
            bail!(
                "cannot signal {}: {}",
                w.name,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Waits up to `timeout` for worker `i`'s lead-exec to exit.
    pub(crate) fn wait_exit(&mut self, i: usize, timeout: Duration) -> Result<ExitStatus> {
        let until = Instant::now() + timeout;
        let w = &mut self.0[i];
        loop {
            if let Some(s) = w.exited {
                return Ok(s);
            }
            if let Some(s) = w.child.try_wait()? {
                w.exited = Some(s);
                return Ok(s);
            }
            if Instant::now() >= until {
                bail!(
                    "{}'s lead-exec did not exit within {}",
                    w.name,
                    secs(timeout)
                );
            }
            sleep(Duration::from_millis(10))?;
        }
    }

    pub(crate) fn running(&mut self) -> Vec<usize> {
        (0..self.0.len())
            .filter(|&i| {
                let w = &mut self.0[i];
                if w.exited.is_none() {
                    w.exited = w.child.try_wait().ok().flatten();
                }
                w.exited.is_none()
            })
            .collect()
    }
}

impl Drop for Workers {
    /// SIGKILL is enough: lead-exec's watchdog then kills each job's process group at once.
    fn drop(&mut self) {
        for w in &mut self.0 {
            if w.exited.is_none() {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
    }
}

/// Reads a worker's stdout (the job's lines) and stderr (lead-exec's log) on two threads,
/// prints what is worth showing, and reports every line and the end of both pipes.
pub(crate) fn forward(
    index: usize,
    name: &'static str,
    out: impl Read + Send + 'static,
    err: impl Read + Send + 'static,
    tx: Sender<Event>,
) {
    let reader = |stream: Box<dyn Read + Send>, is_log: bool, tx: Sender<Event>| {
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                let at = Instant::now();
                let what = if is_log {
                    let line = tidy_log(&line, name);
                    if interesting(&line) {
                        println!("{}  {name} | {line}", stamp(at));
                    }
                    What::Log(line)
                } else {
                    println!("{}  {name} | {line}", stamp(at));
                    What::Job(line)
                };
                let _ = tx.send(Event {
                    worker: index,
                    at,
                    what,
                });
            }
        })
    };
    let a = reader(Box::new(out), false, tx.clone());
    let b = reader(Box::new(err), true, tx.clone());
    // The pipes close when the last process holding them (lead-exec, watchdog, job) is gone.
    std::thread::spawn(move || {
        let _ = a.join();
        let _ = b.join();
        let _ = tx.send(Event {
            worker: index,
            at: Instant::now(),
            what: What::Closed,
        });
    });
}

/// Drops the timestamp and the fields the prefix already says (election and id).
pub(crate) fn tidy_log(line: &str, name: &str) -> String {
    let rest = match line.split_once(' ') {
        Some((first, rest)) if first.contains('T') && first.ends_with('Z') => rest.trim_start(),
        _ => line,
    };
    rest.replace(&format!(" election=\"{ELECTION}\""), "")
        .replace(&format!(" election={ELECTION}"), "")
        .replace(&format!(" id=\"{name}\""), "")
        .replace(&format!(" id={name}"), "")
}

/// lead-exec logs the job's start and end and what it waits for; the demo shows the lines that tell the story,
/// plus anything that went wrong.
pub(crate) fn interesting(line: &str) -> bool {
    const KEEP: [&str; 4] = [
        "leading: job started",
        "waiting behind",
        "job ended",
        "watchdog",
    ];
    KEEP.iter().any(|k| line.contains(k))
        || line.starts_with("WARN")
        || line.starts_with("ERROR")
        || line.starts_with("lead-exec:")
}
