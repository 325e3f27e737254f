//! The intake: watches one mailbox and hands each new AAMP mail to a `deliver` callback, in
//! order, a page at a time. The cursor (how far the mailbox has been read) is saved only
//! after every mail before it was delivered, so a crash re-reads mail rather than losing it;
//! whoever is delivered to recognises a mail it already has. Two loops share the work: the
//! poll loop reads changes (`Email/changes` from the saved cursor) on a timer and whenever
//! the push loop wakes it; the push loop keeps a JMAP WebSocket or EventSource open when the
//! server offers one. With push up, the timer only reconciles (`reconcile_interval`);
//! without it, it polls (`poll_interval`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::link::{Link, Reach};
use super::push::{self, PushTarget};
use super::{Cursor, Mail, MailboxError, Position, Reader};
use crate::backoff::Backoff;
use crate::config::Secret;
use crate::error::{Classify, ErrorClass};
use crate::events::Events;

/// Mails read and delivered per page.
const PAGE: usize = 50;

/// Why a mail could not be taken: the intake stops there and tries again later, without
/// moving the cursor past it.
pub type DeliverError = Box<dyn std::error::Error + Send + Sync>;

/// Why one read of a mailbox (any back-end) did not go through, classed for [`Health`].
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
    #[error("cannot read or write the cursor file: {0}")]
    Cursor(#[from] std::io::Error),
    #[error("a mail could not be taken: {0}")]
    Deliver(DeliverError),
}

/// How often the credentials file is read again while the server refuses the credentials in
/// use: a replaced key is tried at once, without a reload and without waiting for the
/// 5-minute retry.
pub const CREDENTIALS_RECHECK: Duration = Duration::from_secs(2);

/// How one mailbox's reading is going, for every back-end alike: what its link shows
/// (`status`, `doctor`), what the log says (a refused key once, not at every retry), and how
/// long to wait before the next read: refused credentials every 5 minutes (and at once when
/// the credentials file holds others: it is read again at each refusal, every
/// [`CREDENTIALS_RECHECK`] meanwhile, and at a reload), a permanent error every minute,
/// anything else with backoff.
/// After refused credentials, how long before the same ones are tried again (password
/// logins).
const REFUSED_RETRY: Duration = Duration::from_secs(300);

/// The same for bearer keys ([`Health::retry_refused_every`]).
pub const KEY_REFUSED_RETRY: Duration = Duration::from_secs(5);

pub struct Health<'a> {
    link: &'a Link,
    /// "the mail server", "the AMP broker", ...
    server: &'static str,
    /// The account, and the config key to fix when its credentials are refused.
    account: String,
    fix: &'static str,
    backoff: Backoff,
    auth_reported: bool,
    /// The credentials the reads use, when they can be read again.
    secret: Option<Secret>,
    /// The last read was refused for its credentials.
    refused: bool,
    /// Which credentials the read under way uses ([`Secret::generation`]).
    tried: u64,
    /// The credentials file could not be read again (said once, not every few seconds).
    unreadable_reported: bool,
    /// How long to wait after refused credentials before asking the server again with the
    /// same ones (a key made active again is noticed then).
    refused_retry: Duration,
}

impl<'a> Health<'a> {
    pub fn new(link: &'a Link, server: &'static str, account: String, fix: &'static str) -> Self {
        Health {
            link,
            server,
            account,
            fix,
            backoff: Backoff::new(Duration::from_secs(2), Duration::from_secs(60)),
            auth_reported: false,
            secret: None,
            refused: false,
            tried: 0,
            unreadable_reported: false,
            refused_retry: REFUSED_RETRY,
        }
    }

    /// Asks the server again this often while it refuses unchanged credentials. A bearer
    /// key (AMP, ASMTP) can be made active again on the server, and nothing locks an account
    /// for retries with one: such back-ends ask every [`KEY_REFUSED_RETRY`], so an answer
    /// waiting for the key goes within seconds of it working again. A password login keeps
    /// the default five minutes (servers lock accounts out for repeated failed logins).
    pub fn retry_refused_every(mut self, every: Duration) -> Self {
        self.refused_retry = every;
        self
    }

