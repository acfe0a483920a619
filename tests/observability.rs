//! Metrics, structured logs, systemd notifications and completions.

use std::os::unix::net::UnixDatagram;

use harness::*;

/// Worker "w" of `election`, serving metrics on a free loopback port, running `body` (a
/// script as [`script`] makes it) with the lease settings `lease`: the worker and its port.
fn metrics_worker(
    etcd: &Etcd,
    dir: &std::path::Path,
    lease: &[&str],
    election: &str,
    body: &str,
) -> (Worker, u16) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let extra = ["--metrics-addr", addr.as_str()];
    let endpoints = etcd.endpoints();
    let args = run_args_with(lease, election, &endpoints, &extra, body);
    (spawn(dir, "w", &args), port)
}

fn job(dir: &std::path::Path, who: &str) -> String {
    script(
        dir,
        &format!("echo $FENCING_TOKEN > $D/{who}.token; trap 'exit 0' TERM; while :; do sleep 0.05; done"),
    )
}

#[test]
fn metrics_follow_a_failover() {
    let f = Fixture::new();
    let (pa, pb) = (free_port(), free_port());
    let (ma, mb) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args(
            "met",
            &f.ep,
            &["--metrics-addr", &ma],
            &job(f.dir.path(), "a"),
        ),
    );
    let ta = wait_int(&f.dir.path().join("a.token"), secs(10));
    let b = spawn(
        f.dir.path(),
        "b",
        &run_args(
            "met",
            &f.ep,
            &["--metrics-addr", &mb],
            &job(f.dir.path(), "b"),
        ),
    );
    b.wait_log("waiting behind", secs(10));

    let text = scrape(pa).expect("leader serves metrics");
    assert_eq!(metric(&text, "lead_exec_is_leader"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "lead_exec_fencing_token"), Some(ta as f64));
    assert_eq!(metric(&text, "lead_exec_job_starts_total"), Some(1.0));
    assert_eq!(metric(&text, "lead_exec_campaigns_won_total"), Some(1.0));
    // Keepalives happen every third of TTL − grace − margin = 667 ms.
    assert!(wait_until(secs(5), || {
        scrape(pa)
            .and_then(|t| metric(&t, "lead_exec_keepalive_rtt_seconds_count"))
            .unwrap_or(0.0)
            >= 1.0
    }));
    let text = scrape(pb).unwrap();
    assert_eq!(metric(&text, "lead_exec_is_leader"), Some(0.0), "{text}");

    a.signal(libc::SIGTERM);
    a.wait(secs(10));
    let tb = wait_int(&f.dir.path().join("b.token"), secs(10));
    // The job can write its token before lead-exec has taken in the watchdog's "started".
    let mut text = String::new();
    let leads = wait_until(secs(5), || {
        text = scrape(pb).unwrap_or_default();
        metric(&text, "lead_exec_is_leader") == Some(1.0)
    });
    assert!(leads, "{text}");
    assert_eq!(metric(&text, "lead_exec_fencing_token"), Some(tb as f64));
    assert!(metric(&text, "lead_exec_campaign_duration_seconds_count") == Some(1.0));
    assert!(text.contains("lead_exec_lease_ttl_remaining_seconds"));
    drop(b);
}

#[test]
fn metrics_count_losses_and_job_exits_by_reason_and_show_slack_once_a_job_ended() {
    let f = Fixture::new();
    let (w, port) = metrics_worker(
        &f.etcd,
        f.dir.path(),
        &FAST,
        "loss",
        &job(f.dir.path(), "w"),
    );
    wait_int(&f.dir.path().join("w.token"), secs(10));
    // No job has ended yet: no slack to show (a 0 would read as a job that died on its
    // deadline), and every loss reason at 0, in Prometheus's label style.
    let text = scrape(port).unwrap();
    assert_eq!(
        metric(&text, "lead_exec_deadline_slack_seconds"),
        None,
        "{text}"
    );
    for reason in [
        "lease_expired",
        "renewal_deadline_passed",
        "leader_key_deleted",
    ] {
        let at_zero =
            format!(r#"lead_exec_leadership_lost_total{{election="loss",reason="{reason}"}} 0"#);
        assert!(text.contains(&at_zero), "{text}");
    }
    let key = f.etcd.keys("lead-exec/elections/loss/").remove(0);
    std::fs::remove_file(f.dir.path().join("w.token")).unwrap();
    f.etcd.ctl(&["del", &key]);
    wait_int(&f.dir.path().join("w.token"), secs(10));
    let text = scrape(port).unwrap();
    assert!(
        text.contains(
            r#"lead_exec_leadership_lost_total{election="loss",reason="leader_key_deleted"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"lead_exec_job_exits_total{code="0",election="loss"} 1"#),
        "{text}"
    );
    assert!(metric(&text, "lead_exec_deadline_slack_seconds").unwrap() > 0.0);
    drop(w);
}

#[test]
fn json_logs_have_one_object_per_line_with_election_id_and_token() {
    let f = Fixture::new();
    let (code, _, err) = run(&run_args(
        "logs",
        &f.ep,
        &["-v", "--log-format", "json", "--id", "w-json"],
        "exit 0",
    ));
    assert_eq!(code, 0, "{err}");
    let mut transitions = 0;
    for l in err.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        if v["message"].as_str().unwrap_or("").contains(" -> ") {
            assert_eq!(v["election"], "logs", "{l}");
            assert_eq!(v["id"], "w-json", "{l}");
            assert!(v["token"].as_i64().is_some(), "{l}");
            transitions += 1;
        }
    }
    assert!(transitions >= 2, "{err}");
}

/// RUST_LOG sets the levels (here: warnings only, so no "leading" line). One that cannot be
/// read (an unknown level; span syntax, once taken for a target that matched nothing, which
/// logged nothing at all) is one warning in the run's span, with the levels of the flags, and
/// the run goes on. `check` inside the job, which is silent, does not say it again.
#[test]
fn rust_log_sets_the_levels_and_one_that_cannot_be_read_is_one_warning() {
    let f = Fixture::new();
    let bin = bin();
    let job = script(
        f.dir.path(),
        &format!("'{bin}' check > $D/check.out 2>&1; echo $? > $D/check.code"),
    );
    let args = run_args("rustlog", &f.ep, &["--id", "w"], &job);
    let (code, _, err) = run_env(&args, &[("RUST_LOG", "warn")]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("leading"), "{err}");
    // One that does not reach lead-exec's lines (a misspelt name, one module) leaves them at
    // the flags' level, each with the run's fields, instead of hiding them all.
    for elsewhere in ["lead-exec=debug", "lead_exec::election=debug"] {
        let (code, _, err) = run_env(&args, &[("RUST_LOG", elsewhere)]);
        assert_eq!(code, 0, "{err}");
        assert!(
            err.lines().any(|l| l.contains(" INFO leading: job started")
                && l.ends_with("election=\"rustlog\" id=\"w\"")),
            "{elsewhere}: {err}"
        );
    }
    for unread in ["lead_exec=loud", "lead_exec[run]=debug"] {
        let (code, _, err) = run_env(&args, &[("RUST_LOG", unread)]);
        assert_eq!(code, 0, "{err}");
        let warnings: Vec<&str> = err.lines().filter(|l| l.contains("RUST_LOG")).collect();
        assert_eq!(warnings.len(), 1, "{err}");
        assert!(
            warnings[0].contains(&format!(" WARN RUST_LOG={unread} ignored (")),
            "{err}"
        );
        assert!(
            warnings[0].ends_with("election=\"rustlog\" id=\"w\""),
            "{err}"
        );
        assert!(err.contains("INFO leading: job started"), "{err}");
        assert_eq!(wait_int(&f.dir.path().join("check.code"), secs(5)), 0);
        assert_eq!(lines(&f.dir.path().join("check.out")), Vec::<String>::new());
        std::fs::remove_file(f.dir.path().join("check.code")).unwrap();
    }
    // A check that fails says its own line only.
    let stale = [
        "check",
        "--election",
        "rustlog",
        "--endpoints",
        &f.ep,
        "--token",
        "1",
    ];
    let (code, _, err) = run_env(&stale, &[("RUST_LOG", "lead_exec=loud")]);
    assert_eq!(code, 4, "{err}");
    assert!(!err.contains("RUST_LOG"), "{err}");
}

/// Every line of a run ends with its election and id (text) or has them at the top level
/// (JSON), the lines written after the run's own work is done too: "not acquired" for
/// `--no-wait` (75) and for a failing health check (79), and the error that ends a run.
#[test]
fn the_last_lines_of_a_run_carry_its_election_and_id() {
    let f = Fixture::new();
    let d = f.dir.path();
    let holder = spawn(
        d,
        "h",
        &run_args("tail", &f.ep, &["--id", "h"], &job(d, "h")),
    );
    wait_int(&d.join("h.token"), secs(10));
    let late = run_args(
        "tail",
        &f.ep,
        &["--id", "late", "--no-wait", "-v"],
        "exit 0",
    );
    let sick = run_args(
        "tail",
        &f.ep,
        &["--id", "late", "--no-wait", "--health-cmd", "false"],
        "exit 0",
    );
    let dead = run_args(
        "tail",
        "127.0.0.1:1",
        &["--id", "late", "--dial-timeout", "200ms"],
        "exit 0",
    );
    for (args, code, last) in [
        (late, 75, "not acquired"),
        (sick, 79, "not acquired"),
        (dead, 69, "unavailable"),
    ] {
        let (got, _, err) = run(&args);
        assert_eq!(got, code, "{err}");
        assert!(err.lines().last().unwrap_or("").contains(last), "{err}");
        for l in err.lines() {
            assert!(l.ends_with(r#" election="tail" id="late""#), "{l}\n{err}");
        }
        let json: Vec<&str> = ["--log-format", "json"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let (got, _, err) = run(&json);
        assert_eq!(got, code, "{err}");
        for l in err.lines() {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert_eq!(v["election"], "tail", "{l}");
            assert_eq!(v["id"], "late", "{l}");
        }
    }
    drop(holder);
}

#[test]
fn quiet_hides_info_and_verbose_shows_debug() {
    let f = Fixture::new();
    let (_, _, quiet) = run(&run_args("lv", &f.ep, &["-q"], "exit 0"));
    assert!(quiet.is_empty(), "{quiet}");
    let (_, _, loud) = run(&run_args("lv", &f.ep, &["-v"], "exit 0"));
    assert!(loud.contains("DEBUG"), "{loud}");
}

#[test]
fn systemd_notify_gets_ready_and_status() {
    let f = Fixture::new();
    let sock_path = f.dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(secs(10))).unwrap();
    let w = spawn_env(
        f.dir.path(),
        "w",
        &run_args("sd", &f.ep, &[], &job(f.dir.path(), "w")),
        &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())],
    );
    let token = wait_int(&f.dir.path().join("w.token"), secs(10));
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.iter().any(|m: &String| m.contains("STATUS=leading")) {
        let n = sock.recv(&mut buf).expect("notification");
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(got[0].contains("READY=1"), "{got:?}");
    assert!(
        got.iter()
            .any(|m| m == &format!("STATUS=leading, token {token}")),
        "{got:?}"
    );
    drop(w);
}

/// A SIGTERM (`systemctl stop`) is said to systemd at once: STOPPING=1, with how long the
/// stop may take beyond the unit's timeout.
#[test]
fn systemd_hears_stopping_with_the_time_the_stop_may_take() {
    let f = Fixture::new();
    let sock_path = f.dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(secs(10))).unwrap();
    let mut w = spawn_env(
        f.dir.path(),
        "w",
        &run_args("sdstop", &f.ep, &[], &job(f.dir.path(), "w")),
        &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())],
    );
    wait_int(&f.dir.path().join("w.token"), secs(10));
    w.signal(libc::SIGTERM);
    let mut buf = [0u8; 512];
    let stopping = loop {
        let n = sock.recv(&mut buf).expect("STOPPING=1");
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        if m.contains("STOPPING=1") {
            break m;
        }
    };
    // FAST: grace 0.5 s; the default --command-timeout, three times.
    let usec: u64 = stopping
        .lines()
        .find_map(|l| l.strip_prefix("EXTEND_TIMEOUT_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{stopping}"));
    assert!(usec >= 500_000, "{stopping}");
    w.wait(secs(10));
}

