//! Where each inbound message goes: a plain reply to a question, a dispatch (admitted or refused,
//! before anything is acknowledged), a card query, a cancel; what the journal keeps of each.

use std::time::SystemTime;

use serde_json::json;
use tracing::Instrument;

use super::admission::{self, admit, Admission};
use super::claims::Reclaimed;
use super::journal::{self, JournalError, Outgoing, TaskState};
use super::{policy, task_key, AgentSpec, Engine, MailExtras, SenderPolicy, Task, UnknownSenders};
use crate::backend::Backend;
use crate::inbound::{Inbound, Mail, Reply, SenderCheck};
use crate::protocol::{Body, Dispatch, Envelope};

/// Why a mail is automatic (RFC 3834 `Auto-Submitted`, a bounce or a delivery report), if
/// it is: such mail never starts a task, so two automatons cannot keep each other busy.
pub(super) fn automatic(inbound: &Inbound) -> Option<&'static str> {
    let view = &inbound.view;
    if view
        .header("Auto-Submitted")
        .is_some_and(|v| !v.eq_ignore_ascii_case("no"))
    {
        return Some("marked Auto-Submitted");
    }
    let from = view.from.to_ascii_lowercase();
    if from.starts_with("mailer-daemon@") || from.starts_with("postmaster@") || from.is_empty() {
        return Some("a bounce (from the mail system)");
    }
    if view
        .header("Content-Type")
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("multipart/report"))
    {
        return Some("a delivery or disposition report");
    }
    None
}

impl<B: Backend> Engine<B> {
    /// Takes one inbound message: records it in the journal (with the ack or rejection it is
    /// answered with) before returning, then starts its work on the tracker. An error means
    /// the message was not recorded; the caller must offer it again later.
    pub fn deliver(&self, mail: Mail) -> Result<(), JournalError> {
        match mail {
            Mail::Aamp(inbound) => self.deliver_aamp(*inbound),
            Mail::Reply(reply) => self.on_reply(reply),
            Mail::Bounce(bounce) => self.on_bounce(bounce),
        }
    }

    /// A delivery report for a mail this agent sent (an answer to an address that does not
    /// exist, say): the mail is marked undelivered, so `tasks` shows it. Reports of delays,
    /// and of mail the agent did not send, change nothing.
    pub(super) fn on_bounce(&self, bounce: crate::inbound::Bounce) -> Result<(), JournalError> {
        let spec = self.common.spec();
        let n = &bounce.notification;
        let message_id = n
            .message_id
            .as_deref()
            .map(crate::protocol::message::normalize_message_id);
        let span = tracing::info_span!("bounce", agent = %spec.name, message_id = ?message_id, email_id = %bounce.email_id);
        let _enter = span.enter();
        let ignore = |reason: &str| {
            tracing::info!(%reason, "delivery report ignored");
            self.common.events.emit(
                crate::events::Event::MessageIgnored,
                json!({"agent": spec.name, "messageId": message_id, "intent": null, "reason": reason}),
            );
            Ok(())
        };
        let failed: Vec<String> = n.failed().map(|r| r.describe()).collect();
        let addresses: Vec<String> = n.failed().map(|r| r.address.clone()).collect();
        let Some(message_id) = message_id.as_deref() else {
            return ignore("a delivery report that names no mail");
        };
        if failed.is_empty() {
            return ignore("a delivery report of no failure (a delay, or a delivery)");
        }
        let error = format!("bounced: {}", failed.join("; "));
        match self
            .common
            .journal
            .bounced(&spec.name, message_id, &addresses, &error)?
        {
            journal::BounceFound::Marked(journal::Bounced {
                task: row,
                task_id,
                intent,
            }) => {
                tracing::warn!(%intent, %error, "a mail the agent sent could not be delivered");
                if let Some(row) = row {
                    let _ = self.common.journal.note(row, "undelivered", Some(&error));
                }
                self.common.events.emit(
                    crate::events::Event::MailFailed,
                    json!({"agent": spec.name, "taskId": task_id, "intent": intent,
                           "messageId": message_id, "error": error}),
                );
                Ok(())
            }
            journal::BounceFound::NotSent(_) => {
                ignore("a delivery report for a mail of this agent's that has not left (or already failed)")
            }
            journal::BounceFound::NotARecipient(_) => ignore(
                "a delivery report naming no address the mail was sent to",
            ),
            journal::BounceFound::NotOurs => {
                ignore("a delivery report for a mail this agent did not send")
            }
        }
    }

