//! The ACP runner against the project's scripted ACP agent (tests/agents/acp_agent.py), as a
//! real child process speaking JSON-RPC on stdio.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aamp_bridge::runner::stream::{StreamEvent, ToolStatus};
use aamp_bridge::runner::{run, Profile, RunError, RunOutput, TaskInput};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

struct Agent {
    dir: tempfile::TempDir,
    script: PathBuf,
}

impl Agent {
    /// A scripted agent: `script` is merged over the defaults (record and state files in a
    /// fresh folder, which is also the task's workspace).
    fn new(script: Value) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let mut full = json!({
            "record": dir.path().join("messages.jsonl"),
            "state": dir.path().join("sessions.json"),
        });
        for (k, v) in script.as_object().unwrap() {
            full[k] = v.clone();
        }
        let script = dir.path().join("script.json");
        std::fs::write(&script, full.to_string()).unwrap();
        Agent { dir, script }
    }

    fn profile(&self, extra: &str) -> Profile {
        let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/acp_agent.py");
        Profile::parse(
            &format!(
                "kind = \"acp\"\ncommand = \"python3\"\nargs = [{:?}, {:?}]\nenv = {{ ACP_TEST_SCRIPT = {:?} }}\n{extra}",
                agent.display(),
                self.script.display(),
                self.script.display()
            ),
            "acp-test",
            "test",
        )
        .unwrap()
    }

    fn workspace(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    /// The messages the agent received, by method.
    fn received(&self, method: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("messages.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|m| m["method"] == method)
            .collect()
    }

    /// Processes still running this agent's script.
    fn leftovers(&self) -> Vec<String> {
        let marker = self.script.to_str().unwrap();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(marker))
            .collect()
    }

    async fn run(
        &self,
        profile: &Profile,
        resume_id: Option<&str>,
        cancel: &CancellationToken,
    ) -> (Result<RunOutput, RunError>, Vec<StreamEvent>) {
        let task = TaskInput {
            agent: "acp".into(),
            task_id: "t-1".into(),
            prompt: "Do the task.".into(),
            session_key: Some("k".into()),
            resume_id: resume_id.map(str::to_string),
            fresh_prompt: None,
            workspace: self.workspace(),
            questions: None,
            env: Vec::new(),
            on_spawn: None,
            mcp: None,
        };
        let out = support::run_collecting(profile, &task, cancel).await;
        assert_eq!(
            self.leftovers(),
            Vec::<String>::new(),
            "agent processes left behind"
        );
        out
    }
}

