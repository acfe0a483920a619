//! lead-exec's side: [`standby`] starts the job (the watchdog started ahead, then told to
//! start it); [`job`] is the handle on the running job (deadlines, signals to pass on, stop and
//! kill, and lead-exec's own enforcement of D); `ctl` is the control pipe that never blocks;
//! [`detach`] starts the watchdog in a session of its own; [`mod@preflight`] checks the command
//! before campaigning.

mod ctl;
pub mod detach;
pub mod job;
pub mod preflight;
pub mod standby;
