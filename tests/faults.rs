//! The fault suite: what the journal and trust work promise, shown under faults, against the
//! real mail host and a real bridge. Each test prints its counts. The CI form is bounded; a
//! long run is `AAMP_FAULTS_SCALE=10 cargo test --release --test faults -- --nocapture`
//! (under `scripts/test.sh`'s mail host), and `AAMP_FAULTS_SEED=N` replays a run's kill points.
//!
//! Every run asserts: no admitted task lost, none answered twice, exactly one terminal
//! message per task, no panic, the bridge still answers afterwards, memory back near its
//! idle level. (No process left behind is checked by `scripts/test.sh` after the suite.)

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use aamp_bridge::protocol::Intent;
use support::{cpu_ticks, mailhost, rss_kib, Bridge, ConfigDir, Peer, PrivateHost};

fn scale() -> usize {
    std::env::var("AAMP_FAULTS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// A small seeded generator (xorshift), so a run's choices can be replayed.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("AAMP_FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        println!("fault suite seed: {seed} (AAMP_FAULTS_SEED={seed} replays it)");
        Rng(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Results and acks per TaskId in a peer's inbox, counted as distinct messages (by
/// Message-ID): a mail the server accepted just before a SIGKILL, whose sending the journal
/// could not record, goes out again with the same Message-ID, and readers drop the copy (AAMP
/// receivers de-duplicate). Those copies are counted in the third value.
fn tally(peer: &Peer, ids: &[String]) -> (HashMap<String, usize>, HashMap<String, usize>, usize) {
    let mut results = HashMap::new();
    let mut acks = HashMap::new();
    let mut copies = 0;
    for id in ids {
        for (intent, into) in [
            (Intent::TaskResult, &mut results),
            (Intent::TaskAck, &mut acks),
        ] {
            let all: Vec<&str> = peer
                .inbox
                .iter()
                .filter(|m| m.message.task_id() == id && m.message.intent() == intent)
                .map(|m| m.message.envelope.message_id.as_str())
                .collect();
            let distinct: std::collections::HashSet<&str> = all.iter().copied().collect();
            copies += all.len() - distinct.len();
            into.insert(id.clone(), distinct.len());
        }
    }
    (results, acks, copies)
}

/// One hostile mail: (what it is, TaskId the bridge should answer, if any, the bytes).
fn hostile(i: usize, from: &str, to: &str) -> (&'static str, Option<String>, Vec<u8>) {
    let id = format!("hostile-{i}-{}", uuid::Uuid::new_v4().simple());
    let mid = format!("<{id}@fault.test>");
    let head = |task: &str, extra: &str| {
        format!(
            "From: {from}\r\nTo: {to}\r\nSubject: [AAMP Task] fault {i}\r\nMessage-ID: {mid}\r\nX-AAMP-Version: 1.1\r\nX-AAMP-Intent: task.dispatch\r\nX-AAMP-TaskId: {task}\r\n{extra}"
        )
    };
    let plain =
        "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nplease answer\r\n";
    match i % 13 {
        0 => ("valid", Some(id.clone()), format!("{}{plain}", head(&id, "")).into_bytes()),
        1 => (
            "unterminated multipart",
            Some(id.clone()),
            format!("{}MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"b1\"\r\n\r\n--b1\r\nContent-Type: text/plain\r\n\r\nhalf a body\r\n--b1\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n\r\nAAAA", head(&id, "")).into_bytes(),
        ),
        2 => {
            let long: String = (0..1500).map(|n| format!(" word{n}\r\n")).collect();
            ("60 KB folded header", Some(id.clone()), format!("{}X-Long:{long}{plain}", head(&id, "")).into_bytes())
        }
        3 => (
            "bad base64 body",
            Some(id.clone()),
            format!("{}MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n!!!not*base64###\r\n", head(&id, "")).into_bytes(),
        ),
        4 => (
            "broken encoded-words",
            Some(id.clone()),
            format!("{}{plain}", head(&id, "X-AAMP-Session-Key: =?utf-8?B?!!!?=\r\nX-AAMP-Priority: =?x-unknown?Q?high?=\r\n")).into_bytes(),
        ),
        5 => {
            let text = format!("{}{plain}", head(&id, "")).replace(&format!("Message-ID: {mid}\r\n"), "");
            ("no Message-ID", Some(id.clone()), text.into_bytes())
        }
        6 => {
            let refs: String = (0..5000).map(|n| format!(" <r{n}.{i}@refs.test>")).collect();
            ("5,000 References", Some(id.clone()), format!("{}References:{refs}\r\n{plain}", head(&id, "")).into_bytes())
        }
        7 => {
            let many: Vec<String> = (0..10_000).map(|n| format!("u{n}@many.test")).collect();
            let text = format!("{}{plain}", head(&id, "")).replace(&format!("To: {to}\r\n"), &format!("To: {to}, {}\r\n", many.join(", ")));
            ("10,000 recipients", Some(id.clone()), text.into_bytes())
        }
        8 => {
            let mut body = String::new();
            for d in 0..200 {
                body.push_str(&format!("--n{d}\r\nContent-Type: multipart/mixed; boundary=\"n{}\"\r\n\r\n", d + 1));
            }
            body.push_str("--n200\r\nContent-Type: text/plain\r\n\r\ndeep\r\n");
            ("200 nested multiparts", Some(id.clone()), format!("{}MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"n0\"\r\n\r\n{body}", head(&id, "")).into_bytes())
        }
        9 => {
            let mut bytes = head(&id, "X-AAMP-Session-Key: s\u{1}").into_bytes();
            bytes.truncate(bytes.len() - 3);
            bytes.extend_from_slice(b"\xff\xfe\xc3\r\nX-AAMP-Dispatch-Context: k=\xff\xff\r\n");
            bytes.extend_from_slice(plain.as_bytes());
            ("invalid UTF-8 in AAMP headers", Some(id.clone()), bytes)
        }
        10 => {
            let text = format!("{}{plain}", head(&id, "")).replace(&format!("X-AAMP-TaskId: {id}\r\n"), "");
            ("no TaskId", None, text.into_bytes())
        }
        11 => {
            let text = format!("{}{plain}", head(&id, "")).replace("task.dispatch", "task.explode");
            ("unknown intent", None, text.into_bytes())
        }
        _ => {
            let big = "0123456789abcdef".repeat(131_072); // 2 MiB
            ("2 MiB body", Some(id.clone()), format!("{}MIME-Version: 1.0\r\nContent-Type: text/plain\r\n\r\n{big}\r\n", head(&id, "")).into_bytes())
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_mails_through_the_live_daemon() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, marker) = (host.user("agent"), host.user("boss"), host.user("marker"));
    let dir = ConfigDir::new(
        host,
        &format!(
            "{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\nmax_concurrent_tasks = 4\nmax_queued_tasks = 100000\n",
            host.mailbox_toml_with("agent", &agent, "save_sent = false\n"),
            boss.email
        ),
    );
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;
    // A warm-up of one mail of each kind: every path has run once, and its working set (the
    // runtime's threads, connection buffers, the journal's page cache) is the idle level.
    let mut warm = Vec::new();
    for i in 0..13 {
        let (_, task, bytes) = hostile(i, &boss.email, &agent.email);
        peer.send_raw(&agent.email, &format!("<warm-{i}@fault.test>"), bytes)
            .await;
        warm.extend(task);
    }
    for id in &warm {
        peer.wait_for_within(id, Intent::TaskResult, Duration::from_secs(600))
            .await;
    }
    bridge.wait_count("task.completed", warm.len());
    let idle = rss_kib(bridge.pid());
    // 520: 40 of each of the 13 kinds, twice the 260 that showed the memory kept without
    // the idle trim (+12.6 MiB, over the 6 MiB allowed below). The CI run sent 1,040 until
    // issue 44; that proved nothing more and took two minutes of the suite.
    let total = 520 * scale();
    let mut kinds: HashMap<&str, usize> = HashMap::new();
    let (mut expected, mut silent) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for i in 0..total {
        let (kind, task, bytes) = hostile(i, &boss.email, &agent.email);
        *kinds.entry(kind).or_default() += 1;
        peer.send_raw(&agent.email, &format!("<hostile-{i}@fault.test>"), bytes)
            .await;
        match task {
            Some(id) => expected.push(id),
            None => silent.push(i),
        }
    }
    for id in &expected {
        peer.wait_for_within(id, Intent::TaskResult, Duration::from_secs(600))
            .await;
    }
    peer.settle(&marker).await;
    let (results, acks, copies) = tally(&peer, &expected);
    assert_eq!(copies, 0, "no kill here, so no mail goes out twice");
    let twice: Vec<_> = results.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "tasks not answered exactly once: {twice:?}"
    );
    assert!(acks.values().all(|n| *n <= 1), "an ack sent twice");
    // The mails without a usable TaskId got nothing back.
    let others: Vec<String> = peer
        .inbox
        .iter()
        .filter(|m| {
            !expected
                .iter()
                .chain(&warm)
                .any(|id| id == m.message.task_id())
        })
        .filter(|m| m.message.envelope.from != marker.email) // the settle marker
        .map(|m| {
            format!(
                "{} {:?} {:?}",
                m.message.intent(),
                m.message.task_id(),
                m.message.envelope.in_reply_to
            )
        })
        .collect();
    assert!(
        others.is_empty(),
        "answers to mails that are not tasks: {others:?}"
    );
    // Still answering, no panic, memory back near idle once the tasks are done.
    let after = peer
        .send(peer.dispatch_to(&agent.email, "After", "still there?"))
        .await;
    peer.wait_for(after.task_id(), Intent::TaskResult).await;
    let log = bridge.log();
    assert!(!log.contains("panicked"), "a panic:\n{log}");
    // Memory back to its idle level: the bridge gives freed heap back once no task runs.
    // What may stay is bounded, not proportional to the load: the journal's SQLite page
    // cache (2 MiB at most) filling as the journal grew, and a few runtime threads' stacks.
    // Without the trim, 260 mails left +12.6 MiB.
    let pid = bridge.pid();
    let peak = rss_kib(pid);
    let allowed = idle + 6 * 1024;
    let deadline = Instant::now() + Duration::from_secs(30);
    let rss = loop {
        let now = rss_kib(pid);
        if now <= allowed || Instant::now() > deadline {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if rss > allowed {
        // What was still held (a busy slot stops the idle trim) says which cause it was.
        let status = dir.run(&["status", "--json"]);
        panic!(
            "memory did not come back: idle {idle} KiB, at the end of the run {peak} KiB, 30 s later {rss} KiB\nstatus: {status}"
        );
    }
    // No worker spins once the work is done: under 5 % of a core over two seconds.
    let before = cpu_ticks(pid);
    // A measurement window, not a wait for anything.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let busy = cpu_ticks(pid) - before;
    assert!(busy <= 10, "the idle bridge used {busy} CPU ticks in 2 s");
    bridge.wait_event("task.completed", |e| e["taskId"] == after.task_id());
    assert!(bridge.stop().success());
    println!(
        "fault suite: hostile mails: {total} sent in {:.1}s ({} kinds: {kinds:?}); {} tasks answered once each, {} not tasks and not answered; duplicates 0; private memory idle {} KiB, at the end of the run {} KiB, then {} KiB; {} CPU ticks in 2 s idle",
        started.elapsed().as_secs_f64(),
        kinds.len(),
        expected.len(),
        silent.len(),
        idle,
        peak,
        rss,
        busy
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn random_kills_of_the_bridge_lose_nothing_and_answer_once() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, marker) = (host.user("agent"), host.user("boss"), host.user("marker"));
    let dir = ConfigDir::new(host, "");
    let record = dir.dir.path().join("runs.jsonl");
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/scripted_cli.py");
    dir.write(
        "slow.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}, \"--record\", {:?}, \"--linger\", \"0.3\"]\nstdin = \"{{{{prompt}}}}\"\n",
            cli.display(),
            record.display()
        ),
    );
    dir.write_config(&format!(
        "{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"slow.toml\"\nallow_from = [\"{}\"]\nmax_concurrent_tasks = 3\n",
        host.mailbox_toml_with("agent", &agent, "save_sent = false\n"),
        boss.email
    ));
    let mut rng = Rng::new();
    let mut peer = Peer::new(boss.clone()).await;
    let tasks = 30 * scale();
    let kills = 4 * scale();
    let mut ids = Vec::new();
    let mut bridge = Bridge::start(&dir, 1);
    let mut killed = 0;
    for i in 0..tasks {
        let msg = peer
            .send(peer.dispatch_to(
                &agent.email,
                &format!("Task {i}"),
                &format!("task number {i}"),
            ))
            .await;
        ids.push(msg.task_id().to_string());
        // A kill at a random point among the dispatches.
        if killed < kills && rng.below(tasks as u64 / kills as u64 + 1) == 0 {
            // The fault's timing, not a wait for something: the bridge dies wherever it is.
            tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
            bridge.kill();
            killed += 1;
            bridge = Bridge::start(&dir, 1);
        }
    }
    while killed < kills {
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        bridge.kill();
        killed += 1;
        bridge = Bridge::start(&dir, 1);
    }
    for id in &ids {
        peer.wait_for_within(id, Intent::TaskResult, Duration::from_secs(300))
            .await;
    }
    peer.settle(&marker).await;
    let (results, acks, copies) = tally(&peer, &ids);
    let not_once: Vec<_> = results.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        not_once.is_empty(),
        "results not exactly one per task: {not_once:?}"
    );
    let acks_not_once: Vec<_> = acks.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        acks_not_once.is_empty(),
        "acks not exactly one per task: {acks_not_once:?}"
    );
    // Runs: a task the kill interrupted runs again, at most twice in all; none more. A task
    // whose agent was killed both times before it even wrote its record line (kills close
    // together) was answered "interrupted", not left unanswered.
    let lines = support::lines(&record);
    let mut runs: HashMap<&str, usize> = HashMap::new();
    for id in &ids {
        let n = lines.iter().filter(|l| l.contains(id.as_str())).count();
        runs.insert(id, n);
    }
    assert!(runs.values().all(|n| *n <= 2), "runs per task: {runs:?}");
    for (id, _) in runs.iter().filter(|(_, n)| **n == 0) {
        let answer = peer
            .inbox
            .iter()
            .find(|m| m.message.task_id() == *id && m.message.intent() == Intent::TaskResult)
            .expect("answered");
        match &answer.message.body {
            aamp_bridge::protocol::Body::Result(r) => assert!(
                r.status == aamp_bridge::protocol::Status::Rejected
                    && r.error
                        .as_deref()
                        .unwrap_or_default()
                        .contains("interrupted"),
                "{id} never ran but was answered {r:?}"
            ),
            other => panic!("{other:?}"),
        }
    }
    let reruns = runs.values().filter(|n| **n == 2).count();
    let never_ran = runs.values().filter(|n| **n == 0).count();
    assert!(!bridge.log().contains("panicked"));
    assert!(bridge.stop().success());
    println!(
        "fault suite: kills: {tasks} tasks, {killed} SIGKILLs and restarts, {} runs ({reruns} tasks run again after a kill, {never_ran} killed twice before their agent started and answered as interrupted), {} results and {} acks (exactly one each); {copies} mails went out again with their Message-ID (accepted by the server in the instant before a kill)",
        runs.values().sum::<usize>(),
        results.values().sum::<usize>(),
        acks.values().sum::<usize>()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mail_host_restarted_under_load_loses_nothing() {
    let Some(_) = mailhost() else { return };
    let private = PrivateHost::start("faults");
    let host = &private.0;
    let (agent, boss, marker) = (host.user("agent"), host.user("boss"), host.user("marker"));
    let dir = ConfigDir::new(
        host,
        &format!(
            "{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\nmax_concurrent_tasks = 2\n",
            host.mailbox_toml_with("agent", &agent, "poll_interval_secs = 1\n"),
            boss.email
        ),
    );
    let bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss.clone()).await;
    let tasks = 20 * scale();
    let mut ids = Vec::new();
    for i in 0..tasks {
        let msg = peer
            .send(peer.dispatch_to(&agent.email, &format!("Load {i}"), "under load"))
            .await;
        ids.push(msg.task_id().to_string());
        if i == tasks / 2 {
            private.stop();
            private.restart();
        }
    }
    for id in &ids {
        peer.wait_for_within(id, Intent::TaskResult, Duration::from_secs(300))
            .await;
    }
    peer.settle(&marker).await;
    let (results, acks, copies) = tally(&peer, &ids);
    assert!(results.values().all(|n| *n == 1), "results: {results:?}");
    assert!(acks.values().all(|n| *n == 1), "acks: {acks:?}");
    assert!(!bridge.log().contains("panicked"));
    assert!(bridge.stop().success());
    println!(
        "fault suite: host restart: {tasks} tasks, the mail host stopped and started once mid-way, {} results, {} acks (exactly one each), {copies} sent again",
        results.values().sum::<usize>(),
        acks.values().sum::<usize>()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_printing_100_mb_is_answered_and_memory_stays_bounded() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    dir.write(
        "flood.toml",
        "command = \"python3\"\nargs = [\"-c\", \"import sys\\nchunk = 'x' * 65536 + '\\\\n'\\nfor _ in range(1600): sys.stdout.write(chunk)\\n\"]\ntimeout_secs = 120\n",
    );
    dir.write_config(&format!(
        "{}[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"flood.toml\"\nallow_from = [\"{}\"]\n",
        host.mailbox_toml("agent", &agent),
        boss.email
    ));
    let mut bridge = Bridge::start(&dir, 1);
    let idle = rss_kib(bridge.pid());
    let mut peer = Peer::new(boss.clone()).await;
    let msg = peer
        .send(peer.dispatch_to(&agent.email, "Flood", "print a lot"))
        .await;
    // Resident memory sampled while the agent floods its pipe.
    let pid = bridge.pid();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                peak = peak.max(rss_kib(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let done = bridge.wait_event("task.completed", |e| e["taskId"] == msg.task_id());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let peak = sampler.join().unwrap().max(idle);
    let result = peer.wait_for(msg.task_id(), Intent::TaskResult).await;
    let size = result.message.to_json().to_string().len();
    assert!(
        size < 30 * 1024 * 1024,
        "the answer is capped: {size} bytes"
    );
    assert!(
        peak < idle + 200 * 1024,
        "memory while reading 100 MB: idle {idle} KiB, peak {peak} KiB"
    );
    assert!(bridge.stop().success());
    println!(
        "fault suite: 100 MB of stdout: answered {} ({} bytes of result), rss idle {idle} KiB, after {peak} KiB",
        done["status"], size
    );
}
