//! Fail closed: when renewal fails the job is dead before the lease could expire on the
//! server; lost keys and expired candidacies never let a job run on a dead term.

use std::time::{Duration, Instant};

use harness::proxy::{Mode, Proxy};
use harness::*;

/// A job that records each term's token, lease and pid, then runs until killed.
fn recording_job(dir: &std::path::Path) -> String {
    script(
        dir,
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; echo $$ > $D/pid; exec sleep 120",
    )
}

/// D is at most (last keepalive send) + TTL − margin, and the last send was at most one
/// interval (TTL/3) before the cut: the job must be dead within TTL − margin of the cut.
#[test]
fn blackholed_etcd_kills_the_job_before_the_deadline_then_a_new_term_starts() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    let job = recording_job(f.dir.path());
    let ep = proxy.endpoint();
    let mut w = spawn(f.dir.path(), "w", &run_args("fc", &ep, &[], &job));
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let cut = Instant::now();
    proxy.set(Mode::Blackhole);
    assert!(
        wait_until(secs(10), || !alive(pid)),
        "job survived the blackhole"
    );
    let died = cut.elapsed();
    assert!(
        died <= Duration::from_millis(2500 + 300),
        "job died {died:?} after the cut; the deadline was at most 2.5 s"
    );
    proxy.set(Mode::Pass);
    let ok = wait_until(secs(20), || terms(f.dir.path()).len() >= 2);
    assert!(ok, "no new term after etcd came back:\n{}", w.log_text());
    let t = terms(f.dir.path());
    assert!(t[1].0 > t[0].0, "{t:?}");
    assert_ne!(t[1].1, t[0].1, "a new term needs a fresh lease");
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

#[test]
fn stopped_etcd_member_kills_the_job_then_a_new_term_starts() {
    let f = Fixture::new();
    let job = recording_job(f.dir.path());
    let mut w = spawn(f.dir.path(), "w", &run_args("fc2", &f.ep, &[], &job));
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let cut = Instant::now();
    f.etcd.members[0].stop();
    assert!(wait_until(secs(10), || !alive(pid)), "job survived");
    assert!(
        cut.elapsed() <= Duration::from_millis(2800),
        "{:?}",
        cut.elapsed()
    );
    f.etcd.members[0].cont();
    let ok = wait_until(secs(20), || terms(f.dir.path()).len() >= 2);
    assert!(ok, "no new term:\n{}", w.log_text());
    let t = terms(f.dir.path());
    assert!(t[1].0 > t[0].0, "{t:?}");
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

#[test]
fn deleting_the_leader_key_stops_the_job_and_campaigns_again() {
    let f = Fixture::new();
    let job = recording_job(f.dir.path());
    let mut w = spawn(f.dir.path(), "w", &run_args("del", &f.ep, &[], &job));
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let keys = f.etcd.keys("lead-exec/elections/del/");
    assert_eq!(keys.len(), 1);
    f.etcd.ctl(&["del", &keys[0]]);
    assert!(
        wait_until(secs(5), || !alive(pid)),
        "job survived the delete"
    );
    assert!(
        wait_until(secs(10), || terms(f.dir.path()).len() >= 2),
        "{}",
        w.log_text()
    );
    let t = terms(f.dir.path());
    assert!(t[1].0 > t[0].0);
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

#[test]
fn a_candidate_whose_lease_is_revoked_while_queued_never_spawns_on_it() {
    let f = Fixture::new();
    let a_job = script(f.dir.path(), "echo up > $D/a_up; exec sleep 120");
    let b_job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID > $D/b_term",
    );
    let mut a = spawn(f.dir.path(), "a", &run_args("queued", &f.ep, &[], &a_job));
    wait_line(&f.dir.path().join("a_up"), secs(10), |l| l == "up");
    let mut b = spawn(f.dir.path(), "b", &run_args("queued", &f.ep, &[], &b_job));
    b.wait_log("waiting behind", secs(10));
    let keys = f.etcd.keys("lead-exec/elections/queued/");
    let b_lease = keys[1].rsplit('/').next().unwrap().to_string();
    f.etcd.ctl(&["lease", "revoke", &b_lease]);
    b.wait_log("candidacy lost while queued", secs(10));
    a.signal(libc::SIGTERM);
    assert_eq!(b.code(secs(20)), 0, "{}", b.log_text());
    let line = lines(&f.dir.path().join("b_term")).remove(0);
    let (_, lease) = line.split_once(' ').unwrap();
    assert_ne!(lease, b_lease, "spawned on the revoked lease");
    a.wait(secs(10));
}

#[test]
fn a_frozen_candidate_whose_lease_expired_never_spawns_on_it() {
    let f = Fixture::new();
    let a_job = script(f.dir.path(), "echo up > $D/a_up; exec sleep 120");
    let b_job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID > $D/b_term",
    );
    let mut a = spawn(f.dir.path(), "a", &run_args("frozen", &f.ep, &[], &a_job));
    wait_line(&f.dir.path().join("a_up"), secs(10), |l| l == "up");
    let mut b = spawn(f.dir.path(), "b", &run_args("frozen", &f.ep, &[], &b_job));
    b.wait_log("waiting behind", secs(10));
    let keys = f.etcd.keys("lead-exec/elections/frozen/");
    let b_key = keys[1].clone();
    let b_lease = b_key.rsplit('/').next().unwrap().to_string();
    b.signal(libc::SIGSTOP);
    // The server expires B's lease (TTL 3 s) while B is frozen.
    assert!(wait_until(secs(15), || !f
        .etcd
        .keys("lead-exec/elections/frozen/")
        .contains(&b_key)));
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
    b.signal(libc::SIGCONT);
    assert_eq!(b.code(secs(20)), 0, "{}", b.log_text());
    let line = lines(&f.dir.path().join("b_term")).remove(0);
    let (_, lease) = line.split_once(' ').unwrap();
    assert_ne!(lease, b_lease, "spawned on the expired lease");
}

