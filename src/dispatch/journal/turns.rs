//! The turns of each conversation (Session-Key): what was asked and what was answered, kept
//! so that an agent that cannot restore its own session can be given them as text.

use std::time::Duration;

use rusqlite::params;

use super::{now_ms, Journal, JournalError};

/// Turns kept per conversation; the oldest go first.
pub const TURNS_KEPT: i64 = 10;
/// Longest request or answer kept of one turn, in characters.
pub const TURN_TEXT: usize = 2000;
/// A conversation's turns unused this long are removed.
const TURNS_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// One earlier turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    pub request: String,
    pub answer: String,
}

fn cut(text: &str) -> String {
    text.trim().chars().take(TURN_TEXT).collect()
}

impl Journal {
    /// Records a completed turn of conversation `key`, keeping its last [`TURNS_KEPT`] turns
    /// and no agent's turns older than 30 days.
    pub fn add_turn(
        &self,
        agent: &str,
        key: &str,
        request: &str,
        answer: &str,
    ) -> Result<(), JournalError> {
        let now = now_ms();
        let oldest = now - TURNS_MAX_AGE.as_millis() as i64;
        self.with(|c| {
            c.execute(
                "INSERT INTO turns (agent, key, request, answer, at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![agent, key, cut(request), cut(answer), now],
            )?;
            c.execute(
                "DELETE FROM turns WHERE agent = ?1 AND key = ?2 AND id <= (
                     SELECT id FROM turns WHERE agent = ?1 AND key = ?2
                     ORDER BY id DESC LIMIT 1 OFFSET ?3)",
                params![agent, key, TURNS_KEPT],
            )?;
            c.execute(TURNS_EXPIRE, params![agent, oldest]).map(drop)
        })
    }

    /// The kept turns of conversation `key`, oldest first.
    pub fn turns(&self, agent: &str, key: &str) -> Result<Vec<Turn>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(TURNS_READ)?;
            let rows = stmt.query_map(params![agent, key], |r| {
                Ok(Turn {
                    request: r.get(0)?,
                    answer: r.get(1)?,
                })
            })?;
            rows.collect()
        })
    }
}

/// Turns older than they are kept. In the hot path: checked for index use in the journal's tests.
pub(super) const TURNS_EXPIRE: &str = "DELETE FROM turns WHERE agent = ?1 AND at < ?2";
/// A conversation's kept turns. In the hot path: checked for index use in the journal's tests.
pub(super) const TURNS_READ: &str =
    "SELECT request, answer FROM turns WHERE agent = ?1 AND key = ?2 ORDER BY id";
