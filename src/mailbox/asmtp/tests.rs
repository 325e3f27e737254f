//! The ASMTP back-end's own tests: envelopes to tasks and answers to reply envelopes.

use serde_json::json;

use super::client::*;
use super::replies::*;
use super::wire::*;
use crate::protocol::{self, AampMessage, Body};

/// Issue 21: the ids looked like ULIDs but were not time-ordered. They are now: the answer's
/// date in the first 10 characters, stable for the same Message-ID and date.
#[test]
fn envelope_ids_are_stable_time_ordered_ulids() {
    let now = 1_796_000_000_000;
    let a = envelope_id("<task.result.1@x>", now);
    assert_eq!(a, envelope_id("<task.result.1@x>", now));
    assert_ne!(a, envelope_id("<task.result.2@x>", now));
    assert_eq!(a.len(), 26);
    assert!(a.starts_with("01"));
    assert!(a
        .chars()
        .all(|c| "0123456789ABCDEFGHJKMNPQRSTVWXYZ".contains(c)));
    // The time, decoded, is the date's.
    let time = a[..10].chars().fold(0i64, |acc, c| {
        acc * 32 + "0123456789ABCDEFGHJKMNPQRSTVWXYZ".find(c).unwrap() as i64
    });
    assert_eq!(time, now);
    // Later answers sort later, whatever their Message-IDs.
    let mut ids: Vec<String> = (0..50)
        .map(|n| envelope_id(&format!("<m{}@x>", 50 - n), now + n * 1000))
        .collect();
    let made = ids.clone();
    ids.sort();
    assert_eq!(ids, made);
    // A date the `01` prefix cannot hold is kept within it.
    assert!(envelope_id("<m@x>", 0).starts_with("01"));
    assert!(envelope_id("<m@x>", i64::MAX).starts_with("01"));
}

fn envelope() -> AsmtpEnvelope {
    AsmtpEnvelope {
        id: "01HZZZZZZZZZZZZZZZZZZZZZZZ".into(),
        from: "@alice.boss".into(),
        to: vec!["@alice.coder".into()],
        subject: Some("Fix the build".into()),
        in_reply_to: None,
        references: vec![],
        content_parts: vec![
            json!({"type": "text", "text": "It fails."}),
            json!({"type": "data", "data": {"branch": "main"}}),
        ],
        oversized: None,
    }
}

#[test]
fn an_envelope_becomes_a_task_and_its_answer_a_reply_the_same_every_time() {
    let inbound = to_inbound(&envelope(), "@alice.coder").unwrap();
    let msg = &inbound.message;
    assert_eq!(msg.task_id(), "asmtp:01HZZZZZZZZZZZZZZZZZZZZZZZ");
    assert_eq!(msg.envelope.from, "@alice.boss");
    match &msg.body {
        Body::Dispatch(d) => {
            assert_eq!(d.title, "Fix the build");
            assert!(d.body_text.contains("It fails.") && d.body_text.contains("\"branch\""));
            assert_eq!(
                d.session_key.as_deref(),
                Some("asmtp:01HZZZZZZZZZZZZZZZZZZZZZZZ")
            );
        }
        other => panic!("{other:?}"),
    }
    let mut reply = AampMessage::reply(
        &msg.envelope,
        "@alice.coder",
        Body::Result(protocol::TaskResult {
            status: protocol::Status::Completed,
            output: "fixed".into(),
            error: None,
            structured_result: None,
            usage: None,
        }),
    );
    reply.envelope.message_id = "<task.result.1@x>".into();
    let rendered = protocol::rfc5322::render(&reply, std::time::SystemTime::now());
    let envelope = AsmtpReplies::envelope_for(&rendered).unwrap();
    assert_eq!(envelope["in_reply_to"], "01HZZZZZZZZZZZZZZZZZZZZZZZ");
    assert_eq!(envelope["to"], json!(["@alice.boss"]));
    assert_eq!(envelope["content_parts"][0]["text"], "fixed");
    assert!(envelope.get("from").is_none(), "the operator stamps from");
    assert_eq!(
        AsmtpReplies::envelope_for(&rendered).unwrap(),
        envelope,
        "a resend is the same envelope"
    );
}

/// Issue 18: two agents that allow each other answered each other's answers forever.
/// The reply envelope the coder's completed result to `e` becomes, with `output`.
fn answer_to(e: &AsmtpEnvelope, output: &str) -> serde_json::Value {
    let inbound = to_inbound(e, "@alice.coder").unwrap();
    let reply = AampMessage::reply(
        &inbound.message.envelope,
        "@alice.coder",
        Body::Result(protocol::TaskResult {
            status: protocol::Status::Completed,
            output: output.into(),
            error: None,
            structured_result: None,
            usage: None,
        }),
    );
    let rendered = protocol::rfc5322::render(&reply, std::time::SystemTime::now());
    AsmtpReplies::envelope_for(&rendered).unwrap()
}

