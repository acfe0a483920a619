//! A TCP fault proxy between lead-exec and etcd, driven from tests.
//!
//! Modes: pass; blackhole (connections stay open, nothing is forwarded); hold replies (requests
//! pass, answers are held back until the mode changes: to the client, a lost reply); delay N ms
//! per chunk; reset (every connection is closed, new ones are closed at once).

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
                pump(
                    s.clone(),
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    gen,
                    false,
                );
                pump(s.clone(), server, client, gen, true);
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
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
            for c in self.shared.conns.lock().unwrap().drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
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

/// Copies `from` to `to`; `replies` is the server-to-client direction.
fn pump(s: Arc<Shared>, mut from: TcpStream, mut to: TcpStream, gen: u64, replies: bool) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
        let mut held: Vec<u8> = Vec::new();
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
                held.clear();
            }
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if let Mode::Delay(ms) = mode {
                        std::thread::sleep(Duration::from_millis(ms));
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
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