#[tokio::test]
async fn updates_become_stream_events_and_the_answer() {
    let agent = Agent::new(json!({"steps": [
        {"think": "secret reasoning"},
        {"plan": [["Read the code", "in_progress"], ["Write the fix", "pending"]]},
        {"plan": [["Read the code", "in_progress"], ["Write the fix", "pending"]]},
        {"say": "Looking. "},
        {"tool": {"id": "c1", "title": "Run tests", "kind": "execute", "input": {"cmd": "cargo test"}}},
        {"tool_done": {"id": "c1", "output": "12 passed"}},
        {"diff": {"id": "c2", "path": "/w/src/lib.rs", "old": "a\nb", "new": "a\nb\nc"}},
        {"unknown_update": true},
        {"say": "All green."}
    ]}));
    let (result, events) = agent
        .run(&agent.profile(""), None, &CancellationToken::new())
        .await;
    let out = result.unwrap();
    // Issue 20: the answer is what the agent said after its last tool call (what came before
    // is progress, in the stream); thoughts never reach it.
    assert_eq!(out.output, "All green.");
    assert!(out.session_id.as_deref().unwrap().starts_with("sess-"));
    assert_eq!(support::text_of(&events), "Looking. All green.");
    assert!(events.iter().any(|e| matches!(e, StreamEvent::Todo(items) if items.len() == 2 && items[0].status == "in_progress")));
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, StreamEvent::Todo(_)))
            .count(),
        1,
        "the same plan sent twice (as claude-agent-acp does) is one event"
    );
    let tools: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCall {
                id,
                label,
                status,
                input,
                output,
            } => Some((
                id.as_str(),
                label.as_str(),
                *status,
                input.clone(),
                output.clone(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        tools[0],
        (
            "c1",
            "Run tests",
            ToolStatus::Running,
            Some(r#"{"cmd":"cargo test"}"#.into()),
            None
        )
    );
    assert_eq!(
        tools[1],
        (
            "c1",
            "Run tests",
            ToolStatus::Completed,
            None,
            Some("12 passed".into())
        )
    );
    assert_eq!(
        tools[2].4.as_deref(),
        Some("edited /w/src/lib.rs: 2 lines → 3 lines")
    );
    // Under the default policy (read_only) the agent is offered reads only: no writes, no
    // terminals (issue 30: what the policy refuses is not offered).
    let init = &agent.received("initialize")[0]["params"];
    assert_eq!(
        init["clientCapabilities"]["fs"],
        json!({"readTextFile": true, "writeTextFile": false})
    );
    assert_eq!(init["clientCapabilities"]["terminal"], false);
    let prompt = &agent.received("session/prompt")[0]["params"]["prompt"][0]["text"];
    assert_eq!(prompt, "Do the task.", "the prompt goes over stdio");
}

#[tokio::test]
async fn permissions_follow_the_policy() {
    let steps = json!({"steps": [
        {"permission": {"id": "edit", "title": "Edit a file", "kind": "edit"}},
        {"permission": {"id": "read", "title": "Read a file", "kind": "read"}}
    ]});
    for (policy, expected, note) in [
        ("read_only", "permission edit: no permission read: yes", "\n\n(aamp-bridge: refused during this task: \"Edit a file\" (permissions = \"read_only\"))"),
        ("allow", "permission edit: yes permission read: yes", ""),
        ("deny", "permission edit: no permission read: no", "\n\n(aamp-bridge: refused during this task: \"Edit a file\" (permissions = \"deny\"); \"Read a file\" (permissions = \"deny\"))"),
    ] {
        let agent = Agent::new(steps.clone());
        let (out, events) = agent
            .run(
                &agent.profile(&format!("permissions = \"{policy}\"")),
                None,
                &CancellationToken::new(),
            )
            .await;
        // What the agent said of each: the answer is what came after the last tool.
        assert_eq!(
            support::text_of(&events).trim(),
            expected,
            "policy {policy}"
        );
        // Issue 30: and what the policy refused is said after it.
        let out = out.unwrap().output;
        let answer = out.strip_suffix(note).unwrap_or_else(|| panic!("policy {policy}: {out}"));
        assert!(expected.ends_with(answer), "policy {policy}: {out}");
    }
}

/// Issue 20: Gemini announces a tool only inside its permission request; after a refusal no
/// `tool_call` event was sent, so the refused tool was invisible in the stream.
#[tokio::test]
async fn a_tool_announced_only_by_its_permission_request_is_in_the_stream() {
    let agent = Agent::new(json!({"steps": [
        {"permission": {"id": "edit", "title": "Edit a file", "kind": "edit"}},
        {"permission": {"id": "read", "title": "Read a file", "kind": "read"}}
    ]}));
    let (result, events) = agent
        .run(
            &agent.profile("permissions = \"read_only\""),
            None,
            &CancellationToken::new(),
        )
        .await;
    result.unwrap();
    let tools: Vec<(String, String, ToolStatus, Option<String>)> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCall {
                id,
                label,
                status,
                output,
                ..
            } => Some((id.clone(), label.clone(), *status, output.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        tools,
        vec![
            (
                "edit".into(),
                "Edit a file".into(),
                ToolStatus::Failed,
                Some("refused: the permission was not given".into())
            ),
            (
                "read".into(),
                "Read a file".into(),
                ToolStatus::Running,
                None
            ),
        ]
    );
}

/// Issue 20: `permissions = "read_only"` did not hold for codex-acp 2.6, whose default mode
/// edits the workspace without asking. The profile names the agent's own mode for each
/// policy, set before the task; an agent that will not take it does not run the task.
#[tokio::test]
async fn the_policy_is_also_set_as_the_agents_own_mode() {
    let agent =
        Agent::new(json!({"modes": ["read-only", "workspace-write"], "steps": [{"say": "done"}]}));
    let modes = "\n[modes]\nread_only = \"read-only\"\nallow = \"workspace-write\"\n";
    let out = agent
        .run(
            &agent.profile(&format!("permissions = \"read_only\"{modes}")),
            None,
            &CancellationToken::new(),
        )
        .await
        .0
        .unwrap();
    assert_eq!(out.output, "done");
    let set = agent.received("session/set_mode");
    assert_eq!(set.len(), 1);
    assert_eq!(set[0]["params"]["modeId"], "read-only");
    // No mode named for the policy: none set.
    let agent = Agent::new(json!({"modes": ["read-only"], "steps": [{"say": "done"}]}));
    agent
        .run(
            &agent.profile(&format!("permissions = \"deny\"{modes}")),
            None,
            &CancellationToken::new(),
        )
        .await
        .0
        .unwrap();
    assert!(agent.received("session/set_mode").is_empty());
    // A mode the agent does not take: refused, saying which.
    let agent = Agent::new(json!({"modes": [], "steps": [{"say": "done"}]}));
    let err = agent
        .run(
            &agent.profile(&format!("permissions = \"read_only\"{modes}")),
            None,
            &CancellationToken::new(),
        )
        .await
        .0
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"read-only\"") && err.contains("Unknown mode"),
        "{err}"
    );
    assert!(
        agent.received("session/prompt").is_empty(),
        "the task did not run"
    );
}

/// Issue 30, item 7: the shipped codex-acp profile named `workspace-write` for `allow`, which
/// Zed's codex-acp calls `auto`, so it refused the mode and no task ran. A profile names a
/// mode by each adapter's name; the first the agent offers is set, and an agent that offers
/// none of them is refused with what it offers.
#[tokio::test]
async fn a_mode_is_chosen_by_the_names_the_agent_offers() {
    let zed_modes = json!(["read-only", "auto", "full-access"]);
    let agent =
        Agent::new(json!({"modes": zed_modes, "offer_modes": true, "steps": [{"say": "done"}]}));
    let shipped = aamp_bridge::runner::Profile::find("codex-acp", &[]).unwrap();
    let modes = "\n[modes]\nallow = [\"workspace-write\", \"auto\"]\n";
    assert_eq!(
        shipped.modes[&aamp_bridge::runner::PermissionPolicy::Allow],
        vec!["workspace-write", "auto"],
        "the shipped profile names both"
    );
    let out = agent
        .run(
            &agent.profile(&format!("permissions = \"allow\"{modes}")),
            None,
            &CancellationToken::new(),
        )
        .await
        .0
        .unwrap();
    assert!(out.output.ends_with("done"), "{}", out.output);
    let set = agent.received("session/set_mode");
    assert_eq!(set.len(), 1);
    assert_eq!(set[0]["params"]["modeId"], "auto");
    // None of the names offered: refused before the task, naming what it offers.
    let agent =
        Agent::new(json!({"modes": zed_modes, "offer_modes": true, "steps": [{"say": "done"}]}));
    let err = agent
        .run(
            &agent.profile("permissions = \"allow\"\n[modes]\nallow = \"workspace-write\"\n"),
            None,
            &CancellationToken::new(),
        )
        .await
        .0
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("offers none of the modes") && err.contains("read-only, auto, full-access"),
        "{err}"
    );
    assert!(agent.received("session/set_mode").is_empty());
    assert!(agent.received("session/prompt").is_empty());
}

