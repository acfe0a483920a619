//! `lead-exec history`: the audit record of terms, oldest first.

use anyhow::Result;

use super::{fmt_ms, Ctx};
use crate::cli::{HistoryArgs, HistoryCount, Output};
use crate::exit::Exit;
use crate::records::history;
use crate::text::escape;

pub async fn run(a: HistoryArgs) -> Result<Exit> {
    let ctx = Ctx::from_args(&a.election).await?;
    let recs = match a.count {
        // etcd reads a limit of 0 as none at all.
        HistoryCount::Last(0) => Vec::new(),
        HistoryCount::Last(n) => ctx.history(Some(n)).await?,
        HistoryCount::All => ctx.history(None).await?,
    };
    if recs.is_empty() && a.count != HistoryCount::Last(0) {
        // A misspelled name reads like an election that never ran: say which it could be.
        tracing::warn!(
            "no terms recorded for election {}: none has run yet, or the name is misspelled",
            ctx.election.name()
        );
    }
    match a.output {
        // One document, as `status -o json` prints: an array, oldest first, `[]` when empty.
        Output::Json => {
            outln!("{}", serde_json::to_string(&recs)?);
        }
        Output::Text => {
            outln!(
                "{:<10} {:<24} {:<20} {:<8} {:<20} {:<20} {:<20} END",
                "TOKEN",
                "ID",
                "HOST",
                "PID",
                "STARTED",
                "ENDED",
                "RUN"
            );
            for r in &recs {
                outln!(
                    "{:<10} {:<24} {:<20} {:<8} {:<20} {:<20} {:<20} {}",
                    r.token,
                    escape(&r.id),
                    escape(&r.host),
                    r.pid,
                    fmt_ms(r.started_ms),
                    ended_text(r).unwrap_or_else(|| "-".into()),
                    escape(&run_text(r)),
                    escape(&end_text(r))
                );
            }
        }
    }
    Ok(Exit::Ok)
}

/// The run key a term ran for, with its attempt under `--attempts` (`20261206T0100Z #2`).
pub fn run_text(r: &history::Record) -> String {
    match (&r.run_key, r.attempt) {
        (Some(k), Some(n)) => format!("{k} #{n}"),
        (Some(k), None) => k.clone(),
        (None, _) => "-".into(),
    }
}

/// When a term ended, or the bound before which it did when nobody saw it end.
pub fn ended_text(r: &history::Record) -> Option<String> {
    r.ended_ms
        .map(fmt_ms)
        .or_else(|| r.ended_before_ms.map(|t| format!("before {}", fmt_ms(t))))
}

/// How a term ended, marked when unclean (what `--takeover-delay` waits after).
pub fn end_text(r: &history::Record) -> String {
    if let (Some("preempted"), Some(p)) = (r.end.as_deref(), &r.preempted_by) {
        return format!("preempted by {} (priority {})", p.id, p.priority);
    }
    match r.end.as_deref() {
        None => "running".into(),
        Some(e) if r.ended_cleanly() => e.into(),
        Some(e) => format!("{e} (unclean)"),
    }
}
