//! No process of the job outlives its term, wherever it moves: lead-exec-safety(7)'s escape table,
//! cell by cell. Each cell runs a job that starts a heartbeating escapee one way or another
//! and exits; a second worker of the same election then runs. The escapee's heartbeats must
//! stop before the second worker's job starts, and never resume.

use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::*;

/// The ways out of where lead-exec puts the job (rows of the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// A new session (and so a new process group).
    Setsid,
    /// A new process group in the same session.
    Setpgid,
    /// Into another cgroup, keeping the process group (`systemd-run --scope`, `cgexec`).
    CgroupMove,
    /// A daemon: a new session and a double fork, its parent gone.
    DoubleFork,
    /// What `su -` through pam_systemd does: into a session scope's cgroup, then another uid.
    SuPamSystemd,
    /// Into a PID namespace of its own, with its own /proc (`unshare --pid --fork
    /// --mount-proc`).
    PidNamespace,
    /// Chains of processes that each start the next and exit at once, in a new session and
    /// deaf to SIGTERM: every process lives a moment, so one walk of the tree finds each chain
    /// a step behind.
    ForkChain,
    /// A process whose main thread exits while another thread goes on (`pthread_exit`), in a
    /// new session and deaf to SIGTERM: /proc shows it as a zombie ('Z') although it runs.
    MainThreadExited,
    /// Into another cgroup and a session of its own, under a name that is not UTF-8: run
    /// through a link whose name starts with byte 0xff, which /proc's `stat` and `status`
    /// then show as its name (`comm`).
    OddName,
    /// A session of its own, made non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`, as a setuid
    /// program is), under a /proc mounted with `hidepid=2` (systemd's
    /// `ProtectProc=invisible`): an unprivileged lead-exec and its watchdog cannot read its
    /// /proc files, though its parent's list of children names it.
    Undumpable,
    /// lead-exec itself in a PID namespace whose /proc is the host's (`unshare --pid --fork`
    /// without `--mount-proc`, a container that bind-mounts the host's /proc); the job's
    /// escapee a daemon.
    ForeignProc,
}

/// Who runs lead-exec (columns, with the `--cgroup` mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum User {
    Root,
    /// `nobody`: no cgroup can be made, no cgroup can be joined.
    Nobody,
}

const MODES: [&str; 3] = ["auto", "on", "off"];

/// A cgroup v2 beside the job cgroups, for escapees to move into; removed with what is in it.
struct OtherCgroup(PathBuf);

impl OtherCgroup {
    fn new(name: &str) -> OtherCgroup {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mount = info
            .lines()
            .find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                (right.split_whitespace().next()? == "cgroup2")
                    .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
            })
            .expect("no cgroup2 mount: the containment tests need cgroup v2 (run as root)");
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let own = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        let dir = mount
            .join(own.trim_start_matches('/'))
            .join(format!("test-escape-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot make {}: {e} (run as root)", dir.display()));
        OtherCgroup(dir)
    }
}

impl Drop for OtherCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        wait_until(secs(2), || std::fs::remove_dir(&self.0).is_ok());
    }
}

/// The escapee: records its pid (in its own namespace) and beats every 50 ms.
fn write_escapee(dir: &Path) -> PathBuf {
    let path = dir.join("escapee.sh");
    let body = format!(
        "#!/bin/sh\necho $$ > {d}/escapee\nwhile :; do date +%s%N >> {d}/hb; sleep 0.05; done\n",
        d = dir.display()
    );
    std::fs::write(&path, body).unwrap();
    chmod(&path, 0o755);
    path
}

/// One link of a fork chain: beats, starts the next link, exits; SIGTERM is ignored.
fn write_chain(dir: &Path) -> PathBuf {
    let path = dir.join("chain.sh");
    let body = format!(
        "#!/bin/bash\ntrap '' TERM\necho \"${{EPOCHREALTIME/./}}000\" >> {d}/hb\n\"$0\" &\nexit 0\n",
        d = dir.display()
    );
    std::fs::write(&path, body).unwrap();
    chmod(&path, 0o755);
    path
}

