//! Validated configuration.
//!
//! [`crate::cli`] says what the user typed; this module decides whether it can be safe and turns
//! it into the values the rest of the program trusts. Every refusal here is a one-line message
//! and [`Exit::Usage`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::cli::{self, ConnArgs, RunArgs};
use crate::clock::human;
use crate::election::campaign::Wait;
use crate::election::lease::check_lease_safety;
use crate::election::{hostname, Election};
use crate::etcd::{Conn, Secret, Tls};
use crate::exit::{fail, Exit};
use crate::supervisor::CgroupMode;

/// The largest lease TTL etcd grants (`MaxLeaseTTL` in etcd's lease package); a grant above
/// it fails with "too large lease TTL".
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(9_000_000_000);

/// The shortest `--dial-timeout` and `--command-timeout`: below it no request can complete,
/// and a run would retry forever.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(100);

/// A `--wait` this short cannot outlast the first attempt, so it means `--no-wait`.
pub const NO_WAIT_BELOW: Duration = Duration::from_millis(10);

/// The longest duration any flag takes (other than the lease TTLs, which etcd bounds: see
/// [`MAX_LEASE_TTL`]): 100 years, as humantime counts them. Deadlines are instants plus these
/// durations, on clocks counted in nanoseconds in 64 bits (584 years for an unsigned count):
/// a few of them added to the time since boot must still fit.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// Refuses a duration above [`MAX_DURATION`], naming the flag.
pub fn bounded_duration(flag: &str, d: Duration) -> Result<Duration> {
    if d > MAX_DURATION {
        return Err(fail(
            Exit::Usage,
            format!(
                "{flag} {} is too long: the most any duration flag takes is {}",
                human(d),
                human(MAX_DURATION)
            ),
        ));
    }
    Ok(d)
}

/// Refuses a value with a control character in it (a newline, say), naming the flag: it is
/// stored, and shown line by line by `status`, `history` and `watch`, where a newline would
/// print a line of its own.
pub fn one_line(flag: &str, value: &str) -> Result<()> {
    match crate::text::first_control(value) {
        None => Ok(()),
        Some((at, c)) => Err(fail(
            Exit::Usage,
            format!(
                "{flag} '{}' has a control character ({c} at byte {at}): it must be one line of printable text",
                crate::text::quoted(value)
            ),
        )),
    }
}

impl Conn {
    pub fn from_args(a: &ConnArgs) -> Result<Conn> {
        let raw = a
            .endpoints
            .clone()
            .or_else(|| std::env::var("ETCDCTL_ENDPOINTS").ok())
            .unwrap_or_else(|| "127.0.0.1:2379".to_string());
        let endpoints: Vec<String> = raw
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(fail(Exit::Usage, "--endpoints: no endpoint given"));
        }
        for e in &endpoints {
            let hostport = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"))
                .unwrap_or(e);
            if hostport.contains('/') || !hostport.contains(':') {
                return Err(fail(
                    Exit::Usage,
                    format!("--endpoints: '{e}' is not HOST:PORT or a http(s):// URL"),
                ));
            }
        }
        for (flag, d) in [
            ("--dial-timeout", a.dial_timeout),
            ("--command-timeout", a.command_timeout),
        ] {
            bounded_duration(flag, d)?;
            if d < MIN_TIMEOUT {
                return Err(fail(
                    Exit::Usage,
                    format!(
                        "{flag} {} is too short: it must be at least {}",
                        human(d),
                        human(MIN_TIMEOUT)
                    ),
                ));
            }
        }
        let env_path = |name: &str| std::env::var_os(name).map(PathBuf::from);
        let cacert = a.cacert.clone().or_else(|| env_path("ETCDCTL_CACERT"));
        let cert = a.cert.clone().or_else(|| env_path("ETCDCTL_CERT"));
        let key = a.key.clone().or_else(|| env_path("ETCDCTL_KEY"));
        if cert.is_some() != key.is_some() {
            return Err(fail(Exit::Usage, "--cert and --key go together"));
        }
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        let tls =
            (cacert.is_some() || cert.is_some() || https).then_some(Tls { cacert, cert, key });
        let auth = match &a.user {
            None if a.password_file.is_some() => {
                return Err(fail(Exit::Usage, "--password-file needs --user"))
            }
            Some(user) if user.is_empty() => {
                return Err(fail(Exit::Usage, "--user must not be empty"))
            }
            None => None,
            Some(user) => Some((user.clone(), read_password(a)?)),
        };
        Ok(Conn {
            endpoints,
            dial_timeout: a.dial_timeout,
            command_timeout: a.command_timeout,
            tls,
            auth,
        })
    }
}

