//! The AMP back-end (Agent Mailer Protocol, the study8677/agent-mailer broker): an agent's
//! mailbox on an HTTP broker. Read by polling its unread inbox (the broker has no push and no
//! cursor), with backoff; each message is handed to `deliver` (the journal) and only then
//! marked read, so a crash in between delivers it again and the journal recognises it.
//! Answers go back as a `reply` to the message, in its thread. The broker has no idempotency
//! key: before a reply is posted the thread is read, and a reply that carries the same
//! bridge Message-ID (in an HTML comment at its end) is not posted again.
//!
//! How AMP maps onto the bridge's model: every message to the agent is a task
//! (`task.dispatch`: the subject is its title, the body its text, the thread its Session-Key,
//! so a reply in the thread continues the agent's session); `task.result`,
//! `task.help_needed` and `card.response` become replies; acks and streams have no AMP
//! equivalent and are dropped. The TaskId is `amp:<thread_id>:<message_id>`.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::intake::{self, DeliverError, Health, IntakeError, Watched};
use super::{Inbound, Mail, MailboxError};
use crate::config::AmpAccount;
use crate::events::Events;
use crate::protocol::{self, AampMessage, Body, RenderedMail};

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
    #[serde(default)]
    pub parent_id: Option<String>,
    #[serde(default)]
    pub created_at: String,
}

/// The broker's agent-facing API, authenticated with the user's API key.
#[derive(Clone)]
pub struct AmpClient {
    http: reqwest::Client,
    account: AmpAccount,
}

impl AmpClient {
    pub fn new(account: AmpAccount) -> Result<AmpClient, MailboxError> {
        Ok(AmpClient {
            http: super::http_client(account.insecure_tls, Some(Duration::from_secs(30)))?,
            account,
        })
    }

