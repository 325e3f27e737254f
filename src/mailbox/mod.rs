//! Mail in and out: the only code that knows JMAP, SMTP and the shape of a mail. It turns new
//! Inbox mail addressed to an agent into parsed AAMP messages for `dispatch`, and sends the
//! AAMP messages `dispatch` hands back.

pub mod amp;
pub mod asmtp;
pub mod auth;
mod error;
pub mod helper;
pub mod intake;
pub mod jmap;
pub mod link;
pub mod push;
pub mod received;
pub mod smtp;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

pub use error::MailboxError;
use jmap::{Email, JmapClient};
use smtp::SmtpSender;

use crate::config::{Account, PushTransport};
use crate::error::Classify;
pub use crate::inbound::{Attachment, Inbound, Mail, Reply};
use crate::protocol::{self, AampMessage};

/// One read of an ASMTP or AMP mailbox, as `doctor` and `init` check one.
pub struct Probe {
    /// `ASMTP` or `AMP`.
    pub system: &'static str,
    /// The agent's address there.
    pub address: String,
    /// What was read, or why not.
    pub result: Result<String, MailboxError>,
    /// What to check when the read failed: for a refused credential, and otherwise.
    pub auth_fix: &'static str,
    pub other_fix: &'static str,
}

/// Reads the named mailbox once when it is an ASMTP or AMP one; `None` for an AAMP mailbox
/// (checked over JMAP and SMTP instead); a config error when its settings do not hold.
pub async fn probe_other_kind(
    config: &crate::config::LoadedConfig,
    name: &str,
) -> Option<Result<Probe, crate::config::ConfigError>> {
    if config.is_asmtp(name) {
        let account = match config.asmtp_account(name) {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        let (url, address) = (account.url.clone(), account.handle.clone());
        let result = match asmtp::AsmtpClient::new(account) {
            Ok(client) => client.newest().await,
            Err(e) => Err(e),
        };
        return Some(Ok(Probe {
            system: "ASMTP",
            address,
            result: result.map(|_| format!("read the agent's mailbox at {url}")),
            auth_fix: "check token_file: the operator did not accept the token",
            other_fix: "check asmtp_url and that the operator is running",
        }));
    }
    if config.is_amp(name) {
        let account = match config.amp_account(name) {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        let (url, address) = (account.url.clone(), account.address.clone());
        let result = match amp::AmpClient::new(account) {
            Ok(client) => client.unread().await,
            Err(e) => Err(e),
        };
        return Some(Ok(Probe {
            system: "AMP",
            address,
            result: result.map(|m| {
                format!(
                    "read the agent's inbox at {url} ({} unread); AMP has no push: polling",
                    m.len()
                )
            }),
            auth_fix: "check api_key_file and agent_id (the key's user must own the agent)",
            other_fix: "check amp_url and that the broker is running",
        }));
    }
    None
}

/// A message from a mailbox system without AAMP headers (ASMTP, AMP), as a task for the agent:
/// a `task.dispatch` built from its parts, then taken through the same path as mail (rendered,
/// read back), so the journal stores and re-reads it like any other. `None` when it does not
/// survive that trip (not seen in practice; the intake skips it).
pub struct ForeignTask<'a> {
    /// The message's id in its system (the journal's email id).
    pub id: &'a str,
    pub task_id: String,
    /// The journal's key for it, `<id@system>`.
    pub message_id: String,
    pub from: &'a str,
    pub to: &'a str,
    pub title: &'a str,
    pub body: String,
    pub session_key: String,
    /// Why the sender is believed (the system stamps it).
    pub believed_because: &'static str,
    /// How many agents passed this task on before (the system's own metadata carries it).
    pub hop_count: Option<u32>,
    /// The message is an agent bridge's answer (it carries the bridge's answer marker): it is
    /// marked `Auto-Submitted`, so it never starts a task, and two agents that allow each
    /// other do not answer each other's answers forever.
    pub is_answer: bool,
}

/// The AMP/ASMTP metadata key under which the bridge marks its answers and reads hop counts
/// (`{"aampBridge": {"answer": INTENT}}`, `{"aampBridge": {"hopCount": N}}`).
pub const FOREIGN_MARK: &str = "aampBridge";

impl ForeignTask<'_> {
    pub fn into_inbound(self) -> Option<Inbound> {
        let title = if self.title.trim().is_empty() {
            self.body
                .lines()
                .next()
                .unwrap_or("a message")
                .chars()
                .take(120)
                .collect()
        } else {
            self.title.to_string()
        };
        let mut msg = crate::protocol::AampMessage {
            envelope: crate::protocol::Envelope {
                version: crate::protocol::VERSION.into(),
                task_id: self.task_id,
                from: self.from.to_string(),
                to: vec![self.to.to_string()],
                message_id: self.message_id,
                subject: String::new(),
                in_reply_to: None,
                references: vec![],
                received_body: None,
            },
            body: crate::protocol::Body::Dispatch(crate::protocol::Dispatch {
                title,
                body_text: self.body,
                session_key: Some(self.session_key),
                hop_count: self.hop_count,
                ..crate::protocol::Dispatch::default()
            }),
        };
        msg.envelope.subject = msg.subject();
        let rendered = crate::protocol::rfc5322::render(&msg, SystemTime::now());
        let mut view = crate::protocol::rfc5322::parse_raw(&rendered.bytes)?;
        if self.is_answer {
            view.headers
                .push(("Auto-Submitted".into(), "auto-replied".into()));
        }
        let message = crate::protocol::AampMessage::parse(&view).ok()?;
        Some(Inbound {
            email_id: self.id.to_string(),
            message,
            view,
            sender_check: auth::SenderCheck::Verified(self.believed_because.into()),
            truncated: false,
            attachments: Vec::new(),
        })
    }
}

