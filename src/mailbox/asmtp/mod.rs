//! The ASMTP back-end (Agent Simple Mail Transfer Protocol, Robot Networks): an agent's
//! mailbox on an ASMTP operator. Mail is read by keyset catch-up over `GET /mailbox` from a
//! watermark `(created_at, envelope_id)` kept on disk and moved only after every envelope
//! before it was delivered (the journal), then fetched with `GET /messages?ids=` (which marks
//! it read). The operator's WebSocket (`/connect`, push only, no replay) wakes the catch-up;
//! after a dropped connection the catch-up runs again, so nothing pushed meanwhile is missed;
//! while it is down the mailbox is polled. Answers are envelopes in reply (`in_reply_to`,
//! `references`) whose client-supplied id is derived from the bridge's Message-ID and whose
//! body is the same on every attempt, so a resend is a no-op at the operator (its idempotency).
//!
//! The mapping: every envelope to the agent is a task (`subject` → title, `text` parts → its
//! text, `data` parts as JSON below it; the thread's root → Session-Key); `task.result`,
//! `task.help_needed` and `card.response` go back as replies (a structured result also as a
//! `data` part); acks and streams have no ASMTP equivalent and are dropped. The operator
//! stamps `from` from the sender's token, so the sender is believed. TaskId: `asmtp:<id>`.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::intake::{self, DeliverError, Health, IntakeError, Watched};
use super::{Inbound, Mail, MailboxError};
use crate::backoff::Backoff;
use crate::config::AsmtpAccount;
use crate::error::ErrorClass;
use crate::events::Events;
use crate::protocol::{self, AampMessage, Body, RenderedMail};

/// Envelope headers read per catch-up page.
const PAGE: usize = 50;
/// The operator's cap on a request body (the reference cuts the connection past it).
pub const BODY_LIMIT: usize = 1 << 20;
/// The operator's cap on an uploaded file.
pub const FILE_LIMIT: usize = 10 * 1024 * 1024;
/// How much of an answer moved into a file stays in the envelope's text.
const TEXT_KEPT: usize = 32 * 1024;
/// The greatest envelope id: a keyset position just before every envelope of a millisecond.
const LAST_ID: &str = "01ZZZZZZZZZZZZZZZZZZZZZZZZ";

/// A row of `GET /mailbox` (the shape of an `envelope.notify` push frame).
#[derive(Clone, Debug, Deserialize)]
pub struct Header {
    pub id: String,
    pub created_at: i64,
    #[serde(default)]
    pub from: Option<String>,
    /// The envelope it answers (rows of the agent's own envelopes name it).
    #[serde(default)]
    pub in_reply_to: Option<String>,
    /// The envelope's size as the operator estimates it: its content parts' JSON length
    /// over four, rounded up, as the reference operator counts it (a token estimate, not
    /// bytes; older operators leave it out).
    #[serde(default)]
    pub size_hint: Option<u64>,
}

impl Header {
    /// About how many bytes the envelope's content is, from its `size_hint`.
    fn bytes(&self) -> Option<u64> {
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
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub in_reply_to: Option<String>,
    #[serde(default)]
    pub references: Vec<String>,
    #[serde(default)]
    pub content_parts: Vec<Value>,
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

/// Which conversation each envelope of the agent's threads belongs to: the thread's root,
/// for every envelope the agent received or sent. A client that answers with `in_reply_to`
/// alone (the reference CLI's `--in-reply-to`) names only the envelope it answers, often the
/// agent's own reply; this finds the conversation from any envelope of it. Kept in a file of
/// `id root` lines beside the watermark (appended; when it holds [`THREADS_KEPT`], the
/// older half is forgotten and the file written anew).
#[derive(Default)]
pub struct Threads {
    path: Option<PathBuf>,
    roots: std::collections::HashMap<String, String>,
    order: std::collections::VecDeque<String>,
}

/// How many envelopes [`Threads`] remembers.
const THREADS_KEPT: usize = 20_000;

impl Threads {
    /// Loads the file (a missing or damaged one is an empty map).
    pub fn open(path: PathBuf) -> Threads {
        let mut threads = Threads {
            path: Some(path.clone()),
            ..Threads::default()
        };
        if let Ok(text) = std::fs::read_to_string(&path) {
            for line in text.lines() {
                if let Some((id, root)) = line.split_once(' ') {
                    threads.remember(id, root);
                }
            }
        }
        threads
    }

    fn remember(&mut self, id: &str, root: &str) {
        if self
            .roots
            .insert(id.to_string(), root.to_string())
            .is_none()
        {
            self.order.push_back(id.to_string());
        }
        while self.order.len() > THREADS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.roots.remove(&old);
            }
        }
    }

