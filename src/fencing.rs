//! The fencing token and the environment a job receives.
//!
//! The token is the create revision of the leader's key. etcd revisions are cluster-wide,
//! strictly increasing and durable, and a candidate leads only after every key created before
//! its own is gone, so each term's token is larger than every earlier term's. A downstream
//! resource that remembers the highest token it accepted and rejects lower ones is safe even
//! against a frozen old leader.
//!
//! With `--slots N` each of up to N holders gets its own key's create revision: unique, and
//! larger than that of every key created before it. `LEAD_EXEC_SLOT` (0..N−1) is unique among
//! the live holders, so a resource split N ways fences each part by slot. A slot's next holder
//! usually carries a larger token than its last, but one that queued longer (an older key)
//! can carry a smaller one; a resource that fences per slot then rejects it, which fails
//! closed.

use std::path::Path;

use crate::config::RunConfig;

/// What the job is told of the term it runs in.
#[derive(Debug, Clone, Copy)]
pub struct TermFacts<'a> {
    pub token: i64,
    pub slot: u32,
    /// The leader key.
    pub key: &'a str,
    pub lease: i64,
    /// With `--attempts`, the attempt at the run key this term claimed.
    pub attempt: Option<u32>,
}

/// The variables set for the job. `refusals` is the file its `lead-exec check` counts
/// refusals in, with `--metrics-addr`.
pub fn job_env(
    cfg: &RunConfig,
    term: TermFacts<'_>,
    refusals: Option<&Path>,
) -> Vec<(String, String)> {
    let TermFacts {
        token,
        slot,
        key,
        lease,
        attempt,
    } = term;
    let mut env = vec![
        ("FENCING_TOKEN".to_string(), token.to_string()),
        ("LEAD_EXEC_SLOT".to_string(), slot.to_string()),
        (
            "LEAD_EXEC_ELECTION".to_string(),
            cfg.election.name().to_string(),
        ),
        ("LEAD_EXEC_LEADER_KEY".to_string(), key.to_string()),
        ("LEAD_EXEC_LEASE_ID".to_string(), format!("{lease:x}")),
        ("LEAD_EXEC_ID".to_string(), cfg.id.clone()),
        (
            "LEAD_EXEC_ENDPOINTS".to_string(),
            cfg.conn.endpoints.join(","),
        ),
    ];
    if let Some(k) = &cfg.run_key {
        env.push(("LEAD_EXEC_RUN_KEY".to_string(), k.clone()));
    }
    if let Some(p) = &cfg.period {
        env.push(("LEAD_EXEC_PERIOD_START".to_string(), p.start.clone()));
    }
    if let Some(n) = attempt {
        env.push(("LEAD_EXEC_ATTEMPT".to_string(), n.to_string()));
    }
    // Empty without --metrics-addr: a lead-exec run inside a job must not count its own job's
    // refusals in the outer lead-exec's file.
    let refusals = refusals
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    env.push((crate::metrics::CHECK_REFUSALS_VAR.to_string(), refusals));
    env
}

#[cfg(test)]
mod tests {
    fn config(flags: &[&str]) -> crate::config::RunConfig {
        use clap::Parser;
        let args = [&["lead-exec", "run", "x"], flags, &["--", "true"]].concat();
        let crate::cli::Command::Run(crate::cli::Deferred(a)) =
            crate::cli::Cli::try_parse_from(args).unwrap().command
        else {
            unreachable!()
        };
        crate::config::RunConfig::from_args(&a).unwrap()
    }

    fn term(attempt: Option<u32>) -> super::TermFacts<'static> {
        super::TermFacts {
            token: 2,
            slot: 0,
            key: "k",
            lease: 1,
            attempt,
        }
    }

    /// The man pages' ENVIRONMENT section names every variable a job gets, with --run-key,
    /// --every, --attempts and --metrics-addr (which add theirs).
    #[test]
    fn the_manual_names_every_variable_of_the_job() {
        for flags in [&["--run-key", "k"][..], &["--every", "1h"]] {
            let cfg = config(flags);
            let refusals = Some(std::path::Path::new("/run/x"));
            for (name, _) in super::job_env(&cfg, term(Some(1)), refusals) {
                assert!(
                    crate::cli::manual::JOB_ENVIRONMENT
                        .iter()
                        .any(|(n, _)| *n == name),
                    "{name} is not in the manual"
                );
            }
        }
    }

    /// `--every` gives the job its period's key as the run key, and the period's start.
    #[test]
    fn every_gives_the_job_the_run_key_and_the_period_start() {
        let cfg = config(&["--every", "1h"]);
        let env = super::job_env(&cfg, term(None), None);
        let get = |name: &str| {
            env.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let p = cfg.period.clone().unwrap();
        assert_eq!(get("LEAD_EXEC_RUN_KEY"), p.key);
        assert_eq!(get("LEAD_EXEC_PERIOD_START"), p.start);
        assert!(p.start.ends_with(":00:00Z"), "{}", p.start);
        // Without --every there is no period.
        let env = super::job_env(&config(&["--run-key", "k"]), term(None), None);
        assert!(!env.iter().any(|(n, _)| n == "LEAD_EXEC_PERIOD_START"));
    }
}
