//! The command line, as clap parses it. Nothing here is validated beyond its type: see
//! [`crate::config`] for the checks that turn these flags into a safe configuration.
//!
//! Every flag also reads a `LEAD_EXEC_*` environment variable, so a systemd unit or a crontab can
//! set them once.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub mod manual;
pub mod markdown;

/// Run a command on exactly one of many workers, under an etcd lease, with a fencing token.
#[derive(Debug, Parser)]
#[command(
    name = "lead-exec",
    version,
    about,
    long_about = "Run a command on exactly one of many workers, under an etcd lease, with a \
fencing token.\n\nEvery worker runs the same `lead-exec run ELECTION -- COMMAND`. One of them wins \
the election and runs COMMAND with FENCING_TOKEN in its environment; the others wait in line. If \
the leader cannot renew its lease, its job is stopped (SIGTERM, then SIGKILL to the whole process \
group) before the lease can expire on the server.",
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Campaign for leadership and run COMMAND while leading.
    Run(Deferred<Box<RunArgs>>),
    /// Show the leader, its token, the waiting candidates and recent terms.
    Status(Deferred<StatusArgs>),
    /// Stream leader changes until interrupted.
    Watch(Deferred<WatchArgs>),
    /// Make the current leader stop its job and go to the back of the queue.
    Resign(Deferred<ResignArgs>),
    /// Stop the job everywhere and keep it stopped until `resume`.
    Pause(Deferred<PauseArgs>),
    /// Lift a pause.
    Resume(Deferred<ElectionArgs>),
    /// Show the audit record of past terms.
    History(Deferred<HistoryArgs>),
    /// From inside a job: exit 0 only if FENCING_TOKEN still belongs to the leader.
    Check(Deferred<CheckArgs>),
    /// Print a shell completion script.
    Completions(Deferred<CompletionsArgs>),
}

/// A subcommand's flags, added to its `clap::Command` only once clap builds that subcommand
/// (`Command::defer`): a parse builds the one subcommand it enters, so `run` does not build
/// the flags of the other eight, about 0.2 ms of every start. Help, the man pages and the
/// completions build every subcommand (`Command::build`), so they still show every flag; a
/// `clap::Command` read without being built shows none of a subcommand's.
#[derive(Debug)]
pub struct Deferred<T>(pub T);

impl<T: Args> Args for Deferred<T> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.defer(|c| keeping_about(c, T::augment_args))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd.defer(|c| keeping_about(c, T::augment_args_for_update))
    }

    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

/// Adds a subcommand's flags, keeping the about its variant gave it: the flags' struct (or
/// one it flattens) may have an about of its own, which the variant's, set after it when not
/// deferred, replaced.
fn keeping_about(cmd: clap::Command, add: fn(clap::Command) -> clap::Command) -> clap::Command {
    let (about, long) = (cmd.get_about().cloned(), cmd.get_long_about().cloned());
    let cmd = add(cmd);
    let cmd = match about {
        Some(a) => cmd.about(a),
        None => cmd.about(None::<&str>),
    };
    match long {
        Some(l) => cmd.long_about(l),
        None => cmd.long_about(None::<&str>),
    }
}

impl<T: clap::FromArgMatches> clap::FromArgMatches for Deferred<T> {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(m).map(Deferred)
    }

    fn from_arg_matches_mut(m: &mut clap::ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches_mut(m).map(Deferred)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(m)
    }

    fn update_from_arg_matches_mut(&mut self, m: &mut clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches_mut(m)
    }
}

