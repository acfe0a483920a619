//! The `lead-exec` binary. Everything lives in the library; see its "Theory of operation".

fn main() -> std::process::ExitCode {
    lead_exec::main()
}
