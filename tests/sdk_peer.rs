//! A third-party peer: a dispatcher on the PyPI AAMP SDK (`aamp-sdk`, tests/agents/sdk_peer.py)
//! talks to the bridge through the real mail host as that SDK does, submitting over SMTP with
//! mandatory STARTTLS and reading with its own JMAP client: a task answered with an ack, an
//! opened stream and a result with files; a cancel; a card query; pairing.

mod support;

use std::path::Path;

use support::{mailhost, AampHost, Bridge, ConfigDir};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatcher_on_the_python_sdk_dispatches_cancels_queries_and_pairs() {
    let Some(host) = mailhost() else { return };
    let aamp = AampHost::start();
    let (agent, slow, door, boss) = (
        host.user("agent"),
        host.user("slow"),
        host.user("door"),
        host.user("boss"),
    );
    let settings = format!("poll_interval_secs = 1\naamp_url = \"{}\"\n", aamp.url);
    let config = format!(
        "{}{}{}\
         [[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"results.toml\"\nallow_from = [\"{boss}\"]\nsummary = \"Writes reports\"\ncard = \"# Reports\\nHands back fields and files.\"\n\n\
         [[agents]]\nname = \"slow\"\nmailbox = \"slow\"\nprofile = \"slow.toml\"\nallow_from = [\"{boss}\"]\n\n\
         [[agents]]\nname = \"door\"\nmailbox = \"door\"\nprofile = \"echo\"\n",
        host.mailbox_toml_with("agent", &agent, &settings),
        host.mailbox_toml_with("slow", &slow, &settings),
        host.mailbox_toml_with("door", &door, &settings),
        boss = boss.email,
    );
    let dir = ConfigDir::new(host, &config);
    dir.write(
        "results.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}]\nstdin = \"{{{{prompt}}}}\"\n",
            repo().join("tests/agents/result_agent.py").display()
        ),
    );
    dir.write("slow.toml", "command = \"sleep\"\nargs = [\"600\"]\n");
    let pair = std::process::Command::new(support::bin())
        .args(["--config", dir.config().to_str().unwrap()])
        .args(["pair", "--agent", "door", "--json", "--ttl-secs", "300"])
        .output()
        .unwrap();
    assert!(
        pair.status.success(),
        "{}",
        String::from_utf8_lossy(&pair.stderr)
    );
    let code: serde_json::Value = serde_json::from_slice(&pair.stdout).unwrap();
    let code = code["code"].as_str().unwrap().to_string();
    let _bridge = Bridge::start(&dir, 3);

    let out = std::process::Command::new(support::test_agents().join("venv/bin/python"))
        .arg(repo().join("tests/agents/sdk_peer.py"))
        .args([
            &boss.email,
            &boss.password.value(),
            // JMAP through the AAMP service, which serves the push path the SDK asks for.
            &aamp.url,
            &host.smtp_tls_port.to_string(),
            &agent.email,
            &slow.email,
            &door.email,
            &code,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the SDK peer failed:\n{stderr}");
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&out.stdout)));

    // 1. dispatch → ack → stream.opened → result with its files.
    let task = &seen["task"];
    assert_eq!(task["ack"], true, "{seen}");
    assert!(task["streamOpened"]["streamId"].is_string(), "{seen}");
    assert_eq!(task["result"]["status"], "completed", "{seen}");
    assert_eq!(
        task["files"]["report.md"], "# Report\n\nAll good.\n",
        "{seen}"
    );
    assert_eq!(task["files"]["data.csv"], "a,b\n1,2\n", "{seen}");
    let fields = task["result"]["structuredResult"]
        .as_array()
        .expect("fields decoded");
    assert_eq!(fields[0]["value"], "all good");

    // 2. The cancel stopped the running task, and its result says so.
    assert_eq!(seen["cancel"]["ack"], true, "{seen}");
    assert_eq!(seen["cancel"]["result"]["status"], "rejected", "{seen}");
    let why = seen["cancel"]["result"]["errorMsg"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("cancelled"), "{seen}");

    // 3. The card.
    assert_eq!(seen["card"]["summary"], "Writes reports", "{seen}");
    assert!(
        seen["card"]["bodyText"]
            .as_str()
            .unwrap_or_default()
            .contains("fields and files"),
        "{seen}"
    );

    // 4. Pairing let the SDK's mailbox in, and its next task ran.
    assert_eq!(seen["pair"]["status"], "completed", "{seen}");
    assert_eq!(seen["paired_task"]["status"], "completed", "{seen}");

    // Every mail the SDK sent came over STARTTLS: nothing reached the service's HTTP send.
    assert!(
        aamp.actions()
            .iter()
            .all(|a| a["action"] != "aamp.mailbox.send"),
        "{:?}",
        aamp.actions()
    );
    // The SDK read over push and had no error on its side.
    assert_eq!(seen["polling"], false, "{seen}");
    assert_eq!(seen["errors"], serde_json::json!([]), "{seen}");
}
