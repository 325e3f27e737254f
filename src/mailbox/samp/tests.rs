//! The SAMP model and limits, unit by unit.

use super::error::SampError;
use super::replies::{fit_body, reply_subject};
use super::wire::*;
use crate::error::{Classify, ErrorClass};
use crate::mailbox::MailboxError;
use crate::protocol::Body;
use serde_json::json;

fn message() -> SampMessage {
    SampMessage {
        id: "msg_1".into(),
        thread_id: Some("thr_1".into()),
        in_reply_to: None,
        from: "boss".into(),
        to: "coder".into(),
        subject: Some("Fix the build".into()),
        body: Some("It fails.".into()),
        data: None,
    }
}

#[test]
fn a_plain_message_is_a_task_in_its_thread() {
    let inbound = to_inbound(&message(), "h").unwrap();
    assert_eq!(inbound.message.task_id(), "samp:thr_1:msg_1");
    assert_eq!(parse_task_id("samp:thr_1:msg_1"), Some(("thr_1", "msg_1")));
    assert_eq!(inbound.message.envelope.from, "boss@h");
    assert_eq!(inbound.message.envelope.message_id, "<msg_1@samp>");
    match &inbound.message.body {
        Body::Dispatch(d) => {
            assert_eq!(d.title, "Fix the build");
            assert_eq!(d.body_text.trim(), "It fails.");
            assert_eq!(d.session_key.as_deref(), Some("samp:thr_1"));
        }
        other => panic!("{other:?}"),
    }
    assert!(inbound.sender_check.is_believed());
}

#[test]
fn aamp_fields_come_from_data_and_an_answer_never_starts_a_task() {
    let mut m = message();
    m.data = Some(
        json!({"aamp": {"intent": "task.dispatch", "taskId": "t-9", "sessionKey": "s-1", "hopCount": 3}}),
    );
    let inbound = to_inbound(&m, "h").unwrap();
    assert_eq!(inbound.message.task_id(), "t-9");
    match &inbound.message.body {
        Body::Dispatch(d) => {
            assert_eq!(d.session_key.as_deref(), Some("s-1"));
            assert_eq!(d.hop_count, Some(3));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(inbound.view.header("Auto-Submitted"), None);
    m.data = Some(json!({"aamp": {"intent": "task.result"}}));
    assert_eq!(
        to_inbound(&m, "h")
            .unwrap()
            .view
            .header("Auto-Submitted")
            .as_deref(),
        Some("auto-replied")
    );
    m.data = Some(json!({"aamp": {"taskId": "a\r\nBcc: x"}}));
    assert_eq!(
        to_inbound(&m, "h").unwrap().message.task_id(),
        "samp:thr_1:msg_1"
    );
}

#[test]
fn a_long_answer_is_cut_to_the_limit_with_a_note() {
    let long = "é".repeat(50_000);
    let cut = fit_body(&long);
    assert!(cut.len() <= BODY_MAX_BYTES, "{}", cut.len());
    assert!(
        cut.contains("100000 bytes"),
        "the note says how long it was"
    );
    assert_eq!(fit_body("short"), "short");
    assert_eq!(reply_subject(&"x".repeat(300)).chars().count(), 200);
    assert_eq!(reply_subject("RE: re: Hi"), "Re: Hi");
}

#[test]
fn refusals_are_classed() {
    let refused = |code: &str| SampError::Refused {
        tool: "send_message".into(),
        code: code.into(),
        message: String::new(),
        retry_after: None,
    };
    assert_eq!(refused("rate_limited").class(), ErrorClass::Transient);
    assert_eq!(refused("inbox_full").class(), ErrorClass::Transient);
    assert_eq!(refused("blocked").class(), ErrorClass::Permanent);
    assert_eq!(refused("unknown_recipient").class(), ErrorClass::Permanent);
    let http = SampError::Link(MailboxError::Http {
        url: "u".into(),
        status: 401,
        body: String::new(),
    });
    assert_eq!(http.class(), ErrorClass::Auth);
    assert_eq!(
        MailboxError::from(refused("inbox_full")).class(),
        ErrorClass::Transient
    );
}

/// Issue 43: a hop count given as a string was read as none, so a relayed task looked like
/// one that no agent passed on before. It is refused, saying why; a number is taken.
#[test]
fn a_hop_count_that_is_not_a_number_refuses_the_task() {
    let mut m = message();
    for bad in [json!("3"), json!(-1), json!(2.5), json!(u64::MAX)] {
        m.data = Some(json!({"aamp": {"hopCount": bad}}));
        let inbound = to_inbound(&m, "h").unwrap();
        let why = inbound.refused.unwrap_or_default();
        assert!(
            why.contains("hopCount") && why.contains(&bad.to_string()),
            "{bad}: {why}"
        );
    }
    m.data = Some(json!({"aamp": {"hopCount": 2}}));
    assert_eq!(to_inbound(&m, "h").unwrap().refused, None);
    m.data = None;
    assert_eq!(to_inbound(&m, "h").unwrap().refused, None);
    // An answer is never answered, whatever it carries.
    m.data = Some(json!({"aamp": {"intent": "task.result", "hopCount": "3"}}));
    assert_eq!(to_inbound(&m, "h").unwrap().refused, None);
}
