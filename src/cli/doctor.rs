//! `aamp-bridge doctor`: checks the config, each mailbox (login, push, sender evidence, transport)
//! and each agent, with what to do about each failure.

use crate::output::outln;

use super::*;

pub(super) use crate::mailbox::Verdict;
use crate::runner::login::LoginState;

/// One line of `doctor`.
#[derive(serde::Serialize)]
pub(super) struct Check {
    pub(super) check: String,
    pub(super) status: Verdict,
    pub(super) detail: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(super) fix: String,
}

pub(super) fn check(
    check: impl Into<String>,
    status: Verdict,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Check {
    Check {
        check: check.into(),
        status,
        detail: detail.into(),
        fix: fix.into(),
    }
}

pub(super) async fn doctor(config_path: &std::path::Path, json: bool) -> anyhow::Result<i32> {
    let spinner = crate::wizard::prompt::Spinner::new();
    let (config, loads) = config_loads(config_path);
    let mut checks = vec![loads];
    if let Some(config) = &config {
        checks.push(bridge_runs(config));
        checks.extend(mailboxes(config, &spinner).await?);
        checks.extend(agents(config, &spinner).await);
        checks.extend(unpriced(config));
    }
    spinner.clear();
    print(&checks, json)?;
    let failed = checks.iter().any(|c| c.status == Verdict::Fail);
    Ok(if failed { 1 } else { 0 })
}

/// The config, when it loads.
fn config_loads(path: &std::path::Path) -> (Option<LoadedConfig>, Check) {
    match LoadedConfig::load(path) {
        Ok(c) => {
            let loads = format!("{} loads", c.path.display());
            (Some(c), check("config", Verdict::Ok, loads, ""))
        }
        Err(e) => (None, check("config", Verdict::Fail, e.problem, e.fix)),
    }
}

/// Whether a bridge holds the state directory.
fn bridge_runs(config: &LoadedConfig) -> Check {
    match crate::fsio::StateLock::holder(&config.state_dir) {
        Some(pid) => check("bridge", Verdict::Ok, format!("running (pid {pid})"), ""),
        None => check(
            "bridge",
            Verdict::Warn,
            "not running",
            "aamp-bridge start, or install it as a service",
        ),
    }
}

/// Each mailbox, part by part as its system checks it.
async fn mailboxes(
    config: &LoadedConfig,
    spinner: &crate::wizard::prompt::Spinner,
) -> Result<Vec<Check>, crate::mailbox::MailboxError> {
    use crate::wizard::Progress as _;
    let mut checks = Vec::new();
    for name in mailboxes_to_check(config) {
        let tasks_arrive = config
            .config
            .agents
            .iter()
            .any(|a| a.mailbox_name() == name);
        spinner.step(&format!("checking mailbox {name}"));
        for found in crate::mailbox::check(config, &name, tasks_arrive).await? {
            let what = format!("mailbox {name}: {}", found.part);
            checks.push(check(what, found.verdict, found.detail, found.fix));
        }
    }
    Ok(checks)
}

/// Each agent: whether it takes tasks, and whether its agent is installed and logged in.
async fn agents(config: &LoadedConfig, spinner: &crate::wizard::prompt::Spinner) -> Vec<Check> {
    use crate::wizard::Progress as _;
    let dirs = config.profile_dirs();
    let bin_dirs = crate::runner::scan::bin_dirs().await;
    let mut checks = Vec::new();
    for agent in &config.config.agents {
        spinner.step(&format!("checking agent {}", agent.name));
        checks.extend(takes_tasks(config, agent));
        checks.push(agent_runs(config, agent, &dirs, &bin_dirs).await);
    }
    checks
}

/// Whether an agent's profile is found, its command installed, and the agent logged in.
async fn agent_runs(
    config: &LoadedConfig,
    agent: &crate::config::AgentConfig,
    dirs: &[PathBuf],
    bin_dirs: &[PathBuf],
) -> Check {
    use crate::runner::{profile::ProfileKind, scan, Profile};
    let what = format!("agent {}", agent.name);
    let profile = match Profile::find(&config.profile_ref(&agent.profile), dirs) {
        Ok(p) => p,
        Err(e) => {
            let fix = "fix the agent's profile in the config (aamp-bridge agents lists them)";
            return check(what, Verdict::Fail, e.to_string(), fix);
        }
    };
    let command = profile.command.render(&Default::default());
    let Some(path) = scan::find(&command, bin_dirs) else {
        return check(
            what,
            Verdict::Fail,
            format!("{command:?} (profile {}) is not installed", profile.name),
            profile
                .install
                .clone()
                .unwrap_or_else(|| format!("install {command}, or pick another profile")),
        );
    };
    let login = crate::runner::login::check(&profile);
    let (verdict, detail, fix) = if profile.kind == ProfileKind::Acp {
        acp_session(&profile, &path, login.as_ref()).await
    } else {
        cli_version(&profile, &path, login.as_ref()).await
    };
    check(what, verdict, detail, fix)
}

/// An agent's own fix for its login, or `fallback`.
fn login_fix(login: Option<&LoginState>, fallback: &str) -> String {
    login
        .and_then(|l| l.fix.clone())
        .unwrap_or_else(|| fallback.to_string())
}

/// An ACP agent says itself whether it is logged in: a session is opened (no prompt is
/// sent).
async fn acp_session(
    profile: &crate::runner::Profile,
    path: &std::path::Path,
    login: Option<&LoginState>,
) -> (Verdict, String, String) {
    let not_logged_in = login.filter(|l| !l.logged_in);
    let why = || not_logged_in.map(|l| l.detail.clone()).unwrap_or_default();
    let (path, name) = (path.display(), &profile.name);
    let scratch = std::env::temp_dir();
    match crate::runner::acp::probe(profile, &scratch, true).await {
        // claude-agent-acp opens a session with no login and refuses the prompt.
        Ok(info) if not_logged_in.is_some() => (
            Verdict::Warn,
            format!(
                "{path} ({}, profile {name}) opens a session, but is not logged in: {}",
                info.agent.as_deref().unwrap_or("an unnamed ACP agent"),
                why()
            ),
            login_fix(login, ""),
        ),
        Ok(info) => (
            Verdict::Ok,
            format!(
                "{path} ({}): answers ACP and opens a session",
                info.agent.as_deref().unwrap_or("an unnamed ACP agent")
            ),
            String::new(),
        ),
        Err(crate::runner::RunError::NotLoggedIn(words)) => (
            Verdict::Warn,
            format!("{path} (profile {name}) is installed but not logged in: {words}"),
            login_fix(
                login,
                "log in with the agent's own CLI, or set its API key in the profile's env",
            ),
        ),
        // An agent with no login often fails its session some other way (Gemini with a
        // Google login not yet done waits for a browser): when the login check already
        // knows why, that is the warning and its fix.
        Err(e) if not_logged_in.is_some() => (
            Verdict::Warn,
            format!(
                "{path} (profile {name}) is installed but not logged in: {} (the session failed: {e})",
                why()
            ),
            login_fix(login, ""),
        ),
        Err(e) => (
            Verdict::Fail,
            format!("{path} (profile {name}): {e}"),
            "run the agent by hand to see why; `aamp-bridge agents --probe` tries it too"
                .to_string(),
        ),
    }
}

/// A CLI agent: its `--version`, and its login when the bridge knows where it is.
async fn cli_version(
    profile: &crate::runner::Profile,
    path: &std::path::Path,
    login: Option<&LoginState>,
) -> (Verdict, String, String) {
    use crate::runner::scan::{version_probe, VersionProbe};
    let version = match version_probe(path).await {
        VersionProbe::Printed(v) => v,
        VersionProbe::Silent => "no version printed".into(),
        VersionProbe::NoAnswer => "no --version answer".into(),
    };
    match login {
        Some(l) if !l.logged_in => (
            Verdict::Warn,
            format!(
                "{} ({version}, profile {}) is installed but not logged in: {}",
                path.display(),
                profile.name,
                l.detail
            ),
            login_fix(login, ""),
        ),
        Some(l) => (
            Verdict::Ok,
            format!("{} ({version}), logged in ({})", path.display(), l.detail),
            String::new(),
        ),
        None => (
            Verdict::Ok,
            no_known_login(profile, path, &version),
            String::new(),
        ),
    }
}

/// The checks as lines (`OK    what: detail`, its fix below), or as JSON.
fn print(checks: &[Check], json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", crate::events::json_text(checks)?);
        return Ok(());
    }
    for c in checks {
        let word = match c.status {
            Verdict::Ok => "OK",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        };
        outln!("{word:<4}  {}: {}", c.check, c.detail);
        if !c.fix.is_empty() {
            outln!("      fix: {}", c.fix);
        }
    }
    Ok(())
}