/// Reading one account over JMAP.
pub struct Mailbox {
    pub account: Account,
    jmap: JmapClient,
    inbox_id: Option<String>,
}

impl Mailbox {
    pub fn new(account: Account) -> Result<Mailbox, MailboxError> {
        Ok(Mailbox {
            jmap: JmapClient::new(&account)?,
            account,
            inbox_id: None,
        })
    }

    pub fn email(&self) -> &str {
        &self.account.email
    }

    /// Discovers the JMAP session and the Inbox.
    pub async fn connect(&mut self) -> Result<(), MailboxError> {
        self.inbox_id = None;
        self.jmap.connect().await?;
        self.inbox_id = Some(self.jmap.inbox_id().await?);
        Ok(())
    }

    pub fn is_connected(&self) -> bool {
        self.inbox_id.is_some()
    }

    /// Where to connect for push: the transports the server offers that the config allows,
    /// WebSocket first. `None` when there are none.
    pub fn push_target(&self) -> Option<push::PushTarget> {
        let session = self.jmap.session()?;
        let mut transports = Vec::new();
        let (websocket, event_source) = match self.account.push_transport {
            PushTransport::Auto => (true, true),
            PushTransport::Websocket => (true, false),
            PushTransport::Eventsource => (false, true),
        };
        if let Some(url) = session.websocket_url.clone().filter(|_| websocket) {
            if url.scheme() == "wss" && self.account.insecure_tls {
                tracing::info!(
                    "WebSocket push over TLS is not used for a mailbox with insecure_tls"
                );
            } else {
                transports.push(push::Transport::WebSocket(url));
            }
        }
        if let Some(url) = session.event_source_url.clone().filter(|_| event_source) {
            transports.push(push::Transport::EventSource(url));
        }
        (!transports.is_empty()).then(|| push::PushTarget {
            transports,
            login: self.account.login.clone(),
            password: self.account.password.clone(),
            account_id: session.account_id.clone(),
            insecure_tls: self.account.insecure_tls,
        })
    }

    /// The header fields of the newest mail in the Inbox, if there is one (for `doctor`: which
    /// sender evidence this server writes).
    pub async fn newest_headers(&self) -> Result<Option<Vec<(String, String)>>, MailboxError> {
        let inbox = self.inbox_id.as_deref().unwrap_or_default();
        let ids = self.jmap.query_mailbox(inbox, 1).await?;
        Ok(self
            .jmap
            .get_emails(&ids)
            .await?
            .into_iter()
            .next()
            .map(|e| e.view.headers))
    }

    /// Forgets the session, so the next call discovers it again (after errors).
    pub fn disconnect(&mut self) {
        self.inbox_id = None;
    }

    /// The cursor for "everything after now".
    pub async fn current_state(&self) -> Result<String, MailboxError> {
        self.jmap.email_state().await
    }

