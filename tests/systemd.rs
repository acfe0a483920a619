//! The example units (`examples/systemd/`) under a real systemd, booted in a container
//! (see `harness::systemd`), against a real etcd on the host. Each unit is the example as
//! shipped under a name of the test's own, with a drop-in that points it at the test's etcd
//! and runs the test's job; a drop-in line that changes anything else says why.

use std::time::{Duration, Instant};

use harness::systemd::{drop_in, shared, Systemd};
use harness::*;

const INGEST: &str = "lead-exec-ingest.service";

/// A job that records its environment (`env-ID`), its cgroup (`cgroup-ID`), then its term
/// (`terms-ID`: token and pid, last, so that a test that saw it knows the trap is set), and
/// the TERM it gets (`got-ID`); it honours a second of grace, then dies of the TERM.
fn job(sd: &Systemd, dir: &str, id: &str) -> String {
    let path = format!("{dir}/job-{id}.sh");
    sd.write(
        &path,
        &format!(
            "trap 'echo term >> {dir}/got-{id}; sleep 1; echo grace-done >> {dir}/got-{id}; rmdir {dir}/lock; trap - TERM; kill -TERM $$' TERM\n\
             env > {dir}/env-{id}\n\
             cat /proc/self/cgroup > {dir}/cgroup-{id}\n\
             if ! mkdir {dir}/lock 2>/dev/null; then echo \"$FENCING_TOKEN\" >> {dir}/overlap; fi\n\
             echo \"$FENCING_TOKEN $$\" >> {dir}/terms-{id}\n\
             while :; do sleep 0.2; done\n"
        ),
        0o755,
    );
    path
}

/// The ingest example as `UNIT`, running `job` for `ID` in `ELECTION`.
fn ingest(sd: &Systemd, f: &Fixture, unit: &str, election: &str, id: &str, dir: &str, extra: &str) {
    let job = job(sd, dir, id);
    let exec = format!("/usr/local/bin/lead-exec run {election} --id {id} -- /bin/sh {job}");
    // A runtime directory of each unit's own: two copies of one example share a machine here.
    let extra = format!("RuntimeDirectory=\nRuntimeDirectory={unit}\n{extra}");
    sd.install(INGEST, unit, &drop_in(&f.ep, Some(&exec), &extra));
}

/// The job's terms so far: (token, pid in the container).
fn terms(host: &std::path::Path, id: &str) -> Vec<(i64, i64)> {
    lines(&host.join(format!("terms-{id}")))
        .iter()
        .map(|l| {
            let (t, p) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), p.parse().unwrap())
        })
        .collect()
}

fn wait_terms(host: &std::path::Path, id: &str, n: usize, limit: Duration) -> Vec<(i64, i64)> {
    let ok = wait_until(limit, || terms(host, id).len() >= n);
    assert!(ok, "{id}: fewer than {n} terms within {limit:?}");
    terms(host, id)
}

fn stop(sd: &Systemd, units: &[&str]) {
    sd.run(&format!("systemctl stop {}", units.join(" ")));
}

/// 1. `Type=notify`: the unit is active only once lead-exec said READY (connected and
///    campaigning), and `systemctl status` shows its STATUS= line, leading and waiting.
#[test]
fn notify_active_after_ready_with_status_leading_and_waiting() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("notify");
    ingest(sd, &f, "ldx-notify-a.service", "notify", "a", &dir, "");
    ingest(sd, &f, "ldx-notify-b.service", "notify", "b", &dir, "");
    // etcd frozen: lead-exec cannot connect, so it says no READY.
    f.etcd.members[0].stop();
    sd.run("systemctl start --no-block ldx-notify-a.service");
    let start = Instant::now();
    while start.elapsed() < secs(2) {
        assert_ne!(sd.prop("ldx-notify-a.service", "ActiveState"), "active");
        std::thread::sleep(Duration::from_millis(100));
    }
    f.etcd.members[0].cont();
    sd.wait_prop("ldx-notify-a.service", "ActiveState", "active", secs(20));
    let token = wait_terms(&host, "a", 1, secs(10))[0].0;
    sd.wait_prop(
        "ldx-notify-a.service",
        "StatusText",
        &format!("leading, token {token}"),
        secs(5),
    );
    sd.run("systemctl start ldx-notify-b.service");
    let ok = wait_until(secs(10), || {
        sd.prop("ldx-notify-b.service", "StatusText")
            .starts_with("waiting behind a")
    });
    assert!(ok, "{}", sd.status("ldx-notify-b.service"));
    let status =
        sd.run("systemctl status --no-pager ldx-notify-a.service ldx-notify-b.service; true");
    assert!(
        status.contains(&format!("Status: \"leading, token {token}\"")),
        "{status}"
    );
    assert!(status.contains("Status: \"waiting behind a"), "{status}");
    stop(sd, &["ldx-notify-b.service", "ldx-notify-a.service"]);
}

