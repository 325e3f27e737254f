//! Exactly once, across crashes and outages: a real `aamp-bridge start` over the real mail
//! host, killed with SIGKILL, cut off from its submission port, fed the same mail again and a
//! hostile header; every task gets one ack and one answer, and runs once (or, killed while it
//! ran, once more by its profile's choice).

mod support;

use std::path::{Path, PathBuf};

use aamp_bridge::config::Account;
use aamp_bridge::protocol::{Body, Intent, Status};
use support::{alive, lines, mailhost, poll_until, Bridge, ConfigDir, Gate, MailHost, Peer};

fn fault_agent() -> String {
    format!("{}/tests/agents/fault_agent.py", env!("CARGO_MANIFEST_DIR"))
}

/// A profile running the fault agent with `args`, written into the config folder.
fn profile(dir: &ConfigDir, name: &str, args: &[&str], extra: &str) -> String {
    let args: Vec<String> = std::iter::once(fault_agent())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| format!("{a:?}"))
        .collect();
    dir.write(
        name,
        &format!(
            "command = \"python3\"\nargs = [{}]\n{extra}\n",
            args.join(", ")
        ),
    );
    name.to_string()
}

/// The config for one agent; `smtp_port` lets a test put a [`Gate`] in front of Postfix.
fn config(
    host: &MailHost,
    agent: &Account,
    profile: &str,
    allow: &str,
    smtp_port: u16,
    agent_extra: &str,
) -> String {
    let mailbox = host.mailbox_toml("agent", agent).replace(
        &format!("smtp_port = {}", host.smtp_port),
        &format!("smtp_port = {smtp_port}"),
    );
    support::Toml::new()
        .top("shutdown_grace_secs = 5")
        .mailbox_text(&mailbox)
        .agent("agent", profile, &[allow], agent_extra)
        .text()
}

fn path(dir: &ConfigDir, name: &str) -> PathBuf {
    dir.dir.path().join(name)
}

