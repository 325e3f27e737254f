//! The real agent CLIs, installed from npm by `scripts/test-agents.sh`, driven through the
//! bridge over the real mail host, with only the model replaced: `tests/hosts/model_api.py`
//! stands in for the model's API and answers from what it was sent, so a test can tell whether
//! the agent kept its context.

mod support;

use aamp_bridge::protocol::{Body, Intent, Status};
use support::{mailhost, Bridge, ConfigDir, ModelApi, Peer};

/// The model stand-in, on a port of its own.
/// `PATH=` with the agents `scripts/test-agents.sh` installed first.
fn agents_path() -> (String, String) {
    let bin = support::test_agents().join("npm/node_modules/.bin");
    (
        "PATH".into(),
        format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    )
}

/// `PATH=` for the ACP adapters: their own prefix first (its `node` is Node 22, which
/// claude-agent-acp's Claude Code needs), then the CLIs.
fn adapters_path() -> (String, String) {
    let (key, rest) = agents_path();
    let bin = support::test_agents().join("acp/node_modules/.bin");
    (key, format!("{}:{rest}", bin.display()))
}

/// `env` with Zed's adapters first on its `PATH` (their own prefix: Zed's codex-acp has the
/// other one's command name), then the other adapters.
fn with_zed(env: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env = with_adapters(env);
    let (key, rest) = env.pop().expect("PATH last");
    let bin = support::test_agents().join("zed/node_modules/.bin");
    env.push((key, format!("{}:{rest}", bin.display())));
    env
}

/// `env` with its `PATH` made [`adapters_path`].
fn with_adapters(mut env: Vec<(String, String)>) -> Vec<(String, String)> {
    env.retain(|(k, _)| k != "PATH");
    env.push(adapters_path());
    env
}

/// A bridge for `dir` whose agents get `env` besides the bridge's own environment.
fn start(dir: &ConfigDir, env: &[(String, String)]) -> Bridge {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Bridge::start_with_env(dir, 1, &env)
}

/// The environment Claude Code runs in: the stand-in as its API, a home of its own, the
/// installed CLI first on the PATH.
fn claude_env(model: &ModelApi, home: &std::path::Path) -> Vec<(String, String)> {
    vec![
        ("ANTHROPIC_BASE_URL".into(), model.url.clone()),
        ("ANTHROPIC_API_KEY".into(), "sk-ant-test".into()),
        (
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
            "1".into(),
        ),
        ("HOME".into(), home.display().to_string()),
        agents_path(),
    ]
}

/// The environment Codex runs in: a home with a config that names the stand-in as its model
/// provider (Codex reads no base-URL variable), `CODEX_API_KEY`, the installed CLI first.
fn codex_env(model: &ModelApi, home: &std::path::Path) -> Vec<(String, String)> {
    let codex_home = model.codex_home(home);
    vec![
        ("CODEX_API_KEY".into(), "sk-test".into()),
        ("CODEX_HOME".into(), codex_home.display().to_string()),
        ("HOME".into(), home.display().to_string()),
        agents_path(),
    ]
}

/// Codex's environment, for codex-acp.
fn codex_acp_env(model: &ModelApi, home: &std::path::Path) -> Vec<(String, String)> {
    with_adapters(codex_env(model, home))
}

/// Claude Code's environment, for claude-agent-acp: `IS_SANDBOX=1` whatever the machine has
/// (as root, another value makes the adapter ask for a bypass Claude Code refuses).
fn claude_acp_env(model: &ModelApi, home: &std::path::Path) -> Vec<(String, String)> {
    let mut env = with_adapters(claude_env(model, home));
    env.push(("IS_SANDBOX".into(), "1".into()));
    env
}

/// The environment the Gemini CLI runs in: the stand-in as its API (with a custom base URL
/// Gemini needs the API-key auth type chosen, or it exits 41), a home of its own.
fn gemini_env(model: &ModelApi, home: &std::path::Path) -> Vec<(String, String)> {
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::write(
        home.join(".gemini/settings.json"),
        r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}}"#,
    )
    .unwrap();
    vec![
        ("GEMINI_API_KEY".into(), "test-key".into()),
        ("GOOGLE_GEMINI_BASE_URL".into(), model.url.clone()),
        ("HOME".into(), home.display().to_string()),
        agents_path(),
    ]
}

/// How long one real agent's turn may take before a test gives up on it.
const REAL_TURN: std::time::Duration = std::time::Duration::from_secs(120);

/// Sends `texts` as one conversation (Session-Key `talk-1`) and returns the answers in order.
async fn conversation(peer: &mut Peer, to: &str, texts: &[&str]) -> Vec<String> {
    let mut answers = Vec::new();
    for text in texts {
        let mut dispatch = peer.dispatch_to(to, "A conversation", text);
        if let Body::Dispatch(d) = &mut dispatch.body {
            d.session_key = Some("talk-1".into());
        }
        let sent = peer.send(dispatch).await;
        // A real agent's turn (a Node CLI starting, then the model stand-in) takes tens of
        // seconds while the suite's other lanes load the machine.
        let result = peer
            .wait_for_within(sent.task_id(), Intent::TaskResult, REAL_TURN)
            .await;
        let Body::Result(r) = &result.message.body else {
            panic!("not a result")
        };
        assert_eq!(r.status, Status::Completed, "{text}: {r:?}");
        answers.push(r.output.clone());
    }
    answers
}

/// How a test makes an agent's environment from the stand-in and a home of its own.
type EnvFor = fn(&ModelApi, &std::path::Path) -> Vec<(String, String)>;