/// 2. `WatchdogSec=`: lead-exec frozen (SIGSTOP) stops its pings; systemd's watchdog fires,
///    the job is dead by the lease deadline D, the unit restarts and a new term begins with
///    a larger token.
#[test]
fn watchdog_fires_on_a_frozen_lead_exec_and_the_unit_restarts_with_a_larger_token() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("watchdog");
    let unit = "ldx-watchdog.service";
    // Shorter than the example's, for the test's time: the watchdog after 2 s, and the
    // SIGKILL 2 s after the watchdog's SIGABRT, which a stopped process cannot act on.
    ingest(
        sd,
        &f,
        unit,
        "wd",
        "a",
        &dir,
        "WatchdogSec=2s\nTimeoutAbortSec=2s\n",
    );
    sd.run(&format!("systemctl start {unit}"));
    let (t1, p1) = wait_terms(&host, "a", 1, secs(10))[0];
    let frozen = Instant::now();
    sd.run(&format!("systemctl kill --kill-who=main -s SIGSTOP {unit}"));
    // D is at most the lease's TTL (the example's 10 s) after the freeze.
    let dead = wait_until(secs(10), || !sd.alive(p1));
    assert!(
        dead,
        "job {p1} alive {:?} after the freeze",
        frozen.elapsed()
    );
    let second = wait_terms(&host, "a", 2, secs(40));
    assert!(second[1].0 > t1, "{second:?}");
    let said = wait_until(secs(5), || sd.status(unit).contains("Watchdog timeout"));
    assert!(said, "{}", sd.status(unit));
    assert!(sd.prop(unit, "NRestarts").parse::<u32>().unwrap() >= 1);
    stop(sd, &[unit]);
}

/// 3. `systemctl stop`: the job gets TERM and its grace, the other unit's job starts at once,
///    and the stopped unit is `inactive`, not `failed` (lead-exec dies of the TERM).
#[test]
fn stop_gives_the_grace_hands_over_at_once_and_leaves_the_unit_inactive() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("stop");
    ingest(sd, &f, "ldx-stop-a.service", "stop", "a", &dir, "");
    ingest(sd, &f, "ldx-stop-b.service", "stop", "b", &dir, "");
    sd.run("systemctl start ldx-stop-a.service");
    wait_terms(&host, "a", 1, secs(10));
    sd.run("systemctl start ldx-stop-b.service");
    assert!(wait_until(secs(10), || sd
        .prop("ldx-stop-b.service", "StatusText")
        .starts_with("waiting")));
    stop(sd, &["ldx-stop-a.service"]);
    let stopped = Instant::now();
    assert_eq!(lines(&host.join("got-a")), ["term", "grace-done"]);
    wait_terms(&host, "b", 1, secs(5));
    eprintln!("handover {:?} after the stop returned", stopped.elapsed());
    assert_eq!(sd.prop("ldx-stop-a.service", "ActiveState"), "inactive");
    assert_eq!(sd.prop("ldx-stop-a.service", "Result"), "success");
    stop(sd, &["ldx-stop-b.service"]);
    assert_eq!(sd.prop("ldx-stop-b.service", "ActiveState"), "inactive");
}

/// 4. `systemctl kill -s KILL`: every process of the unit, the job's included, dies at once,
///    and the unit's cgroup is left empty.
#[test]
fn kill_9_of_the_unit_kills_the_job_at_once_and_empties_the_cgroup() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("kill");
    let unit = "ldx-kill.service";
    // No restart: the test looks at the cgroup the kill left.
    ingest(sd, &f, unit, "kill", "a", &dir, "Restart=no\n");
    sd.run(&format!("systemctl start {unit}"));
    let (_, pid) = wait_terms(&host, "a", 1, secs(10))[0];
    let cg = sd.prop(unit, "ControlGroup");
    sd.run(&format!("systemctl kill -s SIGKILL {unit}"));
    assert!(wait_until(secs(3), || !sd.alive(pid)), "job {pid} survived");
    sd.wait_prop(unit, "ActiveState", "failed", secs(5));
    let left = sd.run(&format!(
        "for h in /sys/fs/cgroup/unified /sys/fs/cgroup/systemd; do \
         find $h{cg} -name cgroup.procs -exec cat {{}} + 2>/dev/null; done; true"
    ));
    assert!(left.trim().is_empty(), "left in {cg}: {left}");
    sd.run(&format!("systemctl reset-failed {unit}"));
}

