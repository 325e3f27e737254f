//! The one TOML config file: named mailboxes and the agents that use them. Loading validates
//! everything up front; each error names the file, the key and what to do about it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod render;
pub use render::render;

mod accounts;
mod budgets;
mod mailboxes;
mod schema;
mod secret;
pub use accounts::*;
pub use budgets::{Budget, Price};
pub use mailboxes::*;
pub use schema::*;
pub use secret::*;

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

/// A config that passed validation, with relative paths resolved against its folder.
#[derive(Clone, Debug)]
pub struct LoadedConfig {
    pub path: PathBuf,
    pub config: Config,
    pub state_dir: PathBuf,
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
            let (problem, fix) = e.message().split_once(mailboxes::FIX).unwrap_or((
                e.message(),
                "correct the TOML at that line; see docs/configuration.md in the manual (share/doc/aamp-bridge where installed)",
            ));
            let key = e
                .span()
                .map(|s| error_line(text, s, problem))
                .unwrap_or_default();
            err(&key, problem.to_string(), fix)
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
        loaded.validate()?;
        Ok(loaded)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.check_ui()?;
        self.check_budgets()?;
        let mut names = BTreeSet::new();
        for (i, agent) in self.config.agents.iter().enumerate() {
            let key = format!("agents[{i}]");
            if !names.insert(agent.name.clone()) {
                return Err(self.error(
                    format!("{key}.name"),
                    format!("agent {:?} appears twice", agent.name),
                    "give each agent its own name",
                ));
            }
            self.check_agent(&key, agent)?;
        }
        for name in self.config.mailboxes.keys() {
            // A mailbox the bridge will register is checked once it has its credentials.
            if self.kind(name) != MailboxKind::Aamp || self.registration(name).is_none() {
                self.checked(name)?;
            }
        }
        self.check_inline_secret()
    }

    /// The live view answers questions and cancels tasks: loopback unless said otherwise.
    fn check_ui(&self) -> Result<(), ConfigError> {
        match &self.config.ui {
            Some(ui) if !ui.listen.ip().is_loopback() && !ui.allow_remote => Err(self.error(
                "ui.listen",
                format!("{} is not a loopback address; the live view answers questions and cancels tasks", ui.listen),
                "listen on 127.0.0.1 (reach it over an SSH tunnel), or set allow_remote = true to mean it",
            )),
            _ => Ok(()),
        }
    }

    /// One `[[agents]]` table (`key`), but for its name being taken twice.
    fn check_agent(&self, key: &str, agent: &AgentConfig) -> Result<(), ConfigError> {
        if !valid_name(&agent.name) {
            return Err(self.error(
                format!("{key}.name"),
                format!("{:?} is not a valid agent name", agent.name),
                "use lower-case letters, digits, '-' and '_'",
            ));
        }
        let mailbox = agent.mailbox_name().to_string();
        if !self.config.mailboxes.contains_key(&mailbox) {
            return Err(self.error(
                format!("{key}.mailbox"),
                format!("no mailbox named {mailbox:?}"),
                format!(
                    "add a [mailboxes.{mailbox}] table, or set mailbox = \"<name>\" to one of: {}",
                    self.mailbox_names()
                ),
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
        self.check_senders(key, agent)
    }

    /// An agent's sender patterns and its sender policy.
    fn check_senders(&self, key: &str, agent: &AgentConfig) -> Result<(), ConfigError> {
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
        match agent.sender_policy.as_deref().map(policy::parse_text) {
            Some(Err(e)) => Err(self.error(
                format!("{key}.sender_policy"),
                e,
                "write `allow_from: a@x, *@y` lines, each optionally followed by `context_equals: key=value, ...` lines",
            )),
            _ => Ok(()),
        }
    }

    /// A password written in the config file keeps the file private.
    fn check_inline_secret(&self) -> Result<(), ConfigError> {
        let inline_secret = self
            .config
            .mailboxes
            .values()
            .any(|m| m.aamp().is_some_and(|m| m.password.is_some()));
        if inline_secret && !is_private(&self.path) {
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

    /// The named mailbox's kind (AAMP when there is no such mailbox: its errors come from
    /// reading its account).
    pub fn kind(&self, name: &str) -> MailboxKind {
        self.config
            .mailboxes
            .get(name)
            .map(MailboxConfig::kind)
            .unwrap_or_default()
    }

    /// The address mail to the named mailbox goes to, whatever its kind (SAMP: the agent's
    /// name is the server's to tell, so the bridge's own name for it, `MAILBOX@HOST`).
    pub fn mailbox_address(&self, name: &str) -> Result<String, ConfigError> {
        Ok(self.checked(name)?.address(name))
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
                "run `aamp-bridge init` to add one, or add an [[agents]] table (see docs/configuration.md in the manual, share/doc/aamp-bridge where installed)",
            ));
        }
        Ok(agents)
    }

    /// The state directory's layout.
    pub fn state(&self) -> crate::paths::StateDir {
        crate::paths::StateDir::new(&self.state_dir)
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

/// "line N" of a TOML error: its span's line, or, when the span is a table (its `[header]`
/// or `{ ... }`) and the problem names one of the table's keys (`... .KEY: ...`, or serde's
/// `` `KEY` ``), the line of that key.
fn error_line(text: &str, span: std::ops::Range<usize>, problem: &str) -> String {
    let start = span.start.min(text.len());
    if !text[start..].starts_with(['[', '{']) {
        return line_of(text, start);
    }
    let after = span.end.clamp(start, text.len());
    let end = text[after..].find("\n[").map_or(text.len(), |i| after + i);
    let mut offset = start;
    for line in text[start..end].split_inclusive('\n') {
        if let Some((key, _)) = line.split_once('=') {
            let key = key.trim();
            if !key.is_empty()
                && (problem.contains(&format!(".{key}:")) || problem.contains(&format!("`{key}`")))
            {
                return line_of(text, offset);
            }
        }
        offset += line.len();
    }
    line_of(text, start)
}

#[cfg(test)]
mod tests;
