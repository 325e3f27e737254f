//! The one place a mailbox's kind is chosen: each kind's [`System`], from its folder. A new
//! mailbox system is its folder and one line here.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::error::OpenError;
use super::outlet::{Intake, Opening, Outlet, Probe, System};
use super::{aamp, amp, asmtp, samp};
use crate::config::{AgentConfig, ConfigError, LoadedConfig, MailboxKind};
use crate::events::Events;

/// The mailbox system of each kind: the one place a kind is chosen.
pub fn system(kind: MailboxKind) -> &'static System {
    match kind {
        MailboxKind::Aamp => &aamp::SYSTEM,
        MailboxKind::Asmtp => &asmtp::SYSTEM,
        MailboxKind::Amp => &amp::SYSTEM,
        MailboxKind::Samp => &samp::SYSTEM,
    }
}

/// Reads the named mailbox once when its system has a probe; `None` for an AAMP mailbox
/// (checked over JMAP and SMTP instead); a config error when its settings do not hold.
pub async fn probe(config: &LoadedConfig, name: &str) -> Option<Result<Probe, ConfigError>> {
    let probe = system(config.kind(name)).probe?;
    Some(probe(config, name).await)
}

/// Opens an agent's mailbox: its outlet and its intake. Work a back-end keeps beside the
/// outbox (AAMP's Sent copies) runs on `services` until `outbox_stop`.
pub async fn open(
    config: &LoadedConfig,
    agent: &AgentConfig,
    events: Events,
    services: &TaskTracker,
    outbox_stop: &CancellationToken,
) -> Result<(Outlet, Intake), OpenError> {
    let open = system(config.kind(agent.mailbox_name())).open;
    open(Opening {
        config,
        agent,
        events,
        services,
        outbox_stop,
    })
    .await
}
