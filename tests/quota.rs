//! Issue 45: usage limits parked, not failed. The real agent CLIs (Claude Code, Codex, the
//! Gemini CLI, claude-agent-acp) through the bridge over the real mail host, with the model
//! stand-in (`tests/hosts/model_api.py --limits FILE`) answering every request of one API with
//! its provider's own usage-limit error until a time the test wrote: the agent's tasks are
//! parked (and another agent's are not), resumed in order once the window ends, also across a
//! kill -9 while parked, and each task gets exactly one ack and one result.

mod support;

use std::cell::RefCell;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aamp_bridge::protocol::{Body, Intent, Status};
use serde_json::{json, Value};
use support::{mailhost, Bridge, ConfigDir, ModelApi, Peer, Toml};

/// Opens limit windows in the stand-in: `{"anthropic": {"until": EPOCH, "reset": true}, ...}`,
/// written whole (by rename) so it never reads half a file.
fn windows(model: &ModelApi, windows: Value) {
    let limits = model.file("limits.json");
    let tmp = limits.with_extension("tmp");
    std::fs::write(&tmp, windows.to_string()).unwrap();
    std::fs::rename(&tmp, &limits).unwrap();
}

/// How many requests of `api` the stand-in refused at its limit.
fn refused(model: &ModelApi, api: &str) -> usize {
    support::json_lines(&model.file("limits.json.hits"))
        .iter()
        .filter(|h| h["api"] == api)
        .count()
}

