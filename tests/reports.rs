//! Issue 31: delivery reports (RFC 3464 bounces) are believed only when the mailbox's own
//! server made them. Anyone can send a mail with a `message/delivery-status` part over the
//! server's inbound port naming any Message-ID (an answer's is derived from its dispatch's),
//! and on fb62012 such a mail marked a sent answer undelivered, stopped an answer still
//! waiting in the outbox from ever leaving, and ended a waiting `aamp-bridge dispatch` with
//! exit 3 after the agent's ack. A real Postfix bounce is still believed: see `tests/e2e.rs`
//! (`dispatch_to_an_address_that_does_not_exist_fails_within_seconds`,
//! `an_answer_that_bounces_is_shown_as_undelivered`).

mod support;

use std::time::Duration;

use aamp_bridge::protocol::{Body, Intent, Status};
use support::{forge_report, mailhost, Bridge, ConfigDir, Gate, Peer};

/// Waits until the bridge has read the report naming `message_id`: it ignored a report (this
/// build), or took it as a failure of that mail (builds that believed it). An ignored one's
/// event is then put aside, so the next report is waited for by its own.
fn read_report(bridge: &mut Bridge, message_id: &str) {
    let read = bridge.wait_for("the report read", |e| {
        (e["event"] == "message.ignored"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("a delivery report")))
            || (e["event"] == "mail.failed" && e["messageId"] == message_id)
    });
    if read["event"] == "message.ignored" {
        let at = bridge.seen.iter().position(|e| e == &read).unwrap();
        bridge.seen[at]["event"] = serde_json::json!("test.read");
    }
}

/// A CLI agent that takes `seconds` over every task.
fn sleeper(seconds: f64) -> String {
    format!(
        "name = \"sleeper\"\ncommand = \"python3\"\nargs = [\"-c\", \"import sys, time; sys.stdin.read(); time.sleep({seconds}); print('done')\"]\nstdin = \"{{{{prompt}}}}\"\ntimeout_secs = 120\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_reports_change_neither_sent_answers_nor_answers_waiting_to_be_sent() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let gate = Gate::new(host.smtp_port);
    let dir = ConfigDir::new(
        host,
        &support::Toml::new()
            .host_mailbox(host, "agent", &agent, "")
            .agent("agent", "sleeper.toml", &[&boss.email], "")
            .text()
            .replace(
                &format!("smtp_port = {}", host.smtp_port),
                &format!("smtp_port = {}", gate.port),
            ),
    );
    dir.write("sleeper.toml", &sleeper(0.1));
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;

    // A sent answer: its ack and result reported undelivered to their one recipient.
    let first = peer
        .send(peer.dispatch_to(&agent.email, "First", "answered"))
        .await;
    let ack = peer.wait_for(first.task_id(), Intent::TaskAck).await;
    let result = peer.wait_for(first.task_id(), Intent::TaskResult).await;
    for mail in [&ack, &result] {
        forge_report(
            host,
            &agent.email,
            &mail.message.envelope.message_id,
            &boss.email,
        );
        read_report(&mut bridge, &mail.message.envelope.message_id);
    }
    let listed: serde_json::Value =
        serde_json::from_str(&dir.run(&["tasks", "--state", "undelivered", "--json"])).unwrap();
    assert_eq!(listed, serde_json::json!([]), "{listed}");

    // Answers waiting in the outbox while SMTP is down: reported undelivered before they left.
    gate.close();
    let second = peer
        .send(peer.dispatch_to(&agent.email, "Second", "answered after the outage"))
        .await;
    let retrying = bridge.wait_event("mail.retrying", |e| {
        e["taskId"] == second.task_id() && e["intent"] == "task.ack"
    });
    // The result waits behind the ack: its Message-ID from the task's timeline.
    bridge.wait_event("task.completed", |e| e["taskId"] == second.task_id());
    let shown = dir.run(&["task", "show", second.task_id(), "--json"]);
    let result_id = shown
        .split_once("<task.result.")
        .and_then(|(_, rest)| rest.split_once('>'))
        .map(|(id, _)| format!("<task.result.{id}>"))
        .unwrap_or_else(|| panic!("{shown}"));
    for message_id in [retrying["messageId"].as_str().unwrap(), &result_id] {
        forge_report(host, &agent.email, message_id, &boss.email);
        read_report(&mut bridge, message_id);
    }
    gate.open();
    let result = peer
        .wait_for_within(
            second.task_id(),
            Intent::TaskResult,
            Duration::from_secs(60),
        )
        .await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed);
    assert!(
        !bridge.seen.iter().any(|e| e["event"] == "mail.failed"),
        "{:#?}",
        bridge.seen
    );
    let listed: serde_json::Value =
        serde_json::from_str(&dir.run(&["tasks", "--state", "undelivered", "--json"])).unwrap();
    assert_eq!(listed, serde_json::json!([]), "{listed}");
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    for task in [&first, &second] {
        assert_eq!(
            peer.intents_for(task.task_id()),
            vec![Intent::TaskAck, Intent::TaskResult]
        );
    }
}

