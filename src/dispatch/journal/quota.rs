//! An agent waiting for its provider's usage limit to reset (`quota_waits`, one row per agent
//! while it waits), and the tasks parked at the limit (`quota_parked`, one row per task, gone
//! with the task): what `dispatch::quota` keeps so a restart finds the wait and the order.

use std::time::SystemTime;

use rusqlite::{params, OptionalExtension};

use super::{from_millis, millis, now_ms, Journal, JournalError};

/// An agent's wait for its usage limit, as journaled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaWait {
    /// The agent's own words about the limit.
    pub said: String,
    /// When the agent said the limit resets; `None` when it did not say.
    pub resets: Option<SystemTime>,
    /// How many times in a row the agent was found at its limit.
    pub tries: u32,
    /// When the agent first hit the limit.
    pub since: SystemTime,
}

impl Journal {
    /// The wait `agent` is in, if any.
    pub fn quota_wait(&self, agent: &str) -> Result<Option<QuotaWait>, JournalError> {
        self.with(|c| {
            c.query_row(
                "SELECT said, resets, tries, since FROM quota_waits WHERE agent = ?1",
                params![agent],
                |r| {
                    Ok(QuotaWait {
                        said: r.get(0)?,
                        resets: r.get::<_, Option<i64>>(1)?.map(from_millis),
                        tries: r.get(2)?,
                        since: from_millis(r.get(3)?),
                    })
                },
            )
            .optional()
        })
    }

    /// `agent` waits (again) for its limit; the task at `row`, which found it, is parked:
    /// back to waiting to run (its run not counted against its reruns). Returns whether the
    /// task was parked for the first time (so its dispatcher is told once).
    pub fn quota_park(
        &self,
        agent: &str,
        wait: &QuotaWait,
        row: i64,
    ) -> Result<bool, JournalError> {
        let now = now_ms();
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO quota_waits (agent, said, resets, tries, since) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (agent) DO UPDATE SET said = ?2, resets = ?3, tries = ?4",
                params![agent, wait.said, wait.resets.map(millis), wait.tries, millis(wait.since)],
            )?;
            tx.execute(
                "UPDATE tasks SET state = 'received', runs = MAX(runs - 1, 0), pgid = NULL, updated_at = ?2
                 WHERE id = ?1 AND state NOT IN ('answered', 'rejected', 'cancelled', 'expired')",
                params![row, now],
            )?;
            let first = tx.execute(
                "INSERT OR IGNORE INTO quota_parked (task, agent, at) VALUES (?1, ?2, ?3)",
                params![row, agent, now],
            )? == 1;
            tx.commit()?;
            Ok(first)
        })
    }

    /// A task waiting behind `agent`'s limit is noted as told so (once); returns whether this
    /// is the first time.
    pub fn quota_told(&self, agent: &str, row: i64) -> Result<bool, JournalError> {
        self.with(|c| {
            c.execute(
                "INSERT OR IGNORE INTO quota_parked (task, agent, at) VALUES (?1, ?2, ?3)",
                params![row, agent, now_ms()],
            )
            .map(|n| n == 1)
        })
    }

    /// The rows of `agent`'s tasks that the limit held, oldest first.
    pub fn quota_parked(&self, agent: &str) -> Result<Vec<i64>, JournalError> {
        self.with(|c| {
            let mut stmt =
                c.prepare("SELECT task FROM quota_parked WHERE agent = ?1 ORDER BY at, task")?;
            let rows = stmt.query_map(params![agent], |r| r.get(0))?;
            rows.collect()
        })
    }

    /// `agent`'s limit is over (a task ran past it): the wait goes.
    pub fn quota_over(&self, agent: &str) -> Result<(), JournalError> {
        self.with(|c| {
            c.execute("DELETE FROM quota_waits WHERE agent = ?1", params![agent])
                .map(drop)
        })
    }

    /// The task at `row` ran past the limit or left: no longer held by it.
    pub fn quota_unpark(&self, row: i64) -> Result<(), JournalError> {
        self.with(|c| {
            c.execute("DELETE FROM quota_parked WHERE task = ?1", params![row])
                .map(drop)
        })
    }
}
