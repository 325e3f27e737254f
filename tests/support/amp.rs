//! The AMP test broker (tests/hosts/amp_broker.py, the agent-facing API of
//! study8677/agent-mailer), for every test that needs an AMP mailbox: its state kept in a
//! folder of its own so it can be restarted, with one user (alice) whose key registers agents.

use super::*;

use serde_json::json;

pub struct AmpBroker {
    child: Child,
    pub port: u16,
    pub key: String,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl AmpBroker {
    /// Starts it with more arguments for tests/hosts/amp_broker.py (fault options such as
    /// `--stall-first-reply`, or `--huge-bodies`).
    pub fn start(extra: &[&str]) -> AmpBroker {
        let dir = tempfile::tempdir().unwrap();
        let key = format!("amk_{}", uuid::Uuid::new_v4().simple());
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (child, port) = AmpBroker::spawn(dir.path(), 0, &key, &extra);
        AmpBroker {
            child,
            port,
            key,
            dir,
            extra,
        }
    }

    /// Starts it (with `extra`, as [`AmpBroker::start`]) and registers the agents `coder` and
    /// `boss`: (the broker, coder, boss), each agent as (id, address).
    pub async fn with_coder_and_boss(
        extra: &[&str],
    ) -> (AmpBroker, (String, String), (String, String)) {
        let broker = AmpBroker::start(extra);
        let coder = broker.register("coder").await;
        let boss = broker.register("boss").await;
        (broker, coder, boss)
    }

    /// Port 0: one the OS picks.
    fn spawn(dir: &Path, port: u16, key: &str, extra: &[String]) -> (Child, u16) {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--port".into(),
            port.to_string().into(),
            "--db".into(),
            dir.join("broker.sqlite3").into(),
            "--record".into(),
            dir.join("record.jsonl").into(),
            "--user".into(),
            format!("alice:{key}").into(),
        ];
        args.extend(extra.iter().map(Into::into));
        spawn_test_server("amp_broker.py", &args)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Started again on the same port and state, without the fault options.
    pub fn restart(&mut self) {
        self.stop();
        self.extra.clear();
        self.child = AmpBroker::spawn(self.dir.path(), self.port, &self.key, &self.extra).0;
    }

    /// The requests it received (`--record`), in order.
    pub fn record(&self) -> Vec<Value> {
        json_lines(&self.dir.path().join("record.jsonl"))
    }

    /// Fails the test if the bridge made a request the API does not accept.
    pub fn no_invalid_requests(&self) {
        assert_none_invalid(self.record());
    }

    /// A call with alice's key.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.call_as(("X-API-Key", &self.key), method, path, body)
            .await
    }

    /// A call with the given credential header (a person's console session: Authorization).
    pub async fn call_as(
        &self,
        credential: (&str, &str),
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let request = reqwest::Client::new()
            .request(method, format!("{}{path}", self.url()))
            .header(credential.0, credential.1);
        json_call(request, body).await
    }

    /// A call a person makes in the broker's console (logged in as alice).
    pub async fn as_person(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let session = self.console().await;
        self.call_as(("Authorization", &session), method, path, body)
            .await
    }

    /// A person opens `message` in the console, which marks it read.
    pub async fn open_in_console(&self, message: &Value) -> Value {
        let id = message["id"].as_str().unwrap();
        let path = format!("/admin/messages/{id}/read");
        self.as_person(reqwest::Method::PATCH, &path, None).await
    }

    /// A person archives the thread of `message` in the console: the inbox hides it.
    pub async fn archive_thread(&self, message: &Value) -> Value {
        let thread = message["thread_id"].as_str().unwrap();
        let path = format!("/admin/threads/{thread}/archive");
        self.as_person(reqwest::Method::POST, &path, None).await
    }

    /// A person trashes `message` in the console: the inbox hides it.
    pub async fn trash(&self, message: &Value) -> Value {
        let id = message["id"].as_str().unwrap();
        let path = format!("/admin/messages/{id}/trash");
        self.as_person(reqwest::Method::POST, &path, None).await
    }

    /// A console session of the user alice: the `Authorization` header value.
    pub async fn console(&self) -> String {
        let login = self
            .call_as(
                ("X-Nothing", ""),
                reqwest::Method::POST,
                "/users/login",
                Some(json!({"username": "alice", "password": "pw-alice"})),
            )
            .await;
        format!("Bearer {}", login["token"].as_str().unwrap())
    }

