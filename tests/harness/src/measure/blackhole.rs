//! A TCP proxy in front of etcd that blackholes right after it has forwarded an answer from
//! etcd, and records when it last forwarded a request: the worst case for a wrapper's
//! deadline, timed. Unlike the tests' [`crate::proxy::Proxy`], a blackhole here discards what
//! it reads.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::fail;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    /// Blackhole right after the next answer from etcd has been forwarded.
    Armed,
    Blackhole,
}

struct ProxyState {
    mode: Mode,
    /// When a client→etcd request was last forwarded.
    last_up: Option<Instant>,
    /// When the blackhole began, and `last_up` at that moment.
    blackholed: Option<(Instant, Instant)>,
}

struct ProxyShared {
    state: Mutex<ProxyState>,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

/// A TCP proxy in front of etcd. In blackhole mode it reads and discards in both directions
/// and keeps every connection open, as a partitioned network does.
pub struct Proxy {
    pub port: u16,
    shared: Arc<ProxyShared>,
}

impl Proxy {
    pub fn start(etcd_port: u16) -> io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(ProxyShared {
            state: Mutex::new(ProxyState {
                mode: Mode::Pass,
                last_up: None,
                blackholed: None,
            }),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", etcd_port)) else {
                    continue;
                };
                for c in [&client, &server] {
                    let _ = c.set_nodelay(true);
                    let _ = c.set_read_timeout(Some(Duration::from_millis(20)));
                    if let Ok(c) = c.try_clone() {
                        s.conns.lock().unwrap().push(c);
                    }
                }
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                pump(s.clone(), client, server, true);
                pump(s.clone(), s2, c2, false);
            }
        });
        Ok(Proxy { port, shared })
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Blackholes right after the next answer from etcd has been forwarded.
    pub fn arm(&self) {
        self.shared.state.lock().unwrap().mode = Mode::Armed;
    }

    /// (blackhole start, last request forwarded to etcd before it).
    pub fn wait_blackholed(&self, limit: Duration) -> io::Result<(Instant, Instant)> {
        let until = Instant::now() + limit;
        loop {
            if let Some(b) = self.shared.state.lock().unwrap().blackholed {
                return Ok(b);
            }
            if Instant::now() > until {
                return Err(fail(format!(
                    "no answer from etcd crossed the proxy within {limit:?}"
                )));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        for c in self.shared.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        let _ = TcpStream::connect(("127.0.0.1", self.port)); // wakes the accept loop
    }
}

/// Whether a chunk holds an HTTP/2 DATA frame with a payload, i.e. a gRPC request or answer
/// rather than housekeeping (PING, WINDOW_UPDATE, SETTINGS). It assumes the chunk starts at a
/// frame boundary, as the small, sparse frames of an idle connection do; if not, the walk
/// finds no DATA frame and the chunk does not count.
fn has_grpc_message(chunk: &[u8]) -> bool {
    let mut rest = chunk;
    while rest.len() >= 9 {
        let len = (rest[0] as usize) << 16 | (rest[1] as usize) << 8 | rest[2] as usize;
        if rest[3] == 0 && len > 0 {
            return true;
        }
        rest = rest.get(9 + len..).unwrap_or(&[]);
    }
    false
}

fn pump(s: Arc<ProxyShared>, mut from: TcpStream, mut to: TcpStream, up: bool) {
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while !s.stop.load(SeqCst) {
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => break,
            };
            // Forwarding under the lock keeps the timestamps and the mode switch in order.
            let mut st = s.state.lock().unwrap();
            if st.mode == Mode::Blackhole {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            let now = Instant::now();
            let message = has_grpc_message(&buf[..n]);
            if up {
                if message {
                    st.last_up = Some(now);
                }
            } else if st.mode == Mode::Armed && message {
                st.mode = Mode::Blackhole;
                st.blackholed = Some((now, st.last_up.unwrap_or(now)));
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