fn path_arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn count(intents: &[Intent], intent: Intent) -> usize {
    intents.iter().filter(|i| **i == intent).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_killed_mid_task_runs_it_again_once_and_answers_once() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let (runs, left, release) = (
        path(&dir, "runs"),
        path(&dir, "left"),
        path(&dir, "release"),
    );
    let p = profile(
        &dir,
        "fault.toml",
        &[
            "--runs",
            path_arg(&runs),
            "--leave",
            path_arg(&left),
            "--wait-for",
            path_arg(&release),
        ],
        "",
    );
    dir.write_config(&config(host, &agent, &p, &boss.email, host.smtp_port, ""));
    let mut peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 1);
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Crash", "work that is interrupted"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == task.task_id());
    peer.wait_for(task.task_id(), Intent::TaskAck).await;
    poll_until("the agent runs and left a process behind", || {
        lines(&left).len() == 1
    })
    .await;
    let first_agent: i32 = lines(&runs)[0].parse().unwrap();
    let first_left: i32 = lines(&left)[0].parse().unwrap();
    bridge.kill();

    // The agent dies with the bridge (parent-death signal); what it started in a session of
    // its own is still there until the next start.
    poll_until("the agent dies with the bridge", || !alive(first_agent)).await;
    assert!(alive(first_left), "the escaped process outlives the crash");

    std::fs::write(&release, "").unwrap();
    let mut bridge = Bridge::start(&dir, 1);
    assert!(
        !alive(first_left),
        "the first life's leftover is stopped at start"
    );
    bridge.wait_event("task.recovered", |e| e["taskId"] == task.task_id());
    bridge.wait_event("task.completed", |e| e["taskId"] == task.task_id());
    let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    assert_eq!(
        peer.intents_for(task.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult],
        "one ack (sent before the crash, not again) and one result"
    );
    assert_eq!(lines(&runs).len(), 2, "run once more after the crash");
    for pid in lines(&left) {
        assert!(
            !alive(pid.parse().unwrap()),
            "no process of either run is left"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_whose_profile_must_not_run_twice_is_answered_interrupted() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let runs = path(&dir, "runs");
    let p = profile(
        &dir,
        "once.toml",
        &["--runs", path_arg(&runs), "--sleep", "600"],
        "rerun_interrupted = false",
    );
    dir.write_config(&config(host, &agent, &p, &boss.email, host.smtp_port, ""));
    let mut peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 1);
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Once", "not twice"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == task.task_id());
    poll_until("the agent runs", || lines(&runs).len() == 1).await;
    bridge.kill();

    let bridge = Bridge::start(&dir, 1);
    let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Rejected);
    assert!(
        r.error
            .as_deref()
            .unwrap_or_default()
            .contains("interrupted by a bridge restart"),
        "{:?}",
        r.error
    );
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    assert_eq!(count(&peer.intents_for(task.task_id()), Intent::TaskAck), 1);
    assert_eq!(
        count(&peer.intents_for(task.task_id()), Intent::TaskResult),
        1
    );
    assert_eq!(lines(&runs).len(), 1, "run once only");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_killed_before_its_ack_went_out_acks_once_after_the_restart() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let gate = Gate::new(host.smtp_port);
    let (runs, release) = (path(&dir, "runs"), path(&dir, "release"));
    let p = profile(
        &dir,
        "fault.toml",
        &["--runs", path_arg(&runs), "--wait-for", path_arg(&release)],
        "",
    );
    dir.write_config(&config(host, &agent, &p, &boss.email, gate.port, ""));
    let mut peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 1);
    gate.close();
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Unacked", "the ack cannot leave yet"))
        .await;
    bridge.wait_event("task.received", |e| e["taskId"] == task.task_id());
    bridge.wait_event("mail.retrying", |e| e["intent"] == "task.ack");
    bridge.kill();

    gate.open();
    std::fs::write(&release, "").unwrap();
    let bridge = Bridge::start(&dir, 1);
    let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    assert_eq!(
        peer.intents_for(task.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
    assert!(lines(&runs).len() <= 2, "{:?}", lines(&runs));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_waits_out_a_minute_without_the_submission_port() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let gate = Gate::new(host.smtp_port);
    let release = path(&dir, "release");
    let p = profile(&dir, "fault.toml", &["--wait-for", path_arg(&release)], "");
    dir.write_config(&config(host, &agent, &p, &boss.email, gate.port, ""));
    let mut peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 1);
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Outage", "answer across an outage"))
        .await;
    peer.wait_for(task.task_id(), Intent::TaskAck).await;

    gate.close();
    let closed_at = std::time::Instant::now();
    std::fs::write(&release, "").unwrap();
    bridge.wait_event("task.completed", |e| e["taskId"] == task.task_id());
    bridge.wait_event("mail.retrying", |e| e["intent"] == "task.result");
    // The outage lasts a minute (the fault schedule, not a wait for anything).
    tokio::time::sleep(std::time::Duration::from_secs(60).saturating_sub(closed_at.elapsed()))
        .await;
    gate.open();
    // The outbox retries with backoff (capped at 5 minutes), so the next try comes within
    // about a minute and a quarter of the last failure.
    let result = peer
        .wait_for_within(
            task.task_id(),
            Intent::TaskResult,
            std::time::Duration::from_secs(120),
        )
        .await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed);
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    assert_eq!(
        peer.intents_for(task.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
}

/// Issue 31: after a 45 s SMTP cut, answers went out up to 713 s after SMTP came back, each
/// waiting out its own backoff. Now one waiting answer is tried at least every 5 s while the
/// server is down, and the first that goes through makes every waiting one due: all of them
/// arrive within 15 s of the cut's end.
#[tokio::test(flavor = "multi_thread")]
async fn every_answer_waiting_out_a_45_s_smtp_cut_arrives_within_15_s_of_its_end() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let gate = Gate::new(host.smtp_port);
    dir.write_config(&config(host, &agent, "echo", &boss.email, gate.port, ""));
    let mut peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 1);
    gate.close();
    let cut = std::time::Instant::now();
    let mut tasks = Vec::new();
    for n in 0..10 {
        let sent = peer
            .send(peer.dispatch_to(&agent.email, &format!("Cut {n}"), "answer after the cut"))
            .await;
        tasks.push(sent.task_id().to_string());
    }
    for task in &tasks {
        bridge.wait_event("task.completed", |e| e["taskId"] == task.as_str());
    }
    // The cut lasts 45 s (the fault schedule, not a wait for anything).
    tokio::time::sleep(std::time::Duration::from_secs(45).saturating_sub(cut.elapsed())).await;
    gate.open();
    let back = std::time::Instant::now();
    for task in &tasks {
        peer.wait_for_within(
            task,
            Intent::TaskResult,
            std::time::Duration::from_secs(120),
        )
        .await;
    }
    let took = back.elapsed();
    eprintln!("every answer arrived {took:?} after SMTP came back");
    assert!(
        took <= std::time::Duration::from_secs(15),
        "the last answer arrived {took:?} after SMTP came back"
    );
    // Each outbox line names the mail it is about (issue 31: they named none).
    let log = bridge.log();
    let retries: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("could not send"))
        .collect();
    assert!(!retries.is_empty(), "{log}");
    for line in retries {
        assert!(
            line.contains("outbox{task_id=")
                && line.contains("intent=task.")
                && line.contains("message_id=<"),
            "{line}"
        );
    }
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    for task in &tasks {
        assert_eq!(
            peer.intents_for(task),
            vec![Intent::TaskAck, Intent::TaskResult]
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_mail_five_times_and_the_same_task_after_a_restart_run_once() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let runs = path(&dir, "runs");
    let p = profile(&dir, "fault.toml", &["--runs", path_arg(&runs)], "");
    dir.write_config(&config(host, &agent, &p, &boss.email, host.smtp_port, ""));
    let mut peer = Peer::new(boss).await;
    let bridge = Bridge::start(&dir, 1);
    let mut task = peer.dispatch_to(&agent.email, "Again", "the same mail five times");
    task.envelope.message_id = format!("<five-{}@example.test>", uuid::Uuid::new_v4());
    for _ in 0..5 {
        peer.send(task.clone()).await;
    }
    peer.wait_for(task.task_id(), Intent::TaskResult).await;
    assert!(bridge.stop().success());

    // The same sender and TaskId under a new Message-ID, after a restart: a duplicate.
    let mut bridge = Bridge::start(&dir, 1);
    let mut again = task.clone();
    again.envelope.message_id = String::new();
    peer.send(again).await;
    bridge.wait_event("task.duplicate", |e| e["taskId"] == task.task_id());
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    assert_eq!(
        peer.intents_for(task.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
    assert_eq!(lines(&runs).len(), 1, "run once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_refused_as_busy_runs_when_sent_again() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let (runs, release) = (path(&dir, "runs"), path(&dir, "release"));
    let p = profile(
        &dir,
        "fault.toml",
        &["--runs", path_arg(&runs), "--wait-for", path_arg(&release)],
        "",
    );
    dir.write_config(&config(
        host,
        &agent,
        &p,
        &boss.email,
        host.smtp_port,
        "max_queued_tasks = 1",
    ));
    let mut peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 1);
    let first = peer
        .send(peer.dispatch_to(&agent.email, "First", "keeps the agent busy"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == first.task_id());
    let mut second = peer.dispatch_to(&agent.email, "Second", "comes while busy");
    let sent = peer.send(second.clone()).await;
    let refused = peer.wait_for(sent.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &refused.message.body else {
        panic!("not a result")
    };
    assert!(
        r.error.as_deref().unwrap_or_default().contains("busy"),
        "{:?}",
        r.error
    );
    std::fs::write(&release, "").unwrap();
    peer.wait_for(first.task_id(), Intent::TaskResult).await;

    // The retry the refusal asked for: same TaskId, a new mail.
    peer.inbox.clear();
    second.envelope.message_id = String::new();
    peer.send(second.clone()).await;
    let answer = peer.wait_for(second.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &answer.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    assert!(bridge.stop().success());
    assert_eq!(lines(&runs).len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_of_150_after_a_lost_state_is_answered_once_each() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    dir.write_config(&config(
        host,
        &agent,
        "echo",
        &boss.email,
        host.smtp_port,
        "max_concurrent_tasks = 4\nmax_queued_tasks = 200",
    ));
    let mut peer = Peer::new(boss).await;
    assert!(Bridge::start(&dir, 1).stop().success());
    let cursor_path = dir.dir.path().join("state/agents/agent/jmap-email-state");
    let mut cursor: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cursor_path).unwrap()).unwrap();
    cursor["state"] = serde_json::json!("a-state-the-server-lost");
    std::fs::write(&cursor_path, cursor.to_string()).unwrap();

    let mut tasks = Vec::new();
    for i in 0..150 {
        let sent = peer
            .send(peer.dispatch_to(&agent.email, &format!("Backlog {i}"), "waiting"))
            .await;
        tasks.push(sent.task_id().to_string());
    }
    let mut bridge = Bridge::start(&dir, 1);
    for task in &tasks {
        peer.wait_for_within(
            task,
            Intent::TaskResult,
            std::time::Duration::from_secs(180),
        )
        .await;
    }
    assert!(bridge.log().contains("scanning the Inbox"));
    bridge.wait_event("task.completed", |e| e["taskId"] == tasks[149].as_str());
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    for task in &tasks {
        assert_eq!(
            peer.intents_for(task),
            vec![Intent::TaskAck, Intent::TaskResult],
            "task {task}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_whose_child_holds_its_pipe_ends_at_its_deadline_on_cancel_and_when_done() {
    let Some(host) = mailhost() else { return };
    let boss = host.user("boss");
    let dir = ConfigDir::new(host, "");
    let left = path(&dir, "left");
    let release = path(&dir, "release");
    // Three agents: one that hangs past its 3 s deadline, one that hangs until cancelled,
    // one that answers at once; each leaves `setsid sleep 1000` holding its output.
    profile(
        &dir,
        "hangs.toml",
        &["--leave", path_arg(&left), "--wait-for", path_arg(&release)],
        "timeout_secs = 3",
    );
    profile(&dir, "answers.toml", &["--leave", path_arg(&left)], "");
    let mailboxes = [
        ("deadline", host.user("deadline")),
        ("cancel", host.user("cancel")),
        ("done", host.user("done")),
    ];
    let mut text = String::from("state_dir = \"state\"\nshutdown_grace_secs = 5\n");
    for (name, account) in &mailboxes {
        text.push_str(&host.mailbox_toml(name, account));
        let p = if *name == "done" {
            "answers.toml"
        } else {
            "hangs.toml"
        };
        text.push_str(&format!(
            "[[agents]]\nname = \"{name}\"\nmailbox = \"{name}\"\nprofile = \"{p}\"\nallow_from = [\"{}\"]\n",
            boss.email
        ));
    }
    dir.write("config.toml", &text);
    let mut peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 3);

    let deadline = peer
        .send(peer.dispatch_to(&mailboxes[0].1.email, "Deadline", "hang"))
        .await;
    let cancel = peer
        .send(peer.dispatch_to(&mailboxes[1].1.email, "Cancel", "hang"))
        .await;
    let done = peer
        .send(peer.dispatch_to(&mailboxes[2].1.email, "Done", "answer"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == cancel.task_id());
    peer.wait_for(cancel.task_id(), Intent::TaskAck).await;
    peer.send(peer.cancel_of(&cancel, &mailboxes[1].1.email))
        .await;

    let expect = [
        (&deadline, Status::Rejected, "did not finish within 3s"),
        (&cancel, Status::Rejected, "cancelled"),
        (&done, Status::Completed, ""),
    ];
    for (task, status, error) in expect {
        let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
        let Body::Result(r) = &result.message.body else {
            panic!("not a result")
        };
        assert_eq!(r.status, status, "{}: {:?}", task.envelope.subject, r.error);
        assert!(
            r.error.as_deref().unwrap_or_default().contains(error),
            "{:?}",
            r.error
        );
        if status == Status::Completed {
            assert_eq!(r.output, "done");
        }
    }
    assert!(bridge.stop().success());
    let pids = lines(&left);
    assert_eq!(pids.len(), 3, "{pids:?}");
    for pid in pids {
        assert!(
            !alive(pid.parse().unwrap()),
            "the escaped process {pid} is stopped"
        );
    }
}

/// A dispatch whose References holds a run of 980 blanks inside an id: it froze the daemon
/// before (the reply's header folding underflowed), from any sender.
fn hostile_dispatch(from: &str, to: &str, task_id: &str, message_id: &str) -> Vec<u8> {
    format!(
        "From: {from}\r\nTo: {to}\r\nMessage-ID: {message_id}\r\nSubject: [AAMP Task] hostile\r\nReferences: <a{}b@x.test> <c@x.test>\r\nX-AAMP-Version: 1.1\r\nX-AAMP-Intent: task.dispatch\r\nX-AAMP-TaskId: {task_id}\r\nContent-Type: text/plain\r\n\r\nTask: hostile\r\n",
        " ".repeat(980)
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_with_a_hostile_references_header_is_answered_from_anyone() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, stranger) = (host.user("agent"), host.user("boss"), host.user("stranger"));
    let dir = ConfigDir::new(host, "");
    dir.write_config(&config(
        host,
        &agent,
        "echo",
        &boss.email,
        host.smtp_port,
        "",
    ));
    let mut peer = Peer::new(boss).await;
    let mut outsider = Peer::new(stranger).await;
    let bridge = Bridge::start(&dir, 1);
    let (t1, t2) = ("hostile-allowed", "hostile-unknown");
    let id1 = format!("<{}@example.test>", uuid::Uuid::new_v4());
    let id2 = format!("<{}@example.test>", uuid::Uuid::new_v4());
    let raw = hostile_dispatch(&peer.account.email, &agent.email, t1, &id1);
    assert!(String::from_utf8_lossy(&raw)
        .lines()
        .any(|l| l.len() >= 994));
    peer.send_raw(&agent.email, &id1, raw).await;
    outsider
        .send_raw(
            &agent.email,
            &id2,
            hostile_dispatch(&outsider.account.email, &agent.email, t2, &id2),
        )
        .await;
    let answered = peer.wait_for(t1, Intent::TaskResult).await;
    let Body::Result(r) = &answered.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed);
    let refused = outsider.wait_for(t2, Intent::TaskResult).await;
    let Body::Result(r) = &refused.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Rejected);
    // Still responsive afterwards, and it stops on SIGTERM.
    let normal = peer
        .send(peer.dispatch_to(&agent.email, "After", "still there?"))
        .await;
    peer.wait_for(normal.task_id(), Intent::TaskResult).await;
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_start_on_the_same_state_directory_is_refused_with_the_holders_pid() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    dir.write_config(&config(
        host,
        &agent,
        "echo",
        &boss.email,
        host.smtp_port,
        "",
    ));
    let bridge = Bridge::start(&dir, 1);
    let second = std::process::Command::new(support::bin())
        .args(["--config", dir.config().to_str().unwrap(), "start"])
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains(&format!("pid {}", bridge.pid())),
        "{stderr}"
    );
    assert!(bridge.stop().success());
}

/// Two agents, each running the fault agent until its own release file exists.
fn two_waiting_agents(
    host: &MailHost,
    dir: &ConfigDir,
    boss: &Account,
    grace: u64,
) -> [(String, Account, PathBuf, PathBuf); 2] {
    let mut text = format!("state_dir = \"state\"\nshutdown_grace_secs = {grace}\n");
    let agents = ["first", "second"].map(|name| {
        let account = host.user(name);
        let (runs, release) = (path(dir, &format!("{name}.runs")), path(dir, &format!("{name}.release")));
        let p = profile(
            dir,
            &format!("{name}.toml"),
            &["--runs", path_arg(&runs), "--wait-for", path_arg(&release)],
            "",
        );
        text.push_str(&host.mailbox_toml(name, &account));
        text.push_str(&format!(
            "[[agents]]\nname = \"{name}\"\nmailbox = \"{name}\"\nprofile = \"{p}\"\nallow_from = [\"{}\"]\n",
            boss.email
        ));
        (name.to_string(), account, runs, release)
    });
    dir.write("config.toml", &text);
    agents
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_lets_tasks_finish_within_the_grace_and_keeps_the_rest_for_the_next_start() {
    let Some(host) = mailhost() else { return };
    let boss = host.user("boss");
    let dir = ConfigDir::new(host, "");
    let [(_, quick, _, quick_release), (_, slow, slow_runs, slow_release)] =
        two_waiting_agents(host, &dir, &boss, 5);
    let mut peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 2);
    let a = peer
        .send(peer.dispatch_to(&quick.email, "Quick", "finishes during the stop"))
        .await;
    let b = peer
        .send(peer.dispatch_to(&slow.email, "Slow", "outlasts the stop"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == a.task_id());
    bridge.wait_event("task.started", |e| e["taskId"] == b.task_id());

    bridge.signal(nix::sys::signal::Signal::SIGTERM);
    bridge.wait_event("bridge.stopping", |_| true);
    std::fs::write(&quick_release, "").unwrap();
    assert!(bridge.wait_exit().success());
    assert!(bridge
        .seen
        .iter()
        .any(|e| e["event"] == "task.completed" && e["taskId"] == a.task_id()));
    assert!(
        bridge
            .seen
            .iter()
            .any(|e| e["event"] == "task.interrupted" && e["taskId"] == b.task_id()),
        "{:#?}",
        bridge.seen
    );
    peer.wait_for(a.task_id(), Intent::TaskResult).await;

    std::fs::write(&slow_release, "").unwrap();
    let bridge = Bridge::start(&dir, 2);
    let result = peer.wait_for(b.task_id(), Intent::TaskResult).await;
    let Body::Result(r) = &result.message.body else {
        panic!("not a result")
    };
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    assert!(bridge.stop().success());
    peer.settle(&quick).await;
    for task in [&a, &b] {
        assert_eq!(
            peer.intents_for(task.task_id()),
            vec![Intent::TaskAck, Intent::TaskResult]
        );
    }
    assert_eq!(
        lines(&slow_runs).len(),
        2,
        "the interrupted task ran again after the restart"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_signal_stops_the_tasks_at_once() {
    let Some(host) = mailhost() else { return };
    let boss = host.user("boss");
    let dir = ConfigDir::new(host, "");
    let [(_, first, _, _), _] = two_waiting_agents(host, &dir, &boss, 600);
    let peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 2);
    let task = peer
        .send(peer.dispatch_to(&first.email, "Hangs", "until stopped"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == task.task_id());
    bridge.signal(nix::sys::signal::Signal::SIGTERM);
    bridge.wait_event("bridge.stopping", |_| true);
    bridge.signal(nix::sys::signal::Signal::SIGTERM);
    let started = std::time::Instant::now();
    assert!(bridge.wait_exit().success());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "not the 600 s grace"
    );
    assert!(bridge
        .seen
        .iter()
        .any(|e| e["event"] == "task.interrupted" && e["taskId"] == task.task_id()));
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_the_sender_policy_without_a_restart() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let write = |allow: &str| {
        dir.write(
            "config.toml",
            &format!(
                "state_dir = \"state\"\n{}",
                config(host, &agent, "echo", allow, host.smtp_port, "")
            ),
        )
    };
    write("someone-else@example.test");
    let mut peer = Peer::new(boss).await;
    let mut bridge = Bridge::start(&dir, 1);
    let refused = peer
        .send(peer.dispatch_to(&agent.email, "Before", "not yet allowed"))
        .await;
    let r = peer.wait_for(refused.task_id(), Intent::TaskResult).await;
    assert!(matches!(&r.message.body, Body::Result(r) if r.status == Status::Rejected));

    write(&peer.account.email.clone());
    bridge.signal(nix::sys::signal::Signal::SIGHUP);
    bridge.wait_event("bridge.reloaded", |e| e["agents"][0] == "agent");
    let allowed = peer
        .send(peer.dispatch_to(&agent.email, "After", "allowed now"))
        .await;
    let r = peer.wait_for(allowed.task_id(), Intent::TaskResult).await;
    assert!(matches!(&r.message.body, Body::Result(r) if r.status == Status::Completed));
    assert!(bridge.stop().success());
}

/// Issue 37 over the mail host: the agent's password changed on the server (new logins need
/// the new one; the open SMTP connection is cut, as a server restart would), the new one
/// written to `password_file`, with `reload` (SIGHUP) or without: the answer refused at
/// login and waiting in the outbox, and the task that arrived while JMAP refused the old
/// password, both go out within 5 s. On fb62012 both waited for a restart. Returns the
/// seconds from the new password file to each answer.
async fn a_changed_password_is_used(host: &MailHost, sighup: bool) -> (f64, f64) {
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let gate = Gate::new(host.smtp_port);
    dir.write_config(&config(host, &agent, "echo", &boss.email, gate.port, ""));
    let release = dir.use_gated_profile();
    let mut peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);
    let waiting = peer
        .send(peer.dispatch_to(&agent.email, "Before", "answered late"))
        .await;
    peer.wait_for(waiting.task_id(), Intent::TaskAck).await;
    bridge.wait_event("task.started", |_| true);
    let password = format!("rotated-{}", uuid::Uuid::new_v4().simple());
    host.set_password(&agent, &password);
    gate.close();
    gate.open();
    // The answer is ready only now: its login is refused and it waits in the outbox.
    std::fs::write(&release, "").unwrap();
    bridge.wait_event("mail.retrying", |e| e["intent"] == "task.result");
    // The next task's arrival wakes the intake (push), whose read is then refused: nothing
    // else makes it read JMAP before its reconcile interval, so the task is sent first.
    let next = peer
        .send(peer.dispatch_to(&agent.email, "After", "answered with the new password"))
        .await;
    bridge
        .wait_log("the mail server refused the credentials")
        .await;
    dir.replace_private("password", &password);
    let replaced = std::time::Instant::now();
    if sighup {
        bridge.signal(nix::sys::signal::Signal::SIGHUP);
    }
    let within = std::time::Duration::from_secs(5);
    peer.wait_for_within(waiting.task_id(), Intent::TaskResult, within)
        .await;
    let answered = replaced.elapsed();
    peer.wait_for_within(next.task_id(), Intent::TaskResult, within)
        .await;
    let next_answered = replaced.elapsed();
    let status = dir.status_json();
    assert_eq!(
        status["agents"][0]["link"]["credentials"]["worked"], true,
        "{status}"
    );
    let log = bridge.log();
    assert_eq!(
        log.matches("credentials reloaded for agent").count(),
        1,
        "said once"
    );
    assert!(!log.contains(&password), "never logged");
    assert!(bridge.stop().success());
    // (The agent's account in this test still holds the old password.)
    peer.settle(&host.user("marker")).await;
    for task in [&waiting, &next] {
        assert_eq!(
            peer.intents_for(task.task_id()),
            vec![Intent::TaskAck, Intent::TaskResult],
            "one ack and one answer"
        );
    }
    (answered.as_secs_f64(), next_answered.as_secs_f64())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_changed_and_reloaded_is_used_within_seconds() {
    let Some(host) = mailhost() else { return };
    let (waiting, next) = a_changed_password_is_used(host, true).await;
    eprintln!(
        "SIGHUP to the waiting answer: {waiting:.2} s; to the next task's answer: {next:.2} s"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_changed_on_disk_without_a_reload_is_used_at_the_next_retry() {
    let Some(host) = mailhost() else { return };
    let (waiting, next) = a_changed_password_is_used(host, false).await;
    eprintln!("new password file to the waiting answer: {waiting:.2} s; to the next task's answer: {next:.2} s");
}
