//! CLI profiles: how to start an agent as a child process. Profiles are TOML files: the
//! built-ins under `profiles/` are compiled in, and a file of the same name in a profile
//! folder overrides them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::stream::StreamFormat;
use super::template::{self, Template};

/// `(name, TOML)` for each of `names`, read from `profiles/NAME.toml` at build time.
macro_rules! built_in {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../profiles/", $name, ".toml")))),*]
    };
}

/// The profiles shipped with the binary: (name, TOML).
const BUILT_IN: &[(&str, &str)] = built_in![
    "echo",
    "echo-prompt",
    "claude",
    "codex",
    "gemini",
    "claude-acp",
    "codex-acp",
    "gemini-acp",
    "qwen-acp",
    "copilot-acp",
    "opencode-acp",
    "goose-acp",
    "cursor-acp",
    "kiro-acp",
    "auggie-acp",
];

/// The text of a profile as `find` would read it: its file, or the built-in's TOML.
pub fn source_text(name_or_path: &str, dirs: &[PathBuf]) -> Option<String> {
    if name_or_path.contains('/') || name_or_path.ends_with(".toml") {
        return std::fs::read_to_string(name_or_path).ok();
    }
    for dir in dirs {
        if let Ok(text) = std::fs::read_to_string(dir.join(format!("{name_or_path}.toml"))) {
            return Some(text);
        }
    }
    BUILT_IN
        .iter()
        .find(|(n, _)| *n == name_or_path)
        .map(|(_, t)| t.to_string())
}

/// The names of the built-in profiles.
pub fn built_in_names() -> impl Iterator<Item = &'static str> {
    BUILT_IN.iter().map(|(n, _)| *n)
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("no profile named {name:?} (looked in {searched} and the built-ins: {built_in})")]
    NotFound {
        name: String,
        searched: String,
        built_in: String,
    },
    #[error("cannot read profile {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("profile {origin}: {message}")]
    Invalid { origin: String, message: String },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: Option<String>,
    #[serde(default)]
    description: String,
    command: String,
    #[serde(default)]
    args: Vec<String>,
    stdin: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// A file of `KEY=VALUE` lines (a dotenv file, 0600) added to the environment after `env`:
    /// where secrets go (`profile new --env` writes one). Relative to the profile's folder.
    env_file: Option<String>,
    cwd: Option<String>,
    #[serde(default = "default_timeout")]
    timeout_secs: u64,
    #[serde(default = "default_success")]
    success_exit_codes: Vec<i32>,
    #[serde(default)]
    output: OutputOptions,
    /// How stdout is framed: `none` (plain text), `ndjson`, `sse`, `claude`, `codex`, `gemini`.
    #[serde(default)]
    stream: StreamFormat,
    /// Used instead of `args` when the task continues a CLI session (`{{resume_id}}` is set).
    args_when_resuming: Option<Vec<String>>,
    /// After the stream's final event, how long the process may take to exit before it is
    /// stopped.
    #[serde(default = "default_linger")]
    linger_secs: u64,
    /// `cli` (a child process whose stdout is the answer or a stream) or `acp` (an Agent
    /// Client Protocol agent on stdio).
    #[serde(default)]
    kind: ProfileKind,
    /// ACP: how permission requests are answered: `allow`, `read_only` or `deny`.
    #[serde(default)]
    permissions: PermissionPolicy,
    /// ACP: the agent's own session mode for each permission policy (`read_only = "read-only"`),
    /// set with `session/set_mode` before the task, so the policy holds where the agent would
    /// not ask (codex-acp's default mode edits without asking). A list names the same mode
    /// as different adapters call it: the first the agent offers is used.
    #[serde(default)]
    modes: std::collections::BTreeMap<PermissionPolicy, ModeNames>,
    /// CLI: arguments put first for each permission policy, the policy in the CLI's own terms
    /// (`read_only = ["--sandbox", "read-only"]`), so it holds whatever the CLI's own
    /// settings say.
    #[serde(default)]
    permission_args: std::collections::BTreeMap<PermissionPolicy, Vec<String>>,
    /// CLI: arguments added when the bridge gives the agent an MCP server for the task
    /// (`["--mcp-config", "{{mcp_config}}"]`).
    #[serde(default)]
    mcp_args: Vec<String>,
    /// ACP: how long `initialize` may take (cold npx starts are slow).
    #[serde(default = "default_init_timeout")]
    init_timeout_secs: u64,
    /// ACP: after `session/cancel`, how long the agent gets to stop before it is killed.
    #[serde(default = "default_cancel_grace")]
    cancel_grace_secs: u64,
    /// ACP with `permissions = "ask"`: how long to wait for the dispatcher's answer.
    #[serde(default = "default_ask_timeout")]
    ask_timeout_secs: u64,
    /// ACP: the auth method to use when the agent asks for one. Default: a method that takes
    /// an API key from the environment; interactive logins are never started.
    auth_method: Option<String>,
    /// How to install the agent, shown by `aamp-bridge agents` when it is missing.
    install: Option<String>,
    /// The lowest Node.js major version the agent runs on, checked by `aamp-bridge agents`.
    requires_node: Option<u32>,
    /// Whether a task this agent was running when the bridge crashed (or was stopped before
    /// it finished) is run again at the next start. `false` for agents whose work must not
    /// happen twice: such a task is answered rejected, "interrupted by a bridge restart".
    #[serde(default = "default_true")]
    rerun_interrupted: bool,
    /// CLI: the agent may ask its dispatcher by printing `HELP: question | option | ...`
    /// on a line of its own; stdin stays open and the answer comes in as one line.
    #[serde(default)]
    help_lines: bool,
    /// ACP: files the agent writes (fs/write_text_file) in its workspace go with the result.
    #[serde(default)]
    attach_written_files: bool,
}

