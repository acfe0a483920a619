//! Bad input, exit codes and the job's environment.

use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn job_exit_code_passes_through() {
    let etcd = Etcd::start();
    let (code, _, _) = run(&run_args("codes", &etcd.endpoints(), &[], "exit 7"));
    assert_eq!(code, 7);
    let (code, _, _) = run(&run_args("codes", &etcd.endpoints(), &[], "exit 0"));
    assert_eq!(code, 0);
}

#[test]
fn job_killed_by_signal_gives_128_plus_n() {
    let etcd = Etcd::start();
    let (code, _, _) = run(&run_args("sig", &etcd.endpoints(), &[], "kill -9 $$"));
    assert_eq!(code, 137);
    let (code, _, _) = run(&run_args("sig", &etcd.endpoints(), &[], "kill -15 $$"));
    assert_eq!(code, 143);
}

#[test]
fn job_gets_token_and_identity_in_its_environment() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let s = script(dir.path(), "env > $D/env");
    let ep = etcd.endpoints();
    let (code, _, err) = run(&run_args("envtest", &ep, &["--id", "worker-a"], &s));
    assert_eq!(code, 0, "{err}");
    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    let get = |k: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_string))
            .unwrap_or_else(|| panic!("{k} missing from job env:\n{env}"))
    };
    let token: i64 = get("FENCING_TOKEN").parse().unwrap();
    assert!(token > 0);
    assert_eq!(get("LEAD_EXEC_ELECTION"), "envtest");
    assert_eq!(get("LEAD_EXEC_ID"), "worker-a");
    assert_eq!(get("LEAD_EXEC_ENDPOINTS"), ep);
    let lease = get("LEAD_EXEC_LEASE_ID");
    assert_eq!(
        get("LEAD_EXEC_LEADER_KEY"),
        format!("lead-exec/elections/envtest/{lease}")
    );
}

#[test]
fn password_is_not_passed_to_the_job() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let s = script(dir.path(), "env > $D/env");
    let (code, _, err) = run_env(
        &run_args("pw", &etcd.endpoints(), &[], &s),
        &[("LEAD_EXEC_PASSWORD", "hunter2")],
    );
    assert_eq!(code, 0, "{err}");
    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    assert!(!env.contains("hunter2"));
}

#[test]
fn missing_command_is_127_and_not_executable_is_126() {
    let etcd = Etcd::start();
    let ep = etcd.endpoints();
    let (code, _, err) = run(&["run", "x", "--endpoints", &ep, "--", "no-such-command-xyz"]);
    assert_eq!(code, 127);
    assert_eq!(
        err.trim(),
        "lead-exec: no-such-command-xyz: command not found"
    );

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("plain.txt");
    std::fs::write(&f, "not a program").unwrap();
    let (code, _, err) = run(&["run", "x", "--endpoints", &ep, "--", f.to_str().unwrap()]);
    assert_eq!(code, 126);
    assert!(err.contains("cannot execute"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn no_wait_gives_conflict_code_while_another_leads() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let ep = etcd.endpoints();
    let s = script(dir.path(), "echo up > $D/up; sleep 30");
    let mut leader = spawn(dir.path(), "leader", &run_args("cron", &ep, &[], &s));
    wait_line(&dir.path().join("up"), secs(10), |l| l == "up");

    let start = Instant::now();
    let (code, _, _) = run(&run_args("cron", &ep, &["--no-wait"], "echo ran; exit 0"));
    assert_eq!(code, 75);
    assert!(start.elapsed() < secs(5));

    let (code, _, _) = run(&run_args(
        "cron",
        &ep,
        &["--no-wait", "--conflict-exit-code", "3"],
        "exit 0",
    ));
    assert_eq!(code, 3);

    let start = Instant::now();
    let (code, _, _) = run(&run_args("cron", &ep, &["--wait", "1s"], "exit 0"));
    assert_eq!(code, 75);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < secs(8),
        "{took:?}"
    );

    // Those candidates removed their keys: only the leader's remains.
    assert_eq!(etcd.keys("lead-exec/elections/cron/").len(), 1);
    leader.signal(libc::SIGTERM);
    leader.wait(secs(10));
}

#[test]
fn malformed_flags_are_usage_errors_in_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "x", "--ttl", "5x", "--", "true"],
            "invalid value '5x' for '--ttl",
        ),
        (
            &["run", "x", "--ttl", "1s", "--", "true"],
            "below etcd's minimum lease of 2s",
        ),
        (
            &["run", "x", "--ttl", "3s", "--", "true"],
            "unsafe lease settings: --ttl 3s minus --grace 3s, --safety-margin 1s",
        ),
        (&["run", "a/b", "--", "true"], "invalid election name 'a/b'"),
        (&["run", "", "--", "true"], "invalid election name ''"),
        (&["run", "x"], "required arguments were not provided"),
        (
            &["run", "x", "--bogus", "--", "true"],
            "unexpected argument '--bogus'",
        ),
        (
            &["status", "x", "--endpoints", "nohostport"],
            "not HOST:PORT",
        ),
        (
            &["run", "x", "--run-key", "a/b", "--", "true"],
            "invalid --run-key",
        ),
        (
            &["run", "x", "--user", "root", "--", "true"],
            "needs a password in LEAD_EXEC_PASSWORD",
        ),
    ];
    for (args, want) in cases {
        let (code, out, err) = run(args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line:\n{err}");
        assert!(err.starts_with("lead-exec: "), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?}, got {err}");
    }
}

#[test]
fn unreachable_etcd_is_69_within_the_dial_timeout() {
    let port = free_port();
    let ep = format!("127.0.0.1:{port}");
    let start = Instant::now();
    let (code, _, err) = run(&[
        "run",
        "x",
        "--endpoints",
        &ep,
        "--dial-timeout",
        "1s",
        "--",
        "true",
    ]);
    assert_eq!(code, 69, "{err}");
    assert!(start.elapsed() < secs(5), "{:?}", start.elapsed());
    assert!(err.contains(&format!("etcd at {ep} unavailable")), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn help_and_version_exit_zero() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("run"));
    let (code, out, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("lead-exec "));
}

#[test]
fn flags_also_come_from_the_environment() {
    let etcd = Etcd::start();
    let (code, _, err) = run_env(
        &["run", "fromenv", "--", "sh", "-c", "exit 5"],
        &[
            ("LEAD_EXEC_ENDPOINTS", &etcd.endpoints()),
            ("LEAD_EXEC_TTL", "3s"),
            ("LEAD_EXEC_GRACE", "500ms"),
            ("LEAD_EXEC_SAFETY_MARGIN", "500ms"),
        ],
    );
    assert_eq!(code, 5, "{err}");
    // etcdctl's variable is the fallback.
    let (code, _, err) = run_env(
        &["run", "fromenv", "--", "sh", "-c", "exit 6"],
        &[("ETCDCTL_ENDPOINTS", &etcd.endpoints())],
    );
    assert_eq!(code, 6, "{err}");
}
