//! Riding through routine etcd trouble: connections etcd keeps, `--wait` per wait in line.
//! (Member and endpoint faults on a three-member cluster are in `chaos`.)

use std::collections::BTreeSet;

use harness::*;

/// The socket inodes a process holds.
fn sockets(pid: i32) -> BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|l| l.display().to_string())
                .filter(|l| l.starts_with("socket:"))
                .collect()
        })
        .unwrap_or_default()
}

/// etcd answers HTTP/2 pings more frequent than its `--grpc-keepalive-min-time` (5 s) with a
/// GOAWAY "too_many_pings" and drops the connection: an idle candidate must not provoke it.
#[test]
fn etcd_keeps_the_connections_of_idle_candidates() {
    let f = Fixture::new();
    // A long TTL: keepalives every 20 s, so only pings cross the connection meanwhile.
    let long = ["--ttl", "60s"];
    let job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; exec sleep 60",
    );
    let base = |name: &'static str| vec!["run", "idle", "--endpoints", &f.ep, "--id", name];
    let mut leader_args = base("leader");
    leader_args.extend_from_slice(&long);
    leader_args.extend_from_slice(&["--", "sh", "-c", &job]);
    let mut leader = spawn(f.dir.path(), "leader", &leader_args);
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    let mut waiter_args = base("waiter");
    waiter_args.extend_from_slice(&long);
    waiter_args.extend_from_slice(&["--", "true"]);
    let mut waiter = spawn(f.dir.path(), "waiter", &waiter_args);
    waiter.wait_log("waiting behind leader", secs(10));
    let first_l = sockets(leader.pid());
    let first_w = sockets(waiter.pid());
    // Several of etcd's 5 s ping windows; at a 1 s ping interval the connections were
    // replaced every few seconds.
    let end = std::time::Instant::now() + secs(16);
    while std::time::Instant::now() < end {
        let (l, w) = (sockets(leader.pid()), sockets(waiter.pid()));
        assert!(
            l.is_subset(&first_l) && w.is_subset(&first_w),
            "a connection was replaced: leader {first_l:?} -> {l:?}, waiter {first_w:?} -> {w:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    for w in [&mut leader, &mut waiter] {
        w.signal(libc::SIGTERM);
        w.wait(secs(10));
    }
}

