//! `aamp-bridge profile new|test`: makes a profile for a command-line agent the bridge does
//! not ship, finds out how its output is framed by running it once, and smoke-tests it the
//! way the bridge will run it (the runner, a scratch workspace, the real process).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::runner::stream::{self, StreamFormat};
use crate::runner::{Profile, StreamEvent, TaskInput};

/// How the prompt reaches the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptVia {
    /// On stdin (safest: no length limit, nothing in `ps`).
    Stdin,
    /// As an argument: `{{prompt}}` in the arguments, or added last.
    Arg,
}

/// What `profile new` is told (flags, or the questions).
#[derive(Clone)]
pub struct NewProfile {
    pub name: String,
    pub description: String,
    pub command: String,
    pub args: Vec<String>,
    pub prompt_via: PromptVia,
    pub cwd: Option<String>,
    /// `None`: find out by running it.
    pub stream: Option<StreamFormat>,
    pub timeout_secs: u64,
    pub acp: bool,
    pub permissions: Option<String>,
    /// Variables the agent needs (`--env`): kept in `NAME.env` beside the profile, 0600.
    pub env: Vec<(String, String)>,
    /// The flag that makes it continue a session (`--resume`), found by [`find_resume_flag`].
    pub resume_flag: Option<String>,
}

/// `KEY=VALUE`, checked.
pub fn env_pair(pair: &str) -> anyhow::Result<(String, String)> {
    let (key, value) = pair
        .split_once('=')
        .ok_or_else(|| anyhow::anyhow!("--env {pair:?}: give KEY=VALUE"))?;
    let valid = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        anyhow::bail!("--env {key:?}: a variable name is letters, digits and _");
    }
    if value.contains('\n') || (value.contains('"') && value.contains('\'')) {
        anyhow::bail!("--env {key}: the value cannot hold a line break, or both kinds of quote");
    }
    Ok((key.to_string(), value.to_string()))
}

/// The env file's text: a line per variable, quoted when it has to be.
fn env_text(env: &[(String, String)]) -> String {
    let mut out = String::from(
        "# Made by `aamp-bridge profile new --env`: the agent's variables (keep it 0600).\n",
    );
    for (key, value) in env {
        let plain = !value.is_empty()
            && value
                .chars()
                .all(|c| !c.is_whitespace() && !matches!(c, '"' | '\'' | '#'));
        let quoted = if plain {
            value.clone()
        } else if value.contains('"') {
            format!("'{value}'")
        } else {
            format!("\"{value}\"")
        };
        out.push_str(&format!("{key}={quoted}\n"));
    }
    out
}

/// The env file that goes with the profile at `path`.
fn env_path(path: &Path) -> PathBuf {
    path.with_extension("env")
}

