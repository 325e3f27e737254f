//! The ASMTP back-end (Agent Simple Mail Transfer Protocol, Robot Networks): an agent's
//! mailbox on an ASMTP operator. Mail is read by keyset catch-up over `GET /mailbox` from a
//! watermark `(created_at, envelope_id)` kept on disk and moved only after every envelope
//! before it was delivered (the journal), then fetched with `GET /messages?ids=` (which marks
//! it read). The operator's WebSocket (`/connect`, push only, no replay) wakes the catch-up;
//! after a dropped connection the catch-up runs again, so nothing pushed meanwhile is missed;
//! while it is down the mailbox is polled. Answers are envelopes in reply (`in_reply_to`,
//! `references`) whose client-supplied id is derived from the bridge's Message-ID and whose
//! body is the same on every attempt, so a resend is a no-op at the operator (its idempotency).
//!
//! The mapping: every envelope to the agent is a task (`subject` → title, `text` parts → its
//! text, `data` parts as JSON below it; the thread's root → Session-Key); `task.result`,
//! `task.help_needed` and `card.response` go back as replies (a structured result also as a
//! `data` part); acks and streams have no ASMTP equivalent and are dropped. The operator
//! stamps `from` from the sender's token, so the sender is believed. TaskId: `asmtp:<id>`.

mod client;
mod intake;
mod replies;
mod wire;

pub use client::{AsmtpClient, Threads};
pub use intake::{run_intake, WatermarkFile};
pub use replies::AsmtpReplies;
pub use wire::{envelope_id, to_inbound, AsmtpEnvelope, Header, Watermark, BODY_LIMIT, FILE_LIMIT};

use crate::config::{ConfigError, LoadedConfig};
use crate::mailbox::error::OpenError;
use crate::mailbox::outlet::{Intake, Opening, Outlet, Probe, System};

/// The mailbox system ASMTP.
pub(crate) const SYSTEM: System = System {
    open: |o| Box::pin(open(o)),
    probe: Some(|config, name| Box::pin(probe(config, name))),
};

/// Opens an agent's ASMTP mailbox: reply envelopes out, the catch-up and push in.
async fn open(o: Opening<'_>) -> Result<(Outlet, Intake), OpenError> {
    let (state, agent) = (o.config.state(), &o.agent.name);
    let file = |what| state.mailbox_file(agent, "asmtp", what);
    let client = AsmtpClient::new(o.config.asmtp_account(o.agent.mailbox_name())?)
        .map_err(|source| OpenError::mailbox(format!("agent {agent:?}: ASMTP setup"), source))?
        .with_threads(file("threads"))
        .with_questions(file("questions"));
    let watermark = WatermarkFile::new(file("watermark"));
    let outlet = Outlet::new(AsmtpReplies::new(client.clone()));
    let intake = Intake::new(move |r| {
        Box::pin(run_intake(
            r.name, client, r.link, watermark, r.deliver, r.events, r.stop,
        ))
    });
    Ok((outlet, intake))
}

/// `doctor` and `init`: the newest envelope read once.
async fn probe(config: &LoadedConfig, name: &str) -> Result<Probe, ConfigError> {
    let account = config.asmtp_account(name)?;
    let (url, address) = (account.url.clone(), account.handle.clone());
    let result = match AsmtpClient::new(account) {
        Ok(client) => match client.newest().await {
            Ok(_) => owner_check(&client).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    Ok(Probe {
        system: "ASMTP",
        address,
        result: result.map(|_| format!("read the agent's mailbox at {url}")),
        auth_fix: "put the token of the mailbox's handle in token_file (mode 0600): the operator refused it, or it is another agent's",
        other_fix: "check asmtp_url and that the operator is running",
    })
}

/// The token in `token_file` must be `handle`'s: another agent's reads and answers as that
/// agent (the operator stamps the sender from the token), so `doctor` fails it, naming both.
async fn owner_check(client: &AsmtpClient) -> Result<(), super::MailboxError> {
    let Some(owner) = client.token_owner().await? else {
        return Ok(());
    };
    if owner.eq_ignore_ascii_case(client.handle()) {
        return Ok(());
    }
    Err(super::MailboxError::Service {
        class: crate::error::ErrorClass::Auth,
        detail: format!(
            "the token in token_file belongs to {owner}, not to handle {}: the bridge would read and answer {owner}'s mail as {owner}; put {}'s token in token_file, or set handle = \"{owner}\" if that agent is meant",
            client.handle(),
            client.handle()
        ),
    })
}

#[cfg(test)]
mod tests;
