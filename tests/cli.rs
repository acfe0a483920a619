//! Bad input, exit codes and the job's environment.

use std::time::{Duration, Instant};

use harness::*;

/// Starts a leader of `election` whose job runs for 30 s, and waits until the job runs.
fn sleeping_leader(dir: &std::path::Path, election: &str, ep: &str, extra: &[&str]) -> Worker {
    let s = script(dir, "echo up > $D/up; sleep 30");
    let w = spawn(dir, "leader", &run_args(election, ep, extra, &s));
    wait_line(&dir.join("up"), secs(10), |l| l == "up");
    w
}

#[test]
fn job_exit_code_passes_through() {
    let f = Fixture::new();
    let (code, _, _) = run(&run_args("codes", &f.ep, &[], "exit 7"));
    assert_eq!(code, 7);
    let (code, _, _) = run(&run_args("codes", &f.ep, &[], "exit 0"));
    assert_eq!(code, 0);
}

#[test]
fn job_killed_by_signal_gives_128_plus_n() {
    let f = Fixture::new();
    let (code, _, _) = run(&run_args("sig", &f.ep, &[], "kill -9 $$"));
    assert_eq!(code, 137);
    let (code, _, _) = run(&run_args("sig", &f.ep, &[], "kill -15 $$"));
    assert_eq!(code, 143);
}

#[test]
fn job_gets_token_and_identity_in_its_environment() {
    let f = Fixture::new();
    let s = script(f.dir.path(), "env > $D/env");
    let (code, _, err) = run(&run_args("envtest", &f.ep, &["--id", "worker-a"], &s));
    assert_eq!(code, 0, "{err}");
    let env = std::fs::read_to_string(f.dir.path().join("env")).unwrap();
    let get = |k: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_string))
            .unwrap_or_else(|| panic!("{k} missing from job env:\n{env}"))
    };
    let token: i64 = get("FENCING_TOKEN").parse().unwrap();
    assert!(token > 0);
    assert_eq!(get("LEAD_EXEC_ELECTION"), "envtest");
    assert_eq!(get("LEAD_EXEC_ID"), "worker-a");
    assert_eq!(get("LEAD_EXEC_ENDPOINTS"), f.ep);
    let lease = get("LEAD_EXEC_LEASE_ID");
    assert_eq!(
        get("LEAD_EXEC_LEADER_KEY"),
        format!("lead-exec/elections/envtest/{lease}")
    );
}

/// Nor to its watchdog: not in its variables, which the job inherits, nor in what
/// /proc/PID/environ shows of it, which the job (same user) can read.
#[test]
fn password_is_not_passed_to_the_job() {
    let f = Fixture::new();
    let s = script(
        f.dir.path(),
        "env > $D/env; tr '\\0' '\\n' < /proc/$PPID/environ > $D/wd_env",
    );
    let (code, _, err) = run_env(
        &run_args("pw", &f.ep, &[], &s),
        &[("LEAD_EXEC_PASSWORD", "hunter2")],
    );
    assert_eq!(code, 0, "{err}");
    let env = std::fs::read_to_string(f.dir.path().join("env")).unwrap();
    assert!(env.contains("FENCING_TOKEN="), "{env}");
    assert!(!env.contains("hunter2"));
    let wd_env = std::fs::read_to_string(f.dir.path().join("wd_env")).unwrap();
    assert!(wd_env.contains("PATH="), "{wd_env}");
    assert!(!wd_env.contains("hunter2"), "{wd_env}");
}