/// Logging flags, shared by every subcommand.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// More log output (-v: debug; -vv: the libraries' debug lines too, gRPC and HTTP/2).
    /// RUST_LOG overrides both.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,

    /// Only errors.
    #[arg(short, long, global = true, env = "LEAD_EXEC_QUIET", value_parser = clap::builder::BoolishValueParser::new())]
    pub quiet: bool,

    /// Log line format on stderr.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        env = "LEAD_EXEC_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How to reach etcd. Names and fallbacks follow etcdctl.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnArgs {
    /// Comma-separated etcd endpoints (also read from ETCDCTL_ENDPOINTS).
    #[arg(long, env = "LEAD_EXEC_ENDPOINTS", value_name = "URLS")]
    pub endpoints: Option<String>,

    /// How long to wait for etcd to answer the first request (at least 100ms).
    #[arg(long, env = "LEAD_EXEC_DIAL_TIMEOUT", default_value = "2s", value_parser = duration, value_name = "DURATION")]
    pub dial_timeout: Duration,

    /// How long one etcd request may take once connected (at least 100ms; default 5s, and
    /// for `run` the lease TTL if that is shorter: `run` refuses a longer one).
    #[arg(long, env = "LEAD_EXEC_COMMAND_TIMEOUT", value_parser = duration, value_name = "DURATION")]
    pub command_timeout: Option<Duration>,

    /// CA bundle that signs the etcd server certificates (also ETCDCTL_CACERT).
    #[arg(long, env = "LEAD_EXEC_CACERT", value_name = "FILE")]
    pub cacert: Option<PathBuf>,

    /// Client certificate for TLS client authentication (also ETCDCTL_CERT).
    #[arg(long, env = "LEAD_EXEC_CERT", value_name = "FILE")]
    pub cert: Option<PathBuf>,

    /// Private key of --cert (also ETCDCTL_KEY).
    #[arg(long, env = "LEAD_EXEC_KEY", value_name = "FILE")]
    pub key: Option<PathBuf>,

    /// etcd user name. The password comes from LEAD_EXEC_PASSWORD or --password-file, never argv.
    #[arg(long, env = "LEAD_EXEC_USER", value_name = "NAME")]
    pub user: Option<String>,

    /// File whose first line is the etcd password (needs --user; an empty line is refused).
    #[arg(long, env = "LEAD_EXEC_PASSWORD_FILE", value_name = "FILE")]
    pub password_file: Option<PathBuf>,
}

/// The election every subcommand acts on.
#[derive(Debug, Clone, Args)]
pub struct ElectionArgs {
    /// Election name: letters, digits, '.', '_' and '-', 1 to 128 characters.
    #[arg(env = "LEAD_EXEC_ELECTION")]
    pub election: String,

    #[command(flatten)]
    pub conn: ConnArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnLoss {
    /// Stop the job, then campaign again on a fresh lease.
    Campaign,
    /// Stop the job, then exit with code 76.
    Exit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CgroupMode {
    /// Contain the job in its own cgroup v2 when one can be created.
    Auto,
    /// Require a cgroup; refuse to run without one.
    On,
    /// Process group only.
    Off,
}

#[derive(Debug, Args)]
// --run-key-ttl needs a run key, given or made by --every. Whether both may be given is
// decided in `config`, after the variables of an outer job are forgotten.
#[command(group(clap::ArgGroup::new("run_key_source").args(["run_key", "every"]).multiple(true)))]
pub struct RunArgs {
    #[command(flatten)]
    pub election: ElectionArgs,

    /// Lease TTL, rounded up to whole seconds. etcd may grant more; the granted TTL is used.
    #[arg(long, env = "LEAD_EXEC_TTL", default_value = "10s", value_parser = duration, value_name = "DURATION", help_heading = "Lease")]
    pub ttl: Duration,

    /// Time between SIGTERM and SIGKILL when the job is stopped.
    #[arg(long, env = "LEAD_EXEC_GRACE", default_value = "3s", value_parser = duration, value_name = "DURATION", help_heading = "Lease")]
    pub grace: Duration,

    /// Subtracted from the lease deadline, for clock-rate error and signal latency (at least
    /// 100ms).
    #[arg(long, env = "LEAD_EXEC_SAFETY_MARGIN", default_value = "1s", value_parser = duration, value_name = "DURATION", help_heading = "Lease")]
    pub safety_margin: Duration,

    /// This candidate's identity, stored in its key (default HOST:PID; one line, at most 256
    /// bytes).
    #[arg(
        long,
        env = "LEAD_EXEC_ID",
        value_name = "ID",
        help_heading = "Election"
    )]
    pub id: Option<String>,

    /// What to do when leadership is lost while the job runs.
    #[arg(long, env = "LEAD_EXEC_ON_LOSS", value_enum, default_value_t = OnLoss::Campaign, help_heading = "Election")]
    pub on_loss: OnLoss,

