//! JMAP push over the real mail host (Cyrus rebuilt with WebSocket support): dispatches are
//! picked up by push, by polling when push is off, and none is lost when the mail host
//! stops and starts again under traffic.

mod support;

use aamp_bridge::protocol::{Body, Intent, Status};
use support::{mailhost, Bridge, ConfigDir, MailHost, Peer, PrivateHost};

fn config(
    host: &MailHost,
    agent: &aamp_bridge::config::Account,
    boss: &str,
    settings: &str,
) -> String {
    support::Toml::new()
        .host_mailbox(host, "agent", agent, settings)
        .agent("agent", "echo", &[boss], "")
        .text()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_is_picked_up_by_push() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    // Polling every 5 minutes and reconciling every 5 minutes: only push can be this quick.
    let dir = ConfigDir::new(
        host,
        &config(
            host,
            &agent,
            &boss.email,
            "poll_interval_secs = 300\nreconcile_interval_secs = 300\n",
        ),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let push = bridge.wait_event("mailbox.push", |e| e["connected"] == true);
    assert_eq!(push["transport"], "websocket", "WebSocket is preferred");
    // The link state a status command reads.
    let link: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.dir.path().join("state/agents/agent/link.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (link["mailbox"].as_str(), link["push"].as_str()),
        (Some("connected"), Some("websocket")),
        "{link}"
    );
    let mut peer = Peer::new(boss).await;
    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Pushed", "Hello by push."))
        .await;
    // The bridge's next poll is minutes away; the waits below are 30 s at most.
    bridge.wait_event("task.received", |e| e["taskId"] == dispatch.task_id());
    let result = peer.wait_for(dispatch.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_is_picked_up_by_event_source_push() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &config(host, &agent, &boss.email, "poll_interval_secs = 300\nreconcile_interval_secs = 300\npush_transport = \"eventsource\"\n"));
    let mut bridge = Bridge::start(&dir, 1);
    let push = bridge.wait_event("mailbox.push", |e| e["connected"] == true);
    assert_eq!(push["transport"], "eventsource");
    let mut peer = Peer::new(boss).await;
    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Pushed", "Hello by EventSource."))
        .await;
    // The bridge's next poll is minutes away: only the event source can be this quick.
    bridge.wait_event("task.received", |e| e["taskId"] == dispatch.task_id());
    peer.wait_for(dispatch.task_id(), Intent::TaskResult).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_push_off_the_bridge_polls() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &config(
            host,
            &agent,
            &boss.email,
            "poll_interval_secs = 1\npush = false\n",
        ),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;
    let dispatch = peer
        .send(peer.dispatch_to(&agent.email, "Polled", "Hello by polling."))
        .await;
    peer.wait_for(dispatch.task_id(), Intent::TaskResult).await;
    bridge.wait_event("task.completed", |e| e["taskId"] == dispatch.task_id());
    assert!(
        !bridge.seen.iter().any(|e| e["event"] == "mailbox.push"),
        "no push connection was made"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_dispatch_is_lost_when_the_mail_host_restarts_under_traffic() {
    let Some(_) = mailhost() else { return };
    let private = PrivateHost::start("restart");
    let host = &private.0;
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &config(host, &agent, &boss.email, "poll_interval_secs = 2\n"),
    );
    let mut bridge = Bridge::start(&dir, 1);
    bridge.wait_event("mailbox.push", |e| e["connected"] == true);
    let peer = Peer::new(boss.clone()).await;

    // A burst, then the host goes down at once: some of it is not handled yet.
    let mut sent = Vec::new();
    for i in 0..5 {
        sent.push(
            peer.send(peer.dispatch_to(&agent.email, &format!("Burst {i}"), "before the restart"))
                .await,
        );
    }
    private.stop();
    bridge.wait_event("mailbox.push", |e| e["connected"] == false);
    private.restart();
    // The peer's own JMAP session must be made again after the restart.
    let mut peer = Peer::new(boss).await;
    for i in 0..3 {
        sent.push(
            peer.send(peer.dispatch_to(&agent.email, &format!("After {i}"), "after the restart"))
                .await,
        );
    }
    for dispatch in &sent {
        bridge.wait_event("task.completed", |e| e["taskId"] == dispatch.task_id());
    }
    // Every task was handled exactly once.
    for dispatch in &sent {
        let received = bridge
            .seen
            .iter()
            .filter(|e| e["event"] == "task.received" && e["taskId"] == dispatch.task_id())
            .count();
        assert_eq!(
            received,
            1,
            "task {} was received {received} times",
            dispatch.task_id()
        );
    }
    bridge.wait_event("mailbox.push", |e| e["connected"] == true);
    let _ = peer
        .wait_for(sent.last().unwrap().task_id(), Intent::TaskResult)
        .await;
}
