//! `run --metrics-textfile PATH`: a run's outcome in node_exporter's textfile format, for runs
//! too short to be scraped (a cron tick) and for a dead-man's switch.
//!
//! Every run writes the file as it ends, whether or not its worker ran the job: the period
//! (with `--every`) and the time it took part, so that a worker that stops taking part goes
//! stale and a fleet where none ran can be told from one that was never set up. A run whose
//! job ran adds that attempt's start, end, exit code, token and attempt number, and its time
//! as the last success if the job exited 0; a run that found every `--attempts` failed marks
//! the time. What earlier runs wrote is kept: a run that did not run the job leaves the last
//! attempt's lines as they were. The lines of other elections in the same file are kept too.
//!
//! The file is replaced whole (written beside it under a name node_exporter ignores, then
//! renamed over it), so a scrape reads the old file or the new one, never part of one; runs
//! on one host that end together take turns on a lock file beside it.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use crate::exit::{fail, Exit};

/// The job a run started last, as the textfile reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobRun {
    pub token: i64,
    /// With `--attempts`, the attempt at the run key.
    pub attempt: Option<u32>,
    pub started_ms: u64,
    /// When it ended, and its exit status as lead-exec reports it (128+N for signal N);
    /// `None` while it runs.
    pub ended: Option<(u64, u8)>,
}

/// What a run tells the textfile as it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOutcome {
    pub now_ms: u64,
    /// `--every`'s period, in seconds.
    pub period_s: Option<i64>,
    pub job: Option<JobRun>,
    /// Every `--attempts` at the run key failed.
    pub exhausted: bool,
}

/// The series of the textfile (not served on `--metrics-addr`), in the order written, with
/// their help.
pub const SERIES: [(&str, &str); 10] = [
    (
        "lead_exec_run_period_seconds",
        "The --every period of the election's runs.",
    ),
    (
        "lead_exec_run_first_seen_timestamp_seconds",
        "When this worker first took part in a run of the election, as far as this file remembers.",
    ),
    (
        "lead_exec_run_seen_timestamp_seconds",
        "When this worker last took part in a run, whether or not it ran the job.",
    ),
    (
        "lead_exec_run_last_start_timestamp_seconds",
        "When the last job this worker ran started.",
    ),
    (
        "lead_exec_run_last_end_timestamp_seconds",
        "When the last job this worker ran ended.",
    ),
    (
        "lead_exec_run_last_exit_code",
        "The exit code of the last job this worker ran (128+N for signal N).",
    ),
    (
        "lead_exec_run_last_token",
        "The fencing token of the last job this worker ran.",
    ),
    (
        "lead_exec_run_last_attempt",
        "The attempt at its run key of the last job this worker ran (1 without --attempts).",
    ),
    (
        "lead_exec_run_last_success_timestamp_seconds",
        "When the last job this worker ran that exited 0 ended.",
    ),
    (
        "lead_exec_run_exhausted_timestamp_seconds",
        "When this worker last found every --attempts at a run key failed.",
    ),
];

/// Samples by metric, then by election.
type Samples = BTreeMap<&'static str, BTreeMap<String, f64>>;

/// The samples of a textfile this module wrote; lines it does not know are left out.
fn parse(text: &str) -> Samples {
    let mut s = Samples::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((name, rest)) = series.split_once("{election=\"") else {
            continue;
        };
        let (Some(name), Some(election), Ok(value)) = (
            SERIES.iter().map(|(n, _)| *n).find(|n| *n == name),
            rest.strip_suffix("\"}").filter(|e| one_label_value(e)),
            value.parse::<f64>(),
        ) else {
            continue;
        };
        s.entry(name).or_default().insert(unescape(election), value);
    }
    s
}