fn quoted(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The profile file's text.
pub fn render(p: &NewProfile, stream: StreamFormat) -> String {
    let mut args = p.args.clone();
    let in_args = args.iter().any(|a| a.contains("{{prompt}}"));
    if p.prompt_via == PromptVia::Arg && !in_args && !p.acp {
        args.push("{{prompt}}".into());
    }
    if let Some(flag) = &p.resume_flag {
        args = args_with_resume(&args, flag);
    }
    let mut out = format!(
        "# Made by `aamp-bridge profile new`; docs/agents.md (\"Profile keys\") lists every key.\nname = {}\ndescription = {}\n",
        quoted(&p.name),
        quoted(&p.description)
    );
    if p.acp {
        out.push_str("kind = \"acp\"\n");
    }
    out.push_str(&format!("command = {}\n", quoted(&p.command)));
    let args: Vec<String> = args.iter().map(|a| quoted(a)).collect();
    out.push_str(&format!("args = [{}]\n", args.join(", ")));
    // The prompt goes on stdin unless the arguments already carry it (then `profile new`
    // warns: it shows in `ps`).
    if p.prompt_via == PromptVia::Stdin && !in_args && !p.acp {
        out.push_str("stdin = \"{{prompt}}\"\n");
    }
    if let Some(cwd) = &p.cwd {
        out.push_str(&format!("cwd = {}\n", quoted(cwd)));
    }
    if stream != StreamFormat::None && !p.acp {
        out.push_str(&format!("stream = \"{}\"\n", stream.as_str()));
    }
    out.push_str(&format!("timeout_secs = {}\n", p.timeout_secs));
    if let Some(perm) = &p.permissions {
        out.push_str(&format!("permissions = {}\n", quoted(perm)));
    }
    if !p.env.is_empty() {
        out.push_str(&format!(
            "# The variables given with --env (secrets stay out of this file).\nenv_file = {}\n",
            quoted(&format!("{}.env", p.name))
        ));
    }
    out
}

/// The profile's arguments with the resume flag in: before a last `{{prompt}}` or `-` (the
/// prompt or stdin marker many CLIs want last), else at the end.
fn args_with_resume(args: &[String], flag: &str) -> Vec<String> {
    let mut args = args.to_vec();
    let at = match args.last().map(String::as_str) {
        Some("-") => args.len() - 1,
        Some(a) if a.contains("{{prompt}}") => args.len() - 1,
        _ => args.len(),
    };
    args.splice(at..at, [flag.to_string(), "{{resume_id}}".to_string()]);
    args
}

/// Runs the command once with `prompt` and returns its raw stdout, to see how it is framed.
pub async fn sample(p: &NewProfile, prompt: &str) -> anyhow::Result<String> {
    let profile = runnable(p, StreamFormat::None)?;
    let (out, _) = run(&profile, prompt, &p.env, None).await?;
    Ok(out.output)
}

/// The profile as it is run before it is written: its variables go with each run, not by
/// an env file that does not exist yet.
fn runnable(p: &NewProfile, format: StreamFormat) -> anyhow::Result<Profile> {
    let text = render(
        &NewProfile {
            env: Vec::new(),
            ..p.clone()
        },
        format,
    );
    Ok(Profile::parse(&text, &p.name, "the new profile")?)
}

/// Whether the profile's arguments name the session to continue already.
pub fn resumes_already(p: &NewProfile) -> bool {
    p.args.iter().any(|a| a.contains("{{resume_id}}"))
}

/// What [`find_resume_flag`] found.
#[derive(Debug, Serialize)]
pub struct ResumeCheck {
    /// The flag that worked.
    pub flag: Option<String>,
    /// What was tried, and what each did.
    pub tried: Vec<String>,
}

impl ResumeCheck {
    /// A line for people.
    pub fn summary(&self) -> String {
        match &self.flag {
            Some(flag) => format!(
                "it continues a conversation with `{flag} {{{{resume_id}}}}` (checked: a second turn knew what the first was told); written to the profile"
            ),
            None => format!(
                "it could not be made to continue a conversation ({}): each later turn of a conversation is sent with the earlier turns retold in its prompt, and its answer says so",
                self.tried.join("; ")
            ),
        }
    }
}

/// Flags CLI agents take to continue a session by its id.
const RESUME_FLAGS: &[&str] = &["--resume", "--session", "--session-id", "-r"];

/// How long each resume try may take by default: a flag the agent does not know usually fails
/// at once or waits for input, and waiting the profile's own timeout (30 minutes) on each of
/// four flags looked like a hang.
pub const RESUME_TRY_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Finds the flag that makes the agent continue a session: a first turn is told a word to
/// remember and names its session; a second, run with each candidate flag and that session,
/// must answer with the word. Each second turn may take `limit` (the first, which waits for
/// a model as the smoke test did, three times that); a try past it is dropped, which kills its
/// whole process group. `progress` hears a line before each run.
pub async fn find_resume_flag(
    p: &NewProfile,
    format: StreamFormat,
    limit: std::time::Duration,
    progress: &(dyn Fn(&str) + Sync),
) -> ResumeCheck {
    let mut tried = Vec::new();
    let word = format!("w{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let profile = match runnable(p, format) {
        Ok(profile) => profile,
        Err(e) => {
            tried.push(e.to_string());
            return ResumeCheck { flag: None, tried };
        }
    };
    let told = format!("Please remember: {word}. Reply with OK.");
    // One folder for both turns: Claude Code and Qwen Code keep sessions per folder.
    let workspace = match tempfile_dir() {
        Ok(w) => w,
        Err(e) => {
            tried.push(e.to_string());
            return ResumeCheck { flag: None, tried };
        }
    };
    let tries = Tries {
        limit,
        progress,
        workspace: &workspace,
    };
    let found = resume_in(p, format, &profile, &told, &word, &tries, &mut tried).await;
    let _ = std::fs::remove_dir_all(&workspace);
    ResumeCheck { flag: found, tried }
}

/// How [`resume_in`] runs each try.
struct Tries<'a> {
    limit: std::time::Duration,
    progress: &'a (dyn Fn(&str) + Sync),
    workspace: &'a Path,
}

