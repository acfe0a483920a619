//! A throwaway PostgreSQL: Debian's server binaries, `initdb` into a temp dir, the server on
//! a unix socket in that dir (no TCP port, so nothing to collide with), killed by pid on drop.
//!
//! PostgreSQL refuses to run as root. As root, the server and `initdb` run as `nobody`, and
//! the temp dir is given to that user. In a root whose top directories only root may enter
//! (a chroot made with `mktemp -d` is mode 0700), `nobody` could not even reach the binaries:
//! there, and only there, they also get CAP_DAC_READ_SEARCH (search and read anywhere, no
//! writes) with the `no_setuid_fixup` securebit, without which access(2), as initdb uses it
//! to find `postgres`, would drop the capability for a non-root user.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::{signal, wait_until};

/// The Debian package that ships `initdb`, `pg_ctl` and `postgres`.
pub const PACKAGE: &str = "postgresql";

/// The user the server runs as when the caller is root.
const UNPRIVILEGED: (&str, &str) = ("nobody", "nogroup");

/// The directory holding `initdb` and `postgres`: the newest
/// `/usr/lib/postgresql/<version>/bin` that has both (Debian keeps them off PATH).
pub fn bin_dir() -> Result<PathBuf, String> {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or_else(|| {
        format!("PostgreSQL's initdb not found in /usr/lib/postgresql/*/bin: install the Debian package `{PACKAGE}` (apt-get install {PACKAGE}); bash .ci/run does this")
    })
}

fn has_server(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("postgres").is_file()
}

/// A running throwaway server. Connect with [`Postgres::conninfo`].
pub struct Postgres {
    child: Option<Child>,
    dir: TempDir,
}

impl Postgres {
    /// initdb and start; panics with the reason (a missing package is named), never skips.
    pub fn start() -> Postgres {
        Postgres::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Postgres::start`], with the failure as a message.
    pub fn try_start() -> Result<Postgres, String> {
        Postgres::try_start_with(|_| {})
    }

    /// As [`Postgres::try_start`]; `setup` shapes the server's process (an example detaches
    /// its children, say).
    pub fn try_start_with(setup: fn(&mut Command)) -> Result<Postgres, String> {
        let bin = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("lead-exec-pg-")
            .tempdir()
            .map_err(|e| format!("creating a temp dir: {e}"))?;
        // SAFETY: geteuid cannot fail.
        let as_root = unsafe { libc::geteuid() } == 0;
        if as_root {
            chown_to_unprivileged(dir.path())?;
        }
        let data = dir.path().join("data");
        let out = server_command(&bin.join("initdb"), as_root, &bin)
            .arg("-D")
            .arg(&data)
            // Throwaway data: no fsync, trust on the private socket, a locale every root has.
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
            .args(["--no-sync", "--no-instructions"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let log_path = dir.path().join("postgres.log");
        let log = fs::File::create(&log_path).map_err(|e| format!("creating the log: {e}"))?;
        let mut cmd = server_command(&bin.join("postgres"), as_root, &bin);
        setup(&mut cmd);
        let child = cmd
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .args(["-c", "listen_addresses=", "-c", "fsync=off"])
            .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=40", "-c", "shared_buffers=16MB"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting postgres: {e}"))?;
        let mut pg = Postgres {
            child: Some(child),
            dir,
        };
        let ready = wait_until(Duration::from_secs(30), || {
            pg.log().contains("ready to accept connections") || !pg.running()
        });
        if !ready || !pg.running() {
            return Err(format!("postgres did not start; its log:\n{}", pg.log()));
        }
        Ok(pg)
    }

    /// The connection string (libpq key=value form) of the `postgres` database as the
    /// superuser `postgres`: trust authentication, so no password.
    pub fn conninfo(&self) -> String {
        self.conninfo_db("postgres")
    }

    pub fn conninfo_db(&self, db: &str) -> String {
        format!(
            "host={} port=5432 user=postgres dbname={db}",
            self.dir.path().display()
        )
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
}

impl Drop for Postgres {
    /// SIGQUIT is PostgreSQL's immediate shutdown: the postmaster stops its backends and
    /// exits. SIGKILL if it has not within a few seconds (a frozen server, say).
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id() as i32;
            signal(pid, libc::SIGCONT);
            signal(pid, libc::SIGQUIT);
            if !wait_until(Duration::from_secs(5), || {
                c.try_wait().ok().flatten().is_some()
            }) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// `program` with an empty environment (cargo's LD_LIBRARY_PATH points into /root, and the
/// caller's PG* variables must not steer the server), as `nobody` when running as root.
fn server_command(program: &Path, as_root: bool, bin: &Path) -> Command {
    let mut cmd = if as_root {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={}", UNPRIVILEGED.0))
            .arg(format!("--regid={}", UNPRIVILEGED.1))
            .arg("--clear-groups");
        if !enterable_by_others(bin) || !enterable_by_others(&std::env::temp_dir()) {
            c.args(["--securebits=+no_setuid_fixup"]).args([
                "--inh-caps=+dac_read_search",
                "--ambient-caps=+dac_read_search",
            ]);
        }
        c.arg(program);
        c
    } else {
        Command::new(program)
    };
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C");
    cmd
}

/// Whether every directory from `/` down to `dir` lets other users pass (the x bit for
/// others): if not, `nobody` cannot reach what lies below.
fn enterable_by_others(dir: &Path) -> bool {
    dir.ancestors().all(|d| {
        fs::metadata(d)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

/// Gives the temp dir to the server's user: initdb creates the data dir in it, and the server
/// its socket and lock file.
fn chown_to_unprivileged(dir: &Path) -> Result<(), String> {
    let uid = id_of("-u")?;
    let gid = id_of("-g")?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .map_err(|e| format!("chown {} to {}: {e}", dir.display(), UNPRIVILEGED.0))
}

/// `id -u nobody` / `id -g nobody`, through NSS as setpriv resolves the names.
fn id_of(flag: &str) -> Result<u32, String> {
    let out = Command::new("id")
        .args([flag, UNPRIVILEGED.0])
        .output()
        .map_err(|e| format!("running id: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| format!("no user {} on this machine", UNPRIVILEGED.0))
}
