//! What happens to an AAMP message addressed to an agent. Every message is first recorded in
//! the [`journal`] (so it is never lost, and a second delivery of it is recognised); then
//! sender policy, duplicates, the queue's bound and expiry decide whether a dispatch runs
//! (pure, in [`admission`]); the task lifecycle waits for a slot, runs it through
//! `runner`, and records the answer; the outbox worker sends acks and results, retrying
//! until the mail server takes them. Cancels stop the matching task. Nothing here knows SMTP
//! or JMAP: answers leave as rendered bytes through the [`Outbox`] seam.

pub mod admission;
pub mod journal;
mod lifecycle;
mod outbox;
pub mod policy;
pub mod prompt;
pub mod questions;
mod workspace;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::events::Events;
use crate::mailbox::auth::SenderCheck;
use crate::mailbox::{Attachment, Inbound, MailboxError};
use crate::protocol::{AampMessage, Body, Dispatch, Envelope, RenderedMail, Status, TaskResult};
use crate::runner::Profile;
pub use admission::{admit, Admission};
pub use journal::{Journal, JournalError, Outgoing, TaskState};
pub use policy::SenderPolicy;
pub use questions::choose;
use questions::PendingQuestion;

/// Where answers go. The mailbox implements it; tests may use a fake.
pub trait Outbox: Send + Sync + 'static {
    /// Submits a rendered mail once, exactly as it is.
    fn submit(&self, mail: &RenderedMail) -> impl Future<Output = Result<(), MailboxError>> + Send;

    /// Fetches an inbound attachment, at most `max` bytes.
    fn download(
        &self,
        attachment: &Attachment,
        max: u64,
    ) -> impl Future<Output = Result<Vec<u8>, MailboxError>> + Send;

    /// Opens a live stream for a task; `None` when there is no stream service (or it failed,
    /// which is logged: a task never fails for its stream).
    fn open_stream(&self, task_id: &str, peer: &str)
        -> impl Future<Output = Option<String>> + Send;

    /// Feeds `(type, payload)` events to the stream until `events` closes; returns the number
    /// of appends made.
    fn pump_stream(
        &self,
        stream_id: &str,
        events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> impl Future<Output = usize> + Send;

    /// The thread of an earlier task as (intent, from, text), oldest first; empty when there
    /// is no AAMP service or no such thread.
    fn thread(&self, task_id: &str) -> impl Future<Output = Vec<prompt::Earlier>> + Send;

    /// Closes the stream (with no terminal event of its own).
    fn close_stream(
        &self,
        stream_id: &str,
        payload: serde_json::Value,
    ) -> impl Future<Output = ()> + Send;
}

/// An agent as dispatch sees it.
#[derive(Debug)]
pub struct AgentSpec {
    pub name: String,
    pub email: String,
    pub policy: SenderPolicy,
    pub max_concurrent: usize,
    /// Tasks running or waiting at most; more are rejected as busy.
    pub max_queued: usize,
    pub profile: Profile,
    /// Task workspaces are made below this folder.
    pub workspace_root: PathBuf,
}

/// How the dispatcher lives with the rest of the bridge.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long an unsent ack or result is retried before the bridge gives up on it.
    pub retry_for: Duration,
    /// Carried by every agent process this bridge starts (and their children) as
    /// [`OWNER_VAR`], so leftovers of a crashed bridge are found at the next start.
    pub owner_tag: String,
}

/// The environment variable naming the bridge (its state directory) an agent belongs to.
pub const OWNER_VAR: &str = "AAMP_BRIDGE_OWNER";
/// The environment variable naming one run of one task.
pub const RUN_VAR: &str = "AAMP_BRIDGE_RUN";

/// Runs at most this many times for one task; after that a crash answers it rejected.
const MAX_RUNS: u32 = 2;

/// One admitted task.
#[derive(Clone, Debug)]
struct Task {
    /// Its journal row.
    row: i64,
    /// The inbound message's key (Message-ID, or a stand-in).
    key: String,
    env: Envelope,
    dispatch: Dispatch,
    extras: MailExtras,
}

/// What a mail brings besides its AAMP message.
#[derive(Clone, Debug, Default)]
pub struct MailExtras {
    /// The text body was cut at the fetch limit.
    pub truncated: bool,
    pub attachments: Vec<Attachment>,
}

