//! The manual's links checked as GitHub renders them: every relative link of a Markdown file
//! names a file that exists, and every `#anchor` (alone, or after `file.md`) names a heading of
//! that file (by GitHub's slug rule) or an `<a id="…">` in it. Used on the source tree
//! (tests/docs.rs) and on the documentation a package installs (tests/packaging.rs).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// One link that does not resolve: where it is, what it says, and why it fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenLink {
    pub file: PathBuf,
    pub line: usize,
    pub target: String,
    pub why: String,
}

impl std::fmt::Display for BrokenLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: ({}) {}",
            self.file.display(),
            self.line,
            self.target,
            self.why
        )
    }
}

/// GitHub's anchor for a heading's text: lowercase; a space becomes '-'; letters, digits,
/// '-' and '_' stay; every other character is dropped. Inline code and link markup are
/// removed first, as GitHub slugs the rendered text.
pub fn slug(heading: &str) -> String {
    let text = strip_links(heading);
    let mut out = String::new();
    for c in text.chars() {
        if c == ' ' {
            out.push('-');
        } else if c.is_alphanumeric() || c == '-' || c == '_' {
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// `[text](target)` → `text`, so a heading holding a link slugs as its rendered words.
fn strip_links(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some((at, label, _target, end)) = next_link(rest) {
        out.push_str(&rest[..at]);
        out.push_str(label);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out.replace(['`', '*'], "")
}

/// The next `[label](target)` in `text` (an image's `![…](…)` too): its start, label,
/// target and the end of its `)`.
fn next_link(text: &str) -> Option<(usize, &str, &str, usize)> {
    let mut from = 0;
    while let Some(open) = text[from..].find('[').map(|i| i + from) {
        let close = match text[open..].find("](") {
            Some(i) => open + i,
            None => return None,
        };
        let label = &text[open + 1..close];
        if label.contains('[') {
            // A nested bracket: an image inside a link; the inner one is found next time.
            from = open + 1;
            continue;
        }
        let start = close + 2;
        let end = text[start..].find(')')? + start;
        return Some((open, label, text[start..end].trim(), end + 1));
    }
    None
}

/// A Markdown file's lines outside fenced code blocks, numbered from 1: as written, and with
/// inline code spans blanked (a link inside backticks is text, not a link).
fn prose_lines(text: &str) -> Vec<(usize, &str, String)> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut kept = String::new();
        for (n, part) in line.split('`').enumerate() {
            if n % 2 == 0 {
                kept.push_str(part);
            } else {
                kept.push_str(&" ".repeat(part.len() + 2));
            }
        }
        out.push((i + 1, line, kept));
    }
    out
}

/// The anchors a Markdown file offers: its headings' slugs (a repeated one gets `-1`, `-2`,
/// as GitHub numbers them) and the ids of its `<a id="…">` / `<a name="…">` tags.
pub fn anchors(text: &str) -> HashSet<String> {
    let mut found = HashSet::new();
    for (_, raw, line) in prose_lines(text) {
        let trimmed = raw.trim_start();
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
            let base = slug(trimmed[hashes..].trim());
            let mut name = base.clone();
            let mut n = 0;
            while found.contains(&name) {
                n += 1;
                name = format!("{base}-{n}");
            }
            found.insert(name);
        }
        for attr in ["<a id=\"", "<a name=\""] {
            let mut rest = line.as_str();
            while let Some(at) = rest.find(attr) {
                rest = &rest[at + attr.len()..];
                if let Some(end) = rest.find('"') {
                    found.insert(rest[..end].to_string());
                }
            }
        }
    }
    found
}

/// The links of a Markdown file: (line, target), outside code.
pub fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, _, line) in prose_lines(text) {
        let mut rest = line.as_str();
        while let Some((_, _, target, end)) = next_link(rest) {
            out.push((n, target.to_string()));
            rest = &rest[end..];
        }
    }
    out
}

/// Every link of `file` that does not resolve. Links with a scheme (`https:`, `mailto:`)
/// are not followed: the test runs without a network.
pub fn broken_links(file: &Path) -> Vec<BrokenLink> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut broken = Vec::new();
    for (line, target) in links(&text) {
        let target = target
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_matches(['<', '>'])
            .to_string();
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let bad = |why: String| BrokenLink {
            file: file.to_path_buf(),
            line,
            target: target.clone(),
            why,
        };
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else if path.starts_with('/') {
            broken.push(bad(
                "an absolute path: GitHub and an installed copy differ".into()
            ));
            continue;
        } else {
            dir.join(path)
        };
        if !resolved.exists() {
            broken.push(bad(format!("{} does not exist", resolved.display())));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if resolved.extension().and_then(|e| e.to_str()) != Some("md") {
            broken.push(bad("an anchor into a file that is not Markdown".into()));
            continue;
        }
        let target_text = std::fs::read_to_string(&resolved)
            .unwrap_or_else(|e| panic!("{}: {e}", resolved.display()));
        if !anchors(&target_text).contains(anchor) {
            broken.push(bad(format!(
                "no heading or <a id> in {} has the anchor #{anchor}",
                resolved.display()
            )));
        }
    }
    broken
}

/// The Markdown files under `dir`, recursively, sorted.
pub fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}
