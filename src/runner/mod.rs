//! Runs agents: the only code that knows how an agent is started and how its output looks.
//! Today: CLI profiles run as child processes (`profile`, `template`, `process`). Each run
//! gets a task's prompt and workspace and gives back the agent's output or a typed error.

pub mod process;
pub mod profile;
pub mod template;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::error::{Classify, ErrorClass};
use process::GroupChild;
pub use profile::Profile;
use template::Vars;

/// How long a stopped agent gets between SIGTERM and SIGKILL, and how long processes it
/// leaves behind get after it exits.
const GRACE: Duration = Duration::from_secs(2);
/// Bytes of stderr kept for error messages.
const STDERR_TAIL: usize = 8 * 1024;

/// One task as the runner sees it.
#[derive(Clone, Debug)]
pub struct TaskInput {
    pub agent: String,
    pub task_id: String,
    pub prompt: String,
    pub session_key: Option<String>,
    /// The task's own folder: the agent's working directory unless the profile sets one.
    pub workspace: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutput {
    pub output: String,
    /// True when stdout was longer than the profile's `output.max_bytes`.
    pub truncated: bool,
    pub duration: Duration,
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
    #[error("the task was cancelled")]
    Cancelled,
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
            RunError::Spawn { .. } | RunError::Failed { .. } => ErrorClass::Permanent,
            RunError::TimedOut(_) | RunError::Io(_) => ErrorClass::Transient,
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
    vars.set("workspace", task.workspace.display().to_string());
    vars
}

/// Runs one task with a CLI profile. The prompt reaches the agent only through the profile's
/// templates, as whole arguments or stdin; there is no shell.
#[tracing::instrument(skip_all, fields(profile = %profile.name, pid))]
pub async fn run_cli(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
) -> Result<RunOutput, RunError> {
    let started = Instant::now();
    let vars = vars_for(task);
    let program = profile.command.render(&vars);
    let mut cmd = Command::new(&program);
    cmd.args(profile::render_args(&profile.args, &vars))
        .current_dir(match &profile.cwd {
            Some(cwd) => PathBuf::from(cwd.render(&vars)),
            None => task.workspace.clone(),
        })
        .env("AAMP_AGENT", &task.agent)
        .env("AAMP_TASK_ID", &task.task_id)
        .stdin(if profile.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(key) = &task.session_key {
        cmd.env("AAMP_SESSION_KEY", key);
    }
    for (name, value) in &profile.env {
        cmd.env(name, value.render(&vars));
    }
    let mut child = GroupChild::spawn(&mut cmd).map_err(|source| RunError::Spawn {
        command: program.clone(),
        source,
    })?;
    tracing::Span::current().record("pid", child.pid());
    tracing::debug!("agent started");

    let stdin_text = profile.stdin.as_ref().map(|t| t.render(&vars));
    let stdin = child.child.stdin.take();
    let stdout = child.child.stdout.take().expect("stdout is piped");
    let stderr = child.child.stderr.take().expect("stderr is piped");

    // Feed stdin, drain stdout and stderr, and wait, all at once: doing them in turn can
    // deadlock on a full pipe.
    let feed = async move {
        if let (Some(mut pipe), Some(text)) = (stdin, stdin_text) {
            // An agent that exits without reading all of its input is not an error here.
            let _ = pipe.write_all(text.as_bytes()).await;
            let _ = pipe.shutdown().await;
        }
    };
    let max = profile.output.max_bytes;
    let waiting = async {
        let outcome = tokio::select! {
            status = child.child.wait() => Ok(status?),
            _ = tokio::time::sleep(profile.timeout) => Err(RunError::TimedOut(profile.timeout)),
            _ = cancel.cancelled() => Err(RunError::Cancelled),
        };
        match outcome {
            Ok(status) => {
                child.reap_group(GRACE).await;
                Ok(status)
            }
            Err(e) => {
                child.terminate(GRACE).await?;
                Err(e)
            }
        }
    };
    let ((), out, err, status) = tokio::join!(
        feed,
        read_capped(stdout, max),
        read_tail(stderr, STDERR_TAIL),
        waiting
    );
    let status = status?;
    let (stdout_bytes, truncated) = out?;
    let stderr_text = clean(&String::from_utf8_lossy(&err?), true, true);
    let code = status.code();
    if !code.is_some_and(|c| profile.success_exit_codes.contains(&c)) {
        let status = match code {
            Some(c) => format!("exited with status {c}"),
            None => {
                use std::os::unix::process::ExitStatusExt;
                format!("was killed by signal {}", status.signal().unwrap_or(0))
            }
        };
        return Err(RunError::Failed {
            status,
            stderr: stderr_text,
        });
    }
    let opts = &profile.output;
    let mut output = clean(
        &String::from_utf8_lossy(&stdout_bytes),
        opts.strip_ansi,
        opts.trim,
    );
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
    })
}

/// Reads everything, keeping the first `max` bytes.
async fn read_capped(
    mut pipe: impl AsyncRead + Unpin,
    max: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, truncated));
        }
        let room = max.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
        truncated |= n > room;
    }
}

/// Reads everything, keeping the last `max` bytes.
async fn read_tail(mut pipe: impl AsyncRead + Unpin, max: usize) -> std::io::Result<Vec<u8>> {
    let mut tail = std::collections::VecDeque::with_capacity(max);
    let mut buf = vec![0u8; 8 * 1024];
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            return Ok(tail.into_iter().collect());
        }
        for &b in &buf[..n] {
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
