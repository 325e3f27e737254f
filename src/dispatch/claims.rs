//! Claims, when several bridges serve one mailbox: a task is claimed on the mail server before
//! it is acknowledged and run, the claim renewed while it runs and marked done once it is
//! answered; a task whose claim another bridge won is left to it (kept as a record), one whose
//! claim the server refuses for good is parked, and one that comes back is claimed again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::journal::JournalError;
use super::{AgentSpec, Common, Outbox, ReplicaSpec, Task};
use crate::backend::{Backend, ClaimOutcome};
use crate::backoff::Backoff;
use crate::error::{Classify, ErrorClass};
use crate::protocol::Body;

/// One agent's claims on the mail server, when several bridges serve its mailbox. Cheap to
/// clone.
pub struct Claims<B> {
    common: Arc<Common<B>>,
    /// Where a won claim's ack goes.
    outbox: Outbox<B>,
}

impl<B> Clone for Claims<B> {
    fn clone(&self) -> Self {
        Claims {
            common: self.common.clone(),
            outbox: self.outbox.clone(),
        }
    }
}

/// A task another replica held, read back to be claimed again here.
pub(super) struct Reclaimed {
    pub task: Task,
    /// A cancel came for it meanwhile: it is answered cancelled (by the claim's winner).
    pub cancelled: bool,
}

impl<B: Backend> Claims<B> {
    pub(super) fn new(common: Arc<Common<B>>, outbox: Outbox<B>) -> Self {
        Claims { common, outbox }
    }

    fn spec(&self) -> Arc<AgentSpec> {
        self.common.spec()
    }

