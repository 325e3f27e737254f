//! Build → RFC 5322 bytes → parse, for every intent, through a real MIME parser; and property
//! tests that arbitrary values survive the trip.

use std::collections::BTreeMap;
use std::time::SystemTime;

use aamp_bridge::protocol::{
    parse_raw, render, AampMessage, Body, Dispatch, Envelope, HelpNeeded, Intent, Priority, Status,
    TaskResult,
};
use proptest::prelude::*;
use serde_json::json;

fn envelope(task_id: &str) -> Envelope {
    Envelope {
        version: "1.1".into(),
        task_id: task_id.into(),
        from: "planner@corp.test".into(),
        to: vec!["coder@corp.test".into()],
        message_id: String::new(),
        subject: String::new(),
        in_reply_to: Some("<parent@corp.test>".into()),
        references: vec!["<root@corp.test>".into(), "<parent@corp.test>".into()],
        received_body: None,
    }
}

fn trip(msg: &AampMessage) -> AampMessage {
    let mail = render(msg, SystemTime::now());
    let text = String::from_utf8(mail.bytes.clone()).expect("rendered mail is UTF-8");
    for line in text.split("\r\n") {
        assert!(line.len() <= 998, "line over 998 characters: {line:.60}...");
    }
    assert!(
        !text.replace("\r\n", "").contains('\n'),
        "bare LF in rendered mail"
    );
    let view = parse_raw(&mail.bytes).expect("rendered mail parses");
    let parsed = AampMessage::parse(&view).unwrap_or_else(|e| panic!("not AAMP: {e}\n{text}"));
    assert_eq!(parsed.envelope.message_id, mail.message_id);
    parsed
}

fn assert_trips(body: Body, task_id: &str) {
    let mut msg = AampMessage {
        envelope: envelope(task_id),
        body,
    };
    msg.envelope.subject = msg.subject();
    let back = trip(&msg);
    assert_eq!(back.intent(), msg.intent());
    assert_eq!(back.envelope.task_id, msg.envelope.task_id);
    assert_eq!(back.envelope.from, msg.envelope.from);
    assert_eq!(back.envelope.to, msg.envelope.to);
    assert_eq!(back.envelope.subject, msg.envelope.subject);
    assert_eq!(back.envelope.in_reply_to, msg.envelope.in_reply_to);
    assert_eq!(back.envelope.references, msg.envelope.references);
    assert_eq!(back.body, msg.body, "body of {}", msg.intent());
}

fn every_intent() -> Vec<Body> {
    let mut context = BTreeMap::new();
    context.insert("repo".to_string(), "acme/web app".to_string());
    vec![
        Body::Dispatch(Dispatch {
            title: "Fix the build".into(),
            priority: Priority::High,
            expires_at: Some("2027-01-01T00:00:00.000Z".into()),
            session_key: Some("thread-9".into()),
            dispatch_context: context,
            parent_task_id: Some("t-parent".into()),
            hop_count: Some(2),
            chain: aamp_bridge::protocol::Chain {
                id: Some("chain-9".into()),
                members: vec!["root@corp.test".into(), "planner@corp.test".into()],
                deadline: Some("2027-01-01T00:00:00Z".into()),
                budget_tokens: Some(9000),
                traceparent: aamp_bridge::protocol::chain::Traceparent::parse(
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                ),
            },
            body_text: "Line one.\nLine two.".into(),
        }),
        Body::Cancel {
            reason: "No longer needed.".into(),
        },
        Body::Ack,
        Body::HelpNeeded(HelpNeeded {
            question: "Which DB?".into(),
            blocked_reason: "Schema unknown.".into(),
            suggested_options: vec!["PostgreSQL".into(), "SQLite".into()],
        }),
        Body::Result(TaskResult {
            status: Status::Completed,
            output: "All done.\nTwo lines.".into(),
            error: None,
            structured_result: Some(
                json!([{"fieldKey": "summary", "fieldTypeKey": "text", "value": "ok"}]),
            ),
            usage: Some(aamp_bridge::protocol::Usage {
                input_tokens: 1200,
                output_tokens: 340,
                cache_read_tokens: 5000,
                cache_write_tokens: 0,
                cost_micros: Some(12_345),
                cost_partial: false,
                model: Some("claude-sonnet-4-5".into()),
            }),
        }),
        Body::Result(TaskResult {
            status: Status::Rejected,
            output: String::new(),
            error: Some("agent exited with status 3".into()),
            structured_result: None,
            usage: Some(aamp_bridge::protocol::Usage {
                input_tokens: 7,
                ..Default::default()
            }),
        }),
        Body::StreamOpened {
            stream_id: "str_42".into(),
        },
        Body::PairRequest {
            pair_code: "Zk3_q9-AbC".into(),
            rules: Some(json!({"repo": ["acme/web"]})),
        },
        Body::PairRespond {
            status: Status::Rejected,
            reason: Some("invalid or expired pair code".into()),
        },
        Body::PairRespond {
            status: Status::Completed,
            reason: None,
        },
        Body::CardQuery {
            text: "What can you do?".into(),
        },
        Body::CardResponse {
            summary: "Reviews Rust code".into(),
            text: "# Card\n\nI review Rust.".into(),
        },
    ]
}

