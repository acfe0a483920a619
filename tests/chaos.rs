//! Safety and liveness under faults: one named test per fault, each checked mechanically
//! over the jobs' event log and the fenced ledger (see `harness::chaos::check`).

use std::time::Duration;

use harness::chaos::{soak, Cluster, ProxyMode as Mode};
use harness::*;

const TTL: Duration = Duration::from_secs(3);

fn done(mut c: Cluster) -> harness::chaos::Report {
    let r = c.finish();
    r.assert_ok(&c.logs());
    assert!(r.accepted > 0, "no write reached the ledger");
    r
}

#[test]
fn leader_sigkilled() {
    let mut c = Cluster::start(3, TTL);
    let (i, t) = c.wait_leader();
    let m = c.mark("leader SIGKILLed");
    c.kill(i);
    let (j, t2) = c.wait_term_after(t, TTL + secs(10));
    c.heal(m);
    assert_ne!(i, j);
    assert!(t2 > t);
    c.start_worker(i);
    done(c);
}

#[test]
fn leader_frozen_past_the_ttl_then_continued() {
    let mut c = Cluster::start(3, TTL);
    let (i, t) = c.wait_leader();
    let pid = c.workers[i].pid().unwrap();
    let m = c.mark("leader's lead-exec frozen");
    signal(pid, libc::SIGSTOP);
    let (j, _) = c.wait_term_after(t, TTL + secs(10));
    assert_ne!(i, j);
    signal(pid, libc::SIGCONT);
    c.heal(m);
    // The old leader noticed, reaped, and queues again.
    let log = c.workers[i].log_text();
    assert!(
        wait_until(secs(10), || c.workers[i]
            .log_text()
            .contains("waiting behind")),
        "{log}"
    );
    done(c);
}

#[test]
fn whole_worker_frozen_then_its_stale_writes_are_rejected() {
    let mut c = Cluster::start(3, TTL);
    let (i, t) = c.wait_leader();
    let m = c.mark("whole worker frozen");
    c.marks[m].deposed_worker = Some(c.workers[i].name.clone());
    c.freeze(i, true);
    let (_, t2) = c.wait_term_after(t, TTL + secs(10));
    // The zombie may have been frozen inside a ledger transaction, holding SQLite's write
    // lock: the new term's first write then waits for the thaw. Wake it a moment after the
    // new term started, then see the new term write.
    std::thread::sleep(std::time::Duration::from_millis(300));
    c.freeze(i, false);
    c.heal(m);
    let db = c.db.clone();
    let wrote = || harness::chaos::read_ledger(&db).0.iter().any(|w| w.0 == t2);
    assert!(wait_until(secs(10), wrote), "the new term never wrote");
    // Whether or not the zombie got a write in before its watchdog killed it, any write that
    // carries its token is refused now.
    let late = std::process::Command::new(harness::chaos::ledger_bin())
        .args([
            "--db",
            db.to_str().unwrap(),
            "write",
            "--token",
            &t.to_string(),
        ])
        .args(["--worker", "zombie", "--note", "late write"])
        .output()
        .unwrap();
    assert_eq!(
        late.status.code(),
        Some(3),
        "a stale write was not rejected"
    );
    let r = done(c);
    assert!(r.rejected >= 1);
    // Whatever the zombie managed to write after waking was refused by the fence.
    eprintln!(
        "frozen overlaps: {}, rejected writes: {}",
        r.fenced_overlaps, r.rejected
    );
}

#[test]
fn blackhole_between_the_leader_and_etcd() {
    let mut c = Cluster::start(3, TTL);
    let (i, t) = c.wait_leader();
    let m = c.mark("blackhole leader");
    c.workers[i].set(Mode::Blackhole);
    let (j, _) = c.wait_term_after(t, TTL + secs(10));
    assert_ne!(i, j);
    c.workers[i].set(Mode::Pass);
    c.heal(m);
    done(c);
}

