//! The harness that lead-exec's integration tests and examples share: real etcd processes on
//! free loopback ports, a fault proxy ([`proxy`]), the built binary, helpers that wait for
//! events (a file line, a key, an exit) instead of sleeping, the Jepsen-style history
//! checker ([`chaos`]) with liveness gaps and their causes ([`liveness`]), a testbed of real
//! partitions in network namespaces ([`netns`]), and what the benchmarks measure with
//! ([`measure`]).
//!
//! A test opens with a [`Fixture`]: `let f = Fixture::new();` starts a one-member etcd and
//! gives its endpoints (`f.ep`), a temp dir for the test's files (`f.dir`) and the cluster
//! itself (`f.etcd`); `Fixture::with(Etcd::start3())` does the same around three members.
//!
//! The tools built on it are this crate's binaries (`src/bin/`): the chaos soak (`chaos`), the
//! partition soak (`partitions`) and the benchmarks (`bench`), each run as
//! `cargo run --release -p lead-exec-harness --bin NAME -- ARGS`; they build the lead-exec
//! binaries they drive first ([`build_binaries`]).

pub mod chaos;
pub mod liveness;
pub mod measure;
pub mod netns;
pub mod postgres;
pub mod proxy;
pub mod systemd;
pub mod tls;

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The binary under test: `lead-exec` in the target directory of the program that runs (this
/// crate's tools live in it, tests and examples one level below it, in `deps/` or
/// `examples/`), else from PATH.
pub fn bin() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().unwrap_or_default();
        let found = exe
            .ancestors()
            .skip(1)
            .take(2)
            .map(|d| d.join("lead-exec"))
            .find(|p| p.is_file());
        found.map_or_else(|| "lead-exec".into(), |p| p.to_string_lossy().into_owned())
    })
}

/// For this crate's tools (`src/bin/`), which run from `TARGET/PROFILE/`: builds lead-exec and
/// its watchdog (with `ledger`, the fenced ledger example too) into the same target directory,
/// in the release profile or else in the tool's own, and returns the directory they are in.
/// The watchdog is linked statically, as `.ci/package` ships it ([`STATIC_WATCHDOG`]), so the
/// soaks and the bench drive that build. Always run, so that a binary left from an older
/// build is never the one driven (a no-op when they are fresh).
pub fn build_binaries(release: bool, ledger: bool) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let own = exe.parent().ok_or("no directory")?;
    let target = own.parent().ok_or("not in a target directory")?;
    let release = release || own.ends_with("release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let example: &[&str] = if ledger {
        &["--example", "ledger"]
    } else {
        &[]
    };
    let profile: &[&str] = if release { &["--release"] } else { &[] };
    let cargo_ok = |args: &[&str]| {
        Command::new(&cargo)
            .args(args)
            .env("CARGO_TARGET_DIR", target)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .status()
            .is_ok_and(|s| s.success())
    };
    // Not `--bins`: that would link the watchdog dynamically, and the next step link it again.
    let ok = cargo_ok(
        &[
            &["build", "-p", "lead-exec", "--bin", "lead-exec"],
            example,
            profile,
        ]
        .concat(),
    ) && cargo_ok(
        &[
            &["rustc", "-p", "lead-exec", "--bin", "lead-exec-watchdog"],
            profile,
            &["--"],
            &STATIC_WATCHDOG[..],
        ]
        .concat(),
    );
    let dir = target.join(if release { "release" } else { "debug" });
    if ok && dir.join("lead-exec").is_file() {
        Ok(dir)
    } else {
        Err(format!("could not build lead-exec into {}", dir.display()))
    }
}

/// The rustc flags that link the watchdog statically, for `cargo rustc --bin
/// lead-exec-watchdog -- FLAGS` (`.ci/package` builds it so too): it starts beside every job,
/// and without the dynamic loader it starts in about 0.4 ms less CPU time. It looks up no
/// names (no NSS), so it behaves the same linked either way; what it costs is memory where few
/// watchdogs run, and a new build for a glibc update (lead-exec-operations(7), "Install").
pub const STATIC_WATCHDOG: [&str; 2] = ["-C", "target-feature=+crt-static"];

/// Lease settings that keep tests fast and still pass the safety check: a 2 s window before
/// SIGTERM (3 s − grace 0.5 s − margin 0.5 s), renewed every 667 ms.
pub const FAST: [&str; 6] = [
    "--ttl",
    "3s",
    "--grace",
    "500ms",
    "--safety-margin",
    "500ms",
];

