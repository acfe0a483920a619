//! The steps of the demo, each waiting for the events that show it worked.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};

use crate::binaries::{ledger, status, Bins};
use crate::narrate::{print_indented, say, secs, sleep};
use crate::store::Store;
use crate::summary::describe;
use crate::workers::{Monitor, Workers};
use crate::{BATCHES_PER_TERM, EXIT_REJECTED, TTL, WORKERS};

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