#[test]
fn latency_under_the_budget_does_not_flap() {
    let mut c = Cluster::start(3, TTL);
    let (_, t) = c.wait_leader();
    let m = c.mark("100 ms latency");
    for w in &c.workers {
        w.set(Mode::Delay(100));
    }
    // Several keepalive intervals (TTL/3) under latency.
    std::thread::sleep(2 * TTL);
    for w in &c.workers {
        w.set(Mode::Pass);
    }
    c.heal(m);
    assert_eq!(
        c.last_token(),
        t,
        "leadership moved under tolerable latency:\n{}",
        c.logs()
    );
    done(c);
}

#[test]
fn latency_over_the_budget_fails_closed() {
    let mut c = Cluster::start(3, TTL);
    let (i, t) = c.wait_leader();
    let m = c.mark("3 s latency on the leader");
    c.workers[i].set(Mode::Delay(3000));
    let (j, _) = c.wait_term_after(t, TTL + secs(15));
    assert_ne!(i, j);
    c.workers[i].set(Mode::Pass);
    c.heal(m);
    done(c);
}

#[test]
fn connection_resets() {
    let mut c = Cluster::start(3, TTL);
    let (i, _) = c.wait_leader();
    let m = c.mark("connection resets");
    for _ in 0..5 {
        c.workers[i].set(Mode::Reset);
        std::thread::sleep(Duration::from_millis(200));
        c.workers[i].set(Mode::Pass);
        std::thread::sleep(Duration::from_millis(300));
    }
    c.heal(m);
    done(c);
}

#[test]
fn killing_etcds_raft_leader_does_not_restart_the_job() {
    // A longer TTL: a raft election must fit inside the renewal budget.
    let ttl = secs(6);
    let mut c = Cluster::start(3, ttl);
    let (_, t) = c.wait_leader();
    let r = c.raft_leader();
    let m = c.mark("etcd raft leader killed");
    c.etcd.members[r].kill();
    std::thread::sleep(ttl + secs(1));
    assert_eq!(c.last_token(), t, "the job restarted:\n{}", c.logs());
    c.etcd.members[r].restart();
    c.heal(m);
    done(c);
}

#[test]
fn quorum_loss_fails_closed_and_elects_nobody_until_it_returns() {
    let mut c = Cluster::start(3, TTL);
    let (_, t) = c.wait_leader();
    let m = c.mark("quorum lost (2 of 3 stopped)");
    c.etcd.members[0].stop();
    c.etcd.members[1].stop();
    let job = c.events().into_iter().rfind(|e| e.kind == "start").unwrap();
    assert!(
        wait_until(TTL + secs(2), || !alive(job.pid)),
        "the job outlived its lease"
    );
    // Well past the TTL without a quorum: nobody may start.
    std::thread::sleep(TTL);
    assert_eq!(c.last_token(), t, "a term started without a quorum");
    c.etcd.members[0].cont();
    c.etcd.members[1].cont();
    // The quorum is back once the members have elected a leader and commit again, which a
    // loaded machine can take seconds for after SIGCONT: liveness counts from there.
    c.etcd.wait_healthy(secs(30));
    c.heal(m);
    let (_, t2) = c.wait_term_after(t, TTL + secs(10));
    assert!(t2 > t);
    done(c);
}

#[test]
fn full_etcd_restart() {
    let mut c = Cluster::start(3, TTL);
    let (_, t) = c.wait_leader();
    let m = c.mark("full etcd restart");
    for mem in &mut c.etcd.members {
        mem.kill();
    }
    let job = c.events().into_iter().rfind(|e| e.kind == "start").unwrap();
    assert!(
        wait_until(TTL + secs(2), || !alive(job.pid)),
        "the job outlived its lease"
    );
    for mem in &mut c.etcd.members {
        mem.restart();
    }
    c.heal(m);
    let (_, t2) = c.wait_term_after(t, TTL + secs(15));
    assert!(t2 > t);
    done(c);
}

