//! The soak (issue 31): two replicas of one agent mailbox on a private mail host, a dispatcher
//! sending at a steady rate, and faults on a schedule of 60 s cycles (see [`faults`]): a
//! `kill -9` of one replica (the two in turn) and its restart every minute, an SMTP cut of
//! `min(45, secs/5)` s between the replicas and the host every third minute, one restart of
//! the whole mail host (runs of 90 s or more), hostile mail every 3 s (a stranger's dispatch, a
//! dispatch forged in the dispatcher's name, a cancel of a running task from a stranger and
//! one forged in the dispatcher's name, a forged delivery report for an answer that went out;
//! all but the stranger's own mail handed to the inbound port) and duplicate deliveries (every
//! 10th dispatch again with the same Message-ID, every 15th again with the same TaskId under a
//! new Message-ID).
//!
//! Counted from the dispatcher's side (its inbox, distinct Message-IDs per TaskId), it prints
//! dispatched / exactly once / twice / lost for acks and results, p50/p99 dispatch→result away
//! from faults and during them, how soon the answers waiting out an SMTP cut came after it,
//! each replica's private memory and open files every 5 s, journal bytes per task and CPU while
//! idle at the end; and asserts none lost, none twice, every task completed (no stranger's
//! cancel stopped one), none run to completion on both replicas (from their events), no
//! panic, memory and files flat, idle CPU low. On a failure (or with `AAMP_SOAK_KEEP_LOGS`)
//! the replicas' logs are kept under the temp folder.
//!
//! `AAMP_SOAK_SECS` (default 100: CI's run, about two minutes in a debug build) and
//! `AAMP_SOAK_RATE` (dispatches a second, default 2). An hour: `scripts/soak.sh`.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use aamp_bridge::config::Account;
use aamp_bridge::protocol::{self, AampMessage, Body, Intent, Status};
use serde_json::Value;
use support::{
    cpu_ticks, forge_report, inject_mx, mailhost, open_fds, rss_kib, Bridge, ConfigDir, Gate,
    MailHost, Peer, PrivateHost,
};

/// The claims' lease: a killed replica's tasks are taken over after it.
const LEASE_SECS: u64 = 10;
/// What a long task takes (every 8th; the ones forged cancels aim at).
const LONG_SECS: f64 = 4.0;
/// A fault's effects outlast it by this much (a lease; links reconnecting after a backoff):
/// a task whose lifetime meets a fault or this long after it counts as "during faults".
const AFTERMATH: Duration = Duration::from_secs(10);
/// How long the end of the run waits for answers still due.
const DRAIN: Duration = Duration::from_secs(300);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A dispatch the dispatcher sent (its first copy), and when.
#[derive(Clone)]
struct Sent {
    msg: AampMessage,
    at: Instant,
    long: bool,
}

/// What the dispatcher's inbox has shown so far: per TaskId, the first ack's and the first
/// result's arrival and Message-ID.
#[derive(Default)]
struct Seen {
    acks: HashMap<String, (Instant, String)>,
    results: HashMap<String, (Instant, String)>,
}

/// State the run's parts share.
struct Shared {
    start: Instant,
    /// No dispatch, fault or hostile mail starts after it.
    end: Instant,
    sent: Mutex<Vec<Sent>>,
    seen: Mutex<Seen>,
    /// Fault windows: what, from, to.
    windows: Mutex<Vec<(String, Instant, Instant)>>,
    /// Held (read) while mail is handed to the host; taken (write) while it restarts.
    host_up: tokio::sync::RwLock<()>,
    /// Each replica's pid, 0 while it is down.
    pids: [AtomicU32; 2],
    polling: AtomicBool,
    sampling: AtomicBool,
}

