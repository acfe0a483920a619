//! lead-exec keeps etcd's election layout: `etcdctl elect` sees and respects it.

use std::process::Command;

use harness::*;

fn etcdctl_cmd(ep: &str) -> Command {
    let mut c = Command::new(need("etcdctl", "etcd-client"));
    c.env("ETCDCTL_API", "3").arg(format!("--endpoints={ep}"));
    c
}

#[test]
fn etcdctl_elect_listen_shows_our_leader() {
    let f = Fixture::new();
    let s = script(f.dir.path(), "echo up > $D/up; sleep 30");
    let mut w = spawn(
        f.dir.path(),
        "w",
        &run_args("listen", &f.ep, &["--id", "settle-worker-7"], &s),
    );
    wait_line(&f.dir.path().join("up"), secs(10), |l| l == "up");
    let mut cmd = etcdctl_cmd(&f.ep);
    cmd.args(["elect", "--listen", "lead-exec/elections/listen"]);
    let listen = LineReader::start(cmd);
    listen.expect("settle-worker-7", secs(10));
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
}

#[test]
fn an_etcdctl_elect_leader_excludes_us_and_we_exclude_it() {
    let f = Fixture::new();
    // etcdctl leads first: we must not run.
    let mut cmd = etcdctl_cmd(&f.ep);
    cmd.args(["elect", "lead-exec/elections/mixed", "etcdctl-proposal"]);
    let elect = LineReader::start(cmd);
    elect.expect("etcdctl-proposal", secs(10));
    let (code, _, _) = run(&run_args("mixed", &f.ep, &["--no-wait"], "exit 0"));
    assert_eq!(code, 75);
    // etcdctl resigns on SIGINT (a SIGKILL would leave its 60 s lease behind).
    let mut elect = elect;
    signal(elect.child.id() as i32, libc::SIGINT);
    let _ = elect.child.wait();

    // Now we lead: a new etcdctl participant must wait.
    let s = script(f.dir.path(), "echo up > $D/up; sleep 30");
    let mut w = spawn(f.dir.path(), "w", &run_args("mixed", &f.ep, &[], &s));
    wait_line(&f.dir.path().join("up"), secs(30), |l| l == "up");
    let mut cmd = etcdctl_cmd(&f.ep);
    cmd.args(["elect", "lead-exec/elections/mixed", "second"]);
    let second = LineReader::start(cmd);
    assert!(wait_until(secs(10), || f
        .etcd
        .keys("lead-exec/elections/mixed/")
        .len()
        == 2));
    second.quiet_for("second", std::time::Duration::from_secs(1));
    w.signal(libc::SIGTERM);
    w.wait(secs(10));
    // Only after we resign does etcdctl win.
    second.expect("second", secs(10));
}
