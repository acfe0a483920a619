//! Logs: tracing to stderr, as text or JSON; to journald natively when stderr is journald's
//! stream (see [`journal`]).
//!
//! Logging is best effort and never holds lead-exec up. A leader must keep renewing its lease
//! whatever happens to its stderr: a reader that died (`2>fifo`, `| logger`, a journald
//! restart) makes every write fail with EPIPE, and a reader that stopped fills the pipe, after
//! which a write blocks. A blocking write on the runtime thread would stop every timer on it,
//! keepalives included. So a log line is formatted where it happens and queued, and one
//! thread of its own writes the queue to stderr:
//!
//! - a write that fails loses that line and nothing else;
//! - while the writer is blocked, lines queue up to [`QUEUE_BYTES`]; past that they are dropped
//!   and counted, and once the writer moves again one warning says how many were lost;
//! - at exit, dropping the [`Log`] that [`init`] returns waits at most [`FLUSH_LIMIT`] for
//!   the queue to drain.
//!
//! stderr itself is left as it is: it is the job's stderr too (the job inherits it), so making
//! it non-blocking would change the job's writes as well.
//!
//! Text lines are kept to one line each: control characters in a message (an id or a health
//! check's output) are escaped, so no value can print a line that looks like one of ours.

pub mod journal;

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::cli::{LogArgs, LogFormat};

/// How many bytes of log lines wait for a blocked stderr before lines are dropped: four
/// times a default pipe's capacity.
pub const QUEUE_BYTES: usize = 256 * 1024;

/// The longest [`Log::flush`] waits at exit for a stderr that is not being read.
pub const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// The log's queue and the thread that writes it to stderr. Whoever holds it (the process's
/// main function) keeps it until the end: dropping it flushes the queue (see [`Log::flush`]).
/// The writer thread runs on for as long as the process does.
pub struct Log {
    sink: Arc<Sink>,
}

/// Sends tracing's events to a new [`Log`] and returns it, to be kept until exit. If a global
/// subscriber is already set, tracing's events keep going where it sends them.
pub fn init(args: &LogArgs) -> Log {
    // Text under journald goes to the journal itself, with priorities and fields; JSON, which
    // a pipeline parses, stays on stderr as asked.
    let journal = (args.log_format == LogFormat::Text && journal::stderr_is_journal())
        .then(|| journal::connect(Path::new(journal::SOCKET)))
        .flatten();
    let log = Log::start_to(journal);
    // -vv: the libraries' debug lines too (gRPC, HTTP/2); lead-exec has no trace lines.
    let (ours, libraries) = match (args.quiet, args.verbose) {
        (true, _) => (LevelFilter::ERROR, LevelFilter::WARN),
        (false, 0) => (LevelFilter::INFO, LevelFilter::WARN),
        (false, 1) => (LevelFilter::DEBUG, LevelFilter::WARN),
        (false, _) => (LevelFilter::DEBUG, LevelFilter::DEBUG),
    };
    let rust_log = std::env::var_os("RUST_LOG");
    let rust_log = rust_log.as_ref().map(|v| v.to_str().ok_or(v));
    let (filter, unread) = filter(rust_log, ours, libraries);
    *UNREAD.lock().unwrap_or_else(|e| e.into_inner()) = unread;
    if log.sink.journal.is_some() {
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(journal::JournalLayer {
                sink: log.sink.clone(),
            })
            .try_init();
    } else {
        init_stderr(args, &log, filter);
    }
    log
}

/// The warning about a RUST_LOG that could not be read, until it is said: a run says it in
/// its span, so that it carries the run's election and id; `check`, which a job calls and
/// which is silent, never says it (the run that started the job already did).
static UNREAD: Mutex<Option<String>> = Mutex::new(None);

