//! Mail in and out: the only code that knows JMAP, SMTP and the shape of a mail. It turns new
//! Inbox mail addressed to an agent into parsed AAMP messages for `dispatch`, and sends the
//! AAMP messages `dispatch` hands back.

mod error;
pub mod jmap;
pub mod push;
pub mod smtp;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

pub use error::MailboxError;
use jmap::{Email, JmapClient};
use smtp::SmtpSender;

use crate::config::Account;
use crate::error::Classify;
use crate::protocol::{self, AampMessage};

/// A parsed AAMP message with where it came from.
#[derive(Clone, Debug)]
pub struct Inbound {
    pub email_id: String,
    pub message: AampMessage,
    /// The text body was longer than we fetch and was cut.
    pub truncated: bool,
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

    /// Where to connect for push, when the server offers it (and TLS can be verified).
    pub fn push_target(&self) -> Option<push::PushTarget> {
        let session = self.jmap.session()?;
        let url = session.websocket_url.clone()?;
        if url.scheme() == "wss" && self.account.insecure_tls {
            tracing::info!("push over TLS is not used for a mailbox with insecure_tls; polling");
            return None;
        }
        Some(push::PushTarget {
            url,
            login: self.account.login.clone(),
            password: self.account.password.clone(),
            account_id: session.account_id.clone(),
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

    /// New AAMP mail since `state`, and the state to continue from. Follows
    /// `hasMoreChanges` to the end. When the server can no longer compute changes from
    /// `state`, falls back to the newest `backscan` Inbox mails (the caller de-duplicates).
    pub async fn fetch_since(
        &self,
        state: &str,
        backscan: usize,
    ) -> Result<(Vec<Inbound>, String), MailboxError> {
        let mut created = Vec::new();
        let mut since = state.to_string();
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
                    tracing::warn!(state, backscan, "server cannot list changes since our state; scanning the newest Inbox mail instead");
                    let new_state = self.jmap.email_state().await?;
                    let inbox = self.inbox_id.as_deref().unwrap_or_default();
                    created = self.jmap.query_mailbox(inbox, backscan).await?;
                    created.reverse();
                    since = new_state;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let emails = self.jmap.get_emails(&created).await?;
        Ok((
            emails.into_iter().filter_map(|e| self.accept(e)).collect(),
            since,
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
            Ok(message) => Some(Inbound {
                email_id: email.id,
                message,
                truncated: email.truncated,
            }),
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
}

impl Sender {
    pub fn new(account: &Account) -> Result<Sender, MailboxError> {
        Ok(Sender {
            smtp: SmtpSender::new(account)?,
        })
    }

    /// Renders and submits `msg`, retrying transient failures a few times with backoff.
    /// Returns the Message-ID it was sent with.
    pub async fn send(&self, msg: &AampMessage) -> Result<String, MailboxError> {
        let mail = protocol::render(msg, SystemTime::now());
        let mut delay = Duration::from_millis(500);
        let mut attempt = 1;
        loop {
            match self.smtp.send(&mail).await {
                Ok(()) => return Ok(mail.message_id),
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

/// `delay` plus up to 25% more, so many retries do not line up.
pub fn jitter(delay: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    delay + delay.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

/// The JMAP state we have handled everything up to, kept in one small file.
pub struct Cursor {
    path: PathBuf,
}

impl Cursor {
    pub fn new(path: PathBuf) -> Cursor {
        Cursor { path }
    }

    pub fn load(&self) -> std::io::Result<Option<String>> {
        match std::fs::read_to_string(&self.path) {
            Ok(s) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes atomically: a crash leaves the old cursor or the new one, never half of one.
    pub fn save(&self, state: &str) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, state)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &self.path)
    }
}