/// systemd's notify socket and watchdog settings are lead-exec's, not the job's.
#[test]
fn the_job_gets_no_notify_socket_or_watchdog_settings() {
    let f = Fixture::new();
    let sock_path = f.dir.path().join("notify.sock");
    let _sock = UnixDatagram::bind(&sock_path).unwrap();
    let job = script(f.dir.path(), "env > $D/env");
    let pid = std::process::id().to_string();
    let mut w = spawn_env(
        f.dir.path(),
        "w",
        &run_args("sdenv", &f.ep, &[], &job),
        &[
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "10000000"),
            ("WATCHDOG_PID", &pid),
        ],
    );
    assert_eq!(w.code(secs(10)), 0, "{}", w.log_text());
    let env = lines(&f.dir.path().join("env"));
    assert!(
        env.iter().any(|l| l.starts_with("FENCING_TOKEN=")),
        "{env:?}"
    );
    let leaked: Vec<_> = env
        .iter()
        .filter(|l| {
            ["NOTIFY_SOCKET=", "WATCHDOG_USEC=", "WATCHDOG_PID="]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");
}

#[test]
fn completions_are_generated_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, _) = run(&["completions", shell]);
        assert_eq!(code, 0);
        assert!(
            out.contains("lead-exec") && out.contains("resign"),
            "{shell}"
        );
    }
}

/// What bash offers after `lead-exec WORDS<TAB>`, from the generated script.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let (code, script, _) = run(&["completions", "bash"]);
    assert_eq!(code, 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lead-exec.bash");
    std::fs::write(&path, script).unwrap();
    let line = words.join(" ");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_WORDS=(lead-exec {line}); COMP_CWORD={}; \
             _lead__exec lead-exec \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            path.display(),
            words.len()
        ))
        .output()
        .expect("bash (Debian package bash)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// bash completes the flags of each subcommand, not only the top level's: clap_complete's
/// script never matched a subcommand of a binary whose name has a hyphen.
#[test]
fn bash_completes_the_flags_of_each_subcommand() {
    for (words, want) in [
        (&["--ver"][..], "--verbose"),
        (&["res"][..], "resign"),
        (&["run", "--end"][..], "--endpoints"),
        (&["run", "--on-l"][..], "--on-loss"),
        (&["status", "--out"][..], "--output"),
        (&["history", "--cou"][..], "--count"),
        (&["resign", "--tok"][..], "--token"),
        (&["run", "--log-format", ""][..], "json"),
    ] {
        let got = bash_completes(words);
        assert!(got.iter().any(|w| w == want), "{words:?}: {got:?}");
    }
}

#[test]
fn metrics_addr_takes_a_host_name_and_a_taken_port_is_64_with_the_address() {
    let f = Fixture::new();
    let port = free_port();
    let addr = format!("localhost:{port}");
    let w = spawn(
        f.dir.path(),
        "named",
        &run_args(
            "metname",
            &f.ep,
            &["--metrics-addr", &addr],
            &job(f.dir.path(), "a"),
        ),
    );
    wait_int(&f.dir.path().join("a.token"), secs(10));
    let mut text = None;
    assert!(wait_until(secs(5), || {
        text = scrape(port);
        text.is_some()
    }));
    assert!(text.unwrap().contains("lead_exec_is_leader 1"));

    // The same port again: taken. Refused at start-up, before campaigning.
    let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let taken = format!("127.0.0.1:{}", taken.local_addr().unwrap().port());
    let (code, _, err) = run(&run_args(
        "metname2",
        &f.ep,
        &["--metrics-addr", &taken],
        "exit 0",
    ));
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&taken) && err.contains("in use"), "{err}");
    drop(w);
}