/// Whether `v` is one escaped label value: a quote in it ends the value, so a line with more
/// labels than `election` (not this module's) is not read as one.
fn one_label_value(v: &str) -> bool {
    let mut escaped = false;
    for c in v.chars() {
        match (escaped, c) {
            (false, '\\') => escaped = true,
            (false, '"') => return false,
            _ => escaped = false,
        }
    }
    !escaped
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

fn unescape(v: &str) -> String {
    v.replace("\\\"", "\"").replace("\\\\", "\\")
}

/// `before` with this run of `election` recorded (see the module's comment).
fn update(mut s: Samples, election: &str, o: &RunOutcome) -> Samples {
    let secs = |ms: u64| ms as f64 / 1000.0;
    // Kept from the first run this file saw: the alert on an election that never succeeded
    // counts its periods from here.
    s.entry("lead_exec_run_first_seen_timestamp_seconds")
        .or_default()
        .entry(election.to_string())
        .or_insert(secs(o.now_ms));
    let mut set = |name: &'static str, v: f64| {
        s.entry(name).or_default().insert(election.to_string(), v);
    };
    if let Some(p) = o.period_s {
        set("lead_exec_run_period_seconds", p as f64);
    }
    set("lead_exec_run_seen_timestamp_seconds", secs(o.now_ms));
    if let Some(j) = o.job {
        set(
            "lead_exec_run_last_start_timestamp_seconds",
            secs(j.started_ms),
        );
        set("lead_exec_run_last_token", j.token as f64);
        set(
            "lead_exec_run_last_attempt",
            f64::from(j.attempt.unwrap_or(1)),
        );
        if let Some((ended_ms, code)) = j.ended {
            set("lead_exec_run_last_end_timestamp_seconds", secs(ended_ms));
            set("lead_exec_run_last_exit_code", f64::from(code));
            if code == 0 {
                set(
                    "lead_exec_run_last_success_timestamp_seconds",
                    secs(ended_ms),
                );
            }
        }
    }
    if o.exhausted {
        set("lead_exec_run_exhausted_timestamp_seconds", secs(o.now_ms));
    }
    s
}

fn render(s: &Samples) -> String {
    let mut out = String::new();
    for (name, help) in SERIES {
        let Some(by_election) = s.get(name).filter(|m| !m.is_empty()) else {
            continue;
        };
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (election, v) in by_election {
            out.push_str(&format!(
                "{name}{{election=\"{}\"}} {v}\n",
                escape(election)
            ));
        }
    }
    out
}

/// Refuses at start (64) a textfile that node_exporter would not read (not `*.prom`) or that
/// could not be written (its directory missing or not writable), before etcd is touched.
pub fn check_textfile(path: &Path) -> Result<PathBuf> {
    let usage = |why: String| {
        fail(
            Exit::Usage,
            format!("--metrics-textfile {}: {why}", path.display()),
        )
    };
    if path.extension().is_none_or(|e| e != "prom") {
        return Err(usage(
            "node_exporter's textfile collector reads only files named *.prom".into(),
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let probe = dir.join(format!(".lead-exec-probe-{}", std::process::id()));
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => return Err(usage(format!("cannot write in {}: {e}", dir.display()))),
    }
    if path.is_dir() {
        return Err(usage("is a directory".into()));
    }
    Ok(path.to_path_buf())
}

/// Writes this run into `path` (see the module's comment).
pub fn write(path: &Path, election: &str, o: &RunOutcome) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("no file name"))?
        .to_string_lossy()
        .into_owned();
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Hidden, and not *.prom: node_exporter reads neither the lock nor a file being written.
    // Neither follows a symlink: the directory may be writable by others than us.
    let lock = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(format!(".{name}.lock")))
        .context("its lock file")?;
    let _held = lock_within(lock, LOCK_WAIT)?;
    let before = read_ours(path)?;
    let text = render(&update(parse(&before), election, o));
    // A name nobody can have made ready for us: created here, never opened if it exists.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".{name}.{}-{nonce:08x}.tmp", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f: File = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).context("writing it");
    }
    Ok(())
}

/// The longest a run waits for another run's write of the same file (one that was stopped
/// while it held the lock would hold it forever).
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The largest textfile read back: one this module wrote holds a few lines per election.
const MAX_READ: u64 = 1 << 20;

