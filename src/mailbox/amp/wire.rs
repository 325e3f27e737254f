//! AMP's messages as the broker sends them, and as the bridge's model: a message as a task
//! (TaskId `amp:<thread_id>:<message_id>`), the answer marker and hop count an agent bridge
//! writes in a body, reply subjects.

use serde::Deserialize;

use crate::mailbox::Inbound;
use crate::protocol::Intent;

/// A page number past any inbox's end (a count without rendering).
pub(super) const COUNT_PAGE: u64 = 1_000_000;
/// The most messages read per page.
pub(super) const PAGE: u64 = 100;

/// A message as the broker returns it (`MessageResponse`).
#[derive(Clone, Debug, Deserialize)]
pub struct AmpMessage {
    pub id: String,
    pub thread_id: String,
    pub from_agent: String,
    pub to_agent: String,
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub subject: String,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub is_read: bool,
    pub parent_id: Option<String>,
    #[serde(default)]
    pub created_at: String,
    /// Set by the bridge, never the broker: the body was over the message cap, and this is
    /// how many bytes of it were seen (see `mailbox::body::OVERSIZED`, the same name).
    #[serde(default, rename = "aamp_bridge_oversized")]
    pub oversized: Option<u64>,
}

/// A page of the inbox (`?page=`), newest first.
#[derive(Debug)]
pub struct InboxPage {
    pub messages: Vec<AmpMessage>,
    pub total: u64,
}

/// The TaskId of an AMP message: its thread and its id.
pub(super) fn task_id(m: &AmpMessage) -> String {
    format!("amp:{}:{}", m.thread_id, m.id)
}

/// The thread and message a TaskId made by [`task_id`] names.
pub(super) fn parse_task_id(task_id: &str) -> Option<(&str, &str)> {
    let rest = task_id.strip_prefix("amp:")?;
    let (thread, id) = rest.rsplit_once(':')?;
    (!thread.is_empty() && !id.is_empty()).then_some((thread, id))
}

/// An AMP message as the bridge's inbound model: a task for the agent. `None` for a message
/// that does not survive the trip through the mail model (never seen; the intake skips it).
pub fn to_inbound(m: &AmpMessage) -> Option<Inbound> {
    crate::mailbox::ForeignTask {
        id: &m.id,
        task_id: task_id(m),
        message_id: format!("<{}@amp>", m.id),
        from: &m.from_agent,
        to: &m.to_agent,
        title: &m.subject,
        body: m.body.clone(),
        session_key: format!("amp:{}", m.thread_id),
        believed_because: "the AMP broker checked the sender's key and tenant",
        references: Vec::new(),
        hop_count: hop_count(&m.body),
        is_answer: is_answer(&m.body),
    }
    .into_inbound()
}

/// [`to_inbound`], for a message whose body is over `limit` bytes without its body: it is
/// answered rejected, saying why, and its text is neither kept in the journal nor given to an
/// agent (issue 36 item 2: one message's cost is bounded past its read). A body over the cap
/// was never read whole (issue 43 item 2): only its size is known, at least what was seen.
pub(super) fn to_inbound_within(m: &AmpMessage, limit: u64) -> Option<Inbound> {
    let size = m.oversized.unwrap_or(m.body.len() as u64);
    if size <= limit {
        return to_inbound(m);
    }
    tracing::warn!(id = %m.id, size, limit, "an AMP message over max_message_bytes; answered rejected");
    let mut inbound = to_inbound(&AmpMessage {
        body: String::new(),
        ..m.clone()
    })?;
    inbound.refused = Some(match m.oversized {
        Some(seen) => format!(
            "the task is over the {} cap of one AMP message (max_message_bytes): at least {seen} bytes, never read whole; send a shorter task, or put the large content where the agent can fetch it and name it",
            crate::mailbox::error::cap_words(limit)
        ),
        None => format!(
            "the task is {size} bytes, more than this agent reads from one AMP message ({limit} bytes, max_message_bytes): send a shorter task, or put the large content where the agent can fetch it and name it"
        ),
    });
    Some(inbound)
}

/// `Re: <subject>` (one `Re:`, however many the subject had); `Re: (no subject)` for none.
pub(super) fn reply_subject(subject: &str) -> String {
    let mut rest = subject.trim();
    while let Some(stripped) = rest
        .get(..3)
        .filter(|p| p.eq_ignore_ascii_case("re:"))
        .map(|_| rest[3..].trim_start())
    {
        rest = stripped;
    }
    if rest.is_empty() {
        "Re: (no subject)".into()
    } else {
        format!("Re: {rest}")
    }
}

/// The end of every answer the bridge posts: an HTML comment (invisible where the broker
/// renders markdown) naming the answer's Message-ID.
pub(super) fn answer_marker(message_id: &str) -> String {
    format!("<!-- aamp-bridge {message_id} -->")
}

/// The body ends with an agent bridge's answer marker: the message is an answer.
pub(super) fn is_answer(body: &str) -> bool {
    body.trim_end().lines().last().is_some_and(|line| {
        let line = line.trim();
        line.starts_with("<!-- aamp-bridge <") && line.ends_with("> -->")
    })
}

/// The hop count an AMP message carries: a line `<!-- aamp-hop-count N -->` (an agent that
/// passes work on writes it, one more than its own `AAMP_BRIDGE_HOPS`).
pub(super) fn hop_count(body: &str) -> Option<u32> {
    body.lines().find_map(|line| {
        line.trim()
            .strip_prefix("<!-- aamp-hop-count ")?
            .strip_suffix("-->")?
            .trim()
            .parse()
            .ok()
    })
}

/// The Message-ID in the answer marker of a body that asks a question (`task.help_needed`).
pub(super) fn question_marked(body: &str) -> Option<String> {
    let line = body.trim_end().lines().last()?.trim();
    let id = line
        .strip_prefix("<!-- aamp-bridge ")?
        .strip_suffix(" -->")?;
    let question = format!("<{}.", Intent::TaskHelpNeeded.as_str());
    id.starts_with(&question).then(|| id.to_string())
}

/// A reply to the question posted as `question` (its Message-ID), as a plain reply.
pub(super) fn answer_to(m: &AmpMessage, question: String) -> crate::inbound::Reply {
    crate::inbound::Reply {
        email_id: m.id.clone(),
        from: m.from_agent.clone(),
        message_id: format!("<{}@amp>", m.id),
        in_reply_to: Some(question),
        references: Vec::new(),
        text: m.body.clone(),
        sender_check: crate::inbound::SenderCheck::Verified(
            "the AMP broker checked the sender's key and tenant".into(),
        ),
        auto_submitted: is_answer(&m.body),
    }
}
