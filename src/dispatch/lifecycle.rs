//! The run's five named steps in order, for one admitted task from its slot to its recorded
//! answer: its workspace made ready (`attachments.rs`), a slot waited for (one task at a time
//! per Session-Key, at most `max_concurrent` at once), its claim won when several bridges
//! serve the mailbox ([`Claims`](super::Claims)), the agent run (`run.rs`), and the answer
//! recorded for the [`Outbox`](super::Outbox). A task stopped because the bridge stops is not
//! answered: it stays in the journal for the next start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::attachments::Prepared;
use super::run::Answer;
use super::runs::{arrival, Place};
use super::workspace::Workspace;
use super::{results, slots, CancelReply, Engine, ReplicaSpec, Task, TaskState};
use crate::backend::{Backend, ClaimOutcome};
use crate::protocol::{Body, Status, TaskResult};
use crate::runner::RunError;

/// The conversation lock a task's place names (held or to be taken), to take again when a
/// parked task goes round once more.
fn conversation_lock(place: &Place) -> Option<std::sync::Arc<tokio::sync::Mutex<()>>> {
    match place {
        Place::Queued { session, .. } => session
            .as_ref()
            .map(|g| tokio::sync::OwnedMutexGuard::mutex(g).clone()),
        Place::Later(lock) => lock.clone(),
    }
}

/// A slot granted, with the task's conversation lock (if any) held.
type Granted = (Option<tokio::sync::OwnedMutexGuard<()>>, slots::Slot);

/// What the task holds once its claim is settled: its slot (none when it was cancelled or
/// its workspace failed), and why it is answered without running, if it is.
struct Held {
    slot: Option<Granted>,
    refused: Option<String>,
}

/// Why a task left this bridge unanswered: another replica holds its claim (named when
/// known), or the server refused the claim for good (why).
enum Gone {
    Elsewhere(Option<String>),
    Parked(String),
}

impl<B: Backend> Engine<B> {
    pub(super) async fn lifecycle(self, task: Task, place: Place, cancel: CancellationToken) {
        let started = Instant::now();
        // Read once: a reload while the task runs does not change how it is claimed.
        let replica = self.common.spec().replica.clone();
        let workspace = self.workspace_of(&task);
        // Its conversation's folder is not pruned while the task waits or runs in it.
        let _in_use = self.runs.conversations.hold(&workspace);
        let mut prepared = self.make_ready(&task, &workspace, &cancel).await;
        let ready = match &prepared {
            Some(Ok(p)) => Some(p.clone()),
            _ => None,
        };
        let conversation = conversation_lock(&place);
        let mut place = Some(place);
        // Run until the run does not end at the agent's usage limit: a limit parks the task
        // (journaled) and it goes round again once the limit resets.
        let ran = loop {
            let prepared = prepared.take().or_else(|| ready.clone().map(Ok));
            let place = place.take().unwrap_or(Place::Later(conversation.clone()));
            let slot = match &prepared {
                Some(Ok(_)) => self.gate_then_slot(&task, place, &cancel).await,
                _ => None,
            };
            let ran = match self.claim(&task, slot, replica.as_ref(), &cancel).await {
                Ok(held) => {
                    self.execute(&task, held, prepared, replica.as_ref(), &cancel)
                        .await
                }
                Err(gone) => Err(gone),
            };
            match ran {
                Ok(Err(RunError::UsageLimit { .. })) if cancel.is_cancelled() => {
                    break Ok(Err(RunError::Cancelled))
                }
                Ok(Err(RunError::UsageLimit { said, resets })) => {
                    self.park(&task, &said, resets).await
                }
                other => break other,
            }
        };
        match ran {
            Ok(outcome) => {
                self.leave(&task, &workspace);
                self.answer(&task, outcome, started, replica.as_ref()).await;
            }
            Err(gone) => self.hand_off(&task, &workspace, gone),
        }
        // Answered (or gone): the next task held at the agent's limit may go.
        self.quota.left(task.row);
    }

    /// Before step 2: the agent's usage-limit gate ([`super::quota`]), passed at once unless
    /// the agent is at its limit or tasks parked at it go first; a task that waits there holds
    /// no slot and no conversation lock, and its dispatcher is told once.
    async fn gate_then_slot(
        &self,
        task: &Task,
        place: Place,
        cancel: &CancellationToken,
    ) -> Option<Granted> {
        let Some(waiting) = self.quota.enter(task.row) else {
            return self.wait_for_slot(task, place, cancel).await;
        };
        let place = match place {
            Place::Queued { session, ticket } => {
                drop(ticket);
                Place::Later(session.map(|g| tokio::sync::OwnedMutexGuard::mutex(&g).clone()))
            }
            later => later,
        };
        if self.quota.first_told(task.row) {
            super::quota::tell(&self.common, &self.outbox, task, &waiting).await;
        }
        if !self.quota.pass(task.row, cancel).await {
            return None;
        }
        self.common
            .note(task.row, "let through the usage-limit gate", None);
        self.wait_for_slot(task, place, cancel).await
    }

