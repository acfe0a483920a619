//! Mutual exclusion: jobs of different terms never overlap, and tokens strictly increase.

use harness::*;

/// Each job appends "start T" and "end T" around a short sleep; three workers each run the
/// job three times in a row.
#[test]
fn three_workers_never_overlap_and_tokens_increase() {
    let f = Fixture::new();
    let log = f.dir.path().join("intervals");
    let job = script(
        f.dir.path(),
        "echo start $FENCING_TOKEN >> $D/intervals; sleep 0.2; echo end $FENCING_TOKEN >> $D/intervals",
    );
    let mut workers = Vec::new();
    for w in 0..3 {
        // A shell loop per worker, like a cron line firing three times.
        let args = run_args("mutex", &f.ep, &[], &job);
        let line = args
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
            .collect::<Vec<_>>()
            .join(" ");
        let bin = bin();
        let body = format!("for i in 1 2 3; do '{bin}' {line} || exit 1; done");
        let child = std::process::Command::new("sh")
            .args(["-c", &body])
            .stderr(std::fs::File::create(f.dir.path().join(format!("w{w}.log"))).unwrap())
            .spawn()
            .unwrap();
        workers.push(child);
    }
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
    let lines = lines(&log);
    assert_eq!(lines.len(), 18, "{lines:#?}");
    let mut last = 0i64;
    for pair in lines.chunks(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let t: i64 = a
            .strip_prefix("start ")
            .expect("starts alternate with ends")
            .parse()
            .unwrap();
        assert_eq!(
            b,
            &format!("end {t}"),
            "interval of {t} overlaps another: {lines:#?}"
        );
        assert!(t > last, "token {t} after {last}");
        last = t;
    }
}

/// An uncontended candidate is confirmed by the transaction that creates its key, with no read
/// of its own (lead-exec-safety(7), "Round trips"): the leader it learns there is the one a
/// separate read of the line finds, the oldest key, whose create revision is the job's token.
#[test]
fn a_leader_learned_from_its_creating_transaction_is_the_head_a_separate_read_finds() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN > $D/token; while :; do sleep 0.05; done",
    );
    let mut w = spawn(f.dir.path(), "a", &run_args("solo", &f.ep, &[], &job));
    let token = wait_int(&f.dir.path().join("token"), secs(10));
    let out = f.etcd.ctl(&[
        "get",
        "--prefix",
        "lead-exec/elections/solo/",
        "--sort-by=CREATE",
        "--order=ASCEND",
        "--limit=1",
        "-w",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let head = v["kvs"][0]["create_revision"].as_i64().expect(&out);
    assert_eq!(head, token, "{out}");
    // And a second candidate, which the same kind of transaction does not confirm, waits.
    let job_b = script(f.dir.path(), "echo $FENCING_TOKEN > $D/token_b");
    let mut b = spawn(f.dir.path(), "b", &run_args("solo", &f.ep, &[], &job_b));
    b.wait_log("waiting behind", secs(10));
    assert!(!f.dir.path().join("token_b").exists(), "b ran beside a");
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
    let tb = wait_int(&f.dir.path().join("token_b"), secs(10));
    assert!(tb > token, "{tb} after {token}");
    assert_eq!(b.code(secs(10)), 0);
}
