//! `aamp-bridge init` and `aamp-bridge import`: the person's way into a config. A thin shell:
//! the questions ([`prompt`], the only code that prompts) and the reference bridges' files
//! ([`import`]) both come down to [`Answers`], and [`apply`] turns answers into a config the
//! loader accepts, testing every mailbox live before anything is written.
//!
//! Applying the same answers twice changes nothing: a mailbox registered before is reused,
//! the file is rewritten only when its text changes, and a live pairing code is shown again.
//!
//! Just over 600 lines: the answers' model and their one application belong together.

use crate::output::outln;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

use crate::config::{self, Config, LoadedConfig, MailboxConfig, MailboxKind, SmtpSecurity};

pub mod import;
mod line;
pub mod profile_maker;
pub mod prompt;
mod summary;

/// Everything `init` asks, as a file (`init --non-interactive --answers FILE`, JSON or TOML).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Answers {
    /// The AAMP service (its `/.well-known/aamp`): registration and live task streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aamp_url: Option<String>,
    /// Where the journal and workspaces go (default: `$XDG_STATE_HOME/aamp-bridge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    #[serde(default)]
    pub agents: Vec<AgentAnswers>,
    /// A mailbox of the person's own, to send tasks from (`aamp-bridge dispatch --from me`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_mailbox: Option<OwnMailbox>,
    /// Install and start the background service afterwards.
    #[serde(default)]
    pub service: bool,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentAnswers {
    pub name: String,
    /// A profile name (`aamp-bridge agents`) or a profile file.
    pub profile: String,
    pub mailbox: MailboxAnswers,
    /// Who may send tasks (addresses, `*@domain`, `@domain`).
    #[serde(default)]
    pub allow_from: Vec<String>,
    /// Make a pairing code (and show its QR code) for the person who will send tasks.
    #[serde(default)]
    pub pair: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// The person's own mailbox: a `[mailboxes.NAME]` no agent answers, the `--from` of
/// `aamp-bridge dispatch`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OwnMailbox {
    /// Its key in `[mailboxes]` (default `me`).
    #[serde(default = "default_own_name")]
    pub name: String,
    pub mailbox: MailboxAnswers,
    /// Add its address to every agent's allow list (default yes).
    #[serde(default = "yes")]
    pub allow: bool,
}

fn default_own_name() -> String {
    "me".to_string()
}

fn yes() -> bool {
    true
}

/// Where an agent's mail lives.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum MailboxAnswers {
    /// A new mailbox registered with the AAMP service (`aamp_url`).
    Register {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slug: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        #[serde(flatten)]
        servers: Servers,
    },
    /// An account that exists: its address and password.
    Existing {
        email: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        login: Option<String>,
        /// The password; saved in a file of mode 0600 beside the config ...
        #[serde(default, skip_serializing_if = "Option::is_none")]
        password: Option<String>,
        /// ... or a file that already holds it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        password_file: Option<PathBuf>,
        #[serde(flatten)]
        servers: Servers,
    },
    /// The mailbox the config already has for this agent.
    Keep,
    /// A mailbox on an ASMTP operator; the token is in a file (mode 0600) already.
    Asmtp {
        asmtp_url: String,
        handle: String,
        token_file: PathBuf,
        #[serde(default)]
        insecure_tls: bool,
    },
    /// A mailbox on an AMP broker; the API key is in a file (mode 0600) already.
    Amp {
        amp_url: String,
        address: String,
        agent_id: String,
        api_key_file: PathBuf,
        #[serde(default)]
        insecure_tls: bool,
    },
    /// A mailbox on a SAMP server (Agent Mailbox, over MCP); the `amk_...` key is in a file
    /// (mode 0600) already.
    Samp {
        samp_url: String,
        key_file: PathBuf,
        #[serde(default)]
        insecure_tls: bool,
    },
}

/// The servers of a mailbox; for a registered one they default to the AAMP service's host.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Servers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jmap_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp_security: Option<SmtpSecurity>,
    #[serde(default)]
    pub insecure_tls: bool,
}

