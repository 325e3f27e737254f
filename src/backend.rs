//! The outbound seam: what dispatch asks of an agent's mailbox back-end (submit an answer,
//! fetch an attachment, feed a live stream, read an earlier thread, claim a task), and the
//! error and claim types it answers with. Below both `mailbox` (each back-end implements
//! [`Backend`] in its own folder) and `dispatch` (which holds one); it knows only the wire
//! model and the inbound model.

use crate::error::{Classify, ErrorClass};
use crate::inbound::Attachment;
use crate::protocol::RenderedMail;

/// Why a mailbox back-end could not take an answer (or give an attachment), classed for the
/// outbox's retry rule. Dispatch sees only this, whichever mailbox system is behind.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct BackendError {
    pub message: String,
    pub class: ErrorClass,
}

impl BackendError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> BackendError {
        BackendError {
            message: message.into(),
            class,
        }
    }
}

impl Classify for BackendError {
    fn class(&self) -> ErrorClass {
        self.class
    }
}

/// The agent's mailbox back-end as dispatch sees it (the daemon's `Outlet`; tests use a
/// fake): where answers are submitted, attachments downloaded, live streams fed and earlier
/// threads read. "Outbox" is only the journal's queue of answers and the worker that empties
/// it into this.
///
/// One trait for both uses: dispatch's engine is generic over it (`Engine<O: Backend>`), and
/// the outlet holds whichever back-end the mailbox's kind opens as a `dyn` of it, so its
/// futures are boxed (`async_trait`). A new method is declared here (with its default) and
/// forwarded once by the outlet.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Submits a rendered mail once, exactly as it is (a back-end without mail translates it
    /// into its own idiom, or drops what it has no place for).
    async fn submit(&self, mail: &RenderedMail) -> Result<(), BackendError>;

    /// Fetches an inbound attachment, at most `max` bytes.
    /// A back-end whose messages carry no attachments the bridge fetches refuses.
    async fn download(&self, attachment: &Attachment, max: u64) -> Result<Vec<u8>, BackendError> {
        let _ = (attachment, max);
        Err(BackendError::new(ErrorClass::Permanent, NO_ATTACHMENTS))
    }

    /// Opens a live stream for a task; `None` when there is no stream service (or it failed,
    /// which is logged: a task never fails for its stream).
    async fn open_stream(&self, task_id: &str, peer: &str) -> Option<String> {
        let _ = (task_id, peer);
        None
    }

    /// Feeds `(type, payload)` events to the stream until `events` closes; returns the number
    /// of appends made.
    async fn pump_stream(
        &self,
        stream_id: &str,
        events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> usize {
        let _ = (stream_id, events);
        0
    }

    /// The thread of an earlier task as (intent, from, text), oldest first; empty when there
    /// is no AAMP service or no such thread.
    async fn thread(&self, task_id: &str) -> Vec<Earlier> {
        let _ = task_id;
        Vec::new()
    }

    /// Closes the stream (with no terminal event of its own).
    async fn close_stream(&self, stream_id: &str, payload: serde_json::Value) {
        let _ = (stream_id, payload);
    }

    /// Claims a task's mail (`email_id`) for this bridge when several serve the mailbox
    /// (`dispatch::AgentSpec::replica`): won by exactly one of them. A back-end of one bridge always
    /// wins.
    async fn claim(&self, email_id: &str) -> Result<ClaimOutcome, BackendError> {
        let _ = email_id;
        Ok(ClaimOutcome::Won)
    }

    /// Renews this bridge's claim while its task runs; `Ok(false)` when another bridge holds
    /// it now (this one stopped renewing in time, and it was taken over).
    async fn renew_claim(&self, email_id: &str) -> Result<bool, BackendError> {
        let _ = email_id;
        Ok(true)
    }

    /// Marks a claimed task answered, so nobody takes it over: only while this bridge holds
    /// its claim. `Ok(false)`, nothing marked, when another bridge holds it now (it took the
    /// task over after this one's lease ran out, and answers it).
    async fn claim_done(&self, email_id: &str) -> Result<bool, BackendError> {
        let _ = email_id;
        Ok(true)
    }
}

/// What a back-end without attachments answers a download with.
pub const NO_ATTACHMENTS: &str = "this mailbox's messages carry no attachments the bridge fetches";

/// How a claim went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This bridge runs the task.
    Won,
    /// This bridge runs the task, after bridge `from` held it and stopped renewing (it died).
    TakenOver { from: String },
    /// Another bridge runs it (`by`: its name), or it was answered.
    Lost { by: Option<String> },
}

/// One earlier message of the task's thread (from the AAMP service's thread history).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Earlier {
    pub intent: String,
    pub from: String,
    pub text: String,
}
