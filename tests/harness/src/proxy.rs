//! A TCP fault proxy between lead-exec and etcd, driven from tests.
//!
//! Modes: pass; blackhole (connections stay open, nothing is forwarded); hold replies (requests
//! pass, answers are held back until the mode changes: to the client, a lost reply); delay N ms
//! per chunk; reset (every connection is closed, new ones are closed at once). Beside any mode,
//! [`Proxy::reset_on`] cuts one kind of request: every request that carries given bytes is
//! dropped before it reaches the server, and every connection is closed then (new ones pass).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Blackhole,
    HoldReplies,
    Delay(u64),
    Reset,
}

struct Shared {
    mode: Mutex<Mode>,
    /// Bumped on every reset: connections from an older generation close themselves.
    generation: AtomicU64,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
    /// Requests carrying these bytes are dropped, with a reset of every connection.
    reset_on: Mutex<Option<Vec<u8>>>,
    /// How many requests `reset_on` dropped.
    resets_on: AtomicU64,
    /// What each connection's client sent, in the order the connections came.
    sent: Mutex<Vec<Vec<u8>>>,
}

pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    pub fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            reset_on: Mutex::new(None),
            resets_on: AtomicU64::new(0),
            sent: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                if *s.mode.lock().unwrap() == Mode::Reset {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut c = s.conns.lock().unwrap();
                    c.push(client.try_clone().unwrap());
                    c.push(server.try_clone().unwrap());
                }
                let gen = s.generation.load(Ordering::SeqCst);
                let conn = {
                    let mut sent = s.sent.lock().unwrap();
                    sent.push(Vec::new());
                    sent.len() - 1
                };
                pump(
                    s.clone(),
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    gen,
                    Some(conn),
                );
                pump(s.clone(), server, client, gen, None);
            }
        });
        Proxy { port, shared }
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn set(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
        if mode == Mode::Reset {
            self.shared.reset_all();
        }
    }

    /// From now on, a chunk from the client that contains `pattern` is dropped (the server
    /// never sees it) and every connection is closed, as a cut link would; connections opened
    /// afterwards pass as the mode says. `None` stops it. Only for unencrypted traffic, and
    /// for a pattern well inside one request (a chunk is one read of up to 16 KiB; the last
    /// bytes of the one before count too, so a pattern split across two reads is found).
    pub fn reset_on(&self, pattern: Option<&[u8]>) {
        *self.shared.reset_on.lock().unwrap() = pattern.map(<[u8]>::to_vec);
    }

    /// How many requests [`Proxy::reset_on`] dropped so far.
    pub fn resets_on(&self) -> u64 {
        self.shared.resets_on.load(Ordering::SeqCst)
    }

    /// The bytes each connection's client sent and the proxy passed on, one entry per
    /// connection in the order they were accepted.
    pub fn sent(&self) -> Vec<Vec<u8>> {
        self.shared.sent.lock().unwrap().clone()
    }
}

impl Shared {
    /// Closes every connection; their pumps end.
    fn reset_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Whether `chunk` (after `tail`, the end of the chunk before) carries the `reset_on`
    /// pattern.
    fn cuts(&self, tail: &[u8], chunk: &[u8]) -> bool {
        let guard = self.reset_on.lock().unwrap();
        let Some(p) = guard.as_deref().filter(|p| !p.is_empty()) else {
            return false;
        };
        let mut seen = tail.to_vec();
        seen.extend_from_slice(chunk);
        seen.windows(p.len()).any(|w| w == p)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for c in self.shared.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies `from` to `to`: a client's requests when `requests` names its connection (what
/// passes is kept in [`Shared::sent`]), else the server's replies.
fn pump(s: Arc<Shared>, mut from: TcpStream, mut to: TcpStream, gen: u64, requests: Option<usize>) {
    let replies = requests.is_none();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
        let mut held: Vec<u8> = Vec::new();
        // The last bytes forwarded, so that `reset_on` finds a pattern split across two reads.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            if s.stop.load(Ordering::SeqCst) || s.generation.load(Ordering::SeqCst) != gen {
                break;
            }
            let mode = *s.mode.lock().unwrap();
            if mode == Mode::Blackhole || (replies && mode == Mode::HoldReplies) {
                // Keep the bytes: a blackhole drops traffic, but TCP never loses it; what
                // was in flight arrives (late) once the path heals, as on a real network.
                match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => held.extend_from_slice(&buf[..n]),
                    Err(_) => {}
                }
                continue;
            }
            if !held.is_empty() {
                if to.write_all(&held).is_err() {
                    break;
                }
                if let Some(conn) = requests {
                    s.sent.lock().unwrap()[conn].extend_from_slice(&held);
                }
                held.clear();
            }
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if !replies && s.cuts(&tail, &buf[..n]) {
                        s.resets_on.fetch_add(1, Ordering::SeqCst);
                        s.reset_all();
                        break;
                    }
                    tail.clear();
                    tail.extend_from_slice(&buf[n.saturating_sub(256)..n]);
                    if let Mode::Delay(ms) = mode {
                        std::thread::sleep(Duration::from_millis(ms));
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if let Some(conn) = requests {
                        s.sent.lock().unwrap()[conn].extend_from_slice(&buf[..n]);
                    }
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
