//! systemd `Type=notify` support: READY=1, STATUS=, STOPPING=1 with EXTEND_TIMEOUT_USEC=, and
//! WATCHDOG=1 when the unit asks.
//!
//! Without NOTIFY_SOCKET every call here does nothing.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;
use tracing::Instrument;

fn send(msg: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let res = if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)
            .and_then(|a| sock.send_to_addr(msg.as_bytes(), &a))
    } else {
        sock.send_to(msg.as_bytes(), &path)
    };
    if let Err(e) = res {
        tracing::debug!("sd_notify: {e}");
    }
}

/// Connected and campaigning. Also starts the watchdog pings if the unit set WatchdogSec=.
pub fn ready() {
    send("READY=1\nSTATUS=campaigning");
    let usec = std::env::var("WATCHDOG_USEC")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let pid_ok = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .is_none_or(|p| p == std::process::id());
    if let (Some(usec), true) = (usec, pid_ok) {
        let every = Duration::from_micros(usec) / 2;
        tokio::spawn(
            async move {
                loop {
                    send("WATCHDOG=1");
                    tokio::time::sleep(every).await;
                }
            }
            .in_current_span(),
        );
    }
}

/// A stopping signal reached lead-exec: it is going, in at most `within` (the job's grace,
/// then the end record and the lease's release). Tells systemd so, and to wait that long
/// beyond its own stop timeout if need be.
pub fn stopping(within: Duration) {
    send(&format!(
        "STOPPING=1\nSTATUS=stopping\nEXTEND_TIMEOUT_USEC={}",
        within.as_micros()
    ));
}

pub fn status(s: &str) {
    send(&format!("STATUS={s}"));
}
