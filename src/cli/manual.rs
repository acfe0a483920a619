//! The man pages' sections beyond the flags: exit status, environment, signals, examples.
//! Rendered after clap_mangen's own sections, from the tables here, so that every page
//! says the same and `tests/docs.rs` catches a page that drifted.

/// Every exit status, as scripts branch on it (see [`crate::exit::Exit`]).
pub const EXIT_STATUS: [(&str, &str); 18] = [
    ("0", "the job exited 0; or a command that runs no job succeeded; or the --run-key was already done (with --attempts: an attempt on another worker succeeded)"),
    ("1-255", "the job's own exit code, passed through"),
    ("3", "status, resign: the election has no leader (none, or paused)"),
    ("4", "check, resign --token: the token is not the leader's"),
    ("64", "usage: bad flags, durations, names or unsafe settings"),
    ("69", "etcd unavailable, or no answer within --dial-timeout or --command-timeout; also resign or pause whose leader did not stop its job within --timeout"),
    ("70", "internal error (also: --cgroup on without cgroup v2)"),
    ("74", "an operator command could not write its output (stdout closed at start, a full disk)"),
    ("75", "not acquired: someone else leads and --no-wait or --wait gave up (--conflict-exit-code); with --attempts and --every, also a worker elected once the run key's period is over"),
    ("76", "leadership lost while the job ran, with --on-loss exit, or stopped while a lost term's job was being stopped"),
    ("77", "etcd refused the credentials"),
    ("79", "not acquired: this worker's --health-cmd kept failing, so it did not campaign"),
    ("80", "--attempts N: all N attempts at the run key failed (on any workers); every worker of the election exits 80 for that key"),
    ("124", "the job ran past --timeout and was stopped"),
    ("126", "the command cannot be executed"),
    ("127", "the command was not found"),
    ("128+N", "lead-exec was stopped by signal N while waiting in line, or the job died of signal N; when a stop signal (HUP, INT, TERM) to lead-exec ended the run so, lead-exec dies of that signal, as timeout(1) does, so that systemd sees a clean stop"),
    ("137", "the job was killed (SIGKILL) after the grace"),
];

/// The variables every job gets (see [`crate::fencing::job_env`]).
pub const JOB_ENVIRONMENT: [(&str, &str); 11] = [
    ("FENCING_TOKEN", "this term's token: decimal, strictly larger than every earlier term's. Pass it to every write, and have the resource refuse a lower one."),
    ("LEAD_EXEC_SLOT", "the slot this term holds, 0 to N-1 under --slots N (0 with one slot)"),
    ("LEAD_EXEC_ELECTION", "the election name"),
    ("LEAD_EXEC_LEADER_KEY", "the leader key, lead-exec/elections/NAME/<lease hex>"),
    ("LEAD_EXEC_LEASE_ID", "the lease ID, in hex"),
    ("LEAD_EXEC_ID", "the candidate ID (--id)"),
    ("LEAD_EXEC_ENDPOINTS", "the etcd endpoints, so that lead-exec check works inside the job"),
    ("LEAD_EXEC_RUN_KEY", "the --run-key, when given, or the one --every made (20261206T0100Z)"),
    ("LEAD_EXEC_PERIOD_START", "with --every, the start of the period this run is for, in RFC 3339 UTC (2026-12-06T01:00:00Z)"),
    ("LEAD_EXEC_ATTEMPT", "with --attempts, which attempt at the run key this is: 1 to N"),
    ("LEAD_EXEC_CHECK_REFUSALS", "with --metrics-addr, the file where lead-exec check counts its refusals"),
];

const SIGNALS: &str =
    "While the job runs, TERM, INT, HUP, QUIT, USR1 and USR2 sent to lead-exec are \
forwarded to the job's process group. TERM, INT, HUP and QUIT also end the run: lead-exec waits \
out --grace, SIGKILLs what is left of the job, resigns and exits with the job's code; a second \
TERM or INT skips the rest of the grace. While waiting in line, they cancel at once (exit 128+N). \
Ctrl-Z (TSTP, TTIN, TTOU) stops the job, then lead-exec; CONT continues both. A signal ignored \
when lead-exec started (nohup) stays ignored. If lead-exec cannot renew its lease, the job gets \
SIGTERM, then SIGKILL, before the lease can expire on the server, even if lead-exec itself is \
frozen or killed.";