#[test]
fn every_intent_survives_rfc5322() {
    let bodies = every_intent();
    let intents: std::collections::HashSet<Intent> = bodies.iter().map(Body::intent).collect();
    assert_eq!(
        intents.len(),
        Intent::ALL.len(),
        "the list covers all ten intents"
    );
    for body in bodies {
        assert_trips(body, "task-42");
    }
}

#[test]
fn ascii_headers_are_never_encoded_words() {
    let structured = json!({"blob": "x".repeat(2000)});
    let msg = AampMessage {
        envelope: envelope(&"t".repeat(500)),
        body: Body::Result(TaskResult {
            status: Status::Completed,
            output: "ok".into(),
            error: None,
            structured_result: Some(structured.clone()),
            usage: None,
        }),
    };
    let mail = render(&msg, SystemTime::now());
    let text = String::from_utf8(mail.bytes).unwrap();
    let headers = &text[..text.find("\r\n\r\n").unwrap()];
    assert!(!headers.contains("=?"), "no encoded-word in:\n{headers}");
    assert!(headers.contains(&format!("X-AAMP-TaskId: {}", "t".repeat(500))));
    let back = AampMessage::parse(&parse_raw(text.as_bytes()).unwrap()).unwrap();
    match back.body {
        Body::Result(r) => assert_eq!(r.structured_result, Some(structured)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn hostile_values_cannot_add_headers() {
    let msg = AampMessage {
        envelope: envelope("t-1\r\nBcc: victim@evil.test"),
        body: Body::Result(TaskResult {
            status: Status::Rejected,
            output: String::new(),
            error: Some("boom\r\nX-AAMP-Status: completed".into()),
            structured_result: None,
            usage: None,
        }),
    };
    let mail = render(&msg, SystemTime::now());
    let text = String::from_utf8(mail.bytes).unwrap();
    let headers = &text[..text.find("\r\n\r\n").unwrap()];
    assert!(!headers.lines().any(|l| l.starts_with("Bcc:")), "{headers}");
    let starts = |prefix: &str| {
        headers
            .split("\r\n")
            .filter(|l| l.starts_with(prefix))
            .count()
    };
    assert_eq!(starts("X-AAMP-Status:"), 1, "{headers}");
    assert_eq!(starts("X-AAMP-ErrorMsg:"), 1, "{headers}");
    let back = AampMessage::parse(&parse_raw(text.as_bytes()).unwrap()).unwrap();
    match back.body {
        Body::Result(r) => assert_eq!(r.status, Status::Rejected),
        other => panic!("{other:?}"),
    }
}

#[test]
fn garbage_is_never_a_panic() {
    for input in [
        &b""[..],
        b"\r\n\r\n",
        b"X-AAMP-Intent: task.dispatch\r\n",
        b"\xff\xfe\x00garbage",
        b"Subject: =?utf-8?B?####?=\r\n\r\nx",
    ] {
        if let Some(view) = parse_raw(input) {
            let _ = AampMessage::parse(&view);
        }
    }
}

/// Text that a header or body could carry: printable Unicode, spaces, newlines in bodies.
fn text_value() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,:;!?'\"()\\[\\]{}<>@#$%&*+=/_|~^`-]{0,40}|[\\PC]{0,30}"
}

fn one_line() -> impl Strategy<Value = String> {
    text_value().prop_map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn dispatch_values_survive(
        title in one_line().prop_filter("non-empty", |t| !t.is_empty()),
        session in "[A-Za-z0-9._:-]{1,40}",
        ctx in prop::collection::btree_map("[a-z0-9_-]{1,12}", one_line().prop_filter("non-empty", |v| !v.is_empty()), 0..4),
        body in "[\\PC\n]{0,200}",
    ) {
        let ctx: BTreeMap<String, String> = ctx.into_iter().map(|(k, v)| (k, v.trim().to_string())).filter(|(_, v)| !v.is_empty()).collect();
        let body_text = body.replace('\r', "").trim_end().to_string();
        let msg = AampMessage {
            envelope: envelope("task-p"),
            body: Body::Dispatch(Dispatch {
                title: title.clone(),
                priority: Priority::Normal,
                expires_at: None,
                session_key: Some(session.clone()),
                dispatch_context: ctx.clone(),
                parent_task_id: None,
                hop_count: None,
                chain: Default::default(),
                body_text: body_text.clone(),
            }),
        };
        let back = trip(&msg);
        let Body::Dispatch(d) = back.body else { panic!("not a dispatch") };
        prop_assert_eq!(d.title, title);
        prop_assert_eq!(d.session_key, Some(session));
        prop_assert_eq!(d.dispatch_context, ctx);
        prop_assert_eq!(d.body_text.trim_end(), body_text);
    }

    #[test]
    fn result_values_survive(
        output in "[\\PC\n]{0,300}",
        error in one_line(),
        structured in prop::collection::vec(one_line(), 0..5),
        rejected: bool,
    ) {
        let output = output.replace('\r', "").trim().to_string();
        let error = error.trim().to_string();
        let msg = AampMessage {
            envelope: envelope("task-r"),
            body: Body::Result(TaskResult {
                status: if rejected { Status::Rejected } else { Status::Completed },
                output: if rejected { String::new() } else { output.clone() },
                error: (rejected && !error.is_empty()).then(|| error.clone()),
                structured_result: (!structured.is_empty()).then(|| json!(structured)),
                usage: None,
            }),
        };
        let back = trip(&msg);
        let mut expected = msg.body.clone();
        if let Body::Result(r) = &mut expected {
            if rejected && r.error.is_none() {
                // A rejected result always says why; "rejected" when nothing better is known.
                r.error = Some("rejected".into());
            }
        }
        prop_assert_eq!(back.body, expected);
    }

    #[test]
    fn help_values_survive(
        question in one_line().prop_filter("non-empty", |t| !t.trim().is_empty()),
        options in prop::collection::vec(one_line().prop_filter("non-empty", |t| !t.trim().is_empty() && !t.contains('|')), 0..5),
    ) {
        let options: Vec<String> = options.iter().map(|o| o.trim().to_string()).collect();
        let msg = AampMessage {
            envelope: envelope("task-h"),
            body: Body::HelpNeeded(HelpNeeded {
                question: question.trim().to_string(),
                blocked_reason: String::new(),
                suggested_options: options.clone(),
            }),
        };
        let back = trip(&msg);
        let Body::HelpNeeded(h) = back.body else { panic!("not help") };
        prop_assert_eq!(h.question, question.trim());
        prop_assert_eq!(h.suggested_options, options);
    }
}

#[test]
fn overlong_task_ids_are_not_aamp() {
    let raw = format!(
        "From: a@x.test\r\nX-AAMP-Intent: task.dispatch\r\nX-AAMP-TaskId: {}\r\n\r\n",
        "x".repeat(513)
    );
    let err = AampMessage::parse(&parse_raw(raw.as_bytes()).unwrap()).unwrap_err();
    assert!(err.to_string().contains("513"), "{err}");
}

#[test]
fn control_characters_in_a_task_id_do_not_survive_reading() {
    let raw = b"From: a@x.test\r\nTo: b@x.test\r\nX-AAMP-Intent: task.dispatch\r\nX-AAMP-TaskId: \x01\x02\r\n\r\n";
    let view = parse_raw(raw).unwrap();
    assert!(
        AampMessage::parse(&view).is_err(),
        "a TaskId of control characters is no TaskId"
    );
    let raw = b"From: a@x.test\r\nTo: b@x.test\r\nX-AAMP-Intent: task.dispatch\r\nX-AAMP-TaskId: a\x01b\r\n\r\n";
    let msg = AampMessage::parse(&parse_raw(raw).unwrap()).unwrap();
    assert_eq!(trip(&msg).task_id(), msg.task_id());
}

/// Inputs the fuzzer once broke: each must read, render and read back to the same task.
#[test]
fn fuzz_regressions_round_trip() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz-regressions");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let Some(view) = parse_raw(&bytes) else {
            continue;
        };
        let Ok(msg) = AampMessage::parse(&view) else {
            continue;
        };
        let back = trip(&msg);
        assert_eq!(back.task_id(), msg.task_id());
        assert_eq!(back.intent(), msg.intent());
        count += 1;
    }
    assert!(count >= 1);
}