/// A program whose main thread exits while a second thread beats every 50 ms, after it left
/// the job's session and set SIGTERM aside; built with the system's C compiler.
fn build_threaded(dir: &Path) -> PathBuf {
    const SOURCE: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static const char *out;
static void *beat(void *arg) {
    (void)arg;
    for (int i = 0; i < 1200; i++) { /* a minute at most */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        FILE *f = fopen(out, "a");
        if (f) { fprintf(f, "%lld\n", t.tv_sec * 1000000000LL + t.tv_nsec); fclose(f); }
        usleep(50000);
    }
    return 0;
}
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    out = argv[1];
    setsid();
    signal(SIGTERM, SIG_IGN);
    pthread_t t;
    pthread_create(&t, 0, beat, 0);
    pthread_exit(0);
}
"#;
    build_c(dir, "threaded", SOURCE, &["-pthread"])
}

/// A program that leaves the job's session, makes itself non-dumpable and beats every 50 ms;
/// built with the system's C compiler.
fn build_undumpable(dir: &Path) -> PathBuf {
    const SOURCE: &str = r#"
#include <stdio.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    setsid();
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    for (int i = 0; i < 1200; i++) { /* a minute at most */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        FILE *f = fopen(argv[1], "a");
        if (f) { fprintf(f, "%lld\n", t.tv_sec * 1000000000LL + t.tv_nsec); fclose(f); }
        usleep(50000);
    }
    return 0;
}
"#;
    build_c(dir, "undumpable", SOURCE, &[])
}

/// `dir/NAME`, built from `source` with the system's C compiler.
fn build_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let status = std::process::Command::new(need_tool("cc", "gcc"))
        .arg("-O2")
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success(), "cc could not build {}", src.display());
    chmod(&bin, 0o755);
    bin
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The job of the first worker: start the escapee `way`, wait until it beats, exit 0.
fn escaping_job(way: Way, user: User, dir: &Path, other: Option<&Path>) -> String {
    // A PID namespace takes root, or a user namespace of one's own.
    let userns = if user == User::Nobody {
        "--user --map-root-user "
    } else {
        ""
    };
    let esc = write_escapee(dir).display().to_string();
    let chain = write_chain(dir).display().to_string();
    let threaded = || build_threaded(dir).display().to_string();
    let procs = || other.expect("a cgroup to move to").join("cgroup.procs");
    let start = match way {
        Way::Setsid => format!("setsid {esc} &"),
        Way::Setpgid => format!("perl -e 'setpgrp(0, 0); exec @ARGV' {esc} &"),
        Way::CgroupMove => format!("sh -c 'echo $$ > {} && exec {esc}' &", procs().display()),
        Way::OddName => {
            use std::os::unix::ffi::OsStrExt;
            let link = dir.join(std::ffi::OsStr::from_bytes(b"\xffesc"));
            std::os::unix::fs::symlink(&esc, link).unwrap();
            format!(
                "setsid sh -c 'echo $$ > {} && exec \"{}/$(printf \"\\377\")esc\"' &",
                procs().display(),
                dir.display()
            )
        }
        Way::DoubleFork | Way::ForeignProc => format!("setsid sh -c '{esc} & exit' &"),
        Way::SuPamSystemd => format!(
            "sh -c 'echo $$ > {} && exec setpriv --reuid=nobody --regid=nogroup --clear-groups {esc}' &",
            procs().display()
        ),
        Way::PidNamespace => format!("unshare {userns}--pid --fork --mount-proc {esc} &"),
        Way::ForkChain => format!("setsid {chain} & setsid {chain} & setsid {chain} &"),
        Way::MainThreadExited => format!("{} {}/hb &", threaded(), dir.display()),
        Way::Undumpable => format!(
            "{} {}/hb &",
            build_undumpable(dir).display(),
            dir.display()
        ),
    };
    format!(
        "{start} while [ ! -s {d}/hb ]; do sleep 0.01; done; exit 0",
        d = dir.display()
    )
}

