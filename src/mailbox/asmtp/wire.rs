//! ASMTP's envelopes as the operator sends them, its limits, the watermark's shape, and an
//! envelope as the bridge's model: a task (TaskId `asmtp:<id>`, the thread's root its
//! Session-Key); client-chosen envelope ids.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::mailbox::Inbound;

/// Envelope headers read per catch-up page.
pub(super) const PAGE: usize = 50;
/// The operator's cap on a request body (the reference cuts the connection past it).
pub const BODY_LIMIT: usize = 1 << 20;
/// The operator's cap on an uploaded file.
pub const FILE_LIMIT: usize = 10 * 1024 * 1024;
/// How much of an answer moved into a file stays in the envelope's text.
pub(super) const TEXT_KEPT: usize = 32 * 1024;
/// The greatest envelope id: a keyset position just before every envelope of a millisecond.
pub(super) const LAST_ID: &str = "01ZZZZZZZZZZZZZZZZZZZZZZZZ";

/// A row of `GET /mailbox` (the shape of an `envelope.notify` push frame).
#[derive(Clone, Debug, Deserialize)]
pub struct Header {
    pub id: String,
    pub created_at: i64,
    pub from: Option<String>,
    /// The envelope it answers (rows of the agent's own envelopes name it).
    pub in_reply_to: Option<String>,
    /// The envelope's size as the operator estimates it: its content parts' JSON length
    /// over four, rounded up, as the reference operator counts it (a token estimate, not
    /// bytes; older operators leave it out).
    pub size_hint: Option<u64>,
}

impl Header {
    /// About how many bytes the envelope's content is, from its `size_hint`.
    pub(super) fn bytes(&self) -> Option<u64> {
        self.size_hint.map(|hint| hint.saturating_mul(4))
    }
}

/// An envelope's body (`GET /messages`).
#[derive(Clone, Debug, Deserialize)]
pub struct AsmtpEnvelope {
    pub id: String,
    pub from: String,
    #[serde(default)]
    pub to: Vec<String>,
    pub subject: Option<String>,
    pub in_reply_to: Option<String>,
    #[serde(default)]
    pub references: Vec<String>,
    #[serde(default)]
    pub content_parts: Vec<Value>,
    /// Set by the bridge, never the operator: a content part was over the message cap, and
    /// this is how many bytes of it were seen (see `mailbox::body::OVERSIZED`, the same name).
    #[serde(default, rename = "aamp_bridge_oversized")]
    pub oversized: Option<u64>,
}

/// How far the mailbox has been read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    pub created_at: i64,
    pub envelope_id: String,
    /// Every envelope at exactly `created_at` already delivered: the operator's timestamps
    /// tie, and an envelope of the same millisecond may sort before `envelope_id`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids_at: Vec<String>,
    /// Unread envelopes found at the first start, still to be answered (ids, oldest first).
    /// Kept in the file until each is journaled, so a crash in between loses none of them
    /// although fetching them marked them read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backlog: Vec<String>,
}

/// A client-chosen envelope id, a ULID: the time (`date_ms`, the answer's own date, kept
/// within the years the reference's `01` prefix allows) in the first 10 characters, so ids
/// sort as the answers were made, then 80 bits derived from the bridge's Message-ID, so a
/// resend carries the same id.
pub fn envelope_id(message_id: &str, date_ms: i64) -> String {
    const CROCKFORD: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x2b8e_61c4_7a0d_4f3e_9c55_0e1f_d3a2_b7c9);
    // 2^40 ms (November 2004) to 2^41 - 1 (September 2039): the ULIDs that begin `01`.
    let time = date_ms.clamp(1 << 40, (1 << 41) - 1) as u64;
    let mut out = String::with_capacity(26);
    for shift in (0..10).rev() {
        out.push(CROCKFORD[((time >> (shift * 5)) & 31) as usize] as char);
    }
    let hash = uuid::Uuid::new_v5(&NAMESPACE, message_id.as_bytes()).as_u128();
    for shift in (0..16).rev() {
        out.push(CROCKFORD[((hash >> (shift * 5)) & 31) as usize] as char);
    }
    out
}

/// The envelopes `e` answers, oldest first: its `references`, or its `in_reply_to` alone
/// when a client sent no references (the reference CLI's `--in-reply-to`).
pub(super) fn thread_of(e: &AsmtpEnvelope) -> Vec<String> {
    if e.references.is_empty() {
        e.in_reply_to.iter().cloned().collect()
    } else {
        e.references.clone()
    }
}

/// The envelope an ASMTP message becomes as the bridge's inbound model: a task.
pub fn to_inbound(e: &AsmtpEnvelope, me: &str) -> Option<Inbound> {
    let root = thread_of(e)
        .first()
        .cloned()
        .unwrap_or_else(|| e.id.clone());
    to_inbound_in(e, me, &root)
}

/// The same, in the conversation named by its thread's `root`.
pub(super) fn to_inbound_in(e: &AsmtpEnvelope, me: &str, root: &str) -> Option<Inbound> {
    let mut text = Vec::new();
    let (mut hop_count, mut is_answer) = (None, false);
    for part in &e.content_parts {
        if let Some(mark) = part["data"].get(crate::mailbox::FOREIGN_MARK) {
            is_answer |= mark.get("answer").is_some();
            hop_count = hop_count.or(mark["hopCount"]
                .as_u64()
                .map(|n| n.min(u32::MAX as u64) as u32));
        }
        match part["type"].as_str() {
            Some("text") => text.push(part["text"].as_str().unwrap_or_default().to_string()),
            Some("data") => text.push(format!("```json\n{}\n```", part["data"])),
            Some(kind @ ("file" | "image")) => text.push(format!(
                "({kind}: {})",
                part["url"].as_str().unwrap_or("attached")
            )),
            _ => {}
        }
    }
    crate::mailbox::ForeignTask {
        id: &e.id,
        task_id: format!("asmtp:{}", e.id),
        message_id: format!("<{}@asmtp>", e.id),
        from: &e.from,
        to: me,
        title: e.subject.as_deref().unwrap_or_default(),
        body: text.join("\n\n"),
        session_key: format!("asmtp:{root}"),
        references: thread_of(e)
            .iter()
            .map(|id| format!("<{id}@asmtp>"))
            .collect(),
        believed_because: "the ASMTP operator stamps the sender from its token",
        hop_count,
        is_answer,
    }
    .into_inbound()
}
