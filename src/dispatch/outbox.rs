//! The outbox worker: sends the acks, questions and results the journal holds, oldest first
//! (a task's mails in order), each exactly as recorded. A mail is marked sent only once the
//! mail server accepted it; until then it is retried with capped, jittered backoff, across
//! restarts, for `retry_for` (default a day). A refusal that will not change (the server
//! rejects the recipient) is given up at once. While the server cannot be reached, one mail
//! is tried at least every [`PROBE_MAX`], and the first that goes through makes every waiting
//! mail due. Sending never blocks the tasks: it is its own loop, woken whenever something is
//! queued, at the next due time, or at the next try of the server; never by polling. A mail that waits on a claim (one of several
//! replicas answering mail none of them runs) leaves only from the replica that wins it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::compose;
use super::journal::{JournalError, Outgoing, Pending, TaskState};
use super::{results, Common, Task};
use crate::backend::{Backend, BackendError, ClaimOutcome};
use crate::backoff::Backoff;
use crate::error::{Classify, ErrorClass};
use crate::protocol::{AampMessage, Body, Envelope, OutgoingFile, Status, TaskResult, Usage};

/// One agent's outbox: the answers composed, queued in the journal, and sent by its worker
/// ([`Outbox::run`], which the daemon runs). Cheap to clone.
pub struct Outbox<B> {
    common: Arc<Common<B>>,
    worker: Arc<Worker>,
}

impl<B> Clone for Outbox<B> {
    fn clone(&self) -> Self {
        Outbox {
            common: self.common.clone(),
            worker: self.worker.clone(),
        }
    }
}

/// The outbox worker's state.
#[derive(Default)]
struct Worker {
    /// Wakes the worker.
    wake: Notify,
    /// Rounds the worker made (see [`Outbox::rounds`]).
    rounds: AtomicU64,
    /// The mailbox answers again ([`Outbox::server_back`]): the outbox tries at once.
    server_back: AtomicBool,
}

/// Mails read from the journal per round.
const BATCH: usize = 32;
/// How long the worker sleeps when nothing is due.
const IDLE: Duration = Duration::from_secs(3600);
/// While the server cannot be reached, the oldest waiting mail is tried again at most this
/// long after the last try, whatever its own backoff says: the first send that goes through
/// makes every waiting mail due at once, so a short outage ends for all of them within
/// seconds of the server's return, not at each one's next backoff (up to 5 minutes).
const PROBE_MAX: Duration = Duration::from_secs(5);

/// How long a mail the server refused to take under these credentials waits before it is
/// tried again (unless the credentials change first).
const REFUSED_RETRY: Duration = Duration::from_secs(300);

/// What became of one attempt.
enum Sent {
    Yes,
    /// Another replica won the claim the mail waited on, and answers instead.
    Elsewhere(String),
    /// Not now; the round stops (the server is likely down for every mail). `Some(delay)`
    /// when the server could not be reached (the oldest mail is tried again after at most
    /// `delay`, capped at [`PROBE_MAX`]); `None` when it refused the login (tried again
    /// after [`REFUSED_RETRY`], or when the credentials change).
    Later(Option<Duration>),
}

impl<B: Backend> Outbox<B> {
    pub(super) fn new(common: Arc<Common<B>>) -> Self {
        Outbox {
            common,
            worker: Arc::default(),
        }
    }

    fn spec(&self) -> Arc<super::AgentSpec> {
        self.common.spec()
    }

    /// Wakes the outbox worker: something was queued for it.
    pub(super) fn wake(&self) {
        self.worker.wake.notify_one();
    }

    /// Queues a mail that belongs to a task under way (a question, a stream announcement).
    pub(super) fn enqueue(&self, task: &Task, mail: &Outgoing) -> Result<(), JournalError> {
        self.common
            .journal
            .enqueue(&self.spec().name, Some(task.row), mail)?;
        self.wake();
        Ok(())
    }

    /// A reply to `env` carrying `body`, rendered now, with the Message-ID derived from the
    /// task (`n` tells apart several mails of one intent).
    pub(super) fn compose(&self, env: &Envelope, key: &str, body: Body, n: u32) -> Outgoing {
        self.compose_with(env, key, body, n, &[])
    }

