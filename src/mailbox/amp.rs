//! The AMP back-end (Agent Mailer Protocol, the study8677/agent-mailer broker): an agent's
//! mailbox on an HTTP broker, polled (the broker has no push). The inbox is followed by
//! position, not by its read flag (a person who opens a message in the broker's console marks
//! it read): a position `(created_at, ids at it)` kept on disk, moved only after every message
//! before it was handed to `deliver` (the journal, which also de-duplicates). The broker renders
//! markdown for every message it returns, so a poll first asks for the visible and the unread
//! message counts alone (a page past the end: nothing rendered) and reads the newest messages
//! only when one changed, a page the size of the change. A message archived or trashed as
//! another arrives (and is opened in the console) leaves both counts as they were, so the
//! newest messages are also read at each start and every `recheck` (default five minutes).
//! Delivered messages are marked read, as a hint for people. At the first start the unread
//! messages already waiting are the backlog, answered.
//!
//! Answers go back as a `reply` to the message, in its thread. The broker has no idempotency
//! key: the thread is read first (for a bridge Message-ID in an HTML comment at the end of a
//! reply) unless this process read the message and has not tried to answer with this mail
//! before, the common case, where the reply is posted at once.
//!
//! How AMP maps onto the bridge's model: every message to the agent is a task
//! (`task.dispatch`: the subject is its title, the body its text, the thread its Session-Key,
//! so a reply in the thread continues the agent's session); `task.result`,
//! `task.help_needed` and `card.response` become replies titled `Re: <subject>`; acks and
//! streams have no AMP equivalent and are dropped. The TaskId is `amp:<thread_id>:<message_id>`.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::intake::{self, DeliverError, Health, IntakeError, Watched};
use super::{Inbound, Mail, MailboxError};
use crate::config::AmpAccount;
use crate::events::Events;
use crate::protocol::{self, AampMessage, Body, Intent, RenderedMail};

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

/// A page of the inbox (`?page=`), newest first.
#[derive(Debug)]
pub struct InboxPage {
    pub messages: Vec<AmpMessage>,
    pub total: u64,
}

/// Messages this process read, with their subjects, and the answers it tried to post: what
/// lets a reply skip reading its thread.
#[derive(Default)]
struct Recent {
    subjects: VecDeque<(String, String)>,
    attempted: super::RecentIds,
    /// Questions the agent posted (`task.help_needed`), by their broker id, so that a reply
    /// to one (its `parent_id`) is taken as the answer, never as a task.
    questions: super::Questions,
}

/// How many of each [`Recent`] keeps.
const RECENT: usize = 4096;

impl Recent {
    fn saw(&mut self, id: &str, subject: &str) {
        if self.subjects.len() >= RECENT {
            self.subjects.pop_front();
        }
        self.subjects
            .push_back((id.to_string(), subject.to_string()));
    }

    fn subject(&self, id: &str) -> Option<&str> {
        self.subjects
            .iter()
            .rev()
            .find(|(i, _)| i == id)
            .map(|(_, s)| s.as_str())
    }

    /// Notes an attempt to post `message_id`; false when it was tried before.
    fn first_attempt(&mut self, message_id: &str) -> bool {
        self.attempted.first(message_id, RECENT)
    }
}

/// The broker's agent-facing API, authenticated with the user's API key.
#[derive(Clone)]
pub struct AmpClient {
    http: reqwest::Client,
    account: AmpAccount,
    recent: Arc<Mutex<Recent>>,
    /// Messages the broker returned that could not be read, for the intake to report once
    /// each.
    unreadable: Arc<super::UnreadableLog>,
}

impl AmpClient {
    pub fn new(account: AmpAccount) -> Result<AmpClient, MailboxError> {
        Ok(AmpClient {
            http: super::http_client(account.insecure_tls, Some(account.timeout))?,
            account,
            recent: Arc::default(),
            unreadable: Arc::default(),
        })
    }

