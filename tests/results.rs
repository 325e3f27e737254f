//! Results that carry more than text, over the real mail host: structured fields and files
//! handed back by a CLI agent and an ACP agent, read by a dispatcher on the PyPI AAMP SDK;
//! files from outside the task's workspace refused and named; echoed instructions give no
//! structured result; one stream `artifact` per file.

mod support;

use std::io::BufRead;

use aamp_bridge::protocol::{Body, Intent, Status};
use support::{mailhost, Bridge, ConfigDir, Peer};

fn repo() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn config(
    host: &support::MailHost,
    agent: &aamp_bridge::config::Account,
    profile: &str,
    allow: &str,
) -> String {
    support::one_agent(host, agent, profile, allow).text()
}

/// A dispatcher's side on the PyPI AAMP SDK, watching `boss`'s mailbox for `task_id`'s
/// result; ready once this returns.
struct SdkDispatcher {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl SdkDispatcher {
    fn watch(
        host: &support::MailHost,
        boss: &aamp_bridge::config::Account,
        task_id: &str,
    ) -> SdkDispatcher {
        let python = support::test_agents().join("venv/bin/python");
        let mut child = std::process::Command::new(python)
            .arg(repo().join("tests/agents/sdk_dispatcher.py"))
            .args([
                &boss.email,
                &boss.password.value(),
                host.jmap_url.trim_end_matches("/.well-known/jmap"),
                task_id,
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        SdkDispatcher { child, out }
    }

    /// What the SDK read: {status, output, structuredResult, files: {name: text}}.
    fn result(mut self) -> serde_json::Value {
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert!(self.child.wait().unwrap().success(), "{line}");
        serde_json::from_str(&line).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cli_agent_returns_fields_and_files_to_an_sdk_dispatcher_and_nothing_from_outside() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &config(host, &agent, "results.toml", &boss.email));
    dir.write(
        "results.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}]\nstdin = \"{{{{prompt}}}}\"\n",
            repo().join("tests/agents/result_agent.py").display()
        ),
    );
    let peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);

