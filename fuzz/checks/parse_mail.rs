//! Any bytes through the mail reader and the AAMP parser: never a panic, and whatever reads as
//! AAMP renders to a mail that reads back as the same intent and task.
//!
//! Shared by the fuzz target of the same name and by `tests/fuzz_replay.rs`, which replays the
//! saved inputs and seeded mutations of them as an ordinary test.

use aamp_bridge::protocol::{parse_raw, render, AampMessage};

pub fn check(data: &[u8]) {
    let Some(view) = parse_raw(data) else { return };
    let Ok(msg) = AampMessage::parse(&view) else {
        return;
    };
    let _ = msg.to_json();
    let rendered = render(&msg, std::time::UNIX_EPOCH);
    let again = parse_raw(&rendered.bytes).expect("our own rendering is a mail");
    let again = AampMessage::parse(&again).expect("our own rendering is AAMP");
    assert_eq!(again.intent(), msg.intent());
    assert_eq!(again.task_id(), msg.task_id());
}