    /// A plain reply answers a waiting question when it replies to the question's mail and
    /// comes from the task's dispatcher; anything else is left alone.
    pub(super) fn on_reply(&self, reply: Reply) -> Result<(), JournalError> {
        let spec = self.common.spec();
        let span = tracing::info_span!("reply", agent = %spec.name, message_id = %reply.message_id, email_id = %reply.email_id);
        let _enter = span.enter();
        let ignore = |reason: String| {
            tracing::info!(from = %reply.from, %reason, "plain reply ignored");
            self.common.events.emit(
                crate::events::Event::MessageIgnored,
                json!({"agent": spec.name, "from": reply.from, "messageId": reply.message_id, "intent": null, "reason": reason}),
            );
            Ok(())
        };
        if let SenderCheck::Unverified(why) = &reply.sender_check {
            return ignore(format!("sender not authenticated: {why}"));
        }
        if reply.auto_submitted {
            return ignore("an automatic reply (Auto-Submitted)".into());
        }
        let waiting =
            self.desk
                .replied_to(&reply.from, reply.in_reply_to.as_deref(), &reply.references);
        let Some((waiting, row)) = waiting else {
            return ignore(
                "a plain mail that answers no open question (AAMP needs X-AAMP-Intent)".into(),
            );
        };
        let key = format!(
            "{}|{}",
            reply.from.to_ascii_lowercase(),
            if reply.message_id.is_empty() {
                format!("email-id:{}", reply.email_id)
            } else {
                reply.message_id.clone()
            }
        );
        let task_id = waiting
            .split_once('\n')
            .map(|(_, t)| t.to_string())
            .unwrap_or_default();
        let recorded = self.common.journal.record(
            &journal::NewTask {
                agent: &spec.name,
                message_key: &key,
                sender: &reply.from,
                task_id: &task_id,
                session_key: None,
                state: TaskState::Answered,
                admitted: false,
                mail: &json!({"reply": {"from": reply.from, "messageId": reply.message_id, "text": reply.text}}).to_string(),
                reason: Some("a plain reply to a question"),
                chain: None,
            },
            None,
        )?;
        if recorded.is_some() {
            tracing::info!(row, "a plain reply answers the agent's question");
            self.desk.answer(&waiting, &task_id, &reply.text, "");
        }
        Ok(())
    }

