//! Sending from one account over SMTP, with Sent copies kept beside the reply's path.

use std::time::{Duration, SystemTime};

use super::helper;
use super::jmap::JmapClient;
use super::smtp::SmtpSender;
use crate::config::Account;
use crate::error::Classify as _;
use crate::mailbox::{Attachment, MailboxError};
use crate::protocol::{self, AampMessage};

/// Sending from one account over SMTP.
pub struct Sender {
    smtp: SmtpSender,
    /// A JMAP connection of its own, for downloads and Sent copies (the intake owns the other).
    jmap: tokio::sync::Mutex<JmapClient>,
    /// With `replica`: a JMAP connection for renewing claims only, so a renewal never waits
    /// behind claims (which hold their connection through their retries) and a lease does
    /// not run out while its task runs because other tasks were being claimed.
    leases: tokio::sync::Mutex<JmapClient>,
    /// With `replica`: a JMAP connection for done marks only, so an answered task's mark does
    /// not wait behind every running task's renewal: on a starved machine (renewals queued for
    /// seconds) it came after the lease had run out and another replica had taken the
    /// answered task over, to run it again.
    marks: tokio::sync::Mutex<JmapClient>,
    save_sent: bool,
    sent_mailbox: tokio::sync::Mutex<Option<String>>,
    account: Account,
    helper: tokio::sync::Mutex<Option<std::sync::Arc<helper::HelperApi>>>,
    /// Sent copies handed to a [`SentCopies`] worker, off the reply's path; `None` until one
    /// is made (then copies are kept inline).
    copies: Option<tokio::sync::mpsc::Sender<protocol::RenderedMail>>,
}

/// `jmap` locked, connected.
async fn connect(
    jmap: &tokio::sync::Mutex<JmapClient>,
) -> Result<tokio::sync::MutexGuard<'_, JmapClient>, MailboxError> {
    let mut jmap = jmap.lock().await;
    if jmap.session().is_none() {
        jmap.connect().await?;
    }
    Ok(jmap)
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
            leases: tokio::sync::Mutex::new(JmapClient::new(account)?),
            marks: tokio::sync::Mutex::new(JmapClient::new(account)?),
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

    /// The password SMTP, JMAP and the AAMP service are given.
    pub fn password(&self) -> &crate::config::Secret {
        &self.account.password
    }

    /// See [`smtp::SmtpSender::check`].
    pub async fn check_smtp(&self) -> Result<(), MailboxError> {
        self.smtp.check().await
    }

    /// This sender's JMAP connection, connected.
    async fn connected(&self) -> Result<tokio::sync::MutexGuard<'_, JmapClient>, MailboxError> {
        connect(&self.jmap).await
    }

    /// Claims a dispatch's mail for this replica (see [`super::claims`]); won at once when
    /// the mailbox has no `replica` set.
    pub async fn claim(&self, email_id: &str) -> Result<super::claims::Claim, MailboxError> {
        let Some(replica) = &self.account.replica else {
            return Ok(super::claims::Claim::Won);
        };
        let jmap = self.connected().await?;
        super::claims::claim(&jmap, email_id, &replica.name, replica.lease).await
    }

    /// Renews this replica's claim; `Ok(false)` when another replica holds it now.
    pub async fn renew(&self, email_id: &str) -> Result<bool, MailboxError> {
        let Some(replica) = &self.account.replica else {
            return Ok(true);
        };
        let jmap = connect(&self.leases).await?;
        super::claims::renew(&jmap, email_id, &replica.name, replica.lease).await
    }

    /// Marks a claimed dispatch answered, while this replica holds its claim; `Ok(false)`
    /// when another replica took it over (see [`super::claims::finish`]).
    pub async fn finish_claim(&self, email_id: &str) -> Result<bool, MailboxError> {
        let Some(replica) = &self.account.replica else {
            return Ok(true);
        };
        let jmap = connect(&self.marks).await?;
        super::claims::finish(&jmap, email_id, &replica.name).await
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
