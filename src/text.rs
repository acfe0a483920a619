//! Text from elsewhere (etcd values, flags), made safe to show: on one line, and short.
//!
//! What lead-exec prints line by line (`status`, `history`, `watch`, the text log) is read by
//! people and parsed by scripts. A value with a newline in it (an id stored by an older
//! version, or written with etcdctl) would otherwise print a line of its own, such as a second
//! `leader:`; a value of 10 kB would bury the message it is part of.

use std::borrow::Cow;
use std::fmt::Write;

/// `s` with every control character written as an escape: `\n`, `\r`, `\t`, else `\u{1b}`.
/// Everything else, backslashes and non-ASCII letters included, is shown as it is.
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_except(s, |_| false)
}

/// As [`escape`], leaving the control characters `keep` accepts as they are.
pub fn escape_except(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if !c.is_control() || keep(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// The first control character in `s`, escaped, with its byte offset: what a flag that must
/// stay on one line refuses.
pub fn first_control(s: &str) -> Option<(usize, String)> {
    s.char_indices()
        .find(|(_, c)| c.is_control())
        .map(|(i, c)| (i, escape(c.encode_utf8(&mut [0; 4])).into_owned()))
}

/// The most characters of a value that a message quotes.
pub const QUOTED_CHARS: usize = 64;

/// A value typed by someone, for an error message: escaped, and cut after [`QUOTED_CHARS`]
/// characters with the length of the whole, so that a 10 kB name does not make a 10 kB line.
pub fn quoted(s: &str) -> String {
    let shown = escape(s);
    match shown.char_indices().nth(QUOTED_CHARS) {
        None => shown.into_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", &shown[..cut], s.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert!(matches!(escape("plain ünïcode \\n"), Cow::Borrowed(_)));
        assert_eq!(
            escape("evil\nleader:\tx\r\u{1b}[2J\u{7f}\u{85}"),
            "evil\\nleader:\\tx\\r\\u{1b}[2J\\u{7f}\\u{85}"
        );
        assert_eq!(
            escape_except("a\u{1b}[1mb\n", |c| c == '\u{1b}'),
            "a\u{1b}[1mb\\n"
        );
    }

    #[test]
    fn the_first_control_character_is_found_with_its_offset() {
        assert_eq!(first_control("ok"), None);
        assert_eq!(first_control("é\nx\t"), Some((2, "\\n".into())));
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        assert_eq!(quoted("short"), "short");
        let long = "a".repeat(10_000);
        let q = quoted(&long);
        assert_eq!(q, format!("{}… (10000 bytes)", "a".repeat(QUOTED_CHARS)));
        // Cut on a character boundary, after escaping.
        let q = quoted(&format!("{}\n{}", "é".repeat(70), "x"));
        assert!(q.starts_with(&"é".repeat(QUOTED_CHARS)), "{q}");
        assert_eq!(quoted(&"é".repeat(QUOTED_CHARS)), "é".repeat(QUOTED_CHARS));
    }
}
