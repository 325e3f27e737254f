//! Replicas: several bridges serving one agent address on the mail host, coordinated by
//! claims on the server, for the replica tests.

use super::*;

/// A CLI agent that takes `seconds` over every task.
pub fn sleeper(seconds: f64) -> String {
    format!(
        "name = \"sleeper\"\ncommand = \"python3\"\nargs = [\"-c\", \"import sys, time; sys.stdin.read(); time.sleep({seconds}); print('done')\"]\nstdin = \"{{{{prompt}}}}\"\ntimeout_secs = 120\n"
    )
}

/// A config folder for replica `name` of `agent`'s mailbox (lease 10 s), its agent running
/// `profile` (a [`sleeper`], say) with more agent keys `agent_keys`, answering `boss`.
pub fn replica(
    host: &MailHost,
    agent: &Account,
    boss: &str,
    name: &str,
    profile: &str,
    agent_keys: &str,
) -> ConfigDir {
    let dir = ConfigDir::new(
        host,
        &Toml::new()
            .host_mailbox(
                host,
                "agent",
                agent,
                &format!("replica = \"{name}\"\nlease_secs = 10\n"),
            )
            .agent("agent", "sleeper.toml", &[boss], agent_keys)
            .text(),
    );
    dir.write("sleeper.toml", profile);
    dir
}

/// Config folders for the replicas `names` of `agent`'s mailbox, each running a [`sleeper`]
/// of `seconds`, `slots` tasks at a time.
pub fn replicas(
    host: &MailHost,
    agent: &Account,
    boss: &str,
    names: &[&str],
    seconds: f64,
    slots: usize,
) -> Vec<ConfigDir> {
    let keys = format!("max_concurrent_tasks = {slots}");
    names
        .iter()
        .map(|name| replica(host, agent, boss, name, &sleeper(seconds), &keys))
        .collect()
}

/// Sends `n` dispatches titled `Task 0`... to `to`: their task ids, in order.
pub async fn send_burst(peer: &Peer, to: &str, n: usize, body: &str) -> Vec<String> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let sent = peer
            .send(peer.dispatch_to(to, &format!("Task {i}"), body))
            .await;
        tasks.push(sent.task_id().to_string());
    }
    tasks
}

/// Waits for every task's result, each within `within`.
pub async fn wait_results(peer: &mut Peer, tasks: &[String], within: Duration) {
    for task in tasks {
        peer.wait_for_within(task, Intent::TaskResult, within).await;
    }
}

/// [`wait_results`], and when a result does not come, a failure that says what each replica
/// did with the tasks left unanswered: its log lines that name them and its journal's
/// `task show` for each (`replicas` are each replica's config folder and bridge).
pub async fn wait_results_explained(
    peer: &mut Peer,
    tasks: &[String],
    within: Duration,
    replicas: &[(&ConfigDir, &Bridge)],
) {
    let deadline = Instant::now() + within;
    loop {
        let _ = peer.poll().await;
        let missing: Vec<&String> = tasks
            .iter()
            .filter(|t| !peer.intents_for(t).contains(&Intent::TaskResult))
            .collect();
        if missing.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "{} of {} tasks got no task.result within {within:?}:\n{}",
                missing.len(),
                tasks.len(),
                explain(peer, &missing, replicas)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the peer got for each of `missing`, and what each replica's log and journal say of it.
fn explain(peer: &Peer, missing: &[&String], replicas: &[(&ConfigDir, &Bridge)]) -> String {
    let mut out = String::new();
    for task in missing {
        out.push_str(&format!(
            "== {task}: the peer got {:?}\n",
            peer.intents_for(task)
        ));
        for (i, (dir, bridge)) in replicas.iter().enumerate() {
            out.push_str(&format!("-- replica {i}'s log lines naming it:\n"));
            for line in bridge.log().lines().filter(|l| l.contains(task.as_str())) {
                out.push_str(line);
                out.push('\n');
            }
            out.push_str(&format!("-- replica {i}'s journal:\n"));
            out.push_str(&dir.run(&["task", "show", task]));
        }
    }
    out
}

/// Asserts each task was acknowledged once and answered once; `context` is said on failure.
/// An ack counts once per Message-ID: a replica that takes a task over acknowledges it again
/// with the first ack's Message-ID (derived from the dispatch), so it is the same mail again,
/// which a dispatcher drops as it drops any mail seen twice. A result counts once per mail.
pub fn assert_answered_once(peer: &Peer, tasks: &[String], context: &str) {
    for task in tasks {
        let intents = peer.intents_for(task);
        let count = |i: Intent| intents.iter().filter(|x| **x == i).count();
        let acks: std::collections::HashSet<&str> = peer
            .inbox
            .iter()
            .filter(|m| m.message.task_id() == task && m.message.intent() == Intent::TaskAck)
            .map(|m| m.message.envelope.message_id.as_str())
            .collect();
        assert_eq!(acks.len(), 1, "{task}: {intents:?}, acks {acks:?}{context}");
        assert_eq!(count(Intent::TaskResult), 1, "{task}: {intents:?}{context}");
    }
}
