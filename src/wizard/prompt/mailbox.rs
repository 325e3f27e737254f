//! The mailbox questions: an agent's mailbox (kept, registered, or an existing account with
//! its servers), asked again with the answers given until its live test passes, and the
//! person's own mailbox.

use crate::output::outln;

use std::path::Path;
use std::time::Duration;

use inquire::{Password, PasswordDisplayMode, Select};

use super::{answer, Cancelled, Spinner};
use crate::config::{LoadedConfig, SmtpSecurity};
use crate::wizard::summary::Known;
use crate::wizard::Progress as _;
use crate::wizard::{line, AgentAnswers, MailboxAnswers, OwnMailbox, Servers};

/// The mailbox questions, asked and tested until the mailbox works (or the person leaves): a
/// failed test used to end the wizard after the last question and lose every answer.
pub(super) async fn working_mailbox(
    path: &Path,
    name: &str,
    options: &[&'static str],
    aamp_url: &Option<String>,
    previous: Option<&LoadedConfig>,
    (spinner, known): (&Spinner, &Known),
) -> anyhow::Result<MailboxAnswers> {
    // Asked and tested until it works (or the person leaves): a failed test used to end
    // the wizard after the last question and lose every answer.
    let mut given: Option<MailboxAnswers> = None;
    loop {
        let mailbox = match given.take() {
            Some(tested) => tested,
            None => ask_mailbox(name, options, aamp_url, previous, None, (spinner, known)).await?,
        };
        // A new mailbox is registered, and a kept one tested, when the config is written.
        if !matches!(mailbox, MailboxAnswers::Existing { .. }) {
            return Ok(mailbox);
        }
        spinner.step(&format!("testing {name}'s mailbox"));
        let tested = crate::wizard::test_answers(path, name, &mailbox, aamp_url.as_deref()).await;
        match tested {
            Ok(email) => {
                spinner.done(&format!("{name}: {email} answers JMAP and SMTP"));
                known.worked(&mailbox);
                return Ok(mailbox);
            }
            Err(e) => {
                spinner.clear();
                outln!("✗ {e:#}");
                let certificate = e
                    .downcast_ref::<crate::wizard::MailboxTestFailed>()
                    .is_some_and(|f| f.error.certificate_refused());
                let mut choices = vec![CHANGE];
                if certificate {
                    choices.push(TRUST);
                }
                choices.push(LEAVE);
                match answer(Select::new("The mailbox does not work yet:", choices).prompt())? {
                    TRUST => {
                        given = Some(trusted(mailbox));
                    }
                    CHANGE => {
                        given = Some(
                            ask_mailbox(
                                name,
                                options,
                                aamp_url,
                                previous,
                                Some(&mailbox),
                                (spinner, known),
                            )
                            .await?,
                        );
                    }
                    _ => return Err(Cancelled.into()),
                }
            }
        }
    }
}

const OWN_NO: &str = "No: tasks come from elsewhere (an app, a workflow, another agent)";

/// A mailbox of the person's own to send tasks from (`aamp-bridge dispatch --from me`),
/// allowed to send to the agents just set up.
pub(super) async fn ask_own_mailbox(
    path: &Path,
    can_register: bool,
    aamp_url: &Option<String>,
    previous: Option<&LoadedConfig>,
    agents: &[AgentAnswers],
    asked: (&Spinner, &Known),
) -> anyhow::Result<Option<OwnMailbox>> {
    // A mailbox the config has that no agent uses is the person's already.
    if let Some(c) = previous {
        let used: Vec<&str> = c.config.agents.iter().map(|a| a.mailbox_name()).collect();
        if let Some(name) = c
            .config
            .mailboxes
            .keys()
            .find(|m| !used.contains(&m.as_str()))
        {
            outln!("\nYour own mailbox: {name} (kept; `aamp-bridge dispatch --from {name}` sends from it)");
            return Ok(None);
        }
    }
    outln!();
    let mut options = Vec::new();
    if can_register {
        options.push(REGISTER);
    }
    options.push(EXISTING);
    options.push(OWN_NO);
    let pick = answer(
        Select::new(
            "A mailbox of your own, to send tasks from (`aamp-bridge dispatch --from me`)?",
            options,
        )
        .prompt(),
    )?;
    if pick == OWN_NO {
        return Ok(None);
    }
    let name = "me";
    let taken = agents.iter().any(|a| a.name == name);
    let name = if taken { "me-own" } else { name };
    let mailbox = match pick {
        REGISTER => ask_mailbox(name, &[REGISTER], aamp_url, previous, None, asked).await?,
        _ => working_mailbox(path, name, &[EXISTING], aamp_url, previous, asked).await?,
    };
    Ok(Some(OwnMailbox {
        name: name.to_string(),
        mailbox,
        allow: true,
    }))
}

pub(super) const REGISTER: &str = "Register a new mailbox with the AAMP service";
pub(super) const EXISTING: &str = "Use an existing mail account (JMAP + SMTP)";
pub(super) const KEEP: &str = "Keep its current mailbox";

const CHANGE: &str = "Change the answers (each one shows what you gave)";
const TRUST: &str =
    "Trust this server's certificate as it is (insecure_tls = true: only for a host you control)";
const LEAVE: &str = "Leave (nothing is written)";

/// The same answers with the mailbox's TLS certificates accepted unverified.
fn trusted(mut mailbox: MailboxAnswers) -> MailboxAnswers {
    if let MailboxAnswers::Existing { servers, .. } = &mut mailbox {
        servers.insecure_tls = true;
    }
    mailbox
}

/// The mailbox questions; `prior` holds the answers given before (a failed test), shown as
/// each question's default.
async fn ask_mailbox(
    name: &str,
    options: &[&'static str],
    aamp_url: &Option<String>,
    previous: Option<&LoadedConfig>,
    prior: Option<&MailboxAnswers>,
    asked: (&Spinner, &Known),
) -> anyhow::Result<MailboxAnswers> {
    let pick = match (prior, options) {
        (Some(MailboxAnswers::Existing { .. }), _) => EXISTING,
        // One way only: no menu of one.
        (_, [only]) => {
            outln!("Its mailbox: {}", only.to_lowercase());
            only
        }
        _ => answer(Select::new("Its mailbox:", options.to_vec()).prompt())?,
    };
    let host = aamp_url
        .as_deref()
        .and_then(|u| url::Url::parse(u).ok())
        .and_then(|u| u.host_str().map(str::to_string));
    match pick {
        KEEP => Ok(MailboxAnswers::Keep),
        REGISTER => {
            let slug = answer(line::ask(
                "Address prefix to ask for:",
                &name.replace('_', "-"),
                Some("the service may add a suffix"),
            ))?;
            let servers = ask_servers(None, host.as_deref(), None)?;
            Ok(MailboxAnswers::Register {
                slug: Some(slug),
                description: Some(format!("aamp-bridge agent {name}")),
                servers,
            })
        }
        _ => {
            let old = previous.and_then(|c| c.config.mailboxes.get(name));
            let old_email = old.and_then(|m| m.aamp()?.email.as_deref());
            ask_account(old_email, aamp_url, host, prior, asked).await
        }
    }
}

/// An existing account's questions: its address, password and servers.
async fn ask_account(
    old_email: Option<&str>,
    aamp_url: &Option<String>,
    host: Option<String>,
    prior: Option<&MailboxAnswers>,
    (spinner, known): (&Spinner, &Known),
) -> anyhow::Result<MailboxAnswers> {
    let (prior_email, prior_password, prior_servers) = match prior {
        Some(MailboxAnswers::Existing {
            email,
            password,
            servers,
            ..
        }) => (Some(email.clone()), password.clone(), Some(servers)),
        _ => (None, None, None),
    };
    let email = answer(line::ask(
        "Email address:",
        prior_email.as_deref().or(old_email).unwrap_or(""),
        None,
    ))?;
    let password = ask_password(prior_password)?;
    // Servers that just worked for another address on this domain come before any guess,
    // with the certificate trusted for them still trusted.
    let worked = known.for_address(&email);
    let servers = match prior_servers.or(worked.as_ref()) {
        Some(servers) => ask_servers(
            servers.jmap_url.as_deref(),
            servers.smtp_host.as_deref(),
            Some(servers),
        )?,
        None => {
            let (jmap, smtp) = guess_servers(&email, aamp_url, host, spinner).await;
            ask_servers(Some(&jmap), Some(&smtp), None)?
        }
    };
    Ok(MailboxAnswers::Existing {
        email,
        login: None,
        password: Some(password),
        password_file: None,
        servers,
    })
}

/// The password, never shown; Enter alone keeps the one given before (`prior`).
fn ask_password(prior: Option<String>) -> anyhow::Result<String> {
    let mut question = Password::new("Password:")
        .without_confirmation()
        .with_display_mode(PasswordDisplayMode::Masked)
        .with_help_message("saved in a file of mode 0600 beside the config, never in the config");
    if prior.is_some() {
        question = question.with_help_message("Enter alone keeps the one you gave");
    }
    let password = answer(question.prompt())?;
    Ok(match (password.is_empty(), prior) {
        (true, Some(kept)) => kept,
        (_, _) => password,
    })
}

/// The JMAP URL and SMTP host to offer for `email`: the AAMP service's host, or where the
/// address's domain has its servers (the domain itself when nothing answers).
async fn guess_servers(
    email: &str,
    aamp_url: &Option<String>,
    host: Option<String>,
    spinner: &Spinner,
) -> (String, String) {
    let domain = email.rsplit('@').next().unwrap_or_default().to_string();
    let guessed = match aamp_url {
        Some(_) => crate::mailbox::aamp::guess::Guess::default(),
        None => {
            spinner.step(&format!("looking for {domain}'s mail servers"));
            let g = crate::mailbox::aamp::guess::guess(&domain, Duration::from_secs(4)).await;
            spinner.clear();
            g
        }
    };
    let jmap = match aamp_url {
        Some(u) => format!("{u}/.well-known/jmap"),
        None => guessed
            .jmap_url
            .unwrap_or_else(|| format!("https://{domain}/.well-known/jmap")),
    };
    let smtp = host.or(guessed.smtp_host).unwrap_or(domain.clone());
    (jmap, smtp)
}

fn ask_servers(
    jmap_default: Option<&str>,
    smtp_default: Option<&str>,
    prior: Option<&Servers>,
) -> anyhow::Result<Servers> {
    let jmap_url = match jmap_default {
        Some(default) => Some(answer(line::ask("JMAP session URL:", default, None))?),
        None => None,
    };
    let smtp_host = answer(line::ask(
        "SMTP submission server:",
        smtp_default.unwrap_or(""),
        None,
    ))?;
    let choices = [
        SmtpSecurity::Starttls,
        SmtpSecurity::Tls,
        SmtpSecurity::Plain,
    ];
    let cursor = prior
        .and_then(|p| p.smtp_security)
        .and_then(|s| choices.iter().position(|c| *c == s))
        .unwrap_or(0);
    let security = answer(
        Select::new(
            "SMTP security:",
            vec![
                "starttls (port 587)",
                "tls (port 465)",
                "plain (loopback hosts only)",
            ],
        )
        .with_starting_cursor(cursor)
        .prompt(),
    )?;
    let smtp_security = match security.split(' ').next() {
        Some("tls") => SmtpSecurity::Tls,
        Some("plain") => SmtpSecurity::Plain,
        _ => SmtpSecurity::Starttls,
    };
    let default_port = prior
        .filter(|p| p.smtp_security == Some(smtp_security))
        .and_then(|p| p.smtp_port)
        .unwrap_or(smtp_security.default_port());
    let port = loop {
        let text = answer(line::ask("SMTP port:", &default_port.to_string(), None))?;
        match text.trim().parse::<u16>() {
            Ok(p) if p > 0 => break p,
            _ => outln!("  a port is a number from 1 to 65535"),
        }
    };
    // Kept when the same servers are asked again; a changed host must be trusted anew.
    let insecure_tls = prior.is_some_and(|p| {
        p.insecure_tls
            && p.smtp_host.as_deref() == Some(smtp_host.as_str())
            && p.jmap_url == jmap_url
    });
    Ok(Servers {
        jmap_url,
        smtp_host: Some(smtp_host),
        smtp_port: Some(port).filter(|p| *p != smtp_security.default_port()),
        smtp_security: Some(smtp_security),
        insecure_tls,
    })
}