    /// One page of new AAMP mail since `position`: at most about `page` mails (16 when
    /// following changes, which come with their mails in one request), the position
    /// after them, and whether more is waiting. The caller hands the mails on, saves the
    /// position, and asks again while `more`; so a long backlog is never held at once.
    ///
    /// When the server can no longer compute changes from the saved state, the Inbox is
    /// scanned, page by page and to its end, from the second before the last mail handled
    /// (or, before any mail was handled, from a minute before the cursor was made); the
    /// scan's place is part of the position, so it resumes after a restart. Mail seen twice
    /// this way is recognised downstream by its Message-ID.
    pub async fn next_page(&self, position: &Position, page: usize) -> Result<Page, MailboxError> {
        let page = page.max(1);
        let inbox = self.inbox_id.as_deref().unwrap_or_default();
        let mut next = position.clone();
        let (ids, more) = if let Some(scan) = &position.scan {
            let ids = self
                .jmap
                .query_mailbox_after(inbox, &scan.after, scan.offset, page)
                .await?;
            let done = ids.len() < page;
            if done {
                tracing::info!(
                    scanned = scan.offset + ids.len(),
                    "the Inbox scan is complete; following changes again"
                );
                next.state = scan.resume_state.clone();
                next.scan = None;
            } else if let Some(s) = next.scan.as_mut() {
                s.offset += ids.len();
            }
            (ids, true)
        } else {
            // Changes and their mails in one round trip (a smaller page: see
            // `JmapClient::changes_and_emails`).
            match self.jmap.changes_and_emails(&position.state).await {
                Ok((changes, emails)) => {
                    next.state = changes.new_state;
                    let fresh: Vec<jmap::Email> = emails
                        .into_iter()
                        .filter(|e| !position.last_ids.contains(&e.id))
                        .collect();
                    return Ok(self.page_of(fresh, next, changes.has_more));
                }
                Err(MailboxError::CannotCalculateChanges) => {
                    let resume_state = self.jmap.email_state().await?;
                    let from = match (&position.last_received_at, &position.started_at) {
                        (Some(last), _) => shift(last, -1),
                        (None, Some(started)) => shift(started, -60),
                        (None, None) => crate::protocol::time::format_utc(SystemTime::now()),
                    };
                    tracing::warn!(state = %position.state, after = %from, "the server cannot list changes since our state; scanning the Inbox from there");
                    next.scan = Some(Scan {
                        after: from,
                        offset: 0,
                        resume_state,
                    });
                    return Ok(Page {
                        inbound: Vec::new(),
                        ignored: Vec::new(),
                        position: next,
                        more: true,
                    });
                }
                Err(e) => return Err(e),
            }
        };
        let ids: Vec<String> = ids
            .into_iter()
            .filter(|id| !position.last_ids.contains(id))
            .collect();
        let emails = self.jmap.get_emails(&ids).await?;
        Ok(self.page_of(emails, next, more))
    }

    /// The page of `emails`: what is AAMP for this mailbox, what was ignored, and the
    /// position after them.
    fn page_of(&self, emails: Vec<jmap::Email>, mut next: Position, more: bool) -> Page {
        for email in &emails {
            next.saw(&email.id, &email.received_at);
        }
        let mut inbound = Vec::new();
        let mut ignored = Vec::new();
        for email in emails {
            match self.accept(email) {
                Ok(mail) => inbound.push(mail),
                Err(Some(skipped)) => ignored.push(skipped),
                Err(None) => {}
            }
        }
        Page {
            inbound,
            ignored,
            position: next,
            more,
        }
    }

    /// All new AAMP mail since `position` (every page), and the position after it; for
    /// callers that read a handful of mails, such as a dispatcher waiting for its answer.
    pub async fn fetch_since(
        &self,
        position: &Position,
        page: usize,
    ) -> Result<(Vec<Inbound>, Position), MailboxError> {
        let mut all = Vec::new();
        let mut position = position.clone();
        loop {
            let next = self.next_page(&position, page).await?;
            all.extend(next.inbound.into_iter().filter_map(|m| match m {
                Mail::Aamp(inbound) => Some(*inbound),
                Mail::Reply(_) => None,
            }));
            position = next.position;
            if !next.more {
                return Ok((all, position));
            }
        }
    }

