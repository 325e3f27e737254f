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

mod chains;
mod delegations;
pub use chains::{ChainTask, TaskChain};
pub use delegations::{Delegation, NewDelegation};
mod history;
mod outbox;
pub use outbox::{BounceFound, Bounced};
mod sessions;
mod space;
pub use space::{keep, log_kept, size_on_disk, Kept, Upkeep};
mod turns;
pub use turns::Turn;
mod tasks;
pub use tasks::{Limits, Recent, RecentCounts};
mod quota;
mod trust;
pub use quota::QuotaWait;
mod usage;
pub use usage::{hour_of, Spender, UsageHour, USAGE_HOURS_KEPT};

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
    /// Set aside without an answer: the mail server refused this bridge's claim on it for
    /// good (with several bridges an answer may leave only from the claim's winner). Tried
    /// again at the next start; `reason` says why.
    Parked,
    /// Another bridge serving the mailbox won the task's claim and runs it (`reason` names
    /// it): kept, not deleted, so a second delivery of the dispatch is known here too; a
    /// takeover turns it back into a task.
    Elsewhere,
}

impl TaskState {
    pub const ALL: [TaskState; 10] = [
        TaskState::Received,
        TaskState::Acked,
        TaskState::Running,
        TaskState::HelpNeeded,
        TaskState::Answered,
        TaskState::Rejected,
        TaskState::Cancelled,
        TaskState::Expired,
        TaskState::Parked,
        TaskState::Elsewhere,
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
            TaskState::Parked => "parked",
            TaskState::Elsewhere => "elsewhere",
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
    /// The delegation chain the dispatch carried (its id, parent TaskId, hops, members,
    /// deadline, budget and trace, as JSON: [`TaskChain`]); `None` for other mail.
    pub chain: Option<&'a str>,
}

#[cfg(test)]
impl<'a> NewTask<'a> {
    /// A test's task: received and let in, with `key` as both its Message-ID and TaskId.
    pub(crate) fn received(agent: &'a str, key: &'a str, sender: &'a str) -> Self {
        NewTask {
            agent,
            message_key: key,
            sender,
            task_id: key,
            session_key: None,
            state: TaskState::Received,
            admitted: true,
            mail: "{}",
            reason: None,
            chain: None,
        }
    }
}

/// A mail to send, ready to the byte; its Message-ID is derived from the task, so a
/// retried send is the same mail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    pub intent: String,
    pub mail: RenderedMail,
    /// The server's id of the mail this answers, when this bridge is one of several replicas
    /// and the answer leaves only if it wins that mail's claim (an answer every replica
    /// would give alike, to mail none of them runs); `None`: sent as it is.
    pub claim: Option<String>,
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
    /// The key it was recorded under (sender and Message-ID), from which its answers'
    /// Message-IDs are derived.
    pub message_key: String,
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
    /// Why an answer to the task could not be delivered: the server refused it for good
    /// (an ASMTP operator's 404 when the sender no longer lets the agent reach it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undelivered: Option<String>,
}

/// The columns [`task_row`] reads.
pub(super) const TASK_COLUMNS: &str = "id, agent, message_key, sender, task_id, state, reason, runs, received_at, updated_at, (SELECT o.intent || ': ' || COALESCE(o.last_error, 'refused') FROM outbox o WHERE o.task = tasks.id AND o.failed_at IS NOT NULL ORDER BY o.id DESC LIMIT 1)";
/// The same failed-answer column, for a WHERE clause.
pub(super) const UNDELIVERED: &str =
    "(SELECT 1 FROM outbox o WHERE o.task = tasks.id AND o.failed_at IS NOT NULL LIMIT 1)";