/// 5. A journald restart in the middle of a term: the job is not restarted, and lead-exec's
///    lines reach the journal again afterwards.
#[test]
fn a_journald_restart_mid_term_restarts_nothing_and_logging_resumes() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("journald");
    let unit = "ldx-journald.service";
    ingest(sd, &f, unit, "jr", "a", &dir, "");
    sd.run(&format!("systemctl start {unit}"));
    wait_terms(&host, "a", 1, secs(10));
    sd.run("systemctl restart systemd-journald");
    // Microseconds since the epoch, as the journal stamps what it receives. (Not a cursor:
    // journalctl 252's --after-cursor with matches skips the first entry that matches.)
    let restarted: u64 = sd.run("date +%s%6N").trim().parse().unwrap();
    assert_eq!(sd.prop(unit, "ActiveState"), "active");
    stop(sd, &[unit]);
    assert_eq!(terms(&host, "a").len(), 1, "the job was restarted");
    assert_eq!(sd.prop(unit, "NRestarts"), "0");
    // journald writes what it received in its own time. Matched on lead-exec's own field:
    // journald finds a line's unit from the sender's cgroup, which a process that exited
    // before its last lines were read no longer has.
    let resumed = wait_until(secs(5), || {
        sd.run("journalctl --no-pager -o json ELECTION=jr SYSLOG_IDENTIFIER=lead-exec")
            .lines()
            .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
            .any(|v| {
                let at: u64 = v["__REALTIME_TIMESTAMP"]
                    .as_str()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                at > restarted && v["MESSAGE"].as_str().unwrap_or("").contains("job ended")
            })
    });
    assert!(resumed, "no line after the restart:\n{}", sd.status(unit));
}

/// 6. `Delegate=yes`: the job's cgroup is a child of the unit's, and is removed at the end.
#[test]
fn delegate_puts_the_job_in_a_child_cgroup_removed_at_the_end() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("delegate");
    let unit = "ldx-delegate.service";
    ingest(sd, &f, unit, "dg", "a", &dir, "");
    sd.run(&format!("systemctl start {unit}"));
    wait_terms(&host, "a", 1, secs(10));
    let cg = sd.prop(unit, "ControlGroup");
    let job_cg = lines(&host.join("cgroup-a"))
        .iter()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .expect("a cgroup v2 line");
    assert!(
        job_cg.starts_with(&format!("{cg}/")),
        "job in {job_cg}, unit in {cg}"
    );
    let path = format!("/sys/fs/cgroup/unified{job_cg}");
    assert!(sd.sh(&format!("test -d {path}")).status.success(), "{path}");
    stop(sd, &[unit]);
    assert!(
        !sd.sh(&format!("test -d {path}")).status.success(),
        "{path} left"
    );
}

/// 7. Two units of one election (different `--id`) in one systemd, one stopped and started
///    again: never two jobs at once, and every term's token larger than the last.
#[test]
fn two_units_of_one_election_stopped_and_started_keep_exclusion() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("exclusion");
    let (a, b) = ("ldx-excl-a.service", "ldx-excl-b.service");
    ingest(sd, &f, a, "excl", "a", &dir, "");
    ingest(sd, &f, b, "excl", "b", &dir, "");
    sd.run(&format!("systemctl start {a}"));
    wait_terms(&host, "a", 1, secs(10));
    sd.run(&format!("systemctl start {b}"));
    assert!(wait_until(secs(10), || sd
        .prop(b, "StatusText")
        .starts_with("waiting")));
    stop(sd, &[a]);
    wait_terms(&host, "b", 1, secs(5));
    sd.run(&format!("systemctl start {a}"));
    assert!(wait_until(secs(10), || sd
        .prop(a, "StatusText")
        .starts_with("waiting")));
    stop(sd, &[b]);
    wait_terms(&host, "a", 2, secs(5));
    stop(sd, &[a]);
    assert!(!host.join("overlap").exists(), "two jobs at once");
    let mut all: Vec<i64> = terms(&host, "a")
        .into_iter()
        .chain(terms(&host, "b"))
        .map(|t| t.0)
        .collect();
    let order = all.clone();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 3, "{order:?}");
}

