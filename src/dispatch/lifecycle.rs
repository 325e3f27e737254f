//! One admitted task from its slot to its recorded answer: wait for a slot (one task at a time
//! per Session-Key, at most `max_concurrent` at once), run the agent in its workspace (the
//! task's own, or its conversation's),
//! feed its stream, relay its questions, and record the result for the outbox. A task
//! stopped because the bridge stops is not answered: it stays in the journal for the next
//! start. One of several bridges serving the mailbox claims the task on the mail server once
//! it has a slot for it, acknowledges and runs it only when it won, and renews the claim while
//! the task runs.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::journal::TaskState;
use super::questions::PendingQuestion;
use super::{
    arrival, conversation_key, prompt, results, session_scope, task_key, workspace, Backend,
    CancelReply, ClaimOutcome, Engine, Place, Task, OWNER_VAR, RUN_VAR,
};
use crate::error::{Classify, ErrorClass};
use crate::inbound::Attachment;
use crate::protocol::{Body, HelpNeeded, Status, TaskResult};
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
/// The largest attachment a task takes.
const MAX_ATTACHMENT: u64 = 25 << 20;
/// The most attachments a task takes; the prompt names the rest as left out.
const MAX_ATTACHMENTS: usize = 32;
/// Attachments downloaded at once.
const DOWNLOADS_AT_ONCE: usize = 4;

/// A task's workspace made ready: the attachments saved in it, and those left out.
#[derive(Default)]
struct Prepared {
    files: Vec<prompt::File>,
    left_out: Vec<prompt::File>,
}

