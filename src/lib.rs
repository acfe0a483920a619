//! lead-exec runs a command on exactly one of many workers, under an etcd lease, with a
//! fencing token.
//!
//! # Theory of operation
//!
//! Every worker runs `lead-exec run ELECTION -- COMMAND`. Each one grants an etcd lease and
//! creates a candidate key `lead-exec/elections/ELECTION/<lease hex>` on it, only if absent
//! (the first time right behind the grant, naming the lease id it picked, without waiting for
//! the grant's answer).
//! The key with the lowest create revision leads; the others watch the key just ahead of
//! theirs and wait for it to be deleted (or marked elected: then they are next in line).
//! Before spawning, the winner confirms in one transaction that its key still exists with
//! that create revision, which becomes the job's `FENCING_TOKEN`: assigned by etcd, strictly
//! larger every term.
//!
//! The job does not run inside lead-exec. A watchdog process (the small `lead-exec-watchdog`
//! binary, or lead-exec re-executed in a hidden mode), started while lead-exec connects and
//! campaigns and waiting on its pipe until the term is won, forks it into its own process group,
//! and cgroup when possible, as a child subreaper whose descendants the job's processes stay
//! wherever they move, and enforces the lease deadline D = send time of the last renewed
//! keepalive + TTL − safety margin on CLOCK_BOOTTIME: SIGTERM to the group at D − grace,
//! SIGKILL just before D. lead-exec only ever moves D forward, over a pipe. If lead-exec dies,
//! the pipe closes and the group is killed at once; if it freezes, the deadline fires anyway.
//! The watchdog has a session and a name (`ldx-warden`, no three letters in a row of
//! `lead-exec`) of its own, so no group signal or name match stops both; and lead-exec
//! enforces D as well, SIGKILLing the group and cgroup itself if the watchdog has not
//! reported them gone by then, and never blocks on the watchdog's pipe. So the job never outlives the
//! lease on the server, and a frozen old leader's late writes carry a token the resource
//! already rejects.
//!
//! A job starts only with a deadline that leaves it the grace plus one keepalive interval
//! (lead-exec renews first if needed), and the watchdog checks the deadline again right
//! before it forks. When etcd says the lease is gone, the job gets SIGKILL at once, even
//! while it is already being stopped for another reason.
//!
//! When the job exits, one transaction closes the term's history record and deletes
//! lead-exec's key, so the next candidate takes over at once; lead-exec then revokes the
//! emptied lease and exits with the job's code. When leadership is lost, it stops the job and
//! campaigns again on a fresh lease (or exits with `--on-loss exit`).
//!
//! The scheduling controls change when and where the job runs, never that rule: `--timeout`
//! ends a term, `--takeover-delay` holds a new leader's start after an unclean end (judged by
//! the previous term's history record), `--health-cmd` keeps an unhealthy worker out of line,
//! `--priority` makes lower candidates step aside at the head of the line and asks a lower
//! leader to hand over, with the same token-guarded request as `resign`, and `--splay` holds
//! the first campaign back by a random time. `--every` is a run key made from the wall clock
//! (see [`period`]).
//!
//! With `--slots N` the N oldest keys hold instead of the first alone (see
//! [`election::campaign::slots`]); each holder gets its own token and a slot index no other
//! running holder has.
//!
//! # Layout
//!
//! Dependencies point down this list: each module uses only those below it.
//!
//! - [`mod@run`]: `lead-exec run`. [`run::lifecycle`] is the pure state machine: one event
//!   type and one step function per phase, each matching every event of its phase and no
//!   other. The driver in [`mod@run`] (`run/mod.rs`) holds the run as one state: its phase
//!   with exactly the scopes of that phase, one type per lifetime, each in its own file with
//!   its behaviour: `run/candidacy.rs` for a lease ([`run::candidacy::Candidacy`]: the
//!   campaign makes it, the revoke ends it), `run/term.rs` for a won term
//!   ([`run::term::Term`]: the job's start, the end record that ends it), `run/events.rs`
//!   for a job ([`run::events::RunningJob`]) and a term's event sources
//!   ([`run::events::TermEvents`]). The driver waits for the next event of its state, and
//!   carries out the step's actions on what the state holds;
//!   [`run::signals`] is lead-exec's own signal listener; [`run::health`] runs
//!   `--health-cmd`, each check under a guard that kills it when lead-exec goes. A new
//!   per-term control takes one field on the term (or one source of its events), one
//!   [`run::lifecycle::TermEvent`] variant and one arm in [`run::lifecycle::leading`].
//! - [`ops`]: the operator commands: status, watch, resign, pause/resume, history, check.
//! - [`records`]: what `run` writes beside the job and `ops` reads: term history, run keys.
//! - [`fencing`]: the token and the job's environment.
//! - [`config`]: checks the flags into a safe [`config::RunConfig`] of the crate's own types
//!   ([`config::conn`] the etcd connection, [`config::values`] single values,
//!   [`config::exec`] the command against execve's limits); [`logging`] sets up tracing from
//!   them (a run's lines get its election and id from one span, [`logging::run_span`], opened
//!   by `lead-exec run` before anything else), and
//!   `main` keeps the [`logging::Log`] it returns until exit, when its drop flushes
//!   the queue of log lines ([`logging::journal`]: to journald itself under journald).
//! - [`cli`]: the flags as typed; clap stays here, and the man pages are rendered from it,
//!   with [`cli::manual`]'s exit status, environment, signals and examples.
//! - [`election`]: key layout, [`election::lease`] (the lease and its revoke, with
//!   [`election::lease::renewal`], the arithmetic of the deadline D, and
//!   [`election::lease::keepalive`], the task that keeps the lease alive),
//!   [`election::schedule`] (when, where and until when keepalives go out,
//!   decided without I/O; the task carries it out),
//!   [`election::campaign`] (etcd's election protocol plus confirmation, with
//!   [`election::campaign::slots`] and [`election::campaign::priority`] beside it),
//!   [`election::leader`] (what a leader watches for: [`election::leader::LeaderWatch`]),
//!   [`election::scope`] (the etcd scope every request goes through: client, endpoint router,
//!   election and command timeout, one value passed in, not process-global state).
//! - [`etcd`]: connecting, bounding every request by a timeout, endpoint failover.
//! - [`supervisor`]: the job under its watchdog, a folder for each process and one for the
//!   wire. lead-exec's side, [`supervisor::handle`]: [`supervisor::handle::standby`] starts
//!   the job through a watchdog started ahead, [`supervisor::handle::job`] is the handle on
//!   the running job (deadlines, signals, stop and kill, and lead-exec's own enforcement of D).
//!   The watchdog's side, [`supervisor::watchdog`]: [`supervisor::watchdog::enforcer`]
//!   decides, without I/O, what the group gets and when, and the watchdog's main loop carries
//!   it out. [`supervisor::wire`] is what the two pipes carry. Both sides reach the job's
//!   processes through [`supervisor::procs`]: the process group and cgroup, and the tree of
//!   the watchdog's descendants, everything a stop reaches and the term waits for.
//!   `src/bin/lead-exec-watchdog.rs` is the same watchdog as a small binary of its own (linked
//!   statically in the package).
//! - [`exit`], [`clock`], [`period`], [`metrics`], [`notify`], [`text`]: exit codes as a type,
//!   CLOCK_BOOTTIME, `--every`'s periods in UTC, Prometheus, systemd, values made safe to
//!   print; [`hooks`], the debug-build hooks by which tests force an order of events.
//!
//! The safety decisions are pure functions with unit and property tests:
//! the step functions of [`run::lifecycle`], [`supervisor::watchdog::enforcer::Enforcer`],
//! [`election::schedule::Schedule`] (the keepalive schedule), and the renewal arithmetic in
//! [`election::lease::renewal`].

