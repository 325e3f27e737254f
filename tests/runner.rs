//! The CLI runner over real processes: stdin and stdout, caps, exit codes, timeouts and
//! cancellation, and that no process of a task's group outlives it.

use std::path::Path;
use std::time::Duration;

use aamp_bridge::runner::{Profile, RunError, RunOutput, TaskInput};
use tokio_util::sync::CancellationToken;

/// Runs a profile, dropping its stream events.
async fn run_cli(
    profile: &Profile,
    task: &TaskInput,
    cancel: &CancellationToken,
) -> Result<RunOutput, RunError> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let drain = async move { while rx.recv().await.is_some() {} };
    let run = async move { aamp_bridge::runner::run_cli(profile, task, cancel, &tx).await };
    tokio::join!(run, drain).0
}

fn profile(toml: &str) -> Profile {
    Profile::parse(toml, "test", "test.toml").expect("test profile parses")
}

fn task(dir: &Path, prompt: &str) -> TaskInput {
    TaskInput {
        agent: "tester".into(),
        task_id: "task-1".into(),
        prompt: prompt.into(),
        session_key: None,
        resume_id: None,
        fresh_prompt: None,
        workspace: dir.to_path_buf(),
        questions: None,
        env: Vec::new(),
        on_spawn: None,
        mcp: None,
    }
}

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) {
                found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// A sleep duration unique to this test run, so /proc can be searched for it.
fn unique_sleep() -> String {
    format!(
        "{}.{}",
        300 + std::process::id() % 500,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

#[tokio::test]
async fn a_large_prompt_goes_in_by_stdin_and_comes_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile("command = \"cat\"\nstdin = \"{{prompt}}\"\n[output]\nmax_bytes = 4194304");
    let prompt = "line of text\n".repeat(200_000); // 2.6 MB, far past any pipe buffer
    let out = run_cli(&p, &task(dir.path(), &prompt), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.output.len(), prompt.trim().len());
    assert!(!out.truncated);
}

#[tokio::test]
async fn output_past_the_cap_is_cut_and_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile("command = \"cat\"\nstdin = \"{{prompt}}\"\n[output]\nmax_bytes = 10");
    let out = run_cli(
        &p,
        &task(dir.path(), "0123456789abcdef"),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(out.output, "0123456789");
    assert!(out.truncated);
}

#[tokio::test]
async fn the_prompt_is_one_argument_and_never_shell_text() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile("command = \"printf\"\nargs = [\"%s|\", \"{{prompt}}\", \"{{task_id}}\"]");
    let hostile = "$(touch pwned) `touch pwned2`; touch pwned3";
    let out = run_cli(&p, &task(dir.path(), hostile), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.output, format!("{hostile}|task-1|"));
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "nothing was executed"
    );
}

#[tokio::test]
async fn a_failing_agent_reports_its_status_and_last_stderr_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile("command = \"sh\"\nargs = [\"-c\", \"echo working; echo detail >&2; echo 'quota exhausted' >&2; exit 3\"]");
    let err = run_cli(&p, &task(dir.path(), ""), &CancellationToken::new())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, RunError::Failed { .. }), "{err:?}");
    assert!(
        text.contains("exited with status 3") && text.contains("quota exhausted"),
        "{text}"
    );
    let p = profile(
        "command = \"sh\"\nargs = [\"-c\", \"echo fine; exit 3\"]\nsuccess_exit_codes = [0, 3]",
    );
    assert_eq!(
        run_cli(&p, &task(dir.path(), ""), &CancellationToken::new())
            .await
            .unwrap()
            .output,
        "fine"
    );
}

#[tokio::test]
async fn a_missing_command_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile("command = \"no-such-agent-binary\"");
    let err = run_cli(&p, &task(dir.path(), ""), &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Spawn { .. }));
    assert!(err.to_string().contains("no-such-agent-binary"), "{err}");
}

