//! The structure the `lib.rs` header states, checked from the source: which top-level module
//! may name which, so no import runs against the flow (config and the wire model at the
//! bottom; mailbox and runner beside each other; dispatch over runner and the inbound model;
//! daemon and the shells on top), and no circle among the parts of one module (files, and
//! folders taken whole), of any length. Reads the files as text; runs nothing.
//!
//! The files are read as Rust tokens (comments, strings and character literals left out),
//! `use` trees parsed with their nested groups, `self`/`as` and globs, and every path
//! (`crate::`, `super::`, `self::`, a child module, a name a `use` bound) resolved to the
//! module it names, through the names other modules' `use` lines bind (re-exports).

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
    ("backend", &["protocol", "error", "inbound"]),
    (
        "runner",
        &["config", "protocol", "error", "events", "fsio", "backoff"],
    ),
    (
        "mailbox",
        &[
            "backend", "inbound", "config", "protocol", "error", "events", "fsio", "paths",
            "backoff",
        ],
    ),
    (
        "dispatch",
        &[
            "runner", "backend", "inbound", "config", "protocol", "error", "events", "fsio",
            "backoff",
        ],
    ),
    (
        "ui",
        &[
            "dispatch", "mailbox", "runner", "backend", "inbound", "config", "protocol", "error",
            "events", "fsio", "paths", "backoff",
        ],
    ),
];

/// A module's path from the crate root (`["mailbox", "aamp"]`); the root is empty.
type ModPath = Vec<String>;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

