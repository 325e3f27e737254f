//! The SAMP back-end end to end: a real bridge process polls the SAMP imitation
//! (tests/hosts/samp_server.py, an MCP server over Streamable HTTP, run with the test venv's
//! python, which has `mcp`) and answers in the thread, exactly once: across a SIGKILL while
//! the task runs, a revoked key, the send rate and a full inbox. No mail host is involved.

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::{Bridge, ConfigDir, SampPeer as Peer, SampServer as Server};

async fn setup(profile: &str) -> (Server, Peer, String, ConfigDir) {
    let server = Server::start();
    let key = server.agent("coder").await;
    let boss = server.peer("boss").await;
    let dir = server.agent_config("coder", &key, "boss@127.0.0.1", profile);
    (server, boss, key, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_is_answered_in_its_thread_once_and_acked() {
    let (server, boss, _, dir) = setup("echo").await;
    let mut bridge = Bridge::start(&dir, 1);
    let sent = boss.send("coder", "Greet", "say hello", None).await;
    let replies = server
        .replies("coder", &sent, 1, Duration::from_secs(60))
        .await;
    let reply = &replies[0];
    assert_eq!(reply["to"], "boss");
    assert_eq!(reply["subject"], "Re: Greet", "a reply reads like one");
    assert!(
        reply["body"].as_str().unwrap().contains("say hello"),
        "{reply}"
    );
    assert_eq!(reply["data"]["aamp"]["intent"], "task.result", "{reply}");
    let task = reply["data"]["aamp"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(task.starts_with("samp:thr_"), "{task}");
    bridge.wait_event("task.completed", |e| e["taskId"] == task.as_str());
    // The task was acked (only once the journal held it), and the answer is in its thread.
    let coder = server
        .control(reqwest::Method::GET, "/test/mailbox/coder", None)
        .await;
    assert_eq!(coder["unread"], 0, "{coder}");
    let task_row = coder["inbox"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == sent.as_str())
        .unwrap()
        .clone();
    assert!(task_row["acked_at"].is_string());
    assert_eq!(reply["thread_id"], task_row["thread_id"]);
    // The answer, read by boss, starts nothing on the bridge's side; a second task is
    // answered, the first not again.
    boss.read_all().await;
    let second = boss.send("coder", "Again", "say it again", None).await;
    server
        .replies("coder", &second, 1, Duration::from_secs(60))
        .await;
    assert_eq!(
        server
            .replies("coder", &sent, 1, Duration::ZERO)
            .await
            .len(),
        1
    );
    // A sender the policy does not allow is refused in the thread; nothing runs.
    let stranger = server.peer("stranger").await;
    let refused = stranger.send("coder", "Do it", "rm -rf /", None).await;
    let answer = server
        .replies("coder", &refused, 1, Duration::from_secs(60))
        .await;
    assert!(
        answer[0]["body"].as_str().unwrap().contains("rejected"),
        "{answer:?}"
    );
    server.no_invalid_calls();
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_killed_mid_task_answers_once_after_its_restart() {
    let (server, boss, _, dir) = setup("echo").await;
    let gate = dir.use_gated_profile();
    let mut bridge = Bridge::start(&dir, 1);
    let sent = boss.send("coder", "Once", "only once", None).await;
    bridge.wait_event("task.started", |_| true);
    bridge.kill();
    std::fs::write(&gate, "").unwrap();
    let mut bridge = Bridge::start(&dir, 1);
    let replies = server
        .replies("coder", &sent, 1, Duration::from_secs(90))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let replies_now = server.replies("coder", &sent, 1, Duration::ZERO).await;
    assert_eq!(replies_now.len(), 1, "answered twice: {replies_now:?}");
    assert!(replies[0]["body"].as_str().unwrap().contains("only once"));
    // And it goes on answering.
    let next = boss.send("coder", "Next", "second", None).await;
    assert_eq!(
        server
            .replies("coder", &next, 1, Duration::from_secs(60))
            .await
            .len(),
        1
    );
    bridge.take_events();
    server.no_invalid_calls();
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_key_is_shown_by_status_and_a_new_key_file_fixes_it_at_reload() {
    let (server, boss, key, dir) = setup("echo").await;
    let bridge = Bridge::start(&dir, 1);
    let sent = boss.send("coder", "Hello", "with the key", None).await;
    server
        .replies("coder", &sent, 1, Duration::from_secs(60))
        .await;
    server.revoke(&key).await;
    bridge
        .wait_log("the SAMP server refused the credentials")
        .await;
    dir.assert_status_refused();
    let text = dir.run(&["status"]);
    assert!(
        text.contains("401") && text.contains("revoked"),
        "the server's words: {text}"
    );
    assert!(
        !text.contains(&key) && !bridge.log().contains(&key),
        "never shown"
    );
    // A new key in the file, and a reload.
    let fresh = server.new_key("coder").await;
    dir.replace_private("samp.key", &fresh);
    // The refused key's file is watched too: the bridge may have read it before the command.
    let said = dir.run(&["reload"]);
    assert!(
        said.contains("credentials reloaded for coder")
            || said.contains("credentials of coder unchanged, and they work"),
        "{said}"
    );
    let after = boss.send("coder", "After", "with the new key", None).await;
    server
        .replies("coder", &after, 1, Duration::from_secs(30))
        .await;
    let json = dir.status_json();
    assert_eq!(json["agents"][0]["link"]["mailbox"], "connected", "{json}");
    assert!(!bridge.log().contains(&fresh));
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_send_rate_and_a_full_inbox_are_waited_out_none_lost_none_twice() {
    let (server, boss, _, dir) = setup("echo").await;
    let gate = dir.use_gated_profile();
    let mut bridge = Bridge::start(&dir, 1);
    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push(
            boss.send("coder", &format!("Task {i}"), &format!("number {i}"), None)
                .await,
        );
    }
    bridge.wait_event("task.started", |_| true);
    // The rate drops below what whoami said: the server refuses with rate_limited.
    server.config(json!({"sends_per_minute": 2})).await;
    std::fs::write(&gate, "").unwrap();
    let started = std::time::Instant::now();
    for task in &tasks {
        server
            .replies("coder", task, 1, Duration::from_secs(150))
            .await;
    }
    assert!(
        started.elapsed() > Duration::from_secs(20),
        "paced, not at once"
    );
    assert!(
        bridge.log().contains("waiting as it asks"),
        "{}",
        bridge.log()
    );
    boss.read_all().await;
    // A full inbox: boss takes one unread message; the second answer waits.
    server
        .config(json!({"sends_per_minute": 30, "max_unread": 1}))
        .await;
    let a = boss.send("coder", "A", "first", None).await;
    server
        .replies("coder", &a, 1, Duration::from_secs(60))
        .await;
    // Boss holds the answer to A unread: the answer to B meets a full inbox.
    let b = boss.send("coder", "B", "second", None).await;
    bridge.wait_log("inbox_full").await;
    let status = dir.run(&["status"]);
    let _ = status;
    boss.read_all().await;
    server
        .replies("coder", &b, 1, Duration::from_secs(60))
        .await;
    for task in tasks.iter().chain([&a, &b]) {
        assert_eq!(
            server.replies("coder", task, 1, Duration::ZERO).await.len(),
            1,
            "once each"
        );
    }
    server.no_invalid_calls();
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_100_kb_answer_is_cut_to_the_body_limit_with_a_note() {
    let (server, boss, _, dir) = setup("echo").await;
    dir.use_profile(
        "big.toml",
        "command = \"python3\"\nargs = [\"-c\", \"import sys; sys.stdin.read(); print('x' * 100000)\"]\nstdin = \"{{prompt}}\"\ntimeout_secs = 60\n",
    );
    let bridge = Bridge::start(&dir, 1);
    let sent = boss.send("coder", "Big", "a lot", None).await;
    let reply = &server
        .replies("coder", &sent, 1, Duration::from_secs(60))
        .await[0];
    let body = reply["body"].as_str().unwrap();
    assert!(body.len() <= 32 * 1024, "{}", body.len());
    assert!(
        body.contains("[cut: the answer is 10000"),
        "{}",
        &body[body.len() - 300..]
    );
    server.no_invalid_calls();
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn three_turns_in_a_thread_are_one_conversation() {
    let (server, boss, _, dir) = setup("echo-prompt").await;
    let bridge = Bridge::start(&dir, 1);
    let mut parent: Option<String> = None;
    let mut last = String::new();
    for (i, word) in ["apple", "banana", "cherry"].iter().enumerate() {
        let sent = boss
            .send(
                "coder",
                "Fruit",
                &format!("turn {i}: {word}"),
                parent.as_deref(),
            )
            .await;
        let reply = server
            .replies("coder", &sent, 1, Duration::from_secs(60))
            .await[0]
            .clone();
        parent = Some(reply["id"].as_str().unwrap().to_string());
        last = reply["body"].as_str().unwrap().to_string();
        boss.read_all().await;
    }
    // One thread, one conversation (its Session-Key is the thread); each turn answered.
    assert!(last.contains("cherry"), "{last}");
    let threads: std::collections::HashSet<String> = server
        .sent_by("coder")
        .await
        .iter()
        .map(|m| m["thread_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(threads.len(), 1, "{threads:?}");
    server.no_invalid_calls();
    assert!(bridge.stop().success());
}

/// The loop guard between two bridges on one SAMP server, whose agents allow each other: an
/// answer carries the bridge's intent in its `data`, so the other bridge never runs it as a
/// task (two bridges would otherwise answer each other's answers forever), and a task passed
/// on between agents too often (its `data.aamp.hopCount`) is answered rejected, not run.
#[tokio::test(flavor = "multi_thread")]
async fn two_bridges_that_allow_each_other_do_not_answer_each_others_answers() {
    let server = Server::start();
    let coder_key = server.agent("coder").await;
    let helper_key = server.agent("helper").await;
    let coder_dir = server.agent_config("coder", &coder_key, "helper@127.0.0.1", "echo");
    let helper_dir = server.agent_config("helper", &helper_key, "coder@127.0.0.1", "echo");
    let mut coder_bridge = Bridge::start(&coder_dir, 1);
    let mut helper_bridge = Bridge::start(&helper_dir, 1);
    // The helper's side asks the coder (as its agent would, with its own key).
    let helper = Peer {
        url: server.url.clone(),
        key: helper_key.clone(),
    };
    let sent = helper.send("coder", "Start", "say hello", None).await;
    let answers = server
        .replies("coder", &sent, 1, Duration::from_secs(60))
        .await;
    let task = answers[0]["data"]["aamp"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    coder_bridge.wait_event("task.completed", |e| e["taskId"] == task.as_str());
    // The helper's bridge reads the answer and lets it go: it is not a task.
    let ignored = helper_bridge.wait_event("message.ignored", |e| e["taskId"] == task.as_str());
    assert!(
        ignored["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("Auto-Submitted"),
        "{ignored}"
    );
    // A task passed on too often is refused by the loop guard, in the thread.
    let relayed = helper
        .call(
            "send_message",
            json!({"to": "coder", "subject": "Pass it on", "body": "and on",
                   "data": {"aamp": {"intent": "task.dispatch", "hopCount": 50}}}),
        )
        .await["message_id"]
        .as_str()
        .unwrap()
        .to_string();
    let refused = server
        .replies("coder", &relayed, 1, Duration::from_secs(60))
        .await;
    assert!(
        refused[0]["body"]
            .as_str()
            .unwrap_or_default()
            .contains("loop guard"),
        "{refused:?}"
    );
    let refused_task = refused[0]["data"]["aamp"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    helper_bridge.wait_event("message.ignored", |e| e["taskId"] == refused_task.as_str());
    assert!(helper_bridge.stop().success());
    assert!(coder_bridge.stop().success());
    // Nothing after: the helper's bridge answered neither answer, and the coder answered
    // each message once.
    let helper_sent = server.sent_by("helper").await;
    assert_eq!(helper_sent.len(), 2, "only the two tasks: {helper_sent:?}");
    let coder_sent = server.sent_by("coder").await;
    assert_eq!(coder_sent.len(), 2, "one answer each: {coder_sent:?}");
    server.no_invalid_calls();
}

/// Exactly once when the server took an answer and its confirmation was lost (the bridge
/// killed, or the connection dropped, right after the send) and the recipient acked it
/// before the retry: ack clears the `data` that names the answer, so the thread showed
/// nothing to match and the answer went out twice. The bridge now keeps the answers the
/// server confirmed (`samp-sent`) and takes an acked answer of its own, sent after the
/// answer was made, that it never saw confirmed, as the one it retries.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_whose_confirmation_was_lost_is_not_sent_again_after_its_recipient_acked_it() {
    let (server, boss, _, dir) = setup("echo").await;
    server
        .config(
            json!({"lose_send_answers": 1, "lose_send_answers_of": "coder",
                      "lose_send_answers_acked": true}),
        )
        .await;
    let mut bridge = Bridge::start(&dir, 1);
    let sent = boss.send("coder", "Once", "only once", None).await;
    server
        .replies("coder", &sent, 1, Duration::from_secs(60))
        .await;
    // Acked at once (the server's hook acks it just after storing it, before the bridge hears
    // of the lost confirmation), so without its data: the TaskId is the thread's and the
    // task's ids.
    let (srv, id) = (&server, sent.as_str());
    let first = support::poll(
        "the answer acked by its recipient",
        Duration::from_secs(30),
        move || async move {
            let replies = srv.replies("coder", id, 1, Duration::ZERO).await;
            replies[0]["data"].is_null().then_some(replies)
        },
    )
    .await;
    let task = format!("samp:{}:{sent}", first[0]["thread_id"].as_str().unwrap());
    // The outbox settles the answer (its retry goes through): sent once, not twice.
    let settled = bridge.wait_event("mail.sent", |e| {
        e["taskId"] == task.as_str() && e["intent"] == "task.result"
    });
    assert_eq!(settled["attempt"], 2, "{settled}");
    let replies = server.replies("coder", &sent, 1, Duration::ZERO).await;
    assert_eq!(replies.len(), 1, "answered twice: {replies:?}");
    assert!(bridge.log().contains("taken as this one, not sent again"));
    // And it goes on answering.
    let next = boss.send("coder", "Next", "second", None).await;
    server
        .replies("coder", &next, 1, Duration::from_secs(60))
        .await;
    let lost: Vec<String> = support::lines(&server.dir.path().join("record.jsonl"))
        .into_iter()
        .filter(|l| l.contains("answer_lost"))
        .collect();
    assert_eq!(lost.len(), 1, "the hook lost one answer: {lost:?}");
    server.no_invalid_calls();
    assert!(bridge.stop().success());
}

/// `init --answers` sets up a SAMP agent as it does an ASMTP or AMP one: the mailbox is read
/// once before anything is written (a refused key ends it with the server's words, no config
/// written), the key stays in its file, and the agent then answers.
#[tokio::test(flavor = "multi_thread")]
async fn init_from_answers_sets_up_a_samp_agent_that_answers() {
    let server = Server::start();
    let key = server.agent("coder").await;
    let boss = server.peer("boss").await;
    let dir = ConfigDir::empty();
    let init = |key: &str| {
        dir.write_private("coder.samp-key", key);
        let answers = json!({
            "state_dir": "state",
            "agents": [{"name": "coder", "profile": "echo", "allow_from": ["boss@127.0.0.1"],
                        "mailbox": {"kind": "samp", "samp_url": server.url,
                                    "key_file": "coder.samp-key"}}]
        });
        dir.write("answers.json", &answers.to_string());
        Command::new(support::bin())
            .arg("--config")
            .arg(dir.config())
            .args(["init", "--non-interactive", "--json", "--answers"])
            .arg(dir.config().with_file_name("answers.json"))
            .output()
            .unwrap()
    };

    let refused = init("amk_not_a_key_of_this_server");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(err.contains("SAMP") && err.contains("401"), "{err}");
    assert!(
        !dir.config().exists(),
        "nothing written for a mailbox that does not work"
    );

    let out = init(&key);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let applied: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(applied["agents"][0]["how"], "samp", "{applied}");
    assert_eq!(applied["agents"][0]["email"], "coder", "{applied}");
    let text = std::fs::read_to_string(dir.config()).unwrap();
    assert!(
        text.contains("kind = \"samp\"") && text.contains("key_file = \"coder.samp-key\""),
        "{text}"
    );
    assert!(!text.contains(&key), "the key stays in its file: {text}");

    let bridge = Bridge::start(&dir, 1);
    let sent = boss.send("coder", "Greet", "say hello", None).await;
    let replies = server
        .replies("coder", &sent, 1, Duration::from_secs(60))
        .await;
    assert!(
        replies[0]["body"].as_str().unwrap().contains("say hello"),
        "{replies:?}"
    );
    assert!(bridge.stop().success());
}
