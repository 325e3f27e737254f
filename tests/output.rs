//! When whoever reads the bridge's output goes away: `aamp-bridge start 2>&1 | tee log` whose
//! tee died, a dropped `ssh`, `aamp-bridge status | head`. The process goes on (or ends
//! quietly), over the real mail host and the real binary.

mod support;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aamp_bridge::protocol::Intent;
use support::{bin, mailhost, ConfigDir, Peer, WAIT};

/// The grace the bridges here are given to stop.
const GRACE_SECS: u64 = 5;

/// Starts `aamp-bridge start --json` with stdout and stderr on one pipe, reads it until the
/// agent is ready, then closes the pipe's only read end.
fn start_then_close_reader(dir: &ConfigDir) -> Child {
    let (reader, writer) = std::io::pipe().unwrap();
    let child = {
        let mut command = Command::new(bin());
        command
            .args([
                "--config",
                dir.config().to_str().unwrap(),
                "start",
                "--json",
            ])
            .env("AAMP_BRIDGE_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(writer.try_clone().unwrap())
            .stderr(writer);
        // The command (and with it this process's copy of the write end) is dropped here.
        command.spawn().expect("the bridge starts")
    };
    let (tx, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(reader);
        let mut line = String::new();
        while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
            if line.contains("\"event\":\"agent.ready\"") {
                let _ = tx.send(());
                // The reader goes away: the pipe's read end is closed with it.
                return;
            }
            line.clear();
        }
    });
    support::blocking(|| ready.recv_timeout(WAIT))
        .expect("the bridge's agent.ready event on its stdout");
    child
}

/// A child process killed when the test ends, however it ends: none outlives the suite.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `max` for `child` to exit, looking every 20 ms without blocking the runtime.
async fn exit_within(child: &mut Child, max: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + max;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_whose_output_reader_left_answers_and_stops_at_sigterm() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let config = support::one_agent(host, &agent, "echo-prompt", &boss.email)
        .top(&format!("shutdown_grace_secs = {GRACE_SECS}"));
    let dir = ConfigDir::new(host, &config.text());
    let mut child = Killed(start_then_close_reader(&dir));

    let mut peer = Peer::new(boss).await;
    let dispatch = peer.dispatch_to(&agent.email, "After the reader left", "Still there?");
    let dispatch = peer.send(dispatch).await;
    let task_id = dispatch.task_id().to_string();
    peer.wait_for(&task_id, Intent::TaskAck).await;
    peer.wait_for(&task_id, Intent::TaskResult).await;

    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    let asked = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = exit_within(&mut child.0, Duration::from_secs(GRACE_SECS)).await;
    let status = status.expect("the bridge exits within its grace after SIGTERM");
    println!("stopped {:?} after SIGTERM, with {status}", asked.elapsed());
    assert!(status.success(), "{status}");

    // What it logged after the reader left is in the state directory's log.
    let log = std::fs::read_to_string(dir.dir.path().join("state/bridge.log"))
        .expect("the state directory's log");
    assert!(log.contains("stderr is closed"), "{log}");
    assert!(log.contains("stdout is closed"), "{log}");
    assert!(log.contains(&task_id), "{log}");
    assert!(log.contains("SIGTERM received"), "{log}");
}

/// `aamp-bridge --config CONFIG ARGS...` with its stdout on a pipe whose read end is already
/// closed (a `| head` that has its lines): (exit code, stderr).
fn run_with_stdout_closed(dir: &ConfigDir, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(bin())
        .arg("--config")
        .arg(dir.config())
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `aamp-bridge --config CONFIG ARGS...`: (exit code, stdout).
fn run(dir: &ConfigDir, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin())
        .arg("--config")
        .arg(dir.config())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn every_command_ends_quietly_when_its_reader_left() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let config = support::one_agent(host, &agent, "echo", &boss.email);
    let dir = ConfigDir::new(host, &config.text());
    let mut panicked = Vec::new();
    for args in [
        &["service", "status"][..],
        &["service", "render"],
        &["completions", "bash"],
        &["man"],
        &["status"],
        &["status", "--json"],
        &["tasks"],
        &["usage"],
        &["usage", "--csv"],
        &["doctor"],
        &["doctor", "--json"],
        &["agents"],
        &["policy", "list", "--agent", "agent"],
        &["profile", "list"],
        &["--help"],
    ] {
        let (code, stderr) = run_with_stdout_closed(&dir, args);
        println!("{args:?}: exit {code:?}");
        if code == Some(101) || stderr.contains("panicked") {
            panicked.push(format!("{args:?}: exit {code:?}: {stderr}"));
        }
    }
    assert!(panicked.is_empty(), "{panicked:#?}");
}

