//! The etcd scope of one election: the client, its router, the election and the command
//! timeout, as one value that every part talking to etcd is handed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::etcd::Client;
use anyhow::Result;

use super::Election;
use crate::etcd::{self, failover, Conn};

/// What every request about one election needs. The router is the client's own (it routes
/// the client's requests), so the owners of streams, which alone see a stream go silent, get
/// it from here.
#[derive(Clone)]
pub struct Ctx {
    pub client: Client,
    pub router: Arc<failover::Router>,
    pub election: Election,
    /// `--command-timeout`: the bound on every request.
    pub timeout: Duration,
}

impl Ctx {
    /// Builds the client (see [`etcd::open`]); nothing is sent yet.
    pub async fn open(conn: &Conn, election: Election) -> Result<Ctx> {
        let (client, router) = etcd::open(conn).await?;
        Ok(Ctx::of(conn, (client, router), election))
    }

    /// Connects and proves the cluster answers, within the dial timeout.
    pub async fn connect(conn: &Conn, election: Election) -> Result<Ctx> {
        let connection = etcd::connect(conn).await?;
        Ok(Ctx::of(conn, connection, election))
    }

    fn of(conn: &Conn, (client, router): etcd::Connection, election: Election) -> Ctx {
        Ctx {
            client,
            router,
            election,
            timeout: conn.command_timeout,
        }
    }

    /// Runs one etcd request within the command timeout (see [`etcd::bounded`]).
    pub fn bounded<'a, T: 'a>(
        &self,
        fut: impl Future<Output = Result<T, etcd_client::Error>> + 'a,
    ) -> impl Future<Output = Result<T>> + 'a {
        etcd::bounded_by(etcd::Bound::Command(self.timeout), "etcd", fut)
    }

    /// Puts `value` in candidate key `key` on `lease`, only while the key is still the one
    /// created at revision `token` (our term's): what `status` shows of a leader, never
    /// written over a key that is no longer ours.
    pub async fn update_candidate(
        &self,
        key: &str,
        token: i64,
        lease: i64,
        value: &super::Candidate,
    ) -> Result<()> {
        use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, token)])
            .and_then([TxnOp::put(
                key,
                value.encode(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let mut c = self.client.clone();
        self.bounded(c.txn(txn)).await.map(drop)
    }
}
