//! The benchmarks' measuring kit (`src/bin/bench`): a single etcd spoken to over its HTTP
//! gateway ([`etcd`]), a proxy that blackholes right after a keepalive answer ([`blackhole`]),
//! FIFOs that jobs report on ([`fifo`]), wrapper processes in process groups of their own,
//! killed whole on the way out ([`worker`], [`reap`]), statistics ([`stats`]) and the report
//! table ([`report`]).
//!
//! It times events rather than asserting on them, so it differs from the tests' helpers where
//! timing needs it: [`fifo::Fifo`] stamps each line when poll(2) woke rather than polling a file,
//! and [`blackhole::Proxy`] records when it forwarded the last request, which the tests'
//! [`crate::proxy::Proxy`] does not. The etcd itself is the harness's [`crate::Member`].

pub mod blackhole;
pub mod delay;
pub mod etcd;
pub mod fifo;
pub mod reap;
pub mod report;
pub mod stats;
pub mod worker;

use std::fmt::Display;
use std::io;

/// An error with `msg` as its whole text.
pub fn fail(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// `what: cause`, the way the bench prints a chain of errors.
pub trait Context<T> {
    fn context(self, what: impl Display) -> io::Result<T>;
    fn with_context<W: Display>(self, what: impl FnOnce() -> W) -> io::Result<T>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn context(self, what: impl Display) -> io::Result<T> {
        self.map_err(|e| fail(format!("{what}: {e}")))
    }

    fn with_context<W: Display>(self, what: impl FnOnce() -> W) -> io::Result<T> {
        self.map_err(|e| fail(format!("{}: {e}", what())))
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Display) -> io::Result<T> {
        self.ok_or_else(|| fail(what.to_string()))
    }

    fn with_context<W: Display>(self, what: impl FnOnce() -> W) -> io::Result<T> {
        self.ok_or_else(|| fail(what().to_string()))
    }
}
