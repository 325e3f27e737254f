//! The person's side: what happened to a task, and what the bridge is doing, read from the
//! state directory of a real bridge over the real mail host, running and stopped.

mod support;

use aamp_bridge::protocol::Intent;
use support::{mailhost, Bridge, ConfigDir, Peer};

fn cli(dir: &ConfigDir, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(support::bin())
        .args(["--config", dir.config().to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_task_show_and_status_tell_what_happened() {
    let Some(host) = mailhost() else { return };
    let (agent, failing, boss) = (host.user("agent"), host.user("failing"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    dir.write("fails.toml", "command = \"sh\"\nargs = [\"-c\", \"echo starting >&2; echo 'disk on fire' >&2; exit 3\"]\n");
    dir.write(
        "config.toml",
        &format!(
            "state_dir = \"state\"\n{}{}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\n\n[[agents]]\nname = \"failing\"\nmailbox = \"failing\"\nprofile = \"fails.toml\"\nallow_from = [\"{}\"]\n",
            host.mailbox_toml("agent", &agent),
            host.mailbox_toml("failing", &failing),
            boss.email,
            boss.email
        ),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let bridge = Bridge::start(&dir, 2);
    let ok = peer
        .send(peer.dispatch_to(&agent.email, "Fine", "hello"))
        .await;
    let bad = peer
        .send(peer.dispatch_to(&failing.email, "Broken", "hello"))
        .await;
    peer.wait_for(ok.task_id(), Intent::TaskResult).await;
    peer.wait_for(bad.task_id(), Intent::TaskResult).await;

    let status = cli(&dir, &["status", "--json"]);
    assert_eq!(status["running"], true);
    assert_eq!(status["pid"], bridge.pid().to_string());
    // Live figures come from the daemon's owner-only control socket.
    assert_eq!(status["source"], "daemon", "{status}");
    assert_eq!(status["daemon"]["pid"], bridge.pid(), "{status}");
    assert_eq!(status["agents"][0]["slots"]["maxConcurrent"], 1, "{status}");
    {
        use std::os::unix::fs::PermissionsExt;
        let socket = dir.dir.path().join("state/control.sock");
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The timeline reads while the bridge runs, too.
    let live = cli(&dir, &["task", "show", ok.task_id(), "--json"]);
    assert!(
        live[0]["timeline"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{live}"
    );
    assert!(bridge.stop().success());

    let status = cli(&dir, &["status", "--json"]);
    assert_eq!(status["running"], false, "{status}");
    assert_eq!(status["source"], "state files", "{status}");
    assert!(
        !dir.dir.path().join("state/control.sock").exists(),
        "removed at stop"
    );
    let first = &status["agents"][0];
    assert_eq!(first["agent"], "agent");
    assert_eq!(first["mailbox"], agent.email.as_str());
    assert_eq!(first["unsent"], 0);
    assert!(first["link"]["mailbox"].is_string(), "{status}");

    let tasks = cli(&dir, &["tasks", "--json"]);
    let states: Vec<(&str, &str)> = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["taskId"].as_str().unwrap(), t["state"].as_str().unwrap()))
        .collect();
    assert!(states.contains(&(ok.task_id(), "answered")), "{states:?}");
    assert!(states.contains(&(bad.task_id(), "rejected")), "{states:?}");

    let shown = cli(&dir, &["task", "show", ok.task_id(), "--json"]);
    let steps: Vec<&str> = shown[0]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["what"].as_str().unwrap())
        .collect();
    for step in [
        "received from",
        "queued task.ack",
        "sent task.ack",
        "run 1 started",
        "agent started",
        "finished: answered",
        "sent task.result",
    ] {
        assert!(
            steps.iter().any(|s| s.starts_with(step)),
            "{step}: {steps:?}"
        );
    }
    assert_eq!(
        shown[0]["task"]["messageId"],
        ok.envelope.message_id.as_str()
    );
    let times: Vec<i64> = shown[0]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["atMs"].as_i64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "in time order");

    let failed = cli(&dir, &["task", "show", bad.task_id(), "--json"]);
    let stderr = failed[0]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["what"] == "agent stderr (last lines)")
        .expect("the failed agent's stderr is in its timeline");
    assert!(
        stderr["detail"].as_str().unwrap().contains("disk on fire"),
        "{stderr}"
    );

    // Plain text for people, too.
    let out = std::process::Command::new(support::bin())
        .args([
            "--config",
            dir.config().to_str().unwrap(),
            "task",
            "show",
            bad.task_id(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("finished: rejected") && text.contains("disk on fire"),
        "{text}"
    );
}

#[test]
fn the_version_names_the_commit_and_completions_are_printed() {
    let out = std::process::Command::new(support::bin())
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("aamp-bridge 0.") && text.contains("(commit "),
        "{text}"
    );
    let out = std::process::Command::new(support::bin())
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("aamp-bridge"));
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_names_each_problem_with_its_fix() {
    let Some(host) = mailhost() else { return };
    let (good, wrong) = (host.user("good"), host.user("wrong"));
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = ConfigDir::new(host, "");
    dir.write("wrong-password", "not-the-password");
    dir.write(
        "missing.toml",
        "command = \"no-such-agent-binary\"\ninstall = \"npm install -g no-such-agent\"\n",
    );
    let wrong_box = host.mailbox_toml("wrong", &wrong).replace(
        "password_file = \"password\"",
        "password_file = \"wrong-password\"",
    );
    let unreachable = format!(
        "[mailboxes.unreachable]\nemail = \"nobody@example.test\"\njmap_url = \"http://127.0.0.1:{closed}/.well-known/jmap\"\npassword_file = \"password\"\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {closed}\nsmtp_security = \"plain\"\n"
    );
    // A server without push: the AAMP test host's JMAP, with push hidden from the session.
    let no_push = support::AampHost::start_with(&["--no-push"]);
    let pushless = host
        .mailbox_toml("pushless", &good)
        .replace(&host.jmap_url, &format!("{}/.well-known/jmap", no_push.url));
    // An HTTPS server whose certificate nobody trusts (the mail host's self-signed one).
    // Bound to a port the OS picks, which the server prints.
    let tls_dir = std::env::var("MAILHOST_DIR").unwrap_or_else(|_| "/tmp/aamp-mailhost".into());
    let mut tls_server = std::process::Command::new("python3")
        .args([
            "-c",
            "import http.server, ssl, sys\ns = http.server.HTTPServer(('127.0.0.1', 0), http.server.SimpleHTTPRequestHandler)\nc = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\nc.load_cert_chain(sys.argv[1], sys.argv[2])\ns.socket = c.wrap_socket(s.socket, server_side=True)\nprint(s.server_address[1], flush=True)\ns.serve_forever()",
            &format!("{tls_dir}/tls/cert.pem"),
            &format!("{tls_dir}/tls/key.pem"),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(tls_server.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let tls_port: u16 = line.trim().parse().expect("the TLS server prints its port");
    let untrusted = unreachable
        .replace("[mailboxes.unreachable]", "[mailboxes.untrusted]")
        .replace(
            &format!("http://127.0.0.1:{closed}/"),
            &format!("https://127.0.0.1:{tls_port}/"),
        );
    let text = format!(
        "state_dir = \"state\"\n{}{wrong_box}{unreachable}{untrusted}{pushless}\n[[agents]]\nname = \"good\"\nmailbox = \"good\"\nprofile = \"echo\"\n\n[[agents]]\nname = \"wrong\"\nmailbox = \"wrong\"\nprofile = \"echo\"\n\n[[agents]]\nname = \"far\"\nmailbox = \"unreachable\"\nprofile = \"missing.toml\"\n\n[[agents]]\nname = \"pushless\"\nmailbox = \"pushless\"\nprofile = \"echo\"\n\n[[agents]]\nname = \"doubted\"\nmailbox = \"untrusted\"\nprofile = \"echo\"\n",
        host.mailbox_toml_with("good", &good, "push = false\n")
    );
    dir.write("config.toml", &text);
    {
        use std::os::unix::fs::PermissionsExt;
        let file = dir.dir.path().join("wrong-password");
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let out = std::process::Command::new(support::bin())
        .args([
            "--config",
            dir.config().to_str().unwrap(),
            "doctor",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed check fails the command"
    );
    let _ = tls_server.kill();
    let _ = tls_server.wait();
    let checks: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let find = |name: &str| {
        checks
            .iter()
            .find(|c| c["check"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {checks:#?}"))
            .clone()
    };
    assert_eq!(find("mailbox good: JMAP")["status"], "ok");
    assert_eq!(find("mailbox good: SMTP")["status"], "ok");
    let push = find("mailbox good: push");
    assert_eq!(push["status"], "warn");
    assert!(
        push["detail"].as_str().unwrap().contains("polling"),
        "{push}"
    );
    let pushless = find("mailbox pushless: push");
    assert_eq!(pushless["status"], "warn", "{pushless}");
    assert!(
        pushless["detail"]
            .as_str()
            .unwrap()
            .contains("offers no JMAP push")
            && pushless["fix"]
                .as_str()
                .unwrap()
                .contains("poll_interval_secs"),
        "{pushless}"
    );
    for part in ["JMAP", "SMTP"] {
        let c = find(&format!("mailbox wrong: {part}"));
        assert_eq!(c["status"], "fail", "{c}");
        assert!(
            c["fix"]
                .as_str()
                .unwrap()
                .contains("refused the login: check the address (or login) and the password"),
            "{c}"
        );
        let c = find(&format!("mailbox unreachable: {part}"));
        assert_eq!(c["status"], "fail", "{c}");
        assert!(c["fix"].as_str().unwrap().contains("runs"), "{c}");
    }
    // Told by the error's cause, not by its words.
    let tls = find("mailbox untrusted: JMAP");
    assert_eq!(tls["status"], "fail", "{tls}");
    assert!(
        tls["fix"].as_str().unwrap().contains("insecure_tls"),
        "{tls}"
    );
    let agent = find("agent far");
    assert_eq!(agent["status"], "fail");
    assert!(
        agent["fix"]
            .as_str()
            .unwrap()
            .contains("npm install -g no-such-agent"),
        "{agent}"
    );
    assert_eq!(find("agent good")["status"], "ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_service_unit_verifies_and_its_exec_start_runs_the_bridge() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &format!(
            "{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\n",
            host.mailbox_toml("agent", &agent),
            boss.email
        ),
    );
    let home = tempfile::tempdir().unwrap();
    let aamp = |args: &[&str]| {
        std::process::Command::new(support::bin())
            .args(["--config", dir.config().to_str().unwrap()])
            .args(args)
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join(".config"))
            .output()
            .unwrap()
    };
    // Installing writes the unit; with no systemd user manager here, enabling it fails and
    // says why.
    let installed = aamp(&["service", "install"]);
    let unit_path = home.path().join(".config/systemd/user/aamp-bridge.service");
    let unit = std::fs::read_to_string(&unit_path).expect("the unit is written");
    if !installed.status.success() {
        let why = String::from_utf8_lossy(&installed.stderr);
        assert!(why.contains("systemctl") && why.contains("linger"), "{why}");
    }
    // systemd-analyze checks the unit as the user manager would load it (it needs a runtime
    // folder); it reports a bad line on stderr, so a clean unit says nothing at all.
    let runtime = tempfile::tempdir().unwrap();
    let verify = std::process::Command::new("systemd-analyze")
        .args(["verify", "--user"])
        .arg(&unit_path)
        .env("HOME", home.path())
        .env("XDG_RUNTIME_DIR", runtime.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
    // Installing again leaves the file as it is, and registers it again: a first run whose
    // enabling failed (no user manager then) is finished by a second one once there is one.
    let again = aamp(&["service", "install"]);
    assert_eq!(
        std::fs::read_to_string(&unit_path).unwrap(),
        unit,
        "the unit is unchanged"
    );
    if installed.status.success() {
        assert!(
            String::from_utf8_lossy(&again.stdout).contains("already installed, and enabled"),
            "{}",
            String::from_utf8_lossy(&again.stdout)
        );
    } else {
        let why = String::from_utf8_lossy(&again.stderr);
        assert!(
            !again.status.success() && why.contains("daemon-reload"),
            "enabling is tried again, and says why it failed: {why}"
        );
    }
    let status = aamp(&["service", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    if installed.status.success() {
        assert_eq!(status["ok"], true, "{status}");
    } else {
        // Issue 33: a unit written but never enabled (no user manager) is not "ok" (status
        // exited 0 here); the manager's absence is the problem, with its fix.
        assert_eq!(status["ok"], false, "{status}");
        assert!(
            status["problems"][0]["fix"]
                .as_str()
                .unwrap()
                .contains("enable-linger"),
            "{status}"
        );
    }

    // What systemd would run: the ExecStart line, with the unit's PATH.
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    let words: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(words[0], support::bin());
    let mut bridge = std::process::Command::new(words[0])
        .args(&words[1..])
        .arg("--json")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(bridge.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("agent.ready") {
        line.clear();
    }
    assert!(
        line.contains("agent.ready"),
        "the service's command starts the bridge"
    );
    let mut peer = Peer::new(boss.clone()).await;
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Via the unit", "hello"))
        .await;
    peer.wait_for(task.task_id(), Intent::TaskResult).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(bridge.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(bridge.wait().unwrap().success());

    // A unit left by another binary is reported with its fix.
    std::fs::write(&unit_path, unit.replace(support::bin(), "/old/aamp-bridge")).unwrap();
    let status = aamp(&["service", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["ok"], false);
    assert!(
        status["problems"][0]["fix"]
            .as_str()
            .unwrap()
            .contains("service install"),
        "{status}"
    );

    // Issue 33: a unit the package installed (systemd's search path: /usr/lib/systemd/user,
    // $XDG_DATA_DIRS/systemd/user) is the service when there is none of one's own: status
    // sees it (it said "no service is installed" and offered to write a second, shadowing
    // one) and names what differs from this binary and config.
    std::fs::remove_file(&unit_path).unwrap();
    let data = tempfile::tempdir().unwrap();
    let packaged = data.path().join("systemd/user/aamp-bridge.service");
    std::fs::create_dir_all(packaged.parent().unwrap()).unwrap();
    std::fs::write(
        &packaged,
        unit.replace(&exec.to_string(), &format!("{} start", support::bin())),
    )
    .unwrap();
    let status = std::process::Command::new(support::bin())
        .args(["--config", dir.config().to_str().unwrap()])
        .args(["service", "status", "--json"])
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env("XDG_DATA_DIRS", data.path())
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["packaged"], packaged.to_str().unwrap(), "{status}");
    assert_eq!(status["file"], packaged.to_str().unwrap(), "{status}");
    assert_eq!(status["ok"], false, "{status}");
    let problem = status["problems"][0]["problem"].as_str().unwrap();
    assert!(
        problem.contains("the package's unit") && problem.contains("default config"),
        "this config is not the default one: {status}"
    );

    // The launchd agent is a valid property list with the keys launchd needs.
    let plist = aamp(&["service", "render", "--launchd"]);
    let check = std::process::Command::new("python3")
        .args(["-c", "import plistlib,sys; p=plistlib.loads(sys.stdin.buffer.read()); assert p['Label'] and p['ProgramArguments'][-1]=='start' and p['KeepAlive']=={'SuccessfulExit': False} and p['RunAtLoad'] and p['ThrottleInterval'] and 'PATH' in p['EnvironmentVariables'] and p['StandardErrorPath'].endswith('.log'), p"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    check
        .stdin
        .as_ref()
        .unwrap()
        .write_all(&plist.stdout)
        .unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// A `systemctl` that answers as a user manager would (this machine runs none): `is-enabled`
/// and `is-active` say what FAKE_ENABLED and FAKE_ACTIVE hold; FAKE_MANAGER=0 is no manager.
fn fake_systemctl(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("systemctl");
    std::fs::write(
        &script,
        r#"#!/bin/sh
for a in "$@"; do verb=$a; case $a in --*) ;; *) break ;; esac; done
case "$2" in
  show-environment) [ "${FAKE_MANAGER:-1}" = 1 ] && exit 0
    echo "Failed to connect to bus: No medium found" >&2; exit 1 ;;
  is-enabled) echo "${FAKE_ENABLED:-disabled}"; [ "$FAKE_ENABLED" = enabled ] && exit 0; exit 1 ;;
  is-active) echo "${FAKE_ACTIVE:-inactive}"; [ "$FAKE_ACTIVE" = active ] && exit 0; exit 3 ;;
  *) exit 0 ;;
esac
"#,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Issue 33: `service status` said all was well (exit 0) for a unit that was written but
/// never enabled, or not running; it asks the service manager now, and says why with a fix.
#[test]
fn service_status_asks_the_manager_whether_the_unit_is_enabled_and_running() {
    let dir = ConfigDir::empty();
    dir.write_config("");
    let home = tempfile::tempdir().unwrap();
    let fake = tempfile::tempdir().unwrap();
    fake_systemctl(fake.path());
    let path = format!("{}:/usr/bin:/bin", fake.path().display());
    let aamp = |args: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new(support::bin())
            .args(["--config", dir.config().to_str().unwrap()])
            .args(args)
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join(".config"))
            .env("XDG_DATA_DIRS", home.path())
            .env("PATH", &path)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, said) = aamp(&["service", "install"], &[]);
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = aamp(
        &["service", "status"],
        &[("FAKE_ENABLED", "disabled"), ("FAKE_ACTIVE", "inactive")],
    );
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("not enabled (disabled)"), "{said}");
    assert!(said.contains("not running (inactive)"), "{said}");
    assert!(said.contains("fix: aamp-bridge service start"), "{said}");
    let (code, said) = aamp(
        &["service", "status", "--json"],
        &[("FAKE_ENABLED", "enabled"), ("FAKE_ACTIVE", "failed")],
    );
    assert_eq!(code, Some(1), "{said}");
    let json: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(json["problems"].as_array().unwrap().len(), 1, "{json}");
    assert!(
        json["problems"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("not running (failed)"),
        "{json}"
    );
    let (code, said) = aamp(
        &["service", "status", "--json"],
        &[("FAKE_ENABLED", "enabled"), ("FAKE_ACTIVE", "active")],
    );
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = aamp(&["service", "status"], &[("FAKE_MANAGER", "0")]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("user manager does not answer"), "{said}");
}

/// Issue 33: launchd starts a failing agent again every ThrottleInterval, forever, and never
/// rotates its logs. Under launchd (XPC_SERVICE_NAME is the label) the bridge rotates a log
/// above 10 MiB at start, and the tenth start within 5 minutes ends the loop (exit 0, which
/// KeepAlive's SuccessfulExit = false does not restart) saying why.
#[test]
fn under_launchd_a_crash_loop_stops_and_the_log_is_rotated() {
    let home = tempfile::tempdir().unwrap();
    let logs = home.path().join("Library/Logs/aamp-bridge");
    std::fs::create_dir_all(&logs).unwrap();
    let log = logs.join("aamp-bridge.log");
    std::fs::write(&log, vec![b'x'; 11 * 1024 * 1024]).unwrap();
    let start = || {
        std::process::Command::new(support::bin())
            .args(["--config", "/nonexistent/config.toml", "start"])
            .env("HOME", home.path())
            .env("XPC_SERVICE_NAME", "com.aamp-bridge")
            .output()
            .unwrap()
    };
    for n in 1..10 {
        let out = start();
        assert_eq!(out.status.code(), Some(1), "start {n} fails: no config");
        assert!(String::from_utf8_lossy(&out.stderr).contains("no config at"));
    }
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        0,
        "emptied in place"
    );
    assert_eq!(
        std::fs::metadata(logs.join("aamp-bridge.log.1"))
            .unwrap()
            .len(),
        11 * 1024 * 1024
    );
    let out = start();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("10 times in 5 minutes"), "{said}");
    // The count starts over: `service start` after a fix gets its ten tries again.
    assert_eq!(start().status.code(), Some(1));
}