    /// Notes that the broker's message `posted_id` is the agent's question `message_id`.
    fn note_question(&self, posted_id: &str, message_id: &str) {
        self.recent
            .lock()
            .expect("recent lock")
            .questions
            .asked(posted_id, message_id);
    }

    /// Keeps the agent's questions in `path`, so replies to them are known after a restart.
    pub fn with_questions(self, path: std::path::PathBuf) -> AmpClient {
        self.recent.lock().expect("recent lock").questions = super::Questions::open(path);
        self
    }

    pub fn address(&self) -> &str {
        &self.account.address
    }

    /// The API key every call sends.
    pub fn secret(&self) -> &crate::config::Secret {
        &self.account.api_key
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
            .header("X-API-Key", self.account.api_key.value());
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
        self.each(&value, "an AMP inbox message")
    }

    /// The messages of a list answer, each read on its own: one the bridge does not
    /// understand costs that message only, and is reported once by the intake.
    fn each(&self, list: &Value, what: &str) -> Result<Vec<AmpMessage>, MailboxError> {
        let (messages, bad) = super::decode_each::<AmpMessage>(list, what)?;
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
    async fn inbox_query(
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
        let value = self.call(reqwest::Method::GET, &path, &query, None).await?;
        let total = value["total"]
            .as_u64()
            .ok_or_else(|| MailboxError::Protocol {
                what: "an AMP inbox page".into(),
                detail: "no total".into(),
            })?;
        Ok(InboxPage {
            messages: self.each(&value["messages"], "an AMP inbox message")?,
            total,
        })
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
        self.each(&value, "an AMP thread message")
    }

    /// Replies to message `parent` (from `to`).
    /// Uploads an image (`POST /files/upload`, multipart, one `file` field): the broker's
    /// answer (`{id, filename, mime_type, size, url}`), which a message lists among its
    /// `attachments`.
    pub async fn upload(
        &self,
        filename: &str,
        content_type: &str,
        bytes: &[u8],
    ) -> Result<Value, MailboxError> {
        let boundary = format!("aamp-bridge-{}", uuid::Uuid::new_v4().simple());
        let safe: String = filename
            .chars()
            .map(|c| if c == '"' || c.is_control() { '_' } else { c })
            .collect();
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{safe}\"\r\nContent-Type: {content_type}\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(bytes);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let mut url = self.account.url.clone();
        url.set_path(&format!(
            "{}/files/upload",
            url.path().trim_end_matches('/')
        ));
        let request = self
            .http
            .post(url.clone())
            .header("X-API-Key", self.account.api_key.value())
            .header(
                reqwest::header::CONTENT_TYPE,
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body);
        super::fetch_json(request, url.as_str()).await
    }

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
            .await?;
        Self::parse(value, "the AMP send answer")
    }
}

