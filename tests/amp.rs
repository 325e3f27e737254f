//! The AMP back-end end to end: a real bridge process polls an AMP broker
//! (tests/hosts/amp_broker.py, the agent-facing API of study8677/agent-mailer) and answers
//! in the thread, exactly once: across a SIGKILL while its reply was being posted, and across
//! a broker restart. No mail host is involved.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::{AmpBroker as Broker, Bridge, ConfigDir};

#[tokio::test(flavor = "multi_thread")]
async fn a_message_on_the_broker_is_answered_in_its_thread_once_and_marked_read() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let stranger = broker.register("stranger").await;
    let dir = broker.config(&coder, &boss.1, "echo");
    let mut bridge = Bridge::start(&dir, 1);

    let sent = broker.send(&boss, &coder.1, "Greet", "say hello").await;
    let thread = sent["thread_id"].as_str().unwrap();
    let replies = broker.replies(thread, &coder.1).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    let reply = &replies[0];
    assert_eq!(reply["action"], "reply");
    assert_eq!(reply["parent_id"], sent["id"]);
    assert_eq!(reply["subject"], "Re: Greet", "a reply reads like one");
    assert_eq!(reply["to_agent"], boss.1.as_str());
    assert!(
        reply["body"].as_str().unwrap().contains("say hello"),
        "{reply}"
    );
    // The dispatch was marked read once the journal held it.
    let task_id = format!("amp:{thread}:{}", sent["id"].as_str().unwrap());
    bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
    let inbox = broker
        .call(
            reqwest::Method::GET,
            &format!("/messages/inbox/{}?agent_id={}&all=true", coder.1, coder.0),
            None,
        )
        .await;
    assert!(
        inbox
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["is_read"] == true),
        "{inbox}"
    );

    // The read flag is only a hint: the same message unread again is not taken again, and
    // the next message is answered.
    broker
        .call(
            reqwest::Method::PATCH,
            &format!("/messages/{}/unread", sent["id"].as_str().unwrap()),
            None,
        )
        .await;
    let second = broker.send(&boss, &coder.1, "Again", "say it again").await;
    let second_replies = broker.replies_to(&second, &coder.1).await;
    assert_eq!(second_replies.len(), 1);
    assert_eq!(broker.replies(thread, &coder.1).await.len(), 1);
    assert_eq!(
        bridge
            .seen
            .iter()
            .filter(|e| e["event"] == "task.started" && e["taskId"] == task_id.as_str())
            .count(),
        1,
        "run once"
    );
    // Issue 21: a reply is posted without reading the whole thread first (the broker renders
    // every message it returns); the thread is read only to look for a reply a crash may have
    // left.
    let bridge_reads: Vec<Value> = broker
        .record()
        .into_iter()
        .filter(|r| {
            r["ua"]
                .as_str()
                .unwrap_or_default()
                .starts_with("aamp-bridge")
                && r["path"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("/messages/thread/")
        })
        .collect();
    assert!(bridge_reads.is_empty(), "{bridge_reads:?}");

    // A sender the policy does not allow is refused, in the thread, and nothing runs.
    let refused = broker.send(&stranger, &coder.1, "Do it", "rm -rf /").await;
    let answer = broker.replies_to(&refused, &coder.1).await;
    assert_eq!(answer.len(), 1);
    assert!(
        answer[0]["body"].as_str().unwrap().contains("rejected"),
        "{answer:?}"
    );
    broker.no_invalid_requests();
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_killed_while_its_reply_was_posted_does_not_reply_twice() {
    let (mut broker, coder, boss) = Broker::with_coder_and_boss(&["--stall-first-reply"]).await;
    let dir = broker.config(&coder, &boss.1, "echo");
    let bridge = Bridge::start(&dir, 1);

    let sent = broker.send(&boss, &coder.1, "Once", "only once").await;
    let thread = sent["thread_id"].as_str().unwrap().to_string();
    // The broker stored the reply and holds the answer back: kill the bridge now, before it
    // could record that the reply went out.
    support::poll_until("the reply is stored", || {
        broker.record().iter().any(|r| r["stalled"] == true)
    })
    .await;
    bridge.kill();
    // The broker goes down and comes back too (without the stall).
    broker.restart();
    let mut bridge = Bridge::start(&dir, 1);
    let task_id = format!("amp:{thread}:{}", sent["id"].as_str().unwrap());
    bridge.wait_event("mail.sent", |e| {
        e["taskId"] == task_id.as_str() && e["intent"] == "task.result"
    });
    let replies = broker.replies(&thread, &coder.1).await;
    assert_eq!(replies.len(), 1, "replied twice: {replies:?}");
    assert!(
        bridge.log().contains("in the thread already"),
        "the retry looked first"
    );

    // And it goes on answering, also across a broker restart while it runs (meanwhile it
    // polls the broker with backoff).
    let next = broker.send(&boss, &coder.1, "Again", "second").await;
    let replies = broker.replies_to(&next, &coder.1).await;
    assert_eq!(replies.len(), 1);
    broker.stop();
    bridge.wait_log("the AMP broker cannot be read").await;
    broker.restart();
    let third = broker
        .send(&boss, &coder.1, "Third", "after the restart")
        .await;
    let replies = broker.replies_to(&third, &coder.1).await;
    assert_eq!(replies.len(), 1);
    broker.no_invalid_requests();
    assert!(bridge.stop().success());
}

#[test]
fn a_broken_amp_mailbox_is_refused_with_what_to_fix() {
    let dir = ConfigDir {
        dir: tempfile::tempdir().unwrap(),
    };
    dir.write_config(
        "[mailboxes.coder]\nkind = \"amp\"\namp_url = \"http://amp.example.com\"\naddress = \"coder@alice.amp.test\"\nagent_id = \"a1\"\napi_key_file = \"amp.key\"\n\n[[agents]]\nname = \"coder\"\nprofile = \"echo\"\nallow_from = [\"boss@alice.amp.test\"]\n",
    );
    let out = Command::new(support::bin())
        .args(["--config", dir.config().to_str().unwrap(), "start"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("amp_url") && err.contains("https"), "{err}");
    let _ = PathBuf::new();
}

/// Issue 18: two agents that allow each other answered each other's answers forever. An
/// answer ends with the bridge's marker and never starts a task.
#[tokio::test(flavor = "multi_thread")]
async fn two_agents_that_allow_each_other_do_not_answer_each_others_answers() {
    let broker = Broker::start(&[]);
    let coder = broker.register("coder").await;
    let helper = broker.register("helper").await;
    let coder_dir = broker.config(&coder, &helper.1, "echo");
    let helper_dir = broker.config(&helper, &coder.1, "echo");
    let coder_bridge = Bridge::start(&coder_dir, 1);
    let mut helper_bridge = Bridge::start(&helper_dir, 1);
    let sent = broker.send(&helper, &coder.1, "Start", "say hello").await;
    let thread = sent["thread_id"].as_str().unwrap();
    let answers = broker.replies(thread, &coder.1).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let answer = format!("amp:{thread}:{}", answers[0]["id"].as_str().unwrap());
    let ignored = helper_bridge.wait_event("message.ignored", |e| e["taskId"] == answer.as_str());
    assert!(
        ignored["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("Auto-Submitted"),
        "{ignored}"
    );
    assert!(helper_bridge.stop().success());
    assert!(coder_bridge.stop().success());
    let thread = broker.thread(thread).await;
    assert_eq!(
        thread.len(),
        2,
        "the task and its one answer, nothing after: {thread:?}"
    );
    broker.no_invalid_requests();
}

/// Issue 19: AMP and ASMTP retried a refused key forever and never recorded it. Now the one
/// intake rule holds for every back-end: the refusal is logged once, the link says
/// `auth_failed` (what `status` shows), and it is retried (every 5 s for a key since issue 36,
/// which the 401 test below covers). The key is made the
/// way a person makes one (console login, `/users/api-keys`) and then deactivated there.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_deactivated_in_the_console_is_recorded_and_shown_by_status() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let key = broker
        .as_person(
            reqwest::Method::POST,
            "/users/api-keys",
            Some(json!({"name": "bridge"})),
        )
        .await;
    let dir = broker.config(&coder, &boss.1, "echo");
    dir.write_private("amp.key", key["raw_key"].as_str().unwrap());
    let bridge = Bridge::start(&dir, 1);
    let sent = broker
        .send(&boss, &coder.1, "Hello", "with the new key")
        .await;
    assert_eq!(broker.replies_to(&sent, &coder.1).await.len(), 1);
    broker
        .as_person(
            reqwest::Method::POST,
            &format!("/users/api-keys/{}/deactivate", key["id"].as_str().unwrap()),
            None,
        )
        .await;
    bridge
        .wait_log("the AMP broker refused the credentials")
        .await;
    dir.assert_status_refused();
    let text = dir.run(&["status"]);
    assert!(text.contains("credentials refused, read "), "{text}");
    assert_eq!(
        bridge.log().matches("refused the credentials").count(),
        1,
        "said once, not at every retry"
    );
    assert!(bridge.stop().success());
}

/// How long after `since` the thread of `sent` first held a reply from `from`; `None` when
/// it held none within `within`.
async fn replied_within(
    broker: &Broker,
    sent: &Value,
    from: &str,
    since: std::time::Instant,
    within: Duration,
) -> Option<Duration> {
    let thread = sent["thread_id"].as_str().unwrap();
    support::found_within(since, within, || async {
        let messages = broker.thread(thread).await;
        messages.iter().any(|m| m["from_agent"] == from)
    })
    .await
}

/// How a test tells the bridge a key was replaced.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reload {
    Sighup,
    /// `aamp-bridge reload` (the control socket).
    Command,
    /// Nothing: the bridge finds the new file itself.
    None,
}

/// Issue 37: a key revoked and replaced in the console, the new one written to
/// `api_key_file`, with `reload` (SIGHUP or `aamp-bridge reload`) or without: the answer
/// waiting in the outbox and the task waiting on the broker both go through within 5 s. On
/// fb62012 the mailbox stayed `auth_failed` until a restart. Returns the seconds from the new
/// key to each answer.
async fn a_replaced_key_is_used(reload: Reload) -> (f64, f64) {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let (old_id, old_key) = broker.console_key("bridge").await;
    let dir = broker.config(&coder, &boss.1, "echo");
    dir.write_private("amp.key", &old_key);
    let gate = dir.use_gated_profile();
    let mut bridge = Bridge::start(&dir, 1);
    let waiting = broker
        .send(&boss, &coder.1, "Before", "answered late")
        .await;
    bridge.wait_event("task.started", |_| true);
    broker
        .as_person(
            reqwest::Method::POST,
            &format!("/users/api-keys/{old_id}/deactivate"),
            None,
        )
        .await;
    // The answer is ready only now: its reply is refused and waits in the outbox.
    std::fs::write(&gate, "").unwrap();
    bridge.wait_event("mail.retrying", |e| e["intent"] == "task.result");
    bridge
        .wait_log("the AMP broker refused the credentials")
        .await;
    let next = broker
        .send(&boss, &coder.1, "After", "answered with the new key")
        .await;
    let (_, new_key) = broker.console_key("bridge, rotated").await;
    dir.replace_private("amp.key", &new_key);
    let replaced = std::time::Instant::now();
    match reload {
        Reload::Sighup => bridge.signal(nix::sys::signal::Signal::SIGHUP),
        Reload::Command => {
            // A refused key's file is also watched, so the bridge may have read the new
            // key itself before the command came: then the command finds it unchanged.
            let said = dir.run(&["reload"]);
            assert!(
                said.contains("credentials reloaded for coder")
                    || said.contains("credentials of coder unchanged, and they work"),
                "{said}\n{}",
                bridge.log()
            );
        }
        Reload::None => {}
    }
    let within = Duration::from_secs(5);
    let answered = replied_within(&broker, &waiting, &coder.1, replaced, within).await;
    let next_answered = replied_within(&broker, &next, &coder.1, replaced, within).await;
    let status = dir.status_json();
    let log = bridge.log();
    assert!(
        answered.is_some() && next_answered.is_some(),
        "the waiting answer ({answered:?}) and the next task ({next_answered:?}) within {within:?} of the new key\n{status}"
    );
    assert_eq!(
        log.matches("credentials reloaded for coder").count(),
        1,
        "said once"
    );
    let credentials = &status["agents"][0]["link"]["credentials"];
    assert_eq!(credentials["worked"], true, "{status}");
    assert!(credentials["file"].as_str().unwrap().ends_with("amp.key"));
    assert_eq!(
        status["agents"][0]["link"]["mailbox"], "connected",
        "{status}"
    );
    let text = dir.run(&["status"]);
    assert!(text.contains("credentials work, read "), "{text}");
    assert!(
        !text.contains(&new_key) && !log.contains(&new_key),
        "never shown"
    );
    // Each answered once.
    for sent in [&waiting, &next] {
        assert_eq!(broker.replies_to(sent, &coder.1).await.len(), 1);
    }
    assert!(bridge.stop().success());
    broker.no_invalid_requests();
    (
        answered.unwrap().as_secs_f64(),
        next_answered.unwrap().as_secs_f64(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_replaced_and_reloaded_is_used_within_seconds() {
    let (waiting, next) = a_replaced_key_is_used(Reload::Sighup).await;
    eprintln!(
        "SIGHUP to the waiting answer: {waiting:.2} s; to the next task's answer: {next:.2} s"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_replaced_and_reloaded_by_the_reload_command_is_used_within_seconds() {
    let (waiting, next) = a_replaced_key_is_used(Reload::Command).await;
    eprintln!("`aamp-bridge reload` to the waiting answer: {waiting:.2} s; to the next task's answer: {next:.2} s");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_replaced_on_disk_without_a_reload_is_used_at_the_next_retry() {
    let (waiting, next) = a_replaced_key_is_used(Reload::None).await;
    eprintln!("new key file to the waiting answer: {waiting:.2} s; to the next task's answer: {next:.2} s");
}

/// Issue 21: a person who opened a task in the broker's console (which marks it read) before
/// the bridge polled lost it: the bridge listed only unread messages. It follows the inbox by
/// position now, so the task is answered, once.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_read_in_the_console_first_is_still_answered_once() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let dir = broker.config(&coder, &boss.1, "echo");
    // A first start, so the bridge has its position; then it is stopped while the task
    // arrives and is read in the console.
    let bridge = Bridge::start(&dir, 1);
    let first = broker.send(&boss, &coder.1, "First", "one").await;
    assert_eq!(broker.replies_to(&first, &coder.1).await.len(), 1);
    assert!(bridge.stop().success());
    let sent = broker
        .send(&boss, &coder.1, "Opened", "read by a person first")
        .await;
    let opened = broker.open_in_console(&sent).await;
    assert_eq!(opened["is_read"], true);
    // Another thread archived meanwhile: hidden from the inbox, so the count alone would
    // not have changed; the walk still finds the new task.
    broker.archive_thread(&first).await;
    let extra = broker.send(&boss, &coder.1, "Third", "three").await;

    let mut bridge = Bridge::start(&dir, 1);
    let thread = sent["thread_id"].as_str().unwrap();
    let replies = broker.replies(thread, &coder.1).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(broker.replies_to(&extra, &coder.1).await.len(), 1);
    let task_id = format!("amp:{thread}:{}", sent["id"].as_str().unwrap());
    bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
    assert!(bridge.stop().success());
    // And once: a restart finds nothing new.
    let bridge = Bridge::start(&dir, 1);
    let fourth = broker.send(&boss, &coder.1, "Fourth", "four").await;
    broker.replies_to(&fourth, &coder.1).await;
    assert_eq!(broker.replies(thread, &coder.1).await.len(), 1);
    assert!(bridge.stop().success());
    broker.no_invalid_requests();
}

/// Issue 21: the broker renders every message it returns in its one event loop (the real one
/// took 21-33 s to read an inbox holding one 2 MB message), so the fixed 30 s timeout cut the
/// read of a large task every time, and the thread read before each reply too. The timeout is
/// the mailbox's own (`timeout_secs`, default 120), an idle poll renders nothing, and the reply
/// is posted without reading the thread.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_message_on_a_slow_broker_is_answered_without_rereading_it() {
    // 330 ms per KB: the 100 KB task costs 33 s every time the broker returns it.
    let (broker, coder, boss) = Broker::with_coder_and_boss(&["--render-ms-per-kb", "330"]).await;
    let dir = broker.config(&coder, &boss.1, "echo");
    dir.use_profile(
        "short.toml",
        "command = \"python3\"\nargs = [\"-c\", \"print('read it')\"]\ntimeout_secs = 60\n",
    );
    let bridge = Bridge::start(&dir, 1);
    let big = "word ".repeat(20_000);
    let sent = broker.send(&boss, &coder.1, "Big", &big).await;
    // Waited for in the boss's inbox, which holds only the short answer (the thread would
    // render the task again).
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let inbox = broker
            .call(
                reqwest::Method::GET,
                &format!("/messages/inbox/{}?agent_id={}&all=true", boss.1, boss.0),
                None,
            )
            .await;
        let answers = inbox
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["parent_id"] == sent["id"])
            .count();
        if answers > 0 {
            assert_eq!(answers, 1);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no answer");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let it poll a few more times, idle.
    let polls = || {
        broker
            .record()
            .iter()
            .filter(|r| {
                r["ua"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("aamp-bridge")
            })
            .count()
    };
    let before = polls();
    support::poll_until("three more polls", || polls() >= before + 3).await;
    // The big message was read by the bridge once: by the read that took it. (Marking it
    // read renders it once more: the broker answers the PATCH with the message.)
    let big_calls: Vec<String> = broker
        .record()
        .iter()
        .filter(|r| {
            r["ua"]
                .as_str()
                .unwrap_or_default()
                .starts_with("aamp-bridge")
                && r["rendered_bytes"].as_u64().unwrap_or(0) >= 100_000
        })
        .map(|r| r["method"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(big_calls, ["GET", "PATCH"]);
    assert!(bridge.stop().success());
    broker.no_invalid_requests();
}

/// A poll compared the inbox's visible count only, so a task that arrived while another
/// thread was archived (and was opened in the console) left the count as it was and waited
/// for the next arrival, forever in a quiet inbox. The unread count is compared too, and the
/// newest messages are read at each start and every `recheck_secs`.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_arrives_as_another_thread_is_archived_is_still_answered() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let dir = broker.config_with(&coder, &boss.1, "echo", "recheck_secs = 2\n");
    let bridge = Bridge::start(&dir, 1);
    let first = broker.send(&boss, &coder.1, "First", "one").await;
    assert_eq!(broker.replies_to(&first, &coder.1).await.len(), 1);

    // Between two polls (the bridge is held still meanwhile): the first thread is archived, a
    // task arrives and a person opens it. Both counts are what they were.
    let masked = |hidden: Value, text: &'static str| {
        let (broker, boss, coder) = (&broker, &boss, &coder);
        async move {
            broker.archive_thread(&hidden).await;
            let sent = broker.send(boss, &coder.1, text, text).await;
            broker.open_in_console(&sent).await;
            sent
        }
    };
    bridge.signal(nix::sys::signal::Signal::SIGSTOP);
    let second = masked(first, "Second").await;
    bridge.signal(nix::sys::signal::Signal::SIGCONT);
    assert_eq!(broker.replies_to(&second, &coder.1).await.len(), 1);
    assert!(
        bridge.log().contains("the inbox counts did not show"),
        "found by the recheck"
    );
    assert!(bridge.stop().success());

    // The same while the bridge is stopped, with no recheck: its start reads the newest.
    let text = std::fs::read_to_string(dir.config()).unwrap();
    dir.write(
        "config.toml",
        &text.replace("recheck_secs = 2", "recheck_secs = 0"),
    );
    let third = masked(second, "Third").await;
    let bridge = Bridge::start(&dir, 1);
    assert_eq!(broker.replies_to(&third, &coder.1).await.len(), 1);
    assert!(bridge.stop().success());
    broker.no_invalid_requests();
}

/// The broker lists the inbox newest first by `created_at` (a string), at most 100 a page.
/// More than a page arrived while the bridge was stopped: each is answered once, oldest
/// first, and a message trashed meanwhile is not (the inbox hides it).
#[tokio::test(flavor = "multi_thread")]
async fn more_than_a_page_of_tasks_is_answered_once_each_oldest_first() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let dir = broker.config(&coder, &boss.1, "echo");
    let bridge = Bridge::start(&dir, 1);
    let first = broker.send(&boss, &coder.1, "First", "one").await;
    broker.replies_to(&first, &coder.1).await;
    assert!(bridge.stop().success());

    let mut sent = Vec::new();
    for n in 0..105 {
        sent.push(
            broker
                .send(&boss, &coder.1, &format!("Task {n}"), "say hello")
                .await,
        );
    }
    let trashed = broker.send(&boss, &coder.1, "Trashed", "never").await;
    broker.trash(&trashed).await;
    let mut bridge = Bridge::start(&dir, 1);
    let task_of = |m: &Value| {
        format!(
            "amp:{}:{}",
            m["thread_id"].as_str().unwrap(),
            m["id"].as_str().unwrap()
        )
    };
    bridge.wait_event("task.completed", |e| {
        e["taskId"] == task_of(sent.last().unwrap()).as_str()
    });
    for m in &sent {
        assert_eq!(broker.replies_to(m, &coder.1).await.len(), 1);
    }
    let started: Vec<String> = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "task.started")
        .map(|e| e["taskId"].as_str().unwrap().to_string())
        .collect();
    let expected: Vec<String> = sent.iter().map(task_of).collect();
    assert_eq!(started, expected, "each once, oldest first");
    assert!(bridge.stop().success());
    let boss_inbox = broker
        .call(
            reqwest::Method::GET,
            &format!("/messages/inbox/{}?agent_id={}&all=true", boss.1, boss.0),
            None,
        )
        .await;
    let answers = boss_inbox.as_array().unwrap();
    assert_eq!(answers.len(), 106, "one answer each");
    assert!(
        answers.iter().all(|m| m["parent_id"] != trashed["id"]),
        "the trashed message was not answered"
    );
    broker.no_invalid_requests();
}

/// Issue 30, item 5: under `permissions = "ask"` the question was posted, but the sender's
/// reply to it (AMP `parent_id` = the question) was taken as a new task: the question waited
/// out its timeout and was refused, then "Allow" ran on the agent as a task of its own. The
/// reply is now matched by the broker's own link: one answer each, no extra task, for Allow
/// and for Reject.
#[tokio::test(flavor = "multi_thread")]
async fn an_agents_question_is_answered_by_a_reply_in_the_thread_never_run_as_a_task() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let dir = broker.config(&coder, &boss.1, "asking.toml");
    dir.write_asking_agent(120);
    let mut bridge = Bridge::start(&dir, 1);
    for (choice, answer) in [
        ("Allow", "permission edit: yes Done."),
        (
            "Reject",
            "permission edit: no Done.\n\n(aamp-bridge: refused during this task: \"Edit README.md\" (the sender's answer))",
        ),
    ] {
        let sent = broker.send(&boss, &coder.1, "Fix the README", "Please fix the typo.").await;
        let thread = sent["thread_id"].as_str().unwrap();
        let question = broker.replies(thread, &coder.1).await;
        assert_eq!(question.len(), 1, "{question:?}");
        let body = question[0]["body"].as_str().unwrap();
        assert!(body.starts_with("**Question:**") && body.contains("Edit README.md"), "{body}");
        let posted = broker.reply(&boss, &coder.1, "Re: Fix the README", choice, &question[0]).await;
        let task_id = format!("amp:{thread}:{}", sent["id"].as_str().unwrap());
        let done = bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
        assert_eq!(done["status"], "completed", "{choice}: {done}");
        let answered = bridge.wait_event("task.answered", |e| e["answerTaskId"] == task_id.as_str());
        assert_eq!(answered["choice"], choice);
        bridge.wait_event("mail.sent", |e| {
            e["taskId"] == task_id.as_str() && e["intent"] == "task.result"
        });
        let from_coder: Vec<Value> = broker
            .thread(thread)
            .await
            .into_iter()
            .filter(|m| m["from_agent"] == coder.1.as_str())
            .collect();
        assert_eq!(from_coder.len(), 2, "the question and the one result: {from_coder:?}");
        let result = from_coder[1]["body"].as_str().unwrap();
        assert!(result.starts_with(answer), "{choice}: {result}");
        // The answer never became a task.
        let answer_task = format!("amp:{thread}:{}", posted["id"].as_str().unwrap());
        assert!(
            !bridge
                .seen
                .iter()
                .any(|e| e["taskId"] == answer_task.as_str() && e["event"] != "task.answered"),
            "{choice}: the answer was taken as a task: {:?}",
            bridge.seen
        );
    }
    assert!(bridge.stop().success());
    broker.no_invalid_requests();
}

/// Issue 30, item 5, after a restart: the questions the agent posted were known only to the
/// process that posted them, so a reply to one that came after a restart was taken as a new
/// task again ("Allow" run on the agent). They are kept beside the mailbox's position now:
/// the reply is an answer (to a question no task waits on any more), never a task.
#[tokio::test(flavor = "multi_thread")]
async fn a_reply_to_a_question_asked_before_a_restart_is_never_run_as_a_task() {
    reply_after_a_restart(false).await;
}

/// The same, when the bridge was killed after posting the question and before it noted it
/// (a race the CI run hit: the reply was taken as a task): the bridge finds the question in
/// the thread by its marker. The questions file is removed here to make that moment certain.
#[tokio::test(flavor = "multi_thread")]
async fn a_reply_to_a_question_the_killed_bridge_never_noted_is_never_run_as_a_task() {
    reply_after_a_restart(true).await;
}

async fn reply_after_a_restart(forget_noted: bool) {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let dir = broker.config(&coder, &boss.1, "asking.toml");
    dir.write_asking_agent(120);
    let bridge = Bridge::start(&dir, 1);
    let sent = broker
        .send(&boss, &coder.1, "Fix the README", "Please fix the typo.")
        .await;
    let thread = sent["thread_id"].as_str().unwrap();
    let question = broker.replies(thread, &coder.1).await;
    bridge.kill();
    if forget_noted {
        let noted = dir.dir.path().join("state/agents/coder/amp-questions");
        match std::fs::remove_file(&noted) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{noted:?}: {e}"),
            _ => {}
        }
    }
    let mut bridge = Bridge::start(&dir, 1);
    let posted = broker
        .reply(&boss, &coder.1, "Re: Fix the README", "Allow", &question[0])
        .await;
    // A task sent after the reply is read after it: once it is answered, the reply was read.
    let later = broker.send(&boss, &coder.1, "Later", "Another task.").await;
    let later_id = format!(
        "amp:{}:{}",
        later["thread_id"].as_str().unwrap(),
        later["id"].as_str().unwrap()
    );
    bridge.wait_event("task.received", |e| e["taskId"] == later_id.as_str());
    let answer_task = format!("amp:{thread}:{}", posted["id"].as_str().unwrap());
    bridge.take_events();
    assert!(
        !bridge
            .seen
            .iter()
            .any(|e| e["taskId"] == answer_task.as_str()),
        "the answer was taken as a task: {:?}",
        bridge.seen
    );
    // The task itself ran again after the restart and asked again: that question is answered
    // as usual.
    let task_id = format!("amp:{thread}:{}", sent["id"].as_str().unwrap());
    let asked_again = loop {
        let from_coder: Vec<Value> = broker
            .thread(thread)
            .await
            .into_iter()
            .filter(|m| m["from_agent"] == coder.1.as_str() && m["id"] != question[0]["id"])
            .collect();
        if let Some(q) = from_coder.into_iter().next() {
            break q;
        }
        bridge.wait_event("mail.sent", |e| e["taskId"] == task_id.as_str());
    };
    broker
        .reply(&boss, &coder.1, "Re: Fix the README", "Allow", &asked_again)
        .await;
    let done = bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
    assert_eq!(done["status"], "completed", "{done}");
    // The later task asks too; a reply to it lets the bridge stop with nothing running.
    let later_thread = later["thread_id"].as_str().unwrap();
    let later_question = broker.replies(later_thread, &coder.1).await;
    broker
        .reply(&boss, &coder.1, "Re: Later", "Reject", &later_question[0])
        .await;
    bridge.wait_event("task.completed", |e| e["taskId"] == later_id.as_str());
    assert!(bridge.stop().success());
    broker.no_invalid_requests();
}

/// Issue 36, item 2, on AMP: a message of any size was taken whole (into the journal, the
/// prompt and the agent). One over `max_message_bytes` is answered rejected, saying why and
/// what to do, and never reaches the agent; a message under it is answered as usual.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_over_the_size_limit_is_answered_rejected_and_never_run() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let dir = broker.config_with(&coder, &boss.1, "echo", "max_message_bytes = 2000\n");
    let mut bridge = Bridge::start(&dir, 1);
    let big = broker.send(&boss, &coder.1, "Big", &"x".repeat(5000)).await;
    let small = broker.send(&boss, &coder.1, "Small", "say hello").await;
    let refused = broker.replies_to(&big, &coder.1).await;
    let text = refused[0]["body"].as_str().unwrap();
    assert!(
        text.contains("rejected")
            && text.contains("5000 bytes")
            && text.contains("max_message_bytes"),
        "{text}"
    );
    assert!(!text.contains("xxxx"), "{text}");
    let answered = broker.replies_to(&small, &coder.1).await;
    assert!(answered[0]["body"].as_str().unwrap().contains("say hello"));
    let big_id = format!(
        "amp:{}:{}",
        big["thread_id"].as_str().unwrap(),
        big["id"].as_str().unwrap()
    );
    bridge.take_events();
    assert!(
        !bridge
            .seen
            .iter()
            .any(|e| e["event"] == "task.started" && e["taskId"] == big_id.as_str()),
        "the large task ran"
    );
    assert!(bridge.stop().success());
    broker.no_invalid_requests();
}

/// Issue 36, item 1, on AMP: a message the bridge could not decode (no `from_agent`) failed the
/// whole inbox page, so nothing after it was answered. Now it costs itself only: reported once,
/// marked read, and the messages after it answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_the_bridge_cannot_read_costs_that_message_only() {
    let (broker, coder, boss) =
        Broker::with_coder_and_boss(&["--malformed-subject", "POISON"]).await;
    let dir = broker.config(&coder, &boss.1, "echo");
    let mut bridge = Bridge::start(&dir, 1);
    let poison = broker
        .send(&boss, &coder.1, "POISON", "you cannot read me")
        .await;
    let good = broker.send(&boss, &coder.1, "Fine", "say hello").await;
    let replies = broker.replies_to(&good, &coder.1).await;
    assert!(replies[0]["body"].as_str().unwrap().contains("say hello"));
    let ignored = bridge.wait_event("message.ignored", |e| e["messageId"] == poison["id"]);
    assert!(
        ignored["reason"]
            .as_str()
            .unwrap()
            .contains("missing field `from_agent`"),
        "{ignored}"
    );
    let later = broker.send(&boss, &coder.1, "Later", "again").await;
    broker.replies_to(&later, &coder.1).await;
    bridge.take_events();
    let times = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "message.ignored" && e["messageId"] == poison["id"])
        .count();
    assert_eq!(times, 1, "reported once");
    assert!(bridge.stop().success());
}