/// Issue 20: codex-acp 2.6 runs its commands in client terminals even when the client says it
/// has none, so their output was only in metadata. The bridge offers terminals: confined to
/// the workspace, bounded, without a shell, and stopped with the task.
#[tokio::test]
async fn commands_run_in_the_bridges_terminals_within_the_workspace() {
    let marker = format!("terminal-sleep-{}", std::process::id());
    let agent = Agent::new(json!({"steps": [
        {"terminal": {"id": "t1", "command": "sh", "args": ["-c", "echo hi; echo oops >&2; exit 3"]}},
        {"terminal": {"id": "t2", "command": "pwd", "cwd": "/etc"}},
        {"terminal": {"id": "t3", "command": "python3", "args": ["-c", "print('x' * 5000)"], "limit": 100}},
        {"terminal": {"id": "t4", "command": "sh", "args": ["-c", format!("exec -a {marker} sleep 300")], "wait": false, "release": false}},
        {"say": "done"}
    ]}));
    let (result, events) = agent
        .run(
            &agent.profile("permissions = \"allow\""),
            None,
            &CancellationToken::new(),
        )
        .await;
    let out = result.unwrap();
    assert_eq!(out.output, "done");
    let said = support::text_of(&events);
    assert!(said.contains("exit 3: hi\noops"), "{said}");
    assert!(
        said.contains("terminal refused: /etc is outside the task's workspace"),
        "{said}"
    );
    assert!(
        said.contains(&format!("exit 0: [cut] {}", "x".repeat(99))),
        "bounded: {said}"
    );
    // The tool's output is in the stream, read from the terminal.
    let t1_output = events.iter().find_map(|e| match e {
        StreamEvent::ToolCall {
            id,
            status: ToolStatus::Completed,
            output: Some(o),
            ..
        } if id == "t1" => Some(o.clone()),
        _ => None,
    });
    assert_eq!(t1_output.as_deref(), Some("hi\noops"));
    // The command still running when the task ended was stopped with it.
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // And it was offered: initialize says terminal = true.
    let init = agent.received("initialize");
    assert_eq!(init[0]["params"]["clientCapabilities"]["terminal"], true);
}

