//! Where an AMP agent's answers go: replies in the task's thread, posted once (the thread is
//! read first when this process may have posted the answer before).

use serde_json::Value;

use crate::mailbox::answer::{self, Markup};
use crate::mailbox::outlet::answers_only;
use crate::mailbox::MailboxError;
use crate::protocol::{AampMessage, Body, RenderedMail};

use super::client::{broker_takes, AmpClient};
use super::wire::{answer_marker, parse_task_id, reply_subject};

/// Where an AMP agent's answers go: replies in the task's thread.
#[derive(Clone)]
pub struct AmpReplies {
    pub(super) client: AmpClient,
}

answers_only!(AmpReplies);

impl AmpReplies {
    pub fn new(client: AmpClient) -> AmpReplies {
        AmpReplies { client }
    }

    /// Posts the answer in `mail` as a reply, unless the thread holds it already.
    pub async fn submit(&self, mail: &RenderedMail) -> Result<(), MailboxError> {
        let Some(msg) = answer::read(mail, "the AMP broker") else {
            return Ok(());
        };
        let Some((thread, parent)) = parse_task_id(msg.task_id()) else {
            tracing::warn!(
                task_id = msg.task_id(),
                "an answer to a task that did not come from AMP; dropped"
            );
            return Ok(());
        };
        // Acks, stream announcements and the rest have no AMP equivalent.
        let Some(mut text) = answer::text(&msg.body, Markup::Markdown) else {
            return Ok(());
        };
        if let Body::Result(r) = &msg.body {
            if let Some(fields) = &r.structured_result {
                text.push_str(&format!("\n\n```json\n{fields}\n```"));
            }
        }
        let marker = answer_marker(&mail.message_id);
        let (known_subject, first_attempt) = {
            let mut recent = self.client.recent.lock().expect("recent lock");
            let subject = recent.subject(parent).map(str::to_string);
            (subject, recent.first_attempt(&mail.message_id))
        };
        let subject = match known_subject.filter(|_| first_attempt) {
            // Read here, never tried: post at once (no whole-thread read per reply).
            Some(subject) => subject,
            None => match self
                .before_retry(&msg, thread, parent, &marker, mail)
                .await?
            {
                Some(subject) => subject,
                None => return Ok(()),
            },
        };
        let (text, attachments) = self.with_files(text, mail).await?;
        // A reply reads like one: `Re:` and the subject of the message it answers.
        let to = msg.envelope.to.first().cloned().unwrap_or_default();
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

    /// Reads the thread before a retry: `None` when the reply (its `marker`) is there
    /// already, else the subject of `parent`.
    async fn before_retry(
        &self,
        msg: &AampMessage,
        thread: &str,
        parent: &str,
        marker: &str,
        mail: &RenderedMail,
    ) -> Result<Option<String>, MailboxError> {
        let messages = self.client.thread(thread).await?;
        if let Some(posted) = messages.iter().find(|m| {
            m.from_agent.eq_ignore_ascii_case(self.client.address()) && m.body.contains(marker)
        }) {
            tracing::info!(message_id = %mail.message_id, "the reply is in the thread already; not posting it again");
            if matches!(msg.body, Body::HelpNeeded(_)) {
                // Posted by a bridge killed before it noted the question.
                self.client.note_question(&posted.id, &mail.message_id);
            }
            return Ok(None);
        }
        Ok(Some(
            messages
                .iter()
                .find(|m| m.id == parent)
                .map(|m| m.subject.clone())
                .unwrap_or_default(),
        ))
    }

    /// Files the agent handed over: the images go as the broker's attachments (what it
    /// takes, uploaded here); the rest are named under `text`, never dropped silently.
    async fn with_files(
        &self,
        mut text: String,
        mail: &RenderedMail,
    ) -> Result<(String, Vec<Value>), MailboxError> {
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
        Ok((text, attachments))
    }
}
