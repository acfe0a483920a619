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

use crate::config::RunConfig;

/// The variables set for the job.
pub fn job_env(
    cfg: &RunConfig,
    token: i64,
    slot: u32,
    key: &str,
    lease: i64,
) -> Vec<(String, String)> {
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
    // Empty without --metrics-addr: a lead-exec run inside a job must not count its own job's
    // refusals in the outer lead-exec's file.
    let refusals = crate::metrics::check_refusals_path()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    env.push((crate::metrics::CHECK_REFUSALS_VAR.to_string(), refusals));
    env
}