/// Drops the warning about RUST_LOG unsaid: `check`'s, whose RUST_LOG is the job's, of which
/// the run that started the job already warned; `check` fails with its own line only.
pub fn forget_unread_rust_log() {
    UNREAD.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// Warns, once, that RUST_LOG could not be read and the flags' levels apply, if so.
pub fn say_unread_rust_log() {
    if let Some(warning) = UNREAD.lock().unwrap_or_else(|e| e.into_inner()).take() {
        tracing::warn!("{warning}");
    }
}

/// Which lines are logged: those RUST_LOG asks for when it is set, else lead-exec's own at
/// `ours` and the libraries' at `libraries`. With a RUST_LOG it cannot read, the latter, and
/// a warning that says so.
///
/// RUST_LOG takes targets and levels (`warn,lead_exec=debug`, `debug`), as env_logger does:
/// not tracing's span and field filters (`lead_exec[run]=debug`), which are refused rather
/// than taken for a target that matches nothing (which logged nothing at all, errors
/// included). Reading them would take tracing-subscriber's env-filter and its regex engine:
/// 270 KB of code and 12 KB of data relocated in every process (see lead-exec-development(7)).
fn filter(
    rust_log: Option<Result<&str, &std::ffi::OsString>>,
    ours: LevelFilter,
    libraries: LevelFilter,
) -> (Targets, Option<String>) {
    let flags = always(
        Targets::new()
            .with_default(libraries)
            .with_target("lead_exec", ours),
    );
    let unread = |given: String, why: &str| {
        Some(format!(
            "RUST_LOG={given} ignored ({why}): it takes targets and levels, as in warn,lead_exec=debug"
        ))
    };
    let given = match rust_log {
        None => return (flags, None),
        Some(Err(bytes)) => {
            let shown = crate::text::quoted(&bytes.to_string_lossy());
            return (flags, unread(shown, "not UTF-8"));
        }
        Some(Ok(given)) => given,
    };
    // Empty directives (`RUST_LOG=`, a trailing comma) are nothing, as they were to env_logger.
    let directives: Vec<&str> = given
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return (flags, None);
    }
    let shown = || crate::text::quoted(given);
    for d in &directives {
        let (target, level) = target_and_level(d);
        if let Some(c) = target
            .chars()
            .find(|c| matches!(c, '[' | ']' | '{' | '}') || c.is_whitespace())
        {
            let why = format!("{:?} in a target: span and field filters are not read", c);
            return (flags, unread(shown(), &why));
        }
        if level.is_some_and(|l| l.trim().is_empty()) {
            return (flags, unread(shown(), "a target without its level"));
        }
    }
    match directives.join(",").parse::<Targets>() {
        // A RUST_LOG that does not reach lead-exec's own lines (`h2=debug`, a misspelt
        // `lead-exec=debug`, a word that is no level, `lead_exec::runner=debug`) leaves them at
        // the flags' level rather than hiding them all, errors included; only an explicit
        // `off` for them turns them off.
        Ok(theirs) if theirs.would_enable("lead_exec", &tracing::Level::ERROR) => {
            (always(theirs), None)
        }
        Ok(theirs) if directives.iter().any(|d| turns_us_off(d)) => (always(theirs), None),
        Ok(theirs) => (always(theirs.with_target("lead_exec", ours)), None),
        Err(e) => (flags, unread(shown(), &e.to_string())),
    }
}

/// The target of the run's span: every filter keeps it, so that every line of a run carries
/// the run's election and id, whatever RUST_LOG picks.
pub const RUN_TARGET: &str = "lead-exec:run";

/// The target of the line that ends the process under `--log-format json`: every filter keeps
/// it, as the plain text line is printed whatever RUST_LOG says.
pub const EXIT_TARGET: &str = "lead-exec:exit";

/// `t`, with what every filter keeps.
fn always(t: Targets) -> Targets {
    t.with_target(RUN_TARGET, LevelFilter::ERROR)
        .with_target(EXIT_TARGET, LevelFilter::ERROR)
}

