//! The fencing contract on a real PostgreSQL (`contrib/postgres/fencing.sql`): through
//! lead-exec's terms and the ledger example, and with two writers interleaved by hand.

use std::path::Path;
use std::process::Command;

use ::postgres::{Client, IsolationLevel, NoTls};
use harness::chaos::ledger_bin;
use harness::postgres::Postgres;
use harness::*;

const FENCING_SQL: &str = include_str!("../contrib/postgres/fencing.sql");
const STALE: &str = "FENCE";

fn connect(pg: &Postgres) -> Client {
    Client::connect(&pg.conninfo(), NoTls).expect("connecting to the test server")
}

/// A server with the fencing SQL and a table to write, as a user of the contract sets it up.
fn fenced() -> (Postgres, Client) {
    let pg = Postgres::start();
    let mut c = connect(&pg);
    c.batch_execute(FENCING_SQL).unwrap();
    c.batch_execute("CREATE TABLE payouts (token bigint NOT NULL, what text NOT NULL)")
        .unwrap();
    (pg, c)
}

/// A writer's transaction at READ COMMITTED, PostgreSQL's default, named explicitly.
fn begin(c: &mut Client) -> ::postgres::Transaction<'_> {
    c.build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .unwrap()
}

fn sqlstate(e: &::postgres::Error) -> Option<&str> {
    e.code().map(|c| c.code())
}

fn highest(c: &mut Client, resource: &str) -> Option<i64> {
    c.query_opt(
        "SELECT highest FROM lead_exec_fence WHERE resource = $1",
        &[&resource],
    )
    .unwrap()
    .map(|r| r.get(0))
}

