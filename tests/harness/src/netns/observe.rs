//! What etcd itself says, read from each member's `/metrics` through the hub namespace:
//! who leads, and when the leadership changed. A change matters to liveness because the new
//! etcd leader extends every lease by its full TTL: a key nobody renews outlives its TTL.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Testbed;
use crate::chaos::mono_ns;

/// One member's answer.
#[derive(Debug, Clone, Copy)]
pub struct Scrape {
    pub is_leader: bool,
    /// `etcd_server_leader_changes_seen_total`: counts from 0 at each start of the member.
    pub changes_seen: u64,
}

/// Runs `f` on a thread that has entered namespace `ns` (setns moves only the calling thread).
pub fn in_namespace<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: setns on a namespace fd we hold open; it affects this thread only.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("thread in namespace")
}

fn scrape_one(addr: SocketAddr) -> Option<Scrape> {
    let text = crate::scrape_addr(addr, Duration::from_millis(300), Duration::from_millis(700))?;
    let is_leader = crate::metric(&text, "etcd_server_is_leader")? == 1.0;
    let changes_seen = crate::metric(&text, "etcd_server_leader_changes_seen_total")? as u64;
    Some(Scrape {
        is_leader,
        changes_seen,
    })
}

fn addrs(tb: &Testbed) -> Vec<SocketAddr> {
    tb.members
        .iter()
        .map(|m| m.endpoint().parse().unwrap())
        .collect()
}

/// Every member's metrics now (`None`: no answer).
pub fn scrape_all(tb: &Testbed) -> Vec<Option<Scrape>> {
    let addrs = addrs(tb);
    in_namespace(&tb.hub, move || addrs.into_iter().map(scrape_one).collect())
}

/// One etcd leader change as seen from outside: when, and how it showed.
#[derive(Debug, Clone)]
pub struct LeaderChange {
    pub ns: i64,
    pub what: String,
}

/// Follows the members' metrics every 200 ms until dropped, recording each leader change:
/// a member's `leader_changes_seen_total` going up (not from its own restart), or another
/// member reporting itself leader.
pub struct LeaderWatch {
    pub changes: Arc<Mutex<Vec<LeaderChange>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LeaderWatch {
    pub fn start(tb: &Testbed) -> LeaderWatch {
        let addrs = addrs(tb);
        let path = format!("/run/netns/{}", tb.hub);
        let changes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (changes.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap();
            // SAFETY: as in `in_namespace`.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}");
            let mut seen: Vec<Option<u64>> = vec![None; addrs.len()];
            let mut leader: Option<usize> = None;
            while !s.load(Ordering::SeqCst) {
                let now: Vec<Option<Scrape>> = addrs.iter().map(|a| scrape_one(*a)).collect();
                let at = mono_ns();
                for (i, sc) in now.iter().enumerate() {
                    let Some(sc) = sc else { continue };
                    if let Some(before) = seen[i].filter(|&b| sc.changes_seen > b && b > 0) {
                        c.lock().unwrap().push(LeaderChange {
                            ns: at,
                            what: format!("m{i} saw {} leader change(s)", sc.changes_seen - before),
                        });
                    }
                    seen[i] = Some(sc.changes_seen);
                }
                if let Some(l) = now.iter().position(|s| s.is_some_and(|s| s.is_leader)) {
                    if leader.is_some_and(|old| old != l) {
                        c.lock().unwrap().push(LeaderChange {
                            ns: at,
                            what: format!("etcd leader m{} -> m{l}", leader.unwrap()),
                        });
                    }
                    leader = Some(l);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        LeaderWatch {
            changes,
            stop,
            thread: Some(thread),
        }
    }

    /// The changes so far, merged where they are within a second of each other (several
    /// members report the same election).
    pub fn changes(&self) -> Vec<LeaderChange> {
        let mut all = self.changes.lock().unwrap().clone();
        all.sort_by_key(|c| c.ns);
        let mut out: Vec<LeaderChange> = Vec::new();
        for c in all {
            match out.last_mut() {
                Some(last) if c.ns - last.ns < 1_000_000_000 => {
                    if !last.what.contains(&c.what) {
                        last.what = format!("{}; {}", last.what, c.what);
                    }
                }
                _ => out.push(c),
            }
        }
        out
    }
}

impl Drop for LeaderWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
