//! Native ACP: the agent runs as a child process in its own group, and we speak the Agent
//! Client Protocol (crate `agent-client-protocol` 5.2, protocol v1) over its stdio with our
//! own line framing (a length cap, which the crate's reader lacks). One process per task:
//! `initialize`, then `session/new` (or `session/resume` / `session/load` to continue a
//! Session-Key), one `session/prompt`, and teardown. Session updates become stream events;
//! permission requests are answered by policy without blocking the connection; file requests
//! and terminals (`terminals`) are confined to the task's workspace.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AuthMethod, AuthenticateRequest, CancelNotification, ClientCapabilities, ContentBlock,
    EmbeddedResourceResource, FileSystemCapabilities, Implementation, InitializeRequest,
    InitializeResponse, LoadSessionRequest, NewSessionRequest, PermissionOptionKind,
    PlanEntryStatus, PromptRequest, ReadTextFileRequest, ReadTextFileResponse,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    ResumeSessionRequest, SelectedPermissionOutcome, SessionNotification, SessionUpdate,
    SetSessionModeRequest, StopReason, TextContent, ToolCallContent, ToolCallStatus, ToolKind,
    WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, CreateTerminalResponse, KillTerminalRequest, KillTerminalResponse,
    ReleaseTerminalRequest, ReleaseTerminalResponse, TerminalOutputRequest, TerminalOutputResponse,
    WaitForTerminalExitRequest, WaitForTerminalExitResponse,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Agent, Client, ErrorCode, Lines};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

mod framing;
mod fs;
mod gate;
mod permissions;
mod probe;
mod terminals;
mod updates;

use framing::*;
use fs::*;
use permissions::*;
pub use probe::{probe, ProbeInfo};
use updates::*;

use super::process::GroupChild;
use super::profile::PermissionPolicy;
use super::stream::{StreamEvent, TodoItem, ToolStatus};
use super::{
    agent_cwd, clean, read_tail, spawn_agent, vars_for, Profile, RunError, RunOutput, TaskInput,
    GRACE, STDERR_TAIL,
};

/// Longest JSON-RPC line accepted from an agent; a longer one is skipped whole.
const MAX_LINE: usize = 8 << 20;
/// Largest file an agent may read through `fs/read_text_file`.
const MAX_READ: u64 = 16 << 20;

/// What the session driver found, returned from inside the connection.
enum Driven {
    Stopped {
        stop: StopReason,
        session_id: String,
    },
    /// `initialize` or another handshake step got no answer in time.
    NotLoggedIn(String),
    SessionRefused(String),
    TimedOut,
    Cancelled,
    InitTimedOut,
    /// The agent answered `session/prompt` with a JSON-RPC error.
    PromptFailed(agent_client_protocol::Error),
}

#[derive(Default)]
struct Shared {
    /// The answer so far, at most `text_max` bytes; `text_cut` says more came.
    text: Mutex<String>,
    text_max: usize,
    text_cut: AtomicBool,
    titles: Mutex<HashMap<String, String>>,
    /// `session/load` replays history as updates before it answers: not new output.
    replaying: AtomicBool,
    /// Told of every update that comes while `replaying`.
    replayed: Notify,
    /// The session to continue was refused; the task runs in a new one.
    context_lost: AtomicBool,
    /// Where in `text` the answer starts: after the last tool call.
    answer_from: std::sync::atomic::AtomicUsize,
    /// The last plan sent as a `todo` event.
    last_plan: Mutex<Option<Vec<crate::runner::stream::TodoItem>>>,
    /// After `session/cancel`, pending permission requests are answered "cancelled".
    cancelling: AtomicBool,
    /// A question to the dispatcher went unanswered for this many seconds: the task is then
    /// answered rejected, saying so.
    unanswered: Mutex<Option<u64>>,
    /// Files handed over: resources in the agent's messages, and (with the profile's
    /// `attach_written_files`) files it wrote.
    files: Mutex<Vec<super::OutputFile>>,
    /// The commands the agent runs through us (ACP terminals); none in a probe.
    terminals: Option<terminals::Terminals>,
    /// What commands the agent ran itself printed, by tool call, as adapters that do not use
    /// our terminals send it (codex-acp: `_meta.terminal_output_delta`); the last
    /// [`META_OUTPUT_MAX`] bytes of each.
    meta_output: Mutex<HashMap<String, String>>,
    /// The agent said its session is in error (codex-acp: `threadStatus` `systemError` in a
    /// `session_info_update`'s `_meta`, when the model's API failed) and has not said
    /// otherwise since: where in `text` its words about it start. It then ends the turn as if
    /// it had answered, with the error as the text.
    system_error: Mutex<Option<usize>>,
    /// What the policy (or the person asked) refused during the task.
    refusals: gate::Refusals,
    /// What a person allowed that covers later actions.
    granted: gate::Granted,
    /// The task's workspace, kept out of what is mailed.
    workspace: PathBuf,
}