/// The tokens of a Rust file that matter for paths; comments, strings, characters and
/// numbers are left out.
fn lex(text: &str) -> Vec<Tok> {
    let c: Vec<char> = text.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    // Skips a quoted string whose opening quote is at `i`; returns the index after it.
    let skip_string = |mut i: usize| {
        i += 1;
        while i < c.len() && c[i] != '"' {
            i += if c[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    while i < c.len() {
        let ch = c[i];
        if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(i);
        } else if ch == '\'' {
            if at(i + 1) == '\\' {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1; // a lifetime or label: its name follows as an identifier
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw = (word == "r" || word == "br") && (at(i) == '"' || at(i) == '#');
            if raw && (at(i) == '"' || (at(i) == '#' && (at(i + 1) == '"' || at(i + 1) == '#'))) {
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                i += 1; // the opening quote
                loop {
                    if i >= c.len() {
                        break;
                    }
                    if c[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                        i += 1 + hashes;
                        break;
                    }
                    i += 1;
                }
            } else if word == "b" && at(i) == '"' {
                i = skip_string(i);
            } else if word == "b" && at(i) == '\'' {
                i += if at(i + 1) == '\\' { 4 } else { 3 };
                while i < c.len() && c[i - 1] != '\'' {
                    i += 1;
                }
            } else {
                out.push(Tok::Ident(word));
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Other);
        } else {
            i += 1;
            out.push(match ch {
                ':' if at(i) == ':' => {
                    i += 1;
                    Tok::Sep
                }
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                ';' => Tok::Semi,
                '*' => Tok::Star,
                c if c.is_whitespace() => continue,
                _ => Tok::Other,
            });
        }
    }
    out
}

/// One leaf of a `use` tree: the path as written, and the name it binds (`None` for a glob).
#[derive(Clone, Debug, PartialEq)]
struct Import {
    path: Vec<String>,
    name: Option<String>,
}

/// Parses the `use` tree at `toks[*i..]` under `prefix`, up to the end of this subtree.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Import>) {
    let mut path = prefix.to_vec();
    if toks.get(*i) == Some(&Tok::Sep) {
        *i += 1;
    }
    while let Some(Tok::Ident(word)) = toks.get(*i) {
        path.push(word.clone());
        *i += 1;
        if toks.get(*i) == Some(&Tok::Sep) {
            *i += 1;
        } else {
            break;
        }
    }
    match toks.get(*i) {
        Some(Tok::Open) => {
            *i += 1;
            loop {
                match toks.get(*i) {
                    Some(Tok::Close) => {
                        *i += 1;
                        break;
                    }
                    Some(Tok::Comma) => *i += 1,
                    None | Some(Tok::Semi) => break,
                    Some(_) => {
                        let before = *i;
                        use_tree(toks, i, &path, out);
                        if *i == before {
                            *i += 1;
                        }
                    }
                }
            }
        }
        Some(Tok::Star) => {
            *i += 1;
            out.push(Import { path, name: None });
        }
        _ => {
            if path.last().is_some_and(|l| l == "self") {
                path.pop();
            }
            let mut name = path.last().cloned();
            if toks.get(*i) == Some(&Tok::Ident("as".into())) {
                if let Some(Tok::Ident(alias)) = toks.get(*i + 1) {
                    name = Some(alias.clone());
                }
                *i += 2;
            }
            if !path.is_empty() {
                out.push(Import { path, name });
            }
        }
    }
}

/// What one module (a file, or a `mod x { .. }` inside one) says: its `use` leaves and the
/// other paths its code writes.
#[derive(Clone, Debug, Default)]
struct Said {
    imports: Vec<Import>,
    paths: Vec<Vec<String>>,
}

/// Reads one file of module `base`: what it and each of its inline modules say.
fn read_file(base: &[String], text: &str, out: &mut BTreeMap<ModPath, Said>) {
    let toks = lex(text);
    let mut module: ModPath = base.to_vec();
    // The brace depth at which each inline module opened.
    let mut opened: Vec<usize> = Vec::new();
    let mut depth = 0;
    out.entry(module.clone()).or_default();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(w) if w == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open)) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    module.push(name.clone());
                    out.entry(module.clone()).or_default();
                    depth += 1;
                    opened.push(depth);
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(w) if w == "use" => {
                i += 1;
                let mut leaves = Vec::new();
                use_tree(&toks, &mut i, &[], &mut leaves);
                out.get_mut(&module).unwrap().imports.extend(leaves);
                continue;
            }
            // The start of a path (`a::b`), not its middle.
            Tok::Ident(w)
                if (i == 0 || toks[i - 1] != Tok::Sep) && toks.get(i + 1) == Some(&Tok::Sep) =>
            {
                let mut path = vec![w.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::Sep) {
                    match toks.get(j + 1) {
                        Some(Tok::Ident(next)) => path.push(next.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                out.get_mut(&module).unwrap().paths.push(path);
                i = j;
                continue;
            }
            Tok::Open => depth += 1,
            Tok::Close => {
                if opened.last() == Some(&depth) {
                    opened.pop();
                    module.pop();
                }
                depth -= 1;
            }
            _ => {}
        }
        i += 1;
    }
}

/// The crate as read: each module (files and inline modules) and what it says.
struct Crate {
    modules: BTreeMap<ModPath, Said>,
}

impl Crate {
    /// Reads every `.rs` file under `src` (the library: `main.rs` is the binary's own crate).
    fn read(src: &Path) -> Crate {
        let mut all = Vec::new();
        files(src, &mut all);
        let mut modules = BTreeMap::new();
        for path in all {
            let rel = path.strip_prefix(src).unwrap();
            if rel == Path::new("main.rs") {
                continue;
            }
            let mut parts: ModPath = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            read_file(&parts, &text, &mut modules);
        }
        Crate { modules }
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.modules.contains_key(path)
    }

    /// The module `path`, written in module `at`, names (the module itself, or the one that
    /// holds the item it names); `None` for a path outside the crate. `exact` in the answer
    /// says the path names the module itself.
    fn resolve(&self, at: &[String], path: &[String], hops: usize) -> Option<(ModPath, bool)> {
        if hops > 16 || path.is_empty() {
            return None;
        }
        let mut rest = path;
        let mut here: ModPath = match path[0].as_str() {
            "crate" => {
                rest = &path[1..];
                Vec::new()
            }
            "self" => {
                rest = &path[1..];
                at.to_vec()
            }
            "super" => {
                let mut m = at.to_vec();
                while rest.first().is_some_and(|s| s == "super") {
                    m.pop();
                    rest = &rest[1..];
                }
                m
            }
            _ => at.to_vec(),
        };
        let relative = !matches!(path[0].as_str(), "crate" | "self" | "super");
        for (n, segment) in rest.iter().enumerate() {
            let child = [here.as_slice(), std::slice::from_ref(segment)].concat();
            if self.is_module(&child) {
                here = child;
                continue;
            }
            // A name a `use` in `here` binds.
            let bound = self.modules.get(&here).and_then(|said| {
                said.imports
                    .iter()
                    .find(|im| im.name.as_deref() == Some(segment.as_str()))
            });
            match bound.and_then(|im| self.resolve(&here, &im.path, hops + 1)) {
                Some((target, true)) => here = target,
                Some((target, false)) => return Some((target, false)),
                None if relative && n == 0 => return None, // another crate
                None => return Some((here, false)),
            }
        }
        Some((here, true))
    }

    /// Every module each module names: (from, to), neither the crate root.
    fn edges(&self) -> BTreeSet<(ModPath, ModPath)> {
        let mut out = BTreeSet::new();
        for (at, said) in &self.modules {
            let written = said
                .imports
                .iter()
                .map(|im| &im.path)
                .chain(said.paths.iter());
            for path in written {
                if let Some((to, _)) = self.resolve(at, path, 0) {
                    if !to.is_empty() && !at.is_empty() && &to != at {
                        out.insert((at.clone(), to));
                    }
                }
            }
        }
        out
    }
}

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

/// The imports against the flow: a module below that names one it may not.
fn against_the_flow(krate: &Crate) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for (from, to) in krate.edges() {
        let (top, other) = (from[0].as_str(), to[0].as_str());
        if top == other {
            continue;
        }
        if let Some(may) = allowed.get(top) {
            if !may.contains(&other) {
                wrong.push(format!("{} names {}", from.join("::"), to.join("::")));
            }
        }
    }
    wrong
}