    /// Claims the task's mail on the server, retrying while the server cannot be reached;
    /// acknowledges the task when won (once: a claim kept across a restart is won again, and
    /// its ack is the same mail). `None` when cancelled first; `Err(why)` when the server
    /// refused the claim for good (its keyword table is full, the login may not set keywords):
    /// asking again would get the same answer, and the slot is wanted by other tasks.
    pub(super) async fn claim(
        &self,
        task: &Task,
        cancel: &CancellationToken,
    ) -> Option<Result<ClaimOutcome, String>> {
        let inner = &self.common;
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        loop {
            let tried = tokio::select! {
                r = inner.backend.claim(&task.extras.email_id) => r,
                _ = cancel.cancelled() => return None,
            };
            match tried {
                Ok(won @ (ClaimOutcome::Won | ClaimOutcome::TakenOver { .. })) => {
                    let by = self
                        .spec()
                        .replica
                        .as_ref()
                        .map(|r| r.name.clone())
                        .unwrap_or_default();
                    let detail = match &won {
                        ClaimOutcome::TakenOver { from } => {
                            format!("by replica {by}, taken over from {from}")
                        }
                        _ => format!("by replica {by}"),
                    };
                    tracing::debug!(%detail, "claim won");
                    self.common.note(task.row, "claimed", Some(&detail));
                    let ack = self.outbox.compose(&task.env, &task.key, Body::Ack, 0);
                    if let Err(e) = self.outbox.enqueue(task, &ack) {
                        tracing::warn!(error = %e, "could not queue task.ack");
                    }
                    return Some(Ok(won));
                }
                Ok(lost) => {
                    tracing::debug!(outcome = ?lost, "claim lost");
                    return Some(Ok(lost));
                }
                // Refused credentials are not the claim's fault: a password being rotated
                // works again within seconds of the reload, so the claim is tried again
                // (the intake is refused too, so nothing new waits behind it), not parked
                // until the next start.
                Err(e) if e.class() == ErrorClass::Permanent => {
                    return Some(Err(e.to_string()));
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "could not claim the task on the server; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = cancel.cancelled() => return None,
                    }
                }
            }
        }
    }

    /// Marks the answered task done on the server, so no other replica takes it over once
    /// its lease ends. A server that cannot be reached now (an outage, a restart) is asked
    /// again with backoff, and the lease renewed meanwhile, for as long as the bridge runs:
    /// given up after one try, the mark was lost, the lease ran out, and another replica ran
    /// the answered task again (the soak saw it after a mail-host restart).
    ///
    /// Only while this replica holds the claim: one starved past its lease (its renewals
    /// late) may finish its run after another replica took the task over. Marked done then,
    /// the task was lost: this replica's answer is not sent (the outbox finds the claim
    /// another's), and the holder, finding it done at its next renewal, stopped its run as
    /// taken over, unanswered. The holder answers instead; the answer recorded here stays
    /// unsent unless the claim comes back to this replica (see [`super::Outbox`]).
    ///
    /// False when another replica held the claim by then (this run's answer is not the one
    /// that leaves); true otherwise.
    pub(super) async fn mark_done(&self, task: &Task, replica: &ReplicaSpec) -> bool {
        let inner = &self.common;
        let email_id = &task.extras.email_id;
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
        let mut said = false;
        let mut renewed = tokio::time::Instant::now();
        loop {
            let e = match inner.backend.claim_done(email_id).await {
                Ok(true) => {
                    if said {
                        tracing::info!("the task is marked answered on the server");
                    }
                    return true;
                }
                Ok(false) => {
                    let why = "another replica took the task over while it ran here (this one's lease ran out); that replica answers it";
                    tracing::warn!("{why}; not marked answered here");
                    self.common
                        .note(task.row, "taken over before its answer left", Some(why));
                    return false;
                }
                Err(e) => e,
            };
            if e.class() == ErrorClass::Permanent {
                tracing::warn!(error = %e, "the server refuses to mark the task answered; another bridge may take it over after the lease (its answer has the same Message-ID)");
                self.common
                    .note(task.row, "done mark refused", Some(&e.to_string()));
                return true;
            }
            if !said {
                tracing::warn!(error = %e, "could not mark the task answered on the server; trying again until it can");
                said = true;
            }
            if renewed.elapsed() >= replica.lease / 3 {
                // Keeps the claim this replica's while the mark waits (a server back after
                // most of the lease is asked to renew it before the mark goes through).
                if let Ok(true) = inner.backend.renew_claim(email_id).await {
                    renewed = tokio::time::Instant::now();
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                _ = inner.abort.cancelled() => return true,
            }
        }
    }

    /// Renews the task's claim every third of its lease while it runs; returns (after
    /// stopping the task) only when another bridge holds the claim now.
    pub(super) async fn keep(
        &self,
        task: &Task,
        replica: &ReplicaSpec,
        cancel: &CancellationToken,
        lost: &AtomicBool,
    ) {
        // A renewal the server refuses for good is said once (the task runs on; its lease
        // may end, and another replica then take it over), then tried again quietly.
        let mut refused = false;
        // On a fixed cadence from the start, not a sleep after each renewal: a slow server
        // (a renewal taking a second or two) used to push every next renewal later, so a
        // claim aged towards its lease exactly when the server was struggling.
        let every = replica.lease / 3;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match self.common.backend.renew_claim(&task.extras.email_id).await {
                Ok(true) => tracing::debug!("claim renewed"),
                Ok(false) => {
                    tracing::warn!("another bridge took the task over (this one did not renew its claim in time); stopping it here");
                    lost.store(true, Ordering::SeqCst);
                    cancel.cancel();
                    // The run ends on the cancel; this branch then loses the race or wins it
                    // with the same outcome.
                    std::future::pending::<()>().await;
                }
                Err(e) if matches!(e.class(), ErrorClass::Permanent | ErrorClass::Auth) => {
                    if !refused {
                        tracing::error!(error = %e, "the server refuses to renew the task's claim; the task runs on, and may be taken over once its lease ends");
                        self.common
                            .note(task.row, "claim renewal refused", Some(&e.to_string()));
                    }
                    refused = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not renew the task's claim; trying again")
                }
            }
        }
    }

    /// The server refused this bridge's claim on the task for good: the task is set aside in
    /// the journal, unanswered (another bridge may hold it, and only a claim's winner answers),
    /// its slot free for others (the task has left its runs); `status` and `task show` say
    /// why, and the next start tries again.
    pub(super) fn park(&self, task: &Task, refused: &str) {
        let inner = &self.common;
        let reason = format!("the mail server refused this replica's claim: {refused}");
        tracing::error!(%reason, "task parked: not answered here; tried again at the next start");
        if let Err(e) = inner.journal.park(task.row, &reason) {
            tracing::warn!(error = %e, "could not record the task as parked");
        }
        self.common.note(task.row, "parked", Some(&reason));
        inner.events.emit(
            crate::events::Event::TaskParked,
            json!({"agent": self.spec().name, "from": task.env.from, "taskId": task.env.task_id,
                   "messageId": task.env.message_id, "reason": reason}),
        );
    }

    /// Another bridge runs the task: this one keeps it as a record of who does (no ack, no
    /// result), so a second delivery of it is a duplicate here too, and a takeover (or
    /// another delivery, once the claim ran out) brings it back as a task (the task has left
    /// its runs).
    pub(super) fn lost(&self, task: &Task, by: Option<&str>) {
        let inner = &self.common;
        let reason = match by {
            Some(by) => format!("claimed by replica {by}"),
            None => "claimed by another replica".to_string(),
        };
        tracing::info!(%reason, "another bridge runs this task");
        if let Err(e) = inner.journal.elsewhere(task.row, &reason) {
            tracing::warn!(error = %e, "could not record who runs the task");
        }
        self.common
            .note(task.row, "left to another replica", Some(&reason));
        inner.events.emit(
            crate::events::Event::MessageIgnored,
            json!({"agent": self.spec().name, "from": task.env.from, "taskId": task.env.task_id,
                   "intent": "task.dispatch", "messageId": task.env.message_id, "reason": reason}),
        );
    }

    /// A task another replica won comes back here (delivered again, or found among the
    /// claims that ran out): it is read back to be claimed again, on the mail the first claim
    /// was on, whichever copy brought it back; the claim finds it held (and it is left to the
    /// holder again), done, or run out (taken over and run here). A cancel that came
    /// meanwhile is kept: the task is then answered cancelled, by the claim's winner only.
    pub(super) fn reclaim(
        &self,
        row: i64,
        span: &tracing::Span,
    ) -> Result<Option<Reclaimed>, JournalError> {
        let inner = &self.common;
        let Some((key, mail)) = inner.journal.reclaim(row)? else {
            return Ok(None);
        };
        let what = "a task another replica held";
        let Some(task) = inner.read_back(row, key, &mail, what)? else {
            return Ok(None);
        };
        let env = &task.env;
        let cancelled = inner
            .journal
            .was_cancelled(&self.spec().name, &env.from, &env.task_id)?;
        tracing::info!(parent: span, row, "a task another replica held is claimed again here");
        inner.note(
            row,
            "claimed again",
            Some("delivered again, or its claim ran out"),
        );
        Ok(Some(Reclaimed { task, cancelled }))
    }
}