    /// [`Outbox::compose`] with files attached.
    pub(super) fn compose_with(
        &self,
        env: &Envelope,
        key: &str,
        body: Body,
        n: u32,
        files: &[results::Attached],
    ) -> Outgoing {
        let email = &self.spec().email;
        let intent = body.intent().as_str();
        let mut msg = AampMessage::reply(env, email, body);
        msg.envelope.message_id = compose::derived_message_id(email, key, intent, n);
        let files: Vec<OutgoingFile> = files
            .iter()
            .map(|f| OutgoingFile {
                filename: f.filename.clone(),
                content_type: f.content_type.clone(),
                bytes: f.bytes.clone(),
            })
            .collect();
        Outgoing {
            intent: intent.to_string(),
            mail: crate::protocol::render_with(&msg, SystemTime::now(), &files),
            claim: None,
        }
    }

    /// The `task.result` rejected with `reason` that answers `env`.
    pub(super) fn rejection(&self, env: &Envelope, key: &str, reason: &str) -> Outgoing {
        let result = TaskResult {
            status: Status::Rejected,
            output: String::new(),
            error: Some(reason.to_string()),
            structured_result: None,
            usage: None,
        };
        self.compose(env, key, Body::Result(result), 0)
    }

    /// [`Outbox::rejection`] for a task that ran (journal row `row`): with what it spent.
    pub(super) fn spent_rejection(
        &self,
        row: i64,
        env: &Envelope,
        key: &str,
        reason: &str,
    ) -> Outgoing {
        let result = TaskResult {
            status: Status::Rejected,
            output: String::new(),
            error: Some(reason.to_string()),
            structured_result: None,
            usage: self.usage_of(row),
        };
        self.compose(env, key, Body::Result(result), 0)
    }