/// The circles among the parts of one module: an edge from `a::x::..` to `a::y::..` is an
/// edge from part `x` to part `y` of module `a` (a parent naming its child, or the child its
/// parent, is no such edge). Each circle is given as its parts, in order.
fn circles(krate: &Crate) -> Vec<String> {
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, to) in krate.edges() {
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if common == from.len() || common == to.len() {
            continue;
        }
        graphs
            .entry(from[..common].to_vec())
            .or_default()
            .entry(from[common].clone())
            .or_default()
            .insert(to[common].clone());
    }
    let mut out = Vec::new();
    for (module, graph) in &graphs {
        for component in strongly_connected(graph) {
            if component.len() > 1 {
                let at = if module.is_empty() {
                    "crate".to_string()
                } else {
                    module.join("::")
                };
                out.push(format!(
                    "{at}: {}",
                    circle_through(graph, &component).join(" -> ")
                ));
            }
        }
    }
    out
}

/// Tarjan's strongly connected components of `graph`.
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// One circle through the component's first part, back to it (a shortest one, by breadth).
fn circle_through(
    graph: &BTreeMap<String, BTreeSet<String>>,
    component: &BTreeSet<String>,
) -> Vec<String> {
    let start = component.iter().next().unwrap().clone();
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(v) = queue.pop_front() {
        for w in graph.get(&v).into_iter().flatten() {
            if !component.contains(w) {
                continue;
            }
            if *w == start {
                let mut path = vec![v.clone()];
                while path.last() != Some(&start) {
                    let back = came_from[path.last().unwrap()].clone();
                    path.push(back);
                }
                path.reverse();
                path.push(start);
                return path;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w.clone(), v.clone());
                queue.push_back(w.clone());
            }
        }
    }
    component.iter().cloned().collect()
}

