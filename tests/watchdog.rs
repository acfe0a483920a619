//! The job never outlives its leadership, whatever happens to lead-exec itself.

use std::time::{Duration, Instant};

use harness::proxy::{Mode, Proxy};
use harness::*;

/// A job with a grandchild, both recording their pids, both running until killed.
fn family_job(dir: &std::path::Path) -> String {
    script(
        dir,
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; \
         sh -c 'echo $$ > $D/grandchild; exec sleep 120' & \
         echo $$ > $D/pid; wait",
    )
}

/// Starts a worker whose job is `family_job` on `endpoints` and waits for the job and its
/// grandchild: (worker, job pid, grandchild pid).
fn start_family(dir: &std::path::Path, election: &str, endpoints: &str) -> (Worker, i32, i32) {
    start_family_with(dir, election, endpoints, &[])
}

/// [`start_family`] with more of lead-exec's options.
fn start_family_with(
    dir: &std::path::Path,
    election: &str,
    endpoints: &str,
    extra: &[&str],
) -> (Worker, i32, i32) {
    let job = family_job(dir);
    let w = spawn(dir, "w", &run_args(election, endpoints, extra, &job));
    let pid = wait_int(&dir.join("pid"), secs(10)) as i32;
    let gc = wait_int(&dir.join("grandchild"), secs(10)) as i32;
    (w, pid, gc)
}

#[test]
fn sigkill_of_lead_exec_kills_the_whole_group_at_once() {
    let f = Fixture::new();
    let (mut w, pid, gc) = start_family(f.dir.path(), "kill9", &f.ep);
    let start = Instant::now();
    w.signal(libc::SIGKILL);
    w.wait(secs(5));
    assert!(
        wait_until(secs(2), || !alive(pid) && !alive(gc)),
        "job {pid} or grandchild {gc} survived lead-exec's SIGKILL"
    );
    let took = start.elapsed();
    eprintln!("group dead {took:?} after SIGKILL of lead-exec");
    assert!(took < Duration::from_secs(1), "{took:?}: not at once");
}

/// SIGSTOP lead-exec: its watchdog still stops the job by D. After SIGCONT lead-exec notices,
/// and campaigns again on a fresh lease with a larger token.
#[test]
fn frozen_lead_exec_loses_its_job_by_the_deadline_then_campaigns_again() {
    let f = Fixture::new();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let metrics = ["--metrics-addr", addr.as_str()];
    let (mut w, pid, gc) = start_family_with(f.dir.path(), "freeze", &f.ep, &metrics);
    let frozen = Instant::now();
    w.signal(libc::SIGSTOP);
    assert!(
        wait_until(secs(10), || !alive(pid) && !alive(gc)),
        "job outlived D"
    );
    let died = frozen.elapsed();
    // Last renewal ≤ 1 s before the freeze, so D ≤ freeze + 3 s − 0.5 s.
    assert!(
        died <= Duration::from_millis(2800),
        "died {died:?} after the freeze"
    );
    // Keep it frozen past the server-side expiry too, then let it go.
    std::thread::sleep(Duration::from_millis(500));
    w.signal(libc::SIGCONT);
    w.wait_log(
        "the watchdog stopped the job at the lease deadline",
        secs(10),
    );
    let slack: i64 = w
        .log_text()
        .lines()
        .find(|l| l.contains("the watchdog stopped the job"))
        .and_then(|l| l.split("slack_ms=").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("slack in the log");
    eprintln!("job died {died:?} after SIGSTOP; slack before D: {slack} ms");
    assert!(slack >= 0, "the group died after D: {slack} ms");
    assert!(
        wait_until(secs(20), || terms(f.dir.path()).len() >= 2),
        "{}",
        w.log_text()
    );
    let t = terms(f.dir.path());
    assert!(t[1].0 > t[0].0, "{t:?}");
    assert_ne!(t[1].1, t[0].1, "campaigned on the old lease");
    // Said and counted once, whether lead-exec first saw its lease lost or the job's end at
    // the watchdog's hands.
    w.wait_log("leadership lost", secs(10));
    // By whichever reason lead-exec saw first (its deadline, or the key's deletion at the
    // expiry, if that news was waiting when it woke).
    let text = scrape(port).unwrap();
    let lost: f64 = [
        "lease_expired",
        "renewal_deadline_passed",
        "leader_key_deleted",
    ]
    .iter()
    .map(|r| {
        let name = format!(r#"lead_exec_leadership_lost_total{{election="freeze",reason="{r}"}}"#);
        metric(&text, &name).unwrap_or_else(|| panic!("no {name}: {text}"))
    })
    .sum();
    assert_eq!(lost, 1.0, "{text}");
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
    let log = w.log_text();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("leadership lost"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains(&format!("token={}", t[0].0)), "{log}");
}

/// A stop (systemd's, a container's) sent to a leader that is frozen past its lease's
/// deadline: whichever lead-exec reads first when it runs again (its lease lost, the stop,
/// the watchdog's kill), the loss is said once, the term is recorded as lost, and the run
/// ends as stopped.
#[test]
fn a_stop_sent_to_a_frozen_leader_past_its_deadline_says_the_loss_once() {
    let f = Fixture::new();
    let (mut w, pid, gc) = start_family(f.dir.path(), "frozenstop", &f.ep);
    w.wait_job_started();
    w.signal(libc::SIGSTOP);
    w.signal(libc::SIGTERM);
    assert!(
        wait_until(secs(10), || !alive(pid) && !alive(gc)),
        "job outlived D"
    );
    w.signal(libc::SIGCONT);
    let code = w.code(secs(15));
    let log = w.log_text();
    let said = log.matches("leadership lost").count();
    assert_eq!(said, 1, "{log}");
    assert_ne!(code, 0, "{log}");
    let token = terms(f.dir.path())[0].0;
    let (_, history, _) = run(&["history", "frozenstop", "--endpoints", &f.ep, "-o", "json"]);
    // Its one term.
    assert!(
        history.contains(&format!("\"token\":{token},")),
        "{history}"
    );
    assert!(history.contains("\"end\":\"lease lost\""), "{history}");
}

#[test]
fn job_ignoring_term_with_grandchildren_dies_by_the_deadline() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    let job = script(
        f.dir.path(),
        "trap '' TERM; sh -c 'trap \"\" TERM; echo $$ > $D/grandchild; while :; do sleep 1; done' & \
         echo $$ > $D/pid; while :; do sleep 1; done",
    );
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args("stubborn", &proxy.endpoint(), &[], &job),
    );
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let gc = wait_int(&f.dir.path().join("grandchild"), secs(10)) as i32;
    let cut = Instant::now();
    proxy.set(Mode::Blackhole);
    assert!(
        wait_until(secs(10), || !alive(pid) && !alive(gc)),
        "survivors"
    );
    assert!(
        cut.elapsed() <= Duration::from_millis(2800),
        "{:?}",
        cut.elapsed()
    );
    proxy.set(Mode::Pass);
    w.signal(libc::SIGTERM);
    w.wait(secs(15));
}

/// A daemon that calls setsid leaves the job's process group. A cgroup contains it; without
/// one, that is the documented limitation.
#[test]
fn setsid_daemon_is_contained_by_the_cgroup() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "setsid sh -c 'echo $$ > $D/daemon; exec sleep 120' & sleep 0.2; echo $$ > $D/pid",
    );
    let (code, _, err) = run(&run_args("escape", &f.ep, &["--cgroup", "on"], &job));
    if err.contains("cannot create a cgroup") {
        // No cgroup v2 on this host: `--cgroup on` refuses to run, and the limitation is
        // shown by the next test.
        assert_eq!(code, 70, "{err}");
        return;
    }
    assert_eq!(code, 0, "{err}");
    let daemon = wait_int(&f.dir.path().join("daemon"), secs(5)) as i32;
    assert!(
        wait_until(secs(2), || !alive(daemon)),
        "setsid escapee {daemon} survived"
    );
}

