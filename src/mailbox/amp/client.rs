//! The broker's agent-facing API, authenticated with the user's API key, and what this
//! process remembers of what it read and posted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::config::AmpAccount;
use crate::mailbox::MailboxError;

use super::wire::{AmpMessage, InboxPage, COUNT_PAGE};
use crate::mailbox::body::Skimmed;

/// Messages this process read, with their subjects, and the answers it tried to post: what
/// lets a reply skip reading its thread.
#[derive(Default)]
pub(super) struct Recent {
    pub(super) subjects: VecDeque<(String, String)>,
    pub(super) attempted: crate::mailbox::RecentIds,
    /// Questions the agent posted (`task.help_needed`), by their broker id, so that a reply
    /// to one (its `parent_id`) is taken as the answer, never as a task.
    pub(super) questions: crate::mailbox::Questions,
}

/// How many of each [`Recent`] keeps.
pub(super) const RECENT: usize = 4096;

impl Recent {
    pub(super) fn saw(&mut self, id: &str, subject: &str) {
        if self.subjects.len() >= RECENT {
            self.subjects.pop_front();
        }
        self.subjects
            .push_back((id.to_string(), subject.to_string()));
    }

    pub(super) fn subject(&self, id: &str) -> Option<&str> {
        self.subjects
            .iter()
            .rev()
            .find(|(i, _)| i == id)
            .map(|(_, s)| s.as_str())
    }

    /// Notes an attempt to post `message_id`; false when it was tried before.
    pub(super) fn first_attempt(&mut self, message_id: &str) -> bool {
        self.attempted.first(message_id, RECENT)
    }
}

/// The broker's agent-facing API, authenticated with the user's API key.
#[derive(Clone)]
pub struct AmpClient {
    pub(super) http: reqwest::Client,
    pub(super) account: AmpAccount,
    pub(super) recent: Arc<Mutex<Recent>>,
    /// Messages the broker returned that could not be read, for the intake to report once
    /// each.
    pub(super) unreadable: Arc<crate::mailbox::UnreadableLog>,
}

impl AmpClient {
    pub fn new(account: AmpAccount) -> Result<AmpClient, MailboxError> {
        Ok(AmpClient {
            http: crate::mailbox::http_client(account.insecure_tls, Some(account.timeout))?,
            account,
            recent: Arc::default(),
            unreadable: Arc::default(),
        })
    }

    /// Notes that the broker's message `posted_id` is the agent's question `message_id`.
    pub(super) fn note_question(&self, posted_id: &str, message_id: &str) {
        self.recent
            .lock()
            .expect("recent lock")
            .questions
            .asked(posted_id, message_id);
    }

    /// Keeps the agent's questions in `path`, so replies to them are known after a restart.
    pub fn with_questions(self, path: std::path::PathBuf) -> AmpClient {
        self.recent.lock().expect("recent lock").questions = crate::mailbox::Questions::open(path);
        self
    }

    pub fn address(&self) -> &str {
        &self.account.address
    }

    /// The API key every call sends.
    pub fn secret(&self) -> &crate::config::Secret {
        &self.account.api_key
    }

    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> Result<Skimmed, MailboxError> {
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
            .header("X-API-Key", self.account.api_key.value());
        if let Some(body) = body {
            request = request.json(&body);
        }
        // Every answer that names a message carries its body (a mark read too): each is read
        // with the message cap counted while reading, so one message over it costs the cap,
        // not its size (issue 43 item 2).
        crate::mailbox::body::send_skimmed(request, url.as_str(), self.account.max_message_bytes)
            .await
    }

    pub(super) fn parse<T: serde::de::DeserializeOwned>(
        value: Value,
        what: &str,
    ) -> Result<T, MailboxError> {
        serde_json::from_value(value).map_err(|e| MailboxError::Protocol {
            what: what.to_string(),
            detail: e.to_string(),
        })
    }

    /// The agent's unread messages, oldest first.
    pub async fn unread(&self) -> Result<Vec<AmpMessage>, MailboxError> {
        let path = format!("messages/inbox/{}", self.account.address);
        let mut answer = self
            .call(
                reqwest::Method::GET,
                &path,
                &[("agent_id", &self.account.agent_id)],
                None,
            )
            .await?;
        self.each(&answer.list(""), "an AMP inbox message")
    }

    /// The messages of a list answer, each read on its own: one the bridge does not
    /// understand costs that message only, and is reported once by the intake.
    pub(super) fn each(&self, list: &Value, what: &str) -> Result<Vec<AmpMessage>, MailboxError> {
        let (messages, bad) = crate::mailbox::decode_each::<AmpMessage>(list, what)?;
        self.unreadable.note(bad);
        Ok(messages)
    }

    /// Page `page` (from 1) of every visible message to the agent, read or not, newest first.
    pub async fn inbox_page(&self, page: u64, page_size: u64) -> Result<InboxPage, MailboxError> {
        self.inbox_query(true, page, page_size).await
    }

