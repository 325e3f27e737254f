//! The typed AAMP message: what each intent carries, how it is read from a mail's headers and
//! text body, and how it is written back into them. Pure code, no I/O.
//!
//! Every intent is read and written here side by side, so a field
//! cannot be added to one direction and forgotten in the other.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{json, Value};

use super::chain::Chain;
use super::codec;
pub use super::text::normalize_message_id;
use super::text::{
    first_line_after, marker_line, message_ids, section, strip_list_marker, strip_prefix_ci,
};
use super::usage::Usage;
use super::usage_wire;

/// The protocol version this crate writes, and the one assumed when a message omits it.
pub const VERSION: &str = "1.1";

/// The longest TaskId accepted. TaskIds are UUIDs in practice; a longer one could not be
/// written back on one header line unchanged, so a reply could not name it.
pub const MAX_TASK_ID: usize = 512;

/// The ten AAMP intents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Intent {
    TaskDispatch,
    TaskCancel,
    TaskAck,
    TaskHelpNeeded,
    TaskResult,
    TaskStreamOpened,
    PairRequest,
    PairRespond,
    CardQuery,
    CardResponse,
}

impl Intent {
    pub const ALL: [Intent; 10] = [
        Intent::TaskDispatch,
        Intent::TaskCancel,
        Intent::TaskAck,
        Intent::TaskHelpNeeded,
        Intent::TaskResult,
        Intent::TaskStreamOpened,
        Intent::PairRequest,
        Intent::PairRespond,
        Intent::CardQuery,
        Intent::CardResponse,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Intent::TaskDispatch => "task.dispatch",
            Intent::TaskCancel => "task.cancel",
            Intent::TaskAck => "task.ack",
            Intent::TaskHelpNeeded => "task.help_needed",
            Intent::TaskResult => "task.result",
            Intent::TaskStreamOpened => "task.stream.opened",
            Intent::PairRequest => "pair.request",
            Intent::PairRespond => "pair.respond",
            Intent::CardQuery => "card.query",
            Intent::CardResponse => "card.response",
        }
    }

    pub fn parse(text: &str) -> Option<Intent> {
        Intent::ALL.into_iter().find(|i| i.as_str() == text)
    }

    /// An executor's answer to a message (as opposed to a request someone starts).
    pub fn is_reply(self) -> bool {
        matches!(
            self,
            Intent::TaskAck
                | Intent::TaskHelpNeeded
                | Intent::TaskResult
                | Intent::TaskStreamOpened
                | Intent::PairRespond
                | Intent::CardResponse
        )
    }
}

impl fmt::Display for Intent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Priority {
    Urgent,
    High,
    #[default]
    Normal,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Urgent => "urgent",
            Priority::High => "high",
            Priority::Normal => "normal",
        }
    }

    /// Anything but `urgent` or `high` reads as `normal`, as in every SDK.
    pub fn parse(text: &str) -> Priority {
        match text.trim().to_ascii_lowercase().as_str() {
            "urgent" => Priority::Urgent,
            "high" => Priority::High,
            _ => Priority::Normal,
        }
    }
}

/// The terminal status of a task or a pairing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Completed,
    Rejected,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Completed => "completed",
            Status::Rejected => "rejected",
        }
    }
}

