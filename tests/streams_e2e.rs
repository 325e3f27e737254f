//! Live task streams through the AAMP helper API (the test host in tests/hosts), end to end
//! over the real mail host.

mod support;

use aamp_bridge::protocol::{Body, Intent, Status};
use support::{header, mailhost, AampHost, Bridge, ConfigDir, Peer};

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_deltas_stream_in_order_in_few_appends_and_close_before_the_result() {
    let Some(host) = mailhost() else { return };
    let aamp = AampHost::start();
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let settings = format!("poll_interval_secs = 1\naamp_url = \"{}\"\n", aamp.url);
    let config = format!(
        "{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"chatty.toml\"\nallow_from = [\"{}\"]\n",
        host.mailbox_toml_with("agent", &agent, &settings),
        boss.email
    );
    let dir = ConfigDir::new(host, &config);
    // An agent that streams 1,000 small text deltas, a tool call, then its result.
    let words: Vec<String> = (0..1000).map(|i| format!("w{i} ")).collect();
    let mut lines: Vec<String> = words
        .iter()
        .map(|w| serde_json::json!({"type": "delta", "text": w}).to_string())
        .collect();
    lines.insert(
        500,
        r#"{"type":"tool_start","tool_call_id":"t1","name":"grep","input":{"q":"x"}}"#.to_string(),
    );
    lines.push(serde_json::json!({"type": "result", "text": "done streaming"}).to_string());
    dir.write("chatty.ndjson", &(lines.join("\n") + "\n"));
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/scripted_cli.py");
    dir.write(
        "chatty.toml",
        &format!("command = \"python3\"\nargs = [{:?}, {:?}]\nstdin = \"{{{{prompt}}}}\"\nstream = \"ndjson\"\n", script.display(), dir.dir.path().join("chatty.ndjson").display()),
    );
    let _bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;

    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Talk a lot", "Stream please."))
        .await;
    let task_id = dispatch.task_id().to_string();
    let opened = peer.wait_for(&task_id, Intent::TaskStreamOpened).await;
    let Body::StreamOpened { stream_id } = &opened.message.body else {
        panic!("not stream.opened")
    };
    let raw = peer.raw_headers(&opened.email_id).await;
    assert_eq!(header(&raw, "X-AAMP-Stream-Id"), Some(stream_id.as_str()));

    let result = peer.wait_for(&task_id, Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed);
    assert_eq!(r.output, "done streaming");

    // By the time the result arrived, the stream was complete and closed.
    let actions = aamp.actions();
    let kinds: Vec<&str> = actions
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"aamp.stream.create"));
    assert_eq!(
        kinds.last(),
        Some(&"aamp.stream.close"),
        "closed, and nothing after: {kinds:?}"
    );
    assert!(
        actions.iter().all(|a| a["owner"] == agent.email.as_str()),
        "authenticated as the agent's mailbox"
    );
    let appends: Vec<&serde_json::Value> = actions
        .iter()
        .filter(|a| a["action"] == "aamp.stream.append")
        .collect();
    assert!(appends
        .iter()
        .all(|a| a["body"]["streamId"] == stream_id.as_str()));
    let text: String = appends
        .iter()
        .filter(|a| a["body"]["type"] == "text.delta")
        .map(|a| a["body"]["payload"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, words.concat(), "every delta, in order");
    let text_appends = appends
        .iter()
        .filter(|a| a["body"]["type"] == "text.delta")
        .count();
    eprintln!(
        "1,000 text deltas ({} characters) went out in {text_appends} appends",
        text.len()
    );
    assert!(
        text_appends < 100,
        "1,000 deltas took {text_appends} appends"
    );
    let tool_at = appends
        .iter()
        .position(|a| a["body"]["type"] == "tool_call")
        .expect("the tool call was streamed");
    let text_before: String = appends[..tool_at]
        .iter()
        .filter_map(|a| a["body"]["payload"]["text"].as_str())
        .collect();
    assert_eq!(
        text_before,
        words[..500].concat(),
        "the tool call sits between the same deltas as in the agent's output"
    );
    assert_eq!(
        actions.last().unwrap()["body"]["payload"]["status"],
        "completed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_the_server_closed_ends_quietly() {
    let Some(host) = mailhost() else { return };
    let aamp = AampHost::start();
    let mut me = host.user("streamer");
    me.aamp_url = Some(url::Url::parse(&aamp.url).unwrap());
    let api =
        aamp_bridge::mailbox::aamp::helper::HelperApi::discover(me.aamp_url.as_ref().unwrap(), &me)
            .await
            .unwrap();
    let stream = api
        .create_stream("t-closed", "someone@example.test")
        .await
        .unwrap();
    api.close(&stream, &serde_json::json!({"reason": "test"}))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for i in 0..10 {
        tx.send((
            "tool_call",
            serde_json::json!({"toolCallId": format!("t{i}"), "label": "x", "status": "running"}),
        ))
        .await
        .unwrap();
    }
    drop(tx);
    assert_eq!(
        api.pump(&stream, rx).await,
        0,
        "nothing is appended to a closed stream"
    );
    let state = api
        .stream_state("t-closed")
        .await
        .unwrap()
        .expect("the task has a stream");
    assert_eq!(
        (state["streamId"].as_str(), state["status"].as_str()),
        (Some(stream.as_str()), Some("closed"))
    );
    assert!(api.stream_state("no-such-task").await.unwrap().is_none());
    let appends = aamp
        .actions()
        .iter()
        .filter(|a| a["action"] == "aamp.stream.append")
        .count();
    assert_eq!(appends, 1, "after the first 409 the pump stops asking");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mailbox_is_registered_once_and_its_credentials_are_reused() {
    use std::os::unix::fs::PermissionsExt;
    let Some(host) = mailhost() else { return };
    let aamp = AampHost::start();
    let boss = host.user("boss");
    let config = format!(
        "[mailboxes.agent]\ncredentials_file = \"agent-credentials.json\"\naamp_url = \"{}\"\nslug = \"coder\"\ndescription = \"a test agent\"\njmap_url = \"{}\"\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {}\nsmtp_security = \"plain\"\npoll_interval_secs = 1\n\n[[agents]]\nname = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\n",
        aamp.url, host.jmap_url, host.smtp_port, boss.email
    );
    let dir = ConfigDir::new(host, &config);
    let mut peer = Peer::new(boss).await;

    let mut bridge = Bridge::start(&dir, 1);
    let registered = bridge.wait_event("mailbox.registered", |_| true);
    let email = registered["email"].as_str().unwrap().to_string();
    assert!(
        email.starts_with("coder-") && email.ends_with(&format!("@{}", host.domain)),
        "{email}"
    );
    let file = dir.dir.path().join("agent-credentials.json");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600,
        "the credentials are private"
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["email"], email.as_str());
    assert!(
        !bridge
            .log()
            .contains(saved["smtpPassword"].as_str().unwrap()),
        "the password never reaches the log"
    );

    let first = peer
        .send(peer.dispatch_to(&email, "Hello new mailbox", "are you there?"))
        .await;
    peer.wait_for(first.task_id(), Intent::TaskResult).await;
    assert!(bridge.stop().success());

    // The next start reuses the saved credentials: no second registration.
    let mut bridge = Bridge::start(&dir, 1);
    let second = peer
        .send(peer.dispatch_to(&email, "Again", "still there?"))
        .await;
    let result = peer.wait_for(second.task_id(), Intent::TaskResult).await;
    assert_eq!(result.message.envelope.from, email);
    bridge.wait_event("task.completed", |e| e["taskId"] == second.task_id());
    assert!(!bridge
        .seen
        .iter()
        .any(|e| e["event"] == "mailbox.registered"));
    let registrations = aamp
        .actions()
        .iter()
        .filter(|a| a["action"] == "aamp.mailbox.register")
        .count();
    assert_eq!(registrations, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_card_is_published_and_a_follow_up_sees_its_thread() {
    let Some(host) = mailhost() else { return };
    let aamp = AampHost::start();
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let settings = format!("poll_interval_secs = 1\naamp_url = \"{}\"\n", aamp.url);
    let config = format!(
        "{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo-prompt\"\nallow_from = [\"{}\"]\nsummary = \"Reviews Rust code\"\ncard = \"# Reviewer\\nI review Rust pull requests.\"\n",
        host.mailbox_toml_with("agent", &agent, &settings),
        boss.email
    );
    let dir = ConfigDir::new(host, &config);
    let mut bridge = Bridge::start(&dir, 1);
    bridge.wait_event("agent.card", |_| true);
    let upsert = aamp
        .actions()
        .into_iter()
        .find(|a| a["action"] == "aamp.directory.upsert")
        .expect("the card was published");
    assert_eq!(upsert["owner"], agent.email.as_str());
    assert_eq!(
        upsert["body"],
        serde_json::json!({"summary": "Reviews Rust code", "cardText": "# Reviewer\nI review Rust pull requests."})
    );

    let mut peer = Peer::new(boss.clone()).await;
    let first = peer
        .send(peer.dispatch_to(
            &agent.email,
            "Review PR 7",
            "Please review PR 7 for unsafe code.",
        ))
        .await;
    peer.wait_for(first.task_id(), Intent::TaskResult).await;

    let mut follow_up = peer.dispatch_to(
        &agent.email,
        "Review PR 7 again",
        "And now the second commit.",
    );
    if let Body::Dispatch(d) = &mut follow_up.body {
        d.parent_task_id = Some(first.task_id().to_string());
    }
    let follow_up = peer.send(follow_up).await;
    let result = peer.wait_for(follow_up.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    // The echo agent answers with its prompt, which now carries the earlier thread.
    assert!(r.output.contains("Earlier in the thread"), "{}", r.output);
    assert!(
        r.output
            .contains(&format!("[task.dispatch from {}]", boss.email)),
        "{}",
        r.output
    );
    assert!(
        r.output.contains("Please review PR 7 for unsafe code."),
        "{}",
        r.output
    );
    assert!(aamp
        .actions()
        .iter()
        .any(|a| a["action"] == "aamp.mailbox.thread" && a["body"]["taskId"] == first.task_id()));
}

#[tokio::test(flavor = "multi_thread")]
async fn everything_can_go_through_the_aamp_service_alone() {
    let Some(host) = mailhost() else { return };
    let aamp = AampHost::start();
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    // JMAP, its WebSocket push and the helper API all at the service's address.
    let settings = format!(
        "poll_interval_secs = 300\nreconcile_interval_secs = 300\naamp_url = \"{url}\"\n",
        url = aamp.url
    );
    let mailbox = host
        .mailbox_toml_with("agent", &agent, &settings)
        .replace(&host.jmap_url, &format!("{}/.well-known/jmap", aamp.url));
    let config = format!("{mailbox}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\n", boss.email);
    let dir = ConfigDir::new(host, &config);
    let mut bridge = Bridge::start(&dir, 1);
    let push = bridge.wait_event("mailbox.push", |e| e["connected"] == true);
    assert_eq!(
        push["transport"], "websocket",
        "push through the service's WebSocket pass-through"
    );
    let mut peer = Peer::new(boss).await;
    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Through the front door", "hello"))
        .await;
    // With polling minutes away, this is push through the pass-through.
    bridge.wait_event("task.received", |e| e["taskId"] == dispatch.task_id());
    let result = peer.wait_for(dispatch.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed);
    // `echo` emits no stream events: no stream is opened for it, and no stream.opened mail
    // is sent (a stream opens with the first event).
    assert!(
        !aamp
            .actions()
            .iter()
            .any(|a| a["action"] == "aamp.stream.create"),
        "no stream for a task without events"
    );
    assert!(!peer
        .intents_for(dispatch.task_id())
        .contains(&Intent::TaskStreamOpened));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_sent_through_the_service_is_answered_and_its_stream_can_be_followed() {
    let Some(host) = mailhost() else { return };
    let aamp = AampHost::start();
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let settings = format!("poll_interval_secs = 1\naamp_url = \"{}\"\n", aamp.url);
    let config = format!(
        "{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"streaming.toml\"\nallow_from = [\"{}\"]\n",
        host.mailbox_toml_with("agent", &agent, &settings),
        boss.email
    );
    let dir = ConfigDir::new(host, &config);
    write_streaming_agent(&dir);
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;

    // A dispatcher on the HTTP send path (no In-Reply-To, no References).
    let http = reqwest::Client::new();
    let sent: serde_json::Value = http
        .post(format!("{}/api/aamp?action=aamp.mailbox.send", aamp.url))
        .basic_auth(&boss.email, Some(boss.password.value()))
        .json(&serde_json::json!({
            "to": agent.email,
            "subject": "[AAMP Task] Sent over HTTP",
            "text": "hello over the helper API",
            "aampHeaders": {"X-AAMP-Version": "1.1", "X-AAMP-Intent": "task.dispatch", "X-AAMP-TaskId": "http-task-1"}
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(sent["ok"], true, "{sent}");
    let result = peer.wait_for("http-task-1", Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.output, "Hello world");
    assert_eq!(
        result.message.envelope.in_reply_to.as_deref(),
        sent["messageId"].as_str(),
        "threaded under the HTTP-sent dispatch"
    );
    bridge.wait_event("task.completed", |e| e["taskId"] == "http-task-1");

    // The dispatcher follows the task's stream over SSE, resuming after an event id; the
    // server ends the SSE response once the stream is closed.
    let state: serde_json::Value = http
        .get(format!(
            "{}/api/aamp?action=aamp.stream.get&taskId=http-task-1",
            aamp.url
        ))
        .basic_auth(&boss.email, Some(boss.password.value()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["status"], "closed");
    let stream_id = state["streamId"].as_str().unwrap();
    let events = |last: Option<String>| {
        let mut request = http
            .get(format!("{}/api/aamp/streams/{stream_id}/events", aamp.url))
            .basic_auth(&boss.email, Some(boss.password.value()));
        if let Some(id) = last {
            request = request.header("Last-Event-ID", id);
        }
        async move {
            let text = request.send().await.unwrap().text().await.unwrap();
            text.split("\n\n")
                .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
                .map(|d| serde_json::from_str::<serde_json::Value>(d).unwrap())
                .collect::<Vec<_>>()
        }
    };
    let all = events(None).await;
    let kinds: Vec<&str> = all.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        vec!["text.delta", "tool_call", "tool_call"],
        "what the agent streamed: {all:#?}"
    );
    let seqs: Vec<u64> = all.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=all.len() as u64).collect::<Vec<_>>(),
        "in order, none missing"
    );
    let rest = events(Some(all[0]["id"].as_str().unwrap().to_string())).await;
    assert_eq!(
        rest,
        all[1..].to_vec(),
        "Last-Event-ID resumes after that event"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_publishes_the_changed_card_and_card_queries_see_it() {
    let Some(host) = mailhost() else { return };
    let aamp = AampHost::start();
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let settings = format!("poll_interval_secs = 1\naamp_url = \"{}\"\n", aamp.url);
    let config = |card: &str| {
        format!(
            "{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\nsummary = \"Reviews code\"\ncard = \"{card}\"\n",
            host.mailbox_toml_with("agent", &agent, &settings),
            boss.email
        )
    };
    let dir = ConfigDir::new(host, &config("first card"));
    let mut bridge = Bridge::start(&dir, 1);
    bridge.wait_event("agent.card", |_| true);
    dir.write(
        "config.toml",
        &format!("state_dir = \"state\"\n{}", config("second card")),
    );
    bridge.signal(nix::sys::signal::Signal::SIGHUP);
    bridge.wait_event("bridge.reloaded", |_| true);
    let cards: Vec<String> = aamp
        .actions()
        .into_iter()
        .filter(|a| a["action"] == "aamp.directory.upsert")
        .map(|a| {
            a["body"]["cardText"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(cards, vec!["first card", "second card"]);

    let mut peer = Peer::new(boss.clone()).await;
    let mut query = peer.dispatch_to(&agent.email, "card", "");
    query.body = Body::CardQuery {
        text: "who are you?".into(),
    };
    query.envelope.subject = query.subject();
    let query = peer.send(query).await;
    let card = peer.wait_for(query.task_id(), Intent::CardResponse).await;
    assert!(
        matches!(&card.message.body, Body::CardResponse { text, .. } if text.trim() == "second card"),
        "{:?}",
        card.message.body
    );
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn dispatch_follow_prints_the_live_stream_then_the_result() {
    let Some(host) = mailhost() else { return };
    let aamp = AampHost::start();
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let settings = format!("poll_interval_secs = 1\naamp_url = \"{}\"\n", aamp.url);
    let config = format!(
        "{}{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"streaming.toml\"\nallow_from = [\"{}\"]\n",
        host.mailbox_toml_with("agent", &agent, &settings),
        host.mailbox_toml_with("boss", &boss, &settings),
        boss.email
    );
    let dir = ConfigDir::new(host, &config);
    write_streaming_agent(&dir);
    // Only the agent runs; the boss mailbox is only the dispatcher's.
    let mut bridge = Bridge::start(&dir, 1);
    for json in [false, true] {
        let mut args = vec![
            "--config".to_string(),
            dir.config().display().to_string(),
            "dispatch".into(),
            "--from".into(),
            "boss".into(),
            "--to".into(),
            agent.email.clone(),
            "--follow".into(),
            "--timeout".into(),
            "120".into(),
        ];
        if json {
            args.push("--json".into());
        }
        args.push("say hello".into());
        let out = tokio::process::Command::new(support::bin())
            .args(&args)
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if json {
            let lines: Vec<serde_json::Value> = stdout
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let kinds: Vec<&str> = lines.iter().filter_map(|e| e["type"].as_str()).collect();
            assert_eq!(
                kinds,
                vec!["text.delta", "tool_call", "tool_call"],
                "{stdout}"
            );
            assert_eq!(lines.last().unwrap()["intent"], "task.result", "{stdout}");
        } else {
            let deltas = stdout.find("Hello world").expect("the text as it streamed");
            let tool = stdout.find("• grep").expect("tool calls as lines");
            assert!(deltas < tool, "{stdout}");
        }
    }
    bridge.wait_event("task.completed", |_| true);
}

/// `streaming.toml`: a CLI replaying the generic NDJSON stream (text, then two tool calls).
fn write_streaming_agent(dir: &ConfigDir) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    dir.write(
        "streaming.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}, {:?}]\nstdin = \"{{{{prompt}}}}\"\nstream = \"ndjson\"\n",
            repo.join("tests/agents/scripted_cli.py").display(),
            repo.join("tests/fixtures/streams/generic.ndjson").display()
        ),
    );
}