impl<O: Backend> Engine<O> {
    pub(super) async fn lifecycle(self, task: Task, place: Place, cancel: CancellationToken) {
        let inner = &self.inner;
        let started = Instant::now();
        let priority = task.dispatch.priority;
        let name = self.spec().name.clone();
        // The workspace and the mail's attachments are made ready before the task asks for a
        // slot: downloads never hold one.
        let workspace = self.workspace_of(&task);
        // Its conversation's folder is not pruned while the task waits or runs in it.
        let _in_use = inner.conversations.hold(&workspace);
        let prepared = tokio::select! {
            p = self.prepare(&workspace, &task.extras.attachments) => Some(p),
            _ = cancel.cancelled() => None,
        };
        let slot = async {
            let (session, ticket) = match place {
                Place::Queued { session, ticket } => (session, ticket),
                Place::Later(lock) => {
                    let session = match lock {
                        Some(lock) => Some(lock.lock_owned().await),
                        None => None,
                    };
                    let ticket = inner
                        .settings
                        .slots
                        .enqueue(&name, priority, arrival(&task));
                    (session, ticket)
                }
            };
            Some((session, ticket.granted().await))
        };
        let slot = match &prepared {
            Some(Ok(_)) => tokio::select! {
                slot = slot => slot,
                _ = cancel.cancelled() => None,
            },
            _ => None,
        };
        // One of several bridges claims the task once it has a slot for it (a bridge with
        // none free leaves it to the others), and acknowledges it only when it won.
        let replica = self.spec().replica.clone();
        // Not to be run again (the profile's rerun_interrupted): answered with why, once
        // this bridge holds the task.
        let mut refused = task.rerun_refused.clone();
        let slot = match (slot, &replica) {
            (Some(held), Some(_)) => match self.claim(&task, &cancel).await {
                Some(Ok(ClaimOutcome::Won)) => Some(held),
                Some(Ok(ClaimOutcome::TakenOver { from })) => {
                    if !self.spec().profile.rerun_interrupted {
                        refused = Some(format!("interrupted: replica {from} stopped while it ran; this agent's tasks are not run twice; dispatch it again"));
                    }
                    Some(held)
                }
                Some(Ok(ClaimOutcome::Lost { by })) => {
                    drop(held);
                    self.lost_claim(&task, &workspace, by.as_deref());
                    return;
                }
                Some(Err(refused)) => {
                    drop(held);
                    self.park(&task, &workspace, &refused);
                    return;
                }
                None => None,
            },
            (slot, _) => slot,
        };
        // Cancelled while it waited for a slot or for its claim: answered by the bridge that
        // wins the claim, only (a claim given up half way may have been won; claiming again
        // finds it ours).
        if slot.is_none() && replica.is_some() && !inner.abort.is_cancelled() {
            match self.claim(&task, &inner.abort.child_token()).await {
                Some(Ok(ClaimOutcome::Lost { by })) => {
                    self.lost_claim(&task, &workspace, by.as_deref());
                    return;
                }
                Some(Err(refused)) => {
                    self.park(&task, &workspace, &refused);
                    return;
                }
                _ => {}
            }
        }
        let claim_lost = std::sync::atomic::AtomicBool::new(false);
        let outcome = match (slot, prepared) {
            (_, Some(Err(e))) => Err(e),
            (Some(_), Some(Ok(_))) if refused.is_some() => {
                Err(RunError::Prepare(refused.take().unwrap_or_default()))
            }
            (Some(_held), Some(Ok(prepared))) => match inner.journal.start_run(task.row) {
                Ok(runs) => {
                    self.note(task.row, &format!("run {runs} started"), None);
                    let run = self.run(&task, runs, prepared, &cancel);
                    match &replica {
                        None => run.await,
                        Some(replica) => {
                            let renewing = self.keep_claim(&task, replica, &cancel, &claim_lost);
                            tokio::select! {
                                out = run => out,
                                () = renewing => Err(RunError::Cancelled),
                            }
                        }
                    }
                }
                Err(e) => Err(RunError::Prepare(format!(
                    "the task journal could not record the run: {e}"
                ))),
            },
            _ => Err(RunError::Cancelled),
        };
        if claim_lost.load(std::sync::atomic::Ordering::SeqCst) {
            self.lost_claim(&task, &workspace, None);
            return;
        }
        self.leave(&task, &workspace);
        if matches!(outcome, Err(RunError::Cancelled)) && inner.abort.is_cancelled() {
            tracing::info!("the bridge is stopping: the task stays in the journal and is picked up at the next start");
            self.note(
                task.row,
                "stopped by the bridge's shutdown",
                Some("picked up at the next start"),
            );
            inner.events.emit(
                crate::events::Event::TaskInterrupted,
                json!({"agent": self.spec().name, "taskId": task.env.task_id}),
            );
            return;
        }
        let mut structured = None;
        let mut files = Vec::new();
        let (state, status, mut output, mut error) = match outcome {
            Ok(answer) => {
                let mut text = answer.output;
                if answer.truncated {
                    text.push_str(&format!(
                        "\n[output cut at {} bytes]",
                        self.spec().profile.output.max_bytes
                    ));
                }
                structured = answer.structured;
                files = answer.files;
                (TaskState::Answered, Status::Completed, text, None)
            }
            Err(RunError::Cancelled) => (
                TaskState::Cancelled,
                Status::Rejected,
                String::new(),
                Some(self.cancelled_by(&task).to_string()),
            ),
            Err(e) => {
                if let RunError::Failed { stderr, .. } = &e {
                    let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    self.note(
                        task.row,
                        "agent stderr (last lines)",
                        Some(&tail.join("\n")),
                    );
                }
                (
                    TaskState::Rejected,
                    Status::Rejected,
                    String::new(),
                    Some(e.to_string()),
                )
            }
        };
        if let Some(said) = self.operator_answers(&task) {
            match &mut error {
                Some(why) => why.push_str(&format!(" {said}")),
                None => output.push_str(&format!("\n\n{said}")),
            }
        }
        self.note(
            task.row,
            &format!("finished: {}", state.as_str()),
            Some(&format!(
                "{} ms{}",
                started.elapsed().as_millis(),
                error
                    .as_deref()
                    .map(|e| format!("; {e}"))
                    .unwrap_or_default()
            )),
        );
        let result = TaskResult {
            status,
            output,
            error: error.clone(),
            structured_result: structured,
        };
        let silent =
            state == TaskState::Cancelled && self.spec().cancel_reply == CancelReply::Silent;
        let reply = (!silent)
            .then(|| self.compose_with(&task.env, &task.key, Body::Result(result), 0, &files));
        match &reply {
            Some(reply) => {
                tracing::info!(status = status.as_str(), result_message_id = %reply.mail.message_id, "result recorded")
            }
            None => tracing::info!("cancelled; not answered (cancel_reply = \"silent\")"),
        }
        self.finish(&task, state, error.as_deref(), reply);
        if let Some(replica) = &replica {
            self.mark_done(&task, replica).await;
        }
        inner.events.emit(
            crate::events::Event::TaskCompleted,
            json!({"agent": self.spec().name, "taskId": task.env.task_id, "status": status.as_str(),
                   "error": error, "durationMs": started.elapsed().as_millis() as u64}),
        );
    }

