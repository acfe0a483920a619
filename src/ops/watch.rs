//! `lead-exec watch`: one line per leader change (with `--slots`, per change of the holders
//! or their slots), until interrupted.
//!
//! Every wake-up (an event, or a reconnect after the watch broke) re-reads the line of
//! candidates, so a change that happened while disconnected is still printed.

use std::time::Duration;

use anyhow::Result;
use etcd_client::WatchOptions;
use serde_json::json;

use super::{Ctx, Entry, Reader};
use crate::cli::{Output, WatchArgs};
use crate::election::unix_ms;
use crate::exit::Exit;
use crate::text::escape;

/// A holder as a line shows it: its token, slot, and when its job is due while it waits out
/// a takeover delay.
type Shown = (i64, Option<u32>, Option<u64>);

pub async fn run(a: WatchArgs) -> Result<Exit> {
    let ctx = Ctx::from_args(&a.election).await?;
    let mut last: Option<(Vec<Shown>, bool)> = None;
    let mut c = ctx.client.clone();
    loop {
        if super::stdout_gone() {
            return Ok(Exit::Ok);
        }
        let line = match ctx.holders().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("watch: {e:#}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let holders = line.holders();
        let paused = line.paused.is_some();
        // What is shown, not the line behind it: while paused, candidates re-queueing change
        // nothing a reader can see.
        let now = (
            holders
                .iter()
                .map(|h| (h.token, h.slot, h.candidate.takeover_until_ms))
                .collect(),
            paused,
        );
        if last.as_ref() != Some(&now) {
            // Nobody reads the changes any more (`watch | head -1`): done.
            if print(&a.output, ctx.election.name(), holders, line.slots, paused)? == Reader::Gone {
                return Ok(Exit::Ok);
            }
            last = Some(now);
        }
        // The candidates' prefix holds the line; the meta keys hold the pause switch and the
        // slots the holders claim.
        let rev = line.rev;
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1);
        let mut stream = match c.watch(ctx.election.candidates(), Some(opts)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("watch: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let opts = WatchOptions::new().with_start_revision(rev + 1);
        if stream
            .watch(ctx.election.paused_key(), Some(opts))
            .await
            .is_err()
        {
            continue;
        }
        if line.slots > 1 {
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(rev + 1);
            if stream
                .watch(ctx.election.slot_prefix(), Some(opts))
                .await
                .is_err()
            {
                continue;
            }
        }
        // Wait for any change, then re-read; or end once nobody reads the changes, without
        // waiting for one to find out (`watch | head -1`, as `tail -f` does).
        loop {
            tokio::select! {
                m = stream.message() => match m {
                    Ok(Some(r)) if r.created() => continue,
                    _ => break,
                },
                _ = reader_gone() => return Ok(Exit::Ok),
            }
        }
    }
}

/// Returns once stdout's reader has gone away (checked twice a second).
async fn reader_gone() {
    while !super::stdout_gone() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn print(
    out: &Output,
    election: &str,
    holders: &[Entry],
    slots: u32,
    paused: bool,
) -> Result<Reader> {
    let ts = super::fmt_ms(unix_ms());
    let view = |l: &Entry| json!({"id": l.candidate.id, "host": l.candidate.host, "pid": l.candidate.pid, "token": l.token, "takeover_until_ms": l.candidate.takeover_until_ms});
    Ok(match out {
        Output::Json if slots > 1 => {
            let held: Vec<_> = holders
                .iter()
                .map(|h| {
                    let mut v = view(h);
                    v["slot"] = json!(h.slot);
                    v
                })
                .collect();
            let v = json!({
                "time": ts,
                "election": election,
                "paused": paused,
                "slots": slots,
                "leader": holders.first().map(view),
                "holders": held,
            });
            outln!("{v}")
        }
        Output::Json => {
            let v = json!({
                "time": ts,
                "election": election,
                "paused": paused,
                "leader": holders.first().map(view),
            });
            outln!("{v}")
        }
        Output::Text => match (holders, paused) {
            (_, true) => outln!("{ts} {election}: paused"),
            ([], false) => outln!("{ts} {election}: no leader"),
            ([l], false) if slots == 1 => outln!(
                "{ts} {election}: leader {} token {}{}",
                escape(&l.candidate.id),
                l.token,
                l.candidate
                    .takeover_until_ms
                    .map(|due| format!(
                        ", job not started: takeover delay until {}",
                        super::fmt_ms(due)
                    ))
                    .unwrap_or_default()
            ),
            (held, false) => {
                let who: Vec<String> = held
                    .iter()
                    .map(|h| {
                        format!(
                            "{} token {} slot {}",
                            escape(&h.candidate.id),
                            h.token,
                            super::check::slot_name(h.slot)
                        )
                    })
                    .collect();
                outln!(
                    "{ts} {election}: {} of {slots} slots: {}",
                    held.len(),
                    who.join(", ")
                )
            }
        },
    })
}
