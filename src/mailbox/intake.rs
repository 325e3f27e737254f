//! What every back-end's intake shares: the one reading loop ([`watch`]: read, keep the
//! mailbox's [`Health`], wait the back-end's interval unless push wakes it), the one rule for
//! a mailbox's link state ([`Health`]: refused keys, permanent errors, backoff), and the one
//! push supervisor ([`supervise_push`]: connect, say so in `status` and the events, reconnect
//! by the same rule, try again at once with replaced credentials) over each pushed back-end's
//! own connection ([`Pushed`]). Each back-end's reading of its own system lives in its folder.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::link::{Link, Reach};
use super::MailboxError;
use crate::backoff::Backoff;
use crate::config::Secret;
use crate::error::{Classify, ErrorClass};
use crate::events::Events;

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
    /// the default five minutes (servers lock accounts out for repeated failed logins), and so
    /// does a bearer key on a server that locks out an address after failed keys (SAMP).
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

    /// Hears the credentials refused, here or by the outbox's sends.
    fn refusals(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.secret.as_ref().map(Secret::refusals)
    }

    /// The credentials were refused elsewhere (the outbox's send of an answer) while the
    /// reads took them (a push socket opened before a token was revoked reads nothing new
    /// until its next catch-up): `status` shows the refusal, and the file is read again every
    /// [`CREDENTIALS_RECHECK`] from now on, so a replaced key sends the answer within seconds,
    /// not at the next read.
    fn refused_elsewhere(&mut self) {
        let Some(secret) = &self.secret else {
            return;
        };
        if self.refused || secret.status().worked != Some(false) {
            return;
        }
        self.refused = true;
        self.link.credentials(secret);
        let why = format!(
            "{} refused the credentials of {} for a send; fix {}",
            self.server, self.account, self.fix
        );
        tracing::error!(
            "{why}; the file is read again every {}s and a replaced one is used at once",
            CREDENTIALS_RECHECK.as_secs()
        );
        self.auth_reported = true;
        self.link.mailbox(Reach::AuthFailed, Some(why));
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
            // An answer that is not what the server's API gives (an HTML page from a proxy,
            // cut JSON, with status 200) is a passing fault to a reader: tried again on the
            // short schedule, not waited out a minute each time like a permanent error.
            IntakeError::Mailbox(MailboxError::Protocol { .. }) => ErrorClass::Transient,
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
    let mut refusals = health.refusals();
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
            let refused = async {
                match refusals.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                true = refused => health.refused_elsewhere(),
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

/// How one push connection ended, when it did not fail.
#[derive(Debug)]
pub enum Closed {
    /// `stop` was cancelled.
    Stopped,
    /// The server closed it, with its words when it gave any.
    ByServer(Option<String>),
    /// Closed by the bridge: the credentials it was opened with were replaced.
    Replaced,
}

/// One pushed back-end's connection, as [`supervise_push`] drives it.
pub trait Pushed: Send {
    /// Waits until there is somewhere to connect (JMAP: the session the reading loop found);
    /// false when `stop` came first.
    fn ready(&mut self, stop: &CancellationToken) -> impl Future<Output = bool> + Send {
        let _ = stop;
        async { true }
    }
    /// The way the next connection goes, as `status` names it (`websocket`, `eventsource`).
    fn transport(&self) -> &'static str;
    /// One connection, until it ends: `connected` is called once it is up, and every change
    /// the server tells of wakes the reading loop through `wake`.
    fn connect(
        &mut self,
        wake: &mpsc::Sender<()>,
        stop: &CancellationToken,
        connected: impl FnOnce() + Send,
    ) -> impl Future<Output = Result<Closed, MailboxError>> + Send;
    /// After a permanent failure: moves to the next way to connect; false when none is left.
    fn next_way(&mut self) -> bool {
        false
    }
    /// Back to the first way (the place to connect, or the credentials, changed).
    fn restart(&mut self) {}
    /// Resolves when the place to connect changed (JMAP: a new session).
    fn moved(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// A pushed back-end's reading loop beside its push supervisor, until `stop`: each change
/// pushed wakes the reading loop, and `push_up` tells it push is up. `pushed` is `None` when
/// the mailbox does not use push (the loop then only polls).
#[allow(clippy::too_many_arguments)]
pub async fn watch_pushed(
    name: &str,
    events: Events,
    health: Health<'_>,
    watched: &mut impl Watched,
    secret: &Secret,
    pushed: Option<impl Pushed>,
    push_up: &AtomicBool,
    stop: &CancellationToken,
) {
    let link = health.link;
    let (wake, mut woken) = mpsc::channel::<()>(1);
    let pushing = async {
        if let Some(pushed) = pushed {
            supervise_push(name, link, events, secret, pushed, &wake, push_up, stop).await;
        }
    };
    let reading = watch(name, events, health, watched, Some(&mut woken), stop);
    tokio::join!(pushing, reading);
}

/// While every way to push failed for good, how often it is tried again anyway.
const PUSH_GIVEN_UP_RETRY: Duration = Duration::from_secs(600);
/// After the server refused the credentials, how long before push tries the same ones again
/// (replaced ones are tried at once).
const PUSH_REFUSED_RETRY: Duration = Duration::from_secs(300);

/// The one push supervisor of every pushed back-end, until `stop`: keeps `pushed` connected,
/// says so in the link state (`status`) and as `mailbox.push` events, and sets `push_up` while
/// it is up (the reading loop then only reconciles). After a drop it reconnects with backoff;
/// refused credentials wait [`PUSH_REFUSED_RETRY`], unless `secret` is replaced meanwhile (then
/// at once); a permanent failure moves to the next way, and when none is left the mailbox is
/// polled and push tried again when the place to connect changes, or after
/// [`PUSH_GIVEN_UP_RETRY`].
#[allow(clippy::too_many_arguments)]
pub async fn supervise_push(
    name: &str,
    link: &Link,
    events: Events,
    secret: &Secret,
    mut pushed: impl Pushed,
    wake: &mpsc::Sender<()>,
    push_up: &AtomicBool,
    stop: &CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
    let mut replaced = secret.changes();
    replaced.borrow_and_update();
    let report = PushReport {
        name,
        link,
        events: &events,
        wake,
        push_up,
    };
    let mut given_up = false;
    loop {
        if !pushed.ready(stop).await {
            return;
        }
        if given_up {
            tokio::select! {
                _ = tokio::time::sleep(PUSH_GIVEN_UP_RETRY) => {}
                _ = pushed.moved() => {}
                Ok(()) = replaced.changed() => {}
                _ = stop.cancelled() => return,
            }
            given_up = false;
            pushed.restart();
            continue;
        }
        let transport = pushed.transport();
        let result = pushed.connect(wake, stop, || report.up(transport)).await;
        if report.down() {
            // It was up: a drop after that starts the waits over.
            backoff.reset();
        }
        if stop.is_cancelled() {
            return;
        }
        let delay = match after_close(result, &mut pushed, &mut backoff, &mut given_up) {
            AfterClose::Stop => return,
            AfterClose::Replaced => {
                // Seen here: the wait after a later refusal must not end at once for it.
                replaced.borrow_and_update();
                continue;
            }
            AfterClose::Wait(delay) => delay,
        };
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = pushed.moved() => pushed.restart(),
            Ok(()) = replaced.changed() => {
                pushed.restart();
                backoff.reset();
            }
            _ = stop.cancelled() => return,
        }
    }
}

/// Where the push supervisor tells whether push is up: the link state, the events, the
/// reading loop's flag and its wake-up.
struct PushReport<'a> {
    name: &'a str,
    link: &'a Link,
    events: &'a Events,
    wake: &'a mpsc::Sender<()>,
    push_up: &'a AtomicBool,
}

impl PushReport<'_> {
    fn up(&self, transport: &'static str) {
        self.push_up.store(true, Ordering::SeqCst);
        tracing::info!(transport, "push connected");
        self.link.push(transport);
        self.events.emit(
            crate::events::Event::MailboxPush,
            json!({"agent": self.name, "connected": true, "transport": transport}),
        );
        // Catch up on whatever changed while push was down.
        let _ = self.wake.try_send(());
    }

    /// Push is down; true when it was up until now (and this said so).
    fn down(&self) -> bool {
        if !self.push_up.swap(false, Ordering::SeqCst) {
            return false;
        }
        self.link.push("polling");
        self.events.emit(
            crate::events::Event::MailboxPush,
            json!({"agent": self.name, "connected": false}),
        );
        true
    }
}

/// What the supervisor does after a connection ended.
enum AfterClose {
    Stop,
    /// Connect again at once, with the replaced credentials.
    Replaced,
    Wait(Duration),
}

/// How long to wait after a connection ended as `result` says: backoff after a drop, the
/// refused-credentials wait, or the next way at once (`given_up` when none is left).
fn after_close(
    result: Result<Closed, MailboxError>,
    pushed: &mut impl Pushed,
    backoff: &mut Backoff,
    given_up: &mut bool,
) -> AfterClose {
    let e = match result {
        Ok(Closed::Stopped) => return AfterClose::Stop,
        Ok(Closed::Replaced) => {
            tracing::info!("the credentials were replaced; push connects again with them");
            return AfterClose::Replaced;
        }
        Ok(Closed::ByServer(why)) => {
            let delay = backoff.next_delay();
            tracing::info!(
                closed = why.as_deref().unwrap_or("without a close frame"),
                retry_in_s = delay.as_secs(),
                "the server closed the push connection; reconnecting"
            );
            return AfterClose::Wait(delay);
        }
        Err(e) => e,
    };
    AfterClose::Wait(match e.class() {
        ErrorClass::Auth => {
            tracing::warn!(error = %e, retry_in_s = PUSH_REFUSED_RETRY.as_secs(), "the server refused the credentials for push; polling meanwhile, and trying push again at once with replaced ones");
            PUSH_REFUSED_RETRY
        }
        ErrorClass::Permanent => {
            if pushed.next_way() {
                tracing::info!(error = %e, next = pushed.transport(), "push is not available this way; trying the next");
            } else {
                tracing::info!(error = %e, "push is not available; polling");
                *given_up = true;
            }
            Duration::ZERO
        }
        _ => {
            let delay = backoff.next_delay();
            tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "push connection lost; polling meanwhile");
            delay
        }
    })
}

#[cfg(test)]
mod tests;
