//! `lead-exec status`: who leads, with which token, who waits, who is out of line for a
//! failing health check, whether paused, recent terms.
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
use crate::text::escape;

/// Names who holds the election, for a `run` that gave up (`--no-wait`, `--wait`), or says
/// that this worker's own health check kept it out (`unhealthy`). A warning, so that `-q`
/// keeps it: a cron mail should say who ran instead, or why nobody here did.
pub async fn report_not_acquired(cfg: &RunConfig, unhealthy: bool) {
    let name = cfg.election.name();
    if unhealthy {
        tracing::warn!(
            "not acquired: the health check is failing, so this worker did not campaign for {name}"
        );
        return;
    }
    // A lost race is the expected outcome of a cron tick on every worker but one: below the
    // default level, and not worth a round trip to etcd when nobody will read the line.
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let who = async {
        let ctx = Ctx::connect(&cfg.conn, cfg.election.clone()).await?;
        let line = ctx.holders().await?;
        let holders = line.holders();
        anyhow::Ok(match (holders.first(), &line.paused) {
            (_, None) if line.slots > 1 && !(holders.is_empty() && line.draining.is_empty()) => {
                let who: Vec<String> = holders
                    .iter()
                    .map(|h| format!("{} (token {})", escape(&h.candidate.id), h.token))
                    .chain(line.draining.iter().map(|d| {
                        format!(
                            "a draining job whose key is gone (token {}, slot {})",
                            d.token, d.slot
                        )
                    }))
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
        Ok(who) => tracing::debug!("not acquired: {who}"),
        Err(e) => tracing::debug!("not acquired: another candidate leads {name} ({e:#})"),
    }
}

fn priority_text(c: &crate::election::Candidate) -> String {
    match c.priority {
        0 => String::new(),
        p => format!(", priority {p}"),
    }
}

/// A pending resign request: from `lead-exec resign`, or from a waiting candidate of higher
/// `--priority` (then `by` and `priority` are set).
struct Request {
    token: i64,
    by: Option<String>,
    priority: Option<u32>,
}

/// The pending resign request, if any (see [`crate::election::leader::preempt_request`]).
async fn handover_request(ctx: &Ctx) -> Result<Option<Request>> {
    let mut c = ctx.client.clone();
    let key = ctx.election.resign_key();
    let resp = ctx.bounded(c.get(key, None)).await?;
    Ok(resp.kvs().first().and_then(|kv| {
        let v = std::str::from_utf8(kv.value()).ok()?;
        let mut w = v.split_whitespace();
        let token = w.next()?.parse().ok()?;
        let (mut by, mut priority) = (None, None);
        if w.next() == Some("preempt") && w.next() == Some("priority") {
            priority = w.next().and_then(|p| p.parse().ok());
            if w.next() == Some("by") {
                by = Some(w.collect::<Vec<_>>().join(" "));
            }
        }
        Some(Request {
            token,
            by,
            priority,
        })
    }))
}

/// When a leader still waiting out `--takeover-delay` starts its job.
fn takeover_due(c: &crate::election::Candidate) -> Option<u64> {
    c.takeover_until_ms
        .filter(|due| *due > crate::election::unix_ms())
}

/// A holder as `status` shows it: with when its term started and its `--timeout`, from its
/// history record, and what is left of its lease.
struct Holder<'a> {
    entry: &'a Entry,
    since: Option<u64>,
    timeout: Option<u64>,
    ttl_left: Option<i64>,
    /// Whether the job runs in a cgroup of its own, when its record says.
    job_cgroup: Option<bool>,
}

/// What etcd says of the election, read once: the I/O of `status`.
struct Gathered {
    election: String,
    line: super::Holders,
    recent: Vec<crate::records::history::Record>,
    unhealthy: Vec<crate::records::unhealthy::Unhealthy>,
    request: Option<Request>,
    /// What is left of each holder's lease, in the order of `line.holders()`.
    ttl_left: Vec<Option<i64>>,
}

async fn gather(ctx: &Ctx) -> Result<Gathered> {
    let line = ctx.holders().await?;
    let recent = ctx.history(Some(5)).await?;
    let unhealthy = ctx.unhealthy().await?;
    let request = handover_request(ctx).await?;
    let mut ttl_left = Vec::new();
    for h in line.holders() {
        ttl_left.push(match h.lease {
            0 => None,
            lease => {
                let mut c = ctx.client.clone();
                ctx.bounded(c.lease_time_to_live(lease, None))
                    .await
                    .ok()
                    .map(|r| r.ttl())
            }
        });
    }
    Ok(Gathered {
        election: ctx.election.name().to_string(),
        line,
        recent,
        unhealthy,
        request,
        ttl_left,
    })
}

/// The election as `status` shows it, judged from what was read: pure.
struct View<'a> {
    g: &'a Gathered,
    holders: Vec<Holder<'a>>,
    /// A pending handover, if it still stands.
    request: Option<&'a Request>,
    /// Terms whose key is still in line but no longer holds (a pause took the job away) and
    /// whose record is open: their jobs are being stopped. They are not waiting in line.
    stopping: Vec<&'a crate::records::history::Record>,
    waiting: Vec<&'a Entry>,
}

fn view(g: &Gathered) -> View<'_> {
    let line = &g.line;
    // A request from a higher-priority candidate lapses with it: the leader hands over only
    // if such a candidate is still in line once its --min-term is over, and keeps the term
    // (the request left in place) otherwise. A requester that crashed or gave up is no
    // pending handover.
    let request = g.request.as_ref().filter(|r| {
        r.priority.is_none()
            || line.holders().iter().any(|h| {
                h.token == r.token
                    && line
                        .waiting()
                        .iter()
                        .any(|w| w.candidate.priority > h.candidate.priority)
            })
    });
    let holders: Vec<Holder> = line
        .holders()
        .iter()
        .zip(&g.ttl_left)
        .map(|(h, ttl_left)| {
            let record = g.recent.iter().find(|r| r.token == h.token);
            Holder {
                entry: h,
                since: record.map(|r| r.started_ms),
                timeout: record.and_then(|r| r.timeout_ms),
                ttl_left: *ttl_left,
                job_cgroup: record.and_then(|r| r.job_cgroup),
            }
        })
        .collect();
    let stopping: Vec<&crate::records::history::Record> = g
        .recent
        .iter()
        .filter(|r| {
            r.end.is_none()
                && !holders.iter().any(|h| h.entry.token == r.token)
                && line.waiting().iter().any(|w| w.token == r.token)
        })
        .collect();
    let waiting: Vec<&Entry> = line
        .waiting()
        .iter()
        .filter(|w| !stopping.iter().any(|r| r.token == w.token))
        .collect();
    View {
        g,
        holders,
        request,
        stopping,
        waiting,
    }
}

