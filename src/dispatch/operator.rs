//! What the operator does from the live view, on the paths mail takes: answering an agent's
//! question (as a reply to the `task.help_needed` mail would: recorded in the journal, answered
//! once) and cancelling a queued or running task (as `task.cancel` does, answered "cancelled by
//! the operator").

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::journal::JournalError;

/// What the operator did from the live view, kept for the tasks' answers.
#[derive(Default)]
pub(super) struct Acts {
    /// Tasks the operator cancelled, by task key: answered so.
    pub(super) cancelled: Mutex<HashSet<String>>,
    /// Questions the operator answered, by task key: the task's answer tells its dispatcher
    /// who answered what.
    pub(super) answered: Mutex<HashMap<String, Vec<String>>>,
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
pub(super) const BY_DISPATCHER: &str = "cancelled by the dispatcher";
pub(super) const BY_OPERATOR: &str = "cancelled by the operator";
