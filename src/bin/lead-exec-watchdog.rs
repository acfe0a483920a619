//! The watchdog alone: what `lead-exec` runs beside every job when this file is installed next
//! to it. It is the same code as `lead-exec __watchdog` (see `supervisor::watchdog`), without
//! the async runtime and the etcd client, so it costs a fraction of the memory.
//!
//! The package links it statically (`cargo rustc --release --bin lead-exec-watchdog -- -C
//! target-feature=+crt-static`, as `.ci/package` and the tools' builds do): it starts beside
//! every job, and without the dynamic loader it starts in less time. It must therefore call
//! nothing that a static C library can do only with the shared libraries of the glibc it was
//! linked with (name lookups through NSS, `dlopen`, locales), which
//! `watchdog::the_watchdog_calls_nothing_a_static_c_library_cannot_do` checks.

fn main() -> std::process::ExitCode {
    lead_exec::supervisor::watchdog::main(std::env::args_os().collect())
}
