//! Scheduling controls: `--timeout`, `--takeover-delay`, `--health-cmd`, `--slots`, `--priority`,
//! `--splay`, `--attempts` and `--retry-delay`.

use std::time::Duration;

use harness::*;

#[test]
fn a_job_past_its_timeout_is_stopped_the_next_candidate_leads_and_the_exit_is_124() {
    let f = Fixture::new();
    // It would run forever; it exits 0 on TERM, which must still not count as a success.
    let job_a = script(
        f.dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; \
         trap 'echo term >> $D/a; exit 0' TERM; while :; do sleep 0.05; done",
    );
    let same_key = ["--run-key", "nightly"];
    let mut a_args = vec!["--id", "a", "--timeout", "1s"];
    a_args.extend_from_slice(&same_key);
    let mut a = spawn(f.dir.path(), "a", &run_args("to", &f.ep, &a_args, &job_a));
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    let job_b = script(
        f.dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; exec sleep 60",
    );
    let mut b_args = vec!["--id", "b"];
    b_args.extend_from_slice(&same_key);
    let mut b = spawn(f.dir.path(), "b", &run_args("to", &f.ep, &b_args, &job_b));
    b.wait_log("waiting behind a", secs(10));

    assert_eq!(a.code(secs(10)), 124, "{}", a.log_text());
    assert_eq!(
        lines(&f.dir.path().join("a")),
        vec!["term"],
        "the job got SIGTERM"
    );
    // The run key was not recorded, so b runs the job, at once and with a larger token.
    let ok = wait_until(secs(10), || terms(f.dir.path()).len() >= 2);
    assert!(ok, "b did not take over:\n{}", b.log_text());
    let t = terms(f.dir.path());
    assert!(t[1].0 > t[0].0, "{t:?}");
    let (code, out, err) = run(&["history", "to", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let records: serde_json::Value = serde_json::from_str(&out).unwrap();
    let first = &records[0];
    assert_eq!(first["token"].as_i64(), Some(t[0].0), "{out}");
    assert_eq!(first["end"].as_str(), Some("timed out"), "{out}");
    b.signal(libc::SIGTERM);
    b.wait(secs(10));
}

#[test]
fn a_timeout_too_short_to_start_a_job_is_refused() {
    let (code, _, err) = run(&["run", "x", "--timeout", "1ms", "--", "true"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--timeout must be at least 10ms"), "{err}");
    let (code, _, err) = run(&["run", "x", "--timeout", "soon", "--", "true"]);
    assert_eq!(code, 64, "{err}");
}

/// The job records its term and its process group: "TOKEN PGID".
const RECORD_TERM: &str = "echo $FENCING_TOKEN $(cut -d' ' -f5 /proc/$$/stat) >> $D/terms";

#[test]
fn after_an_unclean_end_the_next_leader_waits_the_takeover_delay_and_status_shows_it() {
    let f = Fixture::new();
    let job = script(f.dir.path(), &format!("{RECORD_TERM}; exec sleep 60"));
    let delay = ["--takeover-delay", "4s"];
    let mut a = spawn(f.dir.path(), "a", &run_args("td", &f.ep, &delay, &job));
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    let mut b_args = vec!["--id", "b"];
    b_args.extend_from_slice(&delay);
    let mut b = spawn(f.dir.path(), "b", &run_args("td", &f.ep, &b_args, &job));
    b.wait_log("waiting behind", secs(10));

    let mut cmd = std::process::Command::new(bin());
    cmd.args(["watch", "td", "--endpoints", &f.ep]);
    let watch = LineReader::start(cmd);
    // A worker killed outright: its term never closes, and its lease runs out on the server.
    a.signal(libc::SIGKILL);
    a.wait(secs(5));
    // The log says what was judged: that term's record, never closed.
    b.wait_log("the previous term ended uncleanly (term ", secs(15));
    assert!(
        b.log_text().contains(" ended: not recorded"),
        "{}",
        b.log_text()
    );
    watch.expect(", job not started: takeover delay until ", secs(10));
    let elected = std::time::Instant::now();
    let (code, out, err) = run(&["status", "td", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("takeover delay"), "{out}");
    assert_eq!(lines(&f.dir.path().join("terms")).len(), 1, "started early");
    let ok = wait_until(secs(15), || lines(&f.dir.path().join("terms")).len() >= 2);
    assert!(ok, "b never started:\n{}", b.log_text());
    // Counted from b's log line, which comes after its election: never early.
    assert!(
        elected.elapsed() >= Duration::from_millis(3500),
        "started {:?} after the delay began",
        elected.elapsed()
    );
    let (code, out, err) = run(&["history", "td", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let records: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(records[0]["clean"].as_bool(), Some(false), "{out}");
    assert_eq!(
        records[1]["takeover_delay_ms"].as_u64(),
        Some(4000),
        "{out}"
    );
    let (_, text, _) = run(&["history", "td", "--endpoints", &f.ep]);
    assert!(text.contains("lease lost (unclean)"), "{text}");
    b.signal(libc::SIGTERM);
    b.wait(secs(10));
}

/// Under `--takeover-delay` a leader writes its start record before the job; a job that
/// then cannot start (its command gone: 127) closes that record as `not started`, clean, and
/// the next leader starts at once instead of waiting the delay out.
#[test]
fn a_job_that_could_not_start_is_recorded_as_not_started_and_the_next_leader_does_not_wait() {
    let f = Fixture::new();
    let d = f.dir.path();
    let delay = ["--takeover-delay", "30s"];
    let hold = script(d, "while [ ! -e $D/stop ]; do sleep 0.05; done");
    let h_args = ["--id", "h", delay[0], delay[1]];
    let mut h = spawn(d, "h", &run_args("nostart", &f.ep, &h_args, &hold));
    wait_until(secs(10), || {
        !f.etcd.keys("lead-exec/elections/nostart/").is_empty()
    });
    // A command that exists when `a` starts, and is gone when its term comes.
    let gone = d.join("gone.sh");
    std::fs::write(&gone, "#!/bin/sh\nexit 0\n").unwrap();
    let mut perms = std::fs::metadata(&gone).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&gone, perms).unwrap();
    let mut a_args = vec!["run", "nostart", "--endpoints", &f.ep];
    a_args.extend(FAST);
    a_args.extend(["--id", "a"]);
    a_args.extend(delay);
    let gone_path = gone.to_str().unwrap();
    a_args.extend(["--", gone_path]);
    let mut a = spawn(d, "a", &a_args);
    a.wait_log("waiting behind", secs(10));
    let b_job = script(d, "echo $FENCING_TOKEN > $D/b; exec sleep 120");
    let mut b_args = vec!["--id", "b"];
    b_args.extend(delay);
    let mut b = spawn(d, "b", &run_args("nostart", &f.ep, &b_args, &b_job));
    b.wait_log("waiting behind", secs(10));
    std::fs::remove_file(&gone).unwrap();
    std::fs::write(d.join("stop"), "").unwrap();
    assert_eq!(h.code(secs(10)), 0, "{}", h.log_text());
    assert_eq!(a.code(secs(15)), 127, "{}", a.log_text());
    let took = std::time::Instant::now();
    wait_int(&d.join("b"), secs(25));
    assert!(
        took.elapsed() < secs(10),
        "the next leader waited {:?} after a term whose job never started:\n{}",
        took.elapsed(),
        b.log_text()
    );
    assert!(
        !b.log_text().contains("ended uncleanly"),
        "{}",
        b.log_text()
    );
    let (code, out, err) = run(&["history", "nostart", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let records: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a_rec = records
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "a")
        .unwrap_or_else(|| panic!("no record of a: {out}"));
    assert_eq!(a_rec["end"], "not started", "{a_rec}");
    assert_eq!(a_rec["clean"], true, "{a_rec}");
    b.signal(libc::SIGTERM);
    b.wait(secs(10));
}

#[test]
fn a_clean_exit_or_resign_hands_over_at_once_despite_a_takeover_delay() {
    let f = Fixture::new();
    // Each job runs until its own file appears, then exits 0.
    let job = script(
        f.dir.path(),
        &format!("{RECORD_TERM}; while [ ! -e $D/stop-$FENCING_TOKEN ]; do sleep 0.05; done"),
    );
    let delay = ["--takeover-delay", "60s"];
    let mut workers = Vec::new();
    for name in ["a", "b", "c"] {
        let mut args = vec!["--id", name];
        args.extend_from_slice(&delay);
        workers.push(spawn(
            f.dir.path(),
            name,
            &run_args("clean", &f.ep, &args, &job),
        ));
        if name == "a" {
            wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
        }
    }
    workers[2].wait_log("waiting behind", secs(10));
    let token = |i: usize| {
        lines(&f.dir.path().join("terms"))[i]
            .split(' ')
            .next()
            .unwrap()
            .parse::<i64>()
            .unwrap()
    };

    // The job exits 0: the next one starts well inside the delay.
    std::fs::write(f.dir.path().join(format!("stop-{}", token(0))), "").unwrap();
    let ok = wait_until(secs(20), || lines(&f.dir.path().join("terms")).len() >= 2);
    assert!(ok, "no prompt takeover after a clean exit");
    // An operator's resign: likewise.
    let (code, _, err) = run(&["resign", "clean", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{err}");
    let ok = wait_until(secs(20), || lines(&f.dir.path().join("terms")).len() >= 3);
    assert!(ok, "no prompt takeover after a resign");
    for w in &workers {
        assert!(
            !w.log_text().contains("ended uncleanly"),
            "{}",
            w.log_text()
        );
    }
    for w in &mut workers {
        w.signal(libc::SIGTERM);
    }
    for w in &mut workers {
        w.wait(secs(10));
    }
}

/// A health check that passes while `$D/ok-NAME` exists, and records its process group.
fn health_args(dir: &std::path::Path, name: &str) -> Vec<String> {
    vec![
        "--health-cmd".into(),
        script(
            dir,
            &format!("cut -d' ' -f5 /proc/$$/stat > $D/check-pgid-{name}; test -e $D/ok-{name}"),
        ),
        "--health-interval".into(),
        "200ms".into(),
        "--health-failures".into(),
        "2".into(),
    ]
}

fn candidates(etcd: &Etcd, election: &str) -> usize {
    etcd.keys(&format!("lead-exec/elections/{election}/")).len()
}

#[test]
fn an_unhealthy_worker_does_not_campaign_until_its_check_passes_and_warns_once() {
    let f = Fixture::new();
    let job = script(f.dir.path(), &format!("{RECORD_TERM}; exec sleep 60"));
    let check = script(f.dir.path(), "echo run >> $D/checks; test -e $D/ok-a");
    let args = [
        "--id",
        "a",
        "--health-cmd",
        &check,
        "--health-interval",
        "100ms",
    ];
    let mut a = spawn(f.dir.path(), "a", &run_args("hc", &f.ep, &args, &job));
    a.wait_log("not campaigning until the health check passes", secs(10));
    assert_eq!(
        candidates(&f.etcd, "hc"),
        0,
        "an unhealthy worker joined the line"
    );
    assert!(lines(&f.dir.path().join("terms")).is_empty());
    // Failing ten times a second, it warns once (then once a minute), not at every check.
    assert!(wait_until(secs(10), || lines(&f.dir.path().join("checks"))
        .len()
        >= 8));
    let log = a.log_text();
    assert_eq!(log.matches("health check failed").count(), 1, "{log}");

    std::fs::write(f.dir.path().join("ok-a"), "").unwrap();
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    a.wait_log("health check passes again, after", secs(10));
    let (code, out, _) = run(&["status", "hc", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("leader:    a"), "{out}");
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
}

#[test]
fn a_leader_whose_check_keeps_failing_resigns_and_a_healthy_worker_takes_over() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        &format!("{RECORD_TERM}; trap 'echo term >> $D/stopped; exit 0' TERM; while :; do sleep 0.05; done"),
    );
    for n in ["a", "b"] {
        std::fs::write(f.dir.path().join(format!("ok-{n}")), "").unwrap();
    }
    let (ha, hb) = (
        health_args(f.dir.path(), "a"),
        health_args(f.dir.path(), "b"),
    );
    let mut a_args: Vec<&str> = vec!["--id", "a"];
    a_args.extend(ha.iter().map(String::as_str));
    let mut a = spawn(f.dir.path(), "a", &run_args("hl", &f.ep, &a_args, &job));
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    let mut b_args: Vec<&str> = vec!["--id", "b"];
    b_args.extend(hb.iter().map(String::as_str));
    let mut b = spawn(f.dir.path(), "b", &run_args("hl", &f.ep, &b_args, &job));
    b.wait_log("waiting behind a", secs(10));

    std::fs::remove_file(f.dir.path().join("ok-a")).unwrap();
    a.wait_log("the health check failed 2 times in a row", secs(10));
    let ok = wait_until(secs(10), || lines(&f.dir.path().join("terms")).len() >= 2);
    assert!(ok, "b did not take over:\n{}", b.log_text());
    assert_eq!(
        lines(&f.dir.path().join("stopped")),
        vec!["term"],
        "a's job got SIGTERM"
    );
    let t = lines(&f.dir.path().join("terms"));
    let (tok_a, pgid_a) = t[0].split_once(' ').unwrap();
    let (tok_b, _) = t[1].split_once(' ').unwrap();
    assert!(
        tok_b.parse::<i64>().unwrap() > tok_a.parse::<i64>().unwrap(),
        "{t:?}"
    );
    // The check ran outside the job's process group.
    let check_pgid = std::fs::read_to_string(f.dir.path().join("check-pgid-a")).unwrap();
    assert_ne!(
        check_pgid.trim(),
        pgid_a,
        "the check ran in the job's group"
    );
    // a stays out of line while unhealthy.
    a.wait_log("not campaigning until the health check passes", secs(10));
    assert_eq!(candidates(&f.etcd, "hl"), 1);
    let (_, out, _) = run(&["history", "hl", "--endpoints", &f.ep, "-o", "json"]);
    let records: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(records[0]["end"].as_str(), Some("unhealthy"), "{out}");
    assert_eq!(records[0]["clean"].as_bool(), Some(true), "{out}");
    for w in [&mut a, &mut b] {
        w.signal(libc::SIGTERM);
        w.wait(secs(10));
    }
}

#[test]
fn a_leader_whose_check_fails_between_its_election_and_the_start_gives_the_term_up_without_a_job() {
    use harness::proxy::{Mode, Proxy};
    let f = Fixture::new();
    // Every request of lead-exec's is slow, so its start (which writes the term's start
    // record first, under --takeover-delay) takes long enough for a check to fail in it.
    let proxy = Proxy::start(f.ep.clone());
    proxy.set(Mode::Delay(300));
    let ep = proxy.endpoint();
    let job = script(f.dir.path(), &format!("{RECORD_TERM}; exec sleep 60"));
    // Passes until the worker's log says it was elected, and fails from then on.
    let check = script(f.dir.path(), "! grep -q 'campaigning -> elected' $D/w.log");
    let lease = [
        "--ttl",
        "10s",
        "--grace",
        "500ms",
        "--safety-margin",
        "500ms",
    ];
    let flags = [
        "-v",
        "--id",
        "w",
        "--takeover-delay",
        "1s",
        "--health-cmd",
        &check,
        "--health-interval",
        "100ms",
        "--health-failures",
        "1",
    ];
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args_with(&lease, "hs", &ep, &flags, &job),
    );
    // The job may be stopped before its first line: the log says whether it started.
    let started = || w.log_text().contains("leading: job started");
    let decided = wait_until(secs(20), || {
        w.log_text().contains("not starting the job") || started()
    });
    assert!(decided, "{}", w.log_text());
    assert!(!started(), "the job started:\n{}", w.log_text());
    assert!(lines(&f.dir.path().join("terms")).is_empty());
    w.wait_log(
        "the health check failed 1 times in a row since the election",
        secs(1),
    );
    w.wait_log("not campaigning until the health check passes", secs(10));
    proxy.set(Mode::Pass);
    let (code, out, err) = run(&["history", "hs", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let records: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(records[0]["end"].as_str(), Some("unhealthy"), "{out}");
    assert_eq!(records[0]["clean"].as_bool(), Some(true), "{out}");
    assert_eq!(candidates(&f.etcd, "hs"), 0, "the term was not given up");
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

#[test]
fn a_waiting_candidate_leaves_the_line_while_unhealthy_and_requeues_when_it_passes() {
    let f = Fixture::new();
    let job = script(f.dir.path(), &format!("{RECORD_TERM}; exec sleep 60"));
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args("hw", &f.ep, &["--id", "a"], &job),
    );
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    std::fs::write(f.dir.path().join("ok-b"), "").unwrap();
    let hb = health_args(f.dir.path(), "b");
    let mut b_args: Vec<&str> = vec!["--id", "b"];
    b_args.extend(hb.iter().map(String::as_str));
    let mut b = spawn(f.dir.path(), "b", &run_args("hw", &f.ep, &b_args, &job));
    b.wait_log("waiting behind a", secs(10));
    assert_eq!(candidates(&f.etcd, "hw"), 2);

    std::fs::remove_file(f.dir.path().join("ok-b")).unwrap();
    b.wait_log("leaving the line until it passes", secs(10));
    assert!(
        wait_until(secs(10), || candidates(&f.etcd, "hw") == 1),
        "b's key stayed"
    );
    std::fs::write(f.dir.path().join("ok-b"), "").unwrap();
    b.wait_log("the health check passes; campaigning", secs(10));
    assert!(
        wait_until(secs(10), || candidates(&f.etcd, "hw") == 2),
        "b did not requeue"
    );
    assert_eq!(
        lines(&f.dir.path().join("terms")).len(),
        1,
        "the leader was disturbed"
    );
    for w in [&mut a, &mut b] {
        w.signal(libc::SIGTERM);
        w.wait(secs(10));
    }
}

#[test]
fn bad_health_priority_and_takeover_settings_are_refused_with_64() {
    let cases: [(&[&str], &str); 7] = [
        (
            &["--slots", "2", "--priority", "1"],
            "--priority with --slots 2",
        ),
        (
            &["--slots", "2", "--takeover-delay", "1s"],
            "--takeover-delay with --slots 2",
        ),
        (
            &["--health-cmd", "true", "--health-interval", "1ms"],
            "--health-interval must be at least",
        ),
        (
            &["--health-cmd", "true", "--health-failures", "0"],
            "--health-failures must be at least 1",
        ),
        (&["--health-cmd", " "], "--health-cmd must not be empty"),
        (&["--health-interval", "1s"], "--health-cmd"),
        (&["--takeover-delay", "soon"], "--takeover-delay"),
    ];
    for (flags, says) in cases {
        let mut args = vec!["run", "x"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "true"]);
        let (code, _, err) = run(&args);
        assert_eq!(code, 64, "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[test]
fn a_higher_priority_candidate_takes_over_after_the_leaders_min_term_and_lower_ones_let_it_pass() {
    let f = Fixture::new();
    // One file in event order: each job's start, and its stop on TERM.
    let job = script(
        f.dir.path(),
        "echo start $LEAD_EXEC_ID $FENCING_TOKEN >> $D/events; \
         trap 'echo stop $LEAD_EXEC_ID >> $D/events; exit 0' TERM; while :; do sleep 0.05; done",
    );
    let started = |n: usize| {
        wait_until(secs(20), || {
            lines(&f.dir.path().join("events"))
                .iter()
                .filter(|l| l.starts_with("start"))
                .count()
                >= n
        })
    };
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args("pr", &f.ep, &["--id", "a", "--min-term", "3s"], &job),
    );
    assert!(started(1));
    let elected = std::time::Instant::now();
    let mut b = spawn(
        f.dir.path(),
        "b",
        &run_args("pr", &f.ep, &["--id", "b"], &job),
    );
    b.wait_log("waiting behind a", secs(10));
    let mut c = spawn(
        f.dir.path(),
        "c",
        &run_args("pr", &f.ep, &["--id", "c", "--priority", "10"], &job),
    );
    c.wait_log("asked a (priority 0", secs(10));
    a.wait_log("once --min-term 3s is over", secs(10));
    let (_, out, _) = run(&["status", "pr", "--endpoints", &f.ep]);
    assert!(out.contains("priority 10"), "{out}");
    // The pending request shows beside the leader it is for.
    assert!(
        out.contains("handover:  requested by c (priority 10)"),
        "{out}"
    );
    let (_, js, _) = run(&["status", "pr", "--endpoints", &f.ep, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&js).unwrap();
    assert_eq!(v["leader"]["handover_requested"]["by"], "c", "{js}");

    // a hands over only after its min-term, and b, older but lower, lets c pass.
    assert!(started(2), "c never started:\n{}", c.log_text());
    assert!(
        elected.elapsed() >= Duration::from_millis(2900),
        "preempted within --min-term"
    );
    b.wait_log("letting a higher-priority candidate pass", secs(10));
    let ev = lines(&f.dir.path().join("events"));
    assert_eq!(ev[0].split(' ').nth(1), Some("a"), "{ev:?}");
    assert_eq!(
        ev[1], "stop a",
        "the old job stopped before the new one started: {ev:?}"
    );
    assert_eq!(ev[2].split(' ').nth(1), Some("c"), "{ev:?}");
    // No loop: a and b queue behind c (in either order) and ask nothing of it.
    let behind = wait_until(secs(10), || {
        let t = a.log_text();
        t.contains("waiting behind c") || t.contains("waiting behind b")
    });
    assert!(behind, "a did not queue again:\n{}", a.log_text());
    assert!(
        f.etcd.keys("lead-exec/meta/pr/resign").is_empty(),
        "a request was left"
    );
    assert_eq!(lines(&f.dir.path().join("events")).len(), 3);
    // a's term is recorded as preempted, by whom, not as resigned.
    let (_, hist, _) = run(&["history", "pr", "--endpoints", &f.ep, "-o", "json"]);
    let recs: Vec<serde_json::Value> = serde_json::from_str(&hist).unwrap();
    let first = &recs[0];
    assert_eq!(first["id"], "a", "{hist}");
    assert_eq!(first["end"], "preempted", "{hist}");
    assert_eq!(first["preempted_by"]["id"], "c", "{hist}");
    assert_eq!(first["preempted_by"]["priority"], 10, "{hist}");
    let (_, text, _) = run(&["history", "pr", "--endpoints", &f.ep]);
    assert!(text.contains("preempted by c (priority 10)"), "{text}");
    for w in [&mut a, &mut b, &mut c] {
        w.signal(libc::SIGTERM);
    }
    for w in [&mut a, &mut b, &mut c] {
        w.wait(secs(10));
    }
}

#[test]
fn a_preemption_request_lapses_once_the_candidate_that_made_it_has_left() {
    let f = Fixture::new();
    let job = script(f.dir.path(), &format!("{RECORD_TERM}; exec sleep 60"));
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args("lapse", &f.ep, &["--id", "a", "--min-term", "1s"], &job),
    );
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    // A preferred cron worker: it asks the leader to hand over, then gives up at once.
    let never = script(f.dir.path(), "echo ran >> $D/never");
    let (code, _, err) = run(&run_args(
        "lapse",
        &f.ep,
        &["--id", "p", "--priority", "5", "--no-wait"],
        &never,
    ));
    assert_eq!(code, 75, "{err}");
    assert!(err.contains("asked a (priority 0"), "{err}");
    a.wait_log("a higher-priority candidate asks for the term", secs(10));
    // Past the min-term, the leader looks again and finds nobody to hand over to.
    let judged = wait_until(secs(10), || {
        a.log_text()
            .contains("no higher-priority candidate is in line any more")
            || lines(&f.dir.path().join("terms")).len() > 1
    });
    assert!(judged, "{}", a.log_text());
    assert_eq!(
        lines(&f.dir.path().join("terms")).len(),
        1,
        "the job was restarted for a candidate that had left:\n{}",
        a.log_text()
    );
    assert!(!f.dir.path().join("never").exists());
    assert!(
        !a.log_text().contains("handing over to the higher-priority"),
        "{}",
        a.log_text()
    );
    // A later request from a candidate that stays in line is still honoured.
    let mut c = spawn(
        f.dir.path(),
        "c",
        &run_args("lapse", &f.ep, &["--id", "c", "--priority", "5"], &job),
    );
    let ok = wait_until(secs(15), || lines(&f.dir.path().join("terms")).len() >= 2);
    assert!(ok, "c never took over:\n{}\n{}", a.log_text(), c.log_text());
    for w in [&mut a, &mut c] {
        w.signal(libc::SIGTERM);
        w.wait(secs(10));
    }
}

#[test]
fn min_term_counts_from_the_jobs_start_after_a_takeover_delay() {
    let f = Fixture::new();
    // "start ID NANOS" when the job starts, "stop ID NANOS" on TERM.
    let job = script(
        f.dir.path(),
        "echo start $LEAD_EXEC_ID $(date +%s%N) >> $D/events; \
         trap 'echo stop $LEAD_EXEC_ID $(date +%s%N) >> $D/events; exit 0' TERM; \
         while :; do sleep 0.05; done",
    );
    let events = || lines(&f.dir.path().join("events"));
    let at = |what: &str, id: &str| -> Option<i64> {
        events().iter().find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0] == what && f[1] == id).then(|| f[2].parse().unwrap())
        })
    };
    let delay = ["--takeover-delay", "2s", "--min-term", "2s"];
    let worker = |id: &'static str, extra: &[&'static str]| {
        let mut args = vec!["--id", id];
        args.extend_from_slice(&delay);
        args.extend_from_slice(extra);
        spawn(f.dir.path(), id, &run_args("mt", &f.ep, &args, &job))
    };
    let mut a = worker("a", &[]);
    assert!(wait_until(secs(10), || at("start", "a").is_some()));
    let mut b = worker("b", &[]);
    b.wait_log("waiting behind a", secs(10));
    // An unclean end: b waits out the delay, which is as long as its min-term.
    a.signal(libc::SIGKILL);
    a.wait(secs(5));
    b.wait_log("ended uncleanly", secs(15));
    assert!(
        wait_until(secs(15), || at("start", "b").is_some()),
        "{}",
        b.log_text()
    );
    // A preferred worker arrives right after b's job started.
    let mut c = worker("c", &["--priority", "5"]);
    c.wait_log("asked b (priority 0", secs(10));
    assert!(
        wait_until(secs(15), || at("stop", "b").is_some()),
        "{}",
        b.log_text()
    );
    let ran = at("stop", "b").unwrap() - at("start", "b").unwrap();
    assert!(
        ran >= 1_900_000_000,
        "b's job was preempted {} ms after it started, within its --min-term",
        ran / 1_000_000
    );
    assert!(wait_until(secs(10), || at("start", "c").is_some()));
    for w in [&mut b, &mut c] {
        w.signal(libc::SIGTERM);
        w.wait(secs(10));
    }
}

#[test]
fn a_worker_whose_takeover_delay_differs_from_the_elections_is_refused_with_64() {
    let f = Fixture::new();
    let job = script(f.dir.path(), &format!("{RECORD_TERM}; exec sleep 60"));
    let never = script(f.dir.path(), "echo ran >> $D/never");
    // A leader without the flag: a worker with one would judge its term by a start record
    // it writes only beside its job, so it is refused instead of trusting that.
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args("tda", &f.ep, &["--id", "a"], &job),
    );
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    let (code, _, err) = run(&run_args("tda", &f.ep, &["--takeover-delay", "2s"], &never));
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("election tda runs with --takeover-delay 0s; this worker has --takeover-delay 2s: all candidates of an election must agree (stop them all to change it)"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    a.signal(libc::SIGTERM);
    a.wait(secs(10));

    // Once nobody is left, the next first candidate sets it; then a worker without it, or
    // with another delay, is refused.
    let mut b = spawn(
        f.dir.path(),
        "b",
        &run_args("tda", &f.ep, &["--id", "b", "--takeover-delay", "2s"], &job),
    );
    let ok = wait_until(secs(10), || lines(&f.dir.path().join("terms")).len() >= 2);
    assert!(ok, "{}", b.log_text());
    let stored = f.etcd.ctl(&[
        "get",
        "--print-value-only",
        "lead-exec/meta/tda/takeover-delay",
    ]);
    assert_eq!(stored.trim(), "2000");
    for (flags, ours) in [(vec![], "0s"), (vec!["--takeover-delay", "3s"], "3s")] {
        let (code, _, err) = run(&run_args("tda", &f.ep, &flags, &never));
        assert_eq!(code, 64, "{err}");
        assert!(
            err.contains(&format!(
                "runs with --takeover-delay 2s; this worker has --takeover-delay {ours}:"
            )),
            "{err}"
        );
    }
    assert!(!f.dir.path().join("never").exists());
    assert_eq!(f.etcd.keys("lead-exec/elections/tda/").len(), 1);
    b.signal(libc::SIGTERM);
    b.wait(secs(10));
}

#[test]
fn the_first_leader_with_a_takeover_delay_after_workers_without_one_waits_it_out() {
    let f = Fixture::new();
    let job = script(f.dir.path(), &format!("{RECORD_TERM}; exec sleep 60"));
    // A clean term first: the newest record the next leader can find says "exit 0".
    let quick = script(f.dir.path(), RECORD_TERM);
    let (code, _, err) = run(&run_args("tdk", &f.ep, &["--id", "z"], &quick));
    assert_eq!(code, 0, "{err}");
    // A worker without the delay, whose start record never lands (deleted here as if its
    // write had failed), then is killed outright.
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args("tdk", &f.ep, &["--id", "a"], &job),
    );
    assert!(wait_until(secs(10), || f
        .etcd
        .keys("lead-exec/meta/tdk/history/")
        .len()
        == 2));
    let newest = f.etcd.keys("lead-exec/meta/tdk/history/").pop().unwrap();
    f.etcd.ctl(&["del", &newest]);
    a.signal(libc::SIGKILL);
    a.wait(secs(5));
    // Once its lease is gone the election is empty, and a worker with a delay may set it.
    assert!(wait_until(secs(15), || candidates(&f.etcd, "tdk") == 0));
    let mut b = spawn(
        f.dir.path(),
        "b",
        &run_args("tdk", &f.ep, &["--id", "b", "--takeover-delay", "2s"], &job),
    );
    let judged = wait_until(secs(10), || {
        b.log_text()
            .contains("ran without --takeover-delay until now")
            || lines(&f.dir.path().join("terms")).len() >= 3
    });
    let told = std::time::Instant::now();
    assert!(judged, "{}", b.log_text());
    assert_eq!(
        lines(&f.dir.path().join("terms")).len(),
        2,
        "started at once:\n{}",
        b.log_text()
    );
    let ok = wait_until(secs(10), || lines(&f.dir.path().join("terms")).len() >= 3);
    assert!(ok, "b never started:\n{}", b.log_text());
    assert!(
        told.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        told.elapsed()
    );
    b.signal(libc::SIGTERM);
    b.wait(secs(10));
}

#[test]
fn equal_priorities_never_preempt() {
    let f = Fixture::new();
    let job = script(f.dir.path(), &format!("{RECORD_TERM}; exec sleep 60"));
    let prio = |id: &'static str| vec!["--id", id, "--priority", "5", "--min-term", "0s"];
    let mut a = spawn(f.dir.path(), "a", &run_args("eq", &f.ep, &prio("a"), &job));
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    let mut b = spawn(f.dir.path(), "b", &run_args("eq", &f.ep, &prio("b"), &job));
    // A request would be written before b reports its place in line.
    b.wait_log("waiting behind a", secs(10));
    assert!(f.etcd.keys("lead-exec/meta/eq/resign").is_empty());
    assert!(!b.log_text().contains("asked"), "{}", b.log_text());
    assert_eq!(lines(&f.dir.path().join("terms")).len(), 1);
    for w in [&mut a, &mut b] {
        w.signal(libc::SIGTERM);
        w.wait(secs(10));
    }
}

#[test]
fn a_negative_priority_is_refused_with_64() {
    let (code, _, err) = run(&["run", "x", "--priority", "-1", "--", "true"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--priority"), "{err}");
}

/// A job for slot tests: logs "start TOKEN SLOT ID" and, when it ends (its stop file
/// `stop.TOKEN` appears, or SIGTERM), "end TOKEN".
fn slot_job(dir: &std::path::Path) -> String {
    script(
        dir,
        "echo start $FENCING_TOKEN $LEAD_EXEC_SLOT $LEAD_EXEC_ID >> $D/log; \
         trap 'echo end $FENCING_TOKEN >> $D/log; exit 0' TERM; \
         while [ ! -e $D/stop.$FENCING_TOKEN ]; do sleep 0.05; done; \
         echo end $FENCING_TOKEN >> $D/log",
    )
}

/// One line of [`slot_job`]'s log.
#[derive(Debug, Clone, PartialEq)]
enum SlotEv {
    Start { token: i64, slot: u32, id: String },
    End { token: i64 },
}

fn slot_log(dir: &std::path::Path) -> Vec<SlotEv> {
    lines(&dir.join("log"))
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[0] {
                "start" => SlotEv::Start {
                    token: f[1].parse().unwrap(),
                    slot: f[2].parse().unwrap(),
                    id: f[3].to_string(),
                },
                _ => SlotEv::End {
                    token: f[1].parse().unwrap(),
                },
            }
        })
        .collect()
}

/// Jobs running now, by the log: (token, slot, id).
fn running(dir: &std::path::Path) -> Vec<(i64, u32, String)> {
    let mut live = Vec::new();
    for e in slot_log(dir) {
        match e {
            SlotEv::Start { token, slot, id } => live.push((token, slot, id)),
            SlotEv::End { token } => live.retain(|r| r.0 != token),
        }
    }
    live
}

/// The most jobs the log ever shows at once. A job logs its end before it exits, and the
/// next holder starts only after that, so the order of lines is the order of events.
fn most_at_once(dir: &std::path::Path) -> usize {
    let (mut live, mut most) = (0usize, 0);
    for e in slot_log(dir) {
        match e {
            SlotEv::Start { .. } => live += 1,
            SlotEv::End { .. } => live -= 1,
        }
        most = most.max(live);
    }
    most
}

/// Starts worker `id` in election `name` with `--slots N` and [`slot_job`].
fn slot_worker(dir: &std::path::Path, name: &str, ep: &str, n: &str, id: &str) -> Worker {
    let job = slot_job(dir);
    spawn(
        dir,
        id,
        &run_args(name, ep, &["--slots", n, "--id", id], &job),
    )
}

/// Waits until `n` jobs run, and returns them.
fn wait_running(dir: &std::path::Path, n: usize) -> Vec<(i64, u32, String)> {
    let ok = wait_until(secs(10), || running(dir).len() == n);
    assert!(ok, "{n} jobs never ran at once: {:?}", slot_log(dir));
    running(dir)
}

#[test]
fn slots_run_at_most_n_jobs_each_with_its_own_token_and_slot() {
    let f = Fixture::new();
    let mut w: Vec<Worker> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| slot_worker(f.dir.path(), "sl", &f.ep, "2", id))
        .collect();
    let held = wait_running(f.dir.path(), 2);
    let waiting: Vec<&Worker> = w
        .iter()
        .zip(["a", "b", "c", "d"])
        .filter(|(_, id)| !held.iter().any(|h| h.2 == *id))
        .map(|(w, _)| w)
        .collect();
    for x in &waiting {
        x.wait_log("waiting for one of 2 slots (2 ahead)", secs(10));
    }
    assert_ne!(held[0].0, held[1].0, "tokens are distinct: {held:?}");
    let mut slots: Vec<u32> = held.iter().map(|h| h.1).collect();
    slots.sort();
    assert_eq!(slots, [0, 1], "{held:?}");

    // One holder's job exits: a waiting candidate takes its slot, at once and once.
    let (token, slot, id) = held[0].clone();
    std::fs::write(f.dir.path().join(format!("stop.{token}")), "").unwrap();
    let i = ["a", "b", "c", "d"].iter().position(|x| *x == id).unwrap();
    assert_eq!(w[i].code(secs(10)), 0, "{}", w[i].log_text());
    let ok = wait_until(secs(10), || {
        running(f.dir.path()).iter().any(|r| r.0 != held[1].0)
    });
    assert!(
        ok,
        "nobody took the freed slot: {:?}",
        slot_log(f.dir.path())
    );
    let now = running(f.dir.path());
    let next = now.iter().find(|r| r.0 != held[1].0).unwrap();
    assert_eq!(next.1, slot, "the freed slot is taken: {now:?}");
    assert!(next.0 > held[0].0.max(held[1].0), "{now:?}");
    assert_eq!(now.len(), 2, "{now:?}");
    assert_eq!(
        most_at_once(f.dir.path()),
        2,
        "{:?}",
        slot_log(f.dir.path())
    );
    for x in &mut w {
        x.signal(libc::SIGTERM);
    }
    for x in &mut w {
        x.wait(secs(10));
    }
    assert_eq!(
        most_at_once(f.dir.path()),
        2,
        "{:?}",
        slot_log(f.dir.path())
    );
}

#[test]
fn status_and_check_see_every_holder_with_its_token_and_slot() {
    let f = Fixture::new();
    let _w: Vec<Worker> = ["a", "b", "c"]
        .iter()
        .map(|id| slot_worker(f.dir.path(), "st", &f.ep, "2", id))
        .collect();
    let held = wait_running(f.dir.path(), 2);
    let (code, out, err) = run(&["status", "st", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["slots"], 2, "{out}");
    let holders = v["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{out}");
    for (token, slot, id) in &held {
        let h = holders.iter().find(|h| h["token"] == *token).expect(&out);
        assert_eq!(h["slot"], *slot, "{out}");
        assert_eq!(h["id"], id.as_str(), "{out}");
    }
    assert_eq!(v["waiting"].as_array().unwrap().len(), 1, "{out}");

    let (code, out, _) = run(&["status", "st", "--endpoints", &f.ep]);
    assert_eq!(code, 0);
    assert!(out.contains("slots:     2"), "{out}");
    for (token, slot, id) in &held {
        assert!(
            out.contains(&format!("slot {slot}: {id} ")) && out.contains(&format!("token {token}")),
            "{out}"
        );
    }

    let check = |token: i64| {
        run(&[
            "check",
            "--election",
            "st",
            "--endpoints",
            &f.ep,
            "--token",
            &token.to_string(),
        ])
    };
    for (token, _, _) in &held {
        let (code, out, err) = check(*token);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.is_empty() && err.is_empty(),
            "check is silent: {out}{err}"
        );
    }
    let (code, _, err) = check(held[0].0.max(held[1].0) + 1000);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("the holders' tokens are"), "{err}");
}

#[test]
fn candidates_that_disagree_on_slots_are_refused_with_64() {
    let f = Fixture::new();
    let _a = slot_worker(f.dir.path(), "dis", &f.ep, "3", "a");
    wait_running(f.dir.path(), 1);
    for (flags, theirs) in [(vec!["--slots", "2"], "2"), (vec![], "1")] {
        let (code, _, err) = run(&run_args("dis", &f.ep, &flags, "echo ran >> never"));
        assert_eq!(code, 64, "{err}");
        assert!(
            err.contains(&format!(
                "election dis runs with --slots 3; this worker has --slots {theirs}: all candidates of an election must agree (stop them all to change it)"
            )),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    assert_eq!(running(f.dir.path()).len(), 1);
    // The refused candidates left no key behind.
    assert_eq!(f.etcd.keys("lead-exec/elections/dis/").len(), 1);
}

#[test]
fn slots_can_be_changed_once_every_candidate_has_left() {
    let f = Fixture::new();
    let job = script(f.dir.path(), "echo $LEAD_EXEC_SLOT >> $D/slots");
    for n in ["3", "2", "1", "2"] {
        let (code, _, err) = run(&run_args("chg", &f.ep, &["--slots", n], &job));
        assert_eq!(code, 0, "--slots {n}: {err}");
        let stored = f
            .etcd
            .ctl(&["get", "--print-value-only", "lead-exec/meta/chg/slots"]);
        let want = if n == "1" { "" } else { n };
        assert_eq!(stored.trim(), want, "after --slots {n}");
    }
    assert_eq!(lines(&f.dir.path().join("slots")), ["0", "0", "0", "0"]);
    // The slot keys went with each term.
    assert!(f.etcd.keys("lead-exec/meta/chg/slot/").is_empty());
}

#[test]
fn resign_with_a_token_moves_one_holder() {
    let f = Fixture::new();
    let mut w: Vec<Worker> = ["a", "b", "c"]
        .iter()
        .map(|id| slot_worker(f.dir.path(), "rs", &f.ep, "2", id))
        .collect();
    let held = wait_running(f.dir.path(), 2);
    let waiter = ["a", "b", "c"]
        .iter()
        .position(|id| !held.iter().any(|h| h.2 == *id))
        .unwrap();
    w[waiter].wait_log("waiting for one of 2 slots", secs(10));
    let (token, slot, _) = held[0].clone();
    let (code, out, err) = run(&[
        "resign",
        "rs",
        "--endpoints",
        &f.ep,
        "--token",
        &token.to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resigned; holders now:"), "{out}");
    let ok = wait_until(secs(10), || {
        running(f.dir.path())
            .iter()
            .any(|r| r.2 == ["a", "b", "c"][waiter])
    });
    assert!(
        ok,
        "the waiting candidate did not take over: {:?}",
        slot_log(f.dir.path())
    );
    let log = slot_log(f.dir.path());
    assert!(log.contains(&SlotEv::End { token }), "{log:?}");
    assert!(
        !log.contains(&SlotEv::End { token: held[1].0 }),
        "the other holder keeps running: {log:?}"
    );
    let now = running(f.dir.path());
    let next = now.iter().find(|r| r.2 == ["a", "b", "c"][waiter]).unwrap();
    assert_eq!(next.1, slot, "{now:?}");
    assert_eq!(most_at_once(f.dir.path()), 2, "{log:?}");
    // A token that holds nothing is refused.
    let (code, _, err) = run(&["resign", "rs", "--endpoints", &f.ep, "--token", "1"]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("token 1 is not a holder's"), "{err}");
    for x in &mut w {
        x.signal(libc::SIGTERM);
        x.wait(secs(10));
    }
}

#[test]
fn resign_without_a_token_with_several_holders_is_refused() {
    let f = Fixture::new();
    let _w: Vec<Worker> = ["a", "b"]
        .iter()
        .map(|id| slot_worker(f.dir.path(), "rn", &f.ep, "2", id))
        .collect();
    let held = wait_running(f.dir.path(), 2);
    let (code, _, err) = run(&["resign", "rn", "--endpoints", &f.ep]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("election rn runs with --slots 2: name the holder to resign with --token T"),
        "{err}"
    );
    assert!(f.etcd.keys("lead-exec/meta/rn/resign").is_empty());
    assert_eq!(running(f.dir.path()), held, "nothing moved");
}

#[test]
fn bad_slot_counts_and_slots_with_a_run_key_are_refused_with_64() {
    for (flags, says) in [
        (
            vec!["--slots", "0"],
            "--slots 0: must be between 1 and 1024",
        ),
        (
            vec!["--slots", "1025"],
            "--slots 1025: must be between 1 and 1024",
        ),
        (vec!["--slots", "two"], "--slots"),
        (
            vec!["--slots", "2", "--run-key", "nightly"],
            "a run key runs the job once",
        ),
    ] {
        let mut args = vec!["run", "x"];
        args.extend_from_slice(&flags);
        args.extend_from_slice(&["--", "true"]);
        let (code, _, err) = run(&args);
        assert_eq!(code, 64, "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    let (code, _, err) = run_env(&["run", "x", "--", "true"], &[("LEAD_EXEC_SLOTS", "0")]);
    assert_eq!(code, 64, "{err}");
}

/// Processes whose command line contains `marker`, other than this test's own.
fn marked(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .filter(|pid| alive(*pid))
        .collect()
}

/// A check that passes `passes` times, then hangs (in `sleep`, whose argument is the marker)
/// after writing `$D/hanging`. Returns the check and its marker.
fn hanging_check(dir: &std::path::Path, passes: u32) -> (String, String) {
    let marker = format!("1000.{}{}", std::process::id(), passes);
    let check = script(
        dir,
        &format!(
            "n=$(cat $D/count 2>/dev/null || echo 0); echo $((n+1)) > $D/count; \
             [ $n -lt {passes} ] && exit 0; echo $$ > $D/hanging; sleep {marker}; exit 0"
        ),
    );
    (check, marker)
}

/// No process of the check is left within a few seconds; kills any that are, for the next
/// test's sake.
fn assert_no_check_left(marker: &str) {
    let clean = wait_until(secs(5), || marked(marker).is_empty());
    let left = marked(marker);
    for pid in &left {
        signal(*pid, libc::SIGKILL);
    }
    assert!(clean, "health check processes outlived lead-exec: {left:?}");
}

fn health_leak_worker(
    dir: &std::path::Path,
    name: &str,
    ep: &str,
    check: &str,
    extra: &[&str],
) -> Worker {
    let mut args = vec![
        "--id",
        name,
        "--health-cmd",
        check,
        "--health-interval",
        "3s",
        "--health-failures",
        "5",
    ];
    args.extend_from_slice(extra);
    spawn(dir, name, &run_args("hleak", ep, &args, "exec sleep 60"))
}

#[test]
fn a_health_check_does_not_outlive_a_no_wait_exit() {
    let f = Fixture::new();
    let (check, marker) = hanging_check(f.dir.path(), 0);
    let mut w = health_leak_worker(f.dir.path(), "nw", &f.ep, &check, &["--no-wait"]);
    wait_line(&f.dir.path().join("hanging"), secs(10), |_| true);
    assert_eq!(w.code(secs(10)), 79, "{}", w.log_text());
    assert_no_check_left(&marker);
}

#[test]
fn a_health_check_does_not_outlive_sigterm_while_waiting() {
    let f = Fixture::new();
    let (check, marker) = hanging_check(f.dir.path(), 0);
    let mut w = health_leak_worker(f.dir.path(), "w", &f.ep, &check, &[]);
    wait_line(&f.dir.path().join("hanging"), secs(10), |_| true);
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
    assert_no_check_left(&marker);
}

#[test]
fn a_health_check_does_not_outlive_sigterm_while_leading() {
    let f = Fixture::new();
    let (check, marker) = hanging_check(f.dir.path(), 1);
    let mut w = health_leak_worker(f.dir.path(), "l", &f.ep, &check, &[]);
    w.wait_job_started();
    wait_line(&f.dir.path().join("hanging"), secs(10), |_| true);
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
    assert_no_check_left(&marker);
}

#[test]
fn a_health_check_does_not_outlive_a_sigkilled_lead_exec() {
    let f = Fixture::new();
    let (check, marker) = hanging_check(f.dir.path(), 1);
    let mut w = health_leak_worker(f.dir.path(), "k", &f.ep, &check, &[]);
    w.wait_job_started();
    wait_line(&f.dir.path().join("hanging"), secs(10), |_| true);
    w.signal(libc::SIGKILL);
    w.wait(secs(10));
    assert_no_check_left(&marker);
}

/// A higher-priority candidate that asked for the term and then crashed leaves its request on
/// the leader's lease; the leader rightly keeps the term (nobody higher is in line), and
/// `status` must not go on showing a handover that will never come.
#[test]
fn status_drops_a_handover_request_whose_requester_is_gone() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN >> $D/terms; exec sleep 60",
    );
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args("prgone", &f.ep, &["--id", "a", "--min-term", "60s"], &job),
    );
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    let mut c = spawn(
        f.dir.path(),
        "c",
        &run_args("prgone", &f.ep, &["--id", "c", "--priority", "10"], &job),
    );
    c.wait_log("asked a (priority 0", secs(10));
    let status = || run(&["status", "prgone", "--endpoints", &f.ep]).1;
    let out = status();
    assert!(out.contains("handover:  requested by c"), "{out}");
    c.signal(libc::SIGKILL);
    c.wait(secs(10));
    // c's key goes with its lease (TTL 3 s).
    let gone = wait_until(secs(15), || status().contains("waiting:   0"));
    assert!(gone, "c's key stayed:\n{}", status());
    let out = status();
    let (_, js, _) = run(&["status", "prgone", "--endpoints", &f.ep, "-o", "json"]);
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
    assert!(!out.contains("handover:"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&js).unwrap();
    assert!(v["leader"]["handover_requested"].is_null(), "{js}");
    assert_eq!(
        lines(&f.dir.path().join("terms")).len(),
        1,
        "a gave its term up"
    );
}

/// A guard that is SIGKILLed takes only the check's shell with it (PR_SET_PDEATHSIG); what
/// the shell started runs on in the check's group, holding the output pipe. lead-exec kills
/// that group itself, without waiting for its own exit. The guard shows as `lexec-health`
/// to `pgrep` and `ps -o comm`, not as "exe".
#[test]
fn a_health_check_does_not_outlive_its_sigkilled_guard() {
    let f = Fixture::new();
    let marker = format!("1000.{}7", std::process::id());
    // Hangs on its first run only; passes afterwards.
    let check = script(
        f.dir.path(),
        &format!(
            "n=$(cat $D/count 2>/dev/null || echo 0); echo $((n+1)) > $D/count; \
             [ $n -gt 0 ] && exit 0; echo $$ > $D/hanging; sleep {marker}; exit 0"
        ),
    );
    let args = [
        "--id",
        "g",
        "--health-cmd",
        &check,
        "--health-interval",
        "2s",
        "--health-failures",
        "5",
    ];
    let mut w = spawn(
        f.dir.path(),
        "g",
        &run_args("hguard", &f.ep, &args, "exec sleep 60"),
    );
    wait_line(&f.dir.path().join("hanging"), secs(10), |_| true);
    let guard = children(w.pid())
        .into_iter()
        .find(|p| comm(*p) == "lexec-health");
    let Some(guard) = guard else {
        let names: Vec<String> = children(w.pid()).into_iter().map(comm).collect();
        w.signal(libc::SIGKILL);
        assert_no_check_left(&marker);
        panic!("no child of lead-exec is named lexec-health: {names:?}");
    };
    let sleeper = || {
        marked(&marker)
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .map(|c| c.starts_with(b"sleep\0"))
                    .unwrap_or(false)
            })
            .collect::<Vec<i32>>()
    };
    // The check wrote its pid before it forks `sleep`: the sleep may still be on its way.
    let hangs = wait_until(secs(5), || !sleeper().is_empty());
    assert!(hangs, "the check does not hang in sleep");
    signal(guard, libc::SIGKILL);
    let gone = wait_until(secs(6), || sleeper().is_empty());
    let left = sleeper();
    assert!(alive(w.pid()), "lead-exec ended:\n{}", w.log_text());
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
    assert_no_check_left(&marker);
    assert!(
        gone,
        "the check's sleep outlived its killed guard while lead-exec ran: {left:?}"
    );
}

#[test]
fn a_stop_signal_during_the_timeouts_grace_keeps_the_timeout_in_the_exit_and_history() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "trap 'echo term >> $D/got' TERM; echo $FENCING_TOKEN > $D/token; \
         while :; do sleep 0.05; done",
    );
    let lease = ["--ttl", "10s", "--grace", "3s", "--safety-margin", "500ms"];
    let mut w = spawn(
        f.dir.path(),
        "t",
        &run_args_with(&lease, "tsig", &f.ep, &["--timeout", "500ms"], &job),
    );
    wait_line(&f.dir.path().join("token"), secs(10), |_| true);
    // The job ignores the timeout's TERM; then a stop arrives, as `systemctl stop` sends.
    wait_line(&f.dir.path().join("got"), secs(10), |_| true);
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(10)), 124, "{}", w.log_text());
    let (_, out, _) = run(&["history", "tsig", "--endpoints", &f.ep, "-o", "json"]);
    let recs: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        recs[0]["end"].as_str(),
        Some("timed out, then signal 15 to lead-exec"),
        "{out}"
    );
    assert_eq!(recs[0]["clean"].as_bool(), Some(true), "{out}");
}

