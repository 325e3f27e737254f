//! Answers turned into the config: every mailbox set up and tested live first, then the
//! credential files, the config (only when its text changes), pairing codes and the service.

use crate::output::outln;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde::Serialize;

use super::{empty_config, existing, pairing, qr, register::Setup, view};
use super::{AgentAnswers, Answers, OwnMailbox, Pairing, Progress};
use crate::config::{self, Config, LoadedConfig};

/// What [`apply`] did, for the person (or `--json`).
#[serde_with::skip_serializing_none]
#[derive(Debug, Default, Serialize)]
pub struct Applied {
    pub config: PathBuf,
    /// Whether the config file changed.
    pub written: bool,
    pub agents: Vec<AppliedAgent>,
    /// The person's own mailbox: (its name in the config, its address).
    pub own_mailbox: Option<(String, String)>,
    pub service: Option<String>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize)]
pub struct AppliedAgent {
    pub name: String,
    pub email: String,
    pub mailbox: String,
    /// `registered`, `reused` (registered before), `account`, `kept`, `asmtp`, `amp` or
    /// `samp`.
    pub how: &'static str,
    pub allow_from: Vec<String>,
    pub pairing: Option<Pairing>,
}

/// Turns answers into the config at `path` (and its credential files), testing each mailbox
/// live first. Nothing is written when a mailbox fails its test.
pub async fn apply(
    answers: &Answers,
    path: &Path,
    progress: &dyn Progress,
) -> anyhow::Result<Applied> {
    let before = std::fs::read_to_string(path).ok();
    let mut config = start(answers, path)?;
    let mut applied = Applied {
        config: path.to_path_buf(),
        ..Applied::default()
    };
    let mut setup = Setup {
        path,
        aamp_url: answers.aamp_url.as_deref(),
        progress,
        secrets: Vec::new(),
    };
    for agent in &answers.agents {
        let done = set_up_agent(&mut config, agent, &mut setup).await?;
        applied.agents.push(done);
    }
    if let Some(own) = &answers.own_mailbox {
        let email = set_up_own_mailbox(&mut config, own, &mut setup).await?;
        if own.allow {
            for agent in &mut config.agents {
                allow(&mut agent.allow_from, &email);
            }
            for applied_agent in &mut applied.agents {
                allow(&mut applied_agent.allow_from, &email);
            }
        }
        applied.own_mailbox = Some((own.name.clone(), email));
    }
    applied.written = write(&config, &setup.secrets, before.as_deref(), path)?;
    let loaded = LoadedConfig::load(path).map_err(|e| {
        anyhow::anyhow!(
            "the config just written does not load (a bug in aamp-bridge: please report it): {e}"
        )
    })?;
    for (agent, result) in answers.agents.iter().zip(applied.agents.iter_mut()) {
        if agent.pair {
            result.pairing = Some(pairing(&loaded, &agent.name, Duration::from_secs(900))?);
        }
    }
    if answers.service {
        applied.service = Some(install_service(&loaded));
    }
    Ok(applied)
}

/// The config the answers start from (the one at `path`, or an empty one), with its folder
/// made and the answers' own settings checked and taken.
fn start(answers: &Answers, path: &Path) -> anyhow::Result<Config> {
    let mut config = existing(path)?
        .map(|c| c.config)
        .unwrap_or_else(empty_config);
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the config folder {}", dir.display()))?;
    if let Some(state) = &answers.state_dir {
        config.state_dir = Some(state.clone());
    }
    if let Some(url) = &answers.aamp_url {
        url::Url::parse(url).with_context(|| format!("aamp_url {url:?} is not a URL"))?;
    }
    Ok(config)
}

/// One agent's answers into `config`: its profile checked, its mailbox set up and tested, its
/// entry added or updated.
async fn set_up_agent(
    config: &mut Config,
    agent: &AgentAnswers,
    setup: &mut Setup<'_>,
) -> anyhow::Result<AppliedAgent> {
    let name = agent.name.as_str();
    if !config::valid_name(name) {
        bail!("agent name {name:?}: use lower-case letters, digits, - and _");
    }
    let probe = view(setup.path, config);
    crate::runner::Profile::find(&probe.profile_ref(&agent.profile), &probe.profile_dirs())
        .with_context(|| format!("agent {name}: profile {:?}", agent.profile))?;
    let previous_agent = config.agents.iter().find(|a| a.name == name).cloned();
    let mailbox_name = previous_agent
        .as_ref()
        .and_then(|a| a.mailbox.clone())
        .unwrap_or_else(|| name.to_string());
    let (email, how) = setup
        .mailbox(
            config,
            &mailbox_name,
            &format!("agent {name}"),
            &agent.mailbox,
        )
        .await?;

    let mut entry = previous_agent.unwrap_or_else(|| {
        toml::from_str(&format!("name = {name:?}\nprofile = \"echo\"\n"))
            .expect("a minimal agent loads")
    });
    entry.profile = agent.profile.clone();
    if mailbox_name != name {
        entry.mailbox = Some(mailbox_name.clone());
    }
    entry.allow_from = agent.allow_from.clone();
    if agent.summary.is_some() {
        entry.summary = agent.summary.clone();
    }
    match config.agents.iter_mut().find(|a| a.name == name) {
        Some(slot) => *slot = entry,
        None => config.agents.push(entry),
    }
    Ok(AppliedAgent {
        name: name.to_string(),
        email,
        mailbox: mailbox_name,
        how,
        allow_from: agent.allow_from.clone(),
        pairing: None,
    })
}

