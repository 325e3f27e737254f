//! What the operator does from the live view, on the paths mail takes: answering an agent's
//! question (as a reply to the `task.help_needed` mail would: recorded in the journal, answered
//! once) and cancelling a queued or running task (as `task.cancel` does, answered "cancelled by
//! the operator").

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use serde_json::json;

use super::journal::{JournalError, NewTask, TaskState};
use super::{task_key, Engine, Task};
use crate::backend::Backend;

/// What the operator did from the live view, kept for the tasks' answers.
#[derive(Default)]
pub(super) struct Acts {
    /// Tasks the operator cancelled, by task key: answered so.
    cancelled: Mutex<HashSet<String>>,
    /// Questions the operator answered, by task key: the task's answer tells its dispatcher
    /// who answered what.
    answered: Mutex<HashMap<String, Vec<String>>>,
}

/// Why the operator's action was not taken.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("no question of task {task_id:?} from {from} is waiting (answered already, or the task ended)")]
    NoQuestion { from: String, task_id: String },
    #[error("task {task_id:?} from {from} is neither queued nor running")]
    NotActive { from: String, task_id: String },
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// What a cancelled task's answer says stopped it.
const BY_DISPATCHER: &str = "cancelled by the dispatcher";
const BY_OPERATOR: &str = "cancelled by the operator";

impl<O: Backend> Engine<O> {
    /// Answers the question task `task_id` of `from` waits on with `answer` (an option's name
    /// or number, or free text), as a reply by mail would: recorded in the journal, noted on the
    /// task's timeline, and handed to the agent once. A second answer finds no question.
    pub fn operator_answer(
        &self,
        from: &str,
        task_id: &str,
        answer: &str,
    ) -> Result<(), OperatorError> {
        let spec = self.spec();
        let waiting = task_key(from, task_id);
        let asked = self.question_asked(&waiting);
        let Some((row, question)) = asked else {
            return Err(OperatorError::NoQuestion {
                from: from.to_string(),
                task_id: task_id.to_string(),
            });
        };
        let key = format!("operator|{}", uuid::Uuid::new_v4());
        self.inner.journal.record(
            &NewTask {
                agent: &spec.name,
                message_key: &key,
                sender: "operator",
                task_id,
                session_key: None,
                state: TaskState::Answered,
                admitted: false,
                mail: &json!({"operator": {"answer": answer, "question": row}}).to_string(),
                reason: Some("an answer to a question, from the live view"),
            },
            None,
        )?;
        self.note(row, "answered by the operator", Some(answer));
        tracing::info!(row, "the operator answers the agent's question");
        // The dispatcher asked nothing and answered nothing: its answer says who did.
        let question: String = question.chars().take(200).collect();
        self.inner
            .operator
            .answered
            .lock()
            .expect("answered lock")
            .entry(waiting.clone())
            .or_default()
            .push(format!(
                "the question {question:?} was answered on this machine by its operator: {answer:?}"
            ));
        self.answer_question(&waiting, task_id, answer, "");
        Ok(())
    }

    /// What the operator answered for `task` from the live view, for its answer (and forgets
    /// it): `None` when nobody did.
    pub(super) fn operator_answers(&self, task: &Task) -> Option<String> {
        let key = task_key(&task.env.from, &task.env.task_id);
        let said = self
            .inner
            .operator
            .answered
            .lock()
            .expect("answered lock")
            .remove(&key)?;
        Some(format!("(aamp-bridge: {})", said.join("; ")))
    }

    /// Stops the queued or running task `task_id` of `from`, as its dispatcher's `task.cancel`
    /// would; its answer says the operator cancelled it.
    pub fn operator_cancel(&self, from: &str, task_id: &str) -> Result<(), OperatorError> {
        let key = task_key(from, task_id);
        let cancelled = self.with_running(&key, |cancel| {
            self.inner
                .operator
                .cancelled
                .lock()
                .expect("cancelled lock")
                .insert(key.clone());
            tracing::info!(%from, %task_id, "the operator cancels the task");
            cancel.cancel();
        });
        cancelled.ok_or_else(|| OperatorError::NotActive {
            from: from.to_string(),
            task_id: task_id.to_string(),
        })
    }

    /// Who cancelled `task`, for its answer (and forgets it).
    pub(super) fn cancelled_by(&self, task: &Task) -> &'static str {
        let key = task_key(&task.env.from, &task.env.task_id);
        let mut by_operator = self
            .inner
            .operator
            .cancelled
            .lock()
            .expect("cancelled lock");
        if by_operator.remove(&key) {
            self.note(task.row, BY_OPERATOR, Some("from the live view"));
            BY_OPERATOR
        } else {
            BY_DISPATCHER
        }
    }
}
