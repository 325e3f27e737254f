//! Finding the agents installed on this machine: for every profile, its real launch binary
//! (the ACP adapter, not the vendor's GUI launcher) on PATH, in npm's global bin folder and in
//! the Node version managers' folders; its version; and what stands in its way.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::process::Command;

use super::profile::{Profile, ProfileKind};
use super::template::Vars;

/// How long `--version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Clone, Debug, Serialize)]
pub struct Detected {
    pub profile: String,
    pub kind: &'static str,
    pub description: String,
    pub command: String,
    /// Where the command was found; `None` when it is not installed.
    pub path: Option<PathBuf>,
    pub version: Option<String>,
    /// Agents in the config that use this profile.
    pub configured: Vec<String>,
    pub warnings: Vec<String>,
    pub install: Option<String>,
    /// Whether the agent has credentials, read as the agent reads them ([`super::login`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login: Option<super::login::LoginState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<Result<super::acp::ProbeInfo, String>>,
}

/// The folders searched, in order: PATH, then npm's global bin, then the usual homes of Node
/// version managers and user installs.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(prefix) =
        std::env::var_os("NPM_CONFIG_PREFIX").or_else(|| std::env::var_os("npm_config_prefix"))
    {
        dirs.push(PathBuf::from(prefix).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
        dirs.push(home.join(".npm-global/bin"));
        if let Ok(entries) = std::fs::read_dir(home.join(".nvm/versions/node")) {
            let mut versions: Vec<PathBuf> =
                entries.flatten().map(|e| e.path().join("bin")).collect();
            versions.sort();
            dirs.extend(versions.into_iter().rev());
        }
        for sub in [".volta/bin", ".local/share/pnpm", ".bun/bin", ".local/bin"] {
            dirs.push(home.join(sub));
        }
    }
    dirs.push(PathBuf::from("/usr/local/bin"));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The first executable file named `command` in `dirs` (or `command` itself when it is a path).
pub fn find(command: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if command.contains('/') {
        let p = PathBuf::from(command);
        return executable(&p).then_some(p);
    }
    dirs.iter().map(|d| d.join(command)).find(|p| executable(p))
}

/// The first line `path --version` prints, within a few seconds.
pub async fn version(path: &Path) -> Option<String> {
    match version_probe(path).await {
        VersionProbe::Printed(v) => Some(v),
        VersionProbe::Silent | VersionProbe::NoAnswer => None,
    }
}

/// What `--version` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionProbe {
    /// Its first line.
    Printed(String),
    /// It ended without printing one (the Claude and Zed ACP adapters do).
    Silent,
    /// It did not end within [`VERSION_TIMEOUT`], or could not start.
    NoAnswer,
}

pub async fn version_probe(path: &Path) -> VersionProbe {
    let mut cmd = Command::new(path);
    cmd.arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let Ok(child) = super::process::GroupChild::spawn(&mut cmd) else {
        return VersionProbe::NoAnswer;
    };
    let Ok(Ok(out)) = tokio::time::timeout(VERSION_TIMEOUT, child.wait_output()).await else {
        return VersionProbe::NoAnswer;
    };
    String::from_utf8_lossy(&out)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map_or(VersionProbe::Silent, |l| {
            VersionProbe::Printed(l.chars().take(80).collect())
        })
}

/// npm's global bin folder, as `npm prefix -g` says (within a few seconds), when npm exists.
pub async fn npm_global_bin(dirs: &[PathBuf]) -> Option<PathBuf> {
    let npm = find("npm", dirs)?;
    let mut cmd = Command::new(npm);
    cmd.args(["prefix", "-g"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let child = super::process::GroupChild::spawn(&mut cmd).ok()?;
    let out = tokio::time::timeout(VERSION_TIMEOUT, child.wait_output())
        .await
        .ok()?
        .ok()?;
    let prefix = String::from_utf8_lossy(&out).trim().to_string();
    (!prefix.is_empty()).then(|| PathBuf::from(prefix).join("bin"))
}

/// The major version of `node` found in `dirs`.
async fn node_major(dirs: &[PathBuf]) -> Option<(u32, String)> {
    let node = find("node", dirs)?;
    let text = version(&node).await?;
    let major = text
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()?;
    Some((major, text))
}

/// [`search_dirs`] and npm's global bin folder: where agents' commands are looked for.
pub async fn bin_dirs() -> Vec<PathBuf> {
    let mut dirs = search_dirs();
    if let Some(npm_bin) = npm_global_bin(&dirs).await {
        if !dirs.contains(&npm_bin) {
            dirs.push(npm_bin);
        }
    }
    dirs
}

/// Looks for every profile's command. `configured` maps profile names to the agents using
/// them.
pub async fn scan(
    profiles: &[Profile],
    configured: &[(String, String)],
    dirs: &[PathBuf],
) -> Vec<Detected> {
    let node = node_major(dirs).await;
    let mut out = Vec::with_capacity(profiles.len());
    let paths: Vec<Option<PathBuf>> = profiles
        .iter()
        .map(|p| find(&p.command.render(&Vars::default()), dirs))
        .collect();
    // All at once: one after another, a loaded machine made the later ones look hung.
    let probes = futures::future::join_all(paths.iter().map(|path| async move {
        match path {
            Some(p) => Some(version_probe(p).await),
            None => None,
        }
    }))
    .await;
    for ((profile, path), probe) in profiles.iter().zip(paths).zip(probes) {
        let command = profile.command.render(&Vars::default());
        let version = match &probe {
            Some(VersionProbe::Printed(v)) => Some(v.clone()),
            _ => None,
        };
        let warnings = warnings(profile, path.is_some(), &node, &probe, &command);
        let login = path.as_ref().and_then(|_| super::login::check(profile));
        out.push(Detected {
            profile: profile.name.clone(),
            kind: match profile.kind {
                ProfileKind::Cli => "cli",
                ProfileKind::Acp => "acp",
            },
            description: profile.description.clone(),
            command,
            path,
            version,
            configured: configured
                .iter()
                .filter(|(_, p)| *p == profile.name)
                .map(|(a, _)| a.clone())
                .collect(),
            warnings,
            install: profile.install.clone(),
            login,
            probe: None,
        });
    }
    out
}

/// What stands in the way of a found agent: a Node.js too old for it, a `--version` that
/// gave no answer.
fn warnings(
    profile: &Profile,
    found: bool,
    node: &Option<(u32, String)>,
    probe: &Option<VersionProbe>,
    command: &str,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if let (true, Some(required)) = (found, profile.requires_node) {
        match node {
            Some((major, text)) if *major < required => {
                warnings.push(format!("needs Node.js {required} or newer; found {text}"))
            }
            None => warnings.push(format!("needs Node.js {required} or newer; no node found")),
            _ => {}
        }
    }
    if *probe == Some(VersionProbe::NoAnswer) {
        warnings.push(format!(
            "`--version` gave no answer within {}s (a busy machine, or the agent waits for input: run `{command} --version` by hand)",
            VERSION_TIMEOUT.as_secs()
        ));
    }
    warnings
}

/// Each agent of `config` with the name of the profile it runs (its `profile` value when
/// that does not load).
pub fn agent_profiles(config: &crate::config::LoadedConfig) -> Vec<(String, String)> {
    let dirs = config.profile_dirs();
    config
        .config
        .agents
        .iter()
        .map(|a| {
            let name = Profile::find(&config.profile_ref(&a.profile), &dirs)
                .map(|p| p.name)
                .unwrap_or_else(|_| a.profile.clone());
            (a.name.clone(), name)
        })
        .collect()
}
