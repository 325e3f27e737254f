//! How an ACP run ended, in the runner's terms: the answer, or why there is none in words the
//! sender can act on (the agent's own where it gave any).

use super::*;

/// How the agent's process ended: its exit status, the tail of its stderr, and when it began.
pub(super) struct Exit {
    pub(super) status: Option<std::process::ExitStatus>,
    pub(super) stderr: String,
    pub(super) started: Instant,
}

/// The run's result from what the session driver found (`driven`) and how the process ended.
pub(super) fn judge(
    driven: Result<Driven, agent_client_protocol::Error>,
    exit: Exit,
    shared: &Shared,
    profile: &Profile,
) -> Result<RunOutput, RunError> {
    let Exit {
        status,
        stderr: stderr_text,
        started,
    } = exit;
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
        Ok(Driven::Stopped { stop, session_id }) => {
            stopped(stop, session_id, shared, profile, started)
        }
        Ok(Driven::NotLoggedIn(detail)) => Err(not_logged_in(&detail)),
        Ok(Driven::SessionRefused(detail)) => Err(session_refused(&detail, profile)),
        Ok(Driven::TimedOut) => Err(RunError::TimedOut(profile.timeout)),
        Ok(Driven::Cancelled) => Err(RunError::Cancelled),
        Ok(Driven::InitTimedOut) => Err(failed(format!(
            "did not answer initialize within {}s",
            profile.init_timeout.as_secs()
        ))),
        // Its provider's usage limit (issue 45), whichever way the process ended.
        Ok(Driven::PromptFailed(e)) if usage_limit(&e).is_some() => {
            Err(usage_limit(&e).unwrap_or(RunError::Cancelled))
        }
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

/// The agent ended its turn: its answer, or what stopped it.
fn stopped(
    stop: StopReason,
    session_id: String,
    shared: &Shared,
    profile: &Profile,
    started: Instant,
) -> Result<RunOutput, RunError> {
    match stop {
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
            let (output, truncated) = crate::runner::cap(
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
    }
}

/// An agent's JSON-RPC error in words: its message, and the details adapters put in `data`
/// (`{"details": "Claude Code process exited with code 1"}`).
pub(super) fn agent_error(e: &agent_client_protocol::Error) -> String {
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

/// The usage limit an adapter's failed `session/prompt` tells of: claude-agent-acp 0.49 sends
/// -32603 "Internal error: " and Claude Code's words ("You've hit your session limit · resets
/// 5:58pm (UTC)") with `data.errorKind` "rate_limit"; others are read by their words
/// (`runner::limit`).
pub(super) fn usage_limit(e: &agent_client_protocol::Error) -> Option<RunError> {
    let kind = e
        .data
        .as_ref()
        .and_then(|d| d.get("errorKind"))
        .and_then(|k| k.as_str());
    let said = agent_error(e);
    let said = said.strip_prefix("Internal error: ").unwrap_or(&said);
    let stated = (kind == Some("rate_limit")).then_some(None);
    match crate::runner::limit::or_failure(said, stated, RunError::Cancelled) {
        RunError::Cancelled => None,
        limit => Some(limit),
    }
}

pub(super) fn not_logged_in(detail: &str) -> RunError {
    RunError::NotLoggedIn(detail.to_string())
}

pub(super) fn session_refused(detail: &str, profile: &Profile) -> RunError {
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

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn an_adapters_rate_limit_error_is_a_usage_limit() {
        // What claude-agent-acp 0.49 answers `session/prompt` with when Claude Code hit it.
        let e = agent_client_protocol::Error::new(
            -32603,
            "Internal error: You've hit your session limit · resets 5pm (UTC)",
        )
        .data(serde_json::json!({"errorKind": "rate_limit"}));
        let Some(RunError::UsageLimit { said, resets }) = usage_limit(&e) else {
            panic!("not a limit")
        };
        assert_eq!(said, "You've hit your session limit · resets 5pm (UTC)");
        assert!(resets.is_some());
        // The kind alone is enough, without a time.
        let e = agent_client_protocol::Error::new(-32603, "Internal error: slow down")
            .data(serde_json::json!({"errorKind": "rate_limit"}));
        assert!(matches!(
            usage_limit(&e),
            Some(RunError::UsageLimit { resets: None, .. })
        ));
        let e = agent_client_protocol::Error::new(-32603, "Internal error: something broke");
        assert!(usage_limit(&e).is_none());
    }
}
