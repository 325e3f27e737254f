//! The outbox: every ack and result as a row with its bytes before it is sent, sent in order per
//! task, retried, given up on.

use std::time::SystemTime;

use rusqlite::{params, OptionalExtension};

use super::{
    from_millis, insert_outgoing, millis, now_ms, Journal, JournalError, Outgoing, Pending,
    COUNT_OUTGOING, DUE, NEXT_DUE,
};
use crate::protocol::RenderedMail;

impl Journal {
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
        self.pending(agent, now_ms(), limit)
    }

    /// Unsent mails of `agent` due by `by` (Unix ms), first in their task's line, oldest
    /// first, at most `limit`.
    fn pending(&self, agent: &str, by: i64, limit: usize) -> Result<Vec<Pending>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(DUE)?;
            let rows = stmt.query_map(params![agent, by, limit as i64], |r| {
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
                        claim: r.get(10)?,
                    },
                })
            })?;
            rows.collect()
        })
    }

    /// When the next unsent mail of `agent` is due, if there is one: of the mails first in
    /// their task's line (as [`Journal::due`] reads them). A task's result behind its unsent
    /// ack is due when the ack is sent, whatever its own time says; counting it made the
    /// worker look at the journal every 10 ms through a whole outage.
    pub fn next_due(&self, agent: &str) -> Result<Option<SystemTime>, JournalError> {
        self.with(|c| c.query_row(NEXT_DUE, params![agent], |r| r.get::<_, Option<i64>>(0)))
            .map(|t| t.map(from_millis))
    }

    /// The oldest mail of `agent` waiting to be sent (first in its task's line), due or not:
    /// what the outbox tries while the server is down, to learn when it is back.
    pub fn oldest_waiting(&self, agent: &str) -> Result<Vec<Pending>, JournalError> {
        self.pending(agent, i64::MAX, 1)
    }

    /// The server is back: every waiting mail of `agent` is due now (their order kept).
    /// Returns how many were waiting for a later time.
    pub fn resume(&self, agent: &str) -> Result<usize, JournalError> {
        let now = now_ms();
        self.with(|c| {
            c.execute(
                "UPDATE outbox SET next_at = ?2 WHERE agent = ?1 AND sent_at IS NULL AND failed_at IS NULL AND next_at > ?2",
                params![agent, now],
            )
        })
    }

    /// Unsent mails of `agent`.
    pub fn unsent(&self, agent: &str) -> Result<u32, JournalError> {
        self.with(|c| c.query_row(UNSENT, params![agent], |r| r.get(0)))
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

    /// Every unsent mail of `agent` waiting for a later retry is due now (its credentials
    /// were replaced); how many.
    pub fn retry_now(&self, agent: &str) -> Result<usize, JournalError> {
        self.resume(agent)
    }

    /// Another replica won the claim this mail waited on, and answers in its place: the
    /// mail is not sent (its row goes; the task's timeline says why). A task's result left
    /// so (another replica took the task over while it ran here) makes the task a record of
    /// who holds it ([`super::TaskState::Elsewhere`]), not answered: if that replica stops
    /// before it answers, a takeover scan brings the task back here, to be claimed again.
    pub fn answered_elsewhere(&self, pending: &Pending, by: &str) -> Result<(), JournalError> {
        let now = now_ms();
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM outbox WHERE id = ?1", params![pending.id])?;
            if let (Some(task), "task.result") = (pending.task, pending.mail.intent.as_str()) {
                tx.execute(
                    "UPDATE tasks SET state = 'elsewhere', reason = ?2, updated_at = ?3
                     WHERE id = ?1 AND admitted = 1 AND state IN ('answered', 'rejected', 'cancelled')",
                    params![task, format!("taken over by {by}"), now],
                )?;
            }
            if let Some(task) = pending.task {
                tx.execute(
                    "INSERT INTO timeline (task, at, what, detail) VALUES (?1, ?2, ?3, ?4)",
                    params![
                        task,
                        now,
                        format!("{} left to another replica", pending.mail.intent),
                        by
                    ],
                )?;
            }
            tx.commit()
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

    /// A delivery report says `message_id` will never reach `failed` (addresses): the mail
    /// is marked failed with `error` only when this agent sent it (it left the outbox: a
    /// report never stops an answer still waiting to be sent) and to one of those addresses.
    pub fn bounced(
        &self,
        agent: &str,
        message_id: &str,
        failed: &[String],
        error: &str,
    ) -> Result<BounceFound, JournalError> {
        self.with(|c| {
            let found = c
                .query_row(
                    "SELECT id, task, (SELECT t.task_id FROM tasks t WHERE t.id = outbox.task), intent,
                            recipients, sent_at IS NOT NULL, failed_at IS NOT NULL
                     FROM outbox WHERE agent = ?1 AND message_id = ?2",
                    params![agent, message_id],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            Bounced {
                                task: r.get(1)?,
                                task_id: r.get(2)?,
                                intent: r.get(3)?,
                            },
                            r.get::<_, String>(4)?,
                            r.get::<_, bool>(5)?,
                            r.get::<_, bool>(6)?,
                        ))
                    },
                )
                .optional()?;
            let Some((id, bounced, recipients, sent, failed_before)) = found else {
                return Ok(BounceFound::NotOurs);
            };
            if !sent || failed_before {
                return Ok(BounceFound::NotSent(bounced));
            }
            let recipients: Vec<String> = serde_json::from_str(&recipients).unwrap_or_default();
            let addressed = failed.iter().any(|f| {
                recipients
                    .iter()
                    .any(|r| crate::protocol::address(r).eq_ignore_ascii_case(&crate::protocol::address(f)))
            });
            if !addressed {
                return Ok(BounceFound::NotARecipient(bounced));
            }
            c.execute(
                "UPDATE outbox SET failed_at = ?2, last_error = ?3 WHERE id = ?1",
                params![id, now_ms(), error],
            )?;
            Ok(BounceFound::Marked(bounced))
        })
    }
}

/// A sent mail that came back.
#[derive(Debug, PartialEq, Eq)]
pub struct Bounced {
    /// Its task's row and id, when it was a task's mail.
    pub task: Option<i64>,
    pub task_id: Option<String>,
    pub intent: String,
}

/// What a delivery report was found to be about.
#[derive(Debug, PartialEq, Eq)]
pub enum BounceFound {
    /// A mail this agent sent, to an address the report names: now marked undelivered.
    Marked(Bounced),
    /// A mail of this agent's that has not left (still in the outbox), or already failed.
    NotSent(Bounced),
    /// A mail this agent sent, but to none of the addresses the report names.
    NotARecipient(Bounced),
    /// No mail this agent sent has that Message-ID.
    NotOurs,
}

/// Unsent mails of an agent. In the hot path: checked for index use in the journal's tests.
pub(super) const UNSENT: &str =
    "SELECT COUNT(*) FROM outbox WHERE agent = ?1 AND sent_at IS NULL AND failed_at IS NULL";