#[tokio::test]
async fn a_timeout_kills_the_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let marker = unique_sleep();
    // The shell ignores SIGTERM and its background child would outlive it: both must die.
    let p = profile(&format!(
        "command = \"sh\"\nargs = [\"-c\", \"trap '' TERM; sleep {marker} & sleep {marker}; wait\"]\ntimeout_secs = 1"
    ));
    let err = run_cli(&p, &task(dir.path(), ""), &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::TimedOut(_)), "{err:?}");
    assert!(err.to_string().contains("1s"), "{err}");
    assert_eq!(
        processes_with(&marker),
        Vec::<String>::new(),
        "processes left behind"
    );
}

#[tokio::test]
async fn cancel_stops_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let marker = unique_sleep();
    let p = profile(&format!("command = \"sleep\"\nargs = [\"{marker}\"]"));
    let cancel = CancellationToken::new();
    let input = task(dir.path(), "");
    let run = run_cli(&p, &input, &cancel);
    let stop = async {
        // Cancel once the agent is really running.
        while processes_with(&marker).is_empty() {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
    };
    let (result, ()) = tokio::join!(run, stop);
    assert!(matches!(result, Err(RunError::Cancelled)), "{result:?}");
    assert_eq!(processes_with(&marker), Vec::<String>::new());
}

#[tokio::test]
async fn processes_left_after_the_agent_exits_are_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let marker = unique_sleep();
    // The leader answers and exits, leaving a child that still holds stdout open.
    let p = profile(&format!(
        "command = \"sh\"\nargs = [\"-c\", \"sleep {marker} & echo answered\"]"
    ));
    let out = run_cli(&p, &task(dir.path(), ""), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.output, "answered");
    assert_eq!(processes_with(&marker), Vec::<String>::new());
}

#[tokio::test]
async fn the_workspace_is_the_working_directory_and_ansi_is_stripped() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile("command = \"sh\"\nargs = [\"-c\", \"printf '\\\\033[1;32m%s\\\\033[0m' \\\"$PWD:$AAMP_TASK_ID\\\"\"]");
    let out = run_cli(&p, &task(dir.path(), ""), &CancellationToken::new())
        .await
        .unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    assert_eq!(out.output, format!("{}:task-1", cwd.display()));
}

#[tokio::test]
async fn output_written_before_the_agent_exits_is_all_read_when_its_reader_is_held_back() {
    // The agent prints 3,000 deltas and exits as soon as the last of them fits in the pipe;
    // the events are taken a millisecond apart (a slow stream service holds the reader back),
    // so reading what is left takes longer than the pipes' grace after exit (2 s). Every
    // delta and the answer still arrive: the grace ends only a pipe held open empty.
    let dir = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for i in 0..3000 {
        lines.push_str(&format!("{{\"type\":\"delta\",\"text\":\"w{i} \"}}\n"));
    }
    lines.push_str("{\"type\":\"result\",\"text\":\"done\"}\n");
    let file = dir.path().join("deltas.ndjson");
    std::fs::write(&file, lines).unwrap();
    let p = profile(&format!(
        "command = \"cat\"\nargs = [{:?}]\nstream = \"ndjson\"\n",
        file.display().to_string()
    ));
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let slow = async move {
        let mut n = 0;
        while let Some(e) = rx.recv().await {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if matches!(e, aamp_bridge::runner::StreamEvent::TextDelta(_)) {
                n += 1;
            }
        }
        n
    };
    let cancel = CancellationToken::new();
    let t = task(dir.path(), "go");
    let run = async move {
        let out = aamp_bridge::runner::run_cli(&p, &t, &cancel, &tx).await;
        drop(tx);
        out
    };
    let (out, n) = tokio::join!(run, slow);
    let out = out.unwrap().output;
    assert!(
        out == "done",
        "the answer was lost: {} characters instead",
        out.len()
    );
    assert_eq!(n, 3000);
}

