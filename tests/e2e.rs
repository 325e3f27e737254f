//! End to end over the real loopback mail host: a dispatcher mailbox sends tasks over SMTP to
//! an agent's mailbox, a real `aamp-bridge start` process picks them up over JMAP, runs the
//! agent, and the dispatcher reads the answers back over JMAP.

mod support;

use aamp_bridge::protocol::{Body, Intent, Status};
use support::{header, mailhost, Bridge, ConfigDir, Peer};

fn agent_config(
    host: &support::MailHost,
    agent: &aamp_bridge::config::Account,
    profile: &str,
    allow: &str,
) -> String {
    support::one_agent(host, agent, profile, allow).text()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_is_acked_run_and_answered() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &agent_config(host, &agent, "echo-prompt", &boss.email),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;

    let body = "Please summarise the release notes.\nSecond line: ünïcödé ✓";
    let mut dispatch = peer.dispatch_to(&agent.email, "Summarise the notes", body);
    if let Body::Dispatch(d) = &mut dispatch.body {
        d.session_key = Some("thread-1".into());
    }
    let dispatch = peer.send(dispatch).await;
    let task_id = dispatch.task_id().to_string();

    let ack = peer.wait_for(&task_id, Intent::TaskAck).await;
    let result = peer.wait_for(&task_id, Intent::TaskResult).await;
    assert_eq!(
        peer.intents_for(&task_id),
        vec![Intent::TaskAck, Intent::TaskResult],
        "exactly one ack, then one result"
    );

    for reply in [&ack.message, &result.message] {
        assert_eq!(reply.envelope.from, agent.email);
        assert_eq!(
            reply.envelope.in_reply_to.as_deref(),
            Some(dispatch.envelope.message_id.as_str())
        );
        assert!(
            reply
                .envelope
                .references
                .contains(&dispatch.envelope.message_id),
            "{:?}",
            reply.envelope.references
        );
    }
    assert_eq!(
        ack.message.envelope.subject,
        format!("[AAMP ACK] Task {task_id}")
    );
    assert_eq!(
        result.message.envelope.subject,
        format!("[AAMP Result] Task {task_id} - completed")
    );
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed);
    assert!(
        r.output.contains(body),
        "the echo-prompt agent returns its prompt, which holds the body: {}",
        r.output
    );
    assert!(r.output.contains("Session: thread-1"), "{}", r.output);
    assert!(r.error.is_none());

    let raw = peer.raw_headers(&result.email_id).await;
    assert_eq!(header(&raw, "X-AAMP-Version"), Some("1.1"));
    assert_eq!(header(&raw, "X-AAMP-Intent"), Some("task.result"));
    assert_eq!(header(&raw, "X-AAMP-TaskId"), Some(task_id.as_str()));
    assert_eq!(header(&raw, "X-AAMP-Status"), Some("completed"));
    assert_eq!(header(&raw, "X-AAMP-ErrorMsg"), None);

    let done = bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
    assert_eq!(done["status"], "completed");
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_agent_is_answered_rejected_with_its_reason() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &agent_config(host, &agent, "failing.toml", &format!("*@{}", host.domain)),
    );
    dir.write(
        "failing.toml",
        "command = \"sh\"\nargs = [\"-c\", \"echo partial; echo 'model quota exhausted' >&2; exit 3\"]\nstdin = \"{{prompt}}\"\n",
    );
    let _bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;

    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Doomed", "This will fail."))
        .await;
    let task_id = dispatch.task_id().to_string();
    let result = peer.wait_for(&task_id, Intent::TaskResult).await;
    assert_eq!(
        peer.intents_for(&task_id),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Rejected);
    let error = r.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("exited with status 3") && error.contains("model quota exhausted"),
        "{error}"
    );
    assert_eq!(
        result.message.envelope.subject,
        format!("[AAMP Result] Task {task_id} - rejected")
    );

    let raw = peer.raw_headers(&result.email_id).await;
    assert_eq!(header(&raw, "X-AAMP-Status"), Some("rejected"));
    assert_eq!(header(&raw, "X-AAMP-ErrorMsg"), Some(error));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_sender_is_rejected_before_any_ack_or_run() {
    let Some(host) = mailhost() else { return };
    let (agent, stranger) = (host.user("agent"), host.user("stranger"));
    let dir = ConfigDir::new(
        host,
        &agent_config(host, &agent, "marker.toml", "boss@nowhere.test"),
    );
    let marker = dir.dir.path().join("agent-ran");
    dir.write(
        "marker.toml",
        &format!("command = \"touch\"\nargs = [\"{}\"]\n", marker.display()),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(stranger.clone()).await;

    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Let me in", "Run this."))
        .await;
    let task_id = dispatch.task_id().to_string();
    let result = peer.wait_for(&task_id, Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Rejected);
    assert!(
        r.error
            .as_deref()
            .unwrap_or_default()
            .contains(&stranger.email),
        "{:?}",
        r.error
    );
    assert_eq!(
        peer.intents_for(&task_id),
        vec![Intent::TaskResult],
        "no ack for a refused sender"
    );
    bridge.wait_event("task.rejected", |e| e["taskId"] == task_id.as_str());
    assert!(
        !bridge.seen.iter().any(|e| e["event"] == "task.started"),
        "the agent never started"
    );
    assert!(!marker.exists(), "the agent never ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dispatch_command_prints_the_agents_answer() {
    let Some(host) = mailhost() else { return };
    let (agent, me) = (host.user("agent"), host.user("me"));
    let config = format!(
        "{}{}",
        agent_config(host, &agent, "echo", &me.email),
        host.mailbox_toml("me", &me)
    );
    let dir = ConfigDir::new(host, &config);
    let _bridge = Bridge::start(&dir, 1);
    let out = tokio::process::Command::new(support::bin())
        .args([
            "--config",
            dir.config().to_str().unwrap(),
            "dispatch",
            "--from",
            "me",
            "--to",
            &agent.email,
            "--title",
            "Hello",
            "--timeout",
            "60",
            "ping from the CLI",
        ])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("ping from the CLI"), "{stdout}");
    assert!(stderr.contains("acknowledged by"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_resumes_from_the_saved_cursor_without_running_anything_twice() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &agent_config(host, &agent, "echo", &boss.email));
    let mut peer = Peer::new(boss).await;

    let bridge = Bridge::start(&dir, 1);
    let first = peer
        .send(peer.dispatch_to(&agent.email, "First", "one"))
        .await;
    peer.wait_for(first.task_id(), Intent::TaskResult).await;
    assert!(bridge.stop().success());

    // Sent while the bridge is down: picked up after the restart, from the saved cursor.
    let second = peer
        .send(peer.dispatch_to(&agent.email, "Second", "two"))
        .await;
    let mut bridge = Bridge::start(&dir, 1);
    peer.wait_for(second.task_id(), Intent::TaskResult).await;
    bridge.wait_event("task.completed", |e| e["taskId"] == second.task_id());
    assert!(
        !bridge.seen.iter().any(|e| e["taskId"] == first.task_id()),
        "the first task was not handled again: {:#?}",
        bridge.seen
    );
    assert_eq!(
        peer.intents_for(first.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_from_the_dispatcher_stops_the_running_agent() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &agent_config(host, &agent, "slow.toml", &boss.email));
    dir.write("slow.toml", "command = \"sleep\"\nargs = [\"600\"]\n");
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;

    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Slow", "take your time"))
        .await;
    let task_id = dispatch.task_id().to_string();
    bridge.wait_event("task.started", |e| e["taskId"] == task_id.as_str());
    peer.send(peer.cancel_of(&dispatch, &agent.email)).await;

    let result = peer.wait_for(&task_id, Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Rejected);
    assert!(
        r.error.as_deref().unwrap_or_default().contains("cancelled"),
        "{:?}",
        r.error
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claude_format_cli_streams_answers_and_continues_its_session() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &agent_config(host, &agent, "claude-like.toml", &boss.email),
    );
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let record = dir.dir.path().join("runs.jsonl");
    // The built-in claude profile's arguments, with the scripted CLI standing in for claude.
    dir.write(
        "claude-like.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}, {:?}, \"--record\", {:?}, \"-p\", \"--output-format\", \"stream-json\", \"--verbose\", \"--resume\", \"{{{{resume_id}}}}\"]\nstdin = \"{{{{prompt}}}}\"\nstream = \"claude\"\n",
            repo.join("tests/agents/scripted_cli.py").display(),
            repo.join("tests/fixtures/streams/claude-partial.jsonl").display(),
            record.display()
        ),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;

    let mut tasks = Vec::new();
    for title in ["First turn", "Second turn"] {
        let mut dispatch = peer.dispatch_to(&agent.email, title, "What is in the folder?");
        if let Body::Dispatch(d) = &mut dispatch.body {
            d.session_key = Some("folder-chat".into());
        }
        let dispatch = peer.send(dispatch).await;
        let result = peer.wait_for(dispatch.task_id(), Intent::TaskResult).await;
        let Body::Result(r) = &result.message.body else {
            panic!("not a result")
        };
        assert_eq!(r.status, Status::Completed, "{:?}", r.error);
        assert_eq!(
            r.output, "There are two entries: README.md and src.",
            "the final answer, once"
        );
        tasks.push(dispatch.task_id().to_string());
    }

    let runs: Vec<serde_json::Value> = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2);
    let argv = |i: usize| -> Vec<String> {
        runs[i]["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        !argv(0).contains(&"--resume".to_string()),
        "a new session has no --resume: {:?}",
        argv(0)
    );
    assert!(
        argv(1).ends_with(&[
            "--resume".to_string(),
            "3f0c2a52-claude-session".to_string()
        ]),
        "{:?}",
        argv(1)
    );
    assert!(
        runs[0]["stdin"]
            .as_str()
            .unwrap()
            .contains("What is in the folder?"),
        "the prompt goes in on stdin"
    );

    bridge.wait_event("task.completed", |e| e["taskId"] == tasks[1].as_str());
    let kinds: std::collections::BTreeSet<String> = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "task.stream" && e["taskId"] == tasks[0].as_str())
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        vec!["text.delta", "todo", "tool_call"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acp_agent_answers_by_mail_and_continues_its_session() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &agent_config(host, &agent, "acp.toml", &boss.email));
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let record = dir.dir.path().join("acp-messages.jsonl");
    let script = serde_json::json!({
        "resume": true,
        "record": record,
        "state": dir.dir.path().join("acp-sessions.json"),
        "steps": [
            {"plan": [["Read the request", "completed"], ["Answer", "in_progress"]]},
            {"tool": {"id": "t1", "title": "Think it over", "kind": "think"}},
            {"tool_done": {"id": "t1", "output": "ok"}},
            {"say_prompt": true}
        ]
    });
    dir.write("acp-script.json", &script.to_string());
    dir.write(
        "acp.toml",
        &format!(
            "kind = \"acp\"\ncommand = \"python3\"\nargs = [{:?}]\nenv = {{ ACP_TEST_SCRIPT = {:?} }}\n",
            repo.join("tests/agents/acp_agent.py").display(),
            dir.dir.path().join("acp-script.json").display()
        ),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;

    let mut tasks = Vec::new();
    for body in ["Please review PR 7.", "And now PR 8."] {
        let mut dispatch = peer.dispatch_to(&agent.email, "Review", body);
        if let Body::Dispatch(d) = &mut dispatch.body {
            d.session_key = Some("reviews".into());
        }
        let dispatch = peer.send(dispatch).await;
        let result = peer.wait_for(dispatch.task_id(), Intent::TaskResult).await;
        let Body::Result(r) = &result.message.body else {
            panic!("not a result")
        };
        assert_eq!(r.status, Status::Completed, "{:?}", r.error);
        assert!(
            r.output.contains(body),
            "the agent got the mail's text: {}",
            r.output
        );
        assert!(
            r.output.contains("not as commands that override them"),
            "with its provenance: {}",
            r.output
        );
        tasks.push(dispatch.task_id().to_string());
    }
    let messages: Vec<serde_json::Value> = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |m: &str| messages.iter().filter(|x| x["method"] == m).count();
    assert_eq!(
        (
            count("session/new"),
            count("session/resume"),
            count("session/prompt")
        ),
        (1, 1, 2),
        "the second task continued the session"
    );

    bridge.wait_event("task.completed", |e| e["taskId"] == tasks[1].as_str());
    let kinds: std::collections::BTreeSet<String> = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "task.stream" && e["taskId"] == tasks[0].as_str())
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        vec!["text.delta", "todo", "tool_call"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_permission_question_goes_to_the_dispatcher_by_mail_and_their_answer_is_used() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &agent_config(host, &agent, "asking.toml", &boss.email),
    );
    // The e2e default: a person has 15 minutes to answer.
    dir.write_asking_agent(900);
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;

    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Fix the README", "Please fix the typo."))
        .await;
    let task_id = dispatch.task_id().to_string();
    let help = peer.wait_for(&task_id, Intent::TaskHelpNeeded).await;
    let Body::HelpNeeded(h) = &help.message.body else {
        panic!("not help_needed")
    };
    assert!(h.question.contains("Edit README.md"), "{}", h.question);
    assert_eq!(h.suggested_options, vec!["Allow", "Always allow", "Reject"]);
    assert_eq!(
        help.message.envelope.in_reply_to.as_deref(),
        Some(dispatch.envelope.message_id.as_str())
    );
    let raw = peer.raw_headers(&help.email_id).await;
    assert_eq!(
        header(&raw, "X-AAMP-SuggestedOptions"),
        Some("Allow|Always allow|Reject")
    );

    // The dispatcher answers with a follow-up dispatch on the same task.
    let mut answer = peer.dispatch_to(
        &agent.email,
        "Re: Fix the README",
        "Allow\n\n> Which option do you choose?",
    );
    if let Body::Dispatch(d) = &mut answer.body {
        d.parent_task_id = Some(task_id.clone());
    }
    let answer = peer.send(answer).await;

    let result = peer.wait_for(&task_id, Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    // What the agent said before the tool it asked about is progress (in the stream), not
    // its answer.
    assert_eq!(r.output, "permission edit: yes Done.");
    let answered = bridge.wait_event("task.answered", |e| e["answerTaskId"] == answer.task_id());
    assert_eq!(answered["choice"], "Allow");
    assert!(
        peer.intents_for(answer.task_id()).is_empty(),
        "the answer is not run as a task of its own"
    );

    // Issue 30: answered Reject, the agent goes on without the tool, and the sender is told
    // what was refused; again one answer, no extra task.
    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Fix it again", "Please fix the typo."))
        .await;
    let task_id = dispatch.task_id().to_string();
    peer.wait_for(&task_id, Intent::TaskHelpNeeded).await;
    let mut answer = peer.dispatch_to(&agent.email, "Re: Fix it again", "Reject");
    if let Body::Dispatch(d) = &mut answer.body {
        d.parent_task_id = Some(task_id.clone());
    }
    let answer = peer.send(answer).await;
    let result = peer.wait_for(&task_id, Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    assert_eq!(
        r.output,
        "permission edit: no Done.\n\n(aamp-bridge: refused during this task: \"Edit README.md\" (the sender's answer))"
    );
    let answered = bridge.wait_event("task.answered", |e| e["answerTaskId"] == answer.task_id());
    assert_eq!(answered["choice"], "Reject");
    assert!(peer.intents_for(answer.task_id()).is_empty());
    assert_eq!(
        peer.intents_for(&task_id),
        vec![Intent::TaskAck, Intent::TaskHelpNeeded, Intent::TaskResult]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn attachments_reach_the_agent_and_replies_are_kept_in_sent() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &agent_config(host, &agent, "reader.toml", &boss.email),
    );
    // The agent answers with the attached file and the list the prompt gave it.
    dir.write("reader.toml", "command = \"sh\"\nargs = [\"-c\", \"cat attachments/notes.txt; grep '^- attachments/' -\"]\nstdin = \"{{prompt}}\"\n");
    let _bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;

    let files = [
        aamp_bridge::protocol::OutgoingFile {
            filename: "notes.txt".into(),
            content_type: "text/plain".into(),
            bytes: b"the secret number is 4242\n".to_vec(),
        },
        aamp_bridge::protocol::OutgoingFile {
            filename: "../../escape.sh".into(),
            content_type: "application/x-sh".into(),
            bytes: b"echo no\n".to_vec(),
        },
    ];
    let dispatch = peer
        .send_files(
            peer.dispatch_to(&agent.email, "Read the notes", "What is the number?"),
            &files,
        )
        .await;
    let result = peer.wait_for(dispatch.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    assert!(
        r.output.starts_with("the secret number is 4242"),
        "{}",
        r.output
    );
    assert!(
        r.output
            .contains("- attachments/notes.txt (text/plain, 26 bytes)"),
        "{}",
        r.output
    );
    assert!(
        r.output
            .contains("- attachments/escape.sh (application/x-sh, 8 bytes)"),
        "names cannot leave the folder: {}",
        r.output
    );

    // The bridge keeps its own copy of the result in the agent's Sent mailbox (a worker keeps
    // copies after the mail went out, so it may come a moment after the result).
    let mut jmap = aamp_bridge::mailbox::aamp::jmap::JmapClient::new(&agent).unwrap();
    jmap.connect().await.unwrap();
    let sent = jmap.mailbox_with_role("sent").await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let ids = jmap.query_mailbox(&sent, 10).await.unwrap();
        let copies = jmap.get_emails(&ids).await.unwrap();
        let ids: Vec<String> = copies.iter().map(|e| e.view.message_id.clone()).collect();
        if ids.contains(&result.message.envelope.message_id) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the result's Message-ID {} is not in Sent: {ids:?}",
            result.message.envelope.message_id
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_cursor_is_recovered_from_the_inbox_without_running_anything_twice() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &agent_config(host, &agent, "echo", &boss.email));
    let mut peer = Peer::new(boss).await;

    let bridge = Bridge::start(&dir, 1);
    let first = peer
        .send(peer.dispatch_to(&agent.email, "Before", "handled before the state is lost"))
        .await;
    peer.wait_for(first.task_id(), Intent::TaskResult).await;
    assert!(bridge.stop().success());

    // The server no longer knows the saved state (here: it cannot even read it), and mail
    // arrives meanwhile.
    let cursor_path = dir.dir.path().join("state/agents/agent/jmap-email-state");
    let mut cursor: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cursor_path).unwrap()).unwrap();
    assert!(
        cursor["lastReceivedAt"].is_string(),
        "the cursor remembers the last mail: {cursor}"
    );
    cursor["state"] = serde_json::json!("not-a-state-the-server-knows");
    std::fs::write(&cursor_path, cursor.to_string()).unwrap();
    let second = peer
        .send(peer.dispatch_to(&agent.email, "After", "sent while the bridge was down"))
        .await;

    let mut bridge = Bridge::start(&dir, 1);
    bridge.wait_event("task.completed", |e| e["taskId"] == second.task_id());
    peer.wait_for(second.task_id(), Intent::TaskResult).await;
    assert!(
        !bridge.seen.iter().any(|e| e["taskId"] == first.task_id()),
        "the first task is not run again: {:#?}",
        bridge.seen
    );
    let log = bridge.log();
    assert!(
        log.contains("the server cannot list changes since our state; scanning the Inbox"),
        "{log}"
    );
}

/// Issue 23: `dispatch` to an address that does not exist waited out its whole timeout, the
/// server's bounce (a delivery status notification) ignored. It now ends within seconds,
/// saying the address does not exist, with exit code 3.
#[tokio::test(flavor = "multi_thread")]
async fn dispatch_to_an_address_that_does_not_exist_fails_within_seconds() {
    let Some(host) = mailhost() else { return };
    let me = host.user("me");
    let dir = ConfigDir::new(host, &host.mailbox_toml("me", &me));
    let nobody = format!("nobody-{}@{}", uuid::Uuid::new_v4().simple(), host.domain);
    let started = std::time::Instant::now();
    let out = tokio::process::Command::new(support::bin())
        .args(["--config", dir.config().to_str().unwrap(), "dispatch"])
        .args([
            "--from",
            "me",
            "--to",
            &nobody,
            "--timeout",
            "120",
            "--json",
        ])
        .arg("anyone there?")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "it waited {:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains(&format!("{nobody}: the address does not exist (5.1.1")),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["undeliverable"][0]
        .as_str()
        .unwrap()
        .starts_with(&nobody));
}

/// Issue 23: an answer that bounces (its dispatcher's address does not exist) was counted as
/// sent; the server's delivery report now marks it undelivered in `tasks`, with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_that_bounces_is_shown_as_undelivered() {
    let Some(host) = mailhost() else { return };
    let agent = host.user("agent");
    let ghost = format!("ghost-{}@{}", uuid::Uuid::new_v4().simple(), host.domain);
    // The agent believes From as written, so a dispatch from an address with no mailbox runs.
    let dir = ConfigDir::new(
        host,
        &support::Toml::new()
            .host_mailbox(host, "agent", &agent, "sender_auth = \"none\"\n")
            .agent("agent", "echo", &[&ghost], "")
            .text(),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let task_id = uuid::Uuid::new_v4().to_string();
    support::inject_mx(
        host,
        &ghost,
        &agent.email,
        &format!(
            "From: {ghost}\nTo: {}\nMessage-ID: <{task_id}@ghost.test>\nSubject: [AAMP Task] hello\nX-AAMP-Version: 1.1\nX-AAMP-Intent: task.dispatch\nX-AAMP-TaskId: {task_id}\nContent-Type: text/plain\n\nTask: echo this\n",
            agent.email
        ),
    );
    let failed = bridge.wait_event("mail.failed", |e| {
        e["taskId"] == task_id.as_str() && e["intent"] == "task.result"
    });
    assert!(
        failed.to_string().contains("the address does not exist"),
        "{failed}"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&dir.run(&["tasks", "--state", "undelivered", "--json"])).unwrap();
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["taskId"] == task_id.as_str())
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        row["undelivered"]
            .as_str()
            .unwrap_or_default()
            .contains("bounced:"),
        "{row}"
    );
}

