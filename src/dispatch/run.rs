//! The run itself: the agent started in the task's workspace with its prompt (the thread's or
//! the conversation's earlier turns in it), its stream fed, its questions relayed, its session
//! kept for the conversation's next turn, and what it handed back read into the answer.

use std::sync::Arc;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::attachments::Prepared;
use super::budget::Guard;
use super::{
    conversation_key, prompt, results, session_scope, task_key, AgentSpec, Engine, Journal, Task,
    HOPS_VAR, OWNER_VAR, RUN_VAR,
};
use crate::backend::{Backend, Earlier};
use crate::events::Events;
use crate::protocol::{Body, Dispatch, Envelope};
use crate::runner::{self, RunError, SpawnHook, TaskInput};

/// A successful run as it is answered: the text, and what goes with it.
pub(super) struct Answer {
    pub output: String,
    pub truncated: bool,
    pub session_id: Option<String>,
    /// The conversation's earlier context could not be restored (the result says so).
    pub context_lost: bool,
    /// The answer as the conversation's record keeps it: without the bridge's notes.
    pub said: String,
    pub structured: Option<serde_json::Value>,
    pub files: Vec<results::Attached>,
}

/// What a result says when the agent could not restore the conversation.
pub(super) const CONTEXT_LOST: &str = "[Note from aamp-bridge: the agent could not restore this conversation's earlier context (its session was not found), so this answer was made without it.]";
/// What a result says when the agent's profile names no session to continue, so the
/// conversation's earlier turns were retold in its prompt.
pub(super) const CONTEXT_NO_RESUME: &str = "[Note from aamp-bridge: this agent's profile cannot continue a session (it has no {{resume_id}}), so it was given the conversation's earlier turns as text.]";
/// What a result says when the agent could not restore its session and was given the
/// conversation's earlier turns as text instead.
pub(super) const CONTEXT_RETOLD: &str = "[Note from aamp-bridge: the agent could not restore its own session for this conversation, so it was given the conversation's earlier turns as text instead.]";

/// Reads what the agent handed back: fields and files named in its final answer, and files
/// it handed over otherwise; every file from `workspace` only, and every one refused named at
/// the end of the output.
/// `retold`: the agent was given the conversation's earlier turns, should its session not be
/// restored.
fn hand_back(out: runner::RunOutput, workspace: &std::path::Path, retold: bool) -> Answer {
    let extracted = results::extract(&out.output);
    let mut refs = extracted.files.clone();
    let mut inline = Vec::new();
    for file in out.files {
        match file {
            runner::OutputFile::Path(path) => refs.push(results::FileRef {
                path: path.display().to_string(),
                filename: None,
                content_type: None,
            }),
            runner::OutputFile::Inline {
                name,
                content_type,
                bytes,
            } => inline.push((name, content_type, bytes)),
        }
    }
    let caps = results::Caps::default();
    let (mut files, mut refused) = results::gather(workspace, &refs, caps);
    for (name, content_type, bytes) in inline {
        results::attach_inline(&mut files, &mut refused, &name, content_type, bytes, caps);
    }
    let mut output = extracted.output;
    if !refused.is_empty() {
        output.push_str("\n\nFiles not attached:");
        for why in &refused {
            output.push_str(&format!("\n- {why}"));
        }
        tracing::warn!(refused = ?refused, "files the agent named were not attached");
    }
    let said = output.clone();
    if out.no_resume {
        output.push_str("\n\n");
        output.push_str(CONTEXT_NO_RESUME);
    } else if out.context_lost {
        output.push_str("\n\n");
        output.push_str(if retold { CONTEXT_RETOLD } else { CONTEXT_LOST });
    }
    let structured = extracted.structured.map(|mut s| {
        results::fill_attachment_names(&mut s, &files);
        s
    });
    Answer {
        output,
        truncated: out.truncated,
        session_id: out.session_id,
        context_lost: out.context_lost,
        said,
        structured,
        files,
    }
}