    /// If someone else leads, exit at once with --conflict-exit-code.
    #[arg(
        long,
        env = "LEAD_EXEC_NO_WAIT",
        value_parser = clap::builder::BoolishValueParser::new(),
        conflicts_with = "wait",
        help_heading = "Election"
    )]
    pub no_wait: bool,

    /// Give up waiting for leadership after this long (under 10ms: as --no-wait).
    #[arg(long, env = "LEAD_EXEC_WAIT", value_parser = duration, value_name = "DURATION", help_heading = "Election")]
    pub wait: Option<Duration>,

    /// Exit code when leadership was not acquired (--no-wait, --wait).
    #[arg(
        long,
        env = "LEAD_EXEC_CONFLICT_EXIT_CODE",
        default_value_t = crate::exit::Exit::DEFAULT_CONFLICT,
        value_name = "N",
        help_heading = "Election"
    )]
    pub conflict_exit_code: u8,

    /// Keep this many term records in the history.
    #[arg(
        long,
        env = "LEAD_EXEC_HISTORY_KEEP",
        default_value_t = 100,
        value_name = "N",
        help_heading = "Election"
    )]
    pub history_keep: u32,

    /// Skip the job if KEY is recorded as done; record KEY when the job exits 0 while still
    /// leading. Until a success is recorded, every run runs the job again.
    #[arg(
        long,
        env = "LEAD_EXEC_RUN_KEY",
        value_name = "KEY",
        help_heading = "Election"
    )]
    pub run_key: Option<String>,

    /// How long a --run-key record is kept (whole seconds, rounded up); also --every's.
    #[arg(long, env = "LEAD_EXEC_RUN_KEY_TTL", default_value = "7days", value_parser = duration, value_name = "DURATION", requires = "run_key_source", help_heading = "Election")]
    pub run_key_ttl: Duration,

    /// Run the job once per PERIOD across the fleet: a --run-key made of the UTC start of the
    /// period nearest to now (20261206T0100Z), so clocks within PERIOD/2 of it agree on it.
    /// Whole seconds; not with --run-key.
    #[arg(long, env = "LEAD_EXEC_EVERY", value_parser = duration, value_name = "PERIOD", help_heading = "Election")]
    pub every: Option<Duration>,

    /// Shift --every's periods from the Unix epoch by DURATION, less than the period
    /// (--every 1d --every-offset 2h: 02:00 UTC).
    #[arg(long, env = "LEAD_EXEC_EVERY_OFFSET", default_value = "0s", value_parser = duration, value_name = "DURATION", requires = "every", help_heading = "Election")]
    pub every_offset: Duration,

    /// Give one run key up to N attempts, each on whichever worker leads next: a failed attempt
    /// (non-zero exit, signal, lost lease, --timeout) leaves the key open, its worker exits with
    /// the job's code, and the next in line runs attempt 2. After N failed attempts every
    /// worker exits 80. Needs a run key (--run-key or --every); implies --on-loss exit; not
    /// with --no-wait (workers wait in line while the key is undecided: --every's period by
    /// default).
    #[arg(
        long,
        env = "LEAD_EXEC_ATTEMPTS",
        value_name = "N",
        requires = "run_key_source",
        conflicts_with = "no_wait",
        help_heading = "Election"
    )]
    pub attempts: Option<u32>,

    /// With --attempts: a worker elected after a failed attempt waits this long, its lease
    /// renewed, before it runs the next (shorter than --every's period).
    #[arg(long, env = "LEAD_EXEC_RETRY_DELAY", default_value = "0s", value_parser = duration, value_name = "DURATION", requires = "attempts", help_heading = "Election")]
    pub retry_delay: Duration,

    /// Run the job on at most N workers at once (an N-of-M semaphore); every candidate of the
    /// election must give the same N.
    #[arg(
        long,
        env = "LEAD_EXEC_SLOTS",
        default_value_t = 1,
        value_name = "N",
        help_heading = "Election"
    )]
    pub slots: u32,

    /// Stop the job once it has run this long in a term: SIGTERM, SIGKILL after the grace, then
    /// lead-exec resigns and exits 124 (a --run-key is not recorded as done).
    #[arg(long, env = "LEAD_EXEC_TIMEOUT", value_parser = duration, value_name = "DURATION", help_heading = "Scheduling")]
    pub timeout: Option<Duration>,

    /// After a term that ended uncleanly (lease expired, key deleted, worker killed), wait this
    /// long before starting the job, with the lease kept renewed: in-flight requests of the
    /// dead worker's job settle first. A clean exit or resign takes over at once. Every
    /// candidate of an election must give the same delay.
    #[arg(long, env = "LEAD_EXEC_TAKEOVER_DELAY", default_value = "0s", value_parser = duration, value_name = "DURATION", help_heading = "Scheduling")]
    pub takeover_delay: Duration,

    /// Lead only while this shell command succeeds: no campaign before it passes, a waiting
    /// candidate leaves the line and a leader resigns after --health-failures failures in a row.
    #[arg(
        long,
        env = "LEAD_EXEC_HEALTH_CMD",
        value_name = "SHELL-COMMAND",
        help_heading = "Scheduling"
    )]
    pub health_cmd: Option<String>,

    /// How often the health command runs; also its timeout.
    #[arg(long, env = "LEAD_EXEC_HEALTH_INTERVAL", default_value = "10s", value_parser = duration, value_name = "DURATION", requires = "health_cmd", help_heading = "Scheduling")]
    pub health_interval: Duration,

    /// Failures in a row that make this worker unhealthy.
    #[arg(
        long,
        env = "LEAD_EXEC_HEALTH_FAILURES",
        default_value_t = 3,
        value_name = "N",
        requires = "health_cmd",
        help_heading = "Scheduling"
    )]
    pub health_failures: u32,

    /// Preference for leading: a waiting candidate with a higher priority than the leader asks
    /// it to hand over (after its --min-term), and lower-priority candidates let it pass.
    /// Equal priorities never preempt.
    #[arg(
        long,
        env = "LEAD_EXEC_PRIORITY",
        default_value_t = 0,
        value_name = "P",
        help_heading = "Scheduling"
    )]
    pub priority: u32,

    /// A leader's job is not preempted by a higher --priority in its first DURATION, counted
    /// from the job's start (so a flapping preferred worker cannot restart the job more often
    /// than this).
    #[arg(long, env = "LEAD_EXEC_MIN_TERM", default_value = "60s", value_parser = duration, value_name = "DURATION", help_heading = "Scheduling")]
    pub min_term: Duration,

    /// Wait a random time under DURATION before campaigning, so that workers started by the
    /// same tick do not reach etcd at once (shorter than --every's period).
    #[arg(long, env = "LEAD_EXEC_SPLAY", default_value = "0s", value_parser = duration, value_name = "DURATION", help_heading = "Scheduling")]
    pub splay: Duration,

    /// Contain the job's processes in a cgroup v2 (kills setsid escapees too).
    #[arg(long, env = "LEAD_EXEC_CGROUP", value_enum, default_value_t = CgroupMode::Auto, help_heading = "Job")]
    pub cgroup: CgroupMode,

    /// Serve Prometheus metrics (/metrics) and a leader check (/leader) on HOST:PORT.
    #[arg(
        long,
        env = "LEAD_EXEC_METRICS_ADDR",
        value_name = "HOST:PORT",
        help_heading = "Observability"
    )]
    pub metrics_addr: Option<String>,

    /// At the end of each run, write its outcome to PATH (*.prom) for node_exporter's
    /// textfile collector: the --every period, when this worker took part, and the last job
    /// it ran (start, end, exit code, token, attempt, last success). Replaced atomically.
    #[arg(
        long,
        env = "LEAD_EXEC_METRICS_TEXTFILE",
        value_name = "PATH",
        value_parser = clap::value_parser!(std::path::PathBuf),
        help_heading = "Observability"
    )]
    pub metrics_textfile: Option<std::path::PathBuf>,

    /// The command to run while leading, and its arguments (passed on as bytes, as execve
    /// takes them: they need not be UTF-8).
    #[arg(
        last = true,
        required = true,
        value_name = "COMMAND",
        value_parser = clap::value_parser!(std::ffi::OsString),
        help_heading = "Job"
    )]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub election: ElectionArgs,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text, env = "LEAD_EXEC_OUTPUT")]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub election: ElectionArgs,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text, env = "LEAD_EXEC_OUTPUT")]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct ResignArgs {
    #[command(flatten)]
    pub election: ElectionArgs,

    /// Act only if T is still the leader's fencing token.
    #[arg(long, value_name = "T")]
    pub token: Option<i64>,

    /// How long to wait for the leader to stop its job and step down.
    #[arg(long, default_value = "60s", value_parser = duration, value_name = "DURATION")]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    #[command(flatten)]
    pub election: ElectionArgs,

    /// Why (not empty): shown by `status` and kept in the history.
    #[arg(long, env = "LEAD_EXEC_PAUSE_REASON", value_name = "TEXT")]
    pub reason: String,

    /// How long to wait for the running job to stop (its term closed) before exiting 69;
    /// the pause stays either way.
    #[arg(long, default_value = "60s", value_parser = duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// Exit once the pause is written, without waiting for the running job to stop.
    #[arg(long)]
    pub no_block: bool,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub election: ElectionArgs,

    /// Show the last N terms (`all`: every record kept; 0: none).
    #[arg(short = 'n', long, default_value = "20", value_parser = history_count, value_name = "N|all")]
    pub count: HistoryCount,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text, env = "LEAD_EXEC_OUTPUT")]
    pub output: Output,
}