/// The heartbeats written so far.
fn beats(dir: &Path) -> Vec<i128> {
    lines(&dir.join("hb"))
        .iter()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// `lead-exec ARGS` as `user`, inside a PID namespace whose /proc is the host's for
/// [`Way::ForeignProc`].
fn command_for(user: User, way: Way) -> Vec<&'static str> {
    let mut v = Vec::new();
    if way == Way::Undumpable {
        // A /proc of its own mount namespace, as root, before the user changes.
        v.extend([
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t proc -o hidepid=2 proc /proc && exec \"$0\" \"$@\"",
        ]);
    }
    if user == User::Nobody {
        // Without cargo's LD_LIBRARY_PATH, which may point into a directory only root can
        // read: the system's libraries are what an unprivileged user gets.
        v.extend([
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "env",
            "-u",
            "LD_LIBRARY_PATH",
        ]);
    }
    if way == Way::ForeignProc {
        v.push("unshare");
        if user == User::Nobody {
            v.extend(["--user", "--map-root-user"]);
        }
        // Under an init of its own that outlives it, as in a container: the namespace's
        // end would otherwise kill what lead-exec left behind.
        v.extend([
            "--pid",
            "--fork",
            "sh",
            "-c",
            "\"$0\" \"$@\"; s=$?; sleep 1; exit $s",
        ]);
    }
    v.push(bin());
    v
}

/// One cell: the escapee's beats stop before the next worker's job starts.
fn cell(etcd: &Etcd, way: Way, user: User, mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The escapee may run as nobody, and so may lead-exec.
    chmod(d, 0o777);
    let other = matches!(way, Way::CgroupMove | Way::SuPamSystemd | Way::OddName)
        .then(|| OtherCgroup::new(&format!("{way:?}-{mode}").to_lowercase()));
    let election = format!("esc-{way:?}-{user:?}-{mode}").to_lowercase();
    let ep = etcd.endpoints();
    let job = escaping_job(way, user, d, other.as_ref().map(|o| o.0.as_path()));
    let program = command_for(user, way);
    let mut args: Vec<&str> = program[1..].to_vec();
    args.extend(run_args(&election, &ep, &["--cgroup", mode], &job));
    let first = spawn_program(Path::new(program[0]), d, "first", &args, &[]);
    let what = format!("{way:?} as {user:?} with --cgroup {mode}");
    let mut first = first;
    assert!(
        wait_until(secs(15), || !beats(d).is_empty()),
        "{what}: the escapee never beat:\n{}",
        first.log_text()
    );
    let next_job = script(d, "date +%s%N > $D/next");
    let mut second = spawn(d, "second", &run_args(&election, &ep, &[], &next_job));
    assert_eq!(first.code(secs(15)), 0, "{what}:\n{}", first.log_text());
    assert_eq!(second.code(secs(15)), 0, "{what}:\n{}", second.log_text());
    let next = wait_int(&d.join("next"), secs(5)) as i128;
    // Long enough for a surviving escapee to beat several times more.
    std::thread::sleep(Duration::from_millis(300));
    let all = beats(d);
    let late: Vec<_> = all.iter().filter(|&&b| b >= next).collect();
    assert!(
        late.is_empty(),
        "{what}: the escapee beat {} times after the next leader's job started:\n{}",
        late.len(),
        first.log_text()
    );
    eprintln!(
        "{what}: last beat {:.1} ms before the next job",
        (next - all.iter().max().unwrap()) as f64 / 1e6
    );
}

/// Every mode for `user` but `--cgroup on` as nobody (refused: see below).
fn row(way: Way, users: &[User]) {
    let etcd = Etcd::start();
    for &user in users {
        for mode in MODES {
            if user == User::Nobody && mode == "on" {
                continue;
            }
            cell(&etcd, way, user, mode);
        }
    }
}

const BOTH: [User; 2] = [User::Root, User::Nobody];

