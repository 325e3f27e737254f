//! The operator's agent API, authenticated with the agent's bearer token, and the thread map
//! that finds an envelope's conversation.

use std::path::PathBuf;

use serde_json::Value;

use crate::config::AsmtpAccount;
use crate::events::Events;
use crate::mailbox::{Mail, MailboxError};
use crate::protocol::Body;

use super::wire::{thread_of, to_inbound_in, AsmtpEnvelope, Header};

/// Which conversation each envelope of the agent's threads belongs to: the thread's root,
/// for every envelope the agent received or sent. A client that answers with `in_reply_to`
/// alone (the reference CLI's `--in-reply-to`) names only the envelope it answers, often the
/// agent's own reply; this finds the conversation from any envelope of it. Kept in a file of
/// `id root` lines beside the watermark (appended; when it holds [`THREADS_KEPT`], the
/// older half is forgotten and the file written anew).
#[derive(Default)]
pub struct Threads {
    pub(super) path: Option<PathBuf>,
    pub(super) roots: std::collections::HashMap<String, String>,
    pub(super) order: std::collections::VecDeque<String>,
}

/// How many envelopes [`Threads`] remembers.
pub(super) const THREADS_KEPT: usize = 20_000;

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

    pub(super) fn remember(&mut self, id: &str, root: &str) {
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

    pub(super) fn note(&mut self, id: &str, root: &str) {
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
    pub(super) http: reqwest::Client,
    pub(super) account: AsmtpAccount,
    pub(super) threads: std::sync::Arc<std::sync::Mutex<Threads>>,
    /// Questions the agent sent (`task.help_needed`), by their reply envelope's id, so that
    /// an envelope answering one (its `in_reply_to`) is taken as the answer, never as a task.
    pub(super) questions: std::sync::Arc<std::sync::Mutex<crate::mailbox::Questions>>,
    /// Rows and envelopes the operator returned that could not be read, for the intake to
    /// report once each.
    pub(super) unreadable: std::sync::Arc<crate::mailbox::UnreadableLog>,
}

/// How many of the newest inbound envelopes a first start looks at for read ones the agent
/// never answered.
pub(super) const FIRST_START_READ: usize = 100;

impl AsmtpClient {
    pub fn new(account: AsmtpAccount) -> Result<AsmtpClient, MailboxError> {
        Ok(AsmtpClient {
            http: crate::mailbox::http_client(account.insecure_tls, Some(account.timeout))?,
            account,
            threads: std::sync::Arc::default(),
            questions: std::sync::Arc::default(),
            unreadable: std::sync::Arc::default(),
        })
    }

    /// Keeps the agent's questions in `path`, so replies to them are known after a restart.
    pub fn with_questions(mut self, path: PathBuf) -> AsmtpClient {
        self.questions =
            std::sync::Arc::new(std::sync::Mutex::new(crate::mailbox::Questions::open(path)));
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
    pub(super) fn inbound(&self, e: &AsmtpEnvelope) -> Option<Mail> {
        if let Some(seen) = e.oversized {
            // Its text was over the cap and never read whole (issue 43 item 2): answered
            // rejected with the size seen, as one whose row said it was too large.
            let limit = self.account.max_message_bytes;
            tracing::warn!(id = %e.id, seen, limit, "an ASMTP envelope over max_message_bytes; answered rejected");
            return self.rejected(
                &e.id,
                &e.from,
                format!(
                    "the task is over the {} cap of one ASMTP envelope (max_message_bytes): at least {seen} bytes, never read whole; send large content as a file part, which is passed on as its link",
                    crate::mailbox::error::cap_words(limit)
                ),
            );
        }
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
    pub(super) fn refused(&self, header: &Header, size: u64) -> Option<Mail> {
        self.rejected(
            &header.id,
            header.from.as_deref()?,
            format!(
                "the task is about {size} bytes, more than this agent reads from one ASMTP envelope ({} bytes, max_message_bytes): send large content as a file part, which is passed on as its link",
                self.account.max_message_bytes
            ),
        )
    }

    /// The envelope `id` from `from`, without its content, as a task answered rejected for
    /// `why`.
    fn rejected(&self, id: &str, from: &str, why: String) -> Option<Mail> {
        let envelope = AsmtpEnvelope {
            id: id.to_string(),
            from: from.to_string(),
            to: vec![self.handle().to_string()],
            subject: None,
            in_reply_to: None,
            references: Vec::new(),
            content_parts: Vec::new(),
            oversized: None,
        };
        let Some(Mail::Aamp(mut inbound)) = self.inbound(&envelope) else {
            return None;
        };
        inbound.refused = Some(why);
        Some(Mail::Aamp(inbound))
    }

    /// Notes that the envelope `envelope_id` asks the question `message_id`.
    pub(super) fn asked(&self, envelope_id: &str, message_id: &str) {
        self.questions
            .lock()
            .expect("questions lock")
            .asked(envelope_id, message_id);
    }

    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, MailboxError> {
        let (request, url) = self.request(method, path, query, body);
        crate::mailbox::fetch_json(request, url.as_str()).await
    }

    /// A call whose answer carries envelopes' content: each string is kept up to the
    /// message cap, counted while it is read, and a longer one emptied and sized (issue 43
    /// item 2: a row's `size_hint` may understate the envelope, or be missing).
    async fn call_skimmed(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<crate::mailbox::body::Skimmed, MailboxError> {
        let (request, url) = self.request(reqwest::Method::GET, path, query, None);
        crate::mailbox::body::send_skimmed(request, url.as_str(), self.account.max_message_bytes)
            .await
    }

    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> (reqwest::RequestBuilder, url::Url) {
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
        (request, url)
    }

    /// The agent the token belongs to, as the operator names it (`GET /agents/me`, its
    /// `canonical_handle`, as the reference operator answers); `None` when the operator has no
    /// such route (404) or does not name one.
    pub async fn token_owner(&self) -> Result<Option<String>, MailboxError> {
        match self
            .call(reqwest::Method::GET, "agents/me", &[], None)
            .await
        {
            Ok(me) => Ok(me["canonical_handle"].as_str().map(str::to_string)),
            Err(MailboxError::Http { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One page of the inbound mailbox's headers (`GET /mailbox`): `newest_first` or oldest
    /// first, only unread ones when `unread`, after the keyset position `after`; and whether
    /// more follow.
    pub(super) async fn mailbox_page(
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
    pub(super) async fn rows(
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
        let (headers, bad) = crate::mailbox::decode_each::<Header>(
            &value["envelope_headers"],
            "an ASMTP mailbox row",
        )?;
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
        let mut answer = self
            .call_skimmed("messages", &[("ids", ids.join(","))])
            .await?;
        // An envelope the bridge cannot read costs that envelope only: the intake skips it
        // (its row is passed as one the operator would not return) and reports it once.
        let (envelopes, bad) = crate::mailbox::decode_each::<AsmtpEnvelope>(
            &answer.list("/envelopes"),
            "an ASMTP envelope",
        )?;
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
        let mut url = self.account.url.clone();
        url.set_path(&format!("{}/files", url.path().trim_end_matches('/')));
        let request = self
            .http
            .post(url.clone())
            .bearer_auth(self.account.token.value());
        let request = crate::mailbox::with_file(request, filename, content_type, bytes);
        let value = crate::mailbox::fetch_json(request, url.as_str()).await?;
        crate::mailbox::required_text(&value["id"], "the ASMTP upload answer", "file id")
    }

    /// Posts an envelope; a resend of the same id and body is accepted as a no-op.
    pub async fn post(&self, envelope: &Value) -> Result<(), MailboxError> {
        self.call(reqwest::Method::POST, "messages", &[], Some(envelope))
            .await
            .map(|_| ())
            .map_err(|e| refused_recipient(e, envelope))
    }

    /// The push socket's URL (`/connect`, ws or wss).
    pub(super) fn connect_url(&self) -> String {
        let mut url = self.account.url.clone();
        let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
        let _ = url.set_scheme(scheme);
        url.set_path(&format!("{}/connect", url.path().trim_end_matches('/')));
        url.to_string()
    }
}

/// A 404 to a posted envelope is the operator refusing its recipients (the reference answers
/// every refusal with 404, never 403, so as not to tell whether a handle exists): said as
/// that, not as a missing path, and permanent.
pub(super) fn refused_recipient(e: MailboxError, envelope: &Value) -> MailboxError {
    match e {
        MailboxError::Http { status: 404, .. } => {
            let to: Vec<&str> = ["to", "cc"]
                .iter()
                .filter_map(|k| envelope[k].as_array())
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            MailboxError::Service {
                class: crate::error::ErrorClass::Permanent,
                detail: format!(
                    "the ASMTP operator refused the envelope to {} (HTTP 404): the recipient blocked this agent, does not list it on its allowlist, or does not exist",
                    to.join(", ")
                ),
            }
        }
        other => other,
    }
}
