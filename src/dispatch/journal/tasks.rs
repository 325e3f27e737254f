//! What happens to each inbound message and task: recorded once, admitted or not, run, finished;
//! what is left unfinished at start; the counts admission reads.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, OptionalExtension};

use super::chains::chain_id_of;
use super::{
    insert_outgoing, millis, now_ms, Journal, JournalError, NewTask, Outgoing, TaskState,
    Unfinished, BOUND_NOT_ADMITTED, COUNT_AGENT_RECENT, COUNT_CONVERSATION, COUNT_SENDER_RECENT,
    KEEP_NOT_ADMITTED,
};

/// Limits on how much one sender, one session or the whole agent may ask.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub per_sender_per_hour: Option<u32>,
    pub daily_budget: Option<u32>,
    pub turns_per_session: Option<u32>,
}

/// Whose recent admitted tasks a count is of.
#[derive(Clone, Copy, Debug)]
pub enum Recent<'a> {
    /// All of the agent's.
    Agent,
    /// One sender's.
    Sender(&'a str),
    /// One sender's conversation (its Session-Key).
    Conversation { sender: &'a str, key: &'a str },
}

/// Admission's counts of recent admitted tasks (0 for a limit not set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecentCounts {
    pub sender_last_hour: u32,
    pub agent_last_day: u32,
    pub session_turns: u32,
}

impl Journal {
    /// Whether a message with this key was recorded for `agent`.
    pub fn knows_message(&self, agent: &str, message_key: &str) -> Result<bool, JournalError> {
        self.with(|c| {
            c.query_row(KNOWS_MESSAGE, params![agent, message_key], |_| Ok(()))
                .optional()
                .map(|r| r.is_some())
        })
    }