#[test]
fn a_setsid_escapee_dies_with_the_term() {
    row(Way::Setsid, &BOTH);
}

#[test]
fn chains_of_processes_that_fork_and_exit_die_with_the_term() {
    row(Way::ForkChain, &BOTH);
}

#[test]
fn a_process_whose_main_thread_exited_dies_with_the_term() {
    row(Way::MainThreadExited, &BOTH);
}

#[test]
fn a_setpgid_escapee_dies_with_the_term() {
    row(Way::Setpgid, &BOTH);
}

/// Only root can move a process to another cgroup here.
#[test]
fn an_escapee_moved_to_another_cgroup_dies_with_the_term() {
    row(Way::CgroupMove, &[User::Root]);
}

/// Only the tree reaches it, which read /proc's files as UTF-8: its name made them unreadable,
/// and the walk passed it over.
#[test]
fn an_escapee_named_with_bytes_that_are_not_utf8_dies_with_the_term() {
    row(Way::OddName, &[User::Root]);
}

/// Only the tree reaches it, and /proc hides its files from lead-exec's user: its parent's
/// list of children still names it once it is pinned, so it is signalled through its pidfd.
#[test]
fn an_undumpable_escapee_under_hidepid_dies_with_the_term() {
    row(Way::Undumpable, &[User::Nobody]);
}

#[test]
fn a_double_forked_daemon_dies_with_the_term() {
    row(Way::DoubleFork, &BOTH);
}

/// `su -` through pam_systemd: the move to a session scope's cgroup, then the uid change.
#[test]
fn an_escapee_that_moved_cgroup_and_changed_user_dies_with_the_term() {
    row(Way::SuPamSystemd, &[User::Root]);
}

#[test]
fn an_escapee_in_a_pid_namespace_of_its_own_dies_with_the_term() {
    row(Way::PidNamespace, &BOTH);
}

#[test]
fn under_a_foreign_proc_a_daemon_still_dies_with_the_term() {
    row(Way::ForeignProc, &BOTH);
}

/// As nobody no cgroup can be made: `--cgroup on` refuses to start the job.
#[test]
fn as_an_unprivileged_user_cgroup_on_is_refused() {
    let f = Fixture::new();
    chmod(f.dir.path(), 0o777);
    let program = command_for(User::Nobody, Way::Setsid);
    let mut args: Vec<&str> = program[1..].to_vec();
    args.extend(run_args(
        "esc-refused",
        &f.ep,
        &["--cgroup", "on"],
        "echo ran > /dev/null",
    ));
    let mut w = spawn_program(Path::new(program[0]), f.dir.path(), "w", &args, &[]);
    assert_eq!(w.code(secs(15)), 70, "{}", w.log_text());
    assert!(
        w.log_text()
            .contains("--cgroup on: cannot create a cgroup v2"),
        "{}",
        w.log_text()
    );
}

/// Where /proc shows nothing of this PID namespace, the job's processes could not be found:
/// lead-exec refuses at start with 64 and one line that names the cause and the remedy,
/// before anything reaches etcd.
#[test]
fn without_a_proc_of_this_namespace_run_is_refused() {
    let f = Fixture::new();
    for mode in MODES {
        let inner = format!(
            "mount -t tmpfs none /proc && exec {} run no-proc --endpoints {ep} --cgroup {mode} -- true",
            bin(),
            ep = f.ep
        );
        let out = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &inner])
            .output()
            .expect("unshare (package util-linux)");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "--cgroup {mode}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("the job's processes cannot be seen here") && err.contains("--mount-proc"),
            "{err}"
        );
    }
    assert!(
        f.etcd.keys("lead-exec/").is_empty(),
        "something was written"
    );
}

