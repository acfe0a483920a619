//! A delay line in front of etcd: every chunk either way is held `rtt / 2`, as a network with
//! that round trip would hold it, and chunks in flight overlap, as packets on a wire do (a
//! pipelined request is not charged twice). The tests' [`crate::proxy::Proxy`] in its delay
//! mode sleeps per chunk in the one thread that forwards, so chunks queue behind each other:
//! right for a fault, wrong for timing requests sent together.
//!
//! Connection set-up is not delayed (the kernel completes the client's TCP handshake with the
//! proxy at once); what a TLS or HTTP/2 handshake exchanges is.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

pub struct DelayLine {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl DelayLine {
    /// Forwards 127.0.0.1:`port` to `target`, adding `rtt` to every round trip.
    pub fn start(target: String, rtt: Duration) -> io::Result<DelayLine> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let half = rtt / 2;
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(&target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
                    line(client, s2, half);
                    line(server, c2, half);
                }
            }
        });
        Ok(DelayLine { port, stop })
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One direction: a reader stamps each chunk with when it is due, a writer sends it then.
fn line(mut from: TcpStream, mut to: TcpStream, hold: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now() + hold, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping `tx` ends the writer once it has sent what was in flight.
    });
    thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