    /// Claims the task's mail on the server, retrying while the server cannot be reached;
    /// acknowledges the task when won (once: a claim kept across a restart is won again, and
    /// its ack is the same mail). `None` when cancelled first; `Err(why)` when the server
    /// refused the claim for good (its keyword table is full, the login may not set keywords):
    /// asking again would get the same answer, and the slot is wanted by other tasks.
    async fn claim(
        &self,
        task: &Task,
        cancel: &CancellationToken,
    ) -> Option<Result<ClaimOutcome, String>> {
        let inner = &self.inner;
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        loop {
            let tried = tokio::select! {
                r = inner.outbox.claim(&task.extras.email_id) => r,
                _ = cancel.cancelled() => return None,
            };
            match tried {
                Ok(won @ (ClaimOutcome::Won | ClaimOutcome::TakenOver { .. })) => {
                    let by = self
                        .spec()
                        .replica
                        .as_ref()
                        .map(|r| r.name.clone())
                        .unwrap_or_default();
                    let detail = match &won {
                        ClaimOutcome::TakenOver { from } => {
                            format!("by replica {by}, taken over from {from}")
                        }
                        _ => format!("by replica {by}"),
                    };
                    tracing::debug!(%detail, "claim won");
                    self.note(task.row, "claimed", Some(&detail));
                    let ack = self.compose(&task.env, &task.key, Body::Ack, 0);
                    if let Err(e) = self.enqueue(task, &ack) {
                        tracing::warn!(error = %e, "could not queue task.ack");
                    }
                    return Some(Ok(won));
                }
                Ok(lost) => {
                    tracing::debug!(outcome = ?lost, "claim lost");
                    return Some(Ok(lost));
                }
                // Refused credentials are not the claim's fault: a password being rotated
                // works again within seconds of the reload, so the claim is tried again
                // (the intake is refused too, so nothing new waits behind it), not parked
                // until the next start.
                Err(e) if e.class() == ErrorClass::Permanent => {
                    return Some(Err(e.to_string()));
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "could not claim the task on the server; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = cancel.cancelled() => return None,
                    }
                }
            }
        }
    }

    /// Marks the answered task done on the server, so no other replica takes it over once
    /// its lease ends. A server that cannot be reached now (an outage, a restart) is asked
    /// again with backoff, and the lease renewed meanwhile, for as long as the bridge runs:
    /// given up after one try, the mark was lost, the lease ran out, and another replica ran
    /// the answered task again (the soak saw it after a mail-host restart).
    async fn mark_done(&self, task: &Task, replica: &super::ReplicaSpec) {
        let inner = &self.inner;
        let email_id = &task.extras.email_id;
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
        let mut said = false;
        let mut renewed = tokio::time::Instant::now();
        loop {
            let e = match inner.outbox.claim_done(email_id).await {
                Ok(()) => {
                    if said {
                        tracing::info!("the task is marked answered on the server");
                    }
                    return;
                }
                Err(e) => e,
            };
            if e.class() == ErrorClass::Permanent {
                tracing::warn!(error = %e, "the server refuses to mark the task answered; another bridge may take it over after the lease (its answer has the same Message-ID)");
                self.note(task.row, "done mark refused", Some(&e.to_string()));
                return;
            }
            if !said {
                tracing::warn!(error = %e, "could not mark the task answered on the server; trying again until it can");
                said = true;
            }
            if renewed.elapsed() >= replica.lease / 3 {
                // Keeps the claim this replica's while the mark waits (a server back after
                // most of the lease is asked to renew it before the mark goes through).
                if let Ok(true) = inner.outbox.renew_claim(email_id).await {
                    renewed = tokio::time::Instant::now();
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                _ = inner.abort.cancelled() => return,
            }
        }
    }

    /// Renews the task's claim every third of its lease while it runs; returns (after
    /// stopping the task) only when another bridge holds the claim now.
    async fn keep_claim(
        &self,
        task: &Task,
        replica: &super::ReplicaSpec,
        cancel: &CancellationToken,
        lost: &std::sync::atomic::AtomicBool,
    ) {
        // A renewal the server refuses for good is said once (the task runs on; its lease
        // may end, and another replica then take it over), then tried again quietly.
        let mut refused = false;
        // On a fixed cadence from the start, not a sleep after each renewal: a slow server
        // (a renewal taking a second or two) used to push every next renewal later, so a
        // claim aged towards its lease exactly when the server was struggling.
        let every = replica.lease / 3;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match self.inner.outbox.renew_claim(&task.extras.email_id).await {
                Ok(true) => tracing::debug!("claim renewed"),
                Ok(false) => {
                    tracing::warn!("another bridge took the task over (this one did not renew its claim in time); stopping it here");
                    lost.store(true, std::sync::atomic::Ordering::SeqCst);
                    cancel.cancel();
                    // The run ends on the cancel; this branch then loses the race or wins it
                    // with the same outcome.
                    std::future::pending::<()>().await;
                }
                Err(e) if matches!(e.class(), ErrorClass::Permanent | ErrorClass::Auth) => {
                    if !refused {
                        tracing::error!(error = %e, "the server refuses to renew the task's claim; the task runs on, and may be taken over once its lease ends");
                        self.note(task.row, "claim renewal refused", Some(&e.to_string()));
                    }
                    refused = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not renew the task's claim; trying again")
                }
            }
        }
    }

    /// The task is no longer here: its own folder goes (a conversation's stays for its next
    /// turn), and a cancel no longer finds it running.
    fn leave(&self, task: &Task, workspace: &workspace::Workspace) {
        workspace.finish(&self.inner.conversations);
        self.inner
            .running
            .lock()
            .expect("running lock")
            .remove(&task_key(&task.env.from, &task.env.task_id));
    }

    /// The server refused this bridge's claim on the task for good: the task is set aside in
    /// the journal, unanswered (another bridge may hold it, and only a claim's winner answers),
    /// its slot free for others; `status` and `task show` say why, and the next start tries
    /// again.
    fn park(&self, task: &Task, workspace: &workspace::Workspace, refused: &str) {
        let inner = &self.inner;
        self.leave(task, workspace);
        let reason = format!("the mail server refused this replica's claim: {refused}");
        tracing::error!(%reason, "task parked: not answered here; tried again at the next start");
        if let Err(e) = inner.journal.park(task.row, &reason) {
            tracing::warn!(error = %e, "could not record the task as parked");
        }
        self.note(task.row, "parked", Some(&reason));
        inner.events.emit(
            crate::events::Event::TaskParked,
            json!({"agent": self.spec().name, "from": task.env.from, "taskId": task.env.task_id,
                   "messageId": task.env.message_id, "reason": reason}),
        );
    }

    /// Another bridge runs the task: this one keeps it as a record of who does (no ack, no
    /// result), so a second delivery of it is a duplicate here too, and a takeover (or
    /// another delivery, once the claim ran out) brings it back as a task.
    fn lost_claim(&self, task: &Task, workspace: &workspace::Workspace, by: Option<&str>) {
        let inner = &self.inner;
        self.leave(task, workspace);
        let reason = match by {
            Some(by) => format!("claimed by replica {by}"),
            None => "claimed by another replica".to_string(),
        };
        tracing::info!(%reason, "another bridge runs this task");
        if let Err(e) = inner.journal.elsewhere(task.row, &reason) {
            tracing::warn!(error = %e, "could not record who runs the task");
        }
        self.note(task.row, "left to another replica", Some(&reason));
        inner.events.emit(
            crate::events::Event::MessageIgnored,
            json!({"agent": self.spec().name, "from": task.env.from, "taskId": task.env.task_id,
                   "intent": "task.dispatch", "messageId": task.env.message_id, "reason": reason}),
        );
    }

    /// Where the task runs: its conversation's folder when it has a Session-Key, else its own.
    fn workspace_of(&self, task: &Task) -> workspace::Workspace {
        let scope = task
            .dispatch
            .session_key
            .as_deref()
            .map(|k| session_scope(&task.env.from, k));
        workspace::Workspace::of(
            &self.spec().workspace_root,
            &task.env.task_id,
            task.row,
            scope.as_deref(),
        )
    }

    async fn run(
        &self,
        task: &Task,
        runs: u32,
        prepared: Prepared,
        cancel: &CancellationToken,
    ) -> Result<Answer, RunError> {
        let spec_now = self.spec();
        let spec = &*spec_now;
        let journal = &self.inner.journal;
        let (env, dispatch, extras) = (&task.env, &task.dispatch, &task.extras);
        let workspace = self.workspace_of(task).dir;
        let Prepared { files, left_out } = prepared;
        let history = match &dispatch.parent_task_id {
            Some(parent) => {
                let thread = self.inner.outbox.thread(parent).await;
                // A thread is this sender's only when they dispatched in it: nobody pulls
                // another sender's conversation into their prompt by naming its TaskId.
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
            None => Vec::new(),
        };
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
        let on_spawn = {
            let (journal, row) = (journal.clone(), task.row);
            SpawnHook(Arc::new(move |pgid| {
                if let Err(e) = journal.set_pgid(row, pgid) {
                    tracing::warn!(error = %e, "could not record the agent's process group");
                }
                let _ = journal.note(row, "agent started", Some(&format!("process group {pgid}")));
            }))
        };
        let (questions_tx, mut questions_rx) = tokio::sync::mpsc::channel::<runner::Question>(4);
        // Should the agent not restore its session, the conversation's earlier turns (its
        // record in the journal) go with the request as text, unless the thread's own
        // history already does.
        let turns = match (key, &resume_id) {
            (Some(k), Some(_)) if history.is_empty() => {
                journal.turns(&spec.name, k).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "could not read the conversation's earlier turns");
                    Vec::new()
                })
            }
            _ => Vec::new(),
        };
        let extras = prompt::PromptExtras {
            truncated: extras.truncated,
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
                        crate::backend::Earlier {
                            intent: "task.dispatch".into(),
                            from: env.from.clone(),
                            text: t.request.clone(),
                        },
                        crate::backend::Earlier {
                            intent: "task.result".into(),
                            from: spec.name.clone(),
                            text: t.answer.clone(),
                        },
                    ]
                })
                .collect();
            prompt::build(&spec.name, env, dispatch, &retold)
        });
        let input = TaskInput {
            agent: spec.name.clone(),
            task_id: env.task_id.clone(),
            prompt: prompt::build(&spec.name, env, dispatch, &extras),
            fresh_prompt,
            session_key: dispatch
                .session_key
                .as_deref()
                .map(|k| conversation_key(&env.from, k)),
            resume_id,
            workspace: workspace.clone(),
            questions: Some(questions_tx),
            env: vec![
                (OWNER_VAR.to_string(), self.inner.settings.owner_tag.clone()),
                (RUN_VAR.to_string(), run_tag.clone()),
                (
                    super::HOPS_VAR.to_string(),
                    dispatch.hop_count.unwrap_or(0).to_string(),
                ),
            ],
            on_spawn: Some(on_spawn),
        };
        self.inner.events.emit(
            crate::events::Event::TaskStarted,
            json!({"agent": spec.name, "taskId": env.task_id, "run": runs}),
        );
        // A live stream for the dispatcher, when the mailbox has an AAMP service, opened with
        // the agent's first event (a task that has none costs no stream and no mail), then
        // announced by mail, fed while the agent runs, and closed before the result.
        let (to_stream, mut from_run) =
            tokio::sync::mpsc::channel::<(&'static str, serde_json::Value)>(STREAM_BUFFER);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<runner::StreamEvent>(STREAM_BUFFER);
        let events = self.inner.events;
        let observe = async move {
            while let Some(event) = rx.recv().await {
                let (kind, payload) = event.to_aamp();
                events.emit_detail(crate::events::Event::TaskStream, json!({"agent": spec.name, "taskId": env.task_id, "type": kind, "payload": payload}));
                let _ = to_stream.send((kind, payload)).await;
            }
        };
        let pump = async {
            let first = from_run.recv().await?;
            let Some(stream_id) = self.inner.outbox.open_stream(&env.task_id, &env.from).await
            else {
                // No stream service: the events only go to the log and `--json`.
                while from_run.recv().await.is_some() {}
                return None;
            };
            self.note(task.row, "stream opened", Some(&stream_id));
            let opened = self.compose(
                env,
                &task.key,
                Body::StreamOpened {
                    stream_id: stream_id.clone(),
                },
                runs,
            );
            match self.enqueue(task, &opened) {
                Ok(()) => self.inner.events.emit(
                    crate::events::Event::TaskStreamOpened,
                    json!({"agent": spec.name, "taskId": env.task_id, "streamId": stream_id}),
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
            let ((), appends) =
                tokio::join!(forward, self.inner.outbox.pump_stream(&stream_id, fed));
            Some((stream_id, appends))
        };
        // Owns the input, so the question sender in it drops when the run ends, which ends
        // `asking`.
        let workspace_now = workspace.clone();
        let retold = input.fresh_prompt.is_some();
        let run = async move {
            let outcome = runner::run(&spec.profile, &input, cancel, &tx).await;
            drop(input);
            // Fields and files from the final answer; files only from the workspace, each
            // announced on the stream before the result.
            // Reading up to 20 MiB of files is blocking work: off the runtime.
            let outcome = match outcome {
                Ok(out) => {
                    tokio::task::spawn_blocking(move || hand_back(out, &workspace_now, retold))
                        .await
                        .map_err(|e| {
                            runner::RunError::Prepare(format!(
                                "the answer's files could not be read: {e}"
                            ))
                        })
                }
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
        };
        let asking = async {
            while let Some(question) = questions_rx.recv().await {
                self.ask_dispatcher(task, question).await;
            }
        };
        let (outcome, (), (), streamed) = tokio::join!(run, observe, asking, pump);
        if let Some((stream_id, appends)) = &streamed {
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
            let saved = match (&out.session_id, out.context_lost) {
                (Some(id), _) => journal.set_session(&spec.name, key, id),
                // The old session could not be restored and no new one was named: forget it,
                // so the conversation's next turn does not try it again.
                (None, true) => journal.drop_session(&spec.name, key),
                (None, false) => Ok(()),
            };
            if let Err(e) = saved {
                tracing::warn!(error = %e, "could not save the agent's session id");
            }
            if let Err(e) = journal.add_turn(&spec.name, key, &dispatch.body_text, &out.said) {
                tracing::warn!(error = %e, "could not record the conversation's turn");
            }
        }
        outcome
    }

    /// Makes the task's workspace ready and downloads the mail's attachments into its
    /// attachment folder, under safe and distinct names: at most [`MAX_ATTACHMENTS`] of them
    /// (the rest are named in the prompt as left out), [`DOWNLOADS_AT_ONCE`] at a time. On an
    /// error a task's own workspace is gone again.
    async fn prepare(
        &self,
        workspace: &workspace::Workspace,
        attachments: &[Attachment],
    ) -> Result<Prepared, RunError> {
        workspace.prepare()?;
        let saved = self.save_attachments(workspace, attachments).await;
        if saved.is_err() {
            workspace.finish(&self.inner.conversations);
        }
        saved
    }

    async fn save_attachments(
        &self,
        workspace: &workspace::Workspace,
        attachments: &[Attachment],
    ) -> Result<Prepared, RunError> {
        if attachments.is_empty() {
            return Ok(Prepared::default());
        }
        let dir = workspace.dir.join(&workspace.attachments);
        workspace::make_private_dir(&dir)?;
        let (taken, left) = attachments.split_at(attachments.len().min(MAX_ATTACHMENTS));
        let mut files = Vec::new();
        let mut names = HashSet::new();
        // DOWNLOADS_AT_ONCE at a time, saved in the mail's order.
        for chunk in taken.chunks(DOWNLOADS_AT_ONCE) {
            let downloaded =
                futures::future::join_all(chunk.iter().map(|a| self.download_one(a))).await;
            for (attachment, bytes) in chunk.iter().zip(downloaded) {
                let bytes = bytes?;
                let name = workspace::unique_name(
                    &workspace::safe_file_name(&attachment.name),
                    &mut names,
                );
                std::fs::write(dir.join(&name), &bytes)?;
                files.push(prompt::File {
                    path: format!("{}/{name}", workspace.attachments),
                    content_type: attachment.content_type.clone(),
                    size: bytes.len() as u64,
                });
            }
        }
        let left_out = left
            .iter()
            .map(|a| prompt::File {
                path: a.name.clone(),
                content_type: a.content_type.clone(),
                size: a.size,
            })
            .collect();
        Ok(Prepared { files, left_out })
    }

    async fn download_one(&self, attachment: &Attachment) -> Result<Vec<u8>, RunError> {
        self.inner
            .outbox
            .download(attachment, MAX_ATTACHMENT)
            .await
            .map_err(|e| {
                RunError::Prepare(format!(
                    "could not download the attachment {:?}: {e}",
                    attachment.name
                ))
            })
    }

    /// Queues the agent's question to the dispatcher as `task.help_needed` and keeps its
    /// answer channel until a reply comes.
    async fn ask_dispatcher(&self, task: &Task, question: runner::Question) {
        let inner = &self.inner;
        let text = question.text.clone();
        let help = HelpNeeded {
            question: question.text,
            blocked_reason: question.reason,
            suggested_options: question.options.clone(),
        };
        let n = inner
            .journal
            .count_outgoing(task.row, "task.help_needed")
            .unwrap_or(0);
        let mail = self.compose(&task.env, &task.key, Body::HelpNeeded(help), n);
        let queued = self
            .enqueue(task, &mail)
            .and_then(|()| inner.journal.set_state(task.row, TaskState::HelpNeeded));
        match queued {
            Ok(()) => {
                self.note(
                    task.row,
                    "asked the dispatcher",
                    Some(&mail.mail.message_id),
                );
                inner.events.emit(crate::events::Event::TaskHelpNeeded, json!({"agent": self.spec().name, "taskId": task.env.task_id, "from": task.env.from, "question": text, "options": question.options, "messageId": mail.mail.message_id}));
                let pending = PendingQuestion {
                    help_message_id: mail.mail.message_id.clone(),
                    text,
                    options: question.options,
                    answer: question.answer,
                    task_row: task.row,
                };
                inner
                    .questions
                    .lock()
                    .expect("questions lock")
                    .insert(task_key(&task.env.from, &task.env.task_id), pending);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not queue task.help_needed; the question goes unanswered");
                let _ = question.answer.send(runner::Answer::None);
            }
        }
    }
}