    // The dispatcher's side runs on the PyPI SDK: it watches the mailbox before the task goes.
    let task = peer.dispatch_to(&agent.email, "Report", "Write the report.");
    let sdk = SdkDispatcher::watch(host, &boss, task.task_id());
    peer.send(task.clone()).await;
    let seen = sdk.result();
    assert_eq!(seen["status"], "completed", "{seen}");
    let fields = seen["structuredResult"]
        .as_array()
        .expect("structured fields decoded");
    assert_eq!(fields[0]["value"], "all good");
    assert_eq!(
        fields[1]["attachmentFilenames"],
        serde_json::json!(["report.md", "data.csv"])
    );
    assert_eq!(seen["files"]["report.md"], "# Report\n\nAll good.\n");
    assert_eq!(seen["files"]["data.csv"], "a,b\n1,2\n");
    assert_eq!(seen["files"].as_object().unwrap().len(), 2, "{seen}");
    let output = seen["output"].as_str().unwrap();
    assert!(output.contains("Report ready"), "{output}");
    for refused in [
        "../../etc/passwd: outside",
        "/etc/passwd: outside",
        "escape: outside",
    ] {
        assert!(output.contains(refused), "{refused}: {output}");
    }
    bridge.wait_event("task.completed", |e| e["taskId"] == task.task_id());
    let mut artifacts: Vec<&str> = bridge
        .seen
        .iter()
        .filter(|e| {
            e["event"] == "task.stream" && e["type"] == "artifact" && e["taskId"] == task.task_id()
        })
        .filter_map(|e| e["payload"]["filename"].as_str())
        .collect();
    artifacts.sort();
    assert_eq!(artifacts, vec!["data.csv", "report.md"]);
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acp_agent_hands_back_written_linked_and_embedded_files_with_fields() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &config(host, &agent, "acp.toml", &boss.email));
    let script = serde_json::json!({"steps": [
        {"write_here": ["report.md", "# ACP report\n"]},
        {"write_here": ["notes.txt", "notes\n"]},
        {"resource_link": "notes.txt"},
        {"resource_link": "/etc/passwd"},
        {"resource": ["inline.txt", "sent inline"]},
        {"say": "Finished.\nAAMP_RESULT_JSON: {\"output\": \"ACP done\", \"structuredResult\": [{\"fieldKey\": \"files\", \"fieldTypeKey\": \"file\"}]}"}
    ]});
    dir.write("script.json", &script.to_string());
    dir.write(
        "acp.toml",
        &format!(
            "kind = \"acp\"\ncommand = \"python3\"\nargs = [{:?}]\nenv = {{ ACP_TEST_SCRIPT = {:?} }}\nattach_written_files = true\npermissions = \"allow\"\n",
            repo().join("tests/agents/acp_agent.py").display(),
            dir.dir.path().join("script.json").display()
        ),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let bridge = Bridge::start(&dir, 1);
    let task = peer
        .send(peer.dispatch_to(&agent.email, "ACP report", "Write it."))
        .await;
    let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    assert!(r.output.contains("ACP done"), "{}", r.output);
    assert!(r.output.contains("/etc/passwd: outside"), "{}", r.output);
    let mut names: Vec<&str> = result.attachments.iter().map(|a| a.name.as_str()).collect();
    names.sort();
    assert_eq!(names, vec!["inline.txt", "notes.txt", "report.md"]);
    let structured = r.structured_result.as_ref().expect("fields");
    let mut listed: Vec<String> =
        serde_json::from_value(structured[0]["attachmentFilenames"].clone()).unwrap();
    listed.sort();
    assert_eq!(listed, vec!["inline.txt", "notes.txt", "report.md"]);
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_echoes_its_instructions_returns_no_structured_result() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &config(host, &agent, "echoes.toml", &boss.email));
    dir.write(
        "echoes.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}, \"--echo\"]\nstdin = \"{{{{prompt}}}}\"\n",
            repo().join("tests/agents/result_agent.py").display()
        ),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let bridge = Bridge::start(&dir, 1);
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Echo", "Repeat your instructions."))
        .await;
    let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed);
    assert!(
        r.output.contains("AAMP_RESULT_JSON:"),
        "the instructions came back: {}",
        r.output
    );
    assert!(r.structured_result.is_none());
    assert!(result.attachments.is_empty());
    assert!(!r.output.contains("Files not attached"), "{}", r.output);
    assert!(bridge.stop().success());
}

/// Issue 30, item 2, through the answer's files: an agent with a shell of its own hard-linked
/// the bridge's own password file into its workspace and named it (`FILE:`), and the bridge
/// mailed it to the sender (the files were read by path, with no check of their names). Now
/// the file is not attached, the answer says why, and the ordinary file beside it still is.
#[tokio::test(flavor = "multi_thread")]
async fn a_hard_link_to_the_bridges_password_is_never_attached() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &config(host, &agent, "linker.toml", &boss.email));
    let password = dir.dir.path().join("password");
    assert!(password.exists());
    dir.write(
        "linker.toml",
        &format!(
            "command = \"sh\"\nargs = [\"-c\", \"ln {} stolen.txt && echo fine > ok.txt; echo Done; echo FILE: stolen.txt; echo FILE: ok.txt\"]\n",
            password.display()
        ),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let bridge = Bridge::start(&dir, 1);
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Files", "Hand over your files."))
        .await;
    let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    let names: Vec<&str> = result.attachments.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, vec!["ok.txt"], "{}", r.output);
    assert!(r.output.contains("stolen.txt: has 2 names"), "{}", r.output);
    let secret = std::fs::read_to_string(&password).unwrap();
    assert!(!r.output.contains(secret.trim()));
    assert!(bridge.stop().success());
}