/// What the AMP broker takes as a file (agent-mailer's `/files/upload`): PNG, JPEG, GIF or
/// WebP images of at most 10 MB, told by their first bytes.
fn broker_takes(bytes: &[u8]) -> bool {
    let image = bytes.starts_with(b"\x89PNG\r\n\x1a\n")
        || bytes.starts_with(b"\xff\xd8\xff")
        || bytes.starts_with(b"GIF87a")
        || bytes.starts_with(b"GIF89a")
        || (bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP"));
    image && bytes.len() <= 10 * 1024 * 1024
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

/// [`to_inbound`], for a message whose body is over `limit` bytes without its body: it is
/// answered rejected, saying why, and its text is neither kept in the journal nor given to an
/// agent (issue 36 item 2: one message's cost is bounded past its read).
fn to_inbound_within(m: &AmpMessage, limit: u64) -> Option<Inbound> {
    let size = m.body.len() as u64;
    if size <= limit {
        return to_inbound(m);
    }
    tracing::warn!(id = %m.id, size, limit, "an AMP message over max_message_bytes; answered rejected");
    let mut inbound = to_inbound(&AmpMessage {
        body: String::new(),
        ..m.clone()
    })?;
    inbound.refused = Some(format!(
        "the task is {size} bytes, more than this agent reads from one AMP message ({limit} bytes, max_message_bytes): send a shorter task, or put the large content where the agent can fetch it and name it"
    ));
    Some(inbound)
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

/// A page number past any inbox's end (a count without rendering).
const COUNT_PAGE: u64 = 1_000_000;
/// The most messages read per page.
const PAGE: u64 = 100;

/// How far the inbox has been read: the newest `created_at` handed on, the ids at exactly that
/// time (the broker's timestamps can tie), and the visible and unread counts then.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub created_at: String,
    pub ids: Vec<String>,
    pub total: u64,
    #[serde(default)]
    pub unread: u64,
}

/// The position file.
pub type PositionFile = crate::fsio::JsonFile<Position>;

/// The broker's inbox for [`intake::watch`], followed by position.
struct AmpWatched<'a, D> {
    client: AmpClient,
    position: &'a PositionFile,
    deliver: D,
    link: &'a super::link::Link,
    poll_interval: Duration,
    /// When this process last read the newest messages (`None`: not yet).
    walked: Option<tokio::time::Instant>,
    agent: &'a str,
    events: Events,
}

impl<D: FnMut(Mail) -> Result<(), DeliverError> + Send> Watched for AmpWatched<'_, D> {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        let recheck = match (self.walked, self.client.account.recheck) {
            (None, _) => true,
            (Some(at), Some(every)) => at.elapsed() >= every,
            (Some(_), None) => false,
        };
        let read = poll_once(&self.client, self.position, &mut self.deliver, recheck).await;
        // A message the broker returns that cannot be read is reported once and marked read,
        // so that the unread count does not keep a poll reading it again.
        let bad = self.client.unreadable.take();
        for id in bad.iter().filter_map(|b| b.id.as_deref()) {
            if let Err(e) = self.client.mark_read(id).await {
                tracing::debug!(%id, error = %e, "could not mark an unreadable AMP message read");
            }
        }
        super::report_unreadable(bad, self.agent, "AMP", &self.events);
        let read = read?;
        if read.walked {
            self.walked = Some(tokio::time::Instant::now());
        }
        Ok(read.taken)
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
    position: PositionFile,
    deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
    events: Events,
    stop: CancellationToken,
) {
    let poll_interval = client.account.poll_interval;
    let health = Health::new(
        &link,
        "the AMP broker",
        client.address().to_string(),
        "api_key_file (and agent_id)",
    )
    .with_secret(client.account.api_key.clone())
    .retry_refused_every(intake::KEY_REFUSED_RETRY);
    let mut watched = AmpWatched {
        client,
        position: &position,
        deliver,
        link: &link,
        poll_interval,
        walked: None,
        agent: &name,
        events,
    };
    intake::watch(&name, events, health, &mut watched, None, &stop).await;
}

/// What one poll did.
struct Polled {
    /// Messages handed on.
    taken: usize,
    /// Whether the newest messages were read (not only counted).
    walked: bool,
}

