//! The reference pages in section 7 (`man/*.7.md`) are written in Markdown, so that they read
//! well on the web too, and rendered here to roff for `man`. Only what those pages use is
//! understood: a title line, `##` and `###` headings, paragraphs, `-` and `1.` lists whose
//! items continue on indented lines, fenced code blocks, pipe tables, and inline code,
//! `**bold**`, `*italic*` and `[links](target)`. Everything else is text.

/// Renders one page. Its first line is `# NAME(SECTION) - what it is about`.
pub fn to_roff(markdown: &str, version: &str) -> Result<String, String> {
    let mut lines = markdown.lines().peekable();
    let title = lines
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .ok_or("the first line is not a `# NAME(SECTION) - summary` title")?;
    let (name, summary) = title
        .split_once(" - ")
        .ok_or("the title has no ` - summary`")?;
    let (name, section) = name
        .strip_suffix(')')
        .and_then(|n| n.split_once('('))
        .ok_or("the title does not name a page as NAME(SECTION)")?;
    // Left-adjusted, not justified: a line that holds little more than a test's name has no
    // spaces to stretch, and groff would warn that it cannot adjust it.
    let mut out = format!(
        ".TH {name} {section} \"\" \"lead-exec {version}\"\n.nh\n.ad l\n.SH NAME\n{} \\- {}\n",
        escape(name),
        inline(summary)
    );
    while let Some(line) = lines.next() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(h) = line.strip_prefix("## ") {
            out.push_str(&format!(".SH \"{}\"\n", escape(&plain(h).to_uppercase())));
        } else if let Some(h) = line.strip_prefix("### ") {
            out.push_str(&format!(".SS \"{}\"\n", escape(&plain(h))));
        } else if line.starts_with("```") {
            out.push_str(".PP\n.RS 4\n.nf\n");
            for code in lines.by_ref() {
                if code.starts_with("```") {
                    break;
                }
                out.push_str(&request_safe(&escape(code)));
                out.push('\n');
            }
            out.push_str(".fi\n.RE\n");
        } else if line.starts_with('|') {
            let mut rows = vec![cells(line)];
            while let Some(next) = lines.next_if(|l| l.starts_with('|')) {
                rows.push(cells(next));
            }
            table(&mut out, &rows);
        } else if let Some(tag) = list_tag(line) {
            // An item runs on over the lines indented below it.
            let mut text = line[tag.len()..].trim().to_string();
            while let Some(next) = lines.next_if(|l| l.starts_with("  ") && !l.trim().is_empty()) {
                text.push(' ');
                text.push_str(next.trim());
            }
            let (mark, width) = if tag.starts_with('-') {
                ("\\(bu".to_string(), 2)
            } else {
                (tag.trim().to_string(), 4)
            };
            out.push_str(&format!(
                ".IP {mark} {width}\n{}\n",
                request_safe(&inline(&text))
            ));
        } else {
            let mut text = line.trim().to_string();
            while let Some(next) = lines.next_if(|l| {
                !l.trim().is_empty()
                    && !l.starts_with('#')
                    && !l.starts_with("```")
                    && !l.starts_with('|')
                    && list_tag(l).is_none()
            }) {
                text.push(' ');
                text.push_str(next.trim());
            }
            out.push_str(&format!(".PP\n{}\n", request_safe(&inline(&text))));
        }
    }
    Ok(out)
}

/// `- ` or `12. ` at the start of a line, as written.
fn list_tag(line: &str) -> Option<&str> {
    if line.starts_with("- ") {
        return Some("- ");
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    (digits > 0 && line[digits..].starts_with(". ")).then(|| &line[..digits + 2])
}

/// The cells of a table row; `\|` is a pipe inside a cell.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    cells.iter().map(|c| c.trim().to_string()).collect()
}

/// A table as a list of tagged paragraphs: the first cell is the tag, and each further cell
/// is named by its column's header (the last one too, unless the table has two columns).
fn table(out: &mut String, rows: &[Vec<String>]) {
    let Some((header, body)) = rows.split_first() else {
        return;
    };
    let body = body.iter().filter(|r| {
        !r.iter()
            .all(|c| c.chars().all(|ch| matches!(ch, '-' | ':')))
    });
    for row in body {
        let tag = row.first().map(String::as_str).unwrap_or("");
        let mut text = Vec::new();
        for (i, cell) in row.iter().enumerate().skip(1) {
            let head = header.get(i).map(String::as_str).unwrap_or("");
            if row.len() == 2 || head.is_empty() {
                text.push(cell.clone());
            } else if !cell.is_empty() {
                text.push(format!("*{head}*: {cell}."));
            }
        }
        out.push_str(&format!(
            ".TP\n{}\n{}\n",
            request_safe(&inline(&format!("**{}**", tag.replace('*', "")))),
            request_safe(&inline(&text.join(" ")))
        ));
    }
}

