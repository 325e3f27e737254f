//! Issue 45, item 1: every task's tokens, as the bridge journaled them from each real agent's
//! own reports, equal what the model stand-in (`tests/hosts/model_api.py`) said it answered,
//! by its ledger (a line per answered request: its task, found by the `Task ID:` line of the
//! bridge's prompt, and the tokens it reported). Through the bridge over the real mail host:
//! 104 tasks of eight real agents in one bridge (the Claude Code, Codex, Gemini and Qwen Code
//! CLIs; claude-agent-acp, codex-acp and Gemini's and Qwen Code's ACP agents), single tasks
//! and resumed conversations; a conversation whose session was lost and retold; and a task run
//! again after the bridge was killed (kill -9) while its agent waited in a tool.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use aamp_bridge::protocol::{Body, Intent, Status};
use support::{mailhost, poll_until, Bridge, ConfigDir, ModelApi, Peer};

/// Tokens: input (not cached), cache reads, cache writes, output.
type Tokens = (u64, u64, u64, u64);

/// The stand-in's ledger: a line per answered request (its API, task and tokens).
fn ledger_file(model: &ModelApi) -> std::path::PathBuf {
    model.file("ledger.jsonl")
}

/// The ledger's tokens per task. Every answered request names its task.
fn by_task(model: &ModelApi) -> BTreeMap<String, Tokens> {
    let text = std::fs::read_to_string(ledger_file(model)).unwrap_or_default();
    let mut out: BTreeMap<String, Tokens> = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let task = v["task"]
            .as_str()
            .unwrap_or_else(|| panic!("a request for no task: {line}"));
        let n = |k: &str| v[k].as_u64().unwrap();
        let t = out.entry(task.to_string()).or_default();
        t.0 += n("input");
        t.1 += n("cache_read");
        t.2 += n("cache_write");
        t.3 += n("output");
    }
    out
}

/// The journal's usage rows summed per task, read as the bridge left them.
fn journaled(dir: &ConfigDir) -> BTreeMap<String, Tokens> {
    let path = dir.dir.path().join("state/journal.sqlite3");
    let Ok(db) =
        rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return BTreeMap::new();
    };
    let Ok(mut q) = db.prepare(
        "SELECT t.task_id, SUM(u.input), SUM(u.cache_read), SUM(u.cache_write), SUM(u.output)
         FROM usage u JOIN tasks t ON t.id = u.task GROUP BY t.task_id",
    ) else {
        return BTreeMap::new();
    };
    q.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            (
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)? as u64,
                r.get::<_, i64>(3)? as u64,
                r.get::<_, i64>(4)? as u64,
            ),
        ))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// The journal's cost per task: the sum of the stated costs, `None` when no report stated one.
