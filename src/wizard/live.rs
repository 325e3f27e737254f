//! Mailboxes tested live, as the bridge will use them, before anything is written.

use std::path::Path;

use anyhow::Context as _;

use super::{empty_config, existing, mailbox_config::mailbox_config, view, MailboxAnswers};
use crate::config::LoadedConfig;

/// Logs in over JMAP and SMTP with a mailbox of `config`, as the bridge will (or reads an
/// ASMTP, AMP or SAMP mailbox once).
pub async fn test_mailbox(config: &LoadedConfig, name: &str) -> anyhow::Result<String> {
    if let Some(probe) = crate::mailbox::probe(config, name).await {
        let probe = probe?;
        probe.result.with_context(|| {
            format!(
                "reading the {} mailbox of {} failed: {}",
                probe.system, probe.address, probe.other_fix
            )
        })?;
        return Ok(probe.address);
    }
    let account = config.account(name)?;
    crate::mailbox::aamp::login(&account)
        .await
        .map_err(|failed| MailboxTestFailed {
            what: failed.what,
            error: failed.error,
            fix: failed.fix,
        })?;
    Ok(account.email)
}

/// Tests one agent's mailbox answers before anything is written (what `init` does right after
/// the person gave them, so a failure is asked again, not the end of the wizard). The address
/// that answered, or why not ([`MailboxTestFailed`] for a login that failed).
pub async fn test_answers(
    path: &Path,
    name: &str,
    answers: &MailboxAnswers,
    aamp_url: Option<&str>,
) -> anyhow::Result<String> {
    let mut config = existing(path)?
        .map(|c| c.config)
        .unwrap_or_else(empty_config);
    let previous = config.mailboxes.get(name).cloned();
    let mailbox = mailbox_config(name, answers, aamp_url, previous.as_ref())?;
    config.mailboxes.insert(name.to_string(), mailbox);
    test_mailbox(&view(path, &config), name).await
}

/// A mailbox that failed its live test: which login, the server's own answer, what to do.
#[derive(Debug, thiserror::Error)]
#[error("{what} failed: {error}\n  fix: {fix}")]
pub struct MailboxTestFailed {
    pub what: String,
    /// Not a `source`: its words are in the text already.
    pub error: crate::mailbox::MailboxError,
    pub fix: String,
}
