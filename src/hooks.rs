//! Debug-build hooks: environment variables by which tests force an order of events that
//! real runs leave to chance (a record held back, a clock skewed, a grant sent late). A
//! release build reads none of them.

use std::str::FromStr;

/// The value of hook `name` (`LEAD_EXEC_TEST_…`), in debug builds only.
pub fn value<T: FromStr>(name: &str) -> Option<T> {
    if !cfg!(debug_assertions) {
        return None;
    }
    std::env::var(name).ok()?.trim().parse().ok()
}
