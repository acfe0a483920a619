//! The pipe protocol between lead-exec and its watchdog: one text line per message.
//!
//! lead-exec → watchdog (`Order`), watchdog → lead-exec (`Report`). Text keeps it debuggable
//! with strace; every message is far below `PIPE_BUF`, so writes are atomic.

use crate::exit::JobStatus;

/// The watchdog's process name (comm) and `argv[0]`. It shares no three letters in a row with
/// "lead-exec", so that no `pkill`/`killall` pattern of three letters or more that matches
/// one enforcer's name (`exec`, `lead`, `lead-exec`) matches the other's too.
pub const NAME: &str = "ldx-warden";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// New deadlines on CLOCK_BOOTTIME (ns): SIGTERM at `term_at`, SIGKILL at `kill_at`.
    Deadline { term_at: u64, kill_at: u64 },
    /// Pass this signal on to the group.
    Forward(i32),
    /// Send this signal to the group now, SIGKILL after the grace (or at the deadline, if
    /// sooner).
    Stop(i32),
    /// SIGKILL the group now.
    Kill,
}

/// How the job's process group came to end, as the watchdog saw it (the job's own exit,
/// a stop, the deadline, a lost parent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupEnd {
    /// The job's main process exited on its own.
    SelfExit,
    /// lead-exec asked for the stop.
    Stop,
    /// The lease deadline passed without an extension.
    Deadline,
    /// lead-exec went away (pipe EOF or parent death).
    Orphaned,
    /// The watchdog itself died (seen by lead-exec only, never sent).
    WatchdogLost,
}

impl GroupEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupEnd::SelfExit => "self",
            GroupEnd::Stop => "stop",
            GroupEnd::Deadline => "deadline",
            GroupEnd::Orphaned => "orphaned",
            GroupEnd::WatchdogLost => "watchdog-lost",
        }
    }

    fn parse(s: &str) -> Option<GroupEnd> {
        Some(match s {
            "self" => GroupEnd::SelfExit,
            "stop" => GroupEnd::Stop,
            "deadline" => GroupEnd::Deadline,
            "orphaned" => GroupEnd::Orphaned,
            "watchdog-lost" => GroupEnd::WatchdogLost,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The job cgroup the watchdog made (ahead, while it waits): lead-exec kills it by this
    /// path when the watchdog cannot.
    Cgroup { path: std::ffi::OsString },
    /// The job runs; `contained` says whether in a cgroup of its own (always also in its process
    /// group and the watchdog's tree).
    Spawned { pid: i32, contained: bool },
    /// exec failed with this errno (ENOENT → 127, EACCES → 126).
    ExecFailed { errno: i32 },
    /// The deadline was spent when the watchdog was about to fork: no job was started.
    TooLate,
    /// The watchdog could not set up (e.g. `--cgroup on` without cgroup v2).
    SetupFailed { message: String },
    /// The job's main process exited with `status`; the rest of the job is being stopped
    /// (TERM now, SIGKILL after the grace). lead-exec then knows the end it waits for even
    /// if the watchdog stops before it can say [`Report::Ended`].
    LeaderExited { status: JobStatus },
    /// The whole group is gone and reaped. `slack_ms` = lease deadline − time of death.
    Ended {
        status: JobStatus,
        cause: GroupEnd,
        slack_ms: i64,
    },
}

impl Report {
    /// The report's kind, for a log line.
    pub fn name(&self) -> &'static str {
        match self {
            Report::Cgroup { .. } => "cgroup",
            Report::Spawned { .. } => "spawned",
            Report::ExecFailed { .. } => "exec failed",
            Report::TooLate => "too late",
            Report::SetupFailed { .. } => "setup failed",
            Report::LeaderExited { .. } => "leader exited",
            Report::Ended { .. } => "ended",
        }
    }
}

/// Bytes as hex, so that any byte but NUL survives one text line.
fn hex(s: &mut String, bytes: &[u8]) {
    use std::fmt::Write;
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
}

fn unhex(hex: &str) -> Option<std::ffi::OsString> {
    use std::os::unix::ffi::OsStringExt;
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
        .map(std::ffi::OsString::from_vec)
}

/// The job's command line, the message that starts it: `A` and each argument in hex.
pub fn encode_command(argv: &[std::ffi::OsString]) -> String {
    let mut s = String::from("A");
    for a in argv {
        s.push(' ');
        hex(&mut s, a.as_encoded_bytes());
    }
    s.push('\n');
    s
}

pub fn decode_command(line: &[u8]) -> Option<Vec<std::ffi::OsString>> {
    let line = std::str::from_utf8(line).ok()?;
    let line = line.strip_suffix('\n').unwrap_or(line);
    let mut w = line.split(' ');
    if w.next()? != "A" {
        return None;
    }
    let argv = w.map(unhex).collect::<Option<Vec<_>>>()?;
    (!argv.is_empty()).then_some(argv)
}

/// Everything a watchdog waiting on its pipe needs to start the job, as one write: the job's
/// variables (`V name value`, hex), its deadline (`D`), then its command (`A`), which starts
/// it. The watchdog is started before the term is won, so none of these can be in its argv.
pub fn encode_start(
    env: &[(String, String)],
    deadline: Order,
    argv: &[std::ffi::OsString],
) -> String {
    let mut s = String::new();
    for (k, v) in env {
        s.push_str("V ");
        hex(&mut s, k.as_bytes());
        s.push(' ');
        hex(&mut s, v.as_bytes());
        s.push('\n');
    }
    s.push_str(&deadline.encode());
    s.push_str(&encode_command(argv));
    s
}

/// One line of [`encode_start`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartLine {
    Var(std::ffi::OsString, std::ffi::OsString),
    Deadline { term_at: u64, kill_at: u64 },
    Command(Vec<std::ffi::OsString>),
}

