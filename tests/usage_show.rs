//! Issue 45, item 2: a task's usage shown where people look, over the real loopback mail host
//! and a real `aamp-bridge start`: the result mail's `X-AAMP-Usage` header and its body, what
//! the dispatcher's parser reads, `task show --json`, `tasks --json`, `status --json`, the
//! `task.completed` event, and `usage --json` / `--csv`, all giving the same totals; a task
//! whose agent reported nothing carries no usage anywhere (not zeros), and a failed task's
//! `rejected` result says what it spent before it failed.
//!
//! The usage is journaled while the agent runs through the journal's own API
//! (`Journal::record_usage`, what `dispatch/run.rs` calls for each `StreamEvent::Usage` a runner
//! sends), as a second process writes to the bridge's journal: this test is about showing,
//! and holds whatever runner reports the tokens.

mod support;

use std::time::SystemTime;

use aamp_bridge::dispatch::Journal;
use aamp_bridge::protocol::{usage_wire, Body, Intent, Status, Usage};
use serde_json::Value;
use support::{header, mailhost, Bridge, ConfigDir, Peer};

fn report(input: u64, output: u64, cache_read: u64, cost: Option<u64>, model: &str) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_read_tokens: cache_read,
        cache_write_tokens: 3,
        cost_micros: cost,
        cost_partial: false,
        model: Some(model.to_string()),
    }
}