/// One poll: the counts, and the newest messages down to the position when a count changed
/// or `recheck` asks for it.
async fn poll_once(
    client: &AmpClient,
    position: &PositionFile,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
    recheck: bool,
) -> Result<Polled, IntakeError> {
    let Some(mut at) = position.load()? else {
        let taken = first_start(client, position, deliver).await?;
        return Ok(Polled {
            taken,
            walked: true,
        });
    };
    let total = client.visible_total().await?;
    let unread = client.unread_total().await?;
    if total == at.total && unread == at.unread && !recheck {
        return Ok(Polled {
            taken: 0,
            walked: false,
        });
    }
    // Something arrived (or was archived, trashed or read), or it is time to look anyway: the
    // newest messages down to the position (an older message, or every message at it), a
    // page the size of the change and one more at a time.
    let page_size = (total.abs_diff(at.total) + 1).clamp(2, PAGE);
    let mut fresh = Vec::new();
    let mut at_position = HashSet::new();
    let mut page = 1;
    loop {
        let got = client.inbox_page(page, page_size).await?;
        let last_page = (got.messages.len() as u64) < page_size;
        let mut reached = false;
        for m in got.messages {
            if m.created_at < at.created_at {
                reached = true;
            } else if m.created_at == at.created_at && at.ids.contains(&m.id) {
                at_position.insert(m.id);
            } else {
                fresh.push(m);
            }
        }
        reached |= !at.ids.is_empty() && at_position.len() == at.ids.len();
        if reached || last_page {
            break;
        }
        page += 1;
    }
    // Oldest first (the broker's order is `created_at`, a string); the same message listed on
    // two pages (one arrived in between) once.
    fresh.sort_by(|a, b| a.created_at.cmp(&b.created_at));
    let mut seen = HashSet::new();
    fresh.retain(|m| seen.insert(m.id.clone()));
    if recheck && !fresh.is_empty() && total == at.total && unread == at.unread {
        tracing::info!(
            new = fresh.len(),
            "messages the inbox counts did not show (another was archived or trashed meanwhile)"
        );
    }
    let handed = hand_on(client, &fresh, deliver).await?;
    for m in &fresh {
        if m.created_at > at.created_at {
            at.created_at = m.created_at.clone();
            at.ids.clear();
        }
        if m.created_at == at.created_at && !at.ids.contains(&m.id) {
            at.ids.push(m.id.clone());
        }
    }
    at.total = total;
    // Those this poll marked read are no longer unread.
    at.unread = unread.saturating_sub(handed.marked);
    position.save(&at)?;
    Ok(Polled {
        taken: handed.taken,
        walked: true,
    })
}

/// The first start: the position is the newest message, then the unread messages already
/// waiting are answered; the position is written only after them, so a crash in between
/// starts over (the journal knows what it holds).
/// How many of the newest messages a first start looks at for read ones still unanswered.
const FIRST_START_READ: u64 = 100;

