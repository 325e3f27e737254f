//! Issue 22: several bridges (replicas) serving one agent address, coordinated by the mail
//! server itself: each dispatch is claimed on the server (JMAP `ifInState`) before it is
//! acknowledged, run by the one replica that won, and taken over when its replica dies.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aamp_bridge::protocol::Intent;
use support::{mailhost, Bridge, ConfigDir, MailHost, Peer};

/// A CLI agent that takes `seconds` over every task.
fn sleeper(seconds: f64) -> String {
    format!(
        "name = \"sleeper\"\ncommand = \"python3\"\nargs = [\"-c\", \"import sys, time; sys.stdin.read(); time.sleep({seconds}); print('done')\"]\nstdin = \"{{{{prompt}}}}\"\ntimeout_secs = 120\n"
    )
}

/// A config folder for replica `name` of the agent's mailbox.
fn replica(
    host: &MailHost,
    agent: &aamp_bridge::config::Account,
    boss: &str,
    name: &str,
    seconds: f64,
) -> ConfigDir {
    replica_with(host, agent, boss, name, &sleeper(seconds))
}

/// [`replica`] with the profile `profile`.
fn replica_with(
    host: &MailHost,
    agent: &aamp_bridge::config::Account,
    boss: &str,
    name: &str,
    profile: &str,
) -> ConfigDir {
    let dir = ConfigDir::new(
        host,
        &support::Toml::new()
            .host_mailbox(
                host,
                "agent",
                agent,
                &format!("replica = \"{name}\"\nlease_secs = 10\n"),
            )
            .agent("agent", "sleeper.toml", &[boss], "max_concurrent_tasks = 2")
            .text(),
    );
    dir.write("sleeper.toml", profile);
    dir
}

