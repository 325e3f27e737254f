//! The run's named steps in order, for one admitted task from its slot to its recorded answer:
//! its workspace made ready (`attachments.rs`), a slot waited for (one task at a time per
//! Session-Key, at most `max_concurrent` at once), its claim won when several bridges serve
//! the mailbox (`claims.rs`), the agent run (`run.rs`), and the result recorded for the
//! outbox. A task stopped because the bridge stops is not answered: it stays in the journal
//! for the next start.

use std::time::Instant;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::journal::{Outgoing, TaskState};
use super::runs::{arrival, Place};
use super::{CancelReply, Engine, Task};
use crate::backend::{Backend, ClaimOutcome};
use crate::protocol::{Body, Status, TaskResult};
use crate::runner::RunError;

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
        let _in_use = self.hold_conversation(&workspace);
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

    /// Records a final state with its answer and wakes the outbox. A journal failure is
    /// logged; the answer then goes out directly, once.
    fn finish(&self, task: &Task, state: TaskState, reason: Option<&str>, reply: Option<Outgoing>) {
        let inner = &self.inner;
        // One of several replicas sends its answer only while it still holds the task's
        // claim (or marked it done itself): killed between recording and sending, it may
        // come back after another replica took the task over and answered, and its
        // recorded answer must not leave then too (issue 43: two answers under one
        // Message-ID). The outbox claims before it sends; a lost claim drops the mail.
        let reply = reply.map(|r| self.once_among_replicas(r, &task.extras.email_id));
        match inner
            .journal
            .finish(&self.spec().name, task.row, state, reason, reply.as_ref())
        {
            Ok(()) => {
                if reply.is_some() {
                    fault_exit_after_result();
                }
                self.wake_outbox()
            }
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
