//! FIFOs: how jobs report to the harness. "Job running" is the moment a job's first line
//! arrives and "job dead" the EOF once the last process of the job has closed it.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{fail, Context};

/// A line with the instant poll(2) woke for it, or the EOF.
pub enum Ev {
    Line(String, Instant),
    Eof(Instant),
}

/// A FIFO the harness reads without blocking. Opened read-only, EOF means every writer has
/// closed it (the whole job is gone; Linux reports no hangup before the first writer).
/// `shared` opens it read-write instead, for many writers over time: it never reaches EOF.
pub struct Fifo {
    pub path: PathBuf,
    file: File,
    buf: Vec<u8>,
    last_read: Instant,
    eof: Option<Instant>,
}

impl Fifo {
    pub fn new(path: PathBuf, shared: bool) -> io::Result<Fifo> {
        let c = CString::new(path.as_os_str().as_bytes())?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(std::io::Error::last_os_error()).context("mkfifo");
        }
        let file = OpenOptions::new()
            .read(true)
            .write(shared)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)?;
        Ok(Fifo {
            path,
            file,
            buf: Vec::new(),
            last_read: Instant::now(),
            eof: None,
        })
    }

    /// The next line or the EOF, timed when poll(2) woke; `None` once `until` has passed.
    pub fn next(&mut self, until: Instant) -> Option<Ev> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line).trim_end().to_string();
                return Some(Ev::Line(line, self.last_read));
            }
            if let Some(at) = self.eof {
                return Some(Ev::Eof(at));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut pfd = libc::pollfd {
                fd: self.file.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let timeout = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, timeout) };
            let woke = Instant::now();
            if r <= 0 {
                continue;
            }
            let mut tmp = [0u8; 4096];
            match self.file.read(&mut tmp) {
                Ok(0) => self.eof = Some(woke),
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    self.last_read = woke;
                }
                Err(_) => {}
            }
        }
    }

    pub fn line(&mut self, limit: Duration) -> io::Result<(String, Instant)> {
        match self.next(Instant::now() + limit) {
            Some(Ev::Line(l, at)) => Ok((l, at)),
            Some(Ev::Eof(_)) => Err(fail(format!(
                "the job closed {} without a line",
                self.path.display()
            ))),
            None => Err(fail(format!(
                "no line on {} within {limit:?}",
                self.path.display()
            ))),
        }
    }

    pub fn wait_eof(&mut self, limit: Duration) -> Option<Instant> {
        let until = Instant::now() + limit;
        loop {
            match self.next(until)? {
                Ev::Eof(at) => return Some(at),
                Ev::Line(..) => {}
            }
        }
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}