    /// The run ended at the agent's usage limit: the task is parked (journaled; not
    /// answered), the agent's gate closes until the reset, and the dispatcher is told once.
    async fn park(&self, task: &Task, said: &str, resets: Option<std::time::SystemTime>) {
        let (waiting, first) = self.quota.hit(task.row, said, resets);
        let until = resets.map(crate::protocol::time::format_utc_ms);
        tracing::warn!(until = ?until, said, "the agent is at its usage limit: the task is parked");
        self.common
            .note(task.row, "parked at the agent's usage limit", Some(said));
        self.common.events.emit(
            crate::events::Event::TaskParked,
            json!({"agent": self.common.spec().name, "taskId": task.env.task_id,
                   "reason": "waiting_for_quota", "until": until, "said": said}),
        );
        if first {
            super::quota::tell(&self.common, &self.outbox, task, &waiting).await;
        }
    }

    /// Step 2: the task's place in the slot queue, taken now unless it was at its start
    /// (behind an earlier task of its conversation, or after its downloads); `None` when it is
    /// cancelled first.
    async fn wait_for_slot(
        &self,
        task: &Task,
        place: Place,
        cancel: &CancellationToken,
    ) -> Option<Granted> {
        let slot = async {
            let (session, ticket) = match place {
                Place::Queued { session, ticket } => (session, ticket),
                Place::Later(lock) => {
                    let session = match lock {
                        Some(lock) => Some(lock.lock_owned().await),
                        None => None,
                    };
                    let ticket = self.common.settings.slots.enqueue(
                        &self.common.spec().name,
                        task.dispatch.priority,
                        arrival(task),
                    );
                    (session, ticket)
                }
            };
            (session, ticket.granted().await)
        };
        tokio::select! {
            slot = slot => Some(slot),
            _ = cancel.cancelled() => None,
        }
    }

    /// Step 3: one of several bridges claims the task once it has a slot for it (a bridge
    /// with none free leaves it to the others), and acknowledges it only when it won. A task
    /// cancelled while it waited for a slot or for its claim is answered by the bridge that
    /// wins the claim, only (a claim given up half way may have been won; claiming again
    /// finds it ours).
    async fn claim(
        &self,
        task: &Task,
        slot: Option<Granted>,
        replica: Option<&ReplicaSpec>,
        cancel: &CancellationToken,
    ) -> Result<Held, Gone> {
        // Not to be run again (the profile's rerun_interrupted): answered with why, once
        // this bridge holds the task.
        let mut held = Held {
            slot,
            refused: task.rerun_refused.clone(),
        };
        if replica.is_none() {
            return Ok(held);
        }
        if let Some(granted) = held.slot.take() {
            match self.claims.claim(task, cancel).await {
                Some(Ok(ClaimOutcome::Won)) => held.slot = Some(granted),
                Some(Ok(ClaimOutcome::TakenOver { from })) => {
                    if !self.common.spec().profile.rerun_interrupted {
                        held.refused = Some(format!("interrupted: replica {from} stopped while it ran; this agent's tasks are not run twice; dispatch it again"));
                    }
                    held.slot = Some(granted);
                }
                Some(Ok(ClaimOutcome::Lost { by })) => return Err(Gone::Elsewhere(by)),
                Some(Err(refused)) => return Err(Gone::Parked(refused)),
                None => {}
            }
        }
        let abort = &self.common.abort;
        if held.slot.is_none() && !abort.is_cancelled() {
            match self.claims.claim(task, &abort.child_token()).await {
                Some(Ok(ClaimOutcome::Lost { by })) => return Err(Gone::Elsewhere(by)),
                Some(Err(refused)) => return Err(Gone::Parked(refused)),
                _ => {}
            }
        }
        Ok(held)
    }

    /// Step 4: the agent run, in its slot, its claim renewed meanwhile; what stopped it
    /// otherwise (a workspace that failed, a rerun refused, a cancel) as the error.
    async fn execute(
        &self,
        task: &Task,
        held: Held,
        prepared: Option<Result<Prepared, RunError>>,
        replica: Option<&ReplicaSpec>,
        cancel: &CancellationToken,
    ) -> Result<Result<Answer, RunError>, Gone> {
        let (slot, prepared) = match (held.slot, prepared) {
            (_, Some(Err(e))) => return Ok(Err(e)),
            (Some(_), Some(Ok(_))) if held.refused.is_some() => {
                return Ok(Err(RunError::Prepare(held.refused.unwrap_or_default())))
            }
            (Some(slot), Some(Ok(prepared))) => (slot, prepared),
            _ => return Ok(Err(RunError::Cancelled)),
        };
        // A budget used up while the task waited: refused now, its one answer.
        if let Some(why) = self.over_budget(task) {
            return Ok(Err(RunError::Stopped(why)));
        }
        let runs = match self.common.journal.start_run(task.row) {
            Ok(runs) => runs,
            Err(e) => {
                return Ok(Err(RunError::Prepare(format!(
                    "the task journal could not record the run: {e}"
                ))))
            }
        };
        self.common
            .note(task.row, &format!("run {runs} started"), None);
        let run = self.run(task, runs, prepared, cancel);
        let Some(replica) = replica else {
            return Ok(run.await);
        };
        let claim_lost = AtomicBool::new(false);
        let renewing = self.claims.keep(task, replica, cancel, &claim_lost);
        let outcome = tokio::select! {
            out = run => out,
            () = renewing => Err(RunError::Cancelled),
        };
        drop(slot);
        match claim_lost.load(Ordering::SeqCst) {
            true => Err(Gone::Elsewhere(None)),
            false => Ok(outcome),
        }
    }