impl Shared {
    /// `text` without local detail, for the sender.
    fn redact(&self, text: &str) -> String {
        gate::redact(text, &self.workspace)
    }
}

/// An agent's request refused, in words for the agent.
fn refused(message: String) -> agent_client_protocol::Error {
    agent_client_protocol::Error::new(ErrorCode::INVALID_PARAMS, message)
}

/// What every action an agent asks of the bridge goes through before it is carried out: the
/// policy's verdict ([`gate::verdict`]), and under `ask` a question to the sender.
#[derive(Clone)]
struct Guard {
    shared: Arc<Shared>,
    events: mpsc::Sender<StreamEvent>,
    questions: Option<mpsc::Sender<crate::runner::Question>>,
    policy: PermissionPolicy,
    asking: bool,
    ask_timeout: std::time::Duration,
}

impl Guard {
    /// `Ok` when `what` ("running `make`") may be done; otherwise why not, kept for the answer
    /// and shown in the stream as a failed tool call.
    async fn clear(&self, act: gate::Act, what: String) -> Result<(), String> {
        let shared = &self.shared;
        let why = match gate::verdict(self.policy, self.asking, act) {
            gate::Verdict::Go => return Ok(()),
            gate::Verdict::Ask if shared.granted.always(act) => return Ok(()),
            gate::Verdict::Ask => {
                let questions = self.questions.as_ref().expect("ask has someone to ask");
                let text = format!(
                    "The agent asks to do this in its workspace: {what}. Which option do you choose?"
                );
                let options = vec!["Allow".into(), "Always allow".into(), "Reject".into()];
                match ask_person(questions, text, options, self.ask_timeout, shared).await {
                    Some(0) => return Ok(()),
                    Some(1) => {
                        shared.granted.set_always(act);
                        return Ok(());
                    }
                    Some(_) => "the sender refused it".to_string(),
                    None if shared.unanswered.lock().expect("unanswered lock").is_some() => {
                        "the sender did not answer in time".to_string()
                    }
                    None => "nobody answered".to_string(),
                }
            }
            gate::Verdict::Refuse(why) => why,
        };
        tracing::info!(%what, %why, "an agent's action refused");
        if !shared.cancelling.load(Ordering::SeqCst) {
            shared.refusals.add(format!("{what} ({why})"));
            shared.step();
            let id = format!("refused-{}", uuid::Uuid::new_v4().simple());
            let _ = self
                .events
                .send(StreamEvent::ToolCall {
                    id,
                    label: what.clone(),
                    status: ToolStatus::Failed,
                    input: None,
                    output: Some(format!("refused: {why}")),
                })
                .await;
        }
        Err(format!("refused: {what}: {why}"))
    }
}

/// The environment of a command run in one of our terminals: not the bridge's own (which may
/// hold what the agent must not see), only the basics a command needs, what the profile names
/// for the agent, and the bridge's tags.
fn terminal_env(
    profile: &Profile,
    task: &TaskInput,
    vars: &crate::runner::template::Vars,
) -> Vec<(String, String)> {
    const BASICS: &[&str] = &[
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM",
    ];
    let mut env: Vec<(String, String)> = BASICS
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    env.extend(
        profile
            .env
            .iter()
            .map(|(name, value)| (name.clone(), value.render(vars))),
    );
    env.push(("AAMP_AGENT".into(), task.agent.clone()));
    env.push(("AAMP_TASK_ID".into(), task.task_id.clone()));
    if let Some(key) = &task.session_key {
        env.push(("AAMP_SESSION_KEY".into(), key.clone()));
    }
    env.extend(task.env.iter().cloned());
    env
}

/// After `session/load`, the history replay is over when no update came for this long...
const REPLAY_QUIET: std::time::Duration = std::time::Duration::from_millis(250);
/// ...or after this long, whatever comes.
const REPLAY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// How much of a command's output sent in `_meta` is kept per tool call.
const META_OUTPUT_MAX: usize = 64 * 1024;

