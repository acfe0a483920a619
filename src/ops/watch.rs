//! `lead-exec watch`: one line per leader change, until interrupted.
//!
//! Every wake-up (an event, or a reconnect after the watch broke) re-reads the line of
//! candidates, so a change that happened while disconnected is still printed.

use std::time::Duration;

use anyhow::Result;
use etcd_client::WatchOptions;
use serde_json::json;

use super::{Ctx, Entry};
use crate::cli::{Output, WatchArgs};
use crate::election::unix_ms;
use crate::exit::Exit;

pub async fn run(a: WatchArgs) -> Result<Exit> {
    let ctx = Ctx::connect(&a.election).await?;
    let mut last: Option<(Option<i64>, bool)> = None;
    let mut c = ctx.client.clone();
    loop {
        let (entries, rev) = match ctx.candidates().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("watch: {e:#}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let pause = ctx.paused().await.ok().flatten();
        let leader = super::leader(&entries, pause.as_ref());
        let paused = pause.is_some();
        // What is shown, not the line behind it: while paused, candidates re-queueing change
        // nothing a reader can see.
        let now = (leader.map(|l| l.token), paused);
        if last != Some(now) {
            print(&a.output, ctx.election.name(), leader, paused);
            last = Some(now);
        }
        // The meta prefix holds the pause switch; the candidates' prefix holds the line.
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
        // Wait for any change, then re-read.
        loop {
            match stream.message().await {
                Ok(Some(r)) if r.created() => continue,
                _ => break,
            }
        }
    }
}

fn print(out: &Output, election: &str, leader: Option<&Entry>, paused: bool) {
    let ts = super::fmt_ms(unix_ms());
    match out {
        Output::Json => {
            let v = json!({
                "time": ts,
                "election": election,
                "paused": paused,
                "leader": leader.map(|l| json!({"id": l.candidate.id, "host": l.candidate.host, "pid": l.candidate.pid, "token": l.token})),
            });
            println!("{v}");
        }
        Output::Text => match (leader, paused) {
            (_, true) => println!("{ts} {election}: paused"),
            (Some(l), false) => println!(
                "{ts} {election}: leader {} token {}",
                l.candidate.id, l.token
            ),
            (None, false) => println!("{ts} {election}: no leader"),
        },
    }
}
