//! An agent's mailbox answers as the `[mailboxes.NAME]` entry of the config.

use std::path::PathBuf;

use anyhow::{bail, Context as _};

use super::{MailboxAnswers, Servers};
use crate::config::{AampMailbox, MailboxConfig, MailboxKind};

pub(super) fn service_host(aamp_url: &str) -> Option<String> {
    url::Url::parse(aamp_url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
}

/// The mailbox config for an agent's answers, starting from what the config had.
pub(super) fn mailbox_config(
    name: &str,
    answers: &MailboxAnswers,
    aamp_url: Option<&str>,
    previous: Option<&MailboxConfig>,
) -> anyhow::Result<MailboxConfig> {
    let Some(kind) = answers.kind() else {
        return previous.cloned().with_context(|| format!("agent {name}: mailbox \"keep\", but the config has no mailbox {name:?} to keep: register one or give an existing account"));
    };
    let mut mailbox = start(kind, previous);
    match (answers, &mut mailbox) {
        (
            MailboxAnswers::Asmtp {
                asmtp_url,
                handle,
                token_file,
                insecure_tls,
            },
            MailboxConfig::Asmtp(m),
        ) => {
            m.asmtp_url = Some(asmtp_url.clone());
            m.handle = Some(handle.clone());
            m.token_file = Some(token_file.clone());
            m.common.insecure_tls = *insecure_tls;
        }
        (
            MailboxAnswers::Amp {
                amp_url,
                address,
                agent_id,
                api_key_file,
                insecure_tls,
            },
            MailboxConfig::Amp(m),
        ) => {
            m.amp_url = Some(amp_url.clone());
            m.address = Some(address.clone());
            m.agent_id = Some(agent_id.clone());
            m.api_key_file = Some(api_key_file.clone());
            m.common.insecure_tls = *insecure_tls;
        }
        (
            MailboxAnswers::Samp {
                samp_url,
                key_file,
                insecure_tls,
            },
            MailboxConfig::Samp(m),
        ) => {
            m.samp_url = Some(samp_url.clone());
            m.key_file = Some(key_file.clone());
            m.common.insecure_tls = *insecure_tls;
        }
        (MailboxAnswers::Register { .. }, MailboxConfig::Aamp(m)) => {
            registered(name, answers, aamp_url, m)?;
        }
        (MailboxAnswers::Existing { .. }, MailboxConfig::Aamp(m)) => {
            existing_account(name, answers, aamp_url, m)?;
        }
        _ => unreachable!("a mailbox of the kind answered"),
    }
    Ok(mailbox)
}

/// What the config had when it is of the kind answered; else a mailbox of that kind with the
/// keys every kind has kept.
fn start(kind: MailboxKind, previous: Option<&MailboxConfig>) -> MailboxConfig {
    match previous {
        Some(m) if m.kind() == kind => m.clone(),
        _ => MailboxConfig::new(
            kind,
            previous.map(|m| m.common().clone()).unwrap_or_default(),
        ),
    }
}

/// A mailbox registered with the AAMP service: its credentials file, not an account's keys.
fn registered(
    name: &str,
    answers: &MailboxAnswers,
    aamp_url: Option<&str>,
    m: &mut AampMailbox,
) -> anyhow::Result<()> {
    let MailboxAnswers::Register {
        slug,
        description,
        servers,
    } = answers
    else {
        unreachable!("called for a registration")
    };
    let Some(aamp_url) = aamp_url else {
        bail!("agent {name}: registering a mailbox needs the AAMP service: set aamp_url in the answers");
    };
    if m.aamp_url.as_deref() != Some(aamp_url) || m.credentials_file.is_none() {
        m.credentials_file = Some(PathBuf::from(format!("{name}.json")));
    }
    m.email = None;
    m.password = None;
    m.password_file = None;
    m.login = None;
    m.slug = slug.clone().or(m.slug.take());
    m.description = description.clone().or(m.description.take());
    m.aamp_url = Some(aamp_url.to_string());
    m.jmap_url = servers
        .jmap_url
        .clone()
        .unwrap_or_else(|| format!("{}/.well-known/jmap", aamp_url.trim_end_matches('/')));
    m.smtp_host = servers
        .smtp_host
        .clone()
        .or_else(|| service_host(aamp_url))
        .unwrap_or_default();
    set_servers(m, servers);
    Ok(())
}

/// An account that exists: its address, login, password (or password file) and servers.
fn existing_account(
    name: &str,
    answers: &MailboxAnswers,
    aamp_url: Option<&str>,
    m: &mut AampMailbox,
) -> anyhow::Result<()> {
    let MailboxAnswers::Existing {
        email,
        login,
        password,
        password_file,
        servers,
    } = answers
    else {
        unreachable!("called for an existing account")
    };
    m.credentials_file = None;
    m.email = Some(email.clone());
    m.login = login.clone();
    // A password given here stays in memory until the account passed its test; then
    // it goes into `<name>.password` (see `apply`).
    (m.password, m.password_file) = match (password, password_file) {
        (_, Some(file)) => (None, Some(file.clone())),
        (Some(p), None) => (Some(p.clone()), None),
        (None, None) => bail!(
            "agent {name}: an existing account needs its password (password or password_file)"
        ),
    };
    let (Some(jmap), Some(smtp)) = (&servers.jmap_url, &servers.smtp_host) else {
        bail!("agent {name}: an existing account needs jmap_url and smtp_host");
    };
    m.jmap_url = jmap.clone();
    m.smtp_host = smtp.clone();
    if let Some(url) = aamp_url {
        m.aamp_url = Some(url.to_string());
    }
    set_servers(m, servers);
    Ok(())
}

/// The SMTP port and security and the certificate check an AAMP mailbox's answers give.
fn set_servers(m: &mut AampMailbox, servers: &Servers) {
    m.smtp_port = servers.smtp_port;
    m.smtp_security = servers.smtp_security.unwrap_or_default();
    m.common.insecure_tls = servers.insecure_tls;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::wizard::{empty_config, Servers};

    fn mailbox(text: &str) -> MailboxConfig {
        toml::from_str(text).unwrap()
    }

    fn rendered(m: &MailboxConfig) -> String {
        let mut config = empty_config();
        config.mailboxes.insert("m".to_string(), m.clone());
        config::render(&config)
    }

    /// Issue 34: a mailbox that changes kind is a new mailbox of that kind which keeps only
    /// the keys every mailbox has; one that keeps its kind keeps its other keys too.
    #[test]
    fn a_mailbox_that_changes_kind_keeps_only_the_common_keys() {
        let aamp = mailbox(
            "email = \"a@x\"\njmap_url = \"https://x\"\nsmtp_host = \"x\"\npassword_file = \"p\"\npush = false\npoll_interval_secs = 7\n",
        );
        let asmtp = MailboxAnswers::Asmtp {
            asmtp_url: "https://asmtp.test".to_string(),
            handle: "@o.m".to_string(),
            token_file: PathBuf::from("m.token"),
            insecure_tls: true,
        };
        let m = mailbox_config("m", &asmtp, None, Some(&aamp)).unwrap();
        assert_eq!(m.kind(), MailboxKind::Asmtp);
        assert_eq!(m.common().poll_interval_secs, 7);
        assert!(m.common().insecure_tls);
        let text = rendered(&m);
        assert!(
            text.contains("kind = \"asmtp\"")
                && text.contains("poll_interval_secs = 7")
                && !text.contains("email")
                && !text.contains("push"),
            "{text}"
        );

        let mut skipping = m.clone();
        if let MailboxConfig::Asmtp(a) = &mut skipping {
            a.skip_backlog = true;
        }
        let again = mailbox_config("m", &asmtp, None, Some(&skipping)).unwrap();
        assert!(rendered(&again).contains("skip_backlog = true"));

        let existing = MailboxAnswers::Existing {
            email: "b@x".to_string(),
            login: None,
            password: None,
            password_file: Some(PathBuf::from("p")),
            servers: Servers {
                jmap_url: Some("https://x".to_string()),
                smtp_host: Some("x".to_string()),
                ..Servers::default()
            },
        };
        let back = mailbox_config("m", &existing, None, Some(&again)).unwrap();
        let text = rendered(&back);
        assert!(
            back.aamp().is_some()
                && text.contains("email = \"b@x\"")
                && text.contains("poll_interval_secs = 7")
                && !text.contains("kind")
                && !text.contains("asmtp")
                && !text.contains("skip_backlog"),
            "{text}"
        );
    }
}
