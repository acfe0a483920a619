//! Validated configuration.
//!
//! [`crate::cli`] says what the user typed; this module decides whether it can be safe and turns
//! it into the values the rest of the program trusts. Every refusal here is a one-line message
//! and [`Exit::Usage`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::cli::{CgroupMode, ConnArgs, OnLoss, RunArgs};
use crate::election::lease::{Renewal, MIN_RENEWAL_TIMEOUT, RENEWAL_ATTEMPTS};
use crate::election::Election;
use crate::exit::{fail, Exit};

/// The lowest TTL etcd grants with default election timeouts.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct Conn {
    pub endpoints: Vec<String>,
    pub dial_timeout: Duration,
    pub command_timeout: Duration,
    pub tls: Option<Tls>,
    /// User name and password. The password is never logged (see the `Debug` impl of [`Secret`]).
    pub auth: Option<(String, Secret)>,
}

#[derive(Debug, Clone)]
pub struct Tls {
    pub cacert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// A password: printable only on purpose.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
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
        if a.dial_timeout.is_zero() || a.command_timeout.is_zero() {
            return Err(fail(Exit::Usage, "timeouts must be greater than zero"));
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
        return Ok(Secret(line));
    }
    match std::env::var("LEAD_EXEC_PASSWORD") {
        Ok(p) => Ok(Secret(p)),
        Err(_) => Err(fail(
            Exit::Usage,
            "--user needs a password in LEAD_EXEC_PASSWORD or --password-file",
        )),
    }
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
    pub metrics_addr: Option<std::net::SocketAddr>,
    pub command: Vec<String>,
}

/// How long a candidate waits in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Forever,
    No,
    For(Duration),
}

/// Refuses lease settings under which the job could outlive the lease, or could not survive
/// one lost keepalive.
///
/// The job gets SIGTERM at `D - grace` and SIGKILL at `D`, where
/// `D = send time of the last good keepalive + TTL - margin`. A keepalive goes out one
/// interval (TTL/3) after the last good one; what is left before `D - grace` is the room to
/// retry it, and [`RENEWAL_ATTEMPTS`] attempts of at least [`MIN_RENEWAL_TIMEOUT`] must fit,
/// so that one lost reply or one etcd leader election does not cost the job.
pub fn check_lease_safety(ttl: Duration, grace: Duration, margin: Duration) -> Result<()> {
    if ttl < MIN_TTL {
        return Err(fail(
            Exit::Usage,
            format!(
                "--ttl {} is below etcd's minimum lease of 2s",
                humantime::format_duration(ttl)
            ),
        ));
    }
    let budget = Renewal::budget(ttl, grace, margin);
    if budget < MIN_RENEWAL_TIMEOUT * RENEWAL_ATTEMPTS {
        let ms =
            |d: Duration| humantime::format_duration(Duration::from_millis(d.as_millis() as u64));
        return Err(fail(
            Exit::Usage,
            format!(
                "unsafe lease settings: --ttl {} minus --grace {}, --safety-margin {} and the keepalive interval {} (ttl/3) leaves {} to renew, below {} attempts of {}",
                ms(ttl),
                ms(grace),
                ms(margin),
                ms(ttl / 3),
                ms(budget),
                RENEWAL_ATTEMPTS,
                ms(MIN_RENEWAL_TIMEOUT),
            ),
        ));
    }
    Ok(())
}

impl RunConfig {
    pub fn from_args(a: &RunArgs) -> Result<RunConfig> {
        let election = Election::new(&a.election.election)?;
        let conn = Conn::from_args(&a.election.conn)?;
        check_lease_safety(a.ttl, a.grace, a.safety_margin)?;
        let wait = match (a.no_wait, a.wait) {
            (true, _) => Wait::No,
            (false, Some(d)) => Wait::For(d),
            (false, None) => Wait::Forever,
        };
        let id = match &a.id {
            Some(id) if id.trim().is_empty() => {
                return Err(fail(Exit::Usage, "--id must not be empty"))
            }
            Some(id) => id.clone(),
            None => format!("{}:{}", hostname(), std::process::id()),
        };
        if let Some(k) = &a.run_key {
            crate::election::validate_run_key(k)?;
        }
        let metrics_addr = match &a.metrics_addr {
            None => None,
            Some(s) => Some(s.parse().map_err(|_| {
                fail(
                    Exit::Usage,
                    format!("--metrics-addr '{s}' is not HOST:PORT (e.g. 127.0.0.1:9464)"),
                )
            })?),
        };
        if a.command.first().is_none_or(|c| c.is_empty()) {
            return Err(fail(Exit::Usage, "no command given after --"));
        }
        Ok(RunConfig {
            election,
            conn,
            ttl: a.ttl,
            grace: a.grace,
            safety_margin: a.safety_margin,
            id,
            on_loss: a.on_loss,
            wait,
            conflict_exit_code: a.conflict_exit_code,
            history_keep: a.history_keep.max(1),
            run_key: a.run_key.clone(),
            run_key_ttl: a.run_key_ttl,
            cgroup: a.cgroup,
            metrics_addr,
            command: a.command.clone(),
        })
    }
}

/// This machine's host name, for candidate identities.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    #[test]
    fn defaults_are_safe() {
        check_lease_safety(s(10), s(3), s(1)).unwrap();
    }

    #[test]
    fn ttl_below_two_seconds_is_refused() {
        let e = check_lease_safety(Duration::from_millis(1500), Duration::ZERO, Duration::ZERO)
            .unwrap_err();
        assert!(e.to_string().contains("below etcd's minimum"));
    }

    #[test]
    fn grace_plus_margin_plus_interval_must_fit_in_ttl() {
        // 3s grace + 1s margin + 2s interval = 6s, not below 6s.
        let e = check_lease_safety(s(6), s(3), s(1)).unwrap_err();
        assert!(e.to_string().contains("unsafe lease settings"), "{e}");
        check_lease_safety(s(7), s(3), s(1)).unwrap();
    }

    #[test]
    fn three_renewal_attempts_must_fit_before_sigterm() {
        // 3s - 1s interval - 1.5s grace - 0.25s margin = 250ms: not 3 attempts of 100ms.
        let e = check_lease_safety(
            s(3),
            Duration::from_millis(1500),
            Duration::from_millis(250),
        )
        .unwrap_err();
        assert!(e.to_string().contains("below 3 attempts of 100ms"), "{e}");
        // 300ms left: just enough.
        check_lease_safety(
            s(3),
            Duration::from_millis(1450),
            Duration::from_millis(250),
        )
        .unwrap();
    }

    #[test]
    fn password_is_not_debug_printed() {
        let p = Secret("hunter2".into());
        assert!(!format!("{p:?}").contains("hunter2"));
    }
}
