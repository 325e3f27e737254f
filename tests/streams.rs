//! The CLI stream formats: each recorded stream through the parser, and through the runner
//! with a scripted CLI that prints it the way the real CLI would.

mod support;

use std::path::{Path, PathBuf};

use aamp_bridge::runner::stream::{StreamEvent, StreamFormat, StreamParser, ToolStatus};
use aamp_bridge::runner::{Profile, RunError, RunOutput, TaskInput};
use tokio_util::sync::CancellationToken;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/streams")
        .join(name)
}

fn parse(format: StreamFormat, name: &str) -> (Vec<StreamEvent>, StreamParser) {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let mut parser = StreamParser::new(format);
    let mut events: Vec<StreamEvent> = text.lines().flat_map(|l| parser.line(l)).collect();
    events.extend(parser.finish());
    (events, parser)
}

fn tools(events: &[StreamEvent]) -> Vec<(String, String, ToolStatus)> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCall {
                id, label, status, ..
            } => Some((id.clone(), label.clone(), *status)),
            _ => None,
        })
        .collect()
}

#[test]
fn claude_partial_messages_stream_each_delta_once() {
    let (events, parser) = parse(StreamFormat::Claude, "claude-partial.jsonl");
    assert_eq!(
        support::text_of(&events),
        "Let me check.There are two entries: README.md and src.",
        "no text twice"
    );
    assert_eq!(
        parser.session_id.as_deref(),
        Some("3f0c2a52-claude-session")
    );
    assert!(parser.end.finished && parser.end.error.is_none());
    assert_eq!(
        parser.end.final_text.as_deref(),
        Some("There are two entries: README.md and src.")
    );
    let todo = events
        .iter()
        .find_map(|e| {
            if let StreamEvent::Todo(items) = e {
                Some(items.clone())
            } else {
                None
            }
        })
        .unwrap();
    assert_eq!(todo.len(), 2);
    assert_eq!(
        (todo[0].content.as_str(), todo[0].status.as_str()),
        ("List files", "in_progress")
    );
    assert_eq!(
        tools(&events),
        vec![
            ("toolu_1".into(), "TodoWrite".into(), ToolStatus::Running),
            ("toolu_1".into(), "TodoWrite".into(), ToolStatus::Completed),
            ("toolu_2".into(), "Bash".into(), ToolStatus::Running),
            ("toolu_2".into(), "Bash".into(), ToolStatus::Completed),
        ]
    );
    let bash_output = events.iter().find_map(|e| match e {
        StreamEvent::ToolCall {
            id,
            output: Some(o),
            ..
        } if id == "toolu_2" => Some(o.clone()),
        _ => None,
    });
    assert_eq!(bash_output.as_deref(), Some("README.md\nsrc"));
}

/// Issue 20: Claude Code 2.x plans with TaskCreate/TaskUpdate, not TodoWrite; no `todo` event
/// came. Recorded from the real Claude Code 2.1.197 against tests/hosts/model_api.py (`plan:`).
#[test]
fn claude_code_2_task_tools_become_todo_events() {
    let (events, parser) = parse(StreamFormat::Claude, "claude-tasks.jsonl");
    let todos: Vec<Vec<(String, String, String)>> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Todo(items) => Some(
                items
                    .iter()
                    .map(|t| (t.id.clone(), t.content.clone(), t.status.clone()))
                    .collect(),
            ),
            _ => None,
        })
        .collect();
    let item = |id: &str, content: &str, status: &str| {
        (id.to_string(), content.to_string(), status.to_string())
    };
    assert_eq!(
        todos,
        vec![
            vec![item("new-1", "write the tests", "pending")],
            vec![
                item("new-1", "write the tests", "pending"),
                item("new-2", "run them", "pending")
            ],
            // The results named the ids (#1, #2); the update finds its task by them.
            vec![
                item("1", "write the tests", "completed"),
                item("2", "run them", "pending")
            ],
        ]
    );
    // The answer is Claude's own final result, not what it said before its tool calls.
    assert_eq!(
        parser.end.final_text.as_deref(),
        Some("All done. The plan is finished.")
    );
}

