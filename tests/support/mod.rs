//! Test support over the real mail host (scripts/mailhost.sh): starting it when it is not
//! running, fresh mailboxes per test, a running bridge process, and a dispatcher peer.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aamp_bridge::config::{Account, SmtpSecurity};
use aamp_bridge::mailbox::{Inbound, Reader, Sender};
use aamp_bridge::protocol::{self, AampMessage, Body, Dispatch, Envelope, Intent};
use serde_json::Value;

pub const WAIT: Duration = Duration::from_secs(30);

pub struct MailHost {
    pub domain: String,
    pub password: String,
    pub jmap_url: String,
    pub smtp_port: u16,
    /// Submission that requires STARTTLS (a self-signed certificate), as strict clients use it.
    pub smtp_tls_port: u16,
    /// Submission as stock Postfix does it: its Received field does not name the login.
    pub smtp_stock_port: u16,
    /// The inbound (MX) port: plain SMTP from other servers, no authentication.
    pub mx_port: u16,
    /// Environment for scripts/mailhost.sh that selects this instance (empty: the shared one).
    env: Vec<(String, String)>,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script(args: &[&str]) -> std::process::Output {
    script_with(&[], args)
}

fn script_with(env: &[(String, String)], args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(repo().join("scripts/mailhost.sh"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("bash runs scripts/mailhost.sh")
}

/// The mail host for a test, started on first use when it is not running already; `None` on a
/// machine that has none, so the test returns at once (`let Some(host) = mailhost() else
/// { return };`) after saying, past the test harness's capture, that it needs one.
///
/// A machine has none when the host is not running, Cyrus is not installed or this is not
/// root, and `AAMP_REQUIRE_MAILHOST` is unset. `scripts/test.sh` (and so CI) sets it: there
/// a host that cannot start fails the test, never skips it.
pub fn mailhost() -> Option<&'static MailHost> {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    let available = *AVAILABLE.get_or_init(|| {
        std::env::var_os("AAMP_REQUIRE_MAILHOST").is_some()
            || script(&["check"]).status.success()
            || (Path::new("/usr/lib/cyrus/bin/master").exists()
                && nix::unistd::Uid::effective().is_root())
    });
    if available {
        return Some(shared_host());
    }
    use std::io::Write as _;
    static BANNER: std::sync::Once = std::sync::Once::new();
    let mut err = std::io::stderr().lock();
    BANNER.call_once(|| {
        let _ = writeln!(
            err,
            "\nThis machine has no test mail host (Cyrus + Postfix, root): tests that need it pass \
             without running. `sudo scripts/test.sh` installs it and runs them all."
        );
    });
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let _ = writeln!(err, "  not run here, needs the mail host: {test}");
    None
}

/// The shared mail host, started when it is not running; a failure to start it fails the test.
fn shared_host() -> &'static MailHost {
    static HOST: OnceLock<MailHost> = OnceLock::new();
    HOST.get_or_init(|| {
        if !script(&["check"]).status.success() {
            let out = script(&["start"]);
            assert!(
                out.status.success(),
                "the mail host did not start (run `bash scripts/mailhost.sh install` as root first):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let port = |var: &str, default: u16| std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        MailHost {
            domain: std::env::var("MAILHOST_DOMAIN").unwrap_or_else(|_| "example.test".into()),
            password: std::env::var("MAILHOST_PASSWORD").unwrap_or_else(|_| "secret".into()),
            jmap_url: format!("http://127.0.0.1:{}/.well-known/jmap", port("MAILHOST_JMAP_PORT", 18080)),
            smtp_port: port("MAILHOST_SUBMIT_PORT", 15587),
            smtp_tls_port: port("MAILHOST_SUBMIT_TLS_PORT", 15588),
            smtp_stock_port: port("MAILHOST_SUBMIT_STOCK_PORT", 15589),
            mx_port: port("MAILHOST_MX_PORT", 12525),
            env: Vec::new(),
        }
    })
}

/// A mail host instance of its own (own folder and ports), for tests that stop and start it.
/// It is stopped and deleted on drop.
pub struct PrivateHost(pub MailHost);

