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
