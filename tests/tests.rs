//! Integration tests against the built binary and real etcd processes.
//!
//! Where new tests go:
//! - `cli`: bad input, exit codes, the job's environment
//! - `exclusion`: mutual exclusion and token order across workers
//! - `signals`: signals to lead-exec and their effect on the job's group
//! - `fail_closed`: etcd unreachable, lost key, expired candidates
//! - `availability`: riding through routine etcd trouble (connections kept, `--wait` per wait)
//! - `watchdog`: the job never outlives lead-exec (SIGKILL, SIGSTOP, escapees, descriptors)
//! - `footprint`: what a candidate keeps while it waits (a watchdog only when next in line, not
//!   its start-up stack)
//! - `containment`: no process of the job outlives its term, wherever it moves (lead-exec-safety(7)'s
//!   escape table: setsid, setpgid, cgroup moves, daemons, PID namespaces; root and not)
//! - `interop`: coexistence with `etcdctl elect`
//! - `chaos`: named faults on a three-member etcd, checked over a fenced ledger and a history
//!   (including the routine ones: a member down, a rolling restart, a lost reply); real
//!   partitions in network namespaces are the `partition_*` tests
//! - `ops`: status, watch, resign, pause, history, check, run keys
//! - `scheduling`: the scheduling controls (`--timeout`, `--slots`)
//! - `security`: TLS with client certificates, user/password auth
//! - `observability`: metrics, logs, systemd notify, completions
//! - `docs`: the man pages match the clap definition and their Markdown; the pages name only
//!   flags, tests and pages that exist; the README's recipes run as written
//! - `postgres`: the fencing contract on a real PostgreSQL (`contrib/postgres/fencing.sql`):
//!   terms writing through it, a frozen old leader refused, concurrent writers interleaved
//! - `systemd`: the example units under a real systemd booted in a container (systemd-nspawn,
//!   `harness::systemd`): notify, watchdog, stop, kill, journald, cgroups, a timer; where no
//!   container can be booted the tier says so in one line and its tests do nothing
//!   (`LEAD_EXEC_REQUIRE_SYSTEMD=1`, as CI sets, makes that a failure)
//! - `checker`: the history checker flags overlaps (more than N jobs with slots), stale writes,
//!   token regressions and late beats, and names the cause of each liveness gap
//!
//! The harness (etcd clusters, the fault proxy, workers, waiting helpers, the history
//! checker, a throwaway PostgreSQL) is the `harness` crate in `tests/harness`, shared with the examples.
//! A test opens with `let f = Fixture::new();` (a one-member etcd, a temp dir and the endpoints:
//! `f.etcd`, `f.dir`, `f.ep`), or `Fixture::with(Etcd::start3())` around another cluster.

mod availability;
mod chaos;
mod checker;
mod cli;
mod containment;
mod docs;
mod exclusion;
mod fail_closed;
mod footprint;
mod interop;
mod observability;
mod ops;
mod postgres;
mod scheduling;
mod security;
mod signals;
mod systemd;
mod watchdog;
