//! TLS with client certificates, and user/password auth, against real etcd.

use std::time::{Duration, Instant};

use harness::tls::{ca, cert, cert_as, server_args};
use harness::*;

struct Tls {
    etcd: Etcd,
    dir: std::path::PathBuf,
}

fn tls_etcd() -> Tls {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_path_buf();
    ca(&d, "ca");
    ca(&d, "other-ca");
    cert(&d, "ca", "server", "127.0.0.1");
    cert(&d, "ca", "client", "client");
    cert(&d, "other-ca", "rogue", "client");
    let extra = server_args(&d);
    let etcd = Etcd::start_with(1, "https", &extra, Some(tmp));
    Tls { etcd, dir: d }
}

impl Tls {
    fn args(&self, cacert: &str, cert: &str) -> Vec<String> {
        let p = |f: &str| self.dir.join(f).display().to_string();
        vec![
            "--endpoints".into(),
            format!("https://{}", self.etcd.members[0].endpoint()),
            "--cacert".into(),
            p(cacert),
            "--cert".into(),
            p(&format!("{cert}.crt")),
            "--key".into(),
            p(&format!("{cert}.key")),
            "--dial-timeout".into(),
            "2s".into(),
        ]
    }
}

fn run_with(conn: &[String], tail: &[&str]) -> (i32, String, String) {
    let mut args = vec!["run", "tls"];
    args.extend(conn.iter().map(String::as_str));
    args.extend_from_slice(&FAST);
    args.push("--");
    args.extend_from_slice(tail);
    run(&args)
}

#[test]
fn tls_with_client_certificates_runs_the_job() {
    let t = tls_etcd();
    let conn = t.args("ca.crt", "client");
    // The member needs a moment: retry until it answers.
    let ok = wait_until(secs(20), || run_with(&conn, &["sh", "-c", "exit 4"]).0 == 4);
    assert!(ok, "{:?}", run_with(&conn, &["true"]));
    // Also from etcdctl's variables.
    let p = |f: &str| t.dir.join(f).display().to_string();
    let (code, _, err) = run_env(
        &[
            "run",
            "tls",
            "--endpoints",
            &format!("https://{}", t.etcd.members[0].endpoint()),
            "--",
            "sh",
            "-c",
            "exit 5",
        ],
        &[
            ("ETCDCTL_CACERT", &p("ca.crt")),
            ("ETCDCTL_CERT", &p("client.crt")),
            ("ETCDCTL_KEY", &p("client.key")),
        ],
    );
    assert_eq!(code, 5, "{err}");
}

/// TLS files that cannot work, and a scheme or port that cannot, are usage errors (64) in one
/// line naming the flag and the file, found before anything is sent; not "etcd unavailable"
/// (69), which scripts and `Restart=always` retry forever. Certificates made both ways: a v3
/// client certificate passes the check, a v1 one (the TLS library refuses it) does not.
#[test]
fn tls_files_that_cannot_work_are_refused_with_64_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ca(d, "ca");
    cert(d, "ca", "v3", "client");
    cert_as(d, "ca", "v1", "v1", false);
    let p = |f: &str| d.join(f).display().to_string();
    std::fs::write(d.join("junk.txt"), "not PEM").unwrap();
    let https = "https://127.0.0.1:1";
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec![
                "--cacert".into(),
                p("ca.crt"),
                "--cert".into(),
                p("v1.crt"),
                "--key".into(),
                p("v1.key"),
            ],
            format!("--cert {}: an X.509 v1 certificate", p("v1.crt")),
        ),
        (
            vec!["--cacert".into(), p("ca.key")],
            format!(
                "--cacert {}: holds a private key, not the CA's certificate",
                p("ca.key")
            ),
        ),
        (
            vec!["--cacert".into(), p("junk.txt")],
            format!("--cacert {}: no PEM CERTIFICATE in it", p("junk.txt")),
        ),
        (
            vec![
                "--cacert".into(),
                p("ca.crt"),
                "--cert".into(),
                p("v3.key"),
                "--key".into(),
                p("v3.crt"),
            ],
            format!(
                "--cert {}: holds a private key, not a certificate (are --cert and --key swapped?)",
                p("v3.key")
            ),
        ),
        (
            vec![
                "--cacert".into(),
                p("ca.crt"),
                "--cert".into(),
                p("v3.crt"),
                "--key".into(),
                p("v3.crt"),
            ],
            format!(
                "--key {}: holds a certificate, not a private key",
                p("v3.crt")
            ),
        ),
    ];
    for (files, want) in &cases {
        let mut args = vec![
            "status".to_string(),
            "x".into(),
            "--endpoints".into(),
            https.into(),
        ];
        args.extend(files.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = run(&args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want.as_str()), "want {want:?}, got {err}");
    }
    // The v3 certificate passes the check: what fails then is the connection (nobody there).
    let (code, _, err) = run(&[
        "status",
        "x",
        "--endpoints",
        https,
        "--dial-timeout",
        "200ms",
        "--cacert",
        &p("ca.crt"),
        "--cert",
        &p("v3.crt"),
        "--key",
        &p("v3.key"),
    ]);
    assert_eq!(code, 69, "{err}");
    for (endpoints, want) in [
        (
            "http://127.0.0.1:1",
            "is plain http://, but --cacert and --cert are for TLS",
        ),
        (
            "127.0.0.1:70000",
            "the port must be a number from 1 to 65535",
        ),
    ] {
        let (code, _, err) = run(&[
            "status",
            "x",
            "--endpoints",
            endpoints,
            "--cacert",
            &p("ca.crt"),
        ]);
        assert_eq!(code, 64, "{endpoints}: {err}");
        assert!(err.contains(want), "{endpoints}: {err}");
    }
}