#[test]
fn on_loss_exit_stops_the_job_and_exits_76() {
    let f = Fixture::new();
    let job = recording_job(f.dir.path());
    let args = run_args("onloss", &f.ep, &["--on-loss", "exit"], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let key = f.etcd.keys("lead-exec/elections/onloss/").remove(0);
    f.etcd.ctl(&["del", &key]);
    assert_eq!(w.code(secs(10)), 76, "{}", w.log_text());
    assert!(!alive(pid));
    assert_eq!(
        terms(f.dir.path()).len(),
        1,
        "no new term under --on-loss exit"
    );
}

/// An operator deletes the leader key: at the default log level, a warning says why the job
/// is stopped and lead-exec exits 76.
#[test]
fn a_deleted_leader_key_is_named_in_a_warning_under_on_loss_exit() {
    let f = Fixture::new();
    let job = recording_job(f.dir.path());
    let args = run_args("keydel", &f.ep, &["--on-loss", "exit"], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    wait_int(&f.dir.path().join("pid"), secs(10));
    let key = f.etcd.keys("lead-exec/elections/keydel/").remove(0);
    f.etcd.ctl(&["del", &key]);
    assert_eq!(w.code(secs(10)), 76, "{}", w.log_text());
    let log = w.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("leadership lost: leader key deleted"))
        .unwrap_or_else(|| panic!("no warning names the loss:\n{log}"));
    assert!(line.contains("reason=\"leader_key_deleted\""), "{line}");
}

/// `--wait` bounds the whole attempt, also when etcd goes away while the candidate waits.
#[test]
fn wait_gives_up_even_while_etcd_is_unreachable() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    let pep = proxy.endpoint();
    let job = script(f.dir.path(), "echo up > $D/up; exec sleep 60");
    let mut a = spawn(f.dir.path(), "a", &run_args("waitdown", &f.ep, &[], &job));
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    let mut b = spawn(
        f.dir.path(),
        "b",
        &run_args("waitdown", &pep, &["--wait", "2s"], "exit 0"),
    );
    b.wait_log("waiting behind", secs(10));
    let start = Instant::now();
    proxy.set(Mode::Blackhole);
    assert_eq!(b.code(secs(15)), 75, "{}", b.log_text());
    assert!(start.elapsed() < secs(10), "{:?}", start.elapsed());
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
}

