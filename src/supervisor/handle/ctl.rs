//! lead-exec's end of the control pipe to the watchdog, which never blocks.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

use crate::supervisor::wire::Order;

/// lead-exec's end of the control pipe. It never blocks: a watchdog that does not read (it is
/// stopped, or starved) fills the pipe at 64 KiB, and a blocking write would then stop
/// lead-exec's only thread, its keepalives and its own timer at D with it. What the pipe
/// cannot take waits here, in order, and goes when the pipe is writable again: the newest
/// deadline stands for all older ones, a kill makes everything before it moot, and of the
/// signals to pass on only the first [`MAX_QUEUED`] are kept.
pub(super) struct Ctl {
    /// Non-blocking. Written directly, not through tokio's readiness, so that what fits goes
    /// at once; the readiness only tells when to try again.
    tx: AsyncFd<OwnedFd>,
    deadline: Option<Order>,
    queue: VecDeque<Order>,
    /// Forwarded signals dropped because the queue was full.
    dropped: u64,
}

/// Orders (other than deadlines) that wait for a watchdog that does not read.
const MAX_QUEUED: usize = 64;

impl Ctl {
    pub(super) fn new(fd: OwnedFd) -> std::io::Result<Ctl> {
        set_nonblocking(&fd)?;
        // SAFETY: the descriptor moves into the AsyncFd, which keeps it open for as long as
        // it is registered.
        let tx = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::WRITABLE) }
            .map_err(std::io::Error::from)?;
        Ok(Ctl {
            tx,
            deadline: None,
            queue: VecDeque::new(),
            dropped: 0,
        })
    }

    /// One write(2): with O_NONBLOCK, all of a message under `PIPE_BUF` or nothing.
    fn write(&self, bytes: &[u8]) -> std::io::Result<usize> {
        Ok(nix::unistd::write(self.tx.get_ref(), bytes)?)
    }

    /// Writes `bytes` whole, waiting for room as long as it takes: the start, which may be
    /// longer than `PIPE_BUF` and so go in pieces. The caller bounds the wait.
    pub(super) async fn write_all(&self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            match self.write(bytes) {
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.tx.writable().await?.clear_ready();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Waits until the pipe may take more; then [`Ctl::flush`].
    pub(super) async fn writable(&self) {
        match self.tx.writable().await {
            Ok(mut g) => g.clear_ready(),
            // Not registered any more: nothing will ever come, and flush reports it.
            Err(_) => std::future::pending().await,
        }
    }

    pub(super) fn push(&mut self, c: Order) {
        if self.queue.contains(&Order::Kill) {
            return;
        }
        match c {
            Order::Deadline { .. } => self.deadline = Some(c),
            Order::Kill => {
                self.deadline = None;
                self.queue.clear();
                self.queue.push_back(c);
            }
            Order::Forward(_) if self.queue.len() >= MAX_QUEUED => {
                self.dropped += 1;
                if self.dropped == 1 {
                    tracing::warn!(
                        "the watchdog does not read its pipe; signals for the job are dropped"
                    );
                }
            }
            _ => self.queue.push_back(c),
        }
        self.flush();
    }

    pub(super) fn pending(&self) -> bool {
        self.deadline.is_some() || !self.queue.is_empty()
    }

    /// Writes what waits, as far as the pipe takes it. Each message is one write of less
    /// than `PIPE_BUF`: all of it or nothing.
    pub(super) fn flush(&mut self) {
        loop {
            let (c, from_queue) = match self.queue.front() {
                Some(c) => (*c, true),
                None => match self.deadline {
                    Some(d) => (d, false),
                    None => return,
                },
            };
            match self.write(c.encode().as_bytes()) {
                Ok(_) => {
                    if from_queue {
                        self.queue.pop_front();
                    } else {
                        self.deadline = None;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // The watchdog exits right after the group is gone; its report is on
                    // its way.
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        tracing::debug!("watchdog already gone: {c:?} not sent");
                    } else {
                        tracing::warn!("watchdog pipe: {e}");
                    }
                    self.deadline = None;
                    self.queue.clear();
                    return;
                }
            }
        }
    }
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything the pipe holds now, read without blocking.
    fn drain(r: &OwnedFd) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match nix::unistd::read(r.as_raw_fd(), &mut buf) {
                Ok(n) if n > 0 => out.extend_from_slice(&buf[..n]),
                _ => return String::from_utf8(out).unwrap(),
            }
        }
    }

    /// A watchdog that does not read: sends return at once, the newest deadline stands for
    /// the others, signals to pass on are capped, a stop is kept, and a kill wins.
    #[tokio::test]
    async fn a_full_pipe_never_blocks_and_keeps_what_matters() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        set_nonblocking(&r).unwrap();
        let mut ctl = Ctl::new(w).unwrap();
        let mut written = 0;
        while !ctl.pending() {
            ctl.push(Order::Forward(10));
            written += 1;
        }
        assert!(written > 10_000, "the pipe took only {written}");
        let deadline = |i: u64| Order::Deadline {
            term_at: i,
            kill_at: i + 1,
        };
        for i in 1..=100_000 {
            ctl.push(deadline(i));
        }
        assert_eq!(ctl.deadline, Some(deadline(100_000)));
        for _ in 0..1000 {
            ctl.push(Order::Forward(10));
        }
        ctl.push(Order::Stop(15));
        assert!(ctl.queue.len() <= MAX_QUEUED + 1);
        assert_eq!(ctl.queue.back(), Some(&Order::Stop(15)));
        // Once the watchdog reads again, all of it goes, the newest deadline last.
        drain(&r);
        ctl.flush();
        assert!(!ctl.pending());
        let sent = drain(&r);
        assert!(sent.ends_with("T 15\nD 100000 100001\n"), "{sent:?}");

        while !ctl.pending() {
            ctl.push(Order::Forward(10));
        }
        ctl.push(deadline(200_000));
        ctl.push(Order::Stop(15));
        ctl.push(Order::Kill);
        ctl.push(deadline(300_000));
        ctl.push(Order::Forward(1));
        assert_eq!(ctl.queue, [Order::Kill]);
        assert_eq!(ctl.deadline, None);
        drain(&r);
        ctl.flush();
        assert_eq!(drain(&r), "K\n");
    }
}