pub fn decode_start_line(line: &[u8]) -> Option<StartLine> {
    match line.first()? {
        b'A' => decode_command(line).map(StartLine::Command),
        b'V' => {
            // Only the newline goes: an empty value is an empty last word.
            let line = std::str::from_utf8(line).ok()?.trim_end_matches('\n');
            let mut w = line.split(' ').skip(1);
            let (k, v) = (unhex(w.next()?)?, unhex(w.next()?)?);
            (!k.is_empty() && w.next().is_none()).then_some(StartLine::Var(k, v))
        }
        _ => match Order::decode(std::str::from_utf8(line).ok()?)? {
            Order::Deadline { term_at, kill_at } => Some(StartLine::Deadline { term_at, kill_at }),
            _ => None,
        },
    }
}

impl Order {
    pub fn encode(&self) -> String {
        match self {
            Order::Deadline { term_at, kill_at } => format!("D {term_at} {kill_at}\n"),
            Order::Forward(s) => format!("S {s}\n"),
            Order::Stop(s) => format!("T {s}\n"),
            Order::Kill => "K\n".to_string(),
        }
    }

    pub fn decode(line: &str) -> Option<Order> {
        let mut w = line.split_whitespace();
        let cmd = match w.next()? {
            "D" => Order::Deadline {
                term_at: w.next()?.parse().ok()?,
                kill_at: w.next()?.parse().ok()?,
            },
            "S" => Order::Forward(w.next()?.parse().ok()?),
            "T" => Order::Stop(w.next()?.parse().ok()?),
            "K" => Order::Kill,
            _ => return None,
        };
        Some(cmd)
    }
}

impl Report {
    pub fn encode(&self) -> String {
        match self {
            Report::Cgroup { path } => {
                let mut s = String::from("C ");
                hex(&mut s, path.as_encoded_bytes());
                s.push('\n');
                s
            }
            Report::Spawned { pid, contained } => format!("P {pid} {}\n", u8::from(*contained)),
            Report::ExecFailed { errno } => format!("E {errno}\n"),
            Report::TooLate => "L\n".to_string(),
            Report::SetupFailed { message } => format!("F {}\n", message.replace('\n', " ")),
            Report::LeaderExited { status } => {
                let (kind, n) = status_words(*status);
                format!("G {kind} {n}\n")
            }
            Report::Ended {
                status,
                cause,
                slack_ms,
            } => {
                let (kind, n) = status_words(*status);
                format!("X {kind} {n} {} {slack_ms}\n", cause.as_str())
            }
        }
    }

    pub fn decode(line: &str) -> Option<Report> {
        let line = line.trim_end();
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        let mut w = rest.split_whitespace();
        Some(match tag {
            "C" => Report::Cgroup {
                path: unhex(w.next()?).filter(|p| !p.is_empty())?,
            },
            "P" => Report::Spawned {
                pid: w.next()?.parse().ok()?,
                contained: w.next()? == "1",
            },
            "E" => Report::ExecFailed {
                errno: w.next()?.parse().ok()?,
            },
            "L" => Report::TooLate,
            "F" => Report::SetupFailed {
                message: rest.to_string(),
            },
            "G" => Report::LeaderExited {
                status: parse_status(w.next()?, w.next()?)?,
            },
            "X" => {
                let status = parse_status(w.next()?, w.next()?)?;
                Report::Ended {
                    status,
                    cause: GroupEnd::parse(w.next()?)?,
                    slack_ms: w.next()?.parse().ok()?,
                }
            }
            _ => return None,
        })
    }
}

