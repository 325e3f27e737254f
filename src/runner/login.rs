//! Whether a well-known agent is logged in, read the way the agent itself reads it: from the
//! environment it will run in (the bridge's, with the profile's `env` and `env_file` over it:
//! `HOME`, `CODEX_HOME`, `CLAUDE_CONFIG_DIR`, API key variables, a Codex provider's `env_key`)
//! and the files it keeps its login in, counted only when they hold one (an empty credentials
//! file or a commented-out key is not a login). One check, used by `agents`, `doctor`, `init`
//! and `status`; ACP agents can also be asked (`doctor` opens a session, see
//! [`super::acp::probe`]).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::Profile;

/// What the check found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoginState {
    pub logged_in: bool,
    /// Where the login is ("API key in $CODEX_API_KEY"), or what is missing.
    pub detail: String,
    /// How to log in, in the agent's own words, when not logged in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl std::fmt::Display for LoginState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.fix {
            Some(fix) if !self.logged_in => write!(f, "not logged in: {fix}"),
            _ => write!(f, "logged in ({})", self.detail),
        }
    }
}

/// The environment an agent runs in: the bridge's own, the profile's over it.
pub struct AgentEnv {
    vars: std::collections::HashMap<String, String>,
}

impl AgentEnv {
    /// The environment `profile`'s agent gets.
    pub fn of(profile: &Profile) -> AgentEnv {
        let mut vars: std::collections::HashMap<String, String> = std::env::vars().collect();
        let rendered = super::template::Vars::default();
        for (k, v) in &profile.env {
            vars.insert(k.clone(), v.render(&rendered));
        }
        for (k, v) in profile.file_env().unwrap_or_default() {
            vars.insert(k, v);
        }
        AgentEnv { vars }
    }

    #[cfg(test)]
    fn from_pairs(pairs: &[(&str, &str)]) -> AgentEnv {
        AgentEnv {
            vars: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// A variable's value, when set and not empty.
    fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    fn home(&self) -> Option<PathBuf> {
        self.get("HOME").map(PathBuf::from)
    }

    /// The first of `names` that is set.
    fn first<'a>(&self, names: &[&'a str]) -> Option<&'a str> {
        names.iter().copied().find(|n| self.get(n).is_some())
    }

    fn truthy(&self, name: &str) -> bool {
        self.get(name)
            .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
    }
}

/// Which agent a command is: the CLI and its ACP adapters share a login.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Claude,
    /// The Codex CLI itself (`codex exec` reads `CODEX_API_KEY`, and `OPENAI_API_KEY` only when
    /// a provider's `env_key` names it).
    CodexCli,
    /// Codex's ACP adapters (they take `OPENAI_API_KEY` as well).
    CodexAcp,
    Gemini,
    Qwen,
}

fn family(command: &str) -> Option<Family> {
    let base = Path::new(command).file_name()?.to_str()?;
    Some(match base {
        b if b.starts_with("claude") => Family::Claude,
        "codex" => Family::CodexCli,
        b if b.starts_with("codex") => Family::CodexAcp,
        b if b.starts_with("gemini") => Family::Gemini,
        b if b.starts_with("qwen") => Family::Qwen,
        _ => return None,
    })
}

/// Whether `profile`'s agent is logged in; `None` for agents this does not know.
pub fn check(profile: &Profile) -> Option<LoginState> {
    let command = profile.command.render(&super::template::Vars::default());
    check_in(family(&command)?, &AgentEnv::of(profile))
}

fn logged_in(detail: String) -> Option<LoginState> {
    Some(LoginState {
        logged_in: true,
        detail,
        fix: None,
    })
}

fn logged_out(detail: &str, fix: &str) -> Option<LoginState> {
    Some(LoginState {
        logged_in: false,
        detail: detail.to_string(),
        fix: Some(fix.to_string()),
    })
}

fn check_in(family: Family, env: &AgentEnv) -> Option<LoginState> {
    match family {
        Family::Claude => claude(env),
        Family::CodexCli | Family::CodexAcp => codex(env, family == Family::CodexAcp),
        Family::Gemini => gemini(env),
        Family::Qwen => qwen(env),
    }
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
}

