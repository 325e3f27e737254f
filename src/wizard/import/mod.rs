//! `aamp-bridge import`: the reference bridges' files (`~/.aamp/acp-bridge/config.json`,
//! `~/.aamp/cli-bridge/config.json`, their credentials, sender policies, pairing files and CLI
//! profiles) as this bridge's config. Their shapes are the ones their docs and code define
//! (zod schemas); unknown fields are ignored, as those bridges do.
//!
//! What does not carry over is said, never silently changed: `rejectUnauthorized: false`
//! (their default) does not turn certificate checks off here, and a `shell: true` profile is
//! run without a shell.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use serde::Deserialize;
use serde_json::Value;

use crate::config::{AampMailbox, AgentConfig, Config, MailboxConfig};
use crate::dispatch::policy::Rule;

mod profiles;

use profiles::{acp_profile, profile_toml, their_builtin, toml_string, CliProfile};

/// Everything an import would write.
#[derive(Debug, Default)]
pub struct Plan {
    pub config: Option<Config>,
    /// Files beside the config: (path, bytes, mode).
    pub files: Vec<(PathBuf, Vec<u8>, u32)>,
    /// Pairing codes still valid: (agent, code, time left).
    pub pair_codes: Vec<(String, String, Duration)>,
    /// What the person should know.
    pub notes: Vec<String>,
    /// The reference configs read.
    pub sources: Vec<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BridgeConfig {
    aamp_host: Option<String>,
    reject_unauthorized: Option<bool>,
    #[serde(default)]
    agents: Vec<BridgeAgent>,
    /// CLI bridge: named profiles.
    #[serde(default)]
    profiles: BTreeMap<String, CliProfile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BridgeAgent {
    name: String,
    acp_command: Option<String>,
    cli_profile: Option<Value>,
    slug: Option<String>,
    description: Option<String>,
    summary: Option<String>,
    card_text: Option<String>,
    card_file: Option<String>,
    credentials_file: Option<String>,
    pairing_file: Option<String>,
    sender_policies_file: Option<String>,
    #[serde(default)]
    sender_policies: Vec<Policy>,
    #[serde(default)]
    sender_whitelist: Vec<String>,
    task_dispatch_concurrency: Option<usize>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Policy {
    sender: String,
    #[serde(default)]
    dispatch_context_rules: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PairingFile {
    pair_code: Option<String>,
    expires_at: Option<String>,
    consumed_at: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Credentials {
    email: String,
    mailbox_token: Option<String>,
    smtp_password: String,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Option<T>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map(Some).with_context(|| {
            format!(
                "{} is not in the shape the reference bridges write",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// `~` and relative paths in their files, as they resolve them.
fn their_path(text: &str, home: &Path, base: &Path) -> PathBuf {
    if let Some(rest) = text.strip_prefix("~/") {
        home.join(rest)
    } else {
        base.join(text)
    }
}

/// Reads the reference bridges under `from` (normally `~/.aamp`) into a plan for the config
/// at `config_path`, merged into `existing` (its agents win).
pub fn plan(from: &Path, config_path: &Path, existing: Option<Config>) -> anyhow::Result<Plan> {
    let mut import = Import {
        home: std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| from.parent().unwrap_or(Path::new("/")).to_path_buf()),
        dir: config_path.parent().unwrap_or(Path::new(".")),
        config_path,
        plan: Plan::default(),
        config: existing.unwrap_or_else(super::empty_config),
        custom_profiles: false,
    };
    for (kind, slug_suffix) in [("acp-bridge", "bridge"), ("cli-bridge", "cli-bridge")] {
        let Some(source) = Source::read(from, kind, slug_suffix)? else {
            continue;
        };
        import.plan.sources.push(source.file.clone());
        if source.bridge.reject_unauthorized != Some(true) {
            import.plan.notes.push(format!("{}: TLS certificates were not checked there (rejectUnauthorized is false or unset); here they are. If {} has a self-signed certificate, set insecure_tls = true on its mailboxes.", source.file.display(), source.host));
        }
        for agent in &source.bridge.agents {
            import.agent(&source, agent)?;
        }
    }
    if import.plan.sources.is_empty() {
        anyhow::bail!(
            "no reference bridge config under {} (looked for acp-bridge/config.json and cli-bridge/config.json); pass --from DIR if they live elsewhere",
            from.display()
        );
    }
    if import.custom_profiles && import.config.profiles_dir.is_none() {
        import.config.profiles_dir = Some(PathBuf::from("profiles"));
    }
    import.plan.config = Some(import.config);
    Ok(import.plan)
}

/// One reference bridge: its folder, its config and the AAMP service it used.
struct Source {
    /// `acp-bridge` or `cli-bridge`.
    kind: &'static str,
    /// What their slugs default to after the agent's name.
    slug_suffix: &'static str,
    root: PathBuf,
    file: PathBuf,
    bridge: BridgeConfig,
    host: String,
}

impl Source {
    fn read(
        from: &Path,
        kind: &'static str,
        slug_suffix: &'static str,
    ) -> anyhow::Result<Option<Source>> {
        let root = from.join(kind);
        let file = root.join("config.json");
        let Some(bridge) = read_json::<BridgeConfig>(&file)? else {
            return Ok(None);
        };
        let host = bridge
            .aamp_host
            .clone()
            .unwrap_or_else(|| "https://meshmail.ai".into())
            .trim_end_matches('/')
            .to_string();
        Ok(Some(Source {
            kind,
            slug_suffix,
            root,
            file,
            bridge,
            host,
        }))
    }

    /// An agent's file of theirs: the one its config names, else `<folder>/<agent>.json`.
    fn agent_file(&self, named: Option<&str>, home: &Path, folder: &str, agent: &str) -> PathBuf {
        named
            .map(|f| their_path(f, home, &self.root))
            .unwrap_or_else(|| self.root.join(folder).join(format!("{agent}.json")))
    }
}

/// An import under way: the plan and config so far, and where its files go.
struct Import<'a> {
    home: PathBuf,
    /// The config's folder.
    dir: &'a Path,
    config_path: &'a Path,
    plan: Plan,
    config: Config,
    /// Whether a profile file of theirs is written (the config then needs `profiles_dir`).
    custom_profiles: bool,
}

impl Import<'_> {
    /// One agent of theirs as an agent of ours: its profile, mailbox, senders, pairing code
    /// and card. An agent that cannot be carried over is skipped with a note.
    fn agent(&mut self, source: &Source, agent: &BridgeAgent) -> anyhow::Result<()> {
        let Some(name) = self.name(source, agent) else {
            return Ok(());
        };
        let Some(profile) = self.profile(source, agent, &name)? else {
            return Ok(());
        };
        self.mailbox(source, agent, &name)?;
        let mut agent_config = self.senders(source, agent, &name, &profile)?;
        self.pair_code(source, agent, &name)?;
        agent_config.summary = agent.summary.clone();
        agent_config.card = agent.card_text.clone();
        agent_config.card_file = agent
            .card_file
            .as_deref()
            .map(|f| their_path(f, &self.home, &source.root));
        if let Some(n) = agent.task_dispatch_concurrency {
            agent_config.max_concurrent_tasks = n.max(1);
        }
        self.config.agents.push(agent_config);
        Ok(())
    }

    /// The agent's name here; `None` (with a note) when it is not usable or already taken.
    fn name(&mut self, source: &Source, agent: &BridgeAgent) -> Option<String> {
        let mut name = crate::fsio::safe_word(&agent.name.to_ascii_lowercase(), '-', usize::MAX);
        if self.config.agents.iter().any(|a| a.name == name) {
            if self.plan.sources.len() == 1 || source.kind == "acp-bridge" {
                self.plan.notes.push(format!(
                    "agent {name}: already in {}; kept as it is",
                    self.config_path.display()
                ));
                return None;
            }
            name = format!("{name}-cli");
        }
        if !crate::config::valid_name(&name) {
            self.plan.notes.push(format!(
                "agent {:?}: not a usable name; skipped",
                agent.name
            ));
            return None;
        }
        Some(name)
    }

    /// The agent's profile here (a built-in, or a file of theirs carried over); `None` (with a
    /// note) when it has none that can be.
    fn profile(
        &mut self,
        source: &Source,
        agent: &BridgeAgent,
        name: &str,
    ) -> anyhow::Result<Option<String>> {
        if let Some(command) = &agent.acp_command {
            return Ok(Some(self.acp_command(command, name)));
        }
        let Some((label, profile)) = self.cli_profile(source, agent, name)? else {
            return Ok(None);
        };
        if let Some(p) = profile {
            let text = profile_toml(&label, &p, &mut self.plan.notes);
            let path = self.dir.join("profiles").join(format!("{label}.toml"));
            if !self.plan.files.iter().any(|(f, _, _)| *f == path) {
                self.plan.files.push((path, text.into_bytes(), 0o644));
            }
            self.custom_profiles = true;
        }
        Ok(Some(label))
    }

    /// An `acpCommand` as one of our ACP profiles, or else as a profile file of its own.
    fn acp_command(&mut self, command: &str, name: &str) -> String {
        if let Some(p) = acp_profile(command) {
            return p;
        }
        let mut words = command.split_whitespace();
        let program = words.next().unwrap_or_default();
        let args: Vec<String> = words.map(toml_string).collect();
        let text = format!(
            "# Imported from aamp-acp-bridge: acpCommand {}.\nname = {}\nkind = \"acp\"\ncommand = {}\nargs = [{}]\n",
            toml_string(command),
            toml_string(&format!("{name}-imported")),
            toml_string(program),
            args.join(", ")
        );
        // Named apart from the built-ins, which a same-named file would replace.
        let label = format!("{name}-imported");
        self.plan.files.push((
            self.dir.join("profiles").join(format!("{label}.toml")),
            text.into_bytes(),
            0o644,
        ));
        self.custom_profiles = true;
        label
    }

    /// A `cliProfile`: its name here, and their profile when it is to be carried over as a
    /// file (`None` for one of our built-ins). `None` (with a note) when it is not found.
    fn cli_profile(
        &mut self,
        source: &Source,
        agent: &BridgeAgent,
        name: &str,
    ) -> anyhow::Result<Option<(String, Option<CliProfile>)>> {
        let p = match &agent.cli_profile {
            Some(Value::String(p)) => p,
            Some(inline @ Value::Object(_)) => {
                let profile = serde_json::from_value::<CliProfile>(inline.clone())
                    .with_context(|| format!("agent {name}: the inline cliProfile"))?;
                return Ok(Some((name.to_string(), Some(profile))));
            }
            _ => {
                self.plan.notes.push(format!(
                    "agent {name}: neither acpCommand nor cliProfile; skipped"
                ));
                return Ok(None);
            }
        };
        let found = source.bridge.profiles.get(p).cloned().map(Ok).or_else(|| {
            read_json::<CliProfile>(&source.root.join("profiles").join(format!("{p}.json")))
                .transpose()
        });
        Ok(match found.transpose()? {
            Some(profile) => Some((p.clone(), Some(profile))),
            None if ["claude", "codex", "gemini"].contains(&p.as_str()) => {
                self.plan.notes.push(format!("agent {name}: profile {p:?} becomes the built-in {p:?}, which reads the CLI's JSON stream (live progress) instead of plain text"));
                Some((p.clone(), None))
            }
            None => match their_builtin(p) {
                Some(profile) => Some((p.clone(), Some(profile))),
                None => {
                    self.plan.notes.push(format!("agent {name}: profile {p:?} not found in {} or its profiles folder; skipped", source.file.display()));
                    None
                }
            },
        })
    }

    /// The agent's mailbox on their AAMP service, with its credentials carried over when
    /// there are any (else it registers at the bridge's first start).
    fn mailbox(&mut self, source: &Source, agent: &BridgeAgent, name: &str) -> anyhow::Result<()> {
        let host = &source.host;
        let credentials_path = source.agent_file(
            agent.credentials_file.as_deref(),
            &self.home,
            "credentials",
            &agent.name,
        );
        let credentials = read_json::<Credentials>(&credentials_path)?;
        let mut mailbox = AampMailbox {
            jmap_url: format!("{host}/.well-known/jmap"),
            smtp_host: super::mailbox_config::service_host(host).unwrap_or_default(),
            aamp_url: Some(host.clone()),
            credentials_file: Some(PathBuf::from(format!("{name}.json"))),
            slug: Some(
                agent
                    .slug
                    .clone()
                    .unwrap_or_else(|| format!("{}-{}", agent.name, source.slug_suffix)),
            ),
            description: agent.description.clone(),
            ..AampMailbox::default()
        };
        match credentials {
            Some(c) => {
                // Their SDKs send from the address's domain, port 587.
                if let Some(domain) = c.email.rsplit_once('@').map(|(_, d)| d.to_string()) {
                    mailbox.smtp_host = domain;
                }
                let ours = crate::config::Credentials {
                    email: c.email.clone(),
                    mailbox_token: c.mailbox_token.clone().unwrap_or_else(|| {
                        use base64::Engine as _;
                        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.email, c.smtp_password))
                    }),
                    smtp_password: c.smtp_password.clone(),
                };
                let bytes = serde_json::to_vec_pretty(&ours).expect("credentials serialize");
                self.plan.files.push((self.dir.join(format!("{name}.json")), bytes, 0o600));
            }
            None => self.plan.notes.push(format!("agent {name}: no credentials at {}; the bridge registers a new mailbox with {host} at its first start", credentials_path.display())),
        }
        self.config
            .mailboxes
            .insert(name.to_string(), MailboxConfig::Aamp(mailbox));
        Ok(())
    }

    /// The agent's entry with who may send it tasks: their sender policies (given and paired)
    /// and whitelist.
    fn senders(
        &mut self,
        source: &Source,
        agent: &BridgeAgent,
        name: &str,
        profile: &str,
    ) -> anyhow::Result<AgentConfig> {
        let mut agent_config: AgentConfig = toml::from_str(&format!(
            "name = {}\nprofile = {}\n",
            toml_string(name),
            toml_string(profile)
        ))
        .expect("a minimal agent loads");
        let paired_file = source.agent_file(
            agent.sender_policies_file.as_deref(),
            &self.home,
            "sender-policies",
            &agent.name,
        );
        let paired = read_json::<Vec<Policy>>(&paired_file)?.unwrap_or_default();
        for policy in agent.sender_policies.iter().chain(paired.iter()) {
            let context: BTreeMap<String, Vec<String>> = policy
                .dispatch_context_rules
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if context.is_empty() {
                if !agent_config.allow_from.contains(&policy.sender) {
                    agent_config.allow_from.push(policy.sender.clone());
                }
            } else {
                agent_config.senders.push(Rule {
                    sender: policy.sender.clone(),
                    context,
                });
            }
        }
        for sender in &agent.sender_whitelist {
            if !agent_config.allow_from.contains(sender) {
                agent_config.allow_from.push(sender.clone());
            }
        }
        if agent_config.allow_from.is_empty() && agent_config.senders.is_empty() {
            self.plan.notes.push(format!("agent {name}: no sender policy: nobody may send it tasks until `aamp-bridge policy allow` or `aamp-bridge pair`"));
        }
        Ok(agent_config)
    }

    /// Their pairing code for the agent, when it is still valid and unused.
    fn pair_code(
        &mut self,
        source: &Source,
        agent: &BridgeAgent,
        name: &str,
    ) -> anyhow::Result<()> {
        let pairing_file = source.agent_file(
            agent.pairing_file.as_deref(),
            &self.home,
            "pairing",
            &agent.name,
        );
        let Some(p) = read_json::<PairingFile>(&pairing_file)? else {
            return Ok(());
        };
        let left = p
            .expires_at
            .as_deref()
            .and_then(crate::protocol::time::parse)
            .and_then(|t| t.duration_since(SystemTime::now()).ok());
        if let (Some(code), None, Some(left)) =
            (p.pair_code.filter(|c| !c.is_empty()), p.consumed_at, left)
        {
            self.plan.pair_codes.push((name.to_string(), code, left));
        }
        Ok(())
    }
}

/// Writes a plan: the files, then the config (checked by loading it), then the pairing codes.
pub fn write(plan: &Plan, config_path: &Path) -> anyhow::Result<()> {
    for (path, bytes, mode) in &plan.files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        crate::fsio::write_atomic(path, bytes, *mode)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let config = plan.config.as_ref().context("nothing to write")?;
    crate::fsio::write_atomic(config_path, crate::config::render(config).as_bytes(), 0o600)
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    let loaded = crate::config::LoadedConfig::load(config_path)?;
    if !plan.pair_codes.is_empty() {
        std::fs::create_dir_all(&loaded.state_dir)?;
        let journal = crate::dispatch::Journal::open(&loaded.state().journal())?;
        for (agent, code, left) in &plan.pair_codes {
            if journal
                .fresh_pair_code(agent, Duration::ZERO)?
                .map(|(c, _)| c)
                != Some(code.clone())
            {
                journal.add_pair_code(agent, code, *left)?;
            }
        }
    }
    Ok(())
}