fn json_of(dir: &ConfigDir, args: &[&str]) -> Value {
    let out = dir.run(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tasks_usage_is_the_same_in_its_result_task_show_status_events_and_the_report() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &support::one_agent(host, &agent, "waiting.toml", &boss.email).text(),
    );
    let go_on = dir.dir.path().join("go-on");
    let fail = dir.dir.path().join("fail");
    let script = format!(
        "printf 'working\\n'; while [ ! -e '{}' ]; do sleep 0.05; done; if [ -e '{}' ]; then echo 'out of luck' >&2; exit 3; fi; printf 'all done\\n'",
        go_on.display(),
        fail.display()
    );
    dir.write(
        "waiting.toml",
        &format!("command = \"sh\"\nargs = [\"-c\", {script:?}]\ntimeout_secs = 120\n"),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;

    // Task A: three reports while it runs (one of them twice), two models, one without a cost.
    let a = peer
        .send(peer.dispatch_to(&agent.email, "Costly", "spend"))
        .await;
    let a_id = a.task_id().to_string();
    bridge.wait_event("task.started", |e| e["taskId"] == a_id.as_str());
    let loaded = aamp_bridge::config::LoadedConfig::load(&dir.config()).unwrap();
    let journal = Journal::open(&loaded.state().journal()).unwrap();
    let row = journal.find_tasks(&a_id).unwrap()[0].id;
    let reports = [
        ("msg_1", report(1200, 340, 5000, Some(12_345), "model-a")),
        ("msg_2", report(800, 60, 0, Some(4_000), "model-a")),
        ("msg_3", report(10, 5, 0, None, "model-b")),
    ];
    let now = SystemTime::now();
    let mut expected = Usage::default();
    for (i, (key, usage)) in reports.iter().enumerate() {
        assert!(journal.record_usage(row, 1, key, usage, now).unwrap());
        if i == 0 {
            // A report seen twice counts once.
            assert!(!journal.record_usage(row, 1, key, usage, now).unwrap());
        }
        expected.add(usage);
    }
    assert_eq!(expected.total_tokens(), 2010 + 405 + 5000 + 9);
    assert_eq!(
        (expected.cost_micros, expected.cost_partial),
        (Some(16_345), true)
    );
    assert_eq!(expected.model, None, "two models: none named");
    std::fs::write(&go_on, "").unwrap();

    // The result mail: the header, the parsed field, the body's line.
    let result = peer.wait_for(&a_id, Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed);
    assert_eq!(
        r.usage.as_ref(),
        Some(&expected),
        "the parsed result's usage"
    );
    assert!(
        r.output.contains("all done") && !r.output.contains("Usage:"),
        "{}",
        r.output
    );
    let raw = peer.raw_headers(&result.email_id).await;
    let sent = header(&raw, "X-AAMP-Usage").expect("an X-AAMP-Usage header");
    assert_eq!(
        sent,
        "input=2010; output=405; cache_read=5000; cache_write=9; cost_usd=0.016345; cost_partial=true"
    );
    // The PyPI AAMP SDK reads it with the parser it has for X-AAMP-Dispatch-Context.
    let python = support::test_agents().join("venv/bin/python");
    let parsed = std::process::Command::new(python)
        .args([
            "-c",
            "import json, sys; from aamp_sdk.protocol import parse_dispatch_context_header as p; print(json.dumps(p(sys.argv[1])))",
            sent,
        ])
        .output()
        .unwrap();
    let parsed: Value = serde_json::from_slice(&parsed.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&parsed.stderr)));
    assert_eq!(
        parsed,
        serde_json::json!({"input": "2010", "output": "405", "cache_read": "5000",
                           "cache_write": "9", "cost_usd": "0.016345", "cost_partial": "true"})
    );
    let body = result
        .message
        .envelope
        .received_body
        .clone()
        .unwrap_or_default();
    assert!(
        body.contains("Usage: 2010 input, 405 output, 5000 cache read, 9 cache write tokens (7424 in all); cost $0.0163+"),
        "{body}"
    );
    let done = bridge.wait_event("task.completed", |e| e["taskId"] == a_id.as_str());
    assert_eq!(
        usage_wire::from_json(&done["usage"]).as_ref(),
        Some(&expected)
    );

    // Task B: its agent reports nothing: no usage anywhere, not zeros.
    let b = peer
        .send(peer.dispatch_to(&agent.email, "Silent", "nothing"))
        .await;
    let b_id = b.task_id().to_string();
    let result_b = peer.wait_for(&b_id, Intent::TaskResult).await;
    let Body::Result(rb) = &result_b.message.body else {
        panic!("not a result")
    };
    assert_eq!(rb.usage, None);
    let raw_b = peer.raw_headers(&result_b.email_id).await;
    assert_eq!(header(&raw_b, "X-AAMP-Usage"), None);
    let done_b = bridge.wait_event("task.completed", |e| e["taskId"] == b_id.as_str());
    assert!(done_b["usage"].is_null(), "{done_b}");

    // task show --json, tasks --json.
    let shown = json_of(&dir, &["task", "show", &a_id, "--json"]);
    assert_eq!(
        usage_wire::from_json(&shown[0]["usage"]).as_ref(),
        Some(&expected)
    );
    assert_eq!(shown[0]["usage"]["totalTokens"], 7424);
    assert_eq!(shown[0]["usage"]["costMicros"], 16_345);
    let shown_b = json_of(&dir, &["task", "show", &b_id, "--json"]);
    assert!(shown_b[0]["usage"].is_null(), "{shown_b}");
    let text = dir.run(&["task", "show", &b_id]);
    assert!(text.contains("none reported by the agent"), "{text}");
    let tasks = json_of(&dir, &["tasks", "--json"]);
    let task = |id: &str| {
        tasks
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["taskId"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        usage_wire::from_json(&task(&a_id)["usage"]).as_ref(),
        Some(&expected)
    );
    assert!(task(&b_id)["usage"].is_null());
    let listed = dir.run(&["tasks"]);
    assert!(listed.contains("7424 tok $0.0163+"), "{listed}");

    // status --json: the agent's today.
    let status = dir.status_json();
    let today = &status["agents"][0]["usageToday"];
    assert_eq!(today["totalTokens"], 7424, "{status}");
    assert_eq!(today["costMicros"], 16_345);
    assert_eq!(today["costPartial"], true);

    // The report: JSON, CSV and text, by agent, sender and model.
    let by_agent = json_of(&dir, &["usage", "--json"]);
    assert_eq!(by_agent["total"]["totalTokens"], 7424, "{by_agent}");
    assert_eq!(by_agent["total"]["costMicros"], 16_345);
    assert_eq!(by_agent["total"]["reports"], 3);
    assert_eq!(by_agent["rows"][0]["key"], "agent");
    assert_eq!(by_agent["uncostedModels"], serde_json::json!(["model-b"]));
    let by_model = json_of(&dir, &["usage", "--by", "model", "--json"]);
    let rows = by_model["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{by_model}");
    assert_eq!(rows[1]["key"], "model-b");
    assert_eq!(rows[1]["costUsd"], "unknown", "unknown, not 0");
    let by_sender = json_of(
        &dir,
        &["usage", "--by", "sender", "--json", "--since", "1d"],
    );
    assert_eq!(by_sender["rows"][0]["key"], boss.email.to_ascii_lowercase());
    assert_eq!(by_sender["total"]["totalTokens"], 7424);
    let csv = dir.run(&["usage", "--csv", "--by", "model"]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 4, "{csv}");
    assert_eq!(lines[2], "model-b,1,10,5,0,3,18,unknown,false");
    assert_eq!(lines[3], "total,3,2010,405,5000,9,7424,0.016345,true");
    let text = dir.run(&["usage"]);
    assert!(
        text.contains("no cost known for some reports of: model-b"),
        "{text}"
    );
    let none = json_of(
        &dir,
        &[
            "usage",
            "--json",
            "--until",
            "2000-01-01",
            "--since",
            "1999-01-01",
        ],
    );
    assert_eq!(none["rows"], serde_json::json!([]));
    assert_eq!(none["total"]["costUsd"], "unknown");

    // Task C: a failed run's result says what it spent before it failed.
    std::fs::remove_file(&go_on).unwrap();
    std::fs::write(&fail, "").unwrap();
    let c = peer
        .send(peer.dispatch_to(&agent.email, "Doomed", "fail"))
        .await;
    let c_id = c.task_id().to_string();
    bridge.wait_event("task.started", |e| e["taskId"] == c_id.as_str());
    let row_c = journal.find_tasks(&c_id).unwrap()[0].id;
    let spent = report(7, 1, 0, Some(9), "model-a");
    assert!(journal
        .record_usage(row_c, 1, "m", &spent, SystemTime::now())
        .unwrap());
    std::fs::write(&go_on, "").unwrap();
    let result_c = peer.wait_for(&c_id, Intent::TaskResult).await;
    let Body::Result(rc) = &result_c.message.body else {
        panic!("not a result")
    };
    assert_eq!(rc.status, Status::Rejected);
    assert!(
        rc.error
            .as_deref()
            .unwrap_or_default()
            .contains("out of luck"),
        "{rc:?}"
    );
    assert_eq!(rc.usage.as_ref(), Some(&spent));
    let raw_c = peer.raw_headers(&result_c.email_id).await;
    assert_eq!(
        header(&raw_c, "X-AAMP-Usage"),
        Some("input=7; output=1; cache_read=0; cache_write=3; cost_usd=0.000009; model=model-a")
    );
    let after = json_of(&dir, &["usage", "--json"]);
    assert_eq!(after["total"]["totalTokens"], 7424 + 11, "{after}");

    // A stopped bridge reports the same.
    assert!(bridge.stop().success());
    let stopped = json_of(&dir, &["usage", "--json"]);
    assert_eq!(stopped["total"], after["total"]);
}