    /// The credentials the reads use: read again when they are refused, recorded in the
    /// link (when read, and whether they worked).
    pub fn with_secret(mut self, secret: Secret) -> Self {
        self.link.credentials(&secret);
        self.secret = Some(secret);
        self
    }

    /// Hears the credentials change (a reload, or a read after a refusal found others).
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.secret.as_ref().map(Secret::changes)
    }

    /// A read begins, with the credentials in use now.
    fn reading(&mut self) {
        self.tried = self.secret.as_ref().map_or(0, Secret::generation);
    }

    /// A read went through.
    pub fn ok(&mut self) {
        if self.backoff.failures() > 0 || self.auth_reported {
            tracing::info!("{} is reachable again", self.server);
        }
        self.backoff.reset();
        self.auth_reported = false;
        self.refused = false;
        if let Some(secret) = &self.secret {
            secret.worked(true);
            self.link.credentials(secret);
        }
        self.link.mailbox(Reach::Connected, None);
    }

    /// Reads the credentials file again after a refusal; true when it holds others (they
    /// are in use from now on).
    pub fn reread(&mut self) -> bool {
        let Some(secret) = &self.secret else {
            return false;
        };
        let changed = match secret.reread() {
            Ok(changed) => {
                self.unreadable_reported = false;
                changed
            }
            Err(e) => {
                if !self.unreadable_reported {
                    tracing::warn!(error = %e, "cannot read the credentials of {} again; the ones in use are kept", self.account);
                    self.unreadable_reported = true;
                }
                false
            }
        };
        self.link.credentials(secret);
        changed
    }

    /// A read failed: recorded, and the wait before the next one returned.
    pub fn failed(&mut self, e: &(impl Classify + std::fmt::Display)) -> Duration {
        let auth = e.class() == ErrorClass::Auth;
        self.refused = auth;
        if auth {
            if let Some(secret) = &self.secret {
                if secret.generation() != self.tried {
                    // Replaced while the read was under way: read again with the new ones.
                    return Duration::ZERO;
                }
                secret.worked(false);
                // Recorded before the refusal is logged.
                self.link.credentials(secret);
            }
        }
        self.link.mailbox(
            if auth {
                Reach::AuthFailed
            } else {
                Reach::Unreachable
            },
            Some(e.to_string()),
        );
        match e.class() {
            ErrorClass::Auth => {
                if !self.auth_reported {
                    tracing::error!(error = %e, "{} refused the credentials of {}; fix {} in the config; retrying every {}s, and at once when the file holds others", self.server, self.account, self.fix, self.refused_retry.as_secs());
                    self.auth_reported = true;
                }
                if self.reread() {
                    // Replaced since they were read: tried now.
                    return Duration::ZERO;
                }
                self.refused_retry
            }
            ErrorClass::Permanent => {
                tracing::error!(error = %e, "{} cannot be read; retrying in 60s", self.server);
                Duration::from_secs(60)
            }
            _ => {
                let delay = self.backoff.next_delay();
                tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "{} cannot be read", self.server);
                delay
            }
        }
    }
}

impl Classify for IntakeError {
    fn class(&self) -> ErrorClass {
        match self {
            IntakeError::Mailbox(e) => e.class(),
            IntakeError::Cursor(_) => ErrorClass::Permanent,
            IntakeError::Deliver(_) => ErrorClass::Transient,
        }
    }
}

/// One mailbox as the reading loop sees it, whichever system it is on.
pub trait Watched: Send {
    /// Reads what is new and delivers it; how many messages were taken.
    fn read(&mut self) -> impl std::future::Future<Output = Result<usize, IntakeError>> + Send;
    /// How long to wait before the next read, after a good one that took `taken`.
    fn next_read(&mut self, taken: usize) -> Duration;
    /// After a failed read (a reader drops its connection here).
    fn failed(&mut self) {}
    /// The address `agent.ready` names.
    fn address(&self) -> String;
}