/// Header names, in the spelling AAMP writes them. Reading is case-insensitive.
pub mod header {
    pub const VERSION: &str = "X-AAMP-Version";
    pub const INTENT: &str = "X-AAMP-Intent";
    pub const TASK_ID: &str = "X-AAMP-TaskId";
    pub const PRIORITY: &str = "X-AAMP-Priority";
    pub const EXPIRES_AT: &str = "X-AAMP-Expires-At";
    pub const SESSION_KEY: &str = "X-AAMP-Session-Key";
    pub const DISPATCH_CONTEXT: &str = "X-AAMP-Dispatch-Context";
    pub const PARENT_TASK_ID: &str = "X-AAMP-ParentTaskId";
    /// aamp-bridge's extension: how many agents a task has been passed through.
    pub const HOP_COUNT: &str = "X-AAMP-Hop-Count";
    /// aamp-bridge's delegation extension (`protocol::chain`, `docs/delegation.md`): the
    /// chain's id, the agents it passed through, its deadline, its tokens left, its trace.
    pub use super::super::chain::header::*;
    pub const STATUS: &str = "X-AAMP-Status";
    pub const ERROR_MSG: &str = "X-AAMP-ErrorMsg";
    pub const STRUCTURED_RESULT: &str = "X-AAMP-StructuredResult";
    pub const SUGGESTED_OPTIONS: &str = "X-AAMP-SuggestedOptions";
    pub const STREAM_ID: &str = "X-AAMP-Stream-Id";
    pub const PAIR_CODE: &str = "X-AAMP-Pair-Code";
    pub const DISPATCH_CONTEXT_RULES: &str = "X-AAMP-Dispatch-Context-Rules";
    pub const CARD_SUMMARY: &str = "X-AAMP-Card-Summary";
    /// aamp-bridge's extension: what the task's model calls cost (`protocol::usage_wire`).
    pub const USAGE: &str = "X-AAMP-Usage";
    /// Legacy headers: still read (and preferred) when present, never written.
    pub const LEGACY_OUTPUT: &str = "X-AAMP-Output";
    pub const LEGACY_QUESTION: &str = "X-AAMP-Question";
    pub const LEGACY_BLOCKED_REASON: &str = "X-AAMP-BlockedReason";
}

/// A mail as the parser sees it: addresses, ids, subject, text body and raw header fields.
/// Both the JMAP reader and the RFC 5322 reader produce one; so does the conformance corpus.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MailView {
    pub from: String,
    pub to: Vec<String>,
    /// With angle brackets: `<id@host>`.
    pub message_id: String,
    pub subject: String,
    pub body_text: String,
    /// Raw header fields in message order; values may be folded or encoded-words.
    pub headers: Vec<(String, String)>,
}

impl MailView {
    /// The last field of that name (case-insensitive), unfolded, with encoded-words decoded
    /// and control characters turned to spaces, trimmed; `None` when absent. A value read here
    /// is one we can write back unchanged.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .rev()
            .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| {
                codec::clean_header_text(&codec::decode_words(&codec::unfold(v)))
                    .trim()
                    .to_string()
            })
    }

    /// Like [`MailView::header`], but an empty value counts as absent.
    fn non_empty(&self, name: &str) -> Option<String> {
        self.header(name).filter(|v| !v.is_empty())
    }
}