#[test]
fn attachments_travel_in_multipart_mail() {
    use aamp_bridge::protocol::{render_with, OutgoingFile};
    let msg = AampMessage {
        envelope: envelope("task-files"),
        body: Body::Dispatch(Dispatch {
            title: "With files".into(),
            body_text: "See the attachments.".into(),
            ..Dispatch::default()
        }),
    };
    let files = vec![
        OutgoingFile {
            filename: "notes.txt".into(),
            content_type: "text/plain".into(),
            bytes: b"line one\nline two\n".to_vec(),
        },
        OutgoingFile {
            filename: "données.bin".into(),
            content_type: "application/octet-stream".into(),
            bytes: (0..=255u8).collect(),
        },
    ];
    let mail = render_with(&msg, SystemTime::now(), &files);
    use mail_parser::MimeHeaders;
    let parsed = mail_parser::MessageParser::default()
        .parse(&mail.bytes)
        .unwrap();
    assert_eq!(parsed.body_text(0).unwrap().trim(), "See the attachments.");
    let got: Vec<(String, Vec<u8>)> = parsed
        .attachments()
        .map(|a| {
            (
                a.attachment_name().unwrap_or_default().to_string(),
                a.contents().to_vec(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("notes.txt".to_string(), files[0].bytes.clone()),
            ("données.bin".to_string(), files[1].bytes.clone())
        ]
    );
    let back = AampMessage::parse(&parse_raw(&mail.bytes).unwrap()).unwrap();
    assert_eq!(back.task_id(), "task-files");
}