#[test]
fn fatal_errors_are_json_under_log_format_json() {
    let f = Fixture::new();
    type Case<'a> = (Vec<&'a str>, &'a [(&'a str, &'a str)], i64);
    // A command that does not exist: refused by the run itself (127).
    let missing: Vec<&str> = run_args("fj", &f.ep, &["--log-format=json"], "exit 0")
        .into_iter()
        .map(|a| if a == "sh" { "no-such-command-xyz" } else { a })
        .collect();
    let cases: Vec<Case> = vec![
        // Refused by the configuration check.
        (
            run_args(
                "fj",
                &f.ep,
                &["--log-format", "json", "--ttl", "300years"],
                "exit 0",
            )
            .into_iter()
            .filter(|a| *a != "--ttl" && *a != "3s")
            .collect(),
            &[],
            64,
        ),
        // Refused by the parser, with the format from the flag or the variable.
        (vec!["--log-format", "json", "run", "fj"], &[], 64),
        (vec!["run", "fj"], &[("LEAD_EXEC_LOG_FORMAT", "json")], 64),
        // From the command.
        (missing.clone(), &[], 127),
        // Whatever RUST_LOG says, as the text line is.
        (missing, &[("RUST_LOG", "off")], 127),
    ];
    for (args, env, want) in cases {
        let (code, _, err) = run_env(&args, env);
        assert_eq!(code as i64, want, "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        let v: serde_json::Value =
            serde_json::from_str(err.trim()).unwrap_or_else(|e| panic!("{e}: {err}"));
        assert_eq!(v["level"], "ERROR", "{err}");
        assert_eq!(v["exit_code"], want, "{err}");
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{err}"
        );
    }
}

/// Sends one request on `s` and reads its whole response (headers, then Content-Length bytes).
fn exchange(s: &mut std::net::TcpStream, req: &str) -> String {
    use std::io::{Read, Write};
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(secs(5))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    // One response: headers, then Content-Length bytes of body.
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "connection closed early: {}",
            String::from_utf8_lossy(&out)
        );
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let body_len = if req.starts_with("HEAD") { 0 } else { len };
            if out.len() >= end + 4 + body_len {
                return text;
            }
        }
    }
}

#[test]
fn metrics_endpoint_answers_head_404_keep_alive_and_outlasts_a_slow_client() {
    let f = Fixture::new();
    let (mut w, port) = metrics_worker(
        &f.etcd,
        f.dir.path(),
        &FAST,
        "http",
        &job(f.dir.path(), "w"),
    );
    wait_int(&f.dir.path().join("w.token"), secs(10));
    assert!(wait_until(secs(5), || {
        scrape(port).and_then(|t| metric(&t, "lead_exec_is_leader")) == Some(1.0)
    }));
    // A client that connects and never sends a request must not hold up anyone else.
    let _slow = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = exchange(&mut s, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head.contains("lead_exec_is_leader"),
        "HEAD sent a body: {head}"
    );
    // Same connection (keep-alive): the full body this time.
    let get = exchange(&mut s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(get.starts_with("HTTP/1.1 200"), "{get}");
    assert_eq!(metric(&get, "lead_exec_is_leader"), Some(1.0), "{get}");
    let other = exchange(&mut s, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    let post = exchange(
        &mut s,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(
        post.to_ascii_lowercase().contains("allow: get, head"),
        "405 without Allow: {post}"
    );
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

#[test]
fn metrics_raise_no_false_alarm_for_a_new_leader_without_checks_or_a_waiting_candidate() {
    let f = Fixture::new();
    let (pa, pb) = (free_port(), free_port());
    let (ma, mb) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    // A long TTL: the first keepalive is seconds away when the job starts.
    let lease = [
        "--ttl",
        "30s",
        "--grace",
        "500ms",
        "--safety-margin",
        "500ms",
    ];
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args_with(
            &lease,
            "mfa",
            &f.ep,
            &["--metrics-addr", &ma],
            &job(f.dir.path(), "a"),
        ),
    );
    wait_int(&f.dir.path().join("a.token"), secs(10));
    let mut text = String::new();
    let leads = wait_until(secs(5), || {
        text = scrape(pa).unwrap_or_default();
        metric(&text, "lead_exec_is_leader") == Some(1.0)
    });
    assert!(leads, "{text}");
    assert_eq!(
        metric(&text, "lead_exec_keepalive_rtt_seconds_count"),
        Some(0.0),
        "a keepalive came first: the test proves nothing\n{text}"
    );
    let ttl = metric(&text, "lead_exec_lease_ttl_remaining_seconds").expect(&text);
    assert!(
        ttl > 20.0,
        "a new leader's lease looks spent: {ttl}\n{text}"
    );
    assert_eq!(
        metric(&text, "lead_exec_healthy"),
        None,
        "no --health-cmd, yet a health gauge:\n{text}"
    );
    assert_eq!(metric(&text, "lead_exec_slot"), Some(0.0), "{text}");

    let b = spawn(
        f.dir.path(),
        "b",
        &run_args_with(
            &lease,
            "mfa",
            &f.ep,
            &["--metrics-addr", &mb],
            &job(f.dir.path(), "b"),
        ),
    );
    b.wait_log("waiting behind", secs(10));
    let text = scrape(pb).unwrap();
    assert_eq!(
        metric(&text, "lead_exec_slot"),
        Some(-1.0),
        "a waiting candidate reads as holding slot 0:\n{text}"
    );
    assert_eq!(metric(&text, "lead_exec_is_leader"), Some(0.0), "{text}");
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
    drop(b);
}

#[test]
fn metrics_show_health_only_with_a_health_check() {
    let f = Fixture::new();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args(
            "mhc",
            &f.ep,
            &[
                "--metrics-addr",
                &addr,
                "--health-cmd",
                "true",
                "--health-interval",
                "200ms",
            ],
            &job(f.dir.path(), "a"),
        ),
    );
    wait_int(&f.dir.path().join("a.token"), secs(10));
    let text = scrape(port).unwrap();
    assert_eq!(metric(&text, "lead_exec_healthy"), Some(1.0), "{text}");
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
}

/// A pipe for a child's stderr: (read end, write end), both close-on-exec here (the child
/// gets the write end as its fd 2, without the flag).
fn pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into the array we own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are fresh descriptors nobody else owns.
    unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    }
}