fn default_true() -> bool {
    true
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfileKind {
    #[default]
    Cli,
    Acp,
}

fn default_init_timeout() -> u64 {
    60
}

fn default_ask_timeout() -> u64 {
    15 * 60
}

fn default_cancel_grace() -> u64 {
    5
}

fn default_linger() -> u64 {
    5
}

fn default_timeout() -> u64 {
    30 * 60
}

fn default_success() -> Vec<i32> {
    vec![0]
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct OutputOptions {
    pub strip_ansi: bool,
    pub trim: bool,
    /// Append stderr to the output of a successful run.
    pub include_stderr: bool,
    /// Output kept from stdout; the rest is read and dropped, and the result says so.
    pub max_bytes: usize,
}

impl Default for OutputOptions {
    fn default() -> Self {
        OutputOptions {
            strip_ansi: true,
            trim: true,
            include_stderr: false,
            max_bytes: 1 << 20,
        }
    }
}

/// How an agent's permission requests are answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionPolicy {
    /// Allow everything (once).
    Allow,
    /// Allow tools that only read (read, search, think); reject the rest.
    #[default]
    ReadOnly,
    /// Reject everything.
    Deny,
    /// Ask the dispatcher by mail (`task.help_needed`, the options as suggested options) and
    /// use the option they answer with; reject when no answer comes within `ask_timeout_secs`.
    Ask,
}

/// A validated profile, its templates parsed.
#[derive(Clone, Debug)]
pub struct Profile {
    pub name: String,
    pub description: String,
    pub command: Template,
    pub args: Vec<Template>,
    pub stdin: Option<Template>,
    pub env: Vec<(String, Template)>,
    /// `env_file`, resolved: read when the agent starts, so its values are in no `Profile`.
    pub env_file: Option<PathBuf>,
    pub cwd: Option<Template>,
    pub timeout: Duration,
    pub success_exit_codes: Vec<i32>,
    pub output: OutputOptions,
    pub stream: StreamFormat,
    pub args_when_resuming: Option<Vec<Template>>,
    pub linger: Duration,
    pub kind: ProfileKind,
    pub permissions: PermissionPolicy,
    /// The agent's session mode for each policy.
    /// The agent's session mode for each policy: its names in the adapters the profile
    /// serves, the first the agent offers used.
    pub modes: std::collections::BTreeMap<PermissionPolicy, Vec<String>>,
    /// CLI: the arguments added for each policy.
    pub permission_args: std::collections::BTreeMap<PermissionPolicy, Vec<Template>>,
    /// CLI: the arguments added when the agent is given an MCP server.
    pub mcp_args: Vec<Template>,
    pub init_timeout: Duration,
    pub cancel_grace: Duration,
    pub auth_method: Option<String>,
    pub ask_timeout: Duration,
    pub install: Option<String>,
    pub requires_node: Option<u32>,
    /// Run a task again after a crash interrupted it (see the profile file's key).
    pub rerun_interrupted: bool,
    /// CLI: `HELP:` lines ask the dispatcher (see the profile file's key).
    pub help_lines: bool,
    /// ACP: files the agent writes are attached to the result.
    pub attach_written_files: bool,
    /// Where it came from, for messages: a path or "built-in".
    pub origin: String,
    /// `{{prompt}}` is in `args` (or `args_when_resuming`): see [`Profile::warnings`].
    pub prompt_in_args: bool,
}

/// Parsing one profile file: its errors name where it came from.
struct Parsing<'a> {
    origin: &'a str,
}

