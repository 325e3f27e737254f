//! The person's side: what happened to a task, and what the bridge is doing, read from the
//! state directory of a real bridge over the real mail host, running and stopped.

mod support;

use aamp_bridge::protocol::Intent;
use support::{mailhost, Bridge, ConfigDir, Peer};

fn cli(dir: &ConfigDir, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(support::bin())
        .args(["--config", dir.config().to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_task_show_and_status_tell_what_happened() {
    let host = mailhost();
    let (agent, failing, boss) = (host.user("agent"), host.user("failing"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    dir.write("fails.toml", "command = \"sh\"\nargs = [\"-c\", \"echo starting >&2; echo 'disk on fire' >&2; exit 3\"]\n");
    dir.write(
        "config.toml",
        &format!(
            "state_dir = \"state\"\n{}{}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\n\n[[agents]]\nname = \"failing\"\nmailbox = \"failing\"\nprofile = \"fails.toml\"\nallow_from = [\"{}\"]\n",
            host.mailbox_toml("agent", &agent),
            host.mailbox_toml("failing", &failing),
            boss.email,
            boss.email
        ),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let bridge = Bridge::start(&dir, 2);
    let ok = peer
        .send(peer.dispatch_to(&agent.email, "Fine", "hello"))
        .await;
    let bad = peer
        .send(peer.dispatch_to(&failing.email, "Broken", "hello"))
        .await;
    peer.wait_for(ok.task_id(), Intent::TaskResult).await;
    peer.wait_for(bad.task_id(), Intent::TaskResult).await;

    let status = cli(&dir, &["status", "--json"]);
    assert_eq!(status["running"], true);
    assert_eq!(status["pid"], bridge.pid().to_string());
    assert!(bridge.stop().success());

    let status = cli(&dir, &["status", "--json"]);
    assert_eq!(status["running"], false, "{status}");
    let first = &status["agents"][0];
    assert_eq!(first["agent"], "agent");
    assert_eq!(first["mailbox"], agent.email.as_str());
    assert_eq!(first["unsent"], 0);
    assert!(first["link"]["mailbox"].is_string(), "{status}");

    let tasks = cli(&dir, &["tasks", "--json"]);
    let states: Vec<(&str, &str)> = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["taskId"].as_str().unwrap(), t["state"].as_str().unwrap()))
        .collect();
    assert!(states.contains(&(ok.task_id(), "answered")), "{states:?}");
    assert!(states.contains(&(bad.task_id(), "rejected")), "{states:?}");

    let shown = cli(&dir, &["task", "show", ok.task_id(), "--json"]);
    let steps: Vec<&str> = shown[0]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["what"].as_str().unwrap())
        .collect();
    for step in [
        "received from",
        "queued task.ack",
        "sent task.ack",
        "run 1 started",
        "agent started",
        "finished: answered",
        "sent task.result",
    ] {
        assert!(
            steps.iter().any(|s| s.starts_with(step)),
            "{step}: {steps:?}"
        );
    }
    assert_eq!(
        shown[0]["task"]["messageId"],
        ok.envelope.message_id.as_str()
    );
    let times: Vec<i64> = shown[0]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["atMs"].as_i64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "in time order");

    let failed = cli(&dir, &["task", "show", bad.task_id(), "--json"]);
    let stderr = failed[0]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["what"] == "agent stderr (last lines)")
        .expect("the failed agent's stderr is in its timeline");
    assert!(
        stderr["detail"].as_str().unwrap().contains("disk on fire"),
        "{stderr}"
    );

    // Plain text for people, too.
    let out = std::process::Command::new(support::bin())
        .args([
            "--config",
            dir.config().to_str().unwrap(),
            "task",
            "show",
            bad.task_id(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("finished: rejected") && text.contains("disk on fire"),
        "{text}"
    );
}

#[test]
fn the_version_names_the_commit_and_completions_are_printed() {
    let out = std::process::Command::new(support::bin())
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("aamp-bridge 0.") && text.contains("(commit "),
        "{text}"
    );
    let out = std::process::Command::new(support::bin())
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("aamp-bridge"));
}