/// Worker `a`, leading `election` without a cgroup, whose job leaves a daemon that ignores
/// SIGTERM and appends its token to `beats`, then mounts a tmpfs over /proc in the mount
/// namespace lead-exec and its watchdog share, and exits 0: the daemon is out of sight of
/// both. The worker, the daemon's pid and the watchdog's.
fn a_leader_that_hides_proc(f: &Fixture, election: &str) -> (Worker, i32, i32) {
    let d = f.dir.path();
    let job = script(
        d,
        "echo $PPID > $D/wd; setsid -f sh -c 'trap \"\" TERM; echo $$ > $D/daemon; \
         while :; do echo $FENCING_TOKEN >> $D/beats; sleep 0.05; done'; \
         while [ ! -s $D/daemon ]; do sleep 0.01; done; \
         mount -t tmpfs none /proc && echo masked > $D/masked; exit 0",
    );
    let mut args = vec!["-m", "--propagation", "private", bin()];
    args.extend(run_args(
        election,
        &f.ep,
        &["--id", "a", "--cgroup", "off"],
        &job,
    ));
    let unshare = need_tool("unshare", "util-linux");
    let a = spawn_program(&unshare, d, "a", &args, &[]);
    let daemon = wait_int(&d.join("daemon"), secs(10)) as i32;
    let wd = wait_int(&d.join("wd"), secs(10)) as i32;
    a.wait_job_started();
    wait_line(&d.join("masked"), secs(10), |_| true);
    (a, daemon, wd)
}