    /// What task `row` cost over all its runs, for its result; `None` when its agent reported
    /// nothing, or the journal could not say (logged: the result still goes, without it).
    pub(super) fn usage_of(&self, row: i64) -> Option<Usage> {
        self.common
            .journal
            .task_usage(row)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not read the task's usage; the result goes without it");
                None
            })
    }

    /// `reply` as one of several replicas sends it: only if it wins (or still holds, or
    /// itself marked done) the claim on `email_id`. For answers they would all give alike
    /// to mail none of them runs (a refusal, a card), and for a task's result, which must
    /// not leave from a replica that lost the task while it was down.
    pub(super) fn once_among_replicas(&self, mut reply: Outgoing, email_id: &str) -> Outgoing {
        if self.spec().replica.is_some() {
            reply.claim = Some(email_id.to_string());
        }
        reply
    }

    /// Records the task's final state with its answer and wakes the worker. A journal
    /// failure is logged; the answer then goes out directly, once.
    pub(super) fn finish(
        &self,
        task: &Task,
        state: TaskState,
        reason: Option<&str>,
        reply: Option<Outgoing>,
    ) {
        // One of several replicas sends its answer only while it still holds the task's
        // claim (or marked it done itself): killed between recording and sending, it may
        // come back after another replica took the task over and answered, and its
        // recorded answer must not leave then too (issue 43: two answers under one
        // Message-ID). The outbox claims before it sends; a lost claim drops the mail.
        let reply = reply.map(|r| self.once_among_replicas(r, &task.extras.email_id));
        let recorded =
            self.common
                .journal
                .finish(&self.spec().name, task.row, state, reason, reply.as_ref());
        match (recorded, reply) {
            (Ok(()), reply) => {
                if reply.is_some() {
                    fault_exit_after_result();
                }
                self.wake()
            }
            (Err(_), None) => {}
            (Err(e), Some(reply)) => {
                tracing::error!(error = %e, "could not record the task's answer in the journal; sending it once without the journal");
                let common = self.common.clone();
                self.common.tracker.spawn(async move {
                    if let Err(e) = common.backend.submit(&reply.mail).await {
                        tracing::error!(error = %e, "could not send the task's answer");
                    }
                });
            }
        }
    }

    /// The mailbox's credentials were replaced: what waits in the outbox for a later retry
    /// is tried now.
    pub fn retry_now(&self) {
        match self.common.journal.retry_now(&self.spec().name) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                mails = n,
                "the credentials changed: sending what waited now"
            ),
            Err(e) => tracing::warn!(error = %e, "could not move the outbox's retries"),
        }
        // Tried now, not at the next try of a server that refused the old ones.
        self.server_back();
    }

    /// Sends what is due until `stop`; then makes one last round (bounded by `last_round`) so
    /// answers recorded during the shutdown still leave when the server is up. It waits on
    /// events only: woken when something is queued, or at the next mail's due time, or (while
    /// the server is down) at the next probe; never by looking at the journal in a loop.
    pub async fn run(self, stop: CancellationToken, last_round: Duration) {
        let inner = &self.common;
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        // While the server is unreachable: when the oldest waiting mail is tried again.
        let mut probe: Option<Instant> = None;
        loop {
            let wake = match self.round(&mut backoff, &mut probe).await {
                // While the server is down nothing is sent before its next try, whatever is
                // due meanwhile (a mail queued now is due now): waiting for the next due
                // time then would look at the journal every few milliseconds until the try.
                Ok(()) => probe.unwrap_or_else(|| Instant::now() + self.until_next_due()),
                Err(e) => {
                    tracing::error!(error = %e, "the outbox cannot read the journal; retrying");
                    Instant::now() + backoff.next_delay()
                }
            };
            tokio::select! {
                _ = self.worker.wake.notified() => {}
                _ = tokio::time::sleep_until(wake) => {}
                _ = stop.cancelled() => break,
            }
        }
        let unsent = inner.journal.unsent(&self.spec().name).unwrap_or(0);
        if unsent > 0 {
            backoff.reset();
            let mut probe = Some(Instant::now());
            let _ = tokio::time::timeout(last_round, self.round(&mut backoff, &mut probe)).await;
            let left = inner.journal.unsent(&self.spec().name).unwrap_or(0);
            if left > 0 {
                tracing::warn!(
                    unsent = left,
                    "mails still waiting to be sent; they go out at the next start"
                );
            }
        }
    }

    /// The agent's mailbox answers again after an outage (its link came up): mail waiting
    /// for the server is tried now, not at the next probe.
    pub fn server_back(&self) {
        self.worker.server_back.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// How many rounds the outbox worker has made (each reads the journal once or more):
    /// for tests and figures, as an idle worker must make none.
    pub fn rounds(&self) -> u64 {
        self.worker.rounds.load(Ordering::Relaxed)
    }

    /// How long until the next mail is due (only mails first in their task's line count: a
    /// task's result waits for its ack, whatever its own time says).
    fn until_next_due(&self) -> Duration {
        match self.common.journal.next_due(&self.spec().name) {
            Ok(Some(at)) => at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
                .max(Duration::from_millis(10)),
            _ => IDLE,
        }
    }

    /// Sends every due mail, oldest first. While the server is down (`probe` set) one mail is
    /// tried, when the probe is due; once a mail goes through after that, every waiting mail
    /// is made due and sent in order.
    async fn round(
        &self,
        backoff: &mut Backoff,
        probe: &mut Option<Instant>,
    ) -> Result<(), JournalError> {
        let journal = &self.common.journal;
        let agent = self.spec().name.clone();
        self.worker.rounds.fetch_add(1, Ordering::Relaxed);
        if self.worker.server_back.swap(false, Ordering::SeqCst) {
            if let Some(at) = probe.as_mut() {
                *at = Instant::now();
            }
        }
        loop {
            let due = match *probe {
                // The probe: a due mail if there is one (a mail that fails on its own account
                // waits out its backoff, and holds up no other), else the oldest waiting.
                Some(at) if at <= Instant::now() => match journal.due(&agent, 1)? {
                    due if due.is_empty() => journal.oldest_waiting(&agent)?,
                    due => due,
                },
                Some(_) => return Ok(()),
                None => journal.due(&agent, BATCH)?,
            };
            if due.is_empty() {
                *probe = None;
                return Ok(());
            }
            for pending in &due {
                match self.attempt(pending, backoff).await? {
                    Sent::Yes | Sent::Elsewhere(_) => {
                        backoff.reset();
                        if probe.take().is_some() {
                            let resumed = journal.resume(&agent)?;
                            tracing::info!(
                                waiting = resumed,
                                "the mail server takes mail again; sending every waiting mail now"
                            );
                        }
                    }
                    Sent::Later(reachable) => {
                        // Refused credentials hold up every mail alike: the next try is
                        // at the refused mail's own retry, or at once when the credentials
                        // change ([`Outbox::retry_now`]), not one login a mail.
                        let wait = reachable.map_or(REFUSED_RETRY, |d| d.min(PROBE_MAX));
                        *probe = Some(Instant::now() + wait);
                        return Ok(());
                    }
                }
            }
        }
    }

    /// One attempt at one mail, its log lines in a span naming the mail (its task, intent
    /// and Message-ID). The span is the future's (`instrument`), not entered across the
    /// awaits: a guard held over an await leaves the lines after it without the span once
    /// the task resumes on another thread.
    #[tracing::instrument(name = "outbox", level = "info", skip_all, fields(
        task_id = pending.task_id.as_deref().unwrap_or(""),
        intent = %pending.mail.intent,
        message_id = %pending.mail.mail.message_id,
    ))]
    async fn attempt(
        &self,
        pending: &Pending,
        backoff: &mut Backoff,
    ) -> Result<Sent, JournalError> {
        let inner = &self.common;
        let journal = &inner.journal;
        let mail = &pending.mail;
        let event = json!({"agent": self.spec().name, "taskId": pending.task_id, "intent": mail.intent,
                           "messageId": mail.mail.message_id, "attempt": pending.attempts + 1});
        match self.claim_and_submit(mail).await {
            Ok(Sent::Elsewhere(by)) => {
                tracing::info!(replica = %by, "another replica won this mail's claim and answers it; not sent here");
                journal.answered_elsewhere(pending, &by)?;
                Ok(Sent::Elsewhere(by))
            }
            Ok(_) => {
                journal.mark_sent(pending)?;
                tracing::info!(attempt = pending.attempts + 1, "sent");
                if mail.intent == "task.ack" {
                    inner
                        .events
                        .emit(crate::events::Event::TaskAcked, event.clone());
                }
                inner.events.emit(crate::events::Event::MailSent, event);
                Ok(Sent::Yes)
            }
            Err(e) => {
                let waited = SystemTime::now()
                    .duration_since(pending.created_at)
                    .unwrap_or_default();
                let error = e.to_string();
                if e.class() == ErrorClass::Permanent || waited >= inner.settings.retry_for {
                    let why = if e.class() == ErrorClass::Permanent {
                        "the server refused it for good".to_string()
                    } else {
                        format!("retried for {}s", waited.as_secs())
                    };
                    tracing::error!(error = %e, attempts = pending.attempts + 1, "could not send {}; giving up ({why})", mail.intent);
                    journal.give_up(pending, &error)?;
                    inner.events.emit(crate::events::Event::MailFailed, event);
                    Ok(Sent::Yes)
                } else {
                    let delay = if e.class() == ErrorClass::Auth {
                        REFUSED_RETRY
                    } else {
                        backoff.next_delay()
                    };
                    tracing::warn!(error = %e, attempts = pending.attempts + 1, retry_in_s = delay.as_secs(), "could not send {}; it stays in the outbox", mail.intent);
                    journal.retry_at(pending, SystemTime::now() + delay, &error)?;
                    inner.events.emit(crate::events::Event::MailRetrying, event);
                    Ok(Sent::Later(
                        (e.class() != ErrorClass::Auth).then_some(delay),
                    ))
                }
            }
        }
    }

    /// Submits the mail, after winning its claim when it waits on one. The claim is marked
    /// done before the mail is submitted, so no replica takes it over while sending is
    /// retried; a retry finds it done by this replica and sends.
    async fn claim_and_submit(&self, mail: &Outgoing) -> Result<Sent, BackendError> {
        let backend = &self.common.backend;
        if let Some(email_id) = &mail.claim {
            let spec = self.spec();
            let me = spec.replica.as_ref().map(|r| r.name.as_str());
            match backend.claim(email_id).await? {
                ClaimOutcome::Lost { by } if by.is_none() || by.as_deref() != me => {
                    return Ok(Sent::Elsewhere(
                        by.unwrap_or_else(|| "another replica".to_string()),
                    ));
                }
                _ => {
                    // Marked only while this replica holds the claim: a takeover made since
                    // the claim above leaves the answer to its new holder.
                    if !backend.claim_done(email_id).await? {
                        return Ok(Sent::Elsewhere("another replica".to_string()));
                    }
                }
            }
        }
        backend.submit(&mail.mail).await?;
        Ok(Sent::Yes)
    }
}

/// The environment variable that names a fault to inject, for tests that must stop the
/// bridge at one exact point (no other way to hit the window between two steps
/// deterministically from outside).
pub const FAULT_VAR: &str = "AAMP_BRIDGE_FAULT";

/// `AAMP_BRIDGE_FAULT=exit-after-result`: the process ends (as a kill -9 there would end it,
/// without cleanup) right after a task's answer is recorded in the journal and before the
/// outbox is woken to send it (tests/replica_restart.rs).
fn fault_exit_after_result() {
    if std::env::var(FAULT_VAR).is_ok_and(|v| v == "exit-after-result") {
        tracing::warn!("{FAULT_VAR}=exit-after-result: exiting after recording the answer");
        std::process::exit(137);
    }
}