impl Tries<'_> {
    /// [`run_in`] within `limit`; past it the run is dropped, and with it the agent's process
    /// group (`GroupChild` kills the group when dropped), so no try outlives `profile new`.
    async fn run(
        &self,
        profile: &Profile,
        prompt: &str,
        env: &[(String, String)],
        resume_id: Option<&str>,
        limit: std::time::Duration,
    ) -> anyhow::Result<(crate::runner::RunOutput, Vec<StreamEvent>)> {
        match tokio::time::timeout(
            limit,
            run_in(profile, prompt, env, resume_id, self.workspace),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => anyhow::bail!("no answer within {} s; stopped", limit.as_secs()),
        }
    }
}

async fn resume_in(
    p: &NewProfile,
    format: StreamFormat,
    profile: &Profile,
    told: &str,
    word: &str,
    tries: &Tries<'_>,
    tried: &mut Vec<String>,
) -> Option<String> {
    let first_limit = tries.limit.saturating_mul(3);
    (tries.progress)(&format!(
        "resume check: a first turn to remember a word (up to {} s)",
        first_limit.as_secs()
    ));
    let session = match tries.run(profile, told, &p.env, None, first_limit).await {
        Ok((out, _)) => out.session_id,
        Err(e) => {
            tried.push(format!(
                "a first turn failed: {}",
                first_line(&format!("{e:#}"))
            ));
            return None;
        }
    };
    let Some(session) = session else {
        tried.push("its output names no session".into());
        return None;
    };
    for flag in RESUME_FLAGS {
        let with = NewProfile {
            resume_flag: Some(flag.to_string()),
            ..p.clone()
        };
        let Ok(profile) = runnable(&with, format) else {
            continue;
        };
        let asked = "What was the word I asked you to remember? Reply with that word only.";
        (tries.progress)(&format!(
            "resume check: trying `{flag} <session>` (up to {} s)",
            tries.limit.as_secs()
        ));
        match tries
            .run(&profile, asked, &p.env, Some(&session), tries.limit)
            .await
        {
            Ok((out, _)) if out.output.contains(word) && !out.context_lost => {
                tried.push(format!("{flag}: worked"));
                return Some(flag.to_string());
            }
            Ok(_) => tried.push(format!("{flag}: the second turn did not know the first")),
            Err(e) => tried.push(format!("{flag}: {}", first_line(&format!("{e:#}")))),
        }
    }
    None
}

fn first_line(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(160)
        .collect()
}