/// Whether a directive turns lead-exec's own lines off: `off` (`0`, `OFF`) for every target
/// or for one that `lead_exec` starts with.
fn turns_us_off(directive: &str) -> bool {
    // A bare word is a level for every target, if it is a level at all.
    let (target, level) = match target_and_level(directive) {
        (t, Some(l)) => (t.trim(), l.trim()),
        (word, None) => ("", word),
    };
    level.parse::<LevelFilter>().ok() == Some(LevelFilter::OFF) && "lead_exec".starts_with(target)
}

/// A directive's two sides: `target=level`, or a bare word (a level or a target).
fn target_and_level(directive: &str) -> (&str, Option<&str>) {
    match directive.split_once('=') {
        Some((t, l)) => (t, Some(l)),
        None => (directive, None),
    }
}

/// The text or JSON log on stderr, through the queue.
fn init_stderr(args: &LogArgs, log: &Log, filter: Targets) {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let writer = ToQueue {
        sink: log.sink.clone(),
        // JSON escapes control characters itself.
        one_line: (args.log_format == LogFormat::Text).then_some(ansi),
    };
    let builder = tracing_subscriber::fmt()
        // `filter` decides; the builder's own default would stop at info.
        .with_max_level(LevelFilter::TRACE)
        .with_writer(writer)
        // Its fallback for a failed write is eprintln!, which panics on a closed stderr.
        .log_internal_errors(false)
        .with_target(false);
    let _ = match args.log_format {
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .finish()
            .with(filter)
            .try_init(),
        LogFormat::Text => builder
            .with_ansi(ansi)
            .event_format(SpansLast)
            .finish()
            .with(filter)
            .try_init(),
    };
}

/// The span of the run under way, kept here for the lines that are not written inside it: the
/// log writer's own warning, the last lines `main` prints once the run has returned. Each
/// line of a run carries its election and id, wherever it is written from.
static RUN: Mutex<Option<RunSpan>> = Mutex::new(None);

struct RunSpan {
    span: tracing::Span,
    /// Its fields as text lines end with them (tracing's default field format: `Debug`).
    text: String,
    /// Its fields as journal fields, as the journal layer names them.
    journal: Vec<(String, String)>,
}

/// Opens the span of a run: `election` and `id` on every line of it, from here and from
/// [`in_run`]. At error level, so that `-q` keeps them too.
pub fn run_span(election: &str, id: &str) -> tracing::Span {
    let span = tracing::error_span!(target: RUN_TARGET, "run", election, id);
    *RUN.lock().unwrap_or_else(|e| e.into_inner()) = Some(RunSpan {
        span: span.clone(),
        text: format!(" election={election:?} id={id:?}"),
        journal: vec![
            ("ELECTION".to_string(), election.to_string()),
            ("LEAD_EXEC_ID".to_string(), id.to_string()),
        ],
    });
    span.in_scope(say_unread_rust_log);
    span
}

/// Runs `f` (which logs) inside the run's span, if a run has opened one.
pub fn in_run<R>(f: impl FnOnce() -> R) -> R {
    let span = RUN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|r| r.span.clone());
    match span {
        Some(span) => span.in_scope(f),
        None => f(),
    }
}

/// The run's fields as a text line ends with them (empty before a run): for the lines
/// written without tracing.
pub fn run_fields_text() -> String {
    RUN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|r| r.text.clone())
        .unwrap_or_default()
}

/// Text lines as tracing's default format has them (time, level, message, fields), with the
/// fields of the event's spans after its own: `election=… id=…` from the run's span end every
/// line of a run, where lines had them before there was a span, and the line still starts
/// with what happened.
struct SpansLast;

impl<S, N> FormatEvent<S, N> for SpansLast
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        SystemTime.format_time(&mut writer)?;
        let level = *event.metadata().level();
        let name = format!("{:>5}", level.as_str());
        if writer.has_ansi_escapes() {
            let colour = match level {
                tracing::Level::ERROR => 31,
                tracing::Level::WARN => 33,
                tracing::Level::INFO => 32,
                tracing::Level::DEBUG => 34,
                tracing::Level::TRACE => 35,
            };
            write!(writer, " \x1b[{colour}m{name}\x1b[0m ")?;
        } else {
            write!(writer, " {name} ")?;
        }
        ctx.format_fields(writer.by_ref(), event)?;
        for fields in span_fields(ctx) {
            write!(writer, " {fields}")?;
        }
        writeln!(writer)
    }
}