/// One agent, `agent`, on the mail host running `profile` with the environment `env_for`
/// makes, the model stand-in behind it, and a dispatcher allowed to send it tasks.
struct Setup {
    agent: aamp_bridge::config::Account,
    dir: ConfigDir,
    env: Vec<(String, String)>,
    peer: Peer,
    home: tempfile::TempDir,
    _model: ModelApi,
}

impl Setup {
    /// `None` when there is no mail host (the test then checks nothing).
    async fn new(profile: &str, env_for: EnvFor) -> Option<Setup> {
        let host = mailhost()?;
        let (agent, boss) = (host.user("agent"), host.user("boss"));
        let model = ModelApi::start();
        let home = tempfile::tempdir().unwrap();
        let dir = ConfigDir::new(
            host,
            &support::one_agent(host, &agent, profile, &boss.email).text(),
        );
        let env = env_for(&model, home.path());
        Some(Setup {
            agent,
            dir,
            env,
            peer: Peer::new(boss).await,
            home,
            _model: model,
        })
    }

    fn start(&self) -> Bridge {
        start(&self.dir, &self.env)
    }

    /// Sends one task `text` (titled `title`) and returns its id and result.
    async fn ask(
        &mut self,
        title: &str,
        text: &str,
    ) -> (String, aamp_bridge::protocol::TaskResult) {
        let sent = self
            .peer
            .send(self.peer.dispatch_to(&self.agent.email, title, text))
            .await;
        let task_id = sent.task_id().to_string();
        let result = self
            .peer
            .wait_for_within(&task_id, Intent::TaskResult, REAL_TURN)
            .await;
        let Body::Result(r) = result.message.body else {
            panic!("not a result")
        };
        (task_id, r)
    }

    /// [`conversation`] with this agent.
    async fn talk(&mut self, texts: &[&str]) -> Vec<String> {
        conversation(&mut self.peer, &self.agent.email, texts).await
    }
}

/// `aamp-bridge profile test PROFILE --prompt PROMPT --json` (with `--events` when asked),
/// its agent given `env`, with an empty config in `home`: how it exited, and its report.
fn profile_test(
    home: &std::path::Path,
    profile: &str,
    prompt: &str,
    events: bool,
    env: &[(String, String)],
) -> (std::process::ExitStatus, serde_json::Value) {
    let config = home.join("config.toml");
    std::fs::write(&config, "").unwrap();
    let out = std::process::Command::new(support::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "profile",
            "test",
            profile,
        ])
        .args(["--prompt", prompt, "--json"])
        .args(events.then_some("--events"))
        .envs(env.iter().cloned())
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{profile}: no report: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status, report)
}

/// Runs the shipped `profile` (its CLI given `env`, made by `env_for` from the stand-in and a
/// home) through the bridge over the mail host, in a three-turn conversation, and checks that
/// every turn saw the turns before it.
async fn keeps_three_turns(profile: &str, env_for: EnvFor) {
    let Some(mut setup) = Setup::new(profile, env_for).await else {
        return;
    };
    let bridge = setup.start();
    remembers_three_turns(&mut setup.peer, &setup.agent.email, profile).await;
    assert!(bridge.stop().success());
}

/// A three-turn conversation with the agent at `to`, each turn seeing the turns before it.
async fn remembers_three_turns(peer: &mut Peer, to: &str, profile: &str) {
    let answers = conversation(
        peer,
        to,
        &["remember: tangerine", "remember: walnut", "remember: heron"],
    )
    .await;
    assert_eq!(
        answers,
        vec![
            "I remember: tangerine.",
            "I remember: tangerine, walnut.",
            "I remember: tangerine, walnut, heron."
        ],
        "{profile}"
    );
}

/// Issue 20: a three-turn conversation with the real Codex CLI (0.171, `codex exec` and
/// `codex exec resume`) through the bridge keeps its context.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_codex_cli_keeps_a_conversation_through_the_bridge() {
    keeps_three_turns("codex", codex_env).await;
}

/// Issue 20: a three-turn conversation with the real codex-acp (2.6, `session/resume`)
/// through the bridge keeps its context.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_codex_acp_keeps_a_conversation_through_the_bridge() {
    keeps_three_turns("codex-acp", codex_acp_env).await;
}

/// Files named `name` anywhere under `dir`.
fn found(dir: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            out.extend(found(&path, name));
        } else if entry.file_name() == name {
            out.push(path);
        }
    }
    out
}

