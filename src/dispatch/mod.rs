//! What happens to an AAMP message addressed to an agent: sender policy, de-duplication and
//! expiry decide whether a dispatch runs (pure, in [`admit`]); then the task lifecycle acks it,
//! waits for a slot, runs it through `runner`, and answers with a result through an
//! [`Outbox`]. Cancels stop the matching task. Nothing here knows SMTP or JMAP.

pub mod policy;
pub mod prompt;
pub mod sessions;

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::events::Events;
use crate::mailbox::{Attachment, Inbound, MailboxError};
use crate::protocol::{AampMessage, Body, Dispatch, Envelope, HelpNeeded, Status, TaskResult};
use crate::runner::{self, Profile, RunError, TaskInput};
pub use policy::SenderPolicy;

/// Where answers go. The mailbox implements it; tests may use a fake.
pub trait Outbox: Send + Sync + 'static {
    /// Sends `msg`; returns the Message-ID it went out with.
    fn send(&self, msg: &AampMessage) -> impl Future<Output = Result<String, MailboxError>> + Send;

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
    /// Session-Key → the agent's own session id, kept across restarts.
    pub sessions: sessions::SessionStore,
}

/// Whether a dispatch should run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Run,
    /// Seen before (same Message-ID, or same sender and TaskId): do nothing.
    Duplicate,
    /// Answer with a rejected result saying this, and do not run.
    Reject(String),
}

/// Ids already handled, bounded: the oldest are forgotten first.
#[derive(Debug)]
pub struct Seen {
    order: VecDeque<String>,
    set: HashSet<String>,
    cap: usize,
}