/// JSON lines with the fields of the event and of its spans side by side at the top level:
/// `election` and `id`, which the run's span carries, sit beside `message` and `token` on every
/// line of a run, as log pipelines index them, not nested under a `span` object.
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut line = serde_json::Map::new();
        let mut at = String::new();
        SystemTime.format_time(&mut Writer::new(&mut at))?;
        line.insert("timestamp".into(), at.into());
        line.insert("level".into(), event.metadata().level().as_str().into());
        // Outermost span first: an inner one's field of the same name wins, as the event's
        // own fields win over every span's.
        for fields in span_fields(ctx) {
            if let Ok(serde_json::Value::Object(m)) = serde_json::from_str(&fields) {
                line.extend(m);
            }
        }
        event.record(&mut JsonVisitor(&mut line));
        writeln!(writer, "{}", serde_json::Value::Object(line))
    }
}

/// The fields of the event's spans as the field formatter wrote them, outermost span first.
fn span_fields<S, N>(ctx: &FmtContext<'_, S, N>) -> Vec<String>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let Some(scope) = ctx.event_scope() else {
        return Vec::new();
    };
    scope
        .from_root()
        .filter_map(|span| {
            let ext = span.extensions();
            let fields = ext.get::<FormattedFields<N>>()?;
            (!fields.is_empty()).then(|| fields.fields.clone())
        })
        .collect()
}

/// An event's fields as JSON values.
struct JsonVisitor<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Visit for JsonVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
}

impl Log {
    /// A queue with its writer thread, and no tracing: for the lines printed before logging
    /// is set up (a usage error).
    pub fn start() -> Log {
        Log::start_to(None)
    }

    /// A queue with its writer thread, writing to journald's socket when given one, else to
    /// stderr.
    fn start_to(journal: Option<UnixDatagram>) -> Log {
        let sink = Arc::new(Sink::new(journal));
        let theirs = sink.clone();
        let started = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || writer(&theirs));
        if let Err(e) = started {
            // Without the thread nothing drains the queue: lines are dropped, not written.
            write_stderr(
                format!("lead-exec: no log writer thread ({e}); logging off\n").as_bytes(),
            );
        }
        Log { sink }
    }

    /// Writes one line to stderr as the log does: queued, best effort. For the plain-text
    /// lines printed without tracing (a usage error, the final error).
    pub fn eprint_line(&self, line: &str) {
        if self.sink.journal.is_some() {
            // The run's fields, as every other entry of the run has them: `journalctl
            // ELECTION=…` finds the line that ended it.
            let fields = RUN
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|r| r.journal.clone())
                .unwrap_or_default();
            self.sink.push_entry(Entry::Journal {
                message: line.to_string(),
                level: tracing::Level::ERROR,
                fields,
            });
            return;
        }
        let mut bytes = text_line(line, false).into_owned().into_bytes();
        bytes.push(b'\n');
        self.sink.push(bytes);
    }

    /// Waits until every queued line is written, or [`FLUSH_LIMIT`] has passed.
    pub fn flush(&self) {
        self.sink.flush(FLUSH_LIMIT);
    }
}

/// The process is about to exit: what is queued goes first, within [`FLUSH_LIMIT`].
impl Drop for Log {
    fn drop(&mut self) {
        self.flush();
    }
}

/// `line` (without its newline) on one line: control characters escaped, but ESC kept when
/// `ansi` colours are on.
fn text_line(line: &str, ansi: bool) -> std::borrow::Cow<'_, str> {
    crate::text::escape_except(line, |c| ansi && c == '\u{1b}')
}

/// The tracing writer: each event is formatted into a buffer that goes to the queue whole.
struct ToQueue {
    sink: Arc<Sink>,
    /// Text format: keep each event on one line (`Some(ansi)`).
    one_line: Option<bool>,
}