fn status_words(status: JobStatus) -> (&'static str, i32) {
    match status {
        JobStatus::Exited(c) => ("exit", c),
        JobStatus::Signaled(s) => ("signal", s),
    }
}

fn parse_status(kind: &str, n: &str) -> Option<JobStatus> {
    let n: i32 = n.parse().ok()?;
    match kind {
        "exit" => Some(JobStatus::Exited(n)),
        "signal" => Some(JobStatus::Signaled(n)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No pattern of three letters or more matches both enforcers' names.
    #[test]
    fn the_watchdog_shares_no_three_letters_with_lead_exec() {
        let parts = |s: &str| -> Vec<String> {
            let b = s.as_bytes();
            (3..=b.len())
                .flat_map(|n| {
                    b.windows(n)
                        .map(|w| String::from_utf8_lossy(w).into_owned())
                })
                .collect()
        };
        for p in parts("lead-exec") {
            assert!(!NAME.contains(&p), "{NAME} contains {p:?}");
        }
        for p in parts(NAME) {
            assert!(!"lead-exec".contains(&p), "lead-exec contains {p:?}");
        }
        // The kernel keeps 15 bytes of a process name.
        assert!(NAME.len() <= 15);
    }

    #[test]
    fn orders_round_trip() {
        for c in [
            Order::Deadline {
                term_at: 1,
                kill_at: u64::MAX,
            },
            Order::Forward(10),
            Order::Stop(15),
            Order::Kill,
        ] {
            assert_eq!(Order::decode(&c.encode()), Some(c));
        }
        assert_eq!(Order::decode("bogus"), None);
    }

    #[test]
    fn commands_lines_round_trip() {
        use std::os::unix::ffi::OsStringExt;
        let argv: Vec<std::ffi::OsString> = vec![
            "sh".into(),
            "-c".into(),
            "echo 'a b'\n# lead-exec".into(),
            std::ffi::OsString::from_vec(vec![0xff, 0x01]),
            "".into(),
        ];
        let line = encode_command(&argv);
        assert_eq!(line.matches('\n').count(), 1);
        assert!(!line.contains("lead-exec"));
        assert_eq!(decode_command(line.as_bytes()), Some(argv));
        assert_eq!(decode_command(b"A\n"), None);
        assert_eq!(decode_command(b"A 6\n"), None);
        assert_eq!(decode_command(b"D 1 2\n"), None);
    }

    #[test]
    fn a_start_carries_the_variables_the_deadline_and_the_command() {
        let env = vec![
            ("FENCING_TOKEN".to_string(), "42".to_string()),
            ("X".into(), "a b\nc".into()),
            ("EMPTY".into(), String::new()),
        ];
        let deadline = Order::Deadline {
            term_at: 5,
            kill_at: 9,
        };
        let argv: Vec<std::ffi::OsString> = vec!["sh".into(), "-c".into(), "echo hi".into()];
        let text = encode_start(&env, deadline, &argv);
        let lines: Vec<_> = text
            .split_inclusive('\n')
            .map(|l| decode_start_line(l.as_bytes()))
            .collect();
        assert_eq!(
            lines,
            vec![
                Some(StartLine::Var("FENCING_TOKEN".into(), "42".into())),
                Some(StartLine::Var("X".into(), "a b\nc".into())),
                Some(StartLine::Var("EMPTY".into(), "".into())),
                Some(StartLine::Deadline {
                    term_at: 5,
                    kill_at: 9
                }),
                Some(StartLine::Command(argv)),
            ]
        );
        assert_eq!(decode_start_line(b"K\n"), None);
        assert_eq!(decode_start_line(b"V zz\n"), None);
    }

    #[test]
    fn reports_round_trip() {
        for r in [
            Report::Spawned {
                pid: 42,
                contained: true,
            },
            Report::Spawned {
                pid: 42,
                contained: false,
            },
            Report::Cgroup {
                path: "/sys/fs/cgroup/a b/lead-exec-job-1-00".into(),
            },
            Report::ExecFailed { errno: 2 },
            Report::TooLate,
            Report::SetupFailed {
                message: "no cgroup v2 here".into(),
            },
            Report::LeaderExited {
                status: JobStatus::Exited(3),
            },
            Report::LeaderExited {
                status: JobStatus::Signaled(15),
            },
            Report::Ended {
                status: JobStatus::Exited(7),
                cause: GroupEnd::SelfExit,
                slack_ms: 900,
            },
            Report::Ended {
                status: JobStatus::Signaled(9),
                cause: GroupEnd::Deadline,
                slack_ms: -3,
            },
        ] {
            assert_eq!(Report::decode(&r.encode()), Some(r));
        }
    }
}