/// The one reading loop of every back-end, until `stop`: read, say the agent is ready after
/// the first good read, keep the mailbox's [`Health`], then wait the back-end's interval (or
/// the health rule's delay) unless push wakes it sooner.
pub async fn watch(
    name: &str,
    events: Events,
    mut health: Health<'_>,
    watched: &mut impl Watched,
    mut wake: Option<&mut tokio::sync::mpsc::Receiver<()>>,
    stop: &CancellationToken,
) {
    let mut ready = false;
    let mut changes = health.changes();
    loop {
        // A change heard before this read is the one it uses.
        if let Some(rx) = changes.as_mut() {
            rx.borrow_and_update();
        }
        health.reading();
        let read = tokio::select! {
            r = watched.read() => r,
            _ = stop.cancelled() => return,
        };
        let wait = match read {
            Ok(taken) => {
                if !ready {
                    ready = true;
                    events.emit(
                        crate::events::Event::AgentReady,
                        json!({"agent": name, "email": watched.address()}),
                    );
                }
                health.ok();
                watched.next_read(taken)
            }
            Err(e) => {
                watched.failed();
                health.failed(&e)
            }
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let woken = async {
                match wake.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            let replaced = async {
                match changes.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                Some(()) = woken => {
                    tracing::debug!("woken by push");
                    // When the server said the mailbox changed: where a task's clock starts.
                    events.emit(crate::events::Event::MailboxChanged, json!({"agent": name}));
                    break;
                }
                true = replaced => {
                    tracing::debug!("the credentials changed; reading now");
                    break;
                }
                _ = tokio::time::sleep(CREDENTIALS_RECHECK), if health.refused => {
                    if health.reread() {
                        break;
                    }
                }
                _ = stop.cancelled() => return,
            }
        }
    }
}

/// The JMAP mailbox for [`watch`]: `Email/changes` from the cursor, and after each good read
/// the push loop told where to connect.
struct JmapWatched<'a, D> {
    name: &'a str,
    events: Events,
    mailbox: Reader,
    cursor: Cursor,
    state: Option<Position>,
    deliver: D,
    target_tx: &'a tokio::sync::watch::Sender<Option<PushTarget>>,
    push_up: &'a AtomicBool,
}

impl<D: FnMut(Mail) -> Result<(), DeliverError> + Send> Watched for JmapWatched<'_, D> {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        poll_once(
            self.name,
            self.events,
            &mut self.mailbox,
            &self.cursor,
            &mut self.state,
            &mut self.deliver,
        )
        .await
        .map(|()| 0)
    }

    fn next_read(&mut self, _taken: usize) -> Duration {
        if self.mailbox.account.push {
            let target = self.mailbox.push_target();
            self.target_tx.send_if_modified(|current| {
                let changed = current.as_ref().map(|t| &t.transports)
                    != target.as_ref().map(|t| &t.transports);
                if changed {
                    *current = target;
                }
                changed
            });
        }
        let wait = if self.push_up.load(Ordering::SeqCst) {
            self.mailbox.account.reconcile_interval
        } else {
            self.mailbox.account.poll_interval
        };
        // One of several bridges also looks for tasks to take over every half lease, when
        // nothing arrives to wake it.
        match &self.mailbox.account.replica {
            Some(replica) => wait.min(replica.lease / 2),
            None => wait,
        }
    }

    fn failed(&mut self) {
        self.mailbox.disconnect();
    }

    fn address(&self) -> String {
        self.mailbox.email().to_string()
    }
}