/// Stream events buffered between an agent and their consumer.
const STREAM_BUFFER: usize = 256;

impl<B: Backend> Engine<B> {
    /// The environment of a run tagged `run_tag`: the bridge's and the run's tags, the hop
    /// count, and the delegation tools' socket and credential (with the grant that keeps it).
    fn run_env(
        &self,
        task: &Task,
        run_tag: &str,
    ) -> (
        Vec<(String, String)>,
        Option<super::delegations::GrantGuard>,
    ) {
        let mut env = vec![
            (
                OWNER_VAR.to_string(),
                self.common.settings.owner_tag.clone(),
            ),
            (RUN_VAR.to_string(), run_tag.to_string()),
            (
                HOPS_VAR.to_string(),
                task.dispatch.hop_count.unwrap_or(0).to_string(),
            ),
        ];
        let grant = self.grant_for(task, run_tag, &mut env);
        (env, grant)
    }

    /// Runs the agent on the task: its input made (the prompt, the session to resume, the
    /// conversation's earlier turns), then the run, its stream and its questions side by
    /// side; the stream closed and the conversation's session and turn kept after.
    pub(super) async fn run(
        &self,
        task: &Task,
        runs: u32,
        prepared: Prepared,
        cancel: &CancellationToken,
    ) -> Result<Answer, RunError> {
        let spec_now = self.common.spec();
        let spec = &*spec_now;
        let journal = &self.common.journal;
        let (env, dispatch) = (&task.env, &task.dispatch);
        let workspace = self.workspace_of(task).dir;
        let history = thread_of(self.backend(), env, dispatch).await;
        let scoped = dispatch
            .session_key
            .as_deref()
            .map(|k| session_scope(&env.from, k));
        let key = scoped.as_deref();
        let resume_id = match key {
            Some(k) => journal.session(&spec.name, k).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not read the agent's session id; starting a new session");
                None
            }),
            None => None,
        };
        let run_tag = uuid::Uuid::new_v4().simple().to_string();
        // Only processes created from here on can carry the run's tag.
        let first_pid = runner::process::last_pid();
        let overrides = note_overrides(journal, spec, task.row, resume_id.as_deref());
        let (questions_tx, mut questions_rx) = tokio::sync::mpsc::channel::<runner::Question>(4);
        let mut input = input(spec, task, prepared, history, (key, resume_id), journal);
        input.workspace = workspace.clone();
        input.questions = Some(questions_tx);
        // The delegation tools, bound to this run (withdrawn when `grant` is dropped).
        let (run_env, grant) = self.run_env(task, &run_tag);
        input.env = run_env;
        input.mcp = grant.as_ref().map(|g| g.server.clone());
        self.common.events.emit(
            crate::events::Event::TaskStarted,
            json!({"agent": spec.name, "taskId": env.task_id, "run": runs}),
        );
        // A live stream for the dispatcher, when the mailbox has an AAMP service, opened with
        // the agent's first event (a task that has none costs no stream and no mail), then
        // announced by mail, fed while the agent runs, and closed before the result.
        let (to_stream, from_run) =
            tokio::sync::mpsc::channel::<(&'static str, serde_json::Value)>(STREAM_BUFFER);
        let (tx, rx) = tokio::sync::mpsc::channel::<runner::StreamEvent>(STREAM_BUFFER);
        // A hard budget crossed stops the run through a token of its own (see budget.rs).
        let guard = Guard::new(&spec.budgets, (&spec.name, &env.from), cancel)
            .with_chain(task.row, dispatch.chain.budget_tokens);
        let _deadline = guard.stop_at(dispatch.chain.deadline.as_deref());
        let watched = Watched {
            quota: &self.quota,
            events: self.common.events,
            agent: &spec.name,
            task_id: &env.task_id,
            journal,
            row: task.row,
            run: runs,
            guard: &guard,
        };
        let observe = observe(watched, rx, to_stream);
        let pump = self.stream(task, runs, from_run);
        let run = agent_run(
            spec,
            input,
            guard.token(),
            tx,
            overrides,
            (run_tag, first_pid),
        );
        let asking = async {
            while let Some(question) = questions_rx.recv().await {
                self.desk.ask(task, question).await;
            }
        };
        let (outcome, (), (), streamed) = tokio::join!(run, observe, asking, pump);
        let outcome = guard.explain(outcome, cancel);
        self.after_run(task, cancel);
        if let Some((stream_id, appends)) = &streamed {
            let reason = match &outcome {
                Ok(_) => json!({"reason": "task.result", "status": "completed"}),
                // Parked: the task runs again after the reset, in a stream of its own.
                Err(RunError::UsageLimit { .. }) => json!({"reason": "waiting_for_quota"}),
                Err(_) => json!({"reason": "task.result", "status": "rejected"}),
            };
            self.backend().close_stream(stream_id, reason).await;
            tracing::debug!(appends, "stream closed");
        }
        self.desk.forget(&task_key(&env.from, &env.task_id));
        if let (Some(key), Ok(out)) = (key, &outcome) {
            keep_turn(journal, &spec.name, key, &dispatch.body_text, out);
        }
        outcome
    }

    /// The task's live stream, opened with the agent's first event (`None` when it has none,
    /// or the mailbox has no stream service), announced by mail, and fed with the rest:
    /// its id and the number of appends.
    async fn stream(
        &self,
        task: &Task,
        runs: u32,
        mut from_run: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> Option<(String, usize)> {
        let env = &task.env;
        let first = from_run.recv().await?;
        let Some(stream_id) = self.backend().open_stream(&env.task_id, &env.from).await else {
            // No stream service: the events only go to the log and `--json`.
            while from_run.recv().await.is_some() {}
            return None;
        };
        self.common
            .note(task.row, "stream opened", Some(&stream_id));
        let opened = Body::StreamOpened {
            stream_id: stream_id.clone(),
        };
        let opened = self.outbox.compose(env, &task.key, opened, runs);
        match self.outbox.enqueue(task, &opened) {
            Ok(()) => self.common.events.emit(
                crate::events::Event::TaskStreamOpened,
                json!({"agent": self.common.spec().name, "taskId": env.task_id, "streamId": stream_id}),
            ),
            Err(e) => tracing::warn!(error = %e, "could not queue task.stream.opened"),
        }
        // The first event goes first, then the rest as they come.
        let (feed, fed) =
            tokio::sync::mpsc::channel::<(&'static str, serde_json::Value)>(STREAM_BUFFER);
        let forward = async move {
            if feed.send(first).await.is_ok() {
                while let Some(event) = from_run.recv().await {
                    if feed.send(event).await.is_err() {
                        break;
                    }
                }
            }
        };
        let ((), appends) = tokio::join!(forward, self.backend().pump_stream(&stream_id, fed));
        Some((stream_id, appends))
    }
}

/// The thread of the task's parent for its prompt: only when the sender dispatched in it,
/// so nobody pulls another sender's conversation into their prompt by naming its TaskId.
async fn thread_of<B: Backend>(backend: &B, env: &Envelope, dispatch: &Dispatch) -> Vec<Earlier> {
    let Some(parent) = &dispatch.parent_task_id else {
        return Vec::new();
    };
    let thread = backend.thread(parent).await;
    let theirs = thread
        .iter()
        .any(|e| e.intent == "task.dispatch" && e.from.eq_ignore_ascii_case(&env.from));
    if theirs {
        thread
    } else {
        if !thread.is_empty() {
            tracing::warn!(parent = %parent, "the ParentTaskId names another sender's thread; it is left out of the prompt");
        }
        Vec::new()
    }
}

/// A profile's own flag in place of the policy's, noted where the task is looked at (its
/// timeline, its answer), not only in the log at start.
fn note_overrides(
    journal: &Journal,
    spec: &AgentSpec,
    row: i64,
    resume_id: Option<&str>,
) -> Vec<String> {
    let overrides = spec
        .profile
        .policy_overrides(resume_id.is_some_and(|id| !id.is_empty()));
    for o in &overrides {
        let _ = journal.note(row, "the profile's own flag overrides the policy", Some(o));
    }
    overrides
}

/// The agent's input for the task: its prompt, and (should the agent not restore its
/// session) the conversation's earlier turns, kept in the journal, retold in a fresh one,
/// unless the thread's own history already goes with it. The caller adds the session to
/// resume, the workspace, the questions' channel and the environment.
fn input(
    spec: &AgentSpec,
    task: &Task,
    prepared: Prepared,
    history: Vec<Earlier>,
    (key, resume_id): (Option<&str>, Option<String>),
    journal: &Arc<Journal>,
) -> TaskInput {
    let (env, dispatch) = (&task.env, &task.dispatch);
    let turns = match (key, &resume_id) {
        (Some(k), Some(_)) if history.is_empty() => {
            journal.turns(&spec.name, k).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not read the conversation's earlier turns");
                Vec::new()
            })
        }
        _ => Vec::new(),
    };
    let Prepared { files, left_out } = prepared;
    let extras = prompt::PromptExtras {
        truncated: task.extras.truncated,
        files,
        left_out,
        history,
        boundary: prompt::boundary(),
    };
    let fresh_prompt = (!turns.is_empty()).then(|| {
        let mut retold = extras.clone();
        retold.history = turns
            .iter()
            .flat_map(|t| {
                [
                    Earlier {
                        intent: "task.dispatch".into(),
                        from: env.from.clone(),
                        text: t.request.clone(),
                    },
                    Earlier {
                        intent: "task.result".into(),
                        from: spec.name.clone(),
                        text: t.answer.clone(),
                    },
                ]
            })
            .collect();
        prompt::build(&spec.name, env, dispatch, &retold)
    });
    let on_spawn = {
        let (journal, row) = (journal.clone(), task.row);
        SpawnHook(Arc::new(move |pgid| {
            if let Err(e) = journal.set_pgid(row, pgid) {
                tracing::warn!(error = %e, "could not record the agent's process group");
            }
            let _ = journal.note(row, "agent started", Some(&format!("process group {pgid}")));
        }))
    };
    TaskInput {
        agent: spec.name.clone(),
        task_id: env.task_id.clone(),
        prompt: prompt::build(&spec.name, env, dispatch, &extras),
        fresh_prompt,
        session_key: dispatch
            .session_key
            .as_deref()
            .map(|k| conversation_key(&env.from, k)),
        resume_id,
        workspace: Default::default(),
        questions: None,
        env: Vec::new(),
        on_spawn: Some(on_spawn),
        mcp: None,
    }
}

