//! The way in: the `init` wizard driven in tmux as a person would, its non-interactive form,
//! `import` of the reference bridges' files, and the profile-maker. Real mail host, real AAMP
//! test service (registration), real bridge answering the task at the end.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use aamp_bridge::protocol::Intent;
use support::{mailhost, wait_until, AampHost, Bridge, ConfigDir, Peer};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A tmux server of its own (its own socket), with one window running a command.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(command: &str, env: &[(&str, &str)]) -> Tmux {
        let socket = format!("aamp-wizard-{}", uuid::Uuid::new_v4());
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &socket, "new-session", "-d", "-x", "160", "-y", "80"]);
        for (k, v) in env {
            cmd.args(["-e", &format!("{k}={v}")]);
        }
        cmd.arg(format!("{command}; echo EXIT=$?; sleep 300"));
        let out = cmd
            .output()
            .expect("tmux runs (scripts/test.sh installs it)");
        assert!(
            out.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmux { socket }
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p", "-J"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen shows `text` (a question's words, say).
    fn expect(&self, text: &str) {
        wait_until(&format!("the screen shows {text:?}"), || {
            self.screen().contains(text)
        });
    }

    fn keys(&self, keys: &[&str]) {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "send-keys"])
            .args(keys)
            .output()
            .unwrap();
        assert!(out.status.success());
    }

    /// Answers the question that shows `question` with `keys`, once it is asked.
    fn answer(&self, question: &str, keys: &[&str]) {
        self.expect(&format!("? {question}"));
        self.keys(keys);
        // The question is answered when its line turns from "? " to "> ".
        self.expect(&format!("> {question}"));
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

fn registered_email(dir: &Path, name: &str) -> String {
    let creds: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap())
            .unwrap();
    creds["email"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_wizard_in_a_terminal_sets_up_an_agent_that_answers_mail() {
    let Some(host) = mailhost() else { return };
    let service = AampHost::start();
    let boss = host.user("boss");
    // An existing config: init edits it (its state_dir stays).
    let dir = ConfigDir::new(host, "");
    let home = dir.dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = dir.config();
    let tmux = Tmux::start(
        &format!("{} --config {} init", support::bin(), config.display()),
        &[
            ("HOME", home.to_str().unwrap()),
            ("PATH", "/usr/bin:/bin"),
            ("TERM", "xterm-256color"),
        ],
    );
    tmux.answer("AAMP service URL:", &[&service.url, "Enter"]);
    // The probe says what the service offers.
    tmux.expect("live task streams, mailbox registration");
    tmux.expect("echo ");
    // Issue 33: Enter alone picks the first installed agent (it used to pick nothing and end
    // the wizard, "No agent picked: nothing to do").
    tmux.answer("Which agents should answer mail?", &["Enter"]);
    // Issue 43: an offered answer is editable text, and Ctrl-U/Ctrl-W edit it (they typed
    // "u" and "w"): Ctrl-W takes back a word typed after it, Ctrl-U the whole line.
    let line_is = |want: &str| {
        wait_until(&format!("a line reads {want:?}"), || {
            tmux.screen().lines().any(|l| l.trim_end() == want)
        })
    };
    line_is("? Agent name: echo");
    tmux.keys(&[" extra"]);
    line_is("? Agent name: echo extra");
    tmux.keys(&["C-w"]);
    line_is("? Agent name: echo");
    tmux.keys(&["C-u"]);
    line_is("? Agent name:");
    tmux.answer("Agent name:", &["helper", "Enter"]);
    line_is("> Agent name: helper");
    tmux.answer("Its mailbox:", &["Enter"]); // register with the service
    tmux.answer("Address prefix to ask for:", &["Enter"]);
    tmux.answer("SMTP submission server:", &["C-u", "127.0.0.1", "Enter"]);
    tmux.answer("SMTP security:", &["Down", "Down", "Enter"]); // plain: loopback
    tmux.answer("SMTP port:", &["C-u", &host.smtp_port.to_string(), "Enter"]);
    tmux.answer("Who may send it tasks?", &["Enter"]); // an allow list
    tmux.answer("Addresses", &[&boss.email, "Enter"]);
    tmux.answer(
        "One line about what it does",
        &["C-u", "Echoes your task", "Enter"],
    );
    // Issue 33: a mailbox of one's own to send tasks from, registered like the agent's.
    tmux.answer("A mailbox of your own", &["Enter"]); // register one
    tmux.answer("Address prefix to ask for:", &["Enter"]);
    tmux.answer("SMTP submission server:", &["C-u", "127.0.0.1", "Enter"]);
    tmux.answer("SMTP security:", &["Down", "Down", "Enter"]);
    tmux.answer("SMTP port:", &["C-u", &host.smtp_port.to_string(), "Enter"]);
    tmux.expect("Summary:");
    tmux.expect("you (me) on a new mailbox from the AAMP service");
    tmux.answer("Write the config?", &["Enter"]);
    tmux.expect("EXIT=");
    let screen = tmux.screen();
    assert!(screen.contains("EXIT=0"), "{screen}");
    assert!(screen.contains("answers JMAP and SMTP"), "{screen}");

    let email = registered_email(dir.dir.path(), "helper");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("state_dir = \"state\""), "kept: {text}");
    assert!(
        text.contains(&format!("allow_from = [\"{}\", \"me-", boss.email)),
        "{text}"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.dir.path().join("helper.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The bridge runs what the wizard wrote and answers a task from the allowed sender.
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;
    let task = peer
        .send(peer.dispatch_to(&email, "Hello", "ping from the boss"))
        .await;
    let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
    assert!(
        format!("{:?}", result.message).contains("ping from the boss"),
        "{:?}",
        result.message
    );
    bridge.wait_event("task.completed", |_| true);
    // The person's own mailbox sends a task and gets the answer, allowed by init.
    let me = registered_email(dir.dir.path(), "me");
    assert!(text.contains(&me), "me may send tasks: {text}");
    let sent = Command::new(support::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "dispatch",
            "--from",
            "me",
            "--to",
        ])
        .arg(&email)
        .args(["--timeout", "60", "sent from my own mailbox"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&sent.stdout);
    assert!(
        sent.status.success() && said.contains("sent from my own mailbox"),
        "{said}{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(bridge.stop().success());
}

/// Issue 33: a mailbox that fails its test is asked again at once, each question offering
/// what was given; a self-signed server can be trusted from there (insecure_tls), and nothing
/// that only an AAMP service has (directory card, pairing, a one-way menu) is asked without one.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_mailbox_is_asked_again_without_losing_answers() {
    let Some(host) = mailhost() else { return };
    let agent = host.user("fixed");
    let boss = host.user("boss");
    let dir = ConfigDir::new(host, "");
    let home = dir.dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = dir.config();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nothing_there = format!(
        "http://127.0.0.1:{}/.well-known/jmap",
        closed.local_addr().unwrap().port()
    );
    drop(closed);
    let tmux = Tmux::start(
        &format!("{} --config {} init", support::bin(), config.display()),
        &[
            ("HOME", home.to_str().unwrap()),
            ("PATH", "/usr/bin:/bin"),
            ("TERM", "xterm-256color"),
        ],
    );
    tmux.answer("AAMP service URL:", &["Enter"]); // none: a plain mail account
    tmux.answer("Which agents should answer mail?", &["Enter"]);
    tmux.answer("Agent name:", &["C-u", "mine", "Enter"]);
    tmux.expect("Its mailbox: use an existing mail account");
    tmux.answer("Email address:", &[&agent.email, "Enter"]);
    tmux.answer("Password:", &[&host.password, "Enter"]);
    tmux.answer("JMAP session URL:", &["C-u", &nothing_there, "Enter"]);
    tmux.answer("SMTP submission server:", &["C-u", "127.0.0.1", "Enter"]);
    tmux.answer("SMTP security:", &["Enter"]); // starttls
    tmux.answer(
        "SMTP port:",
        &["C-u", &host.smtp_tls_port.to_string(), "Enter"],
    );
    // The test runs now, and says why in plain words.
    tmux.expect("nothing listens there");
    tmux.expect("fix: check the port in jmap_url");
    let screen = tmux.screen();
    assert!(!screen.contains("Trust this server"), "{screen}");
    tmux.answer("The mailbox does not work yet:", &["Enter"]); // change the answers
                                                               // Each question offers what was given: Enter keeps it.
    tmux.expect(&format!("? Email address: {}", agent.email));
    tmux.answer("Email address:", &["Enter"]);
    tmux.answer("Password:", &["Enter"]); // keeps the one given
    tmux.answer("JMAP session URL:", &["C-u", &host.jmap_url, "Enter"]);
    tmux.expect("? SMTP submission server: 127.0.0.1");
    tmux.answer("SMTP submission server:", &["Enter"]);
    tmux.answer("SMTP security:", &["Enter"]);
    tmux.expect(&format!("? SMTP port: {}", host.smtp_tls_port));
    tmux.answer("SMTP port:", &["Enter"]);
    // JMAP works now; the STARTTLS port has a self-signed certificate.
    tmux.expect("its TLS certificate is self-signed");
    tmux.expect("Trust this server's certificate");
    tmux.answer("The mailbox does not work yet:", &["Down", "Enter"]);
    tmux.expect("answers JMAP and SMTP");
    // No pairing without an AAMP service: the allow list is first, then "Later".
    tmux.expect("? Who may send it tasks?");
    let screen = tmux.screen();
    assert!(!screen.contains("Pair now"), "{screen}");
    tmux.answer("Who may send it tasks?", &["Enter"]);
    tmux.answer("Addresses", &[&boss.email, "Enter"]);
    tmux.answer("A mailbox of your own", &["Down", "Enter"]); // no
    tmux.expect("Summary:");
    tmux.expect(&format!(
        "SMTP 127.0.0.1:{} starttls, certificates not verified",
        host.smtp_tls_port
    ));
    tmux.answer("Write the config?", &["Enter"]);
    tmux.expect("EXIT=");
    let screen = tmux.screen();
    assert!(screen.contains("EXIT=0"), "{screen}");
    assert!(!screen.contains("One line about what it does"), "{screen}");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("insecure_tls = true"), "{text}");
    assert!(text.contains(&host.jmap_url), "{text}");
    assert!(!text.contains("summary"), "{text}");

    // The bridge answers over that STARTTLS port with its certificate trusted as it is.
    let bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Hello", "ping over starttls"))
        .await;
    let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
    assert!(
        format!("{:?}", result.message).contains("ping over starttls"),
        "{:?}",
        result.message
    );
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn init_from_answers_tests_the_account_first_and_is_idempotent() {
    let Some(host) = mailhost() else { return };
    let service = AampHost::start();
    let (agent, boss) = (host.user("acct"), host.user("boss"));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cfg/config.toml");
    let answers = |password: &str| {
        serde_json::json!({
            "aamp_url": service.url, "state_dir": "state",
            "agents": [
                {"name": "mine", "profile": "echo", "allow_from": [boss.email],
                 "mailbox": {"kind": "existing", "email": agent.email, "password": password,
                             "jmap_url": host.jmap_url, "smtp_host": "127.0.0.1",
                             "smtp_port": host.smtp_port, "smtp_security": "plain"}},
                {"name": "paired", "profile": "echo", "pair": true,
                 "mailbox": {"kind": "register", "smtp_host": "127.0.0.1",
                             "smtp_port": host.smtp_port, "smtp_security": "plain"}}
            ]
        })
        .to_string()
    };
    let init = |answers: String| {
        let file = dir.path().join("answers.json");
        std::fs::write(&file, answers).unwrap();
        Command::new(support::bin())
            .args([
                "--config",
                config.to_str().unwrap(),
                "init",
                "--non-interactive",
                "--answers",
            ])
            .arg(&file)
            .arg("--json")
            .output()
            .unwrap()
    };
    // A wrong password: said, and no config written.
    let out = init(answers("not-the-password"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("JMAP login") && err.contains("password"),
        "{err}"
    );
    assert!(
        !config.exists(),
        "nothing is written for a mailbox that fails its test"
    );

    let out = init(answers(&host.password));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(first["written"], true);
    assert_eq!(first["agents"][0]["how"], "account");
    assert_eq!(first["agents"][1]["how"], "registered");
    let code = first["agents"][1]["pairing"]["code"]
        .as_str()
        .unwrap()
        .to_string();
    let text = std::fs::read_to_string(&config).unwrap();
    // The password is in a 0600 file, never in the config.
    assert!(!text.contains(&host.password), "{text}");
    assert!(text.contains("password_file = \"mine.password\""), "{text}");
    aamp_bridge::config::LoadedConfig::load(&config).expect("it loads");

    // Again: nothing changes, no second registration, the same pairing code.
    let out = init(answers(&host.password));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(second["written"], false);
    assert_eq!(second["agents"][1]["how"], "reused");
    assert_eq!(second["agents"][1]["pairing"]["code"], code.as_str());
    assert_eq!(std::fs::read_to_string(&config).unwrap(), text);
    let registrations = service
        .actions()
        .iter()
        .filter(|a| a["action"] == "aamp.mailbox.register")
        .count();
    assert_eq!(registrations, 1);

    // TOML answers from stdin work too, and leave the earlier agents alone.
    let mut child = Command::new(support::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "init",
            "--non-interactive",
            "--answers",
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "[[agents]]\nname = \"mine\"\nprofile = \"echo\"\nallow_from = [\"@example.test\"]\nmailbox = {{ kind = \"keep\" }}").unwrap();
    }
    assert!(child.wait_with_output().unwrap().status.success());
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("allow_from = [\"@example.test\"]"), "{text}");
    assert!(text.contains("name = \"paired\""), "{text}");
}

#[test]
fn start_without_a_config_says_to_run_init() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(support::bin())
        .args([
            "--config",
            dir.path().join("none.toml").to_str().unwrap(),
            "start",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("aamp-bridge init"), "{err}");
}

/// The reference bridges' files, in the shapes their docs and schemas give.
fn reference_tree(root: &Path) {
    let write = |rel: &str, text: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "acp-bridge/config.json",
        r##"{"aampHost": "https://meshmail.example", "rejectUnauthorized": false,
            "agents": [
              {"name": "claude", "acpCommand": "claude-code-acp", "slug": "claude-bridge",
               "summary": "Claude via ACP", "cardText": "# Claude",
               "senderPolicies": [{"sender": "boss@corp.example"},
                                  {"sender": "*@ci.example", "dispatchContextRules": {"project_key": ["alpha", "beta"]}}],
               "taskDispatchConcurrency": 3},
              {"name": "custom", "acpCommand": "my-acp-agent --stdio", "senderWhitelist": ["ops@corp.example"]}
            ]}"##,
    );
    write(
        "acp-bridge/credentials/claude.json",
        r#"{"email": "claude-bridge-x1@meshmail.example", "mailboxToken": "dG9rZW4=", "smtpPassword": "s3cret"}"#,
    );
    write(
        "acp-bridge/sender-policies/claude.json",
        r#"[{"sender": "paired@phone.example", "dispatchContextRules": {}, "pairedAt": "2026-01-01T00:00:00Z"}]"#,
    );
    let future = aamp_bridge::protocol::time::format_utc(
        std::time::SystemTime::now() + std::time::Duration::from_secs(200),
    );
    write(
        "acp-bridge/pairing/claude.json",
        &format!(
            r#"{{"mailbox": "claude-bridge-x1@meshmail.example", "pairCode": "AbCdEfGh", "expiresAt": "{future}", "connectUrl": "aamp://connect?x"}}"#
        ),
    );
    write(
        "cli-bridge/config.json",
        r#"{"aampHost": "https://meshmail.example", "rejectUnauthorized": true,
            "profiles": {"mytool": {"command": "mytool", "args": ["--ask", "{{prompt}}", "--session", "{{sessionKey}}"],
                                    "timeoutMs": 90000, "stream": {"format": "ndjson"}}},
            "agents": [
              {"name": "codex", "cliProfile": "codex", "senderPolicies": [{"sender": "@corp.example"}]},
              {"name": "tool", "cliProfile": "mytool"},
              {"name": "coco", "cliProfile": "coco"}
            ]}"#,
    );
}