/// Runs one task on an ACP agent.
#[tracing::instrument(skip_all, fields(profile = %profile.name, pid))]
pub async fn run_acp(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
    events: &mpsc::Sender<StreamEvent>,
) -> Result<RunOutput, RunError> {
    let started = Instant::now();
    let vars = vars_for(task);
    let program = profile.command.render(&vars);
    let cwd = agent_cwd(profile, task, &vars);
    let mut child = spawn_agent(
        profile,
        Some(task),
        &program,
        &profile.args,
        &vars,
        &cwd,
        true,
    )?;
    let stdin = child.child.stdin.take().expect("stdin is piped");
    let stdout = child.child.stdout.take().expect("stdout is piped");
    let stderr = child.child.stderr.take().expect("stderr is piped");
    tracing::Span::current().record("pid", child.pid());
    task.spawned(child.pid());
    let workspace = cwd.canonicalize().unwrap_or(cwd.clone());

    let shared = Arc::new(Shared {
        text: Mutex::new(String::new()),
        text_max: profile.output.max_bytes,
        text_cut: AtomicBool::new(false),
        titles: Mutex::new(HashMap::new()),
        replaying: AtomicBool::new(false),
        replayed: Notify::new(),
        context_lost: AtomicBool::new(false),
        answer_from: std::sync::atomic::AtomicUsize::new(0),
        last_plan: Mutex::new(None),
        cancelling: AtomicBool::new(false),
        unanswered: Mutex::new(None),
        files: Mutex::new(Vec::new()),
        terminals: Some(terminals::Terminals::new(
            workspace.clone(),
            terminal_env(profile, task, &vars),
        )),
        meta_output: Mutex::new(HashMap::new()),
        system_error: Mutex::new(None),
        refusals: gate::Refusals::default(),
        granted: gate::Granted::default(),
        workspace: workspace.clone(),
    });
    let asking = task.questions.is_some();
    let policy = profile.permissions;
    let on_update = {
        let (events, shared) = (events.clone(), shared.clone());
        async move |n: SessionNotification, _cx| {
            if shared.replaying.load(Ordering::SeqCst) {
                shared.replayed.notify_one();
            } else {
                for event in map_update(&n.update, &shared) {
                    // A closed receiver only means nobody watches the stream.
                    let _ = events.send(event).await;
                }
            }
            Ok(())
        }
    };
    let on_permission = {
        let shared = shared.clone();
        let events = events.clone();
        let questions = task.questions.clone();
        let ask_timeout = profile.ask_timeout;
        async move |req: RequestPermissionRequest,
                    responder: agent_client_protocol::v1::Responder<RequestPermissionResponse>,
                    cx: ConnectionTo<Agent>| {
            if shared.cancelling.load(Ordering::SeqCst) {
                return responder.respond(RequestPermissionResponse::new(
                    RequestPermissionOutcome::Cancelled,
                ));
            }
            match (&questions, policy) {
                (Some(questions), PermissionPolicy::Ask) => {
                    // Waiting for a person inside the handler would stall the connection:
                    // the answer is given from a task of its own.
                    let (questions, shared, events) =
                        (questions.clone(), shared.clone(), events.clone());
                    cx.spawn(async move {
                        let outcome = ask(&questions, &req, ask_timeout, &shared).await;
                        let outcome = if shared.cancelling.load(Ordering::SeqCst) { RequestPermissionOutcome::Cancelled } else { outcome };
                        tracing::info!(tool = ?req.tool_call.fields.title, ?outcome, "permission request answered by the dispatcher");
                        let by = if shared.unanswered.lock().expect("unanswered lock").is_some() { "no answer in time" } else { "the sender's answer" };
                        for event in settle_permission(&shared, &req, &outcome, by).into_iter().chain(unannounced_tool(&shared, &req, &outcome)) {
                            let _ = events.send(event).await;
                        }
                        responder.respond(RequestPermissionResponse::new(outcome))
                    })
                }
                _ => {
                    let outcome = decide(policy, &req);
                    tracing::info!(tool = ?req.tool_call.fields.title, ?outcome, "permission request answered by policy");
                    let by = format!("permissions = \"{}\"", gate::policy_name(policy));
                    for event in settle_permission(&shared, &req, &outcome, &by)
                        .into_iter()
                        .chain(unannounced_tool(&shared, &req, &outcome))
                    {
                        let _ = events.send(event).await;
                    }
                    responder.respond(RequestPermissionResponse::new(outcome))
                }
            }
        }
    };
    // Every action below goes through the policy first (`gate`), then runs off the
    // connection's reading loop: a person's answer, a slow file system or a command never
    // stalls it.
    let guard = Guard {
        shared: shared.clone(),
        events: events.clone(),
        questions: task.questions.clone(),
        policy,
        asking,
        ask_timeout: profile.ask_timeout,
    };
    let on_read = {
        let (root, guard) = (workspace.clone(), guard.clone());
        async move |req: ReadTextFileRequest,
                    responder: agent_client_protocol::v1::Responder<ReadTextFileResponse>,
                    cx: ConnectionTo<Agent>| {
            let (root, guard) = (root.clone(), guard.clone());
            cx.spawn(async move {
                let what = format!(
                    "reading {}",
                    guard.shared.redact(&req.path.display().to_string())
                );
                if let Err(why) = precheck(&root, &req.path) {
                    return responder.respond_with_error(refused(why));
                }
                if let Err(why) = guard.clear(gate::Act::Read, what).await {
                    return responder.respond_with_error(refused(why));
                }
                match off_runtime(move || read_confined(&root, &req)).await {
                    Ok(text) => responder.respond(ReadTextFileResponse::new(text)),
                    Err(message) => responder.respond_with_error(refused(message)),
                }
            })
        }
    };
    let on_write = {
        let (root, guard) = (workspace.clone(), guard.clone());
        let attach = profile.attach_written_files;
        async move |req: WriteTextFileRequest,
                    responder: agent_client_protocol::v1::Responder<WriteTextFileResponse>,
                    cx: ConnectionTo<Agent>| {
            let (root, guard) = (root.clone(), guard.clone());
            cx.spawn(async move {
                let what = format!(
                    "writing {}",
                    guard.shared.redact(&req.path.display().to_string())
                );
                if let Err(why) = precheck(&root, &req.path) {
                    return responder.respond_with_error(refused(why));
                }
                if let Err(why) = guard.clear(gate::Act::Write, what).await {
                    return responder.respond_with_error(refused(why));
                }
                let path = req.path.clone();
                match off_runtime(move || write_confined(&root, &req)).await {
                    Ok(()) => {
                        if attach {
                            let mut files = guard.shared.files.lock().expect("files lock");
                            let path = super::OutputFile::Path(path);
                            if !files.contains(&path) {
                                files.push(path);
                            }
                        }
                        responder.respond(WriteTextFileResponse::new())
                    }
                    Err(message) => responder.respond_with_error(refused(message)),
                }
            })
        }
    };
    // Terminals: each answered from the task's own terminals, refused in words when it cannot
    // be done; waiting runs off the connection's reading loop.
    let on_terminal_create = {
        let guard = guard.clone();
        async move |req: CreateTerminalRequest,
                    responder: agent_client_protocol::v1::Responder<CreateTerminalResponse>,
                    cx: ConnectionTo<Agent>| {
            let guard = guard.clone();
            let runner = cx.clone();
            cx.spawn(async move {
                let command = gate::command_line(&req.command, &req.args);
                let what = format!("running `{}`", guard.shared.redact(&command));
                let cleared = if guard.shared.granted.take_command(&command) {
                    Ok(())
                } else {
                    guard.clear(gate::Act::Terminal, what).await
                };
                if let Err(why) = cleared {
                    return responder.respond_with_error(refused(why));
                }
                let terminals = guard
                    .shared
                    .terminals
                    .as_ref()
                    .expect("a task has terminals");
                match terminals.create(&req) {
                    Ok((id, run)) => {
                        runner.spawn(async move {
                            run.await;
                            Ok(())
                        })?;
                        responder.respond(CreateTerminalResponse::new(id))
                    }
                    Err(message) => responder.respond_with_error(refused(message)),
                }
            })
        }
    };
    let on_terminal_output = {
        let shared = shared.clone();
        async move |req: TerminalOutputRequest,
                    responder: agent_client_protocol::v1::Responder<TerminalOutputResponse>,
                    _cx| {
            let terminals = shared.terminals.as_ref().expect("a task has terminals");
            match terminals.output(&req.terminal_id.0) {
                Ok((text, truncated, exit)) => responder
                    .respond(TerminalOutputResponse::new(text, truncated).exit_status(exit)),
                Err(message) => responder.respond_with_error(refused(message)),
            }
        }
    };
    let on_terminal_wait = {
        let shared = shared.clone();
        async move |req: WaitForTerminalExitRequest,
                    responder: agent_client_protocol::v1::Responder<WaitForTerminalExitResponse>,
                    cx: ConnectionTo<Agent>| {
            let shared = shared.clone();
            cx.spawn(async move {
                let terminals = shared.terminals.as_ref().expect("a task has terminals");
                match terminals.wait(&req.terminal_id.0).await {
                    Ok(status) => responder.respond(WaitForTerminalExitResponse::new(status)),
                    Err(message) => responder.respond_with_error(refused(message)),
                }
            })
        }
    };
    let on_terminal_kill = {
        let shared = shared.clone();
        async move |req: KillTerminalRequest,
                    responder: agent_client_protocol::v1::Responder<KillTerminalResponse>,
                    _cx| {
            let terminals = shared.terminals.as_ref().expect("a task has terminals");
            match terminals.kill(&req.terminal_id.0) {
                Ok(()) => responder.respond(KillTerminalResponse::new()),
                Err(message) => responder.respond_with_error(refused(message)),
            }
        }
    };
    let on_terminal_release = {
        let shared = shared.clone();
        async move |req: ReleaseTerminalRequest,
                    responder: agent_client_protocol::v1::Responder<ReleaseTerminalResponse>,
                    _cx| {
            let terminals = shared.terminals.as_ref().expect("a task has terminals");
            match terminals.release(&req.terminal_id.0) {
                Ok(()) => responder.respond(ReleaseTerminalResponse::new()),
                Err(message) => responder.respond_with_error(refused(message)),
            }
        }
    };
    let transport = Lines::new(line_sink(stdin), line_stream(stdout));
    let driver_shared = shared.clone();
    // The driver's verdict is kept here, not only in the connection's result: an agent that
    // keeps stdout open after we are done is stopped, and the connection then ends with a
    // transport error that must not hide what already happened.
    let verdict: Mutex<Option<Driven>> = Mutex::new(None);
    let done = Notify::new();
    let connection = Client
        .v1()
        .name("aamp-bridge")
        .on_receive_notification(on_update, agent_client_protocol::on_receive_notification!())
        .on_receive_request(on_permission, agent_client_protocol::on_receive_request!())
        .on_receive_request(on_read, agent_client_protocol::on_receive_request!())
        .on_receive_request(on_write, agent_client_protocol::on_receive_request!())
        .on_receive_request(
            on_terminal_create,
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            on_terminal_output,
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            on_terminal_wait,
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            on_terminal_kill,
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            on_terminal_release,
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async |cx: ConnectionTo<Agent>| {
            let driven = drive(cx, profile, task, &workspace, cancel, &driver_shared).await;
            done.notify_one();
            *verdict.lock().expect("verdict lock") = Some(driven?);
            Ok(())
        });
    let (connection, status, stderr_text) = settle(&mut child, stderr, connection, &done).await;
    let driven = match (verdict.into_inner().expect("verdict lock"), connection) {
        (Some(driven), _) => Ok(driven),
        (None, Err(e)) => Err(e),
        (None, Ok(())) => Err(agent_client_protocol::Error::new(
            ErrorCode::INTERNAL_ERROR,
            "the connection ended early",
        )),
    };
    let failed = |what: String| {
        let status = match status.and_then(|s| s.code()) {
            Some(code) => format!("{what} (exit status {code})"),
            None => what,
        };
        RunError::Failed {
            status,
            stderr: stderr_text.clone(),
        }
    };
    if let Some(secs) = *shared.unanswered.lock().expect("unanswered lock") {
        if !matches!(driven, Ok(Driven::Cancelled) | Ok(Driven::TimedOut)) {
            return Err(RunError::Stopped(format!(
                "the agent's question got no answer within {secs}s (ask_timeout_secs), so it was refused"
            )));
        }
    }
    match driven {
        Ok(Driven::Stopped { stop, session_id }) => match stop {
            StopReason::EndTurn if shared.failed().is_some() => Err(RunError::Stopped(format!(
                "the agent's model failed: {}",
                shared.failed().unwrap_or_default()
            ))),
            StopReason::EndTurn
                if shared.refusals.summary().is_some() && shared.after_step().is_none() =>
            {
                // The agent stopped at what it was refused: that is the answer, with what it
                // said before.
                let refused = shared.refusals.summary().unwrap_or_default();
                let said = shared.answer();
                let said = said.trim();
                Err(RunError::Stopped(if said.is_empty() {
                    format!("the agent ended its turn after the bridge refused: {refused}")
                } else {
                    format!("the agent ended its turn after the bridge refused: {refused}. Before that it said: {said}")
                }))
            }
            StopReason::EndTurn => {
                let mut text = shared.answer();
                if let Some(refused) = shared.refusals.summary() {
                    text = format!(
                        "{}\n\n(aamp-bridge: refused during this task: {refused})",
                        text.trim_end()
                    );
                }
                let (output, truncated) = super::cap(
                    clean(&text, profile.output.strip_ansi, profile.output.trim),
                    profile.output.max_bytes,
                );
                let truncated = truncated || shared.text_cut.load(Ordering::SeqCst);
                Ok(RunOutput {
                    output,
                    truncated,
                    duration: started.elapsed(),
                    session_id: Some(session_id),
                    files: std::mem::take(&mut *shared.files.lock().expect("files lock")),
                    context_lost: shared.context_lost.load(Ordering::SeqCst),
                    no_resume: false,
                })
            }
            StopReason::Cancelled => Err(RunError::Cancelled),
            StopReason::Refusal => Err(RunError::Stopped("the agent refused the task".into())),
            StopReason::MaxTokens => Err(RunError::Stopped(
                "the agent reached its token limit before finishing".into(),
            )),
            StopReason::MaxTurnRequests => Err(RunError::Stopped(
                "the agent reached its turn limit before finishing".into(),
            )),
            other => Err(RunError::Stopped(format!("the agent stopped: {other:?}"))),
        },
        Ok(Driven::NotLoggedIn(detail)) => Err(not_logged_in(&detail)),
        Ok(Driven::SessionRefused(detail)) => Err(session_refused(&detail, profile)),
        Ok(Driven::TimedOut) => Err(RunError::TimedOut(profile.timeout)),
        Ok(Driven::Cancelled) => Err(RunError::Cancelled),
        Ok(Driven::InitTimedOut) => Err(failed(format!(
            "did not answer initialize within {}s",
            profile.init_timeout.as_secs()
        ))),
        // The agent refused the task with an error of its own, still running: its words, not
        // a broken connection and its stderr.
        Ok(Driven::PromptFailed(e)) if status.is_none_or(|s| s.success()) => {
            if e.code == ErrorCode::AUTH_REQUIRED {
                Err(not_logged_in(&agent_error(&e)))
            } else {
                Err(RunError::Reported(agent_error(&e)))
            }
        }
        Ok(Driven::PromptFailed(e)) if e.code == ErrorCode::AUTH_REQUIRED => {
            Err(not_logged_in(&agent_error(&e)))
        }
        Ok(Driven::PromptFailed(e)) => {
            Err(failed(format!("failed on the task ({})", agent_error(&e))))
        }
        Err(e) => Err(failed(format!("broke the ACP connection ({})", e.message))),
    }
}