impl Parsing<'_> {
    fn invalid(&self, message: String) -> ProfileError {
        ProfileError::Invalid {
            origin: self.origin.to_string(),
            message,
        }
    }

    /// What the file says that its types do not.
    fn check(&self, file: &ProfileFile) -> Result<(), ProfileError> {
        if file.command.trim().is_empty() {
            return Err(self.invalid("command is empty".into()));
        }
        if file.kind == ProfileKind::Acp
            && (file.stdin.is_some() || file.stream != StreamFormat::None)
        {
            return Err(
                self.invalid("an acp profile talks ACP on stdio: remove stdin and stream".into())
            );
        }
        if file.timeout_secs == 0 {
            return Err(self.invalid("timeout_secs must be at least 1".into()));
        }
        Ok(())
    }

    fn one(&self, field: &str, text: &str) -> Result<Template, ProfileError> {
        Template::parse(text).map_err(|e| self.invalid(format!("{field}: {e}")))
    }

    /// A list of templates, each named `field[i]` in errors.
    fn list(&self, field: &str, texts: &[String]) -> Result<Vec<Template>, ProfileError> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| self.one(&format!("{field}[{i}]"), t))
            .collect()
    }

    /// Each policy's mode names (one or a list, never none).
    fn modes(
        &self,
        modes: BTreeMap<PermissionPolicy, ModeNames>,
    ) -> Result<BTreeMap<PermissionPolicy, Vec<String>>, ProfileError> {
        modes
            .into_iter()
            .map(|(policy, names)| {
                let names = match names {
                    ModeNames::One(name) => vec![name],
                    ModeNames::Many(names) => names,
                };
                if names.is_empty() {
                    return Err(
                        self.invalid(format!("modes.{} names no mode", policy_word(policy)))
                    );
                }
                Ok((policy, names))
            })
            .collect()
    }
}

/// `env_file` as a path: a relative one is beside the profile file it is named in.
fn env_file_path(origin: &str, file: &str) -> PathBuf {
    let file = Path::new(file);
    match Path::new(origin).parent() {
        Some(dir) if file.is_relative() && origin.ends_with(".toml") => dir.join(file),
        _ => file.to_path_buf(),
    }
}