/// Issue 30: a hostile ACP agent under the default policy (`read_only`), over the mail host.
/// It made a FIFO and asked the bridge to read it, which blocked a runtime worker in `open()`
/// for good (two such reads stopped the bridge reading mail, and SIGTERM no longer stopped
/// it); it read the bridge's own mailbox password through a hard link, and ran `cat` on it
/// in a terminal. Now each is refused, the sender is told what was, and SIGTERM still stops
/// the bridge within its grace period while the agent runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_acp_agent_gets_nothing_and_the_bridge_still_stops() {
    hostile_agent_under("read_only").await;
}

/// The same agent under `deny`: every act refused (reads too), nothing leaked, and SIGTERM
/// still stops the bridge within its grace period.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_acp_agent_under_deny_gets_nothing_and_the_bridge_still_stops() {
    hostile_agent_under("deny").await;
}

/// The same agent under `ask`, with a sender who never answers: the file reads refused as
/// under `read_only`, the terminal asked about by mail, and SIGTERM stops the bridge within
/// its grace period while the agent waits for that answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_acp_agent_under_ask_unanswered_and_the_bridge_still_stops() {
    hostile_agent_under("ask").await;
}

/// The same agent under `allow`: its terminal and write run, the file reads the bridge serves
/// are still confined (no FIFO, no hard link), and SIGTERM stops the bridge within its grace.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_acp_agent_under_allow_is_confined_in_its_reads_and_the_bridge_still_stops() {
    hostile_agent_under("allow").await;
}

