//! The questions `aamp-bridge init` asks in a terminal (inquire), and the spinner shown while
//! it waits. The only code in the crate that prompts. The answers go to [`super::apply`].

use crate::output::{errln, outln};

use std::io::IsTerminal as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context as _;
use inquire::{Confirm, InquireError, MultiSelect, Password, PasswordDisplayMode, Select};

use super::{AgentAnswers, Answers, MailboxAnswers, Progress, Servers};
use crate::config::{LoadedConfig, SmtpSecurity};

/// A spinner on stderr while a slow step runs; nothing when stderr is not a terminal.
pub struct Spinner {
    bar: Mutex<Option<indicatif::ProgressBar>>,
    tty: bool,
}

impl Spinner {
    pub fn new() -> Spinner {
        Spinner {
            bar: Mutex::new(None),
            tty: std::io::stderr().is_terminal() && std::io::stdout().is_terminal(),
        }
    }
}

impl Spinner {
    /// Removes the spinner without a line of its own (the caller prints the outcome).
    pub fn clear(&self) {
        if let Some(bar) = self.bar.lock().expect("spinner lock").take() {
            bar.finish_and_clear();
        }
    }
}

impl Default for Spinner {
    fn default() -> Self {
        Spinner::new()
    }
}

impl Progress for Spinner {
    fn step(&self, what: &str) {
        if !self.tty {
            return;
        }
        self.clear();
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(100));
        *self.bar.lock().expect("spinner lock") = Some(bar);
    }

    fn done(&self, what: &str) {
        match self.bar.lock().expect("spinner lock").take() {
            Some(bar) => bar.finish_with_message(format!("✓ {what}")),
            None if self.tty => errln!("✓ {what}"),
            None => {}
        }
    }
}

/// Asking was cancelled (Esc or Ctrl-C): nothing is written.
#[derive(Debug, thiserror::Error)]
#[error("cancelled: nothing was written")]
pub struct Cancelled;

fn answer<T>(result: Result<T, InquireError>) -> anyhow::Result<T> {
    match result {
        Ok(v) => Ok(v),
        Err(InquireError::OperationCanceled | InquireError::OperationInterrupted) => {
            Err(Cancelled.into())
        }
        Err(InquireError::NotTTY) => Err(anyhow::anyhow!(
            "init asks its questions in a terminal; here, use `aamp-bridge init --non-interactive --answers FILE`"
        )),
        Err(e) => Err(e.into()),
    }
}

fn list(text: &str) -> Vec<String> {
    text.split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn agent_name(profile: &str) -> String {
    profile
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// An agent to choose in the multi-select.
#[derive(Clone)]
struct Choice {
    profile: String,
    label: String,
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label)
    }
}