impl PrivateHost {
    /// Starts an instance on six ports the OS says are free (the machine may run other
    /// servers).
    pub fn start(name: &str) -> PrivateHost {
        shared_host(); // the packages are installed and the shared instance's syslog sink runs
        let dir = format!("/tmp/aamp-mailhost-{name}-{}", std::process::id());
        let listeners: Vec<std::net::TcpListener> = (0..6)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        drop(listeners);
        let (jmap, imap, submit, mx, submit_tls) =
            (ports[0], ports[1], ports[2], ports[3], ports[4]);
        let env: Vec<(String, String)> = vec![
            ("MAILHOST_DIR".into(), dir),
            ("MAILHOST_JMAP_PORT".into(), jmap.to_string()),
            ("MAILHOST_IMAP_PORT".into(), imap.to_string()),
            ("MAILHOST_SUBMIT_PORT".into(), submit.to_string()),
            ("MAILHOST_MX_PORT".into(), mx.to_string()),
            ("MAILHOST_SUBMIT_TLS_PORT".into(), submit_tls.to_string()),
            ("MAILHOST_SUBMIT_STOCK_PORT".into(), ports[5].to_string()),
        ];
        let out = script_with(&env, &["start"]);
        assert!(
            out.status.success(),
            "private mail host did not start:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PrivateHost(MailHost {
            domain: "example.test".into(),
            password: "secret".into(),
            jmap_url: format!("http://127.0.0.1:{jmap}/.well-known/jmap"),
            smtp_port: submit,
            smtp_tls_port: submit_tls,
            smtp_stock_port: ports[5],
            mx_port: mx,
            env,
        })
    }

    pub fn stop(&self) {
        let out = script_with(&self.0.env, &["stop"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn restart(&self) {
        let out = script_with(&self.0.env, &["start"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateHost {
    fn drop(&mut self) {
        let _ = script_with(&self.0.env, &["clean"]);
    }
}

impl MailHost {
    /// A new mailbox whose name starts with `prefix`, unique to this test run.
    pub fn user(&self, prefix: &str) -> Account {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "{prefix}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let out = script_with(&self.env, &["adduser", &name]);
        assert!(
            out.status.success(),
            "adduser {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let email = format!("{name}@{}", self.domain);
        Account {
            name: name.clone(),
            email: email.clone(),
            jmap_url: url::Url::parse(&self.jmap_url).unwrap(),
            login: email,
            password: self.password.clone(),
            smtp_host: "127.0.0.1".into(),
            smtp_port: self.smtp_port,
            smtp_security: SmtpSecurity::Plain,
            insecure_tls: false,
            poll_interval: Duration::from_secs(1),
            push: false,
            push_transport: aamp_bridge::config::PushTransport::Auto,
            reconcile_interval: Duration::from_secs(60),
            save_sent: false,
            aamp_url: None,
            sender_auth: aamp_bridge::config::SenderAuth::Auto,
            authserv_id: None,
        }
    }

    /// A `[mailboxes.<key>]` table for `account`, reading the password from `password_file`.
    pub fn mailbox_toml(&self, key: &str, account: &Account) -> String {
        self.mailbox_toml_with(key, account, "poll_interval_secs = 1\n")
    }

    /// Like [`MailHost::mailbox_toml`], with other settings (poll interval, push) given.
    pub fn mailbox_toml_with(&self, key: &str, account: &Account, settings: &str) -> String {
        format!(
            "[mailboxes.{key}]\nemail = \"{}\"\njmap_url = \"{}\"\npassword_file = \"password\"\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {}\nsmtp_security = \"plain\"\n{settings}\n",
            account.email, self.jmap_url, self.smtp_port
        )
    }
}

/// A folder holding a config, its password file and any profiles.
pub struct ConfigDir {
    pub dir: tempfile::TempDir,
}

impl ConfigDir {
    pub fn new(host: &MailHost, config: &str) -> ConfigDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("password"), &host.password).unwrap();
        std::fs::set_permissions(
            dir.path().join("password"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            format!("state_dir = \"state\"\n{config}"),
        )
        .unwrap();
        ConfigDir { dir }
    }

    /// Writes `config.toml`: `text` under `state_dir = "state"`.
    pub fn write_config(&self, text: &str) {
        self.write("config.toml", &format!("state_dir = \"state\"\n{text}"));
    }

    /// Writes `asking.toml`: the ACP test agent asking permission to edit README.md, under
    /// `permissions = "ask"` with `ask_timeout_secs`.
    pub fn write_asking_agent(&self, ask_timeout_secs: u64) {
        let script = serde_json::json!({"steps": [
            {"say": "Need to edit. "},
            {"permission": {"id": "edit", "title": "Edit README.md", "kind": "edit"}},
            {"say": "Done."}
        ]});
        self.write("asking-script.json", &script.to_string());
        self.write(
            "asking.toml",
            &format!(
                "kind = \"acp\"\ncommand = \"python3\"\nargs = [{:?}]\nenv = {{ ACP_TEST_SCRIPT = {:?} }}\npermissions = \"ask\"\nask_timeout_secs = {ask_timeout_secs}\n",
                repo().join("tests/agents/acp_agent.py").display(),
                self.dir.path().join("asking-script.json").display()
            ),
        );
    }

    pub fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.path().join(name), text).unwrap();
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }
}

/// `aamp-bridge start --json` as a child process, with its events readable.
pub struct Bridge {
    child: Child,
    events: mpsc::Receiver<Value>,
    pub seen: Vec<Value>,
    stderr_path: PathBuf,
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_aamp-bridge")
}

impl Bridge {
    /// Starts the bridge and waits until every agent is ready.
    pub fn start(config: &ConfigDir, agents: usize) -> Bridge {
        let stderr_path = config.dir.path().join(format!(
            "bridge-{}.log",
            Instant::now().elapsed().as_nanos()
        ));
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut child = Command::new(bin())
            .args([
                "--config",
                config.config().to_str().unwrap(),
                "start",
                "--json",
            ])
            .env("AAMP_BRIDGE_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("the bridge starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            // Every line is read to the end of the stream, whatever it holds: a reader that
            // stopped would fill the pipe.
            let mut reader = BufReader::new(stdout);
            let mut bytes = Vec::new();
            while reader.read_until(b'\n', &mut bytes).is_ok_and(|n| n > 0) {
                let line = String::from_utf8_lossy(&bytes).trim_end().to_string();
                bytes.clear();
                let event = serde_json::from_str(&line).unwrap_or_else(
                    |e| serde_json::json!({"event": "not-json", "line": line, "error": e.to_string()}),
                );
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
        let mut bridge = Bridge {
            child,
            events,
            seen: Vec::new(),
            stderr_path,
        };
        // Every agent's own event: `wait_event` would find the first one again.
        bridge.wait_count("agent.ready", agents);
        bridge
    }

    /// Waits until `n` events named `name` have been seen.
    pub fn wait_count(&mut self, name: &str, n: usize) {
        let deadline = Instant::now() + WAIT;
        while self.seen.iter().filter(|e| e["event"] == name).count() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(e) => self.seen.push(e),
                Err(_) => panic!(
                    "fewer than {n} {name} events within {WAIT:?}; events: {:#?}\nbridge log:\n{}",
                    self.seen,
                    self.log()
                ),
            }
        }
    }

    /// Waits for an event named `name` that satisfies `pred`.
    pub fn wait_event(&mut self, name: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(e) = self.seen.iter().find(|e| e["event"] == name && pred(e)) {
            return e.clone();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(e) => {
                    self.seen.push(e.clone());
                    if e["event"] == name && pred(&e) {
                        return e;
                    }
                }
                Err(_) => panic!(
                    "no {name} event within {WAIT:?}; events: {:#?}\nbridge log:\n{}",
                    self.seen,
                    self.log()
                ),
            }
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// SIGTERM, and waits for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate()
    }

    /// SIGKILL, as a crash or an out-of-memory kill would: no chance to clean up.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` and returns at once.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// Waits (up to WAIT) for the bridge to exit on its own, reading its events meanwhile.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            while let Ok(e) = self.events.try_recv() {
                self.seen.push(e);
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                while let Ok(e) = self.events.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(e);
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the bridge did not exit within {WAIT:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
        }
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!("--- the bridge's log ends with:");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// A dispatcher: sends tasks from its own mailbox and reads what comes back.
pub struct Peer {
    pub account: Account,
    sender: Sender,
    mailbox: Reader,
    state: aamp_bridge::mailbox::Position,
    pub inbox: Vec<Inbound>,
}

impl Peer {
    pub async fn new(account: Account) -> Peer {
        let sender = Sender::new(&account).unwrap();
        let mut mailbox = Reader::new(account.clone()).unwrap();
        mailbox.connect().await.expect("peer connects over JMAP");
        let state = aamp_bridge::mailbox::Position::at(mailbox.current_state().await.unwrap());
        Peer {
            account,
            sender,
            mailbox,
            state,
            inbox: Vec::new(),
        }
    }

    pub fn dispatch_to(&self, to: &str, title: &str, body: &str) -> AampMessage {
        AampMessage::dispatch(
            uuid::Uuid::new_v4().to_string(),
            &self.account.email,
            to,
            Dispatch {
                title: title.into(),
                body_text: body.into(),
                ..Dispatch::default()
            },
        )
    }

    /// Sends `msg`; returns it with its Message-ID filled in.
    pub async fn send(&self, mut msg: AampMessage) -> AampMessage {
        msg.envelope.message_id = self.sender.send(&msg).await.expect("peer sends over SMTP");
        msg
    }

    /// Sends `msg` with files attached.
    pub async fn send_files(
        &self,
        mut msg: AampMessage,
        files: &[aamp_bridge::protocol::OutgoingFile],
    ) -> AampMessage {
        msg.envelope.message_id = self
            .sender
            .send_with(&msg, files)
            .await
            .expect("peer sends over SMTP");
        msg
    }

    /// Waits until a message of `intent` for `task_id` has arrived and returns it.
    pub async fn wait_for(&mut self, task_id: &str, intent: Intent) -> Inbound {
        self.wait_for_within(task_id, intent, WAIT).await
    }

    /// [`Peer::wait_for`] with a deadline of its own.
    pub async fn wait_for_within(
        &mut self,
        task_id: &str,
        intent: Intent,
        wait: Duration,
    ) -> Inbound {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(found) = self
                .inbox
                .iter()
                .find(|i| i.message.task_id() == task_id && i.message.intent() == intent)
            {
                return found.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no {intent} for {task_id} within {wait:?}; got: {:#?}",
                self.inbox
                    .iter()
                    .map(|i| (i.message.intent(), i.message.task_id().to_string()))
                    .collect::<Vec<_>>()
            );
            let (new, state) = self
                .mailbox
                .fetch_since(&self.state, 50)
                .await
                .expect("peer polls");
            self.state = state;
            if new.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.inbox.extend(new);
        }
    }

    /// Waits until everything sent to this peer before now has arrived: `via` (another
    /// account) mails a marker, and when it is in, the mails submitted before it are too
    /// (the one Postfix queue delivers in order). For checking that nothing more comes.
    pub async fn settle(&mut self, via: &Account) {
        let sender = Sender::new(via).unwrap();
        let marker = format!("marker-{}", uuid::Uuid::new_v4());
        let mut msg = AampMessage {
            envelope: Envelope {
                version: protocol::VERSION.into(),
                task_id: marker.clone(),
                from: via.email.clone(),
                to: vec![self.account.email.clone()],
                message_id: String::new(),
                subject: String::new(),
                in_reply_to: None,
                references: vec![],
                received_body: None,
            },
            body: Body::CardQuery {
                text: "marker".into(),
            },
        };
        msg.envelope.subject = msg.subject();
        sender.send(&msg).await.expect("the marker is sent");
        self.wait_for(&marker, Intent::CardQuery).await;
    }

    /// A `task.cancel` of `dispatch`, from this peer to `agent`.
    pub fn cancel_of(&self, dispatch: &AampMessage, agent: &str) -> AampMessage {
        let mut cancel = AampMessage::reply(
            &dispatch.envelope,
            &self.account.email,
            Body::Cancel {
                reason: "stop".into(),
            },
        );
        cancel.envelope.to = vec![agent.to_string()];
        cancel
    }

    /// Sends raw RFC 5322 bytes from this peer's account to `to`.
    pub async fn send_raw(&self, to: &str, message_id: &str, bytes: Vec<u8>) {
        let mail = protocol::RenderedMail {
            from: self.account.email.clone(),
            to: vec![to.to_string()],
            message_id: message_id.to_string(),
            bytes,
        };
        self.sender
            .submit(&mail)
            .await
            .expect("peer sends raw mail");
    }

    /// Everything received so far for `task_id`, as intents in arrival order.
    pub fn intents_for(&self, task_id: &str) -> Vec<Intent> {
        self.inbox
            .iter()
            .filter(|i| i.message.task_id() == task_id)
            .map(|i| i.message.intent())
            .collect()
    }

    /// The raw header fields of a received mail, read over JMAP.
    pub async fn raw_headers(&self, email_id: &str) -> Vec<(String, String)> {
        let mut client = aamp_bridge::mailbox::jmap::JmapClient::new(&self.account).unwrap();
        client.connect().await.unwrap();
        let reply = client
            .call(
                "Email/get",
                serde_json::json!({"ids": [email_id], "properties": ["headers"]}),
            )
            .await
            .unwrap();
        reply["list"][0]["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["name"].as_str().unwrap().to_string(),
                    h["value"].as_str().unwrap().trim().to_string(),
                )
            })
            .collect()
    }
}

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .rev()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A TCP port the OS says is free now (the machine may run other servers).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts one of the test servers in tests/hosts (`python3 SCRIPT ARGS`), which prints a line
/// starting `listening` once it serves; returns it then.
pub fn spawn_test_server(script: &str, args: &[std::ffi::OsString]) -> Child {
    let mut child = Command::new("python3")
        .arg(repo().join("tests/hosts").join(script))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("python3 runs tests/hosts/{script}: {e}"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("listening"),
        "tests/hosts/{script} did not start: {line:?}"
    );
    child
}

/// The AAMP test host (tests/hosts/aamp_host.py) in front of the shared mail host: the helper
/// API with task streams, recording every action it receives.
pub struct AampHost {
    child: Child,
    pub url: String,
    pub record: PathBuf,
    _dir: tempfile::TempDir,
}

impl AampHost {
    pub fn start() -> AampHost {
        AampHost::start_with(&[])
    }

    /// With more arguments for tests/hosts/aamp_host.py (`--no-push`).
    pub fn start_with(extra: &[&str]) -> AampHost {
        let host = shared_host();
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("actions.jsonl");
        // A free port from the OS, handed to the host.
        let port = free_port();
        let jmap = host
            .jmap_url
            .trim_end_matches("/.well-known/jmap")
            .to_string();
        let mut args: Vec<std::ffi::OsString> = [
            "--port",
            &port.to_string(),
            "--record",
            record.to_str().unwrap(),
            "--jmap",
            &jmap,
            "--mailhost",
            repo().join("scripts/mailhost.sh").to_str().unwrap(),
            "--domain",
            &host.domain,
            "--smtp",
            &format!("127.0.0.1:{}", host.smtp_port),
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.extend(extra.iter().map(Into::into));
        let child = spawn_test_server("aamp_host.py", &args);
        AampHost {
            child,
            url: format!("http://127.0.0.1:{port}"),
            record,
            _dir: dir,
        }
    }

    /// The actions received so far, in order.
    pub fn actions(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for AampHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `profile` on `task`, collecting the stream events it sends.
pub async fn run_collecting(
    profile: &aamp_bridge::runner::Profile,
    task: &aamp_bridge::runner::TaskInput,
    cancel: &tokio_util::sync::CancellationToken,
) -> (
    Result<aamp_bridge::runner::RunOutput, aamp_bridge::runner::RunError>,
    Vec<aamp_bridge::runner::StreamEvent>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let collect = async move {
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        events
    };
    let go = async move {
        let result = aamp_bridge::runner::run(profile, task, cancel, &tx).await;
        drop(tx);
        result
    };
    tokio::join!(go, collect)
}

/// The text of all `text.delta` events, joined.
pub fn text_of(events: &[aamp_bridge::runner::StreamEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            aamp_bridge::runner::StreamEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// A TCP port in front of the mail host's submission port that a test can close (new
/// connections are refused and open ones cut, as when the server is down) and open again.
pub struct Gate {
    pub port: u16,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    live: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Gate {
    pub fn new(target: u16) -> Gate {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let done = Arc::new(AtomicBool::new(false));
        let live = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (open2, done2, live2) = (open.clone(), done.clone(), live.clone());
        std::thread::spawn(move || {
            let mut listener = Some(listener);
            while !done2.load(Ordering::SeqCst) {
                match (&listener, open2.load(Ordering::SeqCst)) {
                    (Some(_), false) => listener = None, // closed: connections are refused
                    (None, true) => {
                        listener = std::net::TcpListener::bind(("127.0.0.1", port)).ok();
                    }
                    _ => {}
                }
                let Some(l) = &listener else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                l.set_nonblocking(true).unwrap();
                match l.accept() {
                    Ok((client, _)) => {
                        if !open2.load(Ordering::SeqCst) {
                            continue; // closed meanwhile: refused
                        }
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
                            continue;
                        };
                        live2.lock().unwrap().push(client.try_clone().unwrap());
                        let (mut c2, mut s2) =
                            (client.try_clone().unwrap(), server.try_clone().unwrap());
                        let (mut c, mut s) = (client, server);
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut c, &mut s);
                            let _ = s.shutdown(std::net::Shutdown::Both);
                        });
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut s2, &mut c2);
                            let _ = c2.shutdown(std::net::Shutdown::Both);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Gate {
            port,
            open,
            done,
            live,
        }
    }

    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        // Connections a client keeps open (an SMTP pool) are cut too.
        for stream in self.live.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// Whether a process is still running (a zombie waiting for its parent counts as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to WAIT for `cond`, looking every 50 ms.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The lines of a file (none when it does not exist).
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Hands `data` to the mail host's inbound (MX) port as another server would: plain SMTP, no
/// login, any envelope and headers. What a forger can do.
pub fn inject_mx(host: &MailHost, from: &str, to: &str, data: &str) {
    inject_mx_as(host, "forger.test", from, to, data)
}

/// [`inject_mx`] with the EHLO name `ehlo`, which Postfix copies into its own Received field.
pub fn inject_mx_as(host: &MailHost, ehlo: &str, from: &str, to: &str, data: &str) {
    use std::io::{BufRead, Write};
    let stream = std::net::TcpStream::connect(("127.0.0.1", host.mx_port)).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let expect = |code: &str, reader: &mut BufReader<std::net::TcpStream>| loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with(code), "expected {code}, got {line:?}");
        if line.as_bytes().get(3) != Some(&b'-') {
            break;
        }
    };
    expect("220", &mut reader);
    for (command, code) in [
        (format!("EHLO {ehlo}"), "250"),
        (format!("MAIL FROM:<{from}>"), "250"),
        (format!("RCPT TO:<{to}>"), "250"),
        ("DATA".to_string(), "354"),
    ] {
        write!(writer, "{command}\r\n").unwrap();
        expect(code, &mut reader);
    }
    let body = data.replace("\r\n", "\n").replace('\n', "\r\n");
    write!(writer, "{body}\r\n.\r\n").unwrap();
    expect("250", &mut reader);
    write!(writer, "QUIT\r\n").unwrap();
}

/// Where `scripts/test-agents.sh` installs the third-party agents and SDKs (installing them
/// the first time).
pub fn test_agents() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("scripts/test-agents.sh"))
            .output()
            .expect("bash runs scripts/test-agents.sh");
        assert!(
            out.status.success(),
            "installing the test agents failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}