/// Issue 36, item 5, on AMP: the agent's files were dropped. The broker takes images (PNG,
/// JPEG, GIF, WebP up to 10 MB, as agent-mailer's `/files/upload`): those go as the reply's
/// attachments; the rest are named in the answer instead of dropped silently.
#[tokio::test(flavor = "multi_thread")]
async fn files_an_agent_hands_over_go_as_the_brokers_attachments_or_are_named() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let dir = broker.config(&coder, &boss.1, "echo");
    dir.use_profile(
        "files.toml",
        "command = \"sh\"\nargs = [\"-c\", \"printf '\\\\211PNG\\\\r\\\\n\\\\032\\\\nchart' > chart.png; echo notes > notes.txt; echo 'Here they are.'; echo 'FILE: chart.png'; echo 'FILE: notes.txt'\"]\n",
    );
    let bridge = Bridge::start(&dir, 1);
    let sent = broker
        .send(&boss, &coder.1, "Files", "Make the files.")
        .await;
    let replies = broker.replies_to(&sent, &coder.1).await;
    let body = replies[0]["body"].as_str().unwrap();
    assert!(
        body.contains("not sent: the AMP broker takes only PNG, JPEG, GIF and WebP images of up to 10 MB: notes.txt"),
        "{body}"
    );
    let attachments = replies[0]["attachments"].as_array().unwrap();
    assert_eq!(attachments.len(), 1, "{replies:?}");
    assert_eq!(attachments[0]["filename"], "chart.png");
    assert_eq!(attachments[0]["mime_type"], "image/png");
    assert!(bridge.stop().success());
    broker.no_invalid_requests();
}

