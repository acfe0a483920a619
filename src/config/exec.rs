//! The job's command line against execve(2)'s limits, checked before campaigning.

use anyhow::Result;

use crate::exit::{fail, Exit};

/// Room kept for what is added to the job's exec beyond its command and lead-exec's
/// environment: the job's `FENCING_TOKEN`/`LEAD_EXEC_*` variables and the watchdog's own
/// arguments.
const EXEC_RESERVE: usize = 4096;

/// The longest single argument or environment string execve(2) takes (`MAX_ARG_STRLEN`).
const MAX_ARG_STRLEN: usize = 32 * 4096;

/// Refuses, before campaigning, a command whose arguments and environment execve(2) would
/// refuse with E2BIG (exit 126, as a shell gives): otherwise the run would win an election
/// only to fail at the spawn.
pub fn check_exec_size(
    command: &[std::ffi::OsString],
    env: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<()> {
    // SAFETY: sysconf has no preconditions.
    let limit = unsafe { libc::sysconf(libc::_SC_ARG_MAX) };
    let limit = if limit > 0 { limit as usize } else { 2 << 20 };
    let ptr = std::mem::size_of::<usize>();
    let env: Vec<usize> = env.map(|(k, v)| k.len() + 1 + v.len()).collect();
    let strings = command.iter().map(|a| a.len()).chain(env.iter().copied());
    let longest = strings.clone().max().unwrap_or(0);
    let total: usize = strings.map(|n| n + 1 + ptr).sum::<usize>() + EXEC_RESERVE;
    if longest >= MAX_ARG_STRLEN || total > limit {
        return Err(fail(
            Exit::NotExecutable,
            format!(
                "{}: cannot execute: argument list too long ({total} bytes of arguments and environment, {longest} in the longest string; the limits are {limit} and {MAX_ARG_STRLEN})",
                command[0].to_string_lossy()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_size_is_checked_against_the_system_limit() {
        let none = std::iter::empty::<(std::ffi::OsString, std::ffi::OsString)>;
        check_exec_size(&["true".into()], none()).unwrap();
        let huge: Vec<std::ffi::OsString> = (0..40).map(|_| "x".repeat(100_000).into()).collect();
        let e = check_exec_size(&huge, none()).unwrap_err();
        assert_eq!(crate::exit::exit_of(&e), Exit::NotExecutable);
        assert!(e.to_string().contains("argument list too long"), "{e}");
        let one = vec!["x".repeat(MAX_ARG_STRLEN).into()];
        assert!(check_exec_size(&one, none()).is_err());
    }
}