/// When etcd says the lease is gone (here: revoked), another leader may already run: the job
/// gets SIGKILL at once, not SIGTERM and the grace.
#[test]
fn a_lease_etcd_says_is_gone_kills_the_job_without_grace() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "trap 'echo term >> $D/events' TERM; echo $$ > $D/pid; while :; do sleep 0.05; done",
    );
    let args = run_args_with(&WIDE_GRACE, "gone", &f.ep, &["-v"], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let key = f.etcd.keys("lead-exec/elections/gone/").remove(0);
    let lease = key.rsplit('/').next().unwrap().to_string();
    let revoked = Instant::now();
    f.etcd.ctl(&["lease", "revoke", &lease]);
    assert!(wait_until(secs(10), || !alive(pid)), "job survived");
    let took = revoked.elapsed();
    eprintln!("job dead {took:?} after its lease was revoked");
    assert!(
        lines(&f.dir.path().join("events")).is_empty(),
        "the job got SIGTERM, not SIGKILL"
    );
    assert!(took < Duration::from_millis(1500), "{took:?}: not at once");
    w.wait_log("leading -> draining on lease expired", secs(5));
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// A lease whose grant was answered late (etcd stalled) leaves less than the grace before D:
/// lead-exec renews it before starting the job, instead of starting a job that the watchdog
/// stops the moment it starts.
#[test]
fn a_lease_answered_late_is_renewed_before_the_job_starts() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "trap 'echo term >> $D/events; exit 143' TERM; echo start >> $D/events; \
         while :; do echo beat >> $D/events; sleep 0.1; done",
    );
    // A grace wide enough that the window this test aims at does not depend on how fast etcd
    // answers after the stall. The connection outlives the stall (HTTP/2 pings wait 30 s);
    // requests wait 6 s.
    let args = run_args_with(
        &WIDE_GRACE,
        "late",
        &f.ep,
        &["-v", "--dial-timeout", "30s", "--command-timeout", "6s"],
        &job,
    );
    let mut w = spawn(f.dir.path(), "w", &args);
    let events = f.dir.path().join("events");
    wait_line(&events, secs(10), |l| l == "start");
    f.etcd.members[0].stop();
    // The job dies by D; lead-exec tries to record the end of the term (6 s), logs the
    // transition, tries to revoke the old lease (1 s) and sends the grant of a new one, whose
    // answer waits for etcd.
    w.wait_log("-> campaigning", secs(30));
    let lost = Instant::now();
    // Thaw when that grant's D (send + 5.5 s) is 1.5 s away: inside the 2 s grace.
    std::thread::sleep(Duration::from_millis(1000 + 4000).saturating_sub(lost.elapsed()));
    f.etcd.members[0].cont();
    let second_term = |ev: &[String]| -> Vec<String> {
        ev.iter()
            .skip_while(|l| *l != "start")
            .skip(1)
            .skip_while(|l| *l != "start")
            .skip(1)
            .cloned()
            .collect()
    };
    let ok = wait_until(secs(30), || {
        second_term(&lines(&events))
            .iter()
            .filter(|l| *l == "beat")
            .count()
            >= 8
    });
    assert!(ok, "no second term ran:\n{}", w.log_text());
    // A job stopped the moment it starts may die before its shell writes anything: count
    // the starts lead-exec made.
    let log = w.log_text();
    let starts = log.matches("leading: job started").count();
    assert_eq!(
        starts, 2,
        "a job was started with its deadline (nearly) spent:\n{log}"
    );
    assert!(!second_term(&lines(&events)).iter().any(|l| l == "term"));
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// etcd restarted on an empty data directory: revisions start again, so the token goes
/// backwards in the same lead-exec process. That is logged as an error and counted.
#[test]
fn a_wiped_etcd_is_reported_as_a_token_regression() {
    let mut f = Fixture::new();
    for i in 0..30 {
        f.etcd
            .ctl(&["put", "lead-exec-test/filler", &i.to_string()]);
    }
    let job = recording_job(f.dir.path());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args("wiped", &f.ep, &["--metrics-addr", &addr], &job),
    );
    wait_int(&f.dir.path().join("pid"), secs(10));
    f.etcd.members[0].wipe();
    f.etcd.wait_healthy(secs(20));
    assert!(
        wait_until(secs(30), || terms(f.dir.path()).len() >= 2),
        "no term after the wipe:\n{}",
        w.log_text()
    );
    let t = terms(f.dir.path());
    eprintln!("tokens across the wipe: {} -> {}", t[0].0, t[1].0);
    assert!(t[1].0 < t[0].0, "{t:?}");
    w.wait_log("the fencing token went backwards", secs(5));
    let text = scrape(port).expect("metrics");
    assert_eq!(
        metric(&text, "lead_exec_token_regressions_total"),
        Some(1.0),
        "{text}"
    );
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// A term that ends while its worker is cut off from etcd cannot hand over in one commit: the
/// worker revokes its lease first, retrying within `--command-timeout`, so the next leader
/// starts as soon as the link is back instead of after the whole lease; the end record
/// follows.
#[test]
fn a_term_that_ends_while_cut_off_hands_over_as_soon_as_etcd_is_back() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    let (direct, cut) = (f.ep.clone(), proxy.endpoint());
    // A long lease: without the revoke, the next leader would wait for it.
    let lease = ["--ttl", "20s", "--grace", "1s", "--safety-margin", "1s"];
    let ends = script(
        f.dir.path(),
        "echo $FENCING_TOKEN > $D/first; while [ ! -e $D/go ]; do sleep 0.05; done",
    );
    let first_args = run_args_with(
        &lease,
        "cutoff",
        &cut,
        &["--id", "first", "--command-timeout", "3s"],
        &ends,
    );
    let mut first = spawn(f.dir.path(), "first", &first_args);
    wait_line(&f.dir.path().join("first"), secs(10), |_| true);
    let next_job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/next");
    let next_args = run_args_with(&lease, "cutoff", &direct, &["--id", "next"], &next_job);
    let mut next = spawn(f.dir.path(), "next", &next_args);
    next.wait_log("waiting behind first", secs(10));
    proxy.set(Mode::Reset);
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    first.wait_log("job ended", secs(10));
    // The link stays cut for a second after the job ended.
    std::thread::sleep(secs(1));
    let healed = Instant::now();
    proxy.set(Mode::Pass);
    wait_line(&f.dir.path().join("next"), secs(25), |_| true);
    let gap = healed.elapsed();
    eprintln!("next term started {gap:?} after the link came back");
    assert!(
        gap < secs(5),
        "the next term started {gap:?} after the link came back (TTL 20 s)\n{}",
        first.log_text()
    );
    assert_eq!(first.code(secs(10)), 0, "{}", first.log_text());
    assert_eq!(next.code(secs(10)), 0, "{}", next.log_text());
    let (code, out, err) = run(&["history", "cutoff", "--endpoints", &direct]);
    assert_eq!(code, 0, "{err}");
    let first_term = out.lines().find(|l| l.contains("first")).unwrap_or("");
    assert!(first_term.contains("exit 0"), "{out}");
}

