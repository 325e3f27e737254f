//! Issue 45 item 3: budgets in tokens and money over the real mail host, with a CLI agent in
//! Claude's stream-json format whose `result` event reports known usage. A budget used up
//! refuses the task after the one that spent it and says when it resets; a soft budget lets
//! the task that crosses it finish; a hard one stops it, with which budget, what was spent
//! and the reset; a report without a stated cost is priced from the config's `[prices]`.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aamp_bridge::protocol::{time::format_utc, Body, Intent, Status, TaskResult};
use support::{mailhost, Bridge, ConfigDir, Peer, Toml};

/// Claude Code's last stream-json line for a run that used `input` and `output` tokens of
/// `model`, with its stated cost when `usd` is given.
fn result_line(input: u64, output: u64, model: &str, usd: Option<f64>) -> String {
    let mut line = serde_json::json!({
        "type": "result", "subtype": "success", "is_error": false, "result": "Done.",
        "session_id": "budget-session", "num_turns": 1,
        "usage": {"input_tokens": input, "output_tokens": output,
                  "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
        "modelUsage": {model: {"inputTokens": input, "outputTokens": output}},
    });
    if let Some(usd) = usd {
        line["total_cost_usd"] = usd.into();
    }
    format!("{line}\n")
}

/// The agent: prints its stream (the file it is given) once the gate file exists (at once
/// without one), then stays the seconds it is given before it exits.
const AGENT: &str = "import os, sys, time\nsys.stdin.read()\nwhile sys.argv[2] and not os.path.exists(sys.argv[2]):\n    time.sleep(0.02)\nsys.stdout.write(open(sys.argv[1]).read())\nsys.stdout.flush()\ntime.sleep(float(sys.argv[3]))\n";

/// A config folder whose agent `agent` (on the host's mailbox of that name, taking tasks from
/// `boss`, one at a time) prints `line` (once the folder's `gate` file exists, when `gated`)
/// and then stays `stays` seconds before it exits; the bridge waits for it (a long
/// `linger_secs`), as for an agent still at work after its report.
fn setup(
    (host, agent, boss): (&support::MailHost, &aamp_bridge::config::Account, &str),
    (top, budget): (&str, &str),
    line: &str,
    (stays, gated): (u64, bool),
) -> ConfigDir {
    let config = Toml::new()
        .top(top)
        .host_mailbox(host, "agent", agent, "")
        .agent("agent", "claude-like.toml", &[boss], budget);
    let dir = ConfigDir::new(host, &config.text());
    dir.write("result.jsonl", line);
    dir.write("agent.py", AGENT);
    let path = |name: &str| dir.dir.path().join(name).display().to_string();
    let gate = if gated { path("gate") } else { String::new() };
    dir.write(
        "claude-like.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}, {:?}, {gate:?}, \"{stays}\"]\nstdin = \"{{{{prompt}}}}\"\nstream = \"claude\"\nlinger_secs = 300\n",
            path("agent.py"),
            path("result.jsonl"),
        ),
    );
    dir
}

/// The next midnight (UTC) after `at`, as the refusals write it.
fn midnight_after(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).unwrap().as_secs();
    format_utc(UNIX_EPOCH + Duration::from_secs(secs - secs % 86_400 + 86_400))
}

/// Sends a task and reads its result (within `wait`).
async fn run_task(peer: &mut Peer, to: &str, title: &str, wait: Duration) -> TaskResult {
    let task = peer.send(peer.dispatch_to(to, title, "work")).await;
    let result = peer
        .wait_for_within(task.task_id(), Intent::TaskResult, wait)
        .await;
    let Body::Result(r) = result.message.body else {
        panic!("not a result")
    };
    r
}

