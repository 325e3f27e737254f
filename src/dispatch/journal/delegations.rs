//! Delegations: sub-tasks an agent's running task handed to other agents by mail. Each is
//! journaled with its `task.dispatch` in one transaction before the mail leaves, so a crash
//! loses neither; the child's answer is taken once (the first `task.result` from the child's
//! address), and what it said is kept for the waiting parent, or a parent resumed after a crash.

use rusqlite::{params, OptionalExtension};

use super::{insert_outgoing, now_ms, Journal, JournalError, Outgoing};

/// A delegation and where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delegation {
    pub agent: String,
    /// The parent task's journal row.
    pub parent: i64,
    /// The child's TaskId.
    pub task_id: String,
    pub recipient: String,
    pub title: String,
    /// `sent`, `completed`, `rejected` or `cancelled`.
    pub state: String,
    /// The child's output (completed) or its reason (rejected, cancelled).
    pub answer: Option<String>,
}

/// A new delegation, as [`Journal::delegate`] records it.
pub struct NewDelegation<'a> {
    pub agent: &'a str,
    pub parent: i64,
    pub task_id: &'a str,
    pub recipient: &'a str,
    pub title: &'a str,
}

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS delegations (
    id          INTEGER PRIMARY KEY,
    agent       TEXT NOT NULL,
    parent      INTEGER NOT NULL,
    task_id     TEXT NOT NULL,
    recipient   TEXT NOT NULL,
    title       TEXT NOT NULL,
    state       TEXT NOT NULL,
    answer      TEXT,
    created_at  INTEGER NOT NULL,
    answered_at INTEGER,
    UNIQUE (agent, task_id)
);
CREATE INDEX IF NOT EXISTS delegations_by_parent ON delegations (parent, state);
";

const COLUMNS: &str = "agent, parent, task_id, recipient, title, state, answer";

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Delegation> {
    Ok(Delegation {
        agent: r.get(0)?,
        parent: r.get(1)?,
        task_id: r.get(2)?,
        recipient: r.get(3)?,
        title: r.get(4)?,
        state: r.get(5)?,
        answer: r.get(6)?,
    })
}

impl Journal {
    /// Records a delegation and queues its dispatch `mail`, in one transaction (before the
    /// mail can leave). `false` when it was recorded before (a parent run again after a
    /// crash asking for the same child): nothing is sent again.
    pub fn delegate(&self, new: &NewDelegation<'_>, mail: &Outgoing) -> Result<bool, JournalError> {
        let now = now_ms();
        self.with(|c| {
            let tx = c.transaction()?;
            let inserted = tx.execute(
                "INSERT INTO delegations (agent, parent, task_id, recipient, title, state, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'sent', ?6)
                 ON CONFLICT (agent, task_id) DO NOTHING",
                params![
                    new.agent,
                    new.parent,
                    new.task_id,
                    new.recipient.to_ascii_lowercase(),
                    new.title,
                    now
                ],
            )?;
            if inserted == 1 {
                insert_outgoing(&tx, new.agent, Some(new.parent), mail, now)?;
            }
            tx.commit().map(|()| inserted == 1)
        })
    }

    /// The child's answer from `from`: taken when the delegation `task_id` of `agent` went to
    /// `from` and is still waiting; `false` otherwise (not ours, or answered before).
    pub fn delegation_answered(
        &self,
        agent: &str,
        task_id: &str,
        from: &str,
        state: &str,
        answer: &str,
    ) -> Result<bool, JournalError> {
        self.with(|c| {
            c.execute(
                "UPDATE delegations SET state = ?4, answer = ?5, answered_at = ?6
                 WHERE agent = ?1 AND task_id = ?2 AND recipient = ?3 AND state = 'sent'",
                params![
                    agent,
                    task_id,
                    from.to_ascii_lowercase(),
                    state,
                    answer,
                    now_ms()
                ],
            )
            .map(|n| n == 1)
        })
    }

    /// Marks a waiting delegation cancelled; `false` when it was not waiting.
    pub fn delegation_cancelled(&self, agent: &str, task_id: &str) -> Result<bool, JournalError> {
        self.with(|c| {
            c.execute(
                "UPDATE delegations SET state = 'cancelled', answer = 'cancelled by the delegating agent', answered_at = ?3
                 WHERE agent = ?1 AND task_id = ?2 AND state = 'sent'",
                params![agent, task_id, now_ms()],
            )
            .map(|n| n == 1)
        })
    }

    /// The delegation `task_id` of `agent`.
    pub fn delegation(
        &self,
        agent: &str,
        task_id: &str,
    ) -> Result<Option<Delegation>, JournalError> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM delegations WHERE agent = ?1 AND task_id = ?2"),
                params![agent, task_id],
                read,
            )
            .optional()
        })
    }

    /// The delegations task `parent` made, oldest first.
    pub fn delegations_of(&self, parent: i64) -> Result<Vec<Delegation>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM delegations WHERE parent = ?1 ORDER BY id LIMIT 1000"
            ))?;
            let rows = stmt.query_map([parent], read)?;
            rows.collect()
        })
    }
}