/// The mailboxes `doctor` checks: each agent's, then the config's others (the person's own,
/// `me`, which `dispatch --from` sends from), each once.
fn mailboxes_to_check(config: &LoadedConfig) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let agents = config.config.agents.iter().map(|a| a.mailbox_name());
    for name in agents.chain(config.config.mailboxes.keys().map(String::as_str)) {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    names
}

/// How many of an agent's newest tasks `doctor` looks at to see whether it takes any.
const RECENT_TASKS: usize = 20;

/// Whether an agent takes tasks at all: a WARN when no sender may dispatch to it (neither
/// the config nor the rules kept by `policy allow` and pairing name one), or when each of its
/// recent tasks was rejected (with the newest reason).
fn takes_tasks(config: &LoadedConfig, agent: &crate::config::AgentConfig) -> Option<Check> {
    use crate::dispatch::{Journal, TaskState};
    let what = format!("agent {}: senders", agent.name);
    let path = config.state().journal();
    let journal = path.exists().then(|| Journal::open(&path).ok()).flatten();
    let kept = journal
        .as_ref()
        .and_then(|j| j.policy(&agent.name).ok())
        .is_some_and(|(allow, _)| !allow.is_empty());
    if agent.sender_policy().is_empty() && !kept {
        return Some(check(
            what,
            Verdict::Warn,
            "no sender may dispatch to it: every task is rejected",
            format!("add allow_from = [\"you@example.com\"] to the agent in the config, or `aamp-bridge policy allow --agent {0} SENDER`, or pair a sender (`aamp-bridge pair --agent {0}`)", agent.name),
        ));
    }
    let recent = journal?.tasks(Some(&agent.name), None, RECENT_TASKS).ok()?;
    let rejected = TaskState::Rejected.as_str();
    if recent.is_empty() || recent.iter().any(|t| t.state != rejected) {
        return None;
    }
    let newest = recent[0].reason.as_deref().unwrap_or("no reason recorded");
    Some(check(
        what,
        Verdict::Warn,
        format!(
            "its {} newest tasks were all rejected; the newest because: {newest}",
            recent.len()
        ),
        format!(
            "`aamp-bridge tasks --agent {} --state rejected` lists them with their senders; allow a sender with `aamp-bridge policy allow`",
            agent.name
        ),
    ))
}