/// An agent's JSON-RPC error in words: its message, and the details adapters put in `data`
/// (`{"details": "Claude Code process exited with code 1"}`).
fn agent_error(e: &agent_client_protocol::Error) -> String {
    // A stack trace in `data` (codex-acp appends one) is not a reason: its telling line is.
    let details = e.data.as_ref().and_then(|d| match d {
        serde_json::Value::String(s) => crate::runner::telling_line(s),
        serde_json::Value::Object(o) => ["details", "message", "error"]
            .iter()
            .find_map(|k| o.get(*k).and_then(|v| v.as_str()))
            .and_then(crate::runner::telling_line),
        _ => None,
    });
    match details.filter(|d| !d.is_empty() && !e.message.contains(d.as_str())) {
        Some(d) => format!("{}: {d}", e.message),
        None => e.message.clone(),
    }
}

fn not_logged_in(detail: &str) -> RunError {
    RunError::NotLoggedIn(detail.to_string())
}

fn session_refused(detail: &str, profile: &Profile) -> RunError {
    let hint = match refused_as_root(detail, profile) {
        Some(value) => format!(
            ". IS_SANDBOX is {value:?} here, so the Claude adapter asks Claude Code for its \
             permission bypass, which Claude Code refuses to root unless IS_SANDBOX is \"1\": \
             set IS_SANDBOX = \"1\" under [env] in the profile, or run the bridge as a normal user"
        ),
        None => String::new(),
    };
    RunError::Stopped(format!(
        "the agent could not start a session: {detail}{hint}"
    ))
}

