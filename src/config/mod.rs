//! The one TOML config file: named mailboxes and the agents that use them. Loading validates
//! everything up front; each error names the file, the key and what to do about it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod render;
pub use render::render;

pub mod policy;

/// A config problem, said as `file: key: problem` followed by the fix.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    pub path: PathBuf,
    pub key: String,
    pub problem: String,
    pub fix: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.problem)?;
        if !self.fix.is_empty() {
            write!(f, "\n  fix: {}", self.fix)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where cursors and task workspaces live. Default: `$XDG_STATE_HOME/aamp-bridge`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// Extra folder of profile files, searched before the user's and the built-in ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profiles_dir: Option<PathBuf>,
    /// Tasks running at once across all agents (each agent also has its own limit); no
    /// limit when unset. Waiting tasks go by X-AAMP-Priority, then by arrival.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_tasks: Option<usize>,
    /// After SIGTERM/SIGINT, how long running tasks get to finish before they are stopped
    /// and left in the journal for the next start.
    #[serde(default = "default_grace_secs")]
    pub shutdown_grace_secs: u64,
    /// How long an ack or result that cannot be sent is retried (across restarts) before the
    /// bridge gives up on it.
    #[serde(default = "default_outbox_hours")]
    pub outbox_retry_hours: u64,
    /// Finished tasks are kept in the journal this many days (for duplicates and history).
    #[serde(default = "default_journal_days")]
    pub journal_retention_days: u64,
    #[serde(default)]
    pub mailboxes: BTreeMap<String, MailboxConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<AgentConfig>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PushTransport {
    #[default]
    Auto,
    Websocket,
    Eventsource,
}

/// The evidence a mailbox needs before it believes a mail's `From:`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SenderAuth {
    /// Authenticated submission on this server, or (with `authserv_id`) its
    /// Authentication-Results.
    #[default]
    Auto,
    /// Only: this server accepted the mail from an authenticated submission by that address.
    Submission,
    /// Only: this server's Authentication-Results (`authserv_id`) pass for the From domain.
    AuthenticationResults,
    /// Believe the From header as it is. Anyone who can put mail in the Inbox can then act
    /// as any allowed sender.
    None,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    /// Upgrade with STARTTLS, and refuse to send if the server does not offer it.
    #[default]
    Starttls,
    /// Implicit TLS from the first byte (usually port 465).
    Tls,
    /// No TLS at all. Allowed only to a loopback host.
    Plain,
}

impl SmtpSecurity {
    pub fn default_port(self) -> u16 {
        match self {
            SmtpSecurity::Starttls | SmtpSecurity::Plain => 587,
            SmtpSecurity::Tls => 465,
        }
    }
}

/// Which mailbox system a mailbox lives in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MailboxKind {
    /// AAMP: JMAP to read, SMTP to send, an optional AAMP service (the default).
    #[default]
    Aamp,
    /// AMP (Agent Mailer Protocol): an HTTP broker, polled (README: "AMP mailboxes").
    Amp,
    /// ASMTP (Agent Simple Mail Transfer Protocol): an operator with push (README: "ASMTP
    /// mailboxes").
    Asmtp,
}

#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MailboxConfig {
    /// `aamp` (the default) or `amp`.
    #[serde(default)]
    pub kind: MailboxKind,
    /// AMP: the broker's base URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amp_url: Option<String>,
    /// AMP: the agent's address on the broker (`name@user.domain`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// AMP: the agent's id on the broker (from `POST /agents/register`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// AMP: a file holding the user's API key (`amk_...`), mode 0600.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<PathBuf>,
    /// ASMTP: the operator's base URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asmtp_url: Option<String>,
    /// ASMTP: the agent's handle (`@owner.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// ASMTP: a file holding the agent's bearer token, mode 0600.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The mailbox's address; mail to it is the agent's work. Not needed with
    /// `credentials_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// A credentials file (`{"email", "mailboxToken", "smtpPassword"}`, mode 0600) instead of
    /// email and password. When it does not exist and `aamp_url` is set, the bridge registers
    /// a mailbox with the AAMP service and writes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<PathBuf>,
    /// For registration: the wanted address prefix (default: the mailbox's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slug: Option<String>,
    /// For registration: what the mailbox is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JMAP session URL (`https://host/.well-known/jmap`) or the server's base URL.
    #[serde(default)]
    pub jmap_url: String,
    /// Login name for JMAP and SMTP; default: `email`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login: Option<String>,
    /// The password inline (the config file must then be private), or ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// ... a file holding it (mode 0600), which is preferred.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    #[serde(default)]
    pub smtp_host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smtp_port: Option<u16>,
    #[serde(default)]
    pub smtp_security: SmtpSecurity,
    /// Accept invalid TLS certificates from this mailbox's hosts. Off unless set.
    #[serde(default)]
    pub insecure_tls: bool,
    /// Allow plain `http://` in `jmap_url`/`aamp_url` to a host that is not loopback: the
    /// password then crosses the network unencrypted. Off unless set.
    #[serde(default, skip_serializing_if = "is_false")]
    pub insecure_http: bool,
    /// Seconds between `Email/changes` polls when push is not available.
    #[serde(default = "default_poll_secs")]
    pub poll_interval_secs: u64,
    /// Use JMAP push when the server offers it.
    #[serde(default = "default_true")]
    pub push: bool,
    /// Which push: `auto` (WebSocket, else EventSource), `websocket` or `eventsource`.
    #[serde(default)]
    pub push_transport: PushTransport,
    /// The AAMP service in front of the mail server (its `/.well-known/aamp`), for live task
    /// streams. Without it tasks run without a stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aamp_url: Option<String>,
    /// Keep a copy of every mail the bridge sends in this mailbox's Sent folder.
    #[serde(default = "default_true")]
    pub save_sent: bool,
    /// What makes a `From:` believable (see the README's security model): `auto` (the
    /// default: this server's authenticated submission, or `Authentication-Results` from
    /// `authserv_id` when set), `submission`, `authentication-results`, or `none`.
    #[serde(default)]
    pub sender_auth: SenderAuth,
    /// The receiving server's RFC 8601 authserv-id, whose `Authentication-Results` are
    /// believed (dmarc=pass, or dkim/spf pass aligned with the From domain).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authserv_id: Option<String>,
    /// While push is up, seconds between safety polls (a missed push costs at most this).
    #[serde(default = "default_reconcile_secs")]
    pub reconcile_interval_secs: u64,
}