    pub fn address(&self) -> &str {
        &self.account.address
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> Result<Value, MailboxError> {
        let mut url = self.account.url.clone();
        {
            let mut segments = url
                .path_segments_mut()
                .map_err(|()| MailboxError::Protocol {
                    what: self.account.url.to_string(),
                    detail: "the broker URL cannot take a path".into(),
                })?;
            segments.pop_if_empty();
            for part in path.split('/').filter(|p| !p.is_empty()) {
                segments.push(part);
            }
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut request = self
            .http
            .request(method, url.clone())
            .header("X-API-Key", &self.account.api_key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        super::fetch_json(request, url.as_str()).await
    }

    fn parse<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T, MailboxError> {
        serde_json::from_value(value).map_err(|e| MailboxError::Protocol {
            what: what.to_string(),
            detail: e.to_string(),
        })
    }

    /// The agent's unread messages, oldest first.
    pub async fn unread(&self) -> Result<Vec<AmpMessage>, MailboxError> {
        let path = format!("messages/inbox/{}", self.account.address);
        let value = self
            .call(
                reqwest::Method::GET,
                &path,
                &[("agent_id", &self.account.agent_id)],
                None,
            )
            .await?;
        Self::parse(value, "the AMP inbox")
    }

    pub async fn mark_read(&self, id: &str) -> Result<(), MailboxError> {
        self.call(
            reqwest::Method::PATCH,
            &format!("messages/{id}/read"),
            &[],
            None,
        )
        .await
        .map(|_| ())
    }

    /// A thread, oldest first.
    pub async fn thread(&self, thread_id: &str) -> Result<Vec<AmpMessage>, MailboxError> {
        let value = self
            .call(
                reqwest::Method::GET,
                &format!("messages/thread/{thread_id}"),
                &[],
                None,
            )
            .await?;
        Self::parse(value, "an AMP thread")
    }

    /// Replies to message `parent` (from `to`).
    pub async fn reply(
        &self,
        parent: &str,
        to: &str,
        subject: &str,
        body: &str,
    ) -> Result<AmpMessage, MailboxError> {
        let value = self
            .call(
                reqwest::Method::POST,
                "messages/send",
                &[],
                Some(json!({
                    "agent_id": self.account.agent_id,
                    "from_agent": self.account.address,
                    "to_agent": to,
                    "action": "reply",
                    "subject": subject,
                    "body": body,
                    "attachments": [],
                    "parent_id": parent,
                })),
            )
            .await?;
        Self::parse(value, "the AMP send answer")
    }
}

/// The TaskId of an AMP message: its thread and its id.
fn task_id(m: &AmpMessage) -> String {
    format!("amp:{}:{}", m.thread_id, m.id)
}

/// The thread and message a TaskId made by [`task_id`] names.
fn parse_task_id(task_id: &str) -> Option<(&str, &str)> {
    let rest = task_id.strip_prefix("amp:")?;
    let (thread, id) = rest.rsplit_once(':')?;
    (!thread.is_empty() && !id.is_empty()).then_some((thread, id))
}

/// An AMP message as the bridge's inbound model: a task for the agent. `None` for a message
/// that does not survive the trip through the mail model (never seen; the intake skips it).
pub fn to_inbound(m: &AmpMessage) -> Option<Inbound> {
    super::ForeignTask {
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

/// `Re: <subject>` (one `Re:`, however many the subject had); `Re: (no subject)` for none.
fn reply_subject(subject: &str) -> String {
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
fn answer_marker(message_id: &str) -> String {
    format!("<!-- aamp-bridge {message_id} -->")
}

/// The body ends with an agent bridge's answer marker: the message is an answer.
fn is_answer(body: &str) -> bool {
    body.trim_end().lines().last().is_some_and(|line| {
        let line = line.trim();
        line.starts_with("<!-- aamp-bridge <") && line.ends_with("> -->")
    })
}

/// The hop count an AMP message carries: a line `<!-- aamp-hop-count N -->` (an agent that
/// passes work on writes it, one more than its own `AAMP_BRIDGE_HOPS`).
fn hop_count(body: &str) -> Option<u32> {
    body.lines().find_map(|line| {
        line.trim()
            .strip_prefix("<!-- aamp-hop-count ")?
            .strip_suffix("-->")?
            .trim()
            .parse()
            .ok()
    })
}

/// The broker's inbox for [`intake::watch`]: every unread message delivered, then marked read.
struct AmpWatched<'a, D> {
    client: AmpClient,
    deliver: D,
    link: &'a super::link::Link,
    poll_interval: Duration,
}

impl<D: FnMut(Mail) -> Result<(), DeliverError> + Send> Watched for AmpWatched<'_, D> {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        poll_once(&self.client, &mut self.deliver).await
    }

    fn next_read(&mut self, taken: usize) -> Duration {
        self.link.push("polling");
        if taken > 0 {
            // More may have come while these were taken.
            Duration::ZERO
        } else {
            self.poll_interval
        }
    }

    fn address(&self) -> String {
        self.client.address().to_string()
    }
}

/// Polls the inbox until `stop` (AMP has no push).
pub async fn run_intake(
    name: String,
    client: AmpClient,
    link: super::link::Link,
    deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
    events: Events,
    poll_interval: Duration,
    stop: CancellationToken,
) {
    let health = Health::new(
        &link,
        "the AMP broker",
        client.address().to_string(),
        "api_key_file (and agent_id)",
    );
    let mut watched = AmpWatched {
        client,
        deliver,
        link: &link,
        poll_interval,
    };
    intake::watch(&name, events, health, &mut watched, None, &stop).await;
}

async fn poll_once(
    client: &AmpClient,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<usize, IntakeError> {
    let unread = client.unread().await?;
    let mut taken = 0;
    for m in unread {
        if !m.to_agent.eq_ignore_ascii_case(client.address()) {
            continue;
        }
        match to_inbound(&m) {
            Some(inbound) => {
                deliver(Mail::Aamp(Box::new(inbound))).map_err(IntakeError::Deliver)?
            }
            None => {
                tracing::warn!(id = %m.id, "an AMP message that cannot be read as a task; skipped")
            }
        }
        // Only once the journal holds it.
        client.mark_read(&m.id).await?;
        taken += 1;
    }
    Ok(taken)
}

/// Where an AMP agent's answers go: replies in the task's thread.
#[derive(Clone)]
pub struct AmpReplies {
    client: AmpClient,
}

impl AmpReplies {
    pub fn new(client: AmpClient) -> AmpReplies {
        AmpReplies { client }
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
        let messages = self.client.thread(thread).await?;
        if messages.iter().any(|m| {
            m.from_agent.eq_ignore_ascii_case(self.client.address()) && m.body.contains(&marker)
        }) {
            tracing::info!(message_id = %mail.message_id, "the reply is in the thread already; not posting it again");
            return Ok(());
        }
        // A reply reads like one: `Re:` and the subject of the message it answers.
        let subject = reply_subject(
            messages
                .iter()
                .find(|m| m.id == parent)
                .map_or("", |m| m.subject.as_str()),
        );
        self.client
            .reply(parent, &to, &subject, &format!("{text}\n\n{marker}"))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> AmpMessage {
        AmpMessage {
            id: "m-1".into(),
            thread_id: "t-1".into(),
            from_agent: "boss@alice.amp.test".into(),
            to_agent: "coder@alice.amp.test".into(),
            action: "send".into(),
            subject: "Fix the build".into(),
            body: "It fails on **main**.\nPlease look.".into(),
            is_read: false,
            parent_id: None,
            created_at: "2026-11-30T10:00:00+00:00".into(),
        }
    }

    #[test]
    fn a_message_becomes_a_task_named_by_its_thread_and_id() {
        let inbound = to_inbound(&message()).unwrap();
        let msg = &inbound.message;
        assert_eq!(msg.task_id(), "amp:t-1:m-1");
        assert_eq!(parse_task_id(msg.task_id()), Some(("t-1", "m-1")));
        assert_eq!(msg.envelope.from, "boss@alice.amp.test");
        assert_eq!(msg.envelope.message_id, "<m-1@amp>");
        match &msg.body {
            Body::Dispatch(d) => {
                assert_eq!(d.title, "Fix the build");
                assert!(d.body_text.contains("Please look."), "{}", d.body_text);
                assert_eq!(d.session_key.as_deref(), Some("amp:t-1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(inbound.sender_check.is_believed());
    }

    /// Issue 21: replies were titled `Re: [AAMP Result] Task amp:<thread>:<id> - completed`.
    #[test]
    fn a_reply_is_titled_after_the_message_it_answers() {
        assert_eq!(reply_subject("Fix the build"), "Re: Fix the build");
        assert_eq!(reply_subject("RE: re: Fix the build"), "Re: Fix the build");
        assert_eq!(reply_subject("  "), "Re: (no subject)");
        assert_eq!(reply_subject("Réponse"), "Re: Réponse");
    }

    /// Issue 18: two agents that allow each other answered each other's answers forever.
    #[test]
    fn an_answer_is_marked_automatic_and_a_hop_count_is_read() {
        let mut m = message();
        m.body = format!("All done.\n\n{}\n", answer_marker("<task.result.1@x>"));
        let inbound = to_inbound(&m).unwrap();
        assert_eq!(
            inbound.view.header("Auto-Submitted").as_deref(),
            Some("auto-replied")
        );
        m.body = "Please look at <!-- aamp-bridge <x> --> this".into();
        assert_eq!(to_inbound(&m).unwrap().view.header("Auto-Submitted"), None);
        m.body = "Relayed work\n<!-- aamp-hop-count 5 -->".into();
        match &to_inbound(&m).unwrap().message.body {
            Body::Dispatch(d) => assert_eq!(d.hop_count, Some(5)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hostile_messages_become_plain_tasks_never_a_panic() {
        let long = "s".repeat(100_000);
        for (subject, body, from) in [
            ("\r\nX-AAMP-Intent: task.cancel", "x", "boss@alice.amp.test"),
            (long.as_str(), "b", "boss@alice.amp.test"),
            ("", "", "boss@alice.amp.test"),
            (
                "\u{0}\u{7f}\u{202e}",
                "\u{feff}body\r\n.\r\n",
                "boss@alice.amp.test",
            ),
            ("hi", "x", "boss@x\r\nBcc: victim@example.com"),
        ] {
            let mut m = message();
            m.subject = subject.into();
            m.body = body.into();
            m.from_agent = from.into();
            if let Some(inbound) = to_inbound(&m) {
                assert_eq!(
                    inbound.message.intent(),
                    crate::protocol::Intent::TaskDispatch
                );
                assert_eq!(inbound.message.task_id(), "amp:t-1:m-1");
                assert!(!inbound.message.envelope.from.contains('\n'));
            }
        }
    }

    #[test]
    fn task_ids_not_from_amp_are_not_taken_for_amp_ones() {
        for id in ["t-1", "amp:", "amp:t-1", "amp::m", "amp:t:"] {
            assert_eq!(parse_task_id(id), None, "{id}");
        }
    }
}
