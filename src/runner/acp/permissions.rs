//! Permission requests answered by the profile's policy, or asked of the dispatcher, without
//! blocking the connection.

use super::*;

/// Hands a permission request to whoever answers questions, and waits for the choice. No
/// answer in time (or nobody listening) rejects.
pub(super) async fn ask(
    questions: &mpsc::Sender<crate::runner::Question>,
    req: &RequestPermissionRequest,
    wait: std::time::Duration,
    shared: &Shared,
) -> RequestPermissionOutcome {
    let title = req
        .tool_call
        .fields
        .title
        .clone()
        .unwrap_or_else(|| "a tool".into());
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
    let (answer, chosen) = tokio::sync::oneshot::channel();
    let question = crate::runner::Question {
        text: format!("The agent asks for permission to use \"{title}\" ({kind}). Which option do you choose?"),
        reason: "The agent needs a permission that this bridge's policy leaves to you.".into(),
        options: req.options.iter().map(|o| o.name.clone()).collect(),
        answer,
    };
    if questions.send(question).await.is_err() {
        return decide(PermissionPolicy::Deny, req);
    }
    match tokio::time::timeout(wait, chosen).await {
        Ok(Ok(crate::runner::Answer::Chosen(i))) if i < req.options.len() => {
            RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                req.options[i].option_id.clone(),
            ))
        }
        Ok(_) => decide(PermissionPolicy::Deny, req),
        Err(_) => {
            tracing::warn!(
                seconds = wait.as_secs(),
                "no answer to the permission question in time; rejecting"
            );
            *shared.unanswered.lock().expect("unanswered lock") = Some(wait.as_secs());
            decide(PermissionPolicy::Deny, req)
        }
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
    let title = req
        .tool_call
        .fields
        .title
        .clone()
        .unwrap_or_else(|| "tool".into());
    {
        let mut titles = shared.titles.lock().expect("titles lock");
        if titles.contains_key(&id) {
            return None;
        }
        titles.insert(id.clone(), title.clone());
    }
    // A tool call first seen here is a step, as any tool call.
    shared.step();
    let refused = match outcome {
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
    };
    Some(crate::runner::StreamEvent::ToolCall {
        id,
        label: title,
        status: if refused {
            crate::runner::stream::ToolStatus::Failed
        } else {
            crate::runner::stream::ToolStatus::Running
        },
        input: super::updates::json_text(&req.tool_call.fields.raw_input),
        output: refused.then(|| "refused: the permission was not given".to_string()),
    })
}