/// Issue 36, item 4: a task opened in the broker's console before the bridge ever started was
/// never answered (the first start answered only the unread ones). With `skip_backlog` unset, a
/// first start now also answers the newest messages that were read but have no reply from
/// the agent in their thread; one it answered before (another state folder, a copy of the
/// agent) is left alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_opened_in_the_console_before_the_first_start_is_answered() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    // Answered before, by the agent (a reply from it in the thread): not answered again.
    let done = broker
        .send(&boss, &coder.1, "Done", "already answered")
        .await;
    broker.open_in_console(&done).await;
    broker
        .reply(&coder, &boss.1, "Re: Done", "done", &done)
        .await;
    let opened = broker
        .send(&boss, &coder.1, "Opened", "looked at, not answered")
        .await;
    assert_eq!(broker.open_in_console(&opened).await["is_read"], true);
    let unread = broker.send(&boss, &coder.1, "Unread", "never opened").await;
    let dir = broker.config(&coder, &boss.1, "echo");
    let bridge = Bridge::start(&dir, 1);
    let replies = broker.replies_to(&opened, &coder.1).await;
    assert!(replies[0]["body"].as_str().unwrap().contains("looked at"));
    broker.replies_to(&unread, &coder.1).await;
    let later = broker.send(&boss, &coder.1, "Later", "after").await;
    broker.replies_to(&later, &coder.1).await;
    assert!(bridge.stop().success());
    let from_coder: Vec<Value> = broker
        .thread(done["thread_id"].as_str().unwrap())
        .await
        .into_iter()
        .filter(|m| m["from_agent"] == coder.1.as_str())
        .collect();
    assert_eq!(from_coder.len(), 1, "answered once, before: {from_coder:?}");
    broker.no_invalid_requests();
}

