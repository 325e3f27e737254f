//! The AAMP wire model: intents, headers, subjects and body templates, and their RFC 5322 form.
//! Pure code with no I/O, shared by `mailbox` (which moves the bytes) and `dispatch` (which
//! decides what to answer). Follows the reference SDKs where they agree and the Python/Go SDKs
//! where they differ (`-` in result subjects, `X-AAMP-ErrorMsg` on rejected results).

pub mod chain;
pub mod codec;
pub mod dsn;
mod json;
pub mod message;
pub mod rfc5322;
pub mod sse;
mod text;
pub mod time;
pub mod usage;
pub mod usage_wire;

pub use chain::Chain;
pub use message::{
    address, AampMessage, Body, Dispatch, Envelope, HelpNeeded, Intent, MailView, NotAamp,
    Priority, Status, TaskResult, VERSION,
};
pub use rfc5322::{parse_raw, render, render_with, OutgoingFile, RenderedMail};
pub use usage::Usage;
