//! Validated configuration.
//!
//! [`crate::cli`] says what the user typed; this module decides whether it can be safe and turns
//! it into the values the rest of the program trusts. Every refusal here is a one-line message
//! and [`Exit::Usage`].
//!
//! [`RunConfig`] is `lead-exec run`'s flags as a whole, here with the checks that relate one
//! flag to another; [`conn`] the etcd connection every command shares; [`values`] the checks
//! of single values (durations, lease TTLs, one-line text); [`exec`] the command's size;
//! [`tls`] the TLS files.

pub mod conn;
pub mod exec;
pub mod tls;
pub mod values;

use std::time::Duration;

use anyhow::Result;

use crate::cli::{self, RunArgs};
use crate::clock::human;
use crate::election::campaign::Wait;
use crate::election::lease::check_lease_safety;
use crate::election::{hostname, Election};
use crate::etcd::Conn;
use crate::exit::{fail, Exit};
use crate::period::{Grid, Period};
use crate::supervisor::CgroupMode;
pub use exec::check_exec_size;
use values::metrics_addr;
pub use values::{
    bounded_duration, lease_ttl, one_line, MAX_DURATION, MAX_LEASE_TTL, MIN_TIMEOUT, NO_WAIT_BELOW,
};

/// What a lost term leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLoss {
    /// Campaign again on a fresh lease.
    Campaign,
    /// Exit with [`Exit::LeadershipLost`].
    Exit,
}

/// Everything `lead-exec run` needs, checked.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub election: Election,
    pub conn: Conn,
    /// Requested TTL; the server's grant may be longer and is what counts.
    pub ttl: Duration,
    pub grace: Duration,
    pub safety_margin: Duration,
    pub id: String,
    pub on_loss: OnLoss,
    pub wait: Wait,
    pub conflict_exit_code: u8,
    pub history_keep: u32,
    /// `--run-key`, or the key of the `--every` period.
    pub run_key: Option<String>,
    pub run_key_ttl: Duration,
    /// `--every`: the period this run is for; its start is `run_key`.
    pub period: Option<Period>,
    /// `--splay`: the longest random wait before the first campaign; zero for none.
    pub splay: Duration,
    /// `--attempts` and `--retry-delay`: the run key's attempts, shared by the fleet.
    pub attempts: Option<Attempts>,
    pub cgroup: CgroupMode,
    /// `--slots`: how many holders may run the job at once.
    pub slots: u32,
    /// `--timeout`: the longest a job may run in one term.
    pub timeout: Option<Duration>,
    /// `--takeover-delay`: the wait before a job starts after an unclean end; zero for none.
    pub takeover_delay: Duration,
    /// `--health-cmd` and its schedule.
    pub health: Option<HealthCheck>,
    /// `--priority`: a higher one asks a lower leader to hand over.
    pub priority: u32,
    /// `--min-term`: how long a leader is safe from preemption by priority.
    pub min_term: Duration,
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `--metrics-textfile`: where each run's outcome is written for node_exporter.
    pub metrics_textfile: Option<std::path::PathBuf>,
    /// As given: bytes, not necessarily UTF-8, as execve takes them.
    pub command: Vec<std::ffi::OsString>,
}

/// `--attempts N --retry-delay D`: at most N attempts at one run key, across the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts {
    pub max: u32,
    /// How long a worker elected after a failed attempt waits before the next.
    pub retry_delay: Duration,
}

/// The most `--attempts`: each is a term, a job start and a record; past this a run key is
/// not being retried but hammered.
pub const MAX_ATTEMPTS: u32 = 1000;

/// Checks `--attempts` and `--retry-delay` against each other and `--every`'s period.
fn check_attempts(
    max: Option<u32>,
    retry_delay: Duration,
    every: Option<Duration>,
    run_key_ttl: Duration,
) -> Result<Option<Attempts>> {
    let Some(max) = max else {
        return Ok(None);
    };
    if !(1..=MAX_ATTEMPTS).contains(&max) {
        return Err(fail(
            Exit::Usage,
            format!("--attempts {max}: must be between 1 and {MAX_ATTEMPTS}"),
        ));
    }
    if let Some(every) = every.filter(|e| run_key_ttl < *e) {
        return Err(fail(
            Exit::Usage,
            format!(
                "--run-key-ttl {} is shorter than --every {}: the count of attempts would be forgotten while the period's workers still retry",
                human(run_key_ttl),
                human(every)
            ),
        ));
    }
    if let Some(every) = every.filter(|e| retry_delay >= *e) {
        return Err(fail(
            Exit::Usage,
            format!(
                "--retry-delay {} is not shorter than --every {}: the retry would fall into the next period",
                human(retry_delay),
                human(every)
            ),
        ));
    }
    Ok(Some(Attempts { max, retry_delay }))
}