pub async fn run(a: StatusArgs) -> Result<Exit> {
    let ctx = Ctx::from_args(&a.election).await?;
    let gathered = gather(&ctx).await?;
    let v = view(&gathered);
    match a.output {
        Output::Json => render_json(&v)?,
        Output::Text => render_text(&v)?,
    }
    Ok(if v.holders.is_empty() {
        Exit::NoLeader
    } else {
        Exit::Ok
    })
}

/// A holder in JSON.
fn holder_json(h: &Holder, request: Option<&Request>) -> serde_json::Value {
    let Holder {
        entry: h,
        since,
        timeout,
        ttl_left,
        job_cgroup,
    } = h;
    json!({
        "id": h.candidate.id, "host": h.candidate.host, "pid": h.candidate.pid,
        "token": h.token, "key": h.key, "slot": h.slot, "since_ms": since,
        "lease_ttl_left_s": ttl_left, "priority": h.candidate.priority,
        "takeover_until_ms": takeover_due(&h.candidate),
        "job_cgroup": job_cgroup,
        "timeout_ms": timeout,
        "handover_requested": request.filter(|r| r.token == h.token).map(|r| json!({
            "by": r.by, "priority": r.priority,
        })),
        "timeout_at_ms": since.zip(*timeout).map(|(s, t)| s + t),
    })
}