fn payouts(c: &mut Client) -> Vec<(i64, String)> {
    c.query("SELECT token, what FROM payouts ORDER BY ctid", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The backend pid of a connection, to watch it from another one.
fn backend_pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// Waits until backend `pid` is blocked on a lock (another transaction's row lock).
fn wait_blocked(observer: &mut Client, pid: i32) {
    let ok = wait_until(secs(10), || {
        observer
            .query_opt(
                "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                &[&pid],
            )
            .unwrap()
            .is_some()
    });
    assert!(ok, "backend {pid} never waited for a lock");
}

/// A writer in a thread of its own: BEGIN, fence with `token`, insert, COMMIT. Returns the
/// SQLSTATE it failed with, or None if it committed.
fn writer_thread(pg: &Postgres, token: i64) -> (i32, std::thread::JoinHandle<Option<String>>) {
    let mut c = connect(pg);
    let pid = backend_pid(&mut c);
    let h = std::thread::spawn(move || {
        let mut tx = begin(&mut c);
        let outcome = tx
            .query_one("SELECT lead_exec_fence('payouts', $1)", &[&token])
            .and_then(|_| tx.execute("INSERT INTO payouts VALUES ($1, 'late writer')", &[&token]));
        match outcome {
            Ok(_) => {
                tx.commit().unwrap();
                None
            }
            Err(e) => Some(sqlstate(&e).unwrap_or("no sqlstate").to_string()),
        }
    });
    (pid, h)
}

/// The interleaving the row lock exists for: the higher token's transaction has passed the
/// fence and not committed yet when the lower one calls it. The lower one waits on the row
/// lock, then sees the committed mark and fails; only the higher one's row lands. Both on a
/// resource's first write (the row is being inserted) and on a resource with a mark.
#[test]
fn a_lower_token_waits_for_the_higher_ones_commit_then_is_refused() {
    let (pg, mut admin) = fenced();
    for first in [true, false] {
        admin.batch_execute("TRUNCATE payouts").unwrap();
        if !first {
            admin
                .batch_execute("UPDATE lead_exec_fence SET highest = 3")
                .unwrap();
        }
        let mut a = connect(&pg);
        let mut tx = begin(&mut a);
        tx.query_one("SELECT lead_exec_fence('payouts', 10)", &[])
            .unwrap();
        tx.execute("INSERT INTO payouts VALUES (10, 'new term')", &[])
            .unwrap();
        let (pid, lower) = writer_thread(&pg, 5);
        wait_blocked(&mut admin, pid);
        tx.commit().unwrap();
        let failed = lower.join().unwrap();
        assert_eq!(
            failed.as_deref(),
            Some(STALE),
            "the lower token committed (first write: {first})"
        );
        assert_eq!(payouts(&mut admin), [(10, "new term".to_string())]);
        assert_eq!(highest(&mut admin, "payouts"), Some(10));
    }
}

/// The other order: the lower token holds the lock, the higher one waits and then lands.
/// Both commit, lower before higher, which is the order the fence allows. A higher token
/// that rolls back leaves no mark: a lower one queued behind it goes through.
#[test]
fn writers_queue_on_the_row_lock_in_commit_order_and_a_rollback_leaves_no_mark() {
    let (pg, mut admin) = fenced();
    let mut a = connect(&pg);
    let mut tx = begin(&mut a);
    tx.query_one("SELECT lead_exec_fence('payouts', 5)", &[])
        .unwrap();
    tx.execute("INSERT INTO payouts VALUES (5, 'old term')", &[])
        .unwrap();
    let (pid, higher) = writer_thread(&pg, 10);
    wait_blocked(&mut admin, pid);
    tx.commit().unwrap();
    assert_eq!(higher.join().unwrap(), None, "the higher token was refused");
    assert_eq!(
        payouts(&mut admin),
        [(5, "old term".to_string()), (10, "late writer".to_string())]
    );

    let mut tx = begin(&mut a);
    tx.query_one("SELECT lead_exec_fence('payouts', 12)", &[])
        .unwrap();
    let (pid, lower) = writer_thread(&pg, 11);
    wait_blocked(&mut admin, pid);
    tx.rollback().unwrap();
    assert_eq!(lower.join().unwrap(), None, "a rolled-back mark refused 11");
    assert_eq!(highest(&mut admin, "payouts"), Some(11));
}

/// The check without the fence's row lock, a SELECT then an UPDATE at READ COMMITTED, lets
/// the same interleaving commit a stale write after a newer one: the test above would see it.
#[test]
fn the_same_check_without_the_row_lock_lets_a_stale_writer_commit() {
    let (pg, mut admin) = fenced();
    admin
        .batch_execute("INSERT INTO lead_exec_fence VALUES ('naive', 3)")
        .unwrap();
    let (mut a, mut b) = (connect(&pg), connect(&pg));
    let read = "SELECT highest FROM lead_exec_fence WHERE resource = 'naive'";
    let raise = "UPDATE lead_exec_fence SET highest = $1 WHERE resource = 'naive'";
    let mut ta = begin(&mut a);
    let mut tb = begin(&mut b);
    let seen_a: i64 = ta.query_one(read, &[]).unwrap().get(0);
    let seen_b: i64 = tb.query_one(read, &[]).unwrap().get(0);
    assert!(10 >= seen_a && 5 >= seen_b, "both pass the check");
    ta.execute(raise, &[&10i64]).unwrap();
    ta.execute("INSERT INTO payouts VALUES (10, 'new term')", &[])
        .unwrap();
    ta.commit().unwrap();
    tb.execute(raise, &[&5i64]).unwrap();
    tb.execute("INSERT INTO payouts VALUES (5, 'stale')", &[])
        .unwrap();
    tb.commit().unwrap();
    assert_eq!(
        payouts(&mut admin),
        [(10, "new term".to_string()), (5, "stale".to_string())]
    );
    assert_eq!(highest(&mut admin, "naive"), Some(5), "the mark went back");
}

/// Above READ COMMITTED the queued lower writer fails too, with a serialization failure
/// (40001) instead of the fence's error: it never commits either way.
#[test]
fn at_repeatable_read_a_queued_lower_token_fails_with_a_serialization_error() {
    let (pg, mut admin) = fenced();
    let mut a = connect(&pg);
    let mut b = connect(&pg);
    let pid = backend_pid(&mut b);
    let mut tx = begin(&mut a);
    tx.query_one("SELECT lead_exec_fence('payouts', 10)", &[])
        .unwrap();
    let lower = std::thread::spawn(move || {
        let mut tb = b
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .start()
            .unwrap();
        tb.query_one("SELECT 1", &[]).unwrap(); // takes the snapshot before A commits
        let r = tb.query_one("SELECT lead_exec_fence('payouts', 5)", &[]);
        r.err().and_then(|e| sqlstate(&e).map(str::to_string))
    });
    wait_blocked(&mut admin, pid);
    tx.commit().unwrap();
    assert_eq!(lower.join().unwrap().as_deref(), Some("40001"));
    assert_eq!(highest(&mut admin, "payouts"), Some(10));
}

/// A stale writer whose transaction wrote (an insert, an update, a delete) before calling the
/// fence: the fence's error rolls all of it back, and the mark stays.
#[test]
fn a_stale_write_does_not_change_the_data() {
    let (_pg, mut c) = fenced();
    let mut tx = begin(&mut c);
    tx.query_one("SELECT lead_exec_fence('payouts', 7)", &[])
        .unwrap();
    tx.execute("INSERT INTO payouts VALUES (7, 'kept')", &[])
        .unwrap();
    tx.commit().unwrap();
    let before = (payouts(&mut c), highest(&mut c, "payouts"));

    let mut tx = begin(&mut c);
    tx.execute("INSERT INTO payouts VALUES (6, 'stale')", &[])
        .unwrap();
    tx.execute("UPDATE payouts SET what = 'overwritten'", &[])
        .unwrap();
    tx.execute("DELETE FROM payouts WHERE token = 7", &[])
        .unwrap();
    let err = tx
        .query_one("SELECT lead_exec_fence('payouts', 6)", &[])
        .unwrap_err();
    assert_eq!(sqlstate(&err), Some(STALE), "{err}");
    let message = err.as_db_error().map(|d| d.message().to_string());
    assert_eq!(
        message.as_deref(),
        Some("stale fencing token 6 for payouts: 7 was accepted")
    );
    // The transaction is aborted: PostgreSQL answers even a COMMIT with a rollback.
    tx.commit().unwrap();
    assert_eq!((payouts(&mut c), highest(&mut c, "payouts")), before);
    // An equal token is the same term writing again: accepted.
    let mut tx = begin(&mut c);
    tx.query_one("SELECT lead_exec_fence('payouts', 7)", &[])
        .unwrap();
    tx.commit().unwrap();
    // Running the file again keeps every mark.
    c.batch_execute(FENCING_SQL).unwrap();
    assert_eq!(highest(&mut c, "payouts"), Some(7));
}

/// `ledger --pg CONNINFO ARGS...`: (exit code, stdout).
fn ledger(pg: &Postgres, args: &[&str]) -> (i32, String) {
    let out = Command::new(ledger_bin())
        .args(["--pg", &pg.conninfo()])
        .args(args)
        .env_remove("FENCING_TOKEN")
        .env_remove("LEAD_EXEC_SLOT")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// (token, worker) of every settlement, in commit order.
fn settled(c: &mut Client) -> Vec<(i64, String)> {
    c.query("SELECT token, worker FROM settlements ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Three terms one after another, each job settling through the fence with its
/// FENCING_TOKEN: every row lands, tokens grow with every term, the mark is the last one.
#[test]
fn jobs_of_successive_terms_write_through_the_postgres_fence() {
    let f = Fixture::new();
    let pg = Postgres::start();
    assert_eq!(ledger(&pg, &["init"]).0, 0);
    let job = format!(
        "exec {} --pg '{}' settle --batches 2 --every 10",
        ledger_bin().display(),
        pg.conninfo()
    );
    for id in ["a", "b", "c"] {
        let (code, _, err) = run(&run_args("pgterms", &f.ep, &["--id", id], &job));
        assert_eq!(code, 0, "term of {id}: {err}");
    }
    let mut c = connect(&pg);
    let rows = settled(&mut c);
    let workers: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(workers, ["a", "a", "b", "b", "c", "c"]);
    let tokens: Vec<i64> = rows.iter().step_by(2).map(|r| r.0).collect();
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "tokens did not grow: {rows:?}"
    );
    assert_eq!(highest(&mut c, "settlement/0"), Some(tokens[2]));
    assert_eq!(ledger(&pg, &["check"]).0, 0);
}

/// Every process of a worker: lead-exec, its watchdog, the job and what the job started.
fn family(pid: i32) -> Vec<i32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        all.extend(children(all[i]));
        i += 1;
    }
    all
}

/// The job's event log lines (`ledger settle --events`) of `kind` from `token`.
fn events(path: &Path, kind: &str, token: i64) -> usize {
    lines(path)
        .iter()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&kind) && f.get(2) == Some(&token.to_string().as_str())
        })
        .count()
}

