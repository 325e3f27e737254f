//! The fast tier: dispatch in-process, with a fake `Backend` in place of the mailbox and no
//! mail server, so the lifecycle, policy and journal rules are checked in milliseconds on any
//! machine (`cargo test --test fast`). Agents are real processes from real profiles; where a
//! rule is about time (an agent that hangs until its timeout) the clock is tokio's, paused and
//! advanced by the runtime, not slept through. The same rules are shown again against the
//! real mail host in tests/e2e.rs, tests/trust.rs and tests/durability.rs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aamp_bridge::config::LoadedConfig;
use aamp_bridge::dispatch::{Engine, Journal, Settings};
use aamp_bridge::events::Events;
use aamp_bridge::mailbox::aamp::auth::SenderCheck;
use aamp_bridge::mailbox::{Attachment, Inbound, Mail};
use aamp_bridge::protocol::{self, AampMessage, Body, Dispatch, Envelope, Intent, Status};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod support;

use support::{Board, Claims, Downloads, FakeBackend, OnBoard};

const AGENT: &str = "agent@example.test";
const BOSS: &str = "boss@example.test";

/// One agent's engine over a journal in a folder of its own, its outbox worker running.
struct Rig {
    dir: tempfile::TempDir,
    outbox: FakeBackend,
    engine: Engine<FakeBackend>,
    tracker: TaskTracker,
    stop: CancellationToken,
    abort: CancellationToken,
    mails: AtomicUsize,
}

impl Rig {
    /// `agent` is the rest of the agent's table (its profile and limits); `files` are written
    /// beside the config.
    fn new(agent: &str, files: &[(&str, &str)]) -> Rig {
        Rig::in_dir(
            tempfile::tempdir().unwrap(),
            agent,
            files,
            FakeBackend::default(),
        )
    }

