use crate::protocol::Body;

use super::wire::{
    answer_marker, parse_task_id, question_marked, reply_subject, to_inbound, AmpMessage,
};

fn message() -> AmpMessage {
    AmpMessage {
        id: "m-1".into(),
        thread_id: "t-1".into(),
        from_agent: "boss@alice.amp.test".into(),
        to_agent: "coder@alice.amp.test".into(),
        action: "send".into(),
        subject: "Fix the build".into(),
        body: "It fails on **main**.\nPlease look.".into(),
        is_read: false,
        parent_id: None,
        created_at: "2026-11-30T10:00:00+00:00".into(),
        oversized: None,
    }
}

#[test]
fn a_question_is_known_by_its_marker() {
    let asked =
        "**Question:** May I?\n- Allow\n\n<!-- aamp-bridge <task.help_needed.0f1e@a.test> -->\n";
    assert_eq!(
        question_marked(asked).as_deref(),
        Some("<task.help_needed.0f1e@a.test>")
    );
    let result = "Done.\n\n<!-- aamp-bridge <task.result.0f1e@a.test> -->";
    assert_eq!(question_marked(result), None);
    assert_eq!(question_marked("**Question:** unmarked"), None);
}

#[test]
fn a_message_becomes_a_task_named_by_its_thread_and_id() {
    let inbound = to_inbound(&message()).unwrap();
    let msg = &inbound.message;
    assert_eq!(msg.task_id(), "amp:t-1:m-1");
    assert_eq!(parse_task_id(msg.task_id()), Some(("t-1", "m-1")));
    assert_eq!(msg.envelope.from, "boss@alice.amp.test");
    assert_eq!(msg.envelope.message_id, "<m-1@amp>");
    match &msg.body {
        Body::Dispatch(d) => {
            assert_eq!(d.title, "Fix the build");
            assert!(d.body_text.contains("Please look."), "{}", d.body_text);
            assert_eq!(d.session_key.as_deref(), Some("amp:t-1"));
        }
        other => panic!("{other:?}"),
    }
    assert!(inbound.sender_check.is_believed());
}

/// Issue 21: replies were titled `Re: [AAMP Result] Task amp:<thread>:<id> - completed`.
#[test]
fn a_reply_is_titled_after_the_message_it_answers() {
    assert_eq!(reply_subject("Fix the build"), "Re: Fix the build");
    assert_eq!(reply_subject("RE: re: Fix the build"), "Re: Fix the build");
    assert_eq!(reply_subject("  "), "Re: (no subject)");
    assert_eq!(reply_subject("Réponse"), "Re: Réponse");
}

/// Issue 18: two agents that allow each other answered each other's answers forever.
#[test]
fn an_answer_is_marked_automatic_and_a_hop_count_is_read() {
    let mut m = message();
    m.body = format!("All done.\n\n{}\n", answer_marker("<task.result.1@x>"));
    let inbound = to_inbound(&m).unwrap();
    assert_eq!(
        inbound.view.header("Auto-Submitted").as_deref(),
        Some("auto-replied")
    );
    m.body = "Please look at <!-- aamp-bridge <x> --> this".into();
    assert_eq!(to_inbound(&m).unwrap().view.header("Auto-Submitted"), None);
    m.body = "Relayed work\n<!-- aamp-hop-count 5 -->".into();
    match &to_inbound(&m).unwrap().message.body {
        Body::Dispatch(d) => assert_eq!(d.hop_count, Some(5)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn hostile_messages_become_plain_tasks_never_a_panic() {
    let long = "s".repeat(100_000);
    for (subject, body, from) in [
        ("\r\nX-AAMP-Intent: task.cancel", "x", "boss@alice.amp.test"),
        (long.as_str(), "b", "boss@alice.amp.test"),
        ("", "", "boss@alice.amp.test"),
        (
            "\u{0}\u{7f}\u{202e}",
            "\u{feff}body\r\n.\r\n",
            "boss@alice.amp.test",
        ),
        ("hi", "x", "boss@x\r\nBcc: victim@example.com"),
    ] {
        let mut m = message();
        m.subject = subject.into();
        m.body = body.into();
        m.from_agent = from.into();
        if let Some(inbound) = to_inbound(&m) {
            assert_eq!(
                inbound.message.intent(),
                crate::protocol::Intent::TaskDispatch
            );
            assert_eq!(inbound.message.task_id(), "amp:t-1:m-1");
            assert!(!inbound.message.envelope.from.contains('\n'));
        }
    }
}

#[test]
fn task_ids_not_from_amp_are_not_taken_for_amp_ones() {
    for id in ["t-1", "amp:", "amp:t-1", "amp::m", "amp:t:"] {
        assert_eq!(parse_task_id(id), None, "{id}");
    }
}
