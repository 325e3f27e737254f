//! Small rooms: no file in `src` over 800 lines and no function outside tests over 100 lines.
//! The places that were already larger when this check came are listed below with their size
//! then; each may only shrink, and leaves the list once it fits (the test says so), so the list
//! can only get shorter.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 100;

/// Files over the limit, with their length when they were listed.
const LARGE_FILES: &[(&str, usize)] = &[];

/// Functions over the limit (`file::name`), with their length when they were listed.
const LONG_FUNCTIONS: &[(&str, usize)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src reads").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Test code is not held to the limits: `tests.rs` and `*_tests.rs` files and `tests/` folders
/// inside `src`.
fn is_test_file(rel: &str) -> bool {
    rel.ends_with("/tests.rs")
        || rel.ends_with("_tests.rs")
        || rel == "tests.rs"
        || rel.contains("/tests/")
}

/// The source with comments, strings and character literals blanked (newlines kept), so that
/// braces and keywords in them are not counted.
fn code_only(text: &str) -> Vec<char> {
    let s: Vec<char> = text.chars().collect();
    let mut out = s.clone();
    let mut i = 0;
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in out.iter_mut().take(to.min(s.len())).skip(from) {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            let end = (i..s.len()).find(|&j| s[j] == '\n').unwrap_or(s.len());
            blank(&mut out, i, end);
            i = end;
        } else if c == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < s.len() && depth > 0 {
                if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 1;
                } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 1;
                }
                j += 1;
            }
            blank(&mut out, i, j);
            i = j;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&s, i) {
            let hashes = s[i + 1..].iter().take_while(|&&h| h == '#').count();
            if s.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let mut j = i + 2 + hashes;
            while j < s.len() {
                if s[j] == '"'
                    && s[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == '#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            blank(&mut out, i, j);
            i = j;
        } else if c == '"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let end = if next == Some('\\') {
                (i + 2..s.len()).find(|&j| s[j] == '\'')
            } else if s.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end + 1);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

fn ident_before(s: &[char], i: usize) -> bool {
    i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_')
}

/// Each function's name and its length in lines, outside `#[cfg(test)]` modules.
fn functions(text: &str) -> Vec<(String, usize)> {
    let code: String = code_only(text).into_iter().collect();
    let bytes: Vec<char> = code.chars().collect();
    let line_of = |pos: usize| bytes[..pos].iter().filter(|&&c| c == '\n').count();
    let matching = |open: usize| {
        let mut depth = 0usize;
        for (j, &c) in bytes.iter().enumerate().skip(open) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return j;
                    }
                }
                _ => {}
            }
        }
        bytes.len() - 1
    };
    let mut skip_until = 0;
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if i < skip_until {
            i += 1;
            continue;
        }
        let rest: String = bytes[i..bytes.len().min(i + 40)].iter().collect();
        if rest.starts_with("#[cfg(test)]") {
            // The item it marks (a module or a function) is test code.
            let open = (i..bytes.len()).find(|&j| bytes[j] == '{' || bytes[j] == ';');
            if let Some(open) = open.filter(|&o| bytes[o] == '{') {
                skip_until = matching(open) + 1;
            }
            i += 1;
            continue;
        }
        if rest.starts_with("fn ")
            && (i == 0 || !bytes[i - 1].is_alphanumeric() && bytes[i - 1] != '_')
        {
            let name: String = bytes[i + 3..]
                .iter()
                .take_while(|c| c.is_alphanumeric() || **c == '_')
                .collect();
            // The body starts at the first `{` before any `;` (a declaration has none).
            let mut j = i;
            let mut depth = 0i32;
            while j < bytes.len() {
                match bytes[j] {
                    '(' | '[' | '<' => depth += 1,
                    ')' | ']' | '>' => depth -= 1,
                    '{' if depth <= 0 => break,
                    ';' if depth <= 0 => break,
                    _ => {}
                }
                j += 1;
            }
            if j < bytes.len() && bytes[j] == '{' {
                let end = matching(j);
                found.push((name, line_of(end) - line_of(i) + 1));
            }
        }
        i += 1;
    }
    found
}

fn measure() -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut paths = Vec::new();
    rust_files(&src(), &mut paths);
    let (mut files, mut fns) = (BTreeMap::new(), BTreeMap::new());
    for path in paths {
        let rel = path
            .strip_prefix(src())
            .expect("inside src")
            .to_string_lossy()
            .into_owned();
        if is_test_file(&rel) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file reads");
        files.insert(rel.clone(), text.lines().count());
        for (name, lines) in functions(&text) {
            let key = format!("{rel}::{name}");
            let longest = fns.entry(key).or_insert(0);
            *longest = (*longest).max(lines);
        }
    }
    (files, fns)
}

/// What is over `max` but not listed, what grew past its listed size, and what is listed but
/// fits now.
fn judge(measured: &BTreeMap<String, usize>, listed: &[(&str, usize)], max: usize) -> Vec<String> {
    let mut wrong = Vec::new();
    for (name, &size) in measured {
        match listed.iter().find(|(n, _)| n == name) {
            None if size > max => wrong.push(format!("{name}: {size} lines (at most {max})")),
            Some((_, was)) if size > *was => wrong.push(format!(
                "{name}: {size} lines, grown from {was} (at most {max}; it may only shrink)"
            )),
            Some(_) if size <= max => wrong.push(format!(
                "{name}: {size} lines fits now: take it off the list"
            )),
            _ => {}
        }
    }
    for (name, _) in listed {
        if !measured.contains_key(*name) {
            wrong.push(format!("{name}: listed but gone: take it off the list"));
        }
    }
    wrong
}

#[test]
fn no_file_in_src_is_over_800_lines() {
    let (files, _) = measure();
    let wrong = judge(&files, LARGE_FILES, MAX_FILE_LINES);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_function_outside_tests_is_over_100_lines() {
    let (_, fns) = measure();
    let wrong = judge(&fns, LONG_FUNCTIONS, MAX_FN_LINES);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn functions_are_measured_by_their_braces_not_by_what_strings_and_comments_hold() {
    let text = r##"
fn short() {
    let s = "}}} {";
    let c = '{';
    let r = r#"{"#;
    // {
    /* } { */
}

#[cfg(test)]
mod tests {
    fn hidden() {
    }
}

fn generic<'a, T: Into<String>>(x: &'a str) -> Vec<u8> where T: Clone {
    x.bytes().collect()
}
"##;
    let found = functions(text);
    assert_eq!(
        found,
        vec![("short".to_string(), 7), ("generic".to_string(), 3)]
    );
}
