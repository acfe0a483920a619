//! The summary at the end, and the checks it makes.

use std::process::ExitStatus;

use anyhow::{ensure, Result};

use crate::narrate::{banner, secs};
use crate::steps::Outcome;
use crate::workers::Monitor;
use crate::{TTL, WORKERS};
pub(crate) fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => format!("{s}"),
    }
}

pub(crate) fn row(label: &str, value: String) {
    println!("  {label:<32} {value}");
}

pub(crate) fn summary(mon: &Monitor, o: &Outcome) -> Result<()> {
    let terms = mon.terms();
    let increasing = terms.windows(2).all(|w| w[1].1 > w[0].1);
    let listed: Vec<String> = terms
        .iter()
        .map(|(w, t)| format!("{} token {t}", WORKERS[*w]))
        .collect();
    let (c, h) = (&o.crash, &o.handover);
    banner(7, "summary");
    row("terms, in order:", listed.join(" -> "));
    row(
        "tokens grew with every term:",
        if increasing { "yes" } else { "NO" }.to_string(),
    );
    row(
        "failover after kill -9:",
        format!(
            "{} ({} -> {}; lease TTL {TTL})",
            secs(c.failover),
            WORKERS[c.victim.worker],
            WORKERS[c.next.worker]
        ),
    );
    row(
        "old job stopped after kill -9:",
        format!(
            "{} ms (lines from it afterwards: {})",
            c.group_gone.as_millis(),
            c.late_lines
        ),
    );
    row(
        "handover after SIGTERM:",
        format!(
            "{} ({} -> {}; {}'s lead-exec: {})",
            secs(h.took),
            WORKERS[h.from.worker],
            WORKERS[h.next.worker],
            WORKERS[h.from.worker],
            describe(h.exit)
        ),
    );
    row(
        "stale writes rejected:",
        format!(
            "1 (the first term's token {}; the ledger said \"{}\")",
            o.stale.token, o.stale.message
        ),
    );
    row(
        "tick retried on another worker:",
        format!(
            "{} attempts; exits {}",
            o.retry.attempts.len(),
            o.retry
                .exits
                .iter()
                .map(|(w, c)| format!("{w} {}", c.map_or("-".into(), |c| c.to_string())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    row(
        "accepted tokens ever decreased:",
        format!(
            "{} (ledger check: {})",
            if o.check_ok { "no" } else { "YES" },
            o.check_text
        ),
    );
    ensure!(increasing, "tokens did not grow with every term");
    ensure!(
        o.check_ok,
        "the ledger saw a token decrease: {}",
        o.check_text
    );
    println!();
    println!("lead-exec demo: done.");
    Ok(())
}
