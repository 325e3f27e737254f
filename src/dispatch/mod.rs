//! What happens to an AAMP message addressed to an agent. Every message is first recorded in
//! the [`journal`] (so it is never lost, and a second delivery of it is recognised); then
//! sender policy, duplicates, the queue's bound and expiry decide whether a dispatch runs
//! (pure, in [`admission`]); the task lifecycle waits for a slot, runs it through
//! `runner`, and records the answer; the outbox worker sends acks and results, retrying
//! until the mail server takes them. Cancels stop the matching task. Nothing here knows SMTP
//! or JMAP: answers leave as rendered bytes through the [`Backend`] seam.

pub mod admission;
mod compose;
pub mod journal;
mod lifecycle;
pub mod operator;
mod outbox;
mod pairing;
pub mod prompt;
pub mod questions;
mod recover;
pub mod results;
mod route;
pub mod slots;
mod workspace;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::backend::{Backend, BackendError, ClaimOutcome};
pub use crate::config::policy::{self, CancelReply, SenderPolicy, UnknownSenders};
use crate::events::Events;
use crate::inbound::SenderCheck;
use crate::inbound::{Attachment, Inbound, Mail, Reply};
use crate::protocol::{AampMessage, Body, Dispatch, Envelope, Status, TaskResult};
use crate::runner::Profile;
pub use admission::{admit, Admission};
pub use journal::{Journal, JournalError, Outgoing, TaskState};
pub use pairing::new_pair_code;
pub use questions::choose;
use questions::PendingQuestion;

/// This bridge as one of several serving an agent's mailbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSpec {
    pub name: String,
    /// How long a claim holds unless renewed; it is renewed every third of it.
    pub lease: Duration,
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
    pub limits: admission::Limits,
    pub unknown_senders: UnknownSenders,
    pub cancel_reply: CancelReply,
    /// Answered to `card.query`: (summary, card text).
    pub card: Option<(String, String)>,
    /// Rejections sent to refused senders per hour at most.
    pub refusals_per_hour: u32,
    /// A dispatch passed on by agents this many times is not run (a loop between agents).
    pub max_hops: u32,
    /// Several bridges serve the mailbox: this one's name and the claims' lease. Each task is
    /// claimed on the mail server before it is acknowledged.
    pub replica: Option<ReplicaSpec>,
}

/// How the engine lives with the rest of the bridge.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long an unsent ack or result is retried before the bridge gives up on it.
    pub retry_for: Duration,
    /// Carried by every agent process this bridge starts (and their children) as
    /// [`OWNER_VAR`], so leftovers of a crashed bridge are found at the next start.
    pub owner_tag: String,
    /// The bridge's one scheduler of slots (each agent's `max_concurrent_tasks`, and the
    /// top-level one for all agents together).
    pub slots: Arc<slots::Slots>,
}

/// The environment variable naming the bridge (its state directory) an agent belongs to.
pub const OWNER_VAR: &str = "AAMP_BRIDGE_OWNER";
/// The environment variable naming one run of one task.
pub const RUN_VAR: &str = "AAMP_BRIDGE_RUN";
/// The environment variable telling an agent how many hops its task has had;
/// `aamp-bridge dispatch` run by the agent sends one more.
pub const HOPS_VAR: &str = "AAMP_BRIDGE_HOPS";

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
    /// Found in the journal at start, interrupted, and not to be run again (the profile
    /// says so, or it ran too often): with several bridges the answer waits for the claim.
    rerun_refused: Option<String>,
}

/// Where an admitted task waits to run.
enum Place {
    /// In the slot queue, its conversation's lock (if any) held.
    Queued {
        session: Option<tokio::sync::OwnedMutexGuard<()>>,
        ticket: slots::Ticket,
    },
    /// It joins the slot queue later: after its attachments are downloaded, and behind a
    /// running task of its conversation (the lock, if any).
    Later(Option<Arc<tokio::sync::Mutex<()>>>),
}

/// A task's arrival, for first-come order among equal priorities: its journal row.
fn arrival(task: &Task) -> u64 {
    task.row.max(0) as u64
}