#[test]
fn import_carries_over_the_reference_bridges_files() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("dot-aamp");
    reference_tree(&from);
    let config = dir.path().join("cfg/config.toml");
    // An existing config: import adds to it.
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, "state_dir = \"state\"\n").unwrap();
    let run = |extra: &[&str]| {
        Command::new(support::bin())
            .args(["--config", config.to_str().unwrap(), "import", "--from"])
            .arg(&from)
            .args(extra)
            .env("HOME", dir.path())
            .output()
            .unwrap()
    };
    // A dry run prints and writes nothing.
    let out = run(&["--dry-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("[mailboxes.claude]"), "{shown}");
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "state_dir = \"state\"\n"
    );

    let out = run(&["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("TLS certificates were not checked there"),
        "{notes}"
    );
    assert!(
        notes.contains("registers a new mailbox"),
        "the agents without credentials: {notes}"
    );

    let loaded =
        aamp_bridge::config::LoadedConfig::load(&config).expect("the imported config loads");
    let agent = |n: &str| {
        loaded
            .config
            .agents
            .iter()
            .find(|a| a.name == n)
            .unwrap()
            .clone()
    };
    let claude = agent("claude");
    assert_eq!(
        claude.profile, "claude-acp",
        "claude-code-acp is the built-in ACP profile"
    );
    assert!(claude.allow_from.contains(&"boss@corp.example".to_string()));
    assert!(
        claude
            .allow_from
            .contains(&"paired@phone.example".to_string()),
        "paired senders come too"
    );
    assert_eq!(claude.senders[0].sender, "*@ci.example");
    assert_eq!(
        claude.senders[0].context["project_key"],
        vec!["alpha", "beta"]
    );
    assert_eq!(claude.max_concurrent_tasks, 3);
    assert_eq!(claude.summary.as_deref(), Some("Claude via ACP"));
    // Credentials are copied, private, and the mailbox uses them; TLS stays verified.
    let account = loaded.account("claude").unwrap();
    assert_eq!(account.email, "claude-bridge-x1@meshmail.example");
    assert_eq!(account.password.value(), "s3cret");
    assert_eq!(account.smtp_host, "meshmail.example");
    assert!(!account.insecure_tls);
    assert_eq!(agent("custom").allow_from, vec!["ops@corp.example"]);
    assert_eq!(agent("codex").profile, "codex");
    assert_eq!(agent("codex").allow_from, vec!["@corp.example"]);
    // Their profiles become ours, with our placeholders.
    let tool =
        aamp_bridge::runner::Profile::find(&agent("tool").profile, &loaded.profile_dirs()).unwrap();
    let mytool =
        std::fs::read_to_string(config.parent().unwrap().join("profiles/mytool.toml")).unwrap();
    assert!(
        mytool.contains("{{session_key}}") && mytool.contains("stream = \"ndjson\""),
        "{mytool}"
    );
    assert_eq!(tool.timeout, std::time::Duration::from_secs(90));
    let custom =
        aamp_bridge::runner::Profile::find(&agent("custom").profile, &loaded.profile_dirs())
            .unwrap();
    assert_eq!(custom.kind, aamp_bridge::runner::profile::ProfileKind::Acp);
    aamp_bridge::runner::Profile::find(&agent("coco").profile, &loaded.profile_dirs()).unwrap();
    // The live pairing code still works here.
    let journal = aamp_bridge::dispatch::Journal::open(&loaded.state().journal()).unwrap();
    let live = journal
        .fresh_pair_code("claude", std::time::Duration::ZERO)
        .unwrap();
    assert_eq!(live.map(|(c, _)| c).as_deref(), Some("AbCdEfGh"));
}

#[test]
fn profile_new_finds_the_stream_format_and_smoke_tests_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "profiles_dir = \"profiles\"\n").unwrap();
    let cli = repo().join("tests/agents/scripted_cli.py");
    let make = |name: &str, fixture: &str| {
        Command::new(support::bin())
            .args([
                "--config",
                config.to_str().unwrap(),
                "profile",
                "new",
                name,
                "--command",
                "python3",
            ])
            .arg("--arg")
            .arg(&cli)
            .arg("--arg")
            .arg(repo().join("tests/fixtures/streams").join(fixture))
            .arg("--json")
            .output()
            .unwrap()
    };
    for (name, fixture, format) in [
        ("fake-claude", "claude-partial.jsonl", "claude"),
        ("fake-codex", "codex.jsonl", "codex"),
        ("fake-gemini", "gemini.jsonl", "gemini"),
        ("fake-sse", "generic.sse", "sse"),
    ] {
        let out = make(name, fixture);
        assert!(
            out.status.success(),
            "{name}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["stream"], format, "{report}");
        assert_eq!(report["test"]["ok"], true, "{report}");
        assert!(dir.path().join(format!("profiles/{name}.toml")).exists());
    }
    // Listed, shown, tested again; a second `new` of the same name is refused.
    let out = Command::new(support::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "profile",
            "list",
            "--json",
        ])
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(list
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "fake-codex"));
    let out = Command::new(support::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "profile",
            "show",
            "fake-codex",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("stream = \"codex\""));
    let out = Command::new(support::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "profile",
            "test",
            "fake-codex",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = make("fake-codex", "codex.jsonl");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    // A command that fails its smoke test says so.
    let out = Command::new(support::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "profile",
            "new",
            "broken",
            "--command",
            "false",
            "--stream",
            "none",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["test"]["ok"], false, "{report}");
}