/// `--wait D` bounds each wait in line: a leader resigned after a term longer than D queues
/// again (here it wins again at once) instead of exiting 75.
#[test]
fn wait_counts_from_each_campaign_not_from_process_start() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; exec sleep 60",
    );
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args("waitd", &f.ep, &["--wait", "1s"], &job),
    );
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    // The term must outlast the wait: there is no event for "1 s has passed".
    std::thread::sleep(secs(2));
    let (code, _, err) = run(&["resign", "waitd", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "resign: {err}");
    let ok = wait_until(secs(10), || terms(f.dir.path()).len() >= 2);
    assert!(ok, "no second term after the resign:\n{}", w.log_text());
    let t = terms(f.dir.path());
    assert!(t[1].0 > t[0].0, "{t:?}");
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// A first endpoint that refuses connections is passed over at start-up at once, not after
/// a read attempt's bound (half the dial timeout): connecting it ahead of the first requests
/// (lead-exec-safety(7), "Round trips") moves the pin on its refusal, and the run goes on at
/// the next endpoint.
#[test]
fn a_first_endpoint_that_refuses_connections_is_passed_over_at_start_up() {
    let f = Fixture::new();
    let eps = format!("127.0.0.1:1,{}", f.ep);
    let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/t");
    let started = std::time::Instant::now();
    let dial = ["--dial-timeout", "10s"];
    let (code, _, err) = run(&run_args("refused", &eps, &dial, &job));
    assert_eq!(code, 0, "{err}");
    assert!(
        started.elapsed() < secs(4),
        "{:?}: {err}",
        started.elapsed()
    );
    let token = wait_int(&f.dir.path().join("t"), secs(1));
    let (_, out, _) = run(&["history", "refused", "--endpoints", &f.ep, "-o", "json"]);
    let recs: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(recs[0]["token"].as_i64(), Some(token), "{out}");
}

/// A first endpoint that connects and then hangs (its member frozen) holds the first grant
/// and the creating transaction sent behind it: the grant is made again at the next endpoint
/// and the transaction is not waited for, so the job starts long before `--command-timeout`
/// (lead-exec-safety(7), "Round trips").
#[test]
fn a_first_endpoint_that_hangs_does_not_hold_the_job_for_the_command_timeout() {
    let f = Fixture::with(Etcd::start3());
    // A follower: a frozen raft leader would add an election to the test (more than the
    // dial timeout on a loaded machine), which is another test's subject.
    let hung = (f.etcd.raft_leader() + 1) % 3;
    let mut eps = vec![f.etcd.members[hung].endpoint()];
    eps.extend(
        (0..3)
            .filter(|&m| m != hung)
            .map(|m| f.etcd.members[m].endpoint()),
    );
    let eps = eps.join(",");
    f.etcd.members[hung].stop();
    let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/t");
    let lease = [
        "--ttl",
        "20s",
        "--command-timeout",
        "10s",
        "--dial-timeout",
        "2s",
    ];
    let started = std::time::Instant::now();
    let (code, _, err) = run(&run_args_with(&lease, "hang", &eps, &[], &job));
    let took = started.elapsed();
    f.etcd.members[hung].cont();
    assert_eq!(code, 0, "{err}");
    assert!(took < secs(6), "{took:?}: {err}");
    wait_int(&f.dir.path().join("t"), secs(1));
}

/// A worker that starts while etcd elects a leader (a member restarted, the raft leader
/// lost) waits for it within `--dial-timeout` instead of exiting 69 at the first "no leader".
#[test]
fn a_cluster_electing_its_leader_at_start_up_is_waited_for_within_the_dial_timeout() {
    let f = Fixture::with(Etcd::start3());
    let one = f.etcd.members[0].endpoint();
    f.etcd.members[1].stop();
    f.etcd.members[2].stop();
    let status = || {
        run(&[
            "status",
            "x",
            "--endpoints",
            &one,
            // Long enough for a loaded machine to get an answer at all: a member without a
            // leader answers "no leader" at once, and status asks again within this bound.
            "--dial-timeout",
            "1s",
        ])
    };
    // The member left alone says "no leader" once it notices: an operator command says so.
    let mut last = String::new();
    let noticed = wait_until(secs(30), || {
        let (code, _, err) = status();
        last = format!("exit {code}: {err}");
        code == 69 && err.contains("no leader")
    });
    assert!(
        noticed,
        "the lone member never said \"no leader\"; last {last}"
    );
    let job = script(f.dir.path(), "echo ran > $D/ran");
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args("x", &one, &["--dial-timeout", "20s"], &job),
    );
    // Still waiting for a leader, not failed.
    let (code, _, err) = status();
    assert_eq!(code, 69, "{err}");
    assert!(w.child.try_wait().unwrap().is_none(), "{}", w.log_text());
    f.etcd.members[1].cont();
    f.etcd.members[2].cont();
    assert_eq!(w.code(secs(30)), 0, "{}", w.log_text());
    assert_eq!(lines(&f.dir.path().join("ran")), vec!["ran"]);
}