/// 8. The settlement timer firing its one-shot `--no-wait` unit on two workers: one runs the
///    job each tick, the other logs at most one line and ends `inactive`.
#[test]
fn a_timer_fires_the_one_shot_on_two_workers_and_one_runs_per_tick() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("timer");
    let settle = format!("{dir}/settle.sh");
    sd.write(
        &settle,
        &format!("echo \"$LEAD_EXEC_RUN_KEY $LEAD_EXEC_ID\" >> {dir}/runs\nsleep 1\n"),
        0o755,
    );
    for w in ["a", "b"] {
        // Every 5 s instead of 5 min, for the test's time: the example's flags otherwise.
        let exec = format!(
            "/usr/local/bin/lead-exec run settlement-{} --id {w} -q --no-wait --every 5s -- {settle}",
            std::process::id()
        );
        sd.install(
            "lead-exec-settlement.service",
            &format!("ldx-tick-{w}.service"),
            &drop_in(&f.ep, Some(&exec), ""),
        );
        sd.install(
            "lead-exec-settlement.timer",
            &format!("ldx-tick-{w}.timer"),
            "[Timer]\nOnCalendar=\nOnCalendar=*:*:0/5\n",
        );
    }
    sd.run("systemctl start ldx-tick-a.timer ldx-tick-b.timer");
    let runs = host.join("runs");
    let ok = wait_until(secs(20), || {
        let keys: std::collections::BTreeSet<String> = lines(&runs)
            .iter()
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect();
        keys.len() >= 2
    });
    assert!(ok, "fewer than two ticks ran: {:?}", lines(&runs));
    sd.run("systemctl stop ldx-tick-a.timer ldx-tick-b.timer");
    for w in ["a", "b"] {
        let unit = format!("ldx-tick-{w}.service");
        assert!(wait_until(secs(10), || sd.prop(&unit, "ActiveState") == "inactive"));
        assert_eq!(sd.prop(&unit, "Result"), "success", "{}", sd.status(&unit));
    }
    let done = lines(&runs);
    let mut keys: Vec<&str> = done.iter().map(|l| l.split(' ').next().unwrap()).collect();
    let ran = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), ran, "a tick ran twice: {done:?}");
    // The run that lost a tick printed at most one line, the one that won none (`-q`): at
    // most one line of lead-exec's per run of either unit.
    for w in ["a", "b"] {
        let unit = format!("ldx-tick-{w}.service");
        let entries = sd.run(&format!(
            "journalctl --no-pager -o json -u {unit} SYSLOG_IDENTIFIER=lead-exec"
        ));
        let mut runs = std::collections::BTreeMap::<String, Vec<String>>::new();
        for e in entries.lines() {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            let run = v["_SYSTEMD_INVOCATION_ID"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let message = v["MESSAGE"].as_str().unwrap_or("").to_string();
            runs.entry(run).or_default().push(message);
        }
        for (run, lines) in &runs {
            assert!(lines.len() <= 1, "{unit} run {run} said {lines:?}");
        }
    }
}

/// 9. Under journald, lead-exec's lines carry their priority and the run's fields
///    (`journalctl -p warning`, `journalctl ELECTION=…`), and the job's own environment has
///    no `NOTIFY_SOCKET` or watchdog settings.
#[test]
fn journal_priorities_and_fields_and_no_notify_socket_for_the_job() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("fields");
    let unit = "ldx-fields.service";
    let election = format!("fields-{}", std::process::id());
    let job = job(sd, &dir, "a");
    // A health check failing at first: a warning, then the term.
    let exec = format!(
        "/usr/local/bin/lead-exec run {election} --id a --health-cmd 'test -e {dir}/healthy' --health-interval 1s -- /bin/sh {job}"
    );
    sd.install(INGEST, unit, &drop_in(&f.ep, Some(&exec), ""));
    sd.run(&format!("systemctl start {unit}"));
    let warned = wait_until(secs(10), || {
        sd.journal(&format!(
            "-p warning ELECTION={election} SYSLOG_IDENTIFIER=lead-exec"
        ))
        .iter()
        .any(|l| l.contains("health check"))
    });
    assert!(warned, "{}", sd.status(unit));
    std::fs::write(host.join("healthy"), "").unwrap();
    let token = wait_terms(&host, "a", 1, secs(20))[0].0;
    let ok = wait_until(secs(5), || {
        !sd.journal(&format!("ELECTION={election} LEAD_EXEC_ID=a TOKEN={token}"))
            .is_empty()
    });
    assert!(ok, "{}", sd.status(unit));
    let info = sd.journal(&format!("-p info ELECTION={election}"));
    let warnings = sd.journal(&format!("-p warning ELECTION={election}"));
    assert!(info.len() > warnings.len(), "{info:?} {warnings:?}");
    let env = lines(&host.join("env-a"));
    assert!(
        env.iter().any(|l| l.starts_with("FENCING_TOKEN=")),
        "{env:?}"
    );
    for var in ["NOTIFY_SOCKET=", "WATCHDOG_USEC=", "WATCHDOG_PID="] {
        assert!(!env.iter().any(|l| l.starts_with(var)), "{var} in {env:?}");
    }
    stop(sd, &[unit]);
}