/// How many history records to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryCount {
    Last(usize),
    All,
}

fn history_count(s: &str) -> Result<HistoryCount, String> {
    if s == "all" {
        return Ok(HistoryCount::All);
    }
    s.parse()
        .map(HistoryCount::Last)
        .map_err(|_| "a number of terms, or `all`".into())
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub conn: ConnArgs,

    /// Election to check (default: LEAD_EXEC_ELECTION, as set for the job).
    #[arg(long, env = "LEAD_EXEC_ELECTION", value_name = "NAME")]
    pub election: String,

    /// Token to check (default: FENCING_TOKEN, as set for the job).
    #[arg(long, env = "FENCING_TOKEN", value_name = "T")]
    pub token: i64,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to generate for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Set by lead-exec for every job (see [`crate::fencing::job_env`]): its presence means this
/// process runs inside a job.
pub const INSIDE_JOB_VAR: &str = "LEAD_EXEC_LEADER_KEY";

/// Keeps an outer job's variables from acting as flags of a `run` inside that job.
///
/// The job's `LEAD_EXEC_ELECTION`, `LEAD_EXEC_ID` and `LEAD_EXEC_RUN_KEY` describe the outer
/// term, yet share their names with flag variables: read as flags, a nested run would take the
/// outer id and run key, and without a name would queue behind its own parent (or, with
/// `--slots`, take a second slot for the same job). Inside a
/// job, `run` ignores them (an election name must be given), and refuses the election the outer
/// job already leads. Operator commands still read them, so `status` or `check` in a job need no
/// arguments.
pub fn forget_outer_job(run: &mut RunArgs, m: &clap::ArgMatches) -> Result<(), String> {
    use clap::parser::ValueSource;
    let Some(outer_key) = std::env::var_os(INSIDE_JOB_VAR) else {
        return Ok(());
    };
    let from_env = |id: &str| m.value_source(id) == Some(ValueSource::EnvVariable);
    if from_env("election") {
        return Err("the following required arguments were not provided: <ELECTION> \
            (inside a job, LEAD_EXEC_ELECTION names the outer job's election and is not read by `run`)"
            .to_string());
    }
    if from_env("id") {
        run.id = None;
    }
    if from_env("run_key") {
        run.run_key = None;
    }
    let outer = std::env::var("LEAD_EXEC_ELECTION").unwrap_or_default();
    if run.election.election == outer {
        return Err(format!(
            "this process runs inside the job that leads election '{outer}' (leader key {}): \
             a run in the same election would wait behind its own parent forever with one slot, \
             or with --slots take a second slot for the job that holds one",
            outer_key.to_string_lossy()
        ));
    }
    Ok(())
}

/// The one-line message for a usage error: clap's first paragraph joined (so the missing
/// arguments and the accepted values are named), with hints for two common slips. A long
/// value typed by the user is cut (see [`crate::text::quoted`]).
pub fn usage_message(e: &clap::Error, args: &[std::ffi::OsString]) -> String {
    use clap::error::{ContextKind, ContextValue};
    let mut text = usage_text(e, args);
    for kind in [ContextKind::InvalidValue, ContextKind::InvalidArg] {
        if let Some(ContextValue::String(v)) = e.get(kind) {
            if v.chars().count() > crate::text::QUOTED_CHARS {
                text = text.replace(v.as_str(), &crate::text::quoted(v));
            }
        }
    }
    text
}

fn usage_text(e: &clap::Error, args: &[std::ffi::OsString]) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let before_dashes = || args.iter().take_while(|a| *a != "--");
    let negative = |a: &str| {
        a.strip_prefix('-')
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
    };
    // `--count=-1`: the value reached its parser.
    if let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) = (
        e.get(ContextKind::InvalidArg),
        e.get(ContextKind::InvalidValue),
    ) {
        if negative(value) {
            return format!("invalid value '{value}' for '{arg}': negative values are not allowed");
        }
    }
    if e.kind() == ErrorKind::InvalidUtf8 {
        return not_utf8(args);
    }
    if e.kind() == ErrorKind::UnknownArgument {
        if let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) {
            if negative(arg) {
                // `--count -1`: clap took the value for a flag; the word before it names the
                // flag it was meant for.
                let words: Vec<_> = before_dashes().map(|a| a.to_string_lossy()).collect();
                let at = words.iter().position(|a| a.starts_with(arg.as_str()));
                let typed = at.map_or_else(|| arg.clone(), |i| words[i].to_string());
                let flag = at
                    .and_then(|i| i.checked_sub(1))
                    .map(|i| &words[i])
                    .filter(|w| w.starts_with('-') && !negative(w));
                return match flag {
                    Some(f) => format!(
                        "invalid value '{typed}' for '{f}': negative values are not allowed"
                    ),
                    None => format!("invalid value '{typed}': negative values are not allowed"),
                };
            }
            let usage = e
                .get(ContextKind::Usage)
                .map(|u| u.to_string())
                .unwrap_or_default();
            if !arg.starts_with('-') && usage.contains("lead-exec run") {
                return format!(
                    "unexpected argument '{arg}': the command goes after `--`, as in \
                     `lead-exec run NAME [OPTIONS] -- COMMAND [ARGS...]`"
                );
            }
        }
    }
    let text = e.to_string();
    let first: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let (head, rest) = first
        .split_first()
        .map_or(("invalid arguments", &[][..]), |(h, r)| (*h, r));
    let head = head.strip_prefix("error: ").unwrap_or(head);
    if rest.is_empty() {
        head.to_string()
    } else if head.ends_with(':') {
        format!("{head} {}", rest.join(", "))
    } else {
        format!("{head} {}", rest.join(" "))
    }
}