fn read_password(a: &ConnArgs) -> Result<Secret> {
    if let Some(path) = &a.password_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            fail(
                Exit::Usage,
                format!("--password-file {}: {e}", path.display()),
            )
        })?;
        let line = text.lines().next().unwrap_or("").to_string();
        if line.is_empty() {
            return Err(fail(
                Exit::Usage,
                format!(
                    "--password-file {}: the first line is empty; it must hold the password",
                    path.display()
                ),
            ));
        }
        return Ok(Secret::new(line));
    }
    match std::env::var("LEAD_EXEC_PASSWORD") {
        Ok(p) => Ok(Secret::new(p)),
        Err(_) => Err(fail(
            Exit::Usage,
            "--user needs a password in LEAD_EXEC_PASSWORD or --password-file",
        )),
    }
}

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
    pub run_key: Option<String>,
    pub run_key_ttl: Duration,
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
    pub command: Vec<String>,
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

/// The shortest `--timeout`: below it the job could not even start.
const MIN_JOB_TIMEOUT: Duration = Duration::from_millis(10);

/// The most `--slots`: the creating transaction reads the first N candidate keys and a
/// holder scans the N slot keys, on every term; past about a thousand that stops being cheap,
/// and a semaphore that wide is better served by a work queue.
pub const MAX_SLOTS: u32 = 1024;

/// Refuses a slot count out of range, and slots with a run key.
fn check_slots(slots: u32, run_key: Option<&str>) -> Result<u32> {
    if !(1..=MAX_SLOTS).contains(&slots) {
        return Err(fail(
            Exit::Usage,
            format!("--slots {slots}: must be between 1 and {MAX_SLOTS}"),
        ));
    }
    if let (true, Some(k)) = (slots > 1, run_key) {
        return Err(fail(
            Exit::Usage,
            format!(
                "--slots {slots} with --run-key {k}: a run key runs the job once, and {slots} slots would run it up to {slots} times at once before any of them records it done"
            ),
        ));
    }
    Ok(slots)
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
        ] {
            if let Some(d) = d {
                bounded_duration(flag, d)?;
            }
        }
        let ttl = lease_ttl("--ttl", a.ttl)?;
        check_lease_safety(ttl, a.grace, a.safety_margin)?;
        let run_key_ttl = lease_ttl("--run-key-ttl", a.run_key_ttl)?;
        let wait = match (a.no_wait, a.wait) {
            (true, _) => Wait::No,
            (false, Some(d)) if d < NO_WAIT_BELOW => Wait::No,
            (false, Some(d)) => Wait::For(d),
            (false, None) => Wait::Forever,
        };
        let id = match &a.id {
            Some(id) if id.trim().is_empty() => {
                return Err(fail(Exit::Usage, "--id must not be empty"))
            }
            Some(id) => {
                one_line("--id", id)?;
                id.clone()
            }
            None => format!("{}:{}", hostname(), std::process::id()),
        };
        if let Some(k) = &a.run_key {
            crate::election::validate_run_key(k)?;
        }
        let slots = check_slots(a.slots, a.run_key.as_deref())?;
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
        if a.command.first().is_none_or(|c| c.is_empty()) {
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
            on_loss: match a.on_loss {
                cli::OnLoss::Campaign => OnLoss::Campaign,
                cli::OnLoss::Exit => OnLoss::Exit,
            },
            wait,
            conflict_exit_code: a.conflict_exit_code,
            history_keep: a.history_keep,
            run_key: a.run_key.clone(),
            run_key_ttl,
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
            command: a.command.clone(),
        })
    }
}