/// Examples for each page, by subcommand ("" for lead-exec(1)).
fn examples(sub: &str) -> &'static [(&'static str, &'static str)] {
    match sub {
        "" | "run" => &[
            (
                "One settlement per 5 minutes across the fleet, from every worker's crontab (the run key is the tick's start in UTC, the same on every worker):",
                "*/5 * * * * lead-exec run settle -q --no-wait --every 5m -- /opt/settle",
            ),
            (
                "A long-running leader under systemd (ExecStart=):",
                "lead-exec run ingest --ttl 15s -- /usr/local/bin/ingest --follow",
            ),
        ],
        "status" => &[("Who leads, as JSON:", "lead-exec status settle -o json")],
        "watch" => &[("Print every change of leader:", "lead-exec watch settle")],
        "resign" => &[("Move leadership, only if token 42 still leads:", "lead-exec resign settle --token 42")],
        "pause" => &[(
            "Stop the job everywhere before maintenance, and wait until it has stopped:",
            "lead-exec pause settle --reason \"db upgrade\" && start-maintenance",
        )],
        "resume" => &[("Lift the pause:", "lead-exec resume settle")],
        "history" => &[("Every recorded term:", "lead-exec history settle -n all")],
        "check" => &[(
            "Inside the job, before a write that must not come from a deposed leader:",
            "lead-exec check && commit-batch",
        )],
        "completions" => &[("Bash completions:", "lead-exec completions bash > /etc/bash_completion.d/lead-exec")],
        _ => &[],
    }
}

/// Text as roff sees it: backslashes and hyphens escaped, no line starting a request.
fn roff(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with(['.', '\'']) {
        format!("\\&{t}")
    } else {
        t
    }
}

fn table(out: &mut String, rows: &[(&str, &str)]) {
    for (term, text) in rows {
        out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(term), roff(text)));
    }
}

/// The sections that follow clap_mangen's for the page of `sub` ("" for lead-exec(1)).
pub fn extra_sections(sub: &str, subs: &[&str]) -> String {
    let mut out = String::new();
    out.push_str(".SH \"EXIT STATUS\"\n");
    table(&mut out, &EXIT_STATUS);
    if matches!(sub, "" | "run" | "check") {
        out.push_str(".SH ENVIRONMENT\n");
        out.push_str(&format!(
            "{}\n",
            roff("Every flag also reads a LEAD_EXEC_* variable (shown with each flag). The job gets these:")
        ));
        table(&mut out, &JOB_ENVIRONMENT);
    }
    if matches!(sub, "" | "run") {
        out.push_str(&format!(".SH SIGNALS\n{}\n", roff(SIGNALS)));
    }
    let ex = examples(sub);
    if !ex.is_empty() {
        out.push_str(".SH EXAMPLES\n");
        for (what, line) in ex {
            out.push_str(&format!(
                ".PP\n{}\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n",
                roff(what),
                roff(line)
            ));
        }
    }
    out.push_str(".SH \"SEE ALSO\"\n");
    out.push_str(&roff(&see_also(sub, subs)));
    out.push('\n');
    out
}

/// Every page ends by naming the others: the command pages but its own (`subs`: every
/// subcommand with a page), then the reference.
fn see_also(sub: &str, subs: &[&str]) -> String {
    let mut pages: Vec<String> = std::iter::once("")
        .chain(subs.iter().copied())
        .filter(|p| *p != sub)
        .map(|p| match p {
            "" => "lead-exec(1)".to_string(),
            p => format!("lead-exec-{p}(1)"),
        })
        .collect();
    pages.push(
        "lead-exec-operations(7) (settings in detail, operator commands, cron, systemd, metrics)"
            .into(),
    );
    pages.push("lead-exec-safety(7) (why it is safe, the fencing contract, where it stops)".into());
    pages.push("lead-exec-development(7) (tests, benchmarks, source layout)".into());
    pages.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_code_has_a_line() {
        use crate::exit::Exit;
        let codes = [
            Exit::Ok,
            Exit::NoLeader,
            Exit::StaleToken,
            Exit::Usage,
            Exit::Unavailable,
            Exit::Software,
            Exit::IoErr,
            Exit::NotAcquired(Exit::DEFAULT_CONFLICT),
            Exit::LeadershipLost,
            Exit::Auth,
            Exit::Unhealthy,
            Exit::AttemptsExhausted,
            Exit::TimedOut,
            Exit::NotExecutable,
            Exit::NotFound,
        ];
        for e in codes {
            let code = e.code().to_string();
            assert!(
                EXIT_STATUS.iter().any(|(c, _)| *c == code),
                "{code} missing"
            );
        }
    }

    #[test]
    fn roff_text_cannot_start_a_request() {
        assert_eq!(roff(".x-y"), "\\&.x\\-y");
        assert_eq!(roff("a\\b"), "a\\eb");
    }
}