/// Without a cgroup, a daemon that calls setsid is still the watchdog's descendant: it dies
/// with the term, and lead-exec exits only once it is gone (the escape table has the rest).
#[test]
fn without_a_cgroup_a_setsid_daemon_dies_with_the_term() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "setsid sh -c 'echo $$ > $D/daemon; exec sleep 120' & sleep 0.2",
    );
    // Not `run`: the escapee keeps the output pipes open.
    let args = run_args("escape2", &f.ep, &["--cgroup", "off"], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    assert_eq!(w.code(secs(10)), 0, "{}", w.log_text());
    let daemon = wait_int(&f.dir.path().join("daemon"), secs(5)) as i32;
    assert!(!alive(daemon), "the setsid daemon outlived the term");
}

#[test]
fn the_job_inherits_no_descriptor_of_ours() {
    let f = Fixture::new();
    // `exec ls` lists its own descriptors (plus the one it reads the directory with); a
    // pipeline would show the shell's pipes in flight instead.
    let list = "exec ls /proc/self/fd";
    let job = script(f.dir.path(), &format!("{list} > $D/job_fds"));
    let (code, _, err) = run(&run_args("fds", &f.ep, &[], &job));
    assert_eq!(code, 0, "{err}");
    // The same shell started directly by the test: what "the user passed in".
    let direct = std::process::Command::new("sh")
        .args([
            "-c",
            &script(f.dir.path(), &format!("{list} > $D/direct_fds")),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(direct.success());
    let fds = |name: &str| -> Vec<u32> {
        let mut v: Vec<u32> = lines(&f.dir.path().join(name))
            .iter()
            .filter_map(|l| l.parse().ok())
            .collect();
        v.sort();
        v
    };
    let (job_fds, direct_fds) = (fds("job_fds"), fds("direct_fds"));
    assert_eq!(&job_fds[..3], &[0, 1, 2], "{job_fds:?}");
    // Other tests run in parallel threads of this process, so the direct shell may catch a
    // descriptor in flight; the job must see nothing beyond what the caller passes.
    for fd in &job_fds {
        assert!(
            direct_fds.contains(fd),
            "the job sees fd {fd} the caller did not pass: {job_fds:?} vs {direct_fds:?}"
        );
    }
}

#[test]
fn the_job_starts_with_default_signals_and_an_empty_mask() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "exec grep -E '^Sig(Ign|Blk)' /proc/self/status > $D/sig",
    );
    // lead-exec itself starts with signals ignored, real-time ones too, as `nohup` or a
    // shell's `trap ''` leave them: none may reach the job.
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            "trap '' HUP INT USR1 40 50 64; exec \"$@\"",
            "sh",
            bin(),
        ])
        .args(run_args("sigmask", &f.ep, &[], &job))
        .env_remove("LEAD_EXEC_ENDPOINTS")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let sig = lines(&f.dir.path().join("sig"));
    assert_eq!(sig.len(), 2, "{sig:?}");
    for l in sig {
        let (name, mask) = l.split_once(':').unwrap();
        // All 64 signals, glibc's own 32 and 33 included.
        let all = u64::from_str_radix(mask.trim(), 16).unwrap();
        assert_eq!(all, 0, "{name} is {mask}");
    }
}

/// If the watchdog itself is SIGKILLed (the OOM killer, a careless kill -9), the job's main
/// process dies with it and lead-exec kills the rest, then campaigns again. The log names
/// that cause, on one line even under RUST_BACKTRACE=1.
#[test]
fn a_killed_watchdog_takes_the_job_with_it_and_is_logged_as_such() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN $LEAD_EXEC_LEASE_ID >> $D/terms; echo $PPID > $D/watchdog; \
         sh -c 'echo $$ > $D/grandchild; exec sleep 120' & \
         echo $$ > $D/pid; wait",
    );
    let args = run_args("wdkill", &f.ep, &[], &job);
    let mut w = spawn_env(f.dir.path(), "w", &args, &[("RUST_BACKTRACE", "1")]);
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let gc = wait_int(&f.dir.path().join("grandchild"), secs(10)) as i32;
    let wd = wait_int(&f.dir.path().join("watchdog"), secs(10)) as i32;
    assert_ne!(wd, w.pid());
    w.wait_job_started();
    std::fs::remove_file(f.dir.path().join("pid")).unwrap();
    signal(wd, libc::SIGKILL);
    assert!(
        wait_until(secs(2), || !alive(pid) && !alive(gc)),
        "job survived its watchdog"
    );
    w.wait_log("the watchdog died", secs(5));
    assert!(
        wait_until(secs(15), || terms(f.dir.path()).len() >= 2),
        "{}",
        w.log_text()
    );
    let t = terms(f.dir.path());
    assert!(t[1].0 > t[0].0);
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
    let log = w.log_text();
    assert!(!log.contains("lease deadline"), "{log}");
    assert!(!log.contains("could not renew"), "{log}");
    // The term was given up, not lost to its lease: nothing counts it as such.
    assert!(!log.contains("leadership lost"), "{log}");
    assert!(!log.to_lowercase().contains("backtrace"), "{log}");
}

/// The small `lead-exec-watchdog` binary is used when it sits beside lead-exec; a lone
/// lead-exec re-executes itself as the watchdog, with the same protection.
#[test]
fn the_watchdog_binary_is_optional() {
    let f = Fixture::new();
    let job = script(f.dir.path(), "readlink /proc/$PPID/exe > $D/wd_exe");
    let (code, _, err) = run(&run_args("wdbin", &f.ep, &[], &job));
    assert_eq!(code, 0, "{err}");
    let exe = lines(&f.dir.path().join("wd_exe")).join("");
    assert!(exe.ends_with("/lead-exec-watchdog"), "{exe}");

    let lone = f.dir.path().join("lead-exec");
    std::fs::copy(bin(), &lone).unwrap();
    let job = script(
        f.dir.path(),
        "readlink /proc/$PPID/exe > $D/lone_exe; echo $$ > $D/pid; exec sleep 60",
    );
    let args = run_args("wdbin", &f.ep, &[], &job);
    let mut w = spawn_program(&lone, f.dir.path(), "lone", &args, &[]);
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    assert_eq!(
        lines(&f.dir.path().join("lone_exe")).join(""),
        lone.display().to_string()
    );
    w.signal(libc::SIGKILL);
    w.wait(secs(5));
    assert!(
        wait_until(secs(2), || !alive(pid)),
        "job survived a lone lead-exec's SIGKILL"
    );
}

#[test]
fn descriptors_the_caller_passes_reach_the_job() {
    // As with flock(1) and systemd socket activation: a descriptor the caller leaves open
    // across exec is the job's too; lead-exec's own descriptors are close-on-exec.
    let f = Fixture::new();
    let job = "echo through-fd-7 >&7";
    let args = run_args("passfd", &f.ep, &[], job)
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(script(
            f.dir.path(),
            &format!("exec 7> $D/seven; exec {} {args}", bin()),
        ))
        .env_remove("LEAD_EXEC_ENDPOINTS")
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(lines(&f.dir.path().join("seven")), vec!["through-fd-7"]);
}

