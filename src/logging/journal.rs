//! Native journald logging, when stderr is journald's stream (`JOURNAL_STREAM`, see
//! systemd.exec(5)): each event goes to the journal's socket as one datagram of `KEY=VALUE`
//! lines, with a priority from its level and the run's fields as journal fields (`ELECTION=`,
//! `LEAD_EXEC_ID=`, `TOKEN=`), so that `journalctl -p warning` and
//! `journalctl ELECTION=ingest` find lead-exec's lines. The datagrams go through the log's
//! queue and its writer thread like stderr lines do (see [`super`]): a journald that stalls
//! delays that thread only, never a lease renewal.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::Arc;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::Sink;

/// journald's socket for the native protocol.
pub const SOCKET: &str = "/run/systemd/journal/socket";

/// Whether fd 2 is the stream `JOURNAL_STREAM` names (`DEV:INODE`): stderr goes to journald,
/// not to a file or a terminal the variable was inherited past.
pub fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(std::io::stderr().as_raw_fd()) else {
        return false;
    };
    is_stream(&stream.to_string_lossy(), st.st_dev, st.st_ino)
}

/// Whether `DEV:INODE` names the file with this device and inode.
fn is_stream(var: &str, dev: u64, ino: u64) -> bool {
    var.split_once(':').is_some_and(|(d, i)| {
        d.parse::<u64>().is_ok_and(|d| d == dev) && i.parse::<u64>().is_ok_and(|i| i == ino)
    })
}

/// A socket connected to journald's, or `None` when it cannot be reached (then stderr stays).
pub fn connect(path: &Path) -> Option<UnixDatagram> {
    let sock = UnixDatagram::unbound().ok()?;
    sock.connect(path).ok()?;
    Some(sock)
}

/// syslog's priority for a level: err, warning, info, debug.
pub fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// The journal field for a tracing field. The run's names are the ones the documentation
/// gives; every other field gets lead-exec's prefix, so that none can pass for one of
/// journald's own (`PRIORITY`, a `--priority` value, must not).
pub fn field_name(name: &str) -> String {
    match name {
        "election" => "ELECTION".into(),
        "id" => "LEAD_EXEC_ID".into(),
        "token" => "TOKEN".into(),
        _ => {
            let upper: String = name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect();
            format!("LEAD_EXEC_{upper}")
        }
    }
}

/// Appends `KEY=VALUE\n`, the value kept to one line (control characters escaped), so that
/// the simple form of the protocol always applies.
fn push_field(out: &mut String, key: &str, value: &str) {
    out.push_str(key);
    out.push('=');
    out.push_str(&super::text_line(value, false));
    out.push('\n');
}

/// One entry: the message, its priority and fields, in the native protocol.
pub fn entry(message: &str, level: Level, fields: &[(String, String)]) -> Vec<u8> {
    let mut out = String::new();
    push_field(&mut out, "MESSAGE", message);
    push_field(&mut out, "PRIORITY", &priority(level).to_string());
    push_field(&mut out, "SYSLOG_IDENTIFIER", "lead-exec");
    for (k, v) in fields {
        push_field(&mut out, k, v);
    }
    out.into_bytes()
}

/// The same entry with its message cut to `keep` bytes, for one too large for a datagram.
pub fn shortened(message: &str, level: Level, fields: &[(String, String)], keep: usize) -> Vec<u8> {
    let mut end = keep.min(message.len());
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    entry(&format!("{}… (cut)", &message[..end]), level, fields)
}

/// A span's or an event's fields: as text for the message (`name=value`, as the text format
/// writes them) and as journal fields.
#[derive(Default)]
struct Fields {
    message: String,
    text: String,
    journal: Vec<(String, String)>,
}

impl Fields {
    fn add(&mut self, field: &Field, text: String, raw: String) {
        if field.name() == "message" {
            self.message = raw;
            return;
        }
        self.text.push_str(&format!(" {}={text}", field.name()));
        self.journal.push((field_name(field.name()), raw));
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        self.add(field, v.clone(), v);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.add(field, format!("{value:?}"), value.to_string());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.add(field, value.to_string(), value.to_string());
    }
}

/// The tracing layer that queues each event as a journal entry.
pub struct JournalLayer {
    pub(super) sink: Arc<Sink>,
}

impl<S> Layer<S> for JournalLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut own = Fields::default();
        event.record(&mut own);
        // The message as the text format has it, without time and level (journald has
        // both): the event's fields, then its spans' (outermost first).
        let mut message = own.message.clone();
        message.push_str(&own.text);
        let mut fields = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<Fields>() {
                    message.push_str(&f.text);
                    fields.extend(f.journal.iter().cloned());
                }
            }
        }
        // The event's own win over a span's of the same name: journald keeps both values,
        // and a reader takes the first, so they go first.
        let mut all = own.journal;
        all.extend(fields);
        let level = *event.metadata().level();
        self.sink.push_entry(super::Entry::Journal {
            message,
            level,
            fields: all,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_names_device_and_inode() {
        assert!(is_stream("64768:1234", 64768, 1234));
        assert!(!is_stream("64768:1234", 64768, 1235));
        assert!(!is_stream("64768", 64768, 1234));
        assert!(!is_stream("x:1234", 0, 1234));
    }

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(priority(Level::ERROR), 3);
        assert_eq!(priority(Level::WARN), 4);
        assert_eq!(priority(Level::INFO), 6);
        assert_eq!(priority(Level::DEBUG), 7);
        assert_eq!(priority(Level::TRACE), 7);
    }

    #[test]
    fn run_fields_keep_their_names_and_others_get_the_prefix() {
        assert_eq!(field_name("election"), "ELECTION");
        assert_eq!(field_name("id"), "LEAD_EXEC_ID");
        assert_eq!(field_name("token"), "TOKEN");
        assert_eq!(field_name("priority"), "LEAD_EXEC_PRIORITY");
        assert_eq!(field_name("slack_ms"), "LEAD_EXEC_SLACK_MS");
    }

    #[test]
    fn an_entry_is_one_line_per_field_whatever_the_values() {
        let e = entry("a\nb", Level::WARN, &[("ELECTION".into(), "x\ny".into())]);
        assert_eq!(
            String::from_utf8(e).unwrap(),
            "MESSAGE=a\\nb\nPRIORITY=4\nSYSLOG_IDENTIFIER=lead-exec\nELECTION=x\\ny\n"
        );
        let cut = String::from_utf8(shortened("héllo", Level::INFO, &[], 2)).unwrap();
        assert!(cut.starts_with("MESSAGE=h… (cut)\n"), "{cut}");
    }
}