/// Whether a Claude adapter's refusal is Claude Code refusing root its permission bypass
/// (`--dangerously-skip-permissions cannot be used with root/sudo privileges`, which the
/// adapters turn into "Claude Code process exited with code 1" or "Query closed before
/// response received" alone), and the IS_SANDBOX
/// value that made the adapter ask: claude-agent-acp asks when IS_SANDBOX has any value,
/// Claude Code allows it to root only with `1`.
fn refused_as_root(detail: &str, profile: &Profile) -> Option<String> {
    let sandbox = match profile.env.iter().find(|(k, _)| k == "IS_SANDBOX") {
        Some((_, value)) => Some(value.literal_text()),
        None => std::env::var("IS_SANDBOX").ok(),
    }?;
    // claude-agent-acp says the first, Zed's claude-code-acp the second.
    let exited = [
        "Claude Code process exited",
        "Query closed before response received",
    ]
    .iter()
    .any(|said| detail.contains(said));
    (exited && nix::unistd::geteuid().is_root() && sandbox != "1").then_some(sandbox)
}

/// `initialize` with the capabilities the policy lets the agent use ([`gate::offered`]): file
/// reads and writes and terminals, confined to the workspace.
fn initialize_request(policy: PermissionPolicy, asking: bool) -> InitializeRequest {
    let (read, write, terminal) = gate::offered(policy, asking);
    InitializeRequest::new(ProtocolVersion::V1)
        .client_capabilities(
            ClientCapabilities::new()
                .fs(FileSystemCapabilities::new()
                    .read_text_file(read)
                    .write_text_file(write))
                .terminal(terminal),
        )
        .client_info(Implementation::new(
            "aamp-bridge",
            env!("CARGO_PKG_VERSION"),
        ))
}