/// The run [`observe`] watches.
struct Watched<'a> {
    /// Told when the run is past its first model call (a tool call, a plan, tokens used):
    /// the agent's usage limit, if it was at one, is over.
    quota: &'a super::quota::Quota,
    events: Events,
    agent: &'a str,
    task_id: &'a str,
    journal: &'a Journal,
    row: i64,
    run: u32,
    /// Prices the reports, and stops the run at a hard budget.
    guard: &'a Guard<'a>,
}

/// Feeds the agent's stream events to the log and `--json`, and those for the dispatcher to
/// the task's stream; journals what the agent reported its model calls cost as each report
/// comes (so a crash mid-task loses none of what was reported), priced first where the agent
/// stated no cost; a hard budget crossed stops the run.
async fn observe(
    run: Watched<'_>,
    mut rx: tokio::sync::mpsc::Receiver<runner::StreamEvent>,
    to_stream: tokio::sync::mpsc::Sender<(&'static str, serde_json::Value)>,
) {
    while let Some(event) = rx.recv().await {
        let event = run.guard.priced(event);
        if past_a_model_call(&event) {
            run.quota.ran(run.row);
        }
        if let runner::StreamEvent::Usage { key, usage } = &event {
            let at = std::time::SystemTime::now();
            match run.journal.record_usage(run.row, run.run, key, usage, at) {
                Ok(true) => run.guard.counted(run.journal, at),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not record what the agent's model calls cost")
                }
            }
        }
        let (kind, payload) = event.to_aamp();
        run.events.emit_detail(
            crate::events::Event::TaskStream,
            json!({"agent": run.agent, "taskId": run.task_id, "type": kind, "payload": payload}),
        );
        if event.for_dispatcher() {
            let _ = to_stream.send((kind, payload)).await;
        }
    }
}