#[tokio::test]
async fn file_access_is_confined_to_the_workspace() {
    let agent = Agent::new(json!({}));
    let ws = agent.workspace();
    std::fs::write(ws.join("notes.txt"), "inside").unwrap();
    std::os::unix::fs::symlink("/etc/hostname", ws.join("escape")).unwrap();
    let script = json!({
        "record": ws.join("messages.jsonl"), "state": ws.join("sessions.json"),
        "steps": [
            {"read": ws.join("notes.txt")},
            {"read": "/etc/hostname"},
            {"read": ws.join("escape")},
            {"write": [ws.join("out.txt"), "written"]},
            {"write": ["/tmp/aamp-bridge-should-not-exist.txt", "x"]},
            {"read": "relative.txt"}
        ]
    });
    std::fs::write(&agent.script, script.to_string()).unwrap();
    let out = agent
        .run(
            &agent.profile("permissions = \"allow\""),
            None,
            &CancellationToken::new(),
        )
        .await
        .0
        .unwrap();
    assert!(
        out.output.starts_with(
            "read: inside read refused: /etc/hostname is outside the task's workspace"
        ),
        "{}",
        out.output
    );
    assert!(
        out.output
            .contains("read refused: /etc/hostname is outside")
            && out.output.matches("outside the task's workspace").count() == 3,
        "{}",
        out.output
    );
    assert!(out.output.contains("write: ok"), "{}", out.output);
    assert!(
        out.output.contains("not an absolute path"),
        "{}",
        out.output
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("out.txt")).unwrap(),
        "written"
    );
    assert!(!Path::new("/tmp/aamp-bridge-should-not-exist.txt").exists());
}

#[tokio::test]
async fn cancel_is_sent_and_honoured() {
    let agent = Agent::new(
        json!({"on_cancel": "honour", "steps": [{"say": "starting "}, {"sleep": 600}, {"say": "never"}]}),
    );
    let cancel = CancellationToken::new();
    let trigger = async {
        while agent.received("session/prompt").is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.cancel();
    };
    let started = Instant::now();
    let profile = agent.profile("");
    let ((result, _), ()) = tokio::join!(agent.run(&profile, None, &cancel), trigger);
    assert!(matches!(result, Err(RunError::Cancelled)), "{result:?}");
    assert_eq!(agent.received("session/cancel").len(), 1);
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn an_agent_that_ignores_cancel_is_killed_after_the_grace() {
    let agent = Agent::new(json!({"on_cancel": "ignore", "steps": [{"sleep": 600}]}));
    let cancel = CancellationToken::new();
    let trigger = async {
        while agent.received("session/prompt").is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.cancel();
    };
    let profile = agent.profile("cancel_grace_secs = 1");
    let ((result, _), ()) = tokio::join!(agent.run(&profile, None, &cancel), trigger);
    assert!(matches!(result, Err(RunError::Cancelled)), "{result:?}");
}

#[tokio::test]
async fn a_slow_turn_times_out() {
    let agent = Agent::new(json!({"on_cancel": "ignore", "steps": [{"sleep": 600}]}));
    let result = agent
        .run(
            &agent.profile("timeout_secs = 1\ncancel_grace_secs = 1"),
            None,
            &CancellationToken::new(),
        )
        .await
        .0;
    assert!(matches!(result, Err(RunError::TimedOut(_))), "{result:?}");
}

#[tokio::test]
async fn a_crash_mid_turn_reports_the_exit_and_stderr() {
    let agent = Agent::new(
        json!({"steps": [{"say": "partial"}, {"stderr": "fatal: model backend unreachable"}, {"crash": 3}]}),
    );
    let err = agent
        .run(&agent.profile(""), None, &CancellationToken::new())
        .await
        .0
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("exit status 3") && text.contains("model backend unreachable"),
        "{text}"
    );
}