/// Issue 20, items 4 and 6, with the real codex-acp 2.6: under `permissions = "read_only"`
/// (the shipped default) it ran `touch` without asking and the file was made (Codex's own
/// default mode writes the workspace); now the policy is passed as Codex's mode and its
/// sandbox refuses the write. And what a command printed came only in the update's `_meta`,
/// so tool calls had no output; now they do. Allowed, the same write is made: the mode is
/// what stopped it.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_codex_acp_holds_read_only_and_shows_what_its_commands_print() {
    let Some(mut setup) = Setup::new("codex-acp", codex_acp_env).await else {
        return;
    };
    let bridge = setup.start();
    let answers = setup.talk(&["run: touch made-by-agent"]).await;
    assert!(bridge.stop().success());
    assert!(
        answers[0].contains("Read-only file system"),
        "{}",
        answers[0]
    );
    assert_eq!(
        found(setup.dir.dir.path(), "made-by-agent"),
        Vec::<std::path::PathBuf>::new()
    );

    // The same agent, allowed.
    let shipped = std::fs::read_to_string(support::repo().join("profiles/codex-acp.toml")).unwrap();
    setup.dir.write(
        "codex-allowed.toml",
        &shipped.replace("permissions = \"read_only\"", "permissions = \"allow\""),
    );
    let config = std::fs::read_to_string(setup.dir.config()).unwrap();
    setup.dir.write(
        "config.toml",
        &config.replace(
            "profile = \"codex-acp\"",
            "profile = \"codex-allowed.toml\"",
        ),
    );
    let mut bridge = setup.start();
    let answers = setup
        .talk(&["run: echo hi", "run: touch made-by-agent"])
        .await;
    assert_eq!(answers[0], "All done. The command said: hi.");
    assert_eq!(found(setup.dir.dir.path(), "made-by-agent").len(), 1);
    bridge.wait_event("task.completed", |e| e["status"] == "completed");
    let printed: Vec<String> = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "task.stream" && e["type"] == "tool_call")
        .filter(|e| e["payload"]["label"] == "echo hi" && e["payload"]["status"] == "completed")
        .map(|e| {
            e["payload"]["output"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(printed, vec!["hi"]);
    assert!(bridge.stop().success());
}

/// Issue 20, item 7: codex-acp 2.6 turned a model API failure (HTTP 500, "We're currently
/// experiencing high demand…") into a text and `end_turn`, so the task was reported completed
/// with the error as its answer. Now it is rejected, saying the model failed; and so with the
/// Codex CLI. (The stand-in's 500 is answered without retries: the profile's provider says
/// none.)
#[tokio::test(flavor = "multi_thread")]
async fn the_real_codex_agents_report_a_failing_model_as_rejected() {
    for profile in ["codex-acp", "codex"] {
        let Some(mut setup) = Setup::new(profile, codex_acp_env).await else {
            return;
        };
        let bridge = setup.start();
        let (_, r) = setup.ask("Busy", "fail: 500").await;
        assert_eq!(r.status, Status::Rejected, "{profile}: {r:?}");
        let error = r.error.as_deref().unwrap_or_default();
        assert!(error.contains("high demand"), "{profile}: {error}");
        assert!(bridge.stop().success());
    }
}

/// Issue 20, item 4, the CLIs: the policy reached the agents only as answers to permission
/// requests, which CLIs in headless mode never send, so what held was each CLI's own settings.
/// Now the shipped profiles pass it in the CLI's terms first: Codex set up to run without a
/// sandbox (`sandbox_mode = "danger-full-access"` in its config) still cannot write under
/// `read_only`.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_codex_cli_holds_read_only_whatever_its_config_says() {
    let Some(mut setup) = Setup::new("codex", codex_env).await else {
        return;
    };
    let config = setup.home.path().join(".codex/config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("sandbox_mode = \"danger-full-access\"\n{text}"),
    )
    .unwrap();
    let bridge = setup.start();
    let answers = setup.talk(&["run: touch made-by-agent"]).await;
    assert!(bridge.stop().success());
    assert!(
        answers[0].contains("Read-only file system"),
        "{}",
        answers[0]
    );
    assert_eq!(
        found(setup.dir.dir.path(), "made-by-agent"),
        Vec::<std::path::PathBuf>::new()
    );
}

/// Issue 20, items 5 and 3, with the real `gemini --acp` (0.61): Gemini names a tool only in
/// its permission request, so a refused call sent no `tool_call` event, and the answer kept
/// what it said before. Now the refusal is a failed tool call, the write is not made, and the
/// answer is Gemini's last word.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_gemini_acp_shows_a_refused_tool_call() {
    let Some(mut setup) = Setup::new("gemini-acp", gemini_env).await else {
        return;
    };
    let mut bridge = setup.start();
    let (task_id, r) = setup.ask("Touch", "run: touch made-by-agent").await;
    assert!(
        r.output.starts_with("All done. The command said:") && r.output.contains("canceled"),
        "{}",
        r.output
    );
    bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
    let calls: Vec<&serde_json::Value> = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "task.stream" && e["type"] == "tool_call")
        .map(|e| &e["payload"])
        .collect();
    assert!(
        calls.iter().any(|c| c["label"] == "touch made-by-agent"
            && c["status"] == "failed"
            && c["output"].as_str().unwrap_or_default().contains("refused")),
        "{calls:?}"
    );
    assert!(bridge.stop().success());
    assert_eq!(
        found(setup.dir.dir.path(), "made-by-agent"),
        Vec::<std::path::PathBuf>::new()
    );
}

/// Issue 20: both Claude adapters answered `session/resume` from another folder with
/// "Resource not found", and every task ran in a fresh folder: the second turn lost its
/// context without a word. A conversation now keeps its folder, so the real claude-agent-acp
/// (0.49, on Node 22) resumes.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_claude_agent_acp_keeps_a_conversation_through_the_bridge() {
    keeps_three_turns("claude-acp", claude_acp_env).await;
}