impl Seen {
    pub fn new(cap: usize) -> Seen {
        Seen {
            order: VecDeque::new(),
            set: HashSet::new(),
            cap,
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        self.set.contains(key)
    }

    pub fn insert(&mut self, key: String) {
        if self.set.insert(key.clone()) {
            self.order.push_back(key);
            while self.order.len() > self.cap {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

fn task_key(from: &str, task_id: &str) -> String {
    format!("{}\n{}", from.to_ascii_lowercase(), task_id)
}

/// The admission decision for a dispatch, made before anything is acknowledged.
/// `active` is the number of tasks running or waiting for a slot.
pub fn admit(
    spec: &AgentSpec,
    env: &Envelope,
    dispatch: &Dispatch,
    seen: &Seen,
    active: usize,
    now: SystemTime,
) -> Admission {
    if seen.contains(&env.message_id) || seen.contains(&task_key(&env.from, &env.task_id)) {
        return Admission::Duplicate;
    }
    if !spec.policy.allows(&env.from) {
        return Admission::Reject(format!(
            "sender {} is not allowed to dispatch tasks to agent {}; the agent's owner can add it to allow_from",
            env.from, spec.name
        ));
    }
    if active >= spec.max_queued {
        return Admission::Reject(format!(
            "agent {} is busy with {active} tasks; dispatch again later",
            spec.name
        ));
    }
    if let Some(expires) = &dispatch.expires_at {
        match crate::protocol::time::parse(expires) {
            Some(at) if at <= now => {
                return Admission::Reject(format!(
                    "the task expired at {expires} before it could start"
                ))
            }
            Some(_) => {}
            None => tracing::warn!(expires, "unreadable X-AAMP-Expires-At; ignoring it"),
        }
    }
    Admission::Run
}

struct Running {
    cancel: CancellationToken,
}

struct Inner<O> {
    spec: AgentSpec,
    outbox: O,
    events: Events,
    seen: Mutex<Seen>,
    running: Mutex<HashMap<String, Running>>,
    permits: Arc<Semaphore>,
    /// One task at a time per Session-Key: an agent session takes one prompt at a time.
    session_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Questions mailed to dispatchers (`task.help_needed`), by task, awaiting an answer.
    questions: Mutex<HashMap<String, PendingQuestion>>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

struct PendingQuestion {
    /// The Message-ID of the help_needed mail, which a reply may name in In-Reply-To.
    help_message_id: String,
    options: Vec<String>,
    answer: tokio::sync::oneshot::Sender<Option<usize>>,
}

/// Which option an answer names: a number (`2`), an option's name, or text containing one
/// (the longest match wins). The first line that is not empty or quoted (`>`) is the answer.
pub fn choose(options: &[String], text: &str) -> Option<usize> {
    let answer = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('>'))?;
    let answer = answer.trim_end_matches(['.', '!']);
    if let Ok(n) = answer.parse::<usize>() {
        return (1..=options.len()).contains(&n).then(|| n - 1);
    }
    if let Some(i) = options
        .iter()
        .position(|o| o.trim().eq_ignore_ascii_case(answer))
    {
        return Some(i);
    }
    let lower = answer.to_lowercase();
    options
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.trim().is_empty() && lower.contains(&o.trim().to_lowercase()))
        .max_by_key(|(_, o)| o.len())
        .map(|(i, _)| i)
}

/// Stream events buffered between an agent and their consumer.
const STREAM_BUFFER: usize = 256;

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

impl<O: Outbox> Dispatcher<O> {
    /// Tasks are spawned on `tracker` and stopped when `shutdown` is cancelled.
    pub fn new(
        spec: AgentSpec,
        outbox: O,
        events: Events,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(spec.max_concurrent));
        Dispatcher {
            inner: Arc::new(Inner {
                spec,
                outbox,
                events,
                seen: Mutex::new(Seen::new(10_000)),
                running: Mutex::new(HashMap::new()),
                permits,
                session_locks: Mutex::new(HashMap::new()),
                questions: Mutex::new(HashMap::new()),
                tracker,
                shutdown,
            }),
        }
    }

    /// Takes one inbound message. Returns at once; the work runs on the tracker.
    pub fn handle(&self, inbound: Inbound) {
        let Inbound {
            message,
            truncated,
            email_id,
            attachments,
        } = inbound;
        let extras = MailExtras {
            truncated,
            attachments,
        };
        let span = tracing::info_span!("task", task_id = %message.envelope.task_id,
            message_id = %message.envelope.message_id, email_id = %email_id);
        let _enter = span.enter();
        match message.body {
            Body::Dispatch(dispatch) => {
                self.on_dispatch(message.envelope, dispatch, extras, span.clone())
            }
            Body::Cancel { .. } => self.on_cancel(&message.envelope),
            other => tracing::debug!(intent = %other.intent(), "not for an executor; ignored"),
        }
    }

    fn on_dispatch(
        &self,
        env: Envelope,
        dispatch: Dispatch,
        extras: MailExtras,
        span: tracing::Span,
    ) {
        let inner = &self.inner;
        if self.answer_question(&env, &dispatch) {
            return;
        }
        let decision = {
            let active = inner.running.lock().expect("running lock").len();
            let mut seen = inner.seen.lock().expect("seen lock");
            let decision = admit(
                &inner.spec,
                &env,
                &dispatch,
                &seen,
                active,
                SystemTime::now(),
            );
            if decision != Admission::Duplicate {
                seen.insert(env.message_id.clone());
                seen.insert(task_key(&env.from, &env.task_id));
            }
            decision
        };
        let fields = json!({"agent": inner.spec.name, "taskId": env.task_id, "from": env.from, "title": dispatch.title});
        match decision {
            Admission::Duplicate => tracing::info!("duplicate dispatch; already handled"),
            Admission::Reject(reason) => {
                inner.events.emit("task.rejected", json!({"agent": inner.spec.name, "taskId": env.task_id, "from": env.from, "reason": reason}));
                let this = self.clone();
                inner.tracker.spawn(
                    async move {
                        this.answer(&env, Status::Rejected, String::new(), Some(reason))
                            .await;
                    }
                    .instrument(span),
                );
            }
            Admission::Run => {
                inner.events.emit("task.received", fields);
                let cancel = inner.shutdown.child_token();
                inner.running.lock().expect("running lock").insert(
                    task_key(&env.from, &env.task_id),
                    Running {
                        cancel: cancel.clone(),
                    },
                );
                let this = self.clone();
                inner.tracker.spawn(
                    this.lifecycle(env, dispatch, extras, cancel)
                        .instrument(span),
                );
            }
        }
    }

    fn on_cancel(&self, env: &Envelope) {
        // Only the sender of the dispatch can cancel it: the key includes the sender.
        let running = self.inner.running.lock().expect("running lock");
        match running.get(&task_key(&env.from, &env.task_id)) {
            Some(task) => {
                tracing::info!(from = %env.from, "cancel received; stopping the task");
                task.cancel.cancel();
            }
            None => {
                tracing::info!(from = %env.from, "cancel for no running task of this sender; ignored")
            }
        }
    }

    async fn lifecycle(
        self,
        env: Envelope,
        dispatch: Dispatch,
        extras: MailExtras,
        cancel: CancellationToken,
    ) {
        let inner = &self.inner;
        let started = Instant::now();
        match inner
            .outbox
            .send(&AampMessage::reply(&env, &inner.spec.email, Body::Ack))
            .await
        {
            Ok(id) => inner.events.emit(
                "task.acked",
                json!({"agent": inner.spec.name, "taskId": env.task_id, "messageId": id}),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "could not send task.ack; running the task anyway")
            }
        }
        let session_lock = dispatch.session_key.as_ref().map(|key| {
            let mut locks = inner.session_locks.lock().expect("session locks");
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            locks.entry(key.clone()).or_default().clone()
        });
        let slot = async {
            let session = match &session_lock {
                Some(lock) => Some(lock.clone().lock_owned().await),
                None => None,
            };
            let permit = inner.permits.clone().acquire_owned().await.ok()?;
            Some((session, permit))
        };
        let slot = tokio::select! {
            slot = slot => slot,
            _ = cancel.cancelled() => None,
        };
        let outcome = match slot {
            Some(_held) => self.run(&env, &dispatch, &extras, &cancel).await,
            None => Err(RunError::Cancelled),
        };
        inner
            .running
            .lock()
            .expect("running lock")
            .remove(&task_key(&env.from, &env.task_id));
        let (status, output, error) = match outcome {
            Ok(out) => {
                let mut text = out.output;
                if out.truncated {
                    text.push_str(&format!(
                        "\n[output cut at {} bytes]",
                        inner.spec.profile.output.max_bytes
                    ));
                }
                (Status::Completed, text, None)
            }
            Err(RunError::Cancelled) if inner.shutdown.is_cancelled() => (
                Status::Rejected,
                String::new(),
                Some(
                    "interrupted: aamp-bridge was stopped while the task ran; dispatch it again"
                        .to_string(),
                ),
            ),
            Err(RunError::Cancelled) => (
                Status::Rejected,
                String::new(),
                Some("cancelled by the dispatcher".to_string()),
            ),
            Err(e) => (Status::Rejected, String::new(), Some(e.to_string())),
        };
        self.answer(&env, status, output, error.clone()).await;
        inner.events.emit(
            "task.completed",
            json!({"agent": inner.spec.name, "taskId": env.task_id, "status": status.as_str(),
                   "error": error, "durationMs": started.elapsed().as_millis() as u64}),
        );
    }

    async fn run(
        &self,
        env: &Envelope,
        dispatch: &Dispatch,
        extras: &MailExtras,
        cancel: &CancellationToken,
    ) -> Result<runner::RunOutput, RunError> {
        let spec = &self.inner.spec;
        let workspace = spec
            .workspace_root
            .join(workspace_name(&env.from, &env.task_id));
        make_private_dir(&workspace)?;
        let files = match self.save_attachments(&workspace, &extras.attachments).await {
            Ok(files) => files,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&workspace);
                return Err(e);
            }
        };
        let history = match &dispatch.parent_task_id {
            Some(parent) => self.inner.outbox.thread(parent).await,
            None => Vec::new(),
        };
        let key = dispatch.session_key.as_deref();
        let (questions_tx, mut questions_rx) = tokio::sync::mpsc::channel::<runner::Question>(4);
        let task = TaskInput {
            agent: spec.name.clone(),
            task_id: env.task_id.clone(),
            prompt: prompt::build(
                &spec.name,
                env,
                dispatch,
                &prompt::PromptExtras {
                    truncated: extras.truncated,
                    files,
                    history,
                },
            ),
            session_key: dispatch.session_key.clone(),
            resume_id: key.and_then(|k| spec.sessions.get(k)),
            workspace: workspace.clone(),
            questions: Some(questions_tx),
        };
        self.inner.events.emit(
            "task.started",
            json!({"agent": spec.name, "taskId": env.task_id}),
        );
        // A live stream for the dispatcher, when the mailbox has an AAMP service: created, then
        // announced by mail, then fed while the agent runs, and closed before the result.
        let stream = self.inner.outbox.open_stream(&env.task_id, &env.from).await;
        if let Some(stream_id) = &stream {
            let opened = AampMessage::reply(
                env,
                &spec.email,
                Body::StreamOpened {
                    stream_id: stream_id.clone(),
                },
            );
            match self.inner.outbox.send(&opened).await {
                Ok(_) => self.inner.events.emit(
                    "task.stream.opened",
                    json!({"agent": spec.name, "taskId": env.task_id, "streamId": stream_id}),
                ),
                Err(e) => tracing::warn!(error = %e, "could not send task.stream.opened"),
            }
        }
        let (to_stream, from_run) =
            tokio::sync::mpsc::channel::<(&'static str, serde_json::Value)>(STREAM_BUFFER);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<runner::StreamEvent>(STREAM_BUFFER);
        let events = self.inner.events;
        let streaming = stream.is_some();
        let observe = async move {
            while let Some(event) = rx.recv().await {
                let (kind, payload) = event.to_aamp();
                events.emit("task.stream", json!({"agent": spec.name, "taskId": env.task_id, "type": kind, "payload": payload}));
                if streaming {
                    let _ = to_stream.send((kind, payload)).await;
                }
            }
        };
        let pump = async {
            match &stream {
                Some(stream_id) => self.inner.outbox.pump_stream(stream_id, from_run).await,
                None => 0,
            }
        };
        let run = async move {
            let outcome = runner::run(&spec.profile, &task, cancel, &tx).await;
            drop(tx);
            outcome
        };
        let asking = async {
            while let Some(question) = questions_rx.recv().await {
                self.ask_dispatcher(env, question).await;
            }
        };
        let (outcome, (), (), appends) = tokio::join!(run, observe, asking, pump);
        if let Some(stream_id) = &stream {
            let status = if outcome.is_ok() {
                "completed"
            } else {
                "rejected"
            };
            self.inner
                .outbox
                .close_stream(
                    stream_id,
                    json!({"reason": "task.result", "status": status}),
                )
                .await;
            tracing::debug!(appends, "stream closed");
        }
        self.inner
            .questions
            .lock()
            .expect("questions lock")
            .remove(&task_key(&env.from, &env.task_id));
        if let (Some(key), Ok(out)) = (key, &outcome) {
            if let Some(id) = &out.session_id {
                if let Err(e) = spec.sessions.set(key, id) {
                    tracing::warn!(error = %e, "could not save the agent's session id");
                }
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&workspace) {
            tracing::warn!(workspace = %workspace.display(), error = %e, "could not remove the task workspace");
        }
        outcome
    }

    /// Downloads the mail's attachments into `workspace/attachments/`, under safe and
    /// distinct names; returns (relative path, content type, size) for the prompt.
    async fn save_attachments(
        &self,
        workspace: &std::path::Path,
        attachments: &[Attachment],
    ) -> Result<Vec<prompt::File>, RunError> {
        if attachments.is_empty() {
            return Ok(Vec::new());
        }
        let dir = workspace.join("attachments");
        make_private_dir(&dir)?;
        let mut files = Vec::new();
        let mut taken = HashSet::new();
        for attachment in attachments {
            let bytes = self
                .inner
                .outbox
                .download(attachment, MAX_ATTACHMENT)
                .await
                .map_err(|e| {
                    RunError::Prepare(format!(
                        "could not download the attachment {:?}: {e}",
                        attachment.name
                    ))
                })?;
            let name = unique_name(&safe_file_name(&attachment.name), &mut taken);
            std::fs::write(dir.join(&name), &bytes)?;
            files.push(prompt::File {
                path: format!("attachments/{name}"),
                content_type: attachment.content_type.clone(),
                size: bytes.len() as u64,
            });
        }
        Ok(files)
    }

    /// Mails the agent's question to the dispatcher as `task.help_needed` and keeps its answer
    /// channel until a reply comes.
    async fn ask_dispatcher(&self, env: &Envelope, question: runner::Question) {
        let inner = &self.inner;
        let help = HelpNeeded {
            question: question.text,
            blocked_reason: question.reason,
            suggested_options: question.options.clone(),
        };
        match inner
            .outbox
            .send(&AampMessage::reply(
                env,
                &inner.spec.email,
                Body::HelpNeeded(help),
            ))
            .await
        {
            Ok(id) => {
                inner.events.emit("task.help_needed", json!({"agent": inner.spec.name, "taskId": env.task_id, "options": question.options, "messageId": id}));
                let pending = PendingQuestion {
                    help_message_id: id,
                    options: question.options,
                    answer: question.answer,
                };
                inner
                    .questions
                    .lock()
                    .expect("questions lock")
                    .insert(task_key(&env.from, &env.task_id), pending);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not send task.help_needed; the question goes unanswered");
                let _ = question.answer.send(None);
            }
        }
    }

    /// A dispatch that answers a pending question (same sender, and its ParentTaskId is the
    /// waiting task or it replies to the help mail) is delivered as the answer, not run.
    fn answer_question(&self, env: &Envelope, dispatch: &Dispatch) -> bool {
        let inner = &self.inner;
        let mut pending = inner.questions.lock().expect("questions lock");
        let sender = format!("{}\n", env.from.to_ascii_lowercase());
        let key = match &dispatch.parent_task_id {
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
        };
        let Some(question) = key.and_then(|k| pending.remove(&k)) else {
            return false;
        };
        let choice = choose(&question.options, &dispatch.body_text)
            .or_else(|| choose(&question.options, &dispatch.title));
        inner
            .seen
            .lock()
            .expect("seen lock")
            .insert(env.message_id.clone());
        inner.events.emit(
            "task.answered",
            json!({"agent": inner.spec.name, "answerTaskId": env.task_id, "choice": choice.map(|i| question.options[i].clone())}),
        );
        if choice.is_none() {
            tracing::warn!("the answer names none of the options; the agent's request is rejected");
        }
        let _ = question.answer.send(choice);
        true
    }

    /// Sends the task's result. A failure is logged with the task id: the journal will make
    /// it retry across restarts.
    async fn answer(&self, env: &Envelope, status: Status, output: String, error: Option<String>) {
        let inner = &self.inner;
        let result = TaskResult {
            status,
            output,
            error,
            structured_result: None,
        };
        match inner
            .outbox
            .send(&AampMessage::reply(
                env,
                &inner.spec.email,
                Body::Result(result),
            ))
            .await
        {
            Ok(id) => {
                tracing::info!(status = status.as_str(), result_message_id = %id, "result sent")
            }
            Err(e) => tracing::error!(error = %e, "could not send task.result"),
        }
    }
}

/// What a mail brings besides its AAMP message.
#[derive(Clone, Debug, Default)]
pub struct MailExtras {
    /// The text body was cut at the fetch limit.
    pub truncated: bool,
    pub attachments: Vec<Attachment>,
}

/// The largest attachment a task takes.
const MAX_ATTACHMENT: u64 = 25 << 20;

/// A file name from a mail made safe to create: no folders, no control characters, not
/// hidden, at most 100 characters.
fn safe_file_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = base
        .chars()
        .filter(|c| !c.is_control())
        .map(|c| if c == ':' { '_' } else { c })
        .take(100)
        .collect();
    let cleaned = cleaned.trim().trim_start_matches('.').to_string();
    if cleaned.is_empty() {
        "attachment".to_string()
    } else {
        cleaned
    }
}

/// `name`, or `name-2`, `name-3`, ... (before the extension) when taken.
fn unique_name(name: &str, taken: &mut HashSet<String>) -> String {
    let (stem, ext) = match name.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() => (s.to_string(), format!(".{e}")),
        _ => (name.to_string(), String::new()),
    };
    let mut candidate = name.to_string();
    let mut n = 2;
    while !taken.insert(candidate.clone()) {
        candidate = format!("{stem}-{n}{ext}");
        n += 1;
    }
    candidate
}