/// Issue 20: every JSON-RPC error on `session/prompt` read "the agent broke the ACP
/// connection (...)" with a stderr line appended; `auth_required` there was not "not logged
/// in". The agent's own words now, with the details adapters put in `data`.
#[tokio::test]
async fn an_error_answering_the_prompt_is_told_in_the_agents_words() {
    let agent = Agent::new(json!({"steps": [
        {"stderr": "    at async Connection.processIncomingMessage (file:///x/acp.js:1:1)"},
        {"fail": {"code": -32603, "message": "Internal error",
                  "data": {"details": "Claude Code process exited with code 1"}}}
    ]}));
    let text = agent
        .run(&agent.profile(""), None, &CancellationToken::new())
        .await
        .0
        .unwrap_err()
        .to_string();
    assert_eq!(
        text,
        "the agent reported an error: Internal error: Claude Code process exited with code 1"
    );
    let agent = Agent::new(json!({"steps": [
        {"fail": {"code": -32000, "message": "Authentication required"}}
    ]}));
    let text = agent
        .run(&agent.profile(""), None, &CancellationToken::new())
        .await
        .0
        .unwrap_err()
        .to_string();
    assert!(text.contains("installed but not logged in"), "{text}");
}

#[tokio::test]
async fn an_oversized_line_is_skipped_and_the_turn_goes_on() {
    let agent = Agent::new(
        json!({"steps": [{"say": "before "}, {"big_line": 9_000_000}, {"say": "after"}]}),
    );
    let out = agent
        .run(&agent.profile(""), None, &CancellationToken::new())
        .await
        .0
        .unwrap();
    assert_eq!(out.output, "before after");
}

#[tokio::test]
async fn stop_reasons_other_than_end_turn_are_rejections() {
    for (stop, expected) in [
        ("refusal", "refused"),
        ("max_tokens", "token limit"),
        ("max_turn_requests", "turn limit"),
    ] {
        let agent = Agent::new(json!({"steps": [{"say": "hm"}, {"stop": stop}]}));
        let err = agent
            .run(&agent.profile(""), None, &CancellationToken::new())
            .await
            .0
            .unwrap_err();
        // Issue 43: the bridge's own reason, not "the agent reported an error: ...".
        assert!(
            matches!(&err, RunError::Stopped(m) if m.contains(expected)),
            "{stop}: {err}"
        );
        assert!(err.to_string().starts_with("the agent "), "{err}");
        assert!(!err.to_string().contains("reported an error"), "{err}");
    }
}

#[tokio::test]
async fn authentication_happens_only_when_the_agent_asks() {
    let agent = Agent::new(json!({"auth": "required", "steps": [{"say": "in"}]}));
    let out = agent
        .run(&agent.profile(""), None, &CancellationToken::new())
        .await
        .0
        .unwrap();
    assert_eq!(out.output, "in");
    assert_eq!(agent.received("authenticate").len(), 1);
    assert_eq!(
        agent.received("session/new").len(),
        2,
        "refused once, then accepted"
    );
    // Interactive logins are never started; the error lists what the agent offers.
    let oauth_only = Agent::new(
        json!({"auth": "required", "auth_methods": [{"id": "browser-login", "name": "Log in with a browser"}], "steps": [{"say": "in"}]}),
    );
    let err = oauth_only
        .run(&oauth_only.profile(""), None, &CancellationToken::new())
        .await
        .0
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not logged in") && err.contains("browser-login"),
        "{err}"
    );
    assert!(oauth_only.received("authenticate").is_empty());
    // Unless the profile names the method.
    let chosen = Agent::new(
        json!({"auth": "required", "auth_methods": [{"id": "browser-login", "name": "Log in"}], "steps": [{"say": "in"}]}),
    );
    let out = chosen
        .run(
            &chosen.profile("auth_method = \"browser-login\""),
            None,
            &CancellationToken::new(),
        )
        .await
        .0
        .unwrap();
    assert_eq!(out.output, "in");
    let plain = Agent::new(json!({"steps": [{"say": "in"}]}));
    plain
        .run(&plain.profile(""), None, &CancellationToken::new())
        .await
        .0
        .unwrap();
    assert!(plain.received("authenticate").is_empty());
}

