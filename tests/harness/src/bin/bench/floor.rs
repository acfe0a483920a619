//! `floor`: the physical limit of an acquire on this etcd, against lead-exec's acquire.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use harness::measure::reap;
use harness::measure::report::{yes_no, Report, Row};
use harness::measure::stats::{fmt_ms, median, ms, summary_ms};
use harness::measure::worker::{self, Tool};

use super::acquire::acquire_once;
use super::{usage, Cx, TTL};

/// The physical limit of an acquire: two raft commits (lease grant, creating transaction)
/// from a client already connected, plus one fork+exec. Beside it, for where the rest goes:
/// the same commits on a fresh connection, and a bare client process that starts, connects,
/// commits both and starts the acquire's job, the least any wrapper process can do.
pub(crate) fn floor(cx: &Cx) -> Result<Report> {
    let n = cx.n(50, 10);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let ep = cx.etcd.endpoint.as_str();
    let (commits, fresh): (Vec<f64>, Vec<f64>) = rt.block_on(async {
        let mut c = etcd_client::Client::connect([ep], None).await?;
        let (mut warm, mut fresh) = (Vec::new(), Vec::new());
        for i in 0..n + 1 {
            let t0 = Instant::now();
            let lease = grant_and_create(&mut c, &format!("floor/{i}")).await?;
            let t_warm = ms(t0.elapsed());
            c.lease_revoke(lease).await?;
            let t0 = Instant::now();
            let mut f = etcd_client::Client::connect([ep], None).await?;
            let lease = grant_and_create(&mut f, &format!("floor/fresh/{i}")).await?;
            let t_fresh = ms(t0.elapsed());
            f.lease_revoke(lease).await?;
            // The first round warms etcd's first-use paths.
            if i > 0 {
                warm.push(t_warm);
                fresh.push(t_fresh);
            }
        }
        Ok::<_, anyhow::Error>((warm, fresh))
    })?;
    let mut forks = Vec::new();
    for _ in 0..n {
        let t0 = Instant::now();
        Command::new("true").status()?;
        forks.push(ms(t0.elapsed()));
    }
    let (mut acq, mut bare) = (Vec::new(), Vec::new());
    acquire_once(cx, Tool::LeadExec, &[])?;
    bare_process_once(cx)?;
    for _ in 0..n {
        acq.push(acquire_once(cx, Tool::LeadExec, &[])?);
        bare.push(bare_process_once(cx)?);
    }
    let fl = median(&commits) + median(&forks);
    let ratio = median(&acq) / fl;
    let row =
        |metric: String, v: &[f64]| Row::new("floor", &metric, summary_ms(v), "–".into(), "", "");
    let rows = vec![
        row(format!("bare client: lease grant + creating txn, median (min–max), n={n}"), &commits),
        row(format!("fork+exec of `true`, median (min–max), n={n}"), &forks),
        Row::new(
            "floor",
            "lead-exec acquire (as in `acquire`) against the floor (sum of the two medians)",
            format!(
                "{} ms vs {} ms = {ratio:.2}× the floor",
                fmt_ms(median(&acq)),
                fmt_ms(fl)
            ),
            "–".into(),
            "≤ 1.5× the floor",
            yes_no(ratio <= 1.5),
        ),
        row(format!("diagnostic: the same two commits on a fresh connection, median (min–max), n={n}"), &fresh),
        Row::new(
            "floor",
            &format!(
                "diagnostic: a bare client process, spawn → job running (start, connect, the two commits, the job's fork+exec), median (min–max), n={n}"
            ),
            format!(
                "{}; lead-exec's acquire is {:.2}× it",
                summary_ms(&bare),
                median(&acq) / median(&bare)
            ),
            "–".into(),
            "",
            "",
        ),
    ];
    let notes = vec![
        "floor: the bare client is etcd-client in the bench process, connected once; each sample \
         is a lease grant then a transaction creating a key on it, the two raft commits every \
         acquire needs. lead-exec's acquire also starts a process, connects (reading once to \
         check the cluster, beside the lease grant), starts its watchdog and the job. The bare \
         client process is this bench binary re-executed: a current-thread runtime, \
         etcd-client, the two commits, then `sh -c 'echo ok > FIFO'` as in `acquire`; no flags \
         to parse, no probe, no watchdog, no cgroup, no history."
            .to_string(),
    ];
    Ok(Report { rows, notes })
}

