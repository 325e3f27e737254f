//! The answers' mails: replies to the task's message with Message-IDs derived from it, so a mail
//! made again after a crash is the same mail.

use std::time::SystemTime;

use super::journal::Outgoing;
use super::results;
use crate::protocol::{AampMessage, Body, Envelope};

/// The Message-ID of the `n`th mail of `intent` answering the message `key`: the same every
/// time it is made, so a mail sent again after a crash is the same mail to its reader.
pub(super) fn derived_message_id(agent_email: &str, key: &str, intent: &str, n: u32) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x5d3c_8a1e_9f2b_4c6d_a7e0_1b2c_3d4e_5f60);
    let id = uuid::Uuid::new_v5(
        &NAMESPACE,
        format!("{agent_email}\n{key}\n{intent}\n{n}").as_bytes(),
    );
    let domain: String = agent_email
        .rsplit_once('@')
        .map_or("localhost", |(_, d)| d)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
        .collect();
    let domain = if domain.is_empty() {
        "localhost".to_string()
    } else {
        domain
    };
    format!("<{intent}.{}@{domain}>", id.simple())
}

/// A reply from `agent_email` to `env` carrying `body`, rendered now, with the Message-ID
/// derived from the task (`n` tells apart several mails of one intent) and `files` attached.
pub(super) fn reply(
    agent_email: &str,
    env: &Envelope,
    key: &str,
    body: Body,
    n: u32,
    files: &[results::Attached],
) -> Outgoing {
    let intent = body.intent().as_str();
    let mut msg = AampMessage::reply(env, agent_email, body);
    msg.envelope.message_id = derived_message_id(agent_email, key, intent, n);
    let files: Vec<crate::protocol::OutgoingFile> = files
        .iter()
        .map(|f| crate::protocol::OutgoingFile {
            filename: f.filename.clone(),
            content_type: f.content_type.clone(),
            bytes: f.bytes.clone(),
        })
        .collect();
    Outgoing {
        intent: intent.to_string(),
        mail: crate::protocol::render_with(&msg, SystemTime::now(), &files),
        claim: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_message_ids_are_stable_distinct_and_well_formed() {
        let a = derived_message_id("coder@x.test", "<m1@y>", "task.ack", 0);
        assert_eq!(
            a,
            derived_message_id("coder@x.test", "<m1@y>", "task.ack", 0)
        );
        assert_ne!(
            a,
            derived_message_id("coder@x.test", "<m1@y>", "task.result", 0)
        );
        assert_ne!(
            a,
            derived_message_id("coder@x.test", "<m2@y>", "task.ack", 0)
        );
        assert_ne!(
            a,
            derived_message_id("coder@x.test", "<m1@y>", "task.ack", 1)
        );
        assert!(
            a.starts_with("<task.ack.") && a.ends_with("@x.test>"),
            "{a}"
        );
        let odd = derived_message_id("weird@ex ample>.test", "k", "task.ack", 0);
        assert!(odd.ends_with("@example.test>"), "{odd}");
    }
}