#[test]
fn tagged_processes_are_found_among_those_created_since_a_point() {
    use aamp_bridge::runner::process::{last_pid, tagged_since};
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let before = last_pid();
    assert!(before.is_some(), "/proc/loadavg names the last process id");
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .env("AAMP_TEST_TAG", &tag)
        .spawn()
        .unwrap();
    let after = last_pid();
    let pid = child.id() as i32;
    // `spawn` can return while the child is still inside execve, before its new environment
    // shows in /proc (seen about once in 40 runs): wait for the exec to finish first.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&tag))
    {
        assert!(std::time::Instant::now() < deadline, "sleep never exec'd");
        std::thread::yield_now();
    }
    assert_eq!(tagged_since("AAMP_TEST_TAG", &tag, before), vec![pid]);
    assert_eq!(tagged_since("AAMP_TEST_TAG", &tag, None), vec![pid]);
    // Created before `after`: not among those created since.
    assert!(tagged_since("AAMP_TEST_TAG", &tag, after).is_empty());
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Runs a profile through `runner::run` (what the engine calls), dropping its events.
async fn run_any(profile: &Profile, task: &TaskInput) -> Result<RunOutput, RunError> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let drain = async move { while rx.recv().await.is_some() {} };
    let run = async move {
        aamp_bridge::runner::run(profile, task, &CancellationToken::new(), &tx).await
    };
    tokio::join!(run, drain).0
}