pub mod cli;
pub mod clock;
pub mod config;
pub mod election;
pub mod etcd;
pub mod exit;
pub mod fencing;
pub mod hooks;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod ops;
pub mod period;
pub mod records;
pub mod run;
pub mod supervisor;
pub mod text;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use anyhow::Result;
use tracing::Instrument;

use cli::{Cli, Command, Deferred};
use exit::{exit_of, Exit};

/// Whether fd 1 was closed when the process started. Rust's runtime opens /dev/null on a
/// closed standard descriptor before `main`, after which every write "succeeds"; the binary
/// looks at fd 1 before that (a constructor in `main.rs`) and says so here, so that an operator
/// command whose output goes nowhere fails as coreutils do instead of exiting 0.
pub static STDOUT_CLOSED_AT_START: AtomicBool = AtomicBool::new(false);

/// Parses argv. Usage errors print one line and give [`Exit::Usage`]; `--help` and
/// `--version` print and give success.
pub fn parse(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Cli, ExitCode> {
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    let parsed = cli::command().try_get_matches_from(&args).and_then(|m| {
        let mut cli = <Cli as clap::FromArgMatches>::from_arg_matches(&m)?;
        Ok((cli_after_env(&mut cli, &m), cli))
    });
    match parsed {
        Ok((Ok(()), cli)) => Ok(cli),
        Ok((Err(message), _)) => {
            fatal_usage(&args, &message);
            Err(Exit::Usage.into())
        }
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                let ok = e.kind() != ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand;
                return Err(if ok {
                    ExitCode::SUCCESS
                } else {
                    Exit::Usage.into()
                });
            }
            fatal_usage(&args, &cli::usage_message(&e, &args));
            Err(Exit::Usage.into())
        }
    }
}