/// `aamp-bridge dispatch` waiting for its result is not ended by a stranger's report that
/// the agent's address does not exist (after the agent acknowledged it, even).
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_report_does_not_end_a_waiting_dispatch() {
    use tokio::io::AsyncBufReadExt;
    let Some(host) = mailhost() else { return };
    let (agent, me) = (host.user("agent"), host.user("me"));
    let dir = ConfigDir::new(
        host,
        &support::Toml::new()
            .host_mailbox(host, "agent", &agent, "")
            .agent("agent", "sleeper.toml", &[&me.email], "")
            .text(),
    );
    dir.write("sleeper.toml", &sleeper(4.0));
    let bridge = Bridge::start(&dir, 1);
    let mine = ConfigDir::new(host, &host.mailbox_toml("me", &me));
    let mut dispatch = tokio::process::Command::new(support::bin())
        .args(["--config", mine.config().to_str().unwrap(), "dispatch"])
        .args(["--from", "me", "--to", &agent.email, "--timeout", "120"])
        .arg("wait for me")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(dispatch.stderr.take().unwrap()).lines();
    let mut told = Vec::new();
    let mut message_id = None;
    while let Some(line) = stderr.next_line().await.unwrap() {
        told.push(line.clone());
        if let Some(id) = line
            .rsplit_once('(')
            .and_then(|(_, id)| id.strip_suffix(')'))
        {
            if line.starts_with("sent task") {
                message_id = Some(id.to_string());
            }
        }
        if line.starts_with("acknowledged by") {
            break;
        }
    }
    let message_id = message_id.unwrap_or_else(|| panic!("{told:?}"));
    forge_report(host, &me.email, &message_id, &agent.email);
    let out = tokio::time::timeout(Duration::from_secs(60), async {
        let mut rest = Vec::new();
        while let Some(line) = stderr.next_line().await.unwrap() {
            rest.push(line);
        }
        (dispatch.wait().await.unwrap(), rest)
    })
    .await
    .expect("dispatch ends with its result");
    let (status, rest) = out;
    assert_eq!(status.code(), Some(0), "{told:?} {rest:?}");
    assert!(bridge.stop().success());
}

/// Issue 43: `dispatch --follow` from a mailbox with no AAMP service waited for a live stream
/// that never opens and showed nothing. It says why and how to fix it, and sends nothing.
#[test]
fn dispatch_follow_without_an_aamp_service_says_so_and_sends_nothing() {
    let Some(host) = mailhost() else { return };
    let me = host.user("follow-me");
    let mine = ConfigDir::new(host, &host.mailbox_toml("me", &me));
    let out = std::process::Command::new(support::bin())
        .args(["--config", mine.config().to_str().unwrap(), "dispatch"])
        .args(["--from", "me", "--to", "nobody@example.test", "--follow"])
        .arg("hello")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--follow shows the agent's live stream")
            && stderr.contains("aamp_url under [mailboxes.me]")
            && !stderr.contains("sent task"),
        "{stderr}"
    );
}