    /// The conversation `chain` (the envelopes answered, oldest first) belongs to: the root
    /// known for the newest of them that is known, else the oldest; `own` when it answers
    /// nothing. Remembered for `own`.
    pub fn root(&mut self, own: &str, chain: &[String]) -> String {
        let root = chain
            .iter()
            .rev()
            .find_map(|id| self.roots.get(id).cloned())
            .or_else(|| chain.first().cloned())
            .unwrap_or_else(|| own.to_string());
        self.note(own, &root);
        root
    }

    fn note(&mut self, id: &str, root: &str) {
        if self.roots.get(id).map(String::as_str) == Some(root) {
            return;
        }
        self.remember(id, root);
        let Some(path) = &self.path else { return };
        let written = if self.order.len() >= THREADS_KEPT {
            // Compact: forget the older half, and write the newer half anew.
            for old in self.order.drain(..THREADS_KEPT / 2) {
                self.roots.remove(&old);
            }
            let keep: Vec<String> = self
                .order
                .iter()
                .map(|id| format!("{id} {}\n", self.roots[id]))
                .collect();
            crate::fsio::write_atomic(path, keep.concat().as_bytes(), 0o600)
        } else {
            use std::io::Write as _;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| writeln!(f, "{id} {root}"))
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, path = %path.display(), "cannot keep the ASMTP thread map");
        }
    }
}

/// The operator's agent API, authenticated with the agent's bearer token.
#[derive(Clone)]
pub struct AsmtpClient {
    http: reqwest::Client,
    account: AsmtpAccount,
    threads: std::sync::Arc<std::sync::Mutex<Threads>>,
    /// Questions the agent sent (`task.help_needed`), by their reply envelope's id, so that
    /// an envelope answering one (its `in_reply_to`) is taken as the answer, never as a task.
    questions: std::sync::Arc<std::sync::Mutex<super::Questions>>,
    /// Rows and envelopes the operator returned that could not be read, for the intake to
    /// report once each.
    unreadable: std::sync::Arc<super::UnreadableLog>,
}

/// How many of the newest inbound envelopes a first start looks at for read ones the agent
/// never answered.
const FIRST_START_READ: usize = 100;

impl AsmtpClient {
    pub fn new(account: AsmtpAccount) -> Result<AsmtpClient, MailboxError> {
        Ok(AsmtpClient {
            http: super::http_client(account.insecure_tls, Some(account.timeout))?,
            account,
            threads: std::sync::Arc::default(),
            questions: std::sync::Arc::default(),
            unreadable: std::sync::Arc::default(),
        })
    }

    /// Keeps the agent's questions in `path`, so replies to them are known after a restart.
    pub fn with_questions(mut self, path: PathBuf) -> AsmtpClient {
        self.questions = std::sync::Arc::new(std::sync::Mutex::new(super::Questions::open(path)));
        self
    }

    /// Keeps the thread map (which conversation each envelope belongs to) in `path`.
    pub fn with_threads(mut self, path: PathBuf) -> AsmtpClient {
        self.threads = std::sync::Arc::new(std::sync::Mutex::new(Threads::open(path)));
        self
    }

    pub fn handle(&self) -> &str {
        &self.account.handle
    }

    /// The bearer token every call (and the push socket) sends.
    pub fn secret(&self) -> &crate::config::Secret {
        &self.account.token
    }