    /// Keeps Inbox mail addressed to this mailbox and not sent by it, and parses it as AAMP.
    /// `Err(None)` for mail that is not the agent's at all (its own Sent copies, other
    /// folders); `Err(Some(_))` for mail to the agent that the bridge does not act on.
    fn accept(&self, email: Email) -> Result<Mail, Option<Ignored>> {
        let me = &self.account.email;
        let in_inbox = self
            .inbox_id
            .as_ref()
            .is_some_and(|inbox| email.mailbox_ids.contains(inbox));
        let to_me = email.view.to.iter().any(|a| a.eq_ignore_ascii_case(me));
        let from_me = email.view.from.eq_ignore_ascii_case(me);
        if !in_inbox || !to_me || from_me {
            tracing::debug!(email_id = %email.id, in_inbox, to_me, from_me, "mail skipped");
            return Err(None);
        }
        match AampMessage::parse(&email.view) {
            Ok(message) => {
                let session = self.jmap.session().ok_or(None)?;
                let attachments = email
                    .attachments
                    .iter()
                    .map(|blob| Attachment {
                        name: blob.name.clone().unwrap_or_else(|| "attachment".into()),
                        content_type: blob.content_type.clone(),
                        size: blob.size,
                        url: jmap::download_url(&session.download_url, &session.account_id, blob),
                    })
                    .collect();
                let sender_check = auth::check_sender(
                    &email.view.headers,
                    &message.envelope.from,
                    self.account.sender_auth,
                    self.account.authserv_id.as_deref(),
                );
                Ok(Mail::Aamp(Box::new(Inbound {
                    email_id: email.id,
                    message,
                    view: email.view,
                    sender_check,
                    truncated: email.truncated,
                    attachments,
                })))
            }
            Err(protocol::NotAamp::NoIntent) if email.view.header("In-Reply-To").is_some() => {
                let view = &email.view;
                let ids = |name: &str| -> Vec<String> {
                    view.header(name)
                        .map(|v| {
                            v.split_whitespace()
                                .map(protocol::message::normalize_message_id)
                                .filter(|id| !id.is_empty() && id.len() <= 250)
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let sender_check = auth::check_sender(
                    &view.headers,
                    &view.from,
                    self.account.sender_auth,
                    self.account.authserv_id.as_deref(),
                );
                Ok(Mail::Reply(Reply {
                    email_id: email.id.clone(),
                    from: protocol::address(&view.from),
                    message_id: protocol::message::normalize_message_id(&view.message_id),
                    in_reply_to: ids("In-Reply-To").pop(),
                    references: ids("References"),
                    text: view.body_text.clone(),
                    sender_check,
                    auto_submitted: view
                        .header("Auto-Submitted")
                        .is_some_and(|v| !v.eq_ignore_ascii_case("no")),
                }))
            }
            Err(reason) => {
                tracing::info!(email_id = %email.id, from = %email.view.from, %reason, "ignored: not an AAMP message this bridge can act on");
                Err(Some(Ignored {
                    email_id: email.id,
                    from: email.view.from,
                    message_id: email.view.message_id,
                    reason: reason.to_string(),
                }))
            }
        }
    }
}

/// Sending from one account over SMTP.
pub struct Sender {
    smtp: SmtpSender,
    /// A JMAP connection of its own, for downloads and Sent copies (the intake owns the other).
    jmap: tokio::sync::Mutex<JmapClient>,
    save_sent: bool,
    sent_mailbox: tokio::sync::Mutex<Option<String>>,
    account: Account,
    helper: tokio::sync::Mutex<Option<std::sync::Arc<helper::HelperApi>>>,
    /// Sent copies handed to a [`SentCopies`] worker, off the reply's path; `None` until one
    /// is made (then copies are kept inline).
    copies: Option<tokio::sync::mpsc::Sender<protocol::RenderedMail>>,
}

/// Sent copies waiting to be kept, at most this many; past it a copy is kept inline.
const COPY_QUEUE: usize = 256;

/// Keeps Sent copies in the background, so a reply leaves as soon as SMTP took it. Has its
/// own JMAP connection.
pub struct SentCopies {
    queue: tokio::sync::mpsc::Receiver<protocol::RenderedMail>,
    jmap: JmapClient,
    sent_mailbox: Option<String>,
}

impl SentCopies {
    /// Keeps copies until `stop`, then those already queued (for at most five seconds).
    pub async fn run(mut self, stop: tokio_util::sync::CancellationToken) {
        loop {
            let mail = tokio::select! {
                m = self.queue.recv() => m,
                _ = stop.cancelled() => break,
            };
            let Some(mail) = mail else { return };
            self.keep(&mail).await;
        }
        self.queue.close();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while let Ok(mail) = self.queue.try_recv() {
            if tokio::time::timeout_at(deadline, self.keep(&mail))
                .await
                .is_err()
            {
                tracing::warn!("stopping with Sent copies not kept");
                return;
            }
        }
    }

    async fn keep(&mut self, mail: &protocol::RenderedMail) {
        if let Err(e) = save_copy(&mut self.jmap, &mut self.sent_mailbox, mail).await {
            tracing::warn!(error = %e, message_id = %mail.message_id, "sent, but the copy in the Sent mailbox failed");
            self.jmap.forget_session();
            self.sent_mailbox = None;
        }
    }
}

/// Keeps a copy of a sent mail in the Sent mailbox: the exact bytes, uploaded and imported as
/// seen.
async fn save_copy(
    jmap: &mut JmapClient,
    sent: &mut Option<String>,
    mail: &protocol::RenderedMail,
) -> Result<(), MailboxError> {
    if jmap.session().is_none() {
        jmap.connect().await?;
    }
    let sent_id = match sent.as_ref() {
        Some(id) => id.clone(),
        None => sent.insert(jmap.mailbox_with_role("sent").await?).clone(),
    };
    let blob = jmap.upload(mail.bytes.clone(), "message/rfc822").await?;
    let reply = jmap
        .call(
            "Email/import",
            serde_json::json!({ "emails": { "copy": { "blobId": blob, "mailboxIds": { sent_id: true }, "keywords": { "$seen": true } } } }),
        )
        .await?;
    if reply["created"]["copy"].is_object() {
        Ok(())
    } else {
        let why = &reply["notCreated"]["copy"];
        Err(MailboxError::Method {
            method: "Email/import".into(),
            kind: why["type"].as_str().unwrap_or("unknown").to_string(),
            description: why["description"].as_str().map(str::to_string),
        })
    }
}

impl Sender {
    pub fn new(account: &Account) -> Result<Sender, MailboxError> {
        Ok(Sender {
            smtp: SmtpSender::new(account)?,
            jmap: tokio::sync::Mutex::new(JmapClient::new(account)?),
            save_sent: account.save_sent,
            sent_mailbox: tokio::sync::Mutex::new(None),
            account: account.clone(),
            helper: tokio::sync::Mutex::new(None),
            copies: None,
        })
    }

    /// A worker that keeps this sender's Sent copies in the background (run it beside the
    /// outbox); `None` when the account keeps no copies.
    pub fn sent_copies(&mut self) -> Result<Option<SentCopies>, MailboxError> {
        if !self.save_sent {
            return Ok(None);
        }
        let (tx, queue) = tokio::sync::mpsc::channel(COPY_QUEUE);
        self.copies = Some(tx);
        Ok(Some(SentCopies {
            queue,
            jmap: JmapClient::new(&self.account)?,
            sent_mailbox: None,
        }))
    }

    /// The AAMP helper API, discovered on first use; `None` without an `aamp_url`.
    pub async fn helper(&self) -> Result<Option<std::sync::Arc<helper::HelperApi>>, MailboxError> {
        let Some(base) = &self.account.aamp_url else {
            return Ok(None);
        };
        let mut cached = self.helper.lock().await;
        if cached.is_none() {
            *cached = Some(std::sync::Arc::new(
                helper::HelperApi::discover(base, &self.account).await?,
            ));
        }
        Ok(cached.clone())
    }

    /// See [`smtp::SmtpSender::check`].
    pub async fn check_smtp(&self) -> Result<(), MailboxError> {
        self.smtp.check().await
    }

    /// Downloads an inbound attachment (at most `max` bytes).
    pub async fn download(
        &self,
        attachment: &Attachment,
        max: u64,
    ) -> Result<Vec<u8>, MailboxError> {
        let jmap = self.jmap.lock().await;
        jmap.download(&attachment.url, max).await
    }

    async fn save_copy(&self, mail: &protocol::RenderedMail) -> Result<(), MailboxError> {
        let mut jmap = self.jmap.lock().await;
        let mut sent = self.sent_mailbox.lock().await;
        save_copy(&mut jmap, &mut sent, mail).await
    }

    /// Renders and submits `msg`, retrying transient failures a few times with backoff, then
    /// keeps a Sent copy. Returns the Message-ID it was sent with.
    pub async fn send(&self, msg: &AampMessage) -> Result<String, MailboxError> {
        self.send_with(msg, &[]).await
    }

    /// [`Sender::send`] with files attached.
    pub async fn send_with(
        &self,
        msg: &AampMessage,
        files: &[protocol::OutgoingFile],
    ) -> Result<String, MailboxError> {
        let mail = protocol::render_with(msg, SystemTime::now(), files);
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(4));
        loop {
            match self.submit(&mail).await {
                Ok(()) => return Ok(mail.message_id),
                Err(e) if e.is_transient() && backoff.failures() < 3 => {
                    tracing::warn!(attempt = backoff.failures() + 1, error = %e, "sending failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Submits a rendered mail once, exactly as it is, then keeps a Sent copy (whose failure
    /// is logged, not returned: the mail itself went out).
    pub async fn submit(&self, mail: &protocol::RenderedMail) -> Result<(), MailboxError> {
        self.smtp.send(mail).await?;
        if let Some(copies) = &self.copies {
            // To the worker; when its queue is full (or it stopped), kept here instead.
            match copies.try_send(mail.clone()) {
                Ok(()) => return Ok(()),
                Err(_) => {
                    tracing::debug!("the Sent copy queue is full or closed; keeping it inline")
                }
            }
        }
        if self.save_sent {
            if let Err(e) = self.save_copy(mail).await {
                tracing::warn!(error = %e, message_id = %mail.message_id, "sent, but the copy in the Sent mailbox failed");
                self.jmap.lock().await.forget_session();
            }
        }
        Ok(())
    }
}

/// The HTTP client for one mailbox's servers: certificates verified unless `insecure_tls`,
/// a connect timeout, and a total timeout unless `None` (long-lived streams). Verified clients
/// share one TLS configuration (the root store is parsed once per process, not per client:
/// it was most of a client's start-up time and memory); each client keeps its own connection
/// pool, bound to the runtime it runs on.
pub fn http_client(
    insecure_tls: bool,
    timeout: Option<Duration>,
) -> Result<reqwest::Client, MailboxError> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("aamp-bridge/", env!("CARGO_PKG_VERSION")));
    builder = if insecure_tls {
        builder.danger_accept_invalid_certs(true)
    } else {
        builder.use_preconfigured_tls(verified_tls().clone())
    };
    if let Some(timeout) = timeout {
        builder = builder.timeout(timeout);
    }
    builder.build().map_err(|e| MailboxError::Protocol {
        what: "HTTP client setup".into(),
        detail: e.to_string(),
    })
}

/// The process's one TLS client configuration with the Mozilla roots (webpki-roots).
fn verified_tls() -> &'static rustls::ClientConfig {
    static CONFIG: std::sync::OnceLock<rustls::ClientConfig> = std::sync::OnceLock::new();
    CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    })
}

/// Sends `request` and reads its JSON answer (see [`read_json`]); a failure to reach the
/// server is a `Network` error naming `url`.
pub async fn fetch_json(
    request: reqwest::RequestBuilder,
    url: &str,
) -> Result<serde_json::Value, MailboxError> {
    let response = request
        .send()
        .await
        .map_err(MailboxError::network(url.to_string()))?;
    read_json(response, url).await
}

/// Reads a JSON answer: a status other than 2xx is an `Http` error carrying the start of the
/// body, and an answer that is not JSON a `Protocol` error.
pub async fn read_json(
    response: reqwest::Response,
    url: &str,
) -> Result<serde_json::Value, MailboxError> {
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(MailboxError::Http {
            url: url.to_string(),
            status: status.as_u16(),
            body: body
                .chars()
                .take(200)
                .collect::<String>()
                .trim()
                .to_string(),
        });
    }
    response.json().await.map_err(|e| MailboxError::Protocol {
        what: url.to_string(),
        detail: e.to_string(),
    })
}

/// How far the mailbox has been read: the JMAP Email state, the newest mail seen (its
/// `receivedAt` and the ids seen in that second), which bounds a back-scan when the server has
/// lost the state, and the place of a back-scan under way.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Position {
    pub state: String,
    #[serde(default)]
    pub last_received_at: Option<String>,
    #[serde(default)]
    pub last_ids: Vec<String>,
    /// When this cursor was made (RFC 3339 UTC): the scan's start before any mail was seen.
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan: Option<Scan>,
}

