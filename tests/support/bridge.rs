//! A config folder and a running bridge process, read through its --json events.

use super::*;

/// A folder holding a config, its password file and any profiles.
pub struct ConfigDir {
    pub dir: tempfile::TempDir,
}

impl ConfigDir {
    pub fn new(host: &MailHost, config: &str) -> ConfigDir {
        let dir = ConfigDir::empty();
        dir.write_private("password", &host.password);
        dir.write_config(config);
        dir
    }

    /// A folder with nothing in it yet.
    pub fn empty() -> ConfigDir {
        ConfigDir {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Writes a secret file, mode 0600 (as the config loader requires).
    pub fn write_private(&self, name: &str, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
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

    /// Writes the profile `name` (`toml`) and makes the config's agents run it instead of
    /// `echo`.
    pub fn use_profile(&self, name: &str, toml: &str) {
        self.write(name, toml);
        let config = std::fs::read_to_string(self.config()).unwrap();
        self.write(
            "config.toml",
            &config.replace("profile = \"echo\"", &format!("profile = {name:?}")),
        );
    }

    /// Replaces a secret file as a careful person does (a new file renamed over the old), so
    /// a reader never sees it half written.
    pub fn replace_private(&self, name: &str, text: &str) {
        let fresh = format!("{name}.new");
        self.write_private(&fresh, text);
        std::fs::rename(self.dir.path().join(fresh), self.dir.path().join(name)).unwrap();
    }

    /// Makes the config's agents run an agent that answers with its task's text once the
    /// file it returns exists (so a test decides when an answer is ready).
    pub fn use_gated_profile(&self) -> PathBuf {
        let gate = self.dir.path().join("gate");
        let script = "import os, sys, time\\nwhile not os.path.exists(sys.argv[1]):\\n    time.sleep(0.02)\\nprint(sys.stdin.read())";
        self.use_profile(
            "gated.toml",
            &format!(
                "command = \"python3\"\nargs = [\"-c\", \"{script}\", {:?}]\nstdin = \"{{{{prompt}}}}\"\ntimeout_secs = 120\n",
                gate.display().to_string()
            ),
        );
        gate
    }

    /// `aamp-bridge status --json`, parsed.
    pub fn status_json(&self) -> Value {
        let status = self.run(&["status", "--json"]);
        serde_json::from_str(&status).unwrap_or_else(|e| panic!("status --json: {e}: {status}"))
    }

    /// Asserts `status` shows the first agent's mailbox refused: `auth_failed`, and the
    /// credentials in use as not working (issue 37).
    pub fn assert_status_refused(&self) {
        let status = self.status_json();
        assert!(status.to_string().contains("auth_failed"), "{status}");
        assert_eq!(
            status["agents"][0]["link"]["credentials"]["worked"], false,
            "{status}"
        );
    }

    /// `aamp-bridge --config CONFIG ARGS...`: what it printed on stdout, whatever its exit.
    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new(bin())
            .arg("--config")
            .arg(self.config())
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// `aamp-bridge start --json` as a child process, with its events readable.
pub struct Bridge {
    child: Child,
    events: mpsc::Receiver<Value>,
    pub seen: Vec<Value>,
    stderr_path: PathBuf,
}

/// The binary under test: this build's, or the one `AAMP_BRIDGE_UNDER_TEST` names (to show
/// a test fails on an older build: `AAMP_BRIDGE_UNDER_TEST=/path/to/old cargo test --test T`).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("AAMP_BRIDGE_UNDER_TEST")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_aamp-bridge").to_string())
    })
}

impl Bridge {
    /// Starts the bridge and waits until every agent is ready.
    pub fn start(config: &ConfigDir, agents: usize) -> Bridge {
        Bridge::start_with_env(config, agents, &[])
    }

    /// The same, with more environment (which its agents inherit).
    pub fn start_with_env(config: &ConfigDir, agents: usize, env: &[(&str, &str)]) -> Bridge {
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
            .envs(env.iter().copied())
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
        self.wait_count_of(name, n, |e| e["event"] == name)
    }

    /// Waits until `n` events that satisfy `pred` have been seen; `name` names them in a
    /// failure.
    pub fn wait_count_of(&mut self, name: &str, n: usize, pred: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + WAIT;
        while self.seen.iter().filter(|e| pred(e)).count() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match blocking(|| self.events.recv_timeout(left)) {
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
        self.wait_for(name, |e| e["event"] == name && pred(e))
    }

    /// Waits for an event (of any name) that satisfies `pred`; `what` names it in a failure.
    pub fn wait_for(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let name = what;
        if let Some(e) = self.seen.iter().find(|e| pred(e)) {
            return e.clone();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match blocking(|| self.events.recv_timeout(left)) {
                Ok(e) => {
                    self.seen.push(e.clone());
                    if pred(&e) {
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

    /// Takes in every event the bridge has printed so far, without waiting.
    pub fn take_events(&mut self) {
        while let Ok(e) = self.events.try_recv() {
            self.seen.push(e);
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Waits (up to WAIT, without blocking the runtime) until the log says `text`.
    pub async fn wait_log(&self, text: &str) {
        poll_until(&format!("the bridge's log says {text:?}"), || {
            self.log().contains(text)
        })
        .await
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
        blocking(|| self.wait_exit_here())
    }

    fn wait_exit_here(&mut self) -> std::process::ExitStatus {
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
        blocking(|| self.terminate_here())
    }

    fn terminate_here(&mut self) -> std::process::ExitStatus {
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
