//! `lead-exec status`: who leads, with which token, who waits, whether paused, recent terms.
//!
//! Exit 0 when a leader runs the job, [`Exit::NoLeader`] when none does (no candidate, or
//! paused), [`Exit::Unavailable`] when etcd cannot say.

use anyhow::Result;
use serde_json::json;

use super::{fmt_ms, Ctx};
use crate::cli::{Output, StatusArgs};
use crate::config::RunConfig;
use crate::exit::Exit;
use crate::records::history;

/// Names who holds the election, for a `run` that gave up (`--no-wait`, `--wait`). A warning,
/// so that `-q` keeps it: a cron mail should say who ran instead.
pub async fn report_not_acquired(cfg: &RunConfig) {
    let name = cfg.election.name();
    let who = async {
        let ctx = Ctx::open(&cfg.conn, cfg.election.clone()).await?;
        let (entries, _) = ctx.candidates().await?;
        let paused = ctx.paused().await?;
        anyhow::Ok(match (super::leader(&entries, paused.as_ref()), &paused) {
            (Some(l), _) => format!(
                "{name} is led by {} (host {}, pid {}, token {})",
                l.candidate.id, l.candidate.host, l.candidate.pid, l.token
            ),
            (None, Some(p)) => format!("{name} is paused by {}: {}", p.by, p.reason),
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
    let (entries, _) = ctx.candidates().await?;
    let paused = ctx.paused().await?;
    let recent = history::read(&ctx.client, &ctx.election, 5, ctx.timeout).await?;
    let leader = super::leader(&entries, paused.as_ref());
    let ttl_left = match leader {
        Some(l) if l.lease != 0 => {
            let mut c = ctx.client.clone();
            crate::etcd::bounded(ctx.timeout, "etcd", c.lease_time_to_live(l.lease, None))
                .await
                .ok()
                .map(|r| r.ttl())
        }
        _ => None,
    };
    let since = leader.and_then(|l| {
        recent
            .iter()
            .find(|r| r.token == l.token)
            .map(|r| r.started_ms)
    });
    let leading = leader.is_some();
    match a.output {
        Output::Json => {
            let v = json!({
                "election": ctx.election.name(),
                "leader": leader.map(|l| json!({
                    "id": l.candidate.id, "host": l.candidate.host, "pid": l.candidate.pid,
                    "token": l.token, "key": l.key, "since_ms": since, "lease_ttl_left_s": ttl_left,
                    "priority": l.candidate.priority, "takeover_until_ms": takeover_due(&l.candidate),
                })),
                "waiting": entries.iter().skip(if leading { 1 } else { 0 }).collect::<Vec<_>>(),
                "paused": paused,
                "recent_terms": recent,
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Output::Text => {
            println!("election:  {}", ctx.election.name());
            match leader {
                Some(l) => {
                    println!(
                        "leader:    {} (host {}, pid {}{}), token {}",
                        l.candidate.id,
                        l.candidate.host,
                        l.candidate.pid,
                        priority_text(&l.candidate),
                        l.token
                    );
                    if let Some(s) = since {
                        println!("since:     {}", fmt_ms(s));
                    }
                    if let Some(t) = ttl_left {
                        println!("lease:     {t}s left");
                    }
                    if let Some(due) = takeover_due(&l.candidate) {
                        println!(
                            "job:       not started: takeover delay after an unclean end, until {}",
                            fmt_ms(due)
                        );
                    }
                }
                None => println!("leader:    none"),
            }
            if let Some(p) = &paused {
                println!(
                    "paused:    yes, since {} by {}: {}",
                    fmt_ms(p.since_ms),
                    p.by,
                    p.reason
                );
            } else {
                println!("paused:    no");
            }
            let waiting: Vec<_> = entries.iter().skip(if leading { 1 } else { 0 }).collect();
            println!("waiting:   {}", waiting.len());
            for (i, w) in waiting.iter().enumerate() {
                println!(
                    "  {}. {} (host {}, pid {}{})",
                    i + 1,
                    w.candidate.id,
                    w.candidate.host,
                    w.candidate.pid,
                    priority_text(&w.candidate)
                );
            }
            if !recent.is_empty() {
                println!("recent terms:");
                for r in recent.iter().rev() {
                    println!(
                        "  token {:<8} {:<24} {} .. {}  {}",
                        r.token,
                        r.id,
                        fmt_ms(r.started_ms),
                        r.ended_ms.map(fmt_ms).unwrap_or_else(|| "now".into()),
                        r.end.as_deref().unwrap_or("running")
                    );
                }
            }
        }
    }
    Ok(if leading { Exit::Ok } else { Exit::NoLeader })
}