impl<'a> MakeWriter<'a> for ToQueue {
    type Writer = LogLine<'a>;

    fn make_writer(&'a self) -> LogLine<'a> {
        LogLine {
            sink: &self.sink,
            buf: Vec::new(),
            one_line: self.one_line,
        }
    }
}

/// One event's line, queued whole when tracing is done formatting it.
struct LogLine<'a> {
    sink: &'a Sink,
    buf: Vec<u8>,
    one_line: Option<bool>,
}

impl std::io::Write for LogLine<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine<'_> {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.buf);
        if let Some(ansi) = self.one_line {
            let text = String::from_utf8_lossy(&buf);
            let body = text.strip_suffix('\n').unwrap_or(&text);
            if let std::borrow::Cow::Owned(mut line) = text_line(body, ansi) {
                line.push('\n');
                buf = line.into_bytes();
            }
        }
        if !buf.is_empty() {
            self.sink.push(buf);
        }
    }
}

/// What the writer thread writes: a line for stderr, or an entry for the journal.
#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Line(Vec<u8>),
    Journal {
        message: String,
        level: tracing::Level,
        fields: Vec<(String, String)>,
    },
}

impl Entry {
    /// About the bytes it takes.
    fn len(&self) -> usize {
        match self {
            Entry::Line(b) => b.len(),
            Entry::Journal {
                message, fields, ..
            } => {
                message.len()
                    + 40
                    + fields
                        .iter()
                        .map(|(k, v)| k.len() + v.len() + 2)
                        .sum::<usize>()
            }
        }
    }
}

impl From<Vec<u8>> for Entry {
    fn from(b: Vec<u8>) -> Entry {
        Entry::Line(b)
    }
}

/// Lines waiting for stderr; no I/O.
#[derive(Debug, Default)]
struct Queue {
    lines: VecDeque<Entry>,
    bytes: usize,
    /// Lines dropped since the writer last reported it.
    dropped: u64,
    /// The writer holds a line it has not finished writing.
    writing: bool,
}

impl Queue {
    /// Queues a line, or drops and counts it when `cap` bytes already wait.
    fn push(&mut self, line: Entry, cap: usize) -> bool {
        if self.bytes + line.len() > cap {
            self.dropped += 1;
            crate::metrics::log_line_dropped();
            return false;
        }
        self.bytes += line.len();
        self.lines.push_back(line);
        true
    }

    /// The next line to write, with the count of lines dropped before it, if any.
    fn pop(&mut self) -> Option<(Entry, u64)> {
        let line = self.lines.pop_front()?;
        self.bytes -= line.len();
        self.writing = true;
        Some((line, std::mem::take(&mut self.dropped)))
    }

    fn drained(&self) -> bool {
        self.lines.is_empty() && !self.writing
    }
}

struct Sink {
    queue: Mutex<Queue>,
    /// Signalled when a line is queued and when one is written.
    changed: Condvar,
    /// journald's socket, when entries go there instead of stderr.
    journal: Option<UnixDatagram>,
}