#[tokio::test]
async fn sessions_continue_with_resume_or_load_without_replaying_output() {
    for (caps, method) in [
        (json!({"resume": true}), "session/resume"),
        (json!({"load": true}), "session/load"),
        // Issue 20: gemini --acp 0.61 answers session/load, then replays the history while
        // the next prompt waits for its model: the history leaked into the answer
        // ("I remember: tangerine.I remember: tangerine, walnut.").
        (
            json!({"load": true, "replay_after_load": true,
                   "steps": [{"sleep": 0.3}, {"say_prompt": true}]}),
            "session/load",
        ),
    ] {
        let mut script = json!({"steps": [{"say_prompt": true}]});
        script
            .as_object_mut()
            .unwrap()
            .extend(caps.as_object().unwrap().clone());
        let agent = Agent::new(script);
        let profile = agent.profile("");
        let first = agent
            .run(&profile, None, &CancellationToken::new())
            .await
            .0
            .unwrap();
        let id = first.session_id.unwrap();
        let (second, events) = agent
            .run(&profile, Some(&id), &CancellationToken::new())
            .await;
        let second = second.unwrap();
        assert_eq!(second.session_id.as_deref(), Some(id.as_str()));
        assert_eq!(
            second.output, "Do the task.",
            "{method}: history replayed by load is not new output"
        );
        assert_eq!(support::text_of(&events), "Do the task.");
        assert_eq!(agent.received(method).len(), 1, "{method}");
        assert_eq!(
            agent.received("session/new").len(),
            1,
            "{method}: no second new session"
        );
    }
    // An unknown session falls back to a new one.
    let agent = Agent::new(json!({"resume": true, "steps": [{"say": "fresh"}]}));
    let out = agent
        .run(
            &agent.profile(""),
            Some("sess-gone"),
            &CancellationToken::new(),
        )
        .await
        .0
        .unwrap();
    assert_eq!(out.output, "fresh");
    assert_eq!(agent.received("session/new").len(), 1);
}

#[tokio::test]
async fn an_agent_that_never_initializes_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let marker = format!(
        "{}.{}",
        600 + std::process::id() % 300,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let profile = Profile::parse(
        &format!(
            "kind = \"acp\"\ncommand = \"sleep\"\nargs = [\"{marker}\"]\ninit_timeout_secs = 1"
        ),
        "mute",
        "test",
    )
    .unwrap();
    let task = TaskInput {
        agent: "a".into(),
        task_id: "t".into(),
        prompt: "p".into(),
        session_key: None,
        resume_id: None,
        fresh_prompt: None,
        workspace: dir.path().to_path_buf(),
        questions: None,
        env: Vec::new(),
        on_spawn: None,
        mcp: None,
    };
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let err = run(&profile, &task, &CancellationToken::new(), &tx)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("did not answer initialize within 1s"),
        "{err}"
    );
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker))
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

#[tokio::test]
async fn an_agent_that_stays_after_its_answer_is_stopped_and_its_answer_kept() {
    let agent = Agent::new(json!({"ignore_eof": true, "steps": [{"say": "done"}]}));
    let out = agent
        .run(&agent.profile(""), None, &CancellationToken::new())
        .await
        .0
        .unwrap();
    assert_eq!(out.output, "done");
}

#[tokio::test]
async fn under_the_ask_policy_permission_requests_become_questions() {
    let agent = Agent::new(json!({"steps": [
        {"permission": {"id": "edit", "title": "Edit src/main.rs", "kind": "edit"}},
        {"permission": {"id": "again", "title": "Edit again", "kind": "edit"}}
    ]}));
    let profile = agent.profile("permissions = \"ask\"\nask_timeout_secs = 1");
    let (qtx, mut qrx) = tokio::sync::mpsc::channel(4);
    let task = TaskInput {
        agent: "acp".into(),
        task_id: "t-ask".into(),
        prompt: "Do it.".into(),
        session_key: None,
        resume_id: None,
        fresh_prompt: None,
        workspace: agent.workspace(),
        questions: Some(qtx),
        env: Vec::new(),
        on_spawn: None,
        mcp: None,
    };
    let (tx, _rx) = tokio::sync::mpsc::channel(64);
    let cancel = CancellationToken::new();
    // The first question is answered "Always allow"; the second is left to time out.
    let answering = async {
        let first = qrx.recv().await.unwrap();
        assert!(
            first.text.contains("Edit src/main.rs") && first.text.contains("(edit)"),
            "{}",
            first.text
        );
        assert_eq!(first.options, vec!["Allow", "Always allow", "Reject"]);
        first
            .answer
            .send(aamp_bridge::runner::Answer::Chosen(1))
            .unwrap();
        let second = qrx.recv().await.unwrap();
        second
    };
    let (result, _unanswered) = tokio::join!(run(&profile, &task, &cancel, &tx), answering);
    // The second question went unanswered: the permission was refused, and the task is
    // answered rejected, saying why.
    let err = result.unwrap_err().to_string();
    assert!(err.contains("no answer within 1s"), "{err}");
}