/// A folder name for a task: readable, safe, and distinct for distinct (sender, task) pairs.
fn workspace_name(from: &str, task_id: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (from.to_ascii_lowercase(), task_id).hash(&mut hasher);
    let safe: String = task_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    format!("{safe}-{:016x}", hasher.finish())
}

fn make_private_dir(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Priority;

    fn spec() -> AgentSpec {
        AgentSpec {
            name: "coder".into(),
            email: "coder@x.test".into(),
            policy: SenderPolicy::new(&["*@x.test".into()]),
            max_concurrent: 1,
            max_queued: 2,
            profile: Profile::find("echo", &[]).unwrap(),
            workspace_root: PathBuf::from("/nonexistent"),
            sessions: sessions::SessionStore::new(PathBuf::from("/nonexistent/sessions.json")),
        }
    }

    fn env(from: &str, task: &str, mid: &str) -> Envelope {
        Envelope {
            version: "1.1".into(),
            task_id: task.into(),
            from: from.into(),
            to: vec!["coder@x.test".into()],
            message_id: mid.into(),
            subject: String::new(),
            in_reply_to: None,
            references: vec![],
            received_body: None,
        }
    }

    fn dispatch(expires: Option<&str>) -> Dispatch {
        Dispatch {
            title: "t".into(),
            priority: Priority::Normal,
            expires_at: expires.map(str::to_string),
            ..Dispatch::default()
        }
    }

    #[test]
    fn admission_checks_policy_duplicates_and_expiry() {
        let spec = spec();
        let mut seen = Seen::new(10);
        let now = SystemTime::now();
        assert_eq!(
            admit(
                &spec,
                &env("a@x.test", "1", "<m1>"),
                &dispatch(None),
                &seen,
                0,
                now
            ),
            Admission::Run
        );
        let rejected = admit(
            &spec,
            &env("a@evil.test", "1", "<m2>"),
            &dispatch(None),
            &seen,
            0,
            now,
        );
        assert!(
            matches!(rejected, Admission::Reject(r) if r.contains("a@evil.test") && r.contains("allow_from"))
        );
        seen.insert("<m1>".into());
        seen.insert(task_key("a@x.test", "1"));
        assert_eq!(
            admit(
                &spec,
                &env("a@x.test", "1", "<m1>"),
                &dispatch(None),
                &seen,
                0,
                now
            ),
            Admission::Duplicate
        );
        assert_eq!(
            admit(
                &spec,
                &env("A@X.test", "1", "<m9>"),
                &dispatch(None),
                &seen,
                0,
                now
            ),
            Admission::Duplicate
        );
        assert_eq!(
            admit(
                &spec,
                &env("b@x.test", "1", "<m3>"),
                &dispatch(None),
                &seen,
                0,
                now
            ),
            Admission::Run,
            "same TaskId from another sender is another task"
        );
        let expired = admit(
            &spec,
            &env("a@x.test", "2", "<m4>"),
            &dispatch(Some("2020-01-01T00:00:00Z")),
            &seen,
            0,
            now,
        );
        assert!(matches!(expired, Admission::Reject(r) if r.contains("expired")));
        assert_eq!(
            admit(
                &spec,
                &env("a@x.test", "3", "<m5>"),
                &dispatch(Some("2999-01-01T00:00:00Z")),
                &seen,
                0,
                now
            ),
            Admission::Run
        );
        let busy = admit(
            &spec,
            &env("a@x.test", "4", "<m6>"),
            &dispatch(None),
            &seen,
            2,
            now,
        );
        assert!(matches!(busy, Admission::Reject(r) if r.contains("busy")));
    }

    #[test]
    fn answers_name_an_option() {
        let options: Vec<String> = ["Allow", "Always allow", "Reject"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(choose(&options, "2"), Some(1));
        assert_eq!(choose(&options, "  reject.\n\n> quoted question"), Some(2));
        assert_eq!(choose(&options, "> Which option?\nAlways allow"), Some(1));
        assert_eq!(choose(&options, "I allow it, go ahead"), Some(0));
        assert_eq!(choose(&options, "4"), None);
        assert_eq!(choose(&options, "maybe later"), None);
        assert_eq!(choose(&options, ""), None);
    }

    #[test]
    fn attachment_names_are_safe_and_distinct() {
        assert_eq!(safe_file_name("../../etc/passwd"), "passwd");
        assert_eq!(safe_file_name("C:\\temp\\x.txt"), "x.txt");
        assert_eq!(safe_file_name(".bashrc"), "bashrc");
        assert_eq!(safe_file_name("\u{0}\n"), "attachment");
        let mut taken = HashSet::new();
        assert_eq!(unique_name("a.txt", &mut taken), "a.txt");
        assert_eq!(unique_name("a.txt", &mut taken), "a-2.txt");
        assert_eq!(unique_name("a.txt", &mut taken), "a-3.txt");
        assert_eq!(unique_name("README", &mut taken), "README");
        assert_eq!(unique_name("README", &mut taken), "README-2");
    }

    #[test]
    fn seen_is_bounded() {
        let mut seen = Seen::new(2);
        for k in ["a", "b", "c"] {
            seen.insert(k.into());
        }
        assert!(!seen.contains("a") && seen.contains("b") && seen.contains("c"));
    }

    #[test]
    fn workspace_names_are_safe_and_distinct() {
        let a = workspace_name("x@y", "../../etc/passwd");
        assert!(!a.contains('/') && !a.contains(".."));
        assert_ne!(workspace_name("x@y", "t"), workspace_name("z@y", "t"));
    }
}
