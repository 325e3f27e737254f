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
    EmbeddedResourceResource, EnvVariable, FileSystemCapabilities, Implementation,
    InitializeRequest, InitializeResponse, LoadSessionRequest, McpServer, McpServerStdio,
    NewSessionRequest, PermissionOptionKind, PlanEntryStatus, PromptRequest, ReadTextFileRequest,
    ReadTextFileResponse, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, ResumeSessionRequest, SelectedPermissionOutcome,
    SessionNotification, SessionUpdate, SetSessionModeRequest, StopReason, TextContent,
    ToolCallContent, ToolCallStatus, ToolKind, WriteTextFileRequest, WriteTextFileResponse,
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
mod handlers;
mod outcome;
mod permissions;
mod probe;
mod terminals;
mod updates;
mod usage;

use framing::*;
use fs::*;
use handlers::{terminal_env, Guard};
use outcome::{agent_error, not_logged_in, session_refused};
use permissions::*;
pub use probe::{probe, ProbeInfo};
use updates::*;

use super::process::GroupChild;
use super::profile::PermissionPolicy;
use super::stream::{StreamEvent, TodoItem, ToolStatus};
use super::{
    clean, read_tail, spawn_agent, start_for_task, Profile, RunError, RunOutput, Started,
    TaskInput, GRACE, STDERR_TAIL,
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
    /// What the agent said its turn used (`usage`).
    usage: Mutex<usage::AcpUsage>,
}

impl Shared {
    /// `text` without local detail, for the sender.
    fn redact(&self, text: &str) -> String {
        gate::redact(text, &self.workspace)
    }
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
    let Started {
        mut child,
        vars,
        cwd,
    } = start_for_task(profile, task, &profile.args, true)?;
    let (stdin, stdout, stderr) = child.pipes();
    let stdin = stdin.expect("stdin is piped");
    let workspace = cwd.canonicalize().unwrap_or(cwd.clone());
    let (shared, guard) = task_state(profile, task, &vars, &workspace, events);
    let transport = Lines::new(line_sink(stdin), line_stream(stdout));
    let driver_shared = shared.clone();
    // The driver's verdict is kept here, not only in the connection's result: an agent that
    // keeps stdout open after we are done is stopped, and the connection then ends with a
    // transport error that must not hide what already happened.
    let verdict: Mutex<Option<Driven>> = Mutex::new(None);
    let done = Notify::new();
    let connection = handlers::serve(
        guard,
        profile.attach_written_files,
        transport,
        async |cx: ConnectionTo<Agent>| {
            let driven = drive(cx, profile, task, &workspace, cancel, &driver_shared).await;
            done.notify_one();
            *verdict.lock().expect("verdict lock") = Some(driven?);
            Ok(())
        },
    );
    let (connection, status, stderr_text) = settle(&mut child, stderr, connection, &done).await;
    if let Some(report) = shared.usage_report() {
        let _ = events.send(report).await;
    }
    let driven = match (verdict.into_inner().expect("verdict lock"), connection) {
        (Some(driven), _) => Ok(driven),
        (None, Err(e)) => Err(e),
        (None, Ok(())) => Err(agent_client_protocol::Error::new(
            ErrorCode::INTERNAL_ERROR,
            "the connection ended early",
        )),
    };
    outcome::judge(
        driven,
        outcome::Exit {
            status,
            stderr: stderr_text,
            started,
        },
        &shared,
        profile,
    )
}