/// A JSON file's value at `pointer`, when it is a string that is not empty.
fn json_string(path: &Path, pointer: &str) -> bool {
    read_json(path)
        .and_then(|v| {
            v.pointer(pointer)
                .and_then(|s| s.as_str())
                .map(str::to_string)
        })
        .is_some_and(|s| !s.trim().is_empty())
}

fn shown(path: &Path, env: &AgentEnv) -> String {
    match env.home() {
        Some(home) => match path.strip_prefix(&home) {
            Ok(rest) => format!("~/{}", rest.display()),
            Err(_) => path.display().to_string(),
        },
        None => path.display().to_string(),
    }
}

/// The variables Claude Code takes a key or token from.
const CLAUDE_KEYS: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
];

/// Claude Code takes a stored login only with a token and the inference scope.
fn claude_oauth(credentials: &Path) -> bool {
    read_json(credentials).is_some_and(|v| {
        v.pointer("/claudeAiOauth/accessToken")
            .and_then(|t| t.as_str())
            .is_some_and(|t| !t.trim().is_empty())
            && v.pointer("/claudeAiOauth/scopes")
                .and_then(|s| s.as_array())
                .is_some_and(|s| s.iter().any(|x| x == "user:inference"))
    })
}

fn claude(env: &AgentEnv) -> Option<LoginState> {
    const FIX: &str = "run `claude auth login` (its ACP adapters use Claude Code's login), or `claude setup-token` and set CLAUDE_CODE_OAUTH_TOKEN, or set ANTHROPIC_API_KEY in the profile's env";
    if let Some(var) = env.first(CLAUDE_KEYS) {
        return logged_in(format!("API key in ${var}"));
    }
    for (var, cloud) in [
        ("CLAUDE_CODE_USE_BEDROCK", "Amazon Bedrock"),
        ("CLAUDE_CODE_USE_VERTEX", "Google Vertex AI"),
    ] {
        if env.truthy(var) {
            return logged_in(format!("{cloud} (${var}), with that cloud's credentials"));
        }
    }
    // Claude Code keeps its login in its config folder: CLAUDE_CONFIG_DIR, or ~/.claude with
    // ~/.claude.json beside it.
    let (dir, json) = match env.get("CLAUDE_CONFIG_DIR") {
        Some(d) => (PathBuf::from(d), PathBuf::from(d).join(".claude.json")),
        None => {
            let home = env.home()?;
            (home.join(".claude"), home.join(".claude.json"))
        }
    };
    let credentials = dir.join(".credentials.json");
    if claude_oauth(&credentials) {
        return logged_in(shown(&credentials, env));
    }
    if json_string(&json, "/primaryApiKey") {
        return logged_in(format!("{} (primaryApiKey)", shown(&json, env)));
    }
    let settings = dir.join("settings.json");
    if json_string(&settings, "/apiKeyHelper") {
        return logged_in(format!("{} (apiKeyHelper)", shown(&settings, env)));
    }
    if let Some(var) = CLAUDE_KEYS
        .iter()
        .find(|v| json_string(&settings, &format!("/env/{v}")))
    {
        return logged_in(format!("{var} in {}", shown(&settings, env)));
    }
    logged_out(
        &format!(
            "Claude Code would say \"Not logged in · Please run /login\": no API key, and no login in {}",
            shown(&credentials, env)
        ),
        FIX,
    )
}

