//! Where an ASMTP agent's answers go: reply envelopes whose client id and body are the same on
//! every attempt (a resend is a no-op at the operator); large answers moved into a file.

use serde_json::{json, Value};

use crate::mailbox::answer::{self, Markup};
use crate::mailbox::outlet::answers_only;
use crate::mailbox::MailboxError;
use crate::protocol::{self, AampMessage, Body, RenderedMail};

use super::client::AsmtpClient;
use super::wire::{envelope_id, BODY_LIMIT, FILE_LIMIT, TEXT_KEPT};

/// Whether `mail` is a question to the dispatcher (`task.help_needed`).
pub(super) fn mail_is_question(mail: &RenderedMail) -> bool {
    protocol::rfc5322::parse_raw(&mail.bytes)
        .and_then(|view| AampMessage::parse(&view).ok())
        .is_some_and(|m| matches!(m.body, Body::HelpNeeded(_)))
}

/// Where an ASMTP agent's answers go: reply envelopes.
#[derive(Clone)]
pub struct AsmtpReplies {
    pub(super) client: AsmtpClient,
}

answers_only!(AsmtpReplies);

impl AsmtpReplies {
    pub fn new(client: AsmtpClient) -> AsmtpReplies {
        AsmtpReplies { client }
    }

    /// The reply envelope for the answer in `mail`; `None` for what ASMTP has no place for.
    /// The same mail gives the same envelope, byte for byte (its date is the mail's own).
    pub fn envelope_for(mail: &RenderedMail) -> Option<Value> {
        let view = protocol::rfc5322::parse_raw(&mail.bytes)?;
        let msg = AampMessage::parse(&view).ok()?;
        let parent = msg.task_id().strip_prefix("asmtp:")?.to_string();
        // The whole chain (RFC 5322: the parent's references, then the parent), ending with the
        // envelope answered, as the operator requires.
        let mut references: Vec<String> = msg
            .envelope
            .references
            .iter()
            .filter_map(|r| {
                r.strip_prefix('<')?
                    .strip_suffix("@asmtp>")
                    .map(str::to_string)
            })
            .filter(|id| *id != parent)
            .collect();
        references.push(parent.clone());
        let mut text = answer::text(&msg.body, Markup::Plain)?;
        let mut data = json!({});
        if let Body::Result(r) = &msg.body {
            if text.is_empty() {
                text = format!("({})", r.status.as_str());
            }
            data["status"] = json!(r.status.as_str());
            if let Some(fields) = &r.structured_result {
                data["structuredResult"] = fields.clone();
            }
        }
        data[crate::mailbox::FOREIGN_MARK] = json!({"answer": msg.intent().as_str()});
        let parts = [
            json!({"type": "text", "text": text}),
            json!({"type": "data", "data": data}),
        ];
        let date_ms = mail_parser::MessageParser::default()
            .parse(&mail.bytes)
            .and_then(|m| m.date().map(|d| d.to_timestamp() * 1000))
            .unwrap_or(0)
            .max(0);
        // No subject: a reply is read in its thread.
        Some(json!({
            "id": envelope_id(&mail.message_id, date_ms),
            "to": msg.envelope.to,
            "in_reply_to": parent,
            "references": references,
            "date_ms": date_ms,
            "content_parts": parts,
        }))
    }

    pub async fn submit(&self, mail: &RenderedMail) -> Result<(), MailboxError> {
        // Acks, streams and the rest have no ASMTP equivalent.
        let Some(mut envelope) = AsmtpReplies::envelope_for(mail) else {
            return Ok(());
        };
        if let (Some(id), true) = (envelope["id"].as_str(), mail_is_question(mail)) {
            self.client.asked(id, &mail.message_id);
        }
        // Files the answer hands over (the agent's `FILE:` lines, files it wrote) go as file
        // parts, uploaded first; an envelope takes no inline bytes.
        for (name, content_type, bytes) in crate::mailbox::attached_files(&mail.bytes) {
            let file_id = self.client.upload(&name, &content_type, &bytes).await?;
            if let Some(parts) = envelope["content_parts"].as_array_mut() {
                let at = parts.len().saturating_sub(1);
                parts.insert(
                    at,
                    json!({"type": "file", "file_id": file_id, "name": name, "mime_type": content_type}),
                );
            }
        }
        // The reply belongs to the conversation of the envelopes it answers.
        if let (Some(id), Some(chain)) =
            (envelope["id"].as_str(), envelope["references"].as_array())
        {
            let chain: Vec<String> = chain
                .iter()
                .filter_map(|r| r.as_str().map(str::to_string))
                .collect();
            self.client
                .threads
                .lock()
                .expect("threads lock")
                .root(id, &chain);
        }
        if serialized_len(&envelope) > BODY_LIMIT {
            envelope = self.fit(envelope).await?;
        }
        match self.client.post(&envelope).await {
            // The id is derived from this mail's Message-ID: an envelope under it is this
            // answer, accepted at an earlier attempt (whose file upload had another id).
            Err(MailboxError::Http {
                status: 409, body, ..
            }) if body.contains("RETRY_MISMATCH") => {
                tracing::info!(message_id = %mail.message_id, "the operator holds this answer already");
                Ok(())
            }
            other => other,
        }
    }

    /// An envelope over the operator's body cap: its text goes into a file part (`answer.md`,
    /// cut at the file cap, saying so) and the envelope keeps the start of it and says where
    /// the rest is. Still too large (a huge structured result) is a permanent refusal.
    pub(super) async fn fit(&self, mut envelope: Value) -> Result<Value, MailboxError> {
        let parts = envelope["content_parts"]
            .as_array_mut()
            .expect("an envelope has parts");
        let Some(text) = parts
            .iter()
            .position(|p| p["type"] == "text")
            .map(|i| (i, parts[i]["text"].as_str().unwrap_or_default().to_string()))
        else {
            return Err(too_large(&envelope));
        };
        let (index, text) = text;
        let whole = text.len();
        let mut file = cut(&text, FILE_LIMIT - 1024).to_string();
        if file.len() < whole {
            file.push_str(&format!(
                "\n\n[cut here: the answer was {whole} bytes, more than the operator's file limit]\n"
            ));
        }
        let file_id = self
            .client
            .upload("answer.md", "text/markdown", file.as_bytes())
            .await?;
        let head = cut(&text, TEXT_KEPT);
        parts[index]["text"] = Value::String(format!(
            "{head}\n\n[The answer is {whole} bytes, more than one envelope takes: it continues in the attached file answer.md{}.]",
            if file.len() < whole { ", itself cut at 10 MiB" } else { "" }
        ));
        parts.insert(
            index + 1,
            json!({"type": "file", "file_id": file_id, "name": "answer.md", "mime_type": "text/markdown"}),
        );
        if serialized_len(&envelope) > BODY_LIMIT {
            return Err(too_large(&envelope));
        }
        Ok(envelope)
    }
}

pub(super) fn serialized_len(envelope: &Value) -> usize {
    serde_json::to_vec(envelope).map_or(usize::MAX, |v| v.len())
}

pub(super) fn too_large(envelope: &Value) -> MailboxError {
    MailboxError::TooLarge {
        what: "the answer envelope".into(),
        server: "the ASMTP operator".into(),
        bytes: serialized_len(envelope),
        limit: BODY_LIMIT,
    }
}

/// The start of `text`, at most `max` bytes, cut at a character boundary.
pub(super) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
