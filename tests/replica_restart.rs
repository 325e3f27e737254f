//! Issue 43: a replica killed between recording a task's result and sending it came back
//! after another replica had taken the task over, sent its recorded result, and the other
//! sent its own: two answers under one Message-ID. A replica sends a task's result only
//! while it still holds the task's claim (or marked it done itself).

mod support;

use std::time::{Duration, Instant};

use aamp_bridge::protocol::Intent;
use support::{mailhost, Bridge, ConfigDir, MailHost, Peer};

/// A config folder for replica `name` of `agent`'s mailbox, whose agent takes half a second
/// over a task.
fn replica(
    host: &MailHost,
    agent: &aamp_bridge::config::Account,
    boss: &str,
    name: &str,
) -> ConfigDir {
    support::replica(host, agent, boss, name, &support::sleeper(0.5), "")
}

/// The `mail.sent` events of `bridge` for `task`'s result.
fn results_sent(bridge: &mut Bridge, task: &str) -> usize {
    bridge.take_events();
    bridge
        .seen
        .iter()
        .filter(|e| {
            e["event"] == "mail.sent" && e["taskId"] == task && e["intent"] == "task.result"
        })
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_back_after_a_takeover_does_not_send_the_result_it_recorded() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let (d1, d2) = (
        replica(host, &agent, &boss.email, "r1"),
        replica(host, &agent, &boss.email, "r2"),
    );
    // r1 alone: it claims and runs the task, records its result, and ends right there.
    let mut r1 = Bridge::start_with_env(&d1, 1, &[("AAMP_BRIDGE_FAULT", "exit-after-result")]);
    let mut peer = Peer::new(boss).await;
    let sent = peer
        .send(peer.dispatch_to(&agent.email, "Once", "answer once"))
        .await;
    let task = sent.task_id().to_string();
    let status = r1.wait_exit();
    assert_eq!(status.code(), Some(137), "{}", r1.log());
    assert!(
        r1.seen
            .iter()
            .any(|e| e["event"] == "task.started" && e["taskId"] == task.as_str()),
        "r1 ran it"
    );
    assert_eq!(results_sent(&mut r1, &task), 0, "r1 ended before sending");
    // r2 takes the task over once r1's lease ends, runs it and answers.
    let mut r2 = Bridge::start(&d2, 1);
    peer.wait_for_within(&task, Intent::TaskResult, Duration::from_secs(60))
        .await;
    // r1 comes back with the result it recorded: its claim is r2's now, so it drops it.
    let mut r1 = Bridge::start(&d1, 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !r1.log().contains("not sent here") {
        assert_eq!(
            results_sent(&mut r1, &task),
            0,
            "r1 sent what it no longer held"
        );
        assert!(Instant::now() < deadline, "r1 never decided:\n{}", r1.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(results_sent(&mut r1, &task), 0);
    assert_eq!(results_sent(&mut r2, &task), 1);
    peer.settle(&via).await;
    let intents = peer.intents_for(&task);
    assert_eq!(
        intents.iter().filter(|i| **i == Intent::TaskResult).count(),
        1,
        "{intents:?}"
    );
    // `status` shows the journal's size and its limit (issue 43, item 4).
    let status = d1.status_json();
    assert!(status["journal"]["bytes"].as_u64().unwrap() > 0, "{status}");
    assert_eq!(status["journal"]["maxBytes"], 1024 << 20, "{status}");
    assert!(d1.run(&["status"]).contains("(kept under 1024 MB)"));
    let shown = d1.run(&["task", "show", &task]);
    assert!(shown.contains("left to another replica"), "{shown}");
    for b in [r1, r2] {
        assert!(b.stop().success());
    }
}
