//! The steps of the demo, each waiting for the events that show it worked.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::binaries::{capture, clean_command, detach_and_tie, ledger, status, Bins};
use crate::narrate::{print_indented, say, secs, sleep};
use crate::store::Store;
use crate::summary::describe;
use crate::workers::{Monitor, Workers};
use crate::{BATCHES_PER_TERM, EXIT_REJECTED, LEASE, TTL, WORKERS};

/// A term: which worker led, with which token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Term {
    pub(crate) worker: usize,
    pub(crate) token: i64,
}

/// What the kill -9 step measured.
pub(crate) struct Crash {
    pub(crate) victim: Term,
    pub(crate) next: Term,
    /// From the kill to the moment the victim's job group was gone (its pipes closed).
    pub(crate) group_gone: Duration,
    /// From the kill to the new leader's job start.
    pub(crate) failover: Duration,
    /// Job lines from the victim read after the kill.
    pub(crate) late_lines: usize,
}

/// What the SIGTERM step measured.
pub(crate) struct Handover {
    pub(crate) from: Term,
    pub(crate) next: Term,
    pub(crate) took: Duration,
    pub(crate) exit: ExitStatus,
}

pub(crate) struct Stale {
    pub(crate) token: i64,
    pub(crate) message: String,
}

pub(crate) struct Outcome {
    pub(crate) crash: Crash,
    pub(crate) handover: Handover,
    pub(crate) stale: Stale,
    pub(crate) retry: Retry,
    pub(crate) check_ok: bool,
    pub(crate) check_text: String,
}

/// Step 1: wait until one worker has settled a few batches.
pub(crate) fn first_leader(mon: &mut Monitor) -> Result<Term> {
    let mut batches = [0u32; WORKERS.len()];
    mon.wait_for(
        0,
        "a leader to settle a few batches",
        Duration::from_secs(30),
        |ev| {
            let (token, _) = ev.settled()?;
            batches[ev.worker] += 1;
            (batches[ev.worker] >= BATCHES_PER_TERM).then_some(Term {
                worker: ev.worker,
                token,
            })
        },
    )
}

/// Waits for another worker than `old.worker` to start a term, and checks its token.
pub(crate) fn next_term(
    mon: &mut Monitor,
    since: usize,
    old: Term,
    timeout: Duration,
) -> Result<(Term, Instant)> {
    let (next, at) = mon.wait_for(since, "another worker to take over", timeout, |ev| {
        let token = ev.leading()?;
        (ev.worker != old.worker).then_some((
            Term {
                worker: ev.worker,
                token,
            },
            ev.at,
        ))
    })?;
    ensure!(
        next.token > old.token,
        "the new term's token {} is not larger than the old term's {}",
        next.token,
        old.token
    );
    Ok((next, at))
}

/// Waits until `term`'s job has settled a few batches, so that the next step starts from a
/// working leader and every term shows up in the ledger.
pub(crate) fn let_it_settle(mon: &mut Monitor, since: usize, term: Term) -> Result<()> {
    let mut n = 0;
    let timeout = Duration::from_secs(15);
    mon.wait_for(since, "the new leader's batches", timeout, |ev| {
        if ev.worker == term.worker && ev.settled().is_some_and(|(t, _)| t == term.token) {
            n += 1;
        }
        (n >= BATCHES_PER_TERM).then_some(())
    })
}