#[test]
fn missing_or_empty_command_is_127_and_not_executable_is_126() {
    let f = Fixture::new();
    let (code, _, err) = run(&[
        "run",
        "x",
        "--endpoints",
        &f.ep,
        "--",
        "no-such-command-xyz",
    ]);
    assert_eq!(code, 127);
    // The run's line ends as every line of a run does, with its election and id.
    assert!(
        err.trim()
            .starts_with("lead-exec: no-such-command-xyz: command not found election=\"x\" id=\""),
        "{err}"
    );
    // An empty word is a command not found, as a shell says of `''`; no word at all is usage.
    let (code, _, err) = run(&["run", "x", "--endpoints", &f.ep, "--", ""]);
    assert_eq!(code, 127, "{err}");
    assert!(
        err.trim()
            .starts_with("lead-exec: '': command not found election=\"x\" id=\""),
        "{err}"
    );

    let file = f.dir.path().join("plain.txt");
    std::fs::write(&file, "not a program").unwrap();
    let (code, _, err) = run(&[
        "run",
        "x",
        "--endpoints",
        &f.ep,
        "--",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 126);
    assert!(err.contains("cannot execute"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn no_wait_gives_conflict_code_while_another_leads() {
    let f = Fixture::new();
    let mut leader = sleeping_leader(f.dir.path(), "cron", &f.ep, &[]);

    let start = Instant::now();
    let (code, _, _) = run(&run_args("cron", &f.ep, &["--no-wait"], "echo ran; exit 0"));
    assert_eq!(code, 75);
    assert!(start.elapsed() < secs(5));

    let (code, _, _) = run(&run_args(
        "cron",
        &f.ep,
        &["--no-wait", "--conflict-exit-code", "3"],
        "exit 0",
    ));
    assert_eq!(code, 3);

    let start = Instant::now();
    let (code, _, _) = run(&run_args("cron", &f.ep, &["--wait", "1s"], "exit 0"));
    assert_eq!(code, 75);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < secs(8),
        "{took:?}"
    );

    // Those candidates removed their keys: only the leader's remains.
    assert_eq!(f.etcd.keys("lead-exec/elections/cron/").len(), 1);
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
            "unsafe lease settings: --ttl 3s minus --grace 3s and --safety-margin 1s leaves 0s",
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

/// An endpoint that accepts connections and never answers (a hung member, a firewall that
/// swallows packets after the handshake): `run` gives up after `--dial-timeout`, connecting
/// included (with TLS, a handshake that never ends), not after the first grant's
/// `--command-timeout`, and names the flag to raise.
#[test]
fn a_silent_etcd_is_69_within_the_dial_timeout_naming_the_flag() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = silent.local_addr().unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    harness::tls::ca(tmp.path(), "ca");
    let cacert = tmp.path().join("ca.crt").display().to_string();
    let https = format!("https://{ep}");
    for (endpoint, tls) in [(&ep, None), (&https, Some(&cacert))] {
        let mut args = vec!["run", "x", "--endpoints", endpoint, "--dial-timeout", "1s"];
        args.extend(["--ttl", "30s", "--command-timeout", "20s"]);
        if let Some(ca) = tls {
            args.extend(["--cacert", ca.as_str()]);
        }
        args.extend(["--", "true"]);
        let start = Instant::now();
        let (code, _, err) = run(&args);
        let took = start.elapsed();
        assert_eq!(code, 69, "{err}");
        assert!(
            took < Duration::from_millis(1500),
            "gave up after {took:?}, not within --dial-timeout 1s"
        );
        assert!(
            err.trim_end().starts_with(&format!(
                "lead-exec: etcd at {endpoint} unavailable: no answer within 1s (--dial-timeout) election=\"x\" id=\""
            )),
            "{err}"
        );
    }
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
    let f = Fixture::new();
    let (code, _, err) = run_env(
        &["run", "fromenv", "--", "sh", "-c", "exit 5"],
        &[
            ("LEAD_EXEC_ENDPOINTS", &f.ep),
            ("LEAD_EXEC_TTL", "3s"),
            ("LEAD_EXEC_GRACE", "500ms"),
            ("LEAD_EXEC_SAFETY_MARGIN", "500ms"),
        ],
    );
    assert_eq!(code, 5, "{err}");
    // etcdctl's variable is the fallback.
    let (code, _, err) = run_env(
        &["run", "fromenv", "--", "sh", "-c", "exit 6"],
        &[("ETCDCTL_ENDPOINTS", &f.ep)],
    );
    assert_eq!(code, 6, "{err}");
}

#[test]
fn usage_errors_name_what_is_missing_and_what_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty-password");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["run"], "not provided: <ELECTION>, <COMMAND>..."),
        (&["run", "foo"], "not provided: <COMMAND>..."),
        (&["run", "foo", "--"], "not provided: <COMMAND>..."),
        (&["pause", "x"], "not provided: --reason <TEXT>"),
        (&["check"], "not provided: --election <NAME>, --token <T>"),
        (&["completions"], "not provided: <SHELL>"),
        (
            &["run", "foo", "--endpoints", "127.0.0.1:1", "echo", "hi"],
            "unexpected argument 'echo': the command goes after `--`",
        ),
        (
            &["run", "foo", "--ttl", "-1s", "--", "true"],
            "'-1s' for '--ttl': negative values are not allowed",
        ),
        (
            &["run", "foo", "--history-keep", "-1", "--", "true"],
            "'-1' for '--history-keep': negative values are not allowed",
        ),
        (
            &["history", "x", "-n", "-1"],
            "'-1' for '-n': negative values are not allowed",
        ),
        (
            &["run", "foo", "--ttl=-1s", "--", "true"],
            "'-1s' for '--ttl <DURATION>': negative values are not allowed",
        ),
        (
            &["history", "x", "--count=-1"],
            "'-1' for '--count <N|all>': negative values are not allowed",
        ),
        (
            &["run", "x", "--on-loss", "foo", "--", "true"],
            "[possible values: campaign, exit]",
        ),
        (
            &["run", "x", "--cgroup", "foo", "--", "true"],
            "[possible values: auto, on, off]",
        ),
        (
            &["--log-format", "xml", "status", "x"],
            "[possible values: text, json]",
        ),
        (
            &["status", "x", "-o", "yaml"],
            "[possible values: text, json]",
        ),
        (
            &["run", "x", "--ttl", "300years", "--", "true"],
            "--ttl 300years is above etcd's maximum lease TTL of 9000000000 s",
        ),
        (
            &[
                "run",
                "x",
                "--run-key",
                "k",
                "--run-key-ttl",
                "1000years",
                "--",
                "true",
            ],
            "--run-key-ttl 1000years is above etcd's maximum lease TTL",
        ),
        (
            &[
                "run",
                "x",
                "--run-key",
                "k",
                "--run-key-ttl",
                "0s",
                "--",
                "true",
            ],
            "--run-key-ttl must be greater than zero",
        ),
        (
            &["run", "x", "--command-timeout", "1ns", "--", "true"],
            "--command-timeout 1ns is too short: it must be at least 100ms",
        ),
        (
            &["status", "x", "--dial-timeout", "0s"],
            "--dial-timeout 0s is too short",
        ),
        (
            &["run", "x", "--password-file", empty, "--", "true"],
            "--password-file needs --user",
        ),
        (
            &[
                "run",
                "x",
                "--user",
                "u",
                "--password-file",
                empty,
                "--",
                "true",
            ],
            "the first line is empty",
        ),
        (
            &["pause", "x", "--reason", ""],
            "--reason must not be empty",
        ),
        (
            &["pause", "x", "--reason", "  "],
            "--reason must not be empty",
        ),
        (
            &["run", "x", "--ttl", "2s", "--", "true"],
            "at least 450ms is needed to renew with 3 retries of 100ms",
        ),
        (
            &[
                "run",
                "x",
                "--metrics-addr",
                "nohost.invalid:9464",
                "--",
                "true",
            ],
            "--metrics-addr 'nohost.invalid:9464'",
        ),
        (
            &["run", "x", "--metrics-addr", "9464", "--", "true"],
            "--metrics-addr '9464': no port",
        ),
    ];
    for (args, want) in cases {
        let (code, out, err) = run(args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line:\n{err}");
        assert!(err.starts_with("lead-exec: "), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?}, got {err}");
        assert!(!err.contains("unexpected argument '-"), "{args:?}: {err}");
    }
}

#[test]
fn boolean_variables_accept_1_0_yes_no_true_false() {
    let f = Fixture::new();
    let mut leader = sleeping_leader(f.dir.path(), "bools", &f.ep, &[]);
    for yes in ["1", "yes", "true", "TRUE"] {
        let (code, _, err) = run_env(
            &run_args("bools", &f.ep, &[], "exit 0"),
            &[("LEAD_EXEC_NO_WAIT", yes)],
        );
        assert_eq!(code, 75, "LEAD_EXEC_NO_WAIT={yes}: {err}");
    }
    for no in ["0", "no", "false"] {
        // Not --no-wait: a free election runs the job.
        let (code, _, err) = run_env(
            &run_args("bools-free", &f.ep, &[], "exit 4"),
            &[("LEAD_EXEC_NO_WAIT", no)],
        );
        assert_eq!(code, 4, "LEAD_EXEC_NO_WAIT={no}: {err}");
    }
    for (v, quiet) in [("1", true), ("yes", true), ("0", false), ("no", false)] {
        let (code, _, err) = run_env(
            &run_args("bools-free", &f.ep, &[], "exit 0"),
            &[("LEAD_EXEC_QUIET", v)],
        );
        assert_eq!(code, 0, "{err}");
        assert_eq!(!err.contains("INFO"), quiet, "LEAD_EXEC_QUIET={v}: {err}");
    }
    let (code, _, err) = run_env(
        &run_args("bools-free", &f.ep, &[], "exit 0"),
        &[("LEAD_EXEC_NO_WAIT", "maybe")],
    );
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    leader.signal(libc::SIGTERM);
    leader.wait(secs(10));
}

#[test]
fn fractional_ttl_is_rounded_up_before_the_safety_check() {
    // 2900ms truncated to 2s would stop this job 0.5 s into every term; rounded up to 3s the
    // settings are safe and the job runs to its end.
    let f = Fixture::new();
    let args = [
        "run",
        "frac",
        "--endpoints",
        &f.ep,
        "--ttl",
        "2900ms",
        "--grace",
        "1s",
        "--safety-margin",
        "500ms",
        "--on-loss",
        "exit",
        "--",
        "sh",
        "-c",
        "sleep 2.5; exit 9",
    ];
    let (code, _, err) = run(&args);
    assert_eq!(code, 9, "{err}");
}

#[test]
fn wait_zero_or_1ns_behaves_like_no_wait() {
    let f = Fixture::new();
    for w in ["0s", "1ns"] {
        let (code, _, err) = run(&run_args("w0", &f.ep, &["--wait", w], "exit 5"));
        assert_eq!(code, 5, "--wait {w} on a free election: {err}");
    }
    let mut leader = sleeping_leader(f.dir.path(), "w0", &f.ep, &[]);
    for w in ["0s", "1ns"] {
        let (code, _, err) = run(&run_args("w0", &f.ep, &["--wait", w], "exit 5"));
        assert_eq!(code, 75, "--wait {w} behind a leader: {err}");
    }
    leader.signal(libc::SIGTERM);
    leader.wait(secs(10));
}

/// A lost `--no-wait` race is the expected outcome of a cron tick on every worker but one:
/// silent by default (cron mails what a job prints), exit 75; `-v` names the leader.
#[test]
fn no_wait_loser_is_silent_by_default_and_names_the_leader_with_v() {
    let f = Fixture::new();
    let mut leader = sleeping_leader(f.dir.path(), "named", &f.ep, &["--id", "the-leader"]);
    let (code, _, err) = run(&run_args("named", &f.ep, &["--no-wait"], "exit 0"));
    assert_eq!((code, without_version_warning(&err).as_str()), (75, ""));
    let mut args = vec!["-v"];
    args.extend(run_args("named", &f.ep, &["--no-wait"], "exit 0"));
    let (code, _, err) = run(&args);
    assert_eq!(code, 75, "{err}");
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("not acquired: named is led by the-leader"))
            .count(),
        1,
        "{err}"
    );
    leader.signal(libc::SIGTERM);
    leader.wait(secs(10));
}

