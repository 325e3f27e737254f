//! The ASMTP back-end end to end: a real bridge process reads an ASMTP operator
//! (tests/hosts/asmtp_operator.py, the wire rules of the reference operator) with WebSocket
//! push and keyset catch-up, and answers with reply envelopes, exactly once: across a dropped
//! push connection and an operator restart, and across a SIGKILL while its reply was posted
//! (the resend carries the same client id and body, a no-op at the operator).

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::{envelope_text as text_of, ulid, AsmtpOperator as Operator, Bridge, ConfigDir};

#[tokio::test(flavor = "multi_thread")]
async fn an_envelope_is_answered_by_push_with_one_reply_and_again_after_the_push_drops() {
    let mut operator = Operator::start(&["@alice.coder", "@alice.boss", "@eve.stranger"], &[]);
    // Polling every ten minutes: within this test, mail is read by push, or by the catch-up
    // that follows a (re)connection.
    let dir = operator.config("@alice.coder", "@alice.*", 600);
    let mut bridge = Bridge::start(&dir, 1);
    wait_push_connected(&mut bridge, 1);

    let sent = operator
        .send("@alice.boss", "@alice.coder", "Greet", "say hello")
        .await;
    let replies = operator.replies("@alice.boss", &sent).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    let reply = &replies[0];
    assert_eq!(reply["from"], "@alice.coder");
    assert_eq!(reply["references"], json!([sent]));
    assert!(text_of(reply).contains("say hello"), "{reply}");
    let data = reply["content_parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "data")
        .expect("the status as data");
    assert_eq!(data["data"]["status"], "completed");

    // A sender the policy does not allow: refused in a reply, nothing run.
    let refused = operator
        .send("@eve.stranger", "@alice.coder", "Do it", "rm -rf /")
        .await;
    let answer = operator.replies("@eve.stranger", &refused).await;
    assert_eq!(answer.len(), 1);
    assert!(text_of(&answer[0]).contains("rejected"), "{answer:?}");

    // The operator restarts: the push connection drops. What is sent meanwhile is read by the
    // catch-up when the bridge reconnects.
    let connects = |op: &Operator| {
        op.record()
            .iter()
            .filter(|r| r["path"] == "/connect")
            .count()
    };
    let before = connects(&operator);
    // Stopped as a service is (SIGTERM: the push socket is closed with 1001), then started.
    operator.terminate();
    operator.restart();
    let later = operator
        .send("@alice.boss", "@alice.coder", "Later", "after the drop")
        .await;
    let replies = operator.replies("@alice.boss", &later).await;
    assert_eq!(replies.len(), 1);
    support::poll_until("push reconnected", || connects(&operator) > before).await;
    operator.no_invalid();
    bridge.wait_event("task.completed", |e| {
        e["taskId"] == format!("asmtp:{later}").as_str()
    });
    let task_id = format!("asmtp:{sent}");
    assert_eq!(
        bridge
            .seen
            .iter()
            .filter(|e| e["event"] == "task.started" && e["taskId"] == task_id.as_str())
            .count(),
        1,
        "the first task ran once"
    );
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_killed_while_its_reply_was_posted_resends_it_as_a_no_op() {
    let mut operator = Operator::start(&["@alice.coder", "@alice.boss"], &["--stall-first-reply"]);
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    let bridge = Bridge::start(&dir, 1);

    let sent = operator
        .send("@alice.boss", "@alice.coder", "Once", "only once")
        .await;
    support::poll_until("the reply is stored", || {
        operator.record().iter().any(|r| r["stalled"] == true)
    })
    .await;
    bridge.kill();
    operator.restart();
    let mut bridge = Bridge::start(&dir, 1);
    let task_id = format!("asmtp:{sent}");
    bridge.wait_event("mail.sent", |e| {
        e["taskId"] == task_id.as_str() && e["intent"] == "task.result"
    });
    let replies = operator.replies("@alice.boss", &sent).await;
    assert_eq!(replies.len(), 1, "replied twice: {replies:?}");
    // The resend carried the same id and body: the operator took it as a no-op.
    let posts: Vec<Value> = operator
        .record()
        .into_iter()
        .filter(|r| {
            r["method"] == "POST"
                && r["path"] == "/messages"
                && r["body"]["in_reply_to"] == sent.as_str()
        })
        .collect();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert_eq!(posts[0]["body"], posts[1]["body"]);
    assert_eq!(posts[1]["status"], 202);
    operator.no_invalid();
    assert!(bridge.stop().success());
}

#[test]
fn a_broken_asmtp_mailbox_is_refused_with_what_to_fix() {
    let dir = ConfigDir {
        dir: tempfile::tempdir().unwrap(),
    };
    for (mailbox, key) in [
        (
            "kind = \"asmtp\"\nasmtp_url = \"http://127.0.0.1:9\"\nhandle = \"coder@alice\"\ntoken_file = \"t\"\n",
            "handle",
        ),
        (
            "kind = \"asmtp\"\nasmtp_url = \"http://127.0.0.1:9\"\nhandle = \"@alice.coder\"\ntoken_file = \"t\"\njmap_url = \"http://x\"\n",
            "jmap_url",
        ),
        (
            "kind = \"asmtp\"\nasmtp_url = \"http://127.0.0.1:9\"\nhandle = \"@alice.coder\"\ntoken_file = \"missing\"\n",
            "token_file",
        ),
    ] {
        dir.write_config(&format!(
            "[mailboxes.coder]\n{mailbox}\n[[agents]]\nname = \"coder\"\nprofile = \"echo\"\nallow_from = [\"@alice.boss\"]\n"
        ));
        let out = Command::new(support::bin())
            .args(["--config", dir.config().to_str().unwrap(), "start"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn init_from_answers_sets_up_an_asmtp_agent_that_answers() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        dir.path().join("coder.token"),
        operator.token("@alice.coder"),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.path().join("coder.token"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
    }
    let answers = json!({
        "state_dir": "state",
        "agents": [{"name": "coder", "profile": "echo", "allow_from": ["@alice.boss"],
                    "mailbox": {"kind": "asmtp", "asmtp_url": operator.url(),
                                "handle": "@alice.coder", "token_file": "coder.token"}}]
    });
    let file = dir.path().join("answers.json");
    std::fs::write(&file, answers.to_string()).unwrap();
    let out = Command::new(support::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "init",
            "--non-interactive",
            "--answers",
        ])
        .arg(&file)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let applied: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(applied["agents"][0]["how"], "asmtp");
    assert_eq!(applied["agents"][0]["email"], "@alice.coder");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(
        text.contains("kind = \"asmtp\"") && !text.contains("jmap_url"),
        "{text}"
    );
    assert!(
        !text.contains(operator.token("@alice.coder")),
        "the token stays in its file"
    );

    // doctor says the mailbox answers, and the agent works.
    let doctor = Command::new(support::bin())
        .args(["--config", config.to_str().unwrap(), "doctor", "--json"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        report.contains("mailbox coder: ASMTP") && report.contains("read the agent's mailbox"),
        "{report}"
    );
    let dir = ConfigDir { dir };
    let bridge = Bridge::start(&dir, 1);
    let sent = operator
        .send("@alice.boss", "@alice.coder", "Hi", "from init")
        .await;
    assert_eq!(operator.replies("@alice.boss", &sent).await.len(), 1);
    // status tells the link as for any mailbox.
    let status = Command::new(support::bin())
        .args(["--config", config.to_str().unwrap(), "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("connected") && text.contains("websocket"),
        "{text}"
    );
    assert!(bridge.stop().success());
}

/// Issue 18: two agents that allow each other answered each other's answers forever (675
/// tasks journaled in 30 s on a real operator). An answer carries the bridge's mark in its
/// data part and never starts a task.
#[tokio::test(flavor = "multi_thread")]
async fn two_agents_that_allow_each_other_do_not_answer_each_others_answers() {
    let operator = Operator::start(&["@alice.coder", "@alice.helper"], &[]);
    let coder_dir = operator.config("@alice.coder", "@alice.*", 1);
    let helper_dir = operator.config("@alice.helper", "@alice.*", 1);
    let coder = Bridge::start(&coder_dir, 1);
    let mut helper = Bridge::start(&helper_dir, 1);
    let sent = operator
        .send("@alice.helper", "@alice.coder", "Start", "say hello")
        .await;
    let answers = operator.replies("@alice.helper", &sent).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let answer = answers[0]["id"].as_str().unwrap().to_string();
    let ignored = helper.wait_event("message.ignored", |e| {
        e["taskId"] == format!("asmtp:{answer}").as_str()
    });
    assert!(
        ignored["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("Auto-Submitted"),
        "{ignored}"
    );
    assert!(helper.stop().success());
    assert!(coder.stop().success());
    let inbox = operator
        .call(
            "@alice.coder",
            reqwest::Method::GET,
            "/mailbox?direction=in&order=asc&limit=1000",
            None,
        )
        .await;
    let ids: Vec<&str> = inbox["envelope_headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["id"].as_str())
        .collect();
    assert_eq!(ids, vec![sent.as_str()], "nothing came back to the coder");
    operator.no_invalid();
}

/// Issue 21: the first start took the newest envelope as its starting point, so a task
/// waiting unread before the bridge ever ran was never answered. Now the unread backlog is
/// answered first (once each); `skip_backlog = true` keeps the old start.
#[tokio::test(flavor = "multi_thread")]
async fn unread_envelopes_waiting_before_the_first_start_are_answered_once() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let early: Vec<String> = {
        let mut ids = Vec::new();
        for n in 0..3 {
            ids.push(
                operator
                    .send(
                        "@alice.boss",
                        "@alice.coder",
                        &format!("Early {n}"),
                        "say hello",
                    )
                    .await,
            );
        }
        ids
    };
    let dir = operator.config("@alice.coder", "@alice.*", 1);
    let bridge = Bridge::start(&dir, 1);
    for id in &early {
        let replies = operator.replies("@alice.boss", id).await;
        assert_eq!(replies.len(), 1, "{replies:?}");
    }
    assert!(bridge.stop().success());
    // A restart does not answer them again.
    let bridge = Bridge::start(&dir, 1);
    let later = operator
        .send("@alice.boss", "@alice.coder", "Later", "say hello")
        .await;
    operator.replies("@alice.boss", &later).await;
    assert!(bridge.stop().success());
    for id in &early {
        assert_eq!(operator.replies("@alice.boss", id).await.len(), 1);
    }
    operator.no_invalid();

    // With skip_backlog, what waits before the first start is left alone.
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let waiting = operator
        .send("@alice.boss", "@alice.coder", "Old", "say hello")
        .await;
    let dir = operator.config("@alice.coder", "@alice.*", 1);
    let text = std::fs::read_to_string(dir.config()).unwrap();
    dir.write(
        "config.toml",
        &text.replace(
            "poll_interval_secs = 1\n",
            "poll_interval_secs = 1\nskip_backlog = true\n",
        ),
    );
    let bridge = Bridge::start(&dir, 1);
    let fresh = operator
        .send("@alice.boss", "@alice.coder", "New", "say hello")
        .await;
    operator.replies("@alice.boss", &fresh).await;
    assert!(bridge.stop().success());
    let listed = operator
        .call(
            "@alice.boss",
            reqwest::Method::GET,
            "/mailbox?direction=in&order=asc&limit=1000",
            None,
        )
        .await;
    assert!(
        !listed["envelope_headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["in_reply_to"] == waiting.as_str()),
        "the old envelope was not answered"
    );
}

/// Issue 21: the operator's `created_at` is `Date.now()`, so envelopes tie; ordering then
/// falls back to the (client-chosen, not time-ordered) id, and the bridge's watermark skipped
/// an envelope of the same millisecond whose id sorted before the one read last.
#[tokio::test(flavor = "multi_thread")]
async fn envelopes_of_the_same_millisecond_are_each_answered_once() {
    let operator = Operator::start(
        &["@alice.coder", "@alice.boss"],
        &["--frozen-clock", "1764000000000"],
    );
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    let bridge = Bridge::start(&dir, 1);
    let envelope = |id: &str, subject: &str| {
        json!({"id": id, "to": ["@alice.coder"], "subject": subject, "date_ms": 1_764_000_000_000u64,
               "content_parts": [{"type": "text", "text": "say hello"}]})
    };
    let high = operator
        .post(
            "@alice.boss",
            envelope("01ZZZZZZZZZZZZZZZZZZZZZZZY", "High"),
        )
        .await;
    assert_eq!(operator.replies("@alice.boss", &high).await.len(), 1);
    let low = operator
        .post("@alice.boss", envelope("0100000000000000000000000A", "Low"))
        .await;
    assert_eq!(operator.replies("@alice.boss", &low).await.len(), 1);
    let middle = operator
        .post(
            "@alice.boss",
            envelope("01MMMMMMMMMMMMMMMMMMMMMMMM", "Middle"),
        )
        .await;
    assert_eq!(operator.replies("@alice.boss", &middle).await.len(), 1);
    assert!(bridge.stop().success());
    for id in [&high, &low, &middle] {
        assert_eq!(operator.replies("@alice.boss", id).await.len(), 1, "{id}");
    }
    operator.no_invalid();
}

/// Issue 21: the operator cuts a request body over 1 MiB (no HTTP answer); the bridge took the
/// cut for a network fault and re-sent for a day. A long answer now goes in a file part, the
/// envelope keeping its start.
#[tokio::test(flavor = "multi_thread")]
async fn a_3_mb_answer_reaches_the_sender_as_a_file() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    dir.use_profile(
        "big.toml",
        "command = \"python3\"\nargs = [\"-c\", \"import sys\\nfor i in range(120000): sys.stdout.write('line %06d of a long answer\\\\n' % i)\"]\ntimeout_secs = 60\n[output]\nmax_bytes = 4000000\n",
    );
    let bridge = Bridge::start(&dir, 1);
    let sent = operator
        .send("@alice.boss", "@alice.coder", "Long", "write a lot")
        .await;
    let replies = operator.replies("@alice.boss", &sent).await;
    assert_eq!(replies.len(), 1);
    let parts = replies[0]["content_parts"].as_array().unwrap();
    let text = text_of(&replies[0]);
    assert!(
        text.starts_with("line 000000 of a long answer"),
        "{}",
        &text[..200.min(text.len())]
    );
    assert!(text.contains("answer.md"), "says where the rest is");
    let url = parts
        .iter()
        .find(|p| p["type"] == "file")
        .and_then(|p| p["url"].as_str())
        .expect("a file part");
    let file = reqwest::Client::new()
        .get(url)
        .bearer_auth(operator.token("@alice.boss"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(file.lines().count(), 120_000);
    assert!(file.trim_end().ends_with("line 119999 of a long answer"));
    assert!(bridge.stop().success());
    assert!(
        !operator.record().iter().any(|r| r["cut"] == true),
        "nothing sent over the operator's cap"
    );
    operator.no_invalid();
}

/// Issue 21: a reply refused with 404 (the sender blocked the agent, or took it off its
/// allowlist) was given up at once while `tasks` said "answered". It is shown as undelivered
/// in `tasks`, `task show` and `status`.
#[tokio::test(flavor = "multi_thread")]
async fn a_reply_the_operator_refuses_is_shown_as_undelivered() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    operator
        .call(
            "@alice.boss",
            reqwest::Method::POST,
            "/agents/me/blocks",
            Some(json!({"handle": "@alice.coder"})),
        )
        .await;
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    let mut bridge = Bridge::start(&dir, 1);
    let sent = operator
        .send("@alice.boss", "@alice.coder", "Blocked", "say hello")
        .await;
    let task_id = format!("asmtp:{sent}");
    bridge.wait_event("mail.failed", |e| e["taskId"] == task_id.as_str());
    let out = dir.run(&["tasks", "--json"]);
    let tasks: Value = serde_json::from_str(&out).unwrap();
    let task = tasks
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["taskId"] == task_id.as_str())
        .unwrap();
    assert!(
        task["undelivered"]
            .as_str()
            .unwrap_or_default()
            .contains("404"),
        "{task}"
    );
    let text = dir.run(&["tasks", "--state", "undelivered"]);
    assert!(
        text.contains(&task_id) && text.contains("UNDELIVERED"),
        "{text}"
    );
    let show = dir.run(&["task", "show", &task_id]);
    assert!(show.contains("UNDELIVERED"), "{show}");
    let status_text = dir.run(&["status"]);
    assert!(
        status_text.contains("could not be delivered"),
        "{status_text}"
    );
    assert!(bridge.stop().success());
}

/// Issue 21: after the operator rotated the agent's token, `status` still said "push over
/// websocket" (the socket stays open) while every read was refused.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_token_rotation_status_says_the_mailbox_is_refused() {
    let operator = Operator::start(
        &["@alice.coder", "@alice.boss"],
        &["--admin-token", "admin-secret"],
    );
    let dir = operator.config("@alice.coder", "@alice.boss", 600);
    let mut bridge = Bridge::start(&dir, 1);
    wait_push_connected(&mut bridge, 1);
    let rotated = reqwest::Client::new()
        .post(format!(
            "{}/_admin/agents/@alice.coder/rotate-token",
            operator.url()
        ))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert!(rotated.status().is_success());
    // A task arrives: the push frame comes over the old socket; the read is refused.
    operator
        .send("@alice.boss", "@alice.coder", "After", "say hello")
        .await;
    bridge.wait_log("refused the credentials").await;
    let text = dir.run(&["status"]);
    assert!(!text.contains("push over websocket"), "{text}");
    assert!(text.contains("auth_failed"), "{text}");
    let json = dir.status_json();
    assert_eq!(json["agents"][0]["reading"], Value::Null, "{json}");
    assert!(bridge.stop().success());
}

/// How long after `since` `handle`'s mailbox first held a reply to `parent`; `None` when it
/// held none within `within`.
async fn replied_within(
    operator: &Operator,
    handle: &str,
    parent: &str,
    since: std::time::Instant,
    within: Duration,
) -> Option<Duration> {
    support::found_within(since, within, || async {
        !operator.reply_headers(handle, parent).await.is_empty()
    })
    .await
}

/// Issue 37: the agent's token rotated at the operator, the new one written to `token_file`,
/// with `reload` (SIGHUP) or without: the reply waiting in the outbox and the task pushed
/// while the token was refused both go through within 5 s (polling every 10 minutes, so
/// nothing but the new token can bring them). On fb62012 the mailbox stayed `auth_failed`
/// until a restart. Returns the seconds from the new token to each answer.
async fn a_rotated_token_is_used(sighup: bool) -> (f64, f64) {
    let operator = Operator::start(
        &["@alice.coder", "@alice.boss"],
        &["--admin-token", "admin-secret"],
    );
    let dir = operator.config("@alice.coder", "@alice.boss", 600);
    let gate = dir.use_gated_profile();
    let mut bridge = Bridge::start(&dir, 1);
    wait_push_connected(&mut bridge, 1);
    let waiting = operator
        .send("@alice.boss", "@alice.coder", "Before", "answered late")
        .await;
    bridge.wait_event("task.started", |_| true);
    let rotated: Value = reqwest::Client::new()
        .post(format!(
            "{}/_admin/agents/@alice.coder/rotate-token",
            operator.url()
        ))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = rotated["token"].as_str().unwrap().to_string();
    // The answer is ready only now: its reply is refused and waits in the outbox.
    std::fs::write(&gate, "").unwrap();
    bridge.wait_event("mail.retrying", |e| e["intent"] == "task.result");
    let next = operator
        .send(
            "@alice.boss",
            "@alice.coder",
            "After",
            "answered with the new token",
        )
        .await;
    bridge.wait_log("refused the credentials").await;
    dir.replace_private("asmtp.token", &token);
    let replaced = std::time::Instant::now();
    if sighup {
        bridge.signal(nix::sys::signal::Signal::SIGHUP);
    }
    let within = Duration::from_secs(5);
    let answered = replied_within(&operator, "@alice.boss", &waiting, replaced, within).await;
    let next_answered = replied_within(&operator, "@alice.boss", &next, replaced, within).await;
    let status = dir.status_json();
    let log = bridge.log();
    assert!(
        answered.is_some() && next_answered.is_some(),
        "the waiting answer ({answered:?}) and the next task ({next_answered:?}) within {within:?} of the new token\n{status}"
    );
    assert_eq!(
        log.matches("credentials reloaded for coder").count(),
        1,
        "said once"
    );
    assert_eq!(
        status["agents"][0]["link"]["credentials"]["worked"], true,
        "{status}"
    );
    assert!(!log.contains(&token), "never logged");
    // Connected again, with the new token.
    wait_push_connected(&mut bridge, 2);
    // A third task comes by push over the socket opened with the new token.
    let third = operator
        .send("@alice.boss", "@alice.coder", "Third", "by push")
        .await;
    let pushed = replied_within(
        &operator,
        "@alice.boss",
        &third,
        std::time::Instant::now(),
        within,
    )
    .await;
    assert!(pushed.is_some(), "a task after the rotation is pushed");
    // A reload with the same token leaves the mailbox alone: no second change, no new socket.
    bridge.signal(nix::sys::signal::Signal::SIGHUP);
    bridge.wait_count("bridge.reloaded", if sighup { 2 } else { 1 });
    let reloaded = bridge
        .seen
        .iter()
        .rfind(|e| e["event"] == "bridge.reloaded")
        .unwrap()
        .clone();
    assert_eq!(reloaded["credentialsChanged"], json!([]), "{reloaded}");
    let log = bridge.log();
    assert_eq!(log.matches("credentials reloaded for coder").count(), 1);
    assert_eq!(push_connects(&bridge), 2);
    for parent in [&waiting, &next, &third] {
        assert_eq!(operator.replies("@alice.boss", parent).await.len(), 1);
    }
    assert!(bridge.stop().success());
    operator.no_invalid();
    (
        answered.unwrap().as_secs_f64(),
        next_answered.unwrap().as_secs_f64(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_rotated_and_reloaded_is_used_within_seconds() {
    let (waiting, next) = a_rotated_token_is_used(true).await;
    eprintln!(
        "SIGHUP to the waiting answer: {waiting:.2} s; to the next task's answer: {next:.2} s"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_rotated_on_disk_without_a_reload_is_used_at_the_next_retry() {
    let (waiting, next) = a_rotated_token_is_used(false).await;
    eprintln!("new token file to the waiting answer: {waiting:.2} s; to the next task's answer: {next:.2} s");
}

/// Issue 21: the Session-Key came from `references[0]`, else `in_reply_to`; the reference CLI
/// (`robotnet send --in-reply-to`) sends `in_reply_to` alone, naming the agent's own reply, so
/// every turn was a new session. The conversation is now found from any envelope of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_three_turn_conversation_sent_like_the_reference_cli_keeps_one_session() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    dir.use_profile(
        "session.toml",
        "command = \"python3\"\nargs = [\"-c\", \"import os; print('session=' + os.environ.get('AAMP_SESSION_KEY', ''))\"]\ntimeout_secs = 60\n",
    );
    let mut bridge = Bridge::start(&dir, 1);
    let session_of = |reply: &Value| {
        let text = text_of(reply);
        text.trim()
            .strip_prefix("session=")
            .unwrap_or_else(|| panic!("{text}"))
            .to_string()
    };
    let first = operator
        .send("@alice.boss", "@alice.coder", "Turn 1", "remember 7")
        .await;
    let reply = operator.replies("@alice.boss", &first).await.remove(0);
    let session = session_of(&reply);
    assert!(!session.is_empty());
    let mut answered = reply["id"].as_str().unwrap().to_string();
    for turn in 2..=3 {
        // As `robotnet send --in-reply-to <the reply>`: no references.
        let next = operator
            .post(
                "@alice.boss",
                json!({"id": ulid(), "to": ["@alice.coder"], "in_reply_to": answered,
                       "date_ms": 1_764_000_000_000u64,
                       "content_parts": [{"type": "text", "text": format!("turn {turn}")}]}),
            )
            .await;
        let reply = operator.replies("@alice.boss", &next).await.remove(0);
        assert_eq!(session_of(&reply), session, "turn {turn}");
        answered = reply["id"].as_str().unwrap().to_string();
    }
    // And across a restart (the map is kept beside the watermark).
    assert!(bridge.stop().success());
    bridge = Bridge::start(&dir, 1);
    let next = operator
        .post(
            "@alice.boss",
            json!({"id": ulid(), "to": ["@alice.coder"], "in_reply_to": answered,
                   "date_ms": 1_764_000_000_000u64,
                   "content_parts": [{"type": "text", "text": "turn 4"}]}),
        )
        .await;
    let reply = operator.replies("@alice.boss", &next).await.remove(0);
    assert_eq!(session_of(&reply), session, "after a restart");
    assert!(bridge.stop().success());
    operator.no_invalid();
}

/// The operator's push and rows as the reference sends them: a task the agent is only
/// cc'd on, stored by an operator that keeps no `size_hint` (older rows), from a sender that
/// asked for `monitor.fact` frames. The agent answers it once, to its sender alone; the
/// sender's socket sees one `stored` fact per recipient; when the operator stops, every
/// socket is closed with 1001 and the bridge says so and reads what came meanwhile once it
/// is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_the_agent_is_cc_d_on_is_answered_once_to_its_sender_only() {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let mut operator = Operator::start(
        &["@alice.coder", "@alice.boss", "@alice.other"],
        &["--no-size-hint"],
    );
    // Polling every ten minutes: the bridge reads by push and its catch-ups.
    let dir = operator.config("@alice.coder", "@alice.boss", 600);
    let mut bridge = Bridge::start(&dir, 1);
    wait_push_connected(&mut bridge, 1);
    let mut request = format!("ws://127.0.0.1:{}/connect", operator.port)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "Authorization",
        format!("Bearer {}", operator.token("@alice.boss"))
            .parse()
            .unwrap(),
    );
    let (mut boss_socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();

    let sent = operator
        .post(
            "@alice.boss",
            json!({"id": ulid(), "to": ["@alice.other"], "cc": ["@alice.coder"],
                   "subject": "FYI", "date_ms": 1_764_000_000_000u64, "monitor": "mon_boss1",
                   "content_parts": [{"type": "text", "text": "say hello"}]}),
        )
        .await;
    let replies = operator.replies("@alice.boss", &sent).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(
        replies[0]["to"],
        json!(["@alice.boss"]),
        "to its sender only"
    );
    assert!(replies[0].get("cc").is_none(), "{}", replies[0]);
    // What the coder's socket was sent: the row with cc and without size_hint.
    let pushed: Vec<Value> = operator
        .record()
        .into_iter()
        .filter(|r| r["push"] == "@alice.coder" && r["frame"]["id"] == sent.as_str())
        .collect();
    assert_eq!(pushed.len(), 1, "{pushed:?}");
    assert_eq!(pushed[0]["frame"]["cc"], json!(["@alice.coder"]));
    assert!(pushed[0]["frame"].get("size_hint").is_none());
    // The other recipient heard nothing from the coder.
    let other = operator
        .call(
            "@alice.other",
            reqwest::Method::GET,
            "/mailbox?direction=in&order=asc&limit=1000",
            None,
        )
        .await;
    assert_eq!(other["envelope_headers"].as_array().unwrap().len(), 1);

    // The sender's socket: one stored fact per recipient, then the envelope.notify of the
    // coder's answer.
    let mut facts = Vec::new();
    while facts.len() < 2 {
        let frame = tokio::time::timeout(Duration::from_secs(30), boss_socket.next())
            .await
            .expect("a frame")
            .unwrap()
            .unwrap();
        let Message::Text(text) = frame else { continue };
        let value: Value = serde_json::from_str(text.as_str()).unwrap();
        if value["op"] == "monitor.fact" {
            facts.push(value);
        }
    }
    let mut recipients: Vec<&str> = facts
        .iter()
        .map(|f| f["recipient_handle"].as_str().unwrap())
        .collect();
    recipients.sort_unstable();
    assert_eq!(recipients, ["@alice.coder", "@alice.other"]);
    assert!(facts
        .iter()
        .all(|f| f["fact"] == "stored" && f["envelope_id"] == sent.as_str()));

    // The operator stops as a service: 1001 on every socket.
    operator.terminate();
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(30), boss_socket.next())
            .await
            .expect("the close")
        {
            Some(Ok(Message::Close(frame))) => break frame.expect("a close code"),
            Some(Ok(_)) => continue,
            other => panic!("no close frame: {other:?}"),
        }
    };
    assert_eq!(u16::from(close.code), 1001);
    bridge.wait_log("1001 operator shutting down").await;
    operator.restart();
    let later = operator
        .send("@alice.boss", "@alice.coder", "Later", "say hello")
        .await;
    assert_eq!(operator.replies("@alice.boss", &later).await.len(), 1);
    bridge.wait_event("task.completed", |e| {
        e["taskId"] == format!("asmtp:{later}").as_str()
    });
    assert!(bridge.stop().success());
    assert_eq!(operator.replies("@alice.boss", &sent).await.len(), 1);
    operator.no_invalid();
}

/// The test operator's refusals, as the reference's (3ab187e): a body over 1 MiB is cut
/// with no HTTP answer; a recipient that has not allowed the sender, or that blocked it, is
/// 404 (never 403), in either direction; a `monitor` that is not `mon_<token>` is 400. The
/// bridge's tests rely on each, so each is checked here.
#[tokio::test(flavor = "multi_thread")]
async fn the_test_operator_refuses_as_the_reference_does() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let post = |from: &str, body: Value| {
        reqwest::Client::new()
            .post(format!("{}/messages", operator.url()))
            .bearer_auth(operator.token(from))
            .json(&body)
            .send()
    };
    let envelope = |to: &str, text: String| {
        json!({"id": ulid(), "to": [to], "date_ms": 1_764_000_000_000u64,
               "content_parts": [{"type": "text", "text": text}]})
    };
    // Over the cap: the connection is cut, no status.
    let cut = post(
        "@alice.boss",
        envelope("@alice.coder", "x".repeat(1_100_000)),
    )
    .await;
    assert!(cut.is_err(), "{cut:?}");
    assert!(operator.record().iter().any(|r| r["cut"] == true));
    // Just under it: accepted.
    let under = post(
        "@alice.boss",
        envelope("@alice.coder", "x".repeat(1_000_000)),
    )
    .await
    .unwrap();
    assert_eq!(under.status(), 202);
    // Off the allowlist (the coder's owner took the boss off): 404.
    operator
        .call(
            "@alice.coder",
            reqwest::Method::DELETE,
            "/agents/me/allowlist/@alice.boss",
            None,
        )
        .await;
    let refused = post("@alice.boss", envelope("@alice.coder", "hi".into()))
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);
    // Reachability is both ways: the coder may not reach the boss either now.
    let back = post("@alice.coder", envelope("@alice.boss", "hi".into()))
        .await
        .unwrap();
    assert_eq!(back.status(), 404);
    // Blocked: 404 although allowed.
    operator
        .call(
            "@alice.coder",
            reqwest::Method::POST,
            "/agents/me/allowlist",
            Some(json!({"entries": ["@alice.boss"]})),
        )
        .await;
    operator
        .call(
            "@alice.boss",
            reqwest::Method::POST,
            "/agents/me/blocks",
            Some(json!({"handle": "@alice.coder"})),
        )
        .await;
    let blocked = post("@alice.coder", envelope("@alice.boss", "hi".into()))
        .await
        .unwrap();
    assert_eq!(blocked.status(), 404);
    // A bad monitor: 400 INVALID_MONITOR.
    let mut bad = envelope("@alice.coder", "hi".into());
    bad["monitor"] = json!("monitor-1\n");
    let response = post("@alice.boss", bad).await.unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "INVALID_MONITOR", "{body}");
}

/// `@alice.coder` on `operator` running the asking agent (it asks before it edits), tasks from
/// `@alice.boss`.
fn asking_config(operator: &Operator) -> ConfigDir {
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    dir.write_asking_agent(120);
    let config = std::fs::read_to_string(dir.config()).unwrap();
    dir.write(
        "config.toml",
        &config.replace("profile = \"echo\"", "profile = \"asking.toml\""),
    );
    dir
}

/// Issue 30, item 5, on ASMTP: a reply to the agent's question (its `in_reply_to` the
/// question's envelope) answers it, for Allow and for Reject; it is never run as a task, and
/// each task gets the question and one result.
#[tokio::test(flavor = "multi_thread")]
async fn an_agents_question_is_answered_by_a_reply_envelope_never_run_as_a_task() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let dir = asking_config(&operator);
    let mut bridge = Bridge::start(&dir, 1);
    for (choice, answer) in [
        ("Allow", "permission edit: yes Done."),
        (
            "Reject",
            "permission edit: no Done.\n\n(aamp-bridge: refused during this task: \"Edit README.md\" (the sender's answer))",
        ),
    ] {
        let task = operator
            .send("@alice.boss", "@alice.coder", "Fix the README", "Please fix the typo.")
            .await;
        let question = operator.replies("@alice.boss", &task).await;
        assert_eq!(question.len(), 1, "{question:?}");
        let asked = text_of(&question[0]);
        assert!(asked.starts_with("Question:") && asked.contains("Edit README.md"), "{asked}");
        let reply = operator
            .post(
                "@alice.boss",
                json!({"id": ulid(), "to": ["@alice.coder"], "in_reply_to": question[0]["id"],
                       "date_ms": 1_764_000_000_000u64,
                       "content_parts": [{"type": "text", "text": choice}]}),
            )
            .await;
        let task_id = format!("asmtp:{task}");
        let done = bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
        assert_eq!(done["status"], "completed", "{choice}: {done}");
        let answered =
            bridge.wait_event("task.answered", |e| e["answerTaskId"] == task_id.as_str());
        assert_eq!(answered["choice"], choice);
        bridge.wait_event("mail.sent", |e| {
            e["taskId"] == task_id.as_str() && e["intent"] == "task.result"
        });
        let replies = operator.replies("@alice.boss", &task).await;
        assert_eq!(replies.len(), 2, "the question and one result: {replies:?}");
        assert!(text_of(&replies[1]).starts_with(answer), "{choice}: {}", text_of(&replies[1]));
        let answer_task = format!("asmtp:{reply}");
        assert!(
            !bridge
                .seen
                .iter()
                .any(|e| e["taskId"] == answer_task.as_str()),
            "{choice}: the answer was taken as a task: {:?}",
            bridge.seen
        );
    }
    assert!(bridge.stop().success());
    operator.no_invalid();
}

/// Issue 30, item 5, after a restart: the questions the agent sent were known only to the
/// process that sent them, so a reply to one that came after a restart ran as a new task. They
/// are kept beside the watermark now: the reply is an answer, never a task.
#[tokio::test(flavor = "multi_thread")]
async fn a_reply_to_a_question_asked_before_a_restart_is_never_run_as_a_task() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let dir = asking_config(&operator);
    let bridge = Bridge::start(&dir, 1);
    let task = operator
        .send(
            "@alice.boss",
            "@alice.coder",
            "Fix the README",
            "Please fix the typo.",
        )
        .await;
    let question = operator.replies("@alice.boss", &task).await;
    bridge.kill();
    let mut bridge = Bridge::start(&dir, 1);
    let answer = |to: &Value, text: &str| {
        json!({"id": ulid(), "to": ["@alice.coder"], "in_reply_to": to["id"],
               "date_ms": 1_764_000_000_000u64,
               "content_parts": [{"type": "text", "text": text}]})
    };
    let reply = operator
        .post("@alice.boss", answer(&question[0], "Allow"))
        .await;
    // A task sent after the reply is read after it: once it is received, the reply was read.
    let later = operator
        .send("@alice.boss", "@alice.coder", "Later", "Another task.")
        .await;
    let later_id = format!("asmtp:{later}");
    bridge.wait_event("task.received", |e| e["taskId"] == later_id.as_str());
    bridge.take_events();
    let answer_task = format!("asmtp:{reply}");
    assert!(
        !bridge
            .seen
            .iter()
            .any(|e| e["taskId"] == answer_task.as_str()),
        "the answer was taken as a task: {:?}",
        bridge.seen
    );
    // The task ran again after the restart and asked again; that question, and the later
    // task's, are answered as usual, so the bridge stops with nothing running.
    let task_id = format!("asmtp:{task}");
    let asked_again = loop {
        let replies = operator.replies("@alice.boss", &task).await;
        if replies.len() >= 2 {
            break replies[1].clone();
        }
        bridge.wait_event("mail.sent", |e| e["taskId"] == task_id.as_str());
    };
    operator
        .post("@alice.boss", answer(&asked_again, "Allow"))
        .await;
    let done = bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
    assert_eq!(done["status"], "completed", "{done}");
    let later_question = operator.replies("@alice.boss", &later).await;
    operator
        .post("@alice.boss", answer(&later_question[0], "Reject"))
        .await;
    bridge.wait_event("task.completed", |e| e["taskId"] == later_id.as_str());
    assert!(bridge.stop().success());
    operator.no_invalid();
}

