//! A throwaway single-member etcd for timing: the harness's [`crate::Member`] in a process group
//! of its own, spoken to over etcd's HTTP gateway (keys, `/metrics`, a watch).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use super::{fail, reap, Context};

/// `etcd` or `etcdctl` as the tests find them: `$ETCD_BIN_DIR` when set, else PATH.
pub fn etcd_bin(name: &str) -> PathBuf {
    crate::locate(name, "etcd-client").unwrap_or_else(|_| PathBuf::from(name))
}

/// A throwaway single-member etcd on loopback, spoken to over its HTTP gateway so that the
/// harness needs no client library (and spawns no etcdctl while timing).
pub struct HttpEtcd {
    pub member: crate::Member,
    /// The plain client port, for the harness's own requests.
    pub port: u16,
    /// Where the tools under measurement connect: the plain port, or the TLS one, directly or
    /// through the delay line.
    pub endpoint: String,
    /// The delay line in front of `endpoint`, if any.
    pub delay: Option<super::delay::DelayLine>,
}

impl HttpEtcd {
    pub fn start(dir: &Path) -> io::Result<HttpEtcd> {
        HttpEtcd::start_with(dir, &crate::MemberOpts::default(), Duration::ZERO)
    }

    /// An etcd as `opts` say (TLS, a slow disk), with `rtt` added to every round trip the
    /// tools make to it (none when zero).
    pub fn start_with(dir: &Path, opts: &crate::MemberOpts, rtt: Duration) -> io::Result<HttpEtcd> {
        crate::locate("etcd", "etcd-server").map_err(fail)?;
        let member = crate::Member::single_with(
            dir,
            "etcd",
            |cmd| {
                // In a group of its own, killed whole on the way out.
                cmd.process_group(0);
                // A connection per candidate: `--candidates 1000` needs more descriptors than the
                // usual soft limit of 1024.
                // SAFETY: getrlimit/setrlimit are async-signal-safe and touch only our own limits.
                unsafe {
                    cmd.pre_exec(|| {
                        let mut r = libc::rlimit {
                            rlim_cur: 0,
                            rlim_max: 0,
                        };
                        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
                            r.rlim_cur = r.rlim_max;
                            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
                        }
                        Ok(())
                    });
                }
            },
            opts,
        );
        reap::add(member.pid());
        let port = member.client_port;
        let log = member.log();
        let tools_port = member.tls_port.unwrap_or(port);
        let delay = if rtt.is_zero() {
            None
        } else {
            Some(super::delay::DelayLine::start(
                format!("127.0.0.1:{tools_port}"),
                rtt,
            )?)
        };
        let hostport = delay
            .as_ref()
            .map_or(format!("127.0.0.1:{tools_port}"), |d| d.endpoint());
        let endpoint = match member.tls_port {
            Some(_) => format!("https://{hostport}"),
            None => hostport,
        };
        let e = HttpEtcd {
            member,
            port,
            endpoint,
            delay,
        };
        // A slow disk slows start-up's commits too: etcd 3.5 took 45 s to answer here.
        let limit = if opts.slow_fsync.is_some() { 180 } else { 20 };
        let until = Instant::now() + Duration::from_secs(limit);
        while !e
            .http("GET", "/health", "")
            .is_ok_and(|b| b.contains("\"true\""))
        {
            if Instant::now() > until {
                return Err(fail(format!(
                    "etcd did not become healthy; see {}",
                    log.display()
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(e)
    }

    pub fn http(&self, method: &str, path: &str, body: &str) -> io::Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let (_, b) = out
            .split_once("\r\n\r\n")
            .context("malformed HTTP response")?;
        Ok(b.to_string())
    }

    /// Number of keys under `prefix`.
    pub fn count(&self, prefix: &str) -> io::Result<u64> {
        let body = self.http(
            "POST",
            "/v3/kv/range",
            &range_json(prefix, ",\"count_only\":true"),
        )?;
        // proto3 JSON leaves out zero values, and writes int64 as a string.
        Ok(match body.split_once("\"count\":\"") {
            Some((_, rest)) => rest
                .split('"')
                .next()
                .unwrap_or("0")
                .parse()
                .context("count")?,
            None => 0,
        })
    }

    /// `grpc_server_msg_received_total` summed per grpc_method.
    pub fn msgs_received(&self) -> io::Result<BTreeMap<String, f64>> {
        by_method(
            &self.http("GET", "/metrics", "")?,
            "grpc_server_msg_received_total",
        )
    }

    /// `grpc_server_started_total` by grpc_method (requests and streams begun), and
    /// `etcd_server_proposals_committed_total` as `"commits"`.
    pub fn requests(&self) -> io::Result<BTreeMap<String, f64>> {
        let text = self.http("GET", "/metrics", "")?;
        let mut m = by_method(&text, "grpc_server_started_total")?;
        if let Some(v) = text
            .lines()
            .find_map(|l| l.strip_prefix("etcd_server_proposals_committed_total "))
        {
            m.insert("commits".to_string(), v.trim().parse().unwrap_or(0.0));
        }
        Ok(m)
    }

    /// Unlabelled samples of etcd's `/metrics` (gauges and counters), by name.
    pub fn gauges(&self) -> io::Result<BTreeMap<String, f64>> {
        let text = self.http("GET", "/metrics", "")?;
        Ok(text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.contains('{'))
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect())
    }

    /// Streams the times at which keys under `prefix` are deleted, once the watch is in place.
    pub fn watch_deletes(&self, prefix: &str) -> io::Result<DeleteWatch> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        let body = format!("{{\"create_request\":{}}}", range_json(prefix, ""));
        write!(
            s,
            "POST /v3/watch HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut r = s.try_clone()?;
        thread::spawn(move || {
            let mut text = String::new();
            let (mut created, mut seen) = (false, 0);
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = r.read(&mut buf) {
                let at = Instant::now();
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                if !created && text.contains("\"created\":true") {
                    created = true;
                    let _ = ready_tx.send(());
                }
                let c = text.matches("\"DELETE\"").count();
                for _ in seen..c {
                    let _ = tx.send(at);
                }
                seen = c;
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .context("etcd watch not created")?;
        Ok(DeleteWatch { rx, stream: s })
    }
}

impl Drop for HttpEtcd {
    fn drop(&mut self) {
        let pg = self.member.pid();
        // SAFETY: kill(2) on the group we created for etcd.
        unsafe { libc::kill(-pg, libc::SIGKILL) };
        self.member.kill();
        reap::remove(pg);
    }
}

/// Deletes under a prefix as etcd streams them, timed on arrival; dropping it ends the watch.
pub struct DeleteWatch {
    pub rx: Receiver<Instant>,
    stream: TcpStream,
}

impl Drop for DeleteWatch {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The samples of `metric` in a `/metrics` text, summed per grpc_method.
fn by_method(text: &str, metric: &str) -> io::Result<BTreeMap<String, f64>> {
    let mut m = BTreeMap::new();
    let open = format!("{metric}{{");
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(open.as_str()) else {
            continue;
        };
        let (labels, value) = rest.rsplit_once("} ").context("metrics line")?;
        let method = labels
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap_or("?");
        *m.entry(method.to_string()).or_insert(0.0) += value
            .trim()
            .parse::<f64>()
            .map_err(|e| fail(e.to_string()))?;
    }
    Ok(m)
}

fn range_json(prefix: &str, extra: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    format!(
        "{{\"key\":\"{}\",\"range_end\":\"{}\"{extra}}}",
        base64(prefix.as_bytes()),
        base64(&end)
    )
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