/// A lease TTL as etcd grants it: whole seconds, so a fraction is rounded up (the safety check
/// then sees the TTL actually requested), and no more than etcd's maximum.
pub fn lease_ttl(flag: &str, d: Duration) -> Result<Duration> {
    if d.is_zero() {
        return Err(fail(
            Exit::Usage,
            format!("{flag} must be greater than zero"),
        ));
    }
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let whole = Duration::from_secs(secs);
    if whole > MAX_LEASE_TTL {
        return Err(fail(
            Exit::Usage,
            format!(
                "{flag} {} is above etcd's maximum lease TTL of {} s",
                human(d),
                MAX_LEASE_TTL.as_secs()
            ),
        ));
    }
    Ok(whole)
}

/// `HOST:PORT` with HOST a name or an address; a name is resolved now, to its first address.
fn metrics_addr(s: &str) -> Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let bad = |why: String| {
        fail(
            Exit::Usage,
            format!("--metrics-addr '{s}': {why} (expected HOST:PORT, e.g. localhost:9464)"),
        )
    };
    if !s.contains(':') {
        return Err(bad("no port".into()));
    }
    // localhost is loopback (RFC 6761) even where /etc/hosts does not say so (minimal roots).
    if let Some(port) = s.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| bad("bad port".into()))?;
        return Ok((std::net::Ipv4Addr::LOCALHOST, port).into());
    }
    s.to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("the host name has no address".into()))
}

/// Room kept for what is added to the job's exec beyond its command and lead-exec's
/// environment: the job's `FENCING_TOKEN`/`LEAD_EXEC_*` variables and the watchdog's own
/// arguments.
const EXEC_RESERVE: usize = 4096;

/// The longest single argument or environment string execve(2) takes (`MAX_ARG_STRLEN`).
const MAX_ARG_STRLEN: usize = 32 * 4096;