/// Starts a detached worker (own session) whose job is [`heartbeat_job`] and waits for the
/// job: (worker, job pid, grandchild pid, watchdog pid, leader key).
fn start_heartbeat(
    dir: &std::path::Path,
    etcd: &Etcd,
    election: &str,
    endpoints: &str,
) -> (Worker, i32, i32, i32, String) {
    // The comment puts "lead-exec" in the job's command line, as a path could.
    let job = format!("{} # lead-exec", heartbeat_job(dir));
    let w = spawn_detached(dir, "w", &run_args(election, endpoints, &[], &job), &[]);
    let pid = wait_int(&dir.join("pid"), secs(10)) as i32;
    let gc = wait_int(&dir.join("grandchild"), secs(10)) as i32;
    let wd = wait_int(&dir.join("watchdog"), secs(10)) as i32;
    w.wait_job_started();
    // A test that kills now reads the last heartbeat: there must be one.
    assert!(
        wait_until(secs(10), || !lines(&dir.join("hb")).is_empty()),
        "the job wrote no heartbeat"
    );
    let key = etcd
        .keys(&format!("lead-exec/elections/{election}/"))
        .remove(0);
    (w, pid, gc, wd, key)
}

/// Neither a group signal, nor a session-wide one, nor a match on "lead-exec" by name, argv[0]
/// or whole command line (`pkill -f`) reaches both lead-exec and its watchdog, even when the
/// job's own command line contains "lead-exec".
#[test]
fn the_watchdog_shares_no_group_session_or_name_with_lead_exec() {
    let f = Fixture::new();
    let (mut w, pid, _, wd, _) = start_heartbeat(f.dir.path(), &f.etcd, "names", &f.ep);
    let lead = w.pid();
    assert!(comm(lead).contains("lead-exec"), "{}", comm(lead));
    let cmdline = std::fs::read(format!("/proc/{wd}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    for (what, name) in [
        ("comm", comm(wd)),
        ("argv[0]", argv0(wd)),
        ("command line", cmdline),
    ] {
        assert!(!name.is_empty(), "no {what} for the watchdog {wd}");
        assert!(
            !name.contains("lead-exec"),
            "the watchdog's {what} is {name:?}"
        );
    }
    // Nor does any `pkill` pattern of three letters or more taken from lead-exec's name.
    for (what, name) in [("comm", comm(wd)), ("argv[0]", argv0(wd))] {
        for part in "lead-exec".as_bytes().windows(3) {
            let part = std::str::from_utf8(part).unwrap();
            assert!(
                !name.contains(part),
                "the watchdog's {what} {name:?} has {part:?}"
            );
        }
    }
    let (lead_pgid, lead_sid) = pgid_sid(lead).unwrap();
    let (wd_pgid, wd_sid) = pgid_sid(wd).unwrap();
    let (job_pgid, _) = pgid_sid(pid).unwrap();
    eprintln!("lead-exec pgid {lead_pgid} sid {lead_sid}; watchdog pgid {wd_pgid} sid {wd_sid}; job pgid {job_pgid}");
    assert_ne!(lead_pgid, wd_pgid);
    assert_ne!(lead_sid, wd_sid);
    assert_ne!(job_pgid, lead_pgid);
    assert_ne!(job_pgid, wd_pgid);
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// `kill -STOP -<pgid>` on lead-exec's process group (job control, a supervisor that signals
/// groups) freezes lead-exec only: the watchdog still kills the job by D, before the key
/// expires in etcd.
#[test]
fn a_stop_to_lead_exec_s_group_does_not_keep_the_job_past_the_deadline() {
    let f = Fixture::new();
    let (mut w, pid, gc, _, key) = start_heartbeat(f.dir.path(), &f.etcd, "grpstop", &f.ep);
    let gone = KeyGone::watch(&f.ep, &key);
    let stopped = now_ns();
    // The worker leads its own group (spawn_detached), so this reaches nothing of ours.
    signal(-w.pid(), libc::SIGSTOP);
    let expired = gone.wait(secs(15));
    let last = last_heartbeat(f.dir.path());
    let dead = !alive(pid) && !alive(gc);
    signal(-w.pid(), libc::SIGCONT);
    eprintln!(
        "group STOP: job's last heartbeat {} ms after the STOP, {} ms before etcd deleted the key",
        (last - stopped) / 1_000_000,
        (expired - last) / 1_000_000
    );
    assert!(
        dead,
        "job {pid} or grandchild {gc} alive when the key expired"
    );
    assert!(
        last <= expired,
        "heartbeat {} ms after the key expired",
        (last - expired) / 1_000_000
    );
    w.signal(libc::SIGTERM);
    w.wait(secs(15));
}

/// `pkill -9 lead-exec` (here narrowed to the sessions of this test's own processes) kills
/// lead-exec but not its watchdog, which then kills the whole job at once: the grandchild
/// too, which PR_SET_PDEATHSIG alone would leave running.
#[test]
fn pkill_by_name_kills_lead_exec_only_and_the_watchdog_kills_the_job() {
    pkill_lead_exec(&[], "lead-exec", "pkill");
}

/// Any part of lead-exec's name (three letters or more) that `pkill` is given matches one
/// enforcer only: "exec" or "lead" kills lead-exec, and its watchdog kills the job.
#[test]
fn pkill_by_part_of_the_name_spares_the_watchdog() {
    for (pattern, election) in [("exec", "pkexec"), ("lead", "pklead")] {
        pkill_lead_exec(&[], pattern, election);
    }
}

/// The same with `pkill -f`, while the job's own command line contains "lead-exec": it kills
/// lead-exec and the job's main process, and the watchdog the rest.
#[test]
fn pkill_f_by_command_line_spares_the_watchdog() {
    pkill_lead_exec(&["-f"], "lead-exec", "pkillf");
}

fn pkill_lead_exec(flags: &[&str], pattern: &str, election: &str) {
    let f = Fixture::new();
    let (mut w, pid, gc, wd, _) = start_heartbeat(f.dir.path(), &f.etcd, election, &f.ep);
    let (_, lead_sid) = pgid_sid(w.pid()).unwrap();
    let (_, wd_sid) = pgid_sid(wd).unwrap();
    let killed = now_ns();
    let out = std::process::Command::new("pkill")
        .arg("-9")
        .args(flags)
        .args(["-s", &format!("{lead_sid},{wd_sid}"), pattern])
        .output()
        .unwrap();
    assert!(out.status.success(), "pkill matched nothing: {out:?}");
    w.wait(secs(5));
    assert!(
        wait_until(secs(3), || !alive(pid) && !alive(gc)),
        "job {pid} or grandchild {gc} survived pkill -9 {flags:?} {pattern}"
    );
    let last = last_heartbeat(f.dir.path());
    eprintln!(
        "pkill -9 {flags:?} {pattern}: job's last heartbeat {} ms after the kill",
        (last - killed) / 1_000_000
    );
    assert!(
        last - killed < 1_000_000_000,
        "the job ran on {} ms",
        (last - killed) / 1_000_000
    );
}

/// SIGSTOP to the watchdog alone, then etcd out of reach: lead-exec enforces D by itself.
#[test]
fn a_frozen_watchdog_does_not_keep_the_job_past_the_deadline() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    let (mut w, pid, gc, wd, key) =
        start_heartbeat(f.dir.path(), &f.etcd, "wdstop", &proxy.endpoint());
    let gone = KeyGone::watch(&f.ep, &key);
    signal(wd, libc::SIGSTOP);
    let cut = now_ns();
    proxy.set(Mode::Blackhole);
    let expired = gone.wait(secs(15));
    let last = last_heartbeat(f.dir.path());
    let dead = !alive(pid) && !alive(gc);
    signal(wd, libc::SIGCONT);
    eprintln!(
        "watchdog frozen, etcd cut: job's last heartbeat {} ms after the cut, {} ms before etcd deleted the key",
        (last - cut) / 1_000_000,
        (expired - last) / 1_000_000
    );
    assert!(
        dead,
        "job {pid} or grandchild {gc} alive when the key expired"
    );
    assert!(last <= expired);
    proxy.set(Mode::Pass);
    w.signal(libc::SIGTERM);
    w.wait(secs(15));
}

/// A job that exits on its own while its watchdog is stopped (`pkill -STOP warden`) ends its
/// term with its own exit code once the watchdog is continued, and runs once. The SIGCHLD
/// waiting for the continued watchdog interrupted its poll, and it judged the group by the
/// deadline it had before the stop (the extensions still unread in its pipe): the end read as
/// a lease deadline, and lead-exec campaigned and ran the job a second time.
#[test]
fn a_job_that_exits_while_its_watchdog_is_stopped_runs_once() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $FENCING_TOKEN >> $D/terms; echo $PPID > $D/watchdog; sleep 1; exit 3",
    );
    let mut w = spawn(f.dir.path(), "w", &run_args("wdexit", &f.ep, &[], &job));
    let wd = wait_int(&f.dir.path().join("watchdog"), secs(10)) as i32;
    w.wait_job_started();
    let _stopped = StoppedWatchdog(wd);
    signal(wd, libc::SIGSTOP);
    // Well past the deadline the watchdog had when it was stopped (TTL 3 s), while
    // lead-exec renews and sends extensions.
    std::thread::sleep(std::time::Duration::from_secs(6));
    signal(wd, libc::SIGCONT);
    assert_eq!(w.code(secs(20)), 3, "{}", w.log_text());
    assert_eq!(
        lines(&f.dir.path().join("terms")).len(),
        1,
        "the job ran again:\n{}",
        w.log_text()
    );
}

