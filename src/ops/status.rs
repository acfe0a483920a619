//! `lead-exec status`: who leads, with which token, who waits, whether paused, recent terms.
//! With `--slots` above 1: every holder, with its token and slot.
//!
//! Exit 0 when a leader runs the job, [`Exit::NoLeader`] when none does (no candidate, or
//! paused), [`Exit::Unavailable`] when etcd cannot say.

use anyhow::Result;
use serde_json::json;

use super::check::slot_name;
use super::{fmt_ms, Ctx, Entry};
use crate::cli::{Output, StatusArgs};
use crate::config::RunConfig;
use crate::exit::Exit;
use crate::records::history;
use crate::text::escape;

/// Names who holds the election, for a `run` that gave up (`--no-wait`, `--wait`), or says
/// that this worker's own health check kept it out (`unhealthy`). A warning, so that `-q`
/// keeps it: a cron mail should say who ran instead, or why nobody here did.
pub async fn report_not_acquired(cfg: &RunConfig, unhealthy: bool) {
    let name = cfg.election.name();
    if unhealthy {
        tracing::warn!(
            election = name,
            "not acquired: the health check is failing, so this worker did not campaign for {name}"
        );
        return;
    }
    let who = async {
        let ctx = Ctx::open(&cfg.conn, cfg.election.clone()).await?;
        let line = ctx.holders().await?;
        let holders = line.holders();
        anyhow::Ok(match (holders.first(), &line.paused) {
            (Some(_), _) if line.slots > 1 => {
                let who: Vec<String> = holders
                    .iter()
                    .map(|h| format!("{} (token {})", escape(&h.candidate.id), h.token))
                    .collect();
                format!(
                    "{name}'s {} slots are held by {}",
                    line.slots,
                    who.join(", ")
                )
            }
            (Some(l), _) => format!(
                "{name} is led by {} (host {}, pid {}, token {})",
                escape(&l.candidate.id),
                escape(&l.candidate.host),
                l.candidate.pid,
                l.token
            ),
            (None, Some(p)) => format!(
                "{name} is paused by {}: {}",
                escape(&p.by),
                escape(&p.reason)
            ),
            (None, None) => format!("{name} had another leader, whose term has ended since"),
        })
    };
    match who.await {
        Ok(who) => tracing::warn!(election = name, "not acquired: {who}"),
        Err(e) => tracing::warn!(
            election = name,
            "not acquired: another candidate leads {name} ({e:#})"
        ),
    }
}

fn priority_text(c: &crate::election::Candidate) -> String {
    match c.priority {
        0 => String::new(),
        p => format!(", priority {p}"),
    }
}

/// When a leader still waiting out `--takeover-delay` starts its job.
fn takeover_due(c: &crate::election::Candidate) -> Option<u64> {
    c.takeover_until_ms
        .filter(|due| *due > crate::election::unix_ms())
}

pub async fn run(a: StatusArgs) -> Result<Exit> {
    let ctx = Ctx::connect(&a.election).await?;
    let line = ctx.holders().await?;
    let recent = history::read(&ctx.client, &ctx.election, 5, ctx.timeout).await?;
    let mut holders = Vec::new();
    for h in line.holders() {
        let ttl_left = match h.lease {
            0 => None,
            lease => {
                let mut c = ctx.client.clone();
                crate::etcd::bounded(ctx.timeout, "etcd", c.lease_time_to_live(lease, None))
                    .await
                    .ok()
                    .map(|r| r.ttl())
            }
        };
        let since = recent
            .iter()
            .find(|r| r.token == h.token)
            .map(|r| r.started_ms);
        holders.push((h, since, ttl_left));
    }
    let view = |(h, since, ttl): &(&Entry, Option<u64>, Option<i64>)| {
        json!({
            "id": h.candidate.id, "host": h.candidate.host, "pid": h.candidate.pid,
            "token": h.token, "key": h.key, "slot": h.slot, "since_ms": since,
            "lease_ttl_left_s": ttl, "priority": h.candidate.priority,
            "takeover_until_ms": takeover_due(&h.candidate),
        })
    };
    let paused = &line.paused;
    match a.output {
        Output::Json => {
            let v = json!({
                "election": ctx.election.name(),
                "slots": line.slots,
                "leader": holders.first().map(view),
                "holders": holders.iter().map(view).collect::<Vec<_>>(),
                "waiting": line.waiting(),
                "paused": paused,
                "recent_terms": recent,
            });
            outln!("{}", serde_json::to_string_pretty(&v)?);
        }
        Output::Text => {
            outln!("election:  {}", ctx.election.name());
            if line.slots > 1 {
                outln!("slots:     {}", line.slots);
                outln!("holders:   {}", holders.len());
            }
            for (h, since, ttl) in &holders {
                if line.slots > 1 {
                    out!("  slot {}: ", slot_name(h.slot));
                } else {
                    out!("leader:    ");
                }
                outln!(
                    "{} (host {}, pid {}{}), token {}",
                    escape(&h.candidate.id),
                    escape(&h.candidate.host),
                    h.candidate.pid,
                    priority_text(&h.candidate),
                    h.token
                );
                let indent = if line.slots > 1 { "    " } else { "" };
                if let Some(s) = since {
                    outln!("{indent}since:     {}", fmt_ms(*s));
                }
                if let Some(t) = ttl {
                    outln!("{indent}lease:     {t}s left");
                }
                if let Some(due) = takeover_due(&h.candidate) {
                    outln!(
                        "{indent}job:       not started: takeover delay after an unclean end, until {}",
                        fmt_ms(due)
                    );
                }
            }
            if holders.is_empty() && line.slots == 1 {
                outln!("leader:    none");
            }
            if let Some(p) = paused {
                outln!(
                    "paused:    yes, since {} by {}: {}",
                    fmt_ms(p.since_ms),
                    escape(&p.by),
                    escape(&p.reason)
                );
            } else {
                outln!("paused:    no");
            }
            let waiting = line.waiting();
            outln!("waiting:   {}", waiting.len());
            for (i, w) in waiting.iter().enumerate() {
                outln!(
                    "  {}. {} (host {}, pid {}{})",
                    i + 1,
                    escape(&w.candidate.id),
                    escape(&w.candidate.host),
                    w.candidate.pid,
                    priority_text(&w.candidate)
                );
            }
            if !recent.is_empty() {
                outln!("recent terms:");
                for r in recent.iter().rev() {
                    outln!(
                        "  token {:<8} {:<24} {} .. {}  {}",
                        r.token,
                        escape(&r.id),
                        fmt_ms(r.started_ms),
                        r.ended_ms.map(fmt_ms).unwrap_or_else(|| "now".into()),
                        escape(&super::history::end_text(r))
                    );
                }
            }
        }
    }
    Ok(if holders.is_empty() {
        Exit::NoLeader
    } else {
        Exit::Ok
    })
}
