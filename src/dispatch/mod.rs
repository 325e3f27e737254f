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
pub mod prompt;
pub mod questions;
pub mod results;
pub mod slots;
mod workspace;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use crate::config::policy::{self, CancelReply, SenderPolicy, UnknownSenders};
use crate::error::{Classify, ErrorClass};
use crate::events::Events;
use crate::inbound::SenderCheck;
use crate::inbound::{Attachment, Inbound, Mail, Reply};
use crate::protocol::{AampMessage, Body, Dispatch, Envelope, RenderedMail, Status, TaskResult};
use crate::runner::Profile;
pub use admission::{admit, Admission};
pub use journal::{Journal, JournalError, Outgoing, TaskState};
pub use questions::choose;
use questions::PendingQuestion;

/// Why a mailbox back-end could not take an answer (or give an attachment), classed for the
/// outbox's retry rule. Dispatch sees only this, whichever mailbox system is behind.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct OutboxError {
    pub message: String,
    pub class: ErrorClass,
}

impl OutboxError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> OutboxError {
        OutboxError {
            message: message.into(),
            class,
        }
    }
}

impl Classify for OutboxError {
    fn class(&self) -> ErrorClass {
        self.class
    }
}

/// Where answers go: a mailbox back-end (the daemon's `Outlet`); tests may use a fake.
pub trait Outbox: Send + Sync + 'static {
    /// Submits a rendered mail once, exactly as it is (a back-end without mail translates it
    /// into its own idiom, or drops what it has no place for).
    fn submit(&self, mail: &RenderedMail) -> impl Future<Output = Result<(), OutboxError>> + Send;

    /// Fetches an inbound attachment, at most `max` bytes.
    fn download(
        &self,
        attachment: &Attachment,
        max: u64,
    ) -> impl Future<Output = Result<Vec<u8>, OutboxError>> + Send;

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
    pub limits: admission::Limits,
    pub unknown_senders: UnknownSenders,
    pub cancel_reply: CancelReply,
    /// Answered to `card.query`: (summary, card text).
    pub card: Option<(String, String)>,
    /// Rejections sent to refused senders per hour at most.
    pub refusals_per_hour: u32,
    /// A dispatch passed on by agents this many times is not run (a loop between agents).
    pub max_hops: u32,
}

/// How the dispatcher lives with the rest of the bridge.
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
    /// When rejections were last sent to refused senders (for `refusals_per_hour`).
    refusals: Mutex<std::collections::VecDeque<std::time::Instant>>,
    /// When refused pair requests were last answered (their own budget).
    pair_refusals: Mutex<std::collections::VecDeque<std::time::Instant>>,
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

/// Equal bytes, compared in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new pairing code: 9 bytes from the OS's random source, base64url (12 characters).
pub fn new_pair_code() -> String {
    use base64::Engine as _;
    let bytes = uuid::Uuid::new_v4().into_bytes();
    // A v4 UUID's bytes come from the OS random source; bytes 6 and 8 carry version bits.
    let random: Vec<u8> = bytes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 6 && *i != 8)
        .map(|(_, b)| *b)
        .take(9)
        .collect();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
}

