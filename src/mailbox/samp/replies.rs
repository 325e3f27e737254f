//! SAMP answers out: each is a `send_message` reply to its task message, cut to the server's
//! limits, and never sent twice (the thread is looked at before a retry, and the answers the
//! server confirmed are kept on disk).

use serde_json::{json, Value};

use super::client::SampClient;
use super::error::SampError;
use super::wire::{parse_task_id, BODY_MAX_BYTES, DATA_MAX_BYTES, SUBJECT_MAX_CHARS};
use crate::mailbox::answer::{self, Markup};
use crate::mailbox::outlet::answers_only;
use crate::mailbox::FOREIGN_MARK;
use crate::protocol::{self, AampMessage, Body, RenderedMail};

/// How far the server's clock may be behind the bridge's when an answer's send time is
/// compared with the time it was made.
const CLOCK_SKEW_SECS: i64 = 5;

/// `Re: <subject>`, at most 200 characters.
pub(super) fn reply_subject(subject: &str) -> String {
    let mut rest = subject.trim();
    while rest.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("re:")) {
        rest = rest[3..].trim_start();
    }
    let subject = if rest.is_empty() {
        "Re: (no subject)".to_string()
    } else {
        format!("Re: {rest}")
    };
    subject.chars().take(SUBJECT_MAX_CHARS).collect()
}

/// `text` cut to the body limit, with a note saying so.
pub(super) fn fit_body(text: &str) -> String {
    if text.len() <= BODY_MAX_BYTES {
        return text.to_string();
    }
    let note = format!(
        "\n\n[cut: the answer is {} bytes; a SAMP message takes {} KB. The whole answer is in the bridge's journal (`aamp-bridge tasks`).]",
        text.len(),
        BODY_MAX_BYTES / 1024
    );
    let mut end = BODY_MAX_BYTES - note.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{note}", &text[..end])
}

/// Where a SAMP agent's answers go: `send_message` replies to the task message.
#[derive(Clone)]
pub struct SampReplies {
    client: SampClient,
}

answers_only!(SampReplies);

impl SampReplies {
    pub fn new(client: SampClient) -> SampReplies {
        SampReplies { client }
    }

    /// Sends the answer in `mail` in reply to its task message, unless the thread shows it
    /// sent already (looked for only on a retry, and findable only while the recipient has
    /// not acked it: ack clears the data that names it).
    pub async fn submit(&self, mail: &RenderedMail) -> Result<(), SampError> {
        let Some(msg) = answer::read(mail, "the SAMP server") else {
            return Ok(());
        };
        let Some(parent) = parent_of(&msg) else {
            tracing::warn!(
                task_id = msg.task_id(),
                "an answer to a task that did not come from SAMP; dropped"
            );
            return Ok(());
        };
        // Acks, stream announcements and the rest have no SAMP equivalent.
        let Some((text, data)) = content(&msg, &mail.message_id) else {
            return Ok(());
        };
        let (known, first) = {
            let mut recent = self.client.recent.lock().expect("recent lock");
            (
                recent.message(&parent),
                recent.first_attempt(&mail.message_id),
            )
        };
        let subject = match known.filter(|_| first) {
            Some((_, subject)) => subject,
            // A retry, or a task read before a restart: look in the thread first.
            None => match self.before_retry(&msg, &parent, mail).await {
                Some(subject) => subject,
                None => return Ok(()),
            },
        };
        let posted = self
            .client
            .send(
                &to_name(&msg),
                &reply_subject(&subject),
                &text,
                Some(data),
                &parent,
            )
            .await?;
        self.noted(&posted, &msg, &mail.message_id);
        Ok(())
    }

