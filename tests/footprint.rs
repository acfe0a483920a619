//! What a candidate keeps while it waits in line, which may be for hours: a watchdog standing
//! by only when it is next, and not the stack its start-up went through.

use harness::measure::worker::mapping_kib;
use harness::*;

/// The watchdogs among a worker's children (from every thread: the runtime's thread starts
/// them).
fn watchdogs(w: &Worker) -> Vec<i32> {
    children(w.pid())
        .into_iter()
        .filter(|c| comm(*c) == "ldx-warden")
        .collect()
}

/// A line on `election`: the first of `ids` leads (its job runs), each next one waits behind
/// the one before (`from_fn` starts them in order).
fn line<const N: usize>(f: &Fixture, election: &str, ids: [&str; N]) -> [Worker; N] {
    std::array::from_fn(|i| {
        let w = worker(f, election, ids[i]);
        match i {
            0 => drop(wait_int(&f.dir.path().join(ids[0]), secs(10))),
            _ => w.wait_log(&format!("waiting behind {}", ids[i - 1]), secs(10)),
        }
        w
    })
}

/// Ends `leader`'s term with SIGTERM (exit 143), and returns the watchdog the next job runs
/// under: its parent, which the job of `next` writes to `$D/NEXT`.
fn hand_over(f: &Fixture, leader: &mut Worker, next: &str) -> i32 {
    leader.signal(libc::SIGTERM);
    assert_eq!(leader.code(secs(10)), 143, "{}", leader.log_text());
    wait_int(&f.dir.path().join(next), secs(10)) as i32
}

/// The one watchdog `w` keeps standing by, once it has one (`who` names it in the failure).
fn standing_by(w: &Worker, who: &str) -> i32 {
    let mut seen = Vec::new();
    assert!(
        wait_until(secs(10), || {
            seen = watchdogs(w);
            seen.len() == 1
        }),
        "{who} has no watchdog standing by: {seen:?}\n{}",
        w.log_text()
    );
    seen[0]
}

/// A worker with `--id ID` whose job writes its parent, the watchdog it runs under, to
/// `$D/ID`, then sleeps.
fn worker(f: &Fixture, election: &str, id: &str) -> Worker {
    let job = script(
        f.dir.path(),
        &format!("echo $PPID > $D/{id}; exec sleep 120"),
    );
    spawn(
        f.dir.path(),
        id,
        &run_args(election, &f.ep, &["--id", id], &job),
    )
}

/// a leads, b waits behind it (next), c behind b. b keeps the watchdog it started ahead and
/// its job runs under it; c lets its own go, starts one when b is elected (c is next then),
/// and its job runs under that one.
#[test]
fn only_the_next_in_line_keeps_a_watchdog_standing_by() {
    let f = Fixture::new();
    let [mut a, mut b, mut c] = line(&f, "nextline", ["a", "b", "c"]);

    let ahead = standing_by(&b, "b, next in line");
    assert!(
        wait_until(secs(5), || watchdogs(&c).is_empty()),
        "c, behind b, kept a watchdog: {:?}\n{}",
        watchdogs(&c),
        c.log_text()
    );

    let b_under = hand_over(&f, &mut a, "b");
    assert_eq!(
        b_under, ahead,
        "b's job ran under another watchdog than the one it had standing by"
    );
    // c is next now: b's key, which c waits behind, was marked elected.
    let standing = standing_by(&c, "c, next in line behind b's term");
    let c_under = hand_over(&f, &mut b, "c");
    assert_eq!(
        c_under, standing,
        "c's job ran under another watchdog than the one it had standing by"
    );
    c.signal(libc::SIGTERM);
    assert_eq!(c.code(secs(10)), 143, "{}", c.log_text());
}

/// A put on the key a candidate waits behind wakes it only when it marks that key's
/// candidate elected: other puts (an `etcdctl elect` leader's proclaim, an operator's, a mark
/// put again over a mark) leave it waiting as it was, without a line in its log each time.
#[test]
fn only_an_elected_mark_on_the_key_ahead_wakes_a_waiting_candidate() {
    let f = Fixture::new();
    let [mut a, mut b, mut c] = line(&f, "putahead", ["a", "b", "c"]);
    let keys = f.etcd.ctl(&[
        "get",
        "--prefix",
        "lead-exec/elections/putahead/",
        "--keys-only",
        "--sort-by=CREATE",
        "--order=ASCEND",
    ]);
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    for v in ["x1", "x2", "x3"] {
        f.etcd.ctl(&["put", keys[1], v, "--ignore-lease"]);
    }
    // b's election marks its key: c is next, and starts a watchdog. The puts before it
    // reached c first, in the watch's order.
    hand_over(&f, &mut a, "b");
    standing_by(&c, "c, next in line behind b's term");
    // Marks again over b's mark, each naming another candidate.
    let marked = f.etcd.ctl(&["get", keys[1], "--print-value-only"]);
    assert!(marked.contains("\"id\":\"b\""), "{marked}");
    for id in ["z1", "z2", "z3"] {
        let v = marked
            .trim()
            .replace("\"id\":\"b\"", &format!("\"id\":\"{id}\""));
        f.etcd.ctl(&["put", keys[1], &v, "--ignore-lease"]);
    }
    // b's end reaches c after them, in the watch's order.
    hand_over(&f, &mut b, "c");
    let waits = c.log_text().matches("waiting behind").count();
    assert_eq!(
        waits,
        1,
        "c woke on puts that mark nothing new:\n{}",
        c.log_text()
    );
    c.signal(libc::SIGTERM);
    assert_eq!(c.code(secs(10)), 143, "{}", c.log_text());
}

/// Resident size of a process's main-thread stack, and how far it has ever grown, in KiB.
fn stack_kib(pid: i32) -> (u64, u64) {
    let field = |key| mapping_kib(pid, "[stack]", key).unwrap_or(0);
    (field("Rss:"), field("Size:"))
}

/// Keepalive messages etcd has received so far, from every client.
fn keepalives(f: &Fixture) -> f64 {
    let addr = f.etcd.members[0].endpoint().parse().unwrap();
    scrape_addr(addr, secs(5), secs(5))
        .unwrap_or_default()
        .lines()
        .find(|l| {
            l.starts_with("grpc_server_msg_received_total{")
                && l.contains("grpc_method=\"LeaseKeepAlive\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// A waiting candidate gives its start-up stack back once its wait has settled, and its
/// keepalives (several per second here) do not wake the campaign to touch it again: only a
/// loss of the lease does.
#[test]
fn a_waiting_candidate_gives_back_its_start_up_stack() {
    let f = Fixture::new();
    let [mut a, b] = line(&f, "stackline", ["a", "b"]);
    let (rss, size) = stack_kib(b.pid());
    assert!(rss > 0 && size >= rss, "no stack read: {rss} of {size} KiB");
    // Released a second after the wait began.
    let released = wait_until(secs(5), || {
        let (now, size) = stack_kib(b.pid());
        now + 16 <= size
    });
    let after = stack_kib(b.pid());
    assert!(
        released,
        "b's stack stayed resident: {after:?} (resident, extent) KiB"
    );
    // Three keepalives of each of the two leases.
    let before = keepalives(&f);
    assert!(
        wait_until(secs(15), || keepalives(&f) >= before + 6.0),
        "etcd counted no keepalives"
    );
    let later = stack_kib(b.pid());
    assert!(
        later.0 + 16 <= later.1,
        "b's stack was touched again while it waited: {after:?} then {later:?} (resident, extent) KiB\n{}",
        b.log_text()
    );
    hand_over(&f, &mut a, "b");
}
