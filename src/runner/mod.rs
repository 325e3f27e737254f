//! Runs agents: the only code that knows how an agent is started and how its output looks.
//! Today: CLI profiles run as child processes (`profile`, `template`, `process`), with their
//! stdout read as plain text or as one of the known JSON streams (`stream`). Each run gets a
//! task's prompt and workspace, sends stream events as they happen, and gives back the
//! agent's answer or a typed error.

pub mod acp;
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
pub use profile::Profile;
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
    /// The task's own folder: the agent's working directory unless the profile sets one.
    pub workspace: PathBuf,
    /// Where the agent's questions go (permission requests under the `ask` policy); `None`
    /// when nobody can answer, and then the policy falls back to `read_only`.
    pub questions: Option<mpsc::Sender<Question>>,
    /// More environment for the agent (the bridge's tags, which its children inherit).
    pub env: Vec<(String, String)>,
    /// Told the process group id once the agent is started.
    pub on_spawn: Option<SpawnHook>,
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
    #[error("the agent reported an error: {0}")]
    Reported(String),
    #[error("the task was cancelled")]
    Cancelled,
    #[error("{0}")]
    Prepare(String),
    #[error("talking to the agent failed: {0}")]
    Io(#[from] std::io::Error),
}

fn stderr_suffix(stderr: &str) -> String {
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    if last.is_empty() {
        String::new()
    } else {
        format!(": {}", last.chars().take(300).collect::<String>())
    }
}