fn journaled_cost(dir: &ConfigDir) -> BTreeMap<String, Option<i64>> {
    let path = dir.dir.path().join("state/journal.sqlite3");
    let db =
        rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut q = db
        .prepare(
            "SELECT t.task_id, SUM(u.cost_micros) FROM usage u JOIN tasks t ON t.id = u.task
             GROUP BY t.task_id",
        )
        .unwrap();
    q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn bin_path(folder: &str) -> String {
    support::test_agents()
        .join(folder)
        .join("node_modules/.bin")
        .display()
        .to_string()
}

/// `PATH` with the CLIs, and (for the adapters) the adapters' own prefix first.
fn path(adapters: bool) -> String {
    let mut parts = vec![];
    if adapters {
        parts.push(bin_path("acp"));
    }
    parts.push(bin_path("npm"));
    parts.push(bin_path("qwen"));
    parts.push(std::env::var("PATH").unwrap_or_default());
    parts.join(":")
}

/// The environment each agent runs in against the stand-in, with a home of its own.
fn env_for(agent: &str, model: &ModelApi, home: &Path) -> Vec<(String, String)> {
    let s = |k: &str, v: &str| (k.to_string(), v.to_string());
    let mut env = vec![s("HOME", home.to_str().unwrap())];
    if agent.starts_with("claude") {
        env.push(s("ANTHROPIC_BASE_URL", &model.url));
        env.push(s("ANTHROPIC_API_KEY", "sk-ant-test"));
        env.push(s("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"));
        env.push(s("IS_SANDBOX", "1"));
        // Bash allowed without asking (the kill test's agent waits in it).
        std::fs::create_dir_all(home.join(".claude")).unwrap();
        std::fs::write(
            home.join(".claude/settings.json"),
            r#"{"permissions": {"allow": ["Bash"]}}"#,
        )
        .unwrap();
    } else if agent.starts_with("codex") {
        let codex_home = model.codex_home(home);
        env.push(s("CODEX_API_KEY", "sk-test"));
        env.push(s("CODEX_HOME", codex_home.to_str().unwrap()));
    } else if agent.starts_with("qwen") {
        if agent == "qwen-acp" {
            // Qwen Code's ACP agent reports no call of its memory subagent nor of its
            // follow-up suggestion, both made after each answer by default: off, so what it
            // reports can be checked exactly.
            std::fs::create_dir_all(home.join(".qwen")).unwrap();
            std::fs::write(
                home.join(".qwen/settings.json"),
                r#"{"memory": {"enableManagedAutoMemory": false}, "ui": {"enableFollowupSuggestions": false}}"#,
            )
            .unwrap();
        }
        env.push(s("OPENAI_API_KEY", "sk-qwen-test"));
        env.push(s("OPENAI_BASE_URL", &format!("{}/v1", model.url)));
        env.push(s("OPENAI_MODEL", "standin"));
    } else {
        std::fs::create_dir_all(home.join(".gemini")).unwrap();
        // Gemini's `--acp` leaves its model router's call out of what it reports: a named
        // model (no router) for it; the CLI's stream-json counts the router's call.
        let named = if agent == "gemini-acp" {
            r#", "model": {"name": "gemini-2.5-flash"}"#
        } else {
            ""
        };
        std::fs::write(
            home.join(".gemini/settings.json"),
            format!(r#"{{"security": {{"auth": {{"selectedType": "gemini-api-key"}}}}{named}}}"#),
        )
        .unwrap();
        env.push(s("GEMINI_API_KEY", "test-key"));
        env.push(s("GOOGLE_GEMINI_BASE_URL", &model.url));
    }
    env.push(s("PATH", &path(agent.ends_with("-acp"))));
    env
}

/// One agent running `profile` against its own stand-in, and a dispatcher.
struct Setup {
    agent: aamp_bridge::config::Account,
    dir: ConfigDir,
    env: Vec<(String, String)>,
    peer: Peer,
    home: tempfile::TempDir,
    model: ModelApi,
}

const TURN: std::time::Duration = std::time::Duration::from_secs(120);

impl Setup {
    async fn new(profile: &str, extra: &str) -> Option<Setup> {
        let host = mailhost()?;
        let (agent, boss) = (host.user("agent"), host.user("boss"));
        let model = ModelApi::start_with(&[("--ledger", "ledger.jsonl")]);
        let home = tempfile::tempdir().unwrap();
        let config = support::Toml::new()
            .top("profiles_dir = \"profiles\"")
            .host_mailbox(host, "agent", &agent, "")
            .agent("agent", profile, &[&boss.email], extra);
        let dir = ConfigDir::new(host, &config.text());
        // Qwen Code ships no CLI profile: one as `profile new` makes it (Claude's stream).
        std::fs::create_dir_all(dir.dir.path().join("profiles")).unwrap();
        dir.write(
            "profiles/qwen.toml",
            "command = \"qwen\"\nargs = [\"--output-format\", \"stream-json\", \"--resume\", \"{{resume_id}}\"]\nstdin = \"{{prompt}}\"\nstream = \"claude\"\n",
        );
        let env = env_for(profile, &model, home.path());
        Some(Setup {
            agent,
            dir,
            env,
            peer: Peer::new(boss).await,
            home,
            model,
        })
    }

    fn start(&self) -> Bridge {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Bridge::start_with_env(&self.dir, 1, &env)
    }

    /// Sends `text` (in conversation `session`, when one) and returns the task's id once it
    /// was answered `completed`.
    async fn ask(&mut self, text: &str, session: Option<&str>) -> String {
        let mut dispatch = self.peer.dispatch_to(&self.agent.email, "Usage", text);
        if let Body::Dispatch(d) = &mut dispatch.body {
            d.session_key = session.map(str::to_string);
        }
        let sent = self.peer.send(dispatch).await;
        let task_id = sent.task_id().to_string();
        let result = self
            .peer
            .wait_for_within(&task_id, Intent::TaskResult, TURN)
            .await;
        let Body::Result(r) = &result.message.body else {
            panic!("not a result")
        };
        assert_eq!(r.status, Status::Completed, "{text}: {r:?}");
        task_id
    }

    /// The journal's tokens per task equal the ledger's, for `tasks` and nothing else.
    fn assert_exact(&self, tasks: &[String]) {
        let (ledger, journal) = (by_task(&self.model), journaled(&self.dir));
        for task in tasks {
            assert!(
                ledger.contains_key(task),
                "the stand-in saw {task}: {ledger:?}"
            );
        }
        assert_eq!(
            journal,
            ledger,
            "journal (left) against the stand-in's ledger: {}",
            std::fs::read_to_string(ledger_file(&self.model)).unwrap_or_default()
        );
        assert_eq!(ledger.len(), tasks.len(), "{ledger:?}");
    }
}

/// Every agent the usage is read from, by its profile: three CLIs of their own stream formats,
/// Qwen Code's CLI (Claude's stream, a profile of the test's own) and four ACP agents.
const MIXED: [&str; 8] = [
    "claude",
    "codex",
    "gemini",
    "qwen",
    "claude-acp",
    "codex-acp",
    "gemini-acp",
    "qwen-acp",
];

/// The whole environment of a bridge that runs all of [`MIXED`] against one stand-in in one
/// home: each agent's variables and settings, the CLIs on `PATH`; the ACP agents run with the
/// adapters' prefix (and its Node) first on their own `PATH`, set by their profiles.
fn mixed_env(model: &ModelApi, home: &Path) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    // Gemini's ACP agent's settings last: a named model (no router call, which its ACP
    // reports leave out) for the CLI too.
    for agent in ["claude", "codex", "qwen-acp", "gemini-acp"] {
        env.extend(env_for(agent, model, home));
    }
    env.insert("PATH".into(), path(false));
    env.into_iter().collect()
}

/// 104 tasks over the eight agents in one bridge, as a day of mixed work is: single tasks and
/// two-turn conversations (each agent's session resumed), several agents at work at once.
/// Each task's tokens as journaled equal the stand-in's ledger (0 drift), Claude's stated cost
/// is kept and the others' is unknown, and `usage --json` and `status --json` (what the live
/// view's figures are made from) give the ledger's totals per agent.
#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_tasks_of_eight_agents_equal_the_ledger() {
    let Some(host) = mailhost() else { return };
    let boss = host.user("boss");
    let model = ModelApi::start_with(&[("--ledger", "ledger.jsonl")]);
    let home = tempfile::tempdir().unwrap();
    let mut config = support::Toml::new().top("profiles_dir = \"profiles\"");
    let mut emails = BTreeMap::new();
    for profile in MIXED {
        let account = host.user(profile);
        config = config.host_mailbox(host, profile, &account, "").agent(
            profile,
            profile,
            &[&boss.email],
            "",
        );
        emails.insert(profile, account.email);
    }
    let dir = ConfigDir::new(host, &config.text());
    std::fs::create_dir_all(dir.dir.path().join("profiles")).unwrap();
    dir.write(
        "profiles/qwen.toml",
        "command = \"qwen\"\nargs = [\"--output-format\", \"stream-json\", \"--resume\", \"{{resume_id}}\"]\nstdin = \"{{prompt}}\"\nstream = \"claude\"\n",
    );
    let env = mixed_env(&model, home.path());
    // codex-acp runs its own Codex (the adapter's pinned version), whose state database must
    // not be the CLI's (a newer Codex migrates it; two at once contend for it): a Codex home
    // of its own, with the same settings.
    let acp_codex_home = home.path().join(".codex-acp");
    std::fs::create_dir_all(&acp_codex_home).unwrap();
    std::fs::copy(
        home.path().join(".codex/config.toml"),
        acp_codex_home.join("config.toml"),
    )
    .unwrap();
    for acp in MIXED.iter().filter(|p| p.ends_with("-acp")) {
        let built_in = aamp_bridge::runner::profile::source_text(acp, &[]).unwrap();
        assert!(!built_in.lines().any(|l| l.starts_with("[env]")), "{acp}");
        let mut table = format!("{built_in}\n[env]\nPATH = {:?}\n", path(true));
        if *acp == "codex-acp" {
            table.push_str(&format!(
                "CODEX_HOME = {:?}\n",
                acp_codex_home.display().to_string()
            ));
        }
        dir.write(&format!("profiles/{acp}.toml"), &table);
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let bridge = Bridge::start_with_env(&dir, MIXED.len(), &env);
    let mut peer = Peer::new(boss).await;
    let day = || aamp_bridge::dispatch::journal::hour_of(std::time::SystemTime::now()) / 24;
    let first_day = day();

    // Two waves: the second continues the conversations the first began.
    let mut agent_of = BTreeMap::new();
    for wave in 0..2 {
        let mut sent = Vec::new();
        for profile in MIXED {
            for i in 0..(6 + wave) {
                let session = (i < 2).then(|| format!("talk-{profile}-{i}"));
                let text = format!("remember: {profile} {wave} {i}");
                let mut dispatch = peer.dispatch_to(&emails[profile], "Usage", &text);
                if let Body::Dispatch(d) = &mut dispatch.body {
                    d.session_key = session;
                }
                let task = peer.send(dispatch).await.task_id().to_string();
                agent_of.insert(task.clone(), profile);
                sent.push(task);
            }
        }
        for task in &sent {
            let result = peer
                .wait_for_within(task, Intent::TaskResult, TURN * 4)
                .await;
            let Body::Result(r) = &result.message.body else {
                panic!("not a result")
            };
            assert_eq!(r.status, Status::Completed, "{}: {r:?}", agent_of[task]);
        }
    }
    assert_eq!(agent_of.len(), 104);

    let (ledger, journal) = (by_task(&model), journaled(&dir));
    assert_eq!(ledger.len(), agent_of.len(), "a ledger line for each task");
    let drift: Vec<_> = ledger
        .iter()
        .filter(|(task, tokens)| journal.get(*task) != Some(tokens))
        .map(|(task, tokens)| (agent_of[task.as_str()], tokens, journal.get(task)))
        .collect();
    assert!(drift.is_empty(), "(agent, ledger, journal): {drift:?}");
    assert_eq!(journal.len(), ledger.len());
    // Claude Code states what each run cost (by its own prices); the others say nothing of
    // money: unknown, not 0.
    for (task, cost) in journaled_cost(&dir) {
        let agent = agent_of[task.as_str()];
        let states = agent == "claude" || agent == "claude-acp";
        assert_eq!(cost.is_some_and(|c| c > 0), states, "{agent}: {cost:?}");
        assert!(states || cost.is_none(), "{agent}: {cost:?}");
    }

    // The report and the status give the ledger's sums, per agent and in all.
    let mut per_agent: BTreeMap<&str, u64> = BTreeMap::new();
    for (task, t) in &ledger {
        *per_agent.entry(agent_of[task.as_str()]).or_default() += t.0 + t.1 + t.2 + t.3;
    }
    let all: u64 = per_agent.values().sum();
    let report: serde_json::Value =
        serde_json::from_str(&dir.run(&["usage", "--json", "--since", "1d"])).unwrap();
    assert_eq!(report["total"]["totalTokens"], all, "{report}");
    let rows = report["rows"].as_array().unwrap();
    let reported: BTreeMap<&str, u64> = rows
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap(),
                r["totalTokens"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(reported, per_agent, "{report}");
    // (Today's figures, unless the test ran over midnight UTC.)
    let status = dir.status_json();
    for a in status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|_| day() == first_day)
    {
        let name = a["agent"].as_str().unwrap();
        assert_eq!(
            a["usageToday"]["totalTokens"], per_agent[name],
            "{name}: {a}"
        );
    }
    assert!(bridge.stop().success());
}

/// Claude Code keeps its sessions per folder under its home: with them gone, `--resume`
/// fails ("No conversation found"), and the bridge runs the turn again in a new session,
/// retold. Both runs counted (the failed one called no model), nothing twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_claude_session_retold_counts_each_call_once() {
    let Some(mut setup) = Setup::new("claude", "").await else {
        return;
    };
    let bridge = setup.start();
    let mut tasks = vec![setup.ask("remember: lark", Some("talk-2")).await];
    let projects = setup.home.path().join(".claude/projects");
    assert!(projects.exists(), "Claude Code keeps sessions there");
    std::fs::remove_dir_all(&projects).unwrap();
    tasks.push(setup.ask("remember: finch", Some("talk-2")).await);
    setup.assert_exact(&tasks);
    assert!(bridge.stop().success());
}

