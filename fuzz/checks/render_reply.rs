//! The renderer fed with hostile inbound values: any bytes read as a mail, and any fields
//! (split at NUL bytes) put straight into a message, answered with every reply the bridge
//! sends. Never a panic, never a loop without end, no line over RFC 5322's 998 characters,
//! and the reply reads back as the same intent and task.
//!
//! Shared by the fuzz target of the same name and by `tests/fuzz_replay.rs`, which replays the
//! saved inputs and seeded mutations of them as an ordinary test.

use aamp_bridge::protocol::{
    parse_raw, render, AampMessage, Body, Envelope, HelpNeeded, Status, TaskResult,
};

fn replies(env: &Envelope, text: &str) -> Vec<AampMessage> {
    let result = |status, error: Option<String>| {
        Body::Result(TaskResult {
            status,
            output: text.to_string(),
            error,
            structured_result: None,
            usage: None,
        })
    };
    [
        Body::Ack,
        result(Status::Completed, None),
        result(Status::Rejected, Some(text.to_string())),
        Body::HelpNeeded(HelpNeeded {
            question: text.to_string(),
            blocked_reason: text.to_string(),
            suggested_options: text.split('|').map(str::to_string).collect(),
        }),
    ]
    .into_iter()
    .map(|body| AampMessage::reply(env, "agent@example.test", body))
    .collect()
}

fn check_reply(reply: &AampMessage) {
    let mail = render(reply, std::time::UNIX_EPOCH);
    let text = String::from_utf8_lossy(&mail.bytes);
    for line in text.split("\r\n") {
        assert!(line.len() <= 998, "a line of {} characters", line.len());
    }
    let view = parse_raw(&mail.bytes).expect("our own rendering is a mail");
    let again = AampMessage::parse(&view).expect("our own rendering is AAMP");
    assert_eq!(again.intent(), reply.intent());
    assert_eq!(again.task_id(), reply.task_id().trim());
}

pub fn check(data: &[u8]) {
    // As a mail from outside.
    if let Some(view) = parse_raw(data) {
        if let Ok(msg) = AampMessage::parse(&view) {
            for reply in replies(&msg.envelope, &view.body_text) {
                check_reply(&reply);
            }
        }
    }
    // As raw field values, whatever a parser might let through.
    let fields: Vec<String> = data
        .split(|b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    let field = |i: usize| fields.get(i).cloned().unwrap_or_default();
    let task_id = field(0);
    // What the parser admits as a TaskId (longer ones are refused when a mail is read).
    if task_id.trim().is_empty()
        || task_id.chars().any(char::is_control)
        || task_id.trim().len() > aamp_bridge::protocol::message::MAX_TASK_ID
    {
        return;
    }
    let env = Envelope {
        version: "1.1".into(),
        task_id,
        from: "sender@example.test".into(),
        to: vec!["agent@example.test".into()],
        message_id: field(1),
        subject: field(2),
        in_reply_to: Some(field(3)),
        references: field(4).split(',').map(str::to_string).collect(),
        received_body: None,
    };
    for reply in replies(&env, &field(5)) {
        check_reply(&reply);
    }
}