/// Starts `lead-exec ARGS` with `stderr` as its stderr; the command (and its copy of the
/// descriptor) is gone when this returns, so the child holds the only write end.
fn spawn_with_stderr(
    args: &[&str],
    env: &[(&str, &str)],
    stderr: std::os::fd::OwnedFd,
) -> std::process::Child {
    std::process::Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// A job that records its token, writes a heartbeat every 50 ms and exits 0 on TERM. Its
/// stderr is lead-exec's, which these tests break: the shell's "Terminated" for its sleep
/// would kill it with SIGPIPE, as it would without lead-exec, so it writes elsewhere.
fn heartbeat(dir: &std::path::Path, who: &str) -> String {
    script(
        dir,
        &format!(
            "exec 2>/dev/null; trap 'echo end >> $D/{who}.end; exit 0' TERM; echo $FENCING_TOKEN > $D/{who}.token; \
             while :; do date +%s%N >> $D/hb; sleep 0.05; done"
        ),
    )
}

/// Waits until the job's heartbeat is `past` later than `since`: the job outlived, by then,
/// more than a TTL of a lease that nobody could have renewed if lead-exec had died.
fn heartbeat_past(dir: &std::path::Path, since: i128, past: std::time::Duration) {
    let at = since + past.as_nanos() as i128;
    assert!(
        wait_until(past + secs(10), || lines(&dir.join("hb"))
            .iter()
            .any(|l| l.trim().parse::<i128>().is_ok_and(|t| t > at))),
        "the job stopped beating"
    );
}

#[test]
fn a_leader_whose_log_reader_is_gone_keeps_its_job_and_hands_over_on_sigterm() {
    let f = Fixture::new();
    // A debug line every 100 ms (each health check), so lead-exec writes to the dead pipe
    // again and again while it leads.
    let job = heartbeat(f.dir.path(), "a");
    let mut args = vec!["-v"];
    args.extend(run_args(
        "gone",
        &f.ep,
        &[
            "--id",
            "a",
            "--health-cmd",
            "true",
            "--health-interval",
            "100ms",
        ],
        &job,
    ));
    let (reader, writer) = pipe();
    let mut a = spawn_with_stderr(&args, &[], writer);
    let ta = wait_int(&f.dir.path().join("a.token"), secs(10));
    drop(reader);
    let closed = now_ns();
    // TTL 3 s: past 5 s, the job runs only because lead-exec is alive and renewing.
    heartbeat_past(f.dir.path(), closed, secs(5));
    assert!(a.try_wait().unwrap().is_none(), "lead-exec exited");

    let mut b = spawn(
        f.dir.path(),
        "b",
        &run_args("gone", &f.ep, &["--id", "b"], &heartbeat(f.dir.path(), "b")),
    );
    b.wait_log("waiting behind a", secs(10));
    signal(a.id() as i32, libc::SIGTERM);
    let end = std::time::Instant::now() + secs(15);
    let status = loop {
        if let Some(s) = a.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < end,
            "lead-exec did not exit on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(
        status.code(),
        Some(0),
        "the job's own exit code, no abort: {status:?}"
    );
    // The job got its TERM and ended by its trap. (On a starved machine a lease may lapse
    // once before, and the job run again in a new term: one "end" per term.)
    let ends = lines(&f.dir.path().join("a.end"));
    assert!(
        !ends.is_empty() && ends.iter().all(|l| l == "end"),
        "{ends:?}"
    );
    let tb = wait_int(&f.dir.path().join("b.token"), secs(10));
    assert!(tb > ta);
    // a's term was closed in the history, not left "running".
    let (code, out, err) = run(&["history", "gone", "--endpoints", &f.ep, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let recs: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rec = recs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["token"] == ta)
        .unwrap_or_else(|| panic!("no record of token {ta}: {out}"));
    assert!(rec["ended_ms"].is_u64(), "{rec}");
    b.signal(libc::SIGTERM);
    assert_eq!(b.code(secs(10)), 0);
}

#[test]
fn a_log_pipe_nobody_reads_neither_stalls_the_leader_nor_its_exit_and_drops_are_counted() {
    use std::io::Read;
    let f = Fixture::new();
    // A pipe already full, whose reader reads nothing: the first write to it blocks, as it
    // does once a stopped reader has let 64 KiB pile up.
    let (reader, writer) = full_pipe();
    // Trace from every crate: 30 to 50 kB of log a second (driven by timers: keepalives, HTTP/2
    // pings, checks), so the 256 KiB queue overflows in about 12 s.
    let job = heartbeat(f.dir.path(), "a");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let args = run_args(
        "stalled",
        &f.ep,
        &[
            "--health-cmd",
            "true",
            "--health-interval",
            "100ms",
            "--metrics-addr",
            &addr,
        ],
        &job,
    );
    let mut a = spawn_with_stderr(&args, &[("RUST_LOG", "trace")], writer);
    wait_int(&f.dir.path().join("a.token"), secs(10));
    let started = now_ns();
    heartbeat_past(f.dir.path(), started, secs(12));
    assert!(a.try_wait().unwrap().is_none(), "lead-exec exited");
    // The loss is counted where an alert can see it, while stderr is still stuck: once the
    // queue is full, whenever that is (the log's rate varies with the machine's load).
    let mut text = String::new();
    let dropped = wait_until(secs(30), || {
        text = scrape(port).unwrap_or_default();
        metric(&text, "lead_exec_log_lines_dropped_total").unwrap_or(0.0) > 0.0
    });
    assert!(dropped, "{text}");
    assert!(a.try_wait().unwrap().is_none(), "lead-exec exited");

    // Once read again, the log resumes and says what it lost.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = std::fs::File::from(reader);
        let mut buf = [0u8; 65536];
        let mut text = Vec::new();
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&text);
            if let Some(l) = text.lines().find(|l| l.contains("log lines were dropped")) {
                let _ = tx.send(l.to_string());
            }
        }
    });
    let said = rx
        .recv_timeout(secs(15))
        .expect("no line said that log lines were dropped");
    // Written by the log's own thread, and still a line of the run.
    assert!(said.contains(r#" election="stalled" id=""#), "{said}");
    signal(a.id() as i32, libc::SIGTERM);
    let end = std::time::Instant::now() + secs(15);
    while a.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < end,
            "lead-exec did not exit on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn an_exit_is_not_held_up_by_a_log_pipe_nobody_reads() {
    // As above, but the pipe stays full to the end: the last lines are given up after a bound.
    let f = Fixture::new();
    let (reader, writer) = full_pipe();
    let started = std::time::Instant::now();
    let mut a = spawn_with_stderr(&run_args("stuck", &f.ep, &[], "exit 7"), &[], writer);
    let end = started + secs(20);
    let status = loop {
        if let Some(s) = a.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < end, "lead-exec did not exit");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(7));
    drop(reader);
}

/// A pipe of one page, filled here: (read end, write end). The first write to it blocks.
fn full_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let (reader, writer) = pipe();
    let w = writer.as_raw_fd();
    // SAFETY: fcntl and write on a descriptor we own; O_NONBLOCK is cleared again before a
    // child shares the description.
    unsafe {
        assert!(libc::fcntl(w, libc::F_SETPIPE_SZ, 4096) >= 4096);
        let flags = libc::fcntl(w, libc::F_GETFL);
        libc::fcntl(w, libc::F_SETFL, flags | libc::O_NONBLOCK);
        while libc::write(w, b"x".as_ptr().cast(), 1) == 1 {}
        libc::fcntl(w, libc::F_SETFL, flags);
    }
    (reader, writer)
}

/// The metric names an exposition text exports: every sample's name, and each family's own
/// (a histogram's samples are its `_bucket`, `_sum` and `_count`).
fn exported(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(t) => t.split(' ').next(),
            None if l.starts_with('#') => None,
            None => l.split(['{', ' ']).next(),
        })
        .filter(|n| n.starts_with("lead_exec_"))
        .map(str::to_string)
        .collect()
}

