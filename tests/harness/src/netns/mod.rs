//! A testbed of real network partitions: N etcd members and M workers (`lead-exec run` with
//! the fenced ledger as its job), each in a network namespace of its own, joined by veth
//! pairs to a bridge in a hub namespace.
//!
//! Faults happen in the kernel, as on a real network: nftables drop rules on the input hook
//! make packets vanish with no RST, so TCP retransmits and backs off ([`Testbed::cut`]); loss
//! is an nftables `numgen random` drop and delay a qdisc (netem when the kernel has it, a
//! `tbf` otherwise; [`Shaping`]); a worker freezes whole (SIGSTOP to every process in its
//! namespace); a member is killed and restarted. The [`nemesis`] mixes them, seeded, and
//! [`observe`] follows etcd's own leader changes so that [`crate::liveness`] can name the
//! cause of every gap.
//!
//! Everything is torn down by name on drop, and [`net::sweep`] removes what a crashed run
//! left behind. The testbed needs root, `ip` and `nft`: without them it fails, saying which
//! is missing.

pub mod nemesis;
pub mod net;
pub mod observe;
pub mod soak;

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::chaos::{ledger_bin, mono_ns, parse_events, read_ledger, Ev, History, Mark, Report};
use crate::{alive, bin, need, signal, wait_until};

/// How a slow link is made: netem when the kernel has `sch_netem`, else a token bucket
/// (queueing delay) with nftables drops for loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shaping {
    Netem,
    Tbf,
}

impl std::fmt::Display for Shaping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Shaping::Netem => "netem (delay and loss)",
            Shaping::Tbf => {
                "tbf queueing delay + nftables numgen loss (no sch_netem in this kernel)"
            }
        })
    }
}

/// One namespace on the bridge.
#[derive(Debug, Clone)]
pub struct Node {
    /// `m0`, `w1`: also the name of its veth port on the bridge.
    pub name: String,
    /// The namespace's full name.
    pub ns: String,
    pub ip: String,
}

pub struct NetMember {
    pub node: Node,
    child: Option<Child>,
    args: Vec<String>,
    pub log: PathBuf,
}

