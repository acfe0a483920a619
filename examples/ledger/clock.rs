//! Clocks: the monotonic one that orders events across processes, and wall time for people.

/// CLOCK_MONOTONIC in nanoseconds: comparable across processes on this machine (the demo
/// uses it to line writes up with the moment it killed a worker), unaffected by clock steps.
pub(crate) fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // time_t and c_long are only 32 bits on some targets.
    #[allow(clippy::unnecessary_cast)]
    let (sec, nsec) = (ts.tv_sec as i64, ts.tv_nsec as i64);
    sec * 1_000_000_000 + nsec
}

/// Local wall time as `YYYY-MM-DD HH:MM:SS.mmm`, for people reading the table.
pub(crate) fn wall_clock() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as libc::time_t;
    // SAFETY: an all-zero tm is valid; localtime_r fills it and is thread-safe.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&secs, &mut tm) };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_millis()
    )
}

/// The time of day part of a stored wall time.
pub(crate) fn short_time(wall: &str) -> &str {
    wall.split_once(' ').map_or(wall, |(_, t)| t)
}