/// Everything every AAMP message has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub version: String,
    pub task_id: String,
    pub from: String,
    pub to: Vec<String>,
    /// With angle brackets. Empty on a message not yet sent (the renderer assigns one).
    pub message_id: String,
    pub subject: String,
    pub in_reply_to: Option<String>,
    pub references: Vec<String>,
    /// The text body exactly as received; `None` on a message built here (its body is
    /// rendered from [`Body`] by [`AampMessage::body_text`]).
    pub received_body: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dispatch {
    pub title: String,
    pub priority: Priority,
    pub expires_at: Option<String>,
    pub session_key: Option<String>,
    pub dispatch_context: BTreeMap<String, String>,
    pub parent_task_id: Option<String>,
    /// How many agents passed this task on before (a dispatch an agent sends while it works
    /// on a task carries that task's count plus one); `None` from people and workflows.
    pub hop_count: Option<u32>,
    /// The delegation chain it belongs to (empty when it is none's).
    pub chain: Chain,
    pub body_text: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskResult {
    pub status: Status,
    pub output: String,
    pub error: Option<String>,
    pub structured_result: Option<Value>,
    /// What the agent's model calls cost, as its own reports said; `None` when it reported
    /// nothing (never zeros).
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HelpNeeded {
    pub question: String,
    pub blocked_reason: String,
    pub suggested_options: Vec<String>,
}

/// What an intent carries beyond the envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Dispatch(Dispatch),
    Cancel {
        reason: String,
    },
    Ack,
    HelpNeeded(HelpNeeded),
    Result(TaskResult),
    StreamOpened {
        stream_id: String,
    },
    PairRequest {
        pair_code: String,
        rules: Option<Value>,
    },
    PairRespond {
        status: Status,
        reason: Option<String>,
    },
    CardQuery {
        text: String,
    },
    CardResponse {
        summary: String,
        text: String,
    },
}

impl Body {
    pub fn intent(&self) -> Intent {
        match self {
            Body::Dispatch(_) => Intent::TaskDispatch,
            Body::Cancel { .. } => Intent::TaskCancel,
            Body::Ack => Intent::TaskAck,
            Body::HelpNeeded(_) => Intent::TaskHelpNeeded,
            Body::Result(_) => Intent::TaskResult,
            Body::StreamOpened { .. } => Intent::TaskStreamOpened,
            Body::PairRequest { .. } => Intent::PairRequest,
            Body::PairRespond { .. } => Intent::PairRespond,
            Body::CardQuery { .. } => Intent::CardQuery,
            Body::CardResponse { .. } => Intent::CardResponse,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AampMessage {
    pub envelope: Envelope,
    pub body: Body,
}

/// Why a mail is not an AAMP message. Never an error: ordinary mail is simply not ours.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotAamp {
    #[error("no X-AAMP-Intent header")]
    NoIntent,
    #[error("unknown intent {0:?}")]
    UnknownIntent(String),
    #[error("no X-AAMP-TaskId header")]
    NoTaskId,
    #[error("an X-AAMP-TaskId of {0} characters (at most {MAX_TASK_ID} are accepted)")]
    TaskIdTooLong(usize),
    #[error("{intent} without its required {header} header")]
    MissingHeader {
        intent: Intent,
        header: &'static str,
    },
}

impl AampMessage {
    pub fn intent(&self) -> Intent {
        self.body.intent()
    }

    pub fn task_id(&self) -> &str {
        &self.envelope.task_id
    }

    /// Reads a mail as AAMP. Header names are matched case-insensitively and the last field of
    /// a name wins; encoded-words are decoded; legacy headers are understood.
    pub fn parse(mail: &MailView) -> Result<AampMessage, NotAamp> {
        let intent_text = mail.non_empty(header::INTENT).ok_or(NotAamp::NoIntent)?;
        let intent = Intent::parse(intent_text.trim())
            .ok_or_else(|| NotAamp::UnknownIntent(intent_text.clone()))?;
        let task_id = mail.non_empty(header::TASK_ID).ok_or(NotAamp::NoTaskId)?;
        if task_id.len() > MAX_TASK_ID {
            return Err(NotAamp::TaskIdTooLong(task_id.len()));
        }
        let required = |name: &'static str| {
            mail.non_empty(name).ok_or(NotAamp::MissingHeader {
                intent,
                header: name,
            })
        };
        let body = match intent {
            Intent::TaskDispatch => Body::Dispatch(Dispatch {
                title: dispatch_title(&mail.subject),
                priority: mail
                    .header(header::PRIORITY)
                    .map(|p| Priority::parse(&p))
                    .unwrap_or_default(),
                expires_at: mail.non_empty(header::EXPIRES_AT),
                session_key: mail.non_empty(header::SESSION_KEY),
                dispatch_context: mail
                    .header(header::DISPATCH_CONTEXT)
                    .map(|c| codec::parse_dispatch_context(&c))
                    .unwrap_or_default(),
                parent_task_id: mail.non_empty(header::PARENT_TASK_ID),
                hop_count: mail
                    .header(header::HOP_COUNT)
                    .and_then(|h| h.trim().parse().ok()),
                chain: Chain::read(|name| mail.header(name)),
                body_text: mail.body_text.clone(),
            }),
            Intent::TaskCancel => Body::Cancel {
                reason: mail.body_text.trim().to_string(),
            },
            Intent::TaskAck => Body::Ack,
            Intent::TaskHelpNeeded => Body::HelpNeeded(read_help_needed(mail)),
            Intent::TaskResult => Body::Result(read_result(mail)),
            Intent::TaskStreamOpened => Body::StreamOpened {
                stream_id: required(header::STREAM_ID)?,
            },
            Intent::PairRequest => Body::PairRequest {
                pair_code: required(header::PAIR_CODE)?,
                rules: mail
                    .non_empty(header::DISPATCH_CONTEXT_RULES)
                    .and_then(|r| codec::decode_json(&r)),
            },
            Intent::PairRespond => Body::PairRespond {
                status: match mail.header(header::STATUS) {
                    Some(s) if s.trim().eq_ignore_ascii_case("completed") => Status::Completed,
                    _ => Status::Rejected,
                },
                reason: mail.non_empty(header::ERROR_MSG),
            },
            Intent::CardQuery => Body::CardQuery {
                text: mail.body_text.clone(),
            },
            Intent::CardResponse => Body::CardResponse {
                summary: mail.non_empty(header::CARD_SUMMARY).unwrap_or_else(|| {
                    strip_prefix_ci(mail.subject.trim(), "[AAMP Card]")
                        .trim()
                        .to_string()
                }),
                text: mail.body_text.clone(),
            },
        };
        Ok(AampMessage {
            envelope: read_envelope(mail, task_id),
            body,
        })
    }

    /// The subject AAMP's SDKs write for this message.
    pub fn subject(&self) -> String {
        let id = &self.envelope.task_id;
        match &self.body {
            Body::Dispatch(d) => format!("[AAMP Task] {}", d.title),
            Body::Cancel { .. } => format!("[AAMP Cancel] Task {id}"),
            Body::Ack => format!("[AAMP ACK] Task {id}"),
            Body::HelpNeeded(_) => format!("[AAMP Help] Task {id} needs assistance"),
            Body::Result(r) => format!("[AAMP Result] Task {id} - {}", r.status.as_str()),
            Body::StreamOpened { .. } => format!("[AAMP Stream] Task {id}"),
            Body::PairRequest { .. } => "[AAMP Pair] Connection request".to_string(),
            Body::PairRespond { status, .. } => format!("[AAMP Pair] {}", status.as_str()),
            Body::CardQuery { .. } => format!("[AAMP Card Query] {id}"),
            Body::CardResponse { summary, .. } => format!("[AAMP Card] {summary}"),
        }
    }

    /// The `X-AAMP-*` fields to write, in order, with values not yet encoded. Optional
    /// values that are empty are left out.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            (header::VERSION, VERSION.to_string()),
            (header::INTENT, self.intent().as_str().to_string()),
            (header::TASK_ID, self.envelope.task_id.clone()),
        ];
        fn opt(out: &mut Vec<(&'static str, String)>, name: &'static str, value: Option<&str>) {
            if let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) {
                out.push((name, v.to_string()));
            }
        }
        match &self.body {
            Body::Dispatch(d) => {
                out.push((header::PRIORITY, d.priority.as_str().to_string()));
                opt(&mut out, header::EXPIRES_AT, d.expires_at.as_deref());
                opt(&mut out, header::SESSION_KEY, d.session_key.as_deref());
                let context = codec::encode_dispatch_context(&d.dispatch_context);
                opt(&mut out, header::DISPATCH_CONTEXT, context.as_deref());
                opt(
                    &mut out,
                    header::PARENT_TASK_ID,
                    d.parent_task_id.as_deref(),
                );
                if let Some(hops) = d.hop_count {
                    out.push((header::HOP_COUNT, hops.to_string()));
                }
                out.extend(d.chain.headers());
            }
            Body::Result(r) => {
                out.push((header::STATUS, r.status.as_str().to_string()));
                if r.status == Status::Rejected {
                    // A short reason (the body has it whole): one line, at most 900
                    // characters, so it is never folded.
                    let msg = r.error.as_deref().unwrap_or("rejected");
                    let mut short: String = msg.split_whitespace().collect::<Vec<_>>().join(" ");
                    if short.chars().count() > 900 {
                        short = short.chars().take(899).collect::<String>() + "…";
                    }
                    out.push((header::ERROR_MSG, short));
                }
                let structured = r.structured_result.as_ref().map(codec::encode_json);
                opt(&mut out, header::STRUCTURED_RESULT, structured.as_deref());
                let usage = r.usage.as_ref().map(usage_wire::header_value);
                opt(&mut out, header::USAGE, usage.as_deref());
            }
            Body::HelpNeeded(h) => {
                // The SDKs always write this header, empty when there are no options.
                let options = codec::encode_options(&h.suggested_options);
                out.push((header::SUGGESTED_OPTIONS, options));
            }
            Body::StreamOpened { stream_id } => {
                out.push((header::STREAM_ID, stream_id.clone()));
            }
            Body::PairRequest { pair_code, rules } => {
                out.push((header::PAIR_CODE, pair_code.clone()));
                let rules = rules.clone().unwrap_or_else(|| json!({}));
                out.push((header::DISPATCH_CONTEXT_RULES, codec::encode_json(&rules)));
            }
            Body::PairRespond { status, reason } => {
                out.push((header::STATUS, status.as_str().to_string()));
                opt(&mut out, header::ERROR_MSG, reason.as_deref());
            }
            Body::CardResponse { summary, .. } => {
                opt(&mut out, header::CARD_SUMMARY, Some(summary));
            }
            Body::Cancel { .. } | Body::Ack | Body::CardQuery { .. } => {}
        }
        out
    }

    /// The text body, in the SDKs' templates (`Output:`, `Error:`, `Question:`, ...).
    pub fn body_text(&self) -> String {
        let id = &self.envelope.task_id;
        match &self.body {
            Body::Dispatch(d) => d.body_text.clone(),
            Body::Cancel { reason } => reason.clone(),
            Body::Ack => String::new(),
            Body::HelpNeeded(h) => {
                let mut text = format!(
                    "AAMP Task Help Needed\n\nTask ID: {id}\n\nQuestion: {}\nBlocked reason: {}\n",
                    h.question.trim(),
                    h.blocked_reason.trim()
                );
                if !h.suggested_options.is_empty() {
                    text.push_str("Suggested options:\n");
                    for (i, option) in h.suggested_options.iter().enumerate() {
                        text.push_str(&format!("  {}. {}\n", i + 1, option.trim()));
                    }
                }
                text
            }
            Body::Result(r) => {
                // Error comes before Output: the readers take Output up to the end of the
                // body (or a later "Error:" line), and Error from its first line.
                let mut text = format!(
                    "AAMP Task Result\n\nTask ID: {id}\nStatus: {}\n\n",
                    r.status.as_str()
                );
                if r.status == Status::Rejected {
                    let error = r.error.as_deref().unwrap_or("rejected");
                    text.push_str(&format!("Error: {}\n\n", codec::clean_header_text(error)));
                }
                // Before the output, which readers take up to the end of the body.
                if let Some(usage) = &r.usage {
                    text.push_str(&format!("Usage: {}\n\n", usage_wire::line(usage)));
                }
                if r.status == Status::Completed || !r.output.is_empty() {
                    text.push_str(&format!("Output:\n{}\n", r.output));
                }
                text
            }
            Body::StreamOpened { stream_id } => {
                format!("AAMP task stream is ready.\n\nTask ID: {id}\nStream ID: {stream_id}\n")
            }
            // The pair code is not repeated in the body: it is a secret.
            Body::PairRequest { .. } => "AAMP Pair Request\n".to_string(),
            Body::PairRespond { status, reason } => {
                let mut text = format!("AAMP Pair Response\n\nStatus: {}\n", status.as_str());
                if let Some(reason) = reason {
                    text.push_str(&format!("Reason: {reason}\n"));
                }
                text
            }
            Body::CardQuery { text } => text.clone(),
            Body::CardResponse { text, .. } => text.clone(),
        }
    }

    /// A new task from `from` to `to`: `dispatch` with a fresh envelope (no Message-ID yet:
    /// the sender gives it one) and its subject.
    pub fn dispatch(task_id: String, from: &str, to: &str, dispatch: Dispatch) -> AampMessage {
        let mut msg = AampMessage {
            envelope: Envelope {
                version: VERSION.to_string(),
                task_id,
                from: from.to_string(),
                to: vec![to.to_string()],
                message_id: String::new(),
                subject: String::new(),
                in_reply_to: None,
                references: vec![],
                received_body: None,
            },
            body: Body::Dispatch(dispatch),
        };
        msg.envelope.subject = msg.subject();
        msg
    }

    /// A reply on the same task: to the sender of `to_this`, threaded under it.
    pub fn reply(to_this: &Envelope, from: &str, body: Body) -> AampMessage {
        let mut references: Vec<String> = to_this.references.clone();
        // Keep the chain short: the thread's root (it names the conversation) and the newest
        // ones (RFC 5322 §3.6.4); the dispatch's own id always goes last.
        if references.len() > 9 {
            references.drain(1..references.len() - 8);
        }
        if !to_this.message_id.is_empty() {
            references.push(to_this.message_id.clone());
        }
        let mut msg = AampMessage {
            envelope: Envelope {
                version: VERSION.to_string(),
                task_id: to_this.task_id.clone(),
                from: from.to_string(),
                to: vec![to_this.from.clone()],
                message_id: String::new(),
                subject: String::new(),
                in_reply_to: (!to_this.message_id.is_empty()).then(|| to_this.message_id.clone()),
                references,
                received_body: None,
            },
            body,
        };
        msg.envelope.subject = msg.subject();
        msg
    }
}