impl NetMember {
    pub fn endpoint(&self) -> String {
        format!("{}:2379", self.node.ip)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(net::tool("ip"));
        cmd.args(["netns", "exec", &self.node.ns])
            .arg(need("etcd", "etcd-server"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        die_with_owner(&mut cmd);
        let child = cmd.spawn().expect("start etcd in its namespace");
        self.child = Some(child);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the member again on its data: it rejoins the cluster.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

pub struct NetWorker {
    pub node: Node,
    /// The member this worker lists first in `--endpoints`: lead-exec pins the first
    /// endpoint until it fails, so this is the member its requests and streams go to.
    pub first_member: usize,
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl NetWorker {
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }
}

pub struct Testbed {
    /// `lxnet-<pid>-<n>`: every namespace name starts with it.
    pub id: String,
    pub hub: String,
    pub members: Vec<NetMember>,
    pub workers: Vec<NetWorker>,
    pub dir: tempfile::TempDir,
    pub db: PathBuf,
    pub events: PathBuf,
    pub ttl: Duration,
    /// Lease flags besides `--ttl`.
    pub lease_args: Vec<String>,
    pub election: String,
    pub shaping: Shaping,
    pub marks: Vec<Mark>,
    deaths: Arc<Mutex<HashMap<i32, i64>>>,
    stop: Arc<AtomicBool>,
    namespaces: Vec<String>,
}

/// SIGKILL when the thread that started it exits: a run that aborts (no drop) leaves no
/// etcd or lead-exec behind; its namespaces go at the next [`net::sweep`]. `ip netns exec`
/// execs the command, and the setting survives that exec.
fn die_with_owner(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

static TESTBEDS: AtomicU32 = AtomicU32::new(0);

/// The table every node namespace gets: faults add rules to its chains, a heal flushes them.
const TABLE: &str = "table inet lxnet {
  chain in { type filter hook input priority 0; policy accept; }
}";

impl Testbed {
    /// `members` etcd members (etcd's default heartbeat and election timeout) and `workers`
    /// workers with lease TTL `ttl` and `lease_args`. Panics, naming what is missing, when
    /// the host cannot make namespaces.
    pub fn start(
        members: usize,
        workers: usize,
        ttl: Duration,
        lease_args: Vec<String>,
    ) -> Testbed {
        Testbed::start_pinned(members, &vec![0; workers], ttl, lease_args)
    }

    /// As [`Testbed::start`], with one worker per entry of `first_members`, each listing that
    /// member first in its `--endpoints` (see [`NetWorker::first_member`]).
    pub fn start_pinned(
        members: usize,
        first_members: &[usize],
        ttl: Duration,
        lease_args: Vec<String>,
    ) -> Testbed {
        if let Err(e) = net::require() {
            panic!("{e}");
        }
        net::sweep();
        let id = format!(
            "{}{}-{}",
            net::PREFIX,
            std::process::id(),
            TESTBEDS.fetch_add(1, Ordering::SeqCst)
        );
        let shaping = if net::has_netem() {
            Shaping::Netem
        } else {
            Shaping::Tbf
        };
        let dir = tempfile::tempdir().unwrap();
        let (db, events) = crate::chaos::new_ledger(dir.path());
        let hub = format!("{id}-hub");
        let deaths = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tb = Testbed {
            id: id.clone(),
            hub: hub.clone(),
            members: Vec::new(),
            workers: Vec::new(),
            dir,
            db,
            events: events.clone(),
            ttl,
            lease_args,
            election: "partitions".into(),
            shaping,
            marks: Vec::new(),
            deaths: deaths.clone(),
            stop: stop.clone(),
            namespaces: Vec::new(),
        };
        tb.add_namespace(&hub);
        net::must(&["ip", "-n", &hub, "link", "add", "br0", "type", "bridge"]);
        let gw = format!("{}.1/24", net::SUBNET);
        net::must(&["ip", "-n", &hub, "addr", "add", &gw, "dev", "br0"]);
        net::must(&["ip", "-n", &hub, "link", "set", "br0", "up"]);
        let member_nodes: Vec<Node> = (0..members)
            .map(|i| tb.add_node(&format!("m{i}"), 10 + i))
            .collect();
        let cluster = member_nodes
            .iter()
            .map(|n| format!("{}=http://{}:2380", n.name, n.ip))
            .collect::<Vec<_>>()
            .join(",");
        for node in member_nodes {
            let data = tb.dir.path().join(&node.name);
            let args = [
                "--name",
                &node.name,
                "--data-dir",
                data.to_str().unwrap(),
                "--listen-client-urls",
                &format!("http://{}:2379", node.ip),
                "--advertise-client-urls",
                &format!("http://{}:2379", node.ip),
                "--listen-peer-urls",
                &format!("http://{}:2380", node.ip),
                "--initial-advertise-peer-urls",
                &format!("http://{}:2380", node.ip),
                "--initial-cluster",
                &cluster,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                &id,
            ]
            .map(String::from)
            .to_vec();
            let log = tb.dir.path().join(format!("{}.log", node.name));
            let mut m = NetMember {
                node,
                child: None,
                args,
                log,
            };
            m.spawn();
            tb.members.push(m);
        }
        tb.wait_healthy(Duration::from_secs(60));
        crate::chaos::watch_deaths(events, deaths, stop);
        for (i, &first_member) in first_members.iter().enumerate() {
            let node = tb.add_node(&format!("w{i}"), 100 + i);
            let log = tb.dir.path().join(format!("{}.log", node.name));
            tb.workers.push(NetWorker {
                node,
                first_member,
                child: None,
                log,
            });
            tb.start_worker(i);
        }
        tb
    }

    fn add_namespace(&mut self, ns: &str) {
        // A dead owner with this pid may have left the name behind.
        if net::ours().iter().any(|n| n == ns) {
            net::remove(ns);
        }
        net::must(&["ip", "netns", "add", ns]);
        self.namespaces.push(ns.to_string());
        net::must(&["ip", "-n", ns, "link", "set", "lo", "up"]);
    }

    fn add_node(&mut self, name: &str, host: usize) -> Node {
        let ns = format!("{}-{name}", self.id);
        self.add_namespace(&ns);
        let ip = format!("{}.{host}", net::SUBNET);
        let hub = self.hub.clone();
        net::must(&[
            "ip", "-n", &hub, "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns",
            &ns,
        ]);
        net::must(&["ip", "-n", &hub, "link", "set", name, "master", "br0", "up"]);
        net::must(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{ip}/24"),
            "dev",
            "eth0",
        ]);
        net::must(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
        net::nft(&ns, TABLE).unwrap_or_else(|e| panic!("{e}"));
        Node {
            name: name.into(),
            ns,
            ip,
        }
    }

    pub fn endpoints(&self) -> String {
        self.endpoints_from(0)
    }

    /// Every member's endpoint, member `first` first and the rest in order after it.
    pub fn endpoints_from(&self, first: usize) -> String {
        let n = self.members.len();
        (0..n)
            .map(|k| self.members[(first + k) % n].endpoint())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// etcdctl from the hub namespace; `None` when it failed.
    pub fn ctl(&self, endpoints: &str, args: &[&str]) -> Option<String> {
        let out = Command::new(net::tool("ip"))
            .args(["netns", "exec", &self.hub])
            .arg(need("etcdctl", "etcd-client"))
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(["--dial-timeout=1s", "--command-timeout=2s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn wait_healthy(&self, limit: Duration) {
        let ends = self.endpoints();
        let ok = wait_until(limit, || {
            self.ctl(&ends, &["put", "lead-exec-test/health", "ok"])
                .is_some()
        });
        assert!(ok, "etcd in namespaces not healthy within {limit:?}");
    }

    /// Starts (or restarts) worker `i`'s lead-exec in its namespace.
    pub fn start_worker(&mut self, i: usize) {
        let ttl = format!("{}ms", self.ttl.as_millis());
        let w = &self.workers[i];
        let endpoints = self.endpoints_from(w.first_member);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&w.log)
            .unwrap();
        let mut cmd = Command::new(net::tool("ip"));
        cmd.args(["netns", "exec", &w.node.ns, bin(), "run", &self.election])
            .args(["--endpoints", &endpoints, "--ttl", &ttl])
            .args(["--id", &w.node.name])
            .args(&self.lease_args)
            .arg("--")
            .arg(ledger_bin())
            .args([
                "--db",
                self.db.to_str().unwrap(),
                "settle",
                "--every",
                "100",
            ])
            .args(["--events", self.events.to_str().unwrap()])
            .env_remove("LEAD_EXEC_ENDPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        die_with_owner(&mut cmd);
        let child = cmd.spawn().expect("start lead-exec in its namespace");
        self.workers[i].child = Some(child);
    }

    /// Restarts every worker whose lead-exec has exited (a job the fence rejected ends its
    /// term, and lead-exec exits with the job's code). Returns their names.
    pub fn revive(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for i in 0..self.workers.len() {
            let done = self.workers[i]
                .child
                .as_mut()
                .is_none_or(|c| c.try_wait().ok().flatten().is_some());
            if done {
                out.push(self.workers[i].node.name.clone());
                self.start_worker(i);
            }
        }
        out
    }

    pub fn events(&self) -> Vec<Ev> {
        parse_events(&fs::read_to_string(&self.events).unwrap_or_default())
    }

    /// The running term: (worker index, token) of the newest start whose job is alive.
    pub fn current(&self) -> Option<(usize, i64)> {
        self.events()
            .into_iter()
            .filter(|e| e.kind == "start" && alive(e.pid))
            .max_by_key(|e| e.token)
            .and_then(|e| Some((self.worker_index(&e.worker)?, e.token)))
    }

    /// Waits for a term with a token above `above`: (worker index, token).
    pub fn wait_term_after(&self, above: i64, limit: Duration) -> Option<(usize, i64)> {
        let mut found = None;
        wait_until(limit, || {
            found = self.current().filter(|&(_, t)| t > above);
            found.is_some()
        });
        found
    }

    pub fn worker_index(&self, name: &str) -> Option<usize> {
        self.workers.iter().position(|w| w.node.name == name)
    }

    /// The member that is etcd's raft leader now, from its metrics.
    pub fn raft_leader(&self) -> Option<usize> {
        let scraped = observe::scrape_all(self);
        scraped
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.is_leader))
    }

    /// Makes member `m` etcd's raft leader (`etcdctl move-leader`), and waits until its
    /// metrics say so. `false` if it is not the leader within `limit`.
    pub fn make_raft_leader(&self, m: usize, limit: Duration) -> bool {
        let id = self
            .ctl(
                &self.members[m].endpoint(),
                &["endpoint", "status", "-w", "json"],
            )
            .and_then(|out| {
                let v: serde_json::Value = serde_json::from_str(&out).ok()?;
                v[0]["Status"]["header"]["member_id"].as_u64()
            });
        let Some(id) = id else { return false };
        wait_until(limit, || match self.raft_leader() {
            Some(l) if l == m => true,
            Some(l) => {
                let to = format!("{id:x}");
                self.ctl(&self.members[l].endpoint(), &["move-leader", &to]);
                false
            }
            None => false,
        })
    }

    /// Drops every packet that `a` receives from `b` and `b` receives from `a` (both are
    /// node names, `m0` or `w1`): silently, as on a cut cable.
    pub fn cut(&self, a: &str, b: &str) {
        let (na, nb) = (self.node(a), self.node(b));
        self.add_rule(&na.ns, &format!("ip saddr {} drop", nb.ip));
        self.add_rule(&nb.ns, &format!("ip saddr {} drop", na.ip));
    }

    /// Drops `percent` of what node `name` receives, at random.
    pub fn lose(&self, name: &str, percent: u32) {
        let n = self.node(name);
        self.add_rule(
            &n.ns,
            &format!(
                "ip saddr {}.0/24 numgen random mod 100 < {percent} drop",
                net::SUBNET
            ),
        );
    }

    /// Delays what node `name` sends by about `ms` (netem), or queues it behind a slow token
    /// bucket whose backlog can reach `ms` (tbf).
    pub fn slow(&self, name: &str, ms: u64) {
        let n = self.node(name);
        let delay = format!("{ms}ms");
        let argv: Vec<&str> = match self.shaping {
            Shaping::Netem => vec![
                "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", &delay, "50ms",
            ],
            Shaping::Tbf => vec![
                "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "24kbit", "burst",
                "1600", "latency", &delay,
            ],
        };
        net::run_in(&n.ns, &argv).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Removes every cut, loss and delay on node `name`.
    pub fn heal(&self, name: &str) {
        let n = self.node(name);
        let _ = net::nft(&n.ns, "flush chain inet lxnet in");
        let _ = net::run_in(&n.ns, &["tc", "qdisc", "del", "dev", "eth0", "root"]);
    }

    pub fn heal_all(&self) {
        let names: Vec<String> = self.nodes().map(|n| n.name.clone()).collect();
        for n in names {
            self.heal(&n);
        }
    }

    /// SIGSTOP (or SIGCONT) to every process in worker `i`'s namespace: lead-exec, its
    /// watchdog and the job, as when a machine pauses.
    pub fn freeze(&self, i: usize, on: bool) {
        let sig = if on { libc::SIGSTOP } else { libc::SIGCONT };
        for pid in net::pids(&self.workers[i].node.ns) {
            signal(pid, sig);
        }
    }

    fn add_rule(&self, ns: &str, rule: &str) {
        net::nft(ns, &format!("add rule inet lxnet in {rule}")).unwrap_or_else(|e| panic!("{e}"));
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.members
            .iter()
            .map(|m| &m.node)
            .chain(self.workers.iter().map(|w| &w.node))
    }

    fn node(&self, name: &str) -> Node {
        self.nodes()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
            .clone()
    }

    /// Stops every worker gracefully and checks the history (faults must be healed first).
    pub fn finish(&mut self) -> (History, Report) {
        for i in 0..self.workers.len() {
            self.freeze(i, false);
            if let Some(p) = self.workers[i].pid() {
                signal(p, libc::SIGTERM);
            }
        }
        for w in &mut self.workers {
            if let Some(c) = w.child.as_mut() {
                let done = wait_until(Duration::from_secs(15), || {
                    c.try_wait().ok().flatten().is_some()
                });
                if !done {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            w.child = None;
        }
        let evs = self.events();
        wait_until(Duration::from_secs(5), || {
            let d = self.deaths.lock().unwrap();
            evs.iter()
                .filter(|e| e.kind == "start")
                .all(|e| d.contains_key(&e.pid))
        });
        let (accepted, rejected) = read_ledger(&self.db);
        let h = History {
            events: self.events(),
            deaths: self.deaths.lock().unwrap().clone(),
            accepted,
            rejected,
            marks: self.marks.clone(),
            liveness_bound_ns: (self.ttl + Duration::from_secs(2)).as_nanos() as i64,
            slots: 1,
        };
        let r = crate::chaos::check(&h);
        (h, r)
    }

    /// Job deaths seen so far: pid → CLOCK_MONOTONIC ns.
    pub fn deaths(&self) -> HashMap<i32, i64> {
        self.deaths.lock().unwrap().clone()
    }

    pub fn logs(&self) -> String {
        self.workers
            .iter()
            .map(|w| {
                format!(
                    "--- {}\n{}",
                    w.node.name,
                    fs::read_to_string(&w.log).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// CLOCK_MONOTONIC now, the clock of the history.
    pub fn now(&self) -> i64 {
        mono_ns()
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in &mut self.workers {
            if let Some(mut c) = w.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for m in &mut self.members {
            m.kill();
        }
        // Watchdogs and jobs die with their lead-exec; whatever is left goes with its
        // namespace.
        for ns in self.namespaces.iter().rev() {
            net::remove(ns);
        }
    }
}
