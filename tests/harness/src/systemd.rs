//! A real systemd, booted in a container, for the `systemd` tier of tests.
//!
//! A Debian root (debootstrap, minbase, with systemd and dbus) is built once per machine under
//! [`CACHE`] and never changed: each boot runs it with `--volatile=overlay`, every write going
//! to a tmpfs thrown away with the container. systemd-nspawn boots it in the background
//! sharing the host's network, so the container's units reach each test's etcd on the host's
//! loopback; the built `lead-exec` (and `lead-exec-watchdog`) are bound in read-only at
//! `/usr/local/bin`, where the example units expect them, and a host directory at [`SHARE`],
//! where jobs leave what tests read. `nsenter` into the container's PID 1 drives it
//! (`systemctl`, `journalctl`).
//!
//! One container serves every test of the tier ([`shared`]): booting costs about a second,
//! but each test's units have names of their own, and each its own etcd.
//!
//! Where it cannot boot (not root, no systemd-nspawn), [`shared`] says so on one line and
//! gives `None`, and the tier's tests pass without running, unless `LEAD_EXEC_REQUIRE_SYSTEMD`
//! is set (as CI sets it), when it panics naming the package.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{bin, wait_until};

/// Where the base root is kept, built once per machine.
pub const CACHE: &str = "/var/cache/lead-exec-tests";

/// Where the host directory of the tests is seen inside the container.
pub const SHARE: &str = "/srv/lead-exec-tests";

/// The example units, as shipped.
pub const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/systemd");

/// A booted systemd: the container's PID 1, seen from the host.
pub struct Systemd {
    pub pid: i32,
    /// Held around each `daemon-reload`; a test that must have none meanwhile holds it too
    /// (see [`Systemd::no_reload`]).
    reload: std::sync::Mutex<()>,
    /// The host directory bound at [`SHARE`].
    pub share: PathBuf,
    /// How long the boot took, to `systemctl is-system-running --wait`.
    pub boot: Duration,
}

static SHARED: OnceLock<Result<Systemd, String>> = OnceLock::new();

/// The tier's one container, booted on first use; `None` (said once) where it cannot be.
pub fn shared() -> Option<&'static Systemd> {
    static SAID: std::sync::Once = std::sync::Once::new();
    match SHARED.get_or_init(boot) {
        Ok(s) => Some(s),
        Err(why) => {
            if std::env::var_os("LEAD_EXEC_REQUIRE_SYSTEMD").is_some() {
                panic!("systemd tier: {why}");
            }
            // Straight to fd 2: libtest captures eprintln!'s output of a passing test.
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "systemd tier not run: {why}");
            });
            None
        }
    }
}

fn boot() -> Result<Systemd, String> {
    // SAFETY: geteuid only reads.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (systemd-nspawn)".into());
    }
    for (cmd, pkg) in [
        ("systemd-nspawn", "systemd-container"),
        ("debootstrap", "debootstrap"),
        ("nsenter", "util-linux"),
    ] {
        if which(cmd).is_none() {
            return Err(format!("{cmd} not found (Debian package {pkg})"));
        }
    }
    let root = base_root()?;
    // The directories of earlier runs whose process is gone (a container dies with its run).
    for old in fs::read_dir("/tmp").into_iter().flatten().flatten() {
        let name = old.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("lead-exec-systemd-") {
            if !Path::new("/proc").join(pid).exists() {
                let _ = fs::remove_dir_all(old.path());
            }
        }
    }
    let share = PathBuf::from(format!("/tmp/lead-exec-systemd-{}", std::process::id()));
    fs::create_dir_all(&share).map_err(|e| format!("{}: {e}", share.display()))?;
    let lead_exec = PathBuf::from(bin());
    let mut args: Vec<String> = vec![
        "-D".into(),
        root.display().to_string(),
        "--register=no".into(),
        "--keep-unit".into(),
        "--boot".into(),
        "--volatile=overlay".into(),
        // When the test binary goes, nspawn gets SIGTERM (below) and kills the container.
        "--kill-signal=SIGKILL".into(),
        format!("--machine=ldx-{}", std::process::id()),
        format!("--bind={}:{SHARE}", share.display()),
        format!("--bind-ro={}:/usr/local/bin/lead-exec", lead_exec.display()),
    ];
    let watchdog = lead_exec.with_file_name("lead-exec-watchdog");
    if watchdog.is_file() {
        args.push(format!(
            "--bind-ro={}:/usr/local/bin/lead-exec-watchdog",
            watchdog.display()
        ));
    }
    let console = fs::File::create(share.join("console.log")).map_err(|e| e.to_string())?;
    let start = Instant::now();
    // Spawned from a thread that lives as long as the process: PR_SET_PDEATHSIG fires when
    // the spawning thread ends, and a test's thread ends with the test.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("systemd-nspawn");
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(console.try_clone().unwrap())
            .stderr(console);
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn();
        let _ = tx.send(child.map(|c| c.id() as i32).map_err(|e| e.to_string()));
        loop {
            std::thread::park();
        }
    });
    let nspawn = rx.recv().map_err(|e| e.to_string())??;
    // nspawn's first child only sets up and forks the container's init, then exits: the pid
    // is read afresh until the one found runs systemd to the end of its boot.
    let mut sd = Systemd {
        pid: 0,
        reload: std::sync::Mutex::new(()),
        share,
        boot: Duration::ZERO,
    };
    let booted = wait_until(Duration::from_secs(60), || {
        let Some(pid) = fs::read_to_string(format!("/proc/{nspawn}/task/{nspawn}/children"))
            .ok()
            .and_then(|c| c.split_whitespace().next()?.parse().ok())
        else {
            return false;
        };
        sd.pid = pid;
        let s = sd.sh("systemctl is-system-running 2>/dev/null");
        let state = String::from_utf8_lossy(&s.stdout);
        state.starts_with("running") || state.starts_with("degraded")
    });
    if !booted {
        return Err(format!(
            "systemd did not finish booting in 60 s:\n{}",
            fs::read_to_string(sd.share.join("console.log")).unwrap_or_default()
        ));
    }
    let boot = start.elapsed();
    {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "systemd tier: container booted in {boot:?}"
        );
    }
    Ok(Systemd { boot, ..sd })
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file())
}