    /// A key made in the console, as a person makes one: (its id, the raw key).
    pub async fn console_key(&self, name: &str) -> (String, String) {
        let key = self
            .as_person(
                reqwest::Method::POST,
                "/users/api-keys",
                Some(json!({"name": name})),
            )
            .await;
        (
            key["id"].as_str().unwrap().to_string(),
            key["raw_key"].as_str().unwrap().to_string(),
        )
    }

    /// Registers an agent: (id, address).
    pub async fn register(&self, name: &str) -> (String, String) {
        let agent = self
            .call(
                reqwest::Method::POST,
                "/agents/register",
                Some(json!({"name": name, "role": name, "system_prompt": "test"})),
            )
            .await;
        (
            agent["id"].as_str().unwrap().to_string(),
            agent["address"].as_str().unwrap().to_string(),
        )
    }

    /// A task from `from` to `to`: the message as `/messages/send` answered it.
    pub async fn send(
        &self,
        from: &(String, String),
        to: &str,
        subject: &str,
        body: &str,
    ) -> Value {
        self.post_message(
            json!({"agent_id": from.0, "from_agent": from.1, "to_agent": to,
                                 "action": "send", "subject": subject, "body": body}),
        )
        .await
    }

    /// A reply from `from` to `to` in the thread of `parent` (its `parent_id`), as the
    /// console or another agent posts one.
    pub async fn reply(
        &self,
        from: &(String, String),
        to: &str,
        subject: &str,
        body: &str,
        parent: &Value,
    ) -> Value {
        self.post_message(
            json!({"agent_id": from.0, "from_agent": from.1, "to_agent": to,
                                 "action": "reply", "subject": subject, "body": body,
                                 "parent_id": parent["id"]}),
        )
        .await
    }

    async fn post_message(&self, message: Value) -> Value {
        self.call(reqwest::Method::POST, "/messages/send", Some(message))
            .await
    }

    /// Every message of the thread, oldest first.
    pub async fn thread(&self, thread_id: &str) -> Vec<Value> {
        self.call(
            reqwest::Method::GET,
            &format!("/messages/thread/{thread_id}"),
            None,
        )
        .await
        .as_array()
        .unwrap()
        .clone()
    }

    /// The replies from `from` in the thread of the message `sent` (as `/messages/send`
    /// answered it), waited for.
    pub async fn replies_to(&self, sent: &Value, from: &str) -> Vec<Value> {
        self.replies(sent["thread_id"].as_str().unwrap(), from)
            .await
    }

    /// Waits (up to a minute) until the thread holds a message from `from`; returns those
    /// messages.
    pub async fn replies(&self, thread_id: &str, from: &str) -> Vec<Value> {
        let what = format!("a reply in thread {thread_id}");
        poll(&what, Duration::from_secs(60), || async {
            let replies: Vec<Value> = self
                .thread(thread_id)
                .await
                .into_iter()
                .filter(|m| m["from_agent"] == from)
                .collect();
            (!replies.is_empty()).then_some(replies)
        })
        .await
    }

    /// The `[mailboxes.NAME]` table of `agent` (id, address) on this broker, polled every
    /// second, with more keys.
    pub fn mailbox(&self, name: &str, agent: &(String, String), keys: &str) -> String {
        format!(
            "[mailboxes.{name}]\nkind = \"amp\"\namp_url = \"{}\"\naddress = \"{}\"\nagent_id = \"{}\"\napi_key_file = \"amp.key\"\npoll_interval_secs = 1\n{keys}",
            self.url(),
            agent.1,
            agent.0
        )
    }

    /// A config of one agent `coder` on an AMP mailbox, answering `boss` with `profile`.
    pub fn config(&self, agent: &(String, String), boss: &str, profile: &str) -> ConfigDir {
        self.config_with(agent, boss, profile, "")
    }

    /// The same, with more keys for the mailbox.
    pub fn config_with(
        &self,
        agent: &(String, String),
        boss: &str,
        profile: &str,
        mailbox_keys: &str,
    ) -> ConfigDir {
        let dir = ConfigDir::empty();
        dir.write_private("amp.key", &self.key);
        dir.write_config(
            &Toml::new()
                .mailbox_text(&self.mailbox("coder", agent, mailbox_keys))
                .agent("coder", profile, &[boss], "")
                .text(),
        );
        dir
    }
}

impl Drop for AmpBroker {
    fn drop(&mut self) {
        self.stop();
    }
}