impl Answers {
    /// Reads answers from JSON or TOML text (JSON when it starts with `{`).
    pub fn parse(text: &str) -> anyhow::Result<Answers> {
        if text.trim_start().starts_with('{') {
            serde_json::from_str(text).context("the answers are not valid JSON for init")
        } else {
            toml::from_str(text).context("the answers are not valid TOML for init")
        }
    }
}

/// What [`apply`] did, for the person (or `--json`).
#[derive(Debug, Default, Serialize)]
pub struct Applied {
    pub config: PathBuf,
    /// Whether the config file changed.
    pub written: bool,
    pub agents: Vec<AppliedAgent>,
    /// The person's own mailbox: (its name in the config, its address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_mailbox: Option<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct AppliedAgent {
    pub name: String,
    pub email: String,
    pub mailbox: String,
    /// `registered`, `reused` (registered before), `account`, `kept`, `asmtp`, `amp` or
    /// `samp`.
    pub how: &'static str,
    pub allow_from: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pairing: Option<Pairing>,
}

/// A pairing code and the link that carries it.
#[derive(Clone, Debug, Serialize)]
pub struct Pairing {
    pub code: String,
    pub url: String,
    #[serde(rename = "expiresAt")]
    pub expires_at: String,
}

/// Reports progress of slow steps (a spinner in a terminal, nothing otherwise).
pub trait Progress {
    fn step(&self, what: &str);
    fn done(&self, what: &str);
}

/// No progress display.
pub struct Quiet;

impl Progress for Quiet {
    fn step(&self, _: &str) {}
    fn done(&self, _: &str) {}
}

/// The config at `path`, or an empty one when there is none yet.
pub fn existing(path: &Path) -> anyhow::Result<Option<LoadedConfig>> {
    if !path.exists() {
        return Ok(None);
    }
    LoadedConfig::load(path).map(Some).map_err(|e| {
        anyhow::anyhow!("{e}\n  (init edits the existing config, so it must load first: fix it, or move it away to start over)")
    })
}

fn empty_config() -> Config {
    toml::from_str("").expect("an empty config loads")
}

/// A loaded view of an in-memory config, to resolve accounts before it is written.
fn view(path: &Path, config: &Config) -> LoadedConfig {
    let base = path.parent().unwrap_or(Path::new("."));
    LoadedConfig {
        path: path.to_path_buf(),
        state_dir: config
            .state_dir
            .as_ref()
            .map(|d| base.join(d))
            .unwrap_or_else(config::default_state_dir),
        config: config.clone(),
    }
}

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
    let mut mailbox = crate::mailbox::aamp::Reader::new(account.clone())?;
    if let Err(error) = mailbox.connect().await {
        return Err(MailboxTestFailed {
            what: format!("JMAP login as {}", account.login),
            fix: error.fix("jmap_url"),
            error,
        }
        .into());
    }
    if let Err(error) = crate::mailbox::aamp::Sender::new(&account)?
        .check_smtp()
        .await
    {
        return Err(MailboxTestFailed {
            what: format!(
                "SMTP login as {} at {}:{} ({})",
                account.login,
                account.smtp_host,
                account.smtp_port,
                account.smtp_security.name()
            ),
            fix: error.fix("smtp_host, smtp_port and smtp_security"),
            error,
        }
        .into());
    }
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