/// The cached Debian root, built now by `.ci/systemd-root` if this machine has none.
fn base_root() -> Result<PathBuf, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.ci/systemd-root");
    let out = Command::new("bash")
        .arg(script)
        .env("LEAD_EXEC_SYSTEMD_CACHE", CACHE)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{script}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{script} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

impl Systemd {
    /// Runs a shell script inside the container, in all its namespaces.
    pub fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-a", "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("nsenter")
    }

    /// The script's standard output; panics with both outputs if it fails.
    pub fn run(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "{script}: {:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `systemctl show -P PROPERTY UNIT`.
    pub fn prop(&self, unit: &str, property: &str) -> String {
        self.run(&format!("systemctl show -P {property} {unit}"))
            .trim()
            .to_string()
    }

    /// Waits until `UNIT`'s `PROPERTY` is `value`; panics with the unit's status otherwise.
    pub fn wait_prop(&self, unit: &str, property: &str, value: &str, limit: Duration) {
        let ok = wait_until(limit, || self.prop(unit, property) == value);
        assert!(
            ok,
            "{unit}: {property} never {value:?} within {limit:?} (now {:?})\n{}",
            self.prop(unit, property),
            self.status(unit)
        );
    }

    /// `systemctl status` and the unit's journal, for failure messages.
    pub fn status(&self, unit: &str) -> String {
        let out = self.sh(&format!(
            "systemctl status --no-pager -l {unit}; journalctl --no-pager -o short-precise -u {unit} | tail -40"
        ));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes a file inside the container (its overlay: gone with it).
    pub fn write(&self, path: &str, content: &str, mode: u32) {
        let host = self.share.join(format!(".w-{}", unique()));
        fs::write(&host, content).unwrap();
        self.run(&format!(
            "mkdir -p \"$(dirname {path})\" && cp {SHARE}/{} {path} && chmod {mode:o} {path}",
            host.file_name().unwrap().to_string_lossy()
        ));
        let _ = fs::remove_file(host);
    }

    /// Installs an example unit under another name, as shipped, with a drop-in of the test's
    /// own (`[Section]` lines), then reloads systemd.
    pub fn install(&self, example: &str, name: &str, drop_in: &str) {
        let text = fs::read_to_string(Path::new(EXAMPLES).join(example))
            .unwrap_or_else(|e| panic!("{EXAMPLES}/{example}: {e}"));
        self.write(&format!("/etc/systemd/system/{name}"), &text, 0o644);
        self.write(
            &format!("/etc/systemd/system/{name}.d/test.conf"),
            drop_in,
            0o644,
        );
        let _no_other = self.no_reload();
        self.run("systemctl daemon-reload");
    }

    /// No `daemon-reload` by another test while the guard lives: systemd 252 re-times a
    /// running stop from `TimeoutStopSec=` on a reload, forgetting an `EXTEND_TIMEOUT_USEC=`.
    pub fn no_reload(&self) -> std::sync::MutexGuard<'_, ()> {
        self.reload.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A directory of the test's own, `(host path, container path)`.
    pub fn dir(&self, name: &str) -> (PathBuf, String) {
        let host = self.share.join(name);
        let _ = fs::remove_dir_all(&host);
        fs::create_dir_all(&host).unwrap();
        (host, format!("{SHARE}/{name}"))
    }

    /// Lines of the journal matching `args` (journalctl's), as `MESSAGE`s.
    pub fn journal(&self, args: &str) -> Vec<String> {
        self.run(&format!("journalctl --no-pager -o cat {args}"))
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Whether a process (the container's pid) is alive inside the container.
    pub fn alive(&self, pid: i64) -> bool {
        self.sh(&format!("kill -0 {pid} 2>/dev/null"))
            .status
            .success()
    }
}

/// The drop-in that points an example unit at a test's etcd, without the example's TLS and
/// user settings, with `ExecStart=` replaced when `exec` is given.
pub fn drop_in(endpoints: &str, exec: Option<&str>, extra: &str) -> String {
    let mut s = format!(
        "[Service]\nEnvironment=LEAD_EXEC_ENDPOINTS={endpoints}\n\
         UnsetEnvironment=LEAD_EXEC_CACERT LEAD_EXEC_CERT LEAD_EXEC_KEY LEAD_EXEC_USER\n"
    );
    if let Some(exec) = exec {
        s.push_str(&format!("ExecStart=\nExecStart={exec}\n"));
    }
    s.push_str(extra);
    s
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