fn default_true() -> bool {
    true
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_reconcile_secs() -> u64 {
    60
}

impl fmt::Debug for MailboxConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MailboxConfig")
            .field("email", &self.email)
            .field("jmap_url", &self.jmap_url)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_file", &self.password_file)
            .field("smtp_host", &self.smtp_host)
            .field("smtp_port", &self.smtp_port)
            .field("smtp_security", &self.smtp_security)
            .finish_non_exhaustive()
    }
}

fn default_refusals() -> u32 {
    20
}

fn default_per_sender() -> u32 {
    1000
}

fn default_hops() -> u32 {
    8
}

fn default_turns() -> u32 {
    100
}

fn default_grace_secs() -> u64 {
    30
}

fn default_outbox_hours() -> u64 {
    24
}

fn default_journal_days() -> u64 {
    30
}

fn default_poll_secs() -> u64 {
    5
}

fn default_concurrency() -> usize {
    1
}

fn default_queue() -> usize {
    100
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Lower-case letters, digits, `-` and `_`.
    pub name: String,
    /// A key of `[mailboxes]`; default: the agent's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mailbox: Option<String>,
    /// A profile name (from the profile folders) or a path to a profile file.
    pub profile: String,
    /// Senders allowed to dispatch tasks: addresses, `*@domain` or `@domain`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_from: Vec<String>,
    /// Tasks this agent runs at once; the rest wait in order.
    #[serde(default = "default_concurrency")]
    pub max_concurrent_tasks: usize,
    /// A one-line summary of what the agent does, for the AAMP service's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The agent's card (markdown) for the directory, inline or ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card: Option<String>,
    /// ... in a file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card_file: Option<PathBuf>,
    /// Tasks running or waiting at most; further dispatches are answered "busy".
    #[serde(default = "default_queue")]
    pub max_queued_tasks: usize,
    /// Allow rules with dispatch-context conditions (`[[agents.senders]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub senders: Vec<policy::Rule>,
    /// Allow rules in the reference bridges' text form (`allow_from: ...` and
    /// `context_equals: key=value` lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender_policy: Option<String>,
    /// Senders refused whatever else allows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_from: Vec<String>,
    /// What a sender the policy refuses hears: `reject` (a rejected result) or `ignore`.
    #[serde(default)]
    pub unknown_senders: policy::UnknownSenders,
    /// Rejections sent to refused senders per hour at most (the rest get nothing), so the
    /// bridge cannot be used to send mail to addresses of someone else's choosing.
    #[serde(default = "default_refusals")]
    pub max_refusals_per_hour: u32,
    /// Tasks one sender may dispatch to this agent per hour.
    #[serde(default = "default_per_sender")]
    pub max_tasks_per_sender_per_hour: u32,
    /// Tasks this agent takes per 24 hours at most (no limit when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daily_task_budget: Option<u32>,
    /// Turns one conversation (Session-Key) may take.
    #[serde(default = "default_turns")]
    pub max_turns_per_session: u32,
    /// A dispatch that agents passed on this many times (`X-AAMP-Hop-Count`) is rejected
    /// instead of run: two agents handing each other work stop there.
    #[serde(default = "default_hops")]
    pub max_hops: u32,
    /// How a cancelled task is answered: `result` (rejected, "cancelled") or `silent`.
    #[serde(default)]
    pub cancel_reply: policy::CancelReply,
}

/// A mailbox with its password resolved.
#[derive(Clone)]
pub struct Account {
    pub name: String,
    pub email: String,
    pub jmap_url: url::Url,
    pub login: String,
    pub password: String,
    pub smtp_host: String,
    pub smtp_port: u16,
    pub smtp_security: SmtpSecurity,
    pub insecure_tls: bool,
    pub poll_interval: std::time::Duration,
    pub push: bool,
    pub push_transport: PushTransport,
    pub reconcile_interval: std::time::Duration,
    pub save_sent: bool,
    pub aamp_url: Option<url::Url>,
    pub sender_auth: SenderAuth,
    pub authserv_id: Option<String>,
}