    pub(super) fn deliver_aamp(&self, inbound: Inbound) -> Result<(), JournalError> {
        let env = &inbound.message.envelope;
        let span = tracing::info_span!("task", agent = %self.common.spec().name,
            task_id = %env.task_id, message_id = %inbound.message_key(), email_id = %inbound.email_id);
        let _enter = span.enter();
        if let SenderCheck::Unverified(why) = &inbound.sender_check {
            tracing::warn!(from = %env.from, reason = %why, "ignored: nothing shows this mail comes from its From address");
            self.ignored(&inbound, &format!("sender not authenticated: {why}"));
            return Ok(());
        }
        // A Message-ID counts per sender, so nobody can use up another sender's ids.
        let key = format!(
            "{}|{}",
            env.from.to_ascii_lowercase(),
            inbound.message_key()
        );
        if let Some((row, state)) = self
            .common
            .journal
            .message_row(&self.common.spec().name, &key)?
        {
            if state == TaskState::Elsewhere {
                // Another replica holds it: claimed again here, which finds it held (or, its
                // claim run out, takes it over).
                return self.reclaim(row, span.clone());
            }
            if self.common.spec().replica.is_some()
                && !inbound.email_id.is_empty()
                && matches!(
                    state,
                    TaskState::Answered
                        | TaskState::Rejected
                        | TaskState::Cancelled
                        | TaskState::Expired
                )
            {
                // Answered here, but its claim is not marked done on the server (the mark was
                // lost, or a claim ran out as it was made): a takeover scan would bring it
                // back every half lease for good. It is marked done now, once per delivery.
                tracing::info!(
                    state = state.as_str(),
                    "a task answered here came back as unclaimed; marking it answered on the server"
                );
                let this = self.clone();
                let email_id = inbound.email_id.clone();
                self.common.tracker.spawn(
                    async move {
                        match this.common.backend.claim_done(&email_id).await {
                            Ok(true) => {}
                            // Taken over before this replica's answer left: the outbox finds
                            // the claim another's and leaves the answer to it.
                            Ok(false) => tracing::info!("another replica holds the task's claim now; it answers it"),
                            Err(e) => tracing::warn!(error = %e, "could not mark the task answered on the server; the next scan tries again"),
                        }
                    }
                    .instrument(span.clone()),
                );
                return Ok(());
            }
            tracing::debug!("this mail is in the journal already; a second delivery is ignored");
            return Ok(());
        }
        match &inbound.message.body {
            Body::Dispatch(_) => self.on_dispatch(inbound, key, span.clone()),
            Body::Cancel { .. } => self.on_cancel(&inbound.message.envelope),
            Body::CardQuery { .. } => self.on_card_query(&inbound, &key),
            Body::PairRequest { .. } => self.on_pair_request(&inbound, &key),
            Body::Result(_) if self.on_child_result(&inbound)? => Ok(()),
            other => {
                tracing::debug!(intent = %other.intent(), "not for an executor; ignored");
                self.ignored(
                    &inbound,
                    &format!("{} is not for an executor", other.intent()),
                );
                Ok(())
            }
        }
    }

    /// A task another replica won comes back here: it is claimed again (see
    /// [`Claims::reclaim`](super::Claims)), and a cancel that came meanwhile holds.
    fn reclaim(&self, row: i64, span: tracing::Span) -> Result<(), JournalError> {
        if let Some(Reclaimed { task, cancelled }) = self.claims.reclaim(row, &span)? {
            let key = task_key(&task.env.from, &task.env.task_id);
            self.start(task, span);
            if cancelled {
                self.runs.running.with(&key, |cancel| cancel.cancel());
            }
        }
        Ok(())
    }

    /// A message the bridge does not act on: one log line (by the caller) and one event.
    pub(super) fn ignored(&self, inbound: &Inbound, reason: &str) {
        let env = &inbound.message.envelope;
        self.common.events.emit(
            crate::events::Event::MessageIgnored,
            json!({"agent": self.common.spec().name, "from": env.from, "taskId": env.task_id,
                   "intent": inbound.message.intent().as_str(), "messageId": env.message_id,
                   "reason": reason}),
        );
    }

    /// The sender policy in force: the config's rules and those kept in the journal (added
    /// with `aamp-bridge policy` or by pairing).
    pub(super) fn policy(&self, spec: &AgentSpec) -> Result<SenderPolicy, JournalError> {
        let (allow, deny) = self.common.journal.policy(&spec.name)?;
        Ok(spec
            .policy
            .clone()
            .with_rules(allow.into_iter().map(|(rule, _)| rule))
            .with_denied(deny.into_iter().map(|(p, _)| p)))
    }

