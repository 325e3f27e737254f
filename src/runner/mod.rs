//! Runs agents: the only code that knows how an agent is started and how its output looks.
//! Today: CLI profiles run as child processes (`profile`, `template`, `process`), with their
//! stdout read as plain text or as one of the known JSON streams (`stream`). Each run gets a
//! task's prompt and workspace, sends stream events as they happen, and gives back the
//! agent's answer or a typed error.

pub mod acp;
mod cli;
mod limit;
pub mod login;
pub use cli::run_cli;
pub mod process;
pub mod profile;
pub mod scan;
pub mod stream;
pub mod template;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::error::{Classify, ErrorClass};
use process::GroupChild;
pub use profile::{PermissionPolicy, Profile};
use stream::StreamParser;
pub use stream::{StreamEvent, StreamFormat};
use template::Vars;

/// How long a stopped agent gets between SIGTERM and SIGKILL, and how long processes it
/// leaves behind get after it exits.
const GRACE: Duration = Duration::from_secs(2);
/// Bytes still read from a pipe after reading was stopped (see `read_or_stop`).
const STOP_DRAIN: usize = 4 * 1024 * 1024;
/// Bytes of stderr kept for error messages.
const STDERR_TAIL: usize = 8 * 1024;

/// One task as the runner sees it.
#[derive(Clone, Debug)]
pub struct TaskInput {
    pub agent: String,
    pub task_id: String,
    pub prompt: String,
    pub session_key: Option<String>,
    /// The agent's own session id to continue (a CLI session captured from an earlier run).
    pub resume_id: Option<String>,
    /// The prompt for a new session when `resume_id` cannot be continued: the same request
    /// with the conversation's earlier turns given as text. `None`: the prompt as it is.
    pub fresh_prompt: Option<String>,
    /// The task's own folder: the agent's working directory unless the profile sets one.
    pub workspace: PathBuf,
    /// Where the agent's questions go (permission requests under the `ask` policy); `None`
    /// when nobody can answer, and then the policy falls back to `read_only`.
    pub questions: Option<mpsc::Sender<Question>>,
    /// More environment for the agent (the bridge's tags, which its children inherit).
    pub env: Vec<(String, String)>,
    /// Told the process group id once the agent is started.
    pub on_spawn: Option<SpawnHook>,
    /// An MCP server the bridge gives the agent for this task (ACP: in `session/new`; CLI:
    /// the profile's `mcp_args`); `None` when there is none.
    pub mcp: Option<McpServer>,
}

/// A stdio MCP server an agent is to start for its task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpServer {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// Its environment beyond what it inherits from the agent (ACP agents are given it; a CLI
    /// agent's servers inherit the agent's environment, which holds it already).
    pub env: Vec<(String, String)>,
}

impl McpServer {
    /// The server as the CLIs' MCP config JSON (`{"mcpServers": {NAME: {...}}}`), without
    /// its environment: nothing secret goes on a command line.
    pub fn config_json(&self) -> String {
        serde_json::json!({"mcpServers": {&self.name: {
            "type": "stdio", "command": self.command, "args": self.args}}})
        .to_string()
    }
}

/// What came back for a question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// One of the options, by index.
    Chosen(usize),
    /// Words that name no option (for agents that take free text).
    Text(String),
    /// No answer.
    None,
}

/// A callback given the agent's process group id when it starts.
#[derive(Clone)]
pub struct SpawnHook(pub std::sync::Arc<dyn Fn(i32) + Send + Sync>);

impl std::fmt::Debug for SpawnHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnHook")
    }
}

impl TaskInput {
    fn spawned(&self, pgid: i32) {
        if let Some(hook) = &self.on_spawn {
            (hook.0)(pgid);
        }
    }
}