/// The directory named by this variable, when set, supplies `etcd` and `etcdctl` instead of
/// PATH: `.ci/run` points it at etcd 3.5 (see `.ci/fetch-etcd`).
pub const ETCD_DIR_VAR: &str = "ETCD_BIN_DIR";

/// An etcd binary: from `$ETCD_BIN_DIR` when set, else from PATH. Missing is a failure that
/// names the package, never a skip.
pub fn need(binary: &str, package: &str) -> PathBuf {
    locate(binary, package).unwrap_or_else(|e| panic!("{e}"))
}

/// As [`need`], with the failure as a message for callers that report errors themselves.
pub fn locate(binary: &str, package: &str) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(ETCD_DIR_VAR).filter(|d| !d.is_empty()) {
        let p = Path::new(&dir).join(binary);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "`{binary}` not found in {ETCD_DIR_VAR}={}: fetch it with `bash .ci/fetch-etcd sid`",
                Path::new(&dir).display()
            ))
        };
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(binary);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(format!("`{binary}` not found on PATH: install the Debian package `{package}` (apt-get install {package}); bash .ci/run does this"))
}

/// A tool from PATH (never from `$ETCD_BIN_DIR`). Missing is a failure that names the
/// package, never a skip.
pub fn need_tool(binary: &str, package: &str) -> PathBuf {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|dir| Path::new(dir).join(binary))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{binary}` not found on PATH: install the Debian package `{package}` (apt-get install {package}); bash .ci/run does this")
        })
}

/// A free loopback port for a server. Taken below Linux's ephemeral range (32768 and up), so
/// that no outgoing connection of a parallel test can take it between this check and the
/// server's bind; each call hands out a different port.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 15_000 + (std::process::id() % 1_000) * 17;
    loop {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = (base + n * 7919 % 17_000) % 17_000 + 15_000;
        if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One etcd member process.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    args: Vec<String>,
    /// Applied to every start of the process (an example detaches its children, say).
    setup: fn(&mut Command),
    /// Each start runs etcd under strace with these arguments (see [`Etcd::slow_commits`]).
    strace: Option<Vec<String>>,
    /// The https client port beside the plain one, with [`Member::single_with`]'s TLS.
    pub tls_port: Option<u16>,
}

/// How [`Member::single_with`] runs its member.
#[derive(Default, Clone)]
pub struct MemberOpts {
    /// Also serve clients over mutual TLS on a port of its own, with `ca.crt`, `server.crt`
    /// and `server.key` from this directory (see [`tls`]); the plain port stays for the
    /// harness's own reads.
    pub tls: Option<PathBuf>,
    /// Every fdatasync delayed this long (under strace): a slow disk, so every commit is.
    pub slow_fsync: Option<Duration>,
}

impl Member {
    /// One etcd on its own in `dir`: data in `dir/NAME`, log in `dir/NAME.log`. `setup`
    /// shapes the process before each start. For the examples: tests use [`Etcd`].
    pub fn single(dir: &Path, name: &str, setup: fn(&mut Command)) -> Member {
        let mut m = Member::unstarted(dir, name, setup);
        m.spawn();
        m
    }

    /// [`Member::single`], over TLS or on a slow disk as `opts` say.
    pub fn single_with(
        dir: &Path,
        name: &str,
        setup: fn(&mut Command),
        opts: &MemberOpts,
    ) -> Member {
        let mut m = Member::unstarted(dir, name, setup);
        if let Some(certs) = &opts.tls {
            let port = free_port();
            let urls = format!(
                "http://127.0.0.1:{},https://127.0.0.1:{port}",
                m.client_port
            );
            for flag in ["--listen-client-urls", "--advertise-client-urls"] {
                let i = m.args.iter().position(|a| a == flag).expect("flag") + 1;
                m.args[i] = urls.clone();
            }
            m.args.extend(tls::server_args(certs));
            m.tls_port = Some(port);
        }
        if let Some(delay) = opts.slow_fsync {
            m.strace = Some(slow_fsync_trace(delay));
        }
        m.spawn();
        m
    }

    fn unstarted(dir: &Path, name: &str, setup: fn(&mut Command)) -> Member {
        let (client, peer) = (free_port(), free_port());
        let peer_url = format!("http://127.0.0.1:{peer}");
        let client_url = format!("http://127.0.0.1:{client}");
        let args = [
            "--name",
            name,
            "--data-dir",
            &dir.join(name).display().to_string(),
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("{name}={peer_url}"),
        ]
        .map(String::from)
        .to_vec();
        Member {
            name: name.to_string(),
            client_port: client,
            peer_port: peer,
            dir: dir.to_path_buf(),
            child: None,
            args,
            setup,
            strace: None,
            tls_port: None,
        }
    }

    /// Where the member logs.
    pub fn log(&self) -> PathBuf {
        self.dir.join(format!("{}.log", self.name))
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        let etcd = need("etcd", "etcd-server");
        let mut cmd = match &self.strace {
            Some(trace) => {
                let mut c = Command::new(need_tool("strace", "strace"));
                c.args(trace).arg(etcd);
                c
            }
            None => Command::new(etcd),
        };
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        (self.setup)(&mut cmd);
        let child = cmd.spawn().expect("start etcd");
        self.child = Some(child);
    }

    pub fn kill(&mut self) {
        // strace detaches from its tracee when it dies: etcd must be killed by its own pid.
        if let (Some(c), Some(_)) = (&self.child, &self.strace) {
            for pid in children(c.id() as i32) {
                signal(pid, libc::SIGKILL);
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Restarts this member on an empty data directory, as after a wipe: revisions start
    /// again from 1.
    pub fn wipe(&mut self) {
        self.kill();
        fs::remove_dir_all(self.dir.join(&self.name)).unwrap();
        self.spawn();
    }

    pub fn stop(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    pub fn cont(&self) {
        signal(self.pid(), libc::SIGCONT);
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            signal(c.id() as i32, libc::SIGCONT);
        }
        self.kill();
    }
}

/// strace's arguments that delay every fdatasync of etcd by `delay`.
fn slow_fsync_trace(delay: Duration) -> Vec<String> {
    [
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        "-e",
        "trace=fdatasync",
        "-e",
        &format!("inject=fdatasync:delay_enter={}", delay.as_micros()),
    ]
    .map(String::from)
    .to_vec()
}

/// A throwaway etcd cluster (one or three members) in its own temp dir.
pub struct Etcd {
    pub members: Vec<Member>,
    pub dir: TempDir,
    /// Extra etcdctl flags (credentials) once auth is enabled.
    pub ctl_args: Vec<String>,
}

impl Etcd {
    pub fn start() -> Etcd {
        Etcd::start_n(1)
    }

    pub fn start3() -> Etcd {
        Etcd::start_n(3)
    }

    pub fn start_n(n: usize) -> Etcd {
        Etcd::start_with(n, "http", &[], None)
    }

    /// `n` members with client URLs of `scheme` and extra flags (TLS, for instance). Files
    /// the flags name can live in `dir`, which the cluster then owns.
    pub fn start_with(n: usize, scheme: &str, extra: &[String], dir: Option<TempDir>) -> Etcd {
        let dir = dir.unwrap_or_else(|| tempfile::tempdir().unwrap());
        let token = format!(
            "t{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let cluster: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect();
        let mut members = Vec::new();
        for (i, (c, p)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let args = vec![
                "--name".into(),
                name.clone(),
                "--data-dir".into(),
                dir.path().join(&name).display().to_string(),
                "--listen-client-urls".into(),
                format!("{scheme}://127.0.0.1:{c}"),
                "--advertise-client-urls".into(),
                format!("{scheme}://127.0.0.1:{c}"),
                "--listen-peer-urls".into(),
                format!("http://127.0.0.1:{p}"),
                "--initial-advertise-peer-urls".into(),
                format!("http://127.0.0.1:{p}"),
                "--initial-cluster".into(),
                cluster.join(","),
                "--initial-cluster-state".into(),
                "new".into(),
                "--initial-cluster-token".into(),
                token.clone(),
                "--heartbeat-interval".into(),
                "50".into(),
                "--election-timeout".into(),
                "500".into(),
            ]
            .into_iter()
            .chain(extra.iter().cloned())
            .collect();
            let mut m = Member {
                name,
                client_port: *c,
                peer_port: *p,
                dir: dir.path().to_path_buf(),
                child: None,
                args,
                setup: |_| {},
                strace: None,
                tls_port: None,
            };
            m.spawn();
            members.push(m);
        }
        let e = Etcd {
            members,
            dir,
            ctl_args: Vec::new(),
        };
        if scheme == "http" {
            e.wait_healthy(Duration::from_secs(20));
        }
        e
    }

    /// One member whose every commit takes `delay` longer (its fdatasync delayed under
    /// strace), while reads and lease renewals, which need no commit, stay fast.
    pub fn slow_commits(delay: Duration) -> Etcd {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Member::unstarted(dir.path(), "slow", |_| {});
        m.strace = Some(slow_fsync_trace(delay));
        m.spawn();
        let e = Etcd {
            members: vec![m],
            dir,
            ctl_args: Vec::new(),
        };
        // Start-up commits are slowed too: etcd 3.5 took 45 s to answer here.
        e.wait_healthy(Duration::from_secs(120));
        e
    }

    /// The raft leader among the etcd members.
    pub fn raft_leader(&self) -> usize {
        for (i, m) in self.members.iter().enumerate() {
            let out = Command::new(need("etcdctl", "etcd-client"))
                .env("ETCDCTL_API", "3")
                .args([
                    &format!("--endpoints={}", m.endpoint()),
                    "endpoint",
                    "status",
                    "-w",
                    "json",
                ])
                .output();
            let Ok(out) = out else { continue };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                continue;
            };
            let s = &v[0]["Status"];
            if s["leader"].is_u64() && s["leader"] == s["header"]["member_id"] {
                return i;
            }
        }
        panic!("no raft leader found");
    }

    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.endpoint())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn wait_healthy(&self, limit: Duration) {
        let ok = wait_until(limit, || {
            etcdctl_status(&self.endpoints(), &["put", "lead-exec-test/health", "ok"]).success()
        });
        assert!(ok, "etcd did not become healthy within {limit:?}");
    }

    /// etcdctl against this cluster; panics on failure.
    pub fn ctl(&self, args: &[&str]) -> String {
        let mut all: Vec<&str> = self.ctl_args.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        etcdctl(&self.endpoints(), &all)
    }

    /// Keys under a prefix, in create order.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.ctl(&["get", "--prefix", "--keys-only", "--sort-by=CREATE", prefix])
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }
}

/// What most tests open with: an etcd, a directory of the test's own (its scripts, the
/// workers' logs, what the job records) and the cluster's endpoints, `--endpoints`' value.
///
/// ```no_run
/// # use harness::*;
/// let f = Fixture::new();
/// let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/token");
/// let (code, _, err) = run(&run_args("example", &f.ep, &[], &job));
/// assert_eq!(code, 0, "{err}");
/// assert!(wait_int(&f.dir.path().join("token"), secs(10)) > 0);
/// f.etcd.ctl(&["put", "lead-exec-test/k", "v"]);
/// ```
///
/// Another cluster comes in through [`Fixture::with`] (`Fixture::with(Etcd::start3())`);
/// tests that set etcd up otherwise (TLS, auth) keep their own locals.
///
/// It has no `Drop` of its own, so a test can still move a field out (`drop(f.etcd)`). The
/// fields drop in the order declared, as the three locals it replaces did (in reverse): the
/// test's directory first, then etcd, whose members are killed by pid in [`Member`]'s `Drop`.
/// Workers a test starts after the fixture are gone before either.
pub struct Fixture {
    /// The test's own directory; etcd's data is in [`Etcd::dir`], another one.
    pub dir: TempDir,
    /// `etcd.endpoints()`: it holds for the cluster's life, as members restart on their ports.
    pub ep: String,
    pub etcd: Etcd,
}