/// An Inbox scan under way: mail received after `after`, read from `offset` on; when done,
/// changes are followed again from `resume_state` (taken before the scan began, so nothing
/// that arrives during it is missed).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scan {
    pub after: String,
    pub offset: usize,
    pub resume_state: String,
}

/// A mail to the agent that is not acted on, and why.
#[derive(Clone, Debug)]
pub struct Ignored {
    pub email_id: String,
    pub from: String,
    pub message_id: String,
    pub reason: String,
}

/// One page of new mail.
#[derive(Debug)]
pub struct Page {
    pub inbound: Vec<Mail>,
    pub ignored: Vec<Ignored>,
    pub position: Position,
    pub more: bool,
}

/// An RFC 3339 time moved by `secs` seconds (unchanged when unreadable).
fn shift(time: &str, secs: i64) -> String {
    match crate::protocol::time::parse(time) {
        Some(t) => {
            let moved = if secs < 0 {
                t - Duration::from_secs(secs.unsigned_abs())
            } else {
                t + Duration::from_secs(secs as u64)
            };
            crate::protocol::time::format_utc(moved)
        }
        None => time.to_string(),
    }
}

impl Position {
    /// A fresh cursor at `state`, made now.
    pub fn at(state: String) -> Position {
        Position {
            state,
            started_at: Some(crate::protocol::time::format_utc(SystemTime::now())),
            ..Position::default()
        }
    }