/// Issue 43: `profile new` tried each resume flag with the profile's whole timeout (1800 s),
/// silently, and once left the agent running. Each try now has a limit, says what it tries,
/// and a try past its limit is stopped with its whole process group (the fake's `sleep`
/// child included).
#[test]
fn profile_new_stops_a_resume_try_that_hangs_with_its_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "profiles_dir = \"profiles\"\n").unwrap();
    let pids = dir.path().join("pids");
    let started = std::time::Instant::now();
    let out = Command::new(support::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "profile",
            "new",
            "hangs",
            "--command",
            "python3",
            "--resume-try-secs",
            // Each try's Python must start and write its pids within it: 1 s was not enough
            // at a load of 30 (the pids file was never written).
            "3",
        ])
        .arg("--arg")
        .arg(repo().join("tests/agents/scripted_cli.py"))
        .arg("--arg")
        .arg(repo().join("tests/fixtures/streams/codex.jsonl"))
        .arg("--arg=--hang-if-resumed")
        .arg("--arg")
        .arg(&pids)
        .arg("--json")
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(took < std::time::Duration::from_secs(45), "took {took:?}");
    for flag in ["--resume", "--session", "--session-id", "-r"] {
        assert!(
            stderr.contains(&format!(
                "resume check: trying `{flag} <session>` (up to 3 s)"
            )),
            "{stderr}"
        );
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["resume"]["flag"].is_null(), "{report}");
    assert!(
        report["resume"]["tried"]
            .to_string()
            .contains("no answer within 3 s"),
        "{report}"
    );
    // Every try's agent and its child are gone (dead, or a zombie about to be reaped).
    let text = std::fs::read_to_string(&pids).unwrap();
    let all: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(all.len(), 8, "{text}");
    let alive = |pid: &i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
    };
    support::wait_until("the tries' processes are gone", || !all.iter().any(alive));
}