#[test]
fn no_module_names_one_above_it_or_beside_it_against_the_flow() {
    let wrong = against_the_flow(&Crate::read(&src()));
    assert!(
        wrong.is_empty(),
        "imports against the flow (see ALLOWED and the lib.rs header):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_parts_of_one_module_name_each_other_in_a_circle() {
    let found = circles(&Crate::read(&src()));
    assert!(
        found.is_empty(),
        "parts of one module that name each other in a circle:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_table_itself_runs_one_way() {
    for (n, (module, may)) in ALLOWED.iter().enumerate() {
        for other in *may {
            assert!(
                ALLOWED[..n].iter().any(|(m, _)| m == other),
                "{module} may name {other}, which is not listed before it"
            );
        }
    }
}

/// Writes a made-up crate (`(path under src, text)`) and reads it.
fn made_up(files: &[(&str, &str)]) -> (tempfile::TempDir, Crate) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let krate = Crate::read(dir.path());
    (dir, krate)
}

#[test]
fn a_circle_of_three_files_is_found() {
    let (_dir, krate) = made_up(&[
        ("lib.rs", "pub mod m;\n"),
        ("m/mod.rs", "mod a;\nmod b;\nmod c;\npub use c::Z;\n"),
        ("m/a.rs", "use super::b::X;\n"),
        ("m/b.rs", "pub struct X;\nfn f() { crate::m::c::g(); }\n"),
        // Through the parent's re-export of a's item, inside a nested group.
        ("m/c.rs", "use super::{d::{self}, Y};\npub fn g() {}\n"),
        ("m/d.rs", "// use super::a; a comment names nothing\n"),
    ]);
    assert!(circles(&krate).is_empty(), "{:?}", circles(&krate));
    let (_dir, krate) = made_up(&[
        ("lib.rs", "pub mod m;\n"),
        ("m/mod.rs", "mod a;\nmod b;\nmod c;\npub use a::Y;\n"),
        ("m/a.rs", "use super::b::X;\npub struct Y;\n"),
        ("m/b.rs", "pub struct X;\nfn f() { crate::m::c::g(); }\n"),
        ("m/c.rs", "use super::{d::{self}, Y};\npub fn g() {}\n"),
        ("m/d.rs", ""),
    ]);
    assert_eq!(circles(&krate), ["m: a -> b -> c -> a"]);
}

#[test]
fn paths_resolve_as_rust_resolves_them() {
    let (_dir, krate) = made_up(&[
        (
            "lib.rs",
            "pub mod low;\npub mod mid;\npub mod top;\npub mod other;\n",
        ),
        ("low.rs", "pub struct L;\n"),
        ("other.rs", "pub struct O;\n"),
        // A top-level file naming its sibling with `super::`, in a string nothing.
        ("mid/mod.rs", "mod x;\npub use x::Thing;\n"),
        (
            "mid/x.rs",
            "use super::super::{low::{self, L}, top as t};\nconst S: &str = \"crate::other\";\nmod tests { use super::super::super::other::O; }\n",
        ),
        ("top.rs", "use crate::mid::Thing;\n"),
    ]);
    let edges = krate.edges();
    let named = |from: &str| -> BTreeSet<String> {
        edges
            .iter()
            .filter(|(f, _)| f.join("::") == from)
            .map(|(_, t)| t.join("::"))
            .collect()
    };
    assert_eq!(named("mid::x"), ["low", "top"].map(String::from).into());
    assert_eq!(named("mid::x::tests"), ["other"].map(String::from).into());
    // `Thing` is `mid`'s re-export of `mid::x`'s item: the path names `mid::x`.
    assert_eq!(named("top"), ["mid::x"].map(String::from).into());
    assert_eq!(
        against_the_flow(&krate),
        Vec::<String>::new(),
        "none of these is in the table"
    );
}

#[test]
fn a_top_level_file_naming_upward_through_super_is_caught() {
    let (_dir, krate) = made_up(&[
        ("lib.rs", "pub mod dispatch;\npub mod mailbox;\n"),
        ("dispatch.rs", "pub struct D;\n"),
        ("mailbox/mod.rs", "mod x;\n"),
        (
            "mailbox/x.rs",
            "fn f() { use super::super::{dispatch::{D}}; }\n",
        ),
    ]);
    assert_eq!(against_the_flow(&krate), ["mailbox::x names dispatch"]);
}