impl fmt::Debug for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Account")
            .field("name", &self.name)
            .field("email", &self.email)
            .field("jmap_url", &self.jmap_url.as_str())
            .field("smtp", &format!("{}:{}", self.smtp_host, self.smtp_port))
            .finish_non_exhaustive()
    }
}

/// An AMP mailbox, checked and with its API key read.
#[derive(Clone)]
pub struct AmpAccount {
    pub name: String,
    pub url: url::Url,
    pub address: String,
    pub agent_id: String,
    pub api_key: String,
    pub poll_interval: std::time::Duration,
    pub insecure_tls: bool,
}

impl fmt::Debug for AmpAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmpAccount")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// An ASMTP mailbox, checked and with its token read.
#[derive(Clone)]
pub struct AsmtpAccount {
    pub name: String,
    pub url: url::Url,
    pub handle: String,
    pub token: String,
    pub poll_interval: std::time::Duration,
    pub insecure_tls: bool,
}

impl fmt::Debug for AsmtpAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsmtpAccount")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

/// A config that passed validation, with relative paths resolved against its folder.
#[derive(Clone, Debug)]
pub struct LoadedConfig {
    pub path: PathBuf,
    pub config: Config,
    pub state_dir: PathBuf,
}

impl AgentConfig {
    /// The agent's sender policy from the config (rules added with `aamp-bridge policy` or by
    /// pairing live in the journal and are added by the dispatcher).
    pub fn sender_policy(&self) -> policy::SenderPolicy {
        let text_rules = self
            .sender_policy
            .as_deref()
            .and_then(|t| policy::parse_text(t).ok())
            .unwrap_or_default();
        policy::SenderPolicy::new(&self.allow_from)
            .with_rules(self.senders.iter().cloned().chain(text_rules))
            .with_denied(self.deny_from.iter().cloned())
    }
}