/// Issue 36, item 1: with one envelope the bridge could not decode (no `from`, as a proxy
/// altering the operator's answers made it) in every page, the whole page failed ("was not
/// understood"), `status` said the mailbox was unreachable, and the next task was never
/// answered. Now that envelope costs itself only: reported once as `message.ignored`, passed,
/// and the tasks after it answered; the mailbox stays up.
#[tokio::test(flavor = "multi_thread")]
async fn an_envelope_the_bridge_cannot_read_costs_that_envelope_only() {
    let operator = Operator::start(
        &["@alice.coder", "@alice.boss"],
        &["--malformed-subject", "POISON"],
    );
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    let mut bridge = Bridge::start(&dir, 1);
    let poison = operator
        .send(
            "@alice.boss",
            "@alice.coder",
            "POISON",
            "you cannot read me",
        )
        .await;
    let good = operator
        .send("@alice.boss", "@alice.coder", "Fine", "say hello")
        .await;
    let reply = operator.replies("@alice.boss", &good).await;
    assert!(text_of(&reply[0]).contains("say hello"), "{reply:?}");
    let ignored = bridge.wait_event("message.ignored", |e| e["messageId"] == poison.as_str());
    assert!(
        ignored["reason"]
            .as_str()
            .unwrap()
            .contains("missing field `from`"),
        "{ignored}"
    );
    // The bogus row with no position is reported too, and neither stops the next task.
    bridge.wait_event("message.ignored", |e| {
        e["reason"]
            .as_str()
            .is_some_and(|r| r.contains("mailbox row") && r.contains("created_at"))
    });
    let later = operator
        .send("@alice.boss", "@alice.coder", "Later", "again")
        .await;
    operator.replies("@alice.boss", &later).await;
    let text = dir.run(&["status"]);
    assert!(!text.contains("unreachable"), "{text}");
    bridge.take_events();
    let times = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "message.ignored" && e["messageId"] == poison.as_str())
        .count();
    assert_eq!(times, 1, "reported once");
    assert!(
        !bridge
            .seen
            .iter()
            .any(|e| e["taskId"] == format!("asmtp:{poison}").as_str()),
        "the unreadable envelope did not become a task"
    );
    assert!(bridge.stop().success());
}

