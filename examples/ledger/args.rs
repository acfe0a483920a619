//! The command line, parsed by hand: `--db FILE COMMAND [--flag VALUE]...`.

use anyhow::Result;

use crate::db::Target;

/// Command-line options after `--db FILE COMMAND`.
#[derive(Debug, Default)]
pub(crate) struct Opts {
    pub(crate) token: Option<String>,
    pub(crate) worker: Option<String>,
    pub(crate) note: Option<String>,
    pub(crate) every: Option<String>,
    pub(crate) batches: Option<String>,
    /// `settle --events FILE`: the job's event log.
    pub(crate) events: Option<String>,
    /// `show --all`: every row instead of the ends of each long run.
    pub(crate) all: bool,
}

/// A usage error: printed with the usage text, exit 2.
#[derive(Debug)]
pub(crate) struct Usage(pub(crate) String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

pub(crate) fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(msg.into()))
}

/// Parses `--db FILE|--pg CONNINFO COMMAND [--flag VALUE]...` by hand; flags may come in any
/// order.
pub(crate) fn parse(args: &[String]) -> Result<(Target, String, Opts)> {
    let (mut db, mut cmd, mut opts) = (None, None, Opts::default());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| usage(format!("{name} needs a value")))
        };
        match a.as_str() {
            "--db" | "--pg" if db.is_some() => {
                return Err(usage("give one of --db and --pg, once"))
            }
            "--db" => db = Some(Target::Sqlite(value("--db")?)),
            "--pg" => db = Some(Target::Postgres(value("--pg")?)),
            "--token" => opts.token = Some(value("--token")?),
            "--worker" => opts.worker = Some(value("--worker")?),
            "--note" => opts.note = Some(value("--note")?),
            "--every" => opts.every = Some(value("--every")?),
            "--batches" => opts.batches = Some(value("--batches")?),
            "--events" => opts.events = Some(value("--events")?),
            "--all" => opts.all = true,
            "-h" | "--help" => return Err(usage("")),
            s if s.starts_with('-') => return Err(usage(format!("unknown option {s}"))),
            s if cmd.is_none() => cmd = Some(s.to_string()),
            s => return Err(usage(format!("unexpected argument {s}"))),
        }
    }
    let db = db.ok_or_else(|| usage("--db FILE or --pg CONNINFO is required"))?;
    let cmd = cmd.ok_or_else(|| usage("a command is required"))?;
    Ok((db, cmd, opts))
}

/// The token of a write: `--token`, else `FENCING_TOKEN` as lead-exec sets it.
pub(crate) fn token_of(opts: &Opts) -> Result<i64> {
    let raw = match &opts.token {
        Some(t) => t.clone(),
        None => std::env::var("FENCING_TOKEN")
            .map_err(|_| usage("no --token and no FENCING_TOKEN in the environment"))?,
    };
    raw.trim()
        .parse()
        .map_err(|_| usage(format!("token {raw:?} is not an integer")))
}

/// The slot of a write: `LEAD_EXEC_SLOT` as lead-exec sets it, else 0.
pub(crate) fn slot_of() -> Result<i64> {
    match std::env::var("LEAD_EXEC_SLOT") {
        Err(_) => Ok(0),
        Ok(raw) => raw
            .trim()
            .parse()
            .ok()
            .filter(|s| *s >= 0)
            .ok_or_else(|| usage(format!("LEAD_EXEC_SLOT {raw:?} is not a slot"))),
    }
}

pub(crate) fn worker_of(opts: &Opts) -> String {
    opts.worker
        .clone()
        .or_else(|| std::env::var("LEAD_EXEC_ID").ok())
        .unwrap_or_else(|| "unknown".to_string())
}

pub(crate) fn number(raw: &Option<String>, name: &str) -> Result<Option<u64>> {
    raw.as_ref()
        .map(|s| {
            s.parse()
                .map_err(|_| usage(format!("{name} {s:?} is not a number")))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_parse_in_any_order() {
        let args: Vec<String> = ["write", "--token", "4", "--db", "f.db", "--note", "n"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (db, cmd, opts) = parse(&args).unwrap();
        assert_eq!(db, Target::Sqlite("f.db".into()));
        assert_eq!(cmd, "write");
        assert_eq!(token_of(&opts).unwrap(), 4);
        assert!(parse(&["init".to_string()]).is_err());
        let pg: Vec<String> = ["--pg", "host=/tmp", "show"].map(String::from).to_vec();
        assert_eq!(parse(&pg).unwrap().0, Target::Postgres("host=/tmp".into()));
        let both: Vec<String> = ["--pg", "x", "--db", "y", "show"]
            .map(String::from)
            .to_vec();
        assert!(parse(&both).is_err());
    }
}