impl LoadedConfig {
    fn error(
        &self,
        key: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            path: self.path.clone(),
            key: key.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
        let err = |key: &str, problem: String, fix: &str| ConfigError {
            path: path.to_path_buf(),
            key: key.to_string(),
            problem,
            fix: fix.to_string(),
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            err(
                "",
                format!("cannot read the config file: {e}"),
                "run `aamp-bridge init` to make one (or `aamp-bridge import` from the reference bridges), or pass another file with --config",
            )
        })?;
        Self::from_text(path, &text)
    }

    /// Validates config text as if read from `path` (relative paths resolve against its
    /// folder; files it names are not read here).
    pub fn from_text(path: &Path, text: &str) -> Result<LoadedConfig, ConfigError> {
        let err = |key: &str, problem: String, fix: &str| ConfigError {
            path: path.to_path_buf(),
            key: key.to_string(),
            problem,
            fix: fix.to_string(),
        };
        let config: Config = toml::from_str(text).map_err(|e| {
            let key = e.span().map(|s| line_of(text, s.start)).unwrap_or_default();
            err(
                &key,
                e.message().to_string(),
                "correct the TOML at that line; see the README's config reference",
            )
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let state_dir = match &config.state_dir {
            Some(dir) => base.join(dir),
            None => default_state_dir(),
        };
        let loaded = LoadedConfig {
            path: path.to_path_buf(),
            config,
            state_dir,
        };
        loaded.validate(text)?;
        Ok(loaded)
    }

    fn validate(&self, text: &str) -> Result<(), ConfigError> {
        let mut names = BTreeSet::new();
        for (i, agent) in self.config.agents.iter().enumerate() {
            let key = format!("agents[{i}]");
            if !valid_name(&agent.name) {
                return Err(self.error(
                    format!("{key}.name"),
                    format!("{:?} is not a valid agent name", agent.name),
                    "use lower-case letters, digits, '-' and '_'",
                ));
            }
            if !names.insert(agent.name.clone()) {
                return Err(self.error(
                    format!("{key}.name"),
                    format!("agent {:?} appears twice", agent.name),
                    "give each agent its own name",
                ));
            }
            let mailbox = agent.mailbox.clone().unwrap_or_else(|| agent.name.clone());
            if !self.config.mailboxes.contains_key(&mailbox) {
                return Err(self.error(
                    format!("{key}.mailbox"),
                    format!("no mailbox named {mailbox:?}"),
                    format!("add a [mailboxes.{mailbox}] table, or set mailbox = \"<name>\" to one of: {}", self.mailbox_names()),
                ));
            }
            if agent.max_queued_tasks < agent.max_concurrent_tasks {
                return Err(self.error(
                    format!("{key}.max_queued_tasks"),
                    "is smaller than max_concurrent_tasks",
                    "set it to at least max_concurrent_tasks",
                ));
            }
            if agent.max_concurrent_tasks == 0 {
                return Err(self.error(
                    format!("{key}.max_concurrent_tasks"),
                    "must be at least 1",
                    "set it to 1 or more",
                ));
            }
            let patterns = agent
                .allow_from
                .iter()
                .enumerate()
                .map(|(j, p)| (format!("{key}.allow_from[{j}]"), p))
                .chain(
                    agent
                        .deny_from
                        .iter()
                        .enumerate()
                        .map(|(j, p)| (format!("{key}.deny_from[{j}]"), p)),
                )
                .chain(
                    agent
                        .senders
                        .iter()
                        .enumerate()
                        .map(|(j, r)| (format!("{key}.senders[{j}].sender"), &r.sender)),
                );
            for (k, pattern) in patterns {
                if !pattern.contains('@') {
                    return Err(self.error(
                        k,
                        format!("{pattern:?} is not an address or a pattern"),
                        "write an address (a@b.com), a glob ('disp-*@b.com', '*@b.com') or '@b.com'",
                    ));
                }
            }
            if let Some(text) = &agent.sender_policy {
                if let Err(e) = policy::parse_text(text) {
                    return Err(self.error(
                        format!("{key}.sender_policy"),
                        e,
                        "write `allow_from: a@x, *@y` lines, each optionally followed by `context_equals: key=value, ...` lines",
                    ));
                }
            }
        }
        for name in self.config.mailboxes.keys() {
            // A mailbox the bridge will register is checked once it has its credentials.
            if self.is_amp(name) {
                self.amp_account(name)?;
            } else if self.is_asmtp(name) {
                self.asmtp_account(name)?;
            } else if self.registration(name).is_none() {
                self.account(name)?;
            }
        }
        let inline_secret = self.config.mailboxes.values().any(|m| m.password.is_some());
        if inline_secret && !is_private(&self.path) {
            let _ = text;
            return Err(self.error(
                "mailboxes.*.password",
                "the file holds a password but other users can read it",
                format!(
                    "run `chmod 600 {}`, or move the password to a password_file",
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }

    fn mailbox_names(&self) -> String {
        let names: Vec<&str> = self.config.mailboxes.keys().map(String::as_str).collect();
        if names.is_empty() {
            "(none defined)".to_string()
        } else {
            names.join(", ")
        }
    }

    /// Whether the named mailbox is an AMP mailbox.
    pub fn is_amp(&self, name: &str) -> bool {
        self.config
            .mailboxes
            .get(name)
            .is_some_and(|m| m.kind == MailboxKind::Amp)
    }

    /// Whether the named mailbox is an ASMTP mailbox.
    pub fn is_asmtp(&self, name: &str) -> bool {
        self.config
            .mailboxes
            .get(name)
            .is_some_and(|m| m.kind == MailboxKind::Asmtp)
    }

    /// The address mail to the named mailbox goes to, whatever its kind.
    pub fn mailbox_address(&self, name: &str) -> Result<String, ConfigError> {
        if self.is_amp(name) {
            Ok(self.amp_account(name)?.address)
        } else if self.is_asmtp(name) {
            Ok(self.asmtp_account(name)?.handle)
        } else {
            Ok(self.account(name)?.email)
        }
    }

    /// The keys set on mailbox `m` that belong to other kinds than `kind`.
    fn foreign_keys(m: &MailboxConfig, kind: MailboxKind) -> Vec<&'static str> {
        let aamp = [
            ("email", m.email.is_some()),
            ("credentials_file", m.credentials_file.is_some()),
            ("jmap_url", !m.jmap_url.is_empty()),
            ("smtp_host", !m.smtp_host.is_empty()),
            ("password", m.password.is_some()),
            ("password_file", m.password_file.is_some()),
            ("aamp_url", m.aamp_url.is_some()),
            ("insecure_http", m.insecure_http),
        ];
        let amp = [
            ("amp_url", m.amp_url.is_some()),
            ("address", m.address.is_some()),
            ("agent_id", m.agent_id.is_some()),
            ("api_key_file", m.api_key_file.is_some()),
        ];
        let asmtp = [
            ("asmtp_url", m.asmtp_url.is_some()),
            ("handle", m.handle.is_some()),
            ("token_file", m.token_file.is_some()),
        ];
        let mut out = Vec::new();
        for (owner, keys) in [
            (MailboxKind::Aamp, &aamp[..]),
            (MailboxKind::Amp, &amp[..]),
            (MailboxKind::Asmtp, &asmtp[..]),
        ] {
            if owner != kind {
                out.extend(keys.iter().filter(|(_, set)| *set).map(|(k, _)| *k));
            }
        }
        out
    }

    /// Plain `http://` to a host that is not loopback sends the mailbox's password in clear:
    /// refused unless the mailbox says `insecure_http = true`.
    fn refuse_cleartext(
        &self,
        key: &str,
        field: &str,
        url: &url::Url,
        allowed: bool,
    ) -> Result<(), ConfigError> {
        if url.scheme() == "http" && !allowed && !url.host_str().is_some_and(is_loopback) {
            return Err(self.error(
                format!("{key}.{field}"),
                format!(
                    "plain http to {} would send the password unencrypted",
                    url.host_str().unwrap_or_default()
                ),
                "use https; or, only on a network you trust, set insecure_http = true on this mailbox",
            ));
        }
        Ok(())
    }

    /// A secret read from a 0600 file named by `key` (relative to the config's folder).
    fn secret_file(
        &self,
        key: &str,
        file: Option<&PathBuf>,
        what: &str,
    ) -> Result<String, ConfigError> {
        let file = file.ok_or_else(|| {
            self.error(
                key,
                "missing",
                format!("set it to a file holding {what} (mode 0600)"),
            )
        })?;
        let file = self.path.parent().unwrap_or(Path::new(".")).join(file);
        let text = std::fs::read_to_string(&file).map_err(|e| {
            self.error(
                key,
                format!("cannot read {}: {e}", file.display()),
                format!("point it at a readable file that holds only {what}"),
            )
        })?;
        if !is_private(&file) {
            return Err(self.error(
                key,
                format!("{} can be read by other users", file.display()),
                format!("run `chmod 600 {}`", file.display()),
            ));
        }
        Ok(text.trim().to_string())
    }

    /// A broker or operator URL: http(s), and plain http only to a loopback host (the
    /// credential would cross the network unencrypted).
    fn service_url(
        &self,
        key: &str,
        text: Option<&String>,
        example: &str,
    ) -> Result<url::Url, ConfigError> {
        let text = text
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| self.error(key, "missing", format!("set it, e.g. {example}")))?;
        let url = url::Url::parse(text)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| {
                self.error(
                    key,
                    format!("{text:?} is not an http(s) URL"),
                    format!("write e.g. {example}"),
                )
            })?;
        if url.scheme() == "http" && !url.host_str().is_some_and(is_loopback) {
            return Err(self.error(
                key,
                "plain http would send the credential unencrypted",
                "use https; http is only allowed to a loopback host",
            ));
        }
        Ok(url)
    }

    /// The named mailbox and its config key (`mailboxes.<name>`), checked to hold only keys of
    /// `kind` (an AAMP account is also refused when the mailbox is of another kind).
    fn mailbox_of_kind(
        &self,
        name: &str,
        kind: MailboxKind,
    ) -> Result<(String, &MailboxConfig), ConfigError> {
        let key = format!("mailboxes.{name}");
        let m = self.config.mailboxes.get(name).ok_or_else(|| {
            self.error(
                &key,
                "no such mailbox",
                format!("use one of: {}", self.mailbox_names()),
            )
        })?;
        if kind == MailboxKind::Aamp && m.kind != MailboxKind::Aamp {
            return Err(self.error(
                format!("{key}.kind"),
                "an AMP or ASMTP mailbox has no JMAP or SMTP account",
                "this command works with AAMP mailboxes only",
            ));
        }
        let foreign = Self::foreign_keys(m, kind);
        if !foreign.is_empty() {
            let (problem, fix) = match kind {
                MailboxKind::Aamp => (
                    format!("{} belong to other kinds of mailbox", foreign.join(", ")),
                    "set kind = \"amp\" or \"asmtp\" for those, or drop the keys",
                ),
                MailboxKind::Asmtp => (
                    format!("{} do not belong to kind = \"asmtp\"", foreign.join(", ")),
                    "an ASMTP mailbox takes asmtp_url, handle and token_file",
                ),
                MailboxKind::Amp => (
                    format!("{} do not belong to kind = \"amp\"", foreign.join(", ")),
                    "an AMP mailbox takes amp_url, address, agent_id and api_key_file",
                ),
            };
            return Err(self.error(&key, problem, fix));
        }
        Ok((key, m))
    }

    /// A mailbox's polling interval: at least a second.
    fn poll_interval(
        &self,
        key: &str,
        m: &MailboxConfig,
    ) -> Result<std::time::Duration, ConfigError> {
        if m.poll_interval_secs == 0 {
            return Err(self.error(
                format!("{key}.poll_interval_secs"),
                "must be at least 1",
                "set it to 1 or more seconds",
            ));
        }
        Ok(std::time::Duration::from_secs(m.poll_interval_secs))
    }

    /// The named ASMTP mailbox with its token read and its settings checked.
    pub fn asmtp_account(&self, name: &str) -> Result<AsmtpAccount, ConfigError> {
        let (key, m) = self.mailbox_of_kind(name, MailboxKind::Asmtp)?;
        let url = self.service_url(
            &format!("{key}.asmtp_url"),
            m.asmtp_url.as_ref(),
            "https://asmtp.example.com",
        )?;
        let handle = m.handle.clone().unwrap_or_default();
        let valid = handle
            .strip_prefix('@')
            .and_then(|h| h.split_once('.'))
            .is_some_and(|(owner, agent)| {
                let ok = |s: &str| {
                    !s.is_empty()
                        && s.chars().all(|c| {
                            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
                        })
                };
                ok(owner) && ok(agent)
            });
        if !valid {
            return Err(self.error(
                format!("{key}.handle"),
                format!("{handle:?} is not an ASMTP handle"),
                "write the agent's handle, @owner.name (lower-case letters, digits, _ and -)",
            ));
        }
        let token = self.secret_file(
            &format!("{key}.token_file"),
            m.token_file.as_ref(),
            "the agent's bearer token",
        )?;
        let poll_interval = self.poll_interval(&key, m)?;
        Ok(AsmtpAccount {
            name: name.to_string(),
            url,
            handle,
            token,
            poll_interval,
            insecure_tls: m.insecure_tls,
        })
    }

    /// The named AMP mailbox with its API key read and its settings checked.
    pub fn amp_account(&self, name: &str) -> Result<AmpAccount, ConfigError> {
        let (key, m) = self.mailbox_of_kind(name, MailboxKind::Amp)?;
        let need = |field: &Option<String>, what: &str, fix: &str| {
            field
                .clone()
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| self.error(format!("{key}.{what}"), "missing", fix))
        };
        let url = self.service_url(
            &format!("{key}.amp_url"),
            m.amp_url.as_ref(),
            "https://amp.example.com",
        )?;
        let address = need(
            &m.address,
            "address",
            "set address = \"<name>@<user>.<broker domain>\"",
        )?;
        if !address.contains('@') {
            return Err(self.error(
                format!("{key}.address"),
                format!("{address:?} is not an AMP address"),
                "write the agent's full address, name@user.domain",
            ));
        }
        let agent_id = need(
            &m.agent_id,
            "agent_id",
            "set agent_id = \"<the id POST /agents/register gave>\"",
        )?;
        let api_key = self.secret_file(
            &format!("{key}.api_key_file"),
            m.api_key_file.as_ref(),
            "the user's amk_ API key",
        )?;
        let poll_interval = self.poll_interval(&key, m)?;
        Ok(AmpAccount {
            name: name.to_string(),
            url,
            address,
            agent_id,
            api_key,
            poll_interval,
            insecure_tls: m.insecure_tls,
        })
    }

    /// The named mailbox with its password read and its settings checked.
    pub fn account(&self, name: &str) -> Result<Account, ConfigError> {
        let (key, m) = self.mailbox_of_kind(name, MailboxKind::Aamp)?;
        let jmap_url = url::Url::parse(&m.jmap_url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| {
                self.error(
                    format!("{key}.jmap_url"),
                    format!("{:?} is not an http(s) URL", m.jmap_url),
                    "write e.g. https://mail.example.com/.well-known/jmap",
                )
            })?;
        self.refuse_cleartext(&key, "jmap_url", &jmap_url, m.insecure_http)?;
        let base = self.path.parent().unwrap_or(Path::new("."));
        let (email, password) = match &m.credentials_file {
            Some(file) => {
                if m.email.is_some() || m.password.is_some() || m.password_file.is_some() {
                    return Err(self.error(
                        &key,
                        "credentials_file is set together with email or a password",
                        "keep credentials_file alone, or drop it and give email and password_file",
                    ));
                }
                let file = base.join(file);
                let creds = read_credentials(&file).map_err(|(problem, fix)| {
                    self.error(format!("{key}.credentials_file"), problem, fix)
                })?;
                (creds.email, creds.smtp_password)
            }
            None => {
                let email = m.email.clone().ok_or_else(|| {
                    self.error(
                        &key,
                        "no email",
                        "set email = \"<the mailbox's address>\", or credentials_file",
                    )
                })?;
                let password = match (&m.password, &m.password_file) {
                    (Some(_), Some(_)) => {
                        return Err(self.error(
                            &key,
                            "both password and password_file are set",
                            "keep one of them (password_file is safer)",
                        ))
                    }
                    (None, None) => {
                        return Err(self.error(
                            &key,
                            "no password",
                            "set password_file = \"<file holding the password>\" (mode 0600)",
                        ))
                    }
                    (Some(p), None) => p.clone(),
                    (None, Some(file)) => {
                        let file = base.join(file);
                        let text = std::fs::read_to_string(&file).map_err(|e| {
                            self.error(
                                format!("{key}.password_file"),
                                format!("cannot read {}: {e}", file.display()),
                                "point it at a readable file that holds only the password",
                            )
                        })?;
                        if !is_private(&file) {
                            return Err(self.error(
                                format!("{key}.password_file"),
                                format!("{} can be read by other users", file.display()),
                                format!("run `chmod 600 {}`", file.display()),
                            ));
                        }
                        text.trim_end_matches(['\r', '\n']).to_string()
                    }
                };
                (email, password)
            }
        };
        if !email.contains('@') || email.trim() != email {
            return Err(self.error(
                format!("{key}.email"),
                format!("{email:?} is not an email address"),
                "write the mailbox's full address",
            ));
        }
        if m.smtp_security == SmtpSecurity::Plain && !is_loopback(&m.smtp_host) {
            return Err(self.error(
                format!("{key}.smtp_security"),
                format!("plain-text SMTP to {} would send the password unencrypted", m.smtp_host),
                "use \"starttls\" or \"tls\"; \"plain\" is only allowed to a loopback host (127.0.0.1, ::1, localhost)",
            ));
        }
        let poll_interval = self.poll_interval(&key, m)?;
        if m.sender_auth == SenderAuth::AuthenticationResults && m.authserv_id.is_none() {
            return Err(self.error(
                format!("{key}.authserv_id"),
                "sender_auth = \"authentication-results\" needs the server's authserv-id",
                "set authserv_id to the name your mail server writes first in its Authentication-Results headers",
            ));
        }
        Ok(Account {
            sender_auth: m.sender_auth,
            authserv_id: m.authserv_id.clone(),
            name: name.to_string(),
            email: email.clone(),
            jmap_url,
            login: m.login.clone().unwrap_or_else(|| email.clone()),
            password,
            smtp_host: m.smtp_host.clone(),
            smtp_port: m.smtp_port.unwrap_or(m.smtp_security.default_port()),
            smtp_security: m.smtp_security,
            insecure_tls: m.insecure_tls,
            poll_interval,
            push: m.push,
            push_transport: m.push_transport,
            save_sent: m.save_sent,
            aamp_url: match &m.aamp_url {
                None => None,
                Some(u) => Some(
                    url::Url::parse(u)
                        .ok()
                        .filter(|u| matches!(u.scheme(), "http" | "https"))
                        .ok_or_else(|| {
                            self.error(
                                format!("{key}.aamp_url"),
                                format!("{u:?} is not an http(s) URL"),
                                "write e.g. https://aamp.example.com",
                            )
                        })
                        .and_then(|u| {
                            self.refuse_cleartext(&key, "aamp_url", &u, m.insecure_http)?;
                            Ok(u)
                        })?,
                ),
            },
            reconcile_interval: std::time::Duration::from_secs(m.reconcile_interval_secs.max(1)),
        })
    }

    /// The registration a mailbox still needs: it has a `credentials_file` that does not exist
    /// yet, and an `aamp_url` to register with.
    pub fn registration(&self, name: &str) -> Option<Registration> {
        let m = self.config.mailboxes.get(name)?;
        let base = self.path.parent().unwrap_or(Path::new("."));
        let file = base.join(m.credentials_file.as_ref()?);
        if file.exists() {
            return None;
        }
        Some(Registration {
            aamp_url: url::Url::parse(m.aamp_url.as_deref()?).ok()?,
            slug: m.slug.clone().unwrap_or_else(|| name.replace('_', "-")),
            description: m
                .description
                .clone()
                .unwrap_or_else(|| format!("aamp-bridge mailbox {name}")),
            credentials_file: file,
            insecure_tls: m.insecure_tls,
        })
    }

    /// The agents to run: all of them, or those named.
    pub fn agents(&self, only: &[String]) -> Result<Vec<AgentConfig>, ConfigError> {
        for name in only {
            if !self.config.agents.iter().any(|a| &a.name == name) {
                let known: Vec<&str> = self.config.agents.iter().map(|a| a.name.as_str()).collect();
                return Err(self.error(
                    "agents",
                    format!("no agent named {name:?}"),
                    format!("use one of: {}", known.join(", ")),
                ));
            }
        }
        let agents: Vec<AgentConfig> = self
            .config
            .agents
            .iter()
            .filter(|a| only.is_empty() || only.contains(&a.name))
            .cloned()
            .collect();
        if agents.is_empty() {
            return Err(self.error(
                "agents",
                "no agents are configured",
                "run `aamp-bridge init` to add one, or add an [[agents]] table (see the README's \"Config reference\")",
            ));
        }
        Ok(agents)
    }

    /// An agent's `profile` value as `runner::Profile::find` takes it: a path (anything with
    /// a `/` or ending in `.toml`) is made relative to the config file's folder.
    pub fn profile_ref(&self, profile: &str) -> String {
        if profile.contains('/') || profile.ends_with(".toml") {
            let base = self.path.parent().unwrap_or(Path::new("."));
            base.join(profile).display().to_string()
        } else {
            profile.to_string()
        }
    }

    /// The folders searched for profiles, most specific first.
    pub fn profile_dirs(&self) -> Vec<PathBuf> {
        let base = self.path.parent().unwrap_or(Path::new("."));
        let mut dirs = Vec::new();
        if let Some(dir) = &self.config.profiles_dir {
            dirs.push(base.join(dir));
        }
        dirs.push(default_config_dir().join("profiles"));
        dirs
    }
}

/// A mailbox still to be registered with its AAMP service.
#[derive(Clone, Debug)]
pub struct Registration {
    pub aamp_url: url::Url,
    pub slug: String,
    pub description: String,
    /// Where to write the credentials.
    pub credentials_file: PathBuf,
    pub insecure_tls: bool,
}

/// What a credentials file holds (the AAMP bridges' format).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    pub email: String,
    pub mailbox_token: String,
    pub smtp_password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("email", &self.email)
            .finish_non_exhaustive()
    }
}