/// Step 2: SIGKILL the leader's lead-exec. Nothing of it can resign: its watchdog sees the
/// control pipe close and kills the job's group, and the lease runs out on the server.
pub(crate) fn kill_leader(
    mon: &mut Monitor,
    workers: &mut Workers,
    victim: Term,
    bins: &Bins,
    endpoint: &str,
) -> Result<Crash> {
    let name = WORKERS[victim.worker];
    let since = mon.mark();
    say(&format!(
        "kill -9 {name}'s lead-exec (pid {})",
        workers.0[victim.worker].child.id()
    ));
    let t0 = Instant::now();
    workers.signal(victim.worker, libc::SIGKILL)?;
    workers.wait_exit(victim.worker, Duration::from_secs(5))?;
    let gone_at = mon.wait_for(
        since,
        &format!("{name}'s job to stop"),
        Duration::from_secs(5),
        |ev| (ev.worker == victim.worker && ev.is_closed()).then_some(ev.at),
    )?;
    let group_gone = gone_at.saturating_duration_since(t0);
    say(&format!(
        "{name}'s job and watchdog are gone {} ms after the kill; no more batches from it",
        group_gone.as_millis()
    ));
    // Nobody could revoke the lease, so etcd still names the dead worker until it expires.
    say(&format!(
        "until its lease expires (TTL {TTL}), etcd still names {name}, and no job runs anywhere:"
    ));
    print_indented(&status(bins, endpoint)?);
    let (next, at) = next_term(mon, since, victim, Duration::from_secs(20))?;
    let failover = at.saturating_duration_since(t0);
    let_it_settle(mon, since, next)?;
    let late_lines = mon.seen[since..]
        .iter()
        .filter(|e| e.worker == victim.worker && e.settled().is_some())
        .count();
    say(&format!(
        "{} took over with token {} (> {}) {} after the kill; lines from {name} since the kill: {late_lines}",
        WORKERS[next.worker],
        next.token,
        victim.token,
        secs(failover)
    ));
    Ok(Crash {
        victim,
        next,
        group_gone,
        failover,
        late_lines,
    })
}

/// Step 3: SIGTERM the leader's lead-exec: it stops the job (TERM, then KILL after the
/// grace), revokes its lease and exits, so the next candidate need not wait for a TTL.
pub(crate) fn terminate_leader(
    mon: &mut Monitor,
    workers: &mut Workers,
    from: Term,
) -> Result<Handover> {
    let name = WORKERS[from.worker];
    let since = mon.mark();
    say(&format!(
        "SIGTERM {name}'s lead-exec (pid {})",
        workers.0[from.worker].child.id()
    ));
    let t0 = Instant::now();
    workers.signal(from.worker, libc::SIGTERM)?;
    let (next, at) = next_term(mon, since, from, Duration::from_secs(15))?;
    let took = at.saturating_duration_since(t0);
    let exit = workers.wait_exit(from.worker, Duration::from_secs(10))?;
    let_it_settle(mon, since, next)?;
    say(&format!(
        "{} took over with token {} (> {}) {} after the SIGTERM; {name}'s lead-exec exited with {}",
        WORKERS[next.worker],
        next.token,
        from.token,
        secs(took),
        describe(exit)
    ));
    Ok(Handover {
        from,
        next,
        took,
        exit,
    })
}

/// Step 4: what a leader that froze in step 1 and woke up now would do: write with its old
/// token. The ledger has seen higher tokens since, so it must refuse.
pub(crate) fn stale_write(bins: &Bins, store: &Store, token: i64) -> Result<Stale> {
    let tok = token.to_string();
    say(&format!(
        "ledger write --token {tok} --worker zombie --note \"late write from a frozen leader\""
    ));
    let out = ledger(
        bins,
        store,
        &[
            "write",
            "--token",
            &tok,
            "--worker",
            "zombie",
            "--note",
            "late write from a frozen leader",
        ],
    )?;
    let message = out.stdout.trim().to_string();
    print_indented(&format!(
        "{message}\n(exit code {})",
        out.code.unwrap_or(-1)
    ));
    ensure!(
        out.code == Some(EXIT_REJECTED),
        "the stale write was not rejected (exit {:?}): {message}",
        out.code
    );
    say("rejected: the ledger keeps the highest token it accepted and refuses lower ones");
    Ok(Stale { token, message })
}

/// Step 5: SIGTERM whoever still runs and wait for them.
pub(crate) fn stop_all(workers: &mut Workers) -> Result<()> {
    for i in workers.running() {
        say(&format!("SIGTERM {}'s lead-exec", WORKERS[i]));
        workers.signal(i, libc::SIGTERM)?;
    }
    for i in workers.running() {
        let s = workers.wait_exit(i, Duration::from_secs(10))?;
        say(&format!(
            "{}'s lead-exec exited with {}",
            WORKERS[i],
            describe(s)
        ));
    }
    sleep(Duration::from_millis(100))?;
    Ok(())
}