/// Issue 30: the policy held only on `session/request_permission`; terminals, file writes and
/// reads were served whatever it said, and a FIFO read froze a runtime worker for good. A
/// hostile agent (the scripted one, doing what a prompt-injected adapter could) tries every
/// way it has under each policy; each cell says what ran, what was written, what was read and
/// what the sender is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_holds_on_every_way_an_acp_agent_acts() {
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Asked {
        NoOne,
        Yes,
        No,
        Never,
    }
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("id_rsa");
    std::fs::write(&secret, "PRIVATE KEY").unwrap();
    let cases = [
        ("allow", Asked::NoOne),
        ("read_only", Asked::NoOne),
        ("deny", Asked::NoOne),
        ("ask", Asked::Yes),
        ("ask", Asked::No),
        ("ask", Asked::Never),
        // `ask` with nobody to ask is `read_only`.
        ("ask", Asked::NoOne),
    ];
    for (policy, asked) in cases {
        let cell = format!("{policy} / {asked:?}");
        let agent = Agent::new(json!({}));
        let ws = agent.workspace();
        let escaped = outside.path().join(format!("escaped-{policy}-{asked:?}"));
        std::fs::write(ws.join("notes.txt"), "inside").unwrap();
        let steps = json!([
            {"permission": {"id": "p1", "title": "Run id", "kind": "execute", "input": {"command": ["id", "-u"]}}},
            // A terminal the permission named (not asked again when it was allowed)...
            {"terminal": {"id": "t0", "command": "id", "args": ["-u"]}},
            // ...and one it did not name: asked of its own.
            {"terminal": {"id": "t1", "command": "sh", "args": ["-c", "echo ran > ran.txt; env"]}},
            {"terminal": {"id": "t2", "command": "cat", "args": [secret]}},
            {"write": [ws.join("written.txt"), "written"]},
            {"write": [escaped, "x"]},
            {"read": ws.join("notes.txt")},
            {"symlink": [secret, ws.join("link")]},
            {"read": ws.join("link")},
            {"hardlink": [secret, ws.join("hard")]},
            {"read": ws.join("hard")},
            {"write": [ws.join("hard"), "overwritten"]},
            {"mkfifo": ws.join("fifo")},
            {"read": ws.join("fifo")},
            {"write": [ws.join("fifo"), "x"]},
            {"symlink": ["/proc/self/environ", ws.join("environ")]},
            {"read": ws.join("environ")},
            {"read": "/proc/self/environ"},
            {"sparse": [ws.join("sparse"), 1u64 << 30]},
            {"read": ws.join("sparse")},
            {"say": "finished"}
        ]);
        let mut steps = steps.as_array().unwrap().clone();
        if nix::unistd::geteuid().is_root() {
            steps.insert(steps.len() - 1, json!({"mknod": ws.join("null")}));
            steps.insert(steps.len() - 1, json!({"read": ws.join("null")}));
        }
        let script = json!({
            "record": agent.dir.path().join("messages.jsonl"),
            "state": agent.dir.path().join("sessions.json"),
            "steps": steps,
        });
        std::fs::write(&agent.script, script.to_string()).unwrap();
        let profile = agent.profile(&format!("permissions = \"{policy}\"\nask_timeout_secs = 1"));
        let (qtx, mut qrx) = tokio::sync::mpsc::channel(8);
        let task = TaskInput {
            agent: "acp".into(),
            task_id: "t-hostile".into(),
            prompt: "Do it.".into(),
            session_key: None,
            resume_id: None,
            fresh_prompt: None,
            workspace: ws.clone(),
            questions: (asked != Asked::NoOne).then_some(qtx),
            env: Vec::new(),
            on_spawn: None,
            mcp: None,
        };
        let started = Instant::now();
        let answering = async {
            let mut asked_about = Vec::new();
            while let Some(q) = qrx.recv().await {
                asked_about.push(q.text.clone());
                match asked {
                    Asked::Yes => q
                        .answer
                        .send(aamp_bridge::runner::Answer::Chosen(0))
                        .unwrap(),
                    Asked::No => q
                        .answer
                        .send(aamp_bridge::runner::Answer::Chosen(2))
                        .unwrap(),
                    // Left to time out (the sender is kept until the run ends).
                    Asked::Never | Asked::NoOne => std::mem::forget(q),
                }
            }
            asked_about
        };
        let ((result, events), asked_about) = tokio::join!(
            async {
                let r = support::run_collecting(&profile, &task, &CancellationToken::new()).await;
                drop(task);
                r
            },
            answering
        );
        let took = started.elapsed();
        assert_eq!(agent.leftovers(), Vec::<String>::new(), "{cell}");
        let said = support::text_of(&events);
        let ran = ws.join("ran.txt").exists();
        let written = ws.join("written.txt").exists();
        // Never, under any policy: outside the workspace, through links, FIFOs, devices, or
        // beyond the size cap; never a hang.
        assert!(!escaped.exists(), "{cell}: wrote outside the workspace");
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "PRIVATE KEY",
            "{cell}"
        );
        assert!(!said.contains("read: PRIVATE KEY"), "{cell}: {said}");
        assert!(
            !said.contains("read: inside") || policy != "deny",
            "{cell}: {said}"
        );
        assert!(!said.contains("slow read"), "{cell}: {said}");
        assert!(took < Duration::from_secs(30), "{cell}: took {took:?}");
        assert!(said.contains("read refused: "), "{cell}: {said}");
        let may_act = matches!((policy, asked), ("allow", _) | ("ask", Asked::Yes));
        assert_eq!(ran, may_act, "{cell}: the terminal ran? {said}");
        assert_eq!(written, may_act, "{cell}: written? {said}");
        if may_act {
            // The terminal's environment is not the bridge's (cargo's variables are in this
            // process), but what the profile names and the bridge's tags.
            assert!(said.contains("ACP_TEST_SCRIPT="), "{cell}: {said}");
            assert!(said.contains("AAMP_TASK_ID=t-hostile"), "{cell}: {said}");
            assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok());
            assert!(!said.contains("CARGO_MANIFEST_DIR"), "{cell}: {said}");
            // A terminal may read what its user may (the policy allowed commands); what the
            // bridge itself serves never leaves the workspace, whatever the agent made there.
            for refused in [
                "hard links",
                "not a regular file",
                "outside the task's workspace",
                "at most",
            ] {
                assert!(said.contains(refused), "{cell}: {refused}: {said}");
            }
        }
        // What the agent was offered.
        let init = &agent.received("initialize")[0]["params"]["clientCapabilities"];
        let offered = (
            init["fs"]["readTextFile"] == true,
            init["fs"]["writeTextFile"] == true,
            init["terminal"] == true,
        );
        let expected = match (policy, asked) {
            ("allow", _) => (true, true, true),
            ("deny", _) => (false, false, false),
            ("ask", a) if a != Asked::NoOne => (true, true, true),
            _ => (true, false, false),
        };
        assert_eq!(offered, expected, "{cell}: capabilities");
        // What the sender was asked: the permission, then the one command it did not name
        // and the write; never the workspace's path.
        match asked {
            Asked::Yes => {
                // The permission, the two commands it did not name, and the writes inside the
                // workspace (the one outside is refused without asking).
                assert_eq!(asked_about.len(), 6, "{cell}: {asked_about:#?}");
                assert!(
                    asked_about[0].contains("the command `id -u`"),
                    "{asked_about:?}"
                );
                assert!(
                    asked_about[1].contains("running `sh -c 'echo ran > ran.txt; env'`"),
                    "{asked_about:?}"
                );
                assert!(
                    asked_about[3].contains("writing written.txt"),
                    "{asked_about:?}"
                );
            }
            Asked::No | Asked::Never => assert!(!asked_about.is_empty(), "{cell}"),
            Asked::NoOne => assert!(asked_about.is_empty(), "{cell}"),
        }
        for q in &asked_about {
            assert!(!q.contains(ws.to_str().unwrap()), "{cell}: {q}");
        }
        // What the sender gets.
        match (policy, asked) {
            ("allow", _) => {
                let out = result.unwrap();
                assert!(out.output.ends_with("finished"), "{cell}: {}", out.output);
            }
            ("ask", Asked::Never) => {
                let err = result.unwrap_err().to_string();
                assert!(err.contains("no answer within 1s"), "{cell}: {err}");
            }
            ("ask", Asked::Yes) => {
                let out = result.unwrap();
                assert!(out.output.ends_with("finished"), "{cell}: {}", out.output);
            }
            _ => {
                let out = result.unwrap();
                assert!(
                    out.output
                        .contains("finished\n\n(aamp-bridge: refused during this task: "),
                    "{cell}: {}",
                    out.output
                );
                assert!(
                    out.output.contains("running `sh -c"),
                    "{cell}: {}",
                    out.output
                );
                assert!(
                    out.output.contains("writing written.txt"),
                    "{cell}: {}",
                    out.output
                );
                let note = out.output.split("(aamp-bridge:").nth(1).unwrap();
                assert!(!note.contains(ws.to_str().unwrap()), "{cell}: {note}");
            }
        }
        // Refusals are failed tool calls in the stream.
        if !may_act {
            assert!(
                events.iter().any(|e| matches!(e, StreamEvent::ToolCall { status: ToolStatus::Failed, output: Some(o), .. } if o.starts_with("refused"))),
                "{cell}: {events:#?}"
            );
        }
    }
}