/// Reads a credentials file, which must be private; errors as (problem, fix).
fn read_credentials(file: &Path) -> Result<Credentials, (String, String)> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        (format!("cannot read {}: {e}", file.display()), "set aamp_url so the bridge registers the mailbox and writes it, or point credentials_file at an existing file".to_string())
    })?;
    if !is_private(file) {
        return Err((
            format!("{} can be read by other users", file.display()),
            format!("run `chmod 600 {}`", file.display()),
        ));
    }
    serde_json::from_str(&text).map_err(|e| {
        (
            format!("{} is not a credentials file: {e}", file.display()),
            "it holds {\"email\", \"mailboxToken\", \"smtpPassword\"}".to_string(),
        )
    })
}

/// Writes a credentials file atomically with mode 0600.
pub fn write_credentials(file: &Path, credentials: &Credentials) -> std::io::Result<()> {
    crate::fsio::write_atomic(
        file,
        &serde_json::to_vec_pretty(credentials).expect("credentials serialize"),
        0o600,
    )
}

/// `$XDG_CONFIG_HOME/aamp-bridge` (default `~/.config/aamp-bridge`).
pub fn default_config_dir() -> PathBuf {
    xdg_dir("XDG_CONFIG_HOME", ".config").join("aamp-bridge")
}