/// Which word before `--` is not UTF-8, and the flag it was given to: flags and names are
/// text, only the job's command may be any bytes.
fn not_utf8(args: &[std::ffi::OsString]) -> String {
    let words: Vec<&std::ffi::OsString> = args.iter().take_while(|a| *a != "--").collect();
    let Some(at) = words.iter().position(|w| w.to_str().is_none()) else {
        return "invalid UTF-8 in the arguments".to_string();
    };
    let word = words[at].to_string_lossy();
    let (flag, shown) = match word.split_once('=').filter(|(f, _)| f.starts_with('-')) {
        Some((f, v)) => (Some(f.to_string()), v.to_string()),
        None => (None, word.to_string()),
    };
    let flag = flag.or_else(|| {
        at.checked_sub(1)
            .and_then(|i| words[i].to_str())
            .filter(|w| w.starts_with('-') && !w.contains('='))
            .map(str::to_string)
    });
    match flag {
        Some(f) => format!(
            "{f}: '{shown}' is not valid UTF-8; flags take text (only the command after `--` may be any bytes)"
        ),
        None => format!(
            "'{shown}' is not valid UTF-8; names and flags take text (only the command after `--` may be any bytes)"
        ),
    }
}

/// Parses a duration the way humantime does ("500ms", "10s", "1m30s").
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 10s, 2m)"))
}

