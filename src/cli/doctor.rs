//! `aamp-bridge doctor`: checks the config, each mailbox (login, push, sender evidence, transport)
//! and each agent, with what to do about each failure.

use crate::output::outln;

use super::*;

pub(super) use crate::mailbox::Verdict;

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
    use crate::runner::{acp, profile::ProfileKind, scan, Profile};
    use crate::wizard::Progress as _;
    let spinner = crate::wizard::prompt::Spinner::new();
    let mut checks = Vec::new();
    let config = match LoadedConfig::load(config_path) {
        Ok(c) => {
            checks.push(check(
                "config",
                Verdict::Ok,
                format!("{} loads", c.path.display()),
                "",
            ));
            Some(c)
        }
        Err(e) => {
            checks.push(check(
                "config",
                Verdict::Fail,
                e.problem.clone(),
                e.fix.clone(),
            ));
            None
        }
    };
    if let Some(config) = &config {
        match crate::fsio::StateLock::holder(&config.state_dir) {
            Some(pid) => checks.push(check(
                "bridge",
                Verdict::Ok,
                format!("running (pid {pid})"),
                "",
            )),
            None => checks.push(check(
                "bridge",
                Verdict::Warn,
                "not running",
                "aamp-bridge start, or install it as a service",
            )),
        }
        let agents_mailboxes: Vec<&str> = config
            .config
            .agents
            .iter()
            .map(|a| a.mailbox_name())
            .collect();
        for name in mailboxes_to_check(config) {
            let serves_agent = agents_mailboxes.contains(&name.as_str());
            spinner.step(&format!("checking mailbox {name}"));
            for found in crate::mailbox::check(config, &name, serves_agent).await? {
                let what = format!("mailbox {name}: {}", found.part);
                checks.push(check(what, found.verdict, found.detail, found.fix));
            }
        }
        let dirs = config.profile_dirs();
        let bin_dirs = scan::bin_dirs().await;
        for agent in &config.config.agents {
            spinner.step(&format!("checking agent {}", agent.name));
            let what = format!("agent {}", agent.name);
            checks.extend(takes_tasks(config, agent));
            let profile = match Profile::find(&config.profile_ref(&agent.profile), &dirs) {
                Ok(p) => p,
                Err(e) => {
                    checks.push(check(
                        what,
                        Verdict::Fail,
                        e.to_string(),
                        "fix the agent's profile in the config (aamp-bridge agents lists them)",
                    ));
                    continue;
                }
            };
            let command = profile.command.render(&Default::default());
            let Some(path) = scan::find(&command, &bin_dirs) else {
                checks.push(check(
                    what,
                    Verdict::Fail,
                    format!("{command:?} (profile {}) is not installed", profile.name),
                    profile
                        .install
                        .clone()
                        .unwrap_or_else(|| format!("install {command}, or pick another profile")),
                ));
                continue;
            };
            let login = crate::runner::login::check(&profile);
            let login_fix = |fallback: &str| {
                login
                    .as_ref()
                    .and_then(|l| l.fix.clone())
                    .unwrap_or_else(|| fallback.to_string())
            };
            let (verdict, detail, fix) = if profile.kind == ProfileKind::Acp {
                // The agent itself says whether it is logged in: a session is opened (no
                // prompt is sent).
                let scratch = std::env::temp_dir();
                match acp::probe(&profile, &scratch, true).await {
                    // claude-agent-acp opens a session with no login and refuses the prompt.
                    Ok(info) if login.as_ref().is_some_and(|l| !l.logged_in) => (
                        Verdict::Warn,
                        format!(
                            "{} ({}, profile {}) opens a session, but is not logged in: {}",
                            path.display(),
                            info.agent.as_deref().unwrap_or("an unnamed ACP agent"),
                            profile.name,
                            login.as_ref().map(|l| l.detail.clone()).unwrap_or_default()
                        ),
                        login_fix(""),
                    ),
                    Ok(info) => (
                        Verdict::Ok,
                        format!(
                            "{} ({}): answers ACP and opens a session",
                            path.display(),
                            info.agent.as_deref().unwrap_or("an unnamed ACP agent")
                        ),
                        String::new(),
                    ),
                    Err(crate::runner::RunError::NotLoggedIn(words)) => (
                        Verdict::Warn,
                        format!(
                            "{} (profile {}) is installed but not logged in: {words}",
                            path.display(),
                            profile.name
                        ),
                        login_fix("log in with the agent's own CLI, or set its API key in the profile's env"),
                    ),
                    // An agent with no login often fails its session some other way (Gemini
                    // with a Google login not yet done waits for a browser): when the login
                    // check already knows why, that is the warning and its fix.
                    Err(e) if login.as_ref().is_some_and(|l| !l.logged_in) => (
                        Verdict::Warn,
                        format!(
                            "{} (profile {}) is installed but not logged in: {} (the session failed: {e})",
                            path.display(),
                            profile.name,
                            login.as_ref().map(|l| l.detail.clone()).unwrap_or_default()
                        ),
                        login_fix(""),
                    ),
                    Err(e) => (
                        Verdict::Fail,
                        format!("{} (profile {}): {e}", path.display(), profile.name),
                        "run the agent by hand to see why; `aamp-bridge agents --probe` tries it too".to_string(),
                    ),
                }
            } else {
                let version = match scan::version_probe(&path).await {
                    scan::VersionProbe::Printed(v) => v,
                    scan::VersionProbe::Silent => "no version printed".into(),
                    scan::VersionProbe::NoAnswer => "no --version answer".into(),
                };
                match &login {
                    Some(l) if !l.logged_in => (
                        Verdict::Warn,
                        format!(
                            "{} ({version}, profile {}) is installed but not logged in: {}",
                            path.display(),
                            profile.name,
                            l.detail
                        ),
                        login_fix(""),
                    ),
                    Some(l) => (
                        Verdict::Ok,
                        format!("{} ({version}), logged in ({})", path.display(), l.detail),
                        String::new(),
                    ),
                    None => (
                        Verdict::Ok,
                        no_known_login(&profile, &path, &version),
                        String::new(),
                    ),
                }
            };
            checks.push(check(what, verdict, detail, fix));
        }
    }
    let failed = checks.iter().any(|c| c.status == Verdict::Fail);
    spinner.clear();
    if json {
        outln!("{}", crate::events::json_text(&checks)?);
    } else {
        for c in &checks {
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
    }
    Ok(if failed { 1 } else { 0 })
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
