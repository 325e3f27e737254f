//! Several bridges on one mailbox, measured over the real loopback mail host:
//! `cargo bench --bench replicas` (the host must run: `scripts/mailhost.sh start`, as root).
//!
//! - throughput of a burst with 1, 2 and 3 replicas (release bridges, separate state folders),
//!   each with two slots and an agent that sleeps 1 s per task, so the figure is about the
//!   coordination, not CPU: ideal is 2, 4 and 6 tasks/s;
//! - the cost of one claim on the server: its round trips (an `Email/get` of what finds the
//!   mail's copies, one request reading its claim and its copies', and an `Email/set` with
//!   `ifInState`, more when another change came first) and their time, p50 / p90, alone
//!   and with three claimants racing for the same mails.
//!
//! `AAMP_BENCH_TASKS` (default 36) sets the burst; the figures go to stdout and to
//! `target/bench/replicas.json`.

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aamp_bridge::mailbox::aamp::claims::{self, Claim};
use common::*;
use serde_json::json;

/// A config folder for replica `name` of `agent`'s mailbox: two slots, a 1 s agent.
fn replica_config(dir: &Path, agent: &str, boss: &str, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(dir.join("password"), PASSWORD).unwrap();
    std::fs::set_permissions(dir.join("password"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(
        dir.join("sleeper.toml"),
        "command = \"python3\"\nargs = [\"-c\", \"import sys, time; sys.stdin.read(); time.sleep(1); print('done')\"]\nstdin = \"{{prompt}}\"\n",
    )
    .unwrap();
    let text = format!(
        "state_dir = \"state\"\n[mailboxes.a]\nemail = \"{agent}\"\njmap_url = \"{JMAP}\"\npassword_file = \"password\"\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {SMTP_PORT}\nsmtp_security = \"plain\"\nsave_sent = false\nreplica = \"{name}\"\n\n[[agents]]\nname = \"a\"\nmailbox = \"a\"\nprofile = \"sleeper.toml\"\nallow_from = [\"{boss}\"]\nmax_concurrent_tasks = 2\n"
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A release bridge, started and ready.
fn start(config: &Path) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aamp-bridge"))
        .args(["--config", config.to_str().unwrap(), "start", "--json"])
        .env("AAMP_BRIDGE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the bridge starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut ready = Some(tx);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("\"agent.ready\"") {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the bridge is ready");
    child
}

fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

/// Sends `n` dispatches at once and returns the seconds until every result is in.
fn burst(rt: &tokio::runtime::Runtime, boss: &str, agent: &str, n: usize) -> f64 {
    let sender = aamp_bridge::mailbox::aamp::Sender::new(&account(boss)).unwrap();
    let mut reader = aamp_bridge::mailbox::aamp::Reader::new(account(boss)).unwrap();
    rt.block_on(reader.connect()).unwrap();
    burst_run(rt, &sender, &reader, boss, agent, n)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    (sorted[i] * 10.0).round() / 10.0
}

/// Claims `ids` with `claimants` racing (each its own connection and replica name): the
/// time of each claim (ms) and the round trips all of them took.
fn claim_costs(
    rt: &tokio::runtime::Runtime,
    owner: &str,
    ids: &[String],
    claimants: usize,
) -> (Vec<f64>, usize) {
    rt.block_on(async {
        let mut handles = Vec::new();
        for c in 0..claimants {
            let ids = ids.to_vec();
            let account = account(owner);
            handles.push(tokio::spawn(async move {
                let mut jmap = aamp_bridge::mailbox::aamp::jmap::JmapClient::new(&account).unwrap();
                jmap.connect().await.unwrap();
                let mut times = Vec::new();
                let mut trips = 0;
                for id in &ids {
                    let started = Instant::now();
                    let outcome =
                        claims::claim(&jmap, id, &format!("bench{c}"), Duration::from_secs(60))
                            .await
                            .unwrap();
                    times.push(started.elapsed().as_secs_f64() * 1000.0);
                    // A won claim is the copies' look-up, a read and a conditional write; a
                    // lost one the look-up and a read.
                    trips += if outcome == Claim::Won { 3 } else { 2 };
                }
                (times, trips)
            }));
        }
        let mut times = Vec::new();
        let mut trips = 0;
        for h in handles {
            let (t, n) = h.await.unwrap();
            times.extend(t);
            trips += n;
        }
        (times, trips)
    })
}

/// `n` fresh mails in `owner`'s Inbox; their ids.
fn fresh_mails(rt: &tokio::runtime::Runtime, from: &str, owner: &str, n: usize) -> Vec<String> {
    let sender = aamp_bridge::mailbox::aamp::Sender::new(&account(from)).unwrap();
    let mut jmap = aamp_bridge::mailbox::aamp::jmap::JmapClient::new(&account(owner)).unwrap();
    rt.block_on(async {
        jmap.connect().await.unwrap();
        for i in 0..n {
            sender.send(&dispatch(from, owner, i)).await.unwrap();
        }
        let inbox = jmap.inbox_id().await.unwrap();
        loop {
            let ids = jmap.query_mailbox(&inbox, 1000).await.unwrap();
            if ids.len() >= n {
                return ids;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "replicas: a benchmark over the mail host; run it with `cargo bench --bench replicas`"
        );
        return;
    }
    let check = Command::new("bash")
        .arg(repo().join("scripts/mailhost.sh"))
        .arg("check")
        .output()
        .expect("bash runs");
    if !check.status.success() {
        eprintln!(
            "the mail host is not running: start it with `scripts/mailhost.sh start` (as root)"
        );
        std::process::exit(2);
    }
    let tasks: usize = std::env::var("AAMP_BENCH_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(36);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let boss = adduser("rbench-boss");
    let mut report = json!({"tasks": tasks});
    println!("replicas: a burst of {tasks} tasks, agents sleeping 1 s, 2 slots per replica");
    for replicas in 1..=3 {
        let agent = adduser("rbench-agent");
        let dirs: Vec<tempfile::TempDir> = (0..replicas)
            .map(|_| tempfile::tempdir().unwrap())
            .collect();
        let bridges: Vec<Child> = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| start(&replica_config(d.path(), &agent, &boss, &format!("r{i}"))))
            .collect();
        let secs = burst(&rt, &boss, &agent, tasks);
        for b in bridges {
            stop(b);
        }
        let rate = tasks as f64 / secs;
        println!(
            "  {replicas} replica(s): {rate:.2} tasks/s ({secs:.1} s; ideal {} tasks/s)",
            2 * replicas
        );
        report[format!("replicas_{replicas}_tasks_per_s")] = json!((rate * 100.0).round() / 100.0);
    }
    for claimants in [1usize, 3] {
        let owner = adduser("rbench-claims");
        let ids = fresh_mails(&rt, &boss, &owner, 40);
        let ids: Vec<String> = ids.into_iter().take(40).collect();
        let (mut times, trips) = claim_costs(&rt, &owner, &ids, claimants);
        times.sort_by(f64::total_cmp);
        let (p50, p90) = (percentile(&times, 0.5), percentile(&times, 0.9));
        println!(
            "  one claim, {claimants} claimant(s) per mail: p50 {p50} ms, p90 {p90} ms; at least {:.2} round trips per mail (a won claim: copies' look-up + read + conditional write; a lost one: look-up + read; a stateMismatch adds the read and write again)",
            trips as f64 / ids.len() as f64
        );
        report[format!("claim_{claimants}_p50_ms")] = json!(p50);
        report[format!("claim_{claimants}_p90_ms")] = json!(p90);
    }
    let out = repo().join("target/bench");
    let _ = std::fs::create_dir_all(&out);
    std::fs::write(out.join("replicas.json"), report.to_string()).unwrap();
}