/// Issue 20, item 7: as root on a machine with `IS_SANDBOX=yes` (this one), claude-agent-acp
/// failed with "Internal error (Claude Code process exited with code 1)" alone (Zed's adapter:
/// "Query closed before response received"): the adapter
/// asks for the permission bypass whenever IS_SANDBOX is set, Claude Code refuses it to root
/// unless it is `1`, and says so only on a stderr the adapter swallows. The bridge now says
/// what happened and what to do. (Run as another user, the adapter works, and so must the
/// check.)
#[test]
fn the_real_claude_adapters_refusing_root_say_what_to_do() {
    let model = ModelApi::start();
    let home = tempfile::tempdir().unwrap();
    let zed = home.path().join("zed-claude.toml");
    std::fs::write(&zed, "kind = \"acp\"\ncommand = \"claude-code-acp\"\n").unwrap();
    for (profile, said) in [
        ("claude-acp", "Claude Code process exited with code 1"),
        (
            zed.to_str().unwrap(),
            "Query closed before response received",
        ),
    ] {
        let mut env = with_zed(claude_acp_env(&model, home.path()));
        env.retain(|(k, _)| k != "IS_SANDBOX");
        env.push(("IS_SANDBOX".into(), "yes".into()));
        let (status, report) =
            profile_test(home.path(), profile, "remember: tangerine", false, &env);
        if nix::unistd::geteuid().is_root() {
            assert!(!status.success(), "{profile}");
            let error = report["error"].as_str().unwrap();
            assert!(
                error.contains(said)
                    && error.contains("IS_SANDBOX is \"yes\" here")
                    && error.contains("set IS_SANDBOX = \"1\""),
                "{profile}: {error}"
            );
        } else {
            assert_eq!(report["output"], "I remember: tangerine.", "{report}");
        }
    }
}

/// Issue 20: `gemini --acp` (0.61) cannot load its own sessions: `session/load` erases the
/// session it is asked to load and answers "No previous sessions found for this project"
/// (google-gemini/gemini-cli#28775, open). The bridge then starts a new session and gives it
/// the conversation's earlier turns as text, saying so: a three-turn conversation keeps its
/// context all the same.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_gemini_acp_keeps_a_conversation_through_the_bridge() {
    let Some(mut setup) = Setup::new("gemini-acp", gemini_env).await else {
        return;
    };
    let bridge = setup.start();
    let answers = setup
        .talk(&["remember: tangerine", "remember: walnut", "remember: heron"])
        .await;
    assert!(bridge.stop().success());
    assert_eq!(answers[0], "I remember: tangerine.");
    for (answer, expected) in answers[1..].iter().zip([
        "I remember: tangerine, walnut.",
        "I remember: tangerine, walnut, heron.",
    ]) {
        // Loaded (should Gemini's bug be fixed), or retold; never without the context.
        let rest = answer
            .strip_prefix(expected)
            .unwrap_or_else(|| panic!("{answer:?} does not start with {expected:?}"));
        assert!(
            rest.is_empty() || rest.contains("given the conversation's earlier turns as text"),
            "{answer:?}"
        );
    }
}

/// Issue 20, item 3, the Gemini CLI in stream mode: the answer was everything Gemini said
/// ("Running it. All done. …"); it is now what came after its last tool call. (Under
/// `read_only` the profile's `--approval-mode default` leaves the shell tool out in `-p` mode:
/// the call fails, and Gemini says so.)
#[test]
fn the_real_gemini_cli_answer_is_what_follows_its_last_tool_call() {
    let model = ModelApi::start();
    let home = tempfile::tempdir().unwrap();
    let env = gemini_env(&model, home.path());
    let (_, report) = profile_test(home.path(), "gemini", "run: echo hi", true, &env);
    let answer = report["output"].as_str().unwrap();
    assert!(
        answer.starts_with("All done. The command said:"),
        "{answer}"
    );
    let kinds: Vec<&str> = report["stream"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"tool_call"), "{kinds:?}");
}

/// Issue 20: Zed's codex-acp (0.16, its own Rust build, the same command name) through the
/// shipped codex-acp profile: a three-turn conversation keeps its context.
#[tokio::test(flavor = "multi_thread")]
async fn zeds_codex_acp_keeps_a_conversation_through_the_bridge() {
    keeps_three_turns("codex-acp", |model, home| with_zed(codex_env(model, home))).await;
}

/// Issue 20: Zed's Claude adapter (claude-code-acp 0.16) answered `session/resume` from
/// another folder with "Resource not found"; with one folder per conversation a three-turn
/// conversation keeps its context. (No profile ships for it: it is the older name of
/// claude-agent-acp; this one is what a user would write.)
#[tokio::test(flavor = "multi_thread")]
async fn zeds_claude_code_acp_keeps_a_conversation_through_the_bridge() {
    let profiles = tempfile::tempdir().unwrap();
    let path = profiles.path().join("zed-claude.toml");
    std::fs::write(
        &path,
        "name = \"zed-claude\"\nkind = \"acp\"\ncommand = \"claude-code-acp\"\n[modes]\nread_only = \"default\"\n",
    )
    .unwrap();
    keeps_three_turns(path.to_str().unwrap(), |model, home| {
        with_zed(claude_acp_env(model, home))
    })
    .await;
}

/// Issue 20: a three-turn conversation with the real Gemini CLI (0.61, stream mode) through the
/// bridge keeps its context: the shipped profile now resumes Gemini's session by id, in the
/// conversation's folder (Gemini keeps sessions per project folder).
#[tokio::test(flavor = "multi_thread")]
async fn the_real_gemini_cli_keeps_a_conversation_through_the_bridge() {
    keeps_three_turns("gemini", gemini_env).await;
}

