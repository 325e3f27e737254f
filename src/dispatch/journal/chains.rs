//! The delegation chain each task belongs to, kept with the task: what it carried when it
//! came (its parent's TaskId, its hop count and the chain's headers), so `task show` can name a
//! task's parent and children, and a delegation made while it runs passes the chain on.

use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::{Journal, JournalError, TaskState};
use crate::protocol::{Chain, Dispatch};

/// What the journal keeps of a task's place in a delegation chain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskChain {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hops: Option<u32>,
    #[serde(default)]
    pub chain: Chain,
}

impl TaskChain {
    /// The chain `dispatch` carried; `None` when it carried nothing of one.
    pub fn of(dispatch: &Dispatch) -> Option<TaskChain> {
        let kept = TaskChain {
            parent_task_id: dispatch.parent_task_id.clone(),
            hops: dispatch.hop_count,
            chain: dispatch.chain.clone(),
        };
        (kept != TaskChain::default()).then_some(kept)
    }

    /// As the journal stores it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The chain id in a stored [`TaskChain`], indexed for a chain's tasks.
pub(super) fn chain_id_of(json: &str) -> Option<String> {
    serde_json::from_str::<TaskChain>(json).ok()?.chain.id
}

/// One task of a chain, as `task show` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainTask {
    pub row: i64,
    pub agent: String,
    pub sender: String,
    pub task_id: String,
    pub state: TaskState,
    pub chain: TaskChain,
}

impl Journal {
    /// The chain task `row` carried, if any.
    pub fn task_chain(&self, row: i64) -> Result<Option<TaskChain>, JournalError> {
        let text: Option<Option<String>> = self.with(|c| {
            c.query_row("SELECT chain FROM tasks WHERE id = ?1", [row], |r| r.get(0))
                .optional()
        })?;
        Ok(text
            .flatten()
            .and_then(|t| serde_json::from_str::<TaskChain>(&t).ok()))
    }

    /// The tasks this journal holds of chain `chain_id`, oldest first.
    pub fn chain_tasks(&self, chain_id: &str) -> Result<Vec<ChainTask>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, agent, sender, task_id, state, chain FROM tasks
                 WHERE chain_id = ?1 ORDER BY id LIMIT 1000",
            )?;
            let rows = stmt.query_map(params![chain_id], |r| {
                let state: String = r.get(4)?;
                let chain: Option<String> = r.get(5)?;
                Ok(ChainTask {
                    row: r.get(0)?,
                    agent: r.get(1)?,
                    sender: r.get(2)?,
                    task_id: r.get(3)?,
                    state: TaskState::parse(&state).unwrap_or(TaskState::Received),
                    chain: chain
                        .and_then(|t| serde_json::from_str(&t).ok())
                        .unwrap_or_default(),
                })
            })?;
            rows.collect()
        })
    }
}
