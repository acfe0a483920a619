//! Signals to lead-exec reach the job's group; the grace is honoured, then SIGKILL.

use std::time::Instant;

use harness::*;

#[test]
fn term_is_forwarded_to_a_job_that_traps_it() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "trap 'echo got-term > $D/trap; exit 0' TERM; echo up > $D/up; while :; do sleep 0.05; done",
    );
    let mut w = spawn(
        dir.path(),
        "w",
        &run_args("sigs", &etcd.endpoints(), &[], &s),
    );
    wait_line(&dir.path().join("up"), secs(10), |l| l == "up");
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(10)), 0);
    assert_eq!(lines(&dir.path().join("trap")), vec!["got-term"]);
    // Resigned: no candidate key left.
    assert!(etcd.keys("lead-exec/elections/sigs/").is_empty());
}

#[test]
fn usr1_and_hup_are_forwarded_too() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "trap 'echo usr1 >> $D/got' USR1; trap 'echo hup >> $D/got; exit 3' HUP; echo up > $D/up; while :; do sleep 0.05; done",
    );
    let mut w = spawn(
        dir.path(),
        "w",
        &run_args("fwd", &etcd.endpoints(), &[], &s),
    );
    wait_line(&dir.path().join("up"), secs(10), |l| l == "up");
    w.signal(libc::SIGUSR1);
    wait_line(&dir.path().join("got"), secs(5), |l| l == "usr1");
    w.signal(libc::SIGHUP);
    assert_eq!(w.code(secs(10)), 3);
}

/// `nohup lead-exec run …`: the SIGHUP of a logout is ignored, as nohup asked, not
/// forwarded and not the run's end; SIGTERM still ends it.
#[test]
fn a_hangup_ignored_at_start_stays_ignored() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "trap 'echo hup >> $D/got' HUP; echo up > $D/up; while :; do sleep 0.05; done",
    );
    let ep = etcd.endpoints();
    let mut args = vec![bin()];
    args.extend(run_args("nohup", &ep, &[], &s));
    let mut w = spawn_program(std::path::Path::new("nohup"), dir.path(), "w", &args, &[]);
    wait_line(&dir.path().join("up"), secs(10), |l| l == "up");
    w.signal(libc::SIGHUP);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(w.child.try_wait().unwrap().is_none(), "{}", w.log_text());
    assert!(
        lines(&dir.path().join("got")).is_empty(),
        "HUP was forwarded"
    );
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(10)), 143, "{}", w.log_text());
}

/// A background command of a non-interactive shell starts with INT and QUIT ignored; they
/// stay so (a ^C meant for the foreground does not end the run).
#[test]
fn int_and_quit_ignored_at_start_stay_ignored() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let s = script(dir.path(), "echo up > $D/up; while :; do sleep 0.05; done");
    let le = run_args("bg", &etcd.endpoints(), &[], &s)
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let line = format!(
        "'{}' {le} & echo $! > {}/pid; wait",
        bin(),
        dir.path().display()
    );
    let mut sh = spawn_program(
        std::path::Path::new("sh"),
        dir.path(),
        "sh",
        &["-c", &line],
        &[],
    );
    wait_line(&dir.path().join("up"), secs(10), |l| l == "up");
    let pid = wait_int(&dir.path().join("pid"), secs(5)) as i32;
    signal(pid, libc::SIGINT);
    signal(pid, libc::SIGQUIT);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(alive(pid), "{}", sh.log_text());
    signal(pid, libc::SIGTERM);
    assert_eq!(sh.code(secs(10)), 0, "{}", sh.log_text());
    assert!(!alive(pid));
}

#[test]
fn job_ignoring_term_is_killed_after_the_grace_with_its_grandchild() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "trap '' TERM; sh -c 'trap \"\" TERM; echo $$ > $D/grandchild; exec sleep 60' & echo up > $D/up; wait",
    );
    let mut w = spawn(
        dir.path(),
        "w",
        &run_args("ign", &etcd.endpoints(), &[], &s),
    );
    wait_line(&dir.path().join("up"), secs(10), |l| l == "up");
    let gc = wait_int(&dir.path().join("grandchild"), secs(5)) as i32;
    assert!(alive(gc));
    let start = Instant::now();
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(10)), 137, "{}", w.log_text());
    let took = start.elapsed();
    // FAST sets a 500 ms grace.
    assert!(took.as_millis() >= 450, "killed before the grace: {took:?}");
    assert!(!alive(gc), "grandchild {gc} survived");
}

#[test]
fn term_while_campaigning_cancels_and_removes_the_key() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let ep = etcd.endpoints();
    let s = script(dir.path(), "echo up > $D/up; sleep 30");
    let mut leader = spawn(dir.path(), "leader", &run_args("queue", &ep, &[], &s));
    wait_line(&dir.path().join("up"), secs(10), |l| l == "up");
    let mut waiter = spawn(dir.path(), "waiter", &run_args("queue", &ep, &[], "exit 0"));
    waiter.wait_log("waiting behind", secs(10));
    assert_eq!(etcd.keys("lead-exec/elections/queue/").len(), 2);
    let start = Instant::now();
    waiter.signal(libc::SIGTERM);
    assert_eq!(waiter.code(secs(5)), 143);
    assert!(start.elapsed() < secs(3));
    assert_eq!(etcd.keys("lead-exec/elections/queue/").len(), 1);
    leader.signal(libc::SIGTERM);
    leader.wait(secs(10));
}

/// A second stop while the job is draining cuts its grace short with SIGKILL: the log says
/// so with its phase line, so that a job killed before its grace is accounted for.
#[test]
fn a_second_stop_while_draining_logs_the_kill() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "trap 'echo got-term >> $D/trap' TERM; echo up > $D/up; while :; do sleep 0.05; done",
    );
    let mut w = spawn(
        dir.path(),
        "w",
        &run_args_with(&WIDE_GRACE, "sig2", &etcd.endpoints(), &[], &s),
    );
    wait_line(&dir.path().join("up"), secs(10), |l| l == "up");
    w.signal(libc::SIGTERM);
    wait_line(&dir.path().join("trap"), secs(5), |l| l == "got-term");
    w.wait_log("leading -> draining", secs(5));
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(5)), 137, "{}", w.log_text());
    let log = w.log_text();
    assert!(
        log.contains("draining -> draining on Signal(15)"),
        "no phase line for the second stop:\n{log}"
    );
}