/// A health check, as `--health-cmd`, `--health-interval` and `--health-failures` give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// Run with `/bin/sh -c`.
    pub command: String,
    /// Time between the starts of two checks; also the timeout of one.
    pub interval: Duration,
    /// Failures in a row that make the worker unhealthy.
    pub failures: u32,
}

/// The shortest `--health-interval`: a check is a fork and exec of a shell.
const MIN_HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// The smallest `--safety-margin`: the margin covers the clock-rate error between us and
/// the etcd leader over a TTL and the delivery of SIGTERM and SIGKILL; under 100 ms it covers
/// neither on a loaded machine.
pub const MIN_SAFETY_MARGIN: Duration = Duration::from_millis(100);

/// The longest `--id`, in bytes, as for `--run-key`: it is stored in every candidate key and
/// history record, and shown on one line by `status`.
pub const MAX_ID_BYTES: usize = 256;

/// The shortest `--timeout`: below it the job could not even start.
const MIN_JOB_TIMEOUT: Duration = Duration::from_millis(10);

/// The most `--slots`: the creating transaction reads the first N candidate keys and a
/// holder scans the N slot keys, on every term; past about a thousand that stops being cheap,
/// and a semaphore that wide is better served by a work queue.
pub const MAX_SLOTS: u32 = 1024;

/// Refuses a slot count out of range, and slots with a run key (`once`: the flag that gives
/// it, with its value).
fn check_slots(slots: u32, once: Option<&str>) -> Result<u32> {
    if !(1..=MAX_SLOTS).contains(&slots) {
        return Err(fail(
            Exit::Usage,
            format!("--slots {slots}: must be between 1 and {MAX_SLOTS}"),
        ));
    }
    if let (true, Some(once)) = (slots > 1, once) {
        return Err(fail(
            Exit::Usage,
            format!(
                "--slots {slots} with {once}: a run key runs the job once, and {slots} slots would run it up to {slots} times at once before any of them records it done"
            ),
        ));
    }
    Ok(slots)
}

/// A request of `run` waits at most the lease TTL: one still unanswered when the lease
/// could have expired cannot keep the term, only hold up its end and the handover. A given
/// `--command-timeout` over the TTL is refused; the default is cut to the TTL.
fn command_timeout_within(mut conn: Conn, given: Option<Duration>, ttl: Duration) -> Result<Conn> {
    match given {
        Some(t) if t > ttl => Err(fail(
            Exit::Usage,
            format!(
                "--command-timeout {} is longer than --ttl {}: a request still unanswered when the lease can expire cannot keep the term; give at most the TTL",
                human(t),
                human(ttl)
            ),
        )),
        Some(_) => Ok(conn),
        None => {
            conn.command_timeout = conn.command_timeout.min(ttl);
            Ok(conn)
        }
    }
}

/// The period of `--every PERIOD --every-offset OFFSET` that `now_ms` (the wall clock, in ms
/// since the Unix epoch) belongs to, with `--splay`'s bound checked against it.
fn every_period(every: Duration, offset: Duration, splay: Duration, now_ms: i64) -> Result<Period> {
    let usage = |m: String| Err(fail(Exit::Usage, m));
    if every.is_zero() {
        return usage("--every must be greater than zero".into());
    }
    for (flag, d) in [("--every", every), ("--every-offset", offset)] {
        if d.subsec_nanos() != 0 {
            return usage(format!(
                "{flag} {} is not a whole number of seconds: the run key names the period's start to the second",
                human(d)
            ));
        }
    }
    if offset >= every {
        return usage(format!(
            "--every-offset {} is not shorter than --every {}: the offset shifts the periods by less than one period",
            human(offset),
            human(every)
        ));
    }
    if splay >= every {
        return usage(format!(
            "--splay {} is not shorter than --every {}: a worker could campaign in the next period with this one's run key",
            human(splay),
            human(every)
        ));
    }
    match Grid::new(every, offset) {
        Some(grid) => Ok(grid.period_at(now_ms)),
        None => usage(format!(
            "--every {} --every-offset {}: not a grid of whole seconds",
            human(every),
            human(offset)
        )),
    }
}