fn secs_since(shared: &Shared, t: Instant) -> f64 {
    t.saturating_duration_since(shared.start).as_secs_f64()
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// The agent: every task takes 0.2 s, one whose prompt says `[long]` LONG_SECS.
fn agent_files(dir: &ConfigDir) {
    dir.write(
        "agent.py",
        &format!(
            "import sys, time\nprompt = sys.stdin.read()\ntime.sleep({LONG_SECS} if '[long]' in prompt else 0.2)\nprint('done')\n"
        ),
    );
    dir.write(
        "soak.toml",
        &format!(
            "name = \"soak\"\ncommand = \"python3\"\nargs = [{:?}]\nstdin = \"{{{{prompt}}}}\"\ntimeout_secs = 120\n",
            dir.dir.path().join("agent.py").display().to_string()
        ),
    );
}

/// A config folder for replica `name` of the agent's mailbox, sending through `smtp_port`.
fn replica(host: &MailHost, agent: &Account, boss: &str, name: &str, smtp_port: u16) -> ConfigDir {
    let text = support::Toml::new()
        .top("shutdown_grace_secs = 5")
        .host_mailbox(
            host,
            "agent",
            agent,
            &format!("replica = \"{name}\"\nlease_secs = {LEASE_SECS}\n"),
        )
        .agent(
            "agent",
            "soak.toml",
            &[boss],
            "max_concurrent_tasks = 4\nmax_queued_tasks = 100000",
        )
        .text()
        .replace(
            &format!("smtp_port = {}", host.smtp_port),
            &format!("smtp_port = {smtp_port}"),
        );
    let dir = ConfigDir::new(host, &text);
    agent_files(&dir);
    dir
}

/// A dispatch in `from`'s name, as a stranger hands it to the inbound port.
fn forged_dispatch(from: &str, to: &str, task_id: &str) -> String {
    format!(
        "From: {from}\nTo: {to}\nMessage-ID: <{task_id}@forger.test>\nSubject: [AAMP Task] forged\nX-AAMP-Version: 1.1\nX-AAMP-Intent: task.dispatch\nX-AAMP-TaskId: {task_id}\nContent-Type: text/plain\n\nTask: run this\n"
    )
}

/// Sends `msg` while the host is up, again after a failure (for two minutes at most).
async fn send_retrying(shared: &Shared, peer: &Peer, msg: &AampMessage) -> (AampMessage, usize) {
    let mut failures = 0;
    loop {
        {
            let _up = shared.host_up.read().await;
            match peer.try_send(msg.clone()).await {
                Ok(sent) => return (sent, failures),
                Err(e) => {
                    failures += 1;
                    assert!(failures < 120, "the dispatcher cannot send: {e}");
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[derive(Default)]
struct DispatchCounts {
    same_message_id: usize,
    same_task_id: usize,
    send_failures: usize,
}

/// The dispatcher: dispatches at `rate` until the end, every 8th a long one, and the copies
/// of every 10th (same Message-ID) and every 15th (same TaskId, new Message-ID) a few seconds
/// after their first.
async fn dispatcher(shared: Arc<Shared>, peer: Peer, agent: String, rate: f64) -> DispatchCounts {
    let mut counts = DispatchCounts::default();
    let mut copies: Vec<(Instant, AampMessage, bool)> = Vec::new();
    let mut n = 0u64;
    loop {
        let next = shared.start + Duration::from_secs_f64(n as f64 / rate);
        let copy_at = copies.iter().map(|c| c.0).min();
        let original = next < shared.end && copy_at.is_none_or(|c| next <= c);
        let at = match (original, copy_at) {
            (true, _) => next,
            (false, Some(c)) => c,
            (false, None) => break,
        };
        tokio::time::sleep_until(at.into()).await;
        if !original {
            let i = copies.iter().position(|c| c.0 == at).unwrap();
            let (_, msg, same_id) = copies.swap_remove(i);
            let (_, failures) = send_retrying(&shared, &peer, &msg).await;
            counts.send_failures += failures;
            if same_id {
                counts.same_message_id += 1;
            } else {
                counts.same_task_id += 1;
            }
            continue;
        }
        let long = n % 8 == 4;
        let body = if long {
            format!("[long] soak task {n}")
        } else {
            format!("soak task {n}")
        };
        let mut msg = peer.dispatch_to(&agent, &format!("Soak {n}"), &body);
        msg.envelope.message_id = format!("<soak-{n}-{}@soak.test>", uuid::Uuid::new_v4().simple());
        let at = Instant::now();
        let (msg, failures) = send_retrying(&shared, &peer, &msg).await;
        counts.send_failures += failures;
        shared.sent.lock().unwrap().push(Sent {
            msg: msg.clone(),
            at,
            long,
        });
        let now = Instant::now();
        if n % 10 == 9 {
            copies.push((now + Duration::from_secs(n / 10 % 6), msg.clone(), true));
        }
        if n % 15 == 14 {
            let mut again = msg.clone();
            again.envelope.message_id = format!(
                "<soak-{n}-again-{}@soak.test>",
                uuid::Uuid::new_v4().simple()
            );
            copies.push((now + Duration::from_secs(n / 15 % 4 * 3), again, false));
        }
        n += 1;
    }
    counts
}

/// Reads the dispatcher's inbox until told to stop, noting when each ack and result came.
async fn poller(shared: Arc<Shared>, mut peer: Peer) -> Peer {
    let mut read = 0;
    while shared.polling.load(Ordering::SeqCst) {
        match peer.poll().await {
            Ok(0) => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(_) => {
                let now = Instant::now();
                let mut seen = shared.seen.lock().unwrap();
                for m in &peer.inbox[read..] {
                    let into = match m.message.intent() {
                        Intent::TaskAck => &mut seen.acks,
                        Intent::TaskResult => &mut seen.results,
                        _ => continue,
                    };
                    into.entry(m.message.task_id().to_string())
                        .or_insert((now, m.message.envelope.message_id.clone()));
                }
                read = peer.inbox.len();
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    peer
}

#[derive(Default)]
struct Hostile {
    /// The stranger's own dispatches (it is not on the allow list).
    stranger_tasks: Vec<String>,
    /// Dispatches in the dispatcher's name over the inbound port.
    forged_tasks: Vec<String>,
    /// Long tasks a stranger's or a forged cancel aimed at while they ran.
    cancelled: HashSet<String>,
    cancels: usize,
    reports: usize,
}

/// Hostile mail every 3 s until the end.
async fn hostile(
    shared: Arc<Shared>,
    host: Arc<PrivateHost>,
    stranger: Peer,
    boss: String,
    agent: String,
) -> (Hostile, Peer) {
    let host = &host.0;
    let mut h = Hostile::default();
    let mut bounced: HashSet<String> = HashSet::new();
    let mut next = shared.start + Duration::from_secs(2);
    let mut round = 0usize;
    while next < shared.end {
        tokio::time::sleep_until(next.into()).await;
        next += Duration::from_secs(3);
        let _up = shared.host_up.read().await;
        // A stranger's dispatch, from its own mailbox or in the dispatcher's name.
        if round.is_multiple_of(2) {
            let msg = stranger.dispatch_to(&agent, "Let me in", "run this for me");
            if let Ok(sent) = stranger.try_send(msg).await {
                h.stranger_tasks.push(sent.task_id().to_string());
            }
        } else {
            let id = format!("forged-{round}-{}", uuid::Uuid::new_v4().simple());
            tokio::task::block_in_place(|| {
                inject_mx(host, &boss, &agent, &forged_dispatch(&boss, &agent, &id))
            });
            h.forged_tasks.push(id);
        }
        // A cancel of a long task that runs now (acknowledged, not answered).
        let target = {
            let sent = shared.sent.lock().unwrap();
            let seen = shared.seen.lock().unwrap();
            sent.iter()
                .rev()
                .find(|s| {
                    let id = s.msg.task_id();
                    s.long
                        && seen.acks.contains_key(id)
                        && !seen.results.contains_key(id)
                        && !h.cancelled.contains(id)
                })
                .cloned()
        };
        if let Some(target) = target {
            if round.is_multiple_of(2) {
                let cancel = stranger.cancel_of(&target.msg, &agent);
                let _ = stranger.try_send(cancel).await;
            } else {
                let mut cancel = AampMessage::reply(
                    &target.msg.envelope,
                    &boss,
                    Body::Cancel {
                        reason: "stop".into(),
                    },
                );
                cancel.envelope.to = vec![agent.clone()];
                let mail = protocol::render(&cancel, SystemTime::now());
                let text = String::from_utf8_lossy(&mail.bytes).into_owned();
                tokio::task::block_in_place(|| inject_mx(host, &boss, &agent, &text));
            }
            h.cancelled.insert(target.msg.task_id().to_string());
            h.cancels += 1;
        }
        // A report that an answer which went out (an ack or a result, in turn) bounced.
        let answer = {
            let seen = shared.seen.lock().unwrap();
            let answers = if round.is_multiple_of(2) {
                &seen.results
            } else {
                &seen.acks
            };
            answers
                .values()
                .filter(|(_, mid)| !bounced.contains(mid))
                .max_by_key(|(at, _)| *at)
                .map(|(_, mid)| mid.clone())
        };
        if let Some(mid) = answer {
            tokio::task::block_in_place(|| forge_report(host, &agent, &mid, &boss));
            bounced.insert(mid);
            h.reports += 1;
        }
        round += 1;
    }
    (h, stranger)
}

/// The replicas, killed and started again by the fault schedule.
struct Replicas {
    dirs: Arc<Vec<ConfigDir>>,
    bridges: Vec<Option<Bridge>>,
    /// The events and logs of earlier runs of each.
    events: Vec<Vec<Value>>,
    /// (replica, log file, its text), of every run.
    logs: Vec<(usize, String, String)>,
    kills: usize,
}

impl Replicas {
    fn start(&mut self, shared: &Shared, i: usize) {
        let bridge = Bridge::start(&self.dirs[i], 1);
        shared.pids[i].store(bridge.pid(), Ordering::SeqCst);
        self.bridges[i] = Some(bridge);
    }

    fn kill(&mut self, shared: &Shared, i: usize) {
        let mut bridge = self.bridges[i].take().unwrap();
        bridge.take_events();
        self.events[i].append(&mut bridge.seen);
        shared.pids[i].store(0, Ordering::SeqCst);
        bridge.kill();
        self.kills += 1;
        // The logs as they are now, before a start writes a new one.
        for (name, text) in bridge_logs(&self.dirs[i]) {
            self.logs.push((i, name, text));
        }
    }
}

/// The bridge logs in a config folder: (file name, text).
fn bridge_logs(dir: &ConfigDir) -> Vec<(String, String)> {
    std::fs::read_dir(dir.dir.path())
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name.starts_with("bridge-") && name.ends_with(".log"))
                .then(|| (name, std::fs::read_to_string(e.path()).unwrap_or_default()))
        })
        .collect()
}

/// Waits (60 s at most) until everything sent to `peer` before now has arrived: `via` mails
/// it a marker, and the one Postfix queue delivers in order. Whether the marker came.
async fn settle(peer: &mut Peer, via: &Peer) -> bool {
    let marker = via.dispatch_to(&peer.account.email, "Marker", "marker");
    if via.try_send(marker.clone()).await.is_err() {
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if peer
            .inbox
            .iter()
            .any(|m| m.message.task_id() == marker.task_id())
        {
            return true;
        }
        if !matches!(peer.poll().await, Ok(n) if n > 0) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    false
}

#[derive(Default)]
struct FaultCounts {
    kills: usize,
    cuts: usize,
    host_restarts: usize,
    cut_secs: u64,
}

/// The fault schedule, every 60 s from the start: at +5 s a `kill -9` of one replica (the two
/// in turn), started again 3 s later; in every third minute (the first included) at +12 s
/// the replicas' SMTP cut for `min(45, secs/5)` s (a 45 s cut every minute would leave no
/// time away from faults); in the second minute of a run of 90 s or more, at +20 s, the mail
/// host stopped and started. Faults run one after another, none starts after the end.
fn faults(
    shared: Arc<Shared>,
    mut replicas: Replicas,
    gate: Arc<Gate>,
    host: Arc<PrivateHost>,
    secs: u64,
) -> (Replicas, FaultCounts) {
    let mut counts = FaultCounts {
        cut_secs: (secs / 5).clamp(1, 45),
        ..FaultCounts::default()
    };
    let cut = Duration::from_secs(counts.cut_secs);
    let window = |what: String, from: Instant| {
        shared
            .windows
            .lock()
            .unwrap()
            .push((what, from, Instant::now()));
    };
    for cycle in 0u64.. {
        let t0 = shared.start + Duration::from_secs(60 * cycle);
        // The fault's timing, not a wait for something: each one lands wherever the load is.
        let kill_at = t0 + Duration::from_secs(5);
        if kill_at >= shared.end {
            break;
        }
        sleep_until(kill_at);
        let victim = (cycle % 2) as usize;
        let from = Instant::now();
        replicas.kill(&shared, victim);
        std::thread::sleep(Duration::from_secs(3));
        replicas.start(&shared, victim);
        window(format!("kill -9 r{}", victim + 1), from);

        let cut_at = t0 + Duration::from_secs(12);
        if cycle % 3 == 0 && cut_at < shared.end {
            sleep_until(cut_at);
            let from = Instant::now();
            gate.close();
            std::thread::sleep(cut);
            gate.open();
            counts.cuts += 1;
            window(format!("SMTP cut {}s", cut.as_secs()), from);
        }

        let restart_at = t0 + Duration::from_secs(20);
        if cycle == 1 && secs >= 90 && restart_at < shared.end {
            sleep_until(restart_at);
            let from = Instant::now();
            let up = shared.host_up.blocking_write();
            host.stop();
            host.restart();
            drop(up);
            counts.host_restarts += 1;
            window("mail host restart".into(), from);
        }
    }
    counts.kills = replicas.kills;
    (replicas, counts)
}

/// Samples every 5 s until told to stop: (seconds into the run, per replica (pid, RssAnon
/// KiB, open fds), 0 for one that is down).
type Sample = (f64, [(u32, u64, usize); 2]);

fn sample(shared: &Shared) -> Sample {
    let one = |i: usize| {
        let pid = shared.pids[i].load(Ordering::SeqCst);
        if pid == 0 {
            (0, 0, 0)
        } else {
            (pid, rss_kib(pid), open_fds(pid))
        }
    };
    (secs_since(shared, Instant::now()), [one(0), one(1)])
}

fn sampler(shared: Arc<Shared>) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut next = Instant::now();
    while shared.sampling.load(Ordering::SeqCst) {
        if Instant::now() >= next {
            samples.push(sample(&shared));
            next += Duration::from_secs(5);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    samples
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A series, compactly: at most 40 values (every k-th when longer), then first/max/last.
fn series(values: &[u64], unit: &str) -> String {
    let step = values.len().div_ceil(40).max(1);
    let shown: Vec<String> = values.iter().step_by(step).map(u64::to_string).collect();
    format!(
        "{}{} (first {} max {} last {} {unit})",
        shown.join(" "),
        if step > 1 {
            format!(" [every {step}th]")
        } else {
            String::new()
        },
        values.first().copied().unwrap_or(0),
        values.iter().max().copied().unwrap_or(0),
        values.last().copied().unwrap_or(0)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_soak_with_replicas_and_faults_answers_every_dispatch_exactly_once() {
    let Some(_) = mailhost() else { return };
    let secs: u64 = env_or("AAMP_SOAK_SECS", 100);
    let rate: f64 = env_or("AAMP_SOAK_RATE", 2.0);
    let private = Arc::new(PrivateHost::start("soak"));
    let host = &private.0;
    let (agent, boss, stranger, marker) = (
        host.user("agent"),
        host.user("boss"),
        host.user("stranger"),
        host.user("marker"),
    );
    let gate = Arc::new(Gate::new(host.smtp_port));
    let dirs = Arc::new(
        ["r1", "r2"]
            .iter()
            .map(|name| replica(host, &agent, &boss.email, name, gate.port))
            .collect::<Vec<_>>(),
    );
    let sender = Peer::new(boss.clone()).await;
    let reader = Peer::new(boss.clone()).await;
    let stranger = Peer::new(stranger).await;
    let wall = Instant::now();
    let mut shared = Shared {
        start: Instant::now(),
        end: Instant::now(),
        sent: Mutex::new(Vec::new()),
        seen: Mutex::new(Seen::default()),
        windows: Mutex::new(Vec::new()),
        host_up: tokio::sync::RwLock::new(()),
        pids: [AtomicU32::new(0), AtomicU32::new(0)],
        polling: AtomicBool::new(true),
        sampling: AtomicBool::new(true),
    };
    let mut replicas = Replicas {
        dirs: dirs.clone(),
        bridges: vec![None, None],
        events: vec![Vec::new(), Vec::new()],
        logs: Vec::new(),
        kills: 0,
    };
    replicas.start(&shared, 0);
    replicas.start(&shared, 1);

    // A warm-up of 6 tasks, answered before the run starts: the first sample is the working
    // set of a bridge that has run every path once.
    let mut warm = Vec::new();
    let mut reader = reader;
    for n in 0..6 {
        let msg = sender
            .send(sender.dispatch_to(&agent.email, &format!("Warm {n}"), "warm up"))
            .await;
        warm.push(msg.task_id().to_string());
    }
    for id in &warm {
        reader
            .wait_for_within(id, Intent::TaskResult, Duration::from_secs(120))
            .await;
    }
    shared.start = Instant::now();
    shared.end = shared.start + Duration::from_secs(secs);
    let shared = Arc::new(shared);

    let sampling = std::thread::spawn({
        let shared = shared.clone();
        move || sampler(shared)
    });
    let polling = tokio::spawn(poller(shared.clone(), reader));
    let dispatching = tokio::spawn(dispatcher(
        shared.clone(),
        sender,
        agent.email.clone(),
        rate,
    ));
    let meddling = tokio::spawn(hostile(
        shared.clone(),
        private.clone(),
        stranger,
        boss.email.clone(),
        agent.email.clone(),
    ));
    let faulting = std::thread::spawn({
        let (shared, gate, private) = (shared.clone(), gate.clone(), private.clone());
        move || faults(shared, replicas, gate, private, secs)
    });

    let dispatch_counts = dispatching.await.expect("the dispatcher");
    let (meddled, mut stranger) = meddling.await.expect("the hostile sender");
    let (mut replicas, fault_counts) = tokio::task::spawn_blocking(move || faulting.join())
        .await
        .unwrap()
        .expect("the fault schedule");
    let sent: Vec<Sent> = shared.sent.lock().unwrap().clone();
    let ids: Vec<String> = warm
        .iter()
        .cloned()
        .chain(sent.iter().map(|s| s.msg.task_id().to_string()))
        .collect();

    // Every ack and result, within DRAIN.
    let drain = Instant::now();
    loop {
        let missing = {
            let seen = shared.seen.lock().unwrap();
            ids.iter()
                .filter(|id| !seen.results.contains_key(*id) || !seen.acks.contains_key(*id))
                .count()
        };
        if missing == 0 || drain.elapsed() > DRAIN {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained = drain.elapsed();
    shared.polling.store(false, Ordering::SeqCst);
    let mut peer = polling.await.expect("the poller");
    // Everything sent to either peer before now has arrived.
    let marker = Peer::new(marker).await;
    let settled = [
        settle(&mut peer, &marker).await,
        settle(&mut stranger, &marker).await,
    ];

    // Idle: CPU over 5 s, once the last answers are in.
    let pids: Vec<u32> = (0..2)
        .map(|i| shared.pids[i].load(Ordering::SeqCst))
        .collect();
    let before: Vec<u64> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_ticks: Vec<u64> = pids
        .iter()
        .zip(&before)
        .map(|(p, b)| cpu_ticks(*p) - b)
        .collect();
    shared.sampling.store(false, Ordering::SeqCst);
    let mut samples = sampling.join().unwrap();
    samples.push(sample(&shared));

    // Counted from the dispatcher's side: distinct Message-IDs per TaskId and intent.
    let mut by_task: HashMap<(&str, Intent), HashSet<&str>> = HashMap::new();
    let mut copies = 0;
    for m in &peer.inbox {
        let fresh = by_task
            .entry((m.message.task_id(), m.message.intent()))
            .or_default()
            .insert(m.message.envelope.message_id.as_str());
        if !fresh {
            copies += 1;
        }
    }
    let count = |id: &str, intent: Intent| by_task.get(&(id, intent)).map_or(0, HashSet::len);
    let tally = |intent: Intent| {
        let (mut once, mut twice, mut lost) = (Vec::new(), Vec::new(), Vec::new());
        for id in &ids {
            match count(id, intent) {
                0 => lost.push(id.clone()),
                1 => once.push(id.clone()),
                _ => twice.push(id.clone()),
            }
        }
        (once, twice, lost)
    };
    let (results_once, results_twice, results_lost) = tally(Intent::TaskResult);
    let (acks_once, acks_twice, acks_lost) = tally(Intent::TaskAck);
    let known: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let others: Vec<String> = peer
        .inbox
        .iter()
        .filter(|m| !known.contains(m.message.task_id()))
        .filter(|m| m.message.envelope.from != marker.account.email)
        .map(|m| format!("{} {}", m.message.intent(), m.message.task_id()))
        .collect();
    let not_completed: Vec<String> = peer
        .inbox
        .iter()
        .filter(|m| known.contains(m.message.task_id()))
        .filter_map(|m| match &m.message.body {
            Body::Result(r) if r.status != Status::Completed => Some(format!(
                "{} {:?} {:?}",
                m.message.task_id(),
                r.status,
                r.error
            )),
            _ => None,
        })
        .collect();
    // The stranger's dispatches: refused, never acknowledged, answered once at most.
    let stranger_answers: Vec<String> = meddled
        .stranger_tasks
        .iter()
        .filter_map(|id| {
            let intents = stranger.intents_for(id);
            let acked = intents.contains(&Intent::TaskAck);
            let results: Vec<&aamp_bridge::mailbox::Inbound> = stranger
                .inbox
                .iter()
                .filter(|m| m.message.task_id() == id && m.message.intent() == Intent::TaskResult)
                .collect();
            let ran = results.iter().any(
                |m| matches!(&m.message.body, Body::Result(r) if r.status == Status::Completed),
            );
            (acked || results.len() > 1 || ran).then(|| format!("{id}: {intents:?}"))
        })
        .collect();

    // Latency, from the first send to the first result seen.
    let windows = shared.windows.lock().unwrap().clone();
    let (mut calm, mut faulty) = (Vec::new(), Vec::new());
    {
        let seen = shared.seen.lock().unwrap();
        for s in &sent {
            let Some((done, _)) = seen.results.get(s.msg.task_id()) else {
                continue;
            };
            let latency = done.duration_since(s.at).as_secs_f64();
            let hit = windows
                .iter()
                .any(|(_, from, to)| s.at <= *to + AFTERMATH && *done >= *from);
            if hit {
                faulty.push(latency);
            } else {
                calm.push(latency);
            }
        }
    }
    // Each SMTP cut: the answers waiting at its end (sent before it, answered after), and
    // how long after it the last of them came.
    let after_cuts: Vec<String> = {
        let seen = shared.seen.lock().unwrap();
        windows
            .iter()
            .filter(|(what, _, _)| what.starts_with("SMTP cut"))
            .map(|(what, from, to)| {
                let waiting: Vec<f64> = sent
                    .iter()
                    .filter(|s| s.at < *to)
                    .flat_map(|s| {
                        let id = s.msg.task_id();
                        [seen.acks.get(id), seen.results.get(id)]
                    })
                    .flatten()
                    .filter(|(at, _)| at > to)
                    .map(|(at, _)| at.duration_since(*to).as_secs_f64())
                    .collect();
                format!(
                    "{what} at {:.0}s: {} answers waiting at its end, the last came {:.1}s after it",
                    secs_since(&shared, *from),
                    waiting.len(),
                    waiting.iter().copied().fold(0.0, f64::max)
                )
            })
            .collect()
    };
    calm.sort_by(f64::total_cmp);
    faulty.sort_by(f64::total_cmp);

    // Journal bytes: both replicas' journals, by file (the database, its -wal and -shm).
    let mut journal_files: std::collections::BTreeMap<String, u64> = Default::default();
    for d in dirs.iter() {
        for e in std::fs::read_dir(d.dir.path().join("state"))
            .unwrap()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("journal.sqlite3") {
                *journal_files.entry(name).or_default() += e.metadata().unwrap().len();
            }
        }
    }
    let journal: u64 = journal_files.values().sum();

    // Nothing marked undelivered by a forged report.
    let undelivered: Vec<String> = dirs
        .iter()
        .map(|d| {
            d.run(&["tasks", "--state", "undelivered", "--json"])
                .trim()
                .to_string()
        })
        .collect();

    // Stop both; their events and logs (with every earlier run's).
    let mut stopped = Vec::new();
    let mut takeover_lines = [0, 0];
    for i in 0..2 {
        let mut bridge = replicas.bridges[i].take().unwrap();
        bridge.take_events();
        replicas.events[i].append(&mut bridge.seen);
        stopped.push(bridge.stop().success());
        for (name, text) in bridge_logs(&dirs[i]) {
            takeover_lines[i] += text
                .lines()
                .filter(|l| l.contains("stopped renewing is taken over"))
                .count();
            replicas.logs.push((i, name, text));
        }
    }
    // The agent run to completion twice for one task (on both replicas): its dispatcher sees
    // one answer (the copies keep their Message-IDs), but the work was done twice (the late
    // replica's run is `task.superseded`: it counts here too).
    let mut completions: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, events) in replicas.events.iter().enumerate() {
        for e in events {
            let ended = e["event"] == "task.completed" || e["event"] == "task.superseded";
            if ended && e["status"] == "completed" {
                if let Some(id) = e["taskId"].as_str() {
                    completions.entry(id.to_string()).or_default().push(i + 1);
                }
            }
        }
    }
    let mut ran_twice: Vec<String> = completions
        .iter()
        .filter(|(_, on)| on.len() > 1)
        .map(|(id, on)| format!("{id} (on r{on:?})"))
        .collect();
    ran_twice.sort();
    let panics: Vec<&str> = replicas
        .logs
        .iter()
        .flat_map(|(_, _, text)| text.lines())
        .filter(|l| l.contains("panicked"))
        .collect();
    let events = |i: usize, pred: &dyn Fn(&Value) -> bool| {
        replicas.events[i].iter().filter(|e| pred(e)).count()
    };
    let ran: Vec<usize> = (0..2)
        .map(|i| events(i, &|e| e["event"] == "task.completed"))
        .collect();
    let duplicates: Vec<usize> = (0..2)
        .map(|i| events(i, &|e| e["event"] == "task.duplicate"))
        .collect();
    let reports_ignored: Vec<usize> = (0..2)
        .map(|i| {
            events(i, &|e| {
                e["event"] == "message.ignored"
                    && e["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("delivery report"))
            })
        })
        .collect();

    let long = sent.iter().filter(|s| s.long).count();
    println!("--- soak: {secs} s at {rate}/s, two replicas (lease {LEASE_SECS} s), wall {:.0} s (the answers drained {:.1} s after the run)", wall.elapsed().as_secs_f64(), drained.as_secs_f64());
    println!(
        "faults: {} kill -9 + restart, {} SMTP cuts of {} s, {} mail-host restarts; windows: {}",
        fault_counts.kills,
        fault_counts.cuts,
        fault_counts.cut_secs,
        fault_counts.host_restarts,
        windows
            .iter()
            .map(|(what, from, to)| format!(
                "{what} {:.0}-{:.0}s",
                secs_since(&shared, *from),
                secs_since(&shared, *to)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "hostile: {} stranger dispatches, {} forged dispatches, {} cancels of running long tasks (stranger's and forged), {} forged delivery reports ({:?} read and ignored per replica)",
        meddled.stranger_tasks.len(),
        meddled.forged_tasks.len(),
        meddled.cancels,
        meddled.reports,
        reports_ignored
    );
    println!(
        "duplicates: {} sent again with the same Message-ID, {} with the same TaskId and a new Message-ID ({:?} task.duplicate per replica); {} dispatcher send failures retried",
        dispatch_counts.same_message_id,
        dispatch_counts.same_task_id,
        duplicates,
        dispatch_counts.send_failures
    );
    println!(
        "dispatched {} ({} warm-up, {long} long): results exactly once {}, twice {}, lost {}; acks exactly once {}, twice {}, lost {}; {copies} copies with a Message-ID already seen; run per replica {ran:?}",
        ids.len(),
        warm.len(),
        results_once.len(),
        results_twice.len(),
        results_lost.len(),
        acks_once.len(),
        acks_twice.len(),
        acks_lost.len()
    );
    println!(
        "run to completion twice: {} {ran_twice:?}; log lines \"stopped renewing is taken over\" per replica: {takeover_lines:?}",
        ran_twice.len()
    );
    println!(
        "dispatch->result: away from faults n={} p50 {:.2}s p99 {:.2}s; during faults n={} p50 {:.2}s p99 {:.2}s max {:.2}s",
        calm.len(),
        percentile(&calm, 0.5),
        percentile(&calm, 0.99),
        faulty.len(),
        percentile(&faulty, 0.5),
        percentile(&faulty, 0.99),
        faulty.last().copied().unwrap_or(f64::NAN)
    );
    for line in &after_cuts {
        println!("{line}");
    }
    for i in 0..2 {
        let rss: Vec<u64> = samples.iter().map(|s| s.1[i].1).collect();
        let fds: Vec<u64> = samples.iter().map(|s| s.1[i].2 as u64).collect();
        let pids: Vec<u32> = samples.iter().map(|s| s.1[i].0).collect();
        let restarts = pids.windows(2).filter(|w| w[0] != w[1]).count();
        println!(
            "r{} RssAnon KiB every 5 s (0 = down): {}",
            i + 1,
            series(&rss, "KiB")
        );
        println!(
            "r{} open fds every 5 s: {} ({restarts} pid changes; 0 = down)",
            i + 1,
            series(&fds, "fds")
        );
    }
    println!(
        "journal (both replicas): {journal} bytes {journal_files:?} for {} tasks: {} bytes per task; idle CPU ticks in 5 s at the end: r1 {} r2 {}",
        ids.len(),
        journal / ids.len().max(1) as u64,
        idle_ticks[0],
        idle_ticks[1]
    );
    println!("---");

    let held = results_lost.is_empty()
        && acks_lost.is_empty()
        && results_twice.is_empty()
        && acks_twice.is_empty()
        && others.is_empty()
        && not_completed.is_empty()
        && stranger_answers.is_empty()
        && undelivered.iter().all(|u| u == "[]")
        && panics.is_empty()
        && ran_twice.is_empty()
        && settled.iter().all(|s| *s);
    if !held || std::env::var_os("AAMP_SOAK_KEEP_LOGS").is_some() {
        let keep = std::env::temp_dir().join(format!("aamp-soak-{}", std::process::id()));
        std::fs::create_dir_all(&keep).unwrap();
        for (n, (i, name, text)) in replicas.logs.iter().enumerate() {
            std::fs::write(keep.join(format!("r{}-{n:02}-{name}", i + 1)), text).unwrap();
        }
        println!("the replicas' logs are kept in {}", keep.display());
    }
    assert!(
        settled.iter().all(|s| *s),
        "a marker sent after the run did not arrive within 60 s (dispatcher, stranger): {settled:?}"
    );
    assert!(
        results_lost.is_empty() && acks_lost.is_empty(),
        "lost: results {results_lost:?}, acks {acks_lost:?}"
    );
    assert!(
        results_twice.is_empty() && acks_twice.is_empty(),
        "answered twice: results {results_twice:?}, acks {acks_twice:?}"
    );
    assert!(
        others.is_empty(),
        "answers to mails that are not the dispatcher's tasks: {others:?}"
    );
    assert!(
        not_completed.is_empty(),
        "tasks not completed (a cancel from a stranger stopped one?): {not_completed:?}"
    );
    assert!(
        stranger_answers.is_empty(),
        "the stranger's dispatches were run or answered twice: {stranger_answers:?}"
    );
    assert!(
        undelivered.iter().all(|u| u == "[]"),
        "answers marked undelivered (by a forged report?): {undelivered:?}"
    );
    assert!(panics.is_empty(), "a panic: {panics:?}");
    assert!(
        ran_twice.is_empty(),
        "tasks run to completion twice across the replicas: {ran_twice:?}"
    );
    assert!(stopped.iter().all(|s| *s), "a replica did not stop cleanly");
    for (i, idle) in idle_ticks.iter().enumerate() {
        let (first, last) = (samples[0].1[i], samples.last().unwrap().1[i]);
        assert!(
            last.2 <= first.2 + 20,
            "r{}: open files grew from {} to {}",
            i + 1,
            first.2,
            last.2
        );
        assert!(
            last.1 <= first.1 + 32 * 1024,
            "r{}: private memory grew from {} KiB to {} KiB",
            i + 1,
            first.1,
            last.1
        );
        assert!(*idle <= 25, "r{}: {idle} CPU ticks in 5 s idle", i + 1);
    }
}
