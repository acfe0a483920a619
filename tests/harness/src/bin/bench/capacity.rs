//! `capacity`: what waiting candidates cost etcd, and how many one etcd serves.

use std::time::Duration;

use anyhow::Result;
use harness::measure::report::{Report, Row};
use harness::measure::worker::{Tool, WorkerSpec};

use super::scale::idle_rates;
use super::{Cx, SCALE_TTL_S};

/// The share of etcd's write capacity that keepalives may take in the sizing rule.
pub(crate) const KEEPALIVE_SHARE: f64 = 0.10;

/// What waiting candidates cost etcd, and how many one etcd can serve.
pub(crate) fn capacity(cx: &Cx) -> Result<Report> {
    let n = cx.n(200, 50);
    let window = Duration::from_secs(SCALE_TTL_S * 3);
    let before = cx.etcd.gauges()?;
    let election = cx.unique("cap");
    let ep = cx.etcd.endpoint.clone();
    let ttl = format!("{SCALE_TTL_S}s");
    let args = ["--ttl", ttl.as_str()];
    let mut workers = Vec::new();
    for i in 0..n {
        let id = format!("c{i}");
        let script = "trap 'exit 0' TERM; while :; do sleep 1000 & wait; done";
        workers.push(cx.spawn(WorkerSpec {
            lead_exec_args: &args,
            ttl_s: SCALE_TTL_S,
            ..WorkerSpec::fast(Tool::LeadExec, &election, &ep, &id, script)
        })?);
    }
    cx.wait_keys(
        &Tool::LeadExec.prefix(&election),
        n as u64,
        Duration::from_secs(60 + n as u64 / 10),
    )?;
    let rates = idle_rates(cx, window)?;
    let after = cx.etcd.gauges()?;
    drop(workers);
    let per = |k: &str| (after.get(k).unwrap_or(&0.0) - before.get(k).unwrap_or(&0.0)) / n as f64;
    let mem_kib = per("process_resident_memory_bytes") / 1024.0;
    let heap_kib = per("go_memstats_heap_inuse_bytes") / 1024.0;
    let watches = per("etcd_debugging_mvcc_watcher_total");
    let streams = per("etcd_debugging_mvcc_watch_stream_total");
    let req_per = (rates.keepalive + rates.other) / n as f64;
    let writes = write_capacity(cx)?;
    let max_candidates = KEEPALIVE_SHARE * writes / req_per;
    let rows = vec![
        Row::new(
            "capacity",
            &format!("per waiting candidate, {n} candidates (TTL {SCALE_TTL_S} s): requests/s, watchers, etcd memory"),
            format!(
                "{req_per:.3} req/s, {watches:.2} watchers ({streams:.2} streams), {mem_kib:.0} KiB RSS ({heap_kib:.0} KiB Go heap)"
            ),
            "–".into(),
            "",
            "",
        ),
        Row::new(
            "capacity",
            "etcd writes/s here (32 clients putting 64-byte values for 5 s)",
            format!("{writes:.0}/s"),
            "–".into(),
            "",
            "",
        ),
        Row::new(
            "capacity",
            &format!(
                "candidates one etcd serves with keepalives at {:.0}% of that",
                KEEPALIVE_SHARE * 100.0
            ),
            format!("{max_candidates:.0}"),
            "–".into(),
            "",
            "",
        ),
    ];
    let notes = vec![format!(
        "capacity: etcd's own /metrics before the candidates joined and after they had waited \
         {} s: process_resident_memory_bytes, go_memstats_heap_inuse_bytes, \
         etcd_debugging_mvcc_watcher_total and \
         _watch_stream_total, grpc_server_msg_received_total; divided by {n}. A keepalive is \
         not a raft write (the leader renews in memory), so counting it against the write \
         capacity overstates its cost: the rule is conservative. Elections do not add up: a \
         candidate costs the same whichever election it is in. Write capacity measured on \
         this one loopback member; a three-member cluster commits through its leader and \
         replicates, so measure yours the same way. Run it on a fresh etcd (alone, or \
         first): memory a larger crowd left behind makes the difference meaningless.",
        window.as_secs()
    )];
    Ok(Report { rows, notes })
}

/// Puts per second that etcd sustains: 32 concurrent clients for 5 s.
pub(crate) fn write_capacity(cx: &Cx) -> Result<f64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = etcd_client::Client::connect([cx.etcd.endpoint.as_str()], None).await?;
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..32 {
            let mut c = client.clone();
            tasks.spawn(async move {
                let mut n = 0u64;
                while tokio::time::Instant::now() < until {
                    c.put(format!("cap/{t}/{}", n % 100), vec![b'x'; 64], None)
                        .await?;
                    n += 1;
                }
                Ok::<_, etcd_client::Error>(n)
            });
        }
        let mut total = 0u64;
        while let Some(r) = tasks.join_next().await {
            total += r??;
        }
        Ok::<_, anyhow::Error>(total as f64 / 5.0)
    })
}