fn service_host(aamp_url: &str) -> Option<String> {
    url::Url::parse(aamp_url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
}

/// The mailbox config for an agent's answers, starting from what the config had.
fn mailbox_config(
    name: &str,
    answers: &MailboxAnswers,
    aamp_url: Option<&str>,
    previous: Option<&MailboxConfig>,
) -> anyhow::Result<MailboxConfig> {
    // What the config had when it is of the kind answered; else a mailbox of that kind with
    // the keys every kind has kept.
    let common = previous.map(|m| m.common().clone()).unwrap_or_default();
    let start = |kind: MailboxKind| match previous {
        Some(m) if m.kind() == kind => m.clone(),
        _ => MailboxConfig::new(kind, common.clone()),
    };
    let (mut m, servers) = match answers {
        MailboxAnswers::Asmtp {
            asmtp_url,
            handle,
            token_file,
            insecure_tls,
        } => {
            let MailboxConfig::Asmtp(mut m) = start(MailboxKind::Asmtp) else {
                unreachable!("a mailbox of the kind asked for")
            };
            m.asmtp_url = Some(asmtp_url.clone());
            m.handle = Some(handle.clone());
            m.token_file = Some(token_file.clone());
            m.common.insecure_tls = *insecure_tls;
            return Ok(MailboxConfig::Asmtp(m));
        }
        MailboxAnswers::Amp {
            amp_url,
            address,
            agent_id,
            api_key_file,
            insecure_tls,
        } => {
            let MailboxConfig::Amp(mut m) = start(MailboxKind::Amp) else {
                unreachable!("a mailbox of the kind asked for")
            };
            m.amp_url = Some(amp_url.clone());
            m.address = Some(address.clone());
            m.agent_id = Some(agent_id.clone());
            m.api_key_file = Some(api_key_file.clone());
            m.common.insecure_tls = *insecure_tls;
            return Ok(MailboxConfig::Amp(m));
        }
        MailboxAnswers::Samp {
            samp_url,
            key_file,
            insecure_tls,
        } => {
            let MailboxConfig::Samp(mut m) = start(MailboxKind::Samp) else {
                unreachable!("a mailbox of the kind asked for")
            };
            m.samp_url = Some(samp_url.clone());
            m.key_file = Some(key_file.clone());
            m.common.insecure_tls = *insecure_tls;
            return Ok(MailboxConfig::Samp(m));
        }
        MailboxAnswers::Keep => {
            return previous.cloned().with_context(|| format!("agent {name}: mailbox \"keep\", but the config has no mailbox {name:?} to keep: register one or give an existing account"));
        }
        MailboxAnswers::Register {
            slug,
            description,
            servers,
        } => {
            let Some(aamp_url) = aamp_url else {
                bail!("agent {name}: registering a mailbox needs the AAMP service: set aamp_url in the answers");
            };
            let MailboxConfig::Aamp(mut m) = start(MailboxKind::Aamp) else {
                unreachable!("a mailbox of the kind asked for")
            };
            if m.aamp_url.as_deref() != Some(aamp_url) || m.credentials_file.is_none() {
                m.credentials_file = Some(PathBuf::from(format!("{name}.json")));
            }
            m.email = None;
            m.password = None;
            m.password_file = None;
            m.login = None;
            m.slug = slug.clone().or(m.slug);
            m.description = description.clone().or(m.description);
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
            (m, servers)
        }
        MailboxAnswers::Existing {
            email,
            login,
            password,
            password_file,
            servers,
        } => {
            let MailboxConfig::Aamp(mut m) = start(MailboxKind::Aamp) else {
                unreachable!("a mailbox of the kind asked for")
            };
            m.credentials_file = None;
            m.email = Some(email.clone());
            m.login = login.clone();
            // A password given here stays in memory until the account passed its test; then
            // it goes into `<name>.password` (see `apply`).
            (m.password, m.password_file) = match (password, password_file) {
                (_, Some(file)) => (None, Some(file.clone())),
                (Some(p), None) => (Some(p.clone()), None),
                (None, None) => bail!("agent {name}: an existing account needs its password (password or password_file)"),
            };
            let (Some(jmap), Some(smtp)) = (&servers.jmap_url, &servers.smtp_host) else {
                bail!("agent {name}: an existing account needs jmap_url and smtp_host");
            };
            m.jmap_url = jmap.clone();
            m.smtp_host = smtp.clone();
            if let Some(url) = aamp_url {
                m.aamp_url = Some(url.to_string());
            }
            (m, servers)
        }
    };
    m.smtp_port = servers.smtp_port;
    m.smtp_security = servers.smtp_security.unwrap_or_default();
    m.common.insecure_tls = servers.insecure_tls;
    Ok(MailboxConfig::Aamp(m))
}

/// Turns answers into the config at `path` (and its credential files), testing each mailbox
/// live first. Nothing is written when a mailbox fails its test.
pub async fn apply(
    answers: &Answers,
    path: &Path,
    progress: &dyn Progress,
) -> anyhow::Result<Applied> {
    let previous = existing(path)?;
    let before = std::fs::read_to_string(path).ok();
    let mut config = previous
        .as_ref()
        .map(|c| c.config.clone())
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
    let mut applied = Applied {
        config: path.to_path_buf(),
        ..Applied::default()
    };
    // Passwords to write once every mailbox passed its test: (file, bytes).
    let mut secrets: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    for agent in &answers.agents {
        let name = agent.name.as_str();
        if !config::valid_name(name) {
            bail!("agent name {name:?}: use lower-case letters, digits, - and _");
        }
        let probe = view(path, &config);
        crate::runner::Profile::find(&probe.profile_ref(&agent.profile), &probe.profile_dirs())
            .with_context(|| format!("agent {name}: profile {:?}", agent.profile))?;
        let previous_agent = config.agents.iter().find(|a| a.name == name).cloned();
        let mailbox_name = previous_agent
            .as_ref()
            .and_then(|a| a.mailbox.clone())
            .unwrap_or_else(|| name.to_string());
        let (email, how) = set_up_mailbox(
            &mut config,
            path,
            &mailbox_name,
            &format!("agent {name}"),
            &agent.mailbox,
            answers.aamp_url.as_deref(),
            progress,
            &mut secrets,
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
        applied.agents.push(AppliedAgent {
            name: name.to_string(),
            email,
            mailbox: mailbox_name,
            how,
            allow_from: agent.allow_from.clone(),
            pairing: None,
        });
    }
    if let Some(own) = &answers.own_mailbox {
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
        let (email, _) = set_up_mailbox(
            &mut config,
            path,
            &own.name,
            &format!("your mailbox {}", own.name),
            &own.mailbox,
            answers.aamp_url.as_deref(),
            progress,
            &mut secrets,
        )
        .await?;
        if own.allow {
            for agent in &mut config.agents {
                if !agent
                    .allow_from
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(&email))
                {
                    agent.allow_from.push(email.clone());
                }
            }
            for applied_agent in &mut applied.agents {
                if !applied_agent
                    .allow_from
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(&email))
                {
                    applied_agent.allow_from.push(email.clone());
                }
            }
        }
        applied.own_mailbox = Some((own.name.clone(), email));
    }
    for (file, bytes) in &secrets {
        crate::fsio::write_atomic(file, bytes, 0o600)
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    let text = config::render(&config);
    if before.as_deref() != Some(text.as_str()) {
        crate::fsio::write_atomic(path, text.as_bytes(), 0o600)
            .with_context(|| format!("cannot write {}", path.display()))?;
        applied.written = true;
    }
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

/// Puts one mailbox into `config` from its answers, registers it when it is new with the AAMP
/// service, and tests it live; a password given in the answers is queued for `secrets`.
/// `owner` names it in an error ("agent helper"). Returns its address and how it came
/// (`registered`, `reused`, `account`, ...).
#[allow(clippy::too_many_arguments)]
async fn set_up_mailbox(
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

/// A pairing code for an agent: the live one if there is one, else a new one.
pub fn pairing(config: &LoadedConfig, agent: &str, ttl: Duration) -> anyhow::Result<Pairing> {
    let entry = config
        .config
        .agents
        .iter()
        .find(|a| a.name == agent)
        .with_context(|| format!("no agent {agent:?} in {}", config.path.display()))?;
    let mailbox = entry.mailbox_name().to_string();
    let email = config.mailbox_address(&mailbox)?;
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("cannot create {}", config.state_dir.display()))?;
    let journal = crate::dispatch::Journal::open(&config.state().journal())?;
    let (code, expires) = match journal.fresh_pair_code(agent, Duration::from_secs(120))? {
        Some(live) => live,
        None => {
            let code = crate::dispatch::new_pair_code();
            let expires = journal.add_pair_code(agent, &code, ttl)?;
            (code, expires)
        }
    };
    Ok(Pairing {
        url: format!(
            "aamp://connect?mailbox={}&pair_code={}",
            crate::protocol::codec::encode_uri_component(&email),
            code
        ),
        code,
        expires_at: crate::protocol::time::format_utc(expires),
    })
}

/// The pairing link as a QR code for a terminal.
pub fn qr(url: &str) -> String {
    qrcode::QrCode::new(url.as_bytes())
        .map(|q| {
            q.render::<qrcode::render::unicode::Dense1x2>()
                .quiet_zone(true)
                .build()
        })
        .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

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