/// What the retried tick showed.
pub(crate) struct Retry {
    /// (worker, exit code) of each worker of the tick, in the order they started.
    pub(crate) exits: Vec<(&'static str, Option<i32>)>,
    /// What each attempt's job said, in order.
    pub(crate) attempts: Vec<String>,
}

/// The election of the retried tick: a cron job of its own beside the long-running one.
pub(crate) const TICK_ELECTION: &str = "settlement-tick";

/// Step 6: one cron tick on the three workers with `--every 1h --attempts 3`. worker-a leads
/// first and its attempt fails (a broken host: the job exits 1); worker-b, next in line on
/// another host, runs attempt 2 with a larger token and succeeds; worker-c finds the tick done
/// and exits 0 without running the job.
pub(crate) fn retried_attempt(
    bins: &Bins,
    store: &Store,
    endpoint: &str,
    dir: &Path,
) -> Result<Retry> {
    let queued = dir.join("tick-queued");
    let said = dir.join("tick-attempts");
    // $0 is the ledger, "$@" its store arguments. worker-a fails once the others queue.
    let job = format!(
        r#"line="$LEAD_EXEC_ID ran attempt $LEAD_EXEC_ATTEMPT of tick $LEAD_EXEC_RUN_KEY with token $FENCING_TOKEN"
if [ "$LEAD_EXEC_ID" = worker-a ]; then
  while [ ! -e '{q}' ]; do sleep 0.05; done
  echo "$line: the bank is unreachable from this host, exit 1" >> '{s}'; exit 1
fi
echo "$line: settled" >> '{s}'
exec "$0" "$@" write --token "$FENCING_TOKEN" --worker "$LEAD_EXEC_ID" --note "tick $LEAD_EXEC_RUN_KEY, attempt $LEAD_EXEC_ATTEMPT" >/dev/null"#,
        q = queued.display(),
        s = said.display(),
    );
    say(&format!(
        "on each worker: lead-exec run {TICK_ELECTION} --every 1h --attempts 3 -- <settle once>"
    ));
    let mut children = Vec::new();
    for (n, name) in WORKERS.iter().enumerate() {
        let mut cmd = clean_command(&bins.lead_exec);
        cmd.args(["run", TICK_ELECTION, "--endpoints", endpoint, "-q"])
            .args(LEASE)
            .args(["--every", "1h", "--attempts", "3", "--id", name, "--"])
            .args(["sh", "-c", &job])
            .arg(&bins.ledger)
            .args(store.args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        detach_and_tie(&mut cmd);
        children.push((
            *name,
            cmd.spawn().with_context(|| format!("starting {name}"))?,
        ));
        // In line one after the other, so that the attempts go a, b, c.
        let want = n + 1;
        wait_until(
            Duration::from_secs(10),
            &format!("{want} workers in line"),
            || Ok(in_line(bins, endpoint)? == want),
        )?;
    }
    std::fs::write(&queued, "").context("starting the tick")?;
    let mut exits = Vec::new();
    for (name, mut child) in children {
        let mut status = None;
        wait_until(
            Duration::from_secs(20),
            &format!("end of {name}'s tick"),
            || {
                status = child.try_wait()?;
                Ok(status.is_some())
            },
        )?;
        let status = status.expect("waited for");
        say(&format!(
            "{name}'s lead-exec exited with {}",
            describe(status)
        ));
        exits.push((name, status.code()));
    }
    let attempts: Vec<String> = std::fs::read_to_string(&said)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    print_indented(&attempts.join("\n"));
    ensure!(
        exits.iter().map(|(_, c)| *c).collect::<Vec<_>>() == [Some(1), Some(0), Some(0)],
        "the tick's workers exited {exits:?}, not 1, 0, 0"
    );
    ensure!(
        attempts.len() == 2,
        "{} attempts ran, not 2",
        attempts.len()
    );
    say("worker-a's attempt failed and it left; worker-b retried on its host with a larger token; worker-c found the tick done");
    Ok(Retry { exits, attempts })
}

/// How many candidates of the tick's election are in line, leader included.
fn in_line(bins: &Bins, endpoint: &str) -> Result<usize> {
    let mut cmd = clean_command(&bins.lead_exec);
    cmd.args([
        "status",
        TICK_ELECTION,
        "--endpoints",
        endpoint,
        "-o",
        "json",
    ]);
    let out = capture(&mut cmd)?;
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_default();
    let leader = usize::from(v["leader"].is_object());
    Ok(leader + v["waiting"].as_array().map_or(0, Vec::len))
}

/// Polls `cond` until it holds, for at most `limit`.
fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let until = Instant::now() + limit;
    while !cond()? {
        ensure!(Instant::now() < until, "no {what} within {limit:?}");
        sleep(Duration::from_millis(50))?;
    }
    Ok(())
}