struct Inner<O> {
    /// Replaced whole on a reload (policy, profile, queue bound).
    spec: std::sync::RwLock<Arc<AgentSpec>>,
    outbox: O,
    journal: Arc<Journal>,
    events: Events,
    settings: Settings,
    /// Tasks admitted and not finished (running or waiting for a slot), by sender + TaskId.
    running: Mutex<HashMap<String, CancellationToken>>,
    permits: Arc<Semaphore>,
    /// One task at a time per Session-Key: an agent session takes one prompt at a time.
    session_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Questions mailed to dispatchers (`task.help_needed`), by task, awaiting an answer.
    questions: Mutex<HashMap<String, PendingQuestion>>,
    tracker: TaskTracker,
    /// Cancelled when the bridge stops its tasks: a task stopped this way is not answered;
    /// it stays in the journal and runs again at the next start.
    abort: CancellationToken,
    /// Wakes the outbox worker.
    wake: Notify,
}

/// One agent's task lifecycle. Cheap to clone.
pub struct Dispatcher<O> {
    inner: Arc<Inner<O>>,
}

impl<O> Clone for Dispatcher<O> {
    fn clone(&self) -> Self {
        Dispatcher {
            inner: self.inner.clone(),
        }
    }
}

fn task_key(from: &str, task_id: &str) -> String {
    format!("{}\n{}", from.to_ascii_lowercase(), task_id)
}

/// The Message-ID of the `n`th mail of `intent` answering the message `key`: the same every
/// time it is made, so a mail sent again after a crash is the same mail to its reader.
fn derived_message_id(agent_email: &str, key: &str, intent: &str, n: u32) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x5d3c_8a1e_9f2b_4c6d_a7e0_1b2c_3d4e_5f60);
    let id = uuid::Uuid::new_v5(
        &NAMESPACE,
        format!("{agent_email}\n{key}\n{intent}\n{n}").as_bytes(),
    );
    let domain: String = agent_email
        .rsplit_once('@')
        .map_or("localhost", |(_, d)| d)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
        .collect();
    let domain = if domain.is_empty() {
        "localhost".to_string()
    } else {
        domain
    };
    format!("<{intent}.{}@{domain}>", id.simple())
}