#[test]
fn an_answer_comes_back_marked_automatic_and_a_hop_count_is_read() {
    let posted = answer_to(&envelope(), "fixed");
    let answer = AsmtpEnvelope {
        id: "01HYYYYYYYYYYYYYYYYYYYYYYY".into(),
        from: "@alice.coder".into(),
        to: vec!["@alice.boss".into()],
        subject: None,
        in_reply_to: posted["in_reply_to"].as_str().map(str::to_string),
        references: vec![],
        content_parts: posted["content_parts"].as_array().unwrap().clone(),
        oversized: None,
    };
    let inbound = to_inbound(&answer, "@alice.boss").unwrap();
    assert_eq!(
        inbound.view.header("Auto-Submitted").as_deref(),
        Some("auto-replied")
    );
    let plain = to_inbound(&envelope(), "@alice.coder").unwrap();
    assert_eq!(plain.view.header("Auto-Submitted"), None);

    let mut relayed = envelope();
    relayed
        .content_parts
        .push(json!({"type": "data", "data": {"aampBridge": {"hopCount": 3}}}));
    match &to_inbound(&relayed, "@alice.coder").unwrap().message.body {
        Body::Dispatch(d) => assert_eq!(d.hop_count, Some(3)),
        other => panic!("{other:?}"),
    }
}

/// Issue 21: replies carried `references: [parent]` only, so a client following RFC 5322
/// kept the conversation at turn 2 and lost it at turn 3. A reply now carries the whole chain.
#[test]
fn a_reply_carries_the_whole_chain_ending_with_the_envelope_it_answers() {
    // Turn 3 of a thread that keeps its references.
    let mut turn3 = envelope();
    turn3.id = "01HTURN3ZZZZZZZZZZZZZZZZZZ".into();
    turn3.in_reply_to = Some("01HTURN2ZZZZZZZZZZZZZZZZZZ".into());
    turn3.references = vec![
        "01HROOTZZZZZZZZZZZZZZZZZZZ".into(),
        "01HTURN2ZZZZZZZZZZZZZZZZZZ".into(),
    ];
    let reply = answer_to(&turn3, "ok");
    assert_eq!(
        reply["references"],
        json!([
            "01HROOTZZZZZZZZZZZZZZZZZZZ",
            "01HTURN2ZZZZZZZZZZZZZZZZZZ",
            "01HTURN3ZZZZZZZZZZZZZZZZZZ"
        ])
    );
    assert_eq!(reply["in_reply_to"], "01HTURN3ZZZZZZZZZZZZZZZZZZ");
    // The reference CLI's --in-reply-to sends no references: the parent stands for the thread.
    let mut cli = envelope();
    cli.id = "01HCLIZZZZZZZZZZZZZZZZZZZZ".into();
    cli.in_reply_to = Some("01HROOTZZZZZZZZZZZZZZZZZZZ".into());
    let reply = answer_to(&cli, "ok");
    assert_eq!(
        reply["references"],
        json!(["01HROOTZZZZZZZZZZZZZZZZZZZ", "01HCLIZZZZZZZZZZZZZZZZZZZZ"])
    );
    match &to_inbound(&cli, "@alice.coder").unwrap().message.body {
        Body::Dispatch(d) => assert_eq!(
            d.session_key.as_deref(),
            Some("asmtp:01HROOTZZZZZZZZZZZZZZZZZZZ")
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_conversation_is_found_from_any_envelope_of_it_and_kept_in_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("asmtp-threads");
    let mut threads = Threads::open(path.clone());
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(threads.root("E1", &[]), "E1", "a new conversation");
    assert_eq!(threads.root("R1", &ids(&["E1"])), "E1", "the agent's reply");
    // `in_reply_to` alone, naming the reply.
    assert_eq!(threads.root("E2", &ids(&["R1"])), "E1");
    assert_eq!(threads.root("R2", &ids(&["R1", "E2"])), "E1");
    // An unknown chain: its oldest envelope (RFC 5322 references).
    assert_eq!(threads.root("X2", &ids(&["X0", "X1"])), "X0");
    // Kept across a restart; a damaged line is skipped.
    std::fs::write(
        &path,
        format!("{}garbage\n", std::fs::read_to_string(&path).unwrap()),
    )
    .unwrap();
    let mut again = Threads::open(path);
    assert_eq!(again.root("E3", &ids(&["R2"])), "E1");
}

#[test]
fn the_thread_map_forgets_its_older_half_when_full() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("asmtp-threads");
    let mut threads = Threads::open(path.clone());
    for n in 0..THREADS_KEPT + 10 {
        threads.root(&format!("E{n}"), &[]);
    }
    let lines = std::fs::read_to_string(&path).unwrap().lines().count();
    assert!(lines <= THREADS_KEPT / 2 + 10, "{lines} lines");
    let mut again = Threads::open(path);
    let last = format!("E{}", THREADS_KEPT + 9);
    assert_eq!(again.root("X", std::slice::from_ref(&last)), last);
}

/// Issue 43: a blocked recipient's 404 was explained in the log as "nothing at that path".
#[test]
fn a_refused_recipient_is_said_as_a_refusal_not_a_missing_path() {
    let e = crate::mailbox::MailboxError::Http {
        url: "http://op.test/messages".into(),
        status: 404,
        body: r#"{"error": {"code": "NOT_FOUND", "message": "not found"}}"#.into(),
    };
    let envelope = serde_json::json!({"to": ["@alice.boss"], "subject": "Re: x"});
    let said = super::client::refused_recipient(e, &envelope);
    let text = said.to_string();
    assert!(
        text.contains("@alice.boss") && text.contains("blocked") && text.contains("404"),
        "{text}"
    );
    assert!(!text.contains("nothing at that path"), "{text}");
    use crate::error::Classify as _;
    assert_eq!(said.class(), crate::error::ErrorClass::Permanent);
}
