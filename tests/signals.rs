//! Signals to lead-exec reach the job's group; the grace is honoured, then SIGKILL.

use std::time::Instant;

use harness::*;

#[test]
fn term_is_forwarded_to_a_job_that_traps_it() {
    let f = Fixture::new();
    let s = script(
        f.dir.path(),
        "trap 'echo got-term > $D/trap; exit 0' TERM; echo up > $D/up; while :; do sleep 0.05; done",
    );
    let mut w = spawn(f.dir.path(), "w", &run_args("sigs", &f.ep, &[], &s));
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(10)), 0);
    assert_eq!(lines(&f.dir.path().join("trap")), vec!["got-term"]);
    // Resigned: no candidate key left.
    assert!(f.etcd.keys("lead-exec/elections/sigs/").is_empty());
}

#[test]
fn usr1_and_hup_are_forwarded_too() {
    let f = Fixture::new();
    let s = script(
        f.dir.path(),
        "trap 'echo usr1 >> $D/got' USR1; trap 'echo hup >> $D/got; exit 3' HUP; echo up > $D/up; while :; do sleep 0.05; done",
    );
    let mut w = spawn(f.dir.path(), "w", &run_args("fwd", &f.ep, &[], &s));
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    w.signal(libc::SIGUSR1);
    wait_line(&f.dir.path().join("got"), secs(5), |l| l == "usr1");
    w.signal(libc::SIGHUP);
    assert_eq!(w.code(secs(10)), 3);
}

/// `nohup lead-exec run …`: the SIGHUP of a logout is ignored, as nohup asked, not
/// forwarded and not the run's end; SIGTERM still ends it.
#[test]
fn a_hangup_ignored_at_start_stays_ignored() {
    let f = Fixture::new();
    let s = script(
        f.dir.path(),
        "trap 'echo hup >> $D/got' HUP; echo up > $D/up; while :; do sleep 0.05; done",
    );
    let mut args = vec![bin()];
    args.extend(run_args("nohup", &f.ep, &[], &s));
    let mut w = spawn_program(std::path::Path::new("nohup"), f.dir.path(), "w", &args, &[]);
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    w.signal(libc::SIGHUP);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(w.child.try_wait().unwrap().is_none(), "{}", w.log_text());
    assert!(
        lines(&f.dir.path().join("got")).is_empty(),
        "HUP was forwarded"
    );
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(10)), 143, "{}", w.log_text());
}

/// A parent that starts lead-exec with TERM, INT and HUP blocked (inherited through exec) does
/// not take them from it: they are unblocked at start, as timeout(1) does, and TERM still
/// stops the run. Blocked by perl (perl-base, in every Debian), then exec.
#[test]
fn stop_signals_blocked_by_the_parent_still_stop_the_run() {
    let f = Fixture::new();
    let s = script(f.dir.path(), "echo up > $D/up; sleep 30");
    let block = "use POSIX; sigprocmask(SIG_BLOCK, POSIX::SigSet->new(SIGTERM, SIGINT, SIGHUP)); exec @ARGV or die";
    let mut args = vec!["-e", block, bin()];
    args.extend(run_args("blocked", &f.ep, &[], &s));
    let mut w = spawn_program(std::path::Path::new("perl"), f.dir.path(), "w", &args, &[]);
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    w.signal(libc::SIGTERM);
    assert_eq!(w.died_of(secs(10)), Some(libc::SIGTERM), "{}", w.log_text());
    assert!(f.etcd.keys("lead-exec/elections/blocked/").is_empty());
}

/// A background command of a non-interactive shell starts with INT and QUIT ignored; they
/// stay so (a ^C meant for the foreground does not end the run).
#[test]
fn int_and_quit_ignored_at_start_stay_ignored() {
    let f = Fixture::new();
    let s = script(
        f.dir.path(),
        "echo up > $D/up; while :; do sleep 0.05; done",
    );
    let le = run_args("bg", &f.ep, &[], &s)
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let line = format!(
        "'{}' {le} & echo $! > {}/pid; wait",
        bin(),
        f.dir.path().display()
    );
    let mut sh = spawn_program(
        std::path::Path::new("sh"),
        f.dir.path(),
        "sh",
        &["-c", &line],
        &[],
    );
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    let pid = wait_int(&f.dir.path().join("pid"), secs(5)) as i32;
    signal(pid, libc::SIGINT);
    signal(pid, libc::SIGQUIT);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(alive(pid), "{}", sh.log_text());
    signal(pid, libc::SIGTERM);
    assert_eq!(sh.code(secs(10)), 0, "{}", sh.log_text());
    assert!(!alive(pid));
}

/// The state letter of a process (`T` when stopped).
fn state(pid: i32) -> char {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    s.rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next())
        .and_then(|f| f.chars().next())
        .unwrap_or('?')
}