/// Issue 20: Claude Code keeps its sessions per working folder, and every task ran in a fresh
/// folder, so `--resume` failed ("No conversation found") at the second turn and, the stale id
/// kept, at every turn after it. Now a conversation keeps its folder; and when Claude cannot
/// find its session (here: its store removed), a new one is given the conversation's earlier
/// turns as text, and the result says so.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_claude_code_keeps_a_conversation_through_the_bridge() {
    let Some(mut setup) = Setup::new("claude", claude_env).await else {
        return;
    };
    let bridge = setup.start();
    let mut answers = setup
        .talk(&["remember: tangerine", "remember: walnut", "remember: heron"])
        .await;
    // Claude's own session store is lost (a new machine, a cleaned home).
    std::fs::remove_dir_all(setup.home.path().join(".claude/projects")).unwrap();
    answers.extend(setup.talk(&["remember: quartz", "remember: ember"]).await);
    assert!(
        answers[0].starts_with("I remember: tangerine."),
        "{}",
        answers[0]
    );
    assert!(
        answers[1].starts_with("I remember: tangerine, walnut."),
        "turn 2 resumed the session: {}",
        answers[1]
    );
    assert!(
        answers[2].starts_with("I remember: tangerine, walnut, heron."),
        "{}",
        answers[2]
    );
    // The session could not be found: a new one, told the conversation so far, and the
    // result says so.
    assert!(
        answers[3].starts_with("I remember: tangerine, walnut, heron, quartz."),
        "{}",
        answers[3]
    );
    assert!(
        answers[3].contains("could not restore its own session for this conversation, so it was given the conversation's earlier turns as text"),
        "{}",
        answers[3]
    );
    assert!(
        !answers[2].contains("could not restore"),
        "said only when it happened"
    );
    // And the conversation goes on in the new session: the stale id was dropped.
    assert!(
        answers[4].starts_with("I remember: tangerine, walnut, heron, quartz, ember."),
        "{}",
        answers[4]
    );
    assert!(!answers[4].contains("could not restore"), "{}", answers[4]);
    assert!(bridge.stop().success());
}

/// Issue 20: Claude Code 2.x plans with TaskCreate/TaskUpdate; the bridge mapped only
/// TodoWrite, so no `todo` event came. Through the bridge, the real CLI's plan now streams as
/// `todo` events, in order, and the answer is Claude's final result alone.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_claude_code_plan_streams_as_todo_events() {
    let Some(mut setup) = Setup::new("claude", claude_env).await else {
        return;
    };
    let mut bridge = setup.start();
    let (task_id, r) = setup.ask("Plan", "plan: write the tests; run them").await;
    assert_eq!(r.output, "All done. The plan is finished.");
    bridge.wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
    let todos: Vec<serde_json::Value> = bridge
        .seen
        .iter()
        .filter(|e| {
            e["event"] == "task.stream" && e["taskId"] == task_id.as_str() && e["type"] == "todo"
        })
        .map(|e| e["payload"].clone())
        .collect();
    assert_eq!(todos.len(), 3, "{todos:?}");
    let last = todos.last().unwrap().to_string();
    assert!(
        last.contains("write the tests") && last.contains("completed") && last.contains("run them"),
        "{last}"
    );
    assert!(bridge.stop().success());
}

/// Issue 20, items 2 and 3, with the real claude-agent-acp (0.49): Claude's plan (TaskCreate,
/// TaskUpdate) comes as ACP plans, each sent twice, and the answer included what Claude said
/// before planning ("Planning first. All done. The plan is finished."). Now each plan is one
/// `todo` event and the answer is what came after the last step.
#[test]
fn the_real_claude_agent_acp_plan_streams_once_and_the_answer_is_the_last_word() {
    let model = ModelApi::start();
    let home = tempfile::tempdir().unwrap();
    let env = claude_acp_env(&model, home.path());
    let plan = "plan: write the tests; run them";
    let (status, report) = profile_test(home.path(), "claude-acp", plan, true, &env);
    assert!(status.success(), "{report}");
    assert_eq!(report["output"], "All done. The plan is finished.");
    let todos: Vec<&serde_json::Value> = report["stream"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "todo")
        .collect();
    assert_eq!(todos.len(), 3, "{todos:?}");
    let last = todos[2]["payload"].to_string();
    assert!(
        last.contains("write the tests") && last.contains("completed") && last.contains("run them"),
        "{last}"
    );
}

/// Issue 20: a way to see a profile's events without a mailbox. `profile test --events` runs
/// the shipped Claude profile with the real CLI and prints the ordered events and the answer.
#[test]
fn profile_test_shows_the_real_claude_codes_events_in_order() {
    let model = ModelApi::start();
    let home = tempfile::tempdir().unwrap();
    let env = claude_env(&model, home.path());
    let plan = "plan: write the tests; run them";
    let (status, report) = profile_test(home.path(), "claude", plan, true, &env);
    assert!(status.success(), "{report}");
    assert_eq!(report["output"], "All done. The plan is finished.");
    let kinds: Vec<&str> = report["stream"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    let first_todo = kinds.iter().position(|k| *k == "todo").unwrap();
    let first_delta = kinds.iter().position(|k| *k == "text.delta").unwrap();
    assert!(first_delta < first_todo, "in order: {kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "todo").count(),
        3,
        "{kinds:?}"
    );
    assert!(kinds.contains(&"tool_call"), "{kinds:?}");
    // The text table too.
    let text = std::process::Command::new(support::bin())
        .arg("--config")
        .arg(home.path().join("config.toml"))
        .args([
            "profile",
            "test",
            "claude",
            "--prompt",
            "plan: one",
            "--events",
        ])
        .envs(env)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(". text.delta") && text.contains("todo") && text.contains(". usage"),
        "{text}"
    );
}