#[test]
fn tasks_before_the_first_start_are_none_yet() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let config = support::one_agent(host, &agent, "echo", &boss.email);
    let dir = ConfigDir::new(host, &config.text());
    let (code, said) = run(&dir, &["tasks"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.starts_with("no tasks yet"), "{said}");
    let (code, said) = run(&dir, &["tasks", "--json"]);
    assert_eq!((code, said.trim()), (Some(0), "[]"));
    // Nothing spent yet either: an empty report, its cost unknown (issue 45).
    let (code, said) = run(&dir, &["usage", "--json"]);
    assert_eq!(code, Some(0), "{said}");
    let report: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(report["rows"], serde_json::json!([]));
    assert_eq!(report["total"]["totalTokens"], 0);
    assert_eq!(report["total"]["costUsd"], "unknown");
    assert!(
        !dir.dir.path().join("state/journal.sqlite3").exists(),
        "looking made no journal"
    );
}

#[test]
fn reload_says_what_did_not_take_effect_and_whether_new_credentials_work() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let config = support::one_agent(host, &agent, "echo", &boss.email);
    let dir = ConfigDir::new(host, &config.text());
    let bridge = support::Bridge::start(&dir, 1);

    dir.replace_private("password", "not-the-password");
    let (code, said) = run(&dir, &["reload"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("credentials reloaded for agent, but the server REFUSED them"),
        "{said}"
    );

    // The bridge may have read the right password again itself before the reload: either
    // way the reload says they work.
    dir.replace_private("password", &host.password);
    let (code, said) = run(&dir, &["reload"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("credentials reloaded for agent, and they work")
            || said.contains("credentials of agent unchanged, and they work"),
        "{said}"
    );

    // A new agent does not start at a reload: it is said, not only logged.
    let helper = host.user("helper");
    let config = config.host_mailbox(host, "helper", &helper, "").agent(
        "helper",
        "echo",
        &[&boss.email],
        "",
    );
    dir.write_config(&config.text());
    let (code, said) = run(&dir, &["reload"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("reloaded agents: agent"), "{said}");
    assert!(
        said.contains("agent helper: not started: a new agent starts at the next restart"),
        "{said}"
    );
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_checks_your_own_mailbox_and_agents_that_take_no_task() {
    let Some(host) = mailhost() else { return };
    let (agent, closed, boss, me) = (
        host.user("agent"),
        host.user("closed"),
        host.user("boss"),
        host.user("me"),
    );
    let config = support::Toml::new()
        .host_mailbox(host, "agent", &agent, "")
        .agent("agent", "echo", &[&boss.email], "")
        .host_mailbox(host, "closed", &closed, "")
        .agent("closed", "echo", &[], "")
        .host_mailbox(host, "me", &me, "");
    let dir = ConfigDir::new(host, &config.text());
    // A stranger's task to `agent`, rejected: every task it had so far.
    let bridge = support::Bridge::start(&dir, 2);
    let mut stranger = Peer::new(host.user("stranger")).await;
    let dispatch = stranger.dispatch_to(&agent.email, "Let me in", "Hello?");
    let task_id = stranger.send(dispatch).await.task_id().to_string();
    stranger.wait_for(&task_id, Intent::TaskResult).await;
    assert!(bridge.stop().success());

    let (_, said) = run(&dir, &["doctor", "--json"]);
    let checks: Vec<serde_json::Value> = serde_json::from_str(&said).expect(&said);
    let find = |name: &str| {
        checks
            .iter()
            .find(|c| c["check"] == name)
            .unwrap_or_else(|| panic!("no {name} check: {said}"))
    };
    assert_eq!(find("mailbox me: JMAP")["status"], "ok", "{said}");
    assert_eq!(find("mailbox me: SMTP")["status"], "ok", "{said}");
    let closed = find("agent closed: senders");
    assert_eq!(closed["status"], "warn");
    assert!(
        closed["detail"]
            .as_str()
            .unwrap()
            .contains("no sender may dispatch to it"),
        "{closed}"
    );
    let rejected = find("agent agent: senders");
    assert_eq!(rejected["status"], "warn");
    assert!(
        rejected["detail"]
            .as_str()
            .unwrap()
            .contains("newest tasks were all rejected"),
        "{rejected}"
    );
    let echo = find("agent agent")["detail"].as_str().unwrap().to_string();
    assert!(!echo.contains("not known"), "{echo}");
    assert!(echo.contains("a demo agent"), "{echo}");
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_sender_writes_cannot_break_up_a_log_line() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let config = support::one_agent(host, &agent, "echo", &boss.email);
    let dir = ConfigDir::new(host, &config.text());
    let bridge = support::Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;
    let title = "one\u{2028}two\u{2029}three\u{85}four\u{1b}[2Jfive";
    let dispatch = peer.dispatch_to(&agent.email, title, "six\u{2028}seven\u{b}eight");
    let task_id = peer.send(dispatch).await.task_id().to_string();
    peer.wait_for(&task_id, Intent::TaskResult).await;
    let log = bridge.log();
    assert!(bridge.stop().success());
    let raw: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(['\u{2028}', '\u{2029}', '\u{85}', '\u{b}', '\u{1b}']))
        .collect();
    println!(
        "{} log lines, {} with a raw separator or control character",
        log.lines().count(),
        raw.len()
    );
    assert!(raw.is_empty(), "{raw:#?}");
    assert!(
        log.contains(r"one\u{2028}two"),
        "the title is in the log, escaped"
    );
}