    /// The task left this bridge unanswered: it leaves its runs, and the journal keeps who
    /// holds it, or why it was parked.
    fn hand_off(&self, task: &Task, workspace: &Workspace, gone: Gone) {
        self.leave(task, workspace);
        match gone {
            Gone::Elsewhere(by) => self.claims.lost(task, by.as_deref()),
            Gone::Parked(refused) => self.claims.park(task, &refused),
        }
    }

    /// Step 5: the answer recorded for the outbox (unless the bridge is stopping: the task
    /// then stays in the journal for the next start), and the claim marked done.
    async fn answer(
        &self,
        task: &Task,
        outcome: Result<Answer, RunError>,
        started: Instant,
        replica: Option<&ReplicaSpec>,
    ) {
        let events = &self.common.events;
        if matches!(outcome, Err(RunError::Cancelled)) && self.common.abort.is_cancelled() {
            tracing::info!("the bridge is stopping: the task stays in the journal and is picked up at the next start");
            self.common.note(
                task.row,
                "stopped by the bridge's shutdown",
                Some("picked up at the next start"),
            );
            events.emit(
                crate::events::Event::TaskInterrupted,
                json!({"agent": self.common.spec().name, "taskId": task.env.task_id}),
            );
            return;
        }
        let (state, result, files) = self.result_of(task, outcome);
        let (status, error) = (result.status, result.error.clone());
        let usage = result
            .usage
            .as_ref()
            .map(crate::protocol::usage_wire::to_json);
        let took = started.elapsed().as_millis();
        let why = error
            .as_deref()
            .map(|e| format!("; {e}"))
            .unwrap_or_default();
        let finished = format!("finished: {}", state.as_str());
        self.common
            .note(task.row, &finished, Some(&format!("{took} ms{why}")));
        let silent =
            state == TaskState::Cancelled && self.common.spec().cancel_reply == CancelReply::Silent;
        let outbox = &self.outbox;
        let reply = (!silent)
            .then(|| outbox.compose_with(&task.env, &task.key, Body::Result(result), 0, &files));
        match &reply {
            Some(reply) => {
                tracing::info!(status = status.as_str(), result_message_id = %reply.mail.message_id, "result recorded")
            }
            None => tracing::info!("cancelled; not answered (cancel_reply = \"silent\")"),
        }
        outbox.finish(task, state, error.as_deref(), reply);
        // A replica starved past its lease may finish a run another replica took over: that
        // one answers, and this run is said as superseded, not completed (counted once).
        let held = match replica {
            Some(replica) => self.claims.mark_done(task, replica).await,
            None => true,
        };
        let event = match held {
            true => crate::events::Event::TaskCompleted,
            false => crate::events::Event::TaskSuperseded,
        };
        events.emit(
            event,
            json!({"agent": self.common.spec().name, "taskId": task.env.task_id, "status": status.as_str(),
                   "error": error, "durationMs": started.elapsed().as_millis() as u64, "usage": usage}),
        );
    }

    /// The task's final state and result for `outcome`, with what the operator answered for
    /// it, and the files that go with it.
    fn result_of(
        &self,
        task: &Task,
        outcome: Result<Answer, RunError>,
    ) -> (TaskState, TaskResult, Vec<results::Attached>) {
        let mut structured = None;
        let mut files = Vec::new();
        let (state, status, mut output, mut error) = match outcome {
            Ok(answer) => {
                let mut text = answer.output;
                if answer.truncated {
                    let max = self.common.spec().profile.output.max_bytes;
                    text.push_str(&format!("\n[output cut at {max} bytes]"));
                }
                structured = answer.structured;
                files = answer.files;
                (TaskState::Answered, Status::Completed, text, None)
            }
            Err(RunError::Cancelled) => {
                let by = self.desk.cancelled_by(task).to_string();
                (
                    TaskState::Cancelled,
                    Status::Rejected,
                    String::new(),
                    Some(by),
                )
            }
            Err(e) => {
                if let RunError::Failed { stderr, .. } = &e {
                    let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    let tail = tail.join("\n");
                    self.common
                        .note(task.row, "agent stderr (last lines)", Some(&tail));
                }
                (
                    TaskState::Rejected,
                    Status::Rejected,
                    String::new(),
                    Some(e.to_string()),
                )
            }
        };
        if let Some(said) = self.desk.operator_answers(task) {
            match &mut error {
                Some(why) => why.push_str(&format!(" {said}")),
                None => output.push_str(&format!("\n\n{said}")),
            }
        }
        let result = TaskResult {
            status,
            output,
            error,
            structured_result: structured,
            usage: self.outbox.usage_of(task.row),
        };
        (state, result, files)
    }
}