/// etcd says the lease is gone (an operator revoked it) while lead-exec is stopping its job
/// for another reason (here a SIGTERM the job ignores, with a long grace): the next leader may
/// already run, so the job gets SIGKILL at once instead of the rest of its grace. The loss is
/// said once, the term is recorded as lost, and the run ends as lost (76).
#[test]
fn a_lease_revoked_while_the_job_is_being_stopped_cuts_the_grace_short() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "trap 'echo term > $D/term' TERM; echo $$ > $D/pid; while :; do sleep 0.1; done",
    );
    let lease = ["--ttl", "30s", "--grace", "20s"];
    let args = run_args_with(&lease, "revdrain", &f.ep, &["-v"], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    w.wait_job_started();
    w.signal(libc::SIGTERM);
    wait_line(&f.dir.path().join("term"), secs(10), |l| l == "term");
    let key = f.etcd.keys("lead-exec/elections/revdrain/").remove(0);
    let id = key.rsplit('/').next().unwrap().to_string();
    let revoked = Instant::now();
    f.etcd.ctl(&["lease", "revoke", &id]);
    assert!(
        wait_until(secs(5), || !alive(pid)),
        "the job kept its grace after the lease was revoked\n{}",
        w.log_text()
    );
    eprintln!("job dead {:?} after the revoke", revoked.elapsed());
    assert_eq!(w.code(secs(10)), 76, "{}", w.log_text());
    let log = w.log_text();
    assert_eq!(log.matches("leadership lost").count(), 1, "{log}");
    assert!(log.contains("leadership lost: lease expired"), "{log}");
    // One step for the loss; the keepalive task's end, which follows it, is no news (it was
    // taken for one on every poll until the job was reaped).
    assert_eq!(log.matches("draining -> draining").count(), 1, "{log}");
    let (_, history, _) = run(&["history", "revdrain", "--endpoints", &f.ep, "-o", "json"]);
    assert!(history.contains("\"end\":\"lease lost\""), "{history}");
}