/// What `doctor` says of an installed CLI agent whose login the bridge cannot read: nothing
/// about a login for the bridge's demo agents (`echo`, `echo-prompt`: a text tool, no model),
/// which have none.
fn no_known_login(
    profile: &crate::runner::Profile,
    path: &std::path::Path,
    version: &str,
) -> String {
    let demo =
        profile.origin == "built-in" && matches!(profile.name.as_str(), "echo" | "echo-prompt");
    if demo {
        format!(
            "{} ({version}): a demo agent, no model and no login",
            path.display()
        )
    } else {
        format!(
            "{} ({version}); its login is not known to the bridge: `aamp-bridge profile test {}` runs it once",
            path.display(),
            profile.name
        )
    }
}

/// The models of the last 30 days' usage reports that stated no cost and have no
/// `[prices]` entry: money budgets count none of their spending.
fn unpriced(config: &LoadedConfig) -> Option<Check> {
    use crate::dispatch::{budget, Journal};
    let path = config.state().journal();
    let journal = path.exists().then(|| Journal::open(&path).ok()).flatten()?;
    let prices = budget::Prices::new(&config.config.prices);
    let now = std::time::SystemTime::now();
    let month = now - std::time::Duration::from_secs(30 * 24 * 3600);
    let models = budget::unpriced_models(&journal, &prices, (month, now)).ok()?;
    let named: Vec<String> = models
        .iter()
        .map(|m| match m.as_str() {
            "" => "(reports that name no model)".to_string(),
            m => format!("{m:?}"),
        })
        .collect();
    (!models.is_empty()).then(|| check(
        "prices",
        Verdict::Warn,
        format!("no stated cost and no price for: {}; money budgets do not count their spending", named.join(", ")),
        "add a [prices.\"MODEL\"] table for each (US dollars per million input and output tokens, from the provider's price list; docs/configuration.md)",
    ))
}
