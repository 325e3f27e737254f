//! Who may send: rules kept by `policy` and pairing, pairing codes and wrong guesses, early
//! cancels.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, OptionalExtension};

use super::{millis, now_ms, Journal, JournalError, KEEP_NOT_ADMITTED};

impl Journal {
    /// Spends one answer of `agent`'s budget `kind` (at most `per_hour` in any hour) if one is
    /// left: `true` when the answer may go. Kept in the journal, so a restart does not refill
    /// it.
    pub fn spend_answer(
        &self,
        agent: &str,
        kind: &str,
        per_hour: u32,
    ) -> Result<bool, JournalError> {
        let now = now_ms();
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(SPENT_FORGET, params![agent, kind, now - 3_600_000])?;
            let spent: u32 = tx.query_row(SPENT_COUNT, params![agent, kind], |r| r.get(0))?;
            let may = spent < per_hour;
            if may {
                tx.execute(
                    "INSERT INTO answer_budget (agent, kind, at) VALUES (?1, ?2, ?3)",
                    params![agent, kind, now],
                )?;
            }
            tx.commit()?;
            Ok(may)
        })
    }

    /// Adds an allow rule or a deny pattern for `agent` (replacing one for the same sender).
    pub fn add_policy(
        &self,
        agent: &str,
        deny: bool,
        rule: &crate::config::policy::Rule,
        source: &str,
    ) -> Result<(), JournalError> {
        let context = serde_json::to_string(&rule.context).expect("a map serializes");
        self.with(|c| {
            c.execute(
                "INSERT INTO policy (agent, kind, sender, context, source, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (agent, kind, sender) DO UPDATE SET context = excluded.context, source = excluded.source, created_at = excluded.created_at",
                params![agent, if deny { "deny" } else { "allow" }, crate::config::policy::normalize(&rule.sender), context, source, now_ms()],
            )
            .map(drop)
        })
    }

    /// Removes the rules for `sender` (allow and deny); returns how many there were.
    pub fn remove_policy(&self, agent: &str, sender: &str) -> Result<usize, JournalError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM policy WHERE agent = ?1 AND sender = ?2",
                params![agent, crate::config::policy::normalize(sender)],
            )
        })
    }

    /// The allow rules and deny patterns kept for `agent`, with where each came from.
    #[allow(clippy::type_complexity)]
    pub fn policy(
        &self,
        agent: &str,
    ) -> Result<
        (
            Vec<(crate::config::policy::Rule, String)>,
            Vec<(String, String)>,
        ),
        JournalError,
    > {
        let rows: Vec<(String, String, String, String)> = self.with(|c| {
            let mut stmt = c.prepare_cached(POLICY_RULES)?;
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
                allow.push((crate::config::policy::Rule { sender, context }, source));
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
                PAIR_FAILURES,
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
                WAS_CANCELLED,
                params![agent, sender.to_ascii_lowercase(), task_id],
                |_| Ok(()),
            )
            .optional()
            .map(|r| r.is_some())
        })
    }
}

/// Answers to refused mail older than the budget's hour. In the hot path: checked for index use in the journal's tests.
pub(super) const SPENT_FORGET: &str =
    "DELETE FROM answer_budget WHERE agent = ?1 AND kind = ?2 AND at < ?3";
/// Answers to refused mail in the budget's hour. In the hot path: checked for index use in the journal's tests.
pub(super) const SPENT_COUNT: &str =
    "SELECT COUNT(*) FROM answer_budget WHERE agent = ?1 AND kind = ?2";
/// The sender rules added at run time (every dispatch's policy check). In the hot path: checked for index use in the journal's tests.
pub(super) const POLICY_RULES: &str =
    "SELECT kind, sender, context, source FROM policy WHERE agent = ?1 ORDER BY id";
/// Failed pairing attempts since a time. In the hot path: checked for index use in the journal's tests.
pub(super) const PAIR_FAILURES: &str =
    "SELECT COUNT(*) FROM pair_failures WHERE agent = ?1 AND at >= ?2 AND (?3 IS NULL OR sender = ?3)";
/// Whether a cancel came before its dispatch. In the hot path: checked for index use in the journal's tests.
pub(super) const WAS_CANCELLED: &str =
    "SELECT 1 FROM cancels WHERE agent = ?1 AND sender = ?2 AND task_id = ?3";