/// Refuses, before campaigning, a command whose arguments and environment execve(2) would
/// refuse with E2BIG (exit 126, as a shell gives): otherwise the run would win an election
/// only to fail at the spawn.
pub fn check_exec_size(
    command: &[String],
    env: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<()> {
    // SAFETY: sysconf has no preconditions.
    let limit = unsafe { libc::sysconf(libc::_SC_ARG_MAX) };
    let limit = if limit > 0 { limit as usize } else { 2 << 20 };
    let ptr = std::mem::size_of::<usize>();
    let env: Vec<usize> = env.map(|(k, v)| k.len() + 1 + v.len()).collect();
    let strings = command.iter().map(String::len).chain(env.iter().copied());
    let longest = strings.clone().max().unwrap_or(0);
    let total: usize = strings.map(|n| n + 1 + ptr).sum::<usize>() + EXEC_RESERVE;
    if longest >= MAX_ARG_STRLEN || total > limit {
        return Err(fail(
            Exit::NotExecutable,
            format!(
                "{}: cannot execute: argument list too long ({total} bytes of arguments and environment, {longest} in the longest string; the limits are {limit} and {MAX_ARG_STRLEN})",
                command[0]
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    #[test]
    fn lease_ttls_round_up_to_whole_seconds_within_etcds_maximum() {
        let ms = Duration::from_millis;
        assert_eq!(lease_ttl("--ttl", ms(2900)).unwrap(), s(3));
        assert_eq!(lease_ttl("--ttl", s(10)).unwrap(), s(10));
        assert_eq!(lease_ttl("--ttl", Duration::from_nanos(1)).unwrap(), s(1));
        assert_eq!(lease_ttl("--ttl", MAX_LEASE_TTL).unwrap(), MAX_LEASE_TTL);
        let e = lease_ttl("--ttl", MAX_LEASE_TTL + ms(1)).unwrap_err();
        assert!(e.to_string().contains("above etcd's maximum"), "{e}");
        let e = lease_ttl("--run-key-ttl", Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("greater than zero"), "{e}");
    }

    #[test]
    fn a_fractional_ttl_is_checked_as_granted() {
        // 2900ms would pass the check, then be granted as 2s: unsafe. Rounded to 3s it is safe.
        let ttl = lease_ttl("--ttl", Duration::from_millis(2900)).unwrap();
        check_lease_safety(ttl, s(2), Duration::from_millis(500)).unwrap();
        assert!(check_lease_safety(s(2), s(2), Duration::from_millis(500)).is_err());
    }

    #[test]
    fn durations_for_people_stop_at_milliseconds() {
        assert_eq!(human(s(2) / 3).to_string(), "666ms");
        assert_eq!(human(Duration::from_nanos(1)).to_string(), "1ns");
        assert_eq!(human(s(10) / 3).to_string(), "3s 333ms");
    }

    #[test]
    fn exec_size_is_checked_against_the_system_limit() {
        let none = std::iter::empty::<(std::ffi::OsString, std::ffi::OsString)>;
        check_exec_size(&["true".into()], none()).unwrap();
        let huge: Vec<String> = (0..40).map(|_| "x".repeat(100_000)).collect();
        let e = check_exec_size(&huge, none()).unwrap_err();
        assert_eq!(crate::exit::exit_of(&e), Exit::NotExecutable);
        assert!(e.to_string().contains("argument list too long"), "{e}");
        let one = vec!["x".repeat(MAX_ARG_STRLEN)];
        assert!(check_exec_size(&one, none()).is_err());
    }

    #[test]
    fn metrics_addresses_resolve_host_names() {
        assert!(metrics_addr("localhost:9464").unwrap().ip().is_loopback());
        assert_eq!(
            metrics_addr("127.0.0.1:9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert!(metrics_addr("9464").is_err());
    }

    fn wait_of(flag: &[&str]) -> Wait {
        use clap::Parser;
        let args = [&["lead-exec", "run", "x"], flag, &["--", "true"]].concat();
        let cli = crate::cli::Cli::try_parse_from(args).unwrap();
        let crate::cli::Command::Run(a) = cli.command else {
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
        assert_eq!(check_slots(1, Some("nightly")).unwrap(), 1);
        for bad in [0, MAX_SLOTS + 1] {
            let e = check_slots(bad, None).unwrap_err();
            assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
            assert!(e.to_string().contains("must be between 1 and"), "{e}");
        }
        let e = check_slots(2, Some("nightly")).unwrap_err();
        assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
        assert!(e.to_string().contains("a run key runs the job once"), "{e}");
    }

    /// Every duration flag, with the most it takes and what it needs beside it.
    const DURATION_FLAGS: [(&str, Duration, &[&str]); 11] = [
        ("--timeout", MAX_DURATION, &[]),
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
        let crate::cli::Command::Run(a) = cli.command else {
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
            // Grace and margin at the maximum need a lease to match.
            let ttl: &[&str] = match flag {
                "--grace" | "--safety-margin" => &["--ttl", "9000000000s"],
                _ => &[],
            };
            let at = format!("{}s", max.as_secs());
            config_with(flag, &at, &[extra, ttl].concat())
                .unwrap_or_else(|e| panic!("{flag} {at}: {e}"));
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

    #[test]
    fn password_is_not_debug_printed() {
        let p = Secret::new("hunter2".into());
        assert!(!format!("{p:?}").contains("hunter2"));
    }
}