/// Asserts `error` names the day's reset, which may have moved on while the test ran.
fn says_it_resets_at_midnight(error: &str, before: SystemTime) {
    let resets = [midnight_after(before), midnight_after(SystemTime::now())];
    assert!(
        resets
            .iter()
            .any(|r| error.contains(&format!("it resets at {r} (in "))),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_soft_budget_lets_the_task_finish_and_refuses_the_next_saying_when_it_resets() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let budget = "[agents.sender_budget]\ntokens_per_day = 1000\n";
    // 1,100 tokens at $0.0525 (stated): over the day's 1,000, then a second to exit.
    let line = result_line(600, 500, "claude-test", Some(0.0525));
    let dir = setup((host, &agent, &boss.email), ("", budget), &line, (1, false));
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;
    let before = SystemTime::now();

    let first = run_task(&mut peer, &agent.email, "First", support::WAIT).await;
    assert_eq!(first.status, Status::Completed, "{first:?}");
    let usage = bridge.wait_event("task.stream", |e| e["type"] == "usage");
    assert_eq!(usage["payload"]["usage"]["costMicros"], 52_500, "{usage}");

    let second = run_task(&mut peer, &agent.email, "Second", support::WAIT).await;
    assert_eq!(second.status, Status::Rejected, "{second:?}");
    let error = second.error.unwrap_or_default();
    let whose = format!(
        "over budget: sender {}'s budget on agent agent of 1,000 tokens a day (UTC) is used up: 1,100 tokens spent today; it resets at ",
        boss.email
    );
    assert!(error.starts_with(&whose), "{error}");
    says_it_resets_at_midnight(&error, before);
    assert!(error.ends_with("; dispatch again after that"), "{error}");
    // Refused before it started: the agent never ran for it.
    bridge.wait_event("task.rejected", |e| e["reason"] == error.as_str());
    let started = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "task.started")
        .count();
    assert_eq!(started, 1);
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hard_budget_stops_a_running_task_with_its_reason_from_the_price_table() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let prices = "[prices.\"test-model\"]\ninput_per_million = 3\noutput_per_million = 15\n";
    let budget = "[agents.budget]\nusd_per_day = 0.01\nhard = true\n";
    // No stated cost: 10,000 input tokens at $3 a million are $0.03, over the day's $0.01;
    // then the agent stays at work for two minutes, unless it is stopped.
    let line = result_line(10_000, 0, "test-model", None);
    let dir = setup(
        (host, &agent, &boss.email),
        (prices, budget),
        &line,
        (120, false),
    );
    let bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;
    let before = SystemTime::now();

    let wait = Duration::from_secs(60);
    let stopped = run_task(&mut peer, &agent.email, "Costly", wait).await;
    assert_eq!(stopped.status, Status::Rejected, "{stopped:?}");
    let error = stopped.error.unwrap_or_default();
    assert!(
        error.starts_with("stopped over budget: agent agent's hard budget of $0.01 a day (UTC) was crossed while the task ran: $0.03 spent today; it resets at "),
        "{error}"
    );
    says_it_resets_at_midnight(&error, before);
    assert!(before.elapsed().unwrap() < wait, "not stopped while it ran");

    let next = run_task(&mut peer, &agent.email, "Next", support::WAIT).await;
    assert_eq!(next.status, Status::Rejected, "{next:?}");
    let error = next.error.unwrap_or_default();
    assert!(
        error.starts_with("over budget: agent agent's hard budget of $0.01 a day (UTC) is used up: $0.03 spent today;"),
        "{error}"
    );
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queued_task_is_refused_when_its_slot_comes_if_the_budget_was_spent_meanwhile() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let budget = "[agents.budget]\ntokens_per_month = 100\n";
    let line = result_line(100, 1, "claude-test", None);
    let dir = setup((host, &agent, &boss.email), ("", budget), &line, (0, true));
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;

    // The first runs and has spent nothing yet when the second is let in behind it.
    let first = peer
        .send(peer.dispatch_to(&agent.email, "First", "work"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == first.task_id());
    let second = peer
        .send(peer.dispatch_to(&agent.email, "Second", "work"))
        .await;
    bridge.wait_event("task.acked", |e| e["taskId"] == second.task_id());
    dir.write("gate", "");

    let result = |inbound: aamp_bridge::mailbox::Inbound| match inbound.message.body {
        Body::Result(r) => r,
        _ => panic!("not a result"),
    };
    let done = result(peer.wait_for(first.task_id(), Intent::TaskResult).await);
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let refused = result(peer.wait_for(second.task_id(), Intent::TaskResult).await);
    assert_eq!(refused.status, Status::Rejected, "{refused:?}");
    let error = refused.error.unwrap_or_default();
    assert!(
        error.starts_with("over budget: agent agent's budget of 100 tokens a month (UTC) is used up: 101 tokens spent this month; it resets at "),
        "{error}"
    );
    // Its one answer: no second result, and the agent never started for it.
    peer.settle(&host.user("marker")).await;
    assert_eq!(
        peer.intents_for(second.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
    let started: Vec<_> = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "task.started")
        .collect();
    assert_eq!(started.len(), 1, "{started:?}");
    assert!(bridge.stop().success());
    // The agent stated no cost and its model has no price: `doctor` names it.
    let doctor: serde_json::Value = serde_json::from_str(&dir.run(&["doctor", "--json"])).unwrap();
    let prices = doctor
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["check"] == "prices"))
        .unwrap_or_else(|| panic!("no prices check: {doctor}"));
    assert!(
        prices["detail"]
            .as_str()
            .unwrap()
            .contains("\"claude-test\""),
        "{prices}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn what_was_spent_survives_a_kill_mid_task_and_refuses_the_task_when_it_is_picked_up() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let budget = "[agents.budget]\ntokens_per_day = 1000\n";
    let line = result_line(600, 500, "claude-test", Some(0.01));
    let dir = setup(
        (host, &agent, &boss.email),
        ("", budget),
        &line,
        (120, false),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;

    // The agent reported 1,100 tokens and is still at work when the bridge is killed.
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Long", "work"))
        .await;
    bridge.wait_event("task.stream", |e| {
        e["taskId"] == task.task_id() && e["type"] == "usage"
    });
    bridge.kill();

    // At the next start the task is picked up again, and its budget is spent: refused.
    let bridge = Bridge::start(&dir, 1);
    let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Rejected, "{r:?}");
    let error = r.error.unwrap_or_default();
    assert!(
        error.starts_with("over budget: agent agent's budget of 1,000 tokens a day (UTC) is used up: 1,100 tokens spent today;"),
        "{error}"
    );
    peer.settle(&host.user("marker")).await;
    let results = peer
        .intents_for(task.task_id())
        .into_iter()
        .filter(|i| *i == Intent::TaskResult)
        .count();
    assert_eq!(results, 1, "one answer");
    assert!(bridge.stop().success());
}
