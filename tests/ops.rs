//! Operator commands against real etcd: status, watch, resign, pause, history, check, run keys.

use std::process::Command;
use std::time::Duration;

use harness::proxy::{Mode, Proxy};
use harness::*;

/// A job that records "start T" / "end T" (on TERM) and runs until stopped.
fn long_job(dir: &std::path::Path, who: &str) -> String {
    script(
        dir,
        &format!(
            "trap 'echo end $FENCING_TOKEN >> $D/log; exit 0' TERM; \
             echo start $FENCING_TOKEN {who} >> $D/log; echo $FENCING_TOKEN > $D/{who}.token; \
             while :; do sleep 0.05; done"
        ),
    )
}

/// Starts `lead-exec run ELECTION --id ID` with [`long_job`], its files named after `who`.
fn candidate(dir: &std::path::Path, election: &str, ep: &str, who: &str, id: &str) -> Worker {
    spawn(
        dir,
        who,
        &run_args(election, ep, &["--id", id], &long_job(dir, who)),
    )
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn starts(dir: &std::path::Path) -> Vec<(i64, String)> {
    lines(&dir.join("log"))
        .iter()
        .filter_map(|l| l.strip_prefix("start "))
        .map(|l| {
            let (t, who) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), who.to_string())
        })
        .collect()
}

#[test]
fn status_shows_leader_token_waiters_and_exit_codes() {
    let f = Fixture::new();
    let (code, _, _) = run(&["status", "st", "--endpoints", &f.ep]);
    assert_eq!(code, 3, "no leader yet");

    let a = candidate(f.dir.path(), "st", &f.ep, "a", "alpha");
    let token = wait_int(&f.dir.path().join("a.token"), secs(10));
    let b = spawn(
        f.dir.path(),
        "b",
        &run_args("st", &f.ep, &["--id", "beta"], "exit 0"),
    );
    b.wait_log("waiting behind alpha", secs(10));

    let (code, out, err) = run(&["status", "st", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["leader"]["id"], "alpha");
    assert_eq!(v["leader"]["token"], token);
    assert!(v["leader"]["lease_ttl_left_s"].as_i64().unwrap() > 0);
    assert_eq!(v["waiting"][0]["id"], "beta");
    // The same type as `watch -o json` gives it: a bool, never null.
    assert_eq!(v["paused"], false);
    assert_eq!(v["pause"], serde_json::Value::Null);

    let (code, out, _) = run(&["status", "st", "--endpoints", &f.ep]);
    assert_eq!(code, 0);
    assert!(
        out.contains("leader:    alpha") && out.contains(&format!("token {token}")),
        "{out}"
    );
    assert!(out.contains("1. beta"), "{out}");

    let dead = format!("127.0.0.1:{}", free_port());
    let (code, _, err) = run(&[
        "status",
        "st",
        "--endpoints",
        &dead,
        "--dial-timeout",
        "500ms",
    ]);
    assert_eq!(code, 69, "{err}");
    drop((a, b));
}

#[test]
fn watch_prints_changes_with_tokens_and_survives_reconnects() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    let mut cmd = Command::new(bin());
    cmd.args(["watch", "wt", "--endpoints", &proxy.endpoint()]);
    let watch = LineReader::start(cmd);
    watch.expect("no leader", secs(10));

    let mut a = candidate(f.dir.path(), "wt", &f.ep, "a", "alpha");
    let ta = wait_int(&f.dir.path().join("a.token"), secs(10));
    watch.expect(&format!("leader alpha token {ta}"), secs(10));

    // Cut the watcher off, change the leader while it is away, then let it back.
    proxy.set(Mode::Reset);
    let b = candidate(f.dir.path(), "wt", &f.ep, "b", "beta");
    b.wait_log("waiting behind alpha", secs(10));
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
    let tb = wait_int(&f.dir.path().join("b.token"), secs(10));
    proxy.set(Mode::Pass);
    watch.expect(&format!("leader beta token {tb}"), secs(20));
    drop(b);
}

