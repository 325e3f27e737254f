//! Issue 22: several bridges (replicas) serving one agent address, coordinated by the mail
//! server itself: each dispatch is claimed on the server (JMAP `ifInState`) before it is
//! acknowledged, run by the one replica that won, and taken over when its replica dies.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aamp_bridge::protocol::Intent;
use support::{
    assert_answered_once, mailhost, replicas, send_burst, sleeper, wait_results,
    wait_results_explained, Bridge, ConfigDir, MailHost, Peer,
};

/// A config folder for replica `name` of the agent's mailbox, whose agent takes `seconds`
/// over a task, two at a time.
fn replica(
    host: &MailHost,
    agent: &aamp_bridge::config::Account,
    boss: &str,
    name: &str,
    seconds: f64,
) -> ConfigDir {
    replica_with(host, agent, boss, name, &sleeper(seconds))
}

/// [`replica`] with the profile `profile`.
fn replica_with(
    host: &MailHost,
    agent: &aamp_bridge::config::Account,
    boss: &str,
    name: &str,
    profile: &str,
) -> ConfigDir {
    support::replica(host, agent, boss, name, profile, "max_concurrent_tasks = 2")
}

/// The tasks each bridge completed (and answered: a run that ended after another replica took
/// its task over is `task.superseded`, counted apart and said here).
fn completed(bridges: &mut [Bridge]) -> Vec<HashSet<String>> {
    bridges
        .iter_mut()
        .map(|b| {
            b.take_events();
            let superseded = b
                .seen
                .iter()
                .filter(|e| e["event"] == "task.superseded")
                .count();
            if superseded > 0 {
                eprintln!("{superseded} runs ended after their task was taken over (starved past the lease)");
            }
            b.seen
                .iter()
                .filter(|e| e["event"] == "task.completed" && e["status"] == "completed")
                .map(|e| e["taskId"].as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

/// Waits until one of `bridges` has started a task (`task_id`, or any when `None`): its index.
async fn runner_of(bridges: &mut [Bridge], task_id: Option<&str>) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let started = bridges.iter_mut().position(|b| {
            b.take_events();
            b.seen
                .iter()
                .any(|e| e["event"] == "task.started" && task_id.is_none_or(|t| e["taskId"] == t))
        });
        if let Some(i) = started {
            return i;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no replica started {task_id:?} within a minute"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_run_a_burst_once_each_and_share_it() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let dirs = replicas(host, &agent, &boss.email, &["r1", "r2", "r3"], 0.2, 2);
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    // 150: every dispatch raced for by three replicas, and enough for each replica's share
    // to show (300 until issue 44: two and a half minutes of the suite, the same proof).
    let tasks = send_burst(&peer, &agent.email, 150, "sleep a little").await;
    wait_results(&mut peer, &tasks, Duration::from_secs(300)).await;
    peer.settle(&via).await;
    assert_answered_once(&peer, &tasks, "");
    let ran = completed(&mut bridges);
    let mut owners: HashMap<&String, usize> = HashMap::new();
    for (i, set) in ran.iter().enumerate() {
        for task in set {
            assert!(
                owners.insert(task, i).is_none(),
                "{task} ran on two replicas"
            );
        }
    }
    assert_eq!(owners.len(), tasks.len());
    for (i, set) in ran.iter().enumerate() {
        assert!(
            set.len() >= tasks.len() / 5,
            "replica r{} ran {} of {}: {:?}",
            i + 1,
            set.len(),
            tasks.len(),
            ran.iter().map(HashSet::len).collect::<Vec<_>>()
        );
    }
    for b in bridges {
        assert!(b.stop().success());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_mid_task_loses_its_tasks_to_the_others_after_the_lease() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let dirs = replicas(host, &agent, &boss.email, &["r1", "r2", "r3"], 3.0, 2);
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    let tasks = send_burst(&peer, &agent.email, 6, "sleep").await;
    // The first replica seen starting one: killed (no stop, no answer, no lease release).
    let victim = runner_of(&mut bridges, None).await;
    bridges.remove(victim).kill();
    wait_results(&mut peer, &tasks, Duration::from_secs(90)).await;
    peer.settle(&via).await;
    for task in &tasks {
        let results = peer
            .intents_for(task)
            .into_iter()
            .filter(|i| *i == Intent::TaskResult)
            .count();
        assert_eq!(results, 1, "{task}");
    }
    let ran = completed(&mut bridges);
    assert_eq!(
        ran.iter().map(HashSet::len).sum::<usize>(),
        tasks.len(),
        "every task completed once on the survivors: {ran:?}"
    );
    for b in bridges {
        assert!(b.stop().success());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_stops_the_task_on_the_replica_that_runs_it() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let dirs = replicas(host, &agent, &boss.email, &["r1", "r2", "r3"], 60.0, 2);
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    let dispatch = peer.dispatch_to(&agent.email, "Long", "sleep long");
    let sent = peer.send(dispatch).await;
    let task = sent.task_id().to_string();
    peer.wait_for(&task, Intent::TaskAck).await;
    let runner = runner_of(&mut bridges, Some(&task)).await;
    // `status` shows which replica holds it, read from the server, on any replica.
    let other = (runner + 1) % 3;
    let status: serde_json::Value =
        serde_json::from_str(&dirs[other].run(&["status", "--json"])).unwrap();
    let names = ["r1", "r2", "r3"];
    assert_eq!(status["agents"][0]["replica"], names[other], "{status}");
    assert_eq!(
        status["agents"][0]["replicas"][names[runner]]["held"], 1,
        "{status}"
    );
    peer.send(peer.cancel_of(&sent, &agent.email)).await;
    let done = bridges[runner].wait_event("task.completed", |e| e["taskId"] == task.as_str());
    assert_eq!(done["status"], "rejected", "{done}");
    let result = peer.wait_for(&task, Intent::TaskResult).await;
    assert!(format!("{:?}", result.message.body).contains("cancelled"));
    peer.settle(&via).await;
    let intents = peer.intents_for(&task);
    assert_eq!(
        intents.iter().filter(|i| **i == Intent::TaskResult).count(),
        1,
        "{intents:?}"
    );
    for b in bridges {
        assert!(b.stop().success());
    }
}

/// A dispatch every replica refuses (a stranger; a task passed on too often) is answered by
/// one of them: the one that wins its claim, as for a task that runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_the_replicas_refuse_is_answered_once() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let stranger = host.user("stranger");
    let dirs = replicas(host, &agent, &boss.email, &["r1", "r2", "r3"], 0.1, 2);
    let bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut boss = Peer::new(boss).await;
    let mut stranger = Peer::new(stranger).await;
    let mut looped = boss.dispatch_to(&agent.email, "Passed on", "again");
    if let aamp_bridge::protocol::Body::Dispatch(d) = &mut looped.body {
        d.hop_count = Some(99);
    }
    let looped = boss.send(looped).await;
    let refused = stranger
        .send(stranger.dispatch_to(&agent.email, "Let me in", "please"))
        .await;
    for (peer, task, why) in [
        (&mut boss, looped.task_id(), "loop guard"),
        (&mut stranger, refused.task_id(), "Unauthorized sender"),
    ] {
        let result = peer.wait_for(task, Intent::TaskResult).await;
        assert!(
            format!("{:?}", result.message.body).contains(why),
            "{:?}",
            result.message.body
        );
        peer.settle(&via).await;
        assert_eq!(peer.intents_for(task), vec![Intent::TaskResult], "{task}");
    }
    for b in bridges {
        assert!(b.stop().success());
    }
}

/// A task taken over from a replica that died is not run again when the agent's tasks must
/// not run twice (`rerun_interrupted = false`): it is answered "interrupted", once.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_must_not_run_twice_is_answered_interrupted_after_a_takeover() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let once = format!("{}rerun_interrupted = false\n", sleeper(30.0));
    let dirs: Vec<ConfigDir> = ["r1", "r2"]
        .iter()
        .map(|name| replica_with(host, &agent, &boss.email, name, &once))
        .collect();
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    let sent = peer
        .send(peer.dispatch_to(&agent.email, "Once", "only once"))
        .await;
    let task = sent.task_id().to_string();
    let runner = runner_of(&mut bridges, Some(&task)).await;
    bridges.remove(runner).kill();
    let result = peer
        .wait_for_within(&task, Intent::TaskResult, Duration::from_secs(60))
        .await;
    let text = format!("{:?}", result.message.body);
    assert!(
        text.contains("interrupted") && text.contains("not run twice"),
        "{text}"
    );
    let survivor = &mut bridges[0];
    survivor.take_events();
    assert!(
        !survivor
            .seen
            .iter()
            .any(|e| e["event"] == "task.started" && e["taskId"] == task.as_str()),
        "the survivor did not run it"
    );
    peer.settle(&via).await;
    assert_eq!(
        peer.intents_for(&task)
            .iter()
            .filter(|i| **i == Intent::TaskResult)
            .count(),
        1
    );
    for b in bridges {
        assert!(b.stop().success());
    }
}

/// Issue 31: Cyrus keeps a mailbox's keyword names in a table of 100 that is never emptied,
/// and builds that wrote a name per lease (`$aamp-lease-SECS`) stopped claiming for good
/// after about a hundred claims and renewals ("Too many user flags in mailbox"). Two
/// replicas race for claims on 20 mails, the winner renews three times and lets the lease
/// end, round after round: 2,000 claims and renewals, each with a lease ending at another
/// second (as claims over half an hour would), all taken by the server, each claim won by
/// exactly one replica, and the names on the mailbox's mail a fixed few.
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_make_2000_claims_and_renewals_on_one_mailbox() {
    use aamp_bridge::mailbox::aamp::claims::{self, Claim};
    use aamp_bridge::mailbox::aamp::jmap::JmapClient;
    let Some(host) = mailhost() else { return };
    let agent = host.user("agent");
    const MAILS: usize = 20;
    for n in 0..MAILS {
        support::inject_mx(
            host,
            "someone@example.test",
            &agent.email,
            &format!("From: someone@example.test\nTo: {}\nSubject: mail {n}\nMessage-ID: <claims-{n}@example.test>\n\nhello\n", agent.email),
        );
    }
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let mut jmap = JmapClient::new(&agent).unwrap();
        jmap.connect().await.unwrap();
        replicas.push(jmap);
    }
    let inbox = replicas[0].inbox_id().await.unwrap();
    let ids = loop {
        let ids = replicas[0].query_mailbox(&inbox, 100).await.unwrap();
        if ids.len() == MAILS {
            break ids;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let names = ["r1", "r2"];
    let started = std::time::Instant::now();
    let (mut ops, mut round) = (0usize, 0u64);
    while ops < 2_000 {
        let id = &ids[round as usize % MAILS];
        // A lease ending at a second no earlier round used.
        let lease = |k: u64| Duration::from_secs(600 + round * 5 + k);
        let (a, b) = tokio::join!(
            claims::claim(&replicas[0], id, names[0], lease(0)),
            claims::claim(&replicas[1], id, names[1], lease(0)),
        );
        ops += 2;
        let (a, b) = (
            a.unwrap_or_else(|e| panic!("claim {ops}: {e}")),
            b.unwrap_or_else(|e| panic!("claim {ops}: {e}")),
        );
        let won = |c: &Claim| matches!(c, Claim::Won | Claim::TakenOver { .. });
        assert!(won(&a) != won(&b), "round {round}: {a:?} / {b:?}");
        let winner = if won(&a) { 0 } else { 1 };
        let loser = if won(&a) { &b } else { &a };
        assert_eq!(
            loser,
            &Claim::Lost {
                by: Some(names[winner].to_string())
            }
        );
        for k in 1..=3 {
            let renewed = claims::renew(&replicas[winner], id, names[winner], lease(k)).await;
            assert!(renewed.unwrap_or_else(|e| panic!("renewal {ops}: {e}")));
            ops += 1;
        }
        // The lease ends now: the next round on this mail is a takeover race.
        assert!(
            claims::renew(&replicas[winner], id, names[winner], Duration::ZERO)
                .await
                .unwrap()
        );
        ops += 1;
        round += 1;
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{ops} claims and renewals in {round} rounds: {elapsed:?}, {:.0}/s",
        ops as f64 / elapsed.as_secs_f64()
    );
    let got = replicas[0]
        .call(
            "Email/get",
            serde_json::json!({ "ids": ids, "properties": ["keywords"] }),
        )
        .await
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for mail in got["list"].as_array().unwrap() {
        seen.extend(mail["keywords"].as_object().unwrap().keys().cloned());
    }
    let allowed: HashSet<String> = claims::names(&names).into_iter().collect();
    let strays: Vec<&String> = seen.iter().filter(|k| !allowed.contains(*k)).collect();
    assert!(
        strays.is_empty(),
        "names outside the claims' set: {strays:?}"
    );
}

/// Uses up `n` of the agent's mailbox's keyword names (Cyrus keeps 100 per mailbox, never
/// freed), as years of a mail client's labels would: set on a mail, then taken off again.
/// The mail keeps `$aamp-done` (one name more), as an answered task's would.
async fn age_keyword_table(host: &MailHost, agent: &aamp_bridge::config::Account, n: usize) {
    use aamp_bridge::mailbox::aamp::jmap::JmapClient;
    support::inject_mx(
        host,
        "someone@example.test",
        &agent.email,
        &format!("From: someone@example.test\nTo: {}\nSubject: labels\nMessage-ID: <labels@example.test>\n\nold mail\n", agent.email),
    );
    let mut jmap = JmapClient::new(agent).unwrap();
    jmap.connect().await.unwrap();
    let inbox = jmap.inbox_id().await.unwrap();
    let id = loop {
        if let Some(id) = jmap.query_mailbox(&inbox, 1).await.unwrap().pop() {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for on in [true, false] {
        let patch: serde_json::Map<String, serde_json::Value> = (0..n)
            .map(|i| {
                let v = if on {
                    serde_json::json!(true)
                } else {
                    serde_json::Value::Null
                };
                (format!("keywords/$label{i}"), v)
            })
            .collect();
        let set = jmap
            .call("Email/set", serde_json::json!({ "update": { &id: patch } }))
            .await
            .unwrap();
        assert!(set["notUpdated"].is_null(), "{set}");
    }
    let set = jmap
        .call(
            "Email/set",
            serde_json::json!({ "update": { &id: { "keywords/$aamp-done": true } } }),
        )
        .await
        .unwrap();
    assert!(set["notUpdated"].is_null(), "{set}");
}

/// Issue 31, end to end: two replicas on a mailbox whose keyword table is 60 names full
/// answer 120 dispatches once each (a claim in most seconds of a minute). Builds that wrote
/// a name per lease ran out of names within a minute here, and every task after that held
/// its slot forever, unclaimed.
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_answer_120_dispatches_once_on_a_mailbox_with_few_names_left() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    age_keyword_table(host, &agent, 60).await;
    let dirs = replicas(host, &agent, &boss.email, &["r1", "r2"], 1.2, 2);
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    let tasks = send_burst(&peer, &agent.email, 120, "sleep a little").await;
    wait_results(&mut peer, &tasks, Duration::from_secs(240)).await;
    peer.settle(&via).await;
    assert_answered_once(&peer, &tasks, "");
    let ran = completed(&mut bridges);
    assert_eq!(
        ran.iter().map(HashSet::len).sum::<usize>(),
        tasks.len(),
        "{ran:?}"
    );
    for b in bridges {
        assert!(b.stop().success());
    }
}

/// A claim the server refuses for good (here its keyword table is full) is not retried while
/// the task holds a slot: the task is parked, unanswered (only a claim's winner answers), and
/// `status`, `tasks` and `doctor` say why.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_the_server_refuses_for_good_parks_the_task_and_says_why() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    age_keyword_table(host, &agent, 99).await;
    let dir = replica(host, &agent, &boss.email, "r1", 0.1);
    let mut bridge = Bridge::start(&dir, 1);
    let peer = Peer::new(boss).await;
    let first = peer
        .send(peer.dispatch_to(&agent.email, "First", "one"))
        .await;
    let second = peer
        .send(peer.dispatch_to(&agent.email, "Second", "two"))
        .await;
    for sent in [&first, &second] {
        let parked = bridge.wait_event("task.parked", |e| e["taskId"] == sent.task_id());
        let reason = parked["reason"].as_str().unwrap();
        assert!(reason.contains("Too many user flags"), "{parked}");
    }
    let status = dir.status_json();
    let a = &status["agents"][0];
    assert_eq!(a["parked"], 2, "{status}");
    assert_eq!(a["queued"], 0, "{status}");
    assert!(
        a["parkedReason"]
            .as_str()
            .unwrap()
            .contains("Too many user flags"),
        "{status}"
    );
    let text = dir.run(&["status"]);
    assert!(text.contains("2 tasks parked"), "{text}");
    let doctor: serde_json::Value = serde_json::from_str(&dir.run(&["doctor", "--json"])).unwrap();
    let claims = doctor
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["check"].as_str().is_some_and(|c| c.ends_with("claims")))
        .unwrap_or_else(|| panic!("{doctor}"));
    assert_eq!(claims["status"], "fail", "{claims}");
    assert!(
        claims["detail"]
            .as_str()
            .unwrap()
            .contains("Too many user flags"),
        "{claims}"
    );
    assert!(bridge.stop().success());
    // The next start tries the parked tasks' claims again (the table is still full here).
    let mut bridge = Bridge::start(&dir, 1);
    for sent in [&first, &second] {
        bridge.wait_event("task.parked", |e| e["taskId"] == sent.task_id());
    }
    assert!(bridge.stop().success());
}

/// `doctor`'s claims check on a replica's mailbox: on a fresh mailbox there is no answered
/// task to try the keywords on (a warning that says when to run it again); once one is
/// answered, every keyword this replica's claims write is set and removed on its mail, and
/// the check passes, leaving the mail as it was (still done, nobody takes it over).
#[tokio::test(flavor = "multi_thread")]
async fn doctor_tries_the_claims_keywords_once_a_task_is_answered() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = replica(host, &agent, &boss.email, "r1", 0.1);
    let claims_check = |dir: &ConfigDir| -> serde_json::Value {
        let doctor: serde_json::Value =
            serde_json::from_str(&dir.run(&["doctor", "--json"])).unwrap();
        doctor
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["check"].as_str().is_some_and(|c| c.ends_with("claims")))
            .cloned()
            .unwrap_or_else(|| panic!("{doctor}"))
    };
    let fresh = claims_check(&dir);
    assert_eq!(fresh["status"], "warn", "{fresh}");
    let mut bridge = Bridge::start(&dir, 1);
    let mut peer = Peer::new(boss).await;
    let sent = peer
        .send(peer.dispatch_to(&agent.email, "First", "one"))
        .await;
    peer.wait_for(sent.task_id(), Intent::TaskResult).await;
    bridge.wait_event("task.completed", |e| e["taskId"] == sent.task_id());
    assert!(bridge.stop().success());
    let answered = claims_check(&dir);
    assert_eq!(answered["status"], "ok", "{answered}");
    // Tried on the answered task's mail and put back: a second look passes the same way.
    assert_eq!(claims_check(&dir)["status"], "ok");
}

/// Issue 31: the replica that lost a claim forgot the task, so a second delivery of the
/// dispatch (the same Message-ID again, or the same sender and TaskId under a new one) was
/// new to it, carried no claim, and ran again: two results. A lost claim is kept as a record
/// of who runs the task now, so every copy is a duplicate on every replica, while the task
/// runs and after it is answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_delivered_twice_to_two_replicas_runs_once() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let dirs = replicas(host, &agent, &boss.email, &["r1", "r2"], 3.0, 2);
    let mut bridges: Vec<Bridge> = dirs.iter().map(|d| Bridge::start(d, 1)).collect();
    let mut peer = Peer::new(boss).await;
    let mut task = peer.dispatch_to(&agent.email, "Twice", "delivered twice");
    task.envelope.message_id = format!("<twice-{}@example.test>", uuid::Uuid::new_v4());
    let task = peer.send(task).await;
    let id = task.task_id().to_string();
    let runner = runner_of(&mut bridges, Some(&id)).await;
    let other = 1 - runner;
    // The other replica has lost the claim and left the task to the runner.
    bridges[other].wait_event("message.ignored", |e| {
        e["taskId"] == id.as_str()
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("claimed by"))
    });
    // While it runs: the same mail again, and the same task under a new Message-ID.
    peer.send(task.clone()).await;
    let mut renamed = task.clone();
    renamed.envelope.message_id = String::new();
    peer.send(renamed.clone()).await;
    peer.wait_for_within(&id, Intent::TaskResult, Duration::from_secs(60))
        .await;
    // After it was answered: both again.
    peer.send(task.clone()).await;
    peer.send(renamed).await;
    for b in bridges.iter_mut() {
        b.wait_count("task.duplicate", 2);
    }
    peer.settle(&via).await;
    let intents = peer.intents_for(&id);
    assert_eq!(
        intents,
        vec![Intent::TaskAck, Intent::TaskResult],
        "{intents:?}"
    );
    let ran = completed(&mut bridges);
    assert_eq!(
        ran.iter().map(HashSet::len).sum::<usize>(),
        1,
        "run once across the replicas: {ran:?}"
    );
    for b in bridges {
        assert!(b.stop().success());
    }
}