fn render_json(v: &View) -> Result<()> {
    let view = |h: &Holder| holder_json(h, v.request);
    let (g, line) = (v.g, &v.g.line);
    let paused = &line.paused;
    let out = json!({
        "election": g.election,
        "slots": line.slots,
        "leader": v.holders.first().map(view),
        "holders": v.holders.iter().map(view).collect::<Vec<_>>(),
        "waiting": v.waiting,
        "draining": line.draining,
        "stopping": v.stopping.iter().map(|r| json!({
            "id": r.id, "host": r.host, "pid": r.pid, "token": r.token,
            "since_ms": r.started_ms,
        })).collect::<Vec<_>>(),
        "unhealthy": g.unhealthy,
        // A bool, as `watch -o json` has it; who paused, why and since when apart.
        "paused": paused.is_some(),
        "pause": paused,
        "recent_terms": g.recent,
    });
    outln!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn render_text(v: &View) -> Result<()> {
    let View {
        g,
        holders,
        request,
        stopping,
        waiting,
    } = v;
    let (line, recent, unhealthy) = (&g.line, &g.recent, &g.unhealthy);
    let paused = &line.paused;
    outln!("election:  {}", g.election);
    if line.slots > 1 {
        outln!("slots:     {}", line.slots);
        outln!("holders:   {}", holders.len());
    }
    for Holder {
        entry: h,
        since,
        timeout,
        ttl_left: ttl,
        job_cgroup: cgroup,
    } in holders
    {
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
        if *cgroup == Some(false) {
            outln!("{indent}job:       no cgroup (process group and tree)");
        }
        if let (Some(s), Some(t)) = (since, timeout) {
            outln!(
                "{indent}timeout:   {}, stops the job at {}",
                crate::clock::human(std::time::Duration::from_millis(*t)),
                fmt_ms(s + t)
            );
        }
        if let Some(r) = request.filter(|r| r.token == h.token) {
            match (&r.by, r.priority) {
                        (Some(by), Some(p)) => outln!(
                            "{indent}handover:  requested by {} (priority {p}); once this term's --min-term is over",
                            escape(by)
                        ),
                        _ => outln!("{indent}handover:  resign requested"),
                    };
        }
        if let Some(due) = takeover_due(&h.candidate) {
            outln!(
                "{indent}job:       not started: takeover delay after an unclean end, until {}",
                fmt_ms(due)
            );
        }
    }
    for d in &line.draining {
        outln!(
                    "  slot {}: a draining job, token {} (its key is gone; the slot frees when the job ends)",
                    d.slot, d.token
                );
    }
    let unknown = line.entries.is_empty()
        && recent.is_empty()
        && paused.is_none()
        && unhealthy.is_empty()
        && line.draining.is_empty();
    if unknown {
        // A misspelled name reads like an election without a leader: say which.
        outln!("leader:    none (no candidates and no recorded terms: none has run yet, or the name is misspelled)");
    } else if holders.is_empty() && line.slots == 1 {
        outln!("leader:    none");
    }
    for r in stopping {
        outln!(
            "stopping:  {} (host {}, pid {}), token {}: its job is being stopped",
            escape(&r.id),
            escape(&r.host),
            r.pid,
            r.token
        );
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
    if !unhealthy.is_empty() {
        outln!(
            "unhealthy: {} (out of line until their health check passes)",
            unhealthy.len()
        );
        for u in unhealthy.iter() {
            outln!(
                "  - {} (host {}, pid {}), since {}",
                escape(&u.candidate.id),
                escape(&u.candidate.host),
                u.candidate.pid,
                fmt_ms(u.unhealthy_since_ms)
            );
        }
    }
    if !recent.is_empty() {
        outln!("recent terms:");
        for r in recent.iter().rev() {
            outln!(
                "  token {:<8} {:<24} {} .. {}  {}",
                r.token,
                escape(&r.id),
                fmt_ms(r.started_ms),
                super::history::ended_text(r).unwrap_or_else(|| "now".into()),
                escape(&super::history::end_text(r))
            );
        }
    }
    Ok(())
}