impl Classify for RunError {
    fn class(&self) -> ErrorClass {
        match self {
            RunError::Spawn { .. } | RunError::Failed { .. } | RunError::Reported(_) => {
                ErrorClass::Permanent
            }
            RunError::TimedOut(_) | RunError::Io(_) | RunError::Prepare(_) => ErrorClass::Transient,
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
    vars
}

/// What stdout gave: plain text, or a parsed stream.
enum Stdout {
    Text(Vec<u8>, bool),
    Stream(Box<StreamParser>),
}

/// How the wait for the process ended.
enum Ended {
    Exited(std::process::ExitStatus),
    /// The stream's final event came and the process did not exit within the linger time;
    /// it was stopped, and the run counts by its stream.
    Lingered,
}

/// Runs one task with `profile`, whatever its kind.
pub async fn run(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
    events: &mpsc::Sender<StreamEvent>,
) -> Result<RunOutput, RunError> {
    match profile.kind {
        profile::ProfileKind::Cli => run_cli(profile, task, cancel, events).await,
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
    if let Some(task) = task {
        cmd.envs(task.env.iter().map(|(k, v)| (k, v)));
    }
    GroupChild::spawn(&mut cmd).map_err(|source| RunError::Spawn {
        command: program.to_string(),
        source,
    })
}

/// Runs one task with a CLI profile. The prompt reaches the agent only through the profile's
/// templates, as whole arguments or stdin; there is no shell. Stream events (for stream
/// formats) go to `events` as they are read.
#[tracing::instrument(skip_all, fields(profile = %profile.name, pid))]
pub async fn run_cli(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
    events: &mpsc::Sender<StreamEvent>,
) -> Result<RunOutput, RunError> {
    let started = Instant::now();
    let vars = vars_for(task);
    let program = profile.command.render(&vars);
    let args = match (&profile.args_when_resuming, &task.resume_id) {
        (Some(resuming), Some(id)) if !id.is_empty() => resuming,
        _ => &profile.args,
    };
    let cwd = agent_cwd(profile, task, &vars);
    let stdin_piped = profile.stdin.is_some() || profile.help_lines;
    let mut child = spawn_agent(
        profile,
        Some(task),
        &program,
        args,
        &vars,
        &cwd,
        stdin_piped,
    )?;
    tracing::Span::current().record("pid", child.pid());
    task.spawned(child.pid());
    tracing::debug!("agent started");

    let stdin_text = profile.stdin.as_ref().map(|t| t.render(&vars));
    let stdin = child.child.stdin.take();
    let stdout = child.child.stdout.take().expect("stdout is piped");
    let stderr = child.child.stderr.take().expect("stderr is piped");

    // Feed stdin, drain stdout and stderr, and wait, all at once: doing them in turn can
    // deadlock on a full pipe.
    // With `help_lines`, stdin stays open after the prompt: each answer to a `HELP:` line goes
    // in as one line.
    let (answers_tx, mut answers_rx) = mpsc::channel::<String>(1);
    let asker = profile.help_lines.then(|| Asker {
        questions: task.questions.clone(),
        answers: std::sync::Mutex::new(Some(answers_tx)),
        wait: profile.ask_timeout,
        unanswered: std::sync::Mutex::new(None),
    });
    let help_lines = profile.help_lines;
    let feed = async move {
        let Some(mut pipe) = stdin else { return };
        // An agent that exits without reading all of its input is not an error here.
        if let Some(text) = stdin_text {
            let _ = pipe.write_all(text.as_bytes()).await;
            if help_lines && !text.ends_with('\n') {
                let _ = pipe.write_all(b"\n").await;
            }
        }
        if help_lines {
            while let Some(line) = answers_rx.recv().await {
                let _ = pipe.write_all(format!("{line}\n").as_bytes()).await;
                let _ = pipe.flush().await;
            }
        }
        let _ = pipe.shutdown().await;
    };
    let finished = Notify::new();
    // Once the agent has exited or been stopped, its pipes get GRACE to reach their end; a
    // process that escaped its group (`setsid cmd &`) may hold them open forever.
    let ended = Notify::new();
    let stop_reading = CancellationToken::new();
    let read_stdout = async {
        if profile.stream == StreamFormat::None {
            let (bytes, truncated) = read_capped(
                stdout,
                profile.output.max_bytes,
                &stop_reading,
                asker.as_ref(),
            )
            .await?;
            Ok::<_, std::io::Error>(Stdout::Text(bytes, truncated))
        } else {
            let parser = read_stream(
                stdout,
                StreamParser::with_limit(profile.stream, profile.output.max_bytes),
                events,
                &finished,
                &stop_reading,
                asker.as_ref(),
            )
            .await?;
            Ok(Stdout::Stream(Box::new(parser)))
        }
    };
    let reads = drain_until_stopped(
        async { tokio::join!(read_stdout, read_tail(stderr, STDERR_TAIL, &stop_reading)) },
        &ended,
        &stop_reading,
    );
    let waiting = async {
        let lingered = async {
            finished.notified().await;
            tokio::time::sleep(profile.linger).await;
        };
        let outcome = tokio::select! {
            status = child.child.wait() => status.map(Ended::Exited).map_err(RunError::from),
            _ = lingered => Ok(Ended::Lingered),
            _ = tokio::time::sleep(profile.timeout) => Err(RunError::TimedOut(profile.timeout)),
            _ = cancel.cancelled() => Err(RunError::Cancelled),
        };
        let outcome = match outcome {
            Ok(Ended::Exited(status)) => {
                child.reap_group(GRACE).await;
                Ok(Ended::Exited(status))
            }
            Ok(Ended::Lingered) => {
                tracing::info!("the agent finished its answer but did not exit; stopping it");
                child
                    .terminate(GRACE)
                    .await
                    .map(|_| Ended::Lingered)
                    .map_err(RunError::from)
            }
            Err(e) => match child.terminate(GRACE).await {
                Ok(_) => Err(e),
                Err(io) => Err(io.into()),
            },
        };
        ended.notify_one();
        outcome
    };
    let reads = async {
        let out = reads.await;
        // No more questions: the answers channel closes, and with it the agent's stdin.
        if let Some(asker) = &asker {
            asker.close();
        }
        out
    };
    let ((), (out, err), ended) = tokio::join!(feed, reads, waiting);
    if let Some(secs) = asker
        .as_ref()
        .and_then(|a| *a.unanswered.lock().expect("unanswered lock"))
    {
        if !matches!(ended, Err(RunError::Cancelled) | Err(RunError::TimedOut(_))) {
            return Err(RunError::Reported(format!(
                "the agent's question got no answer within {secs}s (ask_timeout_secs), so it was refused"
            )));
        }
    }
    let ended = ended?;
    let stdout = out?;
    let stderr_text = clean(&String::from_utf8_lossy(&err?), true, true);
    let exit_failure = match &ended {
        Ended::Exited(status)
            if !status
                .code()
                .is_some_and(|c| profile.success_exit_codes.contains(&c)) =>
        {
            Some(match status.code() {
                Some(c) => format!("exited with status {c}"),
                None => {
                    use std::os::unix::process::ExitStatusExt;
                    format!("was killed by signal {}", status.signal().unwrap_or(0))
                }
            })
        }
        _ => None,
    };
    let opts = &profile.output;
    let (mut output, truncated, session_id) = match stdout {
        Stdout::Text(bytes, truncated) => {
            if let Some(status) = exit_failure {
                return Err(RunError::Failed {
                    status,
                    stderr: stderr_text,
                });
            }
            (
                clean(&String::from_utf8_lossy(&bytes), opts.strip_ansi, opts.trim),
                truncated,
                None,
            )
        }
        Stdout::Stream(parser) => {
            // The stream's own error says most; then the exit status with stderr.
            if let Some(error) = parser.end.error {
                return Err(RunError::Reported(error));
            }
            if let Some(status) = exit_failure {
                return Err(RunError::Failed {
                    status,
                    stderr: stderr_text,
                });
            }
            let text = clean(
                parser.end.final_text.as_deref().unwrap_or_default(),
                opts.strip_ansi,
                opts.trim,
            );
            let (text, truncated) = cap(text, opts.max_bytes);
            (text, truncated || parser.text_cut, parser.session_id)
        }
    };
    if opts.include_stderr && !stderr_text.is_empty() {
        if !output.is_empty() {
            output.push('\n');
        }
        output.push_str(&stderr_text);
    }
    Ok(RunOutput {
        output,
        truncated,
        duration: started.elapsed(),
        session_id,
        files: Vec::new(),
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

/// Longest stream line accepted; a longer one is skipped whole.
const MAX_LINE: usize = 8 << 20;

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

/// Relays `HELP:` lines of a CLI agent to the dispatcher and their answers back to its stdin.
struct Asker {
    questions: Option<mpsc::Sender<Question>>,
    /// To the agent's stdin; taken (closing stdin) once its output has ended.
    answers: std::sync::Mutex<Option<mpsc::Sender<String>>>,
    wait: Duration,
    /// Set when a question went unanswered for this many seconds.
    unanswered: std::sync::Mutex<Option<u64>>,
}

impl Asker {
    /// `HELP: question | option | option`: asks, waits, and writes the answer (the option's
    /// name, or the free text on one line; an empty line when none came) to the agent.
    async fn ask(&self, line: &str) {
        let body = line.trim_start_matches("HELP:").trim();
        let mut parts = body.split('|').map(str::trim);
        let text = parts.next().unwrap_or_default().to_string();
        let options: Vec<String> = parts
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        let reply = match &self.questions {
            Some(questions) => {
                let (answer, chosen) = tokio::sync::oneshot::channel();
                let question = Question {
                    text,
                    reason: "The agent asks for a decision.".into(),
                    options: options.clone(),
                    answer,
                };
                if questions.send(question).await.is_err() {
                    String::new()
                } else {
                    match tokio::time::timeout(self.wait, chosen).await {
                        Ok(Ok(Answer::Chosen(i))) => options.get(i).cloned().unwrap_or_default(),
                        Ok(Ok(Answer::Text(words))) => {
                            words.split_whitespace().collect::<Vec<_>>().join(" ")
                        }
                        Ok(_) => String::new(),
                        Err(_) => {
                            tracing::warn!(
                                seconds = self.wait.as_secs(),
                                "no answer to the agent's question in time"
                            );
                            *self.unanswered.lock().expect("unanswered lock") =
                                Some(self.wait.as_secs());
                            String::new()
                        }
                    }
                }
            }
            None => String::new(),
        };
        let answers = self.answers.lock().expect("answers lock").clone();
        if let Some(answers) = answers {
            let _ = answers.send(reply).await;
        }
    }

    fn close(&self) {
        self.answers.lock().expect("answers lock").take();
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

/// Reads a line-framed stream into `parser`, sending its events as they come, and signals
/// `finished` once the stream's final event has been read.
async fn read_stream(
    mut pipe: impl AsyncRead + Unpin,
    mut parser: StreamParser,
    events: &mpsc::Sender<StreamEvent>,
    finished: &Notify,
    stop: &CancellationToken,
    asker: Option<&Asker>,
) -> std::io::Result<StreamParser> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut line: Vec<u8> = Vec::new();
    let mut skipping = false;
    let mut signalled = false;
    let mut drained = 0;
    let take_line =
        |line: &[u8], parser: &mut StreamParser| parser.line(&String::from_utf8_lossy(line));
    loop {
        let n = read_or_stop(&mut pipe, &mut buf, stop, &mut drained).await?;
        if n == 0 {
            break;
        }
        for chunk in buf[..n].split_inclusive(|b| *b == b'\n') {
            let complete = chunk.last() == Some(&b'\n');
            let data = if complete {
                &chunk[..chunk.len() - 1]
            } else {
                chunk
            };
            if !skipping {
                if line.len() + data.len() > MAX_LINE {
                    tracing::warn!(
                        limit = MAX_LINE,
                        "a stream line from the agent is too long; skipping it"
                    );
                    skipping = true;
                    line.clear();
                } else {
                    line.extend_from_slice(data);
                }
            }
            if complete {
                if let (Some(asker), false) = (asker, skipping) {
                    if line.starts_with(b"HELP:") {
                        asker.ask(&String::from_utf8_lossy(&line)).await;
                        line.clear();
                        continue;
                    }
                }
                if !skipping {
                    for event in take_line(&line, &mut parser) {
                        let _ = events.send(event).await;
                    }
                    if parser.end.finished && !signalled {
                        signalled = true;
                        finished.notify_one();
                    }
                }
                line.clear();
                skipping = false;
            }
        }
    }
    if !line.is_empty() && !skipping {
        for event in take_line(&line, &mut parser) {
            let _ = events.send(event).await;
        }
    }
    for event in parser.finish() {
        let _ = events.send(event).await;
    }
    Ok(parser)
}

/// Reads everything, keeping the first `max` bytes.
async fn read_capped(
    mut pipe: impl AsyncRead + Unpin,
    max: usize,
    stop: &CancellationToken,
    asker: Option<&Asker>,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 16 * 1024];
    // With an asker, text is looked at line by line, so `HELP:` lines can be taken out.
    let mut line: Vec<u8> = Vec::new();
    let mut keep = |bytes: &[u8], kept: &mut Vec<u8>| {
        let room = max.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        truncated |= bytes.len() > room;
    };
    let mut drained = 0;
    loop {
        let n = read_or_stop(&mut pipe, &mut buf, stop, &mut drained).await?;
        if n == 0 {
            keep(&line, &mut kept);
            return Ok((kept, truncated));
        }
        let Some(asker) = asker else {
            keep(&buf[..n], &mut kept);
            continue;
        };
        for chunk in buf[..n].split_inclusive(|b| *b == b'\n') {
            if line.len() < MAX_LINE {
                line.extend_from_slice(chunk);
            }
            if chunk.last() == Some(&b'\n') {
                if line.starts_with(b"HELP:") {
                    asker.ask(String::from_utf8_lossy(&line).trim_end()).await;
                } else {
                    keep(&line, &mut kept);
                }
                line.clear();
            }
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
