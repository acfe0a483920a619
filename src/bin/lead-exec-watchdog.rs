//! The watchdog alone: what `lead-exec` runs beside every job when this file is installed next
//! to it. It is the same code as `lead-exec __watchdog` (see `supervisor::watchdog`), without
//! the async runtime and the etcd client, so it costs a fraction of the memory.

fn main() -> std::process::ExitCode {
    lead_exec::supervisor::watchdog::main(std::env::args_os().collect())
}