    /// An envelope as the intake hands it on: the answer to a question the agent asked (by
    /// the operator's own reply link, `in_reply_to`), or else a task, in the conversation its
    /// thread belongs to.
    fn inbound(&self, e: &AsmtpEnvelope) -> Option<Mail> {
        let question = e.in_reply_to.as_deref().and_then(|parent| {
            self.questions
                .lock()
                .expect("questions lock")
                .question(parent)
        });
        let root = self
            .threads
            .lock()
            .expect("threads lock")
            .root(&e.id, &thread_of(e));
        let inbound = to_inbound_in(e, self.handle(), &root)?;
        let Some(question) = question else {
            return Some(Mail::Aamp(Box::new(inbound)));
        };
        let text = match &inbound.message.body {
            Body::Dispatch(d) => d.body_text.clone(),
            _ => String::new(),
        };
        Some(Mail::Reply(crate::inbound::Reply {
            email_id: e.id.clone(),
            from: e.from.clone(),
            message_id: inbound.message.envelope.message_id.clone(),
            in_reply_to: Some(question),
            references: Vec::new(),
            text,
            sender_check: inbound.sender_check.clone(),
            auto_submitted: inbound.view.header("Auto-Submitted").is_some(),
        }))
    }

    /// The envelope of `header`, too large (`size` bytes) to fetch, as a task answered
    /// rejected, saying why; `None` when the row names no sender.
    fn refused(&self, header: &Header, size: u64) -> Option<Mail> {
        let envelope = AsmtpEnvelope {
            id: header.id.clone(),
            from: header.from.clone()?,
            to: vec![self.handle().to_string()],
            subject: None,
            in_reply_to: None,
            references: Vec::new(),
            content_parts: Vec::new(),
        };
        let Some(Mail::Aamp(mut inbound)) = self.inbound(&envelope) else {
            return None;
        };
        inbound.refused = Some(format!(
            "the task is about {size} bytes, more than this agent reads from one ASMTP envelope ({} bytes, max_message_bytes): send large content as a file part, which is passed on as its link",
            self.account.max_message_bytes
        ));
        Some(Mail::Aamp(inbound))
    }