pub struct Journal {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// See [`Journal::count_steps`].
    count_steps: std::sync::atomic::AtomicU64,
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
    chain       TEXT,
    chain_id    TEXT,
    UNIQUE (agent, message_key)
);
CREATE INDEX IF NOT EXISTS tasks_by_task ON tasks (agent, sender, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (agent, state);
-- A delegation chain's tasks, for `task show`'s parent and children.
CREATE INDEX IF NOT EXISTS tasks_by_chain ON tasks (chain_id) WHERE chain_id IS NOT NULL;
-- A conversation's turns (admission counts them, up to its limit) from the index alone.
CREATE INDEX IF NOT EXISTS tasks_by_conversation ON tasks (agent, session_key, sender, admitted, state);
-- Bounding the rows of mail not admitted reads them newest first.
CREATE INDEX IF NOT EXISTS tasks_by_admission ON tasks (agent, admitted);
-- The admission limits count recent admitted tasks as a range of an index, never reading a
-- row (state is in the index, for the `elsewhere` ones left out), and stop at the limit.
CREATE INDEX IF NOT EXISTS tasks_by_agent_time ON tasks (agent, admitted, received_at, state);
CREATE INDEX IF NOT EXISTS tasks_by_sender_time ON tasks (agent, sender, admitted, received_at, state);
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
CREATE INDEX IF NOT EXISTS pair_failures_by_time ON pair_failures (agent, at);
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
    last_error TEXT,
    claim      TEXT
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
CREATE TABLE IF NOT EXISTS turns (
    id      INTEGER PRIMARY KEY,
    agent   TEXT NOT NULL,
    key     TEXT NOT NULL,
    request TEXT NOT NULL,
    answer  TEXT NOT NULL,
    at      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS turns_by_key ON turns (agent, key, id);
CREATE INDEX IF NOT EXISTS turns_by_time ON turns (agent, at);
-- Answers sent to refused mail in the last hour, per budget (refused dispatches, refused
-- pair requests): a restart does not give a flood of strangers a fresh budget.
CREATE TABLE IF NOT EXISTS answer_budget (
    agent TEXT NOT NULL,
    kind  TEXT NOT NULL,
    at    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS answer_budget_by_kind ON answer_budget (agent, kind, at);
-- What each task's model calls cost, one row per report (see journal/usage.rs).
CREATE TABLE IF NOT EXISTS usage (
    task        INTEGER NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run         INTEGER NOT NULL,
    key         TEXT NOT NULL,
    input       INTEGER NOT NULL,
    output      INTEGER NOT NULL,
    cache_read  INTEGER NOT NULL,
    cache_write INTEGER NOT NULL,
    cost_micros INTEGER,
    model       TEXT,
    at          INTEGER NOT NULL,
    PRIMARY KEY (task, run, key)
);
-- The same summed per agent, hour, sender and model, kept after the tasks go: what budgets
-- read (a month of one agent's or one sender's hours from an index), and reports.
CREATE TABLE IF NOT EXISTS usage_hours (
    agent       TEXT NOT NULL,
    hour        INTEGER NOT NULL,
    sender      TEXT NOT NULL,
    model       TEXT NOT NULL,
    input       INTEGER NOT NULL,
    output      INTEGER NOT NULL,
    cache_read  INTEGER NOT NULL,
    cache_write INTEGER NOT NULL,
    cost_micros INTEGER NOT NULL,
    uncosted    INTEGER NOT NULL,
    reports     INTEGER NOT NULL,
    PRIMARY KEY (agent, hour, sender, model)
);
CREATE INDEX IF NOT EXISTS usage_hours_by_sender ON usage_hours (sender, hour);
CREATE INDEX IF NOT EXISTS usage_hours_by_hour ON usage_hours (hour);
-- An agent waiting for its provider's usage limit to reset, and the tasks parked at it
-- (see journal/quota.rs).
CREATE TABLE IF NOT EXISTS quota_waits (
    agent  TEXT PRIMARY KEY,
    said   TEXT NOT NULL,
    resets INTEGER,
    tries  INTEGER NOT NULL,
    since  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS quota_parked (
    task  INTEGER PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    agent TEXT NOT NULL,
    at    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS quota_parked_by_agent ON quota_parked (agent);
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
        (SELECT t.task_id FROM tasks t WHERE t.id = o.task), o.claim
    FROM outbox o
    WHERE o.agent = ?1 AND o.sent_at IS NULL AND o.failed_at IS NULL AND o.next_at <= ?2
      AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.task = o.task AND e.id < o.id
                      AND e.sent_at IS NULL AND e.failed_at IS NULL)
    ORDER BY o.id LIMIT ?3";
/// When the next mail [`DUE`] reads is due.
const NEXT_DUE: &str = "SELECT MIN(o.next_at) FROM outbox o
    WHERE o.agent = ?1 AND o.sent_at IS NULL AND o.failed_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.task = o.task AND e.id < o.id
                      AND e.sent_at IS NULL AND e.failed_at IS NULL)";
/// Admission's counts of recent admitted tasks (see [`Recent`]): each stops at `?3` rows, the
/// limit it is compared with, so a count costs at most the limit's worth of index entries
/// however long the journal's history (80,000 tasks of the last day cost 800,000 VM steps
/// when every one was counted).
pub(super) const COUNT_AGENT_RECENT: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM tasks
    WHERE agent = ?1 AND admitted = 1 AND received_at >= ?2 AND state != 'elsewhere' LIMIT ?3)";
pub(super) const COUNT_SENDER_RECENT: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM tasks
    WHERE agent = ?1 AND sender = ?4 AND admitted = 1 AND received_at >= ?2 AND state != 'elsewhere' LIMIT ?3)";
/// A conversation's turns are counted from its start (`?2` is not used).
pub(super) const COUNT_CONVERSATION: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM tasks
    WHERE agent = ?1 AND session_key = ?5 AND sender = ?4 AND admitted = 1 AND state != 'elsewhere'
    AND ?2 IS NOT NULL LIMIT ?3)";