/// What Codex 0.171 does, read in its source (codex-rs `login/src/auth/manager.rs`
/// `load_auth`, `core/src/model_provider_info.rs` `api_key`) and tried against a stand-in
/// server: a provider whose `env_key` names a variable sends that variable's value and nothing
/// else (unset, `codex exec` stops with "Missing environment variable"; CODEX_API_KEY does not
/// stand in); otherwise `codex exec` sends CODEX_API_KEY, else the login in `auth.json`, with
/// or without `requires_openai_auth`. OPENAI_API_KEY counts only when an `env_key` names it.
fn codex(env: &AgentEnv, adapter: bool) -> Option<LoginState> {
    const FIX: &str = "run `codex login` (its ACP adapters use Codex's login), or set CODEX_API_KEY in the profile's env";
    let codex_home = match env.get("CODEX_HOME") {
        Some(h) => Some(PathBuf::from(h)),
        None => env.home().map(|h| h.join(".codex")),
    };
    // A model provider of its own, named in config.toml, with the variable its key is in:
    // the only key Codex sends then.
    if let Some((provider, key)) = codex_home
        .as_ref()
        .and_then(|h| provider_key(&h.join("config.toml")))
    {
        if env.get(&key).is_some() {
            return logged_in(format!("provider {provider}'s key in ${key}"));
        }
        return logged_out(
            &format!("provider {provider} reads its key from ${key}, which is not set (Codex would say \"Missing environment variable: `{key}`\")"),
            &format!("set {key} in the profile's env"),
        );
    }
    let vars: &[&str] = if adapter {
        &["CODEX_API_KEY", "OPENAI_API_KEY"]
    } else {
        &["CODEX_API_KEY"]
    };
    if let Some(var) = env.first(vars) {
        return logged_in(format!("API key in ${var}"));
    }
    let codex_home = codex_home?;
    let auth = codex_home.join("auth.json");
    if json_string(&auth, "/OPENAI_API_KEY")
        || json_string(&auth, "/tokens/access_token")
        || json_string(&auth, "/tokens/refresh_token")
    {
        return logged_in(shown(&auth, env));
    }
    let detail = if !adapter && env.get("OPENAI_API_KEY").is_some() {
        format!(
            "$OPENAI_API_KEY is set, but `codex exec` sends it only for a provider whose env_key names it; it reads CODEX_API_KEY or a login in {}",
            shown(&auth, env)
        )
    } else {
        format!("no API key and no login in {}", shown(&auth, env))
    };
    logged_out(&detail, FIX)
}

/// The model provider Codex's `config.toml` picks and the variable its key is read from, when
/// the provider is one of its own `[model_providers.X]` with an `env_key`.
fn provider_key(config: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(config).ok()?;
    let value: toml::Table = toml::from_str(&text).ok()?;
    let provider = value.get("model_provider")?.as_str()?.to_string();
    let key = value
        .get("model_providers")?
        .get(&provider)?
        .get("env_key")?
        .as_str()?
        .to_string();
    Some((provider, key))
}

/// `KEY=VALUE` lines of a dotenv file, comments and blank values left out.
fn dotenv(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .map(|text| super::profile::parse_dotenv(&text))
        .unwrap_or_default()
}

/// What Gemini CLI reads its login from: the environment, and the variables it also reads
/// from a dotenv file (~/.gemini/.env in a trusted folder, else ~/.env); the environment wins.
struct GeminiEnv<'a> {
    env: &'a AgentEnv,
    home: Option<PathBuf>,
    dot_env: Vec<(String, String)>,
}

