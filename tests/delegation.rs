//! Delegation between agents, over the real mail host: the guards a delegation chain carries
//! in its `X-AAMP-*` headers (hop count, chain members, deadline, token budget, trace) are
//! checked by the receiving bridge like any other dispatch, and a chain past one of them is
//! answered `rejected` with the reason, never silence.

mod support;

use aamp_bridge::config::Account;
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

/// The planner runs `tests/agents/delegating_agent.py`, which uses the bridge's MCP server the
/// way an agent does; the coder is the echo agent on the same bridge.
fn planner_and_coder(
    host: &support::MailHost,
    planner: &Account,
    coder: &Account,
    boss: &str,
    (coder_profile, coder_extra): (&str, &str),
) -> (ConfigDir, std::path::PathBuf) {
    let script = format!(
        "{}/tests/agents/delegating_agent.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = support::Toml::new()
        .host_mailbox(host, "planner", planner, "")
        .host_mailbox(host, "coder", coder, "")
        .agent(
            "planner",
            "delegating.toml",
            &[boss],
            &format!("delegate_to = [{:?}]", coder.email),
        )
        .agent("coder", coder_profile, &[&planner.email], coder_extra)
        .text();
    let dir = ConfigDir::new(host, &text);
    let token_file = dir.dir.path().join("token");
    dir.write(
        "delegating.toml",
        &format!(
            "command = \"python3\"\nargs = [{script:?}, {:?}, {:?}, {:?}]\nstdin = \"{{{{prompt}}}}\"\ntimeout_secs = 200\n",
            support::bin(),
            coder.email,
            token_file.to_str().unwrap()
        ),
    );
    (dir, token_file)
}

fn output_json(msg: &aamp_bridge::mailbox::Inbound) -> serde_json::Value {
    let (status, error, output) = answer(msg);
    assert_eq!(status, Status::Completed, "{error}");
    serde_json::from_str(output.trim()).unwrap_or_else(|e| panic!("{e}: {output}"))
}

fn tool_answer(v: &serde_json::Value) -> serde_json::Value {
    assert_eq!(v["error"], false, "{v}");
    serde_json::from_str(v["text"].as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_delegates_through_its_mcp_server_and_gets_the_childs_answer() {
    let Some(host) = mailhost() else { return };
    let (planner, coder, boss) = (host.user("planner"), host.user("coder"), host.user("boss"));
    let (dir, token_file) = planner_and_coder(
        host,
        &planner,
        &coder,
        &boss.email,
        ("echo", "max_hops = 5"),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let bridge = Bridge::start(&dir, 2);

    let task = peer
        .send(peer.dispatch_to(&planner.email, "Plan", "write the plan"))
        .await;
    let out = output_json(&peer.wait_for(task.task_id(), Intent::TaskResult).await);
    assert_eq!(
        out["tools"],
        serde_json::json!([
            "list_agents",
            "delegate",
            "delegate_status",
            "delegate_cancel"
        ])
    );
    let agents = tool_answer(&out["agents"]);
    assert_eq!(agents["agents"][0]["address"], coder.email.as_str());
    let child = tool_answer(&out["answer"]);
    assert_eq!(child["state"], "completed", "{child}");
    assert!(
        child["answer"].as_str().unwrap().contains("child work:"),
        "the coder's answer comes back: {child}"
    );
    assert_eq!(out["nobody"]["error"], true);
    assert!(
        out["nobody"]["text"]
            .as_str()
            .unwrap()
            .contains("may not delegate to nobody@nowhere.test"),
        "{}",
        out["nobody"]
    );
    // A process that is not the task's own cannot use its credential.
    assert_eq!(out["foreign"]["error"], true);
    assert!(
        out["foreign"]["text"]
            .as_str()
            .unwrap()
            .contains("not one of the task's own"),
        "{}",
        out["foreign"]
    );
    // Once the task ended, its credential is refused.
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert_eq!(token.len(), 64);
    let socket = dir.dir.path().join("state/delegate.sock");
    let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(
            format!("{{\"token\":{token:?},\"tool\":\"list_agents\",\"args\":{{}}}}\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    assert!(reply.contains("the task ended"), "{reply}");

    // The child is the coder's task, one hop on, in a chain that names the planner.
    assert!(bridge.stop().success());
    let journal =
        aamp_bridge::dispatch::Journal::open(&dir.dir.path().join("state/journal.sqlite3"))
            .unwrap();
    let child_id = child["task_id"].as_str().unwrap();
    let delegation = journal.delegation("planner", child_id).unwrap().unwrap();
    assert_eq!(delegation.state, "completed");
    let (row, _) = journal
        .admitted_task("coder", &planner.email, child_id)
        .unwrap()
        .expect("the coder's task is journaled");
    let kept = journal.task_chain(row).unwrap().expect("with its chain");
    assert_eq!(kept.parent_task_id.as_deref(), Some(task.task_id()));
    assert_eq!(kept.hops, Some(1));
    assert_eq!(kept.chain.members, vec![planner.email.to_ascii_lowercase()]);
    assert!(kept.chain.id.is_some() && kept.chain.deadline.is_some());
    assert!(kept.chain.traceparent.is_some());
    // `task show` gives the parent its child and the child its parent, with one trace id.
    let parent_shown = dir.run(&["task", "show", task.task_id()]);
    let line = format!(
        "child       {child_id} to {}: completed",
        coder.email.to_ascii_lowercase()
    );
    assert!(parent_shown.contains(&line), "{parent_shown}");
    let child_shown = dir.run(&["task", "show", child_id]);
    let trace = kept.chain.traceparent.as_ref().unwrap().trace_id.clone();
    let line = format!(
        "parent      {} (hop 1, chain {}, trace {trace})",
        task.task_id(),
        kept.chain.id.as_deref().unwrap()
    );
    assert!(child_shown.contains(&line), "{child_shown}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delegation_past_the_hop_limit_or_back_into_its_chain_is_answered_rejected() {
    let Some(host) = mailhost() else { return };
    let (planner, coder, boss) = (host.user("planner"), host.user("coder"), host.user("boss"));
    let (dir, _) = planner_and_coder(
        host,
        &planner,
        &coder,
        &boss.email,
        ("echo", "max_hops = 5"),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 2);
    // The planner's task is four hops deep: its child would be the fifth.
    let deep = peer
        .send(chained(
            &peer,
            &planner.email,
            "deep",
            Some(4),
            Chain::default(),
        ))
        .await;
    // The planner's task came through the coder already: the child would loop back.
    let looped = peer
        .send(chained(
            &peer,
            &planner.email,
            "looped",
            Some(1),
            Chain {
                id: Some("loop-1".into()),
                members: vec![coder.email.clone()],
                ..Chain::default()
            },
        ))
        .await;
    for (msg, why) in [
        (
            &deep,
            "loop guard: this task was passed on between agents 5 times",
        ),
        (
            &looped,
            "loop guard: this delegation chain loop-1 already passed through agent",
        ),
    ] {
        let out = output_json(&peer.wait_for(msg.task_id(), Intent::TaskResult).await);
        let child = tool_answer(&out["answer"]);
        assert_eq!(child["state"], "rejected", "{child}");
        assert!(
            child["answer"].as_str().unwrap().starts_with(why),
            "{child}"
        );
    }
    bridge.wait_count("task.rejected", 2);
    assert!(bridge.stop().success());
}

/// Issue 46, D: the real Claude Code as the planner, its model telling it to call the bridge's
/// MCP tool `delegate`; the echo coder on the same bridge answers; the planner's answer
/// includes the coder's. Then the same with the coder refusing (hop limit): the planner hears
/// the refusal and its reason.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_claude_code_delegates_with_the_bridges_mcp_tool() {
    let Some(host) = mailhost() else { return };
    let (planner, coder, boss) = (host.user("planner"), host.user("coder"), host.user("boss"));
    let home = tempfile::tempdir().unwrap();
    let model = support::ModelApi::start();
    let text = support::Toml::new()
        .host_mailbox(host, "planner", &planner, "")
        .host_mailbox(host, "coder", &coder, "")
        .agent(
            "planner",
            "claude",
            &[&boss.email],
            &format!("delegate_to = [{:?}]", coder.email),
        )
        .agent("coder", "echo", &[&planner.email], "max_hops = 3")
        .text();
    let dir = ConfigDir::new(host, &text);
    let path = format!(
        "{}:{}",
        support::test_agents()
            .join("npm/node_modules/.bin")
            .display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let home_text = home.path().display().to_string();
    let env = [
        ("ANTHROPIC_BASE_URL", model.url.as_str()),
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("HOME", home_text.as_str()),
        ("PATH", path.as_str()),
    ];
    let mut peer = Peer::new(boss.clone()).await;
    let bridge = Bridge::start_with_env(&dir, 2, &env);

    let ask = format!("delegate: {}: tests for the parser", coder.email);
    let task = peer
        .send(peer.dispatch_to(&planner.email, "Plan", &ask))
        .await;
    let result = peer
        .wait_for_within(
            task.task_id(),
            Intent::TaskResult,
            std::time::Duration::from_secs(240),
        )
        .await;
    let (status, error, output) = answer(&result);
    assert_eq!(status, Status::Completed, "{error}");
    assert!(output.contains("The delegate said:"), "{output}");
    assert!(output.contains("completed"), "{output}");
    assert!(
        output.contains("tests for the parser"),
        "the coder's answer is in the planner's: {output}"
    );

    // Two hops deep already: the coder's limit (3) refuses the third, and the planner hears why.
    let mut deep = chained(&peer, &planner.email, "Deep", Some(2), Chain::default());
    if let Body::Dispatch(d) = &mut deep.body {
        d.body_text = ask.clone();
    }
    let deep = peer.send(deep).await;
    let result = peer
        .wait_for_within(
            deep.task_id(),
            Intent::TaskResult,
            std::time::Duration::from_secs(240),
        )
        .await;
    let (status, error, output) = answer(&result);
    assert_eq!(status, Status::Completed, "{error}");
    assert!(output.contains("rejected"), "{output}");
    assert!(
        output.contains("loop guard: this task was passed on between agents 3 times"),
        "{output}"
    );
    assert!(bridge.stop().success());
}

/// Issue 46, item 4: a kill -9 of the bridge while the planner waits for its child loses
/// neither: the planner's task runs again at the next start and, asking the same, finds its
/// child (no second dispatch); the coder's task runs again too, and its one answer reaches the
/// planner, whose one answer reaches the boss.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_while_the_planner_waits_loses_neither_answer() {
    let Some(host) = mailhost() else { return };
    let (planner, coder, boss) = (host.user("planner"), host.user("coder"), host.user("boss"));
    let (dir, _) = planner_and_coder(host, &planner, &coder, &boss.email, ("slow.toml", ""));
    let release = dir.dir.path().join("release");
    dir.write(
        "slow.toml",
        &format!(
            "command = \"python3\"\nargs = [\"-c\", {:?}, {:?}]\nstdin = \"{{{{prompt}}}}\"\ntimeout_secs = 200\n",
            "import os, sys, time\ntext = sys.stdin.read()\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.1)\nprint('coder done: ' + ('parser' if 'parser' in text else '?'))\n",
            release.to_str().unwrap()
        ),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 2);
    let task = peer
        .send(peer.dispatch_to(&planner.email, "Plan", "write the plan"))
        .await;
    // The coder's task runs (so the planner is waiting in delegate): the bridge is killed.
    bridge.wait_event("task.started", |e| e["agent"] == "coder");
    bridge.kill();
    let bridge = Bridge::start(&dir, 2);
    std::fs::write(&release, "go").unwrap();
    let out = output_json(&peer.wait_for(task.task_id(), Intent::TaskResult).await);
    let child = tool_answer(&out["answer"]);
    assert_eq!(child["state"], "completed", "{child}");
    assert!(
        child["answer"]
            .as_str()
            .unwrap()
            .contains("coder done: parser"),
        "{child}"
    );
    peer.settle(&coder).await;
    let results = peer
        .intents_for(task.task_id())
        .into_iter()
        .filter(|i| *i == Intent::TaskResult)
        .count();
    assert_eq!(results, 1, "the boss hears one answer");
    assert!(bridge.stop().success());
    let journal =
        aamp_bridge::dispatch::Journal::open(&dir.dir.path().join("state/journal.sqlite3"))
            .unwrap();
    let (row, _) = journal
        .admitted_task("planner", &boss.email, task.task_id())
        .unwrap()
        .unwrap();
    let children = journal.delegations_of(row).unwrap();
    assert_eq!(
        children.len(),
        1,
        "one child, not one per run: {children:?}"
    );
    assert_eq!(children[0].state, "completed");
}

/// Issue 46, item 4: a cancel of the parent reaches its children within seconds: the planner's
/// task is cancelled while it waits, and the coder's task (the child) is sent `task.cancel` by
/// the planner's mailbox and stops.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_of_the_parent_cancels_its_child() {
    let Some(host) = mailhost() else { return };
    let (planner, coder, boss) = (host.user("planner"), host.user("coder"), host.user("boss"));
    let (dir, _) = planner_and_coder(host, &planner, &coder, &boss.email, ("slow.toml", ""));
    let never = dir.dir.path().join("never");
    dir.write(
        "slow.toml",
        &format!(
            "command = \"python3\"\nargs = [\"-c\", {:?}, {:?}]\nstdin = \"{{{{prompt}}}}\"\ntimeout_secs = 200\n",
            "import os, sys, time\nsys.stdin.read()\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.1)\n",
            never.to_str().unwrap()
        ),
    );
    let peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 2);
    let task = peer
        .send(peer.dispatch_to(&planner.email, "Plan", "write the plan"))
        .await;
    bridge.wait_event("task.started", |e| e["agent"] == "coder");
    let asked = std::time::Instant::now();
    peer.send(peer.cancel_of(&task, &planner.email)).await;
    // The coder answers the planner's cancel (rejected, cancelled); the planner, whose
    // delegation is cancelled already, takes no answer from it.
    bridge.wait_event("message.ignored", |e| {
        e["intent"] == "task.result" && e["from"] == coder.email.as_str()
    });
    let took = asked.elapsed();
    assert!(
        took < std::time::Duration::from_secs(5),
        "the cancel took {took:?}"
    );
    assert!(bridge.stop().success());
    let journal =
        aamp_bridge::dispatch::Journal::open(&dir.dir.path().join("state/journal.sqlite3"))
            .unwrap();
    let (row, _) = journal
        .admitted_task("planner", &boss.email, task.task_id())
        .unwrap()
        .unwrap();
    let children = journal.delegations_of(row).unwrap();
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].state, "cancelled");
    let (_, state) = journal
        .admitted_task("coder", &planner.email, &children[0].task_id)
        .unwrap()
        .unwrap();
    assert_eq!(state, aamp_bridge::dispatch::TaskState::Cancelled);
}