/// The tasks each bridge completed.
fn completed(bridges: &mut [Bridge]) -> Vec<HashSet<String>> {
    bridges
        .iter_mut()
        .map(|b| {
            b.take_events();
            b.seen
                .iter()
                .filter(|e| e["event"] == "task.completed" && e["status"] == "completed")
                .map(|e| e["taskId"].as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

/// Waits until one of `bridges` has started a task (`task_id`, or any when `None`): its index.
async fn runner_of(bridges: &mut [Bridge], task_id: Option<&str>) -> usize {
    loop {
        let started = bridges.iter_mut().position(|b| {
            b.take_events();
            b.seen
                .iter()
                .any(|e| e["event"] == "task.started" && task_id.is_none_or(|t| e["taskId"] == t))
        });
        if let Some(i) = started {
            return i;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_run_a_burst_once_each_and_share_it() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let dirs: Vec<ConfigDir> = ["r1", "r2", "r3"]
        .iter()
        .map(|name| replica(host, &agent, &boss.email, name, 0.2))
        .collect();
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    let mut tasks = Vec::new();
    for n in 0..300 {
        let sent = peer
            .send(peer.dispatch_to(&agent.email, &format!("Task {n}"), "sleep a little"))
            .await;
        tasks.push(sent.task_id().to_string());
    }
    for task in &tasks {
        peer.wait_for_within(task, Intent::TaskResult, Duration::from_secs(300))
            .await;
    }
    peer.settle(&via).await;
    for task in &tasks {
        let intents = peer.intents_for(task);
        let count = |i: Intent| intents.iter().filter(|x| **x == i).count();
        assert_eq!(count(Intent::TaskAck), 1, "{task}: {intents:?}");
        assert_eq!(count(Intent::TaskResult), 1, "{task}: {intents:?}");
    }
    let ran = completed(&mut bridges);
    let mut owners: HashMap<&String, usize> = HashMap::new();
    for (i, set) in ran.iter().enumerate() {
        for task in set {
            assert!(
                owners.insert(task, i).is_none(),
                "{task} ran on two replicas"
            );
        }
    }
    assert_eq!(owners.len(), tasks.len());
    for (i, set) in ran.iter().enumerate() {
        assert!(
            set.len() >= tasks.len() / 5,
            "replica r{} ran {} of {}: {:?}",
            i + 1,
            set.len(),
            tasks.len(),
            ran.iter().map(HashSet::len).collect::<Vec<_>>()
        );
    }
    for b in bridges {
        assert!(b.stop().success());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_mid_task_loses_its_tasks_to_the_others_after_the_lease() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let dirs: Vec<ConfigDir> = ["r1", "r2", "r3"]
        .iter()
        .map(|name| replica(host, &agent, &boss.email, name, 3.0))
        .collect();
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    let mut tasks = Vec::new();
    for n in 0..6 {
        let sent = peer
            .send(peer.dispatch_to(&agent.email, &format!("Task {n}"), "sleep"))
            .await;
        tasks.push(sent.task_id().to_string());
    }
    // The first replica seen starting one: killed (no stop, no answer, no lease release).
    let victim = runner_of(&mut bridges, None).await;
    bridges.remove(victim).kill();
    for task in &tasks {
        peer.wait_for_within(task, Intent::TaskResult, Duration::from_secs(90))
            .await;
    }
    peer.settle(&via).await;
    for task in &tasks {
        let results = peer
            .intents_for(task)
            .into_iter()
            .filter(|i| *i == Intent::TaskResult)
            .count();
        assert_eq!(results, 1, "{task}");
    }
    let ran = completed(&mut bridges);
    assert_eq!(
        ran.iter().map(HashSet::len).sum::<usize>(),
        tasks.len(),
        "every task completed once on the survivors: {ran:?}"
    );
    for b in bridges {
        assert!(b.stop().success());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_stops_the_task_on_the_replica_that_runs_it() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let dirs: Vec<ConfigDir> = ["r1", "r2", "r3"]
        .iter()
        .map(|name| replica(host, &agent, &boss.email, name, 60.0))
        .collect();
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    let dispatch = peer.dispatch_to(&agent.email, "Long", "sleep long");
    let sent = peer.send(dispatch).await;
    let task = sent.task_id().to_string();
    peer.wait_for(&task, Intent::TaskAck).await;
    let runner = runner_of(&mut bridges, Some(&task)).await;
    // `status` shows which replica holds it, read from the server, on any replica.
    let other = (runner + 1) % 3;
    let status: serde_json::Value =
        serde_json::from_str(&dirs[other].run(&["status", "--json"])).unwrap();
    let names = ["r1", "r2", "r3"];
    assert_eq!(status["agents"][0]["replica"], names[other], "{status}");
    assert_eq!(
        status["agents"][0]["replicas"][names[runner]]["held"], 1,
        "{status}"
    );
    peer.send(peer.cancel_of(&sent, &agent.email)).await;
    let done = bridges[runner].wait_event("task.completed", |e| e["taskId"] == task.as_str());
    assert_eq!(done["status"], "rejected", "{done}");
    let result = peer.wait_for(&task, Intent::TaskResult).await;
    assert!(format!("{:?}", result.message.body).contains("cancelled"));
    peer.settle(&via).await;
    let intents = peer.intents_for(&task);
    assert_eq!(
        intents.iter().filter(|i| **i == Intent::TaskResult).count(),
        1,
        "{intents:?}"
    );
    for b in bridges {
        assert!(b.stop().success());
    }
}

/// A dispatch every replica refuses (a stranger; a task passed on too often) is answered by
/// one of them: the one that wins its claim, as for a task that runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_the_replicas_refuse_is_answered_once() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let stranger = host.user("stranger");
    let dirs: Vec<ConfigDir> = ["r1", "r2", "r3"]
        .iter()
        .map(|name| replica(host, &agent, &boss.email, name, 0.1))
        .collect();
    let bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut boss = Peer::new(boss).await;
    let mut stranger = Peer::new(stranger).await;
    let mut looped = boss.dispatch_to(&agent.email, "Passed on", "again");
    if let aamp_bridge::protocol::Body::Dispatch(d) = &mut looped.body {
        d.hop_count = Some(99);
    }
    let looped = boss.send(looped).await;
    let refused = stranger
        .send(stranger.dispatch_to(&agent.email, "Let me in", "please"))
        .await;
    for (peer, task, why) in [
        (&mut boss, looped.task_id(), "loop guard"),
        (&mut stranger, refused.task_id(), "Unauthorized sender"),
    ] {
        let result = peer.wait_for(task, Intent::TaskResult).await;
        assert!(
            format!("{:?}", result.message.body).contains(why),
            "{:?}",
            result.message.body
        );
        peer.settle(&via).await;
        assert_eq!(peer.intents_for(task), vec![Intent::TaskResult], "{task}");
    }
    for b in bridges {
        assert!(b.stop().success());
    }
}

/// A task taken over from a replica that died is not run again when the agent's tasks must
/// not run twice (`rerun_interrupted = false`): it is answered "interrupted", once.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_must_not_run_twice_is_answered_interrupted_after_a_takeover() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let once = format!("{}rerun_interrupted = false\n", sleeper(30.0));
    let dirs: Vec<ConfigDir> = ["r1", "r2"]
        .iter()
        .map(|name| replica_with(host, &agent, &boss.email, name, &once))
        .collect();
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    let sent = peer
        .send(peer.dispatch_to(&agent.email, "Once", "only once"))
        .await;
    let task = sent.task_id().to_string();
    let runner = runner_of(&mut bridges, Some(&task)).await;
    bridges.remove(runner).kill();
    let result = peer
        .wait_for_within(&task, Intent::TaskResult, Duration::from_secs(60))
        .await;
    let text = format!("{:?}", result.message.body);
    assert!(
        text.contains("interrupted") && text.contains("not run twice"),
        "{text}"
    );
    let survivor = &mut bridges[0];
    survivor.take_events();
    assert!(
        !survivor
            .seen
            .iter()
            .any(|e| e["event"] == "task.started" && e["taskId"] == task.as_str()),
        "the survivor did not run it"
    );
    peer.settle(&via).await;
    assert_eq!(
        peer.intents_for(&task)
            .iter()
            .filter(|i| **i == Intent::TaskResult)
            .count(),
        1
    );
    for b in bridges {
        assert!(b.stop().success());
    }
}