/// What a task's requests and updates share, and the guard every action the agent asks for
/// goes through first (`Guard::clear`), then runs off the connection's reading loop
/// (`handlers`).
fn task_state(
    profile: &Profile,
    task: &TaskInput,
    vars: &super::template::Vars,
    workspace: &Path,
    events: &mpsc::Sender<StreamEvent>,
) -> (Arc<Shared>, Guard) {
    let shared = Arc::new(Shared {
        text_max: profile.output.max_bytes,
        terminals: Some(terminals::Terminals::new(
            workspace.to_path_buf(),
            terminal_env(profile, task, vars),
        )),
        workspace: workspace.to_path_buf(),
        ..Shared::default()
    });
    let guard = Guard {
        shared: shared.clone(),
        events: events.clone(),
        questions: task.questions.clone(),
        policy: profile.permissions,
        asking: task.questions.is_some(),
        ask_timeout: profile.ask_timeout,
    };
    (shared, guard)
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

/// A handshake request with initialize's deadline: no answer by then ends the run as
/// [`Driven::InitTimedOut`].
macro_rules! within {
    ($cx:expr, $limit:expr, $request:expr) => {
        match tokio::time::timeout($limit, $cx.send_request($request).block_task()).await {
            Ok(r) => r,
            Err(_) => return Ok(Err(Driven::InitTimedOut)),
        }
    };
}

/// A session the agent opened, and the modes it offers, as its answer named them.
struct Opened {
    id: String,
    offered: Option<Vec<String>>,
}

type Step<T> = Result<Result<T, Driven>, agent_client_protocol::Error>;

fn mode_ids(
    state: &Option<agent_client_protocol::v1::schema::SessionModeState>,
) -> Option<Vec<String>> {
    state.as_ref().map(|s| {
        s.available_modes
            .iter()
            .map(|m| m.id.0.to_string())
            .collect::<Vec<_>>()
    })
}

/// Opens the session a task runs in: continues `resume_id` when the agent can resume or load
/// it, else starts a new one, authenticating (headless methods only) when the agent asks.
/// `Ok(Err(..))` says why there is no session.
async fn open_session(
    cx: &ConnectionTo<Agent>,
    profile: &Profile,
    init: &InitializeResponse,
    cwd: &Path,
    (resume_id, mcp): (Option<&str>, Option<&crate::runner::McpServer>),
    shared: &Shared,
) -> Step<String> {
    // Continue the Session-Key's session when the agent can; otherwise start a new one.
    let resumed = match resume_id.filter(|id| !id.is_empty()) {
        Some(id) => match resume(cx, profile, init, cwd, id, shared).await? {
            Ok(resumed) => resumed,
            Err(driven) => return Ok(Err(driven)),
        },
        None => None,
    };
    let opened = match resumed {
        Some(opened) => opened,
        None => match new_session(cx, profile, init, cwd, mcp).await? {
            Ok(opened) => opened,
            Err(driven) => return Ok(Err(driven)),
        },
    };
    if let Err(driven) = set_mode(cx, profile, &opened).await? {
        return Ok(Err(driven));
    }
    Ok(Ok(opened.id))
}

/// `session/resume`, or `session/load` and its replay, of session `id`; `None` when the agent
/// cannot continue it (the task then runs in a new session, its context told as text).
async fn resume(
    cx: &ConnectionTo<Agent>,
    profile: &Profile,
    init: &InitializeResponse,
    cwd: &Path,
    id: &str,
    shared: &Shared,
) -> Step<Option<Opened>> {
    let caps = &init.agent_capabilities;
    let limit = profile.init_timeout;
    let resumed = if caps.session_capabilities.resume.is_some() {
        within!(cx, limit, ResumeSessionRequest::new(id.to_string(), cwd))
            .map(|r| mode_ids(&r.modes))
    } else if caps.load_session {
        shared.replaying.store(true, Ordering::SeqCst);
        let r = within!(cx, limit, LoadSessionRequest::new(id.to_string(), cwd))
            .map(|r| mode_ids(&r.modes));
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
        Ok(offered) => Ok(Ok(Some(Opened {
            id: id.to_string(),
            offered,
        }))),
        Err(e) => {
            shared.context_lost.store(true, Ordering::SeqCst);
            tracing::warn!(session = id, error = %e.message, "could not continue the session; starting a new one");
            Ok(Ok(None))
        }
    }
}

/// The MCP servers the agent is given for the task, in ACP's terms (stdio, with their
/// environment: it travels in the request, never on a command line).
fn mcp_servers(mcp: Option<&crate::runner::McpServer>) -> Vec<McpServer> {
    mcp.map(|m| {
        let env = m.env.iter().map(|(k, v)| EnvVariable::new(k, v)).collect();
        McpServer::Stdio(
            McpServerStdio::new(&m.name, &m.command)
                .args(m.args.clone())
                .env(env),
        )
    })
    .into_iter()
    .collect()
}

/// `session/new`, authenticating first when the agent asks and a method needs no person.
async fn new_session(
    cx: &ConnectionTo<Agent>,
    profile: &Profile,
    init: &InitializeResponse,
    cwd: &Path,
    mcp: Option<&crate::runner::McpServer>,
) -> Step<Opened> {
    let limit = profile.init_timeout;
    let opened = |r: agent_client_protocol::v1::schema::NewSessionResponse| Opened {
        offered: mode_ids(&r.modes),
        id: r.session_id.0.to_string(),
    };
    match within!(
        cx,
        limit,
        NewSessionRequest::new(cwd).mcp_servers(mcp_servers(mcp))
    ) {
        Ok(r) => Ok(Ok(opened(r))),
        Err(e) if e.code == ErrorCode::AUTH_REQUIRED => {
            // Authenticate only when asked, and only with a method that needs no person: the
            // profile's auth_method, or one that uses an API key from the environment.
            let candidates =
                headless_auth_methods(&init.auth_methods, profile.auth_method.as_deref());
            let mut authenticated = false;
            for id in &candidates {
                if within!(cx, limit, AuthenticateRequest::new(id.clone())).is_ok() {
                    authenticated = true;
                    break;
                }
            }
            let advice = |message: &str| {
                let offered: Vec<String> = init.auth_methods.iter().map(auth_method_id).collect();
                format!("{message}; log in with the agent's own CLI, or set auth_method in the profile to one of: {}", offered.join(", "))
            };
            if !authenticated {
                return Ok(Err(Driven::NotLoggedIn(advice(&agent_error(&e)))));
            }
            match within!(
                cx,
                limit,
                NewSessionRequest::new(cwd).mcp_servers(mcp_servers(mcp))
            ) {
                Ok(r) => Ok(Ok(opened(r))),
                Err(e) => Ok(Err(Driven::NotLoggedIn(advice(&agent_error(&e))))),
            }
        }
        // Some agents put the real cause in the error's data (claude-agent-acp answers
        // -32603 "Internal error" with the details there when it is not logged in).
        Err(e) => Ok(Err(Driven::SessionRefused(agent_error(&e)))),
    }
}

/// The policy in the agent's own terms, where the profile names its mode: the task does not
/// run in another mode.
async fn set_mode(cx: &ConnectionTo<Agent>, profile: &Profile, opened: &Opened) -> Step<()> {
    let Some(names) = profile.modes.get(&profile.permissions) else {
        return Ok(Ok(()));
    };
    let policy = gate::policy_name(profile.permissions);
    // The first of the profile's names the agent offers (adapters name one mode differently:
    // codex-acp's workspace-write is Zed's codex-acp's auto); an agent that names no modes is
    // asked for the first.
    let mode = match &opened.offered {
        Some(offered) if !offered.is_empty() => match names.iter().find(|n| offered.contains(n)) {
            Some(mode) => mode.clone(),
            None => {
                return Ok(Err(Driven::SessionRefused(format!(
                    "it offers none of the modes the profile names for permissions = \"{policy}\" ({}); it offers: {}. Add its name for that mode under [modes] in the profile",
                    names.join(", "),
                    offered.join(", ")
                ))))
            }
        },
        _ => names[0].clone(),
    };
    let request = SetSessionModeRequest::new(opened.id.clone(), mode.clone());
    if let Err(e) = within!(cx, profile.init_timeout, request) {
        return Ok(Err(Driven::SessionRefused(format!(
            "it would not take the mode {mode:?} the profile names for permissions = \"{policy}\" ({})",
            e.message
        ))));
    }
    tracing::info!(%mode, "the agent's session mode set for the permission policy");
    Ok(Ok(()))
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
    let opening = (task.resume_id.as_deref(), task.mcp.as_ref());
    let session_id = match open_session(&cx, profile, &init, cwd, opening, shared).await? {
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
            Ok(r) => {
                shared.prompt_usage(&r);
                Driven::Stopped { stop: r.stop_reason, session_id }
            }
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
            shared.prompt_usage(&r);
            tracing::info!(stop = ?r.stop_reason, "the agent stopped after session/cancel")
        }
        Ok(Err(e)) => tracing::info!(error = %e.message, "the prompt failed after session/cancel"),
        Err(_) => tracing::warn!("the agent ignored session/cancel; stopping its process"),
    }
    Ok(ended)
}