#[test]
fn operator_deletes_the_key_or_revokes_the_lease() {
    let mut c = Cluster::start(3, TTL);
    let (i, t) = c.wait_leader();
    let m = c.mark("leader key deleted");
    c.marks[m].deposed_worker = Some(c.workers[i].name.clone());
    let key = c.etcd.keys("lead-exec/elections/chaos/").remove(0);
    c.etcd.ctl(&["del", &key]);
    let (_, t2) = c.wait_term_after(t, secs(10));
    c.heal(m);
    let m = c.mark("leader lease revoked");
    let (j, _) = c.current(secs(10));
    c.marks[m].deposed_worker = Some(c.workers[j].name.clone());
    let key = c.etcd.keys("lead-exec/elections/chaos/").remove(0);
    let lease = key.rsplit('/').next().unwrap().to_string();
    c.etcd.ctl(&["lease", "revoke", &lease]);
    let (_, t3) = c.wait_term_after(t2, secs(10));
    c.heal(m);
    assert!(t3 > t2 && t2 > t);
    done(c);
}

#[test]
fn a_queued_candidates_lease_expires() {
    let mut c = Cluster::start(2, TTL);
    let (i, t) = c.wait_leader();
    let q = 1 - i;
    let queued = wait_until(secs(10), || {
        c.workers[q].log_text().contains("waiting behind")
    });
    assert!(queued, "w{q} never queued\n{}", c.logs());
    let qpid = c.workers[q].pid().unwrap();
    let m = c.mark("queued candidate frozen past its TTL");
    let before = c.etcd.keys("lead-exec/elections/chaos/");
    signal(qpid, libc::SIGSTOP);
    let expired = wait_until(TTL + secs(5), || {
        c.etcd.keys("lead-exec/elections/chaos/").len() < before.len()
    });
    assert!(
        expired,
        "the frozen candidate's key outlived its TTL: {before:?}"
    );
    c.kill(i);
    signal(qpid, libc::SIGCONT);
    let (j, t2) = c.wait_term_after(t, TTL + secs(10));
    assert_eq!(j, q, "{}", c.logs());
    assert!(t2 > t);
    // It runs on a fresh key, not on the one that expired.
    let now = c.etcd.keys("lead-exec/elections/chaos/");
    assert!(
        now.iter().all(|k| !before.contains(k)),
        "{before:?} {now:?}"
    );
    c.heal(m);
    c.start_worker(i);
    done(c);
}