/// A conversation is one Session-Key of one sender: the same key from two senders is two
/// conversations (no sender can take over, or lock out, another's).
fn session_scope(sender: &str, key: &str) -> String {
    format!("{}\n{key}", sender.to_ascii_lowercase())
}

/// The conversation as the agent sees it (`{{session_key}}`, `AAMP_SESSION_KEY`): the
/// sender's Session-Key and a short tag of the sender, so an agent that keys its own sessions
/// by it keeps two senders' conversations apart too.
fn conversation_key(sender: &str, key: &str) -> String {
    let tag = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        sender.to_ascii_lowercase().as_bytes(),
    );
    format!("{key}-{}", &tag.simple().to_string()[..8])
}

/// What a mail brings besides its AAMP message.
#[derive(Clone, Debug, Default)]
pub struct MailExtras {
    /// The mail's id on its server (what a claim names).
    pub email_id: String,
    /// The text body was cut at the fetch limit.
    pub truncated: bool,
    pub attachments: Vec<Attachment>,
}

/// Pairing: the window wrong codes are counted in, how many one sender may give before it is
/// locked out, how many the agent takes before wrong codes go unanswered, and how many
/// refused pair requests are answered an hour.
const PAIR_WINDOW_SECS: u64 = 15 * 60;
const PAIR_SENDER_TRIES: u32 = 5;
const PAIR_AGENT_TRIES: u32 = 20;
const PAIR_REFUSALS_PER_HOUR: u32 = 20;

struct Inner<O> {
    /// Replaced whole on a reload (policy, profile, queue bound).
    spec: std::sync::RwLock<Arc<AgentSpec>>,
    outbox: O,
    journal: Arc<Journal>,
    events: Events,
    settings: Settings,
    /// Tasks admitted and not finished (running or waiting for a slot), by sender + TaskId.
    running: Mutex<HashMap<String, CancellationToken>>,
    /// One task at a time per Session-Key: an agent session takes one prompt at a time.
    session_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Questions mailed to dispatchers (`task.help_needed`), by task, awaiting an answer.
    questions: Mutex<HashMap<String, PendingQuestion>>,
    /// Tasks the operator cancelled from the live view, by task key: answered so.
    cancelled_by_operator: Mutex<std::collections::HashSet<String>>,
    /// Questions the operator answered from the live view, by task key: the task's answer
    /// tells its dispatcher who answered what.
    answered_by_operator: Mutex<HashMap<String, Vec<String>>>,
    tracker: TaskTracker,
    /// Cancelled when the bridge stops its tasks: a task stopped this way is not answered;
    /// it stays in the journal and runs again at the next start.
    abort: CancellationToken,
    /// Wakes the outbox worker.
    wake: Notify,
    /// Rounds the outbox worker made (see [`Engine::outbox_rounds`]).
    outbox_rounds: std::sync::atomic::AtomicU64,
    /// The mailbox answers again ([`Engine::server_back`]): the outbox tries at once.
    server_back: std::sync::atomic::AtomicBool,
    /// Conversation folders a queued or running task uses: never pruned.
    conversations: workspace::InUse,
}

/// One agent's task lifecycle. Cheap to clone.
pub struct Engine<O> {
    inner: Arc<Inner<O>>,
}

impl<O> Clone for Engine<O> {
    fn clone(&self) -> Self {
        Engine {
            inner: self.inner.clone(),
        }
    }
}

fn task_key(from: &str, task_id: &str) -> String {
    format!("{}\n{}", from.to_ascii_lowercase(), task_id)
}

