//! Delegation between agents, over the real mail host: the guards a delegation chain carries
//! in its `X-AAMP-*` headers (hop count, chain members, deadline, token budget, trace) are
//! checked by the receiving bridge like any other dispatch, and a chain past one of them is
//! answered `rejected` with the reason, never silence.

mod support;

use aamp_bridge::protocol::chain::Traceparent;
use aamp_bridge::protocol::{AampMessage, Body, Chain, Intent, Status};
use support::{mailhost, Bridge, ConfigDir, Peer};

fn answer(msg: &aamp_bridge::mailbox::Inbound) -> (Status, String, String) {
    match &msg.message.body {
        Body::Result(r) => (
            r.status,
            r.error.clone().unwrap_or_default(),
            r.output.clone(),
        ),
        other => panic!("not a result: {other:?}"),
    }
}

fn chained(peer: &Peer, to: &str, title: &str, hops: Option<u32>, chain: Chain) -> AampMessage {
    let mut msg = peer.dispatch_to(to, title, "hand-made dispatch of a delegation chain");
    if let Body::Dispatch(d) = &mut msg.body {
        d.hop_count = hops;
        d.parent_task_id = Some("parent-task".into());
        d.chain = chain;
    }
    msg
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_past_its_hop_limit_deadline_or_budget_or_looping_back_is_rejected_with_why() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let text = support::Toml::new()
        .host_mailbox(host, "agent", &agent, "")
        .agent("agent", "echo", &[&boss.email], "max_hops = 5")
        .text();
    let dir = ConfigDir::new(host, &text);
    let mut peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);
    let trace = Traceparent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    let good = Chain {
        id: Some("chain-ok".into()),
        members: vec![boss.email.clone()],
        deadline: Some("2999-01-01T00:00:00Z".into()),
        budget_tokens: Some(10_000),
        traceparent: trace.clone(),
    };
    let cases = [
        (
            "too deep",
            Some(5),
            good.clone(),
            "loop guard: this task was passed on between agents 5 times (at most 5)",
        ),
        (
            "loop",
            Some(2),
            Chain {
                members: vec![boss.email.clone(), agent.email.to_uppercase()],
                ..good.clone()
            },
            "loop guard: this delegation chain chain-ok already passed through agent",
        ),
        (
            "late",
            Some(1),
            Chain {
                deadline: Some("2020-01-01T00:00:00Z".into()),
                ..good.clone()
            },
            "deadline: this delegation chain chain-ok had to be done by 2020-01-01T00:00:00Z",
        ),
        (
            "spent",
            Some(1),
            Chain {
                budget_tokens: Some(0),
                ..good.clone()
            },
            "over budget: this delegation chain chain-ok has no tokens left",
        ),
    ];
    let mut sent = Vec::new();
    for (title, hops, chain, _) in &cases {
        sent.push(
            peer.send(chained(&peer, &agent.email, title, *hops, chain.clone()))
                .await,
        );
    }
    let fine = peer
        .send(chained(&peer, &agent.email, "fine", Some(4), good.clone()))
        .await;
    for (msg, (title, _, _, why)) in sent.iter().zip(&cases) {
        let result = peer.wait_for(msg.task_id(), Intent::TaskResult).await;
        let (status, error, _) = answer(&result);
        assert_eq!(status, Status::Rejected, "{title}: {error}");
        assert!(error.starts_with(why), "{title}: {error}");
        // Refused before anything was acknowledged.
        assert!(
            !peer.intents_for(msg.task_id()).contains(&Intent::TaskAck),
            "{title}"
        );
    }
    let (status, error, output) = answer(&peer.wait_for(fine.task_id(), Intent::TaskResult).await);
    assert_eq!(status, Status::Completed, "{error}");
    assert!(!output.is_empty());
    bridge.wait_count("task.rejected", cases.len());
    assert!(bridge.stop().success());

    // The journal keeps each task's chain: the one that ran, and the refused ones.
    let journal =
        aamp_bridge::dispatch::Journal::open(&dir.dir.path().join("state/journal.sqlite3"))
            .unwrap();
    let tasks = journal.chain_tasks("chain-ok").unwrap();
    assert_eq!(tasks.len(), cases.len() + 1, "{tasks:?}");
    let ran = tasks.iter().find(|t| t.task_id == fine.task_id()).unwrap();
    assert_eq!(ran.chain.parent_task_id.as_deref(), Some("parent-task"));
    assert_eq!(ran.chain.hops, Some(4));
    assert_eq!(ran.chain.chain, good);
}