/// The `lead_exec_*` names a document mentions.
fn named(doc: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = doc;
    let word = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    while let Some(i) = rest.find("lead_exec_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !word(c)).unwrap_or(tail.len());
        // Only a name that starts a word: a test name such as `…_then_lead_exec_and_…` is none.
        if !rest[..i].ends_with(word) {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// A page without its SQL blocks: the fencing SQL names a table and a function
/// `lead_exec_fence`, which are no metrics.
fn without_sql(doc: &str) -> String {
    let mut out = String::new();
    let mut rest = doc;
    while let Some(i) = rest.find("```sql\n") {
        out.push_str(&rest[..i]);
        let block = &rest[i + 7..];
        rest = block.find("```").map_or("", |end| &block[end + 3..]);
    }
    out.push_str(rest);
    out
}

const RULES: &str = include_str!("../contrib/prometheus/lead-exec.rules.yml");
/// The pages that name metrics: the operations reference (its table and fleet queries), the
/// safety reference and the README.
const OPERATIONS: &str = include_str!("../man/lead-exec-operations.7.md");
const DOCS: [&str; 3] = [
    OPERATIONS,
    include_str!("../man/lead-exec-safety.7.md"),
    include_str!("../README.md"),
];
const RULES_TESTS: &str = include_str!("../contrib/prometheus/lead-exec.rules.test.yml");

/// lead-exec-operations(7)'s fleet queries (its `promql` block), each on one line.
fn documented_queries() -> Vec<String> {
    let block = OPERATIONS
        .split("```promql\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("lead-exec-operations(7) has a promql block");
    let mut queries = Vec::new();
    let mut query = Vec::new();
    for line in block.lines().chain([""]) {
        if line.starts_with('#') || line.trim().is_empty() {
            if !query.is_empty() {
                queries.push(query.join(" "));
                query.clear();
            }
        } else {
            query.push(line.trim());
        }
    }
    queries
}

#[test]
fn the_dashboards_panels_query_only_what_promtool_tests() {
    let dashboard: serde_json::Value = serde_json::from_str(include_str!(
        "../contrib/prometheus/lead-exec.dashboard.json"
    ))
    .expect("the dashboard is JSON");
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().expect("targets"))
        .map(|t| t["expr"].as_str().expect("expr"))
        .collect();
    assert!(exprs.len() >= 3, "{exprs:?}");
    for e in exprs {
        assert!(
            RULES_TESTS.contains(&format!("expr: '{e}'")),
            "not in lead-exec.rules.test.yml's promql_expr_test: {e}"
        );
    }
}

#[test]
fn the_documented_fleet_queries_are_the_ones_promtool_tests() {
    let queries = documented_queries();
    assert!(queries.len() >= 3, "{queries:?}");
    assert!(
        queries.contains(&"sum by (election) (lead_exec_is_leader)".to_string()),
        "leaders per election: {queries:?}"
    );
    for q in queries {
        assert!(
            RULES_TESTS.contains(&format!("expr: '{q}'")),
            "not in lead-exec.rules.test.yml's promql_expr_test: {q}"
        );
    }
}

#[test]
fn every_metric_the_alert_rules_and_docs_name_is_exported_by_leader_and_candidate() {
    let f = Fixture::new();
    let (pa, pb) = (free_port(), free_port());
    let (ma, mb) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    // With a health check, so that its gauge is exported too.
    let checked = ["--health-cmd", "true", "--health-interval", "200ms"];
    let (ea, eb) = (
        [&["--metrics-addr", &ma][..], &checked].concat(),
        [&["--metrics-addr", &mb, "--id", "b"][..], &checked].concat(),
    );
    let (ja, jb) = (job(f.dir.path(), "a"), job(f.dir.path(), "b"));
    let a = spawn(f.dir.path(), "a", &run_args("fleet", &f.ep, &ea, &ja));
    wait_int(&f.dir.path().join("a.token"), secs(10));
    let b = spawn(f.dir.path(), "b", &run_args("fleet", &f.ep, &eb, &jb));
    b.wait_log("waiting behind", secs(10));

    let in_rules = named(RULES);
    assert!(in_rules.len() >= 10, "{in_rules:?}");
    // Absent until a job has ended: a 0 would read as a job that died on its deadline.
    let after_a_job = ["lead_exec_deadline_slack_seconds".to_string()];
    // Written by --metrics-textfile, not served: those must be the textfile's.
    let textfile = |n: &str| {
        lead_exec::metrics::textfile::SERIES
            .iter()
            .any(|(s, _)| *s == n)
    };
    let missing = |text: &str, names: &std::collections::BTreeSet<String>| -> Vec<String> {
        let have = exported(text);
        names
            .difference(&have)
            .filter(|n| !after_a_job.contains(n) && !textfile(n))
            .cloned()
            .collect()
    };
    for doc in [RULES, OPERATIONS] {
        for n in named(doc)
            .iter()
            .filter(|n| n.starts_with("lead_exec_run_"))
        {
            assert!(textfile(n), "{n} is neither served nor in the textfile");
        }
    }
    let mut leader = String::new();
    let leads = wait_until(secs(5), || {
        leader = scrape(pa).unwrap_or_default();
        metric(&leader, "lead_exec_is_leader") == Some(1.0)
    });
    assert!(leads, "{leader}");
    let waiting = scrape(pb).unwrap();
    for (who, text) in [("leader", &leader), ("waiting candidate", &waiting)] {
        assert_eq!(
            missing(text, &in_rules),
            Vec::<String>::new(),
            "{who}:\n{text}"
        );
        for line in text.lines().filter(|l| l.starts_with("lead_exec_")) {
            assert!(line.contains(r#"election="fleet""#), "{who}: {line}");
        }
        assert_eq!(metric(text, "lead_exec_slots"), Some(1.0), "{who}");
    }
    assert!(
        waiting.contains(&format!(
            r#"lead_exec_info{{election="fleet",id="b",version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        )),
        "{waiting}"
    );

    // A handover: a's key goes, b takes over and a queues behind it.
    std::fs::remove_file(f.dir.path().join("b.token")).ok();
    let key = f.etcd.keys("lead-exec/elections/fleet/").remove(0);
    f.etcd.ctl(&["del", &key]);
    wait_int(&f.dir.path().join("b.token"), secs(10));
    a.wait_log("waiting behind", secs(10));
    let mut new_leader = String::new();
    let leads = wait_until(secs(5), || {
        new_leader = scrape(pb).unwrap_or_default();
        metric(&new_leader, "lead_exec_is_leader") == Some(1.0)
    });
    assert!(leads, "{new_leader}");
    let old_leader = scrape(pa).unwrap();
    for (who, text) in [("new leader", &new_leader), ("old leader", &old_leader)] {
        assert_eq!(
            missing(text, &in_rules),
            Vec::<String>::new(),
            "{who}:\n{text}"
        );
    }
    // The pages' tables and queries: every name is exported by one of them.
    let both = format!("{old_leader}\n{new_leader}");
    for doc in DOCS {
        assert_eq!(
            missing(&both, &named(&without_sql(doc))),
            Vec::<String>::new(),
            "{both}"
        );
    }
    drop((a, b));
}

#[test]
fn a_handover_is_timed_from_the_deletion_of_the_key_ahead_to_the_jobs_start() {
    let f = Fixture::new();
    let (pa, pb) = (free_port(), free_port());
    let (ma, mb) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args(
            "hand",
            &f.ep,
            &["--metrics-addr", &ma],
            &job(f.dir.path(), "a"),
        ),
    );
    wait_int(&f.dir.path().join("a.token"), secs(10));
    let text = scrape(pa).unwrap();
    assert_eq!(
        metric(&text, "lead_exec_handover_seconds_count"),
        Some(0.0),
        "nobody was ahead of the first leader:\n{text}"
    );
    let b = spawn(
        f.dir.path(),
        "b",
        &run_args(
            "hand",
            &f.ep,
            &["--metrics-addr", &mb],
            &job(f.dir.path(), "b"),
        ),
    );
    b.wait_log("waiting behind", secs(10));
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
    wait_int(&f.dir.path().join("b.token"), secs(10));
    let mut text = String::new();
    let timed = wait_until(secs(5), || {
        text = scrape(pb).unwrap_or_default();
        metric(&text, "lead_exec_handover_seconds_count") == Some(1.0)
    });
    assert!(timed, "{text}");
    let took = metric(&text, "lead_exec_handover_seconds_sum").unwrap();
    assert!(took > 0.0 && took < 5.0, "handover took {took}s:\n{text}");
    drop(b);
}

#[test]
fn a_jobs_check_refusals_are_counted_by_the_lead_exec_that_runs_it() {
    let f = Fixture::new();
    // Token 1 is never the leader's: each check is refused (exit 4).
    let body = format!(
        "echo \"$LEAD_EXEC_CHECK_REFUSALS\" > $D/file; \
         for i in 1 2 3; do {} check --token 1 2>/dev/null; echo $? >> $D/rc; done; \
         echo $FENCING_TOKEN > $D/w.token; trap 'exit 0' TERM; while :; do sleep 0.05; done",
        bin()
    );
    let (mut w, port) = metrics_worker(
        &f.etcd,
        f.dir.path(),
        &FAST,
        "chkc",
        &script(f.dir.path(), &body),
    );
    wait_int(&f.dir.path().join("w.token"), secs(10));
    assert_eq!(lines(&f.dir.path().join("rc")), ["4", "4", "4"]);
    let text = scrape(port).unwrap();
    assert_eq!(
        metric(&text, "lead_exec_check_refusals_total"),
        Some(3.0),
        "{text}"
    );
    let file = std::fs::read_to_string(f.dir.path().join("file")).unwrap();
    let file = std::path::Path::new(file.trim());
    assert!(file.is_file(), "{}", file.display());
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
    assert!(!file.exists(), "left behind: {}", file.display());
}

/// Leaving the line on a failing health check gives up the candidacy (its lease revoked, a
/// fresh campaign once healthy): a phase change like any other, so it has its log line, as
/// it does after a failed campaign's backoff.
#[test]
fn leaving_the_line_on_a_failing_health_check_logs_the_phase_change() {
    let f = Fixture::new();
    let healthy = f.dir.path().join("healthy");
    std::fs::write(&healthy, "").unwrap();
    let _a = spawn(
        f.dir.path(),
        "a",
        &run_args("hlog", &f.ep, &[], &job(f.dir.path(), "a")),
    );
    wait_int(&f.dir.path().join("a.token"), secs(10));
    let check = format!("test -e {}", healthy.display());
    let b = spawn(
        f.dir.path(),
        "b",
        &run_args(
            "hlog",
            &f.ep,
            &[
                "-v",
                "--health-cmd",
                &check,
                "--health-interval",
                "100ms",
                "--health-failures",
                "2",
            ],
            &job(f.dir.path(), "b"),
        ),
    );
    b.wait_log("waiting behind", secs(10));
    std::fs::remove_file(&healthy).unwrap();
    // Logged after the step's actions: the phase line, if any, is in the log by then.
    b.wait_log("not campaigning until the health check passes", secs(10));
    let log = b.log_text();
    assert!(
        log.contains("campaigning -> campaigning on a failing health check"),
        "no phase line for leaving the line:\n{log}"
    );
}

/// A failed campaign's phase line names what failed; the error itself has its own warning.
/// Printing the error there too would carry its whole stack backtrace (kilobytes, on one
/// line) whenever RUST_BACKTRACE is set.
#[test]
fn a_failed_campaigns_phase_line_carries_no_backtrace() {
    let mut f = Fixture::new();
    let _a = spawn(
        f.dir.path(),
        "a",
        &run_args("bt", &f.ep, &[], &job(f.dir.path(), "a")),
    );
    wait_int(&f.dir.path().join("a.token"), secs(10));
    let b = spawn_env(
        f.dir.path(),
        "b",
        &run_args(
            "bt",
            &f.ep,
            &["-v", "--command-timeout", "1s"],
            &job(f.dir.path(), "b"),
        ),
        &[("RUST_BACKTRACE", "1")],
    );
    b.wait_log("waiting behind", secs(10));
    // Refused connections fail the campaign's requests long before the lease runs out.
    f.etcd.members[0].kill();
    b.wait_log("-> backing-off on etcd failing", secs(15));
    let log = b.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("-> backing-off on"))
        .unwrap();
    assert!(
        !line.contains("backtrace") && line.len() < 400,
        "the phase line carries the error's debug form ({} bytes):\n{line}",
        line.len()
    );
}

/// Clients that send requests and never read the answers fill their connections' buffers;
/// each connection then waits on a write that never completes. Every connection slot taken
/// that way must come free again, or the endpoint is gone for as long as they stay. And the
/// rendering they cause must not hold up the lease's renewals: on the run's own runtime it
/// once did, and the term was lost at its deadline.
#[test]
fn clients_that_never_read_their_answers_do_not_lock_others_out_of_metrics() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let f = Fixture::new();
    let (mut w, port) = metrics_worker(
        &f.etcd,
        f.dir.path(),
        &FAST,
        "noread",
        &job(f.dir.path(), "w"),
    );
    wait_int(&f.dir.path().join("w.token"), secs(10));
    assert!(scrape_within(port, secs(5)).is_some());
    let requests = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(2000);
    let hogs: Vec<std::net::TcpStream> = (0..32)
        .map(|_| {
            let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let small: libc::c_int = 1024;
            // SAFETY: setsockopt on a socket we own, with a valid c_int.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&small as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
            s.set_write_timeout(Some(std::time::Duration::from_millis(200)))
                .unwrap();
            // Stops when the server stops reading: its answers have filled the buffers.
            let _ = (&s).write_all(requests.as_bytes());
            s
        })
        .collect();
    let mut got = None;
    assert!(
        wait_until(secs(60), || {
            got = scrape_within(port, secs(2));
            got.is_some()
        }),
        "no scrape answered while 32 clients did not read"
    );
    let text = got.unwrap();
    assert_eq!(
        metric(&text, "lead_exec_deadline_stops_total"),
        Some(0.0),
        "the job was stopped at the lease deadline:\n{text}"
    );
    assert_eq!(metric(&text, "lead_exec_is_leader"), Some(1.0), "{text}");
    drop(hogs);
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// Out of descriptors, the metrics endpoint cannot accept; it waits before it tries again
/// instead of spinning a core, and serves again once connections close.
#[test]
fn the_metrics_endpoint_out_of_descriptors_does_not_spin() {
    let f = Fixture::new();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let endpoints = f.etcd.endpoints();
    let body = job(f.dir.path(), "w");
    let args = run_args_with(
        &FAST,
        "nofds",
        &endpoints,
        &["--metrics-addr", &addr],
        &body,
    );
    let limited = [&["--nofile=40", "--", bin()][..], &args].concat();
    let mut w = spawn_program(
        std::path::Path::new("/usr/bin/prlimit"),
        f.dir.path(),
        "w",
        &limited,
        &[],
    );
    wait_int(&f.dir.path().join("w.token"), secs(10));
    assert!(scrape_within(port, secs(5)).is_some());
    // More connections than descriptors left: the kernel queues them, accept fails (EMFILE).
    let idle: Vec<std::net::TcpStream> = (0..60)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let start = cpu_ticks(w.pid()).expect("lead-exec running");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let used = cpu_ticks(w.pid()).expect("lead-exec running") - start;
    assert!(used <= 50, "lead-exec used {} ms of CPU in 2 s", used * 10);
    drop(idle);
    let text = scrape_within(port, secs(10)).expect("no scrape once the connections closed");
    assert_eq!(metric(&text, "lead_exec_is_leader"), Some(1.0), "{text}");
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// An etcd that stops answering shows in `lead_exec_keepalive_failures_total` while the term
/// still holds, not only after it is lost: an attempt counts as failed once it is overdue.
#[test]
fn a_stalled_etcd_shows_in_keepalive_failures_before_the_lease_is_lost() {
    let f = Fixture::new();
    let (mut w, port) = metrics_worker(
        &f.etcd,
        f.dir.path(),
        &WIDE_GRACE,
        "stall",
        &job(f.dir.path(), "w"),
    );
    wait_int(&f.dir.path().join("w.token"), secs(10));
    let failures = || {
        scrape_within(port, secs(2))
            .and_then(|t| metric(&t, "lead_exec_keepalive_failures_total"))
            .unwrap_or(-1.0)
    };
    assert_eq!(failures(), 0.0);
    f.etcd.members[0].stop();
    let mut text = String::new();
    let counted = wait_until(secs(20), || {
        text = scrape_within(port, secs(2)).unwrap_or_default();
        metric(&text, "lead_exec_keepalive_failures_total").unwrap_or(0.0) >= 1.0
    });
    let leading = metric(&text, "lead_exec_is_leader");
    f.etcd.members[0].cont();
    assert!(
        counted,
        "no keepalive failure counted during the stall:\n{text}"
    );
    // Seen before the stop at the deadline: the term was still held when it was counted.
    assert_eq!(leading, Some(1.0), "{text}");
    w.signal(libc::SIGTERM);
    w.wait(secs(20));
}

/// The refusals path in a job's environment can be stale (a job that outlived its lead-exec)
/// and lies in a shared directory: `check` writes only to a plain file with one link, never
/// through a symlink, never into a FIFO (where it would block). And lead-exec counts the file
/// it created, whatever the path has since become.
#[test]
fn a_replaced_refusals_path_is_neither_followed_nor_miscounted() {
    let f = Fixture::new();
    let check = format!("{} check --token 1 2>/dev/null", bin());
    let body = format!(
        "F=$LEAD_EXEC_CHECK_REFUSALS; echo \"$F\" > $D/file; \
         {check}; echo $? >> $D/rc; \
         printf 'keep' > $D/target; ln -s $D/target $D/link; ln $D/target $D/hard; mkfifo $D/fifo; \
         LEAD_EXEC_CHECK_REFUSALS=$D/link {check}; echo $? >> $D/rc; \
         LEAD_EXEC_CHECK_REFUSALS=$D/hard {check}; echo $? >> $D/rc; \
         LEAD_EXEC_CHECK_REFUSALS=$D/fifo timeout 10 {check}; echo $? >> $D/rc; \
         head -c 5000 /dev/zero > $D/big; rm \"$F\"; ln -s $D/big \"$F\"; \
         {check}; echo $? >> $D/rc; \
         echo $FENCING_TOKEN > $D/w.token; trap 'exit 0' TERM; while :; do sleep 0.05; done"
    );
    let (mut w, port) = metrics_worker(
        &f.etcd,
        f.dir.path(),
        &FAST,
        "chkr",
        &script(f.dir.path(), &body),
    );
    wait_int(&f.dir.path().join("w.token"), secs(20));
    // 124 would be a check blocked on the FIFO.
    assert_eq!(lines(&f.dir.path().join("rc")), ["4", "4", "4", "4", "4"]);
    assert_eq!(
        std::fs::read_to_string(f.dir.path().join("target")).unwrap(),
        "keep"
    );
    assert_eq!(
        std::fs::metadata(f.dir.path().join("big")).unwrap().len(),
        5000
    );
    let text = scrape_within(port, secs(5)).unwrap();
    assert_eq!(
        metric(&text, "lead_exec_check_refusals_total"),
        Some(1.0),
        "{text}"
    );
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// Under systemd with `RuntimeDirectory=` (as the example unit), the refusals file lives in
/// the service's own directory, which systemd removes when the service stops, even after a
/// SIGKILL left the file behind; a relative `XDG_RUNTIME_DIR` is never used.
#[test]
fn the_refusals_file_goes_in_the_services_runtime_directory() {
    let f = Fixture::new();
    let rt = f.dir.path().join("rt");
    std::fs::create_dir(&rt).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let body = "echo \"$LEAD_EXEC_CHECK_REFUSALS\" > $D/file; \
                echo $FENCING_TOKEN > $D/w.token; trap 'exit 0' TERM; while :; do sleep 0.05; done";
    let runtime = format!("{}:/run/other", rt.display());
    let mut w = spawn_env(
        f.dir.path(),
        "w",
        &run_args(
            "rtdir",
            &f.ep,
            &["--metrics-addr", &addr],
            &script(f.dir.path(), body),
        ),
        &[
            ("RUNTIME_DIRECTORY", &runtime),
            ("XDG_RUNTIME_DIR", "relative"),
        ],
    );
    wait_int(&f.dir.path().join("w.token"), secs(10));
    let file = std::fs::read_to_string(f.dir.path().join("file")).unwrap();
    let file = std::path::Path::new(file.trim());
    assert_eq!(file.parent(), Some(rt.as_path()), "{}", file.display());
    assert!(file.is_file(), "{}", file.display());
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
    assert!(!file.exists(), "left behind: {}", file.display());
}

/// A lead-exec that is killed (SIGKILL, or a signal it does not handle) leaves its refusals
/// file: the next one to make its own in the same directory removes it, and leaves a live
/// one's alone.
#[test]
fn a_killed_lead_execs_refusals_file_is_removed_by_the_next() {
    let f = Fixture::new();
    let d = f.dir.path();
    let rt = d.join("rt");
    std::fs::create_dir(&rt).unwrap();
    let files = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(&rt)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    };
    let env = [("XDG_RUNTIME_DIR", rt.to_str().unwrap())];
    let body = script(
        d,
        "echo \"$LEAD_EXEC_CHECK_REFUSALS\" > $D/$ME; exec sleep 120",
    );
    let start = |me: &str| {
        let addr = format!("127.0.0.1:{}", free_port());
        let job = body.replace("$ME", me);
        let args = run_args("sweep", &f.ep, &["--metrics-addr", &addr, "--id", me], &job);
        spawn_env(d, me, &args, &env)
    };
    let mut a = start("a");
    let a_file = std::path::PathBuf::from(wait_line(&d.join("a"), secs(10), |_| true));
    let mut b = start("b");
    b.wait_log("metrics at", secs(10));
    assert_eq!(files().len(), 2, "{:?}", files());
    a.signal(libc::SIGKILL);
    a.wait(secs(5));
    assert!(a_file.exists(), "a SIGKILL runs no exit handler");
    let mut c = start("c");
    c.wait_log("metrics at", secs(10));
    assert!(!a_file.exists(), "left behind: {}", a_file.display());
    assert_eq!(files().len(), 2, "b's and c's: {:?}", files());
    for w in [&mut b, &mut c] {
        w.signal(libc::SIGTERM);
        w.wait(secs(10));
    }
    assert_eq!(files(), Vec::<std::path::PathBuf>::new());
}

/// `GET /leader` on a `--metrics-addr` port on loopback: the status, the Content-Type and the
/// body as JSON; `None` when nothing answers there.
fn leader_check(port: u16) -> Option<(u16, String, serde_json::Value)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(secs(5))).ok()?;
    s.write_all(b"GET /leader HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_string)
        })
        .unwrap_or_default();
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {out}"));
    Some((status, content_type, json))
}

/// Polls `/leader` on `port` until it answers `status`; that answer.
fn wait_leader_check(port: u16, status: u16) -> (u16, String, serde_json::Value) {
    let mut got = None;
    let ok = wait_until(secs(10), || {
        got = leader_check(port);
        got.as_ref().is_some_and(|g| g.0 == status)
    });
    assert!(ok, "/leader on {port} never said {status}: {got:?}");
    got.unwrap()
}

/// A body's keys, in name order.
fn keys(body: &serde_json::Value) -> Vec<&str> {
    let mut k: Vec<&str> = body
        .as_object()
        .expect("an object")
        .keys()
        .map(|k| k.as_str())
        .collect();
    k.sort();
    k
}

#[test]
fn leader_check_is_200_on_the_leader_503_in_line_and_follows_a_handover() {
    let f = Fixture::new();
    let (pa, pb) = (free_port(), free_port());
    let (ma, mb) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    let before = std::time::SystemTime::now();
    let mut a = spawn(
        f.dir.path(),
        "a",
        &run_args(
            "lb",
            &f.ep,
            &["--metrics-addr", &ma, "--id", "a"],
            &job(f.dir.path(), "a"),
        ),
    );
    let ta = wait_int(&f.dir.path().join("a.token"), secs(10));
    // The job can write its token before lead-exec has taken in the watchdog's "started".
    let (_, content_type, body) = wait_leader_check(pa, 200);
    assert_eq!(content_type, "application/json");
    assert_eq!(keys(&body), ["election", "id", "since", "token"], "{body}");
    assert_eq!(body["election"], "lb", "{body}");
    assert_eq!(body["id"], "a", "{body}");
    assert_eq!(body["token"], ta, "{body}");
    // RFC 3339 in UTC, to the millisecond: lead_exec_job_start_time_seconds.
    let since = body["since"].as_str().expect("since");
    assert!(since.ends_with('Z') && since.len() == 24, "{since}");
    let started = humantime::parse_rfc3339(since).unwrap();
    assert!(started >= before - secs(1) && started <= std::time::SystemTime::now());
    let text = scrape(pa).unwrap();
    let gauge = metric(&text, "lead_exec_job_start_time_seconds").expect(&text);
    let ms = started.duration_since(std::time::UNIX_EPOCH).unwrap();
    assert_eq!(ms.as_millis() as f64, (gauge * 1000.0).round(), "{text}");
    // HEAD answers as GET without the body; other methods are 405.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", pa)).unwrap();
    let head = exchange(&mut s, "HEAD /leader HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.contains("\"token\""), "HEAD sent a body: {head}");
    let post = exchange(
        &mut s,
        "POST /leader HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    drop(s);

    let b = spawn(
        f.dir.path(),
        "b",
        &run_args(
            "lb",
            &f.ep,
            &["--metrics-addr", &mb, "--id", "b"],
            &job(f.dir.path(), "b"),
        ),
    );
    b.wait_log("waiting behind", secs(10));
    let (status, content_type, body) = leader_check(pb).expect("b answers");
    assert_eq!(status, 503, "{body}");
    assert_eq!(content_type, "application/json");
    assert_eq!(
        body,
        serde_json::json!({"election": "lb", "id": "b", "token": null, "since": null})
    );
    assert_eq!(leader_check(pa).map(|g| g.0), Some(200));

    a.signal(libc::SIGTERM);
    a.wait(secs(10));
    let tb = wait_int(&f.dir.path().join("b.token"), secs(10));
    assert!(tb > ta, "{tb} after {ta}");
    let (_, _, body) = wait_leader_check(pb, 200);
    assert_eq!(body["token"], tb, "{body}");
    assert_eq!(body["id"], "b", "{body}");
    assert!(leader_check(pa).is_none(), "a is gone, yet answers");
    drop(b);
}

/// A lost term answers 503 from the moment it is known lost, before its job is stopped: the
/// next holder may start meanwhile. The job still runs (`lead_exec_is_leader` 1), but the
/// worker holds no slot (-1); its next term answers 200 again with a larger token.
#[test]
fn leader_check_says_503_once_a_term_is_lost_while_its_job_is_still_stopping() {
    let f = Fixture::new();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let body = "echo $FENCING_TOKEN > $D/w.token; \
                trap 'touch $D/stopping; while [ ! -e $D/release ]; do sleep 0.05; done; exit 0' TERM; \
                while :; do sleep 0.05; done";
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args_with(
            &WIDE_GRACE,
            "lost",
            &f.ep,
            &["--metrics-addr", &addr],
            &script(f.dir.path(), body),
        ),
    );
    let first = wait_int(&f.dir.path().join("w.token"), secs(10));
    wait_leader_check(port, 200);
    std::fs::remove_file(f.dir.path().join("w.token")).unwrap();
    let key = f.etcd.keys("lead-exec/elections/lost/").remove(0);
    f.etcd.ctl(&["del", &key]);
    // The job has its SIGTERM and waits for the test to let it end.
    let stopping = f.dir.path().join("stopping");
    assert!(wait_until(secs(10), || stopping.exists()), "no SIGTERM");
    let (status, _, body) = leader_check(port).expect("answers");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["token"], serde_json::Value::Null, "{body}");
    let text = scrape(port).unwrap();
    assert_eq!(metric(&text, "lead_exec_is_leader"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "lead_exec_slot"), Some(-1.0), "{text}");
    std::fs::write(f.dir.path().join("release"), "").unwrap();
    let next = wait_int(&f.dir.path().join("w.token"), secs(10));
    assert!(next > first, "{next} after {first}");
    let (_, _, body) = wait_leader_check(port, 200);
    assert_eq!(body["token"], next, "{body}");
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

/// With `--slots`, each holder answers 200 with its slot, and a waiting candidate 503 with a
/// null slot.
#[test]
fn leader_check_names_the_slot_with_slots() {
    let f = Fixture::new();
    let ports = [free_port(), free_port(), free_port()];
    let mut workers = Vec::new();
    for (id, port) in ["a", "b", "c"].into_iter().zip(ports) {
        let (addr, body) = (format!("127.0.0.1:{port}"), job(f.dir.path(), id));
        let args = run_args(
            "slotted",
            &f.ep,
            &["--slots", "2", "--id", id, "--metrics-addr", &addr],
            &body,
        );
        workers.push(spawn(f.dir.path(), id, &args));
        if id != "c" {
            wait_int(&f.dir.path().join(format!("{id}.token")), secs(10));
        }
    }
    workers[2].wait_log("waiting for one of 2 slots", secs(10));
    let mut slots = Vec::new();
    for (id, port) in ["a", "b"].into_iter().zip(ports) {
        let (_, _, body) = wait_leader_check(port, 200);
        assert_eq!(keys(&body), ["election", "id", "since", "slot", "token"]);
        assert_eq!(body["id"], id, "{body}");
        slots.push(body["slot"].as_i64().expect("a slot"));
    }
    slots.sort();
    assert_eq!(slots, [0, 1]);
    let (status, _, body) = leader_check(ports[2]).expect("c answers");
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body,
        serde_json::json!({"election": "slotted", "id": "c", "slot": null, "token": null, "since": null})
    );
    for w in &workers {
        w.signal(libc::SIGTERM);
    }
    for w in &mut workers {
        w.wait(secs(10));
    }
}

/// The value of `name` for `election` in a textfile, if it has one.
fn textfile_value(text: &str, name: &str, election: &str) -> Option<f64> {
    let series = format!("{name}{{election=\"{election}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.parse().unwrap())
}

#[test]
fn a_metrics_textfile_reports_each_workers_part_in_a_run_and_its_last_attempt() {
    let f = Fixture::new();
    let (host_a, host_b) = (f.dir.path().join("a.prom"), f.dir.path().join("b.prom"));
    let job = script(
        f.dir.path(),
        "echo $LEAD_EXEC_ID >> $D/started; while [ ! -e $D/go ]; do sleep 0.05; done; \
         [ \"$LEAD_EXEC_ID\" = b ]",
    );
    let (file_a, file_b) = (host_a.display().to_string(), host_b.display().to_string());
    let tick = ["--every", "1h", "--attempts", "2", "--metrics-textfile"];
    let fa = [&tick[..], &[&file_a, "--id", "a"]].concat();
    let fb = [&tick[..], &[&file_b, "--id", "b"]].concat();
    let mut a = spawn(f.dir.path(), "a", &run_args("tf", &f.ep, &fa, &job));
    wait_line(&f.dir.path().join("started"), secs(10), |l| l == "a");
    let mut b = spawn(f.dir.path(), "b", &run_args("tf", &f.ep, &fb, &job));
    let queued = wait_until(secs(10), || {
        f.etcd.keys("lead-exec/elections/tf/").len() == 2
    });
    assert!(queued, "b never queued");
    std::fs::write(f.dir.path().join("go"), "").unwrap();
    assert_eq!(a.code(secs(20)), 1, "{}", a.log_text());
    assert_eq!(b.code(secs(20)), 0, "{}", b.log_text());
    let (ta, tb) = (
        std::fs::read_to_string(&host_a).unwrap(),
        std::fs::read_to_string(&host_b).unwrap(),
    );
    let v = |t: &str, n: &str| textfile_value(t, n, "tf");
    for t in [&ta, &tb] {
        assert_eq!(v(t, "lead_exec_run_period_seconds"), Some(3600.0), "{t}");
        assert!(
            v(t, "lead_exec_run_seen_timestamp_seconds").is_some(),
            "{t}"
        );
        assert!(t.ends_with('\n'), "{t}");
    }
    // a's attempt failed: no success; b's attempt 2 succeeded, with a larger token.
    assert_eq!(v(&ta, "lead_exec_run_last_exit_code"), Some(1.0), "{ta}");
    assert_eq!(v(&ta, "lead_exec_run_last_attempt"), Some(1.0), "{ta}");
    assert_eq!(
        v(&ta, "lead_exec_run_last_success_timestamp_seconds"),
        None,
        "{ta}"
    );
    assert_eq!(v(&tb, "lead_exec_run_last_exit_code"), Some(0.0), "{tb}");
    assert_eq!(v(&tb, "lead_exec_run_last_attempt"), Some(2.0), "{tb}");
    assert!(
        v(&tb, "lead_exec_run_last_success_timestamp_seconds").is_some(),
        "{tb}"
    );
    assert!(
        v(&tb, "lead_exec_run_last_token") > v(&ta, "lead_exec_run_last_token"),
        "{ta}{tb}"
    );
    // A run that finds the tick done keeps a's last attempt as it was, and says it took part.
    let seen = v(&ta, "lead_exec_run_seen_timestamp_seconds").unwrap();
    let (code, _, err) = run(&run_args("tf", &f.ep, &fa, &job));
    assert_eq!(code, 0, "{err}");
    let again = std::fs::read_to_string(&host_a).unwrap();
    assert!(
        v(&again, "lead_exec_run_seen_timestamp_seconds").unwrap() > seen,
        "{again}"
    );
    assert_eq!(
        v(&again, "lead_exec_run_last_token"),
        v(&ta, "lead_exec_run_last_token")
    );
}

#[test]
fn a_metrics_textfile_is_never_read_half_written() {
    let f = Fixture::new();
    let file = f.dir.path().join("runs.prom");
    let path = file.display().to_string();
    // A reader that reads the file as fast as it can while runs replace it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (file, stop) = (file.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(t) = std::fs::read_to_string(&file) {
                    assert!(t.ends_with('\n'), "a partial read: {t:?}");
                    assert!(t.starts_with("# HELP "), "a partial read: {t:?}");
                    assert!(t.contains("lead_exec_run_seen_timestamp_seconds{"), "{t:?}");
                    reads += 1;
                }
            }
            reads
        })
    };
    // Four workers at a time, for five run keys: runs end together and write the same file.
    for round in 0..5 {
        let key = format!("k{round}");
        let mut workers: Vec<Worker> = (0..4)
            .map(|i| {
                let args = run_args(
                    "atomic",
                    &f.ep,
                    &["--run-key", &key, "--metrics-textfile", &path],
                    "true",
                );
                spawn(f.dir.path(), &format!("w{round}{i}"), &args)
            })
            .collect();
        for w in &mut workers {
            assert_eq!(w.code(secs(20)), 0, "{}", w.log_text());
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().expect("no partial file was read");
    assert!(reads > 0, "the reader never saw the file");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        text.matches("# TYPE ").count(),
        text.matches("# HELP ").count()
    );
    // Nothing of the writes is left beside it but the lock.
    let left: Vec<String> = std::fs::read_dir(f.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("runs.prom") && n != "runs.prom" && n != ".runs.prom.lock")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