#[test]
fn claude_whole_messages_skip_thinking_and_subagents() {
    let (events, parser) = parse(StreamFormat::Claude, "claude-whole.jsonl");
    assert_eq!(support::text_of(&events), "Part one. Part two.");
    assert_eq!(
        parser.end.final_text.as_deref(),
        Some("Part one. Part two.")
    );
}

#[test]
fn claude_errors_are_read_from_the_result_not_its_subtype() {
    let (_, parser) = parse(StreamFormat::Claude, "claude-not-logged-in.jsonl");
    assert_eq!(
        parser.end.error.as_deref(),
        Some("Not logged in · Please run /login")
    );
    let (_, parser) = parse(StreamFormat::Claude, "claude-max-turns.jsonl");
    assert_eq!(
        parser.end.error.as_deref(),
        Some("Reached maximum number of turns (10)")
    );
    // Issue 32: Qwen Code (Claude's stream) puts its reason in an error object; it was read
    // as "claude ended with error_during_execution".
    let (_, parser) = parse(StreamFormat::Claude, "qwen-no-auth.jsonl");
    assert_eq!(
        parser.end.error.as_deref(),
        Some("No auth type is selected. Please configure an auth type (e.g. via settings or `--auth-type`) before running in non-interactive mode.")
    );
}