    /// Notes a mail as seen (RFC 3339 UTC strings of one format compare in time order).
    fn saw(&mut self, id: &str, received_at: &str) {
        if received_at.is_empty() {
            return;
        }
        match self.last_received_at.as_deref() {
            Some(last) if received_at < last => {}
            Some(last) if received_at == last => {
                if !self.last_ids.iter().any(|i| i == id) {
                    self.last_ids.push(id.to_string());
                }
            }
            _ => {
                self.last_received_at = Some(received_at.to_string());
                self.last_ids = vec![id.to_string()];
            }
        }
    }
}

/// Where the mailbox was read up to, kept in one small file.
pub struct Cursor {
    path: PathBuf,
}

impl Cursor {
    pub fn new(path: PathBuf) -> Cursor {
        Cursor { path }
    }

    /// The saved position; a file from an older version (just the state) still reads.
    pub fn load(&self) -> std::io::Result<Option<Position>> {
        match std::fs::read_to_string(&self.path) {
            Ok(s) if s.trim().is_empty() => Ok(None),
            Ok(s) => Ok(Some(serde_json::from_str(&s).unwrap_or_else(|_| {
                Position {
                    state: s.trim().to_string(),
                    ..Position::default()
                }
            }))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes atomically: a crash leaves the old cursor or the new one, never half of one.
    pub fn save(&self, position: &Position) -> std::io::Result<()> {
        crate::fsio::write_atomic(
            &self.path,
            &serde_json::to_vec(position).expect("a position serializes"),
            0o600,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_keep_the_newest_second() {
        let mut p = Position::at("1".into());
        p.saw("a", "2026-11-29T10:00:00Z");
        p.saw("b", "2026-11-29T10:00:01Z");
        p.saw("c", "2026-11-29T10:00:01Z");
        p.saw("d", "2026-11-29T09:59:59Z");
        assert_eq!(p.last_received_at.as_deref(), Some("2026-11-29T10:00:01Z"));
        assert_eq!(p.last_ids, vec!["b", "c"]);
    }

    #[test]
    fn cursors_read_old_and_new_files() {
        let dir = tempfile::tempdir().unwrap();
        let cursor = Cursor::new(dir.path().join("cursor"));
        assert_eq!(cursor.load().unwrap(), None);
        std::fs::write(dir.path().join("cursor"), "42\n").unwrap();
        assert_eq!(
            cursor.load().unwrap().map(|p| p.state),
            Some("42".to_string())
        );
        let mut p = Position::at("43".into());
        p.saw("x", "2026-11-29T10:00:00Z");
        cursor.save(&p).unwrap();
        assert_eq!(cursor.load().unwrap(), Some(p));
    }
}