async fn first_start(
    client: &AmpClient,
    position: &PositionFile,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<usize, IntakeError> {
    let newest = client.inbox_page(1, 1).await?;
    let mut backlog = client.unread().await?;
    let unread = backlog.len() as u64;
    // A task a person opened in the console before the bridge ever started is read, but
    // still waits for its answer: the newest page's read messages whose thread holds no
    // reply from the agent to them are answered too (the journal knows any it answered).
    let recent = client.inbox_page(1, FIRST_START_READ).await?;
    let mut threads_read = std::collections::HashMap::new();
    for m in recent.messages.iter().filter(|m| m.is_read).rev() {
        if backlog.iter().any(|b| b.id == m.id)
            || !m.to_agent.eq_ignore_ascii_case(client.address())
        {
            continue;
        }
        if !threads_read.contains_key(&m.thread_id) {
            let thread = client.thread(&m.thread_id).await?;
            threads_read.insert(m.thread_id.clone(), thread);
        }
        let answered = threads_read[&m.thread_id].iter().any(|r| {
            r.parent_id.as_deref() == Some(m.id.as_str())
                && r.from_agent.eq_ignore_ascii_case(client.address())
        });
        if !answered {
            backlog.push(m.clone());
        }
    }
    let mut at = Position {
        created_at: newest
            .messages
            .first()
            .map(|m| m.created_at.clone())
            .unwrap_or_default(),
        ids: newest
            .messages
            .first()
            .map(|m| m.id.clone())
            .into_iter()
            .collect(),
        total: newest.total,
        unread,
    };
    if !backlog.is_empty() {
        tracing::info!(
            unread = backlog.len(),
            "first start: answering the unread messages already waiting"
        );
    }
    let handed = hand_on(client, &backlog, deliver).await?;
    at.unread = at.unread.saturating_sub(handed.marked);
    position.save(&at)?;
    Ok(handed.taken)
}

/// What [`hand_on`] did.
struct Handed {
    taken: usize,
    /// How many unread messages it marked read.
    marked: u64,
}

/// Hands each message to the journal, then marks it read (a hint for people).
async fn hand_on(
    client: &AmpClient,
    messages: &[AmpMessage],
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<Handed, IntakeError> {
    let mut handed = Handed {
        taken: 0,
        marked: 0,
    };
    for m in messages {
        if !m.to_agent.eq_ignore_ascii_case(client.address()) {
            continue;
        }
        let question = match m.parent_id.as_deref() {
            Some(parent) => question_answered(client, m, parent).await?,
            None => None,
        };
        if let Some(question) = question {
            // An answer to a question the agent asked: matched by the broker's own link.
            deliver(Mail::Reply(answer_to(m, question))).map_err(IntakeError::Deliver)?
        } else {
            match to_inbound_within(m, client.account.max_message_bytes) {
                Some(inbound) => {
                    deliver(Mail::Aamp(Box::new(inbound))).map_err(IntakeError::Deliver)?
                }
                None => {
                    tracing::warn!(id = %m.id, "an AMP message that cannot be read as a task; skipped")
                }
            }
        }
        client
            .recent
            .lock()
            .expect("recent lock")
            .saw(&m.id, &m.subject);
        if !m.is_read {
            client.mark_read(&m.id).await?;
            handed.marked += 1;
        }
        handed.taken += 1;
    }
    Ok(handed)
}

/// The Message-ID of the agent's question that `m` replies to (its `parent_id` is `parent`),
/// if it is one. The questions file knows those the bridge saw posted; one posted by a bridge
/// killed before it could note it is found in the thread by its marker (the question is the
/// agent's own message, marked as a `task.help_needed`), and noted now. The thread is read
/// only for a reply to a message this process did not read itself.
async fn question_answered(
    client: &AmpClient,
    m: &AmpMessage,
    parent: &str,
) -> Result<Option<String>, IntakeError> {
    {
        let recent = client.recent.lock().expect("recent lock");
        if let Some(question) = recent.questions.question(parent) {
            return Ok(Some(question));
        }
        if recent.subject(parent).is_some() {
            // A reply to a message the agent was sent, not to one it posted.
            return Ok(None);
        }
    }
    let thread = client.thread(&m.thread_id).await?;
    let asked = thread
        .iter()
        .find(|t| t.id == parent && t.from_agent.eq_ignore_ascii_case(client.address()))
        .and_then(|t| question_marked(&t.body));
    if let Some(question) = &asked {
        client.note_question(parent, question);
    }
    Ok(asked)
}

/// The Message-ID in the answer marker of a body that asks a question (`task.help_needed`).
fn question_marked(body: &str) -> Option<String> {
    let line = body.trim_end().lines().last()?.trim();
    let id = line
        .strip_prefix("<!-- aamp-bridge ")?
        .strip_suffix(" -->")?;
    let question = format!("<{}.", Intent::TaskHelpNeeded.as_str());
    id.starts_with(&question).then(|| id.to_string())
}

/// A reply to the question posted as `question` (its Message-ID), as a plain reply.
fn answer_to(m: &AmpMessage, question: String) -> crate::inbound::Reply {
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

/// Where an AMP agent's answers go: replies in the task's thread.
#[derive(Clone)]
pub struct AmpReplies {
    client: AmpClient,
}

/// The outbound seam over this system: answers submitted; no attachments, streams, threads
/// or claims (the trait's defaults).
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
        for (name, content_type, bytes) in super::attached_files(&mail.bytes) {
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
    fn a_question_is_known_by_its_marker() {
        let asked = "**Question:** May I?\n- Allow\n\n<!-- aamp-bridge <task.help_needed.0f1e@a.test> -->\n";
        assert_eq!(
            question_marked(asked).as_deref(),
            Some("<task.help_needed.0f1e@a.test>")
        );
        let result = "Done.\n\n<!-- aamp-bridge <task.result.0f1e@a.test> -->";
        assert_eq!(question_marked(result), None);
        assert_eq!(question_marked("**Question:** unmarked"), None);
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
