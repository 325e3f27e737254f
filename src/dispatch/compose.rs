//! The answers' Message-IDs ([`Outbox::compose`](super::Outbox) makes the mails): derived
//! from the task's message, so a mail made again after a crash is the same mail.

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
