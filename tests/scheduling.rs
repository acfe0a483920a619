//! Scheduling controls: `--timeout`.

use harness::*;

#[test]
fn a_job_past_its_timeout_is_stopped_the_next_candidate_leads_and_the_exit_is_124() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let ep = etcd.endpoints();
    // It would run forever; it exits 0 on TERM, which must still not count as a success.
    let job_a = script(
        dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; \
         trap 'echo term >> $D/a; exit 0' TERM; while :; do sleep 0.05; done",
    );
    let same_key = ["--run-key", "nightly"];
    let mut a_args = vec!["--id", "a", "--timeout", "1s"];
    a_args.extend_from_slice(&same_key);
    let mut a = spawn(dir.path(), "a", &run_args("to", &ep, &a_args, &job_a));
    wait_line(&dir.path().join("terms"), secs(10), |_| true);
    let job_b = script(
        dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; exec sleep 60",
    );
    let mut b_args = vec!["--id", "b"];
    b_args.extend_from_slice(&same_key);
    let mut b = spawn(dir.path(), "b", &run_args("to", &ep, &b_args, &job_b));
    b.wait_log("waiting behind a", secs(10));

    assert_eq!(a.code(secs(10)), 124, "{}", a.log_text());
    assert_eq!(
        lines(&dir.path().join("a")),
        vec!["term"],
        "the job got SIGTERM"
    );
    // The run key was not recorded, so b runs the job, at once and with a larger token.
    let ok = wait_until(secs(10), || terms(dir.path()).len() >= 2);
    assert!(ok, "b did not take over:\n{}", b.log_text());
    let t = terms(dir.path());
    assert!(t[1].0 > t[0].0, "{t:?}");
    let (code, out, err) = run(&["history", "to", "--endpoints", &ep, "-o", "json"]);
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
