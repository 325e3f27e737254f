//! One mailbox put into the config from its answers: registered with the AAMP service when it
//! is new, tested live, its password held back until every mailbox passed.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::{mailbox_config::mailbox_config, test_mailbox, view, MailboxAnswers, Progress};
use crate::config::{self, Config, MailboxConfig};

/// What setting up each mailbox of one `apply` needs, and what it holds back until the end.
pub(super) struct Setup<'a> {
    /// The config file: credential and password files go beside it.
    pub path: &'a Path,
    pub aamp_url: Option<&'a str>,
    pub progress: &'a dyn Progress,
    /// Passwords to write once every mailbox passed its test: (file, bytes).
    pub secrets: Vec<(PathBuf, Vec<u8>)>,
}

impl Setup<'_> {
    /// Puts one mailbox into `config` from its answers, registers it when it is new with the
    /// AAMP service, and tests it live; a password given in the answers is queued for
    /// `secrets`. `owner` names it in an error ("agent helper"). Returns its address and how
    /// it came (`registered`, `reused`, `account`, ...).
    pub async fn mailbox(
        &mut self,
        config: &mut Config,
        mailbox_name: &str,
        owner: &str,
        answers: &MailboxAnswers,
    ) -> anyhow::Result<(String, &'static str)> {
        let mailbox = mailbox_config(
            mailbox_name,
            answers,
            self.aamp_url,
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
        if !self.register(config, mailbox_name).await? && how == "registered" {
            how = "reused";
        }
        self.progress
            .step(&format!("testing {mailbox_name}'s mailbox"));
        let email = test_mailbox(&view(self.path, config), mailbox_name)
            .await
            .with_context(|| format!("{owner}: the mailbox does not work yet"))?;
        let over = match answers {
            MailboxAnswers::Asmtp { .. } => "its ASMTP operator",
            MailboxAnswers::Amp { .. } => "its AMP broker",
            MailboxAnswers::Samp { .. } => "its SAMP server",
            _ => "JMAP and SMTP",
        };
        self.progress
            .done(&format!("{mailbox_name}: {email} answers {over}"));
        self.hold_password(config, mailbox_name);
        Ok((email, how))
    }

    /// Registers the mailbox now, unless it is not one to register or a credentials file from
    /// an earlier run is there. Whether it registered.
    async fn register(&self, config: &Config, mailbox_name: &str) -> anyhow::Result<bool> {
        let Some(registration) = view(self.path, config).registration(mailbox_name) else {
            return Ok(false);
        };
        self.progress.step(&format!(
            "registering a mailbox for {mailbox_name} with {}",
            registration.aamp_url
        ));
        let credentials = crate::mailbox::aamp::helper::register(&registration)
            .await
            .with_context(|| format!("registering a mailbox with {}", registration.aamp_url))?;
        self.progress
            .done(&format!("registered {}", credentials.email));
        // Written at once: a registration cannot be undone, and its code is used up.
        config::write_credentials(&registration.credentials_file, &credentials)
            .with_context(|| format!("cannot write {}", registration.credentials_file.display()))?;
        Ok(true)
    }

    /// A password given in the answers leaves the config for `<name>.password`, written once
    /// every mailbox passed its test.
    fn hold_password(&mut self, config: &mut Config, mailbox_name: &str) {
        let entry = config
            .mailboxes
            .get_mut(mailbox_name)
            .and_then(MailboxConfig::aamp_mut);
        if let Some(entry) = entry {
            if let Some(password) = entry.password.take() {
                let file = PathBuf::from(format!("{mailbox_name}.password"));
                let dir = self.path.parent().unwrap_or(Path::new("."));
                self.secrets.push((dir.join(&file), password.into_bytes()));
                entry.password_file = Some(file);
            }
        }
    }
}