/// The envelope every intent has: who, to whom, which task, and the thread.
fn read_envelope(mail: &MailView, task_id: String) -> Envelope {
    Envelope {
        version: mail
            .non_empty(header::VERSION)
            .unwrap_or_else(|| VERSION.to_string()),
        task_id,
        from: address(&mail.from),
        to: mail.to.iter().map(|a| address(a)).collect(),
        message_id: normalize_message_id(&mail.message_id),
        subject: mail.subject.clone(),
        in_reply_to: mail
            .non_empty("In-Reply-To")
            .and_then(|v| message_ids(&v).pop()),
        references: mail
            .header("References")
            .map(|v| message_ids(&v))
            .unwrap_or_default(),
        received_body: Some(mail.body_text.clone()),
    }
}

/// A `task.help_needed`: from its headers, or the labelled sections of its body.
fn read_help_needed(mail: &MailView) -> HelpNeeded {
    let body = &mail.body_text;
    let question = mail
        .non_empty(header::LEGACY_QUESTION)
        .or_else(|| {
            section(
                body,
                "Question:",
                &["Blocked reason:", "Suggested options:"],
            )
        })
        .unwrap_or_else(|| body.trim().to_string());
    let blocked_reason = mail
        .non_empty(header::LEGACY_BLOCKED_REASON)
        .or_else(|| section(body, "Blocked reason:", &["Suggested options:"]))
        .unwrap_or_default();
    let suggested_options = match mail.non_empty(header::SUGGESTED_OPTIONS) {
        Some(h) => codec::parse_options(&h),
        None => section(body, "Suggested options:", &[])
            .map(|s| s.lines().filter_map(strip_list_marker).collect())
            .unwrap_or_default(),
    };
    HelpNeeded {
        question,
        blocked_reason,
        suggested_options,
    }
}

