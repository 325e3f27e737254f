//! Permission requests answered by the profile's policy, or asked of the dispatcher, without
//! blocking the connection.

use super::*;

/// Asks whoever answers questions, and waits for the choice: the option's index, or `None`
/// for no answer in time (which is then kept, so the task says so), free text, or nobody
/// listening.
pub(super) async fn ask_person(
    questions: &mpsc::Sender<crate::runner::Question>,
    text: String,
    options: Vec<String>,
    wait: std::time::Duration,
    shared: &Shared,
) -> Option<usize> {
    let count = options.len();
    let (answer, chosen) = tokio::sync::oneshot::channel();
    let question = crate::runner::Question {
        text,
        reason: "The agent needs a permission that this bridge's policy leaves to you.".into(),
        options,
        answer,
    };
    if questions.send(question).await.is_err() {
        return None;
    }
    match tokio::time::timeout(wait, chosen).await {
        Ok(Ok(crate::runner::Answer::Chosen(i))) if i < count => Some(i),
        Ok(_) => None,
        Err(_) => {
            tracing::warn!(
                seconds = wait.as_secs(),
                "no answer to the permission question in time; rejecting"
            );
            *shared.unanswered.lock().expect("unanswered lock") = Some(wait.as_secs());
            None
        }
    }
}

/// Hands a permission request to whoever answers questions, and waits for the choice. No
/// answer in time (or nobody listening) rejects.
pub(super) async fn ask(
    questions: &mpsc::Sender<crate::runner::Question>,
    req: &RequestPermissionRequest,
    wait: std::time::Duration,
    shared: &Shared,
) -> RequestPermissionOutcome {
    let title = title_of(req, "a tool");
    let kind = req
        .tool_call
        .fields
        .kind
        .map(|k| {
            serde_json::to_value(k)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        })
        .unwrap_or_else(|| "other".into());
    let command = gate::command_of(req.tool_call.fields.raw_input.as_ref())
        .map(|c| format!(", the command `{}`", shared.redact(&c)))
        .unwrap_or_default();
    let text = shared.redact(&format!(
        "The agent asks for permission to use \"{title}\" ({kind}{command}). Which option do you choose?"
    ));
    let options = req.options.iter().map(|o| shared.redact(&o.name)).collect();
    match ask_person(questions, text, options, wait, shared).await {
        Some(i) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
            req.options[i].option_id.clone(),
        )),
        None => decide(PermissionPolicy::Deny, req),
    }
}

/// Whether `outcome` refuses `req`.
pub(super) fn refuses(req: &RequestPermissionRequest, outcome: &RequestPermissionOutcome) -> bool {
    match outcome {
        RequestPermissionOutcome::Selected(selected) => req
            .options
            .iter()
            .find(|o| o.option_id == selected.option_id)
            .is_none_or(|o| {
                matches!(
                    o.kind,
                    PermissionOptionKind::RejectOnce | PermissionOptionKind::RejectAlways
                )
            }),
        _ => true,
    }
}

/// After a permission request was answered: what it grants later terminals and writes, or,
/// refused, the refusal kept for the answer and shown in the stream as a failed tool call
/// (returned as the event to send).
pub(super) fn settle_permission(
    shared: &Shared,
    req: &RequestPermissionRequest,
    outcome: &RequestPermissionOutcome,
    by: &str,
) -> Option<crate::runner::StreamEvent> {
    let title = title_of(req, "a tool");
    if !refuses(req, outcome) {
        let always = matches!(outcome, RequestPermissionOutcome::Selected(s)
            if req.options.iter().any(|o| o.option_id == s.option_id && o.kind == PermissionOptionKind::AllowAlways));
        match req.tool_call.fields.kind {
            Some(ToolKind::Execute) => {
                if let Some(command) = gate::command_of(req.tool_call.fields.raw_input.as_ref()) {
                    shared.granted.command(command);
                }
                if always {
                    shared.granted.set_always(gate::Act::Terminal);
                }
            }
            Some(ToolKind::Edit) | Some(ToolKind::Delete) | Some(ToolKind::Move) if always => {
                shared.granted.set_always(gate::Act::Write)
            }
            _ => {}
        }
        return None;
    }
    if shared.cancelling.load(Ordering::SeqCst) {
        return None;
    }
    shared
        .refusals
        .add(format!("\"{}\" ({by})", shared.redact(&title)));
    let id = req.tool_call.tool_call_id.0.to_string();
    // A tool announced before its request: its refusal in the stream (one first seen in the
    // request is told by `unannounced_tool`).
    let announced = shared.titles.lock().expect("titles lock").contains_key(&id);
    announced.then(|| {
        let output = format!("refused: the permission was not given ({by})");
        tool_event(req, title, ToolStatus::Failed, Some(output))
    })
}

/// The tool's title in `req`, or `fallback` when it names none.
fn title_of(req: &RequestPermissionRequest, fallback: &str) -> String {
    req.tool_call
        .fields
        .title
        .clone()
        .unwrap_or_else(|| fallback.into())
}

/// The tool of `req` as a `tool_call` event.
fn tool_event(
    req: &RequestPermissionRequest,
    label: String,
    status: ToolStatus,
    output: Option<String>,
) -> crate::runner::StreamEvent {
    crate::runner::StreamEvent::ToolCall {
        id: req.tool_call.tool_call_id.0.to_string(),
        label,
        status,
        input: super::updates::json_text(&req.tool_call.fields.raw_input),
        output,
    }
}

/// The option to pick for a permission request under `policy`, chosen by kind. `ask` without
/// anyone to ask behaves as `read_only`.
pub(super) fn decide(
    policy: PermissionPolicy,
    req: &RequestPermissionRequest,
) -> RequestPermissionOutcome {
    let read_only = matches!(
        req.tool_call.fields.kind,
        Some(ToolKind::Read) | Some(ToolKind::Search) | Some(ToolKind::Think)
    );
    let allow = match policy {
        PermissionPolicy::Allow => true,
        PermissionPolicy::ReadOnly | PermissionPolicy::Ask => read_only,
        PermissionPolicy::Deny => false,
    };
    let kinds: &[PermissionOptionKind] = if allow {
        &[
            PermissionOptionKind::AllowOnce,
            PermissionOptionKind::AllowAlways,
        ]
    } else {
        &[
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ]
    };
    kinds
        .iter()
        .find_map(|kind| req.options.iter().find(|o| o.kind == *kind))
        .map(|o| {
            RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(o.option_id.clone()))
        })
        .unwrap_or(RequestPermissionOutcome::Cancelled)
}

/// A tool the agent announced only inside its permission request (Gemini does), as a
/// `tool_call` event: refused, or running when allowed. `None` for a tool announced before.
pub(super) fn unannounced_tool(
    shared: &Shared,
    req: &RequestPermissionRequest,
    outcome: &RequestPermissionOutcome,
) -> Option<crate::runner::StreamEvent> {
    let id = req.tool_call.tool_call_id.0.to_string();
    let title = title_of(req, "tool");
    {
        let mut titles = shared.titles.lock().expect("titles lock");
        if titles.contains_key(&id) {
            return None;
        }
        titles.insert(id.clone(), title.clone());
    }
    // A tool call first seen here is a step, as any tool call.
    shared.step();
    let refused = refuses(req, outcome);
    let status = if refused {
        ToolStatus::Failed
    } else {
        ToolStatus::Running
    };
    let output = refused.then(|| "refused: the permission was not given".to_string());
    Some(tool_event(req, title, status, output))
}
