//! The five fuzz targets' checks as ordinary tests: every saved input (`fuzz/seeds`,
//! `tests/fixtures/fuzz-regressions`, and a local `fuzz/corpus/TARGET` when fuzzing has left
//! one) and a fixed number of seeded mutations of them go through the same `check` the fuzzer
//! runs (`fuzz/checks/*.rs`). Fuzzing itself (cargo-fuzz, minutes per target) is the long
//! tier's: `scripts/test.sh --long`.

use std::path::{Path, PathBuf};

#[path = "../fuzz/checks/config_load.rs"]
mod config_load;
#[path = "../fuzz/checks/parse_mail.rs"]
mod parse_mail;
#[path = "../fuzz/checks/profile_parse.rs"]
mod profile_parse;
#[path = "../fuzz/checks/render_reply.rs"]
mod render_reply;
#[path = "../fuzz/checks/stream_lines.rs"]
mod stream_lines;

/// Mutations per saved input: enough to walk each parser's error paths in about a second.
const MUTATIONS: usize = 300;

fn saved_inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let folders = [
        root.join("fuzz/seeds"),
        root.join("tests/fixtures/fuzz-regressions"),
        root.join("fuzz/corpus").join(target),
        root.join("fuzz/artifacts").join(target),
    ];
    let mut inputs = Vec::new();
    for folder in folders {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() {
                let bytes = std::fs::read(&path).expect("a saved input reads");
                inputs.push((path, bytes));
            }
        }
    }
    inputs.sort();
    inputs
}

/// A small deterministic generator (xorshift64*), so a failure names a seed that replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes the parsers treat specially: line ends, header syntax, encodings, NUL, UTF-8 starts.
const INTERESTING: &[&[u8]] = &[
    b"\r\n",
    b"\n",
    b":",
    b"=?utf-8?B?",
    b"?=",
    b"\0",
    b"\xe2\x80\xae",
    b"\xff",
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b"X-AAMP-",
    b"--",
    b"\r\n\r\n",
    b"\t",
];

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(5) {
            0 if !out.is_empty() => {
                let at = at.min(out.len() - 1);
                out[at] = rng.next() as u8;
            }
            1 => {
                let token = INTERESTING[rng.below(INTERESTING.len())];
                out.splice(at..at, token.iter().copied());
            }
            2 if !out.is_empty() => {
                let end = (at + rng.below(64)).min(out.len());
                out.drain(at.min(end)..end);
            }
            3 if !out.is_empty() => {
                let start = rng.below(out.len());
                let end = (start + rng.below(128)).min(out.len());
                let copy = out[start..end].to_vec();
                out.splice(at..at, copy);
            }
            _ => out.truncate(at),
        }
    }
    out
}

fn replay(target: &str, check: fn(&[u8])) {
    let inputs = saved_inputs(target);
    assert!(
        inputs.len() >= 6,
        "the saved inputs are missing: {inputs:?}"
    );
    for (path, bytes) in &inputs {
        let outcome = std::panic::catch_unwind(|| check(bytes));
        assert!(outcome.is_ok(), "{target} fails on {}", path.display());
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ bytes.len() as u64);
        for round in 0..MUTATIONS {
            let state = rng.0;
            let mutated = mutate(&mut rng, bytes);
            let outcome = std::panic::catch_unwind(|| check(&mutated));
            assert!(
                outcome.is_ok(),
                "{target} fails on mutation {round} of {} (generator state {state:#x}); input: {:?}",
                path.display(),
                String::from_utf8_lossy(&mutated)
            );
        }
    }
}

#[test]
fn parse_mail_replays() {
    replay("parse_mail", parse_mail::check);
}

#[test]
fn render_reply_replays() {
    replay("render_reply", render_reply::check);
}

#[test]
fn stream_lines_replays() {
    replay("stream_lines", stream_lines::check);
}

#[test]
fn profile_parse_replays() {
    replay("profile_parse", profile_parse::check);
}

#[test]
fn config_load_replays() {
    replay("config_load", config_load::check);
}

/// The replay would pass trivially if mutations never reached the parsers' interesting parts:
/// at least some mutated mails must still read as AAMP.
#[test]
fn mutations_keep_some_mails_readable() {
    let (_, bytes) = saved_inputs("parse_mail")
        .into_iter()
        .find(|(p, _)| p.ends_with("dispatch.eml"))
        .expect("the dispatch seed");
    let mut rng = Rng(7);
    let readable = (0..MUTATIONS)
        .filter(|_| {
            let m = mutate(&mut rng, &bytes);
            aamp_bridge::protocol::parse_raw(&m)
                .is_some_and(|v| aamp_bridge::protocol::AampMessage::parse(&v).is_ok())
        })
        .count();
    assert!(
        readable > MUTATIONS / 10,
        "only {readable} of {MUTATIONS} mutations read as AAMP"
    );
}