/// Issue 20: a session the agent cannot continue failed the task (and, the id kept, every
/// later turn). A run that fails before the agent says anything while resuming is run once
/// more in a new session, flagged; one that failed after saying something is not run twice.
#[tokio::test]
async fn a_session_the_agent_cannot_continue_is_started_anew_once() {
    let dir = tempfile::tempdir().unwrap();
    // Fails at once when asked to resume, as `claude --resume` does in another folder.
    let refusing = profile(
        "command = \"python3\"\nargs = [\"-c\", \"import sys\\nif '--resume' in sys.argv: sys.exit(1)\\nprint('fresh session')\", \"--resume\", \"{{resume_id}}\"]\n",
    );
    let mut resuming = task(dir.path(), "go on");
    resuming.resume_id = Some("stale-id".into());
    let out = run_any(&refusing, &resuming).await.unwrap();
    assert_eq!(out.output, "fresh session");
    assert!(out.context_lost);
    // Without a session to continue: one run, nothing lost.
    let out = run_any(&refusing, &task(dir.path(), "go on"))
        .await
        .unwrap();
    assert!(!out.context_lost);

    // Said something (a stream event), then failed: an answer that failed, not a refused
    // session; run once. (Only a streaming agent names a session to resume.)
    let counter = dir.path().join("runs");
    let talking = profile(&format!(
        "command = \"python3\"\nargs = [\"-c\", \"import sys\\nopen('{}', 'a').write('x')\\nprint('{{\\\"type\\\": \\\"delta\\\", \\\"text\\\": \\\"partial\\\"}}', flush=True)\\nsys.exit(2)\", \"--resume\", \"{{{{resume_id}}}}\"]\nstream = \"ndjson\"\n",
        counter.display()
    ));
    let err = run_any(&talking, &resuming).await.unwrap_err();
    assert!(matches!(err, RunError::Failed { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "x", "run once");
}

/// Issue 20, item 4: the permission policy goes to a CLI in its own terms, first (before any
/// subcommand), for the profile's policy only.
#[tokio::test]
async fn the_policys_arguments_come_first() {
    let dir = tempfile::tempdir().unwrap();
    let toml = |policy: &str| {
        format!(
            "command = \"echo\"\nargs = [\"exec\", \"-\"]\npermissions = \"{policy}\"\n[permission_args]\nread_only = [\"--sandbox\", \"read-only\"]\nallow = [\"--sandbox\", \"write\"]\n"
        )
    };
    let cancel = CancellationToken::new();
    for (policy, expected) in [
        ("read_only", "--sandbox read-only exec -"),
        ("allow", "--sandbox write exec -"),
        ("deny", "exec -"),
    ] {
        let out = run_cli(&profile(&toml(policy)), &task(dir.path(), "p"), &cancel)
            .await
            .unwrap();
        assert_eq!(out.output, expected, "{policy}");
    }
}

/// Issue 32, item 4: a CLI profile with no `{{resume_id}}` started every turn afresh while the
/// bridge kept the session id its stream named and never used it. It now gets the
/// conversation's earlier turns retold (the engine's `fresh_prompt`), flagged so the
/// answer says so; a turn with no session to continue runs as it is (a CLI that names no
/// session may keep its conversation by AAMP_SESSION_KEY itself).
#[tokio::test]
async fn a_cli_that_cannot_resume_gets_the_earlier_turns_retold() {
    let dir = tempfile::tempdir().unwrap();
    let plain = profile("command = \"cat\"\nstdin = \"{{prompt}}\"\n");
    assert!(!plain.can_resume());
    let mut later = task(dir.path(), "turn two");
    later.resume_id = Some("kept-id".into());
    later.fresh_prompt = Some("turn one, answer one; turn two".into());
    let out = run_any(&plain, &later).await.unwrap();
    assert_eq!(out.output, "turn one, answer one; turn two");
    assert!(out.no_resume && !out.context_lost);
    let out = run_any(&plain, &task(dir.path(), "turn one"))
        .await
        .unwrap();
    assert_eq!(out.output, "turn one");
    assert!(!out.no_resume);
    let resuming = profile(
        "command = \"cat\"\nstdin = \"{{prompt}}\"\nargs = [\"--resume\", \"{{resume_id}}\"]\n",
    );
    assert!(resuming.can_resume());
    let keyed = profile(
        "command = \"cat\"\nstdin = \"{{prompt}}\"\nenv = { CONV = \"{{safe_session_key}}\" }\n",
    );
    assert!(keyed.can_resume());
}

/// Issue 32, item 3: the failure reason was the last stderr line, often a stack frame or a
/// warning the agent prints on every run. It is the line that reads like an error.
#[tokio::test]
async fn a_failure_names_the_error_line_not_a_stack_frame_or_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let script = "echo 'Ripgrep is not available. Falling back to GrepTool.' >&2; \
                  echo 'Error: Invalid approval mode: sometimes. Valid values are: default, auto_edit, yolo' >&2; \
                  echo '    at parseArguments (file:///x/gemini-3HFX2LNT.js:17300:11)' >&2; \
                  echo '    at async main (file:///x/gemini-3HFX2LNT.js:17363:25)' >&2; \
                  echo 'Ripgrep is not available. Falling back to GrepTool.' >&2; exit 1";
    let p = profile(&format!(
        "command = \"sh\"\nargs = [\"-c\", {}]",
        toml_str(script)
    ));
    let err = run_cli(&p, &task(dir.path(), ""), &CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Invalid approval mode") && !err.contains("at async main"),
        "{err}"
    );
}

/// Issue 32, item 4: the variables a profile needs live in its `env_file` (0600), read when the
/// agent starts; a missing one is a clear error naming the profile and the file.
#[tokio::test]
async fn a_profiles_env_file_reaches_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mine.toml");
    std::fs::write(
        &file,
        "command = \"sh\"\nargs = [\"-c\", \"echo $SECRET_ONE $PLAIN\"]\nenv = { PLAIN = \"p\" }\nenv_file = \"mine.env\"\n",
    )
    .unwrap();
    let p = Profile::find(file.to_str().unwrap(), &[]).unwrap();
    let err = run_cli(&p, &task(dir.path(), ""), &CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mine.env") && err.contains("profile mine"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("mine.env"),
        "# a comment\nSECRET_ONE=\"s 1\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.path().join("mine.env"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    assert!(
        p.warnings().iter().any(|w| w.contains("chmod 600")),
        "{:?}",
        p.warnings()
    );
    let out = run_cli(&p, &task(dir.path(), ""), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.output, "s 1 p");
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Issue 43: a CLI profile without a stream format showed nothing while it ran. Its output
/// lines come as events (`text.delta` on the live view) as they are written (the first while the agent still
/// waits for the test to let it go on), `HELP:` lines are not among them, and the answer is
/// the whole output as before.
#[tokio::test]
async fn plain_output_is_shown_a_line_at_a_time_as_it_comes() {
    use aamp_bridge::runner::StreamEvent;
    let dir = tempfile::tempdir().unwrap();
    let go_on = dir.path().join("go-on");
    let script = format!(
        "printf 'first line\\n'; while [ ! -e {go} ]; do sleep 0.02; done; printf 'second \\033[1mline\\033[0m\\nno end'",
        go = go_on.display()
    );
    let p = profile(&format!(
        "command = \"sh\"\nargs = [\"-c\", {}]\ntimeout_secs = 30\n",
        toml_str(&script)
    ));
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let cancel = CancellationToken::new();
    let t = task(dir.path(), "go");
    let run = tokio::spawn(async move {
        let out = aamp_bridge::runner::run_cli(&p, &t, &cancel, &tx).await;
        drop(tx);
        out
    });
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the first line is shown while the agent runs");
    assert_eq!(first, Some(StreamEvent::Output("first line\n".into())));
    assert!(!run.is_finished(), "the agent still waits");
    std::fs::write(&go_on, "").unwrap();
    let mut rest = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            StreamEvent::Output(t) => rest.push_str(&t),
            other => panic!("only text: {other:?}"),
        }
    }
    assert_eq!(
        rest, "second line\nno end",
        "escapes stripped, the last line too"
    );
    let out = run.await.unwrap().unwrap();
    assert_eq!(out.output, "first line\nsecond line\nno end");
}

