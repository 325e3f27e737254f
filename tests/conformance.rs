//! The AAMP parser against fixture corpora: the project's own (always) and the upstream corpus
//! in `../shared/conformance/aamp/parser.json` (when it is present beside the checkout).

use std::path::{Path, PathBuf};

use aamp_bridge::protocol::{AampMessage, MailView};
use serde_json::Value;

fn mail_from_input(input: &Value) -> MailView {
    let text = |k: &str| input[k].as_str().unwrap_or_default().to_string();
    MailView {
        from: text("from"),
        to: vec![text("to")],
        message_id: text("messageId"),
        subject: text("subject"),
        body_text: text("bodyText"),
        headers: input["headers"]
            .as_object()
            .expect("input.headers is an object")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect(),
    }
}

/// Runs every case of a corpus; returns (passed, failures).
fn run_corpus(path: &Path) -> (usize, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let corpus: Value = serde_json::from_str(&text).expect("corpus is JSON");
    let cases = corpus["cases"].as_array().expect("cases is an array");
    assert!(!cases.is_empty(), "{} has no cases", path.display());
    let mut passed = 0;
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let parsed = AampMessage::parse(&mail_from_input(&case["input"]));
        if case["notAamp"].as_bool() == Some(true) {
            match parsed {
                Err(_) => passed += 1,
                Ok(m) => failures.push(format!("{name}: expected not AAMP, got {}", m.to_json())),
            }
            continue;
        }
        let got = match parsed {
            Ok(m) => m.to_json(),
            Err(e) => {
                failures.push(format!("{name}: not AAMP ({e})"));
                continue;
            }
        };
        let mismatches: Vec<String> = case["expected"]
            .as_object()
            .expect("expected is an object")
            .iter()
            .filter(|(k, v)| got.get(k.as_str()) != Some(v))
            .map(|(k, v)| {
                format!(
                    "{k}: expected {v}, got {}",
                    got.get(k.as_str()).unwrap_or(&Value::Null)
                )
            })
            .collect();
        if mismatches.is_empty() {
            passed += 1;
        } else {
            failures.push(format!("{name}: {}", mismatches.join("; ")));
        }
    }
    (passed, failures)
}

#[test]
fn own_parser_cases_pass() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parser-cases.json");
    let (passed, failures) = run_corpus(&path);
    assert!(
        failures.is_empty(),
        "{} passed, failures:\n{}",
        passed,
        failures.join("\n")
    );
    assert!(passed >= 17);
}

#[test]
fn upstream_corpus_passes_when_present() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/aamp/parser.json");
    if !path.exists() {
        eprintln!(
            "upstream corpus not present at {}; own cases cover the same ground",
            path.display()
        );
        return;
    }
    let (passed, failures) = run_corpus(&path);
    eprintln!(
        "upstream AAMP parser corpus: {passed} of {} cases pass",
        passed + failures.len()
    );
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
    assert_eq!(passed, 6, "the upstream corpus has six cases");
}