/// A `task.result`: its status, output and error from headers or the body's sections.
fn read_result(mail: &MailView) -> TaskResult {
    let status = match mail.header(header::STATUS) {
        Some(s) if s.trim().eq_ignore_ascii_case("rejected") => Status::Rejected,
        _ => Status::Completed,
    };
    let body = &mail.body_text;
    let error = mail
        .non_empty(header::ERROR_MSG)
        .or_else(|| first_line_after(body, "Error:"));
    let output = mail
        .non_empty(header::LEGACY_OUTPUT)
        .or_else(|| section(body, "Output:", &["Error:"]))
        .unwrap_or_else(|| {
            if marker_line(body, "Error:").is_some() {
                String::new()
            } else {
                body.trim().to_string()
            }
        });
    TaskResult {
        status,
        output,
        error,
        structured_result: mail
            .non_empty(header::STRUCTURED_RESULT)
            .and_then(|s| codec::decode_json(&s)),
        usage: mail
            .non_empty(header::USAGE)
            .and_then(|u| usage_wire::parse_header(&u)),
    }
}

/// The dispatch title: the subject without its `[AAMP Task]` tag.
pub fn dispatch_title(subject: &str) -> String {
    let title = strip_prefix_ci(subject.trim(), "[AAMP Task]").trim();
    if title.is_empty() {
        "Untitled Task".to_string()
    } else {
        title.to_string()
    }
}

/// The bare address from `Name <a@b>`, `<a@b>` or `a@b`.
pub fn address(text: &str) -> String {
    let text = text.trim();
    match (text.rfind('<'), text.rfind('>')) {
        (Some(open), Some(close)) if open < close => text[open + 1..close].trim().to_string(),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long thread keeps its root (which names the conversation) and its newest ids.
    #[test]
    fn a_reply_keeps_the_threads_root_and_the_newest_references() {
        let refs: Vec<String> = (0..12).map(|i| format!("<r{i}@x>")).collect();
        let env = Envelope {
            version: VERSION.into(),
            task_id: "t".into(),
            from: "a@x".into(),
            to: vec!["b@x".into()],
            message_id: "<m@x>".into(),
            subject: String::new(),
            in_reply_to: None,
            references: refs.clone(),
            received_body: None,
        };
        let reply = AampMessage::reply(&env, "b@x", Body::Ack);
        let got = &reply.envelope.references;
        assert_eq!(got.len(), 10);
        assert_eq!(got[0], "<r0@x>");
        assert_eq!(&got[1..9], &refs[4..12]);
        assert_eq!(got[9], "<m@x>");
    }
}
