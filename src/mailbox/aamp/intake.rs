//! The AAMP intake: watches one JMAP mailbox and hands each new AAMP mail to a `deliver`
//! callback, in order, a page at a time. The cursor (how far the mailbox has been read) is
//! saved only after every mail before it was delivered, so a crash re-reads mail rather than
//! losing it; whoever is delivered to recognises a mail it already has. Two loops share the
//! work: the reading loop ([`intake::watch`]) reads changes (`Email/changes` from the saved
//! cursor) on a timer and whenever push wakes it; the push supervisor
//! ([`intake::supervise_push`]) keeps a JMAP WebSocket or EventSource open when the server
//! offers one. With push up, the timer only reconciles (`reconcile_interval`); without it, it
//! polls (`poll_interval`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::push::{self, PushTarget};
use super::{Cursor, Page, Position, Reader};
use crate::error::ErrorClass;
use crate::events::Events;
use crate::mailbox::intake::{self, Closed, DeliverError, Health, IntakeError, Pushed, Watched};
use crate::mailbox::link::Link;
use crate::mailbox::{Mail, MailboxError};

/// Mails read and delivered per page.
const PAGE: usize = 50;

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
    let (target_tx, target_rx) = tokio::sync::watch::channel::<Option<PushTarget>>(None);
    let push_up = AtomicBool::new(false);
    let pushed = mailbox.account.push.then_some(JmapPush {
        target_rx,
        target: None,
        which: 0,
        push_state: None,
    });
    let password = mailbox.account.password.clone();
    let health = Health::new(
        &link,
        "the mail server",
        mailbox.email().to_string(),
        "the password (password_file)",
    )
    .with_secret(password.clone());
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
    intake::watch_pushed(
        &name,
        events,
        health,
        &mut watched,
        &password,
        pushed,
        &push_up,
        &stop,
    )
    .await;
}

/// JMAP push for the supervisor: where to connect comes from the reading loop (the session's
/// push URLs), each of the server's transports tried in turn.
struct JmapPush {
    target_rx: tokio::sync::watch::Receiver<Option<PushTarget>>,
    target: Option<PushTarget>,
    /// Which of the target's transports is in use; a permanent failure moves to the next.
    which: usize,
    /// The last push state heard, so a reconnection asks only for what came after it.
    push_state: Option<String>,
}

impl JmapPush {
    fn current(&self) -> Option<&push::Transport> {
        self.target.as_ref()?.transports.get(self.which)
    }
}

impl Pushed for JmapPush {
    async fn ready(&mut self, stop: &CancellationToken) -> bool {
        loop {
            if let Some(target) = self.target_rx.borrow_and_update().clone() {
                self.target = Some(target);
                return true;
            }
            self.which = 0;
            tokio::select! {
                changed = self.target_rx.changed() => if changed.is_err() { return false },
                _ = stop.cancelled() => return false,
            }
        }
    }

    fn transport(&self) -> &'static str {
        match self.current() {
            Some(push::Transport::EventSource(_)) => "eventsource",
            _ => "websocket",
        }
    }

    async fn connect(
        &mut self,
        wake: &tokio::sync::mpsc::Sender<()>,
        stop: &CancellationToken,
        connected: impl FnOnce() + Send,
    ) -> Result<Closed, MailboxError> {
        let (Some(target), Some(transport)) = (self.target.clone(), self.current().cloned()) else {
            return Err(MailboxError::Push {
                detail: "the server offers no push transport".into(),
                class: ErrorClass::Permanent,
            });
        };
        let listener = push::Listener {
            target: &target,
            push_state: &mut self.push_state,
            changed: wake,
            stop,
        };
        push::run(listener, &transport, connected)
            .await
            .map(|()| Closed::Stopped)
    }

    fn next_way(&mut self) -> bool {
        self.which += 1;
        self.current().is_some()
    }

    fn restart(&mut self) {
        self.which = 0;
    }

    async fn moved(&mut self) {
        if self.target_rx.changed().await.is_err() {
            std::future::pending::<()>().await
        }
    }
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
    ) -> impl std::future::Future<Output = Result<Page, MailboxError>> + Send;
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
    async fn next_page(&self, position: &Position, page: usize) -> Result<Page, MailboxError> {
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
    use crate::error::Classify as _;
    use crate::mailbox::Reply;

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
            sender_check: crate::inbound::SenderCheck::Trusted,
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