/// When lead-exec gives up on a frozen watchdog, the log line names the watchdog it kills,
/// not only the job's pid (which read as the watchdog's).
#[test]
fn the_log_names_the_frozen_watchdog_it_kills() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    let (mut w, _pid, _gc, wd, _key) =
        start_heartbeat(f.dir.path(), &f.etcd, "wdname", &proxy.endpoint());
    // Frozen in a cgroup, not stopped: a stopped watchdog is continued by lead-exec once
    // the job's main process is dead, and then reports the end itself.
    let cg = TestCgroup::new("wdname").expect("a writable cgroup v2 (run as root)");
    std::fs::write(cg.0.join("cgroup.procs"), wd.to_string()).unwrap();
    std::fs::write(cg.0.join("cgroup.freeze"), "1").unwrap();
    proxy.set(Mode::Blackhole);
    w.wait_log("killing the watchdog", secs(20));
    let log = w.log_text();
    proxy.set(Mode::Pass);
    w.signal(libc::SIGTERM);
    w.wait(secs(15));
    let line = log
        .lines()
        .find(|l| l.contains("killing the watchdog"))
        .unwrap_or_default()
        .to_string();
    assert!(line.contains(&format!("watchdog={wd}")), "{line}");
}

/// A watchdog a test stopped: killed when the test ends, passed or failed, so that none is
/// left stopped on the host (only while it still is a watchdog: its pid may be reused).
struct StoppedWatchdog(i32);

impl Drop for StoppedWatchdog {
    fn drop(&mut self) {
        if comm(self.0) == "ldx-warden" {
            signal(self.0, libc::SIGKILL);
        }
    }
}

/// A job that exits once `hold` has been done to its watchdog (pid given) ends its term with
/// its own exit code, and the next worker's job starts within the grace (0.5 s, FAST) plus
/// 2 s of the job's end. Returns the first worker's log and the watchdog's pid.
fn a_job_exits_while_its_watchdog_is_held(election: &str, hold: impl FnOnce(i32)) -> (String, i32) {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "echo $PPID > $D/watchdog; while [ ! -e $D/go ]; do sleep 0.01; done; date +%s%N > $D/ended; exit 3",
    );
    let mut first = spawn(f.dir.path(), "first", &run_args(election, &f.ep, &[], &job));
    let wd = wait_int(&f.dir.path().join("watchdog"), secs(10)) as i32;
    first.wait_job_started();
    hold(wd);
    let next_job = script(f.dir.path(), "date +%s%N > $D/next");
    let mut second = spawn(
        f.dir.path(),
        "second",
        &run_args(election, &f.ep, &[], &next_job),
    );
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    assert_eq!(first.code(secs(10)), 3, "{}", first.log_text());
    assert_eq!(second.code(secs(10)), 0, "{}", second.log_text());
    let ended = wait_int(&f.dir.path().join("ended"), secs(1)) as i128;
    let next = wait_int(&f.dir.path().join("next"), secs(1)) as i128;
    let gap = Duration::from_nanos((next - ended) as u64);
    eprintln!("{election}: next job {gap:?} after the job's end");
    assert!(gap < Duration::from_millis(2500), "{gap:?}");
    (first.log_text(), wd)
}

/// A job that exits while its watchdog stays stopped (`pkill -STOP -x ldx-warden`, never
/// continued by hand) ends its term: lead-exec sees the job's end on its own pidfd and
/// continues the watchdog.
#[test]
fn a_job_that_exits_while_its_watchdog_stays_stopped_ends_its_term() {
    let mut stopped = None;
    a_job_exits_while_its_watchdog_is_held("wdstays", |wd| {
        stopped = Some(StoppedWatchdog(wd));
        signal(wd, libc::SIGSTOP);
    });
}

/// The same with a watchdog that SIGCONT cannot wake (frozen in a cgroup): lead-exec reads
/// the job's exit status from the zombie the watchdog holds, kills what is left and the
/// watchdog, and ends the term as the job did.
#[test]
fn a_job_that_exits_while_its_watchdog_is_frozen_ends_its_term() {
    let cg = TestCgroup::new("wdfrozen").expect("a writable cgroup v2 (run as root)");
    let (log, wd) = a_job_exits_while_its_watchdog_is_held("wdfrozen", |wd| {
        std::fs::write(cg.0.join("cgroup.procs"), wd.to_string()).unwrap();
        std::fs::write(cg.0.join("cgroup.freeze"), "1").unwrap();
        assert!(
            wait_until(secs(5), || std::fs::read_to_string(
                cg.0.join("cgroup.events")
            )
            .is_ok_and(|e| e.contains("frozen 1"))),
            "the watchdog's cgroup never froze"
        );
    });
    assert!(log.contains("its watchdog has not said so"), "{log}");
    assert!(!alive(wd), "the frozen watchdog was left behind");
}

/// SIGSTOP to the watchdog, then SIGTERM to lead-exec: lead-exec does not wait for the
/// watchdog to carry out the stop. It kills the job's group itself once the grace is over,
/// then the watchdog, and exits.
#[test]
fn a_stop_goes_through_a_frozen_watchdog() {
    let f = Fixture::new();
    let (mut w, pid, gc, wd, _) = start_heartbeat(f.dir.path(), &f.etcd, "wdstopterm", &f.ep);
    let _cleanup = StoppedWatchdog(wd);
    signal(wd, libc::SIGSTOP);
    let asked = Instant::now();
    w.signal(libc::SIGTERM);
    assert!(
        wait_until(secs(5), || !alive(pid) && !alive(gc)),
        "job {pid} or grandchild {gc} outlived a stop while its watchdog was frozen\n{}",
        w.log_text()
    );
    let dead = asked.elapsed();
    w.wait(secs(10));
    let exited = asked.elapsed();
    eprintln!("watchdog frozen, SIGTERM to lead-exec: group dead after {dead:?}, lead-exec exited after {exited:?}");
    // The grace is 500 ms.
    assert!(dead < Duration::from_millis(1500), "{dead:?}");
    assert!(!alive(wd), "the frozen watchdog {wd} was left behind");
}