#[test]
fn compaction_past_a_watchers_revision() {
    let mut c = Cluster::start(2, TTL);
    let (i, t) = c.wait_leader();
    let q = 1 - i;
    assert!(wait_until(secs(10), || c.workers[q]
        .log_text()
        .contains("waiting behind")));
    let m = c.mark("watcher cut off while the store compacts");
    c.workers[q].set(Mode::Reset);
    for k in 0..20 {
        c.etcd.ctl(&["put", "lead-exec-test/churn", &k.to_string()]);
    }
    let rev: i64 = {
        let out = c.etcd.ctl(&["get", "lead-exec-test/churn", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["header"]["revision"].as_i64().unwrap()
    };
    c.etcd.ctl(&["compact", &rev.to_string()]);
    c.workers[q].set(Mode::Pass);
    let pid = c.workers[i].pid().unwrap();
    signal(pid, libc::SIGTERM);
    let (j, _) = c.wait_term_after(t, TTL + secs(10));
    assert_eq!(j, q);
    c.heal(m);
    done(c);
}

/// A short seeded soak of mixed faults; `cargo run --release -p lead-exec-harness --bin chaos`
/// runs long ones.
#[test]
fn short_seeded_soak() {
    let report = soak(3, 1, 6, 7, TTL, |line| eprintln!("{line}"));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert!(report.faults_injected >= 6);
}

/// Asserts that the term that ran at token `t` is still the only one since, and that no
/// worker exited, after watching for `window`.
fn assert_term_kept(c: &mut Cluster, t: i64, window: Duration, what: &str) {
    // The property is that nothing happens: there is no event to wait for, only a window.
    std::thread::sleep(window);
    let after = c.terms_after(t);
    assert!(
        after.is_empty(),
        "{what}: the job restarted {} time(s): {after:?}\n{}",
        after.len(),
        c.logs()
    );
    let exited = c.exited();
    assert!(
        exited.is_empty(),
        "{what}: workers exited: {exited:?}\n{}",
        c.logs()
    );
}

#[test]
fn one_member_down_for_the_whole_test_costs_nothing() {
    let mut c = Cluster::start(3, TTL);
    // The first endpoint of every worker's list: the one each of them starts on.
    c.etcd.members[0].kill();
    let m = c.mark("etcd member 0 down");
    let (_, t) = c.wait_leader();
    assert_term_kept(&mut c, t, 3 * TTL, "one member down");
    // Every operator command fails over too.
    let dead_first = format!(
        "{},{},{}",
        c.etcd.members[0].endpoint(),
        c.etcd.members[1].endpoint(),
        c.etcd.members[2].endpoint()
    );
    for args in [["status", "chaos"], ["history", "chaos"]] {
        for _ in 0..3 {
            let out = std::process::Command::new(bin())
                .args(args)
                .args(["--endpoints", &dead_first])
                .output()
                .unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{args:?} with a dead endpoint first: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    c.etcd.members[0].restart();
    c.heal(m);
    done(c);
}

#[test]
fn rolling_restart_keeps_the_term() {
    // The routine upgrade, with the default lease settings.
    let mut c = Cluster::start_defaults(3);
    let (_, t) = c.wait_leader();
    let m = c.mark("rolling restart");
    for k in 0..3 {
        c.restart_member(k);
    }
    c.heal(m);
    assert_term_kept(&mut c, t, secs(1), "rolling restart");
    done(c);
}

#[test]
fn raft_leader_killed_keeps_the_term() {
    let mut c = Cluster::start(3, TTL);
    let (_, t) = c.wait_leader();
    let r = c.raft_leader();
    let m = c.mark("raft leader killed");
    c.etcd.members[r].kill();
    let others: Vec<usize> = (0..3).filter(|&k| k != r).collect();
    let elected = wait_until(secs(20), || others.iter().all(|&k| c.member_healthy(k)));
    assert!(elected, "no new raft leader");
    // The dead member stays in every worker's endpoint list.
    assert_term_kept(&mut c, t, 2 * TTL, "raft leader killed");
    c.restart_member(r);
    c.heal(m);
    done(c);
}

#[test]
fn a_lost_keepalive_reply_keeps_the_term() {
    let mut c = Cluster::start(3, TTL);
    let (i, t) = c.wait_leader();
    let m = c.mark("keepalive replies held on one endpoint");
    // Longer than the keepalive interval (TTL/3): at least one renewal's answer is held back
    // on the endpoint the leader uses, and arrives only after it was given up.
    c.workers[i].proxies[0].set(Mode::HoldReplies);
    std::thread::sleep(TTL / 2);
    c.workers[i].proxies[0].set(Mode::Pass);
    c.heal(m);
    assert_term_kept(&mut c, t, 2 * TTL, "a lost keepalive reply");
    done(c);
}

#[test]
fn one_blackholed_endpoint_keeps_the_term() {
    let mut c = Cluster::start(3, TTL);
    let (_, t) = c.wait_leader();
    let m = c.mark("endpoint 0 blackholed for every worker");
    for w in &c.workers {
        w.proxies[0].set(Mode::Blackhole);
    }
    let kept = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_term_kept(&mut c, t, 3 * TTL, "one blackholed endpoint")
    }));
    for w in &c.workers {
        w.proxies[0].set(Mode::Pass);
    }
    c.heal(m);
    if let Err(e) = kept {
        std::panic::resume_unwind(e);
    }
    done(c);
}

/// Faults on one endpoint after another. Replies are held on endpoints 0 and 1; each
/// worker's keepalive overdue on 0 moves its pin to 1, and 0 then answers again, late: the
/// answer must not bring back a stream to 0 while the pin (and every watch) is on 1. Then
/// endpoint 1 is blackholed. Keepalives and watches follow the pin together, so the term is
/// kept, and when the leader dies a waiter, whose watch had to leave the blackholed endpoint,
/// takes over within the liveness bound (TTL + 2 s) instead of when an HTTP/2 ping times out.
#[test]
fn faults_on_one_endpoint_after_another_keep_the_term_and_the_takeover_bound() {
    let mut c = Cluster::start(3, TTL);
    let (i, t) = c.wait_leader();
    let m = c.mark(
        "replies held on endpoints 0 and 1, then endpoint 1 blackholed, then the leader killed",
    );
    for w in &c.workers {
        w.proxies[0].set(Mode::HoldReplies);
        w.proxies[1].set(Mode::HoldReplies);
    }
    // Each worker's endpoint 0 answers again as soon as that worker has left it, while its
    // first try on endpoint 1 still waits.
    let mut released = vec![false; c.workers.len()];
    let all = wait_until(secs(20), || {
        for (k, w) in c.workers.iter().enumerate() {
            let from = format!("from=http://{}/", w.proxies[0].endpoint());
            if !released[k] && w.log_text().contains(&from) {
                w.proxies[0].set(Mode::Pass);
                released[k] = true;
            }
        }
        released.iter().all(|r| *r)
    });
    assert!(
        all,
        "not every worker left endpoint 0: {released:?}\n{}",
        c.logs()
    );
    for w in &c.workers {
        w.proxies[1].set(Mode::Pass);
    }
    for w in &c.workers {
        w.proxies[1].set(Mode::Blackhole);
    }
    let kept = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_term_kept(&mut c, t, 2 * TTL, "endpoint 0 then endpoint 1")
    }));
    if let Err(e) = kept {
        for w in &c.workers {
            w.proxies[1].set(Mode::Pass);
        }
        std::panic::resume_unwind(e);
    }
    let killed = std::time::Instant::now();
    c.kill(i);
    let (j, _) = c.wait_term_after(t, TTL + secs(20));
    let takeover = killed.elapsed();
    eprintln!("takeover {takeover:?} after the leader was killed (TTL {TTL:?})");
    for w in &c.workers {
        w.proxies[1].set(Mode::Pass);
    }
    c.heal(m);
    assert_ne!(i, j);
    assert!(
        takeover <= TTL + secs(2),
        "takeover took {takeover:?}, over TTL + 2 s\n{}",
        c.logs()
    );
    c.start_worker(i);
    done(c);
}