impl Fixture {
    /// A one-member etcd ([`Etcd::start`]), a temp dir and the endpoints.
    // No `Default`: starting an etcd is not a default value.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Fixture {
        Fixture::with(Etcd::start())
    }

    /// The same around a cluster started otherwise ([`Etcd::start3`], say).
    pub fn with(etcd: Etcd) -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            ep: etcd.endpoints(),
            etcd,
        }
    }
}

pub fn etcdctl_status(endpoints: &str, args: &[&str]) -> ExitStatus {
    Command::new(need("etcdctl", "etcd-client"))
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .arg("--dial-timeout=1s")
        .arg("--command-timeout=2s")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
}

pub fn etcdctl(endpoints: &str, args: &[&str]) -> String {
    let out = Command::new(need("etcdctl", "etcd-client"))
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .arg("--command-timeout=5s")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a pid we started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// The direct children of a process, from every one of its threads.
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Whether `pid` exists at all, zombies included (a zombie is a process nobody reaped).
pub fn exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// A /proc file as text, whatever its bytes: a process's name (in `stat`) need not be UTF-8.
fn proc_text(path: &str) -> Option<String> {
    fs::read(path)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Fields of `/proc/PID/stat` after the command name (field 3 is index 0).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = proc_text(&format!("/proc/{pid}/stat"))?;
    let rest = &s[s.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// (process group, session) of a process.
pub fn pgid_sid(pid: i32) -> Option<(i32, i32)> {
    let f = stat_fields(pid)?;
    Some((f[2].parse().ok()?, f[3].parse().ok()?))
}

/// CPU time a process has used so far, user plus system, in clock ticks (1/100 s).
pub fn cpu_ticks(pid: i32) -> Option<u64> {
    let f = stat_fields(pid)?;
    Some(f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?)
}

/// The kernel's name for a process (what `pkill NAME` matches).
pub fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

/// argv[0] of a process, from `/proc/PID/cmdline`.
pub fn argv0(pid: i32) -> String {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let first = raw.split(|&b| b == 0).next().unwrap_or_default();
    String::from_utf8_lossy(first).into_owned()
}

/// Wall-clock nanoseconds, comparable with the job's `date +%s%N`.
pub fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

/// Shifts the wall clock that a test build of lead-exec reads for `run --every`, in ms
/// (ignored by release builds).
pub const CLOCK_SKEW_VAR: &str = "LEAD_EXEC_TEST_CLOCK_SKEW_MS";

/// The [`CLOCK_SKEW_VAR`] value that makes a worker started now read `at_unix_ms` (plus the
/// time it takes to start).
pub fn skew_to(at_unix_ms: i128) -> String {
    (at_unix_ms - now_ns() / 1_000_000).to_string()
}

/// How `run --every` names the period starting at `start_unix_s` to the job:
/// (`LEAD_EXEC_RUN_KEY`, `LEAD_EXEC_PERIOD_START`). Made from humantime's RFC 3339, apart
/// from lead-exec's own calendar arithmetic.
pub fn period_names(start_unix_s: u64) -> (String, String) {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(start_unix_s);
    let start = humantime::format_rfc3339_seconds(at).to_string();
    let compact: String = start.chars().filter(|c| !matches!(c, '-' | ':')).collect();
    // Seconds only when the start is off the whole minute.
    let key = match compact.strip_suffix("00Z") {
        Some(hm) => format!("{hm}Z"),
        None => compact,
    };
    (key, start)
}

/// A job that records its term, its pid, its watchdog's pid and a grandchild's pid, and
/// writes a heartbeat (`date +%s%N`) every 50 ms from both processes into `$D/hb`.
pub fn heartbeat_job(dir: &Path) -> String {
    script(
        dir,
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; echo $PPID > $D/watchdog; \
         sh -c 'echo $$ > $D/grandchild; while :; do date +%s%N >> $D/hb; sleep 0.05; done' & \
         echo $$ > $D/pid; while :; do date +%s%N >> $D/hb; sleep 0.05; done",
    )
}

/// The latest heartbeat written by [`heartbeat_job`], in wall-clock ns.
pub fn last_heartbeat(dir: &Path) -> i128 {
    lines(&dir.join("hb"))
        .iter()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .expect("the job wrote heartbeats")
}

/// `etcdctl --endpoints=E` from where the cluster's etcd comes from, for a long-running
/// command such as `watch`.
pub fn etcdctl_command(endpoints: &str) -> Command {
    let mut c = Command::new(need("etcdctl", "etcd-client"));
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"));
    c
}

/// The moment etcd deletes `key` (its lease expired), as seen by a watch started now:
/// call [`KeyGone::wait`] after the fault.
pub struct KeyGone(LineReader);

impl KeyGone {
    pub fn watch(endpoints: &str, key: &str) -> KeyGone {
        let mut cmd = etcdctl_command(endpoints);
        cmd.args(["watch", key]);
        KeyGone(LineReader::start(cmd))
    }

    /// Blocks until the delete arrives; its wall-clock time in ns.
    pub fn wait(&self, limit: Duration) -> i128 {
        self.0.expect("DELETE", limit);
        now_ns()
    }
}

/// GET /metrics from `addr` (lead-exec's or an etcd member's): `None` when the connection
/// takes longer than `connect`, or the answer longer than `read` between bytes.
pub fn scrape_addr(
    addr: std::net::SocketAddr,
    connect: Duration,
    read: Duration,
) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, connect).ok()?;
    s.set_read_timeout(Some(read)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// GET /metrics from a `--metrics-addr` port on loopback, within `limit`: a starved endpoint
/// fails the scrape instead of hanging the test.
pub fn scrape_within(port: u16, limit: Duration) -> Option<String> {
    scrape_addr(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        limit,
        limit,
    )
}

/// GET /metrics from a `--metrics-addr` port on loopback.
pub fn scrape(port: u16) -> Option<String> {
    scrape_within(port, Duration::from_secs(60))
}

/// One sample's value from an exposition text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub fn alive(pid: i32) -> bool {
    // A zombie still answers kill(0): look at its state too.
    match proc_text(&format!("/proc/{pid}/stat")) {
        Some(s) => {
            let state = s
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            state != Some("Z") && state != Some("X")
        }
        None => false,
    }
}

/// Polls `cond` every 10 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Lines of a file ("" if it does not exist yet).
pub fn lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until `path` has a line for which `pred` holds, and returns it.
pub fn wait_line(path: &Path, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
    let mut found = None;
    let ok = wait_until(limit, || {
        found = lines(path).into_iter().find(|l| pred(l));
        found.is_some()
    });
    assert!(
        ok,
        "no matching line in {} within {limit:?}; it has:\n{}",
        path.display(),
        lines(path).join("\n")
    );
    found.unwrap()
}

/// A `lead-exec` process whose stderr goes to a file.
pub struct Worker {
    pub child: Child,
    pub log: PathBuf,
    done: Option<ExitStatus>,
}

impl Worker {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        signal(self.pid(), sig);
    }

    /// Waits for exit within `limit`; panics with the log otherwise.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        if let Some(s) = self.done {
            return s;
        }
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                self.done = Some(s);
                return s;
            }
            if Instant::now() > end {
                panic!(
                    "lead-exec pid {} still running after {limit:?}; log:\n{}",
                    self.pid(),
                    fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exit status as a shell reports it: the code, or 128+N for a death by signal N
    /// (lead-exec dies of the stop signal that ended its run: see [`Worker::died_of`]).
    pub fn code(&mut self, limit: Duration) -> i32 {
        let s = self.wait(limit);
        use std::os::unix::process::ExitStatusExt;
        s.code()
            .or_else(|| s.signal().map(|n| 128 + n))
            .unwrap_or_else(|| panic!("neither an exit code nor a signal: {s:?}"))
    }

    /// The signal lead-exec died of, if it did not exit.
    pub fn died_of(&mut self, limit: Duration) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.wait(limit).signal()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log has a line containing `needle`.
    pub fn wait_log(&self, needle: &str, limit: Duration) {
        let ok = wait_until(limit, || self.log_text().contains(needle));
        assert!(
            ok,
            "log never said {needle:?} within {limit:?}:\n{}",
            self.log_text()
        );
    }

    /// Waits until lead-exec has its watchdog's report that the job started. A job's first
    /// line runs before that report is read: a test that stops or kills the watchdog on the
    /// job's word alone can catch it before it answered, and lead-exec then gives the term up
    /// (--command-timeout) and runs the job again under a new one.
    pub fn wait_job_started(&self) {
        self.wait_log("leading: job started", Duration::from_secs(10));
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.done.is_none() {
            signal(self.pid(), libc::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `lead-exec ARGS`, logging stderr to `dir/NAME.log`.
pub fn spawn(dir: &Path, name: &str, args: &[&str]) -> Worker {
    spawn_env(dir, name, args, &[])
}

pub fn spawn_env(dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Worker {
    spawn_program(Path::new(bin()), dir, name, args, env)
}

/// Like [`spawn_env`], with another copy of the binary.
pub fn spawn_program(
    program: &Path,
    dir: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Worker {
    start_worker(worker_command(program, dir, name, args, env), dir, name)
}

/// Like [`spawn`], in a session (and so a process group) of its own: the test can signal
/// that group, or match by session, without reaching the test runner or other tests.
pub fn spawn_detached(dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Worker {
    use std::os::unix::process::CommandExt;
    let mut cmd = worker_command(Path::new(bin()), dir, name, args, env);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    start_worker(cmd, dir, name)
}

fn worker_command(
    program: &Path,
    dir: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Command {
    let mut cmd = Command::new(program);
    default_signals(&mut cmd);
    cmd.args(args)
        .env_remove("LEAD_EXEC_ENDPOINTS")
        .env_remove("ETCDCTL_ENDPOINTS")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(fs::File::create(dir.join(format!("{name}.out"))).unwrap());
    cmd
}

/// The signals a test sends start with their default action in the worker, however the test
/// runner itself was started: lead-exec keeps a signal that was ignored at its start ignored
/// (nohup), and a runner started in the background of a non-interactive shell has INT and
/// QUIT ignored.
fn default_signals(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal() is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
}

fn start_worker(mut cmd: Command, dir: &Path, name: &str) -> Worker {
    let log = dir.join(format!("{name}.log"));
    cmd.stderr(fs::File::create(&log).unwrap());
    // A binary copied just now (a test's own copy) can be "busy" for an instant: another
    // test thread's fork may still hold the copy's descriptor until that child execs.
    let mut tries = 0;
    let child = loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    Worker {
        child,
        log,
        done: None,
    }
}

/// Runs `lead-exec ARGS` to completion: (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    run_env(args, &[])
}

pub fn run_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env_remove("LEAD_EXEC_ENDPOINTS")
        .env_remove("ETCDCTL_ENDPOINTS")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A grace long enough to tell SIGTERM-and-wait from SIGKILL (or a spin from a wait) apart:
/// grace 2 + margin 0.5 + interval 2 < ttl 6.
pub const WIDE_GRACE: [&str; 6] = ["--ttl", "6s", "--grace", "2s", "--safety-margin", "500ms"];

/// `run NAME --endpoints E <FAST> EXTRA... -- sh -c SCRIPT`.
pub fn run_args<'a>(
    name: &'a str,
    endpoints: &'a str,
    extra: &[&'a str],
    script: &'a str,
) -> Vec<&'a str> {
    run_args_with(&FAST, name, endpoints, extra, script)
}

/// Like [`run_args`], with other lease settings than [`FAST`].
pub fn run_args_with<'a>(
    lease: &[&'a str],
    name: &'a str,
    endpoints: &'a str,
    extra: &[&'a str],
    script: &'a str,
) -> Vec<&'a str> {
    let mut v = vec!["run", name, "--endpoints", endpoints];
    v.extend_from_slice(lease);
    v.extend_from_slice(extra);
    v.extend_from_slice(&["--", "sh", "-c", script]);
    v
}

/// A shell script line with `$D` standing for the test dir.
pub fn script(dir: &Path, body: &str) -> String {
    body.replace("$D", &dir.display().to_string())
}

/// Terms recorded by a job that appends "$FENCING_TOKEN $LEAD_EXEC_LEASE_ID" to `dir/terms`:
/// (token, lease), oldest first.
pub fn terms(dir: &Path) -> Vec<(i64, String)> {
    lines(&dir.join("terms"))
        .iter()
        .map(|l| {
            let (t, lease) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), lease.to_string())
        })
        .collect()
}

/// Reads an integer from a file once it exists.
pub fn wait_int(path: &Path, limit: Duration) -> i64 {
    let mut v = None;
    let ok = wait_until(limit, || {
        v = fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        v.is_some()
    });
    assert!(ok, "{} never held a number", path.display());
    v.unwrap()
}

/// Follows a child's stdout line by line (for `watch` and `etcdctl elect --listen`).
pub struct LineReader {
    pub child: Child,
    rx: std::sync::mpsc::Receiver<String>,
}

impl LineReader {
    pub fn start(mut cmd: Command) -> LineReader {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        LineReader { child, rx }
    }

    /// Waits for a line containing `needle`.
    pub fn expect(&self, needle: &str, limit: Duration) -> String {
        let end = Instant::now() + limit;
        let mut seen = Vec::new();
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.rx.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return l,
                Ok(l) => seen.push(l),
                Err(_) => break,
            }
        }
        panic!("no line containing {needle:?} within {limit:?}; saw: {seen:#?}");
    }

    /// Asserts that no line containing `needle` arrives within `window`.
    pub fn quiet_for(&self, needle: &str, window: Duration) {
        let end = Instant::now() + window;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            if let Ok(l) = self.rx.recv_timeout(left) {
                assert!(!l.contains(needle), "unexpected line: {l}");
            }
        }
    }
}

impl Drop for LineReader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