#[test]
fn wrong_ca_or_wrong_certificate_is_a_clear_error_not_a_hang() {
    let t = tls_etcd();
    let good = t.args("ca.crt", "client");
    assert!(wait_until(secs(20), || run_with(&good, &["true"]).0 == 0));
    for (conn, what) in [
        (t.args("other-ca.crt", "client"), "wrong CA"),
        (t.args("ca.crt", "rogue"), "wrong client certificate"),
    ] {
        let start = Instant::now();
        let (code, _, err) = run_with(&conn, &["true"]);
        eprintln!("{what}: exit {code}: {err}");
        assert!(
            start.elapsed() < secs(10),
            "{what}: took {:?}",
            start.elapsed()
        );
        assert!(code == 69 || code == 77, "{what}: exit {code}: {err}");
        assert_eq!(err.lines().count(), 1, "{what}: {err}");
        assert!(err.starts_with("lead-exec: "), "{what}: {err}");
    }
}

fn auth_etcd() -> Etcd {
    let mut etcd = Etcd::start();
    etcd.ctl(&["user", "add", "root", "--new-user-password=s3cret-root"]);
    etcd.ctl(&["user", "add", "worker", "--new-user-password=s3cret-worker"]);
    etcd.ctl(&["role", "add", "worker"]);
    etcd.ctl(&[
        "role",
        "grant-permission",
        "worker",
        "--prefix=true",
        "readwrite",
        "lead-exec/",
    ]);
    etcd.ctl(&["user", "grant-role", "worker", "worker"]);
    etcd.ctl(&["auth", "enable"]);
    etcd.ctl_args = vec!["--user=root:s3cret-root".into()];
    etcd
}

#[test]
fn user_auth_takes_the_password_from_env_or_file_and_never_logs_it() {
    let f = Fixture::with(auth_etcd());
    let mut args = run_args("authd", &f.ep, &["--user", "worker", "-vv"], "exit 6");
    let (code, _, err) = run_env(&args, &[("LEAD_EXEC_PASSWORD", "s3cret-worker")]);
    assert_eq!(code, 6, "{err}");
    assert!(!err.contains("s3cret"), "password in the log:\n{err}");

    let pw = f.dir.path().join("pw");
    std::fs::write(&pw, "s3cret-worker\n").unwrap();
    let pw = pw.display().to_string();
    args.splice(2..2, ["--password-file", pw.as_str()]);
    let (code, _, err) = run(&args);
    assert_eq!(code, 6, "{err}");
    assert!(!err.contains("s3cret"));
}

/// A worker that etcd lets write its keys but not read the whole of `lead-exec/` is refused by
/// the start-up probe (77) after its creating transaction, sent beside the lease's grant, has
/// put it in line: it revokes that lease on its way out, so no key of it stands in line. Every
/// commit is slowed, so that the refusal (a read) comes back before the grant (a commit).
#[test]
fn a_worker_refused_at_start_leaves_no_key_in_line() {
    let mut etcd = Etcd::slow_commits(Duration::from_millis(200));
    etcd.ctl(&["user", "add", "root", "--new-user-password=s3cret-root"]);
    etcd.ctl(&["user", "add", "narrow", "--new-user-password=s3cret-narrow"]);
    etcd.ctl(&["role", "add", "narrow"]);
    for prefix in ["lead-exec/elections/", "lead-exec/meta/"] {
        let grant = ["role", "grant-permission", "narrow", "--prefix=true"];
        etcd.ctl(&[&grant[..], &["readwrite", prefix]].concat());
    }
    etcd.ctl(&["user", "grant-role", "narrow", "narrow"]);
    etcd.ctl(&["auth", "enable"]);
    etcd.ctl_args = vec!["--user=root:s3cret-root".into()];
    let f = Fixture::with(etcd);
    for _ in 0..2 {
        let (code, _, err) = run_env(
            &run_args("narrow", &f.ep, &["--user", "narrow"], "exit 0"),
            &[("LEAD_EXEC_PASSWORD", "s3cret-narrow")],
        );
        assert_eq!(code, 77, "{err}");
        let keys = f.etcd.keys("lead-exec/elections/narrow/");
        assert!(keys.is_empty(), "left in line: {keys:?}");
    }
}

#[test]
fn wrong_credentials_exit_77_in_one_line() {
    let f = Fixture::with(auth_etcd());
    let start = Instant::now();
    let (code, _, err) = run_env(
        &run_args("authd", &f.ep, &["--user", "worker"], "exit 0"),
        &[("LEAD_EXEC_PASSWORD", "wrong")],
    );
    assert_eq!(code, 77, "{err}");
    assert!(start.elapsed() < secs(10));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("authentication failed"), "{err}");
    assert!(!err.contains("unavailable"), "{err}");
    assert!(!err.contains("wrong"), "{err}");
    // No credentials at all against an auth-enabled cluster.
    let (code, _, err) = run(&run_args("authd", &f.ep, &[], "exit 0"));
    assert!(code == 77 || code == 69, "{code}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