/// Issue 36, item 5: an agent's `FILE:` lines on an ASMTP task gave a reply with text and data
/// parts only; the files go as file parts now, which the sender downloads.
#[tokio::test(flavor = "multi_thread")]
async fn files_an_agent_hands_over_go_as_file_parts() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    dir.use_profile(
        "results.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}]\nstdin = \"{{{{prompt}}}}\"\n",
            support::repo()
                .join("tests/agents/result_agent.py")
                .display()
        ),
    );
    let bridge = Bridge::start(&dir, 1);
    let sent = operator
        .send("@alice.boss", "@alice.coder", "Report", "Write the report.")
        .await;
    let replies = operator.replies("@alice.boss", &sent).await;
    assert_eq!(replies.len(), 1);
    let files: Vec<&Value> = replies[0]["content_parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "file")
        .collect();
    let names: Vec<&str> = files.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["report.md", "data.csv"], "{replies:?}");
    let report = reqwest::Client::new()
        .get(files[0]["url"].as_str().unwrap())
        .bearer_auth(operator.token("@alice.boss"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(report, "# Report\n\nAll good.\n");
    // The data part still carries the answer's status and marks it an answer.
    let data = replies[0]["content_parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "data")
        .unwrap();
    assert_eq!(data["data"]["status"], "completed");
    assert!(bridge.stop().success());
    operator.no_invalid();
}

/// Issue 36, item 2: a 30 MB envelope was answered, but the bridge's memory peaked at 286 MB
/// (the envelope held several times over while read, rendered and journaled). An envelope over
/// the mailbox's `max_message_bytes` (by the operator's `size_hint`) is no longer fetched; it is
/// answered rejected, saying why and what to do.
#[tokio::test(flavor = "multi_thread")]
async fn an_envelope_over_the_size_limit_is_answered_rejected_unread() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    let config = std::fs::read_to_string(dir.config()).unwrap();
    dir.write(
        "config.toml",
        &config.replace(
            "poll_interval_secs = 1\n",
            "poll_interval_secs = 1\nmax_message_bytes = 100000\n",
        ),
    );
    let bridge = Bridge::start(&dir, 1);
    let big = operator
        .send("@alice.boss", "@alice.coder", "Big", &"x".repeat(200_000))
        .await;
    let small = operator
        .send("@alice.boss", "@alice.coder", "Small", "say hello")
        .await;
    let reply = operator.replies("@alice.boss", &big).await;
    let text = text_of(&reply[0]);
    assert!(
        text.starts_with("rejected: the task is about ")
            && text.contains("max_message_bytes")
            && text.contains("100000 bytes"),
        "{text}"
    );
    let reply = operator.replies("@alice.boss", &small).await;
    assert!(text_of(&reply[0]).contains("say hello"));
    assert!(bridge.stop().success());
    let fetched_big = operator.record().iter().any(|r| {
        r["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/messages"))
            && r.to_string().contains(&big)
            && r["method"] == "GET"
    });
    assert!(!fetched_big, "the large envelope was fetched");
    operator.no_invalid();
}

