//! Statistics over samples in milliseconds or seconds, and their formatting.

use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

/// A uniformly random duration in [0, max), from a xorshift seeded by the clock.
pub fn random_below(max: Duration) -> Duration {
    static STATE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut x = STATE.load(SeqCst);
    if x == 0 {
        x = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, SeqCst);
    max.mul_f64((x >> 11) as f64 / (1u64 << 53) as f64)
}

/// `to − from` in seconds, negative when `to` is earlier.
pub fn signed_secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
        - from.saturating_duration_since(to).as_secs_f64()
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s
}

pub fn median(v: &[f64]) -> f64 {
    let s = sorted(v);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Nearest-rank 99th percentile.
pub fn p99(v: &[f64]) -> f64 {
    let s = sorted(v);
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((0.99 * s.len() as f64).ceil() as usize).max(1);
    s[rank - 1]
}

/// Nearest-rank percentile `p` (0–100).
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let s = sorted(v);
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0 * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

pub fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

pub fn fmt_ms(x: f64) -> String {
    if x.abs() < 10.0 {
        format!("{x:.2}")
    } else if x.abs() < 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

/// `median ms (min–max)`.
pub fn summary_ms(v: &[f64]) -> String {
    summary_between(v, min, max)
}

/// `median ms (p10–p90)`.
pub fn summary_p(v: &[f64]) -> String {
    summary_between(v, |v| percentile(v, 10.0), |v| percentile(v, 90.0))
}

fn summary_between(v: &[f64], lo: fn(&[f64]) -> f64, hi: fn(&[f64]) -> f64) -> String {
    if v.is_empty() {
        return "–".into();
    }
    format!(
        "{} ms ({}–{})",
        fmt_ms(median(v)),
        fmt_ms(lo(v)),
        fmt_ms(hi(v))
    )
}
