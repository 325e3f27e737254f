//! Where an AMP agent's answers go: replies in the task's thread, posted once (the thread is
//! read first when this process may have posted the answer before).

use crate::mailbox::MailboxError;
use crate::protocol::{self, AampMessage, Body, RenderedMail};

use super::client::{broker_takes, AmpClient};
use super::wire::{answer_marker, parse_task_id, reply_subject};

/// Where an AMP agent's answers go: replies in the task's thread.
#[derive(Clone)]
pub struct AmpReplies {
    pub(super) client: AmpClient,
}

/// The outbound seam over this system: answers submitted; no attachments, streams, threads
/// or claims (the trait's defaults).
#[async_trait::async_trait]
impl crate::backend::Backend for AmpReplies {
    async fn submit(&self, mail: &RenderedMail) -> Result<(), crate::backend::BackendError> {
        Ok(AmpReplies::submit(self, mail).await?)
    }
}

impl AmpReplies {
    pub fn new(client: AmpClient) -> AmpReplies {
        AmpReplies { client }
    }

    pub fn secret(&self) -> &crate::config::Secret {
        self.client.secret()
    }

    /// Posts the answer in `mail` as a reply, unless the thread holds it already.
    pub async fn submit(&self, mail: &RenderedMail) -> Result<(), MailboxError> {
        let parsed = protocol::rfc5322::parse_raw(&mail.bytes)
            .and_then(|view| AampMessage::parse(&view).ok());
        let Some(msg) = parsed else {
            tracing::warn!(message_id = %mail.message_id, "not an AAMP answer; nothing to post to the AMP broker");
            return Ok(());
        };
        let Some((thread, parent)) = parse_task_id(msg.task_id()) else {
            tracing::warn!(
                task_id = msg.task_id(),
                "an answer to a task that did not come from AMP; dropped"
            );
            return Ok(());
        };
        let text = match &msg.body {
            Body::Result(r) => {
                let mut text = r.output.clone();
                if let Some(error) = r.error.as_deref().filter(|e| !e.is_empty()) {
                    if !text.is_empty() {
                        text.push_str("\n\n");
                    }
                    text.push_str(&format!("**{}**: {error}", r.status.as_str()));
                }
                if let Some(fields) = &r.structured_result {
                    text.push_str(&format!("\n\n```json\n{fields}\n```"));
                }
                text
            }
            Body::HelpNeeded(h) => {
                let mut text = format!("**Question:** {}", h.question);
                for option in &h.suggested_options {
                    text.push_str(&format!("\n- {option}"));
                }
                text
            }
            Body::CardResponse { summary, text } => format!("**{summary}**\n\n{text}"),
            // Acks, stream announcements and the rest have no AMP equivalent.
            _ => return Ok(()),
        };
        let marker = answer_marker(&mail.message_id);
        let to = msg.envelope.to.first().cloned().unwrap_or_default();
        let (known_subject, first_attempt) = {
            let mut recent = self.client.recent.lock().expect("recent lock");
            let subject = recent.subject(parent).map(str::to_string);
            (subject, recent.first_attempt(&mail.message_id))
        };
        let subject = match known_subject.filter(|_| first_attempt) {
            // Read here, never tried: post at once (no whole-thread read per reply).
            Some(subject) => subject,
            None => {
                let messages = self.client.thread(thread).await?;
                if let Some(posted) = messages.iter().find(|m| {
                    m.from_agent.eq_ignore_ascii_case(self.client.address())
                        && m.body.contains(&marker)
                }) {
                    tracing::info!(message_id = %mail.message_id, "the reply is in the thread already; not posting it again");
                    if matches!(msg.body, Body::HelpNeeded(_)) {
                        // Posted by a bridge killed before it noted the question.
                        self.client.note_question(&posted.id, &mail.message_id);
                    }
                    return Ok(());
                }
                messages
                    .iter()
                    .find(|m| m.id == parent)
                    .map(|m| m.subject.clone())
                    .unwrap_or_default()
            }
        };
        // Files the agent handed over: the images go as the broker's attachments (what it
        // takes); the rest are named, never dropped silently.
        let mut text = text;
        let mut attachments = Vec::new();
        let mut left = Vec::new();
        for (name, content_type, bytes) in crate::mailbox::attached_files(&mail.bytes) {
            if broker_takes(&bytes) {
                attachments.push(self.client.upload(&name, &content_type, &bytes).await?);
            } else {
                left.push(name);
            }
        }
        if !left.is_empty() {
            text.push_str(&format!(
                "\n\n(Files the agent handed over, not sent: the AMP broker takes only PNG, JPEG, GIF and WebP images of up to 10 MB: {})",
                left.join(", ")
            ));
        }
        // A reply reads like one: `Re:` and the subject of the message it answers.
        let posted = self
            .client
            .reply_with(
                parent,
                &to,
                &reply_subject(&subject),
                &format!("{text}\n\n{marker}"),
                &attachments,
            )
            .await?;
        if matches!(msg.body, Body::HelpNeeded(_)) {
            self.client.note_question(&posted.id, &mail.message_id);
        }
        Ok(())
    }
}