/// Why a mail is automatic (RFC 3834 `Auto-Submitted`, a bounce or a delivery report), if
/// it is: such mail never starts a task, so two automatons cannot keep each other busy.
fn automatic(inbound: &Inbound) -> Option<&'static str> {
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
        settings.slots.add_agent(&spec.name, spec.max_concurrent);
        Dispatcher {
            inner: Arc::new(Inner {
                spec: std::sync::RwLock::new(Arc::new(spec)),
                refusals: Mutex::new(std::collections::VecDeque::new()),
                pair_refusals: Mutex::new(std::collections::VecDeque::new()),
                outbox,
                journal,
                events,
                settings,
                running: Mutex::new(HashMap::new()),
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

    /// Where this agent's answers go (its mailbox's sender).
    pub fn outbox(&self) -> &O {
        &self.inner.outbox
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
    pub fn deliver(&self, mail: Mail) -> Result<(), JournalError> {
        match mail {
            Mail::Aamp(inbound) => self.deliver_aamp(*inbound),
            Mail::Reply(reply) => self.on_reply(reply),
        }
    }

    /// A plain reply answers a waiting question when it replies to the question's mail and
    /// comes from the task's dispatcher; anything else is left alone.
    fn on_reply(&self, reply: Reply) -> Result<(), JournalError> {
        let spec = self.spec();
        let span = tracing::info_span!("reply", agent = %spec.name, message_id = %reply.message_id, email_id = %reply.email_id);
        let _enter = span.enter();
        let ignore = |reason: String| {
            tracing::info!(from = %reply.from, %reason, "plain reply ignored");
            self.inner.events.emit(
                "message.ignored",
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
        let waiting = {
            let pending = self.inner.questions.lock().expect("questions lock");
            let sender = format!("{}\n", reply.from.to_ascii_lowercase());
            pending
                .iter()
                .find(|(k, q)| {
                    k.starts_with(&sender)
                        && (reply.in_reply_to.as_deref() == Some(q.help_message_id.as_str())
                            || reply.references.contains(&q.help_message_id))
                })
                .map(|(k, q)| (k.clone(), q.task_row))
        };
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
        let recorded = self.inner.journal.record(
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
            },
            None,
        )?;
        if recorded.is_some() {
            tracing::info!(row, "a plain reply answers the agent's question");
            self.answer_question(&waiting, &task_id, &reply.text, "");
        }
        Ok(())
    }

    fn deliver_aamp(&self, inbound: Inbound) -> Result<(), JournalError> {
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
            Body::Cancel { .. } => self.on_cancel(&inbound.message.envelope),
            Body::CardQuery { .. } => self.on_card_query(&inbound, &key),
            Body::PairRequest { .. } => self.on_pair_request(&inbound, &key),
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

    /// The sender policy in force: the config's rules and those kept in the journal (added
    /// with `aamp-bridge policy` or by pairing).
    fn policy(&self, spec: &AgentSpec) -> Result<SenderPolicy, JournalError> {
        let (allow, deny) = self.inner.journal.policy(&spec.name)?;
        Ok(spec
            .policy
            .clone()
            .with_rules(allow.into_iter().map(|(rule, _)| rule))
            .with_denied(deny.into_iter().map(|(p, _)| p)))
    }

    /// Whether another refusal may be answered now (at most `refusals_per_hour`).
    fn may_answer_refusal(&self, spec: &AgentSpec) -> bool {
        self.may_answer(&self.inner.refusals, spec.refusals_per_hour)
    }

    /// Whether one more answer fits in `budget` (answers sent in the last hour) under `max`;
    /// if so, it is counted.
    fn may_answer(
        &self,
        budget: &Mutex<std::collections::VecDeque<std::time::Instant>>,
        max: u32,
    ) -> bool {
        let mut sent = budget.lock().expect("refusals lock");
        let hour_ago = std::time::Instant::now() - Duration::from_secs(3600);
        while sent.front().is_some_and(|t| *t < hour_ago) {
            sent.pop_front();
        }
        if sent.len() < max as usize {
            sent.push_back(std::time::Instant::now());
            true
        } else {
            false
        }
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
        if let Some(why) = automatic(&inbound) {
            tracing::info!(reason = why, "ignored: automatic mail never starts a task");
            self.ignored(&inbound, why);
            return Ok(());
        }
        // A task to run is kept whole (it is run again after a crash); anything else only as
        // a summary.
        let (mail, summary) = (inbound.to_json(), inbound.summary_json());
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
        let record =
            |state: TaskState, admitted: bool, reason: Option<&str>, reply: Option<&Outgoing>| {
                let mail = if admitted { &mail } else { &summary };
                inner.journal.record(
                    &journal::NewTask {
                        agent: name,
                        message_key: &key,
                        sender: &env.from,
                        task_id: &env.task_id,
                        session_key: dispatch.session_key.as_deref(),
                        state,
                        admitted,
                        mail,
                        reason,
                    },
                    reply,
                )
            };
        if let Some(waiting) = self.question_answered_by(&env, &dispatch) {
            let recorded = record(
                TaskState::Answered,
                false,
                Some("an answer to a question of an earlier task"),
                None,
            )?;
            if recorded.is_some() {
                self.answer_question(&waiting, &env.task_id, &dispatch.body_text, &dispatch.title);
            }
            return Ok(());
        }
        let journal = &inner.journal;
        let duplicate = journal
            .admitted_task(name, &env.from, &env.task_id)?
            .is_some();
        let now = SystemTime::now();
        let load = admission::Load {
            active: inner.running.lock().expect("running lock").len(),
            sender_last_hour: journal.count_admitted(
                name,
                Some(&env.from),
                None,
                now - Duration::from_secs(3600),
            )?,
            agent_last_day: journal.count_admitted(
                name,
                None,
                None,
                now - Duration::from_secs(86_400),
            )?,
            // A conversation is one sender's Session-Key: the same key from another sender
            // is another conversation, never a reason to refuse.
            session_turns: match &dispatch.session_key {
                Some(k) => journal.count_admitted(
                    name,
                    Some(&env.from),
                    Some(k),
                    SystemTime::UNIX_EPOCH,
                )?,
                None => 0,
            },
            cancelled_before: journal.was_cancelled(name, &env.from, &env.task_id)?,
        };
        let policy = self.policy(&spec)?;
        let rejected = |reason: &str| self.rejection(&env, &key, reason);
        match admit(&spec, &policy, &env, &dispatch, duplicate, &load, now) {
            Admission::Duplicate => {
                tracing::info!("a task with this sender and TaskId was received before; this dispatch is a duplicate and is ignored");
                inner.events.emit("task.duplicate", json!({"agent": name, "taskId": env.task_id, "from": env.from, "messageId": env.message_id}));
            }
            Admission::Refuse { reason } => {
                let answer = spec.unknown_senders == UnknownSenders::Reject
                    && self.may_answer_refusal(&spec);
                let reply = answer.then(|| rejected(&reason));
                if record(TaskState::Rejected, false, Some(&reason), reply.as_ref())?.is_some() {
                    tracing::info!(%reason, answered = answer, "dispatch refused by the sender policy");
                    inner.events.emit(
                        "message.ignored",
                        json!({"agent": name, "from": env.from, "taskId": env.task_id,
                        "intent": "task.dispatch", "messageId": env.message_id, "reason": reason}),
                    );
                    inner.events.emit("task.rejected", json!({"agent": name, "taskId": env.task_id, "from": env.from, "reason": reason, "answered": answer}));
                    inner.wake.notify_one();
                }
            }
            Admission::Reject { reason, state } => {
                let reply = rejected(&reason);
                if record(state, false, Some(&reason), Some(&reply))?.is_some() {
                    tracing::info!(%reason, "dispatch refused");
                    inner.events.emit("task.rejected", json!({"agent": name, "taskId": env.task_id, "from": env.from, "reason": reason, "answered": true}));
                    inner.wake.notify_one();
                }
            }
            Admission::Run => {
                let ack = self.compose(&env, &key, Body::Ack, 0);
                let Some(row) = record(TaskState::Received, true, None, Some(&ack))? else {
                    return Ok(());
                };
                inner.events.emit("task.received", json!({"agent": name, "taskId": env.task_id, "from": env.from, "title": dispatch.title, "messageId": env.message_id}));
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

    /// `pair.request`, the one intent the sender policy does not gate: a valid pairing code
    /// (unexpired, unused, compared in constant time) adds the sender to the agent's allowed
    /// senders, with the dispatch-context rules it asked for, and is used up. Repeated wrong
    /// codes lock the sender (5 in 15 minutes) and the agent (20) out for a while.
    fn on_pair_request(&self, inbound: &Inbound, key: &str) -> Result<(), JournalError> {
        let spec = self.spec();
        let journal = &self.inner.journal;
        let env = &inbound.message.envelope;
        let Body::PairRequest { pair_code, rules } = &inbound.message.body else {
            return Ok(());
        };
        // A sender with five wrong codes in 15 minutes is locked out for that long. Past
        // twenty wrong codes for the agent (many senders guessing) wrong codes are no longer
        // answered, but a correct code still pairs: nobody can lock pairing for everyone.
        let window = SystemTime::now() - Duration::from_secs(PAIR_WINDOW_SECS);
        let sender_locked =
            journal.pair_failures(&spec.name, Some(&env.from), window)? >= PAIR_SENDER_TRIES;
        let flooded = journal.pair_failures(&spec.name, None, window)? >= PAIR_AGENT_TRIES;
        let paired = if sender_locked {
            Err("too many wrong pair codes; try again in 15 minutes")
        } else {
            let codes = journal.live_pair_codes(&spec.name)?;
            let found = codes.iter().fold(None, |hit, (id, code)| {
                match constant_time_eq(code.as_bytes(), pair_code.trim().as_bytes()) {
                    true => Some(*id),
                    false => hit,
                }
            });
            match found {
                Some(id) if journal.consume_pair_code(id, &env.from)? => Ok(()),
                _ => {
                    journal.pair_failure(&spec.name, &env.from)?;
                    Err("invalid or expired pair code")
                }
            }
        };
        let (status, reason, state) = match paired {
            Ok(()) => {
                let mut rule = policy::Rule::sender(&env.from);
                if let Some(serde_json::Value::Object(map)) = rules {
                    for (k, v) in map {
                        let values: Vec<String> = match v {
                            serde_json::Value::Array(a) => a
                                .iter()
                                .filter_map(|x| x.as_str().map(str::to_string))
                                .collect(),
                            serde_json::Value::String(s) => vec![s.clone()],
                            _ => Vec::new(),
                        };
                        if !values.is_empty() {
                            rule.context.insert(k.clone(), values);
                        }
                    }
                }
                journal.add_policy(&spec.name, false, &rule, "pairing")?;
                tracing::info!(from = %env.from, "paired: the sender may now dispatch tasks");
                self.inner.events.emit(
                    "sender.paired",
                    json!({"agent": spec.name, "from": env.from, "context": rule.context}),
                );
                (Status::Completed, None, TaskState::Answered)
            }
            Err(why) => {
                tracing::warn!(from = %env.from, reason = why, "pairing refused");
                self.inner.events.emit(
                    "pair.refused",
                    json!({"agent": spec.name, "from": env.from, "reason": why}),
                );
                (Status::Rejected, Some(why.to_string()), TaskState::Rejected)
            }
        };
        // Pairing answers have a budget of their own: refused dispatches cannot use it up.
        let answer = status == Status::Completed
            || (!flooded && self.may_answer(&self.inner.pair_refusals, PAIR_REFUSALS_PER_HOUR));
        let reply = answer.then(|| {
            self.compose(
                env,
                key,
                Body::PairRespond {
                    status,
                    reason: reason.clone(),
                },
                0,
            )
        });
        self.record_answered(
            inbound,
            key,
            state,
            reason.as_deref().unwrap_or("pair.request"),
            reply.as_ref(),
        )?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Records a message that is answered but not run (a pair request, a card query), with
    /// its answer.
    fn record_answered(
        &self,
        inbound: &Inbound,
        key: &str,
        state: TaskState,
        reason: &str,
        reply: Option<&Outgoing>,
    ) -> Result<Option<i64>, JournalError> {
        let env = &inbound.message.envelope;
        self.inner.journal.record(
            &journal::NewTask {
                agent: &self.spec().name,
                message_key: key,
                sender: &env.from,
                task_id: &env.task_id,
                session_key: None,
                state,
                admitted: false,
                mail: &inbound.to_json(),
                reason: Some(reason),
            },
            reply,
        )
    }

    /// `card.query`: the agent's card, to senders the policy allows.
    fn on_card_query(&self, inbound: &Inbound, key: &str) -> Result<(), JournalError> {
        let spec = self.spec();
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
        let reply = self.compose(env, key, Body::CardResponse { summary, text }, 0);
        let recorded = self.record_answered(
            inbound,
            key,
            TaskState::Answered,
            "card.query",
            Some(&reply),
        )?;
        if recorded.is_some() {
            self.inner.events.emit(
                "card.answered",
                json!({"agent": spec.name, "taskId": env.task_id, "from": env.from}),
            );
            self.inner.wake.notify_one();
        }
        Ok(())
    }

    /// A cancel stops the sender's own task (the key includes the sender, so nobody else's);
    /// one that comes before its dispatch is remembered, and the dispatch is then answered
    /// cancelled without running.
    fn on_cancel(&self, env: &Envelope) -> Result<(), JournalError> {
        let spec = self.spec();
        if let Some(cancel) = self
            .inner
            .running
            .lock()
            .expect("running lock")
            .get(&task_key(&env.from, &env.task_id))
        {
            tracing::info!(from = %env.from, "cancel received; stopping the task");
            cancel.cancel();
            return Ok(());
        }
        let journal = &self.inner.journal;
        match journal.admitted_task(&spec.name, &env.from, &env.task_id)? {
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
                let reply = self.rejection(&env, &key, &reason);
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
            self.note(
                left.id,
                "picked up at a restart",
                Some(&format!(
                    "was {} after {} run(s)",
                    left.state.as_str(),
                    left.runs
                )),
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
        self.compose_with(env, key, body, n, &[])
    }

    /// The `task.result` rejected with `reason` that answers `env`.
    fn rejection(&self, env: &Envelope, key: &str, reason: &str) -> Outgoing {
        let result = TaskResult {
            status: Status::Rejected,
            output: String::new(),
            error: Some(reason.to_string()),
            structured_result: None,
        };
        self.compose(env, key, Body::Result(result), 0)
    }

    /// [`Dispatcher::compose`] with files attached.
    fn compose_with(
        &self,
        env: &Envelope,
        key: &str,
        body: Body,
        n: u32,
        files: &[results::Attached],
    ) -> Outgoing {
        let intent = body.intent().as_str();
        let mut msg = AampMessage::reply(env, &self.spec().email, body);
        msg.envelope.message_id = derived_message_id(&self.spec().email, key, intent, n);
        let files: Vec<crate::protocol::OutgoingFile> = files
            .iter()
            .map(|f| crate::protocol::OutgoingFile {
                filename: f.filename.clone(),
                content_type: f.content_type.clone(),
                bytes: f.bytes.clone(),
            })
            .collect();
        Outgoing {
            intent: intent.to_string(),
            mail: crate::protocol::render_with(&msg, SystemTime::now(), &files),
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
            "task.answered",
            json!({"agent": self.spec().name, "answerTaskId": answer_task_id, "choice": choice.map(|i| question.options[i].clone())}),
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