/// Two copies of one dispatch (delivered twice: the same Message-ID; or the same sender and
/// TaskId under another) are one task to the claims: a replica claiming the copy it saw first
/// loses to the claim another replica holds on the other copy, and to a copy already answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_on_one_copy_of_a_dispatch_holds_every_copy() {
    use aamp_bridge::mailbox::aamp::claims::{self, Claim};
    use aamp_bridge::mailbox::aamp::jmap::JmapClient;
    let Some(host) = mailhost() else { return };
    let agent = host.user("agent");
    let lease = Duration::from_secs(60);
    let copy = |message_id: &str, task_id: &str, from: &str| {
        support::inject_mx(
            host,
            from,
            &agent.email,
            &format!("From: {from}\nTo: {}\nSubject: [AAMP Task] copy\nMessage-ID: {message_id}\nX-AAMP-Version: 1.1\nX-AAMP-Intent: task.dispatch\nX-AAMP-TaskId: {task_id}\n\nTask: copy\n", agent.email),
        );
    };
    let mut jmap = JmapClient::new(&agent).unwrap();
    jmap.connect().await.unwrap();
    let inbox = jmap.inbox_id().await.unwrap();
    // Delivers a copy and waits for it: its id.
    let mut seen: HashSet<String> = HashSet::new();
    let mut deliver = async |message_id: &str, task_id: &str, from: &str| -> String {
        copy(message_id, task_id, from);
        loop {
            let ids = jmap.query_mailbox(&inbox, 100).await.unwrap();
            if let Some(new) = ids.into_iter().find(|id| !seen.contains(id)) {
                seen.insert(new.clone());
                return new;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // The same Message-ID twice, a renamed copy (same sender and TaskId), and another
    // sender's mail with that TaskId, which is not a copy.
    let first = deliver("<copy-1@example.test>", "task-1", "boss@example.test").await;
    let again = deliver("<copy-1@example.test>", "task-1", "boss@example.test").await;
    let renamed = deliver("<copy-1b@example.test>", "task-1", "boss@example.test").await;
    let other = deliver("<other@example.test>", "task-1", "someone@example.test").await;
    assert_eq!(
        claims::claim(&jmap, &first, "r1", lease).await.unwrap(),
        Claim::Won
    );
    for copy in [&again, &renamed] {
        assert_eq!(
            claims::claim(&jmap, copy, "r2", lease).await.unwrap(),
            Claim::Lost {
                by: Some("r1".into())
            },
            "a copy of r1's task"
        );
    }
    assert_eq!(
        claims::claim(&jmap, &other, "r2", lease).await.unwrap(),
        Claim::Won,
        "another sender's task"
    );
    // Answered: a copy that comes later is lost too.
    assert!(claims::finish(&jmap, &first, "r1").await.unwrap());
    let later = deliver("<copy-1@example.test>", "task-1", "boss@example.test").await;
    assert_eq!(
        claims::claim(&jmap, &later, "r2", lease).await.unwrap(),
        Claim::Lost {
            by: Some("r1".into())
        }
    );
}

/// A replica starved past its lease finishes a task another replica took over meanwhile: on
/// the mail server, its done mark is refused (the claim is the new holder's, whose renewals
/// go on), and the holder's goes through. A done mark made whoever held the claim stopped the
/// holder's run at its next renewal, and the task went unanswered (the suite's find at a load
/// of 16; see tests/fast.rs for the whole of it).
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_taken_over_is_marked_done_only_by_its_new_holder() {
    use aamp_bridge::mailbox::aamp::claims::{self, Claim};
    use aamp_bridge::mailbox::aamp::jmap::JmapClient;
    let Some(host) = mailhost() else { return };
    let agent = host.user("agent");
    let mut jmap = JmapClient::new(&agent).unwrap();
    jmap.connect().await.unwrap();
    let inbox = jmap.inbox_id().await.unwrap();
    support::inject_mx(
        host,
        "boss@example.test",
        &agent.email,
        &format!("From: boss@example.test\nTo: {}\nSubject: [AAMP Task] t\nMessage-ID: <taken-1@example.test>\nX-AAMP-Version: 1.1\nX-AAMP-Intent: task.dispatch\nX-AAMP-TaskId: taken-1\n\nTask: t\n", agent.email),
    );
    let id = loop {
        if let Some(id) = jmap.query_mailbox(&inbox, 10).await.unwrap().pop() {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let minute = Duration::from_secs(60);
    // r1's lease ends at once (it did not renew in time); r2 takes the task over.
    assert_eq!(
        claims::claim(&jmap, &id, "r1", Duration::ZERO)
            .await
            .unwrap(),
        Claim::Won
    );
    assert_eq!(
        claims::claim(&jmap, &id, "r2", minute).await.unwrap(),
        Claim::TakenOver { from: "r1".into() }
    );
    assert!(
        !claims::finish(&jmap, &id, "r1").await.unwrap(),
        "r1 marks done a claim r2 holds"
    );
    assert!(claims::renew(&jmap, &id, "r2", minute).await.unwrap());
    assert_eq!(
        claims::claim(&jmap, &id, "r1", minute).await.unwrap(),
        Claim::Lost {
            by: Some("r2".into())
        }
    );
    assert!(claims::finish(&jmap, &id, "r2").await.unwrap());
    assert!(claims::finish(&jmap, &id, "r2").await.unwrap(), "again");
    assert!(!claims::finish(&jmap, &id, "r1").await.unwrap());
    assert!(
        !claims::renew(&jmap, &id, "r2", minute).await.unwrap(),
        "answered"
    );
}

/// Issue 31: two replicas, 25 slots each, a 10 s lease renewed every 3.3 s and tasks of 15 s,
/// answer 150 dispatches once each, which makes over 700 claims and renewals on one mailbox of
/// the test Cyrus (counted from the bridges' debug lines; about 6 a task). Builds that wrote a
/// keyword name per lease stopped after about a hundred, so 700 proves the point; the issue's
/// 400 dispatches and 2,000 claims took 7 minutes of the suite (issue 44). On a machine too
/// loaded to renew in time, renewals are fewer (at least 300 are asked for), leases run out
/// and tasks are taken over: each is still answered once (a task left unanswered is
/// explained task by task, from both replicas' logs and journals).
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_answer_150_dispatches_once_through_700_claims_and_renewals() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, via) = (host.user("agent"), host.user("boss"), host.user("via"));
    let dirs = replicas(host, &agent, &boss.email, &["r1", "r2"], 15.0, 25);
    let env = [(
        "AAMP_BRIDGE_LOG",
        "info,aamp_bridge::dispatch::claims=debug",
    )];
    let mut bridges: Vec<Bridge> = dirs
        .iter()
        .map(|d| Bridge::start_with_env(d, 1, &env))
        .collect();
    let started = std::time::Instant::now();
    let mut peer = Peer::new(boss).await;
    let tasks = send_burst(&peer, &agent.email, 150, "sleep a while").await;
    let replicas: Vec<(&ConfigDir, &Bridge)> = dirs.iter().zip(&bridges).collect();
    wait_results_explained(&mut peer, &tasks, Duration::from_secs(600), &replicas).await;
    let took = started.elapsed();
    peer.settle(&via).await;
    let takeovers: Vec<String> = bridges
        .iter()
        .flat_map(|b| {
            b.log()
                .lines()
                .filter(|l| l.contains("taken over from") || l.contains("took the task over"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_answered_once(&peer, &tasks, &format!("; {takeovers:#?}"));
    // Every task ran to completion on one replica; on both only if it was taken over (a
    // replica starved past its lease may finish a run another replica took over and runs
    // again: its answer is then not sent).
    let ran = completed(&mut bridges);
    for task in &tasks {
        let on = ran.iter().filter(|r| r.contains(task)).count();
        let taken = takeovers.iter().any(|l| l.contains(task.as_str()));
        assert!(
            on == 1 || (on == 2 && taken),
            "{task} completed on {on} replicas; takeovers {takeovers:#?}"
        );
    }
    let (mut claims, mut renewals) = (0, 0);
    for b in &bridges {
        let log = b.log();
        claims += log
            .lines()
            .filter(|l| l.contains("claim won") || l.contains("claim lost"))
            .count();
        renewals += log.lines().filter(|l| l.contains("claim renewed")).count();
    }
    eprintln!(
        "150 dispatches in {took:?}: {claims} claims and {renewals} renewals, {:?} run per replica, {} takeover lines",
        ran.iter().map(HashSet::len).collect::<Vec<_>>(),
        takeovers.len()
    );
    // Over 700 on a machine that keeps up. One starved of CPU renews late (7 s
    // apart rather than 3.3 at a quarter of a core, its leases running out and tasks taken
    // over, as above), so it makes fewer (530 to 660 there), but still several times the
    // hundred that filled the table: every one of them was taken, or a task went unanswered.
    assert!(
        claims + renewals >= 300,
        "{claims} claims and {renewals} renewals; takeovers {takeovers:#?}"
    );
    for b in bridges {
        assert!(b.stop().success());
    }
}
