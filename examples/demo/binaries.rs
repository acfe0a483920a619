//! lead-exec and the ledger: where they are, building them when needed, and running them with
//! a clean environment.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use anyhow::{bail, ensure, Context, Result};

use crate::store::Store;
use crate::{ELECTION, EXIT_REJECTED};

pub(crate) struct Bins {
    pub(crate) lead_exec: PathBuf,
    pub(crate) ledger: PathBuf,
}

/// Finds lead-exec and the ledger next to this demo (target/<profile>/examples/demo), and
/// builds them first if they are missing or older than the sources: `cargo run --example
/// demo` builds only the demo itself.
pub(crate) fn locate_binaries() -> Result<Bins> {
    let exe = std::env::current_exe().context("locating the demo executable")?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("the demo is not inside a target/<profile>/examples directory")?
        .to_path_buf();
    let bins = Bins {
        lead_exec: profile_dir.join("lead-exec"),
        ledger: profile_dir.join("examples").join("ledger"),
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Both link the library; the ledger also has its own sources.
    let library = newest_mtime(&[
        root.join("src"),
        root.join("Cargo.toml"),
        root.join("Cargo.lock"),
    ]);
    let ledger_src = newest_mtime(&[root.join("examples").join("ledger")]);
    let stale = |bin: &Path, sources: Option<SystemTime>| match (mtime(bin), sources) {
        (None, _) => true,
        (Some(built), Some(src)) => built < src,
        (Some(_), None) => false,
    };
    if stale(&bins.lead_exec, library) || stale(&bins.ledger, library.max(ledger_src)) {
        build(root, &profile_dir)?;
    }
    for p in [&bins.lead_exec, &bins.ledger] {
        ensure!(p.exists(), "{} is missing after the build", p.display());
    }
    Ok(bins)
}

/// Builds lead-exec and the ledger with the same profile as this demo.
pub(crate) fn build(root: &Path, profile_dir: &Path) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    // `cargo run` exports the demo's package variables (CARGO_PKG_*, CARGO_MANIFEST_DIR...).
    // Some build scripts (ring's) rerun when those change, so passing them on would make this
    // build and the next `cargo run` rebuild each other's dependencies every time.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || matches!(
                k.as_ref(),
                "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE" | "OUT_DIR"
            )
        {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.current_dir(root)
        .args(["build", "--bin", "lead-exec", "--example", "ledger"]);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
        None => {}
    }
    println!("lead-exec demo: building lead-exec and the ledger example (the first build takes a few minutes)...");
    let status = cmd
        .status()
        .with_context(|| format!("running {}", cargo.to_string_lossy()))?;
    ensure!(status.success(), "the build failed ({status})");
    Ok(())
}

pub(crate) fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest modification time of these files and, recursively, of the files under these
/// directories.
pub(crate) fn newest_mtime(paths: &[PathBuf]) -> Option<SystemTime> {
    let mut newest = None;
    let mut todo: Vec<PathBuf> = paths.to_vec();
    while let Some(p) = todo.pop() {
        if p.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                todo.extend(rd.flatten().map(|e| e.path()));
            }
        } else if let Some(t) = mtime(&p) {
            newest = newest.max(Some(t));
        }
    }
    newest
}

/// The only external program the demo needs.
pub(crate) fn require_etcd() -> Result<()> {
    harness::locate("etcd", "etcd-server").map_err(anyhow::Error::msg)?;
    Ok(())
}

/// A command with a clean environment: stray LEAD_EXEC_*, ETCDCTL_* or ETCD_* variables from
/// the user's shell would change how lead-exec or etcd behave.
pub(crate) fn clean_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    clean_env(&mut cmd);
    cmd
}

/// Leaves out the caller's lead-exec and etcd settings, so that they cannot steer the demo.
pub(crate) fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("LEAD_EXEC_")
            || k.starts_with("ETCDCTL_")
            || k.starts_with("ETCD_")
            || k == "FENCING_TOKEN"
            || k == "RUST_LOG"
        {
            cmd.env_remove(k.as_ref());
        }
    }
}

/// Children get their own process group (so Ctrl-C reaches only the demo, which then cleans
/// up in order) and die with the demo even if it is killed outright.
pub(crate) fn detach_and_tie(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: prctl is async-signal-safe. Children are spawned from the main thread, whose
    // exit is the demo's exit.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// What a short command printed and how it exited.
pub(crate) struct Output {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

pub(crate) fn capture(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    Ok(Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs the ledger; fails unless it exits 0, 1 or 3 (the answers, as opposed to errors).
pub(crate) fn ledger(bins: &Bins, store: &Store, args: &[&str]) -> Result<Output> {
    let mut cmd = clean_command(&bins.ledger);
    cmd.args(store.args()).args(args);
    let out = capture(&mut cmd)?;
    if !matches!(out.code, Some(0 | 1 | EXIT_REJECTED)) {
        bail!(
            "ledger {} failed ({:?}): {}",
            args.join(" "),
            out.code,
            out.stderr.trim()
        );
    }
    Ok(out)
}

pub(crate) fn status(bins: &Bins, endpoint: &str) -> Result<String> {
    let mut cmd = clean_command(&bins.lead_exec);
    cmd.args(["status", ELECTION, "--endpoints", endpoint]);
    let out = capture(&mut cmd)?;
    Ok(format!("{}{}", out.stdout, out.stderr))
}