/// Issue 36, item 3: the AMP key was deactivated while the agent ran; its answer stayed in the
/// outbox (right), but after the key was made active again it went out 280 s later (the
/// refused credentials' 5-minute wait). The same key working again is noticed within seconds,
/// and the waiting answer goes.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_refused_with_401_goes_within_seconds_once_the_key_works_again() {
    let (broker, coder, boss) = Broker::with_coder_and_boss(&[]).await;
    let (key_id, raw_key) = broker.console_key("bridge").await;
    let dir = broker.config(&coder, &boss.1, "echo");
    dir.write_private("amp.key", &raw_key);
    // The agent answers once the test lets it.
    let go = dir.dir.path().join("go");
    dir.use_profile(
        "waiting.toml",
        &format!(
            "command = \"sh\"\nargs = [\"-c\", \"while [ ! -e {} ]; do sleep 0.1; done; echo answered\"]\n",
            go.display()
        ),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let sent = broker.send(&boss, &coder.1, "Hello", "answer later").await;
    let task_id = format!(
        "amp:{}:{}",
        sent["thread_id"].as_str().unwrap(),
        sent["id"].as_str().unwrap()
    );
    bridge.wait_event("task.started", |e| e["taskId"] == task_id.as_str());
    broker
        .as_person(
            reqwest::Method::POST,
            &format!("/users/api-keys/{key_id}/deactivate"),
            None,
        )
        .await;
    std::fs::write(&go, "").unwrap();
    bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
    bridge.wait_log("refused the credentials").await;
    let activated = std::time::Instant::now();
    broker
        .as_person(
            reqwest::Method::POST,
            &format!("/users/api-keys/{key_id}/reactivate"),
            None,
        )
        .await;
    let replies = broker.replies_to(&sent, &coder.1).await;
    let took = activated.elapsed();
    assert_eq!(replies.len(), 1);
    assert!(replies[0]["body"].as_str().unwrap().contains("answered"));
    println!("the waiting answer went {took:?} after the key worked again");
    assert!(
        took < Duration::from_secs(15),
        "the waiting answer went {took:?} after the key worked again"
    );
    assert!(bridge.stop().success());
}
