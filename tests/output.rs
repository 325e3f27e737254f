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
    ready
        .recv_timeout(WAIT)
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

/// Waits up to `max` for `child` to exit.
fn exit_within(child: &mut Child, max: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + max;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
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
    let status = exit_within(&mut child.0, Duration::from_secs(GRACE_SECS));
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
