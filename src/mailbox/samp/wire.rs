//! The SAMP wire model: a message as `check_inbox` gives it, the AAMP fields its `data`
//! may carry, the server's limits, and a message as a task for the agent.

use serde::Deserialize;
use serde_json::Value;

use crate::mailbox::{ForeignTask, Inbound, FOREIGN_MARK};
use crate::protocol::Intent;

/// Subject, body and data limits (the SAMP README).
pub(super) const SUBJECT_MAX_CHARS: usize = 200;
pub(super) const BODY_MAX_BYTES: usize = 32 * 1024;
pub(super) const DATA_MAX_BYTES: usize = 64 * 1024;
/// Why the sender of a SAMP message is believed.
pub(super) const BELIEVED: &str = "the SAMP server stamps the sender from its key";

/// A message as `check_inbox` returns it (guessed shape: tests/hosts/README.md).
#[derive(Clone, Debug, Deserialize)]
pub struct SampMessage {
    pub id: String,
    pub thread_id: Option<String>,
    pub in_reply_to: Option<String>,
    pub from: String,
    #[serde(default)]
    pub to: String,
    pub subject: Option<String>,
    pub body: Option<String>,
    pub data: Option<Value>,
}

/// The AAMP fields a message carries in `data.aamp`.
#[derive(Debug, Default, PartialEq, Eq)]
struct AampData {
    intent: Option<String>,
    task_id: Option<String>,
    session_key: Option<String>,
    hop_count: Option<u32>,
    /// `hopCount` was given but is not a whole number of hops (a string, a fraction, less
    /// than 0): what it was. Such a task is refused, never run as one that passed no agent
    /// before (the loop guard counts on it).
    bad_hop_count: Option<String>,
}

fn aamp_data(data: Option<&Value>) -> AampData {
    let a = data.map(|d| &d["aamp"]).unwrap_or(&Value::Null);
    let text = |k: &str| {
        a[k].as_str()
            .map(|s| s.trim().chars().take(200).collect::<String>())
            .filter(|s| !s.is_empty() && !s.chars().any(char::is_control))
    };
    AampData {
        intent: text("intent"),
        task_id: text("taskId"),
        session_key: text("sessionKey"),
        hop_count: a["hopCount"].as_u64().and_then(|n| u32::try_from(n).ok()),
        bad_hop_count: match &a["hopCount"] {
            Value::Null => None,
            n if n.as_u64().is_some_and(|n| u32::try_from(n).is_ok()) => None,
            other => Some(other.to_string().chars().take(40).collect()),
        },
    }
}

/// The TaskId of a message without one of its own: its thread and its id.
pub(super) fn task_id(m: &SampMessage) -> String {
    format!("samp:{}:{}", m.thread_id.as_deref().unwrap_or(""), m.id)
}

/// The message id a TaskId made by [`task_id`] names.
pub(super) fn parse_task_id(task_id: &str) -> Option<(&str, &str)> {
    let rest = task_id.strip_prefix("samp:")?;
    let (thread, id) = rest.rsplit_once(':')?;
    (!id.is_empty()).then_some((thread, id))
}

pub(super) fn message_id(id: &str) -> String {
    format!("<{id}@samp>")
}

/// A SAMP message as a task for the agent (or, with an answer's intent, a message that never
/// starts one).
/// Senders are agent names; the bridge's model (and the sender policy) takes addresses, so a
/// name is written `NAME@HOST` with the server's host (`domain`), and the host dropped again
/// when an answer goes back.
pub fn to_inbound(m: &SampMessage, domain: &str) -> Option<Inbound> {
    let (from, to) = (format!("{}@{domain}", m.from), format!("{}@{domain}", m.to));
    let aamp = aamp_data(m.data.as_ref());
    let is_answer = aamp
        .intent
        .as_deref()
        .is_some_and(|i| i != Intent::TaskDispatch.as_str())
        || m.data
            .as_ref()
            .is_some_and(|d| d[FOREIGN_MARK]["answer"].is_string());
    let bad_hop_count = aamp.bad_hop_count.clone();
    let mut inbound = ForeignTask {
        id: &m.id,
        task_id: aamp.task_id.unwrap_or_else(|| task_id(m)),
        message_id: message_id(&m.id),
        from: &from,
        to: &to,
        title: m.subject.as_deref().unwrap_or_default(),
        body: m.body.clone().unwrap_or_default(),
        session_key: aamp
            .session_key
            .unwrap_or_else(|| format!("samp:{}", m.thread_id.as_deref().unwrap_or(&m.id))),
        references: Vec::new(),
        believed_because: BELIEVED,
        hop_count: aamp.hop_count,
        is_answer,
    }
    .into_inbound()?;
    if let Some(given) = bad_hop_count.filter(|_| !is_answer) {
        inbound.refused = Some(format!(
            "data.aamp.hopCount must be a whole number of hops (0 or more), not {given}; send it as a JSON number"
        ));
    }
    Some(inbound)
}