    /// Notes that the envelope `envelope_id` asks the question `message_id`.
    fn asked(&self, envelope_id: &str, message_id: &str) {
        self.questions
            .lock()
            .expect("questions lock")
            .asked(envelope_id, message_id);
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, MailboxError> {
        let mut url = self.account.url.clone();
        url.set_path(&format!(
            "{}/{}",
            url.path().trim_end_matches('/'),
            path.trim_start_matches('/')
        ));
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let mut request = self
            .http
            .request(method, url.clone())
            .bearer_auth(self.account.token.value());
        if let Some(body) = body {
            request = request.json(body);
        }
        super::fetch_json(request, url.as_str()).await
    }

    /// One page of the inbound mailbox's headers (`GET /mailbox`): `newest_first` or oldest
    /// first, only unread ones when `unread`, after the keyset position `after`; and whether
    /// more follow.
    async fn mailbox_page(
        &self,
        newest_first: bool,
        unread: bool,
        after: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<(Vec<Header>, bool), MailboxError> {
        self.rows("in", newest_first, unread.then_some(true), after, limit)
            .await
    }

    /// One page of rows of the mailbox's `direction` (`in`: the agent's inbound feed;
    /// `out`: what the agent sent), read (`Some(false)`) or unread (`Some(true)`) ones only.
    async fn rows(
        &self,
        direction: &str,
        newest_first: bool,
        unread: Option<bool>,
        after: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<(Vec<Header>, bool), MailboxError> {
        let mut query = vec![
            ("direction", direction.to_string()),
            (
                "order",
                if newest_first { "desc" } else { "asc" }.to_string(),
            ),
            ("limit", limit.to_string()),
        ];
        if let Some(unread) = unread {
            query.push(("unread", unread.to_string()));
        }
        if let Some((created_at, id)) = after {
            query.push(("after_created_at", created_at.to_string()));
            query.push(("after_envelope_id", id.to_string()));
        }
        let value = self
            .call(reqwest::Method::GET, "mailbox", &query, None)
            .await?;
        // A row the bridge cannot read costs that row only.
        let (headers, bad) =
            super::decode_each::<Header>(&value["envelope_headers"], "an ASMTP mailbox row")?;
        self.unreadable.note(bad);
        Ok((headers, !value["next_cursor"].is_null()))
    }

    /// One page of envelope headers after `after` (oldest first), and whether more follow.
    pub async fn headers_after(
        &self,
        after: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<(Vec<Header>, bool), MailboxError> {
        self.mailbox_page(false, false, after, limit).await
    }

    /// The unread envelopes' rows, oldest first: a first start's backlog.
    pub async fn unread_headers(&self) -> Result<Vec<Header>, MailboxError> {
        let mut ids = Vec::new();
        let mut after: Option<(i64, String)> = None;
        loop {
            let position = after.as_ref().map(|(at, id)| (*at, id.as_str()));
            let (headers, more) = self.mailbox_page(false, true, position, 1000).await?;
            let Some(last) = headers.last() else {
                return Ok(ids);
            };
            after = Some((last.created_at, last.id.clone()));
            ids.extend(headers);
            if !more {
                return Ok(ids);
            }
        }
    }

    /// Read envelopes among the newest `limit` of the agent's inbound feed that no envelope
    /// the agent sent (among its newest 1000) answers, oldest first: at a first start, the
    /// tasks a person only looked at (fetching one marks it read).
    pub async fn read_unanswered(&self, limit: usize) -> Result<Vec<Header>, MailboxError> {
        let (read, _) = self.rows("in", true, Some(false), None, limit).await?;
        if read.is_empty() {
            return Ok(read);
        }
        let (sent, _) = self.rows("out", true, None, None, 1000).await?;
        let answered: std::collections::HashSet<&str> = sent
            .iter()
            .filter_map(|h| h.in_reply_to.as_deref())
            .collect();
        let mut waiting: Vec<Header> = read
            .iter()
            .filter(|h| !answered.contains(h.id.as_str()))
            .cloned()
            .collect();
        waiting.reverse();
        Ok(waiting)
    }

    /// The newest envelope header, where a first start begins.
    pub async fn newest(&self) -> Result<Option<Header>, MailboxError> {
        let (headers, _) = self.mailbox_page(true, false, None, 1).await?;
        Ok(headers.into_iter().next())
    }

    /// Envelope bodies by id (at most 100); fetching marks them read.
    pub async fn fetch(&self, ids: &[String]) -> Result<Vec<AsmtpEnvelope>, MailboxError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let value = self
            .call(
                reqwest::Method::GET,
                "messages",
                &[("ids", ids.join(","))],
                None,
            )
            .await?;
        // An envelope the bridge cannot read costs that envelope only: the intake skips it
        // (its row is passed as one the operator would not return) and reports it once.
        let (envelopes, bad) =
            super::decode_each::<AsmtpEnvelope>(&value["envelopes"], "an ASMTP envelope")?;
        self.unreadable.note(bad);
        Ok(envelopes)
    }

    /// Reports what could not be read since the last report.
    pub fn report_unreadable(&self, agent: &str, events: &Events) {
        self.unreadable.report(agent, "ASMTP", events);
    }

    /// Uploads a file (`POST /files`, multipart); its id, for a content part's `file_id`.
    pub async fn upload(
        &self,
        filename: &str,
        content_type: &str,
        bytes: &[u8],
    ) -> Result<String, MailboxError> {
        let boundary = format!("aamp-bridge-{}", uuid::Uuid::new_v4().simple());
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: {content_type}\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(bytes);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let mut url = self.account.url.clone();
        url.set_path(&format!("{}/files", url.path().trim_end_matches('/')));
        let request = self
            .http
            .post(url.clone())
            .bearer_auth(self.account.token.value())
            .header(
                reqwest::header::CONTENT_TYPE,
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body);
        let value = super::fetch_json(request, url.as_str()).await?;
        value["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| MailboxError::Protocol {
                what: "the ASMTP upload answer".into(),
                detail: "no file id".into(),
            })
    }

    /// Posts an envelope; a resend of the same id and body is accepted as a no-op.
    pub async fn post(&self, envelope: &Value) -> Result<(), MailboxError> {
        self.call(reqwest::Method::POST, "messages", &[], Some(envelope))
            .await
            .map(|_| ())
    }

    /// The push socket's URL (`/connect`, ws or wss).
    fn connect_url(&self) -> String {
        let mut url = self.account.url.clone();
        let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
        let _ = url.set_scheme(scheme);
        url.set_path(&format!("{}/connect", url.path().trim_end_matches('/')));
        url.to_string()
    }
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
fn thread_of(e: &AsmtpEnvelope) -> Vec<String> {
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
fn to_inbound_in(e: &AsmtpEnvelope, me: &str, root: &str) -> Option<Inbound> {
    let mut text = Vec::new();
    let (mut hop_count, mut is_answer) = (None, false);
    for part in &e.content_parts {
        if let Some(mark) = part["data"].get(super::FOREIGN_MARK) {
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
    super::ForeignTask {
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

/// The watermark file.
pub type WatermarkFile = crate::fsio::JsonFile<Watermark>;

/// The operator's mailbox for [`intake::watch`]: a catch-up from the watermark.
struct AsmtpWatched<'a, D> {
    client: &'a AsmtpClient,
    watermark: &'a WatermarkFile,
    deliver: D,
    push_up: &'a std::sync::atomic::AtomicBool,
    poll_interval: Duration,
    agent: &'a str,
    events: &'a Events,
}

impl<D: FnMut(Mail) -> Result<(), DeliverError> + Send> Watched for AsmtpWatched<'_, D> {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        let read = catch_up(self.client, self.watermark, &mut self.deliver).await;
        self.client.report_unreadable(self.agent, self.events);
        read.map(|()| 0)
    }

    fn next_read(&mut self, _taken: usize) -> Duration {
        if self.push_up.load(std::sync::atomic::Ordering::SeqCst) {
            // A safety catch-up now and then even with push up.
            Duration::from_secs(60)
        } else {
            self.poll_interval
        }
    }

    fn address(&self) -> String {
        self.client.handle().to_string()
    }
}

/// Reads the mailbox until `stop`: catch-up at start, on every push frame, after every
/// reconnection, and every `poll_interval_secs` while the push socket is down.
pub async fn run_intake(
    name: String,
    client: AsmtpClient,
    link: super::link::Link,
    watermark: WatermarkFile,
    deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
    events: Events,
    stop: CancellationToken,
) {
    let poll_interval = client.account.poll_interval;
    let (wake_tx, mut wake_rx) = mpsc::channel::<()>(1);
    let push_up = std::sync::atomic::AtomicBool::new(false);
    let push = async {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        // A replaced token: the socket opened with the old one is closed and push connects
        // again with the new one at once.
        let mut replaced = client.account.token.changes();
        loop {
            let result = run_push(&client, &wake_tx, &stop, &mut replaced, || {
                push_up.store(true, std::sync::atomic::Ordering::SeqCst);
                link.push("websocket");
                // Connected: catch up on what came while the socket was down.
                let _ = wake_tx.try_send(());
                tracing::info!("ASMTP push connected");
            })
            .await;
            if push_up.swap(false, std::sync::atomic::Ordering::SeqCst) {
                // It was up: a drop after that starts the waits over.
                backoff.reset();
            }
            link.push("polling");
            if stop.is_cancelled() {
                return;
            }
            if matches!(&result, Ok(Some(why)) if why == REPLACED) {
                tracing::info!(
                    "the token was replaced; ASMTP push connects again with the new one"
                );
                continue;
            }
            let delay = backoff.next_delay();
            match result {
                Ok(why) => tracing::info!(
                    closed = why.as_deref().unwrap_or("without a close frame"),
                    retry_in_s = delay.as_secs(),
                    "the ASMTP operator closed the push connection; reconnecting"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "ASMTP push unavailable")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                Ok(()) = replaced.changed() => backoff.reset(),
                _ = stop.cancelled() => return,
            }
        }
    };
    let watch_events = events;
    let reading = async {
        let health = Health::new(
            &link,
            "the ASMTP operator",
            client.handle().to_string(),
            "token_file",
        )
        .with_secret(client.account.token.clone())
        .retry_refused_every(intake::KEY_REFUSED_RETRY);
        let mut watched = AsmtpWatched {
            client: &client,
            watermark: &watermark,
            deliver,
            push_up: &push_up,
            poll_interval,
            agent: &name,
            events: &watch_events,
        };
        intake::watch(
            &name,
            events,
            health,
            &mut watched,
            Some(&mut wake_rx),
            &stop,
        )
        .await;
    };
    tokio::join!(push, reading);
}

/// Reads every envelope after the watermark, a page at a time: each page is delivered, then
/// the watermark is saved after it.
async fn catch_up(
    client: &AsmtpClient,
    watermark: &WatermarkFile,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<(), IntakeError> {
    let mut mark = match watermark.load()? {
        Some(w) => Some(w),
        None => {
            // First start: new work is what arrives from the newest envelope on; the unread
            // envelopes already waiting are the backlog, answered first (unless the mailbox
            // says skip_backlog).
            // The newest first: what arrives after it is read by the catch-up, what arrives
            // while the unread are listed may be in both (the journal knows it the second time).
            let mut w = client
                .newest()
                .await?
                .map(|h| Watermark {
                    created_at: h.created_at,
                    ids_at: vec![h.id.clone()],
                    envelope_id: h.id,
                    backlog: Vec::new(),
                })
                .unwrap_or_default();
            if !client.account.skip_backlog {
                // Those over the size limit are answered now, never fetched.
                let limit = client.account.max_message_bytes;
                // The unread, then those read before the first start (a person looked at
                // them) that the agent never answered.
                let mut waiting = client.unread_headers().await?;
                for header in client.read_unanswered(FIRST_START_READ).await? {
                    if !waiting.iter().any(|h| h.id == header.id) {
                        waiting.push(header);
                    }
                }
                for header in waiting {
                    match header.bytes().filter(|size| *size > limit) {
                        Some(size) => {
                            if let Some(mail) = client.refused(&header, size) {
                                deliver(mail).map_err(IntakeError::Deliver)?;
                            }
                        }
                        None => w.backlog.push(header.id),
                    }
                }
            }
            if !w.backlog.is_empty() {
                tracing::info!(
                    unread = w.backlog.len(),
                    "first start: answering the unread envelopes already waiting"
                );
            }
            watermark.save(&w)?;
            Some(w)
        }
    };
    // The backlog, a page at a time; each page leaves the file once the journal holds it.
    while let Some(w) = mark.as_mut().filter(|w| !w.backlog.is_empty()) {
        let page: Vec<String> = w.backlog.iter().take(PAGE.min(100)).cloned().collect();
        let bodies = client.fetch(&page).await?;
        for id in &page {
            match bodies
                .iter()
                .find(|b| &b.id == id)
                .and_then(|e| client.inbound(e))
            {
                Some(mail) => deliver(mail).map_err(IntakeError::Deliver)?,
                None => {
                    tracing::warn!(%id, "a backlog envelope that cannot be read as a task; skipped")
                }
            }
        }
        w.backlog.drain(..page.len());
        watermark.save(w)?;
    }
    if mark.as_ref().is_some_and(|w| w.envelope_id.is_empty()) {
        mark = None;
    }
    // The first page starts just before the watermark's millisecond (an envelope of the same
    // millisecond may sort before the one read last); what was delivered there is skipped.
    let mut after: Option<(i64, String)> = mark
        .as_ref()
        .map(|w| (w.created_at - 1, LAST_ID.to_string()));
    loop {
        let position = after.as_ref().map(|(at, id)| (*at, id.as_str()));
        let (headers, more) = client.headers_after(position, PAGE).await?;
        if headers.is_empty() {
            return Ok(());
        }
        let delivered = |h: &Header| {
            mark.as_ref().is_some_and(|w| {
                h.created_at < w.created_at
                    || (h.created_at == w.created_at
                        && (w.ids_at.contains(&h.id) || w.envelope_id == h.id))
            })
        };
        let fresh: Vec<&Header> = headers.iter().filter(|h| !delivered(h)).collect();
        // An envelope over the mailbox's size limit is not fetched: one message must not
        // cost the bridge its size several times over in memory. It is answered rejected.
        let limit = client.account.max_message_bytes;
        let too_large = |h: &Header| h.bytes().is_some_and(|size| size > limit);
        let ids: Vec<String> = fresh
            .iter()
            .filter(|h| !too_large(h))
            .map(|h| h.id.clone())
            .collect();
        let bodies = client.fetch(&ids).await?;
        for header in &fresh {
            if too_large(header) {
                let size = header.bytes().unwrap_or_default();
                tracing::warn!(id = %header.id, size, limit, "an ASMTP envelope over max_message_bytes; not fetched, answered rejected");
                match client.refused(header, size) {
                    Some(mail) => deliver(mail).map_err(IntakeError::Deliver)?,
                    None => {
                        tracing::warn!(id = %header.id, "an oversized envelope without a sender; skipped")
                    }
                }
                continue;
            }
            match bodies.iter().find(|b| b.id == header.id) {
                Some(envelope) => match client.inbound(envelope) {
                    Some(mail) => deliver(mail).map_err(IntakeError::Deliver)?,
                    None => {
                        tracing::warn!(id = %header.id, "an ASMTP envelope that cannot be read as a task; skipped")
                    }
                },
                None => {
                    tracing::warn!(id = %header.id, "the operator listed an envelope it would not return; skipped")
                }
            }
        }
        let last = headers.last().expect("not empty");
        let mut next = match mark.take() {
            Some(w) if w.created_at == last.created_at => w,
            _ => Watermark {
                created_at: last.created_at,
                ..Watermark::default()
            },
        };
        next.envelope_id = last.id.clone();
        for h in headers.iter().filter(|h| h.created_at == last.created_at) {
            if !next.ids_at.contains(&h.id) {
                next.ids_at.push(h.id.clone());
            }
        }
        watermark.save(&next)?;
        after = Some((last.created_at, last.id.clone()));
        mark = Some(next);
        if !more {
            return Ok(());
        }
    }
}

/// Why [`run_push`] closed a socket itself: its token was replaced.
const REPLACED: &str = "closed by the bridge: the token was replaced";

/// One push connection: every `envelope.notify` frame wakes the catch-up; other frames
/// (`monitor.fact`, for senders that asked) are let go. `Ok` when the operator closed it (with
/// its close code and reason, as the reference sends `1001 operator shutting down` when it
/// stops) or `stop` was cancelled.
async fn run_push(
    client: &AsmtpClient,
    wake: &mpsc::Sender<()>,
    stop: &CancellationToken,
    replaced: &mut tokio::sync::watch::Receiver<u64>,
    connected: impl FnOnce(),
) -> Result<Option<String>, MailboxError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::HeaderValue;
    use tokio_tungstenite::tungstenite::Message;
    let push_error = |detail: String, class: ErrorClass| MailboxError::Push { detail, class };
    let url = client.connect_url();
    replaced.borrow_and_update();
    let mut request = url.as_str().into_client_request().map_err(|e| {
        push_error(
            format!("bad WebSocket URL {url}: {e}"),
            ErrorClass::Permanent,
        )
    })?;
    request.headers_mut().insert(
        "Authorization",
        HeaderValue::from_str(&format!("Bearer {}", client.account.token.value())).map_err(
            |_| {
                push_error(
                    "the token cannot go in a header".into(),
                    ErrorClass::Permanent,
                )
            },
        )?,
    );
    let (mut socket, _) = tokio::select! {
        r = tokio_tungstenite::connect_async(request) => r.map_err(|e| push_error(e.to_string(), ErrorClass::Transient))?,
        _ = stop.cancelled() => return Ok(None),
    };
    connected();
    loop {
        let frame = tokio::select! {
            f = socket.next() => f,
            Ok(()) = replaced.changed() => {
                let _ = socket.close(None).await;
                return Ok(Some(REPLACED.into()));
            }
            _ = stop.cancelled() => return Ok(None),
        };
        match frame {
            None => return Ok(None),
            Some(Err(e)) => return Err(push_error(e.to_string(), ErrorClass::Transient)),
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
                if value["op"] == "envelope.notify" {
                    let _ = wake.try_send(());
                }
            }
            Some(Ok(Message::Close(frame))) => {
                return Ok(frame.map(|f| {
                    let code = u16::from(f.code);
                    let reason: String = f.reason.chars().filter(|c| !c.is_control()).collect();
                    format!("{code} {reason}")
                }))
            }
            Some(Ok(_)) => {}
        }
    }
}

/// Whether `mail` is a question to the dispatcher (`task.help_needed`).
fn mail_is_question(mail: &RenderedMail) -> bool {
    protocol::rfc5322::parse_raw(&mail.bytes)
        .and_then(|view| AampMessage::parse(&view).ok())
        .is_some_and(|m| matches!(m.body, Body::HelpNeeded(_)))
}

/// Where an ASMTP agent's answers go: reply envelopes.
#[derive(Clone)]
pub struct AsmtpReplies {
    client: AsmtpClient,
}

/// The outbound seam over this system: answers submitted; no attachments, streams, threads
/// or claims (the trait's defaults).
impl crate::backend::Backend for AsmtpReplies {
    async fn submit(&self, mail: &RenderedMail) -> Result<(), crate::backend::BackendError> {
        Ok(AsmtpReplies::submit(self, mail).await?)
    }
}

impl AsmtpReplies {
    pub fn new(client: AsmtpClient) -> AsmtpReplies {
        AsmtpReplies { client }
    }

    pub fn secret(&self) -> &crate::config::Secret {
        self.client.secret()
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
        let mut parts = Vec::new();
        match &msg.body {
            Body::Result(r) => {
                let mut text = r.output.clone();
                if let Some(error) = r.error.as_deref().filter(|e| !e.is_empty()) {
                    if !text.is_empty() {
                        text.push_str("\n\n");
                    }
                    text.push_str(&format!("{}: {error}", r.status.as_str()));
                }
                if text.is_empty() {
                    text = format!("({})", r.status.as_str());
                }
                parts.push(json!({"type": "text", "text": text}));
                let mut data = json!({"status": r.status.as_str()});
                if let Some(fields) = &r.structured_result {
                    data["structuredResult"] = fields.clone();
                }
                data[super::FOREIGN_MARK] = json!({"answer": msg.intent().as_str()});
                parts.push(json!({"type": "data", "data": data}));
            }
            Body::HelpNeeded(h) => {
                let mut text = format!("Question: {}", h.question);
                for option in &h.suggested_options {
                    text.push_str(&format!("\n- {option}"));
                }
                parts.push(json!({"type": "text", "text": text}));
                parts.push(json!({"type": "data", "data": {super::FOREIGN_MARK: {"answer": msg.intent().as_str()}}}));
            }
            Body::CardResponse { summary, text } => {
                parts.push(json!({"type": "text", "text": format!("{summary}\n\n{text}")}));
                parts.push(json!({"type": "data", "data": {super::FOREIGN_MARK: {"answer": msg.intent().as_str()}}}));
            }
            _ => return None,
        }
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
        for (name, content_type, bytes) in super::attached_files(&mail.bytes) {
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
    async fn fit(&self, mut envelope: Value) -> Result<Value, MailboxError> {
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

fn serialized_len(envelope: &Value) -> usize {
    serde_json::to_vec(envelope).map_or(usize::MAX, |v| v.len())
}

fn too_large(envelope: &Value) -> MailboxError {
    MailboxError::TooLarge {
        what: "the answer envelope".into(),
        server: "the ASMTP operator".into(),
        bytes: serialized_len(envelope),
        limit: BODY_LIMIT,
    }
}

/// The start of `text`, at most `max` bytes, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests;
