//! Checks of the job's command before campaigning, and the exit code of a failed exec.

use anyhow::Result;

use crate::exit::{fail, Exit};

/// 127 for a command that does not exist, 126 for one that cannot be executed, as shells do.
pub fn exec_error(cmd: &str, errno: i32) -> anyhow::Error {
    let err = std::io::Error::from_raw_os_error(errno);
    match errno {
        libc::ENOENT | libc::ENOTDIR if cmd.is_empty() => {
            fail(Exit::NotFound, "'': command not found")
        }
        libc::ENOENT | libc::ENOTDIR => fail(Exit::NotFound, format!("{cmd}: command not found")),
        _ => fail(Exit::NotExecutable, format!("{cmd}: cannot execute: {err}")),
    }
}

/// A script whose `#!` interpreter is missing fails exec with ENOENT, which would read as
/// "command not found" for a file that exists: name the interpreter instead (126, as bash's
/// "bad interpreter").
fn check_interpreter(cmd: &str, path: &std::path::Path) -> Result<()> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return Ok(());
    };
    let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let Some(interp) = line.split_whitespace().next() else {
        return Ok(());
    };
    if std::path::Path::new(interp).exists() {
        return Ok(());
    }
    Err(fail(
        Exit::NotExecutable,
        format!("{cmd}: bad interpreter {interp}: no such file"),
    ))
}

/// Checks that the job's processes can be seen here, wherever they move: the tree of the
/// watchdog's descendants is read from /proc (see [`crate::supervisor::procs::tree`]), which must be the /proc of
/// our PID namespace or of an ancestor's. Elsewhere a process that left the job's group and
/// cgroup could outlive the term unseen, so lead-exec refuses to start (64), in every
/// `--cgroup` mode: without /proc the cgroup cannot be found either.
pub fn proc_view() -> Result<()> {
    crate::supervisor::procs::tree::ProcView::detect().map(|_| ()).map_err(|why| {
        fail(
            Exit::Usage,
            format!(
                "the job's processes cannot be seen here: {why}; mount the /proc of this PID namespace (for example `unshare --pid --fork --mount-proc`) or run lead-exec outside it"
            ),
        )
    })
}

/// Checks the command before campaigning, so a typo is reported at once instead of after
/// winning an election.
pub fn preflight(command: &std::ffi::OsStr) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    // The name as bytes (a file name need not be UTF-8); messages show it lossily.
    let name = command.to_string_lossy();
    let cmd = name.as_ref();
    // Joined to a PATH entry, an empty name would be the directory itself.
    if command.is_empty() {
        return Err(exec_error(cmd, libc::ENOENT));
    }
    let candidates: Vec<std::path::PathBuf> = if command.as_bytes().contains(&b'/') {
        vec![command.into()]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(command)).collect())
            .unwrap_or_default()
    };
    let mut found_unexecutable = false;
    for c in candidates {
        if let Ok(m) = std::fs::metadata(&c) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return check_interpreter(cmd, &c);
            }
            found_unexecutable = true;
        }
    }
    Err(if found_unexecutable {
        exec_error(cmd, libc::EACCES)
    } else {
        exec_error(cmd, libc::ENOENT)
    })
}