/// A spawned agent: its process group and its pipes.
/// Runs `connection` to its end and then stops the agent: after our side is done (`done`),
/// an agent that keeps the connection open past the grace period is stopped; after the
/// connection closes (stdin EOF) the agent gets the grace period to exit before its group is
/// stopped. Stderr is drained meanwhile; it ends when the group is gone. Returns the
/// connection's result, the exit status and the cleaned stderr tail.
async fn settle(
    child: &mut GroupChild,
    stderr: ChildStderr,
    connection: impl std::future::Future<Output = Result<(), agent_client_protocol::Error>>,
    done: &Notify,
) -> (
    Result<(), agent_client_protocol::Error>,
    Option<std::process::ExitStatus>,
    String,
) {
    let ended = Notify::new();
    let stop_reading = CancellationToken::new();
    let run_and_stop = async {
        let connection = {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                r = &mut connection => r,
                _ = async { done.notified().await; tokio::time::sleep(GRACE).await } => {
                    tracing::info!("the agent kept its connection open after we were done; stopping it");
                    let _ = child.terminate(GRACE).await;
                    // A process that escaped the group (`setsid cmd &`) may still hold stdout.
                    match tokio::time::timeout(GRACE, connection).await {
                        Ok(r) => r,
                        Err(_) => Err(agent_client_protocol::Error::new(
                            ErrorCode::INTERNAL_ERROR,
                            "the agent's output stayed open after it was stopped",
                        )),
                    }
                }
            }
        };
        let status = match tokio::time::timeout(GRACE, child.child.wait()).await {
            Ok(status) => {
                child.reap_group(GRACE).await;
                status.ok()
            }
            Err(_) => child.terminate(GRACE).await.ok(),
        };
        ended.notify_one();
        (connection, status)
    };
    let tail = super::drain_until_stopped(
        read_tail(stderr, STDERR_TAIL, &stop_reading),
        &ended,
        &stop_reading,
    );
    let ((connection, status), tail) = tokio::join!(run_and_stop, tail);
    (
        connection,
        status,
        clean(
            &String::from_utf8_lossy(&tail.unwrap_or_default()),
            true,
            true,
        ),
    )
}

