//! The task journal: what the bridge has received, decided, run and answered, kept in one
//! SQLite file in the state directory (WAL, `synchronous=FULL`: a row the journal said it
//! wrote survives a power loss). It is what makes a task run exactly once across crashes:
//!
//! - every inbound message is recorded (by its Message-ID, and an admitted task also by
//!   sender and TaskId) before the mailbox cursor moves past it;
//! - every ack and result is first a row in the outbox table, with its bytes and a
//!   Message-ID derived from the task, and is marked sent only when SMTP accepted it, so a
//!   retried send is the same mail;
//! - tasks found `running` at start are re-run or answered, never forgotten; the process
//!   groups they ran in are recorded so leftovers can be stopped.
//!
//! Nothing here knows mail or agents beyond the bytes and ids it is given.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::{Classify, ErrorClass};
use crate::protocol::RenderedMail;

/// Where a task is in its life. Closed: these are all the states there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Recorded and admitted; its ack is in the outbox.
    Received,
    /// The ack was accepted by the mail server; waiting for a slot.
    Acked,
    /// An agent is (or was, when found at start) working on it.
    Running,
    /// The agent asked the dispatcher something and waits for the answer.
    HelpNeeded,
    /// Finished with a completed result (or consumed as an answer to a question).
    Answered,
    /// Finished with a rejected result: refused at admission, or failed.
    Rejected,
    /// Stopped by the dispatcher's cancel.
    Cancelled,
    /// Expired before it could start.
    Expired,
}

impl TaskState {
    pub const ALL: [TaskState; 8] = [
        TaskState::Received,
        TaskState::Acked,
        TaskState::Running,
        TaskState::HelpNeeded,
        TaskState::Answered,
        TaskState::Rejected,
        TaskState::Cancelled,
        TaskState::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Received => "received",
            TaskState::Acked => "acked",
            TaskState::Running => "running",
            TaskState::HelpNeeded => "help_needed",
            TaskState::Answered => "answered",
            TaskState::Rejected => "rejected",
            TaskState::Cancelled => "cancelled",
            TaskState::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Option<TaskState> {
        TaskState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// A task in this state has its answer recorded.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Answered | TaskState::Rejected | TaskState::Cancelled | TaskState::Expired
        )
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the task journal {path}: {source}")]
pub struct JournalError {
    pub path: PathBuf,
    #[source]
    pub source: rusqlite::Error,
}

impl Classify for JournalError {
    fn class(&self) -> ErrorClass {
        use rusqlite::ErrorCode;
        match self.source.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked | ErrorCode::DiskFull) => {
                ErrorClass::Transient
            }
            _ => ErrorClass::Permanent,
        }
    }
}

/// A message to record.
#[derive(Clone, Debug)]
pub struct NewTask<'a> {
    pub agent: &'a str,
    /// The inbound Message-ID, or a stand-in when the mail had none.
    pub message_key: &'a str,
    pub sender: &'a str,
    pub task_id: &'a str,
    pub session_key: Option<&'a str>,
    pub state: TaskState,
    /// True when the task was let in to run: it then holds its (sender, TaskId), and a later
    /// dispatch with the same pair is a duplicate. Refusals (busy, expired, unknown sender)
    /// do not, so the retry a refusal asks for is heard.
    pub admitted: bool,
    /// The inbound message as received (JSON), to run it again after a crash.
    pub mail: &'a str,
    pub reason: Option<&'a str>,
}

/// A mail to send, ready to the byte; its Message-ID is derived from the task, so a
/// retried send is the same mail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    pub intent: String,
    pub mail: RenderedMail,
}

/// An outbox row waiting to be sent.
#[derive(Clone, Debug)]
pub struct Pending {
    pub id: i64,
    pub task: Option<i64>,
    /// The TaskId of that task.
    pub task_id: Option<String>,
    pub attempts: u32,
    pub created_at: SystemTime,
    pub mail: Outgoing,
}

/// A task that was not finished when the bridge last stopped.
#[derive(Clone, Debug)]
pub struct Unfinished {
    pub id: i64,
    pub state: TaskState,
    pub mail: String,
    pub runs: u32,
    pub pgid: Option<i32>,
}

/// One step of a task's timeline.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub at_ms: i64,
    pub what: String,
    pub detail: Option<String>,
}