async fn hostile_agent_under(permissions: &str) {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &support::one_agent(host, &agent, "hostile.toml", &boss.email)
            .top("shutdown_grace_secs = 5")
            .text(),
    );
    let password = dir.dir.path().join("password");
    assert!(password.exists());
    let ws_marker = "HOSTILE-WS";
    let script = serde_json::json!({"steps": [
        {"say": "Looking around. "},
        {"mkfifo": format!("{ws_marker}/fifo")},
        {"read": format!("{ws_marker}/fifo")},
        {"read": format!("{ws_marker}/fifo")},
        {"read": format!("{ws_marker}/fifo")},
        {"hardlink": [password, format!("{ws_marker}/hard")]},
        {"read": format!("{ws_marker}/hard")},
        {"terminal": {"id": "t1", "command": "cat", "args": [password]}},
        {"write": [format!("{ws_marker}/x.txt"), "x"]},
        {"say": "Waiting."},
        {"sleep": 600}
    ]});
    // The scripted agent takes paths literally: it is told its workspace by a wrapper.
    let wrapper = dir.dir.path().join("hostile.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nsed \"s#{ws_marker}#$PWD#g\" {} > \"$PWD/.script.json\"\nACP_TEST_SCRIPT=\"$PWD/.script.json\" exec python3 {}\n",
            dir.dir.path().join("hostile-script.json").display(),
            support::repo().join("tests/agents/acp_agent.py").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    dir.write("hostile-script.json", &script.to_string());
    dir.write(
        "hostile.toml",
        &format!(
            "kind = \"acp\"\ncommand = {:?}\npermissions = \"{permissions}\"\n",
            wrapper.display().to_string()
        ),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;
    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Look around", "Please look around."))
        .await;
    let task_id = dispatch.task_id().to_string();
    if permissions == "ask" {
        // The terminal is a question to the sender, who does not answer: the agent waits
        // in `terminal/create`, and the bridge must still stop while it does.
        let help = peer.wait_for(&task_id, Intent::TaskHelpNeeded).await;
        let Body::HelpNeeded(h) = &help.message.body else {
            panic!("not help_needed")
        };
        assert!(h.question.contains("cat"), "{}", h.question);
        bridge.take_events();
    } else {
        // Every refusal reached the stream (as failed tool calls and in the agent's
        // words)...
        let waiting = bridge.wait_event("task.stream", |e| {
            e["taskId"] == task_id.as_str()
                && e["type"] == "text.delta"
                && e["payload"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("Waiting."))
        });
        assert_eq!(waiting["taskId"], task_id.as_str());
    }
    let said: String = bridge
        .seen
        .iter()
        .filter(|e| e["taskId"] == task_id.as_str() && e["type"] == "text.delta")
        .filter_map(|e| e["payload"]["text"].as_str())
        .collect();
    if permissions == "deny" {
        // Not even a read: three FIFO reads, the hard link, the terminal and the write.
        assert!(said.matches("refused").count() >= 6, "{said}");
    } else {
        assert_eq!(said.matches("is not a regular file").count(), 3, "{said}");
        assert!(said.contains("hard links"), "{said}");
    }
    if permissions == "allow" {
        // The agent may run and write what it likes (it has the user's rights, as with its
        // own shell); what the bridge serves as files is confined all the same.
        assert!(!said.contains("terminal refused"), "{said}");
        assert!(!said.contains("write: refused"), "{said}");
    } else {
        if permissions != "ask" {
            assert!(
                said.contains("terminal refused: refused: running `cat"),
                "{said}"
            );
            assert!(
                said.contains("write: refused: refused: writing x.txt"),
                "{said}"
            );
        }
        let secret = std::fs::read_to_string(&password).unwrap();
        assert!(
            !said.contains(secret.trim()),
            "the password reached the agent: {said}"
        );
    }
    // ...and the bridge still reads mail while the agent runs: a second task is acked.
    let second = peer
        .send(peer.dispatch_to(&agent.email, "Another", "Are you there?"))
        .await;
    peer.wait_for(second.task_id(), Intent::TaskAck).await;
    // SIGTERM stops it within the grace period (5 s), the agent with it.
    let stopping = std::time::Instant::now();
    bridge.signal(nix::sys::signal::Signal::SIGTERM);
    let status = bridge.wait_exit();
    let took = stopping.elapsed();
    assert!(status.success(), "{status:?}\n{}", bridge.log());
    assert!(
        took < std::time::Duration::from_secs(15),
        "stopping took {took:?}"
    );
}
