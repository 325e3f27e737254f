//! What an agent asks of the bridge during a task, each request answered off the connection's
//! reading loop (a person's answer, a slow file system or a command never stalls it):
//! permission requests (by the policy, or by a person under `ask`), file reads and writes
//! confined to the workspace, and the task's terminals. Every action goes through
//! [`Guard::clear`], the policy's verdict, first.

use agent_client_protocol::v1::Responder;
use agent_client_protocol::{on_receive_notification, on_receive_request};

use super::*;

type Answered = Result<(), agent_client_protocol::Error>;

/// An agent's request refused, in words for the agent.
pub(super) fn refused(message: String) -> agent_client_protocol::Error {
    agent_client_protocol::Error::new(ErrorCode::INVALID_PARAMS, message)
}

/// Answers a request with what was done, or its refusal in words for the agent.
fn answer<T, R: agent_client_protocol::JsonRpcResponse>(
    responder: Responder<R>,
    done: Result<T, String>,
    response: impl FnOnce(T) -> R,
) -> Answered {
    responder.respond_with_result(done.map(response).map_err(refused))
}

/// What every action an agent asks of the bridge goes through before it is carried out: the
/// policy's verdict ([`gate::verdict`]), and under `ask` a question to the sender.
#[derive(Clone)]
pub(super) struct Guard {
    pub(super) shared: Arc<Shared>,
    pub(super) events: mpsc::Sender<StreamEvent>,
    pub(super) questions: Option<mpsc::Sender<crate::runner::Question>>,
    pub(super) policy: PermissionPolicy,
    pub(super) asking: bool,
    pub(super) ask_timeout: std::time::Duration,
}

impl Guard {
    /// `Ok` when `what` ("running `make`") may be done; otherwise why not, kept for the answer
    /// and shown in the stream as a failed tool call.
    /// A file the agent reads or writes: inside the workspace (`precheck`), then cleared.
    async fn clear_file(&self, root: &Path, path: &Path, act: gate::Act) -> Result<(), String> {
        let verb = if matches!(act, gate::Act::Write) {
            "writing"
        } else {
            "reading"
        };
        let what = format!("{verb} {}", self.shared.redact(&path.display().to_string()));
        precheck(root, path)?;
        self.clear(act, what).await
    }