/// A member whose commits take 1.5 s (its fdatasync delayed), listed with a dead endpoint:
/// a write gets the whole `--command-timeout` even when another endpoint could be tried, so
/// `pause` succeeds and `run` leads. Cut to a per-attempt bound, every write failed after 1 s
/// and was applied anyway.
#[test]
fn slow_commits_get_the_whole_command_timeout_with_several_endpoints() {
    let f = Fixture::with(Etcd::slow_commits(std::time::Duration::from_millis(1500)));
    let dead = format!("127.0.0.1:{}", free_port());
    let eps = format!("{},{dead}", f.ep);
    let t0 = std::time::Instant::now();
    let (code, _, err) = run(&[
        "pause",
        "slow",
        "--endpoints",
        &eps,
        "--reason",
        "slow disk",
        // The start-up probe is a read, bounded by the dial timeout: under strace on a loaded
        // machine it alone can take 2 s. The write is what this test is about.
        "--dial-timeout",
        "5s",
    ]);
    eprintln!(
        "pause with a slowed member and a dead one: exit {code} after {:?}",
        t0.elapsed()
    );
    assert_eq!(code, 0, "pause: {err}");
    assert_eq!(f.etcd.keys("lead-exec/meta/slow/paused").len(), 1);
    let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/led");
    // Start-up, the probe beside the first grant, is bounded by the dial timeout too.
    let args = run_args_with(
        &[],
        "slow-run",
        &eps,
        &["--no-wait", "--dial-timeout", "5s"],
        &job,
    );
    let t0 = std::time::Instant::now();
    let mut w = spawn(f.dir.path(), "w", &args);
    assert_eq!(w.code(secs(60)), 0, "{}", w.log_text());
    eprintln!(
        "run with a slowed member and a dead one: led and exited 0 after {:?}",
        t0.elapsed()
    );
    assert_eq!(lines(&f.dir.path().join("led")).len(), 1);
}

/// The candidate keys of an election, in line order.
fn line(etcd: &Etcd, name: &str) -> Vec<String> {
    etcd.keys(&format!("lead-exec/elections/{name}/"))
}

