//! `aamp-bridge agents`: finds launch binaries, reads versions, warns about old Node.js,
//! shows what the config uses, and probes ACP agents.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::Value;

fn fake_bin(dir: &Path, name: &str, version: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\necho '{version}'\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn agents_lists_what_is_installed_and_what_is_missing() {
    let home = tempfile::tempdir().unwrap();
    let bin = home.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    fake_bin(&bin, "claude-agent-acp", "0.49.0");
    fake_bin(&bin, "qwen", "0.24.4");
    fake_bin(&bin, "node", "v20.20.2");
    // A user install that is not on PATH, where the scan also looks.
    let local = home.path().join(".local/bin");
    std::fs::create_dir_all(&local).unwrap();
    fake_bin(&local, "codex", "codex-cli 0.171.0");

    // A config whose agent uses the codex profile, and a profile folder with an ACP agent.
    let profiles = home.path().join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/acp_agent.py");
    let script = home.path().join("script.json");
    std::fs::write(&script, r#"{"steps": []}"#).unwrap();
    std::fs::write(
        profiles.join("mine.toml"),
        format!("description = \"my ACP agent\"\nkind = \"acp\"\ncommand = \"python3\"\nargs = [{:?}]\nenv = {{ ACP_TEST_SCRIPT = {:?} }}\n", agent.display(), script.display()),
    )
    .unwrap();
    std::fs::write(home.path().join("pw"), "x").unwrap();
    std::fs::set_permissions(
        home.path().join("pw"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let config = home.path().join("config.toml");
    std::fs::write(
        &config,
        "profiles_dir = \"profiles\"\n[mailboxes.m]\nemail = \"a@x.test\"\njmap_url = \"https://x.test\"\npassword_file = \"pw\"\nsmtp_host = \"x.test\"\n[[agents]]\nname = \"coder\"\nmailbox = \"m\"\nprofile = \"codex\"\nallow_from = [\"@x.test\"]\n",
    )
    .unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aamp-bridge"))
        .args([
            "--config",
            config.to_str().unwrap(),
            "agents",
            "--json",
            "--probe",
        ])
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("HOME", home.path())
        .env_remove("NPM_CONFIG_PREFIX")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let get = |name: &str| {
        list.iter()
            .find(|d| d["profile"] == name)
            .unwrap_or_else(|| panic!("no {name} in {list:#?}"))
            .clone()
    };

    let claude = get("claude-acp");
    assert_eq!(
        claude["path"],
        bin.join("claude-agent-acp").to_str().unwrap()
    );
    assert_eq!(claude["version"], "0.49.0");
    // Issue 43: claude-agent-acp 0.49 declares no engines (its SDK: node >= 18) and runs on
    // Node 20; Qwen Code's package says node >= 22.
    assert!(
        !claude["warnings"].to_string().contains("Node.js"),
        "{claude}"
    );
    let qwen = get("qwen-acp");
    assert!(
        qwen["warnings"][0]
            .as_str()
            .unwrap()
            .contains("needs Node.js 22 or newer; found v20.20.2"),
        "{qwen}"
    );
    assert!(
        claude["probe"]["Err"].is_string(),
        "a fake binary fails the ACP probe: {claude}"
    );

    let codex = get("codex");
    assert_eq!(
        codex["path"],
        local.join("codex").to_str().unwrap(),
        "found in ~/.local/bin"
    );
    assert_eq!(codex["configured"], serde_json::json!(["coder"]));

    let gemini = get("gemini");
    assert!(gemini["path"].is_null());
    assert!(gemini["install"]
        .as_str()
        .unwrap()
        .contains("@google/gemini-cli"));

    let mine = get("mine");
    assert_eq!(mine["kind"], "acp");
    assert_eq!(
        mine["probe"]["Ok"]["agent"], "acp-test-agent 1.0.0",
        "{mine}"
    );
}

/// Issue 20: the Claude and Zed adapters print nothing for `--version` and exit at once, yet
/// the scan warned "gave no answer within 5s"; `~/.claude.json` (written by any run) counted as
/// a login; `$CODEX_HOME/auth.json`, `CODEX_API_KEY`, `~/.gemini/.env` and a key in the
/// profile's `env` were missed; the text table did not show the login at all.
#[test]
fn agents_tells_each_login_shape() {
    let home = tempfile::tempdir().unwrap();
    let bin = home.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let silent = bin.join("claude-agent-acp");
    std::fs::write(&silent, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&silent, std::fs::Permissions::from_mode(0o755)).unwrap();
    fake_bin(&bin, "codex", "codex-cli 0.171.0");
    fake_bin(&bin, "gemini", "0.61.0");
    fake_bin(&bin, "claude", "2.1.197 (Claude Code)");
    // Any run of Claude Code writes this, with or without a login.
    std::fs::write(
        home.path().join(".claude.json"),
        r#"{"numStartups": 1, "projects": {}}"#,
    )
    .unwrap();
    std::fs::create_dir_all(home.path().join(".gemini")).unwrap();
    std::fs::write(home.path().join(".gemini/.env"), "GEMINI_API_KEY=abc\n").unwrap();
    let codex_home = home.path().join("codex-home");
    std::fs::create_dir_all(&codex_home).unwrap();
    std::fs::write(
        codex_home.join("auth.json"),
        r#"{"OPENAI_API_KEY": "sk-from-codex-login"}"#,
    )
    .unwrap();
    // A profile with the key in its env.
    let profiles = home.path().join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(
        profiles.join("keyed-claude.toml"),
        "command = \"claude\"\nargs = [\"-p\"]\nenv = { ANTHROPIC_API_KEY = \"sk-x\" }\n",
    )
    .unwrap();
    let config = home.path().join("config.toml");
    std::fs::write(&config, "profiles_dir = \"profiles\"\n").unwrap();

    let run = |json: bool| {
        let mut args = vec!["--config", config.to_str().unwrap(), "agents"];
        if json {
            args.push("--json");
        }
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_aamp-bridge"));
        cmd.args(args)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("HOME", home.path())
            .env("CODEX_HOME", &codex_home)
            .env_remove("NPM_CONFIG_PREFIX");
        for var in [
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "CLAUDE_CODE_OAUTH_TOKEN",
            "CODEX_API_KEY",
            "OPENAI_API_KEY",
            "GEMINI_API_KEY",
            "GOOGLE_API_KEY",
        ] {
            cmd.env_remove(var);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let list: Vec<Value> = serde_json::from_str(&run(true)).unwrap();
    let get = |name: &str| {
        list.iter()
            .find(|d| d["profile"] == name)
            .unwrap_or_else(|| panic!("no {name} in {list:#?}"))
            .clone()
    };
    let adapter = get("claude-acp");
    assert!(adapter["version"].is_null());
    assert!(
        !adapter.to_string().contains("no answer within"),
        "a silent --version is not a hang: {adapter}"
    );
    let login = &adapter["login"];
    assert_eq!(login["loggedIn"], false, "{login}");
    assert!(
        login["fix"].as_str().unwrap().contains("claude auth login"),
        "~/.claude.json alone is no login, and the adapter has no login of its own: {login}"
    );
    let codex_home_auth = "~/codex-home/auth.json";
    assert_eq!(get("codex")["login"]["detail"], codex_home_auth);
    assert_eq!(
        get("gemini")["login"]["detail"],
        "API key GEMINI_API_KEY in a .env file"
    );
    assert_eq!(
        get("keyed-claude")["login"]["detail"],
        "API key in $ANTHROPIC_API_KEY"
    );
    let text = run(false);
    assert!(
        text.lines()
            .any(|l| l.starts_with("codex ")
                && l.contains(&format!("logged in ({codex_home_auth})"))),
        "{text}"
    );
}
