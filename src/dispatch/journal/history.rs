//! The read model a person sees: task lists, a task's timeline, counts.

use rusqlite::params;

use super::{
    now_ms, task_row, Journal, JournalError, Step, TaskRow, TaskState, TASK_COLUMNS, UNDELIVERED,
};

impl Journal {
    /// Tasks, newest first, optionally of one agent and in one state.
    pub fn tasks(
        &self,
        agent: Option<&str>,
        state: Option<TaskState>,
        limit: usize,
    ) -> Result<Vec<TaskRow>, JournalError> {
        self.tasks_where(agent, state, false, limit)
    }

    /// Tasks whose answer could not be delivered (the server refused it for good), newest
    /// first.
    pub fn undelivered(
        &self,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TaskRow>, JournalError> {
        self.tasks_where(agent, None, true, limit)
    }

    fn tasks_where(
        &self,
        agent: Option<&str>,
        state: Option<TaskState>,
        undelivered_only: bool,
        limit: usize,
    ) -> Result<Vec<TaskRow>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {TASK_COLUMNS}
                 FROM tasks WHERE (?1 IS NULL OR agent = ?1) AND (?2 IS NULL OR state = ?2)
                 AND (?4 = 0 OR {UNDELIVERED} IS NOT NULL)
                 ORDER BY id DESC LIMIT ?3"
            ))?;
            let rows = stmt.query_map(
                params![
                    agent,
                    state.map(TaskState::as_str),
                    limit as i64,
                    undelivered_only
                ],
                task_row,
            )?;
            rows.collect()
        })
    }

    /// Notes a step of a task's life for its timeline (`aamp-bridge task show`).
    pub fn note(&self, task: i64, what: &str, detail: Option<&str>) -> Result<(), JournalError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO timeline (task, at, what, detail) VALUES (?1, ?2, ?3, ?4)",
                params![task, now_ms(), what, detail],
            )
            .map(drop)
        })
    }

    /// A task's timeline: its steps, and the mails sent for it, oldest first.
    pub fn timeline(&self, task: i64) -> Result<Vec<Step>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT received_at, 'received from ' || sender, message_key FROM tasks WHERE id = ?1
                 UNION ALL
                 SELECT at, what, detail FROM timeline WHERE task = ?1
                 UNION ALL
                 SELECT created_at, 'queued ' || intent, message_id FROM outbox WHERE task = ?1
                 UNION ALL
                 SELECT sent_at, 'sent ' || intent, message_id || ' (attempt ' || attempts || ')' FROM outbox WHERE task = ?1 AND sent_at IS NOT NULL
                 UNION ALL
                 SELECT failed_at, 'gave up sending ' || intent, last_error FROM outbox WHERE task = ?1 AND failed_at IS NOT NULL
                 ORDER BY 1",
            )?;
            let rows = stmt.query_map(params![task], |r| {
                Ok(Step {
                    at_ms: r.get(0)?,
                    what: r.get(1)?,
                    detail: r.get(2)?,
                })
            })?;
            rows.collect()
        })
    }

    /// Tasks whose TaskId or Message-ID is `id` (a journal row number also finds its task).
    pub fn find_tasks(&self, id: &str) -> Result<Vec<TaskRow>, JournalError> {
        let row: Option<i64> = id.parse().ok();
        self.with(|c| {
            let mut stmt = c.prepare(
                &format!("SELECT {TASK_COLUMNS}
                 FROM tasks WHERE task_id = ?1 OR message_key LIKE '%|' || ?1 OR message_key = ?1 OR id = ?2
                 ORDER BY id"),
            )?;
            let rows = stmt.query_map(params![id, row], task_row)?;
            rows.collect()
        })
    }

    /// Unsent mails per agent, and unfinished tasks per agent and state.
    pub fn counts(&self) -> Result<Vec<(String, String, u32)>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT agent, state, COUNT(*) FROM tasks WHERE admitted = 1 AND state IN ('received', 'acked', 'running', 'help_needed', 'parked') GROUP BY agent, state
                 UNION ALL
                 SELECT agent, 'unsent', COUNT(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL GROUP BY agent
                 UNION ALL
                 SELECT agent, 'undelivered', COUNT(DISTINCT task) FROM outbox WHERE failed_at > ?1 AND task IS NOT NULL GROUP BY agent",
            )?;
            let week_ago = now_ms() - 7 * 24 * 3600 * 1000;
            let rows = stmt.query_map([week_ago], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect()
        })
    }

    /// The subject each of the rows `ids` carried in its mail (kept whole for a task that
    /// ran, as a summary for one refused), by row: the page's lists show titles, not TaskIds.
    pub fn subjects(
        &self,
        ids: &[i64],
    ) -> Result<std::collections::HashMap<i64, String>, JournalError> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        // Row numbers are integers: written into the statement, they cannot be SQL.
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        self.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT id, COALESCE(json_extract(mail, '$.view.subject'),
                                    json_extract(mail, '$.summary.subject')) FROM tasks
                 WHERE id IN ({list}) AND json_valid(mail)"
            ))?;
            let rows = stmt.query_map([], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, Option<String>>(1)?))
            })?;
            rows.filter_map(|r| match r {
                Ok((id, Some(title))) => Some(Ok((id, title))),
                Ok((_, None)) => None,
                Err(e) => Some(Err(e)),
            })
            .collect()
        })
    }
}