/// A successful run logs two lines at the default level, the job's start and its end, with
/// no type's debug form; `-q` leaves none.
#[test]
fn a_successful_run_logs_its_start_and_end_only() {
    let f = Fixture::new();
    let (code, _, err) = run(&run_args("quiet", &f.ep, &[], "exit 0"));
    assert_eq!(code, 0, "{err}");
    let err = without_version_warning(&err);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].contains("INFO leading: job started"), "{err}");
    assert!(lines[1].contains("INFO job ended: exit code 0"), "{err}");
    assert!(!err.contains('{') && !err.contains(" -> "), "{err}");
    let mut args = vec!["-q"];
    args.extend(run_args("quiet", &f.ep, &[], "exit 0"));
    let (code, _, err) = run(&args);
    assert_eq!((code, err.as_str()), (0, ""));
    // The steps are there at debug level, in words.
    let mut args = vec!["-v"];
    args.extend(run_args("quiet", &f.ep, &[], "exit 0"));
    let (_, _, err) = run(&args);
    assert!(
        err.contains("leading -> done on the job ended (exit code 0)"),
        "{err}"
    );
}

#[test]
fn a_run_inside_a_job_does_not_take_the_outer_jobs_settings() {
    let f = Fixture::new();
    // The outer job runs three nested commands, each recording its exit code and stderr.
    let bin = bin();
    let outer = script(
        f.dir.path(),
        &format!(
            "{bin} run -- true 2> $D/noname.err; echo $? > $D/noname.code; \
             {bin} run outer -- true 2> $D/same.err; echo $? > $D/same.code; \
             {bin} run inner --ttl 3s --grace 500ms --safety-margin 500ms -- \
               sh -c 'env > $D/inner.env' 2> $D/inner.err; echo $? > $D/inner.code; \
             {bin} run every --every 1h --ttl 3s --grace 500ms --safety-margin 500ms -- \
               sh -c 'echo $LEAD_EXEC_RUN_KEY > $D/every.key' 2> $D/every.err; \
               echo $? > $D/every.code"
        ),
    );
    let (code, _, err) = run(&run_args(
        "outer",
        &f.ep,
        &["--id", "outer-id", "--run-key", "outer-key"],
        &outer,
    ));
    assert_eq!(code, 0, "{err}");
    let read = |name: &str| std::fs::read_to_string(f.dir.path().join(name)).unwrap();
    assert_eq!(read("noname.code").trim(), "64", "{}", read("noname.err"));
    assert!(
        read("noname.err").contains("not provided: <ELECTION>"),
        "{}",
        read("noname.err")
    );
    assert_eq!(read("same.code").trim(), "64", "{}", read("same.err"));
    assert!(
        read("same.err").contains("inside the job that leads election 'outer'"),
        "{}",
        read("same.err")
    );
    assert!(
        read("same.err").contains("or with --slots take a second slot"),
        "not only one slot: {}",
        read("same.err")
    );
    assert_eq!(read("inner.code").trim(), "0", "{}", read("inner.err"));
    let env = read("inner.env");
    assert!(env.contains("LEAD_EXEC_ELECTION=inner\n"), "{env}");
    assert!(!env.contains("LEAD_EXEC_ID=outer-id"), "{env}");
    // The outer run key was not taken as the inner run's: nothing recorded for it.
    assert!(f.etcd.keys("lead-exec/meta/inner/runs/").is_empty());
    // The outer run key is not read as a --run-key beside --every either: --every makes its
    // own.
    assert_eq!(read("every.code").trim(), "0", "{}", read("every.err"));
    let key = read("every.key");
    assert!(key.trim().ends_with("00Z"), "{key}");
    // The endpoints are inherited on purpose: the same cluster.
    assert!(
        env.contains(&format!("LEAD_EXEC_ENDPOINTS={}", f.ep)),
        "{env}"
    );
}

