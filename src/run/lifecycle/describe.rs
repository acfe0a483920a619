//! The events, as the log line of a step names them ("leading -> draining on the lease
//! expired"): words for operators, not the types' debug form.

use std::fmt;

use super::{BackoffEnd, CampaignEnd, Cause, DelayEnd, DrainEvent, EndedBy, StartEnd, TermEvent};
use crate::exit::Exit;

/// "SIGTERM", or the number when it has no name.
pub struct SignalName(pub i32);

impl fmt::Display for SignalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match nix::sys::signal::Signal::try_from(self.0) {
            Ok(s) => f.write_str(s.as_str()),
            Err(_) => write!(f, "signal {}", self.0),
        }
    }
}

/// How the job ended, in the words of the phase line.
struct JobEnd {
    exit: Exit,
    by: EndedBy,
}

impl fmt::Display for JobEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the job ended")?;
        match self.exit {
            Exit::Job(c) => write!(f, " (exit code {c})")?,
            Exit::Signal(s) => write!(f, " ({})", SignalName(s))?,
            other => write!(f, " (exit {})", other.code())?,
        }
        match self.by {
            EndedBy::Job => {}
            EndedBy::Deadline => f.write_str(", killed by its watchdog at the lease deadline")?,
            EndedBy::WatchdogGone => f.write_str(", killed as its watchdog died")?,
        }
        Ok(())
    }
}

fn outranked(f: &mut fmt::Formatter<'_>, still: Option<bool>) -> fmt::Result {
    f.write_str(match still {
        Some(true) => "a higher priority still waiting",
        Some(false) => "no higher priority waiting any more",
        None => "no answer on who waits",
    })
}

impl<E: fmt::Debug> fmt::Display for CampaignEnd<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CampaignEnd::Elected { token, delay } => {
                write!(f, "elected with token {token}")?;
                if *delay {
                    f.write_str(", after an unclean end")?;
                }
                Ok(())
            }
            CampaignEnd::Unhealthy => f.write_str("a failing health check"),
            CampaignEnd::NotAcquired { unhealthy: false } => f.write_str("not acquired"),
            CampaignEnd::NotAcquired { unhealthy: true } => {
                f.write_str("not acquired, the health check failing")
            }
            // A failure's Debug form is what failed, only (see `run::Failure`).
            CampaignEnd::Failed(Cause::Etcd(e)) => write!(f, "etcd failing: {e:?}"),
            CampaignEnd::Failed(Cause::CandidacyLost(l)) => {
                write!(f, "the candidacy lost: {}", l.as_str())
            }
            CampaignEnd::Refused(e) => write!(f, "a refusal: {e:?}"),
            CampaignEnd::Interrupted { signal } => write!(f, "{}", SignalName(*signal)),
        }
    }
}

impl fmt::Display for BackoffEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackoffEnd::Done => f.write_str("the backoff's end"),
            BackoffEnd::Interrupted { signal } => write!(f, "{}", SignalName(*signal)),
        }
    }
}

impl fmt::Display for DelayEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DelayEnd::Done => f.write_str("the takeover delay's end"),
            DelayEnd::Lost(l) => f.write_str(l.as_str()),
            DelayEnd::LeaseTaskEnded => f.write_str("the keepalive task's end"),
            DelayEnd::Paused => f.write_str("a pause"),
            DelayEnd::ResignRequested => f.write_str("a resign request"),
            DelayEnd::Unhealthy => f.write_str("a failing health check"),
            DelayEnd::Interrupted { signal } => write!(f, "{}", SignalName(*signal)),
            DelayEnd::Forwarded(signal) => {
                write!(f, "{} (no job yet to pass it to)", SignalName(*signal))
            }
            DelayEnd::HandoverAsked => f.write_str("a handover request"),
            DelayEnd::Outranked(still) => outranked(f, *still),
        }
    }
}

impl<E: fmt::Debug> fmt::Display for StartEnd<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartEnd::Spawned => f.write_str("the job's start"),
            StartEnd::NotStarted => f.write_str("a job that could not start"),
            StartEnd::AlreadyDone => f.write_str("a run key already done"),
            StartEnd::Exhausted => f.write_str("a run key's attempts all made"),
            StartEnd::PeriodOver => f.write_str("the run key's period over"),
            StartEnd::Unhealthy => f.write_str("a failing health check"),
            StartEnd::Failed(e) => write!(f, "a failed start: {e:?}"),
        }
    }
}

impl fmt::Display for TermEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TermEvent::JobEnded { exit, by } => JobEnd { exit, by }.fmt(f),
            TermEvent::Lost(l) => f.write_str(l.as_str()),
            TermEvent::LeaseTaskEnded => f.write_str("the keepalive task's end"),
            TermEvent::Paused => f.write_str("a pause"),
            TermEvent::ResignRequested => f.write_str("a resign request"),
            TermEvent::TimedOut => f.write_str("--timeout"),
            TermEvent::Unhealthy => f.write_str("a failing health check"),
            TermEvent::Signal(s) => write!(f, "{}", SignalName(s.number())),
            TermEvent::HandoverAsked { min_term_left } => write!(
                f,
                "a handover request, {} of --min-term left",
                crate::clock::human(min_term_left)
            ),
            TermEvent::Outranked(still) => outranked(f, still),
        }
    }
}

impl fmt::Display for DrainEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DrainEvent::JobEnded { exit, by } => JobEnd { exit, by }.fmt(f),
            DrainEvent::Lost(l) => f.write_str(l.as_str()),
            DrainEvent::Signal(s) => write!(f, "{}", SignalName(s.number())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::lifecycle::Arrived;

    #[test]
    fn events_read_as_words() {
        let ended = TermEvent::JobEnded {
            exit: Exit::Job(0),
            by: EndedBy::Job,
        };
        assert_eq!(ended.to_string(), "the job ended (exit code 0)");
        let killed = DrainEvent::JobEnded {
            exit: Exit::Signal(9),
            by: EndedBy::Deadline,
        };
        assert_eq!(
            killed.to_string(),
            "the job ended (SIGKILL), killed by its watchdog at the lease deadline"
        );
        assert_eq!(DrainEvent::Signal(Arrived::Stop(15)).to_string(), "SIGTERM");
        let won: CampaignEnd<()> = CampaignEnd::Elected {
            token: 2,
            delay: false,
        };
        assert_eq!(won.to_string(), "elected with token 2");
        assert_eq!(SignalName(99).to_string(), "signal 99");
    }
}