fn auth_method_id(method: &AuthMethod) -> String {
    match method {
        AuthMethod::Agent(a) => a.id.0.to_string(),
        other => serde_json::to_value(other)
            .ok()
            .and_then(|v| v["id"].as_str().map(str::to_string))
            .unwrap_or_else(|| "?".into()),
    }
}

/// The auth methods the bridge may use on its own: the profile's choice, or else the agent's
/// methods that take an API key (by id or `_meta`), never interactive logins such as OAuth.
fn headless_auth_methods(methods: &[AuthMethod], chosen: Option<&str>) -> Vec<String> {
    if let Some(chosen) = chosen {
        return vec![chosen.to_string()];
    }
    methods
        .iter()
        .filter(|m| {
            let value = serde_json::to_value(m).unwrap_or_default();
            let id = value["id"]
                .as_str()
                .unwrap_or_default()
                .to_ascii_lowercase();
            matches!(m, AuthMethod::Agent(_))
                && (id.contains("api-key")
                    || id.contains("api_key")
                    || id.contains("apikey")
                    || value["_meta"].get("api-key").is_some())
        })
        .map(auth_method_id)
        .collect()
}

/// Opens the session a task runs in: continues `resume_id` when the agent can resume or load
/// it, else starts a new one, authenticating (headless methods only) when the agent asks.
/// `Ok(Err(..))` says why there is no session.
async fn open_session(
    cx: &ConnectionTo<Agent>,
    profile: &Profile,
    init: &InitializeResponse,
    cwd: &Path,
    resume_id: Option<&str>,
    shared: &Shared,
) -> Result<Result<String, Driven>, agent_client_protocol::Error> {
    let caps = &init.agent_capabilities;
    let limit = profile.init_timeout;
    // Every handshake step has the same deadline as initialize.
    macro_rules! within {
        ($request:expr) => {
            match tokio::time::timeout(limit, cx.send_request($request).block_task()).await {
                Ok(r) => r,
                Err(_) => return Ok(Err(Driven::InitTimedOut)),
            }
        };
    }

    // Continue the Session-Key's session when the agent can; otherwise start a new one.
    let mut session_id = None;
    // The session modes the agent offers, as its answer named them.
    let mut offered: Option<Vec<String>> = None;
    let ids = |state: &Option<agent_client_protocol::v1::schema::SessionModeState>| {
        state.as_ref().map(|s| {
            s.available_modes
                .iter()
                .map(|m| m.id.0.to_string())
                .collect::<Vec<_>>()
        })
    };
    if let Some(id) = resume_id.filter(|id| !id.is_empty()) {
        let resumed = if caps.session_capabilities.resume.is_some() {
            within!(ResumeSessionRequest::new(id.to_string(), cwd)).map(|r| offered = ids(&r.modes))
        } else if caps.load_session {
            shared.replaying.store(true, Ordering::SeqCst);
            let r = within!(LoadSessionRequest::new(id.to_string(), cwd))
                .map(|r| offered = ids(&r.modes));
            if r.is_ok() {
                // Some agents replay after they answer (gemini --acp 0.61 does not await its
                // replay): the history is over once the updates stop for a moment.
                let until = tokio::time::Instant::now() + REPLAY_MAX;
                while tokio::time::timeout_at(
                    until.min(tokio::time::Instant::now() + REPLAY_QUIET),
                    shared.replayed.notified(),
                )
                .await
                .is_ok()
                {}
            }
            shared.replaying.store(false, Ordering::SeqCst);
            r
        } else {
            Err(agent_client_protocol::Error::new(
                ErrorCode::METHOD_NOT_FOUND,
                "the agent cannot resume or load sessions",
            ))
        };
        match resumed {
            Ok(()) => session_id = Some(id.to_string()),
            Err(e) => {
                shared.context_lost.store(true, Ordering::SeqCst);
                tracing::warn!(session = id, error = %e.message, "could not continue the session; starting a new one")
            }
        }
    }
    let session_id = match session_id {
        Some(id) => id,
        None => match within!(NewSessionRequest::new(cwd)) {
            Ok(r) => {
                offered = ids(&r.modes);
                r.session_id.0.to_string()
            }
            Err(e) if e.code == ErrorCode::AUTH_REQUIRED => {
                // Authenticate only when asked, and only with a method that needs no person:
                // the profile's auth_method, or one that uses an API key from the environment.
                let candidates =
                    headless_auth_methods(&init.auth_methods, profile.auth_method.as_deref());
                let mut authenticated = false;
                for id in &candidates {
                    if within!(AuthenticateRequest::new(id.clone())).is_ok() {
                        authenticated = true;
                        break;
                    }
                }
                let advice = |message: &str| {
                    let offered: Vec<String> =
                        init.auth_methods.iter().map(auth_method_id).collect();
                    format!("{message}; log in with the agent's own CLI, or set auth_method in the profile to one of: {}", offered.join(", "))
                };
                if !authenticated {
                    return Ok(Err(Driven::NotLoggedIn(advice(&agent_error(&e)))));
                }
                match within!(NewSessionRequest::new(cwd)) {
                    Ok(r) => {
                        offered = ids(&r.modes);
                        r.session_id.0.to_string()
                    }
                    Err(e) => return Ok(Err(Driven::NotLoggedIn(advice(&agent_error(&e))))),
                }
            }
            // Some agents put the real cause in the error's data (claude-agent-acp answers
            // -32603 "Internal error" with the details there when it is not logged in).
            Err(e) => {
                let detail = agent_error(&e);
                return Ok(Err(Driven::SessionRefused(detail)));
            }
        },
    };
    // The policy in the agent's own terms, where the profile names its mode: the task does
    // not run in another mode.
    if let Some(names) = profile.modes.get(&profile.permissions) {
        let policy = gate::policy_name(profile.permissions);
        // The first of the profile's names the agent offers (adapters name one mode
        // differently: codex-acp's workspace-write is Zed's codex-acp's auto); an agent
        // that names no modes is asked for the first.
        let mode = match &offered {
            Some(offered) if !offered.is_empty() => {
                match names.iter().find(|n| offered.contains(n)) {
                    Some(mode) => mode.clone(),
                    None => {
                        return Ok(Err(Driven::SessionRefused(format!(
                            "it offers none of the modes the profile names for permissions = \"{policy}\" ({}); it offers: {}. Add its name for that mode under [modes] in the profile",
                            names.join(", "),
                            offered.join(", ")
                        ))))
                    }
                }
            }
            _ => names[0].clone(),
        };
        if let Err(e) = within!(SetSessionModeRequest::new(session_id.clone(), mode.clone())) {
            return Ok(Err(Driven::SessionRefused(format!(
                "it would not take the mode {mode:?} the profile names for permissions = \"{policy}\" ({})",
                e.message
            ))));
        }
        tracing::info!(%mode, "the agent's session mode set for the permission policy");
    }
    Ok(Ok(session_id))
}