/// The schema this build writes (`PRAGMA user_version`). 1: tasks, outbox, sessions;
/// 2: tasks.session_key, policy, pair codes and failures, early cancels; 3: timeline;
/// 4: turns; 5: outbox.claim; 6: answer_budget; 7: admission counts from covering indexes
/// (tasks_by_time and tasks_by_session replaced), incremental auto_vacuum; 8: usage,
/// usage_hours.
const SCHEMA_VERSION: i64 = 9;

/// Brings a journal from an older build up to [`SCHEMA_VERSION`]; refuses one from a newer.
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "written by a newer aamp-bridge (schema {version}, this one knows {SCHEMA_VERSION}); upgrade aamp-bridge"
        )));
    }
    add_column(conn, "tasks", "session_key", "TEXT")?;
    add_column(conn, "outbox", "claim", "TEXT")?;
    add_column(conn, "tasks", "chain", "TEXT")?;
    add_column(conn, "tasks", "chain_id", "TEXT")?;
    // Replaced by indexes that cover what admission counts (schema 7).
    conn.execute_batch(
        "DROP INDEX IF EXISTS tasks_by_time; DROP INDEX IF EXISTS tasks_by_session;",
    )?;
    conn.execute_batch(SCHEMA)?;
    conn.execute_batch(delegations::SCHEMA)?;
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)
}

/// Adds `column` to `table` of a journal written before it was there (a new journal has it
/// from the schema).
fn add_column(conn: &Connection, table: &str, column: &str, decl: &str) -> rusqlite::Result<()> {
    let has_table = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [table],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    let has_column = conn
        .query_row(
            "SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2",
            [table, column],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if has_table && !has_column {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
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
        let mut conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        space::incremental_vacuum(&conn).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(err)?;
        // One transaction: a crash mid-way leaves the journal as it was, and a new journal's
        // two dozen tables and indexes cost one WAL sync instead of one each. Immediate, so
        // a bridge writing meanwhile makes this wait (busy_timeout), not fail.
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        migrate(&tx).and_then(|()| tx.commit()).map_err(err)?;
        Ok(Journal {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            count_steps: Default::default(),
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
        undelivered: r.get(10)?,
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
        "INSERT INTO outbox (agent, task, intent, message_id, sender, recipients, bytes, created_at, next_at, claim)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9)
         ON CONFLICT (message_id) DO NOTHING",
        params![
            agent,
            task,
            mail.intent,
            mail.mail.message_id,
            mail.mail.from,
            serde_json::to_string(&mail.mail.to).expect("strings serialize"),
            mail.mail.bytes,
            now,
            mail.claim
        ],
    )
    .map(drop)
}

#[cfg(test)]
mod tests;