/// The bridge killed (kill -9) while Claude Code waits in a command: the first run's calls
/// were journaled as they came; the task runs again after the restart; both runs' calls
/// counted, each once.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_run_again_after_a_kill_counts_both_runs() {
    let Some(mut setup) = Setup::new("claude", "").await else {
        return;
    };
    let (waiting, release) = (
        setup.home.path().join("waiting"),
        setup.home.path().join("release"),
    );
    let script = format!(
        "run: touch {}; while [ ! -e {} ]; do sleep 0.1; done; echo released",
        waiting.display(),
        release.display()
    );
    let mut bridge = setup.start();
    let sent = setup
        .peer
        .send(setup.peer.dispatch_to(&setup.agent.email, "Usage", &script))
        .await;
    let task = sent.task_id().to_string();
    bridge.wait_event("task.started", |e| e["taskId"] == task);
    // The CLI's start and first model call: a turn's time, not the suite's usual wait (a
    // loaded machine took over 30 s).
    support::poll("the agent waits in its command", TURN, || {
        std::future::ready(waiting.exists().then_some(()))
    })
    .await;
    // The first call's report (its start and its end) journaled before the crash.
    poll_until("the first call journaled", || {
        journaled(&setup.dir).get(&task) == by_task(&setup.model).get(&task)
    })
    .await;
    bridge.kill();
    std::fs::remove_file(&waiting).unwrap();
    std::fs::write(&release, "").unwrap();
    let mut bridge = setup.start();
    bridge.wait_event("task.recovered", |e| e["taskId"] == task);
    let result = setup
        .peer
        .wait_for_within(&task, Intent::TaskResult, TURN)
        .await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed, "{r:?}");
    let lines = std::fs::read_to_string(ledger_file(&setup.model)).unwrap();
    assert!(
        lines.lines().count() >= 3,
        "two runs' calls (the first cut short): {lines}"
    );
    setup.assert_exact(std::slice::from_ref(&task));
    assert!(bridge.stop().success());
}