    /// Whether one more answer fits in the budget `kind` (answers sent in the last hour, kept
    /// in the journal across restarts) under `max`; if so, it is counted. A journal that
    /// cannot say is taken as no budget left: a refusal then goes unanswered.
    pub(super) fn may_answer(&self, kind: &str, max: u32) -> bool {
        self.common
            .journal
            .spend_answer(&self.common.spec().name, kind, max)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not read the answer budget; not answering");
                false
            })
    }

    /// A dispatch: an answer to a waiting question, or a task admitted (recorded whole, so
    /// it runs again after a crash, with its ack) or refused (recorded as a summary, with its
    /// answer), before anything is acknowledged.
    pub(super) fn on_dispatch(
        &self,
        inbound: Inbound,
        key: String,
        span: tracing::Span,
    ) -> Result<(), JournalError> {
        if let Some(why) = automatic(&inbound) {
            tracing::info!(reason = why, "ignored: automatic mail never starts a task");
            self.ignored(&inbound, why);
            return Ok(());
        }
        let Some((arrival, refused)) = Arrival::of(inbound, key) else {
            return Ok(());
        };
        let (env, dispatch) = (&arrival.env, &arrival.dispatch);
        if let Some(waiting) = self.desk.answered_by(env, dispatch) {
            let why = "an answer to a question of an earlier task";
            let recorded = self.record(&arrival, TaskState::Answered, false, Some(why), None)?;
            if recorded.is_some() {
                let (text, title) = (&dispatch.body_text, &dispatch.title);
                self.desk.answer(&waiting, &env.task_id, text, title);
            }
            return Ok(());
        }
        let (admission, earlier) = self.admission(&arrival, refused)?;
        self.on_admission(arrival, admission, earlier, span)
    }

    /// What the sender policy, the limits and the queue say of the dispatch, with its
    /// earlier task of the same sender and TaskId, if any. A message the back-end would not
    /// read whole (`refused`: too large) is answered rejected, once the sender may dispatch
    /// at all.
    fn admission(
        &self,
        arrival: &Arrival,
        refused: Option<String>,
    ) -> Result<(Admission, Option<(i64, TaskState)>), JournalError> {
        let spec = self.common.spec();
        let (name, env, dispatch) = (&spec.name, &arrival.env, &arrival.dispatch);
        let journal = &self.common.journal;
        let earlier = journal.admitted_task(name, &env.from, &env.task_id)?;
        let now = SystemTime::now();
        let session = dispatch.session_key.as_deref();
        let recent = journal.recent_counts(name, &env.from, session, &spec.limits, now)?;
        let load = admission::Load {
            active: self.active(),
            sender_last_hour: recent.sender_last_hour,
            agent_last_day: recent.agent_last_day,
            session_turns: recent.session_turns,
            cancelled_before: journal.was_cancelled(name, &env.from, &env.task_id)?,
            spent: spec.budgets.read(journal, (name, &env.from), now, false)?,
        };
        let policy = self.policy(&spec)?;
        let admitted = admit(&spec, &policy, env, dispatch, earlier.is_some(), &load, now);
        let admission = match (admitted, refused) {
            (admission @ (Admission::Duplicate | Admission::Refuse { .. }), _) => admission,
            (admission, None) => admission,
            (admission @ Admission::Reject { .. }, Some(_)) => admission,
            (_, Some(reason)) => Admission::Reject {
                reason,
                state: TaskState::Rejected,
            },
        };
        Ok((admission, earlier))
    }

    /// Acts on the dispatch's admission: a duplicate ignored (or claimed again, when another
    /// replica held the first), a refusal or rejection recorded with its answer, a task
    /// recorded with its ack and started.
    fn on_admission(
        &self,
        arrival: Arrival,
        admission: Admission,
        earlier: Option<(i64, TaskState)>,
        span: tracing::Span,
    ) -> Result<(), JournalError> {
        let spec = self.common.spec();
        let (events, name) = (&self.common.events, &spec.name);
        let (env, dispatch, key) = (&arrival.env, &arrival.dispatch, &arrival.key);
        // Every replica decides alike here; the one that wins the mail's claim answers.
        let rejected = |reason: &str| {
            let rejection = self.outbox.rejection(env, key, reason);
            self.outbox
                .once_among_replicas(rejection, &arrival.extras.email_id)
        };
        match admission {
            Admission::Duplicate => {
                tracing::info!("a task with this sender and TaskId was received before; this dispatch is a duplicate and is ignored");
                events.emit(crate::events::Event::TaskDuplicate, json!({"agent": name, "taskId": env.task_id, "from": env.from, "messageId": env.message_id}));
                if let Some((row, TaskState::Elsewhere)) = earlier {
                    // The earlier one is another replica's: its claim is looked at again.
                    return self.reclaim(row, span);
                }
            }
            Admission::Refuse { reason } => {
                let answer = spec.unknown_senders == UnknownSenders::Reject
                    && self.may_answer("refusals", spec.refusals_per_hour);
                let reply = answer.then(|| rejected(&reason));
                let recorded = self.record(
                    &arrival,
                    TaskState::Rejected,
                    false,
                    Some(&reason),
                    reply.as_ref(),
                )?;
                if recorded.is_some() {
                    tracing::info!(%reason, answered = answer, "dispatch refused by the sender policy");
                    events.emit(
                        crate::events::Event::MessageIgnored,
                        json!({"agent": name, "from": env.from, "taskId": env.task_id,
                        "intent": "task.dispatch", "messageId": env.message_id, "reason": reason}),
                    );
                    events.emit(crate::events::Event::TaskRejected, json!({"agent": name, "taskId": env.task_id, "from": env.from, "title": dispatch.title, "reason": reason, "answered": answer}));
                    self.outbox.wake();
                }
            }
            Admission::Reject { reason, state } => {
                let reply = rejected(&reason);
                if self
                    .record(&arrival, state, false, Some(&reason), Some(&reply))?
                    .is_some()
                {
                    tracing::info!(%reason, "dispatch refused");
                    events.emit(crate::events::Event::TaskRejected, json!({"agent": name, "taskId": env.task_id, "from": env.from, "title": dispatch.title, "reason": reason, "answered": true}));
                    self.outbox.wake();
                }
            }
            Admission::Run => {
                // One of several bridges acknowledges only once it has won the task's claim.
                let ack = spec
                    .replica
                    .is_none()
                    .then(|| self.outbox.compose(env, key, Body::Ack, 0));
                let recorded =
                    self.record(&arrival, TaskState::Received, true, None, ack.as_ref())?;
                let Some(row) = recorded else {
                    return Ok(());
                };
                events.emit(crate::events::Event::TaskReceived, json!({"agent": name, "taskId": env.task_id, "from": env.from, "title": dispatch.title, "messageId": env.message_id}));
                self.outbox.wake();
                self.start(arrival.into_task(row), span);
            }
        }
        Ok(())
    }

    /// Records the dispatch in the journal with its answer: whole when it is admitted (it
    /// runs again after a crash), else only as a summary.
    fn record(
        &self,
        arrival: &Arrival,
        state: TaskState,
        admitted: bool,
        reason: Option<&str>,
        reply: Option<&Outgoing>,
    ) -> Result<Option<i64>, JournalError> {
        let (env, dispatch) = (&arrival.env, &arrival.dispatch);
        let mail = if admitted {
            &arrival.mail
        } else {
            &arrival.summary
        };
        let chain = journal::TaskChain::of(dispatch).map(|c| c.to_json());
        self.common.journal.record(
            &journal::NewTask {
                agent: &self.common.spec().name,
                message_key: &arrival.key,
                sender: &env.from,
                task_id: &env.task_id,
                session_key: dispatch.session_key.as_deref(),
                state,
                admitted,
                mail,
                reason,
                chain: chain.as_deref(),
            },
            reply,
        )
    }

    /// Records a message that is answered but not run (a pair request, a card query), with
    /// its answer.
    pub(super) fn record_answered(
        &self,
        inbound: &Inbound,
        key: &str,
        state: TaskState,
        reason: &str,
        reply: Option<&Outgoing>,
    ) -> Result<Option<i64>, JournalError> {
        let env = &inbound.message.envelope;
        self.common.journal.record(
            &journal::NewTask {
                agent: &self.common.spec().name,
                message_key: key,
                sender: &env.from,
                task_id: &env.task_id,
                session_key: None,
                state,
                admitted: false,
                mail: &inbound.to_json(),
                reason: Some(reason),
                chain: None,
            },
            reply,
        )
    }

    /// `card.query`: the agent's card, to senders the policy allows.
    pub(super) fn on_card_query(&self, inbound: &Inbound, key: &str) -> Result<(), JournalError> {
        let spec = self.common.spec();
        let env = &inbound.message.envelope;
        if !matches!(
            self.policy(&spec)?.check(&env.from, &Default::default()),
            policy::Verdict::Allowed(_)
        ) {
            tracing::info!(from = %env.from, "card query from a sender the policy refuses; not answered");
            self.ignored(inbound, "card.query from a sender the policy refuses");
            return Ok(());
        }
        let (summary, text) = spec.card.clone().unwrap_or_else(|| {
            (
                spec.name.clone(),
                format!("Agent {} (no card configured).", spec.name),
            )
        });
        let reply = self.outbox.once_among_replicas(
            self.outbox
                .compose(env, key, Body::CardResponse { summary, text }, 0),
            &inbound.email_id,
        );
        let recorded = self.record_answered(
            inbound,
            key,
            TaskState::Answered,
            "card.query",
            Some(&reply),
        )?;
        if recorded.is_some() {
            self.common.events.emit(
                crate::events::Event::CardAnswered,
                json!({"agent": spec.name, "taskId": env.task_id, "from": env.from}),
            );
            self.outbox.wake();
        }
        Ok(())
    }

    /// A cancel stops the sender's own task (the key includes the sender, so nobody else's);
    /// one that comes before its dispatch is remembered, and the dispatch is then answered
    /// cancelled without running.
    pub(super) fn on_cancel(&self, env: &Envelope) -> Result<(), JournalError> {
        let spec = self.common.spec();
        let stopped = self
            .runs
            .running
            .with(&task_key(&env.from, &env.task_id), |cancel| {
                tracing::info!(from = %env.from, "cancel received; stopping the task");
                cancel.cancel();
            });
        if stopped.is_some() {
            return Ok(());
        }
        let journal = &self.common.journal;
        match journal.admitted_task(&spec.name, &env.from, &env.task_id)? {
            Some((_, TaskState::Elsewhere)) => {
                // Another replica runs it and stops it; should this one take it over, the
                // cancel holds.
                tracing::info!(from = %env.from, "cancel for a task another replica holds; remembered for a takeover");
                journal.remember_cancel(&spec.name, &env.from, &env.task_id)?;
            }
            Some(_) => {
                tracing::info!(from = %env.from, "cancel for a task that already ended; nothing to stop")
            }
            None if !self.policy(&spec)?.may_ever_dispatch(&env.from) => {
                // Nothing of theirs could run: there is nothing to remember it for.
                tracing::info!(from = %env.from, "cancel from a sender the policy does not allow; ignored");
            }
            None => {
                tracing::info!(from = %env.from, "cancel before its dispatch; the dispatch will not run");
                journal.remember_cancel(&spec.name, &env.from, &env.task_id)?;
            }
        }
        Ok(())
    }
}

