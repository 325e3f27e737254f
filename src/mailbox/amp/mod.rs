//! The AMP back-end (Agent Mailer Protocol, the study8677/agent-mailer broker): an agent's
//! mailbox on an HTTP broker, polled (the broker has no push). The inbox is followed by
//! position, not by its read flag (a person who opens a message in the broker's console marks
//! it read): a position `(created_at, ids at it)` kept on disk, moved only after every message
//! before it was handed to `deliver` (the journal, which also de-duplicates). The broker renders
//! markdown for every message it returns, so a poll first asks for the visible and the unread
//! message counts alone (a page past the end: nothing rendered) and reads the newest messages
//! only when one changed, a page the size of the change. A message archived or trashed as
//! another arrives (and is opened in the console) leaves both counts as they were, so the
//! newest messages are also read at each start and every `recheck` (default five minutes).
//! Delivered messages are marked read, as a hint for people. At the first start the unread
//! messages already waiting are the backlog, answered.
//!
//! Answers go back as a `reply` to the message, in its thread. The broker has no idempotency
//! key: the thread is read first (for a bridge Message-ID in an HTML comment at the end of a
//! reply) unless this process read the message and has not tried to answer with this mail
//! before, the common case, where the reply is posted at once.
//!
//! How AMP maps onto the bridge's model: every message to the agent is a task
//! (`task.dispatch`: the subject is its title, the body its text, the thread its Session-Key,
//! so a reply in the thread continues the agent's session); `task.result`,
//! `task.help_needed` and `card.response` become replies titled `Re: <subject>`; acks and
//! streams have no AMP equivalent and are dropped. The TaskId is `amp:<thread_id>:<message_id>`.

mod client;
mod intake;
mod replies;
mod wire;

pub use client::AmpClient;
pub use intake::{run_intake, Position, PositionFile};
pub use replies::AmpReplies;
pub use wire::{to_inbound, AmpMessage, InboxPage};

use crate::config::{ConfigError, LoadedConfig};
use crate::mailbox::error::OpenError;
use crate::mailbox::outlet::{Intake, Opening, Outlet, Probe, System};

/// The mailbox system AMP.
pub(crate) const SYSTEM: System = System {
    open: |o| Box::pin(open(o)),
    probe: Some(|config, name| Box::pin(probe(config, name))),
};

/// Opens an agent's AMP mailbox: replies out, the inbox polled in.
async fn open(o: Opening<'_>) -> Result<(Outlet, Intake), OpenError> {
    let (state, agent) = (o.config.state(), &o.agent.name);
    let client = AmpClient::new(o.config.amp_account(o.agent.mailbox_name())?)
        .map_err(|source| OpenError::mailbox(format!("agent {agent:?}: AMP setup"), source))?
        .with_questions(state.mailbox_file(agent, "amp", "questions"));
    let position = PositionFile::new(state.mailbox_file(agent, "amp", "position"));
    let outlet = Outlet::new(AmpReplies::new(client.clone()));
    let intake = Intake::new(move |r| {
        Box::pin(run_intake(
            r.name, client, r.link, position, r.deliver, r.events, r.stop,
        ))
    });
    Ok((outlet, intake))
}

/// `doctor` and `init`: the unread messages counted once.
async fn probe(config: &LoadedConfig, name: &str) -> Result<Probe, ConfigError> {
    let account = config.amp_account(name)?;
    let (url, address) = (account.url.clone(), account.address.clone());
    let result = match AmpClient::new(account) {
        Ok(client) => client.unread().await,
        Err(e) => Err(e),
    };
    Ok(Probe {
        system: "AMP",
        address,
        result: result.map(|m| {
            format!(
                "read the agent's inbox at {url} ({} unread); AMP has no push: polling",
                m.len()
            )
        }),
        auth_fix: "check api_key_file and agent_id (the key's user must own the agent)",
        other_fix: "check amp_url and that the broker is running",
    })
}

#[cfg(test)]
mod tests;
