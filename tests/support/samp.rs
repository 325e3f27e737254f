//! The SAMP imitation (tests/hosts/samp_server.py, an MCP server over Streamable HTTP, run with
//! the test venv's python, which has `mcp`) and an agent's client of it, for the SAMP tests.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

/// The SAMP imitation, its state kept in a folder of its own.
pub struct SampServer {
    child: Child,
    pub url: String,
    pub admin: String,
    pub dir: tempfile::TempDir,
}

impl SampServer {
    pub fn start() -> SampServer {
        let dir = tempfile::tempdir().unwrap();
        let python = super::test_agents().join("venv/bin/python");
        let mut child = Command::new(python)
            .arg(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hosts/samp_server.py"),
            )
            .args(["--port", "0", "--state"])
            .arg(dir.path().join("state.json"))
            .arg("--record")
            .arg(dir.path().join("record.jsonl"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the test venv's python runs tests/hosts/samp_server.py");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (mut admin, mut url) = (String::new(), String::new());
        for _ in 0..2 {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            if let Some(key) = line.trim().strip_prefix("samp: admin key ") {
                admin = key.to_string();
            } else if let Some(u) = line.trim().strip_prefix("samp: listening on ") {
                url = u.to_string();
            }
        }
        assert!(
            !admin.is_empty() && !url.is_empty(),
            "the SAMP server did not start"
        );
        SampServer {
            child,
            url,
            admin,
            dir,
        }
    }

    pub fn base(&self) -> String {
        self.url.trim_end_matches("/mcp").to_string()
    }

    /// A call to the server's test controls, as its admin.
    pub async fn control(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let request = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base()))
            .bearer_auth(&self.admin);
        super::json_call(request, body).await
    }

    /// Revokes `key`: the server refuses it from now on.
    pub async fn revoke(&self, key: &str) {
        self.control(
            reqwest::Method::POST,
            "/test/revoke",
            Some(json!({"key": key})),
        )
        .await;
    }

    /// A new key for `agent`, as a person makes one after a revocation.
    pub async fn new_key(&self, agent: &str) -> String {
        self.control(
            reqwest::Method::POST,
            "/test/keys",
            Some(json!({"agent": agent})),
        )
        .await["key"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// A new agent `name`, and its side of MCP.
    pub async fn peer(&self, name: &str) -> SampPeer {
        SampPeer {
            url: self.url.clone(),
            key: self.agent(name).await,
        }
    }

    /// The `[mailboxes.NAME]` table of a SAMP mailbox on this server, its key in `key_file`,
    /// polled every second.
    pub fn mailbox(&self, name: &str, key_file: &str) -> String {
        format!(
            "[mailboxes.{name}]\nkind = \"samp\"\nsamp_url = \"{}\"\nkey_file = \"{key_file}\"\npoll_interval_secs = 1\n",
            self.url
        )
    }

    /// A config of the agent and mailbox `name` with `key`, answering `boss` with `profile`.
    pub fn agent_config(
        &self,
        name: &str,
        key: &str,
        boss: &str,
        profile: &str,
    ) -> super::ConfigDir {
        let dir = super::ConfigDir::empty();
        dir.write_private("samp.key", key);
        dir.write_config(
            &super::Toml::new()
                .mailbox_text(&self.mailbox(name, "samp.key"))
                .agent(name, profile, &[boss], "")
                .text(),
        );
        dir
    }

    /// A new agent: its key.
    pub async fn agent(&self, name: &str) -> String {
        let made = self
            .control(
                reqwest::Method::POST,
                "/test/agents",
                Some(json!({"name": name})),
            )
            .await;
        made["key"].as_str().unwrap().to_string()
    }

    pub async fn config(&self, settings: Value) {
        self.control(reqwest::Method::POST, "/test/config", Some(settings))
            .await;
    }

    /// Every stored message sent by `from`, oldest first.
    pub async fn sent_by(&self, from: &str) -> Vec<Value> {
        self.control(reqwest::Method::GET, &format!("/test/mailbox/{from}"), None)
            .await["sent"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// The messages `from` sent in reply to `message`, waited for (at least `n`).
    pub async fn replies(
        &self,
        from: &str,
        message: &str,
        n: usize,
        within: Duration,
    ) -> Vec<Value> {
        let what = format!("{n} replies from {from} to {message}");
        super::poll(&what, within, || async {
            let replies: Vec<Value> = self
                .sent_by(from)
                .await
                .into_iter()
                .filter(|m| m["in_reply_to"] == message)
                .collect();
            (replies.len() >= n).then_some(replies)
        })
        .await
    }

    pub fn no_invalid_calls(&self) {
        let invalid: Vec<String> = super::lines(&self.dir.path().join("record.jsonl"))
            .into_iter()
            .filter(|l| l.contains("\"invalid\": true"))
            .collect();
        assert!(
            invalid.is_empty(),
            "calls the server does not accept: {invalid:?}"
        );
    }
}

impl Drop for SampServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An agent's side of MCP, as a person's or another agent's client calls it.
pub struct SampPeer {
    pub url: String,
    pub key: String,
}

impl SampPeer {
    pub async fn call(&self, tool: &str, arguments: Value) -> Value {
        let http = reqwest::Client::new();
        let post = |body: Value| {
            http.post(&self.url)
                .bearer_auth(&self.key)
                .header("Accept", "application/json, text/event-stream")
                .json(&body)
                .send()
        };
        post(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "samp-test", "version": "0"}}}),
        )
        .await
        .unwrap();
        let answer: Value = post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                        "params": {"name": tool, "arguments": arguments}}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        let text = answer["result"]["content"][0]["text"].as_str().unwrap();
        let value: Value = serde_json::from_str(text).unwrap();
        assert_ne!(answer["result"]["isError"], true, "{tool}: {value}");
        value
    }

    /// Sends a message: its id.
    pub async fn send(
        &self,
        to: &str,
        subject: &str,
        body: &str,
        reply_to: Option<&str>,
    ) -> String {
        let mut args = json!({"to": to, "subject": subject, "body": body});
        if let Some(parent) = reply_to {
            args["in_reply_to"] = json!(parent);
        }
        self.call("send_message", args).await["message_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Reads and acks the inbox: the messages.
    pub async fn read_all(&self) -> Vec<Value> {
        let inbox = self.call("check_inbox", json!({"limit": 100})).await;
        let messages = inbox["messages"].as_array().unwrap().clone();
        let ids: Vec<&str> = messages.iter().filter_map(|m| m["id"].as_str()).collect();
        if !ids.is_empty() {
            self.call("ack", json!({"message_ids": ids})).await;
        }
        messages
    }
}