/// Real partitions (network namespaces, nftables drops with no RST): a leader cut off from
/// every etcd member stops its job before its lease can expire on the server, and another
/// worker takes over only after that.
#[test]
fn partition_leader_cut_off_from_every_member_stops_before_its_lease_expires() {
    use harness::chaos::mono_ns;
    use harness::netns::Testbed;
    let ttl = secs(4);
    let lease = ["--grace", "500ms", "--safety-margin", "500ms"].map(String::from);
    let mut tb = Testbed::start(3, 2, ttl, lease.to_vec());
    let (i, t) = tb
        .wait_term_after(0, secs(30))
        .unwrap_or_else(|| panic!("no first term\n{}", tb.logs()));
    let job = tb
        .events()
        .into_iter()
        .find(|e| e.kind == "start" && e.token == t)
        .unwrap()
        .pid;
    let cut_at = mono_ns();
    let w = tb.workers[i].node.name.clone();
    let members: Vec<String> = tb.members.iter().map(|m| m.node.name.clone()).collect();
    for m in &members {
        tb.cut(&w, m);
    }
    let died = wait_until(ttl + secs(5), || tb.deaths().contains_key(&job));
    assert!(died, "the cut-off leader's job still runs\n{}", tb.logs());
    let died_at = tb.deaths()[&job];
    let (j, t2) = tb
        .wait_term_after(t, ttl + secs(20))
        .unwrap_or_else(|| panic!("no takeover\n{}", tb.logs()));
    assert_ne!(j, i, "the takeover must be on the other worker");
    let started = tb
        .events()
        .into_iter()
        .find(|e| e.kind == "start" && e.token == t2)
        .unwrap()
        .ns;
    assert!(
        died_at - cut_at < ttl.as_nanos() as i64,
        "the job ran {} ms after the cut, TTL {ttl:?}",
        (died_at - cut_at) / 1_000_000
    );
    assert!(
        started > died_at,
        "the new term started before the old job died"
    );
    tb.heal_all();
    let (_, r) = tb.finish();
    r.assert_ok(&tb.logs());
}