#[test]
fn status_shows_a_leaders_timeout_and_when_it_stops_the_job() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN > $D/token; exec sleep 60",
    );
    let mut w = spawn(
        f.dir.path(),
        "s",
        &run_args("stt", &f.ep, &["--timeout", "30s"], &job),
    );
    wait_line(&f.dir.path().join("token"), secs(10), |_| true);
    let mut out = String::new();
    let ok = wait_until(secs(10), || {
        out = run(&["status", "stt", "--endpoints", &f.ep]).1;
        out.contains("timeout:")
    });
    assert!(ok, "{out}");
    assert!(out.contains("timeout:   30s, stops the job at "), "{out}");
    let (_, js, _) = run(&["status", "stt", "--endpoints", &f.ep, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&js).unwrap();
    assert_eq!(v["leader"]["timeout_ms"].as_u64(), Some(30_000), "{js}");
    let since = v["leader"]["since_ms"].as_u64().unwrap();
    assert_eq!(
        v["leader"]["timeout_at_ms"].as_u64(),
        Some(since + 30_000),
        "{js}"
    );
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

#[test]
fn status_lists_a_worker_out_of_line_for_a_failing_health_check() {
    let f = Fixture::new();
    let job = script(f.dir.path(), &format!("{RECORD_TERM}; exec sleep 60"));
    let health = health_args(f.dir.path(), "a");
    let mut args: Vec<&str> = vec!["--id", "sick"];
    args.extend(health.iter().map(String::as_str));
    let mut a = spawn(f.dir.path(), "a", &run_args("hst", &f.ep, &args, &job));
    a.wait_log("not campaigning until the health check passes", secs(10));
    let mut out = String::new();
    let shown = wait_until(secs(5), || {
        out = run(&["status", "hst", "--endpoints", &f.ep]).1;
        out.contains("unhealthy: 1")
    });
    assert!(shown, "{out}");
    assert!(out.contains("  - sick (host "), "{out}");
    assert_eq!(
        candidates(&f.etcd, "hst"),
        0,
        "the marker is not a candidate"
    );
    let (_, js, _) = run(&["status", "hst", "--endpoints", &f.ep, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&js).unwrap();
    assert_eq!(v["unhealthy"][0]["id"].as_str(), Some("sick"), "{js}");

    // Once it passes, it campaigns and is no longer listed.
    std::fs::write(f.dir.path().join("ok-a"), "").unwrap();
    wait_line(&f.dir.path().join("terms"), secs(10), |_| true);
    let (code, out, _) = run(&["status", "hst", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("unhealthy:"), "{out}");
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
}

#[test]
fn a_draining_holder_whose_key_was_deleted_still_shows_as_taking_its_slot() {
    let f = Fixture::new();
    // Ignores TERM, so it drains for the whole grace once its key is gone.
    let job = script(
        f.dir.path(),
        "trap '' TERM; echo start $FENCING_TOKEN $LEAD_EXEC_SLOT $LEAD_EXEC_ID >> $D/log; \
         while :; do sleep 0.05; done",
    );
    let mut grace = WIDE_GRACE.to_vec();
    grace[3] = "4s";
    grace[1] = "8s";
    let mut workers: Vec<Worker> = ["a", "b"]
        .iter()
        .map(|id| {
            spawn(
                f.dir.path(),
                id,
                &run_args_with(
                    &grace,
                    "drs",
                    &f.ep,
                    &["-v", "--slots", "2", "--id", id],
                    &job,
                ),
            )
        })
        .collect();
    let held = wait_running(f.dir.path(), 2);
    let (token_a, slot_a, _) = held.iter().find(|h| h.2 == "a").unwrap().clone();
    let key_a = f
        .etcd
        .ctl(&["get", "--prefix", "lead-exec/elections/drs/", "--keys-only"])
        .lines()
        .map(str::to_string)
        .filter(|k| !k.is_empty())
        .find(|k| {
            let v = f.etcd.ctl(&["get", k, "--print-value-only"]);
            v.contains("\"id\":\"a\"")
        })
        .expect("a's key");
    f.etcd.ctl(&["del", &key_a]);
    workers[0].wait_log("leading -> draining", secs(10));

    let (code, out, _) = run(&["status", "drs", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("slot {slot_a}: a draining job, token {token_a}")),
        "{out}"
    );
    let c = run(&run_args_with(
        &grace,
        "drs",
        &f.ep,
        &["-v", "--slots", "2", "--id", "c", "--no-wait"],
        "true",
    ));
    assert_eq!(c.0, 75, "{}", c.2);
    assert!(
        c.2.contains(&format!(
            "a draining job whose key is gone (token {token_a}"
        )),
        "{}",
        c.2
    );
    for w in &mut workers {
        w.signal(libc::SIGKILL);
    }
}

/// The wait a worker drew for `--splay`, from its log line ("waiting 1s 234ms (--splay 3s)
/// before campaigning").
fn drawn_splay(log: &str) -> Duration {
    let line = log
        .lines()
        .find(|l| l.contains("before campaigning"))
        .unwrap_or_else(|| panic!("no splay in the log:\n{log}"));
    let drawn = line
        .split("waiting ")
        .nth(1)
        .and_then(|r| r.split(" (--splay").next())
        .unwrap_or_else(|| panic!("{line}"));
    humantime::parse_duration(drawn).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// Each worker waits its own random time under the splay before campaigning: its job starts
/// no sooner than the wait it drew, and within the splay (plus what a start takes).
#[test]
fn a_splay_delays_the_first_campaign_by_a_random_time_under_its_bound() {
    let f = Fixture::new();
    let splay = Duration::from_secs(3);
    let started = now_ns();
    let mut workers: Vec<Worker> = (0..3)
        .map(|i| {
            let (name, job) = (
                format!("splay{i}"),
                script(f.dir.path(), &format!("date +%s%N > $D/start{i}")),
            );
            let args = run_args(&name, &f.ep, &["--splay", "3s"], &job);
            spawn(f.dir.path(), &name, &args)
        })
        .collect();
    let mut draws = Vec::new();
    for (i, w) in workers.iter_mut().enumerate() {
        assert_eq!(w.code(secs(30)), 0, "{}", w.log_text());
        let drawn = drawn_splay(&w.log_text());
        assert!(drawn < splay, "drew {drawn:?}");
        let start = wait_int(&f.dir.path().join(format!("start{i}")), secs(1));
        let after = Duration::from_nanos((i128::from(start) - started) as u64);
        // The log rounds the wait to the millisecond.
        assert!(
            after + Duration::from_millis(1) >= drawn,
            "worker {i} started its job {after:?} after launch, before its splay of {drawn:?}"
        );
        assert!(
            after < splay + Duration::from_secs(10),
            "worker {i} started its job {after:?} after launch"
        );
        draws.push(drawn);
    }
    assert!(
        draws.iter().any(|d| *d != draws[0]),
        "three workers drew the same splay: {draws:?}"
    );
}

/// Without `--splay` nothing waits (and nothing says so); a stop signal during a splay ends
/// the run as one in line does (128+N), before the worker ever joined the line.
#[test]
fn no_splay_by_default_and_a_stop_signal_during_one_exits_as_in_line() {
    let f = Fixture::new();
    let job = script(f.dir.path(), "echo ran >> $D/ran");
    let (code, _, err) = run(&run_args("unspread", &f.ep, &["-v"], &job));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("splay"), "{err}");
    assert_eq!(lines(&f.dir.path().join("ran")).len(), 1);

    // A year's splay: the worker is still waiting when the signal comes.
    let mut w = spawn(
        f.dir.path(),
        "splayed",
        &run_args("splayed", &f.ep, &["--splay", "365days"], &job),
    );
    w.wait_log("before campaigning", secs(10));
    assert_eq!(
        candidates(&f.etcd, "splayed"),
        0,
        "in line during its splay"
    );
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(10)), 128 + libc::SIGTERM, "{}", w.log_text());
    assert_eq!(lines(&f.dir.path().join("ran")).len(), 1, "the job ran");
    assert_eq!(candidates(&f.etcd, "splayed"), 0);
}

/// A job for `--attempts`: notes "TOKEN ATTEMPT ID START_NS" in `att`, waits for `go`, notes its
/// end in `end`, and exits 0 on the worker named `wins`, else 3.
fn attempt_job(dir: &std::path::Path, wins: &str) -> String {
    script(
        dir,
        &format!(
            "echo $FENCING_TOKEN $LEAD_EXEC_ATTEMPT $LEAD_EXEC_ID $(date +%s%N) >> $D/att; \
             while [ ! -e $D/go ]; do sleep 0.05; done; date +%s%N >> $D/end; \
             [ \"$LEAD_EXEC_ID\" = {wins} ] && exit 0; exit 3"
        ),
    )
}

/// (token, attempt, id, start ns) of each attempt's job, in order.
fn attempts_run(dir: &std::path::Path) -> Vec<(i64, u32, String, i128)> {
    lines(&dir.join("att"))
        .iter()
        .map(|l| {
            let v: Vec<&str> = l.split(' ').collect();
            (
                v[0].parse().unwrap(),
                v[1].parse().unwrap(),
                v[2].to_string(),
                v[3].parse().unwrap(),
            )
        })
        .collect()
}

/// Starts workers `ids` of election `name` one after the other, each in line before the next,
/// the first one's job running.
fn attempt_workers(
    f: &Fixture,
    name: &str,
    ids: &[&str],
    flags: &[&str],
    job: &str,
) -> Vec<Worker> {
    let mut workers = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let extra = [flags, &["--id", id]].concat();
        workers.push(spawn(f.dir.path(), id, &run_args(name, &f.ep, &extra, job)));
        if n == 0 {
            wait_line(&f.dir.path().join("att"), secs(10), |l| l.contains(" a "));
        } else {
            let ok = wait_until(secs(10), || candidates(&f.etcd, name) == n + 1);
            assert!(ok, "{id} never queued");
        }
    }
    workers
}

