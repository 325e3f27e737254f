//! The SAMP back-end ("Agent Mailbox", clement10601/agent-mailbox): an agent's mailbox on an
//! MCP server over Streamable HTTP, with a bearer `amk_` key per agent. Polled (`check_inbox`
//! lists the unread messages, oldest first, and marks nothing read): each message is handed
//! to `deliver` (the journal, which de-duplicates by the message id) BEFORE it is acked, as
//! `ack` clears its subject, body and data; a bridge killed in between reads it again and the
//! journal knows it. There is no position file: the server's unread state is the position.
//!
//! At start (and after a refused key) `initialize`, `tools/list` and `whoami`: the tools'
//! arguments are mapped from their input schemas ([`tools`]), the agent's name and limits
//! read. The sender of a message is stamped by the server from the sender's key, so it is
//! believed as the provider says.
//!
//! How SAMP maps onto the bridge's model: a message is a task (`task.dispatch`; the subject is
//! its title, the body its text, the thread its Session-Key) unless its `data` says otherwise:
//! `data.aamp` may carry `intent`, `taskId`, `sessionKey` and `hopCount`; a message whose
//! `data.aamp.intent` is not `task.dispatch` is an answer and never starts a task. Answers go
//! back with `send_message` to the sender, `in_reply_to` the task (so in its thread), the
//! structured result in `data.aamp`. The TaskId is `samp:<thread_id>:<message_id>` unless the
//! sender gave one.
//!
//! Limits (the SAMP README): subject 200 characters, body 32 KB, data 64 KB of JSON, 30 sends
//! a minute. A longer body is cut at 32 KB with a note saying how long the answer was (not
//! split: parts would each count against the recipient's 10 unread and the send rate, and a
//! retry could double some); data over 64 KB loses its structured result, with a note. Sends
//! are paced to the server's rate (from `whoami`, else 30 a minute); `rate_limited` is waited
//! out (`retry_after_seconds`) and tried again, `inbox_full` is retried by the outbox with
//! backoff; `blocked` and `unknown_recipient` are permanent.

mod client;
mod error;
mod intake;
mod replies;
mod rpc;
pub mod tools;
mod wire;

pub use client::SampClient;
pub use error::SampError;
pub use intake::run_intake;
pub use replies::SampReplies;
pub use wire::{to_inbound, SampMessage};

use super::error::OpenError;
use super::outlet::{Intake, Opening, Outlet, Probe, System};
use super::MailboxError;

/// The mailbox system SAMP.
pub(crate) const SYSTEM: System = System {
    open: |o| Box::pin(open(o)),
    probe: Some(|config, name| Box::pin(probe(config, name))),
};

/// Opens an agent's SAMP mailbox: `send_message` replies out, the inbox polled in.
async fn open(o: Opening<'_>) -> Result<(Outlet, Intake), OpenError> {
    let agent = &o.agent.name;
    let client = SampClient::new(o.config.samp_account(o.agent.mailbox_name())?)
        .map_err(|source| OpenError::mailbox(format!("agent {agent:?}: SAMP setup"), source))?
        .with_questions(o.config.state().mailbox_file(agent, "samp", "questions"))
        .with_sent(o.config.state().mailbox_file(agent, "samp", "sent"));
    let outlet = Outlet::new(SampReplies::new(client.clone()));
    let intake = Intake::new(move |r| {
        Box::pin(run_intake(
            r.name, client, r.link, r.deliver, r.events, r.stop,
        ))
    });
    Ok((outlet, intake))
}

/// `doctor` and `init`: the server's tools mapped, `whoami` and the inbox read once.
async fn probe(
    config: &crate::config::LoadedConfig,
    name: &str,
) -> Result<Probe, crate::config::ConfigError> {
    let account = config.samp_account(name)?;
    let url = account.url.clone();
    let result = match SampClient::new(account) {
        Ok(client) => async {
            let ready = client.ready().await?;
            let (messages, more) = client.check_inbox().await?;
            Ok::<_, SampError>((ready, messages.len(), more))
        }
        .await
        .map_err(MailboxError::from),
        Err(e) => Err(e),
    };
    let address = result
        .as_ref()
        .map(|(r, _, _)| r.me.clone())
        .unwrap_or_else(|_| name.to_string());
    Ok(Probe {
        system: "SAMP",
        address,
        result: result.map(|(r, n, more)| {
            format!(
                "agent {} at {url}: tools mapped, {n}{} unread; SAMP has no push: polling",
                r.me,
                if more { "+" } else { "" }
            )
        }),
        auth_fix: "the server refused the key: put a working amk_ key in key_file (mode 0600), then `aamp-bridge reload`",
        other_fix: "check samp_url (the server's /mcp endpoint) and that the server runs",
    })
}

#[cfg(test)]
mod tests;
