//! The ACP runner against agents we did not write: one on the official TypeScript SDK (npm
//! `@agentclientprotocol/sdk`), one on the official Python SDK (PyPI `agent-client-protocol`),
//! and the real Gemini CLI (`gemini --acp`, npm `@google/gemini-cli`). `scripts/test-agents.sh`
//! installs them on first use.

mod support;

use std::path::{Path, PathBuf};

use aamp_bridge::runner::acp::probe;
use aamp_bridge::runner::stream::{StreamEvent, ToolStatus};
use aamp_bridge::runner::{run, Profile, RunError, RunOutput, TaskInput};
use tokio_util::sync::CancellationToken;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn agents_dir() -> &'static PathBuf {
    support::test_agents()
}

fn acp_profile(command: &Path, args: &[&Path], env: &[(&str, &str)]) -> Profile {
    let args: Vec<String> = args
        .iter()
        .map(|a| format!("{:?}", a.display().to_string()))
        .collect();
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k} = {v:?}")).collect();
    Profile::parse(
        &format!(
            "kind = \"acp\"\ncommand = {:?}\nargs = [{}]\nenv = {{ {} }}\ninit_timeout_secs = 60\n",
            command.display().to_string(),
            args.join(", "),
            env.join(", ")
        ),
        "third-party",
        "test",
    )
    .unwrap()
}

async fn run_task(
    profile: &Profile,
    prompt: &str,
    cancel: &CancellationToken,
) -> (Result<RunOutput, RunError>, Vec<StreamEvent>) {
    let dir = tempfile::tempdir().unwrap();
    let task = TaskInput {
        agent: "t".into(),
        task_id: "t-1".into(),
        prompt: prompt.into(),
        session_key: None,
        resume_id: None,
        fresh_prompt: None,
        workspace: dir.path().to_path_buf(),
        questions: None,
        env: Vec::new(),
        on_spawn: None,
        mcp: None,
    };
    support::run_collecting(profile, &task, cancel).await
}

fn ts_sdk_agent() -> Profile {
    let entry =
        agents_dir().join("npm/node_modules/@agentclientprotocol/sdk/dist/v1/stable/acp.js");
    acp_profile(
        Path::new("node"),
        &[&repo().join("tests/agents/sdk_agent.mjs")],
        &[("ACP_SDK_ENTRY", entry.to_str().unwrap())],
    )
}

#[tokio::test]
async fn an_agent_on_the_typescript_sdk_answers() {
    let (result, events) = run_task(
        &ts_sdk_agent(),
        "Summarise the diff.",
        &CancellationToken::new(),
    )
    .await;
    let out = result.unwrap();
    assert_eq!(out.output, "ts-sdk: Summarise the diff.");
    assert_eq!(out.session_id.as_deref(), Some("ts-sdk-1"));
    let statuses: Vec<ToolStatus> = events
        .iter()
        .filter_map(|e| {
            if let StreamEvent::ToolCall { status, .. } = e {
                Some(*status)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(statuses, vec![ToolStatus::Running, ToolStatus::Completed]);
}

#[tokio::test]
async fn an_agent_on_the_typescript_sdk_honours_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let task = TaskInput {
        agent: "t".into(),
        task_id: "t-1".into(),
        prompt: "TAKE-YOUR-TIME please".into(),
        session_key: None,
        resume_id: None,
        fresh_prompt: None,
        workspace: dir.path().to_path_buf(),
        questions: None,
        env: Vec::new(),
        on_spawn: None,
        mcp: None,
    };
    let profile = ts_sdk_agent();
    let cancel = CancellationToken::new();
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    // The agent reports its tool call once the prompt runs: cancel then.
    let trigger = async {
        while let Some(event) = rx.recv().await {
            if matches!(event, StreamEvent::ToolCall { .. }) {
                cancel.cancel();
            }
        }
    };
    let go = async {
        let r = run(&profile, &task, &cancel, &tx).await;
        drop(tx);
        r
    };
    let (result, ()) = tokio::join!(go, trigger);
    assert!(matches!(result, Err(RunError::Cancelled)), "{result:?}");
}

#[tokio::test]
async fn an_agent_on_the_python_sdk_answers() {
    let python = agents_dir().join("venv/bin/python");
    let profile = acp_profile(
        &python,
        &[&repo().join("tests/agents/py_sdk_agent.py")],
        &[],
    );
    let (result, events) = run_task(&profile, "List the files.", &CancellationToken::new()).await;
    let out = result.unwrap();
    assert_eq!(out.output, "python-sdk: List the files.");
    assert!(events
        .iter()
        .any(|e| matches!(e, StreamEvent::Todo(items) if items[0].content == "Echo the prompt")));
}

#[tokio::test]
async fn the_real_gemini_cli_speaks_acp() {
    let gemini = agents_dir().join("npm/node_modules/.bin/gemini");
    let home = tempfile::tempdir().unwrap();
    let home_str = home.path().to_str().unwrap();
    let scratch = tempfile::tempdir().unwrap();

    // Without credentials: initialize answers; a session is refused, and said so clearly.
    let bare = acp_profile(&gemini, &[Path::new("--acp")], &[("HOME", home_str)]);
    let info = probe(&bare, scratch.path(), false).await.unwrap();
    assert!(
        info.agent
            .as_deref()
            .unwrap_or_default()
            .starts_with("gemini-cli"),
        "{info:?}"
    );
    assert!(
        info.auth_methods.contains(&"gemini-api-key".to_string()),
        "{info:?}"
    );
    let refused = probe(&bare, scratch.path(), true)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("not logged in") && refused.contains("oauth-personal"),
        "{refused}"
    );

    // With an API key in the environment (any value; nothing is sent): authenticate with the
    // key method, never the interactive Google login, then open a session and stop.
    let keyed = acp_profile(
        &gemini,
        &[Path::new("--acp")],
        &[
            ("HOME", home_str),
            ("GEMINI_API_KEY", "dummy-key-for-tests"),
        ],
    );
    let info = probe(&keyed, scratch.path(), true).await.unwrap();
    assert!(
        info.session_id.as_deref().is_some_and(|id| !id.is_empty()),
        "{info:?}"
    );
}