#[test]
fn codex_items_become_tools_todos_and_a_final_message() {
    let (events, parser) = parse(StreamFormat::Codex, "codex.jsonl");
    assert_eq!(parser.session_id.as_deref(), Some("0199-codex-thread"));
    assert!(
        parser.end.finished && parser.end.error.is_none(),
        "error events are not fatal"
    );
    assert_eq!(
        parser.end.final_text.as_deref(),
        Some("Two entries: README.md and src.")
    );
    assert_eq!(
        tools(&events),
        vec![
            (
                "item_2".into(),
                "Run: bash -lc ls".into(),
                ToolStatus::Running
            ),
            (
                "item_2".into(),
                "Run: bash -lc ls".into(),
                ToolStatus::Completed
            ),
            (
                "item_3".into(),
                "Edit: notes.md".into(),
                ToolStatus::Completed
            ),
        ]
    );
    let todos: Vec<_> = events
        .iter()
        .filter_map(|e| {
            if let StreamEvent::Todo(items) = e {
                Some(items.clone())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(todos.len(), 2);
    assert!(todos[1].iter().all(|t| t.status == "completed"));
    let (_, parser) = parse(StreamFormat::Codex, "codex-failed.jsonl");
    assert_eq!(
        parser.end.error.as_deref(),
        Some("stream disconnected before completion: rate limited")
    );
}

#[test]
fn gemini_deltas_tools_and_todos() {
    let (events, parser) = parse(StreamFormat::Gemini, "gemini.jsonl");
    assert_eq!(parser.session_id.as_deref(), Some("2a493108-gemini"));
    assert_eq!(
        support::text_of(&events),
        "Checking... done: README.md and src."
    );
    // Issue 20: the answer is what Gemini said after its last tool call; what it said
    // before is progress, in the stream.
    assert_eq!(
        parser.end.final_text.as_deref(),
        Some("... done: README.md and src.")
    );
    assert!(
        parser.end.error.is_none(),
        "a warning does not fail the run"
    );
    assert!(events
        .iter()
        .any(|e| matches!(e, StreamEvent::Todo(items) if items.len() == 2)));
    assert_eq!(
        tools(&events),
        vec![
            ("t1".into(), "write_todos".into(), ToolStatus::Running),
            ("t1".into(), "write_todos".into(), ToolStatus::Completed),
            ("t2".into(), "list_directory".into(), ToolStatus::Running),
            ("t2".into(), "list_directory".into(), ToolStatus::Failed),
        ]
    );
    let (_, parser) = parse(StreamFormat::Gemini, "gemini-error.jsonl");
    assert_eq!(
        parser.end.error.as_deref(),
        Some("Reached max session turns")
    );
}

#[test]
fn generic_ndjson_and_sse() {
    let (events, parser) = parse(StreamFormat::Ndjson, "generic.ndjson");
    assert_eq!(support::text_of(&events), "Hello world");
    assert_eq!(parser.session_id.as_deref(), Some("gen-1"));
    assert_eq!(tools(&events).len(), 2);
    assert!(parser.end.finished);
    assert_eq!(parser.end.final_text.as_deref(), Some("Hello world"));
    let (events, parser) = parse(StreamFormat::Sse, "generic.sse");
    assert_eq!(support::text_of(&events), "multi-line");
    assert_eq!(parser.session_id.as_deref(), Some("sse-1"));
    assert_eq!(
        parser.end.final_text.as_deref(),
        Some("multi-line"),
        "an event without a closing blank line still counts"
    );
}

#[test]
fn the_answer_kept_from_a_stream_is_capped_while_it_grows() {
    let mut parser = StreamParser::with_limit(StreamFormat::Ndjson, 100);
    let mut deltas = 0;
    for _ in 0..1000 {
        let line = serde_json::json!({"type": "delta", "text": "é".repeat(30)}).to_string();
        deltas += parser.line(&line).len();
    }
    parser.finish();
    let text = parser.end.final_text.unwrap_or_default();
    assert!(text.len() <= 100, "{} bytes kept", text.len());
    assert!(parser.text_cut);
    assert_eq!(deltas, 1000, "every delta still streams");
    let mut sse = StreamParser::with_limit(StreamFormat::Sse, 100);
    for _ in 0..1000 {
        sse.line(&format!("data: {}", "x".repeat(50)));
    }
    assert!(sse.text_cut, "an event's data is capped too");
}

// --- through the runner, with the scripted CLI -------------------------------------------

fn scripted(format: &str, script_args: &[&str], extra: &str) -> Profile {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/scripted_cli.py");
    let mut args = vec![script.display().to_string()];
    args.extend(script_args.iter().map(|a| a.to_string()));
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    Profile::parse(
        &format!("command = \"python3\"\nargs = [{}]\nstdin = \"{{{{prompt}}}}\"\nstream = \"{format}\"\n{extra}", args.join(", ")),
        "scripted",
        "test",
    )
    .unwrap()
}

async fn run(
    profile: &Profile,
    resume_id: Option<&str>,
) -> (Result<RunOutput, RunError>, Vec<StreamEvent>) {
    let dir = tempfile::tempdir().unwrap();
    let task = TaskInput {
        agent: "tester".into(),
        task_id: "t-1".into(),
        prompt: "list the files".into(),
        session_key: Some("thread".into()),
        resume_id: resume_id.map(str::to_string),
        fresh_prompt: None,
        workspace: dir.path().to_path_buf(),
        questions: None,
        env: Vec::new(),
        on_spawn: None,
        mcp: None,
    };
    support::run_collecting(profile, &task, &CancellationToken::new()).await
}

#[tokio::test]
async fn a_claude_format_cli_gives_its_answer_events_and_session() {
    let fx = fixture("claude-partial.jsonl");
    let profile = scripted("claude", &[fx.to_str().unwrap()], "");
    let (result, events) = run(&profile, None).await;
    let out = result.unwrap();
    assert_eq!(out.output, "There are two entries: README.md and src.");
    assert_eq!(out.session_id.as_deref(), Some("3f0c2a52-claude-session"));
    assert_eq!(
        support::text_of(&events),
        "Let me check.There are two entries: README.md and src."
    );
    assert!(events.iter().any(|e| matches!(e, StreamEvent::Todo(_))));
}

#[tokio::test]
async fn a_stream_error_wins_over_the_exit_status() {
    let fx = fixture("claude-not-logged-in.jsonl");
    let profile = scripted("claude", &[fx.to_str().unwrap(), "--exit", "1"], "");
    let err = run(&profile, None).await.0.unwrap_err();
    assert!(
        matches!(&err, RunError::Reported(m) if m == "Not logged in · Please run /login"),
        "{err}"
    );
}

#[tokio::test]
async fn a_run_with_no_json_reports_stderr_and_the_exit_code() {
    let profile = scripted(
        "gemini",
        &[
            "--exit",
            "41",
            "--stderr",
            "When using Gemini API, you must specify the GEMINI_API_KEY environment variable.",
        ],
        "",
    );
    let err = run(&profile, None).await.0.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("exited with status 41") && text.contains("GEMINI_API_KEY"),
        "{text}"
    );
}

/// Issue 30, item 6: Codex's sandbox refusals left no trace but the model's own words. A
/// command its read-only sandbox stopped, or one it declined, is a failed tool call and is
/// named in the answer's note; a command that failed for its own reasons is not.
#[tokio::test]
async fn codexs_sandbox_refusals_are_failed_tools_and_named_in_the_answer() {
    let (events, parser) = parse(StreamFormat::Codex, "codex-sandboxed.jsonl");
    let finished: Vec<_> = tools(&events)
        .into_iter()
        .filter(|(_, _, status)| *status != ToolStatus::Running)
        .collect();
    assert!(
        finished.iter().all(|(_, _, s)| *s == ToolStatus::Failed),
        "{finished:?}"
    );
    assert_eq!(parser.end.refused.len(), 2, "{:?}", parser.end.refused);
    let fx = fixture("codex-sandboxed.jsonl");
    let profile = scripted("codex", &[fx.to_str().unwrap()], "");
    let out = run(&profile, None).await.0.unwrap();
    assert_eq!(
        out.output,
        "I could not make the file.\n\n(aamp-bridge: refused during this task: \"bash -lc 'touch made-by-agent'\" (stopped by Codex's read-only sandbox); \"bash -lc 'rm -rf build'\" (declined by Codex's approval policy))"
    );
}

#[tokio::test]
async fn a_cli_lingering_after_its_result_is_stopped_and_its_answer_kept() {
    let fx = fixture("codex.jsonl");
    let profile = scripted(
        "codex",
        &[fx.to_str().unwrap(), "--linger", "600"],
        "linger_secs = 1",
    );
    let started = std::time::Instant::now();
    let out = run(&profile, None).await.0.unwrap();
    assert_eq!(out.output, "Two entries: README.md and src.");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "stopped after the linger time"
    );
}

#[tokio::test]
async fn resuming_uses_the_resume_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("argv.jsonl");
    let fx = fixture("codex.jsonl");
    let r = record.to_str().unwrap();
    let profile = scripted(
        "codex",
        &[fx.to_str().unwrap(), "--record", r, "exec", "--json", "-"],
        &format!("args_when_resuming = [{:?}, {:?}, {:?}, {:?}, {:?}, \"resume\", \"{{{{resume_id}}}}\", \"-\"]", Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/scripted_cli.py").display(), fx.display(), "--record", r, "exec"),
    );
    run(&profile, None).await.0.unwrap();
    run(&profile, Some("0199-codex-thread")).await.0.unwrap();
    let runs: Vec<serde_json::Value> = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2);
    assert!(!runs[0]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "resume"));
    let second: Vec<&str> = runs[1]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        second.ends_with(&["exec", "resume", "0199-codex-thread", "-"]),
        "{second:?}"
    );
    assert_eq!(runs[1]["stdin"], "list the files");
}

/// Issue 43: under `read_only` a Codex write came back a plain "Done." (completed): a command
/// whose output says "Read-only file system" though it exited 0, and an edit Codex did not
/// make, are named in the answer.
#[tokio::test]
async fn a_quiet_codex_read_only_refusal_is_named_in_the_answer() {
    let (_, parser) = parse(StreamFormat::Codex, "codex-readonly-quiet.jsonl");
    assert_eq!(parser.end.refused.len(), 2, "{:?}", parser.end.refused);
    let fx = fixture("codex-readonly-quiet.jsonl");
    let profile = scripted("codex", &[fx.to_str().unwrap()], "");
    let out = run(&profile, None).await.0.unwrap();
    assert!(
        out.output.starts_with("Done.\n\n(aamp-bridge: refused during this task: \"bash -lc 'touch notes.txt; echo done'\" (stopped by Codex's read-only sandbox); an edit of /w/src/lib.rs"),
        "{}",
        out.output
    );
}