/// Watches one mailbox and hands its AAMP mail to `deliver`, until `stop`.
pub async fn run(
    name: String,
    mailbox: Reader,
    cursor: Cursor,
    link: Link,
    deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
    events: Events,
    stop: CancellationToken,
) {
    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (target_tx, mut target_rx) = tokio::sync::watch::channel::<Option<PushTarget>>(None);
    let push_up = AtomicBool::new(false);
    let use_push = mailbox.account.push;
    // A replaced password is tried by push at once, not after its 5-minute wait.
    let mut password_changes = mailbox.account.password.changes();
    let poll_secs = mailbox.account.poll_interval.as_secs();

    let polling = async {
        let health = Health::new(
            &link,
            "the mail server",
            mailbox.email().to_string(),
            "the password (password_file)",
        )
        .with_secret(mailbox.account.password.clone());
        let mut watched = JmapWatched {
            name: &name,
            events,
            mailbox,
            cursor,
            state: None,
            deliver,
            target_tx: &target_tx,
            push_up: &push_up,
        };
        watch(
            &name,
            events,
            health,
            &mut watched,
            Some(&mut wake_rx),
            &stop,
        )
        .await;
    };

    let pushing = async {
        if !use_push {
            return;
        }
        let mut push_state: Option<String> = None;
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
        // Which of the target's transports is in use; a permanent failure moves to the next.
        let mut which = 0;
        loop {
            // The poll loop publishes where to connect once it has a session.
            let target = loop {
                if let Some(target) = target_rx.borrow_and_update().clone() {
                    break target;
                }
                which = 0;
                tokio::select! {
                    changed = target_rx.changed() => if changed.is_err() { return },
                    _ = stop.cancelled() => return,
                }
            };
            let Some(transport) = target.transports.get(which).cloned() else {
                // Every transport failed for good: poll, and look again when the session changes.
                tokio::select! {
                    _ = target_rx.changed() => which = 0,
                    _ = tokio::time::sleep(Duration::from_secs(600)) => which = 0,
                    _ = stop.cancelled() => return,
                }
                continue;
            };
            let connected = || {
                push_up.store(true, Ordering::SeqCst);
                tracing::info!(%transport, "push connected");
                let kind = match transport {
                    push::Transport::WebSocket(_) => "websocket",
                    push::Transport::EventSource(_) => "eventsource",
                };
                link.push(kind);
                events.emit(
                    crate::events::Event::MailboxPush,
                    json!({"agent": name, "connected": true, "transport": kind}),
                );
                // Catch up on whatever changed while push was down.
                let _ = wake_tx.try_send(());
            };
            let result = push::run(
                &target,
                &transport,
                &mut push_state,
                &wake_tx,
                &stop,
                connected,
            )
            .await;
            let was_up = push_up.swap(false, Ordering::SeqCst);
            if was_up {
                link.push("polling");
                events.emit(
                    crate::events::Event::MailboxPush,
                    json!({"agent": name, "connected": false}),
                );
            }
            let Err(e) = result else { return };
            if was_up {
                backoff.reset();
            }
            let delay = match e.class() {
                ErrorClass::Auth => Duration::from_secs(300),
                ErrorClass::Permanent => {
                    which += 1;
                    match target.transports.get(which) {
                        Some(next) => {
                            tracing::info!(error = %e, %transport, %next, "push is not available this way; trying the next")
                        }
                        None => {
                            tracing::info!(error = %e, "push is not available; polling every {poll_secs}s")
                        }
                    }
                    Duration::ZERO
                }
                _ => {
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "push connection lost; polling meanwhile");
                    delay
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = target_rx.changed() => which = 0,
                Ok(()) = password_changes.changed() => which = 0,
                _ = stop.cancelled() => return,
            }
        }
    };
    tokio::join!(polling, pushing);
}