/// `$XDG_STATE_HOME/aamp-bridge` (default `~/.local/state/aamp-bridge`).
pub fn default_state_dir() -> PathBuf {
    xdg_dir("XDG_STATE_HOME", ".local/state").join("aamp-bridge")
}

/// The config file used when `--config` is not given.
pub fn default_config_path() -> PathBuf {
    default_config_dir().join("config.toml")
}

fn xdg_dir(var: &str, fallback: &str) -> PathBuf {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"))
            .join(fallback),
    }
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// True when neither group nor others may read the file.
fn is_private(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 == 0)
}

/// "line N" for a byte offset, which is as close to a key as a TOML parse error gets.
fn line_of(text: &str, offset: usize) -> String {
    let line = text[..offset.min(text.len())].matches('\n').count() + 1;
    format!("line {line}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    const GOOD: &str = r#"
[mailboxes.coder]
email = "coder@example.test"
jmap_url = "http://127.0.0.1:18080/.well-known/jmap"
password_file = "coder.pass"
smtp_host = "127.0.0.1"
smtp_port = 15587
smtp_security = "plain"

[[agents]]
name = "coder"
profile = "echo"
allow_from = ["*@example.test"]
"#;

    #[test]
    fn a_good_config_loads() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "coder.pass", "secret\n", 0o600);
        let path = write(dir.path(), "config.toml", GOOD, 0o644);
        let loaded = LoadedConfig::load(&path).unwrap();
        let account = loaded.account("coder").unwrap();
        assert_eq!(account.password, "secret");
        assert_eq!(account.login, "coder@example.test");
        assert_eq!(account.smtp_port, 15587);
        assert_eq!(loaded.agents(&[]).unwrap().len(), 1);
        assert!(
            !format!("{account:?}").contains("secret"),
            "Debug must not show the password"
        );
    }

    fn load_err(config: &str, pass_mode: u32, config_mode: u32) -> String {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "coder.pass", "secret\n", pass_mode);
        let path = write(dir.path(), "config.toml", config, config_mode);
        LoadedConfig::load(&path).unwrap_err().to_string()
    }

    /// Issue 18: `jmap_url = "http://mail.example.com/…"` loaded without a word and sent the
    /// password with Basic auth in clear.
    #[test]
    fn plain_http_to_another_host_is_refused_unless_the_mailbox_says_so() {
        let remote = GOOD.replace("http://127.0.0.1:18080", "http://mail.example.com");
        let e = load_err(&remote, 0o600, 0o644);
        assert!(
            e.contains("mailboxes.coder.jmap_url")
                && e.contains("unencrypted")
                && e.contains("insecure_http"),
            "{e}"
        );
        let e = load_err(
            &GOOD.replace(
                "smtp_security = \"plain\"",
                "smtp_security = \"plain\"\naamp_url = \"http://aamp.example.com\"",
            ),
            0o600,
            0o644,
        );
        assert!(e.contains("mailboxes.coder.aamp_url"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "coder.pass", "secret\n", 0o600);
        let allowed = remote.replace(
            "smtp_security = \"plain\"",
            "smtp_security = \"plain\"\ninsecure_http = true",
        );
        let path = write(dir.path(), "config.toml", &allowed, 0o644);
        let loaded = LoadedConfig::load(&path).unwrap();
        assert_eq!(loaded.account("coder").unwrap().jmap_url.scheme(), "http");
    }

    #[test]
    fn errors_name_the_key_and_the_fix() {
        let e = load_err(
            &GOOD.replace("127.0.0.1\"\nsmtp_port", "mail.example.com\"\nsmtp_port"),
            0o600,
            0o644,
        );
        assert!(
            e.contains("mailboxes.coder.smtp_security") && e.contains("loopback"),
            "{e}"
        );
        let e = load_err(GOOD, 0o644, 0o644);
        assert!(
            e.contains("password_file") && e.contains("chmod 600"),
            "{e}"
        );
        let e = load_err(
            &GOOD.replace("password_file = \"coder.pass\"", "password = \"x\""),
            0o600,
            0o644,
        );
        assert!(e.contains("chmod 600") && e.contains("config.toml"), "{e}");
        let e = load_err(
            &GOOD.replace("name = \"coder\"", "name = \"Coder!\""),
            0o600,
            0o644,
        );
        assert!(e.contains("agents[0].name"), "{e}");
        let e = load_err(
            &GOOD.replace(
                "profile = \"echo\"",
                "profile = \"echo\"\nmailbox = \"nope\"",
            ),
            0o600,
            0o644,
        );
        assert!(
            e.contains("agents[0].mailbox") && e.contains("coder"),
            "{e}"
        );
        let e = load_err(
            &GOOD.replace("smtp_port = 15587", "smtp_prot = 15587"),
            0o600,
            0o644,
        );
        assert!(e.contains("line 7") && e.contains("smtp_prot"), "{e}");
        let e = load_err(
            &GOOD.replace(
                "allow_from = [\"*@example.test\"]",
                "allow_from = [\"everyone\"]",
            ),
            0o600,
            0o644,
        );
        assert!(e.contains("allow_from[0]"), "{e}");
    }

    #[test]
    fn loopback_hosts() {
        assert!(
            is_loopback("127.0.0.1")
                && is_loopback("localhost")
                && is_loopback("[::1]")
                && is_loopback("127.8.9.1")
        );
        assert!(!is_loopback("10.0.0.1") && !is_loopback("mail.example.com"));
    }
}