/// A waiting candidate whose watch breaks while etcd has no leader reads the line again, and
/// again, within `--command-timeout`: it keeps its place instead of leaving the line.
#[test]
fn a_waiting_candidate_keeps_its_place_through_an_etcd_leader_election() {
    let f = Fixture::with(Etcd::start3());
    let all = f.etcd.endpoints();
    let one = f.etcd.members[0].endpoint();
    // Leases that outlive the outage by far: only the line is at stake.
    let lease = ["--ttl", "20s", "--grace", "1s", "--safety-margin", "1s"];
    let holds = script(
        f.dir.path(),
        "echo $FENCING_TOKEN > $D/first; while [ ! -e $D/go ]; do sleep 0.05; done",
    );
    let first_args = run_args_with(&lease, "inline", &all, &["--id", "first"], &holds);
    let mut first = spawn(f.dir.path(), "first", &first_args);
    wait_line(&f.dir.path().join("first"), secs(10), |_| true);
    let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/second");
    // On the member that loses its leader only: its reads fail with "no leader".
    let second_args = run_args_with(&lease, "inline", &one, &["--id", "second", "-v"], &job);
    let mut second = spawn(f.dir.path(), "second", &second_args);
    second.wait_log("waiting behind first", secs(10));
    let before = line(&f.etcd, "inline");
    assert_eq!(before.len(), 2, "{before:?}");
    let json = f.etcd.ctl(&["get", &before[1], "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let place = v["kvs"][0]["create_revision"].as_i64().unwrap();
    f.etcd.members[1].stop();
    f.etcd.members[2].stop();
    // etcd cancels a require-leader watch after about three election timeouts without a
    // leader (1.5 s here); the candidate then reads the line and finds no leader.
    second.wait_log("no leader", secs(10));
    f.etcd.members[1].cont();
    f.etcd.members[2].cont();
    f.etcd.wait_healthy(secs(20));
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    let token = wait_int(&f.dir.path().join("second"), secs(20));
    assert_eq!(first.code(secs(10)), 0, "{}", first.log_text());
    assert_eq!(second.code(secs(10)), 0, "{}", second.log_text());
    // It led on the place it had: the key it created before the outage.
    assert_eq!(token, place, "{}", second.log_text());
}

/// A key of ours from an earlier campaign (its creating transaction applied, its answer lost,
/// then its revoke lost too) is recognised by the process identity in its value and revoked:
/// the candidate never waits behind itself.
#[test]
fn a_candidate_never_queues_behind_its_own_orphaned_key() {
    let f = Fixture::new();
    let holds = script(
        f.dir.path(),
        "echo $FENCING_TOKEN > $D/first; while [ ! -e $D/go ]; do sleep 0.05; done",
    );
    let mut first = spawn(
        f.dir.path(),
        "first",
        &run_args("orphan", &f.ep, &["--id", "first"], &holds),
    );
    wait_line(&f.dir.path().join("first"), secs(10), |_| true);
    let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/second");
    let mut second = spawn(
        f.dir.path(),
        "second",
        &run_args("orphan", &f.ep, &["--id", "second"], &job),
    );
    second.wait_log("waiting behind first", secs(10));
    let keys = line(&f.etcd, "orphan");
    assert_eq!(keys.len(), 2, "{keys:?}");
    let own = &keys[1];
    let value = f.etcd.ctl(&["get", "--print-value-only", own]);
    // The orphan: the same value on a lease this process does not hold, ahead of the key it
    // creates next.
    let granted = f.etcd.ctl(&["lease", "grant", "60"]);
    let lease = granted.split_whitespace().nth(1).unwrap().to_string();
    let orphan = format!("lead-exec/elections/orphan/{lease}");
    f.etcd
        .ctl(&["put", &format!("--lease={lease}"), &orphan, value.trim()]);
    // Out of line: the candidate campaigns again, on a new lease, behind the orphan.
    let own_lease = own.rsplit('/').next().unwrap();
    f.etcd.ctl(&["lease", "revoke", own_lease]);
    let gone = wait_until(secs(10), || !line(&f.etcd, "orphan").contains(&orphan));
    assert!(gone, "the orphaned key stayed:\n{}", second.log_text());
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    wait_line(&f.dir.path().join("second"), secs(10), |_| true);
    assert_eq!(first.code(secs(10)), 0, "{}", first.log_text());
    assert_eq!(second.code(secs(10)), 0, "{}", second.log_text());
    let log = second.log_text();
    assert!(!log.contains("waiting behind second"), "{log}");
    assert!(
        log.contains("a key of ours from an earlier campaign"),
        "{log}"
    );
}

/// An etcd outage behind two endpoints moves the pin back and forth on every attempt of every
/// request: its start is logged once and its end once, not each move (a 15-minute partition
/// soak logged 1,998 such lines, half of all). The moves are still counted in the metrics.
#[test]
fn an_etcd_outage_is_logged_when_it_starts_and_when_it_ends() {
    let mut f = Fixture::new();
    let dead = format!("127.0.0.1:{}", free_port());
    let eps = format!("{},{dead}", f.ep);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // A lease that outlives the outage: only the log is at stake.
    let lease = ["--ttl", "30s", "--grace", "1s", "--safety-margin", "1s"];
    let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/token; sleep 600");
    let args = run_args_with(&lease, "outage", &eps, &["--metrics-addr", &addr], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    wait_int(&f.dir.path().join("token"), secs(10));
    let moves = || {
        scrape(port)
            .and_then(|t| metric(&t, "lead_exec_etcd_endpoint_failovers_total"))
            .unwrap_or(0.0)
    };
    let before = moves();
    f.etcd.members[0].kill();
    assert!(
        wait_until(secs(30), || moves() >= before + 6.0),
        "the pin did not move back and forth: {}",
        w.log_text()
    );
    f.etcd.members[0].restart();
    w.wait_log("etcd answers again", secs(30));
    let log = w.log_text();
    let started = log.matches("etcd endpoint failed").count();
    let ended = log.matches("etcd answers again").count();
    assert_eq!((started, ended), (1, 1), "{log}");
    assert!(
        w.child.try_wait().unwrap().is_none(),
        "the term ended: {log}"
    );
    w.signal(libc::SIGTERM);
    w.wait(secs(15));
}