/// A dispatch as it arrived: its parts, and the mail as the journal keeps it (whole for a
/// task to run, else a summary).
struct Arrival {
    key: String,
    env: Envelope,
    dispatch: Dispatch,
    extras: MailExtras,
    mail: String,
    summary: String,
}

impl Arrival {
    /// The dispatch `inbound` brings, recorded under `key`, with why the back-end would not
    /// read it whole (if it would not); `None` when it brings none.
    fn of(inbound: Inbound, key: String) -> Option<(Arrival, Option<String>)> {
        let (mail, summary) = (inbound.to_json(), inbound.summary_json());
        let Inbound {
            email_id,
            message,
            truncated,
            attachments,
            refused,
            ..
        } = inbound;
        let Body::Dispatch(dispatch) = message.body else {
            return None;
        };
        let extras = MailExtras {
            email_id,
            truncated,
            attachments,
        };
        let env = message.envelope;
        let arrival = Arrival {
            key,
            env,
            dispatch,
            extras,
            mail,
            summary,
        };
        Some((arrival, refused))
    }

    /// The admitted task, at its journal row.
    fn into_task(self, row: i64) -> Task {
        Task {
            row,
            key: self.key,
            env: self.env,
            dispatch: self.dispatch,
            extras: self.extras,
            rerun_refused: None,
        }
    }
}
