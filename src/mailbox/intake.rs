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
use super::{Cursor, Mail, Mailbox, MailboxError, Position};
use crate::backoff::Backoff;
use crate::error::{Classify, ErrorClass};
use crate::events::Events;

/// Mails read and delivered per page.
const PAGE: usize = 50;

/// Why a mail could not be taken: the intake stops there and tries again later, without
/// moving the cursor past it.
pub type DeliverError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
enum IntakeError {
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
    #[error("cannot read or write the cursor file: {0}")]
    Cursor(#[from] std::io::Error),
    #[error("a mail could not be taken: {0}")]
    Deliver(DeliverError),
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

/// Watches one mailbox and hands its AAMP mail to `deliver`, until `stop`.
pub async fn run(
    name: String,
    mut mailbox: Mailbox,
    cursor: Cursor,
    link: Link,
    mut deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
    events: Events,
    stop: CancellationToken,
) {
    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (target_tx, mut target_rx) = tokio::sync::watch::channel::<Option<PushTarget>>(None);
    let push_up = AtomicBool::new(false);
    let use_push = mailbox.account.push;
    let poll_secs = mailbox.account.poll_interval.as_secs();

    let polling = async {
        let mut state: Option<Position> = None;
        let mut ready = false;
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
        let mut auth_reported = false;
        loop {
            let poll = tokio::select! {
                result = poll_once(&name, events, &mut mailbox, &cursor, &mut state, &mut deliver) => result,
                _ = stop.cancelled() => return,
            };
            let wait = match poll {
                Ok(()) => {
                    if !ready {
                        ready = true;
                        events.emit(
                            "agent.ready",
                            json!({"agent": name, "email": mailbox.email()}),
                        );
                    }
                    if backoff.failures() > 0 {
                        tracing::info!("mailbox reachable again");
                    }
                    backoff.reset();
                    auth_reported = false;
                    link.mailbox(Reach::Connected, None);
                    if use_push {
                        let target = mailbox.push_target();
                        target_tx.send_if_modified(|current| {
                            let changed = current.as_ref().map(|t| &t.transports)
                                != target.as_ref().map(|t| &t.transports);
                            if changed {
                                *current = target;
                            }
                            changed
                        });
                    }
                    if push_up.load(Ordering::SeqCst) {
                        mailbox.account.reconcile_interval
                    } else {
                        mailbox.account.poll_interval
                    }
                }
                Err(e) => {
                    mailbox.disconnect();
                    let reach = if e.class() == ErrorClass::Auth {
                        Reach::AuthFailed
                    } else {
                        Reach::Unreachable
                    };
                    link.mailbox(reach, Some(e.to_string()));
                    match e.class() {
                        ErrorClass::Auth => {
                            if !auth_reported {
                                tracing::error!(error = %e, "the mail server refused the credentials of {}; fix the password in the config; retrying every 5 minutes", mailbox.email());
                                auth_reported = true;
                            }
                            Duration::from_secs(300)
                        }
                        ErrorClass::Permanent => {
                            tracing::error!(error = %e, "mailbox error; retrying in 60s");
                            Duration::from_secs(60)
                        }
                        _ => {
                            let delay = backoff.next_delay();
                            tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "mailbox unreachable");
                            delay
                        }
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                Some(()) = wake_rx.recv() => {
                    tracing::debug!("woken by push");
                    // When the server said the mailbox changed: where a task's clock starts.
                    events.emit("mailbox.changed", json!({"agent": name}));
                }
                _ = stop.cancelled() => return,
            }
        }
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
                    "mailbox.push",
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
                events.emit("mailbox.push", json!({"agent": name, "connected": false}));
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
                _ = stop.cancelled() => return,
            }
        }
    };
    tokio::join!(polling, pushing);
}

/// Reads everything new, page by page: each page's mails are delivered, then the cursor is
/// saved after them.
async fn poll_once(
    name: &str,
    events: Events,
    mailbox: &mut Mailbox,
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
                "message.ignored",
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
            return Ok(());
        }
    }
}
