//! Metrics, structured logs, systemd notifications and completions.

use std::os::unix::net::UnixDatagram;

use harness::*;

fn job(dir: &std::path::Path, who: &str) -> String {
    script(
        dir,
        &format!("echo $FENCING_TOKEN > $D/{who}.token; trap 'exit 0' TERM; while :; do sleep 0.05; done"),
    )
}

#[test]
fn metrics_follow_a_failover() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let ep = etcd.endpoints();
    let (pa, pb) = (free_port(), free_port());
    let (ma, mb) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    let mut a = spawn(
        dir.path(),
        "a",
        &run_args("met", &ep, &["--metrics-addr", &ma], &job(dir.path(), "a")),
    );
    let ta = wait_int(&dir.path().join("a.token"), secs(10));
    let b = spawn(
        dir.path(),
        "b",
        &run_args("met", &ep, &["--metrics-addr", &mb], &job(dir.path(), "b")),
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
    let tb = wait_int(&dir.path().join("b.token"), secs(10));
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
fn metrics_count_losses_and_job_exits_by_reason() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = spawn(
        dir.path(),
        "w",
        &run_args(
            "loss",
            &etcd.endpoints(),
            &["--metrics-addr", &addr],
            &job(dir.path(), "w"),
        ),
    );
    wait_int(&dir.path().join("w.token"), secs(10));
    let key = etcd.keys("lead-exec/elections/loss/").remove(0);
    std::fs::remove_file(dir.path().join("w.token")).unwrap();
    etcd.ctl(&["del", &key]);
    wait_int(&dir.path().join("w.token"), secs(10));
    let text = scrape(port).unwrap();
    assert!(
        text.contains(r#"lead_exec_leadership_lost_total{reason="leader key deleted"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"lead_exec_job_exits_total{code="0"} 1"#),
        "{text}"
    );
    assert!(metric(&text, "lead_exec_deadline_slack_seconds").unwrap() > 0.0);
    drop(w);
}

#[test]
fn json_logs_have_one_object_per_line_with_election_id_and_token() {
    let etcd = Etcd::start();
    let (code, _, err) = run(&run_args(
        "logs",
        &etcd.endpoints(),
        &["--log-format", "json", "--id", "w-json"],
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

#[test]
fn quiet_hides_info_and_verbose_shows_debug() {
    let etcd = Etcd::start();
    let (_, _, quiet) = run(&run_args("lv", &etcd.endpoints(), &["-q"], "exit 0"));
    assert!(quiet.is_empty(), "{quiet}");
    let (_, _, loud) = run(&run_args("lv", &etcd.endpoints(), &["-v"], "exit 0"));
    assert!(loud.contains("DEBUG"), "{loud}");
}

#[test]
fn systemd_notify_gets_ready_and_status() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(secs(10))).unwrap();
    let w = spawn_env(
        dir.path(),
        "w",
        &run_args("sd", &etcd.endpoints(), &[], &job(dir.path(), "w")),
        &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())],
    );
    let token = wait_int(&dir.path().join("w.token"), secs(10));
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

#[test]
fn metrics_addr_takes_a_host_name_and_a_taken_port_is_64_with_the_address() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let ep = etcd.endpoints();
    let port = free_port();
    let addr = format!("localhost:{port}");
    let w = spawn(
        dir.path(),
        "named",
        &run_args(
            "metname",
            &ep,
            &["--metrics-addr", &addr],
            &job(dir.path(), "a"),
        ),
    );
    wait_int(&dir.path().join("a.token"), secs(10));
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
        &ep,
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
    let etcd = Etcd::start();
    let ep = etcd.endpoints();
    type Case<'a> = (Vec<&'a str>, &'a [(&'a str, &'a str)], i64);
    let cases: Vec<Case> = vec![
        // Refused by the configuration check.
        (
            run_args(
                "fj",
                &ep,
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
        (
            run_args("fj", &ep, &["--log-format=json"], "exit 0")
                .into_iter()
                .map(|a| if a == "sh" { "no-such-command-xyz" } else { a })
                .collect(),
            &[],
            127,
        ),
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
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut w = spawn(
        dir.path(),
        "w",
        &run_args(
            "http",
            &etcd.endpoints(),
            &["--metrics-addr", &addr],
            &job(dir.path(), "w"),
        ),
    );
    wait_int(&dir.path().join("w.token"), secs(10));
    assert!(wait_until(secs(5), || {
        scrape(port).and_then(|t| metric(&t, "lead_exec_is_leader")) == Some(1.0)
    }));
    // A client that connects and never sends a request must not hold up anyone else.
    let _slow = std::net::TcpStream::connect(&addr).unwrap();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
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
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

#[test]
fn metrics_raise_no_false_alarm_for_a_new_leader_without_checks_or_a_waiting_candidate() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let ep = etcd.endpoints();
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
        dir.path(),
        "a",
        &run_args_with(
            &lease,
            "mfa",
            &ep,
            &["--metrics-addr", &ma],
            &job(dir.path(), "a"),
        ),
    );
    wait_int(&dir.path().join("a.token"), secs(10));
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
        dir.path(),
        "b",
        &run_args_with(
            &lease,
            "mfa",
            &ep,
            &["--metrics-addr", &mb],
            &job(dir.path(), "b"),
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
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let ep = etcd.endpoints();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut a = spawn(
        dir.path(),
        "a",
        &run_args(
            "mhc",
            &ep,
            &[
                "--metrics-addr",
                &addr,
                "--health-cmd",
                "true",
                "--health-interval",
                "200ms",
            ],
            &job(dir.path(), "a"),
        ),
    );
    wait_int(&dir.path().join("a.token"), secs(10));
    let text = scrape(port).unwrap();
    assert_eq!(metric(&text, "lead_exec_healthy"), Some(1.0), "{text}");
    a.signal(libc::SIGTERM);
    a.wait(secs(10));
}