#[test]
fn missing_interpreter_is_named_and_gives_126() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("script");
    std::fs::write(&f, "#!/no/such/interpreter -e\necho hi\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Checked before connecting: no etcd needed.
    let (code, _, err) = run(&[
        "run",
        "x",
        "--endpoints",
        "127.0.0.1:1",
        "--",
        f.to_str().unwrap(),
    ]);
    assert_eq!(code, 126, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("bad interpreter /no/such/interpreter"),
        "{err}"
    );
}

#[test]
fn argument_lists_too_long_to_exec_are_refused_before_campaigning() {
    let f = Fixture::new();
    // SAFETY: sysconf has no preconditions.
    let limit = unsafe { libc::sysconf(libc::_SC_ARG_MAX) } as usize;
    // lead-exec itself starts (its own exec fits), but the job's exec, which adds the job's
    // variables and the watchdog's arguments, would not: refused as a shell would, 126.
    let mut args: Vec<String> = ["run", "big", "--endpoints", &f.ep, "--", "true"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let chunk = "x".repeat(100_000);
    let used = |a: &[String]| a.iter().map(|s| s.len() + 1 + 8).sum::<usize>() + 200;
    while used(&args) + chunk.len() + 9 < limit - 1500 {
        args.push(chunk.clone());
    }
    let pad = limit - 1500 - used(&args) - 9;
    args.push("y".repeat(pad));
    let start = Instant::now();
    let out = std::process::Command::new(bin())
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(err.contains("argument list too long"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(start.elapsed() < secs(10));
    assert!(f.etcd.keys("lead-exec/").iter().all(|k| !k.contains("big")));
}

#[test]
fn history_keep_0_is_refused_with_64() {
    let (code, _, err) = run(&["run", "x", "--history-keep", "0", "--", "true"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--history-keep must be at least 1"), "{err}");
}

#[test]
fn huge_durations_are_usage_errors_naming_the_flag_and_the_longest_run() {
    let f = Fixture::new();
    let flags: &[(&str, &[&str])] = &[
        ("--timeout", &[]),
        ("--wait", &[]),
        ("--health-interval", &["--health-cmd", "true"]),
        ("--grace", &[]),
        ("--safety-margin", &[]),
        ("--dial-timeout", &[]),
        ("--command-timeout", &[]),
        ("--takeover-delay", &[]),
        ("--min-term", &[]),
    ];
    for (flag, extra) in flags {
        let mut args = vec![
            "run",
            "huge",
            "--endpoints",
            &f.ep,
            flag,
            "18446744073709551615s",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", "exit 5"]);
        let (code, out, err) = run(&args);
        assert_eq!(code, 64, "{flag}: {err}");
        assert!(out.is_empty(), "{flag}: the job ran: {out}");
        assert_eq!(err.lines().count(), 1, "{flag}: {err}");
        assert!(
            err.starts_with(&format!("lead-exec: {flag} ")) && err.contains("too long"),
            "{flag}: {err}"
        );
    }
    // At the maximum, each works (grace, margin and request timeout under the longest lease
    // etcd grants).
    // Each in an election of its own: a first leader with --takeover-delay after terms that
    // ran without one waits the delay out.
    for (i, (flag, extra)) in flags.iter().enumerate() {
        let election = format!("huge{i}");
        let lease: &[&str] = match *flag {
            "--grace" | "--safety-margin" | "--command-timeout" => &["--ttl", "9000000000s"],
            _ => &FAST,
        };
        let mut args = vec!["run", &election, "--endpoints", &f.ep, flag, "100years"];
        args.extend_from_slice(lease);
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", "exit 5"]);
        let (code, _, err) = run(&args);
        assert_eq!(code, 5, "{flag} 100years: {err}");
    }
}

#[test]
fn run_key_ttl_needs_a_run_key_as_health_interval_needs_a_health_cmd() {
    for (flag, value, needs) in [
        ("--run-key-ttl", "1d", "--run-key"),
        ("--every-offset", "5m", "--every"),
        ("--health-interval", "1s", "--health-cmd"),
        ("--health-failures", "2", "--health-cmd"),
    ] {
        let (code, _, err) = run(&["run", "x", flag, value, "--", "true"]);
        assert_eq!(code, 64, "{flag}: {err}");
        assert_eq!(err.lines().count(), 1, "{flag}: {err}");
        assert!(err.contains(needs), "{flag}: {err}");
    }
}

#[test]
fn a_long_election_name_or_value_is_cut_in_the_error() {
    let long = "a".repeat(10_000);
    for args in [
        vec!["run", long.as_str(), "--", "true"],
        vec!["status", long.as_str()],
        vec!["run", "x", "--ttl", long.as_str(), "--", "true"],
        vec!["run", "x", "--run-key", long.as_str(), "--", "true"],
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 64, "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.len() < 400, "{} bytes: {err}", err.len());
        assert!(err.contains("… (10000 bytes)"), "{err}");
    }
}

/// A health check may print without end until it is killed at the interval; lead-exec
/// keeps only the end of it (what the warning shows), not the whole output in memory.
#[test]
fn a_health_check_that_prints_without_end_costs_only_its_last_lines() {
    let f = Fixture::new();
    let job = script(f.dir.path(), "echo ran > $D/ran");
    // 256 MiB of output, then the line the warning must show.
    let check = "head -c 268435456 /dev/zero | tr '\\0' x; echo; echo the check ends here; exit 1";
    let args = run_args(
        "chatty",
        &f.ep,
        &[
            "--health-cmd",
            check,
            "--health-interval",
            "60s",
            "--no-wait",
        ],
        &job,
    );
    // Reaped by the wait4 below, which gives its rusage: not by Child::wait.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(bin())
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(f.dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: wait4 on our own child, into a status and a rusage we own.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let err = std::fs::read_to_string(f.dir.path().join("err")).unwrap();
    assert_eq!(libc::WEXITSTATUS(status), 79, "{err}");
    assert!(err.contains("the check ends here"), "{err}");
    // ru_maxrss is in KiB: lead-exec, its guard and the check, the largest of them.
    assert!(
        usage.ru_maxrss < 64 * 1024,
        "peak RSS {} KiB while a check printed 256 MiB",
        usage.ru_maxrss
    );
    assert!(!f.dir.path().join("ran").exists());
}

/// A check that starts a process out of its group (`setsid`, a self-daemonising tool)
/// leaves the output pipe held open, here by a process that writes without end; the check
/// still ends when its guard does, and passes.
#[test]
fn a_check_whose_setsid_child_holds_its_output_still_passes_when_its_shell_does() {
    let f = Fixture::new();
    let job = script(f.dir.path(), "echo ran > $D/ran");
    let check = script(
        f.dir.path(),
        // The shell waits until the escaped process has left its group, or the guard's kill
        // at the shell's exit could reach it first.
        "setsid sh -c \"echo \\$\\$ > $D/esc.tmp; mv $D/esc.tmp $D/escaped; exec yes\" & \
         while [ ! -s $D/escaped ]; do sleep 0.01; done; echo ok",
    );
    let args = run_args(
        "escaping",
        &f.ep,
        &[
            "--health-cmd",
            &check,
            "--health-interval",
            "2s",
            "--no-wait",
        ],
        &job,
    );
    let (code, _, err) = run(&args);
    let escaped = wait_int(&f.dir.path().join("escaped"), secs(5)) as i32;
    // SAFETY: kill(2) of the `yes` the check left, whose pid it wrote (if the closed pipe
    // has not ended it already).
    unsafe { libc::kill(escaped, libc::SIGKILL) };
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("timed out"), "{err}");
    assert!(f.dir.path().join("ran").exists());
}

/// A check killed at the interval shows what it printed before it hung.
#[test]
fn a_check_that_times_out_shows_what_it_printed() {
    let f = Fixture::new();
    let job = script(f.dir.path(), "echo ran > $D/ran");
    let args = run_args(
        "hung",
        &f.ep,
        &[
            "--health-cmd",
            "echo the last words before it hung; exec sleep 30",
            "--health-interval",
            "500ms",
            "--no-wait",
        ],
        &job,
    );
    let (code, _, err) = run(&args);
    assert_eq!(code, 79, "{err}");
    assert!(err.contains("health check timed out after 500ms"), "{err}");
    assert!(err.contains("the last words before it hung"), "{err}");
    assert!(!f.dir.path().join("ran").exists());
}

/// A worker kept out by its own failing health check says so, in a warning and in its exit
/// code: 79, not the conflict code (75), which means someone else leads. Nobody does here.
#[test]
fn no_wait_kept_out_by_its_own_failing_health_check_says_so_and_exits_79() {
    let f = Fixture::new();
    let job = script(f.dir.path(), "echo ran > $D/ran");
    for extra in [&["--no-wait"][..], &["--wait", "1s"]] {
        let args = [
            &["--health-cmd", "exit 1", "--health-interval", "200ms"][..],
            extra,
        ]
        .concat();
        let (code, _, err) = run(&run_args("sick", &f.ep, &args, &job));
        assert_eq!(code, 79, "{extra:?}: {err}");
        assert!(
            err.contains("not acquired: the health check is failing"),
            "{err}"
        );
        assert!(!err.contains("another leader"), "{err}");
        // -q leaves errors only; the exit code still says it.
        let quiet = [&["-q"][..], &run_args("sick", &f.ep, &args, &job)].concat();
        let (code, _, err) = run(&quiet);
        assert_eq!((code, err.as_str()), (79, ""), "{extra:?}");
    }
    assert!(!f.dir.path().join("ran").exists());
    assert!(f.etcd.keys("lead-exec/elections/sick/").is_empty());
}

/// The job's command and arguments go to execve as the bytes they were given, as with flock,
/// timeout, env and nice: a file name in Latin-1 is not refused. Flags and names are text: a
/// non-UTF-8 one is refused with 64, naming it.
#[test]
fn the_command_is_passed_on_as_bytes_and_a_flag_that_is_not_utf8_is_named() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let f = Fixture::new();
    let latin1 = OsStr::from_bytes(b"caf\xe9");
    let script = f.dir.path().join(OsStr::from_bytes(b"run-\xe9"));
    std::fs::write(&script, "#!/bin/sh\nprintf '%s' \"$1\"\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = std::process::Command::new(bin())
        .args(["run", "bytes", "--endpoints", &f.ep, "--"])
        .arg(&script)
        .arg(latin1)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(out.stdout, b"caf\xe9");
    for (args, named) in [
        (vec![&b"--id"[..], b"w\xe9"], "--id: "),
        (vec![&b"--id=w\xe9"[..]], "--id: "),
    ] {
        let out = std::process::Command::new(bin())
            .args(["run", "bytes", "--endpoints", &f.ep])
            .args(args.iter().map(|a| OsStr::from_bytes(a)))
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!("lead-exec: {named}'w\u{fffd}' is not valid UTF-8")),
            "{err}"
        );
    }
}

/// stderr without the warning an etcd that lacks the lease fixes gets (the suite runs on
/// 3.4.23, which does, and on the newest 3.5, which does not).
fn without_version_warning(err: &str) -> String {
    err.lines()
        .filter(|l| !l.contains("lacks a lease fix"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// At start, `run` reads the server's version beside its first requests: one warning when it
/// predates the lease fixes the fail-closed argument needs, and the version as a metric.
#[test]
fn an_etcd_without_the_lease_fixes_is_warned_of_once_and_its_version_is_a_metric() {
    let f = Fixture::new();
    let out = etcdctl(&f.ep, &["endpoint", "status", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let version = v[0]["Status"]["version"].as_str().unwrap().to_string();
    let missing = lead_exec::etcd::lease_fix_missing(&version);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let job = script(f.dir.path(), "while [ ! -e $D/go ]; do sleep 0.05; done");
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args("ver", &f.ep, &["--metrics-addr", &addr], &job),
    );
    w.wait_job_started();
    let out = scrape(port).expect("metrics");
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    assert_eq!(w.code(secs(10)), 0, "{}", w.log_text());
    let err = w.log_text();
    let warnings = err
        .matches(&format!("etcd {version} lacks a lease fix"))
        .count();
    assert_eq!(warnings, usize::from(missing.is_some()), "{version}: {err}");
    let fixes = if missing.is_some() { "no" } else { "yes" };
    assert!(
        out.contains(&format!(
            r#"lead_exec_etcd_server_info{{election="ver",lease_fixes="{fixes}",version="{version}"}} 1"#
        )),
        "{out}"
    );
}

/// `--every`, `--every-offset` and `--splay` refuse what cannot name one period, in one line
/// with 64, before anything is written to etcd.
#[test]
fn every_and_splay_refuse_bad_input_with_64_before_touching_etcd() {
    let f = Fixture::new();
    let cases: &[Refusal] = &[
        (&["--every", "0s"], &[], "--every must be greater than zero"),
        (
            &["--every", "-1h"],
            &[],
            "invalid value '-1h' for '--every': negative values are not allowed",
        ),
        (
            &["--every", "hourly"],
            &[],
            "invalid value 'hourly' for '--every",
        ),
        (
            &["--every", "1500ms"],
            &[],
            "--every 1s 500ms is not a whole number of seconds",
        ),
        (
            &["--every", "1h", "--every-offset", "1h"],
            &[],
            "--every-offset 1h is not shorter than --every 1h",
        ),
        (
            &["--every", "1h", "--every-offset", "2h"],
            &[],
            "--every-offset 2h is not shorter than --every 1h",
        ),
        (
            &["--every-offset", "5m"],
            &[],
            "the following required arguments were not provided: --every <PERIOD>",
        ),
        (
            &["--every", "1h", "--run-key", "nightly"],
            &[],
            "--every 1h with --run-key nightly: --every makes the run key from the time",
        ),
        (
            &["--every", "1h"],
            &[("LEAD_EXEC_RUN_KEY", "nightly")],
            "--every 1h with --run-key nightly",
        ),
        (
            &["--every", "5m", "--splay", "5m"],
            &[],
            "--splay 5m is not shorter than --every 5m",
        ),
        (
            &["--every", "5m", "--splay", "10m"],
            &[],
            "--splay 10m is not shorter than --every 5m",
        ),
        (&["--splay", "-1s"], &[], "negative values are not allowed"),
        (
            &["--splay", "101years"],
            &[],
            "--splay 101years is too long",
        ),
        (
            &["--every", "1h", "--slots", "2"],
            &[],
            "a run key runs the job once",
        ),
    ];
    refused_before_etcd(&f, cases);
}

/// The flags of a `run`, the variables beside them, and what its one line must say.
type Refusal = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// Each case is refused with 64 and one line naming the problem, and nothing is written to
/// etcd.
fn refused_before_etcd(f: &Fixture, cases: &[Refusal]) {
    for (flags, env, want) in cases {
        let args = [
            &["run", "bad", "--endpoints", &f.ep],
            *flags,
            &["--", "true"],
        ]
        .concat();
        let (code, out, err) = run_env(&args, env);
        assert_eq!(code, 64, "{flags:?}: {err}");
        assert!(out.is_empty(), "{flags:?}");
        assert_eq!(err.lines().count(), 1, "{flags:?}: not one line:\n{err}");
        assert!(err.contains(want), "{flags:?}: want {want:?}, got {err}");
    }
    assert!(
        f.etcd.keys("lead-exec/").is_empty(),
        "a refused run wrote to etcd"
    );
}

#[test]
fn attempts_and_retry_delay_refuse_bad_input_with_64_before_touching_etcd() {
    let f = Fixture::new();
    let cases: &[Refusal] = &[
        (
            &["--every", "5m", "--attempts", "0"],
            &[],
            "--attempts 0: must be between 1 and 1000",
        ),
        (&["--every", "5m", "--attempts", "-1"], &[], "--attempts"),
        (&["--every", "5m", "--attempts", "many"], &[], "--attempts"),
        (
            &["--attempts", "3"],
            &[],
            "the following required arguments were not provided",
        ),
        (
            &["--every", "5m", "--attempts", "3", "--no-wait"],
            &[],
            "cannot be used with",
        ),
        (
            &["--every", "5m", "--retry-delay", "1m"],
            &[],
            "the following required arguments were not provided: --attempts <N>",
        ),
        (
            &["--every", "5m", "--attempts", "3", "--retry-delay", "5m"],
            &[],
            "--retry-delay 5m is not shorter than --every 5m",
        ),
        (
            &[
                "--run-key",
                "k",
                "--attempts",
                "3",
                "--retry-delay",
                "101years",
            ],
            &[],
            "--retry-delay 101years is too long",
        ),
    ];
    refused_before_etcd(&f, cases);
}

#[test]
fn a_metrics_textfile_that_cannot_be_written_or_read_is_refused_with_64_before_touching_etcd() {
    let f = Fixture::new();
    let cases: &[Refusal] = &[
        (
            &["--metrics-textfile", "/nonexistent-lead-exec-dir/runs.prom"],
            &[],
            "--metrics-textfile /nonexistent-lead-exec-dir/runs.prom: cannot write in /nonexistent-lead-exec-dir",
        ),
        (
            &["--metrics-textfile", "/dev/null/runs.prom"],
            &[],
            "cannot write in /dev/null",
        ),
        (
            &["--metrics-textfile", "/tmp/runs.txt"],
            &[],
            "node_exporter's textfile collector reads only files named *.prom",
        ),
    ];
    refused_before_etcd(&f, cases);
}