/// The two raft commits of an acquire: a lease grant, then the transaction that creates the
/// candidate key on it. Returns the lease.
pub(crate) async fn grant_and_create(c: &mut etcd_client::Client, key: &str) -> Result<i64> {
    let lease = c.lease_grant(TTL.as_secs() as i64, None).await?.id();
    let txn = etcd_client::Txn::new()
        .when([etcd_client::Compare::create_revision(
            key,
            etcd_client::CompareOp::Equal,
            0,
        )])
        .and_then([etcd_client::TxnOp::put(
            key,
            "x",
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )]);
    c.txn(txn).await?;
    Ok(lease)
}

/// The bench binary's hidden mode for the bare client process of `floor`.
pub(crate) const FLOOR_PROCESS: &str = "__floor-process";

/// The bare client process: connect (with the tools' connection flags, `--tls`'s
/// certificates), grant, create `key`, run `sh -c SCRIPT`, revoke.
fn bare_command(cx: &Cx, key: &str, script: &str) -> Result<Command> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([FLOOR_PROCESS, cx.etcd.endpoint.as_str(), key, script])
        .args(worker::CONN_ARGS.get().map_or(&[][..], Vec::as_slice))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    Ok(cmd)
}

/// One bare client process, timed like `acquire_once`: spawn → the job's line.
pub(crate) fn bare_process_once(cx: &Cx) -> Result<f64> {
    let mut fifo = cx.fifo(false)?;
    let key = cx.unique("floor/process");
    let script = format!("echo ok > \"{}\"", fifo.path.display());
    let mut cmd = bare_command(cx, &key, &script)?;
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("starting the bare client process")?;
    let (_, t1) = fifo.line(Duration::from_secs(10))?;
    let status = child.wait()?;
    if !status.success() {
        bail!("the bare client process failed: {status}");
    }
    Ok(ms(t1 - t0))
}

/// One whole run of the bare client process with `script` as the job, `setup` applied
/// before it starts; returns once it has exited. In a process group of its own, killed
/// whole after 10 s or on the bench's way out, as the wrappers are.
pub(crate) fn bare_run(cx: &Cx, script: &str, setup: &dyn Fn(&mut Command)) -> Result<()> {
    let key = cx.unique("floor/run");
    let mut cmd = bare_command(cx, &key, script)?;
    cmd.process_group(0);
    setup(&mut cmd);
    let mut child = cmd.spawn().context("starting the bare client process")?;
    let pgid = child.id() as i32;
    reap::add(pgid);
    let status = worker::wait_or_kill(&mut child, vec![pgid], Duration::from_secs(10));
    reap::remove(pgid);
    let status = status?;
    if !status.success() {
        bail!("the bare client process failed or was killed after 10 s: {status}");
    }
    Ok(())
}

/// In the bare client process: connect, grant, create the key, run the job, revoke. After
/// the three arguments, the connection flags of `worker::CONN_ARGS` (`--cacert F --cert F
/// --key F`).
pub(crate) fn floor_process(args: &[String]) -> ExitCode {
    let [endpoint, key, script, conn @ ..] = args else {
        return usage();
    };
    let run = async {
        let mut c =
            etcd_client::Client::connect([endpoint.as_str()], connect_options(conn)?).await?;
        let lease = grant_and_create(&mut c, key).await?;
        Command::new("sh").args(["-c", script]).status()?;
        c.lease_revoke(lease).await?;
        Ok::<_, anyhow::Error>(())
    };
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: bare client process: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Mutual TLS from `--cacert F --cert F --key F`, in any order, each once; none for no flags.
fn connect_options(flags: &[String]) -> Result<Option<etcd_client::ConnectOptions>> {
    if flags.is_empty() {
        return Ok(None);
    }
    let (mut ca, mut cert, mut key) = (None, None, None);
    for pair in flags.chunks(2) {
        let [flag, path] = pair else {
            bail!("connection flags come in pairs: {flags:?}");
        };
        let slot = match flag.as_str() {
            "--cacert" => &mut ca,
            "--cert" => &mut cert,
            "--key" => &mut key,
            _ => bail!("unknown connection flag {flag}"),
        };
        if slot.is_some() {
            bail!("{flag} given twice");
        }
        *slot = Some(path);
    }
    let read = |f: &str, p: Option<&String>| -> Result<Vec<u8>> {
        let p = p.with_context(|| format!("no {f}"))?;
        std::fs::read(p).with_context(|| format!("reading {p}"))
    };
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read("--cacert", ca)?))
        .identity(etcd_client::Identity::from_pem(
            read("--cert", cert)?,
            read("--key", key)?,
        ));
    Ok(Some(etcd_client::ConnectOptions::new().with_tls(tls)))
}
