//! Mail in and out: the only code that knows JMAP, SMTP and the shape of a mail. It turns new
//! Inbox mail addressed to an agent into parsed AAMP messages for `dispatch`, and sends the
//! AAMP messages `dispatch` hands back.

mod error;
pub mod helper;
pub mod jmap;
pub mod link;
pub mod push;
pub mod smtp;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

pub use error::MailboxError;
use jmap::{Email, JmapClient};
use smtp::SmtpSender;

use crate::config::{Account, PushTransport};
use crate::error::Classify;
use crate::protocol::{self, AampMessage};

/// A parsed AAMP message with where it came from.
#[derive(Clone, Debug)]
pub struct Inbound {
    pub email_id: String,
    pub message: AampMessage,
    /// The text body was longer than we fetch and was cut.
    pub truncated: bool,
    pub attachments: Vec<Attachment>,
}

/// A file attached to an inbound mail, to download with [`Sender::download`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub name: String,
    pub content_type: String,
    pub size: u64,
    pub url: String,
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

    /// Forgets the session, so the next call discovers it again (after errors).
    pub fn disconnect(&mut self) {
        self.inbox_id = None;
    }

    /// The cursor for "everything after now".
    pub async fn current_state(&self) -> Result<String, MailboxError> {
        self.jmap.email_state().await
    }

    /// New AAMP mail since `position`, and the position to continue from. Follows
    /// `hasMoreChanges` to the end. When the server can no longer compute changes from the
    /// state, scans the Inbox for mail received since the last mail handled (at most
    /// `backscan` mails); no gap is skipped silently.
    pub async fn fetch_since(
        &self,
        position: &Position,
        backscan: usize,
    ) -> Result<(Vec<Inbound>, Position), MailboxError> {
        let mut created = Vec::new();
        let mut since = position.state.clone();
        loop {
            match self.jmap.changes(&since).await {
                Ok(page) => {
                    created.extend(page.created);
                    since = page.new_state;
                    if !page.has_more {
                        break;
                    }
                }
                Err(MailboxError::CannotCalculateChanges) => {
                    let new_state = self.jmap.email_state().await?;
                    let inbox = self.inbox_id.as_deref().unwrap_or_default();
                    created = match &position.last_received_at {
                        Some(last) => {
                            tracing::warn!(state = %position.state, since = %last, "the server cannot list changes since our state; scanning the Inbox from the last mail handled");
                            // JMAP's `after` is strict and receivedAt has whole seconds: ask
                            // from the second before, and skip the mails already handled.
                            let after = crate::protocol::time::parse(last)
                                .map(|t| {
                                    crate::protocol::time::format_utc(
                                        t - std::time::Duration::from_secs(1),
                                    )
                                })
                                .unwrap_or_else(|| last.clone());
                            let ids = self
                                .jmap
                                .query_mailbox_after(inbox, &after, backscan)
                                .await?;
                            ids.into_iter()
                                .filter(|id| !position.last_ids.contains(id))
                                .collect()
                        }
                        None => {
                            tracing::warn!(state = %position.state, backscan, "the server cannot list changes since our state, and no mail was handled yet; scanning the newest Inbox mail");
                            let mut ids = self.jmap.query_mailbox(inbox, backscan).await?;
                            ids.reverse();
                            ids
                        }
                    };
                    since = new_state;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let emails = self.jmap.get_emails(&created).await?;
        let mut next = Position {
            state: since,
            ..position.clone()
        };
        for email in &emails {
            next.saw(&email.id, &email.received_at);
        }
        Ok((
            emails.into_iter().filter_map(|e| self.accept(e)).collect(),
            next,
        ))
    }

    /// Keeps Inbox mail addressed to this mailbox and not sent by it, and parses it as AAMP.
    fn accept(&self, email: Email) -> Option<Inbound> {
        let me = &self.account.email;
        let in_inbox = self
            .inbox_id
            .as_ref()
            .is_some_and(|inbox| email.mailbox_ids.contains(inbox));
        let to_me = email.view.to.iter().any(|a| a.eq_ignore_ascii_case(me));
        let from_me = email.view.from.eq_ignore_ascii_case(me);
        if !in_inbox || !to_me || from_me {
            tracing::debug!(email_id = %email.id, in_inbox, to_me, from_me, "mail skipped");
            return None;
        }
        match AampMessage::parse(&email.view) {
            Ok(message) => {
                let session = self.jmap.session()?;
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
                Some(Inbound {
                    email_id: email.id,
                    message,
                    truncated: email.truncated,
                    attachments,
                })
            }
            Err(reason) => {
                tracing::debug!(email_id = %email.id, %reason, "not an AAMP mail");
                None
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
        })
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

    /// Downloads an inbound attachment (at most `max` bytes).
    pub async fn download(
        &self,
        attachment: &Attachment,
        max: u64,
    ) -> Result<Vec<u8>, MailboxError> {
        let jmap = self.jmap.lock().await;
        jmap.download(&attachment.url, max).await
    }

    /// Keeps a copy of a sent mail in the Sent mailbox: the exact bytes, uploaded and imported
    /// as seen. A failure is reported to the caller, who logs it; the mail itself is sent.
    async fn save_copy(&self, mail: &protocol::RenderedMail) -> Result<(), MailboxError> {
        let mut jmap = self.jmap.lock().await;
        if jmap.session().is_none() {
            jmap.connect().await?;
        }
        let mut sent = self.sent_mailbox.lock().await;
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
        self.submit(&mail).await?;
        if self.save_sent {
            if let Err(e) = self.save_copy(&mail).await {
                tracing::warn!(error = %e, message_id = %mail.message_id, "sent, but the copy in the Sent mailbox failed");
                self.jmap.lock().await.forget_session();
            }
        }
        Ok(mail.message_id)
    }

    async fn submit(&self, mail: &protocol::RenderedMail) -> Result<(), MailboxError> {
        let mut delay = Duration::from_millis(500);
        let mut attempt = 1;
        loop {
            match self.smtp.send(mail).await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_transient() && attempt < 4 => {
                    tracing::warn!(attempt, error = %e, "sending failed; retrying");
                    tokio::time::sleep(jitter(delay)).await;
                    delay *= 2;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The HTTP client for one mailbox's servers: certificates verified unless `insecure_tls`,
/// a connect timeout, and a total timeout unless `None` (long-lived streams).
pub fn http_client(
    insecure_tls: bool,
    timeout: Option<Duration>,
) -> Result<reqwest::Client, MailboxError> {
    let mut builder = reqwest::Client::builder()
        .danger_accept_invalid_certs(insecure_tls)
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("aamp-bridge/", env!("CARGO_PKG_VERSION")));
    if let Some(timeout) = timeout {
        builder = builder.timeout(timeout);
    }
    builder.build().map_err(|e| MailboxError::Protocol {
        what: "HTTP client setup".into(),
        detail: e.to_string(),
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
        .map_err(|source| MailboxError::Network {
            url: url.to_string(),
            source,
        })?;
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

/// `delay` plus up to 25% more, so many retries do not line up.
pub fn jitter(delay: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    delay + delay.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

/// How far the mailbox has been read: the JMAP Email state, and the newest mail seen (its
/// `receivedAt` and the ids seen in that second), which bounds a back-scan when the server has
/// lost the state.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Position {
    pub state: String,
    #[serde(default)]
    pub last_received_at: Option<String>,
    #[serde(default)]
    pub last_ids: Vec<String>,
}

impl Position {
    pub fn at(state: String) -> Position {
        Position {
            state,
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
            Ok(s) => Ok(Some(
                serde_json::from_str(&s).unwrap_or_else(|_| Position::at(s.trim().to_string())),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes atomically: a crash leaves the old cursor or the new one, never half of one.
    pub fn save(&self, position: &Position) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(position).expect("a position serializes"),
        )?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &self.path)
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
        assert_eq!(cursor.load().unwrap(), Some(Position::at("42".into())));
        let mut p = Position::at("43".into());
        p.saw("x", "2026-11-29T10:00:00Z");
        cursor.save(&p).unwrap();
        assert_eq!(cursor.load().unwrap(), Some(p));
    }
}