impl GeminiEnv<'_> {
    fn of(env: &AgentEnv) -> GeminiEnv<'_> {
        let home = env.home();
        let dot_env = home
            .as_ref()
            .map(|h| {
                let own = dotenv(&h.join(".gemini/.env"));
                if own.is_empty() {
                    dotenv(&h.join(".env"))
                } else {
                    own
                }
            })
            .unwrap_or_default();
        GeminiEnv { env, home, dot_env }
    }

    fn var(&self, name: &str) -> Option<String> {
        self.env.get(name).map(str::to_string).or_else(|| {
            self.dot_env
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    /// Where a variable was found, for the detail.
    fn from(&self, name: &str) -> String {
        if self.env.get(name).is_some() {
            format!("${name}")
        } else {
            format!("{name} in a .env file")
        }
    }

    fn truthy(&self, name: &str) -> bool {
        self.var(name)
            .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true"))
    }

    /// `security.auth.selectedType` in ~/.gemini/settings.json.
    fn selected(&self) -> Option<String> {
        self.home
            .as_ref()
            .and_then(|h| read_json(&h.join(".gemini/settings.json")))
            .and_then(|v| {
                v.pointer("/security/auth/selectedType")
                    .and_then(|t| t.as_str())
                    .map(str::to_string)
            })
    }

    /// The auth method Gemini uses: the selected one, else the one its variables choose.
    fn method(&self, selected: Option<&str>) -> Option<String> {
        Some(match selected {
            Some(m) => m.to_string(),
            None if self.truthy("GOOGLE_GENAI_USE_GCA") => "oauth-personal".into(),
            None if self.truthy("GOOGLE_GENAI_USE_VERTEXAI") => "vertex-ai".into(),
            None if self.var("GOOGLE_GEMINI_BASE_URL").is_some() => "gateway".into(),
            None if self.var("GEMINI_API_KEY").is_some() => "gemini-api-key".into(),
            None if self.truthy("CLOUD_SHELL") || self.truthy("GEMINI_CLI_USE_COMPUTE_ADC") => {
                "compute-default-credentials".into()
            }
            None => return None,
        })
    }
}

fn gemini(env: &AgentEnv) -> Option<LoginState> {
    // Gemini's own words when it has no auth method (it exits 41).
    const NONE: &str = "Gemini CLI would say \"Please set an Auth method in your ~/.gemini/settings.json or specify one of the following environment variables before running: GEMINI_API_KEY, GOOGLE_GENAI_USE_VERTEXAI, GOOGLE_GENAI_USE_GCA\"";
    const FIX: &str = "run `gemini` once and log in, or set GEMINI_API_KEY in the profile's env (with a custom base URL, also set \"selectedType\": \"gemini-api-key\" in ~/.gemini/settings.json, or it exits 41)";
    let gemini = GeminiEnv::of(env);
    let selected = gemini.selected();
    let Some(method) = gemini.method(selected.as_deref()) else {
        return logged_out(NONE, FIX);
    };
    match method.as_str() {
        "gemini-api-key" => match gemini.var("GEMINI_API_KEY") {
            Some(_) => logged_in(format!("API key {}", gemini.from("GEMINI_API_KEY"))),
            None => logged_out(
                "Gemini CLI would say \"When using Gemini API, you must specify the GEMINI_API_KEY environment variable\"",
                "set GEMINI_API_KEY in the profile's env",
            ),
        },
        "vertex-ai" => gemini_vertex(&gemini),
        "oauth-personal" => gemini_oauth(&gemini),
        "compute-default-credentials" => {
            logged_in("the machine's Google Cloud credentials (compute-default-credentials)".into())
        }
        // Gemini accepts only the methods above without a terminal: anything else, among them
        // the "gateway" a GOOGLE_GEMINI_BASE_URL chooses when settings.json names none, ends
        // every task with exit 41 "Invalid auth method selected".
        other => logged_out(
            &format!(
                "Gemini CLI would say \"Invalid auth method selected\" (exit 41): the auth method is {other}{}",
                if selected.is_none() {
                    " (chosen by $GOOGLE_GEMINI_BASE_URL, as ~/.gemini/settings.json names no selectedType)"
                } else {
                    " (selectedType in ~/.gemini/settings.json)"
                }
            ),
            "set \"selectedType\": \"gemini-api-key\" under security.auth in ~/.gemini/settings.json and GEMINI_API_KEY in the profile's env",
        ),
    }
}

/// Vertex AI: an API key, or a project and location with application default credentials.
fn gemini_vertex(gemini: &GeminiEnv) -> Option<LoginState> {
    if gemini.var("GOOGLE_API_KEY").is_some() {
        return logged_in(format!(
            "Vertex AI, API key {}",
            gemini.from("GOOGLE_API_KEY")
        ));
    }
    if gemini.var("GOOGLE_CLOUD_PROJECT").is_none() || gemini.var("GOOGLE_CLOUD_LOCATION").is_none()
    {
        return logged_out(
            "Vertex AI is chosen without GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION (or GOOGLE_API_KEY)",
            "set GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION in the profile's env",
        );
    }
    let adc = gemini
        .var("GOOGLE_APPLICATION_CREDENTIALS")
        .map(PathBuf::from)
        .or_else(|| {
            gemini
                .home
                .as_ref()
                .map(|h| h.join(".config/gcloud/application_default_credentials.json"))
        });
    match adc.filter(|p| p.is_file()) {
        Some(adc) => logged_in(format!(
            "Vertex AI, application default credentials in {}",
            shown(&adc, gemini.env)
        )),
        None => logged_out(
            "Vertex AI is chosen with no application default credentials (Gemini would say \"Could not load the default credentials\")",
            "run `gcloud auth application-default login`, or set GOOGLE_API_KEY in the profile's env",
        ),
    }
}

/// A Google login kept in ~/.gemini/oauth_creds.json.
fn gemini_oauth(gemini: &GeminiEnv) -> Option<LoginState> {
    let creds = gemini
        .home
        .as_ref()
        .map(|h| h.join(".gemini/oauth_creds.json"));
    match creds.filter(|c| json_string(c, "/refresh_token") || json_string(c, "/access_token")) {
        Some(c) => logged_in(format!("Google login in {}", shown(&c, gemini.env))),
        None => logged_out(
            "a Google login is chosen but none is kept in ~/.gemini/oauth_creds.json (Gemini would say \"Manual authorization is required but the current session is non-interactive\")",
            "run `gemini` in a terminal and log in, or set GEMINI_API_KEY in the profile's env",
        ),
    }
}

fn qwen(env: &AgentEnv) -> Option<LoginState> {
    const NONE: &str = "Qwen Code would say \"No auth type is selected. Please configure an auth type (e.g. via settings or `--auth-type`) before running in non-interactive mode.\"";
    const FIX: &str = "run `qwen` once and log in, or set OPENAI_API_KEY, OPENAI_BASE_URL and OPENAI_MODEL in the profile's env (`aamp-bridge profile new --env`)";
    let home = env.home()?;
    let dot_env = dotenv(&home.join(".qwen/.env"));
    let var = |name: &str| env.get(name).is_some() || dot_env.iter().any(|(k, _)| k == name);
    let settings = read_json(&home.join(".qwen/settings.json"));
    let selected = settings.as_ref().and_then(|v| {
        v.pointer("/security/auth/selectedType")
            .and_then(|t| t.as_str())
            .map(str::to_string)
    });
    match selected.as_deref() {
        Some("openai") => {
            let in_settings = settings
                .as_ref()
                .and_then(|v| v.pointer("/security/auth/apiKey"))
                .and_then(|k| k.as_str())
                .is_some_and(|k| !k.is_empty());
            if var("OPENAI_API_KEY") || in_settings {
                logged_in("an OpenAI-compatible API key (selectedType openai)".into())
            } else {
                logged_out(
                    "Qwen Code would say \"Missing API key for OpenAI-compatible auth\"",
                    "set OPENAI_API_KEY in the profile's env",
                )
            }
        }
        Some("qwen-oauth") => {
            let creds = home.join(".qwen/oauth_creds.json");
            if json_string(&creds, "/access_token") || json_string(&creds, "/refresh_token") {
                logged_in(shown(&creds, env))
            } else {
                logged_out(
                    "a Qwen login is chosen but none is kept in ~/.qwen/oauth_creds.json",
                    FIX,
                )
            }
        }
        Some(other) => logged_in(format!("auth type {other}")),
        None if var("OPENAI_API_KEY")
            && var("OPENAI_BASE_URL")
            && (var("OPENAI_MODEL") || var("QWEN_MODEL")) =>
        {
            logged_in("API key in $OPENAI_API_KEY, with OPENAI_BASE_URL and a model".into())
        }
        None => logged_out(NONE, FIX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A home folder of the test's own (or a `CODEX_HOME`, a `CLAUDE_CONFIG_DIR`).
    struct Home(tempfile::TempDir);

    impl Home {
        fn new() -> Home {
            Home(tempfile::tempdir().unwrap())
        }

        fn path(&self) -> &str {
            self.0.path().to_str().unwrap()
        }

        /// The login state of `family` with this folder as `HOME`, beside `pairs`.
        fn state(&self, family: Family, pairs: &[(&str, &str)]) -> LoginState {
            state(family, &[&[("HOME", self.path())], pairs].concat())
        }

        fn logged_in(&self, family: Family, pairs: &[(&str, &str)]) -> bool {
            self.state(family, pairs).logged_in
        }

        /// Writes `text` to the file `name` below it.
        fn write(&self, name: &str, text: &str) {
            let path = self.0.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    fn state(family: Family, pairs: &[(&str, &str)]) -> LoginState {
        check_in(family, &AgentEnv::from_pairs(pairs)).unwrap()
    }

    /// Asserts that `s` is no login and that its detail says `says`.
    #[track_caller]
    fn assert_no_login(s: &LoginState, says: &str) {
        assert!(!s.logged_in && s.detail.contains(says), "{s:?}");
    }

    #[test]
    fn commands_name_their_family() {
        assert_eq!(family("/usr/bin/codex"), Some(Family::CodexCli));
        assert_eq!(family("codex-acp"), Some(Family::CodexAcp));
        assert_eq!(family("claude-agent-acp"), Some(Family::Claude));
        assert_eq!(family("gemini"), Some(Family::Gemini));
        assert_eq!(family("qwen"), Some(Family::Qwen));
        assert_eq!(family("goose"), None);
    }

    #[test]
    fn an_empty_claude_credentials_file_is_not_a_login() {
        let h = Home::new();
        h.write(".claude/.credentials.json", "");
        h.write(".claude.json", r#"{"numStartups": 1}"#);
        let s = h.state(Family::Claude, &[]);
        assert!(!s.logged_in, "{s:?}");
        assert!(
            s.detail.contains("Please run /login") && s.fix.unwrap().contains("claude auth login")
        );
        h.write(
            ".claude/.credentials.json",
            r#"{"claudeAiOauth": {"accessToken": "t"}}"#,
        );
        assert!(!h.logged_in(Family::Claude, &[]), "no scope");
        h.write(
            ".claude/.credentials.json",
            r#"{"claudeAiOauth": {"accessToken": "t", "scopes": ["user:inference"]}}"#,
        );
        assert!(h.logged_in(Family::Claude, &[]));
        // CLAUDE_CONFIG_DIR moves it.
        let other = Home::new();
        let os = other.path();
        assert!(!h.logged_in(Family::Claude, &[("CLAUDE_CONFIG_DIR", os)]));
        assert!(state(Family::Claude, &[("ANTHROPIC_API_KEY", "k")]).logged_in);
        assert!(state(Family::Claude, &[("CLAUDE_CODE_USE_VERTEX", "1")]).logged_in);
    }

    #[test]
    fn openai_api_key_alone_is_not_a_codex_cli_login() {
        let h = Home::new();
        let s = h.state(Family::CodexCli, &[("OPENAI_API_KEY", "k")]);
        assert!(!s.logged_in, "{s:?}");
        assert!(s.detail.contains("CODEX_API_KEY"), "{s:?}");
        assert!(h.logged_in(Family::CodexAcp, &[("OPENAI_API_KEY", "k")]));
        assert!(h.logged_in(Family::CodexCli, &[("CODEX_API_KEY", "k")]));
    }

    #[test]
    fn codex_reads_its_own_home_and_providers() {
        let h = Home::new();
        h.write(".codex/auth.json", r#"{"OPENAI_API_KEY": "k"}"#);
        assert!(h.logged_in(Family::CodexCli, &[]));
        // CODEX_HOME elsewhere: ~/.codex does not count.
        let other = Home::new();
        let os = other.path();
        assert!(!h.logged_in(Family::CodexCli, &[("CODEX_HOME", os)]));
        other.write(
            "config.toml",
            "model_provider = \"standin\"\n[model_providers.standin]\nenv_key = \"STANDIN_KEY\"\n",
        );
        let s = h.state(Family::CodexCli, &[("CODEX_HOME", os)]);
        assert!(
            !s.logged_in && s.fix.as_deref() == Some("set STANDIN_KEY in the profile's env"),
            "{s:?}"
        );
        let s = h.state(
            Family::CodexCli,
            &[("CODEX_HOME", os), ("STANDIN_KEY", "k")],
        );
        assert!(s.logged_in && s.detail.contains("STANDIN_KEY"), "{s:?}");
    }

    #[test]
    fn a_commented_out_gemini_key_is_not_a_login() {
        let h = Home::new();
        h.write(".gemini/.env", "# GEMINI_API_KEY=abc\nGOOGLE_API_KEY=\n");
        assert!(!h.logged_in(Family::Gemini, &[]));
        h.write(".gemini/.env", "export GEMINI_API_KEY=\"abc\"\n");
        assert!(h.logged_in(Family::Gemini, &[]));
    }

    #[test]
    fn google_api_key_alone_chooses_no_gemini_method() {
        let h = Home::new();
        let s = h.state(Family::Gemini, &[("GOOGLE_API_KEY", "k")]);
        assert_no_login(&s, "Please set an Auth method");
        // A base URL chooses the gateway; a key with a chosen method is a login.
        h.write(
            ".gemini/settings.json",
            r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}}"#,
        );
        assert!(!h.logged_in(Family::Gemini, &[]));
        assert!(h.logged_in(Family::Gemini, &[("GEMINI_API_KEY", "k")]));
    }

    /// Issue 43: GOOGLE_GEMINI_BASE_URL with no selectedType makes Gemini choose "gateway",
    /// which it refuses with exit 41 "Invalid auth method selected" on every task.
    #[test]
    fn a_gemini_base_url_without_a_selected_type_is_not_a_login() {
        let h = Home::new();
        let env = [
            ("GOOGLE_GEMINI_BASE_URL", "http://127.0.0.1:9/"),
            ("GEMINI_API_KEY", "k"),
        ];
        let s = h.state(Family::Gemini, &env);
        assert_no_login(&s, "Invalid auth method selected");
        assert!(s.fix.as_deref().unwrap().contains("selectedType"), "{s:?}");
        h.write(
            ".gemini/settings.json",
            r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}}"#,
        );
        assert!(h.logged_in(Family::Gemini, &env));
        h.write(
            ".gemini/settings.json",
            r#"{"security": {"auth": {"selectedType": "gateway"}}}"#,
        );
        assert!(!h.logged_in(Family::Gemini, &env));
    }

    /// Codex sends only the provider's env_key when it has one (CODEX_API_KEY does not stand
    /// in), and OPENAI_API_KEY when an env_key names it, `requires_openai_auth` or not.
    #[test]
    fn a_codex_provider_key_is_the_only_key_sent() {
        let h = Home::new();
        h.write(
            ".codex/config.toml",
            "model_provider = \"x\"\n[model_providers.x]\nenv_key = \"FOO\"\n",
        );
        let s = h.state(Family::CodexCli, &[("CODEX_API_KEY", "k")]);
        assert_no_login(&s, "FOO");
        h.write(".codex/config.toml", "model_provider = \"x\"\n[model_providers.x]\nenv_key = \"OPENAI_API_KEY\"\nrequires_openai_auth = true\n");
        assert!(h.logged_in(Family::CodexCli, &[("OPENAI_API_KEY", "k")]));
        // Without an env_key, requires_openai_auth or not, OPENAI_API_KEY is not sent.
        h.write(
            ".codex/config.toml",
            "model_provider = \"x\"\n[model_providers.x]\nrequires_openai_auth = true\n",
        );
        let s = h.state(Family::CodexCli, &[("OPENAI_API_KEY", "k")]);
        assert_no_login(&s, "env_key");
    }

    #[test]
    fn qwen_needs_a_key_a_base_url_and_a_model_or_a_chosen_auth_type() {
        let h = Home::new();
        let s = h.state(Family::Qwen, &[("OPENAI_API_KEY", "k")]);
        assert_no_login(&s, "No auth type is selected");
        let all = [
            ("OPENAI_API_KEY", "k"),
            ("OPENAI_BASE_URL", "http://x/v1"),
            ("OPENAI_MODEL", "m"),
        ];
        assert!(h.logged_in(Family::Qwen, &all));
    }

    #[test]
    fn vertex_needs_credentials_and_a_project() {
        let h = Home::new();
        let vertex = [("GOOGLE_GENAI_USE_VERTEXAI", "true")];
        let s = h.state(Family::Gemini, &vertex);
        assert!(!s.logged_in && s.fix.unwrap().contains("GOOGLE_CLOUD_PROJECT"));
        let mut with_project = vertex.to_vec();
        with_project.extend([
            ("GOOGLE_CLOUD_PROJECT", "p"),
            ("GOOGLE_CLOUD_LOCATION", "us-central1"),
        ]);
        let s = h.state(Family::Gemini, &with_project);
        assert!(!s.logged_in && s.fix.unwrap().contains("gcloud"));
        h.write(".config/gcloud/application_default_credentials.json", "{}");
        assert!(h.logged_in(Family::Gemini, &with_project));
    }

    #[test]
    fn dotenv_lines() {
        assert_eq!(
            super::super::profile::parse_dotenv(
                "A=1\n# B=2\nC=\nexport D='x y'\nE=\"q\" # c\nF=v # note\n"
            ),
            vec![
                ("A".to_string(), "1".to_string()),
                ("D".to_string(), "x y".to_string()),
                ("E".to_string(), "q".to_string()),
                ("F".to_string(), "v".to_string()),
            ]
        );
    }
}