fn history_of(f: &Fixture, name: &str) -> Vec<serde_json::Value> {
    let (code, out, err) = run(&["history", name, "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn a_failed_attempt_is_retried_by_the_next_worker_with_a_larger_token_and_the_rest_exit_0() {
    let f = Fixture::new();
    let job = attempt_job(f.dir.path(), "b");
    let flags = ["--attempts", "3", "--run-key", "k1"];
    let mut w = attempt_workers(&f, "att", &["a", "b", "c"], &flags, &job);
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    // The failed attempt's worker leaves with the job's code; the one that succeeded, and the
    // one that found the key done, exit 0.
    assert_eq!(w[0].code(secs(20)), 3, "{}", w[0].log_text());
    assert_eq!(w[1].code(secs(20)), 0, "{}", w[1].log_text());
    assert_eq!(w[2].code(secs(20)), 0, "{}", w[2].log_text());
    assert!(
        w[2].log_text().contains("run key already done"),
        "{}",
        w[2].log_text()
    );
    let ran = attempts_run(f.dir.path());
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert_eq!((ran[0].1, ran[0].2.as_str()), (1, "a"), "{ran:?}");
    assert_eq!((ran[1].1, ran[1].2.as_str()), (2, "b"), "{ran:?}");
    assert!(ran[1].0 > ran[0].0, "tokens not increasing: {ran:?}");
    // History names the run key, the attempt, the host and the outcome of each term.
    let hist = history_of(&f, "att");
    let by_attempt: Vec<(u64, &str, &str)> = hist
        .iter()
        .map(|r| {
            assert_eq!(r["run_key"], "k1", "{r}");
            assert!(r["host"].as_str().is_some_and(|h| !h.is_empty()), "{r}");
            (
                r["attempt"].as_u64().unwrap(),
                r["id"].as_str().unwrap(),
                r["end"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(by_attempt, [(1, "a", "exit 3"), (2, "b", "exit 0")]);
    let (_, text, _) = run(&["history", "att", "--endpoints", &f.ep]);
    assert!(text.contains("k1 #2"), "{text}");
}

#[test]
fn once_every_attempt_failed_every_worker_exits_80_and_none_runs_the_job_again() {
    let f = Fixture::new();
    let job = attempt_job(f.dir.path(), "nobody");
    let flags = ["--attempts", "2", "--run-key", "k2"];
    let mut w = attempt_workers(&f, "all", &["a", "b", "c"], &flags, &job);
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    assert_eq!(w[0].code(secs(20)), 3, "{}", w[0].log_text());
    assert_eq!(w[1].code(secs(20)), 3, "{}", w[1].log_text());
    assert_eq!(w[2].code(secs(20)), 80, "{}", w[2].log_text());
    assert!(
        w[2].log_text()
            .contains("2 attempts at the run key failed (--attempts 2)"),
        "{}",
        w[2].log_text()
    );
    // A worker that comes late for the same key ends the same way, without a run.
    let extra = [&flags[..], &["--id", "d"]].concat();
    let (code, _, err) = run(&run_args("all", &f.ep, &extra, &job));
    assert_eq!(code, 80, "{err}");
    let ran = attempts_run(f.dir.path());
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert_eq!(history_of(&f, "all").len(), 2);
}

#[test]
fn a_lost_term_is_a_failed_attempt_its_worker_leaves_and_the_next_runs_attempt_2() {
    let f = Fixture::new();
    let job = attempt_job(f.dir.path(), "b");
    let flags = ["--attempts", "2", "--run-key", "k3"];
    let mut w = attempt_workers(&f, "lost", &["a", "b"], &flags, &job);
    // a freezes: its watchdog kills the job, its lease runs out, b takes the term.
    w[0].signal(libc::SIGSTOP);
    let b_started = wait_line(&f.dir.path().join("att"), secs(20), |l| l.contains(" b "));
    assert!(b_started.contains(" 2 b "), "{b_started}");
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    assert_eq!(w[1].code(secs(20)), 0, "{}", w[1].log_text());
    // Continued, a finds its term lost and leaves (--attempts implies --on-loss exit).
    w[0].signal(libc::SIGCONT);
    assert_eq!(w[0].code(secs(20)), 76, "{}", w[0].log_text());
    let ran = attempts_run(f.dir.path());
    assert!(ran[1].0 > ran[0].0, "{ran:?}");
    assert_eq!(
        lines(&f.dir.path().join("end")).len(),
        1,
        "a's job ran to its end"
    );
}

#[test]
fn the_worker_after_a_failed_attempt_waits_the_retry_delay_before_its_attempt() {
    let f = Fixture::new();
    let job = attempt_job(f.dir.path(), "b");
    let flags = ["--attempts", "2", "--run-key", "k4", "--retry-delay", "2s"];
    let mut w = attempt_workers(&f, "rd", &["a", "b"], &flags, &job);
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    // While it waits, the term runs no job, and no reader says it does: every term in the
    // history is closed (its key no longer says it was elected).
    w[1].wait_log("waiting --retry-delay", secs(20));
    let mut hist = Vec::new();
    let quiet = wait_until(Duration::from_millis(1500), || {
        hist = history_of(&f, "rd");
        hist.iter().all(|r| !r["end"].is_null())
    });
    assert!(
        quiet,
        "a term waiting out its retry delay shown running: {hist:?}"
    );
    assert_eq!(w[0].code(secs(20)), 3, "{}", w[0].log_text());
    assert_eq!(w[1].code(secs(20)), 0, "{}", w[1].log_text());
    let log = w[1].log_text();
    assert!(
        log.contains("attempt 1 of 2 at run key k4 failed: waiting --retry-delay 2s"),
        "{log}"
    );
    let failed_at: i128 = lines(&f.dir.path().join("end"))[0].parse().unwrap();
    let retried_at = attempts_run(f.dir.path())[1].3;
    assert!(
        retried_at - failed_at >= 2_000_000_000,
        "retried {} ms after the failure",
        (retried_at - failed_at) / 1_000_000
    );
}

#[test]
fn an_attempt_stopped_by_a_resign_is_given_back_and_the_next_worker_makes_it_again() {
    let f = Fixture::new();
    let job = attempt_job(f.dir.path(), "b");
    let flags = ["--attempts", "2", "--run-key", "k5"];
    let mut w = attempt_workers(&f, "rs", &["a", "b"], &flags, &job);
    let (code, _, err) = run(&["resign", "rs", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{err}");
    let b_started = wait_line(&f.dir.path().join("att"), secs(10), |l| l.contains(" b "));
    assert!(b_started.contains(" 1 b "), "{b_started}");
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    assert_eq!(w[1].code(secs(20)), 0, "{}", w[1].log_text());
    // a went back in line, and finds the key done.
    assert_eq!(w[0].code(secs(20)), 0, "{}", w[0].log_text());
    assert!(
        w[0].log_text()
            .contains("attempt 1 given back: the term was resigned"),
        "{}",
        w[0].log_text()
    );
    let ran: Vec<u32> = attempts_run(f.dir.path()).iter().map(|r| r.1).collect();
    assert_eq!(ran, [1, 1]);
}

#[test]
fn a_retry_due_after_its_period_is_over_is_not_started_and_its_worker_exits_75() {
    let f = Fixture::new();
    let job = attempt_job(f.dir.path(), "nobody");
    // Both workers read a clock 4 s into a 10 s period; the retry waits 6 s more.
    const PERIOD_MS: i128 = 10_000;
    let tick = (now_ns() / 1_000_000 / PERIOD_MS + 1000) * PERIOD_MS;
    let flags = ["--every", "10s", "--attempts", "3", "--retry-delay", "6s"];
    let mut w = Vec::new();
    for id in ["a", "b"] {
        let skew = skew_to(tick + 4_000);
        let extra = [&flags[..], &["--id", id]].concat();
        let args = run_args("late", &f.ep, &extra, &job);
        w.push(spawn_env(
            f.dir.path(),
            id,
            &args,
            &[(CLOCK_SKEW_VAR, &skew)],
        ));
        if id == "a" {
            wait_line(&f.dir.path().join("att"), secs(10), |l| l.contains(" a "));
        } else {
            let ok = wait_until(secs(10), || candidates(&f.etcd, "late") == 2);
            assert!(ok, "b never queued");
        }
    }
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    assert_eq!(w[0].code(secs(20)), 3, "{}", w[0].log_text());
    assert_eq!(w[1].code(secs(20)), 75, "{}", w[1].log_text());
    let log = w[1].log_text();
    assert!(log.contains("the period of the run key ended at"), "{log}");
    assert_eq!(attempts_run(f.dir.path()).len(), 1, "only a's attempt ran");
}
