//! The one place a mailbox's kind is chosen: each kind's [`System`], from its folder. A new
//! mailbox system is its folder and one line here.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::error::{MailboxError, OpenError};
use super::finding::{Finding, Verdict};
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
/// (checked part by part instead: [`check`]); a config error when its settings do not hold.
pub async fn probe(config: &LoadedConfig, name: &str) -> Option<Result<Probe, ConfigError>> {
    let probe = system(config.kind(name)).probe?;
    Some(probe(config, name).await)
}

/// Checks the named mailbox as `doctor` does, part by part: its system's probe, or an AAMP
/// mailbox's logins and what the bridge relies on there (its sender evidence only where
/// `tasks_arrive`). An error only when an AAMP mailbox's clients cannot be made at all.
pub async fn check(
    config: &LoadedConfig,
    name: &str,
    tasks_arrive: bool,
) -> Result<Vec<Finding>, MailboxError> {
    use crate::error::{Classify as _, ErrorClass};
    let config_failed =
        |e: ConfigError| vec![Finding::new("config", Verdict::Fail, e.problem, e.fix)];
    let Some(probe) = probe(config, name).await else {
        return match config.account(name) {
            Ok(account) => aamp::probe::check(&account, tasks_arrive).await,
            Err(e) => Ok(config_failed(e)),
        };
    };
    let probe = match probe {
        Ok(probe) => probe,
        Err(e) => return Ok(config_failed(e)),
    };
    let finding = match probe.result {
        Ok(read) => Finding::new(probe.system, Verdict::Ok, read, ""),
        Err(e) => {
            let fix = match e.class() {
                ErrorClass::Auth => probe.auth_fix,
                _ => probe.other_fix,
            };
            Finding::new(probe.system, Verdict::Fail, e.to_string(), fix)
        }
    };
    Ok(vec![finding])
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
            Ok(account) => aamp::probe::jmap_login(&account)
                .await
                .map(|_| "logged in over JMAP".to_string()),
            Err(e) => return LoginTried::Untried(e.problem),
        },
    };
    match result {
        Ok(read) => LoginTried::Works(read),
        Err(e) if e.class() == ErrorClass::Auth => LoginTried::Refused(e.to_string()),
        Err(e) => LoginTried::Untried(e.to_string()),
    }
}
