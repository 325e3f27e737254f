//! # aamp-bridge
//!
//! Connects the coding agents on a machine to mailboxes: tasks arrive as AAMP mail (ordinary
//! email with `X-AAMP-*` headers), run on an agent, and go back as mail.
//!
//! ## Architecture map
//!
//! Data flows one way, and each layer knows only its own world:
//!
//! ```text
//!     mail server (JMAP + push in, SMTP out)      AAMP service (helper API: streams, ...)
//!                 │                     ▲                      ▲
//!                 ▼                     │                      │
//!   mailbox ── Inbound (parsed AAMP) ─┐ │  mailbox::Sender (implements dispatch::Outbox:
//!                                     │ │  mail out, attachments, streams, thread)
//!                                     ▼ │
//!   dispatch ── admit (policy, duplicates, expiry, queue) → ack → run → result
//!                                     │ ▲ stream events, questions (help_needed)
//!                                     ▼ │
//!   runner ── agent in its own process group: ACP session or CLI profile → answer or RunError
//! ```
//!
//! - [`protocol`]: the AAMP wire model, pure: intents, headers, subjects, body templates,
//!   RFC 5322 rendering/reading (with attachments), timestamps. Shared vocabulary of `mailbox`
//!   and `dispatch`.
//! - [`mailbox`]: the only code that knows mail and the AAMP service: JMAP session and
//!   `Email/changes` from a persisted cursor (with recovery when the server lost the state),
//!   push over WebSocket or EventSource, Inbox and address filtering, attachments, SMTP
//!   submission with Sent copies, the helper API (streams, registration, thread, directory),
//!   and the link state a status command reads.
//! - [`dispatch`]: what to do with a message: sender policy, de-duplication, expiry, a bounded
//!   queue, one task at a time per Session-Key, the ack → run → result lifecycle, cancel,
//!   questions to the dispatcher, the prompt. Pure where it can be ([`dispatch::admit`]).
//! - [`runner`]: the only code that knows agents: ACP sessions (`runner::acp`), CLI profiles
//!   and their stream formats (`runner::stream`), templates, process groups, the agent scan.
//! - [`daemon`]: wires the layers per agent under one cancellation token and task tracker.
//! - [`cli`], [`telemetry`]: thin shells.
//! - [`config`], [`error`], [`events`]: the config file, error classes, JSON-lines events.

pub mod backoff;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod dispatch;
pub mod error;
pub mod events;
pub mod fsio;
pub mod mailbox;
pub mod protocol;
pub mod runner;
pub mod telemetry;