    /// Looks in the task's thread before a retry: `None` when the answer is there already
    /// (sent, or taken by the server and never confirmed), else the subject of `parent`.
    async fn before_retry(
        &self,
        msg: &AampMessage,
        parent: &str,
        mail: &RenderedMail,
    ) -> Option<String> {
        let messages = match parse_task_id(msg.task_id()) {
            Some((thread, _)) if !thread.is_empty() => {
                self.client.thread(thread).await.unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "could not read the SAMP thread before a retry");
                    Vec::new()
                })
            }
            _ => Vec::new(),
        };
        if let Some(posted) = messages
            .iter()
            .find(|m| m["data"]["aamp"]["messageId"] == mail.message_id.as_str())
        {
            tracing::info!(message_id = %mail.message_id, "the answer is in the thread already; not sending it again");
            if let Some(id) = posted["id"].as_str().filter(|_| is_question(msg)) {
                self.note_question(id, &mail.message_id);
            }
            return None;
        }
        if let Some(lost) = self.lost_send(&messages, parent, mail).await {
            tracing::info!(message_id = %mail.message_id, posted = %lost, "an answer of ours the server took but never confirmed is in the thread (acked, so without its content): taken as this one, not sent again");
            self.noted(&lost, msg, &mail.message_id);
            return None;
        }
        let subject = messages
            .iter()
            .find(|m| m["id"] == parent)
            .and_then(|m| m["subject"].as_str());
        Some(subject.unwrap_or_default().to_string())
    }

    /// Keeps `posted` as the answer sent for `message_id`, and as a question when it is one.
    fn noted(&self, posted: &str, msg: &AampMessage, message_id: &str) {
        self.note_sent(posted, message_id);
        if is_question(msg) {
            self.note_question(posted, message_id);
        }
    }

    /// An answer of ours to `parent` in the thread `messages` that the server took but the
    /// bridge never saw confirmed: sent by this agent, in reply to `parent`, acked by its
    /// recipient (its content, and with it the Message-ID in its `data`, cleared), not among
    /// the answers the server confirmed, and sent no earlier than `mail` was made (so an
    /// earlier answer of the same task, a question, is not taken for it). Its id.
    async fn lost_send(
        &self,
        messages: &[Value],
        parent: &str,
        mail: &RenderedMail,
    ) -> Option<String> {
        let me = self.client.ready().await.ok()?.me;
        let made = mail_parser::MessageParser::default()
            .parse(&mail.bytes)?
            .date()
            .map(|d| d.to_timestamp())?;
        let recent = self.client.recent.lock().expect("recent lock");
        messages
            .iter()
            .filter(|m| m["from"] == me.as_str() && m["in_reply_to"] == parent)
            .filter(|m| m["data"].is_null() && m["body"].is_null())
            .filter(|m| {
                m["created_at"]
                    .as_str()
                    .and_then(protocol::time::parse)
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .is_some_and(|t| t.as_secs() as i64 >= made - CLOCK_SKEW_SECS)
            })
            .filter_map(|m| m["id"].as_str())
            .find(|id| recent.sent.question(id).is_none())
            .map(str::to_string)
    }

    fn note_sent(&self, posted: &str, message_id: &str) {
        self.client
            .recent
            .lock()
            .expect("recent lock")
            .sent
            .asked(posted, message_id);
    }

    fn note_question(&self, posted: &str, message_id: &str) {
        self.client
            .recent
            .lock()
            .expect("recent lock")
            .questions
            .asked(posted, message_id);
    }
}

fn is_question(msg: &AampMessage) -> bool {
    matches!(msg.body, Body::HelpNeeded(_))
}

/// The SAMP message an answer replies to: named by its In-Reply-To, else by its TaskId.
fn parent_of(msg: &AampMessage) -> Option<String> {
    msg.envelope
        .in_reply_to
        .as_deref()
        .and_then(|r| r.strip_prefix('<')?.strip_suffix("@samp>"))
        .map(str::to_string)
        .or_else(|| parse_task_id(msg.task_id()).map(|(_, id)| id.to_string()))
}

/// The recipient: `NAME@HOST` back to the agent's name.
fn to_name(msg: &AampMessage) -> String {
    let to = msg.envelope.to.first().map_or("", String::as_str);
    to.rsplit_once('@').map_or(to, |(name, _)| name).to_string()
}

/// The answer's text and its `data` (the AAMP fields in `data.aamp`, and the mark that it is
/// an answer), cut to the server's limits; `None` for what SAMP has no place for.
fn content(msg: &AampMessage, message_id: &str) -> Option<(String, Value)> {
    let intent = msg.intent();
    let text = answer::text(&msg.body, Markup::Plain)?;
    let mut aamp = json!({
        "intent": intent.as_str(),
        "taskId": msg.task_id(),
        "messageId": message_id,
    });
    match &msg.body {
        Body::Result(r) => {
            aamp["status"] = json!(r.status.as_str());
            if let Some(error) = r.error.as_deref().filter(|e| !e.is_empty()) {
                aamp["error"] = json!(error);
            }
            if let Some(fields) = &r.structured_result {
                aamp["structuredResult"] = fields.clone();
            }
        }
        Body::HelpNeeded(h) => {
            aamp["question"] = json!(h.question);
            aamp["suggestedOptions"] = json!(h.suggested_options);
        }
        _ => {}
    }
    let mut text = fit_body(&text);
    let mut data = json!({ "aamp": aamp, FOREIGN_MARK: {"answer": intent.as_str()} });
    if serde_json::to_vec(&data).map_or(0, |d| d.len()) > DATA_MAX_BYTES {
        if let Some(aamp) = data["aamp"].as_object_mut() {
            aamp.remove("structuredResult");
        }
        text = fit_body(&format!(
            "{text}\n\n[the structured result was over the 64 KB SAMP data limit and is not attached]"
        ));
    }
    Some((text, data))
}