/// What the poll step reads from: a mailbox that hands out pages of new mail after a
/// position. [`Reader`] (JMAP) is the one in use; the tests below use a fake.
pub(crate) trait Source: Send {
    fn is_connected(&self) -> bool;
    fn connect(&mut self) -> impl std::future::Future<Output = Result<(), MailboxError>> + Send;
    fn email(&self) -> &str;
    /// The position for "everything after now".
    fn current_state(
        &self,
    ) -> impl std::future::Future<Output = Result<String, MailboxError>> + Send;
    fn next_page(
        &self,
        position: &Position,
        page: usize,
    ) -> impl std::future::Future<Output = Result<super::Page, MailboxError>> + Send;
    /// Mail read again outside the cursor: dispatches another replica claimed and stopped
    /// renewing. None for a mailbox of one bridge.
    fn takeovers(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<Mail>, MailboxError>> + Send {
        async { Ok(Vec::new()) }
    }
}

impl Source for Reader {
    fn is_connected(&self) -> bool {
        Reader::is_connected(self)
    }
    async fn connect(&mut self) -> Result<(), MailboxError> {
        Reader::connect(self).await
    }
    fn email(&self) -> &str {
        Reader::email(self)
    }
    async fn current_state(&self) -> Result<String, MailboxError> {
        Reader::current_state(self).await
    }
    async fn next_page(
        &self,
        position: &Position,
        page: usize,
    ) -> Result<super::Page, MailboxError> {
        Reader::next_page(self, position, page).await
    }
    async fn takeovers(&self) -> Result<Vec<Mail>, MailboxError> {
        Reader::expired_claims(self).await
    }
}

/// Reads everything new, page by page: each page's mails are delivered, then the cursor is
/// saved after them.
async fn poll_once(
    name: &str,
    events: Events,
    mailbox: &mut impl Source,
    cursor: &Cursor,
    state: &mut Option<Position>,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<(), IntakeError> {
    if !mailbox.is_connected() {
        mailbox.connect().await?;
        tracing::info!(email = mailbox.email(), "connected to the mailbox");
    }
    let since = match state.clone() {
        Some(s) => s,
        None => match cursor.load()? {
            Some(s) => s,
            None => {
                // First start: work begins with mail that arrives from now on.
                let s = Position::at(mailbox.current_state().await?);
                cursor.save(&s)?;
                s
            }
        },
    };
    let mut position = since;
    loop {
        let page = mailbox.next_page(&position, PAGE).await?;
        for ignored in &page.ignored {
            events.emit(
                crate::events::Event::MessageIgnored,
                json!({"agent": name, "from": ignored.from, "messageId": ignored.message_id,
                       "emailId": ignored.email_id, "reason": ignored.reason}),
            );
        }
        for inbound in page.inbound {
            deliver(inbound).map_err(IntakeError::Deliver)?;
        }
        if page.position != position {
            cursor.save(&page.position)?;
        }
        position = page.position;
        *state = Some(position.clone());
        if !page.more {
            break;
        }
    }
    // Several bridges on one mailbox: the tasks of one that died come back here.
    for mail in mailbox.takeovers().await? {
        tracing::info!("a task another replica stopped renewing is taken over");
        deliver(mail).map_err(IntakeError::Deliver)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The poll step over a fake mailbox: what is delivered, in what order, and where the
    //! cursor stands after a failure or a crash.

    use super::*;
    use crate::mailbox::{Page, Reply};

    /// A mailbox holding `mails` (by number); the position's state is how many were read.
    struct Fake {
        mails: Vec<usize>,
        connected: bool,
        /// `connect` fails while this is set.
        down: bool,
    }

    fn mail(n: usize) -> Mail {
        Mail::Reply(Reply {
            email_id: format!("M{n}"),
            from: "boss@example.test".into(),
            message_id: format!("<{n}@example.test>"),
            in_reply_to: None,
            references: vec![],
            text: String::new(),
            sender_check: crate::mailbox::auth::SenderCheck::Trusted,
            auto_submitted: false,
        })
    }

    fn number(mail: &Mail) -> usize {
        match mail {
            Mail::Reply(r) => r.email_id[1..].parse().unwrap(),
            Mail::Aamp(_) | Mail::Bounce(_) => unreachable!("the fake source makes replies"),
        }
    }

    impl Source for Fake {
        fn is_connected(&self) -> bool {
            self.connected
        }
        async fn connect(&mut self) -> Result<(), MailboxError> {
            if self.down {
                return Err(MailboxError::Push {
                    detail: "connection refused".into(),
                    class: ErrorClass::Transient,
                });
            }
            self.connected = true;
            Ok(())
        }
        fn email(&self) -> &str {
            "agent@example.test"
        }
        async fn current_state(&self) -> Result<String, MailboxError> {
            Ok(self.mails.len().to_string())
        }
        async fn next_page(&self, position: &Position, page: usize) -> Result<Page, MailboxError> {
            let from: usize = position.state.parse().unwrap();
            let to = (from + page).min(self.mails.len());
            Ok(Page {
                inbound: self.mails[from..to].iter().map(|n| mail(*n)).collect(),
                ignored: vec![],
                position: Position {
                    state: to.to_string(),
                    ..Position::default()
                },
                more: to < self.mails.len(),
            })
        }
    }

    fn fake(n: usize) -> Fake {
        Fake {
            mails: (0..n).collect(),
            connected: false,
            down: false,
        }
    }

    fn saved(cursor: &Cursor) -> Option<String> {
        cursor.load().unwrap().map(|p| p.state)
    }

    /// One poll step over `source`: the numbers of the mails delivered go to `seen`; mail
    /// number `refuse` cannot be taken (as when the journal cannot record it).
    async fn poll(
        source: &mut Fake,
        cursor: &Cursor,
        state: &mut Option<Position>,
        refuse: Option<usize>,
        seen: &mut Vec<usize>,
    ) -> Result<(), IntakeError> {
        let mut deliver = |m: Mail| -> Result<(), DeliverError> {
            let n = number(&m);
            if refuse == Some(n) {
                return Err("the journal is full".into());
            }
            seen.push(n);
            Ok(())
        };
        poll_once(
            "agent",
            Events::new(false),
            source,
            cursor,
            state,
            &mut deliver,
        )
        .await
    }

    /// A mailbox whose server takes only the key `good`; each read's time is kept.
    struct Keyed {
        secret: Secret,
        good: String,
        reads: std::sync::Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
    }

    impl Watched for Keyed {
        async fn read(&mut self) -> Result<usize, IntakeError> {
            self.reads.lock().unwrap().push(tokio::time::Instant::now());
            if self.secret.value() == self.good {
                Ok(0)
            } else {
                Err(IntakeError::Mailbox(MailboxError::Http {
                    url: "http://broker.test/inbox".into(),
                    status: 401,
                    body: String::new(),
                }))
            }
        }
        fn next_read(&mut self, _taken: usize) -> Duration {
            Duration::from_secs(600)
        }
        fn address(&self) -> String {
            "coder@broker.test".into()
        }
    }

    fn private(path: &std::path::Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        let fresh = path.with_extension("new");
        std::fs::write(&fresh, text).unwrap();
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::rename(fresh, path).unwrap();
    }

    /// Issue 37: refused credentials waited 5 minutes, read once at start. A key written to
    /// the file is tried within [`CREDENTIALS_RECHECK`]; one that works is not read again
    /// before its interval; a key replaced by a reload (another clone of the secret) is tried
    /// at once.
    #[tokio::test(start_paused = true)]
    async fn refused_credentials_are_read_again_and_a_new_key_is_tried_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        private(&file, "amk_old");
        let secret = Secret::from_file("coder", &file, crate::config::SecretForm::Trimmed).unwrap();
        let link = Link::new(dir.path().join("link.json"));
        let reads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut keyed = Keyed {
            secret: secret.clone(),
            good: "amk_new".into(),
            reads: reads.clone(),
        };
        let stop = CancellationToken::new();
        let health = Health::new(&link, "the AMP broker", "coder".into(), "api_key_file")
            .with_secret(secret.clone());
        let count = || reads.lock().unwrap().len();
        let start = tokio::time::Instant::now();
        let watching = watch("coder", Events::new(false), health, &mut keyed, None, &stop);
        let driving = async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            assert_eq!(count(), 1, "refused once, then waiting");
            let state = super::super::link::read(&dir.path().join("link.json")).unwrap();
            assert_eq!(state.mailbox, Reach::AuthFailed);
            assert_eq!(state.credentials.unwrap().worked, Some(false));
            private(&file, "amk_new\n");
            tokio::time::sleep(CREDENTIALS_RECHECK * 2).await;
            assert_eq!(count(), 2, "the new key tried at the next look at the file");
            let at = reads.lock().unwrap()[1] - start;
            assert!(
                at <= Duration::from_secs(60) + CREDENTIALS_RECHECK,
                "{at:?}"
            );
            let state = super::super::link::read(&dir.path().join("link.json")).unwrap();
            assert_eq!(state.mailbox, Reach::Connected);
            assert_eq!(state.credentials.unwrap().worked, Some(true));
            // Working: the file is not looked at, nor the server asked, before the interval.
            tokio::time::sleep(Duration::from_secs(60)).await;
            assert_eq!(count(), 2);
            // A reload with another key: tried at once.
            private(&file, "amk_other");
            let fresh =
                Secret::from_file("coder", &file, crate::config::SecretForm::Trimmed).unwrap();
            assert!(secret.replace(&fresh));
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert_eq!(count(), 3, "read at once with the reloaded key");
            stop.cancel();
        };
        tokio::join!(watching, driving);
    }

    #[tokio::test]
    async fn a_first_start_begins_after_what_is_already_there() {
        let dir = tempfile::tempdir().unwrap();
        let cursor = Cursor::new(dir.path().join("cursor"));
        let mut source = fake(7);
        let mut seen = Vec::new();
        poll(&mut source, &cursor, &mut None, None, &mut seen)
            .await
            .unwrap();
        assert!(seen.is_empty(), "{seen:?}");
        assert_eq!(saved(&cursor).as_deref(), Some("7"));
    }

    #[tokio::test]
    async fn a_backlog_is_delivered_in_order_a_page_at_a_time_and_the_cursor_follows() {
        let dir = tempfile::tempdir().unwrap();
        let cursor = Cursor::new(dir.path().join("cursor"));
        cursor.save(&Position::at("0".into())).unwrap();
        let mut source = fake(2 * PAGE + 3);
        let mut seen = Vec::new();
        poll(&mut source, &cursor, &mut None, None, &mut seen)
            .await
            .unwrap();
        assert_eq!(seen, (0..2 * PAGE + 3).collect::<Vec<_>>());
        assert_eq!(saved(&cursor), Some((2 * PAGE + 3).to_string()));
    }

    #[tokio::test]
    async fn a_mail_that_cannot_be_taken_stops_the_cursor_before_its_page_until_it_can() {
        let dir = tempfile::tempdir().unwrap();
        let cursor = Cursor::new(dir.path().join("cursor"));
        cursor.save(&Position::at("0".into())).unwrap();
        let mut source = fake(PAGE + 10);
        let mut seen = Vec::new();
        let mut state = None;
        let err = poll(&mut source, &cursor, &mut state, Some(PAGE + 4), &mut seen)
            .await
            .unwrap_err();
        assert_eq!(err.class(), ErrorClass::Transient);
        // The first page is saved; the second is not, so nothing after the refused mail is
        // skipped (nor is the refused one).
        assert_eq!(saved(&cursor), Some(PAGE.to_string()));
        poll(&mut source, &cursor, &mut state, None, &mut seen)
            .await
            .unwrap();
        assert_eq!(saved(&cursor), Some((PAGE + 10).to_string()));
        let mut expected: Vec<usize> = (0..PAGE + 4).collect();
        // The second page again from its start: downstream knows the ones it has.
        expected.extend(PAGE..PAGE + 10);
        assert_eq!(seen, expected);
    }

    #[tokio::test]
    async fn after_a_crash_reading_resumes_from_the_saved_cursor_and_an_outage_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cursor = Cursor::new(dir.path().join("cursor"));
        cursor.save(&Position::at("3".into())).unwrap();
        let mut source = fake(6);
        source.down = true;
        let mut seen = Vec::new();
        let err = poll(&mut source, &cursor, &mut None, None, &mut seen)
            .await
            .unwrap_err();
        assert_eq!(err.class(), ErrorClass::Transient);
        assert_eq!(saved(&cursor).as_deref(), Some("3"));
        source.down = false;
        // A new life: no state in memory, only the cursor file.
        poll(&mut source, &cursor, &mut None, None, &mut seen)
            .await
            .unwrap();
        assert_eq!(seen, vec![3, 4, 5]);
        assert_eq!(saved(&cursor).as_deref(), Some("6"));
    }
}