/// Issue 45: a resumed run that failed (reporting what its calls used) and was run again in a
/// new session: both runs' usage reports arrive, the second's keyed apart, so none is taken
/// for another; a usage report alone does not stop the new session.
#[tokio::test]
async fn usage_keys_of_a_run_in_a_new_session_are_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys
if '--resume' in sys.argv:
    print('{"type":"result","subtype":"error_during_execution","is_error":true,"usage":{"input_tokens":5,"output_tokens":1},"total_cost_usd":0.001}')
    sys.exit(1)
print('{"type":"assistant","message":{"id":"m1","model":"x","content":[{"type":"text","text":"fresh"}],"usage":{"input_tokens":7,"output_tokens":2}}}')
print('{"type":"result","subtype":"success","is_error":false,"result":"fresh","usage":{"input_tokens":7,"output_tokens":2},"total_cost_usd":0.002}')
"#;
    let p = profile(&format!(
        "command = \"python3\"\nargs = [\"-c\", {script:?}, \"--resume\", \"{{{{resume_id}}}}\"]\nstream = \"claude\"\n"
    ));
    let mut resuming = task(dir.path(), "go on");
    resuming.resume_id = Some("stale-id".into());
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let keys = async move {
        let mut keys = Vec::new();
        while let Some(e) = rx.recv().await {
            if let aamp_bridge::runner::StreamEvent::Usage { key, usage } = e {
                keys.push((key, usage.total_tokens()));
            }
        }
        keys
    };
    let run = async move {
        aamp_bridge::runner::run(&p, &resuming, &CancellationToken::new(), &tx).await
    };
    let (out, keys) = tokio::join!(run, keys);
    let out = out.unwrap();
    assert!(out.context_lost);
    assert_eq!(
        keys,
        vec![
            ("result".to_string(), 6),
            ("new-session/msg:m1".to_string(), 9),
            ("new-session/result".to_string(), 0),
        ]
    );
}