/// The person's own mailbox into `config`, set up and tested; its address.
async fn set_up_own_mailbox(
    config: &mut Config,
    own: &OwnMailbox,
    setup: &mut Setup<'_>,
) -> anyhow::Result<String> {
    if !config::valid_name(&own.name) {
        bail!(
            "own_mailbox name {:?}: use lower-case letters, digits, - and _",
            own.name
        );
    }
    if config.agents.iter().any(|a| a.mailbox_name() == own.name) {
        bail!(
            "own_mailbox {:?} is an agent's mailbox: give yours another name",
            own.name
        );
    }
    let owner = format!("your mailbox {}", own.name);
    let (email, _) = setup
        .mailbox(config, &own.name, &owner, &own.mailbox)
        .await?;
    Ok(email)
}

/// Adds `email` to an allow list that does not have it already (in any case).
fn allow(allow_from: &mut Vec<String>, email: &str) {
    if !allow_from.iter().any(|a| a.eq_ignore_ascii_case(email)) {
        allow_from.push(email.to_string());
    }
}

/// Writes the held-back passwords, then the config when its text changed from `before`.
/// Whether the config was written.
fn write(
    config: &Config,
    secrets: &[(PathBuf, Vec<u8>)],
    before: Option<&str>,
    path: &Path,
) -> anyhow::Result<bool> {
    for (file, bytes) in secrets {
        crate::fsio::write_atomic(file, bytes, 0o600)
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    let text = config::render(config);
    if before == Some(text.as_str()) {
        return Ok(false);
    }
    crate::fsio::write_atomic(path, text.as_bytes(), 0o600)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(true)
}

/// Installs and starts the service; says what happened (a failure is a hint, not an error:
/// the config is written and `aamp-bridge start` works).
fn install_service(config: &LoadedConfig) -> String {
    let result = crate::service::Service::for_this_machine(&config.path, false).and_then(|svc| {
        svc.install()?;
        svc.start()?;
        Ok(svc.file.display().to_string())
    });
    match result {
        Ok(file) => format!("installed and started ({file})"),
        Err(e) => format!("not installed: {e:#}; run `aamp-bridge start` in a terminal instead"),
    }
}

/// Prints what apply did, for a person.
pub fn print_applied(applied: &Applied) {
    outln!(
        "{} {}",
        if applied.written {
            "wrote"
        } else {
            "unchanged:"
        },
        applied.config.display()
    );
    for agent in &applied.agents {
        let how = match agent.how {
            "registered" => "new mailbox",
            "reused" => "mailbox registered earlier",
            "account" => "your account",
            _ => "mailbox kept",
        };
        outln!("  agent {}: {} ({how})", agent.name, agent.email);
        if agent.allow_from.is_empty() && agent.pairing.is_none() {
            outln!(
                "    nobody may send it tasks yet: `aamp-bridge policy allow --agent {} ADDRESS` or `aamp-bridge pair --agent {}`",
                agent.name, agent.name
            );
        } else if !agent.allow_from.is_empty() {
            outln!("    tasks accepted from: {}", agent.allow_from.join(", "));
        }
        if let Some(p) = &agent.pairing {
            outln!("{}", qr(&p.url));
            outln!("    pair with it: {}", p.url);
            outln!(
                "    code {}, valid until {} (once; the bridge must be running)",
                p.code,
                p.expires_at
            );
        }
    }
    if let Some((name, email)) = &applied.own_mailbox {
        outln!("  your mailbox {name}: {email} (send a task: `aamp-bridge dispatch --from {name} --to AGENT-ADDRESS \"...\"`)");
    }
    if let Some(service) = &applied.service {
        outln!("service: {service}");
    }
}