/// Issue 30, item 7, with the real Gemini CLI (0.61): a profile that passes its own
/// `--approval-mode yolo` got the policy's `--approval-mode default` put first, and gemini
/// exited 1 "Invalid approval mode: default,yolo" (the sender read a stack frame). The
/// profile's own option now wins, with a warning at start that the policy does not hold for
/// the agent's own tools.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_gemini_cli_runs_with_a_profiles_own_approval_mode() {
    gemini_with_its_own_approval(&["--approval-mode", "yolo"]).await;
}

/// The same with gemini's other spelling of that setting, `--yolo`: beside the policy's
/// `--approval-mode default` gemini refuses the pair too, so the profile's own wins the same
/// way.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_gemini_cli_runs_with_a_profiles_own_yolo_flag() {
    gemini_with_its_own_approval(&["--yolo"]).await;
}

async fn gemini_with_its_own_approval(flags: &[&str]) {
    let shipped = std::fs::read_to_string(support::repo().join("profiles/gemini.toml")).unwrap();
    let quoted: Vec<String> = flags.iter().map(|f| format!("\"{f}\"")).collect();
    let own = shipped
        .replace("name = \"gemini\"", "name = \"my-gemini\"")
        .replace(
            "\"--skip-trust\"",
            &format!("\"--skip-trust\", {}", quoted.join(", ")),
        );
    assert_ne!(own, shipped);
    let profiles = tempfile::tempdir().unwrap();
    let path = profiles.path().join("my-gemini.toml");
    std::fs::write(&path, own).unwrap();
    let Some(mut setup) = Setup::new(path.to_str().unwrap(), gemini_env).await else {
        return;
    };
    let mut bridge = setup.start();
    let (_, r) = setup.ask("Remember", "remember: kiwi").await;
    assert_eq!(r.status, Status::Completed, "{r:?}");
    // Issue 43: the sender is told the profile's flag, not the policy, held (it was only in
    // the log).
    assert_eq!(
        r.output,
        format!(
            "I remember: kiwi.\n\n[Note from aamp-bridge: this agent's profile passes its own `{}` instead of `--approval-mode default` (permissions = \"read_only\"): what the agent's tools could do followed the profile's flag, not the sender policy.]",
            flags.join(" ")
        )
    );
    bridge.take_events();
    let log = bridge.log();
    assert!(
        log.contains(&format!("passes its own `{}`", flags.join(" ")))
            && log.contains("`--approval-mode default`"),
        "{log}"
    );
    assert!(bridge.stop().success());
}

/// Issue 30, item 6, with Zed's claude-code-acp (0.16): under `read_only` it asked to run
/// `echo hi`, the policy refused, the agent ended its turn, and the task came back
/// `completed` with "Planning first." (the chatter before the tool) as the answer. Now the
/// sender is told what was refused, with what the agent said. (`touch`: Claude Code runs the
/// commands it deems read-only, such as `echo`, without asking.)
#[tokio::test(flavor = "multi_thread")]
async fn zeds_claude_code_acp_refused_a_command_says_so() {
    let profiles = tempfile::tempdir().unwrap();
    let path = profiles.path().join("zed-claude.toml");
    std::fs::write(
        &path,
        "name = \"zed-claude\"\nkind = \"acp\"\ncommand = \"claude-code-acp\"\npermissions = \"read_only\"\n[modes]\nread_only = \"default\"\n",
    )
    .unwrap();
    let Some(mut setup) = Setup::new(path.to_str().unwrap(), |model, home| {
        with_zed(claude_acp_env(model, home))
    })
    .await
    else {
        return;
    };
    let bridge = setup.start();
    let (_, r) = setup.ask("Run it", "run: touch made-by-agent").await;
    assert!(bridge.stop().success());
    assert_eq!(
        found(setup.dir.dir.path(), "made-by-agent"),
        Vec::<std::path::PathBuf>::new()
    );
    let told = format!("{} {}", r.output, r.error.as_deref().unwrap_or_default());
    println!("the sender got: {r:?}");
    assert_ne!(r.output.trim(), "Planning first.", "{r:?}");
    assert!(
        told.contains("refused") && told.contains("touch made-by-agent"),
        "the refusal is named: {r:?}"
    );
}

/// `PATH=` with every installed agent: Qwen Code, the ACP adapters (and their Node 22), the
/// CLIs.
fn every_agent_path() -> String {
    let (_, rest) = adapters_path();
    let qwen = support::test_agents().join("qwen/node_modules/.bin");
    format!("{}:{rest}", qwen.display())
}