impl Profile {
    pub fn parse(text: &str, fallback_name: &str, origin: &str) -> Result<Profile, ProfileError> {
        let p = Parsing { origin };
        let file: ProfileFile = toml::from_str(text).map_err(|e| p.invalid(e.to_string()))?;
        p.check(&file)?;
        Ok(Profile {
            name: file.name.unwrap_or_else(|| fallback_name.to_string()),
            description: file.description,
            command: p.one("command", &file.command)?,
            args: p.list("args", &file.args)?,
            stdin: file
                .stdin
                .as_deref()
                .map(|s| p.one("stdin", s))
                .transpose()?,
            env: file
                .env
                .iter()
                .map(|(k, v)| Ok((k.clone(), p.one(&format!("env.{k}"), v)?)))
                .collect::<Result<_, ProfileError>>()?,
            env_file: file.env_file.as_deref().map(|f| env_file_path(origin, f)),
            cwd: file.cwd.as_deref().map(|c| p.one("cwd", c)).transpose()?,
            timeout: Duration::from_secs(file.timeout_secs),
            success_exit_codes: file.success_exit_codes,
            output: file.output,
            stream: file.stream,
            args_when_resuming: file
                .args_when_resuming
                .as_deref()
                .map(|args| p.list("args_when_resuming", args))
                .transpose()?,
            linger: Duration::from_secs(file.linger_secs),
            kind: file.kind,
            permissions: file.permissions,
            modes: p.modes(file.modes)?,
            permission_args: file
                .permission_args
                .iter()
                .map(|(policy, args)| Ok((*policy, p.list("permission_args", args)?)))
                .collect::<Result<_, ProfileError>>()?,
            mcp_args: p.list("mcp_args", &file.mcp_args)?,
            init_timeout: Duration::from_secs(file.init_timeout_secs),
            cancel_grace: Duration::from_secs(file.cancel_grace_secs),
            auth_method: file.auth_method,
            ask_timeout: Duration::from_secs(file.ask_timeout_secs),
            install: file.install,
            requires_node: file.requires_node,
            rerun_interrupted: file.rerun_interrupted,
            help_lines: file.help_lines,
            attach_written_files: file.attach_written_files,
            origin: origin.to_string(),
            prompt_in_args: file
                .args
                .iter()
                .chain(file.args_when_resuming.iter().flatten())
                .any(|a| a.contains("{{prompt}}")),
        })
    }

    /// The arguments a CLI agent is started with: the policy's (`[permission_args]`) first,
    /// less any option the profile's own `args` (or `args_when_resuming`) already pass (the
    /// profile's own wins: two values of one flag make some CLIs refuse to start, as Gemini
    /// does with `--approval-mode default,yolo`), then the profile's own.
    pub fn args_for(&self, resuming: bool) -> Vec<Template> {
        let (own, policy) = self.own_and_policy_args(resuming);
        let (kept, _) = merge_policy_args(policy, own);
        kept.into_iter().chain(own.iter().cloned()).collect()
    }

    /// The profile's own arguments for a run (resuming or not), and the policy's.
    fn own_and_policy_args(&self, resuming: bool) -> (&[Template], &[Template]) {
        let own = match (&self.args_when_resuming, resuming) {
            (Some(args), true) => args,
            _ => &self.args,
        };
        let policy = self
            .permission_args
            .get(&self.permissions)
            .map(Vec::as_slice)
            .unwrap_or_default();
        (own, policy)
    }