impl<O: Backend> Engine<O> {
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
        settings.slots.add_agent(&spec.name, spec.max_concurrent);
        Engine {
            inner: Arc::new(Inner {
                spec: std::sync::RwLock::new(Arc::new(spec)),
                outbox,
                journal,
                events,
                settings,
                running: Mutex::new(HashMap::new()),
                session_locks: Mutex::new(HashMap::new()),
                questions: Mutex::new(HashMap::new()),
                cancelled_by_operator: Mutex::default(),
                answered_by_operator: Mutex::default(),
                tracker,
                abort,
                wake: Notify::new(),
                outbox_rounds: std::sync::atomic::AtomicU64::new(0),
                server_back: std::sync::atomic::AtomicBool::new(false),
                conversations: workspace::InUse::default(),
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

    /// Where this agent's answers go (its mailbox's sender).
    pub fn outbox(&self) -> &O {
        &self.inner.outbox
    }

    pub fn name(&self) -> String {
        self.spec().name.clone()
    }

    /// The mailbox's credentials were replaced: what waits in the outbox for a later retry
    /// is tried now.
    pub fn retry_outbox_now(&self) {
        match self.inner.journal.retry_now(&self.spec().name) {
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

    /// Starts the work on an admitted task.
    fn start(&self, task: Task, span: tracing::Span) {
        let cancel = self.inner.abort.child_token();
        self.inner
            .running
            .lock()
            .expect("running lock")
            .insert(task_key(&task.env.from, &task.env.task_id), cancel.clone());
        // The task's place in the slot queue is taken now, in delivery order, unless it must
        // first wait for an earlier task of its conversation or download its attachments.
        let session_lock = task.dispatch.session_key.as_ref().map(|key| {
            let scope = session_scope(&task.env.from, key);
            let mut locks = self.inner.session_locks.lock().expect("session locks");
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            locks.entry(scope).or_default().clone()
        });
        // A task with attachments joins after downloading them, so it never holds a slot
        // while it waits for them.
        let place = if !task.extras.attachments.is_empty() {
            Place::Later(session_lock)
        } else {
            match session_lock.map(|lock| lock.clone().try_lock_owned().map_err(|_| lock)) {
                Some(Err(lock)) => Place::Later(Some(lock)),
                session => Place::Queued {
                    session: session.map(|s| s.expect("the Err case is above")),
                    ticket: self.inner.settings.slots.enqueue(
                        &self.spec().name,
                        task.dispatch.priority,
                        arrival(&task),
                    ),
                },
            }
        };
        let this = self.clone();
        self.inner
            .tracker
            .spawn(this.lifecycle(task, place, cancel).instrument(span));
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

    /// Hands the answer in `text` (or else `title`) to the question waiting under `waiting`.
    fn answer_question(&self, waiting: &str, answer_task_id: &str, text: &str, title: &str) {
        let inner = &self.inner;
        let Some(question) = inner
            .questions
            .lock()
            .expect("questions lock")
            .remove(waiting)
        else {
            return;
        };
        let choice = choose(&question.options, text).or_else(|| choose(&question.options, title));
        inner.events.emit(
            crate::events::Event::TaskAnswered,
            json!({"agent": self.spec().name, "taskId": waiting.split_once('\n').map(|(_, t)| t), "answerTaskId": answer_task_id, "choice": choice.map(|i| question.options[i].clone())}),
        );
        if choice.is_none() {
            tracing::info!(
                "the answer names none of the options; it goes to the agent as free text"
            );
        }
        if let Err(e) = inner
            .journal
            .set_state(question.task_row, TaskState::Running)
        {
            tracing::warn!(error = %e, "could not record that the question was answered");
        }
        let answer = match choice {
            Some(i) => crate::runner::Answer::Chosen(i),
            None => match questions::own_words(text) {
                Some(words) => crate::runner::Answer::Text(words),
                None => crate::runner::Answer::None,
            },
        };
        let _ = question.answer.send(answer);
    }

    /// Records a final state with its answer and wakes the outbox. A journal failure is
    /// logged; the answer then goes out directly, once.
    fn finish(&self, task: &Task, state: TaskState, reason: Option<&str>, reply: Option<Outgoing>) {
        let inner = &self.inner;
        match inner
            .journal
            .finish(&self.spec().name, task.row, state, reason, reply.as_ref())
        {
            Ok(()) => inner.wake.notify_one(),
            Err(_) if reply.is_none() => {}
            Err(e) => {
                let reply = reply.expect("checked above");
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

    /// Notes a step in the task's timeline (a failure to note is only logged).
    fn note(&self, row: i64, what: &str, detail: Option<&str>) {
        if let Err(e) = self.inner.journal.note(row, what, detail) {
            tracing::debug!(error = %e, "could not note a step in the task's timeline");
        }
    }

    /// Tasks admitted and not finished.
    pub fn active(&self) -> usize {
        self.inner.running.lock().expect("running lock").len()
    }
}