    /// The row and state of the message recorded under `message_key`, if any.
    pub fn message_row(
        &self,
        agent: &str,
        message_key: &str,
    ) -> Result<Option<(i64, TaskState)>, JournalError> {
        self.with(|c| {
            c.query_row(MESSAGE_ROW, params![agent, message_key], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .optional()
        })
        .map(|r| r.map(|(id, s)| (id, TaskState::parse(&s).unwrap_or(TaskState::Received))))
    }

    /// The admitted task with this sender and TaskId, if any.
    pub fn admitted_task(
        &self,
        agent: &str,
        sender: &str,
        task_id: &str,
    ) -> Result<Option<(i64, TaskState)>, JournalError> {
        self.with(|c| {
            c.query_row(
                ADMITTED_TASK,
                params![agent, sender.to_ascii_lowercase(), task_id],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
            )
            .optional()
        })
        .map(|r| r.map(|(id, s)| (id, TaskState::parse(&s).unwrap_or(TaskState::Received))))
    }

    /// Records a message and, in the same transaction, the mail it is answered with. `None`
    /// when the message was recorded already (a duplicate delivery).
    pub fn record(
        &self,
        task: &NewTask<'_>,
        reply: Option<&Outgoing>,
    ) -> Result<Option<i64>, JournalError> {
        let now = now_ms();
        self.with(|c| {
            let tx = c.transaction()?;
            let inserted = tx.execute(
                "INSERT INTO tasks (agent, message_key, sender, task_id, state, admitted, mail, reason, received_at, updated_at, session_key, chain, chain_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10, ?11, ?12)
                 ON CONFLICT (agent, message_key) DO NOTHING",
                params![
                    task.agent,
                    task.message_key,
                    task.sender.to_ascii_lowercase(),
                    task.task_id,
                    task.state.as_str(),
                    task.admitted,
                    task.mail,
                    task.reason,
                    now,
                    task.session_key,
                    task.chain,
                    task.chain.and_then(chain_id_of),
                ],
            )?;
            if inserted == 0 {
                return Ok(None);
            }
            let id = tx.last_insert_rowid();
            if let Some(mail) = reply {
                insert_outgoing(&tx, task.agent, Some(id), mail, now)?;
            }
            // Mail that is not admitted is kept as a summary, and at most KEEP_NOT_ADMITTED
            // rows of it per agent (checked every hundredth row): a flood of refused mail
            // cannot grow the journal without end.
            if !task.admitted && id % 100 == 0 {
                tx.execute(BOUND_NOT_ADMITTED, params![task.agent, KEEP_NOT_ADMITTED])?;
            }
            tx.commit()?;
            Ok(Some(id))
        })
    }

    /// Moves a task to `state` (not touching finished tasks).
    pub fn set_state(&self, id: i64, state: TaskState) -> Result<(), JournalError> {
        self.update_unfinished(id, "state = ?2", state.as_str())
    }

    /// Sets `set` (whose `?2` is `value`) on task `id` unless it is finished: a finished task
    /// keeps the state it was answered in.
    fn update_unfinished(&self, id: i64, set: &str, value: &str) -> Result<(), JournalError> {
        let sql = format!(
            "UPDATE tasks SET {set}, updated_at = ?3 WHERE id = ?1 AND state NOT IN ('answered', 'rejected', 'cancelled', 'expired')"
        );
        self.with(|c| c.execute(&sql, params![id, value, now_ms()]).map(drop))
    }

    /// Sets the task aside, unanswered, with why (see [`TaskState::Parked`]).
    pub fn park(&self, id: i64, reason: &str) -> Result<(), JournalError> {
        self.update_unfinished(id, "state = 'parked', reason = ?2", reason)
    }

    /// The task starts a run: `running`, one more run counted, no process group yet.
    /// Returns the number of runs so far, this one included.
    pub fn start_run(&self, id: i64) -> Result<u32, JournalError> {
        self.with(|c| {
            c.query_row(
                "UPDATE tasks SET state = 'running', runs = runs + 1, pgid = NULL, updated_at = ?2 WHERE id = ?1 RETURNING runs",
                params![id, now_ms()],
                |r| r.get(0),
            )
        })
    }

    /// Records the process group the task's agent runs in.
    pub fn set_pgid(&self, id: i64, pgid: i32) -> Result<(), JournalError> {
        self.with(|c| {
            c.execute(
                "UPDATE tasks SET pgid = ?2 WHERE id = ?1",
                params![id, pgid],
            )
            .map(drop)
        })
    }

    /// Finishes a task and queues its answer, in one transaction.
    pub fn finish(
        &self,
        agent: &str,
        id: i64,
        state: TaskState,
        reason: Option<&str>,
        reply: Option<&Outgoing>,
    ) -> Result<(), JournalError> {
        let now = now_ms();
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "UPDATE tasks SET state = ?2, reason = ?3, pgid = NULL, updated_at = ?4 WHERE id = ?1",
                params![id, state.as_str(), reason, now],
            )?;
            if let Some(mail) = reply {
                insert_outgoing(&tx, agent, Some(id), mail, now)?;
            }
            tx.commit()
        })
    }

    /// Tasks of `agent` that were admitted and not finished, oldest first.
    pub fn unfinished(&self, agent: &str) -> Result<Vec<Unfinished>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, state, mail, runs, pgid, message_key FROM tasks
                 WHERE agent = ?1 AND admitted = 1 AND state IN ('received', 'acked', 'running', 'help_needed', 'parked')
                 ORDER BY id",
            )?;
            let rows = stmt.query_map(params![agent], |r| {
                let state: String = r.get(1)?;
                Ok(Unfinished {
                    id: r.get(0)?,
                    state: TaskState::parse(&state).unwrap_or(TaskState::Running),
                    mail: r.get(2)?,
                    runs: r.get(3)?,
                    pgid: r.get(4)?,
                    message_key: r.get(5)?,
                })
            })?;
            rows.collect()
        })
    }

    /// The process groups recorded for unfinished tasks of any agent.
    pub fn recorded_pgids(&self) -> Result<Vec<i32>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT DISTINCT pgid FROM tasks WHERE pgid IS NOT NULL AND state IN ('running', 'help_needed')",
            )?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect()
        })
    }

    /// What admission's limits (`limits`) need to know about `agent`'s recent admitted tasks,
    /// for a dispatch from `sender` in conversation `session_key`. A count whose limit is
    /// not set is not made (0), and a count stops at its limit (the decision is only whether
    /// the limit is reached): per dispatch, at most the limits' worth of index entries is
    /// read, however many tasks the journal holds.
    pub fn recent_counts(
        &self,
        agent: &str,
        sender: &str,
        session_key: Option<&str>,
        limits: &Limits,
        now: SystemTime,
    ) -> Result<RecentCounts, JournalError> {
        let hour = now - Duration::from_secs(3600);
        let day = now - Duration::from_secs(86_400);
        let count = |of: Recent<'_>, since: SystemTime, cap: Option<u32>| match cap {
            Some(cap) => self.count_admitted(agent, of, since, cap),
            None => Ok(0),
        };
        Ok(RecentCounts {
            sender_last_hour: count(Recent::Sender(sender), hour, limits.per_sender_per_hour)?,
            agent_last_day: count(Recent::Agent, day, limits.daily_budget)?,
            // A conversation is one sender's Session-Key: the same key from another sender
            // is another conversation.
            session_turns: match session_key {
                Some(key) => count(
                    Recent::Conversation { sender, key },
                    UNIX_EPOCH,
                    limits.turns_per_session,
                )?,
                None => 0,
            },
        })
    }

    /// Admitted tasks of `agent` (of `of`) received since `since`, counted up to `cap`.
    pub fn count_admitted(
        &self,
        agent: &str,
        of: Recent<'_>,
        since: SystemTime,
        cap: u32,
    ) -> Result<u32, JournalError> {
        let (sql, sender, key) = match of {
            Recent::Agent => (COUNT_AGENT_RECENT, None, None),
            Recent::Sender(s) => (COUNT_SENDER_RECENT, Some(s.to_ascii_lowercase()), None),
            Recent::Conversation { sender, key } => (
                COUNT_CONVERSATION,
                Some(sender.to_ascii_lowercase()),
                Some(key),
            ),
        };
        self.with(|c| {
            let mut stmt = c.prepare_cached(sql)?;
            let mut values: Vec<rusqlite::types::Value> =
                vec![agent.to_string().into(), millis(since).into(), cap.into()];
            values.extend(sender.map(Into::into));
            values.extend(key.map(|k| k.to_string().into()));
            let n = stmt.query_row(rusqlite::params_from_iter(values), |r| r.get(0));
            let steps = stmt.get_status(rusqlite::StatementStatus::VmStep);
            self.count_steps
                .fetch_add(steps.max(0) as u64, std::sync::atomic::Ordering::Relaxed);
            n
        })
    }

    /// SQLite VM steps spent counting for admission since the journal was opened: a figure
    /// that does not depend on the machine, for tests that bound a dispatch's cost.
    pub fn count_steps(&self) -> u64 {
        self.count_steps.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Another replica won the task's claim (`by`, when known): the task is kept as a record
    /// ([`TaskState::Elsewhere`]), so de-duplication here sees a second delivery of it.
    pub fn elsewhere(&self, row: i64, by: &str) -> Result<(), JournalError> {
        self.update_unfinished(row, "state = 'elsewhere', reason = ?2, pgid = NULL", by)
    }

    /// A task another replica held comes back to be claimed here (a delivery of it again,
    /// or its claim ran out): `received` again, its message key and mail as recorded; `None`
    /// when it was not [`TaskState::Elsewhere`] (another caller took it back first).
    pub fn reclaim(&self, row: i64) -> Result<Option<(String, String)>, JournalError> {
        self.with(|c| {
            c.query_row(
                "UPDATE tasks SET state = 'received', updated_at = ?2 WHERE id = ?1 AND state = 'elsewhere' RETURNING message_key, mail",
                params![row, now_ms()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
        })
    }
}

/// Whether a Message-ID was recorded (every inbound mail). In the hot path: checked for index use in the journal's tests.
pub(super) const KNOWS_MESSAGE: &str = "SELECT 1 FROM tasks WHERE agent = ?1 AND message_key = ?2";
/// A recorded message's row and state. In the hot path: checked for index use in the journal's tests.
pub(super) const MESSAGE_ROW: &str =
    "SELECT id, state FROM tasks WHERE agent = ?1 AND message_key = ?2";
/// The de-duplication of a dispatch by sender and TaskId. In the hot path: checked for index use in the journal's tests.
pub(super) const ADMITTED_TASK: &str =
    "SELECT id, state FROM tasks WHERE agent = ?1 AND sender = ?2 AND task_id = ?3 AND admitted = 1 ORDER BY id DESC LIMIT 1";
