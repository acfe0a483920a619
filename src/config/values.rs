//! Single values, each checked on its own and refused naming its flag: durations, lease
//! TTLs, text that is stored and shown, the metrics address.

use std::time::Duration;

use anyhow::Result;

use crate::clock::human;
use crate::exit::{fail, Exit};

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
pub(super) fn metrics_addr(s: &str) -> Result<std::net::SocketAddr> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::lease::check_lease_safety;

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
        assert_eq!(human(s(2) / 3).to_string(), "667ms");
        assert_eq!(human(Duration::from_nanos(1)).to_string(), "1ns");
        assert_eq!(human(s(10) / 3).to_string(), "3s 333ms");
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
}