/// Issue 36, item 4, on ASMTP: an envelope already read before the bridge's first start (a
/// person fetched it) was never answered while the unread ones were. With `skip_backlog`
/// unset, a first start now also answers the newest read envelopes that no envelope the agent
/// sent answers (its outbound feed, `direction=out`, names what each of its envelopes
/// answers); one the agent answered before is left alone.
#[tokio::test(flavor = "multi_thread")]
async fn an_envelope_read_before_the_first_start_is_answered_unless_answered_before() {
    let operator = Operator::start(&["@alice.coder", "@alice.boss"], &[]);
    let looked = operator
        .send(
            "@alice.boss",
            "@alice.coder",
            "Looked",
            "looked at, not answered",
        )
        .await;
    let done = operator
        .send("@alice.boss", "@alice.coder", "Done", "answered before")
        .await;
    // A person reads both as the agent; the agent answered one of them before.
    operator
        .call(
            "@alice.coder",
            reqwest::Method::GET,
            &format!("/messages?ids={looked},{done}"),
            None,
        )
        .await;
    operator
        .post(
            "@alice.coder",
            json!({"id": ulid(), "to": ["@alice.boss"], "in_reply_to": done, "references": [done],
                   "date_ms": 1_764_000_000_000u64,
                   "content_parts": [{"type": "text", "text": "done earlier"}]}),
        )
        .await;
    let unread = operator
        .send("@alice.boss", "@alice.coder", "Unread", "never opened")
        .await;
    let dir = operator.config("@alice.coder", "@alice.boss", 1);
    let bridge = Bridge::start(&dir, 1);
    let reply = operator.replies("@alice.boss", &looked).await;
    assert!(text_of(&reply[0]).contains("looked at"), "{reply:?}");
    operator.replies("@alice.boss", &unread).await;
    let later = operator
        .send("@alice.boss", "@alice.coder", "Later", "after")
        .await;
    operator.replies("@alice.boss", &later).await;
    assert!(bridge.stop().success());
    assert_eq!(
        operator.replies("@alice.boss", &done).await.len(),
        1,
        "answered once, before the bridge"
    );
    operator.no_invalid();
}

/// Whether `e` says the bridge's push connected: the `mailbox.push` event every pushed
/// back-end emits through the one push supervisor (ASMTP did not, before it).
fn is_push_connect(e: &Value) -> bool {
    e["event"] == "mailbox.push" && e["connected"] == true && e["transport"] == "websocket"
}

/// Waits until the bridge's ASMTP push has connected `n` times.
fn wait_push_connected(bridge: &mut Bridge, n: usize) {
    bridge.wait_count_of("mailbox.push (connected)", n, is_push_connect);
}

/// How many times the bridge's push connected, in the events seen so far.
fn push_connects(bridge: &Bridge) -> usize {
    bridge.seen.iter().filter(|e| is_push_connect(e)).count()
}