/// The watchdog is the subreaper of the job's orphans: one that exits is reaped at once, not
/// left a zombie until the job's main process exits.
#[test]
fn orphaned_grandchildren_are_reaped_while_the_job_runs() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "sh -c 'sh -c \"echo \\$\\$ > $D/orphan; sleep 0.3\" & exit 0'; \
         echo $$ > $D/pid; exec sleep 120",
    );
    let mut w = spawn(f.dir.path(), "w", &run_args("orphan", &f.ep, &[], &job));
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let orphan = wait_int(&f.dir.path().join("orphan"), secs(10)) as i32;
    assert!(
        wait_until(secs(5), || !exists(orphan)),
        "orphan {orphan} left unreaped while the job runs"
    );
    assert!(alive(pid));
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// The job's main process exited but a member lingers (ignoring SIGTERM) for the grace: the
/// watchdog waits without spinning on the exited process's pidfd.
#[test]
fn a_lingering_group_does_not_make_the_watchdog_spin() {
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "sh -c 'trap \"\" TERM; echo $$ > $D/lingering; while :; do sleep 0.1; done' & \
         echo $PPID > $D/watchdog; echo $$ > $D/pid; sleep 0.3",
    );
    let args = run_args_with(&WIDE_GRACE, "linger", &f.ep, &[], &job);
    let mut w = spawn(f.dir.path(), "w", &args);
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let wd = wait_int(&f.dir.path().join("watchdog"), secs(10)) as i32;
    let lingering = wait_int(&f.dir.path().join("lingering"), secs(10)) as i32;
    assert!(
        wait_until(secs(5), || !alive(pid)),
        "main process did not exit"
    );
    let start = cpu_ticks(wd).expect("watchdog running");
    let mut used = 0;
    assert!(
        wait_until(secs(10), || {
            if let Some(t) = cpu_ticks(wd) {
                used = t - start;
            }
            !alive(lingering)
        }),
        "the lingering member outlived the grace"
    );
    eprintln!(
        "watchdog CPU while a member lingered for the 2 s grace: {} ms",
        used * 10
    );
    assert!(used <= 30, "watchdog used {} ms of CPU in 2 s", used * 10);
    assert_eq!(w.code(secs(10)), 0, "{}", w.log_text());
}