/// The leader key deleted (an operator), then a stop (`systemctl stop`) while the job is being
/// stopped for it: the run ends as lost (76), not with the 0 its job exits with on SIGTERM, so
/// that a cron line's run key or `--attempts` does not take the lost term for a success.
#[test]
fn a_stop_while_a_lost_term_is_being_stopped_ends_the_run_as_lost() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "(trap '' TERM; exec sleep 120) & trap 'echo term > $D/term; exit 0' TERM; \
         echo $$ > $D/pid; while :; do sleep 0.1; done",
    );
    let lease = ["--ttl", "30s", "--grace", "20s"];
    let args = run_args_with(&lease, "loststop", &f.ep, &[], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    w.wait_job_started();
    let key = f.etcd.keys("lead-exec/elections/loststop/").remove(0);
    f.etcd.ctl(&["del", &key]);
    wait_line(&f.dir.path().join("term"), secs(10), |l| l == "term");
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(10)), 76, "{}", w.log_text());
    let log = w.log_text();
    assert_eq!(log.matches("leadership lost").count(), 1, "{log}");
    assert!(log.contains("leadership lost: leader key deleted"), "{log}");
    let (_, history, _) = run(&["history", "loststop", "--endpoints", &f.ep, "-o", "json"]);
    assert!(history.contains("\"end\":\"lease lost\""), "{history}");
}

/// The number of requests etcd (one member, at `ep`) has started.
fn etcd_requests(ep: &str) -> f64 {
    let addr = ep.parse().expect("a host:port endpoint");
    let text = scrape_addr(addr, secs(2), secs(2)).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("grpc_server_started_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A job being stopped (it ignores SIGTERM, with a long grace) for `why`: a SIGTERM to
/// lead-exec, or a pause; then etcd restarts, which breaks the leader watch. The requests
/// etcd takes over 2 s of the rest of the grace, once lead-exec has reconnected.
fn requests_while_draining_after_a_restart(why: &str, delete_key: bool) -> f64 {
    let mut f = Fixture::new();
    let job = script(
        f.dir.path(),
        "trap '' TERM; echo $$ > $D/pid; while :; do sleep 0.1; done",
    );
    let lease = ["--ttl", "30s", "--grace", "20s"];
    let args = run_args_with(&lease, "drainloop", &f.ep, &["-v"], &job);
    let w = spawn(f.dir.path(), "w", &args);
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    w.wait_job_started();
    if why == "pause" {
        let pause = [
            "pause",
            "drainloop",
            "--endpoints",
            &f.ep,
            "--no-block",
            "--reason",
            "t",
        ];
        let (code, _, err) = run(&pause);
        assert_eq!(code, 0, "{err}");
    } else {
        w.signal(libc::SIGTERM);
    }
    w.wait_log("leading -> draining", secs(10));
    if delete_key {
        let key = f.etcd.keys("lead-exec/elections/drainloop/").remove(0);
        f.etcd.ctl(&["del", &key]);
        w.wait_log("leadership lost: leader key deleted", secs(10));
    }
    f.etcd.members[0].restart();
    // Reconnected: the lease's keepalives reach the new process.
    assert!(
        wait_until(secs(10), || etcd_requests(&f.ep) > 0.0),
        "etcd did not come back"
    );
    std::thread::sleep(Duration::from_millis(500));
    let before = etcd_requests(&f.ep);
    std::thread::sleep(Duration::from_secs(2));
    let made = etcd_requests(&f.ep) - before;
    eprintln!(
        "{why}, key deleted {delete_key}: {made} requests in 2 s of the drain after etcd restarted"
    );
    assert!(alive(pid), "the job kept its grace");
    made
}

/// A job being stopped does not read etcd in a loop after the leader watch breaks: neither
/// once its term is known lost (a re-opened watch found the key gone from a read, each time,
/// thousands of requests a second for the rest of the grace), nor during a pause (it found
/// the pause switch on, each time).
#[test]
fn a_job_being_stopped_does_not_read_etcd_in_a_loop_after_a_broken_watch() {
    for (why, delete_key) in [("term", true), ("pause", true), ("pause", false)] {
        let made = requests_while_draining_after_a_restart(why, delete_key);
        assert!(
            made < 10.0,
            "{why}, key deleted {delete_key}: {made} requests in 2 s"
        );
    }
}
