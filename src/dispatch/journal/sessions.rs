//! The agent's own session id per conversation.

use rusqlite::{params, OptionalExtension};

use super::{now_ms, Journal, JournalError};

impl Journal {
    /// The agent's own session id for a Session-Key.
    pub fn session(&self, agent: &str, key: &str) -> Result<Option<String>, JournalError> {
        self.with(|c| {
            c.query_row(SESSION, params![agent, key], |r| r.get(0))
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

    /// Forgets the session id of a Session-Key (the agent could not restore it).
    pub fn drop_session(&self, agent: &str, key: &str) -> Result<(), JournalError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM sessions WHERE agent = ?1 AND key = ?2",
                params![agent, key],
            )
            .map(drop)
        })
    }
}

/// A conversation's agent session id (every dispatch with a Session-Key). In the hot path: checked for index use in the journal's tests.
pub(super) const SESSION: &str = "SELECT session_id FROM sessions WHERE agent = ?1 AND key = ?2";