/// Something the agent needs a person to decide, such as a permission request.
#[derive(Debug)]
pub struct Question {
    pub text: String,
    /// Why the agent is blocked.
    pub reason: String,
    /// The choices, by name.
    pub options: Vec<String>,
    /// The index of the chosen option. Dropping it, or `None`, means no answer.
    pub answer: tokio::sync::oneshot::Sender<Answer>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutput {
    pub output: String,
    /// True when the output was longer than the profile's `output.max_bytes`.
    pub truncated: bool,
    pub duration: Duration,
    /// The agent's own session id, when its stream named one (to resume it later).
    pub session_id: Option<String>,
    /// Files the agent handed over beside its text (ACP resources, files it wrote).
    pub files: Vec<OutputFile>,
    /// The task asked to continue a session the agent could not restore: it ran in a new
    /// session, without the conversation's earlier context.
    pub context_lost: bool,
    /// The profile names no session to continue (no `{{resume_id}}`): the conversation's
    /// earlier turns were retold in the prompt.
    pub no_resume: bool,
}

/// A file an agent handed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputFile {
    /// A path, as the agent named it (checked against the workspace by whoever attaches it).
    Path(PathBuf),
    /// Content the agent sent itself.
    Inline {
        name: String,
        content_type: Option<String>,
        bytes: Vec<u8>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("could not start {command:?}: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("the agent did not finish within {}s and was stopped", .0.as_secs())]
    TimedOut(Duration),
    #[error("the agent {status}{}", stderr_suffix(.stderr))]
    Failed { status: String, stderr: String },
    /// The agent's own words about what went wrong.
    #[error("the agent reported an error: {0}")]
    Reported(String),
    /// Why the bridge ended the task, in its own words (a stop reason, a refused question, a
    /// session that did not open): not prefixed as if the agent had said it.
    #[error("{0}")]
    Stopped(String),
    /// The agent said it has no login (an ACP agent's auth error; its words).
    #[error("the agent is installed but not logged in: {0}")]
    NotLoggedIn(String),
    /// The agent hit its provider's usage limit (a plan's window, a quota), in its own words:
    /// not a failure of the task, which can run again once the limit resets (`resets`, when
    /// the agent said when; else unknown, to be probed again later).
    #[error("the agent hit its usage limit: {said}")]
    UsageLimit {
        said: String,
        resets: Option<std::time::SystemTime>,
    },
    #[error("the task was cancelled")]
    Cancelled,
    #[error("{0}")]
    Prepare(String),
    #[error("talking to the agent failed: {0}")]
    Io(#[from] std::io::Error),
}

fn stderr_suffix(stderr: &str) -> String {
    match telling_line(stderr) {
        Some(line) => format!(": {line}"),
        None => String::new(),
    }
}

/// The line of an agent's stderr (or an error's text) that says what went wrong: the last
/// one that reads like an error, else the last that is not noise. Noise: stack frames
/// (`at main (…js:17363:25)`), Node's own lines, and warnings agents print on every run
/// ("Ripgrep is not available. Falling back to GrepTool.").
pub fn telling_line(text: &str) -> Option<String> {
    const WARNINGS: &[&str] = &[
        "ripgrep is not available",
        "falling back to",
        "deprecationwarning",
        "experimentalwarning",
        "(use `node --trace",
        "(use node --trace",
        "node.js v",
        "loaded cached credentials",
        "data collection is disabled",
    ];
    const ERROR_WORDS: &[&str] = &[
        "error",
        "invalid",
        "denied",
        "refused",
        "failed",
        "not found",
        "unauthorized",
        "forbidden",
        "cannot",
        "could not",
        "unable",
        "missing",
        "required",
        "not logged in",
        "no auth",
        "please set",
        "please run",
        "please configure",
        "must specify",
    ];
    // A usage dump after a command-line error (yargs, clap) is not the reason: what is
    // before it is.
    let text = match text.find("\nUsage: ") {
        Some(at) if !text[..at].trim().is_empty() => &text[..at],
        _ => text,
    };
    let kept: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| {
            let lower = l.to_ascii_lowercase();
            let frame = l.starts_with("at ")
                || l.starts_with("node:")
                || l.starts_with('^')
                || l.starts_with("...")
                || matches!(*l, "{" | "}" | "]" | "[" | ")" | "})" | "});")
                || (l.contains(".js:") && !l.contains(' '));
            !frame && !WARNINGS.iter().any(|w| lower.contains(w))
        })
        .collect();
    let pick = kept
        .iter()
        .rev()
        .find(|l| {
            let lower = l.to_ascii_lowercase();
            ERROR_WORDS.iter().any(|w| lower.contains(w))
        })
        .or(kept.last())?;
    // "Invalid values:" says its reason on the next line.
    let mut line = pick.to_string();
    if line.ends_with(':') {
        if let Some(next) = kept.iter().skip_while(|l| *l != pick).nth(1) {
            line = format!("{line} {next}");
        }
    }
    Some(line.chars().take(300).collect())
}

impl Classify for RunError {
    fn class(&self) -> ErrorClass {
        match self {
            RunError::Spawn { .. }
            | RunError::Failed { .. }
            | RunError::Reported(_)
            | RunError::Stopped(_)
            | RunError::NotLoggedIn(_) => ErrorClass::Permanent,
            RunError::TimedOut(_)
            | RunError::Io(_)
            | RunError::Prepare(_)
            | RunError::UsageLimit { .. } => ErrorClass::Transient,
            RunError::Cancelled => ErrorClass::Cancelled,
        }
    }
}

fn vars_for(task: &TaskInput) -> Vars {
    let mut vars = Vars::default();
    let key = task.session_key.clone().unwrap_or_default();
    vars.set("prompt", task.prompt.clone());
    vars.set("agent", task.agent.clone());
    vars.set("task_id", task.task_id.clone());
    vars.set(
        "safe_session_key",
        template::safe_session_key(&key, &task.agent),
    );
    vars.set("session_key", key);
    vars.set("resume_id", task.resume_id.clone().unwrap_or_default());
    vars.set("workspace", task.workspace.display().to_string());
    if let Some(mcp) = &task.mcp {
        vars.set("mcp_config", mcp.config_json());
    }
    vars
}

/// Runs one task with `profile`, whatever its kind.
///
/// A run asked to continue a session (`resume_id`) that fails before the agent sent a single
/// stream event is taken as the agent refusing the session (only a streaming CLI names a
/// session to resume) (Claude Code keeps sessions per
/// folder and answers "No conversation found"): it is run once more in a new session, and
/// the output says the context was lost. An ACP agent that refuses `session/resume` or
/// `session/load` gets a new session at once, told the same way.
pub async fn run(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
    events: &mpsc::Sender<StreamEvent>,
) -> Result<RunOutput, RunError> {
    // A CLI agent that named a session (its stream did) but whose profile cannot say which
    // to continue is given the conversation's earlier turns as text instead, and the answer
    // says so. (One that names none may keep its conversation by AAMP_SESSION_KEY itself.)
    if task.resume_id.is_some() && !profile.can_resume() {
        let mut out = run_once(profile, &retold(task), cancel, events).await?;
        out.no_resume = true;
        return Ok(out);
    }
    let Some(resume_id) = task.resume_id.as_deref() else {
        return run_once(profile, task, cancel, events).await;
    };
    // Watch whether the agent says anything before it fails.
    let (seen_tx, mut seen_rx) = mpsc::channel::<StreamEvent>(1);
    let mut said_anything = false;
    let forward = async {
        while let Some(event) = seen_rx.recv().await {
            // A usage report alone (Claude's failed resume reports its empty result) is
            // not the agent taking up the session.
            said_anything |= !matches!(event, StreamEvent::Usage { .. });
            if events.send(event).await.is_err() {
                break;
            }
        }
    };
    let (first, ()) = tokio::join!(
        async {
            let r = run_once(profile, task, cancel, &seen_tx).await;
            drop(seen_tx);
            r
        },
        forward
    );
    match first {
        Err(RunError::Failed { .. } | RunError::Reported(_) | RunError::Stopped(_))
            if !said_anything =>
        {
            tracing::warn!(
                session = resume_id,
                "the agent could not continue its session; running the task in a new one"
            );
            let mut out = run_in_new_session(profile, task, cancel, events).await?;
            out.context_lost = true;
            Ok(out)
        }
        other => other,
    }
}

/// [`run_once`] of [`retold`] `task` after a first run in the same [`run`]: its usage
/// reports keyed `new-session/KEY`, so a key the first run used is not taken for the same
/// report.
async fn run_in_new_session(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
    events: &mpsc::Sender<StreamEvent>,
) -> Result<RunOutput, RunError> {
    let (tx, mut rx) = mpsc::channel::<StreamEvent>(1);
    let forward = async move {
        while let Some(event) = rx.recv().await {
            let event = match event {
                StreamEvent::Usage { key, usage } => StreamEvent::Usage {
                    key: format!("new-session/{key}"),
                    usage,
                },
                other => other,
            };
            if events.send(event).await.is_err() {
                break;
            }
        }
    };
    let (out, ()) = tokio::join!(
        async {
            let r = run_once(profile, &retold(task), cancel, &tx).await;
            drop(tx);
            r
        },
        forward
    );
    out
}

/// `task` in a new session: its prompt with the conversation's earlier turns retold, when
/// the engine (`dispatch::Engine`) made one.
fn retold(task: &TaskInput) -> TaskInput {
    TaskInput {
        resume_id: None,
        prompt: task
            .fresh_prompt
            .clone()
            .unwrap_or_else(|| task.prompt.clone()),
        ..task.clone()
    }
}

async fn run_once(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
    events: &mpsc::Sender<StreamEvent>,
) -> Result<RunOutput, RunError> {
    match profile.kind {
        profile::ProfileKind::Cli => cli::run_cli(profile, task, cancel, events).await,
        profile::ProfileKind::Acp => acp::run_acp(profile, task, cancel, events).await,
    }
}

/// The agent's working directory: the profile's `cwd`, or the task's own workspace.
fn agent_cwd(profile: &Profile, task: &TaskInput, vars: &Vars) -> PathBuf {
    match &profile.cwd {
        Some(cwd) => PathBuf::from(cwd.render(vars)),
        None => task.workspace.clone(),
    }
}

/// An agent started for a task: its process group, the task's template variables, and the
/// agent's working directory.
struct Started {
    child: GroupChild,
    vars: Vars,
    cwd: PathBuf,
}

/// Starts the profile's command for `task` with `args` (see [`spawn_agent`]) and tells the
/// run's span and the task's spawn hook its process group.
fn start_for_task(
    profile: &Profile,
    task: &TaskInput,
    args: &[template::Template],
    stdin: bool,
) -> Result<Started, RunError> {
    let vars = vars_for(task);
    let program = profile.command.render(&vars);
    let cwd = agent_cwd(profile, task, &vars);
    let child = spawn_agent(profile, Some(task), &program, args, &vars, &cwd, stdin)?;
    tracing::Span::current().record("pid", child.pid());
    task.spawned(child.pid());
    Ok(Started { child, vars, cwd })
}

/// The one way an agent process starts, for both kinds of profile: `program` with `args`
/// rendered, in `cwd`, in a process group of its own, stdout and stderr piped and stdin piped
/// when `stdin` (else closed); with the profile's `env` rendered and, for a task (not a
/// probe), `AAMP_AGENT`, `AAMP_TASK_ID`, `AAMP_SESSION_KEY` and the bridge's tags (which its
/// children inherit).
fn spawn_agent(
    profile: &Profile,
    task: Option<&TaskInput>,
    program: &str,
    args: &[template::Template],
    vars: &Vars,
    cwd: &std::path::Path,
    stdin: bool,
) -> Result<GroupChild, RunError> {
    let mut cmd = Command::new(program);
    cmd.args(profile::render_args(args, vars))
        .current_dir(cwd)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(task) = task {
        cmd.env("AAMP_AGENT", &task.agent)
            .env("AAMP_TASK_ID", &task.task_id);
        if let Some(key) = &task.session_key {
            cmd.env("AAMP_SESSION_KEY", key);
        }
    }
    for (name, value) in &profile.env {
        cmd.env(name, value.render(vars));
    }
    // A few lines, read as the agent starts (its values are kept in no `Profile`).
    let file_env = profile.file_env().map_err(|source| RunError::Spawn {
        command: program.to_string(),
        source,
    })?;
    cmd.envs(file_env);
    if let Some(task) = task {
        cmd.envs(task.env.iter().map(|(k, v)| (k, v)));
    }
    GroupChild::spawn(&mut cmd).map_err(|source| RunError::Spawn {
        command: program.to_string(),
        source,
    })
}

/// Keeps at most `max` bytes of `text`, cut on a character boundary.
fn cap(mut text: String, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

/// Runs `reads` to their end, or, once `ended` was notified and GRACE has passed, cancels
/// `stop` so they return what they have.
pub(crate) async fn drain_until_stopped<F: std::future::Future>(
    reads: F,
    ended: &Notify,
    stop: &CancellationToken,
) -> F::Output {
    let mut reads = std::pin::pin!(reads);
    tokio::select! {
        out = &mut reads => out,
        _ = async { ended.notified().await; tokio::time::sleep(GRACE).await } => {
            tracing::warn!("the agent's pipes stayed open after it ended (a process it started still holds them); no longer reading them");
            stop.cancel();
            reads.await
        }
    }
}

/// Reads everything, keeping the last `max` bytes.
/// Each line also goes to the log at debug level (target `agent`), cut at 500 characters.
async fn read_tail(
    mut pipe: impl AsyncRead + Unpin,
    max: usize,
    stop: &CancellationToken,
) -> std::io::Result<Vec<u8>> {
    let mut tail = std::collections::VecDeque::with_capacity(max);
    let mut buf = vec![0u8; 8 * 1024];
    let mut line: Vec<u8> = Vec::new();
    let mut drained = 0;
    loop {
        let n = read_or_stop(&mut pipe, &mut buf, stop, &mut drained).await?;
        if n == 0 {
            if !line.is_empty() {
                tracing::debug!(target: "agent", "{}", String::from_utf8_lossy(&line));
            }
            return Ok(tail.into_iter().collect());
        }
        for &b in &buf[..n] {
            if b == b'\n' {
                tracing::debug!(target: "agent", "{}", String::from_utf8_lossy(&line));
                line.clear();
            } else if line.len() < 500 {
                line.push(b);
            }
            if tail.len() == max {
                tail.pop_front();
            }
            tail.push_back(b);
        }
    }
}

/// Removes ANSI escape sequences (CSI and OSC) and other control characters except newlines
/// and tabs, then trims if asked.
pub fn clean(text: &str, strip_ansi: bool, trim: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if strip_ansi && c == '\u{1b}' {
            match chars.peek() {
                Some('[') => {
                    chars.next();
                    // parameters and intermediates, then one final byte in @..~
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                Some(']') => {
                    chars.next();
                    // until BEL or ESC \
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' || (c == '\u{1b}' && chars.peek() == Some(&'\\')) {
                            if c == '\u{1b}' {
                                chars.next();
                            }
                            break;
                        }
                    }
                }
                _ => {
                    chars.next();
                }
            }
            continue;
        }
        if strip_ansi && c.is_control() && c != '\n' && c != '\t' {
            continue;
        }
        out.push(c);
    }
    if trim {
        out.trim().to_string()
    } else {
        out
    }
}

/// One read, or 0 (as at the end) once `stop` is cancelled.
/// Reads what comes until `stop`. Once stopped, what is already waiting in the pipe is still
/// read (up to [`STOP_DRAIN`] bytes, counted in `drained`): output the agent wrote before it
/// ended is not lost because the bridge was slow to take it (a slow stream service holds the
/// reader back); only a pipe held open with nothing in it ends the read.
async fn read_or_stop(
    pipe: &mut (impl AsyncRead + Unpin),
    buf: &mut [u8],
    stop: &CancellationToken,
    drained: &mut usize,
) -> std::io::Result<usize> {
    if stop.is_cancelled() && *drained >= STOP_DRAIN {
        return Ok(0);
    }
    let n = tokio::select! {
        biased;
        n = pipe.read(buf) => n?,
        _ = stop.cancelled() => 0,
    };
    if stop.is_cancelled() {
        *drained += n;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_is_stripped() {
        assert_eq!(
            clean(
                "\u{1b}[1;31mred\u{1b}[0m\r\n\u{1b}]0;title\u{7}ok\u{8} ",
                true,
                true
            ),
            "red\nok"
        );
        assert_eq!(
            clean("  keep \u{1b}[0m ", false, false),
            "  keep \u{1b}[0m "
        );
    }

    #[test]
    fn stderr_suffix_takes_the_last_line() {
        assert_eq!(stderr_suffix("a\nboom\n\n"), ": boom");
        assert_eq!(stderr_suffix(""), "");
    }
}
