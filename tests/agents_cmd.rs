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
    assert!(
        claude["warnings"][0]
            .as_str()
            .unwrap()
            .contains("needs Node.js 22 or newer; found v20.20.2"),
        "{claude}"
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
