//! The tests of `runner::profile` (kept apart so profile.rs stays under 800 lines).
use super::*;

/// Issue 18: a profile passing the prompt as an argument shows it to every local user.
#[test]
fn a_prompt_in_the_arguments_is_warned_about() {
    let arg = Profile::parse(
        "command = \"tool\"\nargs = [\"--ask\", \"{{prompt}}\"]\n",
        "tool",
        "test",
    )
    .unwrap();
    assert!(arg.warnings()[0].contains("ps"), "{:?}", arg.warnings());
    let stdin = Profile::parse(
        "command = \"tool\"\nstdin = \"{{prompt}}\"\n",
        "tool",
        "test",
    )
    .unwrap();
    assert!(stdin.warnings().is_empty());
    for name in ["claude", "codex", "gemini", "echo"] {
        let p = Profile::find(name, &[]).unwrap();
        assert!(p.warnings().is_empty(), "{name}: {:?}", p.warnings());
    }
}

/// Issue 30, item 7: a gemini profile passing its own `--approval-mode yolo` got the
/// policy's `--approval-mode default` put first, and gemini exited "Invalid approval mode:
/// default,yolo". The profile's own option wins (with a warning when it differs); the
/// policy's other options stay; Codex's `-c` overrides count by key.
#[test]
fn the_policy_args_give_way_to_the_profiles_own_option() {
    let words = |p: &Profile, resuming| -> Vec<String> {
        p.args_for(resuming)
            .iter()
            .map(Template::literal_text)
            .collect()
    };
    let gemini = Profile::parse(
        "command = \"gemini\"\nargs = [\"-p\", \"\", \"--approval-mode=yolo\"]\nargs_when_resuming = [\"--resume\", \"x\"]\n[permission_args]\nread_only = [\"--approval-mode\", \"default\", \"--sandbox\"]\n",
        "my-gemini",
        "test",
    )
    .unwrap();
    assert_eq!(
        words(&gemini, false),
        ["--sandbox", "-p", "", "--approval-mode=yolo"]
    );
    assert_eq!(
        words(&gemini, true),
        ["--approval-mode", "default", "--sandbox", "--resume", "x"]
    );
    // Issue 43: said for the run too (the task's timeline and its answer).
    assert_eq!(
        gemini.policy_overrides(false),
        vec!["`--approval-mode=yolo` instead of `--approval-mode default` (permissions = \"read_only\")".to_string()]
    );
    let warnings = gemini.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("`--approval-mode=yolo`")
            && warnings[0].contains("`--approval-mode default`")
            && warnings[0].contains("read_only"),
        "{warnings:?}"
    );
    let codex = Profile::parse(
        "command = \"codex\"\nargs = [\"-c\", \"model=x\", \"exec\"]\n[permission_args]\nread_only = [\"-c\", \"sandbox_mode=\\\"read-only\\\"\"]\n",
        "my-codex",
        "test",
    )
    .unwrap();
    assert_eq!(
        words(&codex, false),
        ["-c", "sandbox_mode=\"read-only\"", "-c", "model=x", "exec"]
    );
    assert!(codex.warnings().is_empty());
    let own_sandbox = Profile::parse(
        "command = \"codex\"\nargs = [\"-c\", \"sandbox_mode=danger-full-access\", \"exec\"]\n[permission_args]\nread_only = [\"-c\", \"sandbox_mode=\\\"read-only\\\"\"]\n",
        "my-codex",
        "test",
    )
    .unwrap();
    assert_eq!(
        words(&own_sandbox, false),
        ["-c", "sandbox_mode=danger-full-access", "exec"]
    );
    assert_eq!(own_sandbox.warnings().len(), 1);
    // Another spelling of the same setting is the same option: gemini refuses
    // `--yolo` beside `--approval-mode`, and Codex's `--full-auto` or `-s` beside the
    // policy's `-c sandbox_mode` won over it without a word.
    for (command, own, policy) in [
        ("gemini", "\"--yolo\"", "\"--approval-mode\", \"default\""),
        ("gemini", "\"-y\"", "\"--approval-mode\", \"default\""),
        (
            "codex",
            "\"--full-auto\"",
            "\"-c\", \"sandbox_mode=\\\"read-only\\\"\"",
        ),
        (
            "codex",
            "\"-s\", \"danger-full-access\"",
            "\"-c\", \"sandbox_mode=\\\"read-only\\\"\"",
        ),
        (
            "codex",
            "\"--config\", \"sandbox_mode=x\"",
            "\"-c\", \"sandbox_mode=\\\"read-only\\\"\"",
        ),
        (
            "claude",
            "\"--dangerously-skip-permissions\"",
            "\"--permission-mode\", \"default\"",
        ),
    ] {
        let p = Profile::parse(
            &format!("command = \"{command}\"\nargs = [{own}, \"-\"]\n[permission_args]\nread_only = [{policy}]\n"),
            "mine",
            "test",
        )
        .unwrap();
        let args = words(&p, false);
        assert_eq!(args.last().map(String::as_str), Some("-"), "{args:?}");
        assert_eq!(
            args.len(),
            own.split(", ").count() + 1,
            "{command} {own}: {args:?}"
        );
        assert_eq!(p.warnings().len(), 1, "{command} {own}: {:?}", p.warnings());
    }
    // The shipped profiles pass none of their policy's options themselves.
    for name in ["claude", "codex", "gemini"] {
        let p = Profile::find(name, &[]).unwrap();
        let policy = p.permission_args[&p.permissions].len();
        assert_eq!(p.args_for(false).len(), policy + p.args.len(), "{name}");
    }
}