impl Sink {
    fn new(journal: Option<UnixDatagram>) -> Sink {
        Sink {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            journal,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A panic elsewhere while holding it cannot leave the queue inconsistent.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, line: Vec<u8>) {
        self.push_entry(Entry::Line(line));
    }

    fn push_entry(&self, line: Entry) {
        if self.lock().push(line, QUEUE_BYTES) {
            self.changed.notify_all();
        }
    }

    fn flush(&self, limit: Duration) {
        let end = Instant::now() + limit;
        let mut q = self.lock();
        while !q.drained() {
            let Some(left) = end.checked_duration_since(Instant::now()) else {
                return;
            };
            q = match self.changed.wait_timeout(q, left) {
                Ok((q, _)) => q,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

fn writer(sink: &Sink) {
    loop {
        let (line, dropped) = {
            let mut q = sink.lock();
            loop {
                if let Some(next) = q.pop() {
                    break next;
                }
                q = match sink.changed.wait(q) {
                    Ok(q) => q,
                    Err(e) => e.into_inner(),
                };
            }
        };
        match (&line, &sink.journal) {
            (Entry::Line(bytes), _) => write_stderr(bytes),
            (
                Entry::Journal {
                    message,
                    level,
                    fields,
                },
                Some(sock),
            ) => send_journal(sock, message, *level, fields),
            (Entry::Journal { .. }, None) => {}
        }
        if dropped > 0 {
            // Queued behind what is already waiting, in the log's own format, with the
            // run's fields like every other line of it.
            in_run(|| {
                tracing::warn!(
                    dropped,
                    "{dropped} log lines were dropped: the log was not being read"
                )
            });
        }
        sink.lock().writing = false;
        sink.changed.notify_all();
    }
}

/// One entry to journald, blocking this thread only. One too large for a datagram goes
/// again with its message cut. One journald does not take (its socket gone or refusing) goes
/// to stderr as a text line instead, which is journald's stream for this service too, and is
/// counted as dropped from the journal (the metric only: a warning would go the same way).
fn send_journal(
    sock: &UnixDatagram,
    message: &str,
    level: tracing::Level,
    fields: &[(String, String)],
) {
    let full = journal::entry(message, level, fields);
    loop {
        match sock.send(&full) {
            Ok(_) => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                let _ = sock.send(&journal::shortened(message, level, fields, 8192));
                return;
            }
            Err(_) => {
                crate::metrics::log_line_dropped();
                let line = format!("{level:>5} {message}");
                let mut bytes = text_line(&line, false).into_owned().into_bytes();
                bytes.push(b'\n');
                write_stderr(&bytes);
                return;
            }
        }
    }
}

/// One write of `buf` to fd 2, retried only when interrupted. Any failure (EPIPE from a
/// reader that is gone, EBADF, EIO) loses the line: there is nowhere else to report it.
/// Straight to the descriptor, not through `std::io::stderr()`, whose lock a blocked write
/// would hold against every other user of it (a panic message among them).
fn write_stderr(mut buf: &[u8]) {
    let stderr = std::io::stderr();
    let fd = stderr.as_fd();
    while !buf.is_empty() {
        match nix::unistd::write(fd, buf) {
            Ok(0) => return,
            Ok(n) => buf = &buf[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_sets_the_levels_and_one_it_cannot_read_leaves_the_flags_and_says_so() {
        use tracing::Level;
        let on = |t: &Targets, target: &str, level: Level| t.would_enable(target, &level);
        let (debug, warn, info) = (LevelFilter::DEBUG, LevelFilter::WARN, LevelFilter::INFO);
        for unset in [None, Some(""), Some(" , ,")] {
            let (t, warning) = filter(unset.map(Ok), debug, warn);
            assert!(warning.is_none(), "{unset:?}");
            assert!(on(&t, "lead_exec::run", Level::DEBUG), "{unset:?}");
            assert!(!on(&t, "lead_exec::run", Level::TRACE), "{unset:?}");
            assert!(on(&t, "h2::proto", Level::WARN), "{unset:?}");
            assert!(!on(&t, "h2::proto", Level::INFO), "{unset:?}");
        }
        // -vv: the libraries' debug lines too.
        let (t, _) = filter(None, debug, debug);
        assert!(on(&t, "h2::proto", Level::DEBUG));
        assert!(!on(&t, "h2::proto", Level::TRACE));
        let (t, warning) = filter(Some(Ok("error, h2=debug,")), info, warn);
        assert!(warning.is_none());
        assert!(on(&t, "h2::codec", Level::DEBUG));
        assert!(!on(&t, "lead_exec::run", Level::WARN));
        assert!(on(&t, "lead_exec::run", Level::ERROR));
        // Unknown levels, span and field filters (once taken for targets that match nothing,
        // which logged nothing at all), a target without its level, a space in a target.
        for unread in [
            "lead_exec=loud",
            "a=b=c",
            "lead_exec[run]=debug",
            "[run]",
            "lead_exec[{token}]=debug",
            "lead_exec=",
            "lead_exec =debug",
        ] {
            let (t, warning) = filter(Some(Ok(unread)), info, warn);
            assert!(on(&t, "lead_exec::run", Level::INFO), "{unread}");
            assert!(!on(&t, "lead_exec::run", Level::DEBUG), "{unread}");
            let warning = warning.unwrap_or_else(|| panic!("no warning for {unread}"));
            assert!(
                warning.starts_with(&format!("RUST_LOG={unread} ignored (")),
                "{warning}"
            );
        }
        // A RUST_LOG that does not reach lead-exec's own lines leaves them at the flags' level;
        // only an explicit off turns them off. The run's span and the exit line stay.
        for elsewhere in [
            "h2=debug",
            "warning",
            "lead-exec=debug",
            "LEAD_EXEC=debug",
            "h2=off",
        ] {
            let (t, warning) = filter(Some(Ok(elsewhere)), info, warn);
            assert!(warning.is_none(), "{elsewhere}");
            assert!(on(&t, "lead_exec::run", Level::INFO), "{elsewhere}");
            assert!(!on(&t, "lead_exec::run", Level::DEBUG), "{elsewhere}");
        }
        assert!(on(
            &filter(Some(Ok("h2=debug")), info, warn).0,
            "h2",
            Level::DEBUG
        ));
        let (t, _) = filter(Some(Ok("lead_exec::run=debug")), info, warn);
        assert!(on(&t, "lead_exec::run", Level::DEBUG));
        assert!(on(&t, "lead_exec::election", Level::INFO));
        for off in [
            "off",
            "0",
            "info,lead_exec=off",
            "lead_exec=OFF,h2=debug",
            "lead=00",
        ] {
            let (t, warning) = filter(Some(Ok(off)), info, warn);
            assert!(warning.is_none(), "{off}");
            assert!(!on(&t, "lead_exec::run", Level::ERROR), "{off}");
            assert!(on(&t, RUN_TARGET, Level::ERROR), "{off}");
            assert!(on(&t, EXIT_TARGET, Level::ERROR), "{off}");
        }
        let long = format!("lead_exec={}\n", "x".repeat(100));
        let warning = filter(Some(Ok(&long)), info, warn).1.unwrap();
        assert!(warning.contains("… (111 bytes)"), "{warning}");
        assert!(!warning.contains('\n'), "{warning}");
        use std::os::unix::ffi::OsStringExt;
        let bytes = std::ffi::OsString::from_vec(b"lead_exec=debug\xff".to_vec());
        let (t, warning) = filter(Some(Err(&bytes)), info, warn);
        assert!(!on(&t, "lead_exec::run", Level::DEBUG));
        let warning = warning.unwrap();
        assert!(warning.contains("ignored (not UTF-8)"), "{warning}");
    }

    #[test]
    fn a_full_queue_drops_and_counts_lines_then_reports_with_the_next() {
        let mut q = Queue::default();
        assert!(q.push(vec![b'a'; 6].into(), 10));
        assert!(!q.push(vec![b'b'; 6].into(), 10), "over the cap");
        assert!(
            !q.push(vec![b'c'; 11].into(), 10),
            "a line longer than the cap"
        );
        assert!(q.push(vec![b'd'; 4].into(), 10), "what still fits");
        assert_eq!(q.pop(), Some((vec![b'a'; 6].into(), 2)));
        assert!(!q.drained(), "a line is being written");
        q.writing = false;
        assert_eq!(q.pop(), Some((vec![b'd'; 4].into(), 0)));
        q.writing = false;
        assert!(q.drained());
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn text_lines_stay_on_one_line() {
        assert_eq!(text_line("a\nb", false), "a\\nb");
        assert_eq!(text_line("\u{1b}[2mx", true), "\u{1b}[2mx");
        assert_eq!(text_line("\u{1b}[2mx", false), "\\u{1b}[2mx");
    }
}