    pub(super) async fn clear(&self, act: gate::Act, what: String) -> Result<(), String> {
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
pub(super) fn terminal_env(
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

/// The policy's answer to a permission request, or under `ask` the sender's.
pub(super) async fn permission(
    guard: &Guard,
    req: RequestPermissionRequest,
    responder: Responder<RequestPermissionResponse>,
    cx: &ConnectionTo<Agent>,
) -> Answered {
    let Guard {
        shared,
        events,
        questions,
        policy,
        ask_timeout,
        ..
    } = guard;
    let (policy, ask_timeout) = (*policy, *ask_timeout);
    if shared.cancelling.load(Ordering::SeqCst) {
        return responder.respond(RequestPermissionResponse::new(
            RequestPermissionOutcome::Cancelled,
        ));
    }
    match (questions, policy) {
        (Some(questions), PermissionPolicy::Ask) => {
            // Waiting for a person inside the handler would stall the connection: the answer
            // is given from a task of its own.
            let (questions, shared, events) = (questions.clone(), shared.clone(), events.clone());
            cx.spawn(async move {
                let outcome = ask(&questions, &req, ask_timeout, &shared).await;
                let outcome = if shared.cancelling.load(Ordering::SeqCst) {
                    RequestPermissionOutcome::Cancelled
                } else {
                    outcome
                };
                tracing::info!(tool = ?req.tool_call.fields.title, ?outcome, "permission request answered by the dispatcher");
                let by = if shared.unanswered.lock().expect("unanswered lock").is_some() {
                    "no answer in time"
                } else {
                    "the sender's answer"
                };
                answer_permission(&shared, &events, &req, outcome, by, responder).await
            })
        }
        _ => {
            let outcome = decide(policy, &req);
            tracing::info!(tool = ?req.tool_call.fields.title, ?outcome, "permission request answered by policy");
            let by = format!("permissions = \"{}\"", gate::policy_name(policy));
            answer_permission(shared, events, &req, outcome, &by, responder).await
        }
    }
}

/// Settles a permission request answered `by` a person or the policy (what it grants, or its
/// refusal in the stream), then gives the agent its answer.
async fn answer_permission(
    shared: &Shared,
    events: &mpsc::Sender<StreamEvent>,
    req: &RequestPermissionRequest,
    outcome: RequestPermissionOutcome,
    by: &str,
    responder: Responder<RequestPermissionResponse>,
) -> Answered {
    for event in settle_permission(shared, req, &outcome, by)
        .into_iter()
        .chain(unannounced_tool(shared, req, &outcome))
    {
        let _ = events.send(event).await;
    }
    responder.respond(RequestPermissionResponse::new(outcome))
}

/// `fs/read_text_file`, inside the workspace.
pub(super) async fn read(
    root: PathBuf,
    guard: Guard,
    req: ReadTextFileRequest,
    responder: Responder<ReadTextFileResponse>,
) -> Answered {
    if let Err(why) = guard.clear_file(&root, &req.path, gate::Act::Read).await {
        return responder.respond_with_error(refused(why));
    }
    let read = off_runtime(move || read_confined(&root, &req)).await;
    answer(responder, read, ReadTextFileResponse::new)
}

/// `fs/write_text_file`, inside the workspace; the file is handed over with the answer when
/// the profile says `attach_written_files`.
pub(super) async fn write(
    root: PathBuf,
    guard: Guard,
    attach: bool,
    req: WriteTextFileRequest,
    responder: Responder<WriteTextFileResponse>,
) -> Answered {
    if let Err(why) = guard.clear_file(&root, &req.path, gate::Act::Write).await {
        return responder.respond_with_error(refused(why));
    }
    let path = req.path.clone();
    match off_runtime(move || write_confined(&root, &req)).await {
        Ok(()) => {
            if attach {
                let mut files = guard.shared.files.lock().expect("files lock");
                let path = super::super::OutputFile::Path(path);
                if !files.contains(&path) {
                    files.push(path);
                }
            }
            responder.respond(WriteTextFileResponse::new())
        }
        Err(message) => responder.respond_with_error(refused(message)),
    }
}

fn terminals(shared: &Shared) -> &terminals::Terminals {
    shared.terminals.as_ref().expect("a task has terminals")
}

/// `terminal/create`: a command in the task's own terminals, once the policy clears it.
pub(super) async fn terminal_create(
    guard: Guard,
    req: CreateTerminalRequest,
    responder: Responder<CreateTerminalResponse>,
    runner: ConnectionTo<Agent>,
) -> Answered {
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
    match terminals(&guard.shared).create(&req) {
        Ok((id, run)) => {
            runner.spawn(async move {
                run.await;
                Ok(())
            })?;
            responder.respond(CreateTerminalResponse::new(id))
        }
        Err(message) => responder.respond_with_error(refused(message)),
    }
}

pub(super) fn terminal_output(
    shared: &Shared,
    req: TerminalOutputRequest,
    responder: Responder<TerminalOutputResponse>,
) -> Answered {
    let output = terminals(shared).output(&req.terminal_id.0);
    answer(responder, output, |(text, truncated, exit)| {
        TerminalOutputResponse::new(text, truncated).exit_status(exit)
    })
}

pub(super) async fn terminal_wait(
    shared: Arc<Shared>,
    req: WaitForTerminalExitRequest,
    responder: Responder<WaitForTerminalExitResponse>,
) -> Answered {
    let status = terminals(&shared).wait(&req.terminal_id.0).await;
    answer(responder, status, WaitForTerminalExitResponse::new)
}

pub(super) fn terminal_kill(
    shared: &Shared,
    req: KillTerminalRequest,
    responder: Responder<KillTerminalResponse>,
) -> Answered {
    let killed = terminals(shared).kill(&req.terminal_id.0);
    answer(responder, killed, |()| KillTerminalResponse::new())
}

pub(super) fn terminal_release(
    shared: &Shared,
    req: ReleaseTerminalRequest,
    responder: Responder<ReleaseTerminalResponse>,
) -> Answered {
    let released = terminals(shared).release(&req.terminal_id.0);
    answer(responder, released, |()| ReleaseTerminalResponse::new())
}

/// A session update: a stream event, unless it replays history after `session/load`.
async fn update(shared: &Shared, events: &mpsc::Sender<StreamEvent>, n: SessionNotification) {
    if shared.replaying.load(Ordering::SeqCst) {
        shared.replayed.notify_one();
    } else {
        for event in map_update(&n.update, shared) {
            // A closed receiver only means nobody watches the stream.
            let _ = events.send(event).await;
        }
    }
}

/// The bridge's side of the connection: every request an agent may make is answered by the
/// handlers above, each cleared by `guard`, while `main` drives the session.
pub(super) async fn serve(
    guard: Guard,
    attach: bool,
    transport: impl agent_client_protocol::ConnectTo<Client>,
    main: impl AsyncFnOnce(ConnectionTo<Agent>) -> Answered,
) -> Answered {
    let on_update = {
        let (events, shared) = (guard.events.clone(), guard.shared.clone());
        async move |n: SessionNotification, _cx| {
            update(&shared, &events, n).await;
            Ok(())
        }
    };
    let on_permission = {
        let guard = guard.clone();
        async move |req: RequestPermissionRequest,
                    responder: Responder<RequestPermissionResponse>,
                    cx: ConnectionTo<Agent>| {
            permission(&guard, req, responder, &cx).await
        }
    };
    let on_read = {
        let (root, guard) = (guard.shared.workspace.clone(), guard.clone());
        async move |req: ReadTextFileRequest,
                    responder: Responder<ReadTextFileResponse>,
                    cx: ConnectionTo<Agent>| {
            cx.spawn(read(root.clone(), guard.clone(), req, responder))
        }
    };
    let on_write = {
        let (root, guard) = (guard.shared.workspace.clone(), guard.clone());
        async move |req: WriteTextFileRequest,
                    responder: Responder<WriteTextFileResponse>,
                    cx: ConnectionTo<Agent>| {
            cx.spawn(write(root.clone(), guard.clone(), attach, req, responder))
        }
    };
    let on_terminal_create = {
        let guard = guard.clone();
        async move |req: CreateTerminalRequest,
                    responder: Responder<CreateTerminalResponse>,
                    cx: ConnectionTo<Agent>| {
            cx.spawn(terminal_create(guard.clone(), req, responder, cx.clone()))
        }
    };
    let on_terminal_output = {
        let shared = guard.shared.clone();
        async move |req: TerminalOutputRequest,
                    responder: Responder<TerminalOutputResponse>,
                    _cx| { terminal_output(&shared, req, responder) }
    };
    let on_terminal_wait = {
        let shared = guard.shared.clone();
        async move |req: WaitForTerminalExitRequest,
                    responder: Responder<WaitForTerminalExitResponse>,
                    cx: ConnectionTo<Agent>| {
            cx.spawn(terminal_wait(shared.clone(), req, responder))
        }
    };
    let on_terminal_kill = {
        let shared = guard.shared.clone();
        async move |req: KillTerminalRequest, responder: Responder<KillTerminalResponse>, _cx| {
            terminal_kill(&shared, req, responder)
        }
    };
    let on_terminal_release = {
        let shared = guard.shared.clone();
        async move |req: ReleaseTerminalRequest,
                    responder: Responder<ReleaseTerminalResponse>,
                    _cx| { terminal_release(&shared, req, responder) }
    };
    Client
        .v1()
        .name("aamp-bridge")
        .on_receive_notification(on_update, on_receive_notification!())
        .on_receive_request(on_permission, on_receive_request!())
        .on_receive_request(on_read, on_receive_request!())
        .on_receive_request(on_write, on_receive_request!())
        .on_receive_request(on_terminal_create, on_receive_request!())
        .on_receive_request(on_terminal_output, on_receive_request!())
        .on_receive_request(on_terminal_wait, on_receive_request!())
        .on_receive_request(on_terminal_kill, on_receive_request!())
        .on_receive_request(on_terminal_release, on_receive_request!())
        .connect_with(transport, main)
        .await
}