fn cli_after_env(cli: &mut Cli, m: &clap::ArgMatches) -> std::result::Result<(), String> {
    match (&mut cli.command, m.subcommand()) {
        (Command::Run(Deferred(a)), Some(("run", sub))) => cli::forget_outer_job(a, sub),
        _ => Ok(()),
    }
}

/// A usage error, before logging is set up: JSON when `--log-format json` (or its variable)
/// asks for it, else one plain line.
fn fatal_usage(args: &[std::ffi::OsString], message: &str) {
    let flag = args
        .iter()
        .take_while(|a| *a != "--")
        .zip(args.iter().skip(1))
        .find_map(|(a, b)| {
            let a = a.to_string_lossy();
            if a == "--log-format" {
                Some(b.to_string_lossy().into_owned())
            } else {
                a.strip_prefix("--log-format=").map(str::to_string)
            }
        });
    let json = flag.or_else(|| std::env::var("LEAD_EXEC_LOG_FORMAT").ok()) == Some("json".into());
    // Logging is not set up yet: this sets it up for this one line, flushed when `log` drops.
    let log = if json {
        logging::init(&cli::LogArgs {
            verbose: 0,
            quiet: false,
            log_format: cli::LogFormat::Json,
        })
    } else {
        logging::Log::start()
    };
    fatal(&log, json, &format!("{message} (see --help)"), Exit::Usage);
}

/// Prints the error that ends the process: one plain line, or one JSON log object under
/// `--log-format json` (tracing then goes to `log`) so that a log pipeline parses it like
/// every other line. Either goes through the log's queue, best effort (see [`logging`]).
fn fatal(log: &logging::Log, json: bool, message: &str, exit: Exit) {
    // A run's last line carries its election and id, as every line of it does.
    // What RUST_LOG could not read is said first, if the run did not get to say it.
    logging::in_run(logging::say_unread_rust_log);
    if json {
        logging::in_run(
            || tracing::error!(target: logging::EXIT_TARGET, exit_code = exit.code(), "{message}"),
        );
    } else {
        log.eprint_line(&format!(
            "lead-exec: {message}{}",
            logging::run_fields_text()
        ));
    }
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> Result<Exit> {
    match cli.command {
        Command::Run(Deferred(a)) => {
            let cfg = config::RunConfig::from_args(&a)?;
            // Every line of the run carries its election and id, from here to the error
            // that may end it (see `fatal`).
            let span = logging::run_span(cfg.election.name(), cfg.id.as_str());
            async move {
                // A command that cannot run is refused (127, 126) before anything starts,
                // and so is a place where the job's processes could not be seen (64).
                supervisor::preflight(&cfg.command[0])?;
                supervisor::handle::preflight::proc_view()?;
                let exit = Box::pin(run::run(cfg.clone())).await?;
                if let Exit::NotAcquired(_) | Exit::Unhealthy = exit {
                    ops::status::report_not_acquired(&cfg, exit == Exit::Unhealthy).await;
                }
                Ok(exit)
            }
            .instrument(span)
            .await
        }
        Command::Status(Deferred(a)) => ops::status::run(a).await,
        Command::Watch(Deferred(a)) => ops::watch::run(a).await,
        Command::Resign(Deferred(a)) => ops::resign::run(a).await,
        Command::Pause(Deferred(a)) => ops::pause::pause(a).await,
        Command::Resume(Deferred(a)) => ops::pause::resume(a).await,
        Command::History(Deferred(a)) => ops::history::run(a).await,
        Command::Check(Deferred(a)) => ops::check::run(a).await,
        Command::Completions(Deferred(a)) => {
            ops::emit(&cli::completion_script(a.shell))?;
            Ok(Exit::Ok)
        }
    }
}

/// The whole program after argv: a hidden mode (the watchdog, a health check's guard), or
/// the CLI on a single-threaded runtime (so that the thread that forks the watchdog lives as
/// long as the process: see [`supervisor`]).
pub fn main() -> ExitCode {
    // One malloc arena: the log writer and signal threads hardly allocate, and an arena of
    // their own each kept pages resident in every process, a waiting candidate's too.
    // SAFETY: plain integers; before any thread is started, so every thread gets it.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == supervisor::watchdog::ARG) {
        return supervisor::watchdog::main(args);
    }
    if args.get(1).is_some_and(|a| a == run::health::GUARD_ARG) {
        return run::health::guard_main(args);
    }
    unblock_handled_signals();
    cli_main(args)
}