/// Inline Markdown to roff: code and `**` bold, `*` italic, links as their text (with the
/// address when it leads off these pages).
fn inline(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c == '`' {
            if let Some(end) = rest[1..].find('`') {
                out.push_str(&format!("\\fB{}\\fR", code(&rest[1..1 + end])));
                rest = &rest[end + 2..];
                continue;
            }
        } else if let Some(after) = rest.strip_prefix("**") {
            if let Some(end) = after.find("**") {
                out.push_str(&format!("\\fB{}\\fR", inline(&after[..end])));
                rest = &after[end + 2..];
                continue;
            }
        } else if c == '*' && rest[1..].starts_with(|n: char| !n.is_whitespace()) {
            if let Some(end) = rest[1..].find('*') {
                out.push_str(&format!("\\fI{}\\fR", inline(&rest[1..1 + end])));
                rest = &rest[end + 2..];
                continue;
            }
        } else if c == '[' {
            if let Some((label, target, len)) = link(rest) {
                out.push_str(&inline(label));
                if !(target.starts_with('#') || target.contains(".md")) {
                    out.push_str(&format!(" <{}>", escape(target)));
                }
                rest = &rest[len..];
                continue;
            }
        }
        out.push_str(&escape(&c.to_string()));
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `[label](target)` at the start of `text`: the label, the target and the length.
fn link(text: &str) -> Option<(&str, &str, usize)> {
    let close = text.find("](")?;
    let end = text[close..].find(')')? + close;
    let label = &text[1..close];
    (!label.contains('[')).then(|| (label, &text[close + 2..end], end + 1))
}

/// A heading's text without its marks: headings are set in their own font.
fn plain(text: &str) -> String {
    text.replace(['`', '*'], "")
}

/// Backslashes and hyphens as roff wants them in text, and every other character than ASCII
/// as its Unicode escape, so that the page needs no input encoding (preconv) to render.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\e"),
            '-' => out.push_str("\\-"),
            c if c.is_ascii() => out.push(c),
            c => out.push_str(&format!("\\[u{:04X}]", c as u32)),
        }
    }
    out
}

/// A code span's text, escaped, with a place to break the line after each `_` and `,` (roff's
/// `\:`, which prints nothing): a test's name or a JSON example runs to 100 characters
/// without a space, and hyphenation is off, so groff could neither fill nor break the line.
fn code(text: &str) -> String {
    escape(text).replace('_', "_\\:").replace(',', ",\\:")
}

/// No output line may start a roff request.
fn request_safe(line: &str) -> String {
    if line.starts_with(['.', '\'']) {
        format!("\\&{line}")
    } else {
        line.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(md: &str) -> String {
        to_roff(&format!("# x(7) - a page\n\n{md}"), "1.0").unwrap()
    }

    #[test]
    fn the_title_names_the_page_and_its_section() {
        let r = to_roff("# lead-exec-x(7) - what it is\n", "1.0").unwrap();
        assert!(r.starts_with(".TH lead-exec-x 7 \"\" \"lead-exec 1.0\"\n.nh\n.ad l\n.SH NAME\nlead\\-exec\\-x \\- what it is\n"), "{r}");
        assert!(to_roff("no title", "1").is_err());
        assert!(to_roff("# x - no section", "1").is_err());
    }

    #[test]
    fn headings_paragraphs_and_inline_text() {
        let r = render("## Why it is safe\n\nA `--ttl` of **10s**, *not*\nless: [see](#x), [etcd](https://etcd.io).\n\n### Sub\n");
        assert!(r.contains(".SH \"WHY IT IS SAFE\"\n"), "{r}");
        assert!(r.contains(".PP\nA \\fB\\-\\-ttl\\fR of \\fB10s\\fR, \\fInot\\fR less: see, etcd <https://etcd.io>.\n"), "{r}");
        assert!(r.contains(".SS \"Sub\"\n"), "{r}");
    }

    #[test]
    fn lists_run_on_over_indented_lines() {
        let r = render("- one\n  more\n- two\n\n1. first\n2. second\n");
        assert!(
            r.contains(".IP \\(bu 2\none more\n.IP \\(bu 2\ntwo\n"),
            "{r}"
        );
        assert!(r.contains(".IP 1. 4\nfirst\n.IP 2. 4\nsecond\n"), "{r}");
    }

    #[test]
    fn long_code_spans_may_break_after_underscores_and_commas() {
        let r = render("See `a_test_name` and `{\"a\":1,\"b\":2}`.\n");
        assert!(r.contains("\\fBa_\\:test_\\:name\\fR"), "{r}");
        assert!(r.contains("\\fB{\"a\":1,\\:\"b\":2}\\fR"), "{r}");
    }

    #[test]
    fn code_blocks_keep_their_lines_and_start_no_request() {
        let r = render("```sql\n.x\nSELECT 'a\\b';\n```\n");
        assert!(r.contains(".nf\n\\&.x\nSELECT 'a\\eb';\n.fi\n"), "{r}");
    }

    #[test]
    fn tables_become_tagged_paragraphs_named_by_their_headers() {
        let r = render(
            "| flag | default | meaning |\n|---|---|---|\n| `--ttl D` | `10s` | the TTL |\n",
        );
        assert!(r.contains(".TP\n\\fB\\fB\\-\\-ttl D\\fR\\fR\n\\fIdefault\\fR: \\fB10s\\fR. \\fImeaning\\fR: the TTL.\n"), "{r}");
        let two = render("| code | meaning |\n|---|---|\n| 64 | usage |\n| `a\\|b` | c |\n");
        assert!(two.contains(".TP\n\\fB\\fBa|b\\fR\\fR\nc\n"), "{two}");
        assert!(two.contains(".TP\n\\fB64\\fR\nusage\n"), "{two}");
    }

    #[test]
    fn headings_lose_their_marks_and_text_is_ascii() {
        let r = render("## `run` flags\n\nTTL − 1 s → D\n");
        assert!(r.contains(".SH \"RUN FLAGS\"\n"), "{r}");
        assert!(r.contains("TTL \\[u2212] 1 s \\[u2192] D\n"), "{r}");
        assert!(r.is_ascii(), "{r}");
    }

    #[test]
    fn an_unmatched_mark_is_text() {
        assert_eq!(inline("a * b `c"), "a * b `c");
    }
}
