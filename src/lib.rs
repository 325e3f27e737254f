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
//!            mail server (JMAP in, SMTP out)
//!                 │                     ▲
//!                 ▼                     │
//!   mailbox ── Inbound (parsed AAMP) ─┐ │  mailbox::Sender (implements dispatch::Outbox)
//!                                     ▼ │
//!   dispatch ── admit (policy, duplicates, expiry, queue) → ack → run → result
//!                                     │
//!                                     ▼
//!   runner ── child process in its own group (CLI profiles) → output or RunError
//! ```
//!
//! - [`protocol`]: the AAMP wire model, pure: intents, headers, subjects, body templates and
//!   RFC 5322 rendering/reading. Shared vocabulary of `mailbox` and `dispatch`.
//! - [`mailbox`]: the only code that knows mail: JMAP session, `Email/changes` polling from a
//!   persisted cursor, Inbox and address filtering, SMTP submission.
//! - [`dispatch`]: what to do with a message: sender policy, de-duplication, expiry, a bounded
//!   queue, the ack → run → result lifecycle, cancel. Pure where it can be ([`dispatch::admit`]).
//! - [`runner`]: the only code that knows agents: CLI profiles, templates, process groups.
//! - [`daemon`]: wires the layers per agent under one cancellation token and task tracker.
//! - [`cli`], [`telemetry`]: thin shells.
//! - [`config`], [`error`], [`events`]: the config file, error classes, JSON-lines events.

pub mod cli;
pub mod config;
pub mod daemon;
pub mod dispatch;
pub mod error;
pub mod events;
pub mod mailbox;
pub mod protocol;
pub mod runner;
pub mod telemetry;