/// A testbed left behind by a dead owner (a crashed run) is removed by the next one's sweep;
/// a live owner's is not.
#[test]
fn partition_testbed_sweeps_a_dead_owners_namespaces() {
    use harness::netns::net;
    net::require().unwrap_or_else(|e| panic!("{e}"));
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let left = format!("{}{dead}-0-w0", net::PREFIX);
    let live = format!("{}{}-999-w0", net::PREFIX, std::process::id());
    net::must(&["ip", "netns", "add", &left]);
    net::must(&["ip", "netns", "add", &live]);
    net::sweep();
    let names = net::ours();
    net::remove(&live);
    assert!(!names.contains(&left), "{names:?}");
    assert!(names.contains(&live), "{names:?}");
}

/// Real partitions: a standby pinned to the etcd leader member when that member is cut off
/// from the other two (clients still reach it), and the leader's job ends at that moment.
/// The isolated member keeps answering the standby's keepalives for a while (it renews
/// leases locally until it steps down) and its watch of the leader's key stays silent; the
/// standby must still move to the majority and take over within TTL + 2 s of the job's death.
#[test]
fn partition_standby_pinned_to_a_cut_off_etcd_leader_takes_over_in_time() {
    use harness::netns::Testbed;
    let ttl = secs(4);
    let lease = ["--grace", "500ms", "--safety-margin", "500ms"].map(String::from);
    // w0 lists m1 first, w1 lists m0 first: whichever waits is pinned to its own member.
    let mut tb = Testbed::start_pinned(3, &[1, 0], ttl, lease.to_vec());
    let (i, t) = tb
        .wait_term_after(0, secs(30))
        .unwrap_or_else(|| panic!("no first term\n{}", tb.logs()));
    let j = 1 - i;
    let waiting = wait_until(secs(10), || {
        std::fs::read_to_string(&tb.workers[j].log)
            .unwrap_or_default()
            .contains("waiting behind")
    });
    assert!(waiting, "the standby is not in line\n{}", tb.logs());
    let m = tb.workers[j].first_member;
    assert!(
        tb.make_raft_leader(m, secs(15)),
        "m{m} is not etcd's leader\n{}",
        tb.logs()
    );
    let job = tb
        .events()
        .into_iter()
        .find(|e| e.kind == "start" && e.token == t)
        .unwrap()
        .pid;
    let cut = tb.members[m].node.name.clone();
    for k in (0..tb.members.len()).filter(|&k| k != m) {
        let other = tb.members[k].node.name.clone();
        tb.cut(&cut, &other);
    }
    signal(job, libc::SIGKILL);
    let died = wait_until(secs(5), || tb.deaths().contains_key(&job));
    assert!(died, "the leader's job still runs\n{}", tb.logs());
    let died_at = tb.deaths()[&job];
    let (k, t2) = tb
        .wait_term_after(t, ttl + secs(20))
        .unwrap_or_else(|| panic!("no takeover\n{}", tb.logs()));
    assert_eq!(k, j, "the standby takes over");
    let started = tb
        .events()
        .into_iter()
        .find(|e| e.kind == "start" && e.token == t2)
        .unwrap()
        .ns;
    let gap = Duration::from_nanos((started - died_at).max(0) as u64);
    eprintln!("gap {gap:?} from the old job's death to the standby's start (TTL {ttl:?})");
    tb.heal_all();
    let (_, r) = tb.finish();
    r.assert_ok(&tb.logs());
    assert!(
        gap <= ttl + secs(2),
        "the standby started {gap:?} after the old job died, over TTL + 2 s\n{}",
        tb.logs()
    );
}