    /// How many messages the inbox shows, read or not: a page past the end, so the broker
    /// counts them and renders none.
    pub async fn visible_total(&self) -> Result<u64, MailboxError> {
        Ok(self.inbox_query(true, COUNT_PAGE, 1).await?.total)
    }

    /// How many of those are unread, counted the same way.
    pub async fn unread_total(&self) -> Result<u64, MailboxError> {
        Ok(self.inbox_query(false, COUNT_PAGE, 1).await?.total)
    }

    /// One page of the inbox: every visible message (`all`) or the unread ones only.
    pub(super) async fn inbox_query(
        &self,
        all: bool,
        page: u64,
        page_size: u64,
    ) -> Result<InboxPage, MailboxError> {
        let path = format!("messages/inbox/{}", self.account.address);
        let (page, page_size) = (page.to_string(), page_size.to_string());
        let mut query = vec![
            ("agent_id", self.account.agent_id.as_str()),
            ("page", &page),
            ("page_size", &page_size),
        ];
        if all {
            query.push(("all", "true"));
        }
        let mut answer = self.call(reqwest::Method::GET, &path, &query, None).await?;
        let total = answer.value["total"]
            .as_u64()
            .ok_or_else(|| MailboxError::Protocol {
                what: "an AMP inbox page".into(),
                detail: "no total".into(),
            })?;
        Ok(InboxPage {
            messages: self.each(&answer.list("/messages"), "an AMP inbox message")?,
            total,
        })
    }

    /// Marks a message read. The broker answers with the whole message, body and all:
    /// only the status is read, so a large message costs nothing more here.
    pub async fn mark_read(&self, id: &str) -> Result<(), MailboxError> {
        let mut url = self.account.url.clone();
        url.path_segments_mut()
            .map_err(|()| MailboxError::Protocol {
                what: self.account.url.to_string(),
                detail: "the broker URL cannot take a path".into(),
            })?
            .pop_if_empty()
            .extend(["messages", id, "read"]);
        let response = self
            .http
            .patch(url.clone())
            .header("X-API-Key", self.account.api_key.value())
            .send()
            .await
            .map_err(MailboxError::network(url.to_string()))?;
        crate::mailbox::body::success(response, url.as_str())
            .await
            .map(drop)
    }

    /// A thread, oldest first.
    pub async fn thread(&self, thread_id: &str) -> Result<Vec<AmpMessage>, MailboxError> {
        let mut answer = self
            .call(
                reqwest::Method::GET,
                &format!("messages/thread/{thread_id}"),
                &[],
                None,
            )
            .await?;
        self.each(&answer.list(""), "an AMP thread message")
    }

    /// Uploads an image (`POST /files/upload`, multipart, one `file` field): the broker's
    /// answer (`{id, filename, mime_type, size, url}`), which a message lists among its
    /// `attachments`.
    pub async fn upload(
        &self,
        filename: &str,
        content_type: &str,
        bytes: &[u8],
    ) -> Result<Value, MailboxError> {
        let safe: String = filename
            .chars()
            .map(|c| if c == '"' || c.is_control() { '_' } else { c })
            .collect();
        let mut url = self.account.url.clone();
        url.set_path(&format!(
            "{}/files/upload",
            url.path().trim_end_matches('/')
        ));
        let request = self
            .http
            .post(url.clone())
            .header("X-API-Key", self.account.api_key.value());
        let request = crate::mailbox::with_file(request, &safe, content_type, bytes);
        crate::mailbox::fetch_json(request, url.as_str()).await
    }

    /// Replies to message `parent` (from `to`).
    pub async fn reply(
        &self,
        parent: &str,
        to: &str,
        subject: &str,
        body: &str,
    ) -> Result<AmpMessage, MailboxError> {
        self.reply_with(parent, to, subject, body, &[]).await
    }

    /// A reply listing `attachments` (what [`AmpClient::upload`] answered).
    pub async fn reply_with(
        &self,
        parent: &str,
        to: &str,
        subject: &str,
        body: &str,
        attachments: &[Value],
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
                    "attachments": attachments,
                    "parent_id": parent,
                })),
            )
            .await?
            .value;
        Self::parse(value, "the AMP send answer")
    }
}

/// What the AMP broker takes as a file (agent-mailer's `/files/upload`): PNG, JPEG, GIF or
/// WebP images of at most 10 MB, told by their first bytes.
pub(super) fn broker_takes(bytes: &[u8]) -> bool {
    let image = bytes.starts_with(b"\x89PNG\r\n\x1a\n")
        || bytes.starts_with(b"\xff\xd8\xff")
        || bytes.starts_with(b"GIF87a")
        || bytes.starts_with(b"GIF89a")
        || (bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP"));
    image && bytes.len() <= 10 * 1024 * 1024
}
