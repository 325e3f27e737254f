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