/// A job run as root that mounts over /proc in lead-exec's own mount namespace hides its
/// leftovers from every walk. What cannot be read counts as alive: the term is held, and no
/// other leader starts, until the watchdog, which waits for its children without /proc, says
/// they are gone. (Before, an empty walk read as "nothing left": lead-exec killed the
/// watchdog, its orphan went to init, and the next leader's job ran beside it.)
#[test]
fn a_job_that_hides_proc_holds_its_term_until_its_leftovers_are_gone() {
    let f = Fixture::new();
    let d = f.dir.path();
    let (mut a, daemon, _) = a_leader_that_hides_proc(&f, "hide");
    let b_job = script(d, "echo $FENCING_TOKEN > $D/b");
    let mut b = spawn(d, "b", &run_args("hide", &f.ep, &["--id", "b"], &b_job));
    a.wait_log("has not reported the job's group gone", secs(15));
    // Two more seconds of the orphan's beats, counted by its own writes: no next term.
    let beats = || lines(&d.join("beats")).len();
    let then = beats();
    assert!(
        wait_until(secs(20), || beats() >= then + 40),
        "the orphan stopped"
    );
    assert!(
        !d.join("b").exists(),
        "the next leader started beside the orphan:\n{}",
        a.log_text()
    );
    // The chase says so, from its own thread, as a line of the run.
    a.wait_log("of SIGKILLs", secs(15));
    let chase = a.log_text();
    let said = chase.lines().find(|l| l.contains("of SIGKILLs")).unwrap();
    assert!(said.ends_with(r#" election="hide" id="a""#), "{said}");
    // Once it is gone, the watchdog says so and the term ends as the job did.
    signal(daemon, libc::SIGKILL);
    let tb = wait_int(&d.join("b"), secs(15));
    assert_eq!(a.code(secs(10)), 0, "{}", a.log_text());
    let ta: i64 = lines(&d.join("beats"))[0].parse().unwrap();
    assert!(tb > ta);
    // The lease was renewed all along: the job's end is inside it, whatever deadline the
    // stop began under (the slack was measured against that one, and came out negative).
    let log = a.log_text();
    let slack: i64 = log
        .lines()
        .find(|l| l.contains("job ended"))
        .and_then(|l| l.split("slack_ms=").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no slack in:\n{log}"));
    assert!(slack > 0, "slack_ms={slack} inside a renewed lease:\n{log}");
    b.wait(secs(10));
}

/// lead-exec chases a job's leftovers before it kills a watchdog that has not reported them
/// gone; the lease is renewed meanwhile, and each renewal drops and makes again the wait that
/// runs the chase. A watchdog stopped during the chase is still killed once the leftovers
/// are gone (the kill used to be skipped when the wait it was due in had been dropped), and
/// the next leader starts: the stopped watchdog does not hold the term.
#[test]
fn a_watchdog_stopped_during_the_chase_is_killed_once_the_leftovers_are_gone() {
    let f = Fixture::new();
    let d = f.dir.path();
    let (mut a, daemon, wd) = a_leader_that_hides_proc(&f, "chasestop");
    let b_job = script(d, "echo $FENCING_TOKEN > $D/b");
    let mut b = spawn(
        d,
        "b",
        &run_args("chasestop", &f.ep, &["--id", "b"], &b_job),
    );
    a.wait_log("has not reported the job's group gone", secs(15));
    signal(wd, libc::SIGSTOP);
    // Renewals go on meanwhile (several a second under these lease settings): time, not an
    // event, is what this waits for, so that some of them fall inside the chase.
    std::thread::sleep(secs(3));
    assert!(
        !d.join("b").exists(),
        "the next leader started beside the leftover"
    );
    signal(daemon, libc::SIGKILL);
    // /proc shown again (a proc mounted over the tmpfs, which the watchdog, stopped at any
    // moment, may hold open against an unmount): the chase sees that nothing is left, and
    // ends.
    let nsenter = need_tool("nsenter", "util-linux");
    let pid = a.pid().to_string();
    let shown = std::process::Command::new(nsenter)
        .args(["-t", &pid, "-m", "mount", "-t", "proc", "proc", "/proc"])
        .status()
        .unwrap();
    assert!(shown.success());
    let next = wait_until(secs(15), || d.join("b").exists());
    if !next {
        signal(wd, libc::SIGKILL);
    }
    assert!(
        next,
        "the stopped watchdog held the term after the leftovers were gone:\n{}",
        a.log_text()
    );
    a.code(secs(10));
    b.wait(secs(10));
}

/// A frozen watchdog cannot reap: the zombies of the job's killed processes pile up in its
/// tree. Under a small descriptor limit (systemd's soft limit is 1,024), a walk that held a
/// descriptor for each of them ran out before it reached the live ones, skipped those
/// silently, and two such walks agreed that nothing was left: lead-exec killed the watchdog,
/// and the escapees went to init. A zombie's descriptor is now closed at once, and a process
/// that cannot be pinned counts as alive.
#[test]
fn a_frozen_watchdog_with_hundreds_of_escapees_under_a_small_descriptor_limit_leaves_none() {
    let f = Fixture::new();
    let d = f.dir.path();
    let job = script(
        d,
        "trap 'exit 0' TERM; \
         for i in $(seq 200); do setsid -f sh -c 'trap \"\" TERM; echo $$ >> $D/pids; exec sleep 1000'; done; \
         setsid -f sh -c 'trap \"\" TERM; echo $$ >> $D/pids; echo $$ > $D/daemon; \
           while :; do echo beat >> $D/beats; sleep 0.05; done'; \
         while :; do sleep 0.05; done",
    );
    let run = run_args("frozen-emfile", &f.ep, &["--cgroup", "off"], &job);
    let line = format!("ulimit -n 128; exec {} \"$@\"", bin());
    let mut args = vec!["-c", line.as_str(), "sh"];
    args.extend(run);
    let mut a = spawn_program(Path::new("/bin/sh"), d, "a", &args, &[]);
    let all = || lines(&d.join("pids")).len();
    assert!(wait_until(secs(30), || all() >= 201), "{} escapees", all());
    let freezer = freeze_the_watchdog_of(&a, "frozen-watchdog");
    a.signal(libc::SIGTERM);
    a.wait(secs(60));
    let left = kill_those_alive(&d.join("pids"));
    let _ = std::fs::write(freezer.0.join("cgroup.freeze"), "0");
    assert!(
        left.is_empty(),
        "{} of the job's processes outlived its term: {left:?}\n{}",
        left.len(),
        a.log_text()
    );
}

/// Moves lead-exec `a`'s watchdog into a cgroup v2 of its own and freezes it there: SIGCONT
/// cannot wake it, and it reaps nothing. Thawed and removed with the returned cgroup.
fn freeze_the_watchdog_of(a: &Worker, name: &str) -> OtherCgroup {
    let watchdog = *children(a.pid()).first().expect("the watchdog");
    let freezer = OtherCgroup::new(name);
    std::fs::write(freezer.0.join("cgroup.procs"), watchdog.to_string()).unwrap();
    std::fs::write(freezer.0.join("cgroup.freeze"), "1").unwrap();
    freezer
}

/// The processes listed in `pids_file` that are still alive, SIGKILLed once found (for the
/// next test's sake).
fn kill_those_alive(pids_file: &Path) -> Vec<i32> {
    let left: Vec<i32> = lines(pids_file)
        .iter()
        .filter_map(|p| p.parse().ok())
        .filter(|&p| alive(p))
        .collect();
    for &p in &left {
        signal(p, libc::SIGKILL);
    }
    left
}

/// As above, with lead-exec's cgroup out of task slots (its pids.max reached, as a job's
/// zombies under a frozen watchdog can fill systemd's TasksMax): no thread can be made for
/// the chase. lead-exec chases on its own thread instead of panicking (exit 101) and leaving
/// the job's processes to run on.
#[test]
fn a_full_pids_cgroup_does_not_stop_lead_exec_from_chasing_the_job() {
    let f = Fixture::new();
    let d = f.dir.path();
    // The pids controller: on this kind of host, cgroup v1's (the unified tree has none).
    let own = PidsCgroup::new("full-pids");
    let job = script(
        d,
        "trap 'exit 0' TERM; \
         for i in $(seq 40); do setsid -f sh -c 'trap \"\" TERM; echo $$ >> $D/pids; exec sleep 1000'; done; \
         while :; do sleep 0.05; done",
    );
    let run = run_args("full-pids", &f.ep, &["--cgroup", "off"], &job);
    let line = format!(
        "echo $$ > {}/cgroup.procs && exec {} \"$@\"",
        own.0.display(),
        bin()
    );
    let mut args = vec!["-c", line.as_str(), "sh"];
    args.extend(run);
    let mut a = spawn_program(Path::new("/bin/sh"), d, "a", &args, &[]);
    assert!(wait_until(secs(30), || lines(&d.join("pids")).len() >= 40));
    let freezer = freeze_the_watchdog_of(&a, "full-pids-watchdog");
    // Not one more task in lead-exec's cgroup.
    let current = std::fs::read_to_string(own.0.join("pids.current")).unwrap();
    std::fs::write(own.0.join("pids.max"), current.trim()).unwrap();
    a.signal(libc::SIGTERM);
    let status = a.wait(secs(60));
    let left = kill_those_alive(&d.join("pids"));
    let _ = std::fs::write(own.0.join("pids.max"), "max");
    let _ = std::fs::write(freezer.0.join("cgroup.freeze"), "0");
    assert_ne!(
        status.code(),
        Some(101),
        "lead-exec panicked:\n{}",
        a.log_text()
    );
    assert!(
        left.is_empty(),
        "{} outlived the term: {left:?}\n{}",
        left.len(),
        a.log_text()
    );
}

/// A cgroup v1 pids group for one test; its tasks are killed and it is removed on drop.
struct PidsCgroup(PathBuf);

impl PidsCgroup {
    fn new(name: &str) -> PidsCgroup {
        let root = Path::new("/sys/fs/cgroup/pids");
        assert!(
            root.join("cgroup.procs").exists(),
            "no cgroup v1 pids hierarchy at {} (the kernel's pids controller, run as root)",
            root.display()
        );
        let dir = root.join(format!("test-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot make {}: {e}", dir.display()));
        PidsCgroup(dir)
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("pids.max"), "max");
        for p in lines(&self.0.join("cgroup.procs")) {
            if let Ok(p) = p.parse() {
                signal(p, libc::SIGKILL);
            }
        }
        wait_until(secs(2), || std::fs::remove_dir(&self.0).is_ok());
    }
}