    /// The variables in `env_file` (none without one).
    pub fn file_env(&self) -> Result<Vec<(String, String)>, std::io::Error> {
        match &self.env_file {
            Some(path) => std::fs::read_to_string(path)
                .map(|text| parse_dotenv(&text))
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("profile {}'s env_file {}: {e}", self.name, path.display()),
                    )
                }),
            None => Ok(Vec::new()),
        }
    }

    /// Whether a CLI agent can be told which session to continue: `{{resume_id}}` in its
    /// arguments (or `args_when_resuming`), or a session key it keeps its conversations by
    /// (`{{session_key}}`, `{{safe_session_key}}` anywhere). ACP agents resume by the protocol.
    pub fn can_resume(&self) -> bool {
        let templates = self
            .args
            .iter()
            .chain(self.args_when_resuming.iter().flatten())
            .chain(self.stdin.iter())
            .chain(self.cwd.iter())
            .chain(self.env.iter().map(|(_, v)| v));
        self.kind == ProfileKind::Acp
            || templates.into_iter().any(|t| {
                t.names("resume_id") || t.names("session_key") || t.names("safe_session_key")
            })
    }

    /// The profile's own options that take the place of the policy's for a run (resuming
    /// or not), each as "`--yolo` instead of `--approval-mode default` (permissions =
    /// \"read_only\")": what the task's timeline and its answer say, not only the log.
    pub fn policy_overrides(&self, resuming: bool) -> Vec<String> {
        if self.kind != ProfileKind::Cli {
            return Vec::new();
        }
        let (own, policy) = self.own_and_policy_args(resuming);
        merge_policy_args(policy, own)
            .1
            .into_iter()
            .filter(|(theirs, ours)| theirs != ours)
            .map(|(theirs, ours)| {
                format!(
                    "`{theirs}` instead of `{ours}` (permissions = \"{}\")",
                    policy_word(self.permissions)
                )
            })
            .collect()
    }

    /// What is unsafe about this profile, in words a person acts on.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(path) = &self.env_file {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.permissions().mode() & 0o077 != 0 {
                    out.push(format!(
                        "profile {}'s env_file {} can be read by other users: chmod 600 it",
                        self.name,
                        path.display()
                    ));
                }
            }
        }
        let policy = self
            .permission_args
            .get(&self.permissions)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for own in std::iter::once(&self.args).chain(self.args_when_resuming.iter()) {
            for (theirs, ours) in merge_policy_args(policy, own).1 {
                let warning = format!(
                    "profile {} passes its own `{theirs}`, which is used instead of `{ours}` that permissions = \"{}\" would pass: what the agent's own tools may do follows the profile's flag, not the policy; remove it from args to let the policy hold",
                    self.name,
                    policy_word(self.permissions)
                );
                if theirs != ours && !out.contains(&warning) {
                    out.push(warning);
                }
            }
        }
        if self.prompt_in_args {
            out.push(format!(
                "profile {} puts {{{{prompt}}}} in its arguments: every local user can read the task's text with ps; pass it on stdin instead (stdin = \"{{{{prompt}}}}\")",
                self.name
            ));
        }
        out
    }

    /// Finds a profile by name (in `dirs`, then built in) or by path (when it has a `/`).
    pub fn find(name_or_path: &str, dirs: &[PathBuf]) -> Result<Profile, ProfileError> {
        if name_or_path.contains('/') || name_or_path.ends_with(".toml") {
            return Self::from_file(Path::new(name_or_path), name_or_path);
        }
        for dir in dirs {
            let path = dir.join(format!("{name_or_path}.toml"));
            if path.exists() {
                return Self::from_file(&path, name_or_path);
            }
        }
        match BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            Some((name, text)) => Self::parse(text, name, "built-in"),
            None => Err(ProfileError::NotFound {
                name: name_or_path.to_string(),
                searched: dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                built_in: BUILT_IN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Every profile: the built-ins, overridden by same-named files in `dirs` (earlier
    /// folders win), plus the other files there. Unreadable files are reported, not skipped
    /// silently.
    pub fn all(dirs: &[PathBuf]) -> (Vec<Profile>, Vec<ProfileError>) {
        let mut names: Vec<String> = built_in_names().map(str::to_string).collect();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut found: Vec<String> = entries
                .flatten()
                .filter_map(|e| {
                    e.path()
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .map(str::to_string)
                        .filter(|_| e.path().extension().is_some_and(|x| x == "toml"))
                })
                .collect();
            found.sort();
            names.extend(found);
        }
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        let (mut ok, mut errors) = (Vec::new(), Vec::new());
        for name in names {
            match Profile::find(&name, dirs) {
                Ok(p) => ok.push(p),
                Err(e) => errors.push(e),
            }
        }
        (ok, errors)
    }

    fn from_file(path: &Path, name: &str) -> Result<Profile, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or(name);
        Self::parse(&text, stem, &path.display().to_string())
    }
}

/// The pairs in a dotenv text: `KEY=VALUE`, `export KEY=VALUE`, values quoted or not; lines
/// starting with `#` and empty values are not pairs.
pub fn parse_dotenv(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.starts_with('#') {
                return None;
            }
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (key, value) = line.split_once('=')?;
            let key = key.trim();
            let mut value = value.trim();
            if let Some(q) = value.chars().next().filter(|c| *c == '"' || *c == '\'') {
                value = value[1..].split(q).next().unwrap_or("");
            } else if let Some((v, _)) = value.split_once(" #") {
                value = v.trim();
            }
            (!key.is_empty() && !value.is_empty()).then(|| (key.to_string(), value.to_string()))
        })
        .collect()
}