fn epoch(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// The environment every agent of these tests runs in: the stand-in as each provider's API,
/// one home (Codex's and Gemini's configs in it), the installed CLIs and adapters first on
/// the PATH. Claude Code gets a subscription's token (its limit then says when it resets);
/// `api_key` gives it an API key instead (a 429 that says no time).
fn env(model: &ModelApi, home: &Path, api_key: bool) -> Vec<(String, String)> {
    let codex_home = model.codex_home(home);
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::write(
        home.join(".gemini/settings.json"),
        r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}}"#,
    )
    .unwrap();
    let agents = support::test_agents();
    let path = format!(
        "{}:{}:{}",
        agents.join("acp/node_modules/.bin").display(),
        agents.join("npm/node_modules/.bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let claude_auth = match api_key {
        true => ("ANTHROPIC_API_KEY", "sk-ant-test"),
        false => ("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-test"),
    };
    [
        ("ANTHROPIC_BASE_URL", model.url.as_str()),
        claude_auth,
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("IS_SANDBOX", "1"),
        ("CODEX_API_KEY", "sk-test"),
        ("CODEX_HOME", codex_home.to_str().unwrap()),
        ("GEMINI_API_KEY", "test-key"),
        ("GOOGLE_GEMINI_BASE_URL", model.url.as_str()),
        ("HOME", home.to_str().unwrap()),
        ("PATH", path.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A real agent's turn under the suite's load, and the slack past a reset the issue allows.
const REAL_TURN: Duration = Duration::from_secs(120);
const AFTER_RESET: Duration = Duration::from_secs(60);

/// Agents (name, profile) on the mail host, each on its own mailbox, taking tasks from one
/// dispatcher, with the stand-in behind them.
struct Setup {
    dir: ConfigDir,
    env: Vec<(String, String)>,
    peer: Peer,
    emails: Vec<(String, String)>,
    model: ModelApi,
    _home: tempfile::TempDir,
}

impl Setup {
    async fn new(agents: &[(&str, &str)], api_key: bool) -> Option<Setup> {
        let host = mailhost()?;
        let boss = host.user("boss");
        let mut toml = Toml::new();
        let mut emails = Vec::new();
        for (name, profile) in agents {
            let account = host.user(name);
            toml = toml.host_mailbox(host, name, &account, "").agent(
                name,
                profile,
                &[&boss.email],
                "",
            );
            emails.push((name.to_string(), account.email.clone()));
        }
        let model = ModelApi::start_with(&[("--limits", "limits.json")]);
        let home = tempfile::tempdir().unwrap();
        let env = env(&model, home.path(), api_key);
        Some(Setup {
            dir: ConfigDir::new(host, &toml.text()),
            env,
            peer: Peer::new(boss).await,
            emails,
            model,
            _home: home,
        })
    }

    fn start(&self) -> Bridge {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Bridge::start_with_env(&self.dir, self.emails.len(), &env)
    }

    fn email(&self, agent: &str) -> String {
        self.emails
            .iter()
            .find(|(n, _)| n == agent)
            .unwrap()
            .1
            .clone()
    }

    /// Sends a task to `agent`; returns its TaskId.
    async fn send(&self, agent: &str, text: &str) -> String {
        let dispatch = self.peer.dispatch_to(&self.email(agent), "quota", text);
        self.peer.send(dispatch).await.task_id().to_string()
    }

    /// Waits for the task's result; it must have completed with `answer`.
    async fn completed(&mut self, task_id: &str, answer: &str) -> SystemTime {
        let result = self
            .peer
            .wait_for_within(task_id, Intent::TaskResult, REAL_TURN + AFTER_RESET)
            .await;
        let Body::Result(r) = &result.message.body else {
            panic!("not a result")
        };
        assert_eq!(r.status, Status::Completed, "{task_id}: {r:?}");
        assert_eq!(r.output, answer, "{task_id}");
        SystemTime::now()
    }

    /// Every task got exactly one ack and one result (checked once all sent before now is in).
    async fn once_each(&mut self, tasks: &[&str]) {
        let via = mailhost().unwrap().user("marker");
        self.peer.settle(&via).await;
        for task in tasks {
            let intents = self.peer.intents_for(task);
            let count = |i: Intent| intents.iter().filter(|x| **x == i).count();
            assert_eq!(count(Intent::TaskAck), 1, "{task}: {intents:?}");
            assert_eq!(count(Intent::TaskResult), 1, "{task}: {intents:?}");
        }
    }
}

/// The events of `bridge` for `agent`'s tasks (started, its first model call as the stream's
/// first usage or tool call, completed) in the order they first came, as `(event, taskId)`,
/// read until `done` of them completed.
fn task_events(bridge: &mut Bridge, agent: &str, done: usize) -> Vec<(String, String)> {
    let seen = RefCell::new(Vec::new());
    bridge.wait_count_of("task.completed", done, |e| {
        let name = e["event"].as_str().unwrap_or_default();
        let ours = e["agent"] == agent;
        let called =
            name == "task.stream" && matches!(e["type"].as_str(), Some("usage" | "tool_call"));
        if ours && (called || matches!(name, "task.started" | "task.completed")) {
            // The predicate is asked again of every event seen so far while it waits.
            let id = e["taskId"].as_str().unwrap_or_default();
            let name = if called { "called" } else { name };
            let event = (name.to_string(), id.to_string());
            if !seen.borrow().contains(&event) {
                seen.borrow_mut().push(event);
            }
        }
        ours && name == "task.completed"
    });
    seen.into_inner()
}

/// Where `event` of `task` is in `events`.
fn at(events: &[(String, String)], event: &str, task: &str) -> usize {
    events
        .iter()
        .position(|(e, t)| e == event && t == task)
        .unwrap_or_else(|| panic!("no {event} of {task} in {events:?}"))
}

/// A Claude Code subscription's limit window parks every task of that agent, not another
/// agent's; a kill -9 while they are parked loses none; after the reset they run one at a
/// time, in the order they came, within 60 s of it; each is acked and answered once.
#[tokio::test(flavor = "multi_thread")]
async fn a_limit_window_parks_an_agents_tasks_and_resumes_them_in_order_across_a_kill() {
    let Some(mut setup) = Setup::new(&[("claude", "claude"), ("codex", "codex")], false).await
    else {
        return;
    };
    let until = SystemTime::now() + Duration::from_secs(25);
    windows(
        &setup.model,
        json!({"anthropic": {"until": epoch(until), "reset": true}}),
    );
    let mut bridge = setup.start();
    let mut claude = Vec::new();
    for word in ["alpha", "bravo", "charlie"] {
        claude.push(setup.send("claude", &format!("remember: {word}")).await);
    }
    let codex = setup.send("codex", "remember: delta").await;
    // The other agent goes on while Claude waits.
    let codex_done = setup.completed(&codex, "I remember: delta.").await;
    // The first is parked at the limit, with the time Claude Code's stream stated.
    let parked = bridge.wait_event("task.parked", |e| e["reason"] == "waiting_for_quota");
    let stated = parked["until"].as_str().unwrap_or_default().to_string();
    assert!(!stated.is_empty(), "the reset Claude Code stated: {parked}");
    assert!(
        codex_done < until,
        "the other agent's task did not wait for the window"
    );
    // status shows the wait.
    let status = setup.dir.status_json();
    let agent = status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent"] == "claude")
        .unwrap()
        .clone();
    assert_eq!(
        agent["quota"]["until"].as_str(),
        Some(stated.as_str()),
        "{agent}"
    );
    assert!(
        agent["quota"]["said"]
            .as_str()
            .unwrap_or_default()
            .contains("limit"),
        "{agent}"
    );
    let text = setup.dir.run(&["status"]);
    assert!(
        text.contains(&format!("waiting for quota until {stated}")),
        "{text}"
    );
    // A crash while parked: the journal keeps the wait and the tasks.
    bridge.kill();
    let mut bridge = setup.start();
    let mut done = Vec::new();
    for (task, word) in claude.iter().zip(["alpha", "bravo", "charlie"]) {
        done.push(setup.completed(task, &format!("I remember: {word}.")).await);
    }
    let first = done[0].duration_since(until).unwrap_or_default();
    assert!(first < AFTER_RESET, "resumed {first:?} after the reset");
    // One at a time, in the order they came, never a burst: each starts only once the one
    // before it got past its first model call (the limit is over) or finished.
    let events = task_events(&mut bridge, "claude", 3);
    for pair in claude.windows(2) {
        let before = at(&events, "called", &pair[0]).min(at(&events, "task.completed", &pair[0]));
        assert!(
            before < at(&events, "task.started", &pair[1]),
            "{} started before {} was past its first model call: {events:?}",
            pair[1],
            pair[0]
        );
    }
    assert!(refused(&setup.model, "anthropic") >= 1);
    let mut all: Vec<&str> = claude.iter().map(String::as_str).collect();
    all.push(&codex);
    setup.once_each(&all).await;
    let status = setup.dir.status_json();
    let agent = status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent"] == "claude")
        .unwrap()
        .clone();
    assert!(agent["quota"].is_null(), "the wait is over: {agent}");
    assert!(bridge.stop().success());
}

/// Limits of the other agents, each in its own words: Codex's usage limit with its reset
/// time, the Gemini CLI's daily quota (no time: probed with backoff), and claude-agent-acp
/// over an API key's 429 (no time): every task parked, then answered once the windows end.
#[tokio::test(flavor = "multi_thread")]
async fn codex_gemini_and_an_acp_adapter_are_parked_and_probed_until_their_windows_end() {
    let agents = [
        ("codex", "codex"),
        ("gemini", "gemini"),
        ("claudeacp", "claude-acp"),
    ];
    let Some(mut setup) = Setup::new(&agents, true).await else {
        return;
    };
    // Codex's window states its end; the others state none, so they stay open until each
    // agent was refused once (a slow start under load does not miss them), then close.
    let now = SystemTime::now();
    let codex_until = now + Duration::from_secs(40);
    let window = |until, reset| json!({"until": epoch(until), "reset": reset});
    let far = now + Duration::from_secs(600);
    windows(
        &setup.model,
        json!({"openai": window(codex_until, true),
                               "gemini": window(far, false), "anthropic": window(far, false)}),
    );
    let mut bridge = setup.start();
    let mut tasks = Vec::new();
    for (agent, _) in agents {
        for n in 1..=2 {
            let word = format!("{agent}{n}");
            tasks.push((setup.send(agent, &format!("remember: {word}")).await, word));
        }
    }
    let both_refused =
        |model: &ModelApi| refused(model, "gemini") > 0 && refused(model, "anthropic") > 0;
    support::poll("Gemini and claude-agent-acp refused", REAL_TURN, || {
        std::future::ready(both_refused(&setup.model).then_some(()))
    })
    .await;
    let closed = SystemTime::now() + Duration::from_secs(3);
    windows(
        &setup.model,
        json!({"openai": window(codex_until, true),
                               "gemini": window(closed, false), "anthropic": window(closed, false)}),
    );
    for (agent, _) in agents {
        bridge.wait_event("task.parked", |e| {
            e["agent"] == agent && e["reason"] == "waiting_for_quota"
        });
    }
    let mut last = closed.max(codex_until);
    for (task, word) in &tasks {
        last = last.max(setup.completed(task, &format!("I remember: {word}.")).await);
    }
    let after = last
        .duration_since(closed.max(codex_until))
        .unwrap_or_default();
    assert!(
        after < AFTER_RESET + REAL_TURN,
        "the last answered {after:?} after the windows"
    );
    assert!(
        refused(&setup.model, "openai") >= 1,
        "Codex was never refused"
    );
    let ids: Vec<&str> = tasks.iter().map(|(t, _)| t.as_str()).collect();
    setup.once_each(&ids).await;
    assert!(bridge.stop().success());
}