/// What a smoke test saw.
#[derive(Debug, Serialize)]
pub struct Report {
    pub ok: bool,
    pub output: String,
    #[serde(rename = "durationMs")]
    pub duration_ms: u128,
    /// Stream events by AAMP type.
    pub events: std::collections::BTreeMap<String, usize>,
    /// Every stream event in order (`{type, payload}`), when asked for (`profile test
    /// --events`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stream: Vec<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

async fn run(
    profile: &Profile,
    prompt: &str,
    env: &[(String, String)],
    resume_id: Option<&str>,
) -> anyhow::Result<(crate::runner::RunOutput, Vec<StreamEvent>)> {
    let workspace = tempfile_dir()?;
    let result = run_in(profile, prompt, env, resume_id, &workspace).await;
    let _ = std::fs::remove_dir_all(&workspace);
    result
}

/// [`run`] in `workspace` (agents that keep sessions per folder resume only in the same one).
async fn run_in(
    profile: &Profile,
    prompt: &str,
    env: &[(String, String)],
    resume_id: Option<&str>,
    workspace: &Path,
) -> anyhow::Result<(crate::runner::RunOutput, Vec<StreamEvent>)> {
    let workspace = workspace.to_path_buf();
    let task = TaskInput {
        agent: profile.name.clone(),
        task_id: format!("profile-test-{}", uuid::Uuid::new_v4()),
        prompt: prompt.to_string(),
        session_key: None,
        resume_id: resume_id.map(str::to_string),
        fresh_prompt: None,
        workspace: workspace.clone(),
        questions: None,
        env: env.to_vec(),
        on_spawn: None,
        mcp: None,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let cancel = CancellationToken::new();
    let collect = async move {
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        events
    };
    let go = async {
        let result = crate::runner::run(profile, &task, &cancel, &tx).await;
        drop(tx);
        result
    };
    let (result, events) = tokio::join!(go, collect);
    let output = result.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((output, events))
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("aamp-bridge-profile-test-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Runs a profile on `prompt` as the bridge would, and says what came back.
pub async fn smoke_test(profile: &Profile, prompt: &str) -> Report {
    smoke_test_with(profile, prompt, false).await
}

/// The same, keeping every stream event in order when `keep_events`.
pub async fn smoke_test_with(profile: &Profile, prompt: &str, keep_events: bool) -> Report {
    let started = std::time::Instant::now();
    match run(profile, prompt, &[], None).await {
        Ok((out, events)) => {
            let output = out.output;
            let mut counts = std::collections::BTreeMap::new();
            let mut stream = Vec::new();
            for e in &events {
                let (kind, payload) = e.to_aamp();
                *counts.entry(kind.to_string()).or_insert(0) += 1;
                if keep_events {
                    stream.push(serde_json::json!({"type": kind, "payload": payload}));
                }
            }
            Report {
                ok: !output.trim().is_empty(),
                error: output
                    .trim()
                    .is_empty()
                    .then(|| "the agent answered nothing".to_string()),
                output,
                duration_ms: started.elapsed().as_millis(),
                events: counts,
                stream,
            }
        }
        Err(e) => Report {
            ok: false,
            output: String::new(),
            duration_ms: started.elapsed().as_millis(),
            events: Default::default(),
            stream: Vec::new(),
            error: Some(format!("{e:#}")),
        },
    }
}

/// Finds the framing by running the command once; plain text when it cannot tell.
pub async fn detect(p: &NewProfile, prompt: &str) -> anyhow::Result<StreamFormat> {
    let out = sample(p, prompt)
        .await
        .context("running the command once to see its output")?;
    Ok(stream::detect(&out))
}

/// Where `profile new` writes: the first profile folder.
pub fn target(dirs: &[PathBuf], name: &str) -> PathBuf {
    dirs.first()
        .cloned()
        .unwrap_or_else(|| crate::config::default_config_dir().join("profiles"))
        .join(format!("{name}.toml"))
}

/// Writes the profile file and, with variables, its env file (0600) first: the profile names
/// it. Refuses to replace a profile unless `force`.
pub fn write_with_env(
    path: &Path,
    text: &str,
    env: &[(String, String)],
    force: bool,
) -> anyhow::Result<()> {
    if path.exists() && !force {
        anyhow::bail!(
            "{} exists: pass --force to replace it, or pick another name",
            path.display()
        );
    }
    if !env.is_empty() {
        let env_file = env_path(path);
        if let Some(dir) = env_file.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        crate::fsio::write_atomic(&env_file, env_text(env).as_bytes(), 0o600)
            .with_context(|| format!("cannot write {}", env_file.display()))?;
    }
    write(path, text, force)
}

/// Writes the profile file (0644), refusing to replace one unless `force`.
pub fn write(path: &Path, text: &str, force: bool) -> anyhow::Result<()> {
    if path.exists() && !force {
        anyhow::bail!(
            "{} exists: pass --force to replace it, or pick another name",
            path.display()
        );
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Checked before it is written: a profile the bridge cannot load is never saved.
    Profile::parse(text, "", &path.display().to_string())?;
    crate::fsio::write_atomic(path, text.as_bytes(), 0o644)
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resume_flag_goes_before_a_last_prompt_or_stdin_marker() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            args_with_resume(&args(&["-p", "--output-format", "stream-json"]), "--resume"),
            args(&[
                "-p",
                "--output-format",
                "stream-json",
                "--resume",
                "{{resume_id}}"
            ])
        );
        assert_eq!(
            args_with_resume(&args(&["exec", "-"]), "-r"),
            args(&["exec", "-r", "{{resume_id}}", "-"])
        );
        assert_eq!(
            args_with_resume(&args(&["-p", "{{prompt}}"]), "--session"),
            args(&["-p", "--session", "{{resume_id}}", "{{prompt}}"])
        );
    }

    #[test]
    fn env_values_come_back_as_given() {
        let env = vec![
            ("A".to_string(), "plain".to_string()),
            ("B".to_string(), "with space # and hash".to_string()),
            ("C".to_string(), "say \"hi\"".to_string()),
        ];
        assert_eq!(crate::runner::profile::parse_dotenv(&env_text(&env)), env);
        assert!(env_pair("1A=x").is_err());
        assert!(env_pair("NOEQUALS").is_err());
        assert_eq!(
            env_pair("K=a=b").unwrap(),
            ("K".to_string(), "a=b".to_string())
        );
    }
}