/// The clap command, for the man pages and completions.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// The completion script for `shell`. In bash's, clap_complete names the case arm of each
/// subcommand `lead__subcmd__exec__subcmd__run` where its loop over the words arrives at
/// `lead__exec__subcmd__run` (a binary name with a hyphen: clap-rs/clap#6421, open), so no
/// flag of any subcommand ever completed; the arms are renamed as the loop spells them.
pub fn completion_script(shell: clap_complete::Shell) -> String {
    // Into memory first: clap_complete panics on a failed write.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command(), "lead-exec", &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    match shell {
        clap_complete::Shell::Bash => script.replace("lead__subcmd__exec__", "lead__exec__"),
        _ => script,
    }
}

/// The man pages, as (file name, roff): `lead-exec.1` and one `lead-exec-SUB.1` per
/// subcommand, rendered from this definition so they cannot drift from it, and the reference
/// pages of section 7, rendered from their Markdown.
pub fn man_pages() -> Vec<(String, Vec<u8>)> {
    // No `help` subcommand on the pages: lead-exec-help(1) would name a page that does not
    // exist (`lead-exec help run` still works).
    let mut cmd = command().disable_help_subcommand(true);
    cmd.build();
    let shown = || {
        cmd.get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    };
    // Each page's SEE ALSO names the others, from this same list.
    let subs: Vec<&str> = shown().map(|s| s.get_name()).collect();
    let mut pages = Vec::new();
    let mut top = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut top)
        .expect("rendering to memory cannot fail");
    top.extend_from_slice(manual::extra_sections("", &subs).as_bytes());
    pages.push(("lead-exec.1".to_string(), top));
    for sub in shown() {
        let short = sub.get_name().to_string();
        let name = format!("lead-exec-{short}");
        let sub = sub
            .clone()
            .name(name.clone())
            .bin_name(format!("lead-exec {short}"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(sub)
            .render(&mut buf)
            .expect("rendering to memory cannot fail");
        buf.extend_from_slice(manual::extra_sections(&short, &subs).as_bytes());
        pages.push((format!("{name}.1"), buf));
    }
    for (file, markdown) in REFERENCE {
        let roff = markdown::to_roff(markdown, env!("CARGO_PKG_VERSION"))
            .unwrap_or_else(|e| panic!("man/{file}.md: {e}"));
        pages.push((file.to_string(), roff.into_bytes()));
    }
    pages
}

/// The reference in section 7, written in Markdown beside the pages rendered from it.
pub const REFERENCE: [(&str, &str); 3] = [
    (
        "lead-exec-safety.7",
        include_str!("../../man/lead-exec-safety.7.md"),
    ),
    (
        "lead-exec-operations.7",
        include_str!("../../man/lead-exec-operations.7.md"),
    ),
    (
        "lead-exec-development.7",
        include_str!("../../man/lead-exec-development.7.md"),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        command().debug_assert();
    }

    /// A parse builds the subcommand it enters and no other: `run` does not pay for the
    /// flags of `status`, `history` and the rest.
    #[test]
    fn a_parse_builds_only_the_subcommand_it_enters() {
        let mut cmd = command();
        cmd.try_get_matches_from_mut(["lead-exec", "run", "x", "--", "true"])
            .unwrap();
        let flags = |name: &str| {
            cmd.find_subcommand(name)
                .unwrap()
                .get_arguments()
                .filter(|a| a.get_long() == Some("endpoints"))
                .count()
        };
        assert_eq!(flags("run"), 1);
        for other in [
            "status", "watch", "resign", "pause", "resume", "history", "check",
        ] {
            assert_eq!(flags(other), 0, "{other} was built");
        }
    }

    /// Built late, a subcommand keeps the about of its variant, not the one of the flags'
    /// struct (`ElectionArgs`: "The election every subcommand acts on").
    #[test]
    fn a_subcommand_built_late_keeps_its_own_about() {
        let mut cmd = command();
        cmd.build();
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            assert!(!about.contains("acts on"), "{}: {about}", sub.get_name());
            assert!(sub.get_long_about().is_none(), "{}", sub.get_name());
        }
        let run = cmd.find_subcommand("run").unwrap();
        assert_eq!(
            run.get_about().unwrap().to_string(),
            "Campaign for leadership and run COMMAND while leading"
        );
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert!(duration("5x").unwrap_err().contains("examples"));
    }
}