/// One task as `status` and `tasks` show it.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRow {
    pub id: i64,
    pub agent: String,
    pub message_id: String,
    pub sender: String,
    pub task_id: String,
    pub state: String,
    pub reason: Option<String>,
    pub runs: u32,
    pub received_at_ms: i64,
    pub updated_at_ms: i64,
}

pub struct Journal {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
    id          INTEGER PRIMARY KEY,
    agent       TEXT NOT NULL,
    message_key TEXT NOT NULL,
    sender      TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    session_key TEXT,
    state       TEXT NOT NULL,
    admitted    INTEGER NOT NULL,
    mail        TEXT NOT NULL,
    reason      TEXT,
    runs        INTEGER NOT NULL DEFAULT 0,
    pgid        INTEGER,
    received_at INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    UNIQUE (agent, message_key)
);
CREATE INDEX IF NOT EXISTS tasks_by_task ON tasks (agent, sender, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (agent, state);
CREATE INDEX IF NOT EXISTS tasks_by_session ON tasks (agent, session_key);
-- Bounding the rows of mail not admitted reads them newest first.
CREATE INDEX IF NOT EXISTS tasks_by_admission ON tasks (agent, admitted);
-- The admission limits count recent tasks from the index alone, not by reading every row.
CREATE INDEX IF NOT EXISTS tasks_by_time ON tasks (agent, received_at, admitted, sender, session_key);
CREATE TABLE IF NOT EXISTS policy (
    id         INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('allow', 'deny')),
    sender     TEXT NOT NULL,
    context    TEXT NOT NULL DEFAULT '{}',
    source     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (agent, kind, sender)
);
CREATE TABLE IF NOT EXISTS pair_codes (
    id         INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    code       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    used_at    INTEGER,
    used_by    TEXT
);
CREATE TABLE IF NOT EXISTS pair_failures (
    agent  TEXT NOT NULL,
    sender TEXT NOT NULL,
    at     INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS timeline (
    task   INTEGER NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    at     INTEGER NOT NULL,
    what   TEXT NOT NULL,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS timeline_by_task ON timeline (task, at);
CREATE TABLE IF NOT EXISTS cancels (
    agent      TEXT NOT NULL,
    sender     TEXT NOT NULL,
    task_id    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (agent, sender, task_id)
);
CREATE INDEX IF NOT EXISTS cancels_by_time ON cancels (agent, created_at);
CREATE TABLE IF NOT EXISTS outbox (
    id         INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    task       INTEGER REFERENCES tasks (id) ON DELETE CASCADE,
    intent     TEXT NOT NULL,
    message_id TEXT NOT NULL UNIQUE,
    sender     TEXT NOT NULL,
    recipients TEXT NOT NULL,
    bytes      BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    next_at    INTEGER NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    sent_at    INTEGER,
    failed_at  INTEGER,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (agent, sent_at, failed_at, next_at);
-- A task's mails (their count, the order they leave in) without scanning the outbox.
CREATE INDEX IF NOT EXISTS outbox_by_task ON outbox (task, intent);
CREATE TABLE IF NOT EXISTS sessions (
    agent      TEXT NOT NULL,
    key        TEXT NOT NULL,
    session_id TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (agent, key)
);
";

/// Rows of mail not admitted (refused, rejected, plain replies) kept per agent, and early
/// cancels kept per agent; the oldest go first.
pub const KEEP_NOT_ADMITTED: i64 = 10_000;
const BOUND_NOT_ADMITTED: &str = "DELETE FROM tasks WHERE agent = ?1 AND admitted = 0
    AND id < (SELECT id FROM tasks WHERE agent = ?1 AND admitted = 0 ORDER BY id DESC LIMIT 1 OFFSET ?2)
    AND state IN ('answered', 'rejected', 'cancelled', 'expired')
    AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task = tasks.id AND o.sent_at IS NULL AND o.failed_at IS NULL)";

/// The queries run for every task, kept here so a test can check that each uses an index
/// (a scan of a journal with months of history would cost every task more).
const COUNT_OUTGOING: &str = "SELECT COUNT(*) FROM outbox WHERE task = ?1 AND intent = ?2";
const DUE: &str = "SELECT o.id, o.task, o.attempts, o.created_at, o.intent, o.message_id, o.sender, o.recipients, o.bytes,
        (SELECT t.task_id FROM tasks t WHERE t.id = o.task)
    FROM outbox o
    WHERE o.agent = ?1 AND o.sent_at IS NULL AND o.failed_at IS NULL AND o.next_at <= ?2
      AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.task = o.task AND e.id < o.id
                      AND e.sent_at IS NULL AND e.failed_at IS NULL)
    ORDER BY o.id LIMIT ?3";
const COUNT_ADMITTED: &str =
    "SELECT COUNT(*) FROM tasks WHERE agent = ?1 AND admitted = 1 AND received_at >= ?2
    AND (?3 IS NULL OR sender = ?3) AND (?4 IS NULL OR session_key = ?4)";

/// The schema this build writes (`PRAGMA user_version`). 1: tasks, outbox, sessions;
/// 2: tasks.session_key, policy, pair codes and failures, early cancels; 3: timeline.
const SCHEMA_VERSION: i64 = 3;

/// Brings a journal from an older build up to [`SCHEMA_VERSION`]; refuses one from a newer.
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "written by a newer aamp-bridge (schema {version}, this one knows {SCHEMA_VERSION}); upgrade aamp-bridge"
        )));
    }
    let has_tasks: bool = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tasks'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if has_tasks {
        let has_session_key: bool = conn
            .query_row(
                "SELECT 1 FROM pragma_table_info('tasks') WHERE name = 'session_key'",
                [],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        if !has_session_key {
            conn.execute_batch("ALTER TABLE tasks ADD COLUMN session_key TEXT")?;
        }
    }
    conn.execute_batch(SCHEMA)?;
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

