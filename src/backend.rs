//! The outbound seam: what dispatch asks of an agent's mailbox back-end (submit an answer,
//! fetch an attachment, feed a live stream, read an earlier thread, claim a task), and the
//! error and claim types it answers with. Below both `mailbox` (each back-end implements
//! [`Backend`] in its own folder) and `dispatch` (which holds one); it knows only the wire
//! model and the inbound model.

use std::future::Future;

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
pub trait Backend: Send + Sync + 'static {
    /// Submits a rendered mail once, exactly as it is (a back-end without mail translates it
    /// into its own idiom, or drops what it has no place for).
    fn submit(&self, mail: &RenderedMail) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Fetches an inbound attachment, at most `max` bytes.
    /// A back-end whose messages carry no attachments the bridge fetches refuses.
    fn download(
        &self,
        attachment: &Attachment,
        max: u64,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> + Send {
        let _ = (attachment, max);
        async { Err(BackendError::new(ErrorClass::Permanent, NO_ATTACHMENTS)) }
    }

    /// Opens a live stream for a task; `None` when there is no stream service (or it failed,
    /// which is logged: a task never fails for its stream).
    fn open_stream(
        &self,
        task_id: &str,
        peer: &str,
    ) -> impl Future<Output = Option<String>> + Send {
        let _ = (task_id, peer);
        async { None }
    }

    /// Feeds `(type, payload)` events to the stream until `events` closes; returns the number
    /// of appends made.
    fn pump_stream(
        &self,
        stream_id: &str,
        events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> impl Future<Output = usize> + Send {
        let _ = (stream_id, events);
        async { 0 }
    }

    /// The thread of an earlier task as (intent, from, text), oldest first; empty when there
    /// is no AAMP service or no such thread.
    fn thread(&self, task_id: &str) -> impl Future<Output = Vec<Earlier>> + Send {
        let _ = task_id;
        async { Vec::new() }
    }

    /// Closes the stream (with no terminal event of its own).
    fn close_stream(
        &self,
        stream_id: &str,
        payload: serde_json::Value,
    ) -> impl Future<Output = ()> + Send {
        let _ = (stream_id, payload);
        async {}
    }

    /// Claims a task's mail (`email_id`) for this bridge when several serve the mailbox
    /// (`dispatch::AgentSpec::replica`): won by exactly one of them. A back-end of one bridge always
    /// wins.
    fn claim(
        &self,
        email_id: &str,
    ) -> impl Future<Output = Result<ClaimOutcome, BackendError>> + Send {
        let _ = email_id;
        async { Ok(ClaimOutcome::Won) }
    }

    /// Renews this bridge's claim while its task runs; `Ok(false)` when another bridge holds
    /// it now (this one stopped renewing in time, and it was taken over).
    fn renew_claim(
        &self,
        email_id: &str,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send {
        let _ = email_id;
        async { Ok(true) }
    }

    /// Marks a claimed task answered: nobody takes it over.
    fn claim_done(&self, email_id: &str) -> impl Future<Output = Result<(), BackendError>> + Send {
        let _ = email_id;
        async { Ok(()) }
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