/// Whether the heartbeats stay still for `window`.
fn beats_still(dir: &std::path::Path, window: std::time::Duration) -> bool {
    let before = lines(&dir.join("hb")).len();
    std::thread::sleep(window);
    lines(&dir.join("hb")).len() == before
}

/// Ctrl-Z (SIGTSTP to lead-exec): the whole job stops first (both of its processes), then
/// lead-exec; `fg` (SIGCONT) continues both, in the same term.
#[test]
fn ctrl_z_stops_the_job_then_lead_exec_and_fg_continues_both() {
    let f = Fixture::new();
    let job = heartbeat_job(f.dir.path());
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args_with(&WIDE_GRACE, "ctrlz", &f.ep, &[], &job),
    );
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let gc = wait_int(&f.dir.path().join("grandchild"), secs(10)) as i32;
    w.wait_job_started();
    w.signal(libc::SIGTSTP);
    assert!(
        wait_until(secs(2), || state(w.pid()) == 'T'),
        "lead-exec did not stop"
    );
    // The job's group got its SIGSTOP before lead-exec stopped itself. A shell that has
    // just vforked a command whose child the stop caught waits for that child in state D,
    // as stopped as the child is; the heartbeats below tell that nothing runs.
    let held = |c: char| c == 'T' || c == 'D';
    assert!(
        wait_until(secs(2), || held(state(pid)) && held(state(gc))),
        "the job runs on: {:?}",
        (state(pid), state(gc))
    );
    assert!(beats_still(
        f.dir.path(),
        std::time::Duration::from_millis(300)
    ));
    w.signal(libc::SIGCONT);
    assert!(
        wait_until(secs(2), || !beats_still(
            f.dir.path(),
            std::time::Duration::from_millis(200)
        )),
        "the job was not continued"
    );
    assert_ne!(state(w.pid()), 'T');
    assert_eq!(terms(f.dir.path()).len(), 1, "{}", w.log_text());
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(10)), 143, "{}", w.log_text());
}

/// A Ctrl-Z that outlasts the lease ends the term the fail-closed way: the stopped job is
/// killed by the deadline, and lead-exec, once continued, runs it again in a new term.
#[test]
fn a_ctrl_z_longer_than_the_lease_kills_the_job_by_the_deadline() {
    let f = Fixture::new();
    let job = heartbeat_job(f.dir.path());
    let mut w = spawn(f.dir.path(), "w", &run_args("ctrlzlong", &f.ep, &[], &job));
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    w.wait_job_started();
    let stopped = std::time::Instant::now();
    w.signal(libc::SIGTSTP);
    assert!(wait_until(secs(2), || state(w.pid()) == 'T'));
    assert!(
        wait_until(secs(5), || !alive(pid)),
        "the stopped job outlived D"
    );
    // TTL 3 s: D is at most 3 s − margin after the last renewal before the stop.
    assert!(stopped.elapsed() < std::time::Duration::from_millis(2900));
    w.signal(libc::SIGCONT);
    assert!(
        wait_until(secs(20), || terms(f.dir.path()).len() >= 2),
        "{}",
        w.log_text()
    );
    let t = terms(f.dir.path());
    assert!(t[1].0 > t[0].0, "{t:?}");
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

#[test]
fn job_ignoring_term_is_killed_after_the_grace_with_its_grandchild() {
    let f = Fixture::new();
    let s = script(
        f.dir.path(),
        "trap '' TERM; sh -c 'trap \"\" TERM; echo $$ > $D/grandchild; exec sleep 60' & echo up > $D/up; wait",
    );
    let mut w = spawn(f.dir.path(), "w", &run_args("ign", &f.ep, &[], &s));
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    let gc = wait_int(&f.dir.path().join("grandchild"), secs(5)) as i32;
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
    let f = Fixture::new();
    let s = script(f.dir.path(), "echo up > $D/up; sleep 30");
    let mut leader = spawn(f.dir.path(), "leader", &run_args("queue", &f.ep, &[], &s));
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    let mut waiter = spawn(
        f.dir.path(),
        "waiter",
        &run_args("queue", &f.ep, &[], "exit 0"),
    );
    waiter.wait_log("waiting behind", secs(10));
    assert_eq!(f.etcd.keys("lead-exec/elections/queue/").len(), 2);
    let start = Instant::now();
    waiter.signal(libc::SIGTERM);
    assert_eq!(waiter.code(secs(5)), 143);
    assert!(start.elapsed() < secs(3));
    assert_eq!(f.etcd.keys("lead-exec/elections/queue/").len(), 1);
    leader.signal(libc::SIGTERM);
    leader.wait(secs(10));
}

/// A second stop while the job is draining cuts its grace short with SIGKILL: the log says
/// so with its phase line, so that a job killed before its grace is accounted for.
#[test]
fn a_second_stop_while_draining_logs_the_kill() {
    let f = Fixture::new();
    let s = script(
        f.dir.path(),
        "trap 'echo got-term >> $D/trap' TERM; echo up > $D/up; while :; do sleep 0.05; done",
    );
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args_with(&WIDE_GRACE, "sig2", &f.ep, &["-v"], &s),
    );
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    w.signal(libc::SIGTERM);
    wait_line(&f.dir.path().join("trap"), secs(5), |l| l == "got-term");
    w.wait_log("leading -> draining", secs(5));
    w.signal(libc::SIGTERM);
    assert_eq!(w.code(secs(5)), 137, "{}", w.log_text());
    let log = w.log_text();
    assert!(
        log.contains("draining -> draining on SIGTERM"),
        "no phase line for the second stop:\n{log}"
    );
}

