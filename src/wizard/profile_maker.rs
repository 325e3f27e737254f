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
#[derive(Clone, Debug)]
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
    let mut out = format!(
        "# Made by `aamp-bridge profile new`; the README's \"Profiles\" section lists every key.\nname = {}\ndescription = {}\n",
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
    out
}

/// Runs the command once with `prompt` and returns its raw stdout, to see how it is framed.
pub async fn sample(p: &NewProfile, prompt: &str) -> anyhow::Result<String> {
    let text = render(p, StreamFormat::None);
    let profile = Profile::parse(&text, &p.name, "the new profile")?;
    let (output, _) = run(&profile, prompt).await?;
    Ok(output)
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

async fn run(profile: &Profile, prompt: &str) -> anyhow::Result<(String, Vec<StreamEvent>)> {
    let workspace = tempfile_dir()?;
    let task = TaskInput {
        agent: profile.name.clone(),
        task_id: format!("profile-test-{}", uuid::Uuid::new_v4()),
        prompt: prompt.to_string(),
        session_key: None,
        resume_id: None,
        fresh_prompt: None,
        workspace: workspace.clone(),
        questions: None,
        env: Vec::new(),
        on_spawn: None,
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
    let _ = std::fs::remove_dir_all(&workspace);
    let output = result.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((output.output, events))
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
    match run(profile, prompt).await {
        Ok((output, events)) => {
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