/// A `--grace` longer than the unit's `TimeoutStopSec=`: lead-exec's STOPPING=1 with
/// EXTEND_TIMEOUT_USEC= makes systemd wait it out instead of SIGKILLing the job mid-grace.
#[test]
fn a_grace_longer_than_timeout_stop_sec_is_waited_out() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("extend");
    let unit = "ldx-extend.service";
    // The job's TERM trap takes 1 s: a 1 s stop timeout with a 4 s grace.
    ingest(
        sd,
        &f,
        unit,
        "extend",
        "a",
        &dir,
        "TimeoutStopSec=1s\nEnvironment=LEAD_EXEC_GRACE=4s\n",
    );
    // The trap's second, stretched past the stop timeout.
    let job = format!("{dir}/job-a.sh");
    sd.run(&format!("sed -i 's/sleep 1;/sleep 2;/' {job}"));
    sd.run(&format!("systemctl start {unit}"));
    wait_terms(&host, "a", 1, secs(10));
    // A reload would make systemd forget the extension (see harness::systemd::Systemd::no_reload).
    let no_reload = sd.no_reload();
    let start = Instant::now();
    stop(sd, &[unit]);
    drop(no_reload);
    assert!(
        start.elapsed() >= secs(2),
        "{:?}\n{}",
        start.elapsed(),
        sd.status(unit)
    );
    assert_eq!(lines(&host.join("got-a")), ["term", "grace-done"]);
    assert_eq!(sd.prop(unit, "Result"), "success", "{}", sd.status(unit));
}

/// Outside journald, the text log is as it always was, even under systemd: a unit whose
/// stderr is a file (its stdout still the journal's stream, so `JOURNAL_STREAM` is set, for
/// fd 1) gets the usual text lines there, and the journal gets none of lead-exec's.
#[test]
fn a_unit_whose_stderr_is_a_file_gets_the_text_log_there() {
    let Some(sd) = shared() else { return };
    let f = Fixture::new();
    let (host, dir) = sd.dir("stderr-file");
    let unit = "ldx-stderr-file.service";
    let election = format!("stderr-{}", std::process::id());
    let exec =
        format!("/usr/local/bin/lead-exec run {election} --id a -- /bin/sh -c 'env > {dir}/env'");
    sd.install(
        INGEST,
        unit,
        &drop_in(
            &f.ep,
            Some(&exec),
            &format!("Restart=no\nStandardError=append:{dir}/log\n"),
        ),
    );
    sd.run(&format!("systemctl start {unit}"));
    sd.wait_prop(unit, "ActiveState", "inactive", secs(10));
    let log = lines(&host.join("log"));
    let started = log
        .iter()
        .find(|l| l.contains(" INFO leading: job started token="))
        .unwrap_or_else(|| panic!("{log:?}"));
    // As outside systemd: the time first, the run's fields last.
    assert!(started.starts_with("20"), "{started}");
    assert!(
        started.ends_with(&format!("election=\"{election}\" id=\"a\"")),
        "{started}"
    );
    assert!(sd.journal(&format!("ELECTION={election}")).is_empty());
    // The variable was there: fd 2 was not the stream it names.
    let env = lines(&host.join("env"));
    assert!(
        env.iter().any(|l| l.starts_with("JOURNAL_STREAM=")),
        "{env:?}"
    );
}
