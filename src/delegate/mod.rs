//! The MCP server the bridge gives each agent it runs, so a running task can hand work to
//! other agents (`docs/delegation.md`). Two halves meet on a Unix socket in the bridge's
//! private state directory:
//!
//! - [`relay`]: in the daemon, the socket's listener. Each request names a credential; only a
//!   running task's grant ([`dispatch::delegations::Registry`](crate::dispatch::delegations))
//!   answers to it, only for a process of this user that carries that task's run tag, and only
//!   while the run lasts. The tools themselves run in the agent's engine
//!   ([`dispatch::delegations::Delegator`](crate::dispatch::delegations::Delegator)).
//! - [`stdio`]: `aamp-bridge mcp`, the MCP server (the official SDK, `rmcp`, over stdio) an
//!   agent starts as one of its MCP servers; it finds the socket and the credential in its
//!   environment (never in its arguments) and relays each tool call.
//!
//! One request or answer is one line of JSON: `{"token", "tool", "args"}` in,
//! `{"ok": true, "text"}` or `{"ok": false, "error"}` out.

pub mod relay;
pub mod stdio;

/// The longest request or answer line read (a task's text rides in it).
pub const MAX_LINE: usize = 4 * 1024 * 1024;
