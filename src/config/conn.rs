//! The etcd connection flags shared by every command (endpoints, timeouts, TLS,
//! credentials), checked into a [`Conn`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use super::values::{bounded_duration, MIN_TIMEOUT};
use crate::cli::ConnArgs;
use crate::clock::human;
use crate::etcd::{Conn, Secret, Tls};
use crate::exit::{fail, Exit};

/// `--command-timeout` when none is given (for `run`, the lease TTL when that is shorter).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

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
            let port = hostport.rsplit(':').next().unwrap_or_default();
            if !port.parse::<u16>().is_ok_and(|p| p > 0) {
                return Err(fail(
                    Exit::Usage,
                    format!("--endpoints: '{e}': the port must be a number from 1 to 65535"),
                ));
            }
        }
        for (flag, d) in [
            ("--dial-timeout", a.dial_timeout),
            (
                "--command-timeout",
                a.command_timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT),
            ),
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
        if let Some(t) = &tls {
            super::tls::check(t, &endpoints)?;
        }
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
            command_timeout: a.command_timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_is_not_debug_printed() {
        let p = Secret::new("hunter2".into());
        assert!(!format!("{p:?}").contains("hunter2"));
    }
}