/// Renders `args`: an argument whose template renders empty is dropped, and so is the flag
/// just before it (`--resume {{session_key}}` disappears when there is no session key), as is
/// `--flag={{x}}` when `x` is empty. Plain arguments are always kept.
pub fn render_args(args: &[Template], vars: &template::Vars) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(args.len());
    let mut prev_was_plain_flag = false;
    for arg in args {
        let rendered = arg.render(vars);
        if arg.has_placeholders() {
            let literal = arg.literal_text();
            // Every placeholder rendered empty and nothing is left, or only "--flag=".
            let empty = rendered.is_empty() || (rendered == literal && literal.ends_with('='));
            if empty {
                if rendered.is_empty() && prev_was_plain_flag {
                    out.pop();
                }
                prev_was_plain_flag = false;
                continue;
            }
        }
        prev_was_plain_flag = !arg.has_placeholders() && rendered.starts_with('-');
        out.push(rendered);
    }
    out
}

/// A session mode's name, or its names in several adapters.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(untagged)]
enum ModeNames {
    One(String),
    Many(Vec<String>),
}

/// The policy's word in the config file.
fn policy_word(policy: PermissionPolicy) -> &'static str {
    match policy {
        PermissionPolicy::Allow => "allow",
        PermissionPolicy::ReadOnly => "read_only",
        PermissionPolicy::Deny => "deny",
        PermissionPolicy::Ask => "ask",
    }
}

/// One command-line option: what identifies it (`--approval-mode`; for `-c key=value`,
/// Codex's config overrides, the flag and the key), and its words as written.
fn options(args: &[String]) -> Vec<(String, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let word = &args[i];
        if !word.starts_with('-') || word == "-" || word == "--" {
            i += 1;
            continue;
        }
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
            _ => (word.as_str(), None),
        };
        let (value, end) = match inline {
            Some(value) => (Some(value.to_string()), i + 1),
            None => match args.get(i + 1).filter(|next| !next.starts_with('-')) {
                Some(next) => (Some(next.clone()), i + 2),
                None => (None, i + 1),
            },
        };
        let identity = match (flag, &value) {
            ("-c" | "--config", Some(v)) => {
                format!(
                    "-c {}",
                    v.split_once('=').map_or(v.as_str(), |(k, _)| k.trim())
                )
            }
            _ => flag.to_string(),
        };
        out.push((setting(identity), i..end));
        i = end;
    }
    out
}

/// What an option sets, so that the agents' other spellings of one setting count as the
/// same option: Gemini's `--yolo`/`-y` are its approval mode, Codex's `-s`/`--sandbox`,
/// `--full-auto` and its bypass flag its sandbox (as `-c sandbox_mode=...` is), Claude's
/// skip-permissions flag its permission mode. Passed beside the policy's spelling, each was
/// either refused by the agent or quietly won over the policy with no warning.
fn setting(identity: String) -> String {
    let same = match identity.as_str() {
        "--approval-mode" | "--yolo" | "-y" => "--approval-mode",
        "-c sandbox_mode"
        | "-s"
        | "--sandbox"
        | "--full-auto"
        | "--dangerously-bypass-approvals-and-sandbox" => "-c sandbox_mode",
        "-c approval_policy" | "-a" | "--ask-for-approval" => "-c approval_policy",
        "--permission-mode" | "--dangerously-skip-permissions" => "--permission-mode",
        _ => return identity,
    };
    same.to_string()
}

/// The policy's arguments less the options `own` already passes, and, for each of those,
/// (the profile's words, the policy's words).
fn merge_policy_args(
    policy: &[Template],
    own: &[Template],
) -> (Vec<Template>, Vec<(String, String)>) {
    let text = |args: &[Template]| args.iter().map(Template::literal_text).collect::<Vec<_>>();
    let (policy_text, own_text) = (text(policy), text(own));
    let own_options = options(&own_text);
    let mut kept = Vec::new();
    let mut overridden = Vec::new();
    let mut covered = 0;
    for (identity, range) in options(&policy_text) {
        // Words before this option that belong to none (positional ones) are kept.
        kept.extend(policy[covered..range.start].iter().cloned());
        covered = range.end;
        match own_options.iter().find(|(id, _)| *id == identity) {
            Some((_, theirs)) => overridden.push((
                own_text[theirs.clone()].join(" "),
                policy_text[range.clone()].join(" "),
            )),
            None => kept.extend(policy[range].iter().cloned()),
        }
    }
    kept.extend(policy[covered..].iter().cloned());
    (kept, overridden)
}

#[cfg(test)]
#[path = "profile_tests.rs"]
mod tests;