/// A parent may start lead-exec with signals blocked (inherited through exec): unblocked here,
/// before any thread is started (threads inherit the mask), as timeout(1) does, so that the
/// signals lead-exec acts on reach it. A signal *ignored* at start stays ignored (nohup): that
/// is the caller's choice, and the signal thread keeps it.
fn unblock_handled_signals() {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
        Signal::SIGCONT,
        Signal::SIGCHLD,
    ] {
        set.add(s);
    }
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
}

/// The signal the process dies of at exit, 0 for none: set once the outcome is known (see
/// [`Exit::dies_of`]).
static DIE_OF: AtomicI32 = AtomicI32::new(0);

/// Dies of [`DIE_OF`]'s signal, if one is set, at the very end of exit(): registered with
/// atexit before anything else is, it runs after every other exit handler (atexit runs them
/// in reverse order), so the cleanup done at exit (the refusals file) still happens, and the
/// log's queue has been flushed before exit() was called.
extern "C" fn die_of_signal_at_exit() {
    let sig = DIE_OF.load(Ordering::SeqCst);
    if sig != 0 {
        // Default disposition, unblocked, raised: the process ends here. Should it not, exit()
        // goes on with 128+N.
        let _ = signal_hook::low_level::emulate_default_handler(sig);
    }
}

fn cli_main(args: Vec<std::ffi::OsString>) -> ExitCode {
    // SAFETY: registers a plain function with no captured state, run by exit().
    unsafe { libc::atexit(die_of_signal_at_exit) };
    let cli = match parse(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // Kept to the end: its drop flushes the log's queue.
    let log = logging::init(&cli.log);
    // A run says it in its span; `check`, which the job runs, never (see
    // `logging::say_unread_rust_log`); the others now.
    match cli.command {
        Command::Run(_) => {}
        Command::Check(_) => logging::forget_unread_rust_log(),
        _ => logging::say_unread_rust_log(),
    }
    let json = cli.log.log_format == cli::LogFormat::Json;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // A run watches a handful of descriptors: tokio's default of 1,024 events per poll
        // is a 12 KiB buffer, in every waiting candidate too.
        .max_io_events_per_tick(64)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log.eprint_line(&format!("lead-exec: cannot start the runtime: {e}"));
            return Exit::Software.into();
        }
    };
    let result = rt.block_on(run(cli));
    // Nothing left in it can change the outcome (the revoke of an emptied lease, idle
    // connections): exiting without tearing it down is the last cut from a cron run's time.
    std::mem::forget(rt);
    match result {
        Ok(exit) => {
            if let Some(sig) = exit.dies_of(run::signals::stopped_by()) {
                DIE_OF.store(sig, Ordering::SeqCst);
            }
            exit.into()
        }
        Err(err) => {
            let exit = exit_of(&err);
            fatal(&log, json, &format!("{err:#}"), exit);
            exit.into()
        }
    }
}
