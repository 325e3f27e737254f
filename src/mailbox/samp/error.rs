//! Why a SAMP call did not go through, classed for the intake's health and the outbox.

use crate::backend::BackendError;
use crate::error::{Classify, ErrorClass};
use crate::mailbox::intake::IntakeError;
use crate::mailbox::MailboxError;

/// Why a SAMP call did not go through, classed for the intake's health and the outbox.
#[derive(Debug, thiserror::Error)]
pub enum SampError {
    /// The HTTP link: unreachable, or an HTTP status (401: the key was refused).
    #[error(transparent)]
    Link(#[from] MailboxError),
    #[error("the SAMP server answered {method} with error {code}: {message}")]
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
    /// A tool's refusal (`isError`), with the server's code and words.
    #[error("SAMP {tool} refused: {code}: {message}")]
    Refused {
        tool: String,
        code: String,
        message: String,
        retry_after: Option<u64>,
    },
    /// A tool or argument the bridge needs and cannot find in `tools/list`.
    #[error("the SAMP server's tool {tool} cannot be used: {problem}")]
    Mapping { tool: String, problem: String },
    #[error("the SAMP server's answer to {what} was not understood: {detail}")]
    Protocol { what: String, detail: String },
}

impl Classify for SampError {
    fn class(&self) -> ErrorClass {
        match self {
            SampError::Link(e) => e.class(),
            // Internal errors may pass; a request the server does not take will not.
            SampError::Rpc { code, .. } => match code {
                -32603 => ErrorClass::Transient,
                _ => ErrorClass::Permanent,
            },
            SampError::Refused { code, .. } => match code.as_str() {
                "rate_limited" | "inbox_full" => ErrorClass::Transient,
                "unauthorized" | "agent_disabled" => ErrorClass::Auth,
                _ => ErrorClass::Permanent,
            },
            SampError::Mapping { .. } | SampError::Protocol { .. } => ErrorClass::Permanent,
        }
    }
}

impl From<SampError> for MailboxError {
    fn from(e: SampError) -> MailboxError {
        match e {
            SampError::Link(e) => e,
            e => MailboxError::Service {
                class: e.class(),
                detail: e.to_string(),
            },
        }
    }
}

impl From<SampError> for IntakeError {
    fn from(e: SampError) -> IntakeError {
        IntakeError::Mailbox(e.into())
    }
}

impl From<SampError> for BackendError {
    fn from(e: SampError) -> BackendError {
        let class = e.class();
        let message = match &e {
            SampError::Refused { code, .. } if code == "inbox_full" => format!(
                "{e} (the recipient has too many unread messages; the answer waits in the outbox and is sent once they read theirs)"
            ),
            _ => e.to_string(),
        };
        BackendError::new(class, message)
    }
}