impl<O: Outbox> Dispatcher<O> {
    /// Tasks are spawned on `tracker`; `abort` stops them without an answer.
    pub fn new(
        spec: AgentSpec,
        outbox: O,
        journal: Arc<Journal>,
        events: Events,
        settings: Settings,
        tracker: TaskTracker,
        abort: CancellationToken,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(spec.max_concurrent.max(1)));
        Dispatcher {
            inner: Arc::new(Inner {
                spec: std::sync::RwLock::new(Arc::new(spec)),
                outbox,
                journal,
                events,
                settings,
                running: Mutex::new(HashMap::new()),
                permits,
                session_locks: Mutex::new(HashMap::new()),
                questions: Mutex::new(HashMap::new()),
                tracker,
                abort,
                wake: Notify::new(),
            }),
        }
    }

    /// The agent as it is now.
    fn spec(&self) -> Arc<AgentSpec> {
        self.inner
            .spec
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn name(&self) -> String {
        self.spec().name.clone()
    }

    /// Takes a reloaded config for this agent: its sender policy, profile and queue bound
    /// apply to tasks admitted from now on; tasks under way keep what they started with.
    /// The agent's name, address and concurrency stay as they were (say so, and restart).
    pub fn reload(&self, new: AgentSpec) {
        let old = self.spec();
        if new.email != old.email || new.max_concurrent != old.max_concurrent {
            tracing::warn!(agent = %old.name, "the mailbox address and max_concurrent_tasks change at the next start, not on reload");
        }
        let spec = AgentSpec {
            name: old.name.clone(),
            email: old.email.clone(),
            max_concurrent: old.max_concurrent,
            workspace_root: old.workspace_root.clone(),
            ..new
        };
        *self.inner.spec.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(spec);
        tracing::info!(agent = %old.name, "config reloaded");
    }

    /// Takes one inbound message: records it in the journal (with the ack or rejection it is
    /// answered with) before returning, then starts its work on the tracker. An error means
    /// the message was not recorded; the caller must offer it again later.
    pub fn deliver(&self, inbound: Inbound) -> Result<(), JournalError> {
        let env = &inbound.message.envelope;
        let span = tracing::info_span!("task", agent = %self.spec().name,
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
        if self.inner.journal.knows_message(&self.spec().name, &key)? {
            tracing::debug!("this mail is in the journal already; a second delivery is ignored");
            return Ok(());
        }
        match &inbound.message.body {
            Body::Dispatch(_) => self.on_dispatch(inbound, key, span.clone()),
            Body::Cancel { .. } => {
                self.on_cancel(&inbound.message.envelope);
                Ok(())
            }
            other => {
                tracing::debug!(intent = %other.intent(), "not for an executor; ignored");
                Ok(())
            }
        }
    }

    /// A message the bridge does not act on: one log line (by the caller) and one event.
    fn ignored(&self, inbound: &Inbound, reason: &str) {
        let env = &inbound.message.envelope;
        self.inner.events.emit(
            "message.ignored",
            json!({"agent": self.spec().name, "from": env.from, "taskId": env.task_id,
                   "intent": inbound.message.intent().as_str(), "messageId": env.message_id,
                   "reason": reason}),
        );
    }

    fn on_dispatch(
        &self,
        inbound: Inbound,
        key: String,
        span: tracing::Span,
    ) -> Result<(), JournalError> {
        let inner = &self.inner;
        let spec = self.spec();
        let name = &spec.name;
        let mail = inbound.to_json();
        let Inbound {
            message,
            truncated,
            attachments,
            ..
        } = inbound;
        let env = message.envelope;
        let Body::Dispatch(dispatch) = message.body else {
            return Ok(());
        };
        if let Some(waiting) = self.question_answered_by(&env, &dispatch) {
            let reason = "an answer to a question of an earlier task";
            let recorded = inner.journal.record(
                &journal::NewTask {
                    agent: name,
                    message_key: &key,
                    sender: &env.from,
                    task_id: &env.task_id,
                    state: TaskState::Answered,
                    admitted: false,
                    mail: &mail,
                    reason: Some(reason),
                },
                None,
            )?;
            if recorded.is_some() {
                self.answer_question(&waiting, &env, &dispatch);
            }
            return Ok(());
        }
        let duplicate = inner
            .journal
            .admitted_task(name, &env.from, &env.task_id)?
            .is_some();
        let active = inner.running.lock().expect("running lock").len();
        let decision = admit(&spec, &env, &dispatch, duplicate, active, SystemTime::now());
        match decision {
            Admission::Duplicate => {
                tracing::info!("a task with this sender and TaskId was received before; this dispatch is a duplicate and is ignored");
                inner.events.emit("task.duplicate", json!({"agent": name, "taskId": env.task_id, "from": env.from, "messageId": key}));
            }
            Admission::Reject { reason, state } => {
                let result = TaskResult {
                    status: Status::Rejected,
                    output: String::new(),
                    error: Some(reason.clone()),
                    structured_result: None,
                };
                let reply = self.compose(&env, &key, Body::Result(result), 0);
                let recorded = inner.journal.record(
                    &journal::NewTask {
                        agent: name,
                        message_key: &key,
                        sender: &env.from,
                        task_id: &env.task_id,
                        state,
                        admitted: false,
                        mail: &mail,
                        reason: Some(&reason),
                    },
                    Some(&reply),
                )?;
                if recorded.is_some() {
                    tracing::info!(%reason, "dispatch refused");
                    inner.events.emit("task.rejected", json!({"agent": name, "taskId": env.task_id, "from": env.from, "reason": reason}));
                    inner.wake.notify_one();
                }
            }
            Admission::Run => {
                let ack = self.compose(&env, &key, Body::Ack, 0);
                let recorded = inner.journal.record(
                    &journal::NewTask {
                        agent: name,
                        message_key: &key,
                        sender: &env.from,
                        task_id: &env.task_id,
                        state: TaskState::Received,
                        admitted: true,
                        mail: &mail,
                        reason: None,
                    },
                    Some(&ack),
                )?;
                let Some(row) = recorded else {
                    return Ok(());
                };
                inner.events.emit("task.received", json!({"agent": name, "taskId": env.task_id, "from": env.from, "title": dispatch.title, "messageId": key}));
                inner.wake.notify_one();
                self.start(
                    Task {
                        row,
                        key,
                        env,
                        dispatch,
                        extras: MailExtras {
                            truncated,
                            attachments,
                        },
                    },
                    span,
                );
            }
        }
        Ok(())
    }

    fn on_cancel(&self, env: &Envelope) {
        // Only the sender of the dispatch can cancel it: the key includes the sender.
        let running = self.inner.running.lock().expect("running lock");
        match running.get(&task_key(&env.from, &env.task_id)) {
            Some(cancel) => {
                tracing::info!(from = %env.from, "cancel received; stopping the task");
                cancel.cancel();
            }
            None => {
                tracing::info!(from = %env.from, "cancel for no running task of this sender; ignored")
            }
        }
    }

    /// Starts the work on an admitted task.
    fn start(&self, task: Task, span: tracing::Span) {
        let cancel = self.inner.abort.child_token();
        self.inner
            .running
            .lock()
            .expect("running lock")
            .insert(task_key(&task.env.from, &task.env.task_id), cancel.clone());
        let this = self.clone();
        self.inner
            .tracker
            .spawn(this.lifecycle(task, cancel).instrument(span));
    }

    /// Picks up what the journal holds from the bridge's last life: tasks not yet run are
    /// queued again; tasks that were running are run again (workspace emptied first) when
    /// the profile allows it and they have not been run `MAX_RUNS` times, and otherwise
    /// answered rejected. Returns how many tasks were picked up.
    pub fn recover(&self) -> Result<usize, JournalError> {
        let inner = &self.inner;
        let spec = self.spec();
        let name = &spec.name;
        let unfinished = inner.journal.unfinished(name)?;
        for left in &unfinished {
            let inbound = match Inbound::from_json(&left.mail) {
                Ok(inbound) => inbound,
                Err(e) => {
                    tracing::error!(row = left.id, error = %e, "a task in the journal cannot be read back; it is closed without an answer");
                    inner.journal.finish(
                        name,
                        left.id,
                        TaskState::Rejected,
                        Some("could not be read back from the journal"),
                        None,
                    )?;
                    continue;
                }
            };
            let key = inbound.message_key();
            let Body::Dispatch(dispatch) = inbound.message.body else {
                continue;
            };
            let env = inbound.message.envelope;
            let span = tracing::info_span!("task", agent = %name, task_id = %env.task_id, message_id = %key, email_id = %inbound.email_id);
            let _enter = span.enter();
            let interrupted = matches!(left.state, TaskState::Running | TaskState::HelpNeeded);
            if interrupted && (!spec.profile.rerun_interrupted || left.runs >= MAX_RUNS) {
                let reason = if spec.profile.rerun_interrupted {
                    format!("interrupted by a bridge restart {} times; not run again; dispatch it again", left.runs)
                } else {
                    "interrupted by a bridge restart; this agent's tasks are not run twice; dispatch it again".to_string()
                };
                tracing::warn!(runs = left.runs, "{reason}");
                let result = TaskResult {
                    status: Status::Rejected,
                    output: String::new(),
                    error: Some(reason.clone()),
                    structured_result: None,
                };
                let reply = self.compose(&env, &key, Body::Result(result), 0);
                inner.journal.finish(
                    name,
                    left.id,
                    TaskState::Rejected,
                    Some(&reason),
                    Some(&reply),
                )?;
                inner.events.emit("task.completed", json!({"agent": name, "taskId": env.task_id, "status": "rejected", "error": reason, "recovered": true}));
                continue;
            }
            tracing::info!(
                state = left.state.as_str(),
                runs = left.runs,
                "picking up a task from the journal"
            );
            inner.events.emit("task.recovered", json!({"agent": name, "taskId": env.task_id, "state": left.state.as_str(), "runs": left.runs}));
            self.start(
                Task {
                    row: left.id,
                    key,
                    env,
                    dispatch,
                    extras: MailExtras {
                        truncated: inbound.truncated,
                        attachments: inbound.attachments,
                    },
                },
                span.clone(),
            );
        }
        inner.wake.notify_one();
        Ok(unfinished.len())
    }

    /// A reply to `env` carrying `body`, rendered now, with the Message-ID derived from the
    /// task (`n` tells apart several mails of one intent).
    fn compose(&self, env: &Envelope, key: &str, body: Body, n: u32) -> Outgoing {
        let intent = body.intent().as_str();
        let mut msg = AampMessage::reply(env, &self.spec().email, body);
        msg.envelope.message_id = derived_message_id(&self.spec().email, key, intent, n);
        Outgoing {
            intent: intent.to_string(),
            mail: crate::protocol::render(&msg, SystemTime::now()),
        }
    }

    /// The question a dispatch answers, by task key: same sender, and its ParentTaskId is the
    /// waiting task, or it replies to the help mail.
    fn question_answered_by(&self, env: &Envelope, dispatch: &Dispatch) -> Option<String> {
        let pending = self.inner.questions.lock().expect("questions lock");
        let sender = format!("{}\n", env.from.to_ascii_lowercase());
        match &dispatch.parent_task_id {
            Some(parent) if pending.contains_key(&task_key(&env.from, parent)) => {
                Some(task_key(&env.from, parent))
            }
            _ => pending
                .iter()
                .find(|(k, q)| {
                    k.starts_with(&sender)
                        && (env.in_reply_to.as_deref() == Some(q.help_message_id.as_str())
                            || env.references.contains(&q.help_message_id))
                })
                .map(|(k, _)| k.clone()),
        }
    }

    /// Hands the answer in `dispatch` to the question waiting under `waiting`.
    fn answer_question(&self, waiting: &str, env: &Envelope, dispatch: &Dispatch) {
        let inner = &self.inner;
        let Some(question) = inner
            .questions
            .lock()
            .expect("questions lock")
            .remove(waiting)
        else {
            return;
        };
        let choice = choose(&question.options, &dispatch.body_text)
            .or_else(|| choose(&question.options, &dispatch.title));
        inner.events.emit(
            "task.answered",
            json!({"agent": self.spec().name, "answerTaskId": env.task_id, "choice": choice.map(|i| question.options[i].clone())}),
        );
        if choice.is_none() {
            tracing::warn!("the answer names none of the options; the agent's request is rejected");
        }
        if let Err(e) = inner
            .journal
            .set_state(question.task_row, TaskState::Running)
        {
            tracing::warn!(error = %e, "could not record that the question was answered");
        }
        let _ = question.answer.send(choice);
    }

    /// Records a final state with its answer and wakes the outbox. A journal failure is
    /// logged; the answer then goes out directly, once.
    fn finish(&self, task: &Task, state: TaskState, reason: Option<&str>, reply: Outgoing) {
        let inner = &self.inner;
        match inner
            .journal
            .finish(&self.spec().name, task.row, state, reason, Some(&reply))
        {
            Ok(()) => inner.wake.notify_one(),
            Err(e) => {
                tracing::error!(error = %e, "could not record the task's answer in the journal; sending it once without the journal");
                let this = self.clone();
                inner.tracker.spawn(async move {
                    if let Err(e) = this.inner.outbox.submit(&reply.mail).await {
                        tracing::error!(error = %e, "could not send the task's answer");
                    }
                });
            }
        }
    }

    /// Queues a mail that belongs to a task under way (a question, a stream announcement).
    fn enqueue(&self, task: &Task, mail: &Outgoing) -> Result<(), JournalError> {
        self.inner
            .journal
            .enqueue(&self.spec().name, Some(task.row), mail)?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Tasks admitted and not finished.
    pub fn active(&self) -> usize {
        self.inner.running.lock().expect("running lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_message_ids_are_stable_distinct_and_well_formed() {
        let a = derived_message_id("coder@x.test", "<m1@y>", "task.ack", 0);
        assert_eq!(
            a,
            derived_message_id("coder@x.test", "<m1@y>", "task.ack", 0)
        );
        assert_ne!(
            a,
            derived_message_id("coder@x.test", "<m1@y>", "task.result", 0)
        );
        assert_ne!(
            a,
            derived_message_id("coder@x.test", "<m2@y>", "task.ack", 0)
        );
        assert_ne!(
            a,
            derived_message_id("coder@x.test", "<m1@y>", "task.ack", 1)
        );
        assert!(
            a.starts_with("<task.ack.") && a.ends_with("@x.test>"),
            "{a}"
        );
        let odd = derived_message_id("weird@ex ample>.test", "k", "task.ack", 0);
        assert!(odd.ends_with("@example.test>"), "{odd}");
    }
}