fn now_ms() -> i64 {
    millis(SystemTime::now())
}

impl Journal {
    /// Opens (or creates, mode 0600) the journal at `path`.
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        let err = |source| JournalError {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if !path.exists() {
            use std::os::unix::fs::OpenOptionsExt;
            // SQLite gives its -wal and -shm files the main file's mode.
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path);
        }
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(err)?;
        migrate(&conn).map_err(err)?;
        Ok(Journal {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, JournalError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut conn).map_err(|source| JournalError {
            path: self.path.clone(),
            source,
        })
    }

    /// Whether a message with this key was recorded for `agent`.
    pub fn knows_message(&self, agent: &str, message_key: &str) -> Result<bool, JournalError> {
        self.with(|c| {
            c.query_row(
                "SELECT 1 FROM tasks WHERE agent = ?1 AND message_key = ?2",
                params![agent, message_key],
                |_| Ok(()),
            )
            .optional()
            .map(|r| r.is_some())
        })
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
                "SELECT id, state FROM tasks WHERE agent = ?1 AND sender = ?2 AND task_id = ?3 AND admitted = 1 ORDER BY id DESC LIMIT 1",
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
                "INSERT INTO tasks (agent, message_key, sender, task_id, state, admitted, mail, reason, received_at, updated_at, session_key)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)
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
                    task.session_key
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
        self.with(|c| {
            c.execute(
                "UPDATE tasks SET state = ?2, updated_at = ?3 WHERE id = ?1 AND state NOT IN ('answered', 'rejected', 'cancelled', 'expired')",
                params![id, state.as_str(), now_ms()],
            )
            .map(drop)
        })
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

    /// Queues a mail for a task that goes on (a question, a stream announcement). A mail
    /// with a Message-ID already queued is not queued twice.
    pub fn enqueue(
        &self,
        agent: &str,
        task: Option<i64>,
        mail: &Outgoing,
    ) -> Result<(), JournalError> {
        self.with(|c| insert_outgoing(c, agent, task, mail, now_ms()))
    }

    /// How many mails of `intent` were queued for the task.
    pub fn count_outgoing(&self, task: i64, intent: &str) -> Result<u32, JournalError> {
        self.with(|c| c.query_row(COUNT_OUTGOING, params![task, intent], |r| r.get(0)))
    }

    /// Mails of `agent` due now, oldest first; a mail waits while an earlier one of the same
    /// task is unsent, so a task's mails leave in order.
    pub fn due(&self, agent: &str, limit: usize) -> Result<Vec<Pending>, JournalError> {
        let now = now_ms();
        self.with(|c| {
            let mut stmt = c.prepare_cached(DUE)?;
            let rows = stmt.query_map(params![agent, now, limit as i64], |r| {
                let recipients: String = r.get(7)?;
                Ok(Pending {
                    id: r.get(0)?,
                    task: r.get(1)?,
                    task_id: r.get(9)?,
                    attempts: r.get(2)?,
                    created_at: from_millis(r.get(3)?),
                    mail: Outgoing {
                        intent: r.get(4)?,
                        mail: RenderedMail {
                            message_id: r.get(5)?,
                            from: r.get(6)?,
                            to: serde_json::from_str(&recipients).unwrap_or_default(),
                            bytes: r.get(8)?,
                        },
                    },
                })
            })?;
            rows.collect()
        })
    }

    /// When the next unsent mail of `agent` is due, if there is one.
    pub fn next_due(&self, agent: &str) -> Result<Option<SystemTime>, JournalError> {
        self.with(|c| {
            c.query_row(
                "SELECT MIN(next_at) FROM outbox WHERE agent = ?1 AND sent_at IS NULL AND failed_at IS NULL",
                params![agent],
                |r| r.get::<_, Option<i64>>(0),
            )
        })
        .map(|t| t.map(from_millis))
    }

    /// Unsent mails of `agent`.
    pub fn unsent(&self, agent: &str) -> Result<u32, JournalError> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM outbox WHERE agent = ?1 AND sent_at IS NULL AND failed_at IS NULL",
                params![agent],
                |r| r.get(0),
            )
        })
    }

    /// The mail server accepted the mail; an ack moves its task from received to acked.
    pub fn mark_sent(&self, pending: &Pending) -> Result<(), JournalError> {
        let now = now_ms();
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "UPDATE outbox SET sent_at = ?2, attempts = attempts + 1, last_error = NULL WHERE id = ?1",
                params![pending.id, now],
            )?;
            if let (Some(task), "task.ack") = (pending.task, pending.mail.intent.as_str()) {
                tx.execute(
                    "UPDATE tasks SET state = 'acked', updated_at = ?2 WHERE id = ?1 AND state = 'received'",
                    params![task, now],
                )?;
            }
            tx.commit()
        })
    }

    /// Sending failed; try again at `next`.
    pub fn retry_at(
        &self,
        pending: &Pending,
        next: SystemTime,
        error: &str,
    ) -> Result<(), JournalError> {
        self.with(|c| {
            c.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_at = ?2, last_error = ?3 WHERE id = ?1",
                params![pending.id, millis(next), error],
            )
            .map(drop)
        })
    }

    /// Sending failed for good.
    pub fn give_up(&self, pending: &Pending, error: &str) -> Result<(), JournalError> {
        self.with(|c| {
            c.execute(
                "UPDATE outbox SET attempts = attempts + 1, failed_at = ?2, last_error = ?3 WHERE id = ?1",
                params![pending.id, now_ms(), error],
            )
            .map(drop)
        })
    }

    /// Tasks of `agent` that were admitted and not finished, oldest first.
    pub fn unfinished(&self, agent: &str) -> Result<Vec<Unfinished>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, state, mail, runs, pgid FROM tasks
                 WHERE agent = ?1 AND admitted = 1 AND state IN ('received', 'acked', 'running', 'help_needed')
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

    /// The agent's own session id for a Session-Key.
    pub fn session(&self, agent: &str, key: &str) -> Result<Option<String>, JournalError> {
        self.with(|c| {
            c.query_row(
                "SELECT session_id FROM sessions WHERE agent = ?1 AND key = ?2",
                params![agent, key],
                |r| r.get(0),
            )
            .optional()
        })
    }

    pub fn set_session(&self, agent: &str, key: &str, id: &str) -> Result<(), JournalError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO sessions (agent, key, session_id, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (agent, key) DO UPDATE SET session_id = excluded.session_id, updated_at = excluded.updated_at",
                params![agent, key, id, now_ms()],
            )
            .map(drop)
        })
    }

    /// Tasks, newest first, optionally of one agent and in one state.
    pub fn tasks(
        &self,
        agent: Option<&str>,
        state: Option<TaskState>,
        limit: usize,
    ) -> Result<Vec<TaskRow>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, agent, message_key, sender, task_id, state, reason, runs, received_at, updated_at
                 FROM tasks WHERE (?1 IS NULL OR agent = ?1) AND (?2 IS NULL OR state = ?2)
                 ORDER BY id DESC LIMIT ?3",
            )?;
            let rows = stmt.query_map(
                params![agent, state.map(TaskState::as_str), limit as i64],
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
                "SELECT id, agent, message_key, sender, task_id, state, reason, runs, received_at, updated_at
                 FROM tasks WHERE task_id = ?1 OR message_key LIKE '%|' || ?1 OR message_key = ?1 OR id = ?2
                 ORDER BY id",
            )?;
            let rows = stmt.query_map(params![id, row], task_row)?;
            rows.collect()
        })
    }

    /// Unsent mails per agent, and unfinished tasks per agent and state.
    pub fn counts(&self) -> Result<Vec<(String, String, u32)>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT agent, state, COUNT(*) FROM tasks WHERE admitted = 1 AND state IN ('received', 'acked', 'running', 'help_needed') GROUP BY agent, state
                 UNION ALL
                 SELECT agent, 'unsent', COUNT(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL GROUP BY agent",
            )?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect()
        })
    }

    /// Admitted tasks of `agent` received since `since`, of one sender and/or one Session-Key
    /// when given.
    pub fn count_admitted(
        &self,
        agent: &str,
        sender: Option<&str>,
        session_key: Option<&str>,
        since: SystemTime,
    ) -> Result<u32, JournalError> {
        self.with(|c| {
            c.query_row(
                COUNT_ADMITTED,
                params![
                    agent,
                    millis(since),
                    sender.map(str::to_ascii_lowercase),
                    session_key
                ],
                |r| r.get(0),
            )
        })
    }

    /// Adds an allow rule or a deny pattern for `agent` (replacing one for the same sender).
    pub fn add_policy(
        &self,
        agent: &str,
        deny: bool,
        rule: &super::policy::Rule,
        source: &str,
    ) -> Result<(), JournalError> {
        let context = serde_json::to_string(&rule.context).expect("a map serializes");
        self.with(|c| {
            c.execute(
                "INSERT INTO policy (agent, kind, sender, context, source, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (agent, kind, sender) DO UPDATE SET context = excluded.context, source = excluded.source, created_at = excluded.created_at",
                params![agent, if deny { "deny" } else { "allow" }, super::policy::normalize(&rule.sender), context, source, now_ms()],
            )
            .map(drop)
        })
    }

    /// Removes the rules for `sender` (allow and deny); returns how many there were.
    pub fn remove_policy(&self, agent: &str, sender: &str) -> Result<usize, JournalError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM policy WHERE agent = ?1 AND sender = ?2",
                params![agent, super::policy::normalize(sender)],
            )
        })
    }

    /// The allow rules and deny patterns kept for `agent`, with where each came from.
    #[allow(clippy::type_complexity)]
    pub fn policy(
        &self,
        agent: &str,
    ) -> Result<(Vec<(super::policy::Rule, String)>, Vec<(String, String)>), JournalError> {
        let rows: Vec<(String, String, String, String)> = self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT kind, sender, context, source FROM policy WHERE agent = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map(params![agent], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?;
            rows.collect()
        })?;
        let mut allow = Vec::new();
        let mut deny = Vec::new();
        for (kind, sender, context, source) in rows {
            if kind == "deny" {
                deny.push((sender, source));
            } else {
                let context = serde_json::from_str(&context).unwrap_or_default();
                allow.push((super::policy::Rule { sender, context }, source));
            }
        }
        Ok((allow, deny))
    }

    /// Keeps a new pairing code for `agent`, valid for `ttl`.
    pub fn add_pair_code(
        &self,
        agent: &str,
        code: &str,
        ttl: Duration,
    ) -> Result<SystemTime, JournalError> {
        let now = SystemTime::now();
        let expires = now + ttl;
        self.with(|c| {
            c.execute(
                "INSERT INTO pair_codes (agent, code, created_at, expires_at) VALUES (?1, ?2, ?3, ?4)",
                params![agent, code, millis(now), millis(expires)],
            )
            .map(drop)
        })?;
        Ok(expires)
    }

    /// The pairing codes of `agent` that are unused and unexpired: (id, code).
    pub fn live_pair_codes(&self, agent: &str) -> Result<Vec<(i64, String)>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, code FROM pair_codes WHERE agent = ?1 AND used_at IS NULL AND expires_at > ?2",
            )?;
            let rows = stmt.query_map(params![agent, now_ms()], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })
    }

    /// The newest unused pairing code of `agent` with at least `left` to live, and its expiry.
    pub fn fresh_pair_code(
        &self,
        agent: &str,
        left: Duration,
    ) -> Result<Option<(String, SystemTime)>, JournalError> {
        let after = millis(SystemTime::now() + left);
        self.with(|c| {
            c.query_row(
                "SELECT code, expires_at FROM pair_codes WHERE agent = ?1 AND used_at IS NULL AND expires_at > ?2 ORDER BY id DESC LIMIT 1",
                params![agent, after],
                |r| {
                    let ms: i64 = r.get(1)?;
                    Ok((r.get(0)?, UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)))
                },
            )
            .optional()
        })
    }

    /// Uses up a pairing code; false when it was used meanwhile.
    pub fn consume_pair_code(&self, id: i64, sender: &str) -> Result<bool, JournalError> {
        self.with(|c| {
            c.execute(
                "UPDATE pair_codes SET used_at = ?2, used_by = ?3 WHERE id = ?1 AND used_at IS NULL",
                params![id, now_ms(), sender.to_ascii_lowercase()],
            )
            .map(|n| n == 1)
        })
    }

    pub fn pair_failure(&self, agent: &str, sender: &str) -> Result<(), JournalError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO pair_failures (agent, sender, at) VALUES (?1, ?2, ?3)",
                params![agent, sender.to_ascii_lowercase(), now_ms()],
            )
            .map(drop)
        })
    }

    /// Failed pairing attempts since `since`, by one sender or by all.
    pub fn pair_failures(
        &self,
        agent: &str,
        sender: Option<&str>,
        since: SystemTime,
    ) -> Result<u32, JournalError> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM pair_failures WHERE agent = ?1 AND at >= ?2 AND (?3 IS NULL OR sender = ?3)",
                params![agent, millis(since), sender.map(str::to_ascii_lowercase)],
                |r| r.get(0),
            )
        })
    }

    /// Remembers a cancel that came before its dispatch.
    pub fn remember_cancel(
        &self,
        agent: &str,
        sender: &str,
        task_id: &str,
    ) -> Result<(), JournalError> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO cancels (agent, sender, task_id, created_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                params![agent, sender.to_ascii_lowercase(), task_id, now_ms()],
            )?;
            // At most KEEP_NOT_ADMITTED early cancels per agent: the oldest go first.
            tx.execute(
                "DELETE FROM cancels WHERE agent = ?1 AND created_at < (SELECT created_at FROM cancels
                   WHERE agent = ?1 ORDER BY created_at DESC LIMIT 1 OFFSET ?2)",
                params![agent, KEEP_NOT_ADMITTED],
            )?;
            tx.commit()
        })
    }

    /// Whether the dispatch (sender, TaskId) was cancelled before it came.
    pub fn was_cancelled(
        &self,
        agent: &str,
        sender: &str,
        task_id: &str,
    ) -> Result<bool, JournalError> {
        self.with(|c| {
            c.query_row(
                "SELECT 1 FROM cancels WHERE agent = ?1 AND sender = ?2 AND task_id = ?3",
                params![agent, sender.to_ascii_lowercase(), task_id],
                |_| Ok(()),
            )
            .optional()
            .map(|r| r.is_some())
        })
    }

    /// Forgets finished tasks (and their sent mails) last touched before `before`. Returns
    /// how many tasks were removed.
    pub fn prune(&self, before: SystemTime) -> Result<usize, JournalError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "DELETE FROM tasks WHERE updated_at < ?1 AND state IN ('answered', 'rejected', 'cancelled', 'expired')
                 AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task = tasks.id AND o.sent_at IS NULL AND o.failed_at IS NULL)",
                params![millis(before)],
            )?;
            tx.execute(
                "DELETE FROM outbox WHERE task IS NULL AND created_at < ?1 AND (sent_at IS NOT NULL OR failed_at IS NOT NULL)",
                params![millis(before)],
            )?;
            tx.execute(
                "DELETE FROM cancels WHERE created_at < ?1",
                params![millis(before)],
            )?;
            tx.execute("DELETE FROM pair_codes WHERE expires_at < ?1", params![millis(before)])?;
            tx.execute("DELETE FROM pair_failures WHERE at < ?1", params![millis(before)])?;
            tx.commit()?;
            Ok(n)
        })
    }
}