/// Takes the lock on `f`, waiting at most `limit`.
fn lock_within(f: File, limit: Duration) -> Result<nix::fcntl::Flock<File>> {
    let until = std::time::Instant::now() + limit;
    let mut f = f;
    loop {
        match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(held) => return Ok(held),
            Err((back, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < until => {
                f = back;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err((_, e)) => return Err(anyhow!("locking it (another run holds it): {e}")),
        }
    }
}

/// The textfile as it is, if it is one this module could have written: a missing file, or
/// one too large to be ours, counts as empty (what it held is replaced); bytes that are not
/// UTF-8 are read as U+FFFD and their lines dropped.
fn read_ours(path: &Path) -> Result<String> {
    use std::io::Read;
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e).context("reading it"),
    };
    if !f
        .metadata()
        .is_ok_and(|m| m.is_file() && m.len() <= MAX_READ)
    {
        tracing::warn!(
            "--metrics-textfile {}: not a file of at most {MAX_READ} bytes; replacing it",
            path.display()
        );
        return Ok(String::new());
    }
    let mut bytes = Vec::new();
    f.take(MAX_READ)
        .read_to_end(&mut bytes)
        .context("reading it")?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Tries [`write`] a few times (a full disk may clear, a lock holder finish), then reports.
pub fn write_retrying(path: &Path, election: &str, o: &RunOutcome) {
    const TRIES: u32 = 3;
    for n in 1..=TRIES {
        match write(path, election, o) {
            Ok(()) => return,
            Err(e) if n == TRIES => {
                tracing::warn!("--metrics-textfile {}: {e:#}", path.display());
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(job: Option<JobRun>, exhausted: bool) -> RunOutcome {
        RunOutcome {
            now_ms: 1_800_000_000_000,
            period_s: Some(300),
            job,
            exhausted,
        }
    }

    #[test]
    fn a_run_that_ran_the_job_reports_it_and_one_that_did_not_keeps_what_was_there() {
        let ran = JobRun {
            token: 42,
            attempt: Some(2),
            started_ms: 1_799_999_990_000,
            ended: Some((1_799_999_999_500, 0)),
        };
        let first = render(&update(
            Samples::new(),
            "settle",
            &outcome(Some(ran), false),
        ));
        assert!(
            first.contains("lead_exec_run_last_token{election=\"settle\"} 42\n"),
            "{first}"
        );
        assert!(
            first.contains("lead_exec_run_last_attempt{election=\"settle\"} 2\n"),
            "{first}"
        );
        assert!(
            first.contains(
                "lead_exec_run_last_success_timestamp_seconds{election=\"settle\"} 1799999999.5\n"
            ),
            "{first}"
        );
        assert!(first.contains("lead_exec_run_period_seconds{election=\"settle\"} 300\n"));
        assert!(!first.contains("exhausted"), "{first}");
        // The next tick ran elsewhere: only the time seen moves; another election's lines stay.
        let mut later = outcome(None, true);
        later.now_ms += 300_000;
        let other = render(&update(parse(&first), "other", &outcome(None, false)));
        let second = render(&update(parse(&other), "settle", &later));
        let kept = |name: &str| {
            let line = |t: &str| {
                t.lines()
                    .find(|l| l.starts_with(name) && l.contains("settle"))
                    .map(str::to_string)
            };
            assert_eq!(line(&first), line(&second), "{name}");
        };
        kept("lead_exec_run_last_token");
        kept("lead_exec_run_last_success_timestamp_seconds");
        assert!(
            second
                .contains("lead_exec_run_seen_timestamp_seconds{election=\"settle\"} 1800000300\n"),
            "{second}"
        );
        assert!(
            second
                .contains("lead_exec_run_seen_timestamp_seconds{election=\"other\"} 1800000000\n"),
            "{second}"
        );
        assert!(
            second.contains(
                "lead_exec_run_exhausted_timestamp_seconds{election=\"settle\"} 1800000300\n"
            ),
            "{second}"
        );
        kept("lead_exec_run_first_seen_timestamp_seconds");
        // One HELP and TYPE per metric, and the file parses back to what it says.
        assert_eq!(
            second
                .matches("# TYPE lead_exec_run_seen_timestamp_seconds gauge")
                .count(),
            1
        );
        assert_eq!(render(&parse(&second)), second);
    }

    #[test]
    fn a_failed_job_is_reported_without_a_success() {
        let ran = JobRun {
            token: 7,
            attempt: None,
            started_ms: 1_000,
            ended: Some((2_000, 137)),
        };
        let text = render(&update(Samples::new(), "e", &outcome(Some(ran), false)));
        assert!(
            text.contains("lead_exec_run_last_exit_code{election=\"e\"} 137\n"),
            "{text}"
        );
        assert!(
            text.contains("lead_exec_run_last_attempt{election=\"e\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains("success"), "{text}");
    }

    #[test]
    fn a_lock_file_that_is_a_symlink_is_not_followed_and_nothing_is_written_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(".s.prom.lock")).unwrap();
        let path = dir.path().join("s.prom");
        assert!(write(&path, "e", &outcome(None, false)).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!path.exists());
    }

    #[test]
    fn lines_with_other_labels_or_bytes_are_dropped_not_misread() {
        let text = "lead_exec_run_last_token{election=\"other\",instance=\"h\"} 5\n\
                    lead_exec_run_last_token{election=\"a\\\"b\"} 6\n\
                    lead_exec_run_last_token{election=\"\u{fffd}\"} x\n";
        let s = parse(text);
        let tokens: Vec<(&String, &f64)> = s["lead_exec_run_last_token"].iter().collect();
        assert_eq!(tokens, [(&"a\"b".to_string(), &6.0)]);
    }
}