/// initialize → session → prompt, with deadlines and cancel.
async fn drive(
    cx: ConnectionTo<Agent>,
    profile: &Profile,
    task: &TaskInput,
    cwd: &Path,
    cancel: &CancellationToken,
    shared: &Shared,
) -> Result<Driven, agent_client_protocol::Error> {
    let init = initialize_request(profile.permissions, task.questions.is_some());
    let init = tokio::select! {
        r = tokio::time::timeout(profile.init_timeout, cx.send_request(init).block_task()) => match r {
            Ok(r) => r?,
            Err(_) => return Ok(Driven::InitTimedOut),
        },
        _ = cancel.cancelled() => return Ok(Driven::Cancelled),
    };
    let session_id =
        match open_session(&cx, profile, &init, cwd, task.resume_id.as_deref(), shared).await? {
            Ok(id) => id,
            Err(why) => return Ok(why),
        };

    // A session that could not be continued: a new one, given the conversation as text.
    let prompt = match (
        &task.fresh_prompt,
        shared.context_lost.load(Ordering::SeqCst),
    ) {
        (Some(fresh), true) => fresh.clone(),
        _ => task.prompt.clone(),
    };
    let request = PromptRequest::new(
        session_id.clone(),
        vec![ContentBlock::Text(TextContent::new(prompt))],
    );
    let mut reply = std::pin::pin!(cx.send_request(request).block_task());
    let ended = tokio::select! {
        r = &mut reply => return Ok(match r {
            Ok(r) => Driven::Stopped { stop: r.stop_reason, session_id },
            Err(e) => Driven::PromptFailed(e),
        }),
        _ = cancel.cancelled() => Driven::Cancelled,
        _ = tokio::time::sleep(profile.timeout) => Driven::TimedOut,
    };
    // session/cancel, then a grace period for the agent to stop; after that the process
    // group is killed by the caller.
    shared.cancelling.store(true, Ordering::SeqCst);
    cx.send_notification(CancelNotification::new(session_id.clone()))?;
    match tokio::time::timeout(profile.cancel_grace, &mut reply).await {
        Ok(Ok(r)) => {
            tracing::info!(stop = ?r.stop_reason, "the agent stopped after session/cancel")
        }
        Ok(Err(e)) => tracing::info!(error = %e.message, "the prompt failed after session/cancel"),
        Err(_) => tracing::warn!("the agent ignored session/cancel; stopping its process"),
    }
    Ok(ended)
}