/// The watchdog checks the deadline right before it forks: handed a spent one, it starts
/// nothing and says so.
#[test]
fn the_watchdog_never_starts_a_job_after_the_deadline() {
    use std::io::BufRead;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let pipe = || {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors that we then own.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    };
    let (ctl_r, ctl_w) = pipe();
    let (rep_r, rep_w) = pipe();
    let (c, r) = (ctl_r.as_raw_fd(), rep_w.as_raw_fd());
    let ran = dir.path().join("ran");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_lead-exec-watchdog"));
    cmd.args([
        "__watchdog",
        &std::process::id().to_string(),
        &c.to_string(),
        &r.to_string(),
    ])
    // Grace 0.5 s, no cgroup.
    .args(["500000000", "off"]);
    // SAFETY: fcntl is async-signal-safe; it lets the watchdog inherit its two pipe ends.
    unsafe {
        cmd.pre_exec(move || {
            for fd in [c, r] {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(rep_w);
    drop(ctl_r);
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    // The start comes over the control pipe: the deadline, SIGTERM and SIGKILL due 1 ns and
    // 2 ns after boot (long past), then "A" and each argument in hex.
    let line = format!(
        "D 1 2\nA {} {} {}\n",
        hex("sh"),
        hex("-c"),
        hex(&format!("touch {}", ran.display()))
    );
    std::io::Write::write_all(&mut std::fs::File::from(ctl_w), line.as_bytes()).unwrap();
    let mut first = String::new();
    std::io::BufReader::new(std::fs::File::from(rep_r))
        .read_line(&mut first)
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(first.trim_end(), "L", "the watchdog did not refuse");
    assert!(!ran.exists(), "the job ran");
}

/// A job cgroup whose watchdog is gone (lead-exec and its watchdog both SIGKILLed) is killed,
/// not just removed once empty, by the next job start on the host.
#[test]
fn a_stale_job_cgroup_is_killed_by_the_next_start() {
    // In a cgroup of the test's own: a job start of another test, running beside it, would
    // sweep the stale cgroup too, before the start this test makes.
    let Some(cg) = TestCgroup::new("stale") else {
        eprintln!("no writable cgroup v2 here; nothing to check");
        return;
    };
    let f = Fixture::new();
    let job = script(
        f.dir.path(),
        "cat /proc/self/cgroup > $D/cgroup; echo $PPID > $D/watchdog; \
         sh -c 'echo $$ > $D/grandchild; exec sleep 120' & echo $$ > $D/pid; wait",
    );
    let mut a = cg.spawn(
        f.dir.path(),
        "a",
        &[bin()],
        &run_args("stale", &f.ep, &[], &job),
    );
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let gc = wait_int(&f.dir.path().join("grandchild"), secs(10)) as i32;
    let wd = wait_int(&f.dir.path().join("watchdog"), secs(10)) as i32;
    a.wait_job_started();
    if !lines(&f.dir.path().join("cgroup"))
        .join("")
        .contains("lead-exec-job-")
    {
        eprintln!("no cgroup v2 for jobs here; nothing to check");
        return;
    }
    // Two separate kills, so that nothing is left to clean up after them.
    a.signal(libc::SIGSTOP);
    signal(wd, libc::SIGKILL);
    a.signal(libc::SIGKILL);
    a.wait(secs(5));
    assert!(wait_until(secs(5), || !alive(pid)), "PR_SET_PDEATHSIG");
    assert!(alive(gc), "the grandchild should have outlived both");
    let mut b = cg.spawn(
        f.dir.path(),
        "b",
        &[bin()],
        &run_args("stale2", &f.ep, &[], "true"),
    );
    assert_eq!(b.code(secs(20)), 0, "{}", b.log_text());
    assert!(
        wait_until(secs(5), || !alive(gc)),
        "grandchild {gc} survived in its stale cgroup"
    );
}

/// The job cgroup of watchdog `wd` in `parent`: `lead-exec-job-<wd>-<random>`.
fn job_cgroup_of(parent: &std::path::Path, wd: i32) -> Option<std::path::PathBuf> {
    let prefix = format!("lead-exec-job-{wd}-");
    std::fs::read_dir(parent)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
}

/// A waiting candidate's watchdog makes the job's cgroup ahead; the cgroup goes with the
/// candidate, whether lead-exec exits on SIGTERM or is SIGKILLed.
/// A leader of `election` whose job runs in a cgroup of its own, and the cgroup its job
/// cgroups are made in; `None` (said) where jobs get no cgroup v2.
///
/// The leader runs in `cg`, as must every worker of the test: a job start of another test
/// sweeps the stale job cgroups beside its own, and would remove one this test looks at.
fn a_leader_in_a_job_cgroup(
    f: &Fixture,
    cg: &TestCgroup,
    election: &str,
) -> Option<(std::path::PathBuf, Worker)> {
    let job = script(
        f.dir.path(),
        "cat /proc/self/cgroup > $D/cgroup; exec sleep 120",
    );
    let a = cg.spawn(
        f.dir.path(),
        "a",
        &[bin()],
        &run_args(election, &f.ep, &[], &job),
    );
    let own = wait_line(&f.dir.path().join("cgroup"), secs(10), |l| {
        l.starts_with("0::")
    });
    let Some(rel) = own
        .strip_prefix("0::")
        .filter(|p| p.contains("lead-exec-job-"))
    else {
        eprintln!("no cgroup v2 for jobs here; nothing to check");
        return None;
    };
    let job_dir = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|m| std::path::PathBuf::from(format!("{m}{rel}")))
        .find(|p| p.is_dir())
        .expect("the job's cgroup directory");
    Some((job_dir.parent().unwrap().to_path_buf(), a))
}

/// A waiting candidate's watchdog, once it has made its job cgroup ahead in `parent`: its
/// pid and the cgroup.
fn standby_cgroup(w: &Worker, parent: &std::path::Path) -> (i32, std::path::PathBuf) {
    // lead-exec's one child is its watchdog.
    let children = format!("/proc/{0}/task/{0}/children", w.pid());
    let mut wd = 0;
    assert!(
        wait_until(secs(10), || {
            wd = std::fs::read_to_string(&children)
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            wd > 0 && job_cgroup_of(parent, wd).is_some()
        }),
        "no cgroup made ahead by the watchdog of {}",
        w.pid()
    );
    (wd, job_cgroup_of(parent, wd).unwrap())
}

/// A waiting candidate whose watchdog (started ahead, no job yet) is SIGKILLed cannot
/// remove the empty cgroup it made: lead-exec, which it told the path, removes it when it
/// gives that watchdog up, whether it exits then or its term comes and a new watchdog runs
/// the job.
#[test]
fn a_killed_standby_watchdogs_empty_cgroup_is_removed_by_lead_exec() {
    let Some(tc) = TestCgroup::new("sbcg") else {
        eprintln!("no writable cgroup v2 here; nothing to check");
        return;
    };
    let f = Fixture::new();
    let Some((parent, mut a)) = a_leader_in_a_job_cgroup(&f, &tc, "sbcg") else {
        return;
    };
    // lead-exec exits (SIGTERM while in line) without ever running a job.
    let args = run_args("sbcg", &f.ep, &[], "true");
    let mut b = tc.spawn(f.dir.path(), "b", &[bin()], &args);
    let (wd, cg) = standby_cgroup(&b, &parent);
    signal(wd, libc::SIGKILL);
    assert!(wait_until(secs(5), || !alive(wd)));
    assert!(cg.exists(), "the killed watchdog removed its cgroup itself");
    b.signal(libc::SIGTERM);
    b.wait(secs(5));
    assert!(
        wait_until(secs(2), || !cg.exists()),
        "{} outlived its candidate",
        cg.display()
    );
    // The term comes: the dead watchdog is given up for a new one, and its cgroup with it.
    let job = script(f.dir.path(), "echo $FENCING_TOKEN > $D/c; exec sleep 120");
    let args = run_args("sbcg", &f.ep, &[], &job);
    let mut c = tc.spawn(f.dir.path(), "c", &[bin()], &args);
    let (wd, cg) = standby_cgroup(&c, &parent);
    signal(wd, libc::SIGKILL);
    assert!(wait_until(secs(5), || !alive(wd)));
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
    wait_int(&f.dir.path().join("c"), secs(15));
    assert!(
        wait_until(secs(2), || !cg.exists()),
        "{} was left when the term came",
        cg.display()
    );
    c.signal(libc::SIGTERM);
    c.wait(secs(10));
}

#[test]
fn a_waiting_candidates_cgroup_goes_with_it() {
    let Some(tc) = TestCgroup::new("ahead") else {
        eprintln!("no writable cgroup v2 here; nothing to check");
        return;
    };
    let f = Fixture::new();
    let Some((parent, _a)) = a_leader_in_a_job_cgroup(&f, &tc, "ahead") else {
        return;
    };
    for (name, sig) in [("b", libc::SIGTERM), ("c", libc::SIGKILL)] {
        let args = run_args("ahead", &f.ep, &[], "true");
        let mut w = tc.spawn(f.dir.path(), name, &[bin()], &args);
        let (wd, cg) = standby_cgroup(&w, &parent);
        w.signal(sig);
        w.wait(secs(5));
        assert!(
            wait_until(secs(5), || !cg.exists() && !alive(wd)),
            "{name}: {} outlived the candidate (signal {sig})",
            cg.display()
        );
    }
}

/// SIGSTOP to the watchdog, then a flood of signals for it to pass on (far more than its
/// 64 KiB pipe holds): lead-exec never blocks on the pipe, so it keeps renewing, and when etcd
/// goes out of reach it still kills the job itself by D.
#[test]
fn a_frozen_watchdog_with_a_full_pipe_does_not_block_lead_exec() {
    let f = Fixture::new();
    let proxy = Proxy::start(f.ep.clone());
    let (mut w, pid, gc, wd, key) =
        start_heartbeat(f.dir.path(), &f.etcd, "wdflood", &proxy.endpoint());
    let _cleanup = StoppedWatchdog(wd);
    signal(wd, libc::SIGSTOP);
    // 20,000 forwards of 5 bytes: 100 KB, past the pipe's 64 KiB.
    let flood = Instant::now();
    for _ in 0..20_000 {
        signal(w.pid(), libc::SIGUSR1);
        std::thread::sleep(Duration::from_micros(200));
    }
    eprintln!("flood of 20000 SIGUSR1 took {:?}", flood.elapsed());
    let gone = KeyGone::watch(&f.ep, &key);
    let cut = now_ns();
    proxy.set(Mode::Blackhole);
    let expired = gone.wait(secs(30));
    let last = last_heartbeat(f.dir.path());
    let dead = !alive(pid) && !alive(gc);
    signal(wd, libc::SIGCONT);
    eprintln!(
        "watchdog frozen with a full pipe, etcd cut: job's last heartbeat {} ms after the cut, {} ms before etcd deleted the key",
        (last - cut) / 1_000_000,
        (expired - last) / 1_000_000
    );
    assert!(
        dead,
        "job {pid} or grandchild {gc} alive when the key expired: lead-exec blocked on the pipe\n{}",
        w.log_text()
    );
    assert!(last <= expired);
    proxy.set(Mode::Pass);
    w.signal(libc::SIGTERM);
    w.wait(secs(15));
}

/// The same frozen watchdog, its pipe full, then SIGKILLed: what waited for it is dropped on
/// the closed pipe, lead-exec kills the rest of the job and campaigns again.
#[test]
fn a_watchdog_killed_with_a_full_pipe_is_seen_as_dead() {
    let f = Fixture::new();
    let (mut w, pid, gc, wd, _) = start_heartbeat(f.dir.path(), &f.etcd, "wdfullkill", &f.ep);
    let _cleanup = StoppedWatchdog(wd);
    signal(wd, libc::SIGSTOP);
    for _ in 0..15_000 {
        signal(w.pid(), libc::SIGUSR1);
        std::thread::sleep(Duration::from_micros(200));
    }
    signal(wd, libc::SIGKILL);
    assert!(
        wait_until(secs(3), || !alive(pid) && !alive(gc)),
        "job {pid} or grandchild {gc} survived\n{}",
        w.log_text()
    );
    w.wait_log("the watchdog died", secs(5));
    assert!(
        wait_until(secs(15), || terms(f.dir.path()).len() >= 2),
        "{}",
        w.log_text()
    );
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// A cgroup v2 directory of the test's own, removed with everything in it: the workers of a
/// test that sweeps job cgroups run in it, so that their sweeps see no other test's jobs.
struct TestCgroup(std::path::PathBuf);

impl TestCgroup {
    fn new(name: &str) -> Option<TestCgroup> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mount = info.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(std::path::PathBuf::from))?
        })?;
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let own = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        let dir = mount
            .join(own.trim_start_matches('/'))
            .join(format!("test-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let cg = TestCgroup(dir);
        // A cgroup no process can join (controllers enabled above, delegation) is no use.
        let joined = std::process::Command::new("sh")
            .args(["-c", "echo $$ > \"$0\""])
            .arg(cg.0.join("cgroup.procs"))
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        joined.then_some(cg)
    }

    /// `sh -c 'join the cgroup; exec PROGRAM ARGS'` as a worker.
    fn spawn(&self, dir: &std::path::Path, name: &str, program: &[&str], args: &[&str]) -> Worker {
        let procs = self.0.join("cgroup.procs");
        let mut all = vec![
            "-c",
            "echo $$ > \"$0\" && exec \"$@\"",
            procs.to_str().unwrap(),
        ];
        all.extend_from_slice(program);
        all.extend_from_slice(args);
        spawn_program(std::path::Path::new("/bin/sh"), dir, name, &all, &[])
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        for _ in 0..200 {
            for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    let _ = std::fs::write(e.path().join("cgroup.kill"), "1");
                    let _ = std::fs::remove_dir(e.path());
                }
            }
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `unshare` into a new PID namespace, the forked lead-exec killed when unshare dies.
const NEW_PID_NS: [&str; 4] = ["unshare", "--kill-child", "-pf", "--mount-proc"];

/// Checks that this host lets us make PID namespaces (util-linux's `unshare`, as root).
fn need_pid_namespaces() {
    let ok = std::process::Command::new(NEW_PID_NS[0])
        .args(&NEW_PID_NS[1..])
        .arg("true")
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    // Never a silent skip: the tests run as root, where this works on any recent kernel.
    assert!(
        ok,
        "cannot make a PID namespace (`unshare -pf --mount-proc`, package util-linux, as root)"
    );
}

/// Whether a job's heartbeats (see [`heartbeat_job`]) go on: one newer than `after` comes.
fn beats_after(dir: &std::path::Path, after: i128) -> bool {
    wait_until(secs(3), || {
        lines(&dir.join("hb"))
            .iter()
            .filter_map(|l| l.trim().parse::<i128>().ok())
            .any(|t| t > after)
    })
}

/// A job started in another PID namespace sweeps stale job cgroups too: it must not take a
/// live job of the host, whose watchdog's pid means nothing in its namespace, for a stale one.
#[test]
fn a_job_start_in_another_pid_namespace_leaves_a_host_job_alone() {
    need_pid_namespaces();
    let Some(cg) = TestCgroup::new("nshost") else {
        eprintln!("no writable cgroup v2 here; nothing to check");
        return;
    };
    let f = Fixture::new();
    let job = format!(
        "cat /proc/self/cgroup > $D/cgroup; {}",
        heartbeat_job(f.dir.path())
    );
    let job = script(f.dir.path(), &job);
    let mut host = cg.spawn(
        f.dir.path(),
        "host",
        &[bin()],
        &run_args("nshost", &f.ep, &[], &job),
    );
    let pid = wait_int(&f.dir.path().join("pid"), secs(10)) as i32;
    let gc = wait_int(&f.dir.path().join("grandchild"), secs(10)) as i32;
    if !lines(&f.dir.path().join("cgroup"))
        .join("")
        .contains("lead-exec-job-")
    {
        eprintln!("no cgroup v2 for jobs here; nothing to check");
        return;
    }
    let mut other = NEW_PID_NS.to_vec();
    other.push(bin());
    let mut ns = cg.spawn(
        f.dir.path(),
        "ns",
        &other,
        &run_args("nsother", &f.ep, &[], "true"),
    );
    assert_eq!(ns.code(secs(20)), 0, "{}", ns.log_text());
    let done = now_ns();
    assert!(
        alive(pid) && alive(gc) && beats_after(f.dir.path(), done),
        "the host job was killed by a start in another PID namespace:\n{}",
        host.log_text()
    );
    assert!(
        !host.log_text().contains("watchdog died"),
        "{}",
        host.log_text()
    );
    host.signal(libc::SIGTERM);
    host.wait(secs(10));
}

/// The reverse: a job in a PID namespace has a watchdog with a small pid (2, 3...), which on
/// the host is some other process; a job start on the host must leave it alone.
#[test]
fn a_job_start_on_the_host_leaves_a_job_in_a_pid_namespace_alone() {
    need_pid_namespaces();
    let Some(cg) = TestCgroup::new("nsjob") else {
        eprintln!("no writable cgroup v2 here; nothing to check");
        return;
    };
    let f = Fixture::new();
    let job = format!(
        "cat /proc/self/cgroup > $D/cgroup; {}",
        heartbeat_job(f.dir.path())
    );
    let job = script(f.dir.path(), &job);
    let mut program = NEW_PID_NS.to_vec();
    program.push(bin());
    let ns = cg.spawn(
        f.dir.path(),
        "ns",
        &program,
        &run_args("nsjob", &f.ep, &[], &job),
    );
    let nspid = wait_int(&f.dir.path().join("pid"), secs(10));
    let wd = wait_int(&f.dir.path().join("watchdog"), secs(10));
    eprintln!("in its namespace: job {nspid}, watchdog {wd}");
    if !lines(&f.dir.path().join("cgroup"))
        .join("")
        .contains("lead-exec-job-")
    {
        eprintln!("no cgroup v2 for jobs here; nothing to check");
        return;
    }
    let mut host = cg.spawn(
        f.dir.path(),
        "host",
        &[bin()],
        &run_args("nshost2", &f.ep, &[], "true"),
    );
    assert_eq!(host.code(secs(20)), 0, "{}", host.log_text());
    let done = now_ns();
    assert!(
        beats_after(f.dir.path(), done),
        "the job in the PID namespace was killed by a start on the host:\n{}",
        ns.log_text()
    );
    assert!(
        !ns.log_text().contains("watchdog died"),
        "{}",
        ns.log_text()
    );
}

/// A leftover directory with the name a watchdog would pick (here: every small pid, in a
/// fresh PID namespace where the watchdog gets one) neither leaves the job without a cgroup
/// nor stops lead-exec from killing the job's group when the watchdog is SIGKILLed.
#[test]
fn a_leftover_cgroup_by_the_same_name_neither_uncontains_nor_spares_the_job() {
    need_pid_namespaces();
    let Some(cg) = TestCgroup::new("leftover") else {
        eprintln!("no writable cgroup v2 here; nothing to check");
        return;
    };
    for pid in 1..=300 {
        std::fs::create_dir(cg.0.join(format!("lead-exec-job-{pid}"))).unwrap();
    }
    let f = Fixture::new();
    // The job (its first term only) kills its own watchdog when told to: its pid is one of
    // the namespace's. Each term's member writes heartbeats to a file of its own.
    let job = script(
        f.dir.path(),
        "cat /proc/self/cgroup > $D/cgroup; echo $FENCING_TOKEN >> $D/terms; \
         sh -c 'while :; do date +%s%N >> $D/hb-$FENCING_TOKEN; sleep 0.05; done' & \
         while ! mv $D/go $D/went 2>/dev/null; do sleep 0.05; done; kill -9 $PPID; wait",
    );
    let mut program = NEW_PID_NS.to_vec();
    program.push(bin());
    let w = cg.spawn(
        f.dir.path(),
        "w",
        &program,
        &run_args("leftover", &f.ep, &[], &job),
    );
    let own = wait_line(&f.dir.path().join("cgroup"), secs(10), |l| {
        l.starts_with("0::")
    });
    assert!(
        own.contains("lead-exec-job-"),
        "the job runs outside a job cgroup: {own}\n{}",
        w.log_text()
    );
    let first = wait_int(&f.dir.path().join("terms"), secs(10));
    w.wait_job_started();
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    w.wait_log("the watchdog died", secs(10));
    let killed = now_ns();
    let hb = f.dir.path().join(format!("hb-{first}"));
    let beats = || -> Option<i128> {
        lines(&hb)
            .iter()
            .filter_map(|l| l.trim().parse().ok())
            .max()
    };
    assert!(
        !wait_until(secs(2), || beats()
            .is_some_and(|t| t > killed + 200_000_000)),
        "a member of the job's group outlived its SIGKILLed watchdog:\n{}",
        w.log_text()
    );
    w.signal(libc::SIGKILL);
}

/// A waiting candidate's watchdog (the one started ahead), once it has made its cgroup.
fn standby_watchdog(w: &Worker) -> i32 {
    let children = format!("/proc/{0}/task/{0}/children", w.pid());
    let mut wd = 0;
    assert!(
        wait_until(secs(10), || {
            wd = std::fs::read_to_string(&children)
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            wd > 0 && comm(wd) != comm(w.pid())
        }),
        "no watchdog started ahead"
    );
    wd
}

/// A waiting candidate whose watchdog, started ahead, is stopped or SIGKILLed when its term
/// comes: the term must neither hang on it nor fail, the job runs under a new watchdog.
fn a_broken_standby_is_replaced(sig: i32, election: &str) {
    let f = Fixture::new();
    let first = script(f.dir.path(), "echo $$ > $D/a; exec sleep 120");
    let mut a = spawn(f.dir.path(), "a", &run_args(election, &f.ep, &[], &first));
    wait_int(&f.dir.path().join("a"), secs(10));
    let second = script(f.dir.path(), "echo $PPID > $D/b; exec sleep 120");
    let extra = ["--command-timeout", "1s"];
    let mut b = spawn(
        f.dir.path(),
        "b",
        &run_args(election, &f.ep, &extra, &second),
    );
    let wd = standby_watchdog(&b);
    let _cleanup = StoppedWatchdog(wd);
    signal(wd, sig);
    let handed = Instant::now();
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
    let runs_under = wait_int(&f.dir.path().join("b"), secs(15)) as i32;
    eprintln!(
        "standby watchdog {wd} got signal {sig}; the job ran {:?} after the handover, under watchdog {runs_under}",
        handed.elapsed()
    );
    assert_ne!(runs_under, wd);
    assert!(
        wait_until(secs(2), || !alive(wd)),
        "the broken watchdog {wd} was left"
    );
    b.signal(libc::SIGTERM);
    assert_eq!(b.code(secs(10)), 143, "{}", b.log_text());
}

/// A stopped one does not answer: the term is given up after `--command-timeout`, and the
/// next term (on a fresh watchdog) runs the job.
#[test]
fn a_stopped_standby_watchdog_is_given_up_not_waited_for() {
    a_broken_standby_is_replaced(libc::SIGSTOP, "sbstop");
}

#[test]
fn a_killed_standby_watchdog_is_replaced_when_the_term_comes() {
    a_broken_standby_is_replaced(libc::SIGKILL, "sbkill");
}

/// As a user who may not make cgroups, `--cgroup auto` runs the job in its process group
/// only: lead-exec says so once in its log, and `status` shows it.
#[test]
fn a_job_without_a_cgroup_is_warned_of_and_shown_in_status() {
    // A root whose top directory only root may enter (a chroot made with mktemp -d) runs
    // nothing as another user; a real machine does.
    let unprivileged = std::process::Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "true",
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !unprivileged {
        eprintln!("this root runs nothing as nobody (mode of /?); nothing to check");
        return;
    }
    let f = Fixture::new();
    // Without cargo's LD_LIBRARY_PATH, which may point into a directory only root can read
    // (a toolchain under /root): the system's libraries are what an unprivileged user gets.
    let mut args = vec![
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "env",
        "-u",
        "LD_LIBRARY_PATH",
        bin(),
    ];
    args.extend(run_args(
        "nocg",
        &f.ep,
        &["--cgroup", "auto"],
        "exec sleep 60",
    ));
    let mut w = spawn_program(
        std::path::Path::new("setpriv"),
        f.dir.path(),
        "w",
        &args,
        &[],
    );
    w.wait_job_started();
    let log = w.log_text();
    assert_eq!(
        log.matches("the job runs without a cgroup of its own")
            .count(),
        1,
        "{log}"
    );
    // The start record, which `status` reads, is written beside the job.
    let mut out = String::new();
    assert!(
        wait_until(secs(5), || {
            out = run(&["status", "nocg", "--endpoints", &f.ep]).1;
            out.contains("job:       no cgroup (process group and tree)")
        }),
        "{out}"
    );
    let (code, json, err) = run(&["status", "nocg", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        v["leader"]["job_cgroup"],
        serde_json::json!(false),
        "{json}"
    );
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// The watchdog ships statically linked (`.ci/package`, `harness::STATIC_WATCHDOG`), where the
/// C library's name lookups (users, groups, hosts and the other NSS databases), `dlopen` and
/// locales need the shared libraries of the very glibc it was linked with. So its code calls
/// none of them, as the dynamic build's imports show. (The static build also holds glibc's
/// locale and `dlopen` code, which `strerror_r` and `assert` pull in; it is reached only in a
/// locale that `setlocale` chose, and the watchdog never calls it: it stays in the C locale.)
#[test]
fn the_watchdog_calls_nothing_a_static_c_library_cannot_do() {
    let bin = env!("CARGO_BIN_EXE_lead-exec-watchdog");
    let readelf = need_tool("readelf", "binutils");
    let out = std::process::Command::new(readelf)
        .args(["--dyn-syms", "--wide", bin])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let imported: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().nth(7))
        .map(|s| s.split('@').next().unwrap_or(s))
        .collect();
    assert!(
        imported.contains(&"waitid"),
        "{bin} imports nothing: linked statically, by a tool (the soaks, the bench) that built \
         the same target directory after this test was built; `cargo test` links it again"
    );
    let bad: Vec<&&str> = imported
        .iter()
        .filter(|s| needs_the_shared_c_library(s))
        .collect();
    assert!(
        bad.is_empty(),
        "the watchdog calls {bad:?}, which a statically linked C library can only do with \
         the shared libraries of the glibc it was linked with"
    );
}

/// Whether glibc, linked statically, needs its own shared libraries at run time for this
/// function: the NSS databases' lookups and enumerations (`getpwnam`, `setgrent`,
/// `endhostent`, ...), those built on them, `dlopen`, iconv and locales.
fn needs_the_shared_c_library(f: &str) -> bool {
    const ANY: [&str; 15] = [
        "getaddrinfo",
        "getnameinfo",
        "initgroups",
        "getgrouplist",
        "innetgr",
        "getlogin",
        "getlogin_r",
        "wordexp",
        "getpublickey",
        "getsecretkey",
        "dlopen",
        "dlmopen",
        "iconv_open",
        "setlocale",
        "newlocale",
    ];
    // Same prefixes, no NSS: system calls and uname.
    const NOT_NSS: [&str; 4] = ["getgroups", "setgroups", "gethostname", "sethostname"];
    const DATABASES: [&str; 10] = [
        "pw", "gr", "sp", "sg", "host", "serv", "proto", "net", "rpc", "alias",
    ];
    if ANY.contains(&f) || f.starts_with("ether_") {
        return true;
    }
    !NOT_NSS.contains(&f)
        && ["get", "set", "end"].iter().any(|p| {
            f.strip_prefix(p)
                .is_some_and(|rest| DATABASES.iter().any(|d| rest.starts_with(d)))
        })
}

#[test]
fn needing_the_shared_c_library_is_told_by_the_name_of_the_call() {
    for f in [
        "getpwnam_r",
        "getpwuid",
        "setgrent",
        "endpwent",
        "getspnam",
        "gethostbyname2_r",
        "sethostent",
        "getservbyport",
        "getprotoent",
        "getnetgrent",
        "setnetgrent",
        "setrpcent",
        "getaliasbyname",
        "getaddrinfo",
        "initgroups",
        "getlogin_r",
        "ether_ntohost",
        "dlopen",
        "setlocale",
    ] {
        assert!(needs_the_shared_c_library(f), "{f}");
    }
    for f in [
        "getpid",
        "getppid",
        "getpgid",
        "setpgid",
        "setsid",
        "setgid",
        "setuid",
        "getgroups",
        "setgroups",
        "gethostname",
        "getrandom",
        "getrlimit",
        "setns",
        "getsockopt",
        "setsockopt",
        "getpriority",
        "getauxval",
        "getenv",
        "setenv",
        "getcwd",
        "waitid",
    ] {
        assert!(!needs_the_shared_c_library(f), "{f}");
    }
}