fn task_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TaskRow> {
    let key: String = r.get(2)?;
    Ok(TaskRow {
        id: r.get(0)?,
        agent: r.get(1)?,
        // The key is "sender|Message-ID"; show the Message-ID.
        message_id: key
            .split_once('|')
            .map_or(key.clone(), |(_, id)| id.to_string()),
        sender: r.get(3)?,
        task_id: r.get(4)?,
        state: r.get(5)?,
        reason: r.get(6)?,
        runs: r.get(7)?,
        received_at_ms: r.get(8)?,
        updated_at_ms: r.get(9)?,
    })
}

fn insert_outgoing(
    c: &Connection,
    agent: &str,
    task: Option<i64>,
    mail: &Outgoing,
    now: i64,
) -> rusqlite::Result<()> {
    c.execute(
        "INSERT INTO outbox (agent, task, intent, message_id, sender, recipients, bytes, created_at, next_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)
         ON CONFLICT (message_id) DO NOTHING",
        params![
            agent,
            task,
            mail.intent,
            mail.mail.message_id,
            mail.mail.from,
            serde_json::to_string(&mail.mail.to).expect("strings serialize"),
            mail.mail.bytes,
            now
        ],
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queries_run_for_every_task_use_indexes_not_scans() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(&dir.path().join("j.sqlite3")).unwrap();
        let conn = journal.conn.lock().unwrap();
        for (name, sql, n) in [
            ("COUNT_OUTGOING", COUNT_OUTGOING, 2),
            ("DUE", DUE, 3),
            ("COUNT_ADMITTED", COUNT_ADMITTED, 4),
            ("BOUND_NOT_ADMITTED", BOUND_NOT_ADMITTED, 2),
        ] {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let values: Vec<rusqlite::types::Value> =
                (0..n).map(|_| rusqlite::types::Value::Null).collect();
            let plan: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(values), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(
                plan.iter().all(|step| !step.starts_with("SCAN")),
                "{name} scans a table: {plan:?}"
            );
        }
    }

    #[test]
    fn mail_not_admitted_is_bounded_per_agent_and_pending_answers_stay() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(&dir.path().join("j.sqlite3")).unwrap();
        let keys: Vec<String> = (0..30).map(|i| format!("<r{i}>")).collect();
        for key in &keys {
            let mut t = task(key, key, false);
            t.state = TaskState::Rejected;
            journal.record(&t, None).unwrap();
        }
        journal
            .with(|c| {
                c.execute(BOUND_NOT_ADMITTED, params!["coder", 10])
                    .map(drop)
            })
            .unwrap();
        let left: Vec<bool> = keys
            .iter()
            .map(|k| journal.knows_message("coder", k).unwrap())
            .collect();
        assert_eq!(left.iter().filter(|k| **k).count(), 11, "{left:?}");
        assert!(left[29] && !left[0], "the oldest go first");
    }

    fn task<'a>(key: &'a str, task_id: &'a str, admitted: bool) -> NewTask<'a> {
        NewTask {
            agent: "coder",
            message_key: key,
            sender: "A@x.test",
            task_id,
            session_key: Some("s1"),
            state: if admitted {
                TaskState::Received
            } else {
                TaskState::Rejected
            },
            admitted,
            mail: "{}",
            reason: None,
        }
    }

    fn mail(intent: &str, id: &str) -> Outgoing {
        Outgoing {
            intent: intent.into(),
            mail: RenderedMail {
                message_id: id.into(),
                from: "coder@x.test".into(),
                to: vec!["a@x.test".into()],
                bytes: b"bytes".to_vec(),
            },
        }
    }

    #[test]
    fn a_message_is_recorded_once_and_its_task_key_held_only_when_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("journal.sqlite3")).unwrap();
        let id = j
            .record(&task("<m1>", "t1", true), Some(&mail("task.ack", "<a1>")))
            .unwrap()
            .expect("recorded");
        assert!(j.knows_message("coder", "<m1>").unwrap());
        assert!(!j.knows_message("other", "<m1>").unwrap());
        assert_eq!(
            j.record(&task("<m1>", "t1", true), Some(&mail("task.ack", "<a1>")))
                .unwrap(),
            None,
            "a second delivery is a duplicate"
        );
        assert_eq!(
            j.admitted_task("coder", "a@X.test", "t1").unwrap(),
            Some((id, TaskState::Received))
        );
        j.record(
            &task("<m2>", "t2", false),
            Some(&mail("task.result", "<r2>")),
        )
        .unwrap();
        assert_eq!(j.admitted_task("coder", "a@x.test", "t2").unwrap(), None);
        assert_eq!(j.unsent("coder").unwrap(), 2);
    }

    #[test]
    fn the_outbox_sends_a_tasks_mails_in_order_and_marks_the_ack() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite3")).unwrap();
        let id = j
            .record(&task("<m1>", "t1", true), Some(&mail("task.ack", "<a1>")))
            .unwrap()
            .unwrap();
        j.finish(
            "coder",
            id,
            TaskState::Answered,
            None,
            Some(&mail("task.result", "<r1>")),
        )
        .unwrap();
        let due = j.due("coder", 10).unwrap();
        assert_eq!(due.len(), 1, "the result waits for the ack");
        assert_eq!(due[0].mail.intent, "task.ack");
        j.retry_at(&due[0], SystemTime::now() + Duration::from_secs(60), "down")
            .unwrap();
        assert!(j.due("coder", 10).unwrap().is_empty());
        assert!(j.next_due("coder").unwrap().is_some());
        j.mark_sent(&due[0]).unwrap();
        let due = j.due("coder", 10).unwrap();
        assert_eq!(due[0].mail.intent, "task.result");
        j.mark_sent(&due[0]).unwrap();
        assert_eq!(j.unsent("coder").unwrap(), 0);
        assert!(j.unfinished("coder").unwrap().is_empty());
    }

    #[test]
    fn unfinished_tasks_survive_reopening_with_their_runs_and_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite3");
        {
            let j = Journal::open(&path).unwrap();
            let id = j.record(&task("<m1>", "t1", true), None).unwrap().unwrap();
            assert_eq!(j.start_run(id).unwrap(), 1);
            j.set_pgid(id, 4242).unwrap();
            j.set_session("coder", "k", "s1").unwrap();
            j.set_session("coder", "k", "s2").unwrap();
        }
        let j = Journal::open(&path).unwrap();
        let left = j.unfinished("coder").unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(
            (left[0].state, left[0].runs, left[0].pgid),
            (TaskState::Running, 1, Some(4242))
        );
        assert_eq!(j.recorded_pgids().unwrap(), vec![4242]);
        assert_eq!(j.session("coder", "k").unwrap().as_deref(), Some("s2"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_journal_of_the_first_schema_is_brought_up_to_date() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.sqlite3");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE tasks (id INTEGER PRIMARY KEY, agent TEXT NOT NULL, message_key TEXT NOT NULL,
                   sender TEXT NOT NULL, task_id TEXT NOT NULL, state TEXT NOT NULL, admitted INTEGER NOT NULL,
                   mail TEXT NOT NULL, reason TEXT, runs INTEGER NOT NULL DEFAULT 0, pgid INTEGER,
                   received_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, UNIQUE (agent, message_key));
                 INSERT INTO tasks (agent, message_key, sender, task_id, state, admitted, mail, received_at, updated_at)
                   VALUES ('coder', '<old>', 'a@x.test', 't0', 'running', 1, '{}', 1, 1);",
            )
            .unwrap();
        }
        let j = Journal::open(&path).unwrap();
        assert!(j.knows_message("coder", "<old>").unwrap());
        assert_eq!(j.unfinished("coder").unwrap().len(), 1);
        j.record(&task("<new>", "t1", true), None).unwrap();
        assert_eq!(
            j.count_admitted("coder", Some("a@x.test"), Some("s1"), UNIX_EPOCH)
                .unwrap(),
            1
        );
        drop(j);
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        let newer = Journal::open(&path).unwrap_err().to_string();
        assert!(newer.contains("newer aamp-bridge"), "{newer}");
    }

    #[test]
    fn pruning_keeps_unfinished_tasks_and_unsent_mail() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite3")).unwrap();
        let done = j.record(&task("<m1>", "t1", true), None).unwrap().unwrap();
        j.finish("coder", done, TaskState::Answered, None, None)
            .unwrap();
        let waiting = j.record(&task("<m2>", "t2", true), None).unwrap().unwrap();
        j.finish(
            "coder",
            waiting,
            TaskState::Answered,
            None,
            Some(&mail("task.result", "<r2>")),
        )
        .unwrap();
        j.record(&task("<m3>", "t3", true), None).unwrap();
        let removed = j.prune(SystemTime::now() + Duration::from_secs(1)).unwrap();
        assert_eq!(removed, 1);
        assert!(!j.knows_message("coder", "<m1>").unwrap());
        assert!(j.knows_message("coder", "<m2>").unwrap());
        assert!(j.knows_message("coder", "<m3>").unwrap());
    }
}