fn vars(session: &str) -> template::Vars {
    let mut v = template::Vars::default();
    v.set("prompt", "do it");
    v.set("session_key", session);
    v
}

fn args(list: &[&str]) -> Vec<Template> {
    list.iter().map(|a| Template::parse(a).unwrap()).collect()
}

#[test]
fn empty_options_are_dropped_with_their_flag() {
    let a = args(&[
        "-p",
        "--resume",
        "{{session_key}}",
        "--session={{session_key}}",
        "--verbose",
        "{{prompt}}",
    ]);
    assert_eq!(render_args(&a, &vars("")), vec!["-p", "--verbose", "do it"]);
    assert_eq!(
        render_args(&a, &vars("s1")),
        vec!["-p", "--resume", "s1", "--session=s1", "--verbose", "do it"]
    );
}

#[test]
fn every_built_in_parses() {
    for name in built_in_names() {
        let p = Profile::find(name, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.name, name);
    }
}

#[test]
fn built_ins_parse_and_user_files_override() {
    let echo = Profile::find("echo", &[]).unwrap();
    assert_eq!(echo.origin, "built-in");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("echo.toml"),
        "command = \"printf\"\nargs = [\"x\"]\n",
    )
    .unwrap();
    let mine = Profile::find("echo", &[dir.path().to_path_buf()]).unwrap();
    assert_eq!(mine.name, "echo");
    assert!(mine.origin.ends_with("echo.toml"));
    let err = Profile::find("nope", &[dir.path().to_path_buf()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope") && err.contains("echo"), "{err}");
}

#[test]
fn bad_profiles_say_what_is_wrong() {
    let e = Profile::parse("command = \"x\"\nargs = [\"{{nope}}\"]", "t", "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("args[0]") && e.contains("nope"), "{e}");
    let e = Profile::parse("command = \"\"", "t", "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("command is empty"), "{e}");
    let e = Profile::parse("command = \"x\"\nshell = true", "t", "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("shell"), "{e}");
}

#[test]
fn an_mcp_server_is_given_to_claude_as_its_mcp_config_without_its_environment() {
    let server = crate::runner::McpServer {
        name: "aamp".into(),
        command: "/usr/bin/aamp-bridge".into(),
        args: vec!["mcp".into()],
        env: vec![("AAMP_BRIDGE_MCP_TOKEN".into(), "secret".into())],
    };
    let json = server.config_json();
    assert!(!json.contains("secret"), "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["mcpServers"]["aamp"]["args"][0], "mcp");
    let claude = Profile::find("claude", &[]).unwrap();
    let mut vars = crate::runner::template::Vars::default();
    vars.set("mcp_config", json.clone());
    let args: Vec<String> = claude.mcp_args.iter().map(|a| a.render(&vars)).collect();
    assert_eq!(
        args,
        ["--mcp-config", json.as_str(), "--allowedTools", "mcp__aamp"]
    );
}
