//! The `lead-exec` binary. Everything lives in the library; see its "Theory of operation".

fn main() -> std::process::ExitCode {
    lead_exec::main()
}

/// Runs before Rust's runtime replaces a closed fd 1 with /dev/null (glibc calls the
/// `.init_array` functions before `main`): see [`lead_exec::STDOUT_CLOSED_AT_START`].
extern "C" fn note_closed_stdout() {
    // SAFETY: fcntl(F_GETFD) only reads the descriptor's flags.
    if unsafe { libc::fcntl(1, libc::F_GETFD) } == -1 {
        lead_exec::STDOUT_CLOSED_AT_START.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[used]
#[link_section = ".init_array"]
static NOTE_CLOSED_STDOUT: extern "C" fn() = note_closed_stdout;