/// Asks everything, starting from the config at `path` when there is one. `None` when the
/// person declined to write.
pub async fn ask(path: &Path) -> anyhow::Result<Option<Answers>> {
    let previous = super::existing(path)?;
    outln!(
        "aamp-bridge init: which agents answer mail, their mailboxes, and who may send them tasks."
    );
    match &previous {
        Some(_) => outln!("Editing {} (your other settings stay).", path.display()),
        None => outln!("Writing {}.", path.display()),
    }
    outln!("Esc cancels; nothing is written until the end.\n");

    let spinner = Spinner::new();
    let known = super::summary::Known::default();
    let old_url = previous.as_ref().and_then(|c| {
        c.config
            .mailboxes
            .values()
            .find_map(|m| m.aamp()?.aamp_url.clone())
    });
    let mut info = None;
    let aamp_url = loop {
        let url = answer(super::line::ask(
            "AAMP service URL:",
            old_url.as_deref().unwrap_or(""),
            Some("its /.well-known/aamp gives mailboxes and live task streams; leave empty for a plain mail account"),
        ))?
            .trim()
            .trim_end_matches('/')
            .to_string();
        if url.is_empty() {
            break None;
        }
        let Ok(parsed) = url::Url::parse(&url) else {
            outln!("  {url:?} is not a URL (like https://aamp.example.com)");
            continue;
        };
        spinner.step(&format!("asking {url}/.well-known/aamp"));
        match crate::mailbox::aamp::helper::probe(&parsed, false).await {
            Ok(found) => {
                spinner.done(&format!("{url}: {}", found.describe()));
                info = Some(found);
                break Some(url);
            }
            Err(e) => {
                spinner.done(&format!("{url} did not answer as an AAMP service"));
                outln!("  {e}");
                if answer(Confirm::new("Use it anyway?").with_default(false).prompt())? {
                    break Some(url);
                }
            }
        }
    };

    spinner.step("looking for agents on this machine");
    let found = scan(previous.as_ref()).await;
    spinner.done(&format!(
        "agents found: {}",
        found.iter().filter(|d| d.path.is_some()).count()
    ));
    let choices: Vec<Choice> = found
        .iter()
        .filter(|d| d.path.is_some() || !d.configured.is_empty())
        .map(|d| {
            let mut label = format!("{:<13} {}", d.profile, d.description);
            if let Some(v) = &d.version {
                label.push_str(&format!(" [{v}]"));
            }
            if let Some(login) = &d.login {
                label.push_str(&format!(" ({login})"));
            }
            if d.path.is_none() {
                label.push_str(" (not installed)");
            }
            Choice {
                profile: d.profile.clone(),
                label,
            }
        })
        .collect();
    if choices.is_empty() {
        anyhow::bail!("no agent is installed: `aamp-bridge agents` lists the ones the bridge knows and how to install them; `aamp-bridge profile new` adds your own");
    }
    let configured: Vec<usize> = choices
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            found
                .iter()
                .any(|d| d.profile == c.profile && !d.configured.is_empty())
        })
        .map(|(i, _)| i)
        .collect();
    // Enter alone used to pick nothing and end the wizard ("No agent picked"): the first
    // installed agent is picked already when none is configured, and an empty pick asks again.
    let defaults = if configured.is_empty() {
        vec![0]
    } else {
        configured
    };
    let picked = loop {
        let picked = answer(
            MultiSelect::new("Which agents should answer mail?", choices.clone())
                .with_default(&defaults)
                .with_help_message("space picks or unpicks, enter when done, esc leaves")
                .prompt(),
        )?;
        if !picked.is_empty() {
            break picked;
        }
        outln!("No agent picked: pick at least one with Space, then Enter (Esc leaves).");
    };

    let mut agents = Vec::new();
    for choice in picked {
        let profile = choice.profile;
        let old = previous.as_ref().and_then(|c| {
            c.config.agents.iter().find(|a| {
                crate::runner::Profile::find(&c.profile_ref(&a.profile), &c.profile_dirs())
                    .map(|p| p.name == profile)
                    .unwrap_or(false)
            })
        });
        outln!("\n— {profile} —");
        let name = loop {
            let default = old
                .map(|a| a.name.clone())
                .unwrap_or_else(|| agent_name(&profile));
            let name = answer(super::line::ask(
                "Agent name:",
                &default,
                Some("lower-case letters, digits, - and _"),
            ))?;
            if crate::config::valid_name(&name) {
                break name;
            }
            outln!("  use lower-case letters, digits, - and _");
        };
        let can_register = aamp_url.is_some() && info.as_ref().is_none_or(|i| i.registration);
        let mut options = Vec::new();
        if old.is_some() {
            options.push(KEEP);
        }
        if can_register {
            options.push(REGISTER);
        }
        options.push(EXISTING);
        let mailbox = working_mailbox(
            path,
            &name,
            &options,
            &aamp_url,
            previous.as_ref(),
            (&spinner, &known),
        )
        .await?;
        let (allow_from, pair) = ask_senders(
            old.map(|a| a.allow_from.clone()).unwrap_or_default(),
            aamp_url.is_some(),
        )?;
        // The card is what the AAMP service's directory shows; without one there is no card
        // (and the bridge would warn about it at every start).
        let summary = match &aamp_url {
            Some(_) => answer(super::line::ask(
                "One line about what it does (its card in the directory):",
                &old.and_then(|a| a.summary.clone())
                    .unwrap_or_else(|| format!("{profile} agent")),
                None,
            ))?,
            None => String::new(),
        };
        agents.push(AgentAnswers {
            name,
            profile,
            mailbox,
            allow_from,
            pair,
            summary: Some(summary).filter(|s| !s.is_empty()),
        });
    }

    let own_mailbox = ask_own_mailbox(
        path,
        can_register_any(&aamp_url, &info),
        &aamp_url,
        previous.as_ref(),
        &agents,
        (&spinner, &known),
    )
    .await?;

    outln!("\nSummary:");
    for line in super::summary::lines(&agents, own_mailbox.as_ref()) {
        outln!("{line}");
    }
    if !answer(
        Confirm::new("Write the config?")
            .with_default(true)
            .prompt(),
    )? {
        return Ok(None);
    }
    Ok(Some(Answers {
        aamp_url,
        state_dir: None,
        agents,
        own_mailbox,
        service: false,
    }))
}