impl RunConfig {
    pub fn from_args(a: &RunArgs) -> Result<RunConfig> {
        let election = Election::new(&a.election.election)?;
        let conn = Conn::from_args(&a.election.conn)?;
        for (flag, d) in [
            ("--grace", Some(a.grace)),
            ("--safety-margin", Some(a.safety_margin)),
            ("--wait", a.wait),
            ("--timeout", a.timeout),
            ("--takeover-delay", Some(a.takeover_delay)),
            ("--health-interval", Some(a.health_interval)),
            ("--min-term", Some(a.min_term)),
            ("--every", a.every),
            ("--every-offset", Some(a.every_offset)),
            ("--splay", Some(a.splay)),
            ("--retry-delay", Some(a.retry_delay)),
        ] {
            if let Some(d) = d {
                bounded_duration(flag, d)?;
            }
        }
        let ttl = lease_ttl("--ttl", a.ttl)?;
        if a.safety_margin < MIN_SAFETY_MARGIN {
            return Err(fail(
                Exit::Usage,
                format!(
                    "--safety-margin {} is too small: it must be at least {}, for clock-rate error and the signal's delivery",
                    human(a.safety_margin),
                    human(MIN_SAFETY_MARGIN)
                ),
            ));
        }
        check_lease_safety(ttl, a.grace, a.safety_margin)?;
        let conn = command_timeout_within(conn, a.election.conn.command_timeout, ttl)?;
        let run_key_ttl = lease_ttl("--run-key-ttl", a.run_key_ttl)?;
        let attempts = check_attempts(a.attempts, a.retry_delay, a.every, run_key_ttl)?;
        let wait = match (a.no_wait, a.wait) {
            (true, _) => Wait::No,
            (false, Some(d)) if d < NO_WAIT_BELOW => Wait::No,
            (false, Some(d)) => Wait::For(d),
            // Workers wait in line while the period's key is undecided, and no longer: the
            // next tick's workers take the next key.
            (false, None) => match (attempts, a.every) {
                (Some(_), Some(every)) => Wait::For(every),
                _ => Wait::Forever,
            },
        };
        let id = match &a.id {
            Some(id) if id.trim().is_empty() => {
                return Err(fail(Exit::Usage, "--id must not be empty"))
            }
            Some(id) if id.len() > MAX_ID_BYTES => {
                return Err(fail(
                    Exit::Usage,
                    format!("--id is {} bytes long: at most {MAX_ID_BYTES}", id.len()),
                ))
            }
            Some(id) => {
                one_line("--id", id)?;
                id.clone()
            }
            None => format!("{}:{}", hostname(), std::process::id()),
        };
        let every = match a.every {
            None => None,
            Some(every) => Some((
                every,
                every_period(every, a.every_offset, a.splay, crate::period::now_unix_ms())?,
            )),
        };
        let (run_key, once) = match (&a.run_key, &every) {
            (Some(k), Some((every, _))) => {
                return Err(fail(
                    Exit::Usage,
                    format!(
                        "--every {} with --run-key {}: --every makes the run key from the time; give one of them",
                        human(*every),
                        crate::text::quoted(k)
                    ),
                ))
            }
            (Some(k), None) => (Some(k.clone()), Some(format!("--run-key {k}"))),
            (None, Some((every, p))) => (
                Some(p.key.clone()),
                Some(format!("--every {} (run key {})", human(*every), p.key)),
            ),
            (None, None) => (None, None),
        };
        if let Some(k) = &run_key {
            crate::election::validate_run_key(k)?;
        }
        let slots = check_slots(a.slots, once.as_deref())?;
        // Both rank one holder against the others: with several holders there is no "the
        // leader" to preempt, and no one "previous term" whose end could be judged.
        if slots > 1 && a.priority > 0 {
            return Err(fail(
                Exit::Usage,
                format!("--priority with --slots {slots}: priorities rank a single leader; use one slot"),
            ));
        }
        if slots > 1 && !a.takeover_delay.is_zero() {
            return Err(fail(
                Exit::Usage,
                format!("--takeover-delay with --slots {slots}: the delay judges the one previous term; use one slot"),
            ));
        }
        if a.timeout.is_some_and(|t| t < MIN_JOB_TIMEOUT) {
            return Err(fail(
                Exit::Usage,
                format!("--timeout must be at least {}", human(MIN_JOB_TIMEOUT)),
            ));
        }
        // The running term's own record is always kept (the end is written into it, and the
        // next term's --takeover-delay reads it): 0 cannot mean "none", and quietly meaning 1
        // would surprise.
        if a.history_keep == 0 {
            return Err(fail(
                Exit::Usage,
                "--history-keep must be at least 1 (the running term's own record)",
            ));
        }
        let health = match &a.health_cmd {
            None => None,
            Some(c) if c.trim().is_empty() => {
                return Err(fail(Exit::Usage, "--health-cmd must not be empty"))
            }
            Some(c) => {
                if a.health_interval < MIN_HEALTH_INTERVAL {
                    return Err(fail(
                        Exit::Usage,
                        format!(
                            "--health-interval must be at least {}",
                            human(MIN_HEALTH_INTERVAL)
                        ),
                    ));
                }
                if a.health_failures == 0 {
                    return Err(fail(Exit::Usage, "--health-failures must be at least 1"));
                }
                Some(HealthCheck {
                    command: c.clone(),
                    interval: a.health_interval,
                    failures: a.health_failures,
                })
            }
        };
        let metrics_addr = match &a.metrics_addr {
            None => None,
            Some(s) => Some(metrics_addr(s)?),
        };
        let metrics_textfile = match &a.metrics_textfile {
            None => None,
            Some(p) => Some(crate::metrics::textfile::check_textfile(p)?),
        };
        // An empty word is a command that is not found (127, as a shell says of `''`), which
        // the preflight reports; only no word at all is a usage error.
        if a.command.is_empty() {
            return Err(fail(Exit::Usage, "no command given after --"));
        }
        check_exec_size(&a.command, std::env::vars_os())?;
        Ok(RunConfig {
            election,
            conn,
            ttl,
            grace: a.grace,
            safety_margin: a.safety_margin,
            id,
            // With --attempts a lost term was a failed attempt, and a failed attempt's worker
            // leaves the line: the next attempt runs elsewhere.
            on_loss: match (a.on_loss, attempts) {
                (_, Some(_)) | (cli::OnLoss::Exit, None) => OnLoss::Exit,
                (cli::OnLoss::Campaign, None) => OnLoss::Campaign,
            },
            wait,
            conflict_exit_code: a.conflict_exit_code,
            history_keep: a.history_keep,
            run_key,
            run_key_ttl,
            period: every.map(|(_, p)| p),
            splay: a.splay,
            attempts,
            cgroup: match a.cgroup {
                cli::CgroupMode::Auto => CgroupMode::Auto,
                cli::CgroupMode::On => CgroupMode::On,
                cli::CgroupMode::Off => CgroupMode::Off,
            },
            slots,
            timeout: a.timeout,
            takeover_delay: a.takeover_delay,
            health,
            priority: a.priority,
            min_term: a.min_term,
            metrics_addr,
            metrics_textfile,
            command: a.command.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn wait_of(flag: &[&str]) -> Wait {
        use clap::Parser;
        let args = [&["lead-exec", "run", "x"], flag, &["--", "true"]].concat();
        let cli = crate::cli::Cli::try_parse_from(args).unwrap();
        let crate::cli::Command::Run(crate::cli::Deferred(a)) = cli.command else {
            unreachable!()
        };
        RunConfig::from_args(&a).unwrap().wait
    }

    #[test]
    fn a_wait_too_short_to_attempt_means_no_wait() {
        assert_eq!(wait_of(&["--wait", "0s"]), Wait::No);
        assert_eq!(wait_of(&["--wait", "1ns"]), Wait::No);
        assert_eq!(wait_of(&["--wait", "1s"]), Wait::For(s(1)));
        assert_eq!(wait_of(&[]), Wait::Forever);
    }

    #[test]
    fn slots_are_bounded_and_refused_with_a_run_key() {
        assert_eq!(check_slots(1, None).unwrap(), 1);
        assert_eq!(check_slots(MAX_SLOTS, None).unwrap(), MAX_SLOTS);
        assert_eq!(check_slots(1, Some("--run-key nightly")).unwrap(), 1);
        for bad in [0, MAX_SLOTS + 1] {
            let e = check_slots(bad, None).unwrap_err();
            assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
            assert!(e.to_string().contains("must be between 1 and"), "{e}");
        }
        let e = check_slots(2, Some("--run-key nightly")).unwrap_err();
        assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
        assert!(e.to_string().contains("a run key runs the job once"), "{e}");
    }

    /// Every duration flag, with the most it takes and what it needs beside it.
    const DURATION_FLAGS: [(&str, Duration, &[&str]); 14] = [
        ("--timeout", MAX_DURATION, &[]),
        ("--every", MAX_DURATION, &[]),
        (
            "--every-offset",
            MAX_DURATION.saturating_sub(Duration::from_secs(1)),
            &["--every", "100years"],
        ),
        ("--splay", MAX_DURATION, &[]),
        ("--wait", MAX_DURATION, &[]),
        ("--health-interval", MAX_DURATION, &["--health-cmd", "true"]),
        ("--grace", MAX_DURATION, &[]),
        ("--safety-margin", MAX_DURATION, &[]),
        ("--dial-timeout", MAX_DURATION, &[]),
        ("--command-timeout", MAX_DURATION, &[]),
        ("--takeover-delay", MAX_DURATION, &[]),
        ("--min-term", MAX_DURATION, &[]),
        ("--ttl", MAX_LEASE_TTL, &[]),
        ("--run-key-ttl", MAX_LEASE_TTL, &["--run-key", "k"]),
    ];

    fn config_with(flag: &str, value: &str, extra: &[&str]) -> Result<RunConfig> {
        use clap::Parser;
        let args = [
            &["lead-exec", "run", "x", flag, value],
            extra,
            &["--", "true"],
        ]
        .concat();
        let cli = crate::cli::Cli::try_parse_from(args).expect("parses");
        let crate::cli::Command::Run(crate::cli::Deferred(a)) = cli.command else {
            unreachable!()
        };
        RunConfig::from_args(&a)
    }

    fn any_duration() -> impl proptest::strategy::Strategy<Value = (String, Duration)> {
        use proptest::prelude::*;
        prop_oneof![
            any::<u64>().prop_map(|s| (format!("{s}s"), Duration::from_secs(s))),
            any::<u64>().prop_map(|n| (format!("{n}ns"), Duration::from_nanos(n))),
            (0..=200u64).prop_map(|y| (format!("{y}years"), Duration::from_secs(y * 31_557_600))),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { failure_persistence: None, cases: 512, ..Default::default() })]

        /// No duration a flag takes can overflow the instant arithmetic it feeds; a longer one
        /// is a usage error naming the flag.
        #[test]
        fn every_duration_flag_is_bounded(
            (flag, max, extra) in proptest::sample::select(DURATION_FLAGS.to_vec()),
            (text, d) in any_duration(),
        ) {
            match config_with(flag, &text, extra) {
                Ok(_) => {
                    proptest::prop_assert!(d <= max, "{flag} {text} accepted");
                    // Room for a few of them added together (a lease TTL: two), after the time
                    // since boot, on the clocks that deadlines use.
                    let few = d.checked_mul(if max == MAX_LEASE_TTL { 2 } else { 4 }).expect("fits");
                    let since_boot = u128::from(crate::clock::BootInstant::now().as_nanos());
                    proptest::prop_assert!(few.as_nanos() + since_boot < u128::from(u64::MAX));
                    proptest::prop_assert!(std::time::Instant::now().checked_add(few).is_some());
                    proptest::prop_assert!(tokio::time::Instant::now().checked_add(few).is_some());
                }
                Err(e) => {
                    proptest::prop_assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
                    let msg = e.to_string();
                    proptest::prop_assert!(!msg.contains('\n'), "{msg}");
                    if d > max {
                        proptest::prop_assert!(msg.starts_with(flag), "{msg}");
                    } else {
                        proptest::prop_assert!(!msg.contains("too long") && !msg.contains("above etcd's maximum"), "{flag} {text}: {msg}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_longest_durations_are_accepted() {
        for (flag, max, extra) in DURATION_FLAGS {
            let over = format!("{}ns", max.as_nanos() + 1);
            let e = config_with(flag, &over, extra).unwrap_err();
            assert!(e.to_string().starts_with(flag), "{e}");
            // Grace, margin and request timeout at the maximum need a lease to match.
            let ttl: &[&str] = match flag {
                "--grace" | "--safety-margin" | "--command-timeout" => &["--ttl", "9000000000s"],
                _ => &[],
            };
            let at = format!("{}s", max.as_secs());
            config_with(flag, &at, &[extra, ttl].concat())
                .unwrap_or_else(|e| panic!("{flag} {at}: {e}"));
        }
    }

    #[test]
    fn ids_are_capped_at_256_bytes() {
        let at = "é".repeat(128);
        assert_eq!(config_with("--id", &at, &[]).unwrap().id, at);
        let e = config_with("--id", &format!("{at}x"), &[]).unwrap_err();
        assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
        assert_eq!(e.to_string(), "--id is 257 bytes long: at most 256");
    }

    #[test]
    fn a_safety_margin_under_100ms_is_refused() {
        config_with("--safety-margin", "100ms", &[]).unwrap();
        for bad in ["0s", "99ms"] {
            let e = config_with("--safety-margin", bad, &[]).unwrap_err();
            assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
            assert!(
                e.to_string().starts_with(&format!(
                    "--safety-margin {bad} is too small: it must be at least 100ms"
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn a_command_timeout_over_the_ttl_is_refused_and_the_default_fits_the_ttl() {
        let c = |extra: &[&str]| {
            let args = [&["--ttl", "3s"][..], extra].concat();
            config_with("--grace", "1s", &args)
        };
        assert_eq!(c(&[]).unwrap().conn.command_timeout, s(3));
        assert_eq!(
            c(&["--command-timeout", "3s"])
                .unwrap()
                .conn
                .command_timeout,
            s(3)
        );
        let e = c(&["--command-timeout", "4s"]).unwrap_err();
        assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
        assert!(
            e.to_string()
                .starts_with("--command-timeout 4s is longer than --ttl 3s"),
            "{e}"
        );
        // A long lease keeps the default.
        let long = config_with("--ttl", "60s", &[]).unwrap();
        assert_eq!(long.conn.command_timeout, s(5));
    }

    #[test]
    fn every_makes_the_run_key_of_the_nearest_period_start() {
        // 2026-12-06T00:59:58Z: two seconds before the 01:00 tick.
        let now_ms = 1_796_518_798_000;
        let p = every_period(s(3600), s(0), s(0), now_ms).unwrap();
        assert_eq!(p.key, "20261206T0100Z");
        assert_eq!(p.start, "2026-12-06T01:00:00Z");
        let p = every_period(s(86_400), s(2 * 3600), s(60), now_ms).unwrap();
        assert_eq!(p.start, "2026-12-06T02:00:00Z");
        // From the flags: the key is the run key, and the job is told the period.
        let cfg = config_with("--every", "5m", &[]).unwrap();
        let period = cfg.period.unwrap();
        assert_eq!(cfg.run_key.as_deref(), Some(period.key.as_str()));
        assert_eq!(period.start_unix_s % 300, 0);
        assert!(config_with("--every", "1h", &["--every-offset", "30m"]).is_ok());
        assert!(config_with("--every", "1h", &["--run-key-ttl", "2h"]).is_ok());
    }

    #[test]
    fn every_refuses_what_cannot_name_one_period() {
        let refused = |flag: &str, value: &str, extra: &[&str], want: &str| {
            let e = config_with(flag, value, extra).unwrap_err();
            assert_eq!(crate::exit::exit_of(&e), Exit::Usage, "{e}");
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "{msg}");
            assert!(msg.starts_with(want), "{flag} {value} {extra:?}: {msg}");
        };
        refused("--every", "0s", &[], "--every must be greater than zero");
        refused(
            "--every",
            "1500ms",
            &[],
            "--every 1s 500ms is not a whole number of seconds",
        );
        refused(
            "--every",
            "1h",
            &["--every-offset", "1h"],
            "--every-offset 1h is not shorter than --every 1h",
        );
        refused(
            "--every",
            "1h",
            &["--every-offset", "90m"],
            "--every-offset 1h 30m is not shorter than --every 1h",
        );
        refused(
            "--every",
            "1h",
            &["--every-offset", "1500ms"],
            "--every-offset 1s 500ms is not a whole number of seconds",
        );
        refused(
            "--every",
            "5m",
            &["--splay", "5m"],
            "--splay 5m is not shorter than --every 5m",
        );
        refused(
            "--every",
            "1h",
            &["--run-key", "nightly"],
            "--every 1h with --run-key nightly: --every makes the run key from the time",
        );
        refused(
            "--every",
            "1h",
            &["--slots", "2"],
            "--slots 2 with --every 1h (run key ",
        );
        // Without --every, the splay is only bounded.
        assert_eq!(config_with("--splay", "2h", &[]).unwrap().splay, s(7200));
    }

    #[test]
    fn attempts_wait_a_period_leave_on_loss_and_refuse_what_cannot_retry() {
        let cfg = config_with("--attempts", "3", &["--every", "5m"]).unwrap();
        let want = Attempts {
            max: 3,
            retry_delay: Duration::ZERO,
        };
        assert_eq!(cfg.attempts, Some(want));
        // The key is undecided for at most its period; a lost term is a failed attempt.
        assert_eq!(cfg.wait, Wait::For(s(300)));
        assert_eq!(cfg.on_loss, OnLoss::Exit);
        let cfg = config_with("--attempts", "2", &["--run-key", "k", "--wait", "1m"]).unwrap();
        assert_eq!(cfg.wait, Wait::For(s(60)));
        let cfg = config_with("--attempts", "2", &["--run-key", "k"]).unwrap();
        assert_eq!(cfg.wait, Wait::Forever);
        let cfg = config_with("--attempts", "2", &["--every", "1h", "--retry-delay", "5m"]);
        assert_eq!(cfg.unwrap().attempts.unwrap().retry_delay, s(300));
        for (extra, want) in [
            (
                &["--every", "5m", "--attempts", "0"][..],
                "--attempts 0: must be between 1 and 1000",
            ),
            (
                &["--every", "5m", "--attempts", "1001"],
                "--attempts 1001: must be between",
            ),
            (
                &["--every", "5m", "--attempts", "2", "--retry-delay", "5m"],
                "--retry-delay 5m is not shorter than --every 5m",
            ),
            (
                &["--every", "1h", "--attempts", "2", "--run-key-ttl", "30m"],
                "--run-key-ttl 30m is shorter than --every 1h",
            ),
        ] {
            let e = config_with("--id", "w", extra).unwrap_err();
            assert_eq!(crate::exit::exit_of(&e), Exit::Usage, "{e}");
            assert!(e.to_string().starts_with(want), "{extra:?}: {e}");
        }
        // Clap's own refusals: no run key to count attempts of, --no-wait, a delay alone.
        for args in [
            &["--attempts", "2"][..],
            &["--attempts", "2", "--every", "5m", "--no-wait"],
            &["--retry-delay", "1s", "--every", "5m"],
        ] {
            use clap::Parser;
            let argv = [&["lead-exec", "run", "x"], args, &["--", "true"]].concat();
            assert!(crate::cli::Cli::try_parse_from(argv).is_err(), "{args:?}");
        }
    }

    #[test]
    fn ids_are_one_line() {
        let e = config_with("--id", "evil\nleader:    mallory", &[]).unwrap_err();
        assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
        assert!(
            e.to_string().contains("control character (\\n at byte 4)"),
            "{e}"
        );
        assert_eq!(
            config_with("--id", "wörker-1 (b)", &[]).unwrap().id,
            "wörker-1 (b)"
        );
    }
}
