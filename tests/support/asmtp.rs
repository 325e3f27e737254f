//! The ASMTP test operator (tests/hosts/asmtp_operator.py, the wire rules of the reference
//! operator), for every test that needs an ASMTP mailbox: its state kept in a folder of its
//! own so it can be restarted, with a token for each agent it is started with.

use super::*;

use serde_json::json;

/// A fresh envelope id (the ULID shape: `01` and 24 Crockford base32 characters).
pub fn ulid() -> String {
    const CROCKFORD: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let bytes = uuid::Uuid::new_v4().into_bytes();
    let mut out = String::from("01");
    for i in 0..24 {
        out.push(CROCKFORD[(bytes[i % 16] as usize + i * 7) % 32] as char);
    }
    out
}

pub struct AsmtpOperator {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
    agents: Vec<(String, String)>,
}

impl AsmtpOperator {
    /// Starts with these handles, each with a token of its own, each allowing the others in;
    /// `extra`: more arguments for tests/hosts/asmtp_operator.py (fault options,
    /// `--huge-bodies`, `--admin-token`).
    pub fn start(handles: &[&str], extra: &[&str]) -> AsmtpOperator {
        let dir = tempfile::tempdir().unwrap();
        let agents: Vec<(String, String)> = handles
            .iter()
            .map(|h| {
                (
                    h.to_string(),
                    format!("tok_{}", uuid::Uuid::new_v4().simple()),
                )
            })
            .collect();
        let (child, port) = AsmtpOperator::spawn(dir.path(), 0, &agents, extra);
        AsmtpOperator {
            child,
            port,
            dir,
            agents,
        }
    }

    /// Port 0: one the OS picks.
    fn spawn(dir: &Path, port: u16, agents: &[(String, String)], extra: &[&str]) -> (Child, u16) {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--port".into(),
            port.to_string().into(),
            "--db".into(),
            dir.join("operator.sqlite3").into(),
            "--record".into(),
            dir.join("record.jsonl").into(),
        ];
        args.extend(extra.iter().map(Into::into));
        for (handle, token) in agents {
            args.push("--agent".into());
            args.push(format!("{handle}:{token}").into());
            // The operator's policy is an allowlist both ways: each agent's owner lets the
            // others in, as a person sets it up with `robotnet me allowlist add`.
            for (other, _) in agents.iter().filter(|(o, _)| o != handle) {
                args.push("--allow".into());
                args.push(format!("{handle}={other}").into());
            }
        }
        spawn_test_server("asmtp_operator.py", &args)
    }

    /// The token `handle` was started with.
    pub fn token(&self, handle: &str) -> &str {
        &self.agents.iter().find(|(h, _)| h == handle).unwrap().1
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops it as a service manager would (SIGTERM: every push socket is closed with 1001).
    pub fn terminate(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Started again on the same port and state, without fault options.
    pub fn restart(&mut self) {
        self.stop();
        self.child = AsmtpOperator::spawn(self.dir.path(), self.port, &self.agents, &[]).0;
    }

    /// The requests and frames it received (`--record`), in order.
    pub fn record(&self) -> Vec<Value> {
        json_lines(&self.dir.path().join("record.jsonl"))
    }

    /// Fails the test if the bridge made a request or sent a frame against the rules.
    pub fn no_invalid(&self) {
        assert_none_invalid(self.record());
    }

    /// A call as the agent `as_handle` (with its first token).
    pub async fn call(
        &self,
        as_handle: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let request = reqwest::Client::new()
            .request(method, format!("{}{path}", self.url()))
            .bearer_auth(self.token(as_handle));
        json_call(request, body).await
    }

    /// Posts a task envelope from `from` to `to`; returns its id.
    pub async fn send(&self, from: &str, to: &str, subject: &str, text: &str) -> String {
        self.post(
            from,
            json!({"id": ulid(), "to": [to], "subject": subject, "date_ms": 1_764_000_000_000u64,
                    "content_parts": [{"type": "text", "text": text}]}),
        )
        .await
    }

    /// Posts an envelope as `from`; returns its id.
    pub async fn post(&self, from: &str, envelope: Value) -> String {
        self.call(
            from,
            reqwest::Method::POST,
            "/messages",
            Some(envelope.clone()),
        )
        .await;
        envelope["id"].as_str().unwrap().to_string()
    }

    /// The headers of the envelopes in `handle`'s mailbox that reply to `parent`.
    pub async fn reply_headers(&self, handle: &str, parent: &str) -> Vec<Value> {
        let listed = self
            .call(
                handle,
                reqwest::Method::GET,
                "/mailbox?direction=in&order=asc&limit=1000",
                None,
            )
            .await;
        listed["envelope_headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["in_reply_to"] == parent)
            .cloned()
            .collect()
    }

    /// The envelopes in `handle`'s mailbox that reply to `parent`, waited for (a minute).
    pub async fn replies(&self, handle: &str, parent: &str) -> Vec<Value> {
        let what = format!("a reply to {parent}");
        let ids = poll(&what, Duration::from_secs(60), || async {
            let ids: Vec<String> = self
                .reply_headers(handle, parent)
                .await
                .iter()
                .map(|h| h["id"].as_str().unwrap().to_string())
                .collect();
            (!ids.is_empty()).then_some(ids)
        })
        .await;
        let path = format!("/messages?ids={}", ids.join(","));
        let bodies = self.call(handle, reqwest::Method::GET, &path, None).await;
        bodies["envelopes"].as_array().unwrap().clone()
    }

    /// The `[mailboxes.coder]` table of `handle`, polled every `poll` seconds while push is
    /// down.
    pub fn mailbox(&self, handle: &str, poll: u64) -> String {
        format!(
            "[mailboxes.coder]\nkind = \"asmtp\"\nasmtp_url = \"{}\"\nhandle = \"{handle}\"\ntoken_file = \"asmtp.token\"\npoll_interval_secs = {poll}\n",
            self.url()
        )
    }

    /// A config of the agent `coder` on `agent`'s mailbox, answering `allow` with `echo`.
    pub fn config(&self, agent: &str, allow: &str, poll: u64) -> ConfigDir {
        self.config_token(agent, self.token(agent), allow, poll)
    }

    /// The same, with `token` in its token file.
    pub fn config_token(&self, agent: &str, token: &str, allow: &str, poll: u64) -> ConfigDir {
        let dir = ConfigDir::empty();
        dir.write_private("asmtp.token", token);
        dir.write_config(
            &Toml::new()
                .mailbox_text(&self.mailbox(agent, poll))
                .agent("coder", "echo", &[allow], "")
                .text(),
        );
        dir
    }
}

/// The text parts of an envelope, joined.
pub fn envelope_text(envelope: &Value) -> String {
    envelope["content_parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

impl Drop for AsmtpOperator {
    fn drop(&mut self) {
        self.stop();
    }
}
