//! The structure the `lib.rs` header states, checked from the source: which top-level module
//! may name which (`crate::x` in `use` lines and paths), so no import runs against the flow
//! (config and the wire model at the bottom; mailbox and runner beside each other; dispatch
//! over runner and the inbound model; daemon and the shells on top), and no two files of one
//! module name each other (a circle). Reads the files as text; runs nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module and the modules it may name. A module absent here is a shell on top (daemon,
/// cli, wizard, service, telemetry): it may name anything, and nothing below may name it.
const ALLOWED: &[(&str, &[&str])] = &[
    ("protocol", &[]),
    ("backoff", &[]),
    ("paths", &[]),
    ("fsio", &["paths"]),
    ("error", &[]),
    ("events", &["protocol"]),
    ("config", &["protocol", "error", "fsio", "paths"]),
    ("inbound", &["protocol", "config"]),
    (
        "runner",
        &["config", "protocol", "error", "events", "fsio", "backoff"],
    ),
    (
        "mailbox",
        &[
            "inbound", "config", "protocol", "error", "events", "fsio", "backoff",
        ],
    ),
    (
        "dispatch",
        &[
            "runner", "inbound", "config", "protocol", "error", "events", "fsio", "backoff",
        ],
    ),
];

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (line comments and doc comments), so prose that
/// names a module does not count.
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a file names with `crate::`, including `use crate::{a, b::c}`.
fn named(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let head: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !head.is_empty() {
                    out.insert(head);
                }
            }
        } else {
            let head: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !head.is_empty() {
                out.insert(head);
            }
        }
    }
    out
}

/// `src/a/b.rs` → ("a", "b"); `src/a.rs` → ("a", ""); `src/a/mod.rs` → ("a", "mod").
fn place(path: &Path) -> (String, String) {
    let rel = path.strip_prefix(src()).unwrap();
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    match parts.as_slice() {
        [file] => (file.clone(), String::new()),
        [module, rest @ ..] => (module.clone(), rest.join("/")),
        [] => unreachable!(),
    }
}

#[test]
fn no_module_names_one_above_it_or_beside_it_against_the_flow() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for path in &all {
        let (module, _) = place(path);
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(may) = allowed.get(module.as_str()) else {
            continue; // a shell on top
        };
        let text = std::fs::read_to_string(path).unwrap();
        for other in named(&code(&text)) {
            if other != module && !may.contains(&other.as_str()) {
                wrong.push(format!(
                    "{} names crate::{other}",
                    path.strip_prefix(src()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the flow (see ALLOWED and the lib.rs header):\n{}",
        wrong.join("\n")
    );
}

/// The names a file of `module` takes from its parent (`super::x`, `super::{x, y}`,
/// `crate::module::x`); the circle check keeps those that are sibling files. A module's own
/// `mod.rs` is its parent, not a sibling.
fn siblings(module: &str, code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in ["super::".to_string(), format!("crate::{module}::")] {
        let mut rest = code;
        while let Some(i) = rest.find(&prefix) {
            rest = &rest[i + prefix.len()..];
            let heads: Vec<String> = match rest.strip_prefix('{') {
                Some(group) => group[..group.find('}').unwrap_or(group.len())]
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .collect(),
                None => vec![rest.to_string()],
            };
            for head in heads {
                let name: String = head
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

#[test]
fn no_two_files_of_one_module_name_each_other() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for path in &all {
        // The folder (`mailbox/aamp`) and the file's name in it; a folder's `mod.rs` is the
        // parent of the others, not a sibling.
        let rel = path.strip_prefix(src()).unwrap();
        let Some(folder) = rel.parent().filter(|f| !f.as_os_str().is_empty()) else {
            continue;
        };
        let file = rel.file_stem().unwrap().to_string_lossy().to_string();
        if file == "mod" {
            continue;
        }
        let module = folder.to_string_lossy().replace('/', "::");
        let text = std::fs::read_to_string(path).unwrap();
        edges.insert((module.clone(), file), siblings(&module, &code(&text)));
    }
    let mut circles = Vec::new();
    for ((module, file), names) in &edges {
        for other in names
            .iter()
            .filter(|n| edges.contains_key(&(module.clone(), n.to_string())))
        {
            if file < other
                && edges
                    .get(&(module.clone(), other.clone()))
                    .is_some_and(|back| back.contains(file))
            {
                circles.push(format!("{module}::{file} <-> {module}::{other}"));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files that name each other:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_check() {
    let code = "use crate::{config::X, protocol};\nlet a = crate::runner::run();\n// crate::daemon in a comment\n";
    let names = named(&code_of(code));
    assert_eq!(
        names,
        ["config", "protocol", "runner"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    let sib = siblings(
        "runner",
        "use super::profile::Profile;\nuse super::{acp::X, Y};\n",
    );
    assert!(sib.contains("acp") && sib.contains("profile") && sib.contains("Y"));
}

fn code_of(text: &str) -> String {
    code(text)
}