/// `aamp-bridge --config CONFIG ARGS…` in a clean environment (only `PATH`, `HOME` and
/// `env`: no key of the machine's leaks in), its stdout as JSON.
fn bridge_json(
    config: &std::path::Path,
    home: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> serde_json::Value {
    let out = std::process::Command::new(support::bin())
        .arg("--config")
        .arg(config)
        .args(args)
        .env_clear()
        .env("PATH", every_agent_path())
        .env("HOME", home)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: {e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Issue 32, items 1 and 2, over the real CLIs and adapters from npm: `agents` read login
/// wrong for several shapes and `doctor` did not check it at all (every installed agent OK,
/// one line a Rust `Debug` dump). Each shape below is a fresh home.
#[tokio::test(flavor = "multi_thread")]
async fn agents_and_doctor_tell_whether_each_real_agent_is_logged_in() {
    let Some(host) = mailhost() else {
        return;
    };
    let login = |list: &serde_json::Value, profile: &str| -> serde_json::Value {
        list.as_array()
            .unwrap()
            .iter()
            .find(|d| d["profile"] == profile)
            .unwrap_or_else(|| panic!("no {profile} in {list:#}"))["login"]
            .clone()
    };
    let fresh = || {
        let home = tempfile::tempdir().unwrap();
        let config = home.path().join("config.toml");
        std::fs::write(&config, "profiles_dir = \"profiles\"\n").unwrap();
        std::fs::create_dir_all(home.path().join("profiles")).unwrap();
        (home, config)
    };

    // Nothing at all: every agent is out, in the agent's own words.
    let (home, config) = fresh();
    let list = bridge_json(&config, home.path(), &["agents", "--json"], &[]);
    for profile in [
        "claude",
        "claude-acp",
        "codex",
        "codex-acp",
        "gemini",
        "gemini-acp",
    ] {
        assert_eq!(
            login(&list, profile)["loggedIn"],
            false,
            "{profile}: {list:#}"
        );
    }
    assert!(login(&list, "claude")["detail"]
        .as_str()
        .unwrap()
        .contains("Not logged in · Please run /login"));
    assert!(login(&list, "gemini")["detail"]
        .as_str()
        .unwrap()
        .contains("Please set an Auth method"));

    // OPENAI_API_KEY alone: `codex exec` never sends it (the adapters authenticate with it).
    let list = bridge_json(
        &config,
        home.path(),
        &["agents", "--json"],
        &[("OPENAI_API_KEY", "sk-test")],
    );
    let codex = login(&list, "codex");
    assert_eq!(codex["loggedIn"], false, "{codex}");
    assert!(
        codex["detail"].as_str().unwrap().contains("CODEX_API_KEY"),
        "{codex}"
    );
    assert_eq!(login(&list, "codex-acp")["loggedIn"], true);

    // Files that hold no login, and a profile whose own env points Codex elsewhere.
    let (home, config) = fresh();
    let h = home.path();
    std::fs::create_dir_all(h.join(".claude")).unwrap();
    std::fs::write(h.join(".claude/.credentials.json"), "").unwrap();
    std::fs::create_dir_all(h.join(".gemini")).unwrap();
    std::fs::write(
        h.join(".gemini/.env"),
        "# GEMINI_API_KEY=abc\nGEMINI_API_KEY=\n",
    )
    .unwrap();
    std::fs::create_dir_all(h.join(".codex")).unwrap();
    std::fs::write(
        h.join(".codex/auth.json"),
        r#"{"OPENAI_API_KEY": "sk-login"}"#,
    )
    .unwrap();
    let elsewhere = h.join("codex-elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(
        h.join("profiles/codex-elsewhere.toml"),
        format!(
            "command = \"codex\"\nargs = [\"exec\", \"--json\", \"-\"]\nstream = \"codex\"\nenv = {{ CODEX_HOME = \"{}\" }}\n",
            elsewhere.display()
        ),
    )
    .unwrap();
    let list = bridge_json(&config, h, &["agents", "--json"], &[]);
    for (profile, logged_in, why) in [
        ("claude", false, "an empty credentials file"),
        ("gemini", false, "a commented-out key"),
        ("codex", true, "~/.codex/auth.json"),
        (
            "codex-elsewhere",
            false,
            "CODEX_HOME in the profile's env: ~/.codex does not count",
        ),
    ] {
        assert_eq!(
            login(&list, profile)["loggedIn"],
            logged_in,
            "{profile}: {why}"
        );
    }

    // Vertex AI with a project and application default credentials.
    let (home, config) = fresh();
    let adc = home.path().join("adc.json");
    std::fs::write(&adc, r#"{"type": "authorized_user"}"#).unwrap();
    let list = bridge_json(
        &config,
        home.path(),
        &["agents", "--json"],
        &[
            ("GOOGLE_GENAI_USE_VERTEXAI", "true"),
            ("GOOGLE_CLOUD_PROJECT", "p"),
            ("GOOGLE_CLOUD_LOCATION", "us-central1"),
            ("GOOGLE_APPLICATION_CREDENTIALS", adc.to_str().unwrap()),
        ],
    );
    assert_eq!(login(&list, "gemini")["loggedIn"], true, "{list:#}");

    // doctor, with an agent per profile: WARN with the fix when not logged in (the ACP
    // adapters asked by opening a session), OK with keys; never a Debug dump.
    let (home, _) = fresh();
    let profiles = ["claude", "codex", "gemini", "codex-acp", "claude-acp"];
    let mut toml = support::Toml::new();
    for profile in profiles {
        let name = profile.replace('-', "_");
        let account = host.user(&name);
        toml = toml.host_mailbox(host, &name, &account, "").agent(
            &name,
            profile,
            &["boss@example.test"],
            "",
        );
    }
    let dir = ConfigDir::new(host, &toml.text());
    let config = dir.dir.path().join("config.toml");
    let doctor = |env: &[(&str, &str)]| -> Vec<serde_json::Value> {
        let checks = bridge_json(&config, home.path(), &["doctor", "--json"], env);
        profiles
            .iter()
            .map(|p| {
                let what = format!("agent {}", p.replace('-', "_"));
                checks
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["check"] == what.as_str())
                    .unwrap_or_else(|| panic!("no {what} in {checks:#}"))
                    .clone()
            })
            .collect()
    };
    // status says it too, for a stuck agent.
    let status = bridge_json(&config, home.path(), &["status", "--json"], &[]);
    let claude = status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent"] == "claude")
        .unwrap_or_else(|| panic!("{status:#}"));
    assert_eq!(claude["login"]["loggedIn"], false, "{claude}");
    let bare = doctor(&[("IS_SANDBOX", "1")]);
    for (profile, check) in profiles.iter().zip(&bare) {
        assert_eq!(check["status"], "warn", "{profile}: {check}");
        assert!(
            !check["fix"].as_str().unwrap_or_default().is_empty(),
            "{check}"
        );
        let detail = check["detail"].as_str().unwrap();
        assert!(detail.contains("not logged in"), "{profile}: {check}");
        assert!(
            !detail.contains("ProbeInfo") && !detail.contains("    at "),
            "{check}"
        );
    }
    assert!(
        bare[3]["detail"]
            .as_str()
            .unwrap()
            .contains("Authentication required"),
        "codex-acp's own words: {}",
        bare[3]
    );
    let keyed = doctor(&[
        ("IS_SANDBOX", "1"),
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
        ("CODEX_API_KEY", "sk-test"),
        ("GEMINI_API_KEY", "test-key"),
    ]);
    for (profile, check) in profiles.iter().zip(&keyed) {
        assert_eq!(check["status"], "ok", "{profile}: {check}");
    }
}

/// A profile, the variables it runs with, and words its failure must hold.
type FailureCase = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// Issue 32, item 3: each agent's failure gives its own reason, not a stack frame, a warning
/// it prints on every run, or the stream format's name (through `profile test`, which runs
/// the agent as the bridge does).
#[test]
fn each_real_agents_failure_gives_its_own_reason() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::create_dir_all(h.join("profiles")).unwrap();
    let config = h.join("config.toml");
    std::fs::write(&config, "profiles_dir = \"profiles\"\n").unwrap();
    std::fs::write(
        h.join("profiles/gemini-odd.toml"),
        "command = \"gemini\"\nargs = [\"-p\", \"\", \"--output-format\", \"stream-json\", \"--approval-mode\", \"sometimes\"]\nstdin = \"{{prompt}}\"\nstream = \"gemini\"\n",
    )
    .unwrap();
    std::fs::write(
        h.join("profiles/qwen.toml"),
        "command = \"qwen\"\nargs = [\"--output-format\", \"stream-json\"]\nstdin = \"{{prompt}}\"\nstream = \"claude\"\n",
    )
    .unwrap();
    let cases: &[FailureCase] = &[
        ("claude", &[], "Not logged in · Please run /login"),
        ("gemini", &[], "Please set an Auth method"),
        (
            "gemini-odd",
            &[("GEMINI_API_KEY", "test-key")],
            "Argument: approval-mode, Given: \"sometimes\"",
        ),
        ("codex-acp", &[], "Authentication required"),
        ("qwen", &[], "No auth type is selected"),
    ];
    for (profile, env, words) in cases {
        let report = bridge_json(
            &config,
            h,
            &["profile", "test", profile, "--prompt", "hi", "--json"],
            env,
        );
        assert_eq!(report["ok"], false, "{profile}: {report}");
        let error = report["error"].as_str().unwrap();
        assert!(error.contains(words), "{profile}: {error}");
        for noise in ["    at ", "Ripgrep", "claude ended with", ".js:"] {
            assert!(!error.contains(noise), "{profile}: {error}");
        }
    }
}

/// Issue 32, item 4, done when: Qwen Code, an agent no built-in profile names, made into a
/// profile with `profile new --env …` (its key in a 0600 env file, not the profile; its
/// resume flag found by a second smoke turn), keeps a three-turn conversation through the
/// bridge over the mail host.
#[tokio::test(flavor = "multi_thread")]
async fn a_qwen_code_profile_made_with_profile_new_keeps_a_conversation() {
    let Some(host) = mailhost() else {
        return;
    };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let model = ModelApi::start();
    let home = tempfile::tempdir().unwrap();
    let dir = ConfigDir::new(
        host,
        &support::one_agent(host, &agent, "qwen", &boss.email)
            .top("profiles_dir = \"profiles\"")
            .text(),
    );
    let config = dir.dir.path().join("config.toml");
    let base = format!("OPENAI_BASE_URL={}/v1", model.url);
    let made = bridge_json(
        &config,
        home.path(),
        &[
            "profile",
            "new",
            "qwen",
            "--command",
            "qwen",
            "--arg=--output-format",
            "--arg=stream-json",
            "--env",
            "OPENAI_API_KEY=sk-qwen-test",
            "--env",
            &base,
            "--env",
            "OPENAI_MODEL=standin",
            "--json",
        ],
        &[],
    );
    assert_eq!(made["stream"], "claude", "{made:#}");
    assert_eq!(made["test"]["ok"], true, "{made:#}");
    assert_eq!(made["resume"]["flag"], "--resume", "{made:#}");
    let profiles = dir.dir.path().join("profiles");
    let text = std::fs::read_to_string(profiles.join("qwen.toml")).unwrap();
    assert!(
        !text.contains("sk-qwen-test") && text.contains("{{resume_id}}"),
        "{text}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(profiles.join("qwen.env"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let path = every_agent_path();
    let home_str = home.path().display().to_string();
    let bridge = Bridge::start_with_env(&dir, 1, &[("PATH", &path), ("HOME", &home_str)]);
    let mut peer = Peer::new(boss).await;
    remembers_three_turns(&mut peer, &agent.email, "qwen").await;
    assert!(bridge.stop().success());
}