    fn in_dir(
        dir: tempfile::TempDir,
        agent: &str,
        files: &[(&str, &str)],
        outbox: FakeBackend,
    ) -> Rig {
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let password = dir.path().join("password");
        std::fs::write(&password, "secret").unwrap();
        std::fs::set_permissions(
            &password,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        // A back-end that claims serves one of several replicas.
        let replica = match &outbox.replica {
            Some(on) => format!("replica = \"{}\"\n", on.name),
            None if outbox.claims.is_some() || outbox.wins => "replica = \"r1\"\n".into(),
            None => String::new(),
        };
        // Port 9 (discard): nothing here talks to a mail server.
        let text = format!(
            "state_dir = \"state\"\n\n[mailboxes.agent]\nemail = \"{AGENT}\"\njmap_url = \"http://127.0.0.1:9/.well-known/jmap\"\npassword_file = \"password\"\nsmtp_host = \"127.0.0.1\"\nsmtp_port = 9\nsmtp_security = \"plain\"\n{replica}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nallow_from = [\"{BOSS}\"]\n{agent}\n"
        );
        let path = dir.path().join("config.toml");
        std::fs::write(&path, &text).unwrap();
        let config = LoadedConfig::from_text(&path, &text).unwrap();
        std::fs::create_dir_all(&config.state_dir).unwrap();
        let agents = config.agents(&[]).unwrap();
        let mut spec = aamp_bridge::daemon::agent_spec(&config, &agents[0]).unwrap();
        if let (Some(replica), Some(_)) = (spec.replica.as_mut(), &outbox.replica) {
            // On a board of claims, whose leases run out when the test says: renewed often,
            // so a renewal that finds the claim another's comes at once.
            replica.lease = Duration::from_millis(150);
        }
        let journal = Arc::new(Journal::open(&config.state_dir.join("journal.sqlite3")).unwrap());
        let settings = Settings {
            retry_for: Duration::from_secs(86_400),
            owner_tag: dir.path().display().to_string(),
            slots: aamp_bridge::dispatch::slots::Slots::new(None),
            delegation: None,
        };
        let (tracker, stop, abort) = (
            TaskTracker::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let engine = Engine::new(
            spec,
            outbox.clone(),
            journal,
            Events::new(false),
            settings,
            tracker.clone(),
            abort.clone(),
        );
        engine.recover().unwrap();
        tracker.spawn(
            engine
                .outbox()
                .clone()
                .run(stop.clone(), Duration::from_secs(1)),
        );
        Rig {
            dir,
            outbox,
            engine,
            tracker,
            stop,
            abort,
            mails: AtomicUsize::new(0),
        }
    }

    /// One of several replicas of the agent (the echo profile), its claims made through
    /// `claims`.
    /// One of several replicas that wins every claim it makes, on the `echo` profile, with
    /// `outbox` for the rest of what its back-end does.
    fn winner(outbox: FakeBackend) -> Rig {
        Rig::in_dir(
            tempfile::tempdir().unwrap(),
            "profile = \"echo\"",
            &[],
            FakeBackend {
                wins: true,
                ..outbox
            },
        )
    }

    fn replica(claims: &Claims) -> Rig {
        let outbox = FakeBackend {
            claims: Some(claims.clone()),
            ..FakeBackend::default()
        };
        Rig::in_dir(
            tempfile::tempdir().unwrap(),
            "profile = \"echo\"",
            &[],
            outbox,
        )
    }

    /// A dispatch from `from`, as the intake would hand it on, with a Message-ID of its own.
    fn dispatch(&self, from: &str, title: &str, body: &str) -> AampMessage {
        let mut msg = AampMessage {
            envelope: Envelope {
                version: protocol::VERSION.into(),
                task_id: uuid::Uuid::new_v4().to_string(),
                from: from.into(),
                to: vec![AGENT.into()],
                message_id: format!("<{}@example.test>", uuid::Uuid::new_v4()),
                subject: String::new(),
                in_reply_to: None,
                references: vec![],
                received_body: None,
            },
            body: Body::Dispatch(Dispatch {
                title: title.into(),
                body_text: body.into(),
                ..Dispatch::default()
            }),
        };
        msg.envelope.subject = msg.subject();
        msg
    }

    fn cancel_of(&self, dispatch: &AampMessage) -> AampMessage {
        let mut msg = dispatch.clone();
        msg.envelope.message_id = format!("<{}@example.test>", uuid::Uuid::new_v4());
        msg.envelope.in_reply_to = Some(dispatch.envelope.message_id.clone());
        msg.body = Body::Cancel {
            reason: "stop".into(),
        };
        msg.envelope.subject = msg.subject();
        msg
    }

    /// Hands `msg` to the engine as the intake does (rendered, then read back), its
    /// sender believed.
    fn deliver(&self, msg: &AampMessage) {
        let n = self.mails.fetch_add(1, Ordering::SeqCst);
        self.engine.deliver(as_delivered(msg, n)).unwrap();
    }

    /// Stops as the daemon does at a crash-free stop: tasks aborted (kept for the next
    /// start), the outbox's last round, everything awaited. Returns the folder.
    async fn shut(self) -> (tempfile::TempDir, FakeBackend) {
        self.abort.cancel();
        self.stop.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        (self.dir, self.outbox)
    }
}

/// `msg` as the intake hands it on (rendered, then read back), its sender believed.
fn as_delivered(msg: &AampMessage, n: usize) -> Mail {
    as_delivered_with(msg, n, Vec::new())
}

fn as_delivered_with(msg: &AampMessage, n: usize, attachments: Vec<Attachment>) -> Mail {
    let rendered = protocol::rfc5322::render(msg, SystemTime::now());
    let view = protocol::rfc5322::parse_raw(&rendered.bytes).unwrap();
    let message = AampMessage::parse(&view).unwrap();
    Mail::Aamp(Box::new(Inbound {
        email_id: format!("M{n}"),
        message,
        view,
        sender_check: SenderCheck::Trusted,
        truncated: false,
        attachments,
        refused: None,
    }))
}

#[tokio::test]
async fn an_allowed_dispatch_is_acked_then_answered_once() {
    let rig = Rig::new("profile = \"echo\"", &[]);
    let task = rig.dispatch(BOSS, "Greet", "say hello");
    rig.deliver(&task);
    let result = rig.outbox.result(task.task_id()).await;
    assert_eq!(result.status, Status::Completed);
    assert!(result.output.contains("say hello"), "{}", result.output);
    let (_, outbox) = rig.shut().await;
    assert_eq!(
        outbox.intents(task.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
}

#[tokio::test]
async fn an_unknown_sender_is_refused_before_anything_is_acked_or_run() {
    let marker = tempfile::tempdir().unwrap();
    let touched = marker.path().join("ran");
    let profile = format!(
        "command = \"touch\"\nargs = [{:?}]\n",
        touched.display().to_string()
    );
    let rig = Rig::new("profile = \"touch.toml\"", &[("touch.toml", &profile)]);
    let task = rig.dispatch("stranger@elsewhere.test", "Do it", "rm -rf /");
    rig.deliver(&task);
    let result = rig.outbox.result(task.task_id()).await;
    assert_eq!(result.status, Status::Rejected);
    let (_, outbox) = rig.shut().await;
    assert_eq!(outbox.intents(task.task_id()), vec![Intent::TaskResult]);
    assert!(!touched.exists(), "the agent ran for a stranger");
}

/// Issue 31: the budget of answers to refused senders (`max_refusals_per_hour`) was kept in
/// memory, so every restart gave a flood of strangers a fresh one. It is kept in the journal.
#[tokio::test]
async fn the_refusal_budget_survives_a_restart() {
    let agent = "profile = \"echo\"\nmax_refusals_per_hour = 3";
    let rig = Rig::new(agent, &[]);
    let first: Vec<AampMessage> = (0..3)
        .map(|n| {
            rig.dispatch(
                &format!("stranger{n}@elsewhere.test"),
                "Let me in",
                "please",
            )
        })
        .collect();
    for task in &first {
        rig.deliver(task);
    }
    rig.outbox.until("three refusals", |s| s.len() == 3).await;
    let (dir, _) = rig.shut().await;
    let rig = Rig::in_dir(dir, agent, &[], FakeBackend::default());
    for n in 3..6 {
        rig.deliver(&rig.dispatch(
            &format!("stranger{n}@elsewhere.test"),
            "Let me in",
            "please",
        ));
    }
    let (dir, outbox) = rig.shut().await;
    assert!(
        outbox.sent().is_empty(),
        "answered past the budget: {:?}",
        outbox.sent()
    );
    let journal = Journal::open(&dir.path().join("state/journal.sqlite3")).unwrap();
    let refused = journal
        .tasks(
            Some("agent"),
            Some(aamp_bridge::dispatch::TaskState::Rejected),
            100,
        )
        .unwrap();
    assert_eq!(refused.len(), 6, "every refused mail is recorded");
}

#[tokio::test]
async fn the_same_mail_delivered_three_times_runs_and_is_answered_once() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let profile = format!(
        "command = \"sh\"\nargs = [\"-c\", \"echo run >> {}; echo done\"]\n",
        runs.display()
    );
    let rig = Rig::new("profile = \"count.toml\"", &[("count.toml", &profile)]);
    let task = rig.dispatch(BOSS, "Once", "only once");
    for _ in 0..3 {
        rig.deliver(&task);
    }
    rig.outbox.result(task.task_id()).await;
    let (_, outbox) = rig.shut().await;
    assert_eq!(
        outbox.intents(task.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\n");
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_hangs_is_stopped_at_its_timeout_without_waiting_for_it() {
    let started = std::time::Instant::now();
    let rig = Rig::new(
        "profile = \"hang.toml\"",
        &[(
            "hang.toml",
            "command = \"sleep\"\nargs = [\"86400\"]\ntimeout_secs = 3600\ncancel_grace_secs = 60\n",
        )],
    );
    let task = rig.dispatch(BOSS, "Hang", "forever");
    rig.deliver(&task);
    let result = rig.outbox.result(task.task_id()).await;
    assert_eq!(result.status, Status::Rejected);
    let why = result.error.unwrap_or_default();
    assert!(why.contains("did not finish within 3600s"), "{why}");
    rig.shut().await;
    // An hour of the agent's clock, in real seconds at most.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_cancel_racing_its_tasks_end_gets_exactly_one_answer() {
    let rig = Rig::new("profile = \"echo\"", &[]);
    let mut tasks = Vec::new();
    for i in 0..10 {
        let task = rig.dispatch(BOSS, &format!("Race {i}"), "quick");
        rig.deliver(&task);
        rig.deliver(&rig.cancel_of(&task));
        tasks.push(task);
    }
    for task in &tasks {
        let result = rig.outbox.result(task.task_id()).await;
        assert!(
            result.status == Status::Completed
                || result
                    .error
                    .as_deref()
                    .unwrap_or_default()
                    .contains("cancelled"),
            "{result:?}"
        );
    }
    let (_, outbox) = rig.shut().await;
    for task in &tasks {
        let results = outbox
            .intents(task.task_id())
            .into_iter()
            .filter(|i| *i == Intent::TaskResult)
            .count();
        assert_eq!(results, 1, "{:?}", outbox.intents(task.task_id()));
    }
}

/// A replica whose task is cancelled while its claim is on the way answers only if it wins
/// the claim. CI saw the sender get two results, one from the replica that ran the task and
/// one from a replica that had a free slot and gave up claiming when the cancel came.
#[tokio::test]
async fn a_replica_cancelled_while_it_claims_answers_only_if_it_wins_the_claim() {
    let claims = Claims::new();
    let rig = Rig::replica(&claims);
    let task = rig.dispatch(BOSS, "Long", "wait");
    rig.deliver(&task);
    rig.outbox
        .until("the claim", |_: &[AampMessage]| {
            claims.made.load(Ordering::SeqCst) >= 1
        })
        .await;
    rig.deliver(&rig.cancel_of(&task));
    rig.outbox
        .until("the claim given up", |_: &[AampMessage]| {
            claims.dropped.load(Ordering::SeqCst) >= 1
        })
        .await;
    claims.open.send_replace(true);
    let id = task.task_id().to_string();
    rig.outbox
        .until("the claim lost, or an answer", |sent: &[AampMessage]| {
            claims.lost.load(Ordering::SeqCst) >= 1 || sent.iter().any(|m| m.task_id() == id)
        })
        .await;
    let (_, outbox) = rig.shut().await;
    assert_eq!(outbox.intents(task.task_id()), Vec::<Intent>::new());
}

/// A refusal every replica would give alike leaves only from the replica that wins the
/// mail's claim; here another won, so this one sends nothing and keeps nothing unsent.
#[tokio::test]
async fn a_replica_that_loses_the_claim_does_not_send_its_refusal() {
    let claims = Claims::new();
    claims.open.send_replace(true);
    let rig = Rig::replica(&claims);
    let task = rig.dispatch("stranger@elsewhere.test", "Let me in", "please");
    rig.deliver(&task);
    rig.outbox
        .until("the claim lost", |_: &[AampMessage]| {
            claims.lost.load(Ordering::SeqCst) >= 1
        })
        .await;
    let journal = Journal::open(&rig.dir.path().join("state/journal.sqlite3")).unwrap();
    let (_, outbox) = rig.shut().await;
    assert_eq!(outbox.intents(task.task_id()), Vec::<Intent>::new());
    assert_eq!(journal.unsent("agent").unwrap(), 0);
}

#[tokio::test]
async fn an_expired_dispatch_is_rejected_and_not_run() {
    let rig = Rig::new("profile = \"echo\"", &[]);
    let mut task = rig.dispatch(BOSS, "Late", "too late");
    if let Body::Dispatch(d) = &mut task.body {
        d.expires_at = Some(protocol::time::format_utc(
            SystemTime::now() - Duration::from_secs(60),
        ));
    }
    rig.deliver(&task);
    let result = rig.outbox.result(task.task_id()).await;
    assert_eq!(result.status, Status::Rejected);
    assert!(
        result
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("expired"),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_full_queue_says_busy_and_the_queued_task_still_runs() {
    let rig = Rig::new(
        "profile = \"slow.toml\"\nmax_concurrent_tasks = 1\nmax_queued_tasks = 2",
        &[("slow.toml", "command = \"sleep\"\nargs = [\"600\"]\n")],
    );
    let tasks: Vec<AampMessage> = (0..3)
        .map(|i| rig.dispatch(BOSS, &format!("Slow {i}"), "wait"))
        .collect();
    for task in &tasks {
        rig.deliver(task);
    }
    let third = rig.outbox.result(tasks[2].task_id()).await;
    assert_eq!(third.status, Status::Rejected);
    assert!(
        third.error.as_deref().unwrap_or_default().contains("busy"),
        "{third:?}"
    );
    // The first two were admitted: acked, and answered once cancelled.
    for task in &tasks[..2] {
        rig.deliver(&rig.cancel_of(task));
        assert!(rig
            .outbox
            .result(task.task_id())
            .await
            .error
            .unwrap_or_default()
            .contains("cancelled"));
    }
    let (_, outbox) = rig.shut().await;
    for task in &tasks[..2] {
        assert_eq!(
            outbox.intents(task.task_id()),
            vec![Intent::TaskAck, Intent::TaskResult]
        );
    }
}

#[tokio::test]
async fn answers_the_server_refused_are_kept_and_sent_once_after_a_restart() {
    let outbox = FakeBackend::default();
    // The server is down for this whole life of the bridge.
    outbox.fail.store(usize::MAX, Ordering::SeqCst);
    let rig = Rig::in_dir(
        tempfile::tempdir().unwrap(),
        "profile = \"echo\"",
        &[],
        outbox,
    );
    let task = rig.dispatch(BOSS, "Keep", "keep my answer");
    rig.deliver(&task);
    // The task ran and its answer is recorded, not sent.
    let journal = Journal::open(&rig.dir.path().join("state/journal.sqlite3")).unwrap();
    let mut ticks = tokio::time::interval(Duration::from_millis(20));
    while journal.unsent("agent").unwrap() < 2 {
        ticks.tick().await;
    }
    let (dir, old) = rig.shut().await;
    assert!(old.sent().is_empty());

    // The next life: the server is back.
    let rig = Rig::in_dir(dir, "profile = \"echo\"", &[], FakeBackend::default());
    let result = rig.outbox.result(task.task_id()).await;
    assert_eq!(result.status, Status::Completed);
    rig.deliver(&task); // and the same mail again, as after a lost cursor
    let (_, outbox) = rig.shut().await;
    assert_eq!(
        outbox.intents(task.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
}

/// Issue 31: after a short outage, answers went out up to 12 minutes after the server came
/// back, each waiting out its own backoff (doubling to 5 minutes). Now, while the server is
/// down, one waiting mail is tried at least every 5 s, and the first that goes through makes
/// every waiting one due: all leave within seconds of the server's return, in order.
#[tokio::test(start_paused = true)]
async fn answers_waiting_out_an_outage_all_leave_within_seconds_of_the_server_coming_back() {
    let outbox = FakeBackend::default();
    outbox.fail.store(usize::MAX, Ordering::SeqCst);
    let rig = Rig::in_dir(
        tempfile::tempdir().unwrap(),
        "profile = \"echo\"",
        &[],
        outbox,
    );
    let tasks: Vec<AampMessage> = (0..5)
        .map(|n| rig.dispatch(BOSS, &format!("Task {n}"), "answer after the outage"))
        .collect();
    for task in &tasks {
        rig.deliver(task);
    }
    let journal = Journal::open(&rig.dir.path().join("state/journal.sqlite3")).unwrap();
    while journal.unsent("agent").unwrap() < 10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Ten minutes down: each mail's own backoff has grown to its cap.
    tokio::time::sleep(Duration::from_secs(600)).await;
    rig.outbox.fail.store(0, Ordering::SeqCst);
    let back = tokio::time::Instant::now();
    let sent = rig.outbox.until("every answer", |s| s.len() == 10).await;
    let took = back.elapsed();
    assert!(
        took <= Duration::from_secs(6),
        "the last answer left {took:?} after the server came back"
    );
    let acks: Vec<&str> = sent
        .iter()
        .filter(|m| m.intent() == Intent::TaskAck)
        .map(|m| m.task_id())
        .collect();
    let order: Vec<&str> = tasks.iter().map(|t| t.task_id()).collect();
    assert_eq!(acks, order, "oldest first");
    let (_, outbox) = rig.shut().await;
    for task in &tasks {
        assert_eq!(
            outbox.intents(task.task_id()),
            vec![Intent::TaskAck, Intent::TaskResult]
        );
    }
}

/// The mailbox answering again (its link came up) sends what waits at once, without waiting
/// for the outbox's next try of the server.
#[tokio::test(start_paused = true)]
async fn the_mailbox_coming_back_sends_waiting_answers_at_once() {
    let outbox = FakeBackend::default();
    outbox.fail.store(usize::MAX, Ordering::SeqCst);
    let rig = Rig::in_dir(
        tempfile::tempdir().unwrap(),
        "profile = \"echo\"",
        &[],
        outbox,
    );
    let task = rig.dispatch(BOSS, "Wait", "until the link is back");
    rig.deliver(&task);
    let journal = Journal::open(&rig.dir.path().join("state/journal.sqlite3")).unwrap();
    while journal.unsent("agent").unwrap() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Well into the outage: the next try of the server is seconds away.
    tokio::time::sleep(Duration::from_secs(30)).await;
    rig.outbox.fail.store(0, Ordering::SeqCst);
    let back = tokio::time::Instant::now();
    rig.engine.outbox().server_back();
    rig.outbox.until("both answers", |s| s.len() == 2).await;
    assert!(
        back.elapsed() < Duration::from_millis(500),
        "{:?}",
        back.elapsed()
    );
    rig.shut().await;
}

/// Issue 31: with the server down, a task's result waited behind its unsent ack, and the
/// outbox, taking the result's own time as due, read the journal every 10 ms for the whole
/// outage (8-11 % of a core). It wakes on events now: a mail queued, the next due time, the
/// next try of the server (at most every 5 s while it is down); idle, not at all.
#[tokio::test(start_paused = true)]
async fn the_outbox_does_not_poll_the_journal_idle_or_through_an_outage() {
    let outbox = FakeBackend::default();
    outbox.fail.store(usize::MAX, Ordering::SeqCst);
    let rig = Rig::in_dir(
        tempfile::tempdir().unwrap(),
        "profile = \"echo\"",
        &[],
        outbox,
    );
    let idle = rig.engine.outbox().rounds();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let idle = rig.engine.outbox().rounds() - idle;
    // The first round at start, and one look an hour.
    assert!(idle <= 2, "{idle} rounds in an idle hour");
    // Three tasks: besides each result behind its ack, the acks of the second and third are
    // due while the next try of the server is still ahead (the outbox took that for "due now"
    // and looked again every 10 ms until the try).
    let tasks: Vec<_> = (0..3)
        .map(|i| rig.dispatch(BOSS, &format!("Wait {i}"), "wait out the outage"))
        .collect();
    for task in &tasks {
        rig.deliver(task);
    }
    let journal = Journal::open(&rig.dir.path().join("state/journal.sqlite3")).unwrap();
    while journal.unsent("agent").unwrap() < 6 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = rig.engine.outbox().rounds();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let rounds = rig.engine.outbox().rounds() - before;
    // A try of the server every 5 s at most (sooner while its backoff is short), and a wake
    // for each mail queued: a dozen or so; polling made 6,000.
    assert!(rounds <= 30, "{rounds} rounds in a minute of outage");
    rig.outbox.fail.store(0, Ordering::SeqCst);
    for task in &tasks {
        rig.outbox.result(task.task_id()).await;
    }
    rig.shut().await;
}

/// A replica's claim refused for its credentials (a password being rotated: the intake is
/// refused too) was parked until the next start. It is tried again, and the task runs and is
/// answered once the credentials work.
#[tokio::test]
async fn a_claim_refused_for_the_credentials_is_tried_again_not_parked() {
    let rig = Rig::winner(FakeBackend {
        refuse_claims: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(2)),
        ..FakeBackend::default()
    });
    let task = rig.dispatch(BOSS, "Rotated", "answered once the password works");
    rig.deliver(&task);
    let result = rig.outbox.result(task.task_id()).await;
    assert_eq!(result.status, Status::Completed);
    assert_eq!(rig.outbox.refuse_claims.load(Ordering::SeqCst), 0);
    rig.shut().await;
}

/// The soak's find: a replica answered a task while the mail server restarted, its one try
/// at marking the claim done failed, the lease ran out, and the other replica ran the answered
/// task again. The mark is now tried until it goes through.
#[tokio::test]
async fn a_done_mark_the_server_could_not_take_is_tried_until_it_goes_through() {
    let rig = Rig::winner(FakeBackend {
        fail_done: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(3)),
        ..FakeBackend::default()
    });
    let task = rig.dispatch(BOSS, "Outage", "answered while the server restarts");
    rig.deliver(&task);
    rig.outbox.result(task.task_id()).await;
    let marks = rig.outbox.done_marks.clone();
    rig.outbox
        .until("the fourth done mark", |_| {
            marks.load(Ordering::SeqCst) >= 4
        })
        .await;
    assert_eq!(rig.outbox.fail_done.load(Ordering::SeqCst), 0);
    rig.shut().await;
}

/// An agent that runs until the file `gate` exists (a task of any length, ended by the test).
fn gated(gate: &std::path::Path) -> String {
    format!(
        "command = \"sh\"\nargs = [\"-c\", \"while [ ! -e '{}' ]; do sleep 0.02; done; echo done\"]\ntimeout_secs = 3600\n",
        gate.display()
    )
}

/// The suite's find on a machine at a load of 16: a replica starved of CPU renewed its claim
/// late, the lease ran out, and another replica took the task over (acknowledging it again,
/// under the same Message-ID) and ran it. The first replica's run then ended, and it marked
/// the task done on the server over the new holder's claim: its own answer was not sent (the
/// claim was another's), and the holder, finding the task done at its next renewal, stopped
/// its run as taken over. Two acks, no result. A replica now marks a task done only while it
/// holds the claim, so the holder answers, once, and the first keeps the task as another's.
#[tokio::test]
async fn a_task_taken_over_from_a_starved_replica_is_answered_once_by_its_new_holder() {
    let gates = tempfile::tempdir().unwrap();
    let gate = |n: u8| gates.path().join(format!("go{n}"));
    let board = Board::default();
    let (on1, on2) = (OnBoard::new(&board, "r1"), OnBoard::new(&board, "r2"));
    // r1 is starved: its renewals do not reach the server.
    on1.renewing.send_replace(false);
    let rig = |on: &OnBoard, n: u8| {
        Rig::in_dir(
            tempfile::tempdir().unwrap(),
            "profile = \"gated.toml\"",
            &[("gated.toml", &gated(&gate(n)))],
            FakeBackend {
                replica: Some(on.clone()),
                ..FakeBackend::default()
            },
        )
    };
    let (r1, r2) = (rig(&on1, 1), rig(&on2, 2));
    let mut events = aamp_bridge::events::tap();
    let acked = |s: &[AampMessage]| s.iter().any(|m| m.intent() == Intent::TaskAck);
    let task = r1.dispatch(BOSS, "Long", "taken over while it runs");
    r1.deliver(&task);
    r1.outbox.until("r1's ack", acked).await;
    // Its lease runs out; the takeover scan hands the mail to r2, which takes it over.
    board.expire("M0");
    r2.deliver(&task);
    r2.outbox.until("r2's ack", acked).await;
    assert_eq!(board.held("M0").unwrap().by, "r2");
    // r1's run ends: its answer meets the claim r2 holds (its done mark, and its outbox's
    // claim before it sends).
    std::fs::write(gate(1), "").unwrap();
    let (marks, claims) = (r1.outbox.done_marks.clone(), on1.claims.clone());
    r1.outbox
        .until("r1's done mark and its outbox's claim", |_| {
            marks.load(Ordering::SeqCst) >= 1 && claims.load(Ordering::SeqCst) >= 2
        })
        .await;
    let held = board.held("M0").unwrap();
    assert!(
        held.by == "r2" && !held.done,
        "r1 marked done the claim r2 holds: {held:?}"
    );
    // r2 renews after that, and finishes its run.
    let (renewals, before) = (on2.renewals.clone(), on2.renewals.load(Ordering::SeqCst));
    r2.outbox
        .until("a renewal of r2's claim", |_| {
            renewals.load(Ordering::SeqCst) > before
        })
        .await;
    std::fs::write(gate(2), "").unwrap();
    let result = r2.outbox.result(task.task_id()).await;
    assert_eq!(result.status, Status::Completed);
    let held = board.held("M0").unwrap();
    assert!(held.by == "r2" && held.done, "{held:?}");
    let ((dir1, first), (_, second)) = (r1.shut().await, r2.shut().await);
    assert_eq!(first.intents(task.task_id()), vec![Intent::TaskAck]);
    assert_eq!(
        second.intents(task.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult]
    );
    assert_eq!(
        first.sent()[0].envelope.message_id,
        second.sent()[0].envelope.message_id,
        "the takeover's ack is the first ack again"
    );
    // r1 keeps the task as r2's: a takeover scan that finds r2's claim run out brings it back.
    let journal = Journal::open(&dir1.path().join("state/journal.sqlite3")).unwrap();
    let kept = journal
        .tasks(
            Some("agent"),
            Some(aamp_bridge::dispatch::TaskState::Elsewhere),
            10,
        )
        .unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    // r1's run is said as superseded, r2's as completed: counting completions counts answers.
    let mut ends = Vec::new();
    while let Ok(line) = events.try_recv() {
        let e: serde_json::Value = serde_json::from_str(&line).unwrap();
        if e["taskId"] == task.task_id() && e["event"].as_str().unwrap().starts_with("task.") {
            ends.push(e["event"].as_str().unwrap().to_string());
        }
    }
    ends.retain(|e| e == "task.completed" || e == "task.superseded");
    ends.sort();
    assert_eq!(ends, ["task.completed", "task.superseded"], "{ends:?}");
}

/// The soak's other find: a task answered here whose done mark never reached the server came
/// back from every takeover scan (every half lease) and was ignored as a second delivery, for
/// good. Delivered again, an answered task is marked done on the server, and not run again.
#[tokio::test]
async fn an_answered_task_that_comes_back_unclaimed_is_marked_done_not_run() {
    let rig = Rig::winner(FakeBackend::default());
    let task = rig.dispatch(BOSS, "Once", "answered once");
    rig.deliver(&task);
    rig.outbox.result(task.task_id()).await;
    let marks = rig.outbox.done_marks.clone();
    rig.outbox
        .until("the done mark", |_| marks.load(Ordering::SeqCst) >= 1)
        .await;
    // The takeover scan hands the same mail on again.
    rig.deliver(&task);
    rig.outbox
        .until("a second done mark", |_| marks.load(Ordering::SeqCst) >= 2)
        .await;
    let (_, outbox) = rig.shut().await;
    assert_eq!(
        outbox.intents(task.task_id()),
        vec![Intent::TaskAck, Intent::TaskResult],
        "run and answered once"
    );
}

/// A replica's task interrupted by a restart is claimed again at the next start and
/// acknowledged again: with the same Message-ID as the first ack, so it is the same mail (the
/// journal keeps it once) and not a second ack. The recovered task's mails were derived from
/// its Message-ID alone, not from its sender and Message-ID as at its arrival.
#[tokio::test]
async fn a_replica_restarted_mid_task_acknowledges_it_once() {
    let hang = (
        "hang.toml",
        "command = \"sleep\"\nargs = [\"600\"]\ntimeout_secs = 3600\n",
    );
    let replica = || FakeBackend {
        wins: true,
        ..FakeBackend::default()
    };
    let rig = Rig::in_dir(
        tempfile::tempdir().unwrap(),
        "profile = \"hang.toml\"",
        &[hang],
        replica(),
    );
    let task = rig.dispatch(BOSS, "Long", "interrupted by a restart");
    rig.deliver(&task);
    rig.outbox
        .until("the ack", |s| {
            s.iter().any(|m| m.intent() == Intent::TaskAck)
        })
        .await;
    let (dir, first) = rig.shut().await;
    let rig = Rig::in_dir(dir, "profile = \"echo\"", &[], replica());
    let result = rig.outbox.result(task.task_id()).await;
    assert_eq!(result.status, Status::Completed);
    let (_, second) = rig.shut().await;
    let ids = |o: &FakeBackend| -> Vec<(Intent, String)> {
        o.sent()
            .iter()
            .map(|m| (m.intent(), m.envelope.message_id.clone()))
            .collect()
    };
    assert_eq!(
        second.intents(task.task_id()),
        vec![Intent::TaskResult],
        "first life {:?}, second {:?}",
        ids(&first),
        ids(&second)
    );
}

/// Issue 31: a hundred other conversations finishing made the prune remove the folder of a
/// conversation whose task was running in it. A folder in use is never pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_conversations_folder_outlives_a_hundred_other_conversations() {
    let profile = "command = \"sh\"\nargs = [\"-c\", \"case \\\"$AAMP_SESSION_KEY\\\" in busy*) sleep 600;; esac; echo done\"]\n";
    let rig = Rig::new(
        "profile = \"conv.toml\"\nmax_concurrent_tasks = 4",
        &[("conv.toml", profile)],
    );
    let conversation = |key: &str| {
        let mut task = rig.dispatch(BOSS, "Turn", "a turn");
        if let Body::Dispatch(d) = &mut task.body {
            d.session_key = Some(key.to_string());
        }
        task
    };
    let folders = rig.dir.path().join("state");
    let conversations = || -> Vec<std::path::PathBuf> {
        walk(&folders)
            .into_iter()
            .filter(|p| p.parent().is_some_and(|d| d.ends_with("conversations")))
            .collect()
    };
    let busy = conversation("busy");
    rig.deliver(&busy);
    rig.outbox
        .until("the busy task's ack", |s| {
            s.iter().any(|m| m.task_id() == busy.task_id())
        })
        .await;
    let held = loop {
        if let [one] = conversations().as_slice() {
            break one.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let others: Vec<AampMessage> = (0..105)
        .map(|n| conversation(&format!("other-{n}")))
        .collect();
    for task in &others {
        rig.deliver(task);
    }
    rig.outbox
        .until("the others' results", |s| {
            s.iter()
                .filter(|m| m.intent() == Intent::TaskResult)
                .count()
                == others.len()
        })
        .await;
    assert!(
        held.exists(),
        "the running conversation's folder was pruned"
    );
    assert!(conversations().len() <= 101, "{}", conversations().len());
    rig.shut().await;
}

/// Every folder below `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(entry.path());
            out.extend(walk(&entry.path()));
        }
    }
    out
}

/// Issue 18: tasks of equal priority ran as 34, 32, 31, 33, 35: each took its place in the
/// slot queue when the runtime first polled it. Now the place is taken at delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_equal_priority_runs_in_arrival_order() {
    let marker = tempfile::tempdir().unwrap();
    let order = marker.path().join("order");
    let profile = format!(
        "command = \"python3\"\nargs = [\"-c\", \"import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\\\n')\", {:?}, \"{{{{task_id}}}}\"]\n",
        order.display().to_string()
    );
    let rig = Rig::new(
        "profile = \"order.toml\"\nmax_concurrent_tasks = 1",
        &[("order.toml", &profile)],
    );
    let tasks: Vec<AampMessage> = (0..12)
        .map(|i| rig.dispatch(BOSS, &format!("Task {i}"), "note your id"))
        .collect();
    // Delivered from a task on a worker thread, as the daemon's intake does: what that task
    // spawns lands in the worker's own queue, which the runtime does not run in order.
    let (engine, burst) = (rig.engine.clone(), tasks.clone());
    tokio::spawn(async move {
        for (n, task) in burst.iter().enumerate() {
            engine.deliver(as_delivered(task, n)).unwrap();
        }
    })
    .await
    .unwrap();
    for task in &tasks {
        assert_eq!(
            rig.outbox.result(task.task_id()).await.status,
            Status::Completed
        );
    }
    let ran: Vec<String> = std::fs::read_to_string(&order)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let sent: Vec<String> = tasks.iter().map(|t| t.task_id().to_string()).collect();
    assert_eq!(ran, sent, "first come, first served");
    rig.shut().await;
}

/// A `pair.request` from `from` with `code`.
fn pair_request(rig: &Rig, from: &str, code: &str) -> AampMessage {
    let mut msg = rig.dispatch(from, "pair", "");
    msg.body = Body::PairRequest {
        pair_code: code.into(),
        rules: None,
    };
    msg.envelope.subject = msg.subject();
    msg
}

fn pair_status(msg: &AampMessage) -> Option<(Status, Option<String>)> {
    match &msg.body {
        Body::PairRespond { status, reason } => Some((*status, reason.clone())),
        _ => None,
    }
}

/// Issue 18: five wrong codes from each of four ordinary users locked pairing for the agent,
/// and a fifth user's valid code was refused without even an answer (the refusals' budget was
/// used up). A correct code pairs unless its own sender is locked out.
#[tokio::test]
async fn guessing_senders_cannot_lock_pairing_for_someone_with_the_right_code() {
    let rig = Rig::new("profile = \"echo\"", &[]);
    let journal = Journal::open(&rig.dir.path().join("state/journal.sqlite3")).unwrap();
    journal
        .add_pair_code("agent", "the-right-code", Duration::from_secs(300))
        .unwrap();
    let mut wrong = Vec::new();
    for user in 0..4 {
        for attempt in 0..5 {
            let msg = pair_request(
                &rig,
                &format!("guesser{user}@example.test"),
                &format!("guess-{attempt}"),
            );
            rig.deliver(&msg);
            wrong.push(msg);
        }
    }
    // Past the agent's ceiling a wrong code is not answered; a locked sender is refused even
    // with the right code.
    let late_guess = pair_request(&rig, "guesser5@example.test", "guess");
    rig.deliver(&late_guess);
    let locked = pair_request(&rig, "guesser0@example.test", "the-right-code");
    rig.deliver(&locked);
    let fifth = pair_request(&rig, "newcomer@example.test", "the-right-code");
    rig.deliver(&fifth);
    let sent = rig
        .outbox
        .until("the newcomer's pairing answer", |s| {
            s.iter().any(|m| m.task_id() == fifth.task_id())
        })
        .await;
    let answer = sent
        .iter()
        .find(|m| m.task_id() == fifth.task_id())
        .unwrap();
    assert_eq!(pair_status(answer).unwrap().0, Status::Completed);
    let (_, outbox) = rig.shut().await;
    for msg in &wrong {
        let answers: Vec<_> = outbox
            .sent()
            .into_iter()
            .filter(|m| m.task_id() == msg.task_id())
            .collect();
        assert_eq!(answers.len(), 1, "each of the first twenty is answered");
        assert_eq!(pair_status(&answers[0]).unwrap().0, Status::Rejected);
    }
    assert!(
        outbox.intents(late_guess.task_id()).is_empty(),
        "not answered past the ceiling"
    );
    // The locked sender's right code was not taken (the newcomer paired with it), and past
    // the ceiling its refusal was not mailed either.
    assert!(outbox.intents(locked.task_id()).is_empty());
}

#[tokio::test]
async fn a_sender_with_five_wrong_codes_is_locked_out_even_with_the_right_one() {
    let rig = Rig::new("profile = \"echo\"", &[]);
    let journal = Journal::open(&rig.dir.path().join("state/journal.sqlite3")).unwrap();
    journal
        .add_pair_code("agent", "the-right-code", Duration::from_secs(300))
        .unwrap();
    for attempt in 0..5 {
        rig.deliver(&pair_request(
            &rig,
            "guesser@example.test",
            &format!("guess-{attempt}"),
        ));
    }
    let right = pair_request(&rig, "guesser@example.test", "the-right-code");
    rig.deliver(&right);
    let sent = rig
        .outbox
        .until("the answer", |s| {
            s.iter().any(|m| m.task_id() == right.task_id())
        })
        .await;
    let answer = sent
        .iter()
        .find(|m| m.task_id() == right.task_id())
        .unwrap();
    let (status, reason) = pair_status(answer).unwrap();
    assert_eq!(status, Status::Rejected);
    assert!(reason.unwrap().contains("too many"));
    rig.shut().await;
}

/// The journal's size on disk, with its write-ahead log.
fn journal_bytes(rig: &Rig) -> u64 {
    ["journal.sqlite3", "journal.sqlite3-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(rig.dir.path().join("state").join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// Issue 18: every refused dispatch was stored whole for 30 days (30 mails of 1 MiB from a
/// stranger added 31.6 MB), and early cancels from strangers without limit.
#[tokio::test]
async fn refused_mail_and_strangers_cancels_do_not_fill_the_journal() {
    let rig = Rig::new("profile = \"echo\"", &[]);
    let before = journal_bytes(&rig);
    let big = "x".repeat(1 << 20);
    let mut refused = Vec::new();
    for i in 0..30 {
        let msg = rig.dispatch("stranger@elsewhere.test", &format!("Big {i}"), &big);
        rig.deliver(&msg);
        refused.push(msg);
    }
    for i in 0..200 {
        let mut cancel = rig.dispatch("stranger@elsewhere.test", "c", "");
        cancel.envelope.task_id = format!("early-{i}");
        cancel.body = Body::Cancel {
            reason: "stop".into(),
        };
        cancel.envelope.subject = cancel.subject();
        rig.deliver(&cancel);
    }
    let grown = journal_bytes(&rig).saturating_sub(before);
    assert!(grown < 2 << 20, "the journal grew by {grown} bytes");
    let journal = Journal::open(&rig.dir.path().join("state/journal.sqlite3")).unwrap();
    assert!(!journal
        .was_cancelled("agent", "stranger@elsewhere.test", "early-0")
        .unwrap());
    // A redelivery is still recognised: nothing is run or answered twice.
    rig.deliver(&refused[0]);
    rig.outbox
        .until("the refusals", |s| {
            s.iter()
                .filter(|m| m.intent() == Intent::TaskResult)
                .count()
                >= 20
        })
        .await;
    let (_, outbox) = rig.shut().await;
    assert_eq!(
        outbox.intents(refused[0].task_id()),
        vec![Intent::TaskResult]
    );
}

/// Issue 18: 3,000 tiny attachments held the agent's only slot for 50 s while they downloaded
/// one by one. Now a task takes at most 32, four at a time, before it asks for a slot, and the
/// prompt names what was left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_attachments_never_hold_the_slot_and_the_rest_are_named_as_left_out() {
    let (open, _) = tokio::sync::watch::channel(false);
    let downloads = Downloads {
        open,
        in_flight: Arc::default(),
        most_at_once: Arc::default(),
        done: Arc::default(),
    };
    let outbox = FakeBackend {
        downloads: Some(downloads.clone()),
        ..FakeBackend::default()
    };
    let rig = Rig::in_dir(
        tempfile::tempdir().unwrap(),
        "profile = \"echo-prompt\"\nmax_concurrent_tasks = 1",
        &[],
        outbox,
    );
    let heavy = rig.dispatch(BOSS, "Heavy", "read the files");
    let attachments: Vec<Attachment> = (0..3000)
        .map(|i| Attachment {
            name: format!("note-{i}.txt"),
            content_type: "text/plain".into(),
            size: 10,
            url: format!("http://127.0.0.1:9/{i}"),
        })
        .collect();
    rig.engine
        .deliver(as_delivered_with(&heavy, 0, attachments))
        .unwrap();
    // While its downloads wait, the next task has the agent's only slot.
    let light = rig.dispatch(BOSS, "Light", "quick one");
    rig.engine.deliver(as_delivered(&light, 1)).unwrap();
    assert_eq!(
        rig.outbox.result(light.task_id()).await.status,
        Status::Completed
    );
    assert!(
        downloads.done.load(Ordering::SeqCst) == 0,
        "the heavy task is still downloading"
    );
    downloads.open.send_replace(true);
    let result = rig.outbox.result(heavy.task_id()).await;
    assert_eq!(result.status, Status::Completed);
    assert!(
        result.output.contains("2968 more attachments"),
        "{}",
        result.output
    );
    assert!(
        result.output.contains("attachments/note-31.txt"),
        "{}",
        result.output
    );
    assert!(!result.output.contains("attachments/note-32.txt"));
    assert_eq!(downloads.done.load(Ordering::SeqCst), 32);
    assert!(downloads.most_at_once.load(Ordering::SeqCst) <= 4);
    rig.shut().await;
}

/// Issue 32, item 4: a CLI whose stream names a session, under a profile with no
/// `{{resume_id}}` (as `profile new` made them), started every turn afresh while the bridge
/// kept the session id and never used it, and told nobody. Its later turns now carry the
/// conversation's earlier turns in the prompt, and the result says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_that_cannot_resume_is_retold_the_conversation_and_the_result_says_so() {
    let script = r#"import sys, json
p = sys.stdin.read()
print(json.dumps({"type": "system", "subtype": "init", "session_id": "s-1"}))
said = "knew apricot" if "apricot" in p and "second turn" in p else "fresh"
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": said}))"#;
    let profile = format!(
        "command = \"python3\"\nargs = [\"-c\", {}]\nstdin = \"{{{{prompt}}}}\"\nstream = \"claude\"\n",
        toml::Value::String(script.into())
    );
    let rig = Rig::new("profile = \"forgets.toml\"", &[("forgets.toml", &profile)]);
    let turn = |text: &str| {
        let mut task = rig.dispatch(BOSS, "Turn", text);
        if let Body::Dispatch(d) = &mut task.body {
            d.session_key = Some("talk".to_string());
        }
        task
    };
    let first = turn("remember apricot");
    rig.deliver(&first);
    let one = rig.outbox.result(first.task_id()).await;
    assert_eq!(one.output, "fresh", "{one:?}");
    let second = turn("second turn");
    rig.deliver(&second);
    let two = rig.outbox.result(second.task_id()).await;
    assert!(two.output.starts_with("knew apricot"), "{two:?}");
    assert!(
        two.output.contains("cannot continue a session"),
        "the result says the turns were retold: {two:?}"
    );
    rig.shut().await;
}
