//! The AAMP back-end: an agent's mailbox on a mail server, read over JMAP (`jmap`, push over
//! WebSocket or EventSource in `push`, the cursor here), written over SMTP (`smtp`, with Sent
//! copies in `sender`), with the AAMP service's helper API (`helper`: streams, registration,
//! thread, directory) and sender evidence (`auth`, `received`). The intake loop that reads it
//! is `mailbox::intake`.

pub mod auth;
pub mod claims;
mod dispatcher;
pub mod guess;
pub mod helper;
pub mod intake;
pub mod jmap;
pub(crate) mod outlet;
pub(crate) mod probe;
pub mod push;
pub mod received;
mod sender;
pub mod smtp;

pub use dispatcher::Dispatcher;
pub(crate) use outlet::SYSTEM;
pub use probe::{login, replica_claims, LoginFailed};
pub use sender::{Sender, SentCopies};

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::config::{Account, PushTransport};
use crate::mailbox::{Attachment, Inbound, Mail, MailboxError, Reply};
use crate::protocol::{self, AampMessage};
use jmap::{Email, JmapClient};

/// Reading one account over JMAP.
pub struct Reader {
    pub account: Account,
    jmap: JmapClient,
    inbox_id: Option<String>,
    /// With `replica`: when claims other replicas stopped renewing were last looked for.
    takeover_scan: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Reader {
    pub fn new(account: Account) -> Result<Reader, MailboxError> {
        Ok(Reader {
            jmap: JmapClient::new(&account)?,
            account,
            inbox_id: None,
            takeover_scan: std::sync::Mutex::new(None),
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
                    return Ok(self.page_of(fresh, next, changes.has_more).await);
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
        Ok(self.page_of(emails, next, more).await)
    }

    /// The page of `emails`: what is AAMP for this mailbox, what was ignored, and the
    /// position after them.
    async fn page_of(&self, emails: Vec<jmap::Email>, mut next: Position, more: bool) -> Page {
        for email in &emails {
            next.saw(&email.id, &email.received_at);
        }
        let mut inbound = Vec::new();
        let mut ignored = Vec::new();
        for email in emails {
            if let Some(parts) = self.bounce_parts(&email) {
                // Believed only when the mailbox's own server made it (see
                // `auth::report_by_server`); anyone can mail a delivery-status part, and
                // `sender_auth = "none"` is about senders, not about the server's reports.
                if let Err(why) = auth::report_by_server(&email.view.headers) {
                    tracing::warn!(email_id = %email.id, from = %email.view.from, reason = %why, "ignored: a delivery report the mail server did not make");
                    ignored.push(Ignored {
                        email_id: email.id,
                        from: email.view.from,
                        message_id: email.view.message_id,
                        reason: format!("a delivery report not made by the mail server: {why}"),
                    });
                    continue;
                }
                match self.read_bounce(&email, parts).await {
                    Some(bounce) => inbound.push(Mail::Bounce(bounce)),
                    None => {
                        tracing::info!(email_id = %email.id, "ignored: a delivery report that names no recipient")
                    }
                }
                continue;
            }
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
        let (mail, position) = self.fetch_mail_since(position, page).await?;
        let aamp = mail
            .into_iter()
            .filter_map(|m| match m {
                Mail::Aamp(inbound) => Some(*inbound),
                _ => None,
            })
            .collect();
        Ok((aamp, position))
    }

    /// All new mail for the bridge since `position` (every page): AAMP messages, plain
    /// replies and delivery reports.
    pub async fn fetch_mail_since(
        &self,
        position: &Position,
        page: usize,
    ) -> Result<(Vec<Mail>, Position), MailboxError> {
        let mut all = Vec::new();
        let mut position = position.clone();
        loop {
            let next = self.next_page(&position, page).await?;
            all.extend(next.inbound);
            position = next.position;
            if !next.more {
                return Ok((all, position));
            }
        }
    }

    /// Dispatches another replica claimed and stopped renewing (it died), unanswered: read
    /// again, for this replica to claim and run. Looked for at most every half lease; empty
    /// without `replica`.
    pub async fn expired_claims(&self) -> Result<Vec<Mail>, MailboxError> {
        let (Some(inbox), Some(replica)) = (self.inbox_id.as_deref(), &self.account.replica) else {
            return Ok(Vec::new());
        };
        {
            let mut last = self.takeover_scan.lock().expect("takeover lock");
            if last.is_some_and(|t| t.elapsed() < replica.lease / 2) {
                return Ok(Vec::new());
            }
            *last = Some(std::time::Instant::now());
        }
        let ids = claims::expired(&self.jmap, inbox).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let emails = self.jmap.get_emails(&ids).await?;
        Ok(emails
            .into_iter()
            .filter_map(|e| self.accept(e).ok())
            .collect())
    }

    /// Whether the server takes the keywords this replica's claims write (see
    /// [`claims::check`]); `Ok(None)` without `replica`.
    pub async fn check_claims(&self) -> Result<Option<bool>, MailboxError> {
        let (Some(inbox), Some(replica)) = (self.inbox_id.as_deref(), &self.account.replica) else {
            return Ok(None);
        };
        claims::check(&self.jmap, inbox, &replica.name)
            .await
            .map(Some)
    }

    /// The replicas holding claims on this mailbox's Inbox: per name, (live claims, claims
    /// whose lease ran out). Empty without `replica`.
    pub async fn replicas(
        &self,
    ) -> Result<std::collections::BTreeMap<String, (usize, usize)>, MailboxError> {
        let Some(inbox) = self.inbox_id.as_deref() else {
            return Ok(Default::default());
        };
        let held = claims::held(&self.jmap, inbox).await?;
        Ok(claims::by_replica(&held, claims::now_secs()))
    }

    /// A delivery report in this mailbox's Inbox (`multipart/report` whose
    /// `message/delivery-status` part JMAP lists as an attachment): that part, and the
    /// returned mail or its headers when the server included them.
    fn bounce_parts(&self, email: &jmap::Email) -> Option<(jmap::BlobRef, Option<jmap::BlobRef>)> {
        let in_inbox = self
            .inbox_id
            .as_ref()
            .is_some_and(|inbox| email.mailbox_ids.contains(inbox));
        let to_me = email
            .view
            .to
            .iter()
            .any(|a| a.eq_ignore_ascii_case(&self.account.email));
        if !in_inbox || !to_me {
            return None;
        }
        let of_type = |t: &str| {
            email
                .attachments
                .iter()
                .find(|a| a.content_type.eq_ignore_ascii_case(t))
                .cloned()
        };
        let status = of_type("message/delivery-status")?;
        Some((
            status,
            of_type("message/rfc822").or_else(|| of_type("text/rfc822-headers")),
        ))
    }

    /// Reads a delivery report's parts (at most 64 KiB each: the returned mail's headers are
    /// all it needs of it).
    async fn read_bounce(
        &self,
        email: &jmap::Email,
        (status, returned): (jmap::BlobRef, Option<jmap::BlobRef>),
    ) -> Option<crate::inbound::Bounce> {
        const PART_MAX: u64 = 64 * 1024;
        let session = self.jmap.session()?;
        let fetch = |blob: jmap::BlobRef| {
            let url = jmap::download_url(&session.download_url, &session.account_id, &blob);
            async move {
                match self.jmap.download(&url, PART_MAX).await {
                    Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not read a part of a delivery report");
                        String::new()
                    }
                }
            }
        };
        let status_text = fetch(status).await;
        let returned_text = match returned {
            Some(blob) => fetch(blob).await,
            None => String::new(),
        };
        let notification = protocol::dsn::parse(&status_text, &returned_text)?;
        tracing::info!(email_id = %email.id, message_id = ?notification.message_id, failed = notification.failed().count(), "a delivery report");
        Some(crate::inbound::Bounce {
            email_id: email.id.clone(),
            notification,
        })
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
                    refused: None,
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

/// How far the mailbox has been read: the JMAP Email state, the newest mail seen (its
/// `receivedAt` and the ids seen in that second), which bounds a back-scan when the server has
/// lost the state, and the place of a back-scan under way.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Position {
    pub state: String,
    pub last_received_at: Option<String>,
    #[serde(default)]
    pub last_ids: Vec<String>,
    /// When this cursor was made (RFC 3339 UTC): the scan's start before any mail was seen.
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
