//! One mailbox put into the config from its answers: registered with the AAMP service when it
//! is new, tested live, its password held back until every mailbox passed.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::{mailbox_config::mailbox_config, test_mailbox, view, MailboxAnswers, Progress};
use crate::config::{self, Config, MailboxConfig};

/// Puts one mailbox into `config` from its answers, registers it when it is new with the AAMP
/// service, and tests it live; a password given in the answers is queued for `secrets`.
/// `owner` names it in an error ("agent helper"). Returns its address and how it came
/// (`registered`, `reused`, `account`, ...).
#[allow(clippy::too_many_arguments)]
pub(super) async fn set_up_mailbox(
    config: &mut Config,
    path: &Path,
    mailbox_name: &str,
    owner: &str,
    answers: &MailboxAnswers,
    aamp_url: Option<&str>,
    progress: &dyn Progress,
    secrets: &mut Vec<(PathBuf, Vec<u8>)>,
) -> anyhow::Result<(String, &'static str)> {
    let mailbox = mailbox_config(
        mailbox_name,
        answers,
        aamp_url,
        config.mailboxes.get(mailbox_name),
    )?;
    let mut how = match answers {
        MailboxAnswers::Register { .. } => "registered",
        MailboxAnswers::Existing { .. } => "account",
        MailboxAnswers::Keep => "kept",
        MailboxAnswers::Asmtp { .. } => "asmtp",
        MailboxAnswers::Amp { .. } => "amp",
        MailboxAnswers::Samp { .. } => "samp",
    };
    config.mailboxes.insert(mailbox_name.to_string(), mailbox);
    // Register now, unless a credentials file from an earlier run is there.
    if let Some(registration) = view(path, config).registration(mailbox_name) {
        progress.step(&format!(
            "registering a mailbox for {mailbox_name} with {}",
            registration.aamp_url
        ));
        let credentials = crate::mailbox::aamp::helper::register(&registration)
            .await
            .with_context(|| format!("registering a mailbox with {}", registration.aamp_url))?;
        progress.done(&format!("registered {}", credentials.email));
        // Written at once: a registration cannot be undone, and its code is used up.
        config::write_credentials(&registration.credentials_file, &credentials)
            .with_context(|| format!("cannot write {}", registration.credentials_file.display()))?;
    } else if how == "registered" {
        how = "reused";
    }
    progress.step(&format!("testing {mailbox_name}'s mailbox"));
    let email = test_mailbox(&view(path, config), mailbox_name)
        .await
        .with_context(|| format!("{owner}: the mailbox does not work yet"))?;
    let over = match answers {
        MailboxAnswers::Asmtp { .. } => "its ASMTP operator",
        MailboxAnswers::Amp { .. } => "its AMP broker",
        MailboxAnswers::Samp { .. } => "its SAMP server",
        _ => "JMAP and SMTP",
    };
    progress.done(&format!("{mailbox_name}: {email} answers {over}"));
    let entry = config
        .mailboxes
        .get_mut(mailbox_name)
        .and_then(MailboxConfig::aamp_mut);
    if let Some(entry) = entry {
        if let Some(password) = entry.password.take() {
            let file = PathBuf::from(format!("{mailbox_name}.password"));
            let dir = path.parent().unwrap_or(Path::new("."));
            secrets.push((dir.join(&file), password.into_bytes()));
            entry.password_file = Some(file);
        }
    }
    Ok((email, how))
}