/// A leader frozen whole (lead-exec, watchdog, job) past its lease: another worker leads and
/// writes. Then the job wakes first, before the watchdog that would kill it, the worst order,
/// and writes with its old token: PostgreSQL refuses it, and nothing of the old term lands
/// after the new term's first row.
#[test]
fn a_frozen_old_leader_that_wakes_up_is_refused_by_postgres() {
    let f = Fixture::new();
    let pg = Postgres::start();
    assert_eq!(ledger(&pg, &["init"]).0, 0);
    let events_file = f.dir.path().join("events");
    // A write every second: the freeze lands between two transactions, never inside one
    // (a writer frozen inside holds the fence's row lock and the next term would wait).
    let job = |id: &str| {
        script(
            f.dir.path(),
            &format!(
                "echo $$ > $D/{id}.job; exec {} --pg '{}' settle --every 1000 --events $D/events",
                ledger_bin().display(),
                pg.conninfo()
            ),
        )
    };
    let (job_a, job_b) = (job("a"), job("b"));
    let a_args = run_args("pgfrozen", &f.ep, &["--id", "a"], &job_a);
    let a = spawn(f.dir.path(), "a", &a_args);
    a.wait_log("leading", secs(10));
    let old = wait_line(&events_file, secs(10), |l| l.contains(" write ")); // committed
    let old_token: i64 = old.split_whitespace().nth(2).unwrap().parse().unwrap();
    let b_args = run_args("pgfrozen", &f.ep, &["--id", "b"], &job_b);
    let b = spawn(f.dir.path(), "b", &b_args);
    b.wait_log("waiting behind", secs(10));

    // Right after a commit, while the job sleeps until its next write.
    let writes = events(&events_file, "write", old_token);
    assert!(wait_until(secs(5), || events(
        &events_file,
        "write",
        old_token
    ) > writes));
    let frozen = family(a.pid());
    for &pid in &frozen {
        signal(pid, libc::SIGSTOP);
    }
    let mut c = connect(&pg);
    let before: Vec<(i64, String)> = settled(&mut c);
    let new = wait_line(&events_file, secs(15), |l| {
        l.contains(" write ") && !l.contains(&format!(" write {old_token} "))
    });
    let new_token: i64 = new.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(new_token > old_token);

    let job_pid = wait_int(&f.dir.path().join("a.job"), secs(1)) as i32;
    signal(job_pid, libc::SIGCONT);
    wait_line(&events_file, secs(10), |l| {
        l.contains(&format!(" reject {old_token} "))
    });
    for &pid in &frozen {
        signal(pid, libc::SIGCONT);
    }

    let rows = settled(&mut c);
    assert_eq!(
        rows[..before.len()],
        before[..],
        "rows committed before the freeze changed"
    );
    let late: Vec<_> = rows[before.len()..]
        .iter()
        .filter(|r| r.0 != new_token)
        .collect();
    assert!(late.is_empty(), "rows after the new term's: {late:?}");
    let refused = c
        .query(
            "SELECT highest FROM rejections WHERE token = $1 AND worker = 'a'",
            &[&old_token],
        )
        .unwrap();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].get::<_, i64>(0), new_token);
    assert!(highest(&mut c, "settlement/0").unwrap() >= new_token);
    assert_eq!(ledger(&pg, &["check"]).0, 0);
    drop(b);
}

/// lead-exec-safety(7)'s fencing contract shows the SQL that these tests run, word for word.
#[test]
fn the_safety_page_shows_the_tested_fencing_sql() {
    let readme = include_str!("../man/lead-exec-safety.7.md");
    let start = "```sql\n-- A PostgreSQL table as a fenced resource";
    let at = readme.find(start).expect(
        "lead-exec-safety(7)'s fencing contract has no block starting with the file's first line",
    );
    let block = &readme[at + "```sql\n".len()..];
    let block = &block[..block.find("```").unwrap()];
    assert_eq!(block, FENCING_SQL);
}
