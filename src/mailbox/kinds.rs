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

/// What trying a mailbox's credentials found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoginTried {
    /// They work: what was read with them.
    Works(String),
    /// The server refused them.
    Refused(String),
    /// They could not be tried (the server did not answer, the settings do not hold).
    Untried(String),
}

/// Tries the named mailbox's credentials as they are on disk now, with one read: its
/// system's probe, or an AAMP mailbox's JMAP login. What `reload` says of new credentials.
pub async fn try_login(config: &LoadedConfig, name: &str) -> LoginTried {
    use crate::error::{Classify as _, ErrorClass};
    let result = match probe(config, name).await {
        Some(Ok(probe)) => probe.result,
        Some(Err(e)) => return LoginTried::Untried(e.problem),
        None => match config.account(name) {
            Ok(account) => match aamp::Reader::new(account) {
                Ok(mut reader) => reader
                    .connect()
                    .await
                    .map(|()| "logged in over JMAP".to_string()),
                Err(e) => Err(e),
            },
            Err(e) => return LoginTried::Untried(e.problem),
        },
    };
    match result {
        Ok(read) => LoginTried::Works(read),
        Err(e) if e.class() == ErrorClass::Auth => LoginTried::Refused(e.to_string()),
        Err(e) => LoginTried::Untried(e.to_string()),
    }
}