#[test]
fn resign_moves_leadership_without_overlap_and_the_new_token_is_larger() {
    let f = Fixture::new();
    let a = candidate(f.dir.path(), "rs", &f.ep, "a", "alpha");
    let ta = wait_int(&f.dir.path().join("a.token"), secs(10));
    let b = candidate(f.dir.path(), "rs", &f.ep, "b", "beta");
    b.wait_log("waiting behind alpha", secs(10));

    let (code, _, err) = run(&[
        "resign",
        "rs",
        "--endpoints",
        &f.ep,
        "--token",
        &(ta + 1000).to_string(),
    ]);
    assert_eq!(code, 4, "a wrong token must not act: {err}");
    assert!(err.contains("is not the leader's"), "{err}");

    let (code, out, err) = run(&[
        "resign",
        "rs",
        "--endpoints",
        &f.ep,
        "--token",
        &ta.to_string(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let tb = wait_int(&f.dir.path().join("b.token"), secs(10));
    assert!(tb > ta);
    // A stopped its job before B started: "end A" precedes "start B".
    let log = lines(&f.dir.path().join("log"));
    let end_a = log
        .iter()
        .position(|l| l == &format!("end {ta}"))
        .expect("A ended");
    let start_b = log
        .iter()
        .position(|l| l.starts_with(&format!("start {tb}")))
        .unwrap();
    assert!(end_a < start_b, "{log:#?}");
    // A went to the back of the line.
    a.wait_log("waiting behind beta", secs(10));
    let (_, hist, _) = run(&["history", "rs", "--endpoints", &f.ep, "-o", "json"]);
    assert!(hist.contains("\"end\":\"resigned\""), "{hist}");
    drop((a, b));
}

#[test]
fn pause_stops_the_job_and_resume_restarts_it() {
    let f = Fixture::new();
    let a = candidate(f.dir.path(), "pz", &f.ep, "a", "alpha");
    let ta = wait_int(&f.dir.path().join("a.token"), secs(10));

    let (code, out, _) = run(&[
        "pause",
        "pz",
        "--endpoints",
        &f.ep,
        "--reason",
        "ledger migration",
    ]);
    assert_eq!(code, 0, "{out}");
    wait_line(&f.dir.path().join("log"), secs(10), |l| {
        l == format!("end {ta}")
    });
    a.wait_log("election paused; waiting for resume", secs(10));
    let (code, out, _) = run(&["status", "pz", "--endpoints", &f.ep]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("ledger migration"), "{out}");
    assert_eq!(
        starts(f.dir.path()).len(),
        1,
        "no job may start while paused"
    );

    let (code, _, _) = run(&["resume", "pz", "--endpoints", &f.ep]);
    assert_eq!(code, 0);
    assert!(wait_until(secs(10), || starts(f.dir.path()).len() == 2));
    let s = starts(f.dir.path());
    assert!(s[1].0 > ta, "{s:?}");
    let (_, hist, _) = run(&["history", "pz", "--endpoints", &f.ep, "-o", "json"]);
    assert!(hist.contains("\"end\":\"paused\""), "{hist}");
    drop(a);
}

/// `pause X && start-maintenance` is safe: pause returns once the running job has stopped and
/// its term is closed. `--no-block` returns once the pause is written.
#[test]
fn pause_returns_once_the_running_job_has_stopped_and_no_block_does_not_wait_while_status_shows_it_stopping(
) {
    let f = Fixture::new();
    // A job that takes a second to stop, well within the grace (2 s).
    let job = script(
        f.dir.path(),
        "trap 'sleep 1; echo end $FENCING_TOKEN >> $D/log; exit 0' TERM; \
         echo $FENCING_TOKEN > $D/a.token; while :; do sleep 0.05; done",
    );
    let a = spawn(
        f.dir.path(),
        "a",
        &run_args_with(&WIDE_GRACE, "pw", &f.ep, &["--id", "alpha"], &job),
    );
    let t1 = wait_int(&f.dir.path().join("a.token"), secs(10));
    let pause = |extra: &[&str]| {
        let args = [
            &["pause", "pw", "--endpoints", &f.ep, "--reason", "upgrade"][..],
            extra,
        ]
        .concat();
        run(&args)
    };
    let (code, out, err) = pause(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        lines(&f.dir.path().join("log")).contains(&format!("end {t1}")),
        "pause returned while the job still ran:\n{out}"
    );
    assert!(
        out.contains(&format!("waiting for token {t1} to stop its job")),
        "{out}"
    );
    let (_, hist, _) = run(&["history", "pw", "--endpoints", &f.ep, "-o", "json"]);
    assert!(
        hist.contains("\"end\":\"paused\""),
        "the term is closed: {hist}"
    );

    let (code, _, _) = run(&["resume", "pw", "--endpoints", &f.ep]);
    assert_eq!(code, 0);
    assert!(wait_until(secs(10), || {
        std::fs::read_to_string(f.dir.path().join("a.token"))
            .is_ok_and(|t| t.trim() != t1.to_string())
    }));
    let t2 = wait_int(&f.dir.path().join("a.token"), secs(1));
    let (code, out, err) = pause(&["--no-block"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("waiting"), "{out}");
    assert!(
        !lines(&f.dir.path().join("log")).contains(&format!("end {t2}")),
        "--no-block waited for the job"
    );
    // Meanwhile `status` shows the term being stopped, not its key as a waiting candidate.
    let (code, out, err) = run(&["status", "pw", "--endpoints", &f.ep]);
    let (_, json, _) = run(&["status", "pw", "--endpoints", &f.ep, "-o", "json"]);
    if !lines(&f.dir.path().join("log")).contains(&format!("end {t2}")) {
        assert_eq!(code, 3, "{err}");
        let line = out
            .lines()
            .find(|l| l.starts_with("stopping:  alpha (host "));
        assert!(
            line.is_some_and(|l| l.ends_with(&format!(
                ", pid {}), token {t2}: its job is being stopped",
                a.pid()
            ))),
            "{out}"
        );
        assert!(out.contains("waiting:   0"), "{out}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["stopping"][0]["token"], t2, "{json}");
    }
    wait_line(&f.dir.path().join("log"), secs(10), |l| {
        l == format!("end {t2}")
    });
    // Once its record is closed, it is gone from `status`.
    let mut out = String::new();
    let gone = wait_until(secs(10), || {
        out = run(&["status", "pw", "--endpoints", &f.ep]).1;
        !out.contains("stopping:")
    });
    assert!(gone, "{out}");
    drop(a);
}

#[test]
fn history_records_terms_and_a_stale_leader_cannot_write_it() {
    let f = Fixture::new();
    for code in [0, 3] {
        let (c, _, err) = run(&run_args(
            "hist",
            &f.ep,
            &["--id", "h"],
            &format!("exit {code}"),
        ));
        assert_eq!(c, code, "{err}");
    }
    let (code, out, _) = run(&["history", "hist", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0);
    let recs: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(recs.len(), 2, "{out}");
    assert_eq!(recs[0]["end"], "exit 0");
    assert_eq!(recs[1]["end"], "exit 3");
    assert!(recs[0]["token"].as_i64() < recs[1]["token"].as_i64());
    let (_, text, _) = run(&["history", "hist", "--endpoints", &f.ep]);
    assert!(text.lines().next().unwrap().starts_with("TOKEN"), "{text}");

    // The first term's leader key is gone: a write guarded by it must fail.
    let token = recs[0]["token"].as_i64().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wrote = rt.block_on(async {
        let election = lead_exec::election::Election::new("hist").unwrap();
        let stale_key = election.candidate_key(0x1234);
        let ctx = scope(&f.ep, election).await;
        ctx.finish(
            token,
            lead_exec::records::history::TermEnd::Exited(9),
            etcd_client::Compare::create_revision(stale_key, etcd_client::CompareOp::Equal, token),
        )
        .await
        .unwrap()
    });
    assert!(!wrote, "a stale leader wrote history");
    let (_, out, _) = run(&["history", "hist", "--endpoints", &f.ep, "-o", "json"]);
    assert!(!out.contains("exit 9"), "{out}");
}

#[test]
fn history_n_0_shows_none_and_n_all_shows_every_record_kept() {
    let f = Fixture::new();
    for _ in 0..3 {
        let (c, _, err) = run(&run_args("hn", &f.ep, &[], "exit 0"));
        assert_eq!(c, 0, "{err}");
    }
    let count = |n: &str| {
        let (code, out, err) = run(&["history", "hn", "--endpoints", &f.ep, "-o", "json", "-n", n]);
        assert_eq!(code, 0, "-n {n}: {err}");
        json(&out).as_array().unwrap().len()
    };
    assert_eq!(count("0"), 0);
    assert_eq!(count("2"), 2);
    assert_eq!(count("all"), 3);
    let (code, _, err) = run(&["history", "hn", "--endpoints", &f.ep, "-n", "some"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("'some' for '--count <N|all>'"), "{err}");
}

#[test]
fn history_keeps_only_the_last_n_terms() {
    let f = Fixture::new();
    for _ in 0..4 {
        let (c, _, err) = run(&run_args("keep", &f.ep, &["--history-keep", "2"], "exit 0"));
        assert_eq!(c, 0, "{err}");
    }
    assert_eq!(f.etcd.keys("lead-exec/meta/keep/history/").len(), 2);
}

#[test]
fn check_inside_the_job_passes_silently_for_the_leader_and_fails_for_an_old_token() {
    let f = Fixture::new();
    let bin = bin();
    let job = script(
        f.dir.path(),
        &format!("'{bin}' check > $D/check.out 2>&1; echo $? > $D/check.code; echo $FENCING_TOKEN > $D/token"),
    );
    let (code, _, err) = run(&run_args("chk", &f.ep, &[], &job));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        wait_int(&f.dir.path().join("check.code"), secs(5)),
        0,
        "{:?}",
        lines(&f.dir.path().join("check.out"))
    );
    // Silent on success, as test(1) is: nothing lands in the job's output, even without -q.
    assert_eq!(lines(&f.dir.path().join("check.out")), Vec::<String>::new());
    let old = wait_int(&f.dir.path().join("token"), secs(5));

    // A later term makes the old token stale.
    let _w = spawn(
        f.dir.path(),
        "w",
        &run_args("chk", &f.ep, &[], &long_job(f.dir.path(), "w")),
    );
    wait_int(&f.dir.path().join("w.token"), secs(10));
    let (code, _, err) = run_env(
        &["check"],
        &[
            ("FENCING_TOKEN", &old.to_string()),
            ("LEAD_EXEC_ELECTION", "chk"),
            ("LEAD_EXEC_ENDPOINTS", &f.ep),
        ],
    );
    assert_eq!(code, 4, "{err}");
    assert!(err.contains(&format!("token {old} is stale")), "{err}");
}

#[test]
fn run_key_dedupes_and_its_record_is_fenced() {
    let f = Fixture::new();
    let job = script(f.dir.path(), "echo ran $LEAD_EXEC_RUN_KEY >> $D/runs");
    let key = "20261202T1530";
    for _ in 0..2 {
        let (code, _, err) = run(&run_args(
            "cron",
            &f.ep,
            &["--run-key", key, "--no-wait"],
            &job,
        ));
        assert_eq!(code, 0, "{err}");
    }
    assert_eq!(
        lines(&f.dir.path().join("runs")),
        vec![format!("ran {key}")]
    );
    // A failed run is not recorded: the next one runs.
    let (code, _, _) = run(&run_args("cron", &f.ep, &["--run-key", "k2"], "exit 1"));
    assert_eq!(code, 1);
    let (code, _, _) = run(&run_args("cron", &f.ep, &["--run-key", "k2"], &job));
    assert_eq!(code, 0);
    assert_eq!(lines(&f.dir.path().join("runs")).len(), 2);

    // A candidate queued behind the leader of the same key does not rerun it.
    let slow = script(
        f.dir.path(),
        "echo up > $D/up; sleep 1; echo ran k3 >> $D/runs",
    );
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args("cron", &f.ep, &["--run-key", "k3"], &slow),
    );
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    let mut b = spawn(
        f.dir.path(),
        "b",
        &run_args("cron", &f.ep, &["--run-key", "k3"], &job),
    );
    assert_eq!(a.code(secs(10)), 0);
    assert_eq!(b.code(secs(10)), 0, "{}", b.log_text());
    assert_eq!(
        lines(&f.dir.path().join("runs"))
            .iter()
            .filter(|l| l.contains("k3"))
            .count(),
        1
    );

    // The record is written only under a live leader key.
    let election = lead_exec::election::Election::new("cron").unwrap();
    let ttl = Duration::from_secs(60);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let wrote = rt.block_on(async {
        let stale = election.candidate_key(0x4242);
        let term = lead_exec::records::Writer {
            token: 7,
            key: &stale,
            id: "w",
        };
        let ctx = scope(&f.ep, election.clone()).await;
        ctx.mark_run_key_done(term, "k4", ttl).await.unwrap()
    });
    assert!(!wrote);
    assert!(f.etcd.keys("lead-exec/meta/cron/runs/k4").is_empty());
}

#[test]
fn subcommands_reject_bad_elections_and_report_missing_leaders() {
    let f = Fixture::new();
    for sub in ["status", "watch", "resign", "resume", "history"] {
        let (code, _, err) = run(&[sub, "bad/name", "--endpoints", &f.ep]);
        assert_eq!(code, 64, "{sub}: {err}");
        assert!(
            err.contains("invalid election name 'bad/name'"),
            "{sub}: {err}"
        );
    }
    let (code, _, err) = run(&["resign", "nobody", "--endpoints", &f.ep]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(err.trim(), "lead-exec: nobody: no leader to resign");
    let (code, _, err) = run(&["pause", "x", "--endpoints", &f.ep]);
    assert_eq!(code, 64, "--reason is required: {err}");
    let dead = format!("127.0.0.1:{}", free_port());
    for sub in ["resign", "resume", "history"] {
        let (code, _, err) = run(&[sub, "x", "--endpoints", &dead, "--dial-timeout", "300ms"]);
        assert_eq!(code, 69, "{sub}: {err}");
        assert_eq!(err.lines().count(), 1, "{sub}: {err}");
    }
    let (code, _, err) = run(&[
        "check",
        "--election",
        "x",
        "--token",
        "1",
        "--endpoints",
        &f.ep,
    ]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("there is no leader"), "{err}");
}

#[test]
fn history_keep_1_keeps_only_the_newest_term() {
    let f = Fixture::new();
    for i in 0..3 {
        let (c, _, err) = run(&run_args(
            "keep1",
            &f.ep,
            &["--history-keep", "1"],
            "exit 0",
        ));
        assert_eq!(c, 0, "run {i}: {err}");
        assert!(!err.contains("history:"), "run {i}: {err}");
    }
    let (_, out, _) = run(&["history", "keep1", "--endpoints", &f.ep, "-o", "json"]);
    let recs = json(&out);
    assert_eq!(recs.as_array().unwrap().len(), 1, "{out}");
    assert_eq!(f.etcd.keys("lead-exec/meta/keep1/history/").len(), 1);
}

#[test]
fn history_json_is_one_array_and_empty_is_brackets() {
    let f = Fixture::new();
    let (code, out, err) = run(&["history", "hj", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "[]");
    for _ in 0..2 {
        let (c, _, err) = run(&run_args("hj", &f.ep, &[], "exit 0"));
        assert_eq!(c, 0, "{err}");
    }
    let (_, out, _) = run(&["history", "hj", "--endpoints", &f.ep, "-o", "json"]);
    let recs = json(&out);
    let recs = recs
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {out}"));
    assert_eq!(recs.len(), 2, "{out}");
    assert!(
        recs[0]["token"].as_i64() < recs[1]["token"].as_i64(),
        "{out}"
    );
}

#[test]
fn resign_without_a_leader_or_while_paused_is_3_and_leaves_nothing() {
    let f = Fixture::new();
    let (code, _, err) = run(&["resign", "rp", "--endpoints", &f.ep]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no leader"), "{err}");
    let (code, _, err) = run(&["resign", "rp", "--endpoints", &f.ep, "--token", "5"]);
    assert_eq!(code, 3, "{err}");

    let a = candidate(f.dir.path(), "rp", &f.ep, "a", "alpha");
    let ta = wait_int(&f.dir.path().join("a.token"), secs(10));
    let (code, _, err) = run(&["pause", "rp", "--endpoints", &f.ep, "--reason", "test"]);
    assert_eq!(code, 0, "{err}");
    a.wait_log("election paused; waiting for resume", secs(10));
    let (code, _, err) = run(&["resign", "rp", "--endpoints", &f.ep]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no leader to resign (paused)"), "{err}");
    assert!(f.etcd.keys("lead-exec/meta/rp/resign").is_empty());

    // After resume the next term runs: nothing left behind stops it.
    let (code, _, _) = run(&["resume", "rp", "--endpoints", &f.ep]);
    assert_eq!(code, 0);
    assert!(wait_until(secs(10), || starts(f.dir.path()).len() == 2));
    let t2 = starts(f.dir.path())[1].0;
    assert!(t2 > ta);
    let stopped = wait_until(secs(2), || {
        lines(&f.dir.path().join("log")).contains(&format!("end {t2}"))
    });
    assert!(!stopped, "the job after resume was stopped");
    drop(a);
}

#[test]
fn a_resign_request_only_acts_on_the_token_it_names() {
    let f = Fixture::new();
    let a = candidate(f.dir.path(), "rt", &f.ep, "a", "alpha");
    let ta = wait_int(&f.dir.path().join("a.token"), secs(10));
    // A request naming another term (as a stale one would) is ignored by this term.
    f.etcd
        .ctl(&["put", "lead-exec/meta/rt/resign", &(ta - 1).to_string()]);
    let stopped = wait_until(secs(2), || {
        lines(&f.dir.path().join("log")).contains(&format!("end {ta}"))
    });
    assert!(!stopped, "a request for another token stopped the job");
    let (code, out, err) = run(&[
        "resign",
        "rt",
        "--endpoints",
        &f.ep,
        "--token",
        &ta.to_string(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    wait_line(&f.dir.path().join("log"), secs(10), |l| {
        l == format!("end {ta}")
    });
    drop(a);
}

#[test]
fn resign_does_not_report_success_when_its_watch_ends_early() {
    let f = Fixture::new();
    // A job that ignores SIGTERM, with a long grace: the leader keeps its key for a while.
    let job = script(
        f.dir.path(),
        "trap '' TERM; echo $FENCING_TOKEN > $D/t; while :; do sleep 0.05; done",
    );
    let args = [
        "run",
        "rw",
        "--endpoints",
        &f.ep,
        "--ttl",
        "30s",
        "--grace",
        "15s",
        "--safety-margin",
        "1s",
        "--",
        "sh",
        "-c",
        &job,
    ];
    let _leader = spawn(f.dir.path(), "leader", &args);
    wait_int(&f.dir.path().join("t"), secs(10));
    let resign_args = ["resign", "rw", "--endpoints", &f.ep, "--timeout", "5s"];
    let mut resign = spawn(f.dir.path(), "resign", &resign_args);
    wait_line(&f.dir.path().join("resign.out"), secs(10), |l| {
        l.starts_with("asked ")
    });
    // The watch ends before the leader steps down, and etcd stays away past the wait: that
    // is no success.
    signal(f.etcd.members[0].pid(), libc::SIGTERM);
    let code = resign.code(secs(30));
    assert_eq!(code, 69, "{}", resign.log_text());
    assert!(!std::fs::read_to_string(f.dir.path().join("resign.out"))
        .unwrap()
        .contains("resigned"));
}

/// etcd restarts while `resign` waits for the leader to step down (its watch breaks): the
/// wait goes on, and once the leader has stepped down `resign` says so and exits 0. It used
/// to fail with 69 at the break, although the resign took effect.
#[test]
fn resign_rides_out_an_etcd_restart_while_it_waits() {
    let mut f = Fixture::new();
    // A job that ignores SIGTERM: the leader keeps its key for its grace.
    let job = script(
        f.dir.path(),
        "trap '' TERM; echo $FENCING_TOKEN > $D/t; while :; do sleep 0.05; done",
    );
    let lease = ["--ttl", "30s", "--grace", "4s"];
    let leader = spawn(
        f.dir.path(),
        "leader",
        &run_args_with(&lease, "rr", &f.ep, &["-v"], &job),
    );
    wait_int(&f.dir.path().join("t"), secs(10));
    leader.wait_job_started();
    let mut resign = spawn(
        f.dir.path(),
        "resign",
        &["resign", "rr", "--endpoints", &f.ep],
    );
    wait_line(&f.dir.path().join("resign.out"), secs(10), |l| {
        l.starts_with("asked ")
    });
    leader.wait_log("leading -> draining", secs(10));
    f.etcd.members[0].restart();
    let code = resign.code(secs(40));
    let out = std::fs::read_to_string(f.dir.path().join("resign.out")).unwrap();
    assert_eq!(code, 0, "{out}{}\n{}", resign.log_text(), leader.log_text());
    assert!(out.contains("resigned"), "{out}");
}

#[test]
fn a_pause_reads_the_same_in_status_and_watch() {
    let f = Fixture::new();
    let watch = |format: &str| {
        let mut cmd = Command::new(bin());
        cmd.args(["watch", "pt", "--endpoints", &f.ep, "-o", format]);
        LineReader::start(cmd)
    };
    let (text, js) = (watch("text"), watch("json"));
    text.expect("no leader", secs(10));
    let a = candidate(f.dir.path(), "pt", &f.ep, "a", "alpha");
    wait_int(&f.dir.path().join("a.token"), secs(10));
    let b = candidate(f.dir.path(), "pt", &f.ep, "b", "beta");
    b.wait_log("waiting behind alpha", secs(10));
    text.expect("leader alpha", secs(10));
    let (code, _, _) = run(&["pause", "pt", "--endpoints", &f.ep, "--reason", "maint"]);
    assert_eq!(code, 0);
    text.expect(": paused", secs(10));
    let line = js.expect("\"paused\":true", secs(10));
    assert_eq!(json(&line)["leader"], serde_json::Value::Null, "{line}");
    // The stopped leader queues again behind the other candidate, now first in line: the
    // views stay "paused", once.
    b.wait_log("election paused; waiting for resume", secs(10));
    a.wait_log("waiting behind beta", secs(10));
    text.quiet_for("paused", secs(1));
    js.quiet_for("paused", secs(1));
    let (code, out, _) = run(&["status", "pt", "--endpoints", &f.ep]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("leader:    none"), "{out}");
    let (_, out, _) = run(&["status", "pt", "--endpoints", &f.ep, "-o", "json"]);
    let v = json(&out);
    assert_eq!(v["leader"], serde_json::Value::Null, "{out}");
    assert_eq!(v["paused"], true, "{out}");
    assert!(v["pause"].is_object(), "{out}");
    drop((a, b));
}

#[test]
fn run_key_runs_again_until_a_success_is_recorded() {
    let f = Fixture::new();
    let rk = ["--run-key", "k1", "--on-loss", "exit"];
    // A successful job whose term was lost (its key deleted) is not recorded.
    let job = script(
        f.dir.path(),
        "trap 'exit 0' TERM; echo ran >> $D/runs; echo $LEAD_EXEC_LEADER_KEY > $D/key; \
         while :; do sleep 0.05; done",
    );
    let mut w = spawn(f.dir.path(), "lost", &run_args("rk", &f.ep, &rk, &job));
    let key = wait_line(&f.dir.path().join("key"), secs(10), |l| !l.is_empty());
    f.etcd.ctl(&["del", &key]);
    assert_eq!(w.code(secs(10)), 76, "{}", w.log_text());
    // A failure is not recorded either.
    let fail = script(f.dir.path(), "echo ran >> $D/runs; exit 1");
    let (code, _, err) = run(&run_args("rk", &f.ep, &rk, &fail));
    assert_eq!(code, 1, "{err}");
    // So the job runs again, and its success is recorded...
    let ok = script(f.dir.path(), "echo ran >> $D/runs; exit 0");
    let (code, _, err) = run(&run_args("rk", &f.ep, &rk, &ok));
    assert_eq!(code, 0, "{err}");
    assert_eq!(lines(&f.dir.path().join("runs")).len(), 3);
    // ...after which it is skipped.
    let (code, _, err) = run(&run_args("rk", &f.ep, &rk, &ok));
    assert_eq!(code, 0, "{err}");
    assert_eq!(lines(&f.dir.path().join("runs")).len(), 3);
}

/// A clean end writes the end record and deletes the leader key in one transaction: the next
/// candidate takes over on the same commit that closes the record, and the lease revoke is no
/// longer on the way out.
#[test]
fn a_clean_exit_closes_the_record_and_releases_the_key_in_one_commit() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEADER_KEY > $D/term",
    );
    let mut w = spawn(f.dir.path(), "w", &run_args("onecommit", &f.ep, &[], &job));
    assert_eq!(w.code(secs(10)), 0, "{}", w.log_text());
    let line = lines(&f.dir.path().join("term")).remove(0);
    let (token, key) = line.split_once(' ').unwrap();
    let prefix = "lead-exec/meta/onecommit/history/";
    let rec = f.etcd.ctl(&["get", "--prefix", prefix, "-w", "json"]);
    let v = json(&rec);
    let kv = &v["kvs"][0];
    let mod_rev = kv["mod_revision"].as_i64().unwrap();
    assert!(
        f.etcd.keys("lead-exec/elections/onecommit/").is_empty(),
        "the leader key outlived the run"
    );
    let at = |rev: i64| {
        f.etcd
            .ctl(&["get", key, "--rev", &rev.to_string(), "--keys-only"])
    };
    assert!(
        at(mod_rev).trim().is_empty(),
        "key still there at the end record's revision"
    );
    assert_eq!(
        at(mod_rev - 1).trim(),
        key,
        "key gone before the end record"
    );
    assert!(mod_rev > token.parse::<i64>().unwrap());
}

#[test]
fn history_and_status_show_every_running_slot_holder_as_running() {
    let f = Fixture::new();
    let mut workers: Vec<Worker> = Vec::new();
    for who in ["a", "b", "c"] {
        workers.push(spawn(
            f.dir.path(),
            who,
            &run_args(
                "hs",
                &f.ep,
                &["--slots", "3", "--id", who],
                &long_job(f.dir.path(), who),
            ),
        ));
        wait_line(&f.dir.path().join(format!("{who}.token")), secs(10), |_| {
            true
        });
    }
    // The start records are written beside the jobs: wait for all three.
    let mut recs = Vec::new();
    let ok = wait_until(secs(10), || {
        let (_, out, _) = run(&["history", "hs", "--endpoints", &f.ep, "-o", "json"]);
        recs = json(&out).as_array().cloned().unwrap_or_default();
        recs.len() == 3
    });
    assert!(ok, "{recs:?}");
    for r in &recs {
        assert!(r["end"].is_null(), "a running holder shown ended: {r}");
        assert!(r["ended_ms"].is_null(), "{r}");
        assert!(r["clean"].is_null(), "{r}");
    }
    let (_, text, _) = run(&["history", "hs", "--endpoints", &f.ep]);
    assert!(!text.contains("lease lost"), "{text}");
    assert_eq!(text.matches("running").count(), 3, "{text}");
    let (code, out, err) = run(&["status", "hs", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("lease lost"), "{out}");
    for w in &mut workers {
        w.signal(libc::SIGTERM);
    }
    for w in &mut workers {
        w.wait(secs(10));
    }
}

#[test]
fn a_crashed_term_with_no_successor_shows_as_ended_before_now_not_running() {
    let f = Fixture::new();
    let mut a = candidate(f.dir.path(), "crash", &f.ep, "a", "a");
    wait_line(&f.dir.path().join("a.token"), secs(10), |_| true);
    let ok = wait_until(secs(10), || {
        f.etcd.keys("lead-exec/meta/crash/history/").len() == 1
    });
    assert!(ok, "no start record");
    let key = f.etcd.keys("lead-exec/elections/crash/").remove(0);
    let gone = KeyGone::watch(&f.ep, &key);
    a.signal(libc::SIGKILL);
    a.wait(secs(5));
    gone.wait(secs(15));
    let observed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let (_, out, _) = run(&["history", "crash", "--endpoints", &f.ep, "-o", "json"]);
    let recs = json(&out);
    let r = &recs[0];
    assert_eq!(r["end"], "lease lost", "{out}");
    assert_eq!(r["clean"], false, "{out}");
    assert!(
        r["ended_ms"].is_null(),
        "an end time that nobody saw: {out}"
    );
    let before = r["ended_before_ms"].as_u64().expect(&out);
    assert!(
        before >= r["started_ms"].as_u64().unwrap() && before <= observed + 60_000,
        "{out}"
    );
    let (code, text, _) = run(&["status", "crash", "--endpoints", &f.ep]);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("leader:    none"), "{text}");
    assert!(
        !text.contains("running"),
        "a dead term shown running: {text}"
    );
    assert!(text.contains("lease lost (unclean)"), "{text}");
    assert!(text.contains("before "), "{text}");
    let (_, text, _) = run(&["history", "crash", "--endpoints", &f.ep]);
    assert!(text.contains("before "), "{text}");
}

#[test]
fn a_crashed_terms_end_is_shown_before_its_successors_election_not_at_its_start() {
    let f = Fixture::new();
    let delay = ["--takeover-delay", "2s"];
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args(
            "succ",
            &f.ep,
            &[&["--id", "a"][..], &delay].concat(),
            &long_job(f.dir.path(), "a"),
        ),
    );
    wait_line(&f.dir.path().join("a.token"), secs(10), |_| true);
    let mut b = spawn(
        f.dir.path(),
        "b",
        &run_args(
            "succ",
            &f.ep,
            &[&["--id", "b"][..], &delay].concat(),
            &long_job(f.dir.path(), "b"),
        ),
    );
    b.wait_log("waiting behind", secs(10));
    a.signal(libc::SIGKILL);
    a.wait(secs(5));
    wait_line(&f.dir.path().join("b.token"), secs(20), |_| true);
    let mut recs = serde_json::Value::Null;
    let ok = wait_until(secs(10), || {
        let (_, out, _) = run(&["history", "succ", "--endpoints", &f.ep, "-o", "json"]);
        recs = json(&out);
        recs.as_array().is_some_and(|r| r.len() == 2)
    });
    assert!(ok, "{recs}");
    let (first, second) = (&recs[0], &recs[1]);
    assert_eq!(first["end"], "lease lost", "{recs}");
    assert!(first["ended_ms"].is_null(), "{recs}");
    let delay_ms = second["takeover_delay_ms"].as_u64().expect("b waited");
    let before = first["ended_before_ms"].as_u64().expect("a bound");
    assert_eq!(
        before,
        second["started_ms"].as_u64().unwrap() - delay_ms,
        "the bound is b's election, before its delay: {recs}"
    );
    assert!(second["end"].is_null(), "b still runs: {recs}");
    b.signal(libc::SIGTERM);
    b.wait(secs(10));
}

/// The write end of a pipe whose read end is already closed: every write to it fails with
/// EPIPE, as `status | head -1` does once head has its line.
fn closed_pipe() -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into the array we own; we close the read end.
    unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
        libc::close(fds[0]);
        std::os::fd::OwnedFd::from_raw_fd(fds[1])
    }
}

#[test]
fn status_history_watch_and_check_exit_quietly_when_their_reader_is_gone() {
    use std::io::BufRead;
    let f = Fixture::new();
    let a = candidate(f.dir.path(), "gone", &f.ep, "a", "alpha");
    let token = wait_int(&f.dir.path().join("a.token"), secs(10)).to_string();
    let e = ["--endpoints", f.ep.as_str()];
    let cases: Vec<Vec<&str>> = vec![
        [&["status", "gone"][..], &e].concat(),
        [&["status", "gone", "-o", "json"][..], &e].concat(),
        [&["history", "gone"][..], &e].concat(),
        [&["history", "gone", "-o", "json"][..], &e].concat(),
        [&["check", "--election", "gone", "--token", &token][..], &e].concat(),
        vec!["completions", "bash"],
    ];
    // Each a few times: a race with the reader would show as an occasional failure.
    for _ in 0..3 {
        for args in &cases {
            let out = Command::new(bin())
                .args(args)
                .stdin(std::process::Stdio::null())
                .stdout(closed_pipe())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            // The exit the command has with a reader: the leader runs, the token is current.
            assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
            assert!(err.is_empty(), "{args:?}: not quiet: {err}");
        }
    }
    // `watch | head -1`: once its reader is gone it ends, without waiting for a change.
    for _ in 0..3 {
        let mut w = Command::new(bin())
            .args(["watch", "gone", "--endpoints", &f.ep])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(w.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(first.contains("leader alpha"), "{first}");
        let end = std::time::Instant::now() + secs(10);
        while w.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < end,
                "watch kept running without a reader"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = w.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(err.is_empty(), "not quiet: {err}");
    }
    drop(a);
}

/// Output that cannot be written is an error, not a quiet success: a stdout closed at start
/// (`status >&-`, which Rust's runtime would quietly point at /dev/null) and a full disk are
/// exit 74 (EX_IOERR) with one line, as coreutils fail on `echo hi >&-`.
#[test]
fn status_history_and_watch_with_a_closed_or_full_stdout_exit_74() {
    use std::os::unix::process::CommandExt;
    let f = Fixture::new();
    let (code, _, err) = run(&["run", "io", "--endpoints", &f.ep, "--", "true"]);
    assert_eq!(code, 0, "{err}");
    let e = ["--endpoints", f.ep.as_str()];
    let cases: Vec<Vec<&str>> = vec![
        [&["status", "io"][..], &e].concat(),
        [&["history", "io", "-o", "json"][..], &e].concat(),
        [&["watch", "io"][..], &e].concat(),
        vec!["completions", "bash"],
    ];
    for args in &cases {
        for closed in [true, false] {
            let mut cmd = Command::new(bin());
            cmd.args(args).stdin(std::process::Stdio::null());
            if closed {
                // SAFETY: close(2) only, between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::close(1);
                        Ok(())
                    });
                }
            } else {
                cmd.stdout(std::fs::File::create("/dev/full").unwrap());
            }
            let out = cmd.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(74),
                "{args:?} closed={closed}: {err}"
            );
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.starts_with("lead-exec: cannot write the output: "),
                "{args:?}: {err}"
            );
        }
    }
}

#[test]
fn newlines_in_ids_and_reasons_are_refused_and_shown_escaped_when_stored() {
    let f = Fixture::new();
    let forged = "evil\nleader:    mallory (host prod1, pid 1), token 999999";
    let (code, _, err) = run(&[
        "run",
        "fg",
        "--endpoints",
        &f.ep,
        "--id",
        forged,
        "--",
        "true",
    ]);
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--id") && err.contains("control character"),
        "{err}"
    );
    let (code, _, err) = run(&[
        "pause",
        "fg",
        "--endpoints",
        &f.ep,
        "--reason",
        "x\npaused:    no",
    ]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("--reason") && err.contains("control character"),
        "{err}"
    );
    assert!(f.etcd.keys("lead-exec/meta/fg/paused").is_empty());

    // The same values written by an older version, or by hand with etcdctl.
    let granted = f.etcd.ctl(&["lease", "grant", "60"]);
    let lease = granted.split_whitespace().nth(1).unwrap();
    let candidate = serde_json::json!({"id": forged, "host": "h\tx", "pid": 1, "started_ms": 0});
    f.etcd.ctl(&[
        "put",
        &format!("--lease={lease}"),
        &format!("lead-exec/elections/fg/{lease}"),
        &candidate.to_string(),
    ]);
    let record =
        serde_json::json!({"token": 1, "id": forged, "host": "h", "pid": 1, "started_ms": 0});
    f.etcd.ctl(&[
        "put",
        &format!("lead-exec/meta/fg/history/{:020}", 1),
        &record.to_string(),
    ]);
    let escaped = "evil\\nleader:    mallory";
    let (code, out, err) = run(&["status", "fg", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{err}");
    let leaders: Vec<&str> = out.lines().filter(|l| l.starts_with("leader:")).collect();
    assert_eq!(leaders.len(), 1, "{out}");
    assert!(
        leaders[0].contains(escaped) && leaders[0].contains("host h\\tx"),
        "{out}"
    );
    let (code, out, err) = run(&["history", "fg", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "a header and one term: {out}");
    assert!(out.contains(escaped), "{out}");
    let mut cmd = Command::new(bin());
    cmd.args(["watch", "fg", "--endpoints", &f.ep]);
    let watch = LineReader::start(cmd);
    let line = watch.expect("leader evil", secs(10));
    assert!(line.contains(escaped), "{line}");
    drop(watch);

    let pause = serde_json::json!({"reason": "x\npaused:    no", "since_ms": 0, "by": "me"});
    f.etcd
        .ctl(&["put", "lead-exec/meta/fg/paused", &pause.to_string()]);
    let (_, out, _) = run(&["status", "fg", "--endpoints", &f.ep]);
    let paused: Vec<&str> = out.lines().filter(|l| l.starts_with("paused:")).collect();
    assert_eq!(paused.len(), 1, "{out}");
    assert!(
        paused[0].starts_with("paused:    yes") && paused[0].contains("x\\npaused:    no"),
        "{out}"
    );
}

/// The etcd scope the records are written through, as `run` has it.
async fn scope(ep: &str, election: lead_exec::election::Election) -> lead_exec::election::Ctx {
    let conn = lead_exec::etcd::Conn {
        endpoints: vec![ep.to_string()],
        dial_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(5),
        tls: None,
        auth: None,
    };
    lead_exec::election::Ctx::connect(&conn, election)
        .await
        .unwrap()
}

/// What only a start record carries on the wire: an end not yet set. The end records, the
/// candidate keys and everything else lead-exec writes do not.
const OPEN_RECORD: &[u8] = b"\"end\":null";

/// A lease that outlives the cuts below by far: only the record is at stake.
const LONG: [&str; 6] = ["--ttl", "10s", "--grace", "1s", "--safety-margin", "1s"];

/// A job that says it started (its token in `started`, its leader key in `key`) and exits 0
/// once `go` exists.
fn job_until_go(dir: &std::path::Path) -> String {
    script(
        dir,
        "echo $LEAD_EXEC_LEADER_KEY > $D/key; echo $FENCING_TOKEN > $D/started; \
         while [ ! -e $D/go ]; do sleep 0.05; done",
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `history NAME -o json`, straight from etcd.
fn history_json(etcd: &Etcd, name: &str) -> Vec<serde_json::Value> {
    let (code, out, err) = run(&[
        "history",
        name,
        "--endpoints",
        &etcd.endpoints(),
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// The one record of a term that ran job `w` with `token` and exited 0, whole: its start as
/// the term knew it (lead-exec's pid and host, the job's start before `started_by`) and its end.
fn assert_whole_exit_0(
    recs: &[serde_json::Value],
    token: i64,
    id: &str,
    w: &Worker,
    started_by: u64,
) {
    assert_eq!(recs.len(), 1, "{recs:?}");
    let r = &recs[0];
    assert_eq!(r["token"].as_i64(), Some(token), "{r}");
    assert_eq!(r["id"], id, "{r}");
    assert_eq!(r["pid"].as_i64(), Some(w.pid() as i64), "{r}");
    assert!(!r["host"].as_str().unwrap_or("").is_empty(), "{r}");
    assert!(
        r["job_cgroup"].is_boolean(),
        "written after the job started: {r}"
    );
    assert_eq!(r["end"], "exit 0", "{r}");
    assert_eq!(r["clean"], true, "{r}");
    let started = r["started_ms"].as_u64().unwrap_or(0);
    let ended = r["ended_ms"].as_u64().unwrap_or(0);
    assert!(
        started > 0 && started <= started_by,
        "started_ms {started} is not the job's start (before {started_by}): {r}"
    );
    assert!(ended >= started, "{r}");
}

/// The start record, written beside the job, is cut on its way to etcd: the proxy drops every
/// request that carries it and resets the link. lead-exec writes it again after each failure
/// (100 ms, then doubling), and once the link carries it the record lands while the job runs;
/// the job's end closes it. Written once and never again, the term had no record at all.
#[test]
fn a_start_record_that_failed_is_retried_until_it_lands() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    proxy.reset_on(Some(OPEN_RECORD));
    let (cut, name) = (proxy.endpoint(), "retried");
    let job = job_until_go(f.dir.path());
    let args = run_args_with(&LONG, name, &cut, &["--id", name], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    let token = wait_int(&f.dir.path().join("started"), secs(10));
    // The first write and a retry, both cut.
    let retried = wait_until(secs(10), || proxy.resets_on() >= 2);
    let started_by = now_ms();
    assert!(
        retried,
        "the start record was written {} time(s) and never again\n{}",
        proxy.resets_on(),
        w.log_text()
    );
    proxy.reset_on(None);
    let landed = wait_until(secs(10), || {
        history_json(&f.etcd, name)
            .first()
            .is_some_and(|r| r["token"].as_i64() == Some(token))
    });
    assert!(landed, "the start record never landed\n{}", w.log_text());
    let open = history_json(&f.etcd, name);
    assert!(open[0]["end"].is_null(), "the job still runs: {open:?}");
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    assert_eq!(w.code(secs(10)), 0, "{}", w.log_text());
    assert_whole_exit_0(&history_json(&f.etcd, name), token, name, &w, started_by);
}

/// The start record never gets through while the job runs: every request carrying it is cut.
/// When the job exits 0, the term's one release commit writes the record whole (the start the
/// term knew, and the end) as it deletes the leader key; `history` shows the term complete,
/// where it showed it running, known by its key alone.
#[test]
fn a_term_whose_start_record_never_landed_is_recorded_whole_at_its_end() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    proxy.reset_on(Some(OPEN_RECORD));
    let (cut, name) = (proxy.endpoint(), "whole");
    let job = job_until_go(f.dir.path());
    let args = run_args_with(&LONG, name, &cut, &["--id", name], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    let token = wait_int(&f.dir.path().join("started"), secs(10));
    // Its first write failed, and said so.
    w.wait_log("history:", secs(10));
    let started_by = now_ms();
    assert!(proxy.resets_on() >= 1);
    assert!(
        f.etcd
            .keys(&format!("lead-exec/meta/{name}/history/"))
            .is_empty(),
        "the start record got through"
    );
    // Meanwhile `history` knows the term by its key: running.
    let open = history_json(&f.etcd, name);
    assert_eq!(open[0]["token"].as_i64(), Some(token), "{open:?}");
    assert!(open[0]["end"].is_null(), "{open:?}");
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    assert_eq!(w.code(secs(10)), 0, "{}", w.log_text());
    assert!(
        f.etcd
            .keys(&format!("lead-exec/elections/{name}/"))
            .is_empty(),
        "the leader key outlived the run"
    );
    assert_whole_exit_0(&history_json(&f.etcd, name), token, name, &w, started_by);
    // In the commit that deleted the key, not after a revoke.
    let key = lines(&f.dir.path().join("key")).remove(0);
    let hk = format!("lead-exec/meta/{name}/history/{token:020}");
    let rec = json(&f.etcd.ctl(&["get", &hk, "-w", "json"]));
    let mod_rev = rec["kvs"][0]["mod_revision"].as_i64().unwrap();
    let at = |rev: i64| {
        f.etcd
            .ctl(&["get", &key, "--rev", &rev.to_string(), "--keys-only"])
    };
    assert_eq!(at(mod_rev - 1).trim(), key, "key gone before the record");
    assert!(
        at(mod_rev).trim().is_empty(),
        "the record did not go in the release commit\n{}",
        w.log_text()
    );
}

/// A misspelled election name reads like an election without a leader: `status` and
/// `history` say that nothing is known of it, so the typo is not taken for an outage.
#[test]
fn an_election_nothing_is_known_of_says_so_in_status_and_history() {
    let f = Fixture::new();
    let (code, out, _) = run(&["status", "settelment", "--endpoints", &f.ep]);
    assert_eq!(code, 3);
    assert!(
        out.contains("leader:    none (no candidates and no recorded terms: none has run yet, or the name is misspelled)"),
        "{out}"
    );
    let (code, _, err) = run(&["history", "settelment", "--endpoints", &f.ep]);
    assert_eq!(code, 0);
    assert!(
        err.contains("no terms recorded for election settelment"),
        "{err}"
    );
    // An election that ran says nothing of the kind.
    let (code, _, err) = run(&["run", "settlement", "--endpoints", &f.ep, "--", "true"]);
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = run(&["status", "settlement", "--endpoints", &f.ep]);
    assert!(out.contains("leader:    none\n"), "{out}");
    let (_, _, err) = run(&["history", "settlement", "--endpoints", &f.ep]);
    assert!(!err.contains("no terms recorded"), "{err}");
}

/// The period start nearest to `now_ms` on the grid of `period_s` shifted by `offset_s`, in
/// seconds: counted here from the definition, to check lead-exec's against.
fn nearest_start(now_ms: i128, period_s: i128, offset_s: i128) -> u64 {
    let (p, o) = (period_s * 1000, offset_s * 1000);
    let k = (now_ms - o + p / 2).div_euclid(p);
    ((o + k * p) / 1000) as u64
}

/// `--every` gives the job the run key and the start of the period nearest to the clock, from
/// the real clock: the test names the periods before and after the run, one of which is the
/// run's (both the same unless the run straddled a half-period). The key is a run key: the
/// same period again is skipped, with exit 0.
#[test]
fn every_gives_the_job_the_key_and_start_of_the_nearest_period_and_skips_it_once_done() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $LEAD_EXEC_RUN_KEY $LEAD_EXEC_PERIOD_START >> $D/runs",
    );
    for (flags, period, offset) in [
        (&["--every", "1h"][..], 3600, 0),
        (&["--every", "1h", "--every-offset", "20m"], 3600, 1200),
        (&["--every", "7m", "--every-offset", "30s"], 420, 30),
    ] {
        let _ = std::fs::remove_file(f.dir.path().join("runs"));
        let now = || now_ns() / 1_000_000;
        let before = nearest_start(now(), period, offset);
        let (code, _, err) = run(&run_args("every", &f.ep, flags, &job));
        let after = nearest_start(now(), period, offset);
        assert_eq!(code, 0, "{flags:?}: {err}");
        let ran = lines(&f.dir.path().join("runs"));
        assert_eq!(ran.len(), 1, "{flags:?}: {ran:?}");
        let names = |s: u64| {
            let (key, start) = period_names(s);
            format!("{key} {start}")
        };
        assert!(
            ran[0] == names(before) || ran[0] == names(after),
            "{flags:?}: the job got {:?}, not {:?} or {:?}",
            ran[0],
            names(before),
            names(after)
        );
        // Recorded under that key: the same period again is skipped.
        let key = ran[0].split(' ').next().unwrap();
        assert_eq!(
            f.etcd
                .keys(&format!("lead-exec/meta/every/runs/{key}"))
                .len(),
            1
        );
        // Again with the clock at that period's start, wherever the real clock is by now.
        let ran_in = if ran[0] == names(before) {
            before
        } else {
            after
        };
        let skew = skew_to(i128::from(ran_in) * 1000);
        let (code, _, err) = run_env(
            &run_args("every", &f.ep, flags, &job),
            &[(CLOCK_SKEW_VAR, &skew)],
        );
        assert_eq!(code, 0, "{flags:?}: {err}");
        assert_eq!(lines(&f.dir.path().join("runs")).len(), 1, "{flags:?}");
    }
}

/// Three workers whose clocks read the tick, a third of a period early and a third late, all
/// started for each of three hourly ticks: each tick's job runs once, with that tick's key
/// and start, and the others exit 0 without running it (they wait in line, then find the key
/// done). The clocks are set with the test builds' clock skew, so the test does not wait for
/// real hours to pass.
#[test]
fn workers_whose_clocks_differ_by_a_third_of_the_period_run_each_period_once() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $LEAD_EXEC_RUN_KEY $LEAD_EXEC_PERIOD_START $LEAD_EXEC_ID >> $D/runs; sleep 0.3",
    );
    const HOUR_MS: i128 = 3_600_000;
    // An hour's start in the future, so that no key of the real clock is among them.
    let first = (now_ns() / 1_000_000 / HOUR_MS + 24) * HOUR_MS;
    let ticks: Vec<i128> = (0..3).map(|n| first + n * HOUR_MS).collect();
    for (n, tick) in ticks.iter().enumerate() {
        let mut workers: Vec<Worker> = [-HOUR_MS / 3, 0, HOUR_MS / 3]
            .iter()
            .enumerate()
            .map(|(i, off)| {
                let id = format!("t{n}w{i}");
                let skew = skew_to(tick + off);
                spawn_env(
                    f.dir.path(),
                    &id,
                    &run_args("skewed", &f.ep, &["--every", "1h", "--id", &id], &job),
                    &[(CLOCK_SKEW_VAR, &skew)],
                )
            })
            .collect();
        for w in &mut workers {
            assert_eq!(w.code(secs(20)), 0, "{}", w.log_text());
        }
        let ran = lines(&f.dir.path().join("runs"));
        assert_eq!(ran.len(), n + 1, "tick {n}: {ran:?}");
        let (key, start) = period_names((tick / 1000) as u64);
        assert!(
            ran[n].starts_with(&format!("{key} {start} t{n}w")),
            "tick {n}: {}",
            ran[n]
        );
    }
    assert_eq!(f.etcd.keys("lead-exec/meta/skewed/runs/").len(), 3);
    // A late worker of the first tick, its clock a third of a period behind: skipped.
    let skew = skew_to(ticks[0] - HOUR_MS / 3);
    let (code, _, err) = run_env(
        &run_args("skewed", &f.ep, &["--every", "1h"], &job),
        &[(CLOCK_SKEW_VAR, &skew)],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(lines(&f.dir.path().join("runs")).len(), 3);
}

#[test]
fn an_attempt_claim_whose_answer_was_lost_is_found_again_by_its_token_not_counted_twice() {
    use lead_exec::records::attempts::Claim;
    use lead_exec::records::Writer;
    let f = Fixture::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let election = lead_exec::election::Election::new("lostans").unwrap();
        let key = election.candidate_key(0xabc);
        let ctx = scope(&f.ep, election).await;
        let mut c = ctx.client.clone();
        // Creates our key: its create revision is the token.
        let create = async |c: &mut etcd_client::Client| {
            let put = c.put(key.as_str(), "w", None).await.unwrap();
            put.header().unwrap().revision()
        };
        let token = create(&mut c).await;
        let writer = Writer {
            token,
            key: &key,
            id: "w",
        };
        let ttl = Duration::from_secs(60);
        let first = ctx.claim_attempt(writer, "k", 3, ttl).await.unwrap();
        assert!(matches!(first, Claim::Attempt(a) if a.n == 1), "{first:?}");
        // The same term asks again, as after a claim that landed but whose answer was lost:
        // it gets the attempt it claimed, and the count stays.
        let again = ctx.claim_attempt(writer, "k", 3, ttl).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(ctx.attempts_of("k").await.unwrap().count, 1);
        // A term of the past (its key gone) claims nothing.
        c.delete(key.as_str(), None).await.unwrap();
        let token = create(&mut c).await;
        let stale = Writer {
            token: token - 1,
            ..writer
        };
        let lost = ctx.claim_attempt(stale, "k", 3, ttl).await.unwrap();
        assert_eq!(lost, Claim::Lost);
        assert_eq!(ctx.attempts_of("k").await.unwrap().count, 1);
    });
}

/// A run that ends at once, before its start record is seen written, has its record written
/// whole by the commit that closes its term (lead-exec-safety(7), "Round trips"): `history`
/// shows every such term ended, and `--history-keep` still trims, by the keys the creating
/// transaction read.
#[test]
fn short_runs_are_recorded_whole_at_their_end_and_still_trimmed() {
    let f = Fixture::new();
    let mut tokens = Vec::new();
    for i in 0..4 {
        let job = script(f.dir.path(), &format!("echo $FENCING_TOKEN > $D/t{i}"));
        let (code, _, err) = run(&run_args("quick", &f.ep, &["--history-keep", "2"], &job));
        assert_eq!(code, 0, "{err}");
        tokens.push(wait_int(&f.dir.path().join(format!("t{i}")), secs(5)));
    }
    let (_, out, _) = run(&["history", "quick", "--endpoints", &f.ep, "-o", "json"]);
    let recs = json(&out);
    let recs = recs.as_array().expect(&out);
    assert_eq!(recs.len(), 2, "{out}");
    for (r, t) in recs.iter().zip(&tokens[2..]) {
        assert_eq!(r["token"].as_i64(), Some(*t), "{out}");
        assert_eq!(r["end"], "exit 0", "{out}");
        assert_eq!(r["clean"], true, "{out}");
    }
}

/// A whole run does not wait for its lease's revoke (lead-exec-safety(7), "Round trips"): the
/// commit that closes the term deleted the key and what else the lease held (its `--priority`
/// key, a resign request written on it), so the run leaves no key behind, and a lease of its
/// still alive holds none. A resign request on another lease is not the term's to delete.
#[test]
fn a_whole_run_leaves_no_key_behind_and_its_lease_holds_none() {
    let f = Fixture::new();
    let d = f.dir.path();
    let job = job_until_go(d);
    let mut w = spawn(d, "w", &run_args("left", &f.ep, &["--priority", "5"], &job));
    wait_int(&d.join("started"), secs(10));
    let key = std::fs::read_to_string(d.join("key")).unwrap();
    let lease = key.trim().rsplit('/').next().unwrap().to_string();
    // A request naming another token: the leader leaves it be, and it goes with the term.
    f.etcd
        .ctl(&["put", "lead-exec/meta/left/resign", "1", "--lease", &lease]);
    std::fs::write(d.join("go"), "").unwrap();
    assert_eq!(w.wait(secs(10)).code(), Some(0), "{}", w.log_text());
    let meta = f.etcd.keys("lead-exec/meta/left/");
    assert!(
        meta.iter()
            .all(|k| k.starts_with("lead-exec/meta/left/history/")),
        "{meta:?}"
    );
    assert!(f.etcd.keys("lead-exec/elections/left/").is_empty());
    let held = |id: &str| {
        let ttl = f.etcd.ctl(&["lease", "timetolive", id, "--keys"]);
        !(ttl.contains("already expired") || ttl.contains("attached keys([])"))
    };
    assert!(!held(&lease), "the run's lease holds a key");
    // A request on a lease not ours stays for its own holder.
    let other = f.etcd.ctl(&["lease", "grant", "60"]);
    let other = other.split_whitespace().nth(1).unwrap().to_string();
    f.etcd
        .ctl(&["put", "lead-exec/meta/left/resign", "1", "--lease", &other]);
    let (code, _, err) = run(&run_args("left", &f.ep, &[], "true"));
    assert_eq!(code, 0, "{err}");
    assert!(!f.etcd.keys("lead-exec/meta/left/resign").is_empty());
    for line in f.etcd.ctl(&["lease", "list"]).lines().skip(1) {
        let Some(id) = line.split_whitespace().next() else {
            continue;
        };
        assert!(id == other || !held(id), "lease {id} holds a key");
    }
}

/// A start record still in flight when the term ends is not waited for (lead-exec-safety(7),
/// "Round trips"): the end's commit writes the record whole, and the attempt, guarded by the
/// key that commit deletes, changes nothing after it. Every request is delayed 150 ms each
/// way, so the attempt sent as the job starts is still in flight when the job has ended.
#[test]
fn a_start_record_in_flight_at_the_end_leaves_the_record_closed() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    proxy.set(Mode::Delay(150));
    let ep = proxy.endpoint();
    let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/t");
    // Sent as the job starts, as a longer job's record is once the hold is over.
    let at_once = [("LEAD_EXEC_TEST_START_RECORD_HOLD_MS", "0")];
    let (code, _, err) = run_env(&run_args("flight", &ep, &[], &job), &at_once);
    assert_eq!(code, 0, "{err}");
    let token = wait_int(&f.dir.path().join("t"), secs(5));
    let (_, out, _) = run(&["history", "flight", "--endpoints", &f.ep, "-o", "json"]);
    let recs = json(&out);
    let r = &recs[0];
    assert_eq!(recs.as_array().map(Vec::len), Some(1), "{out}");
    assert_eq!(r["token"].as_i64(), Some(token), "{out}");
    assert_eq!(r["end"], "exit 0", "{out}");
    assert!(f.etcd.keys("lead-exec/elections/flight/").is_empty());
}

/// Starts a worker on `name` (with `extra` flags) whose start record is held back for the
/// whole term, and whose job takes 3 s to stop: past the 1.5 s a pause gives a holder without a
/// record. Returns once `history` shows the term running, known by its key alone.
fn held_term(f: &Fixture, name: &str, extra: &[&str]) -> (Worker, i64) {
    let a = spawn_held(f, name, ("a", "alpha"), extra);
    let token = wait_int(&f.dir.path().join("a.token"), secs(10));
    assert!(
        f.etcd
            .keys(&format!("lead-exec/meta/{name}/history/"))
            .is_empty(),
        "the start record is held back"
    );
    let (code, out, err) = run(&["history", name, "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let recs = json(&out);
    assert_eq!(recs[0]["token"].as_i64(), Some(token), "{out}");
    assert_eq!(recs[0]["id"], "alpha", "{out}");
    assert!(recs[0]["end"].is_null(), "running: {out}");
    (a, token)
}

/// A worker `who` (its name, its id) on `name` whose start record is held back for the whole
/// term; its job writes its token to `$D/<name>.token` and takes 3 s to stop.
fn spawn_held(f: &Fixture, name: &str, who: (&str, &str), extra: &[&str]) -> Worker {
    let job = script(
        f.dir.path(),
        &format!(
            "trap 'sleep 3; echo end $FENCING_TOKEN >> $D/log; exit 0' TERM; \
             echo $FENCING_TOKEN > $D/{}.token; while :; do sleep 0.05; done",
            who.0
        ),
    );
    let grace = ["--ttl", "8s", "--grace", "5s", "--safety-margin", "500ms"];
    let hold = [("LEAD_EXEC_TEST_START_RECORD_HOLD_MS", "600000")];
    let flags = [&["--id", who.1][..], extra].concat();
    spawn_env(
        f.dir.path(),
        who.0,
        &run_args_with(&grace, name, &f.ep, &flags, &job),
        &hold,
    )
}

/// A blocking `pause` of `name` returns only once the job of `token` has ended, and that
/// term's end wrote its record whole.
fn pause_waits_for(f: &Fixture, name: &str, token: i64) {
    let (code, out, err) = run(&["pause", name, "--endpoints", &f.ep, "--reason", "upgrade"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        lines(&f.dir.path().join("log")).contains(&format!("end {token}")),
        "pause returned while the job still ran:\n{out}"
    );
    assert!(
        out.contains(&format!("waiting for token {token} to stop its job")),
        "{out}"
    );
    let (_, out, _) = run(&["history", name, "--endpoints", &f.ep, "-o", "json"]);
    let recs = json(&out);
    assert_eq!(recs.as_array().map(Vec::len), Some(1), "{out}");
    assert_eq!(recs[0]["token"].as_i64(), Some(token), "{out}");
    assert_eq!(recs[0]["end"], "paused", "{out}");
    assert_eq!(
        f.etcd
            .keys(&format!("lead-exec/meta/{name}/history/"))
            .len(),
        1
    );
}

/// A term elected by the transaction that created its key is marked so in the key, and holds
/// its start record back (lead-exec-safety(7), "Round trips"). Until the record is there,
/// `history`, `status` and a blocking `pause` know the term by its key.
#[test]
fn a_term_known_by_its_key_alone_is_running_for_pause_status_and_history() {
    let f = Fixture::new();
    let (a, token) = held_term(&f, "held", &[]);
    let (code, out, err) = run(&["status", "held", "--endpoints", &f.ep]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("leader:    alpha"), "{out}");
    assert!(out.contains(&format!("token {token}")), "{out}");
    pause_waits_for(&f, "held", token);
    drop(a);
}

/// With `--slots`, the transaction that claims a slot marks the holder's key the same way.
#[test]
fn a_slot_holder_is_marked_by_its_claim_and_pause_waits_for_its_job() {
    let f = Fixture::new();
    let (a, token) = held_term(&f, "heldslot", &["--slots", "2"]);
    pause_waits_for(&f, "heldslot", token);
    drop(a);
}

/// A candidate that waited behind another is marked elected by the transaction that confirms
/// it: its start record is held back too,
/// and a blocking `pause` waits for its job however long the record takes (lead-exec-safety(7),
/// "Round trips"). Before, a record delayed past 1.5 s let `pause` return with the job running.
#[test]
fn a_term_confirmed_behind_another_is_marked_and_pause_waits_for_its_job() {
    let f = Fixture::new();
    let first = job_until_go(f.dir.path());
    let a = spawn(
        f.dir.path(),
        "a",
        &run_args("behind", &f.ep, &["--id", "alpha"], &first),
    );
    let t1 = wait_int(&f.dir.path().join("started"), secs(10));
    let b = spawn_held(&f, "behind", ("b", "beta"), &[]);
    assert!(wait_until(secs(10), || f
        .etcd
        .keys("lead-exec/elections/behind/")
        .len()
        == 2));
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    let t2 = wait_int(&f.dir.path().join("b.token"), secs(10));
    assert!(t2 > t1);
    let values = f.etcd.ctl(&[
        "get",
        "--prefix",
        "lead-exec/elections/behind/",
        "--print-value-only",
    ]);
    assert!(values.contains("\"elected_ms\""), "{values}");
    assert_eq!(
        f.etcd.keys("lead-exec/meta/behind/history/").len(),
        1,
        "only the first term's record; the second's is held back"
    );
    let (code, out, err) = run(&[
        "pause",
        "behind",
        "--endpoints",
        &f.ep,
        "--reason",
        "upgrade",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        lines(&f.dir.path().join("log")).contains(&format!("end {t2}")),
        "pause returned while the job still ran:\n{out}"
    );
    let (_, out, _) = run(&["history", "behind", "--endpoints", &f.ep, "-o", "json"]);
    let recs = json(&out);
    assert_eq!(recs[1]["token"].as_i64(), Some(t2), "{out}");
    assert_eq!(recs[1]["end"], "paused", "{out}");
    drop((a, b));
}

/// The log of a run at debug level.
const DEBUG: &[(&str, &str)] = &[("RUST_LOG", "warn,lead_exec=debug")];

/// What a run logs at debug level when its creating transaction, sent beside the lease's
/// grant, reached etcd before it.
const BEFORE_ITS_LEASE: &str =
    "sent ahead of its lease: etcd unavailable: etcdserver: requested lease not found";

/// The cluster's revision: how many writes it has taken.
fn revision(f: &Fixture) -> i64 {
    let out = f.etcd.ctl(&["get", "lead-exec/no-such-key", "-w", "json"]);
    json(&out)["header"]["revision"]
        .as_i64()
        .expect("a revision")
}

/// The first lease grant is the first request on lead-exec's connection, and the creating
/// transaction that names its lease the next: the start-up probe and the version request go
/// out behind them. With those two beside the grant, etcd proposed the transaction first in
/// about one run of ten (lead-exec-safety(7), "Round trips"), each a commit and a round trip
/// more. Read off the HTTP/2 frames lead-exec sent, through a proxy.
#[test]
fn the_first_lease_grant_is_the_first_request_and_the_creating_transaction_the_next() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    let id: u64 = 0x5eed_1ea5_e000_0001;
    let id_text = id.to_string();
    let env = [("LEAD_EXEC_TEST_FIRST_LEASE_ID", id_text.as_str())];
    let (code, _, err) = run_env(&run_args("order", &proxy.endpoint(), &[], "true"), &env);
    assert_eq!(code, 0, "{err}");
    let sent = proxy.sent();
    let requests = grpc_messages(sent.first().expect("lead-exec connected"));
    let id = varint(id);
    // LeaseGrantRequest: the lease id is field 2 (tag 0x10); a PutRequest names it in its
    // field 3 (tag 0x18).
    let names = |m: &[u8], tag: u8| {
        let mut p = vec![tag];
        p.extend_from_slice(&id);
        m.windows(p.len()).any(|w| w == p.as_slice())
    };
    let order: Vec<&str> = requests
        .iter()
        .map(|m| {
            if names(m, 0x10) && m.len() < 32 {
                "grant"
            } else if names(m, 0x18) {
                "creation"
            } else {
                "other"
            }
        })
        .collect();
    assert!(
        order.len() >= 4 && order[..2] == ["grant", "creation"],
        "requests in the order sent: {order:?}"
    );
}

/// The gRPC messages of an HTTP/2 client's byte stream, one per stream, in the order the
/// streams' first DATA frames were sent (a message longer than a frame is cut short: enough to
/// tell requests apart).
fn grpc_messages(bytes: &[u8]) -> Vec<Vec<u8>> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut rest = bytes.strip_prefix(PREFACE).expect("an HTTP/2 preface");
    let mut seen = Vec::new();
    let mut messages = Vec::new();
    while rest.len() >= 9 {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (kind, stream) = (rest[3], u32::from_be_bytes(rest[5..9].try_into().unwrap()));
        let Some(payload) = rest.get(9..9 + len) else {
            break;
        };
        // DATA frames, each stream's first: its message after gRPC's 5-byte prefix.
        if kind == 0 && !seen.contains(&stream) && payload.len() >= 5 {
            seen.push(stream);
            messages.push(payload[5..].to_vec());
        }
        rest = &rest[9 + len..];
    }
    messages
}

/// `v` as a protobuf varint.
fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

/// The creating transaction goes out beside the lease's grant, naming the lease id the grant
/// asks for (lead-exec-safety(7), "Round trips"). One that etcd takes before the grant fails
/// whole and writes nothing: the run's only writes are its creation, sent again once the lease
/// exists, and its end, so its token is the next revision.
#[test]
fn a_creating_transaction_that_reaches_etcd_before_its_lease_writes_nothing_and_is_sent_again() {
    let f = Fixture::new();
    let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/t");
    let (code, _, err) = run(&run_args("ahead", &f.ep, &[], "true"));
    assert_eq!(code, 0, "{err}");
    let before = revision(&f);
    let late = [DEBUG[0], ("LEAD_EXEC_TEST_FIRST_GRANT_LATE_MS", "300")];
    let (code, _, err) = run_env(&run_args("ahead", &f.ep, &[], &job), &late);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(BEFORE_ITS_LEASE), "{err}");
    let token = wait_int(&f.dir.path().join("t"), secs(5));
    assert_eq!(token, before + 1, "{err}");
    assert_eq!(
        revision(&f),
        before + 2,
        "the creation and the end only: {err}"
    );
    let recs = history_json(&f.etcd, "ahead");
    let last = recs.last().expect("a record");
    assert_eq!(last["token"].as_i64(), Some(token), "{recs:?}");
    assert_eq!(last["end"], "exit 0", "{recs:?}");
    assert!(f.etcd.keys("lead-exec/elections/ahead/").is_empty());
}

/// A lease id of our choosing that a live lease has already: etcd refuses the grant, and a
/// key that the creating transaction put on that lease (and its `--priority` key) is withdrawn
/// before the campaign goes on, on a lease etcd picks. The lease that is not ours is left
/// alone.
#[test]
fn a_lease_id_taken_already_is_left_alone_and_the_key_put_on_it_is_withdrawn() {
    let f = Fixture::new();
    let d = f.dir.path();
    let granted = f.etcd.ctl(&["lease", "grant", "60"]);
    let hex = granted.split_whitespace().nth(1).unwrap().to_string();
    let taken = i64::from_str_radix(&hex, 16).unwrap().to_string();
    let job = script(
        d,
        "echo $LEAD_EXEC_LEADER_KEY > $D/key; echo $FENCING_TOKEN > $D/t",
    );
    let env = [DEBUG[0], ("LEAD_EXEC_TEST_FIRST_LEASE_ID", taken.as_str())];
    let prio = ["--priority", "3"];
    let (code, _, err) = run_env(&run_args("taken", &f.ep, &prio, &job), &env);
    assert_eq!(code, 0, "{err}");
    let token = wait_int(&d.join("t"), secs(5));
    let key = std::fs::read_to_string(d.join("key")).unwrap();
    assert!(!key.trim().ends_with(&format!("/{hex}")), "{key}: {err}");
    let ttl = f.etcd.ctl(&["lease", "timetolive", &hex, "--keys"]);
    assert!(
        ttl.contains("attached keys([])") && !ttl.contains("expired"),
        "{ttl}"
    );
    let recs = history_json(&f.etcd, "taken");
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["token"].as_i64(), Some(token));
    assert!(f.etcd.keys("lead-exec/elections/taken/").is_empty());
    let meta = f.etcd.keys("lead-exec/meta/taken/");
    assert!(meta.iter().all(|k| k.contains("/history/")), "{meta:?}");
}

/// A lease id that a running worker's lease has: the key the creating transaction finds there
/// is that worker's, not ours, and stays, with its job; we queue behind it on a lease etcd
/// picks and lead after it.
#[test]
fn a_lease_id_taken_by_a_running_worker_leaves_its_key_and_job_alone() {
    let f = Fixture::new();
    let d = f.dir.path();
    let same = [("LEAD_EXEC_TEST_FIRST_LEASE_ID", "777")];
    let a_job = script(
        d,
        "echo $FENCING_TOKEN > $D/a; trap 'echo term > $D/a.term; exit 0' TERM; \
         while [ ! -e $D/go ]; do sleep 0.05; done",
    );
    let mut a = spawn_env(d, "a", &run_args("same", &f.ep, &[], &a_job), &same);
    let token_a = wait_int(&d.join("a"), secs(10));
    let b_job = script(d, "echo $FENCING_TOKEN > $D/b");
    let mut b = spawn_env(d, "b", &run_args("same", &f.ep, &[], &b_job), &same);
    let in_line = || f.etcd.keys("lead-exec/elections/same/").len() == 2;
    assert!(wait_until(secs(10), in_line), "{}", b.log_text());
    let keys = f.etcd.keys("lead-exec/elections/same/");
    assert!(keys.iter().any(|k| k.ends_with("/309")), "{keys:?}");
    assert!(!d.join("a.term").exists(), "{}", a.log_text());
    assert!(!d.join("b").exists(), "{}", b.log_text());
    std::fs::write(d.join("go"), "").unwrap();
    assert_eq!(a.wait(secs(10)).code(), Some(0), "{}", a.log_text());
    assert_eq!(b.wait(secs(10)).code(), Some(0), "{}", b.log_text());
    assert!(wait_int(&d.join("b"), secs(1)) > token_a);
    assert!(!d.join("a.term").exists(), "{}", a.log_text());
}

/// An uncontended run that ends within the hold makes three raft commits: the lease grant,
/// the creating transaction and the closing one (lead-exec-safety(7), "Round trips"), as
/// etcd's own counter says, and its record is whole.
#[test]
fn a_short_uncontended_run_makes_three_raft_commits_and_is_recorded_whole() {
    let f = Fixture::new();
    let commits = || -> f64 {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&f.ep).expect("etcd's client port");
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", f.ep).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("etcd_server_proposals_committed_total "))
            .and_then(|v| v.trim().parse().ok())
            .expect("etcd reports its committed proposals")
    };
    // The first run sets the election up; the next ones are what every run costs.
    let job = script(f.dir.path(), "echo $FENCING_TOKEN >> $D/t");
    let (code, _, err) = run(&run_args("three", &f.ep, &[], &job));
    assert_eq!(code, 0, "{err}");
    for _ in 0..3 {
        let before = commits();
        let (code, _, err) = run_env(&run_args("three", &f.ep, &[], &job), DEBUG);
        assert_eq!(code, 0, "{err}");
        // A revoke sent on the way out would land within this.
        std::thread::sleep(Duration::from_millis(300));
        let made = commits() - before;
        // A creating transaction that etcd took before the grant ahead of it failed whole,
        // and was sent again: one commit more.
        let allowed = if err.contains(BEFORE_ITS_LEASE) {
            4.0
        } else {
            3.0
        };
        assert!(made <= allowed, "{made} raft commits for one run: {err}");
    }
    let tokens = lines(&f.dir.path().join("t"));
    let (_, out, _) = run(&["history", "three", "--endpoints", &f.ep, "-o", "json"]);
    let recs = json(&out);
    assert_eq!(recs.as_array().map(Vec::len), Some(4), "{out}");
    for (r, t) in recs.as_array().unwrap().iter().zip(&tokens) {
        assert_eq!(r["token"].to_string(), *t, "{out}");
        assert_eq!(r["end"], "exit 0", "{out}");
    }
}