/// A signal for the job (USR1) that reaches a candidate waiting in line has no job to go to:
/// it is dropped, said at debug level, and the candidate keeps its place and leads later.
#[test]
fn a_signal_for_the_job_while_waiting_in_line_is_dropped_and_the_place_kept() {
    let f = Fixture::new();
    let (dir, ep) = (&f.dir, &f.ep);
    let s = script(dir.path(), "echo up > $D/up; sleep 30");
    let mut leader = spawn(dir.path(), "leader", &run_args("usr-q", ep, &[], &s));
    wait_line(&dir.path().join("up"), secs(10), |l| l == "up");
    let waiter_job = script(dir.path(), "echo ran > $D/waiter-ran");
    let mut waiter = spawn(
        dir.path(),
        "waiter",
        &run_args("usr-q", ep, &["-v"], &waiter_job),
    );
    waiter.wait_log("waiting behind", secs(10));
    waiter.signal(libc::SIGUSR1);
    waiter.wait_log("a signal for the job is dropped", secs(5));
    assert_eq!(f.etcd.keys("lead-exec/elections/usr-q/").len(), 2);
    leader.signal(libc::SIGTERM);
    leader.wait(secs(10));
    assert_eq!(waiter.code(secs(10)), 0);
    assert_eq!(lines(&dir.path().join("waiter-ran")), vec!["ran"]);
}

/// A run that a stop signal ends in 128+N ends by dying of that signal, as timeout(1) does:
/// a shell still sees 128+N, and systemd sees a clean stop rather than a failure. What exit
/// would have done is done first: the refusals file removed, the last log line written.
#[test]
fn a_stopped_run_dies_of_the_signal_after_its_cleanup() {
    let f = Fixture::new();
    // The job dies of the forwarded TERM: the run's end is 143, by dying of TERM.
    let s = script(
        f.dir.path(),
        "echo \"$LEAD_EXEC_CHECK_REFUSALS\" > $D/file; echo up > $D/up; sleep 30",
    );
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let mut leader = spawn(
        f.dir.path(),
        "leader",
        &run_args("dies", &f.ep, &["--metrics-addr", &addr], &s),
    );
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    let file = lines(&f.dir.path().join("file")).remove(0);
    assert!(std::path::Path::new(&file).exists(), "{file}");
    // One in line, stopped by INT while campaigning.
    let mut waiter = spawn(
        f.dir.path(),
        "waiter",
        &run_args("dies", &f.ep, &[], "exit 0"),
    );
    waiter.wait_log("waiting behind", secs(10));
    waiter.signal(libc::SIGINT);
    assert_eq!(waiter.died_of(secs(5)), Some(libc::SIGINT));
    assert_eq!(waiter.code(secs(0)), 130, "as a shell sees it");

    leader.signal(libc::SIGTERM);
    assert_eq!(
        leader.died_of(secs(10)),
        Some(libc::SIGTERM),
        "{}",
        leader.log_text()
    );
    assert_eq!(leader.code(secs(0)), 143);
    assert!(
        !std::path::Path::new(&file).exists(),
        "refusals file left: {file}"
    );
    let log = leader.log_text();
    assert!(log.contains("job ended: signal 15"), "no last line:\n{log}");
    assert!(f.etcd.keys("lead-exec/elections/dies/").is_empty());
}

/// A job killed by someone else's TERM is the job's result: lead-exec exits 143, it does not
/// die of a signal nobody sent it.
#[test]
fn a_job_killed_from_outside_is_an_exit_code_not_a_death() {
    let f = Fixture::new();
    let s = script(f.dir.path(), "echo $$ > $D/pid; sleep 30");
    let mut w = spawn(f.dir.path(), "w", &run_args("outside", &f.ep, &[], &s));
    let pid = wait_int(&f.dir.path().join("pid"), secs(10));
    signal(pid as i32, libc::SIGTERM);
    assert_eq!(w.died_of(secs(10)), None);
    assert_eq!(w.code(secs(0)), 143);
}