/// The mailbox questions, asked and tested until the mailbox works (or the person leaves): a
/// failed test used to end the wizard after the last question and lose every answer.
async fn working_mailbox(
    path: &Path,
    name: &str,
    options: &[&'static str],
    aamp_url: &Option<String>,
    previous: Option<&LoadedConfig>,
    (spinner, known): (&Spinner, &super::summary::Known),
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
        let tested = super::test_answers(path, name, &mailbox, aamp_url.as_deref()).await;
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
                    .downcast_ref::<super::MailboxTestFailed>()
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

fn can_register_any(
    aamp_url: &Option<String>,
    info: &Option<crate::mailbox::aamp::helper::ServiceInfo>,
) -> bool {
    aamp_url.is_some() && info.as_ref().is_none_or(|i| i.registration)
}

const OWN_NO: &str = "No: tasks come from elsewhere (an app, a workflow, another agent)";

/// A mailbox of the person's own to send tasks from (`aamp-bridge dispatch --from me`),
/// allowed to send to the agents just set up.
async fn ask_own_mailbox(
    path: &Path,
    can_register: bool,
    aamp_url: &Option<String>,
    previous: Option<&LoadedConfig>,
    agents: &[AgentAnswers],
    asked: (&Spinner, &super::summary::Known),
) -> anyhow::Result<Option<super::OwnMailbox>> {
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
    Ok(Some(super::OwnMailbox {
        name: name.to_string(),
        mailbox,
        allow: true,
    }))
}

async fn scan(previous: Option<&LoadedConfig>) -> Vec<crate::runner::scan::Detected> {
    use crate::runner::{scan, Profile};
    let dirs = match previous {
        Some(c) => c.profile_dirs(),
        None => vec![crate::config::default_config_dir().join("profiles")],
    };
    let (profiles, _) = Profile::all(&dirs);
    let configured = previous
        .map(crate::runner::scan::agent_profiles)
        .unwrap_or_default();
    scan::scan(&profiles, &configured, &scan::bin_dirs().await).await
}

const REGISTER: &str = "Register a new mailbox with the AAMP service";
const EXISTING: &str = "Use an existing mail account (JMAP + SMTP)";
const KEEP: &str = "Keep its current mailbox";

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
    (spinner, known): (&Spinner, &super::summary::Known),
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
    if pick == KEEP {
        return Ok(MailboxAnswers::Keep);
    }
    let host = aamp_url
        .as_deref()
        .and_then(|u| url::Url::parse(u).ok())
        .and_then(|u| u.host_str().map(str::to_string));
    if pick == REGISTER {
        let slug = answer(super::line::ask(
            "Address prefix to ask for:",
            &name.replace('_', "-"),
            Some("the service may add a suffix"),
        ))?;
        let servers = ask_servers(None, host.as_deref(), None)?;
        return Ok(MailboxAnswers::Register {
            slug: Some(slug),
            description: Some(format!("aamp-bridge agent {name}")),
            servers,
        });
    }
    let (prior_email, prior_password, prior_servers) = match prior {
        Some(MailboxAnswers::Existing {
            email,
            password,
            servers,
            ..
        }) => (Some(email.clone()), password.clone(), Some(servers)),
        _ => (None, None, None),
    };
    let old = previous.and_then(|c| c.config.mailboxes.get(name));
    let email = answer(super::line::ask(
        "Email address:",
        prior_email
            .as_deref()
            .or(old.and_then(|m| m.aamp()?.email.as_deref()))
            .unwrap_or(""),
        None,
    ))?;
    let domain = email.rsplit('@').next().unwrap_or_default().to_string();
    let mut question = Password::new("Password:")
        .without_confirmation()
        .with_display_mode(PasswordDisplayMode::Masked)
        .with_help_message("saved in a file of mode 0600 beside the config, never in the config");
    if prior_password.is_some() {
        question = question.with_help_message("Enter alone keeps the one you gave");
    }
    let password = answer(question.prompt())?;
    let password = match (password.is_empty(), prior_password) {
        (true, Some(kept)) => kept,
        (_, _) => password,
    };
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
            // The AAMP service's host, or where the address's domain has its servers (the
            // domain itself when nothing answers).
            let guessed = match aamp_url {
                Some(_) => crate::mailbox::aamp::guess::Guess::default(),
                None => {
                    spinner.step(&format!("looking for {domain}'s mail servers"));
                    let g =
                        crate::mailbox::aamp::guess::guess(&domain, Duration::from_secs(4)).await;
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

fn ask_servers(
    jmap_default: Option<&str>,
    smtp_default: Option<&str>,
    prior: Option<&Servers>,
) -> anyhow::Result<Servers> {
    let jmap_url = match jmap_default {
        Some(default) => Some(answer(super::line::ask(
            "JMAP session URL:",
            default,
            None,
        ))?),
        None => None,
    };
    let smtp_host = answer(super::line::ask(
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
        let text = answer(super::line::ask(
            "SMTP port:",
            &default_port.to_string(),
            None,
        ))?;
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

const PAIR: &str = "Pair now: show a QR code for the AAMP app (or `aamp-cli pair`)";
const ALLOW: &str = "An allow list of addresses";
const LATER: &str = "Later (nobody may send tasks until then)";

/// Who may send tasks; pairing (the AAMP app's QR code) only with an AAMP service.
fn ask_senders(old: Vec<String>, can_pair: bool) -> anyhow::Result<(Vec<String>, bool)> {
    let keep = (!old.is_empty()).then(|| format!("Keep: {}", old.join(", ")));
    let mut options: Vec<&str> = Vec::new();
    if let Some(k) = &keep {
        options.push(k);
    }
    options.push(ALLOW);
    if can_pair {
        options.push(PAIR);
    }
    options.push(LATER);
    let pick = answer(Select::new("Who may send it tasks?", options).prompt())?;
    Ok(match pick {
        ALLOW => {
            let text = answer(super::line::ask(
                "Addresses (comma-separated; *@domain or @domain for a whole domain):",
                &old.join(", "),
                None,
            ))?;
            (list(&text), false)
        }
        PAIR => (old, true),
        LATER => (Vec::new(), false),
        _ => (old, false),
    })
}

/// After writing: offers the background service when this machine has one.
pub fn offer_service(config: &Path) -> anyhow::Result<Option<String>> {
    let service = crate::service::Service::for_this_machine(config, false)?;
    if !service.available() {
        outln!(
            "\nNo systemd user manager here: run `aamp-bridge --config {} start` (in tmux or screen to keep it running).",
            config.display()
        );
        return Ok(None);
    }
    let go = answer(
        Confirm::new("Install and start the background service now?")
            .with_default(true)
            .prompt(),
    )?;
    if !go {
        outln!("Later: `aamp-bridge service install && aamp-bridge service start`, or `aamp-bridge start`.");
        return Ok(None);
    }
    service.install().context("installing the service")?;
    service.start().context("starting the service")?;
    Ok(Some(format!(
        "installed and started ({})",
        service.file.display()
    )))
}