/// Whether the event shows a model call that went through (not text alone: Claude Code
/// says its usage limit as an assistant message of its own).
fn past_a_model_call(event: &runner::StreamEvent) -> bool {
    match event {
        runner::StreamEvent::ToolCall { .. } | runner::StreamEvent::Todo(_) => true,
        runner::StreamEvent::Usage { usage, .. } => usage.total_tokens() > 0,
        _ => false,
    }
}

/// The agent run itself, and what it handed back read into the answer (its files each
/// announced on the stream before the result); then what the agent started and left behind
/// (`tag`: the run's tag and the first process id it may carry) is stopped. Owns the input,
/// so the question sender in it drops when the run ends, which ends the questions' relay.
async fn agent_run(
    spec: &AgentSpec,
    input: TaskInput,
    cancel: &CancellationToken,
    tx: tokio::sync::mpsc::Sender<runner::StreamEvent>,
    overrides: Vec<String>,
    (run_tag, first_pid): (String, Option<i32>),
) -> Result<Answer, RunError> {
    let workspace = input.workspace.clone();
    let retold = input.fresh_prompt.is_some();
    let outcome = runner::run(&spec.profile, &input, cancel, &tx).await;
    drop(input);
    // Fields and files from the final answer; files only from the workspace.
    // Reading up to 20 MiB of files is blocking work: off the runtime.
    let outcome = match outcome {
        Ok(out) => tokio::task::spawn_blocking(move || {
            let mut answer = hand_back(out, &workspace, retold);
            if !overrides.is_empty() {
                answer.output.push_str(&format!(
                    "\n\n[Note from aamp-bridge: this agent's profile passes its own {}: what the agent's tools could do followed the profile's flag, not the sender policy.]",
                    overrides.join("; ")
                ));
            }
            answer
        })
        .await
        .map_err(|e| RunError::Prepare(format!("the answer's files could not be read: {e}"))),
        Err(e) => Err(e),
    };
    if let Ok(answer) = &outcome {
        for file in &answer.files {
            let _ = tx
                .send(runner::StreamEvent::Artifact {
                    label: file.filename.clone(),
                    filename: file.filename.clone(),
                    content_type: file.content_type.clone(),
                    size: file.bytes.len() as u64,
                })
                .await;
        }
    }
    drop(tx);
    // What the agent started and left behind, even outside its process group.
    let left = runner::process::kill_tagged_since(RUN_VAR, &run_tag, first_pid);
    if left > 0 {
        tracing::info!(processes = left, "stopped processes the agent left behind");
    }
    outcome
}

/// Keeps the conversation `key`'s session for its next turn, and the turn itself (what was
/// asked, what was said).
fn keep_turn(journal: &Journal, agent: &str, key: &str, asked: &str, out: &Answer) {
    let saved = match (&out.session_id, out.context_lost) {
        (Some(id), _) => journal.set_session(agent, key, id),
        // The old session could not be restored and no new one was named: forget it, so
        // the conversation's next turn does not try it again.
        (None, true) => journal.drop_session(agent, key),
        (None, false) => Ok(()),
    };
    if let Err(e) = saved {
        tracing::warn!(error = %e, "could not save the agent's session id");
    }
    if let Err(e) = journal.add_turn(agent, key, asked, &out.said) {
        tracing::warn!(error = %e, "could not record the conversation's turn");
    }
}
