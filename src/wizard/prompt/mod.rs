//! The questions `aamp-bridge init` asks in a terminal (inquire), and the spinner shown while
//! it waits (`spinner`); the mailbox questions are in `mailbox`. The only code in the crate
//! that prompts. The answers go to [`super::apply`].

use crate::output::outln;

use std::path::Path;

use anyhow::Context as _;
use inquire::{Confirm, InquireError, MultiSelect, Select};

use super::{AgentAnswers, Answers, Progress as _};
use crate::config::LoadedConfig;
use crate::mailbox::aamp::helper::ServiceInfo;

mod mailbox;
mod spinner;

use mailbox::{ask_own_mailbox, working_mailbox, EXISTING, KEEP, REGISTER};
pub use spinner::Spinner;

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
    crate::fsio::safe_word(profile, '-', usize::MAX).to_ascii_lowercase()
}

/// An agent to choose in the multi-select.
#[derive(Clone)]
struct Choice {
    profile: String,
    label: String,
}

impl Choice {
    /// An agent found, as the multi-select shows it: its version, login and whether it is
    /// installed.
    fn of(d: &crate::runner::scan::Detected) -> Choice {
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
    }
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
    let (aamp_url, info) = ask_service(previous.as_ref(), &spinner).await?;
    let can_register = can_register_any(&aamp_url, &info);
    let mut agents = Vec::new();
    for choice in pick_agents(previous.as_ref(), &spinner).await? {
        let asked = (&spinner, &known);
        let agent = ask_agent(
            path,
            choice.profile,
            can_register,
            &aamp_url,
            previous.as_ref(),
            asked,
        );
        agents.push(agent.await?);
    }

    let own_mailbox = ask_own_mailbox(
        path,
        can_register,
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

/// The AAMP service, asked until it answers (or the person uses it anyway, or leaves it
/// empty for a plain mail account), with what it said about itself.
async fn ask_service(
    previous: Option<&LoadedConfig>,
    spinner: &Spinner,
) -> anyhow::Result<(Option<String>, Option<ServiceInfo>)> {
    let old_url = previous.and_then(|c| {
        c.config
            .mailboxes
            .values()
            .find_map(|m| m.aamp()?.aamp_url.clone())
    });
    loop {
        let url = answer(super::line::ask(
            "AAMP service URL:",
            old_url.as_deref().unwrap_or(""),
            Some("its /.well-known/aamp gives mailboxes and live task streams; leave empty for a plain mail account"),
        ))?
            .trim()
            .trim_end_matches('/')
            .to_string();
        if url.is_empty() {
            return Ok((None, None));
        }
        let Ok(parsed) = url::Url::parse(&url) else {
            outln!("  {url:?} is not a URL (like https://aamp.example.com)");
            continue;
        };
        spinner.step(&format!("asking {url}/.well-known/aamp"));
        match crate::mailbox::aamp::helper::probe(&parsed, false).await {
            Ok(found) => {
                spinner.done(&format!("{url}: {}", found.describe()));
                return Ok((Some(url), Some(found)));
            }
            Err(e) => {
                spinner.done(&format!("{url} did not answer as an AAMP service"));
                outln!("  {e}");
                if answer(Confirm::new("Use it anyway?").with_default(false).prompt())? {
                    return Ok((Some(url), None));
                }
            }
        }
    }
}

/// The agents found on this machine (and those the config has), and the ones the person
/// picks to answer mail: at least one.
async fn pick_agents(
    previous: Option<&LoadedConfig>,
    spinner: &Spinner,
) -> anyhow::Result<Vec<Choice>> {
    spinner.step("looking for agents on this machine");
    let found = scan(previous).await;
    spinner.done(&format!(
        "agents found: {}",
        found.iter().filter(|d| d.path.is_some()).count()
    ));
    let choices: Vec<Choice> = found
        .iter()
        .filter(|d| d.path.is_some() || !d.configured.is_empty())
        .map(Choice::of)
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
    loop {
        let picked = answer(
            MultiSelect::new("Which agents should answer mail?", choices.clone())
                .with_default(&defaults)
                .with_help_message("space picks or unpicks, enter when done, esc leaves")
                .prompt(),
        )?;
        if !picked.is_empty() {
            return Ok(picked);
        }
        outln!("No agent picked: pick at least one with Space, then Enter (Esc leaves).");
    }
}

/// One picked agent's questions: its name, mailbox, senders and card.
async fn ask_agent(
    path: &Path,
    profile: String,
    can_register: bool,
    aamp_url: &Option<String>,
    previous: Option<&LoadedConfig>,
    (spinner, known): (&Spinner, &super::summary::Known),
) -> anyhow::Result<AgentAnswers> {
    let old = previous.and_then(|c| {
        c.config.agents.iter().find(|a| {
            crate::runner::Profile::find(&c.profile_ref(&a.profile), &c.profile_dirs())
                .map(|p| p.name == profile)
                .unwrap_or(false)
        })
    });
    outln!("\n— {profile} —");
    let name = ask_name(old.map(|a| a.name.clone()), &profile)?;
    let mut options = Vec::new();
    if old.is_some() {
        options.push(KEEP);
    }
    if can_register {
        options.push(REGISTER);
    }
    options.push(EXISTING);
    let mailbox =
        working_mailbox(path, &name, &options, aamp_url, previous, (spinner, known)).await?;
    let (allow_from, pair) = ask_senders(
        old.map(|a| a.allow_from.clone()).unwrap_or_default(),
        aamp_url.is_some(),
    )?;
    // The card is what the AAMP service's directory shows; without one there is no card
    // (and the bridge would warn about it at every start).
    let summary = match aamp_url {
        Some(_) => answer(super::line::ask(
            "One line about what it does (its card in the directory):",
            &old.and_then(|a| a.summary.clone())
                .unwrap_or_else(|| format!("{profile} agent")),
            None,
        ))?,
        None => String::new(),
    };
    Ok(AgentAnswers {
        name,
        profile,
        mailbox,
        allow_from,
        pair,
        summary: Some(summary).filter(|s| !s.is_empty()),
    })
}

/// The agent's name, asked until it is one the config takes.
fn ask_name(old: Option<String>, profile: &str) -> anyhow::Result<String> {
    let default = old.unwrap_or_else(|| agent_name(profile));
    loop {
        let name = answer(super::line::ask(
            "Agent name:",
            &default,
            Some("lower-case letters, digits, - and _"),
        ))?;
        if crate::config::valid_name(&name) {
            return Ok(name);
        }
        outln!("  use lower-case letters, digits, - and _");
    }
}

fn can_register_any(aamp_url: &Option<String>, info: &Option<ServiceInfo>) -> bool {
    aamp_url.is_some() && info.as_ref().is_none_or(|i| i.registration)
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
