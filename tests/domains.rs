//! Across organisations, over the mail host's two real domains (scripts/mailhost.sh): each
//! domain's Postfix is the other's MX, signs what its users submit with DKIM (OpenDKIM) and
//! verifies what comes in, writing `Authentication-Results` under its own authserv-id. A
//! bridge at the first domain trusts the second domain's senders only on that evidence
//! (`sender_auth = "authentication-results"`): a dispatch signed at the other domain runs and
//! its answer crosses back; a mail claiming the other domain's sender without its signature,
//! with a made-up verdict, or replayed from a signed one under a new TaskId, is refused as an
//! unauthenticated sender is: no ack, no answer.

mod support;

use aamp_bridge::config::Account;
use aamp_bridge::protocol::{Body, Intent, Status};
use support::{inject_mx, mailhost, mailhost2, Bridge, ConfigDir, MailHost, Peer};

/// An echo agent on `agent` (at `host`) that takes tasks from `allow`, believing senders only
/// through `host`'s Authentication-Results.
fn config(host: &MailHost, agent: &Account, allow: &str) -> String {
    support::Toml::new()
        .host_mailbox(
            host,
            "agent",
            agent,
            &format!(
                "sender_auth = \"authentication-results\"\nauthserv_id = \"{}\"",
                host.authserv_id
            ),
        )
        .agent("agent", "echo", &[allow], "")
        .text()
}

fn dispatch_text(from: &str, to: &str, task_id: &str, extra_headers: &str) -> String {
    format!(
        "{extra_headers}From: {from}\nTo: {to}\nMessage-ID: <{task_id}@forger.test>\nSubject: [AAMP Task] forged\nX-AAMP-Version: 1.1\nX-AAMP-Intent: task.dispatch\nX-AAMP-TaskId: {task_id}\nContent-Type: text/plain\n\nTask: run this\n"
    )
}

/// The Authentication-Results fields of a delivered mail that `authserv_id` wrote.
fn results_by<'a>(headers: &'a [(String, String)], authserv_id: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, v)| {
            n.eq_ignore_ascii_case("authentication-results")
                && v.split(';').next().map(str::trim) == Some(authserv_id)
        })
        .map(|(_, v)| v.as_str())
        .collect()
}

/// `mail` with the header fields named `name` (any case) given `value` instead.
fn with_header(mail: &str, name: &str, value: &str) -> String {
    let (head, body) = mail.split_once("\r\n\r\n").expect("a header and a body");
    let head: Vec<String> = head
        .split("\r\n")
        .map(|line| match line.split_once(':') {
            Some((n, _)) if n.eq_ignore_ascii_case(name) => format!("{n}: {value}"),
            _ => line.to_string(),
        })
        .collect();
    format!("{}\r\n\r\n{body}", head.join("\r\n"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_signed_at_the_other_domain_runs_once_and_its_answer_is_signed_back() {
    let (Some(a), Some(b)) = (mailhost(), mailhost2()) else {
        return;
    };
    let (agent, boss) = (a.user("agent"), b.user("boss"));
    assert_ne!(a.domain, b.domain);
    let dir = ConfigDir::new(a, &config(a, &agent, &boss.email));
    let mut boss_peer = Peer::new(boss.clone()).await;
    let mut agent_view = Peer::new(agent.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);

    // Submitted at the second domain, signed there, relayed to the first.
    let dispatch = boss_peer
        .send(boss_peer.dispatch_to(&agent.email, "Across", "run this"))
        .await;
    let result = boss_peer
        .wait_for(dispatch.task_id(), Intent::TaskResult)
        .await;
    assert!(
        matches!(&result.message.body, Body::Result(r) if r.status == Status::Completed),
        "{:?}",
        result.message.body
    );
    bridge.wait_event("task.completed", |e| e["taskId"] == dispatch.task_id());

    // What the bridge believed: the first domain's verdict on the second domain's signature.
    let arrived = agent_view
        .wait_for(dispatch.task_id(), Intent::TaskDispatch)
        .await;
    let headers = agent_view.raw_headers(&arrived.email_id).await;
    let verdicts = results_by(&headers, &a.authserv_id);
    assert!(
        verdicts
            .iter()
            .any(|v| v.contains("dkim=pass") && v.contains(&format!("header.d={}", b.domain))),
        "{verdicts:?}"
    );
    // And the answer: signed by the first domain, verified by the second.
    let headers = boss_peer.raw_headers(&result.email_id).await;
    let verdicts = results_by(&headers, &b.authserv_id);
    assert!(
        verdicts
            .iter()
            .any(|v| v.contains("dkim=pass") && v.contains(&format!("header.d={}", a.domain))),
        "{verdicts:?}"
    );

    // Whoever holds the signed mail cannot have it run again as another task: the signature
    // covers the Message-ID and every X-AAMP header.
    let signed = String::from_utf8(agent_view.raw_mail(&arrived.email_id).await).unwrap();
    let replay = format!("replay-{}", uuid::Uuid::new_v4());
    let replayed = with_header(&signed, "X-AAMP-TaskId", &replay);
    let replayed = with_header(&replayed, "Message-ID", &format!("<{replay}@forger.test>"));
    assert_ne!(replayed, signed);
    inject_mx(a, &boss.email, &agent.email, &replayed);
    let ignored = bridge.wait_event("message.ignored", |e| e["taskId"] == replay.as_str());
    assert!(
        ignored["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("not authenticated"),
        "{ignored}"
    );
    let replayed_here = agent_view.wait_for(&replay, Intent::TaskDispatch).await;
    let headers = agent_view.raw_headers(&replayed_here.email_id).await;
    let verdicts = results_by(&headers, &a.authserv_id);
    assert!(
        verdicts.len() == 1 && verdicts[0].contains("dkim=fail"),
        "the server's own verdict on the replay, and only it: {verdicts:?}"
    );
    bridge.take_events();
    let about: Vec<_> = bridge
        .seen
        .iter()
        .filter(|e| e["taskId"] == replay.as_str() && e["event"] != "message.ignored")
        .collect();
    assert!(about.is_empty(), "the replay went on: {about:?}");
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn mail_claiming_the_other_domains_sender_without_its_signature_is_refused() {
    let (Some(a), Some(b)) = (mailhost(), mailhost2()) else {
        return;
    };
    let (agent, boss) = (a.user("agent"), b.user("boss"));
    let dir = ConfigDir::new(a, &config(a, &agent, &boss.email));
    let mut boss_peer = Peer::new(boss.clone()).await;
    let mut agent_view = Peer::new(agent.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);

    let task = |kind: &str| format!("{kind}-{}", uuid::Uuid::new_v4());
    // Straight into the first domain's inbound port: no signature.
    let unsigned = task("unsigned");
    inject_mx(
        a,
        &boss.email,
        &agent.email,
        &dispatch_text(&boss.email, &agent.email, &unsigned, ""),
    );
    // The same with a verdict made up in the first domain's name (and another server's).
    let made_up = task("made-up");
    let verdict = format!(
        "Authentication-Results: {}; dkim=pass header.d={d} header.i=@{d}\nAuthentication-Results: {}; dmarc=pass header.from={d}\n",
        a.authserv_id, b.authserv_id, d = b.domain
    );
    inject_mx(
        a,
        &boss.email,
        &agent.email,
        &dispatch_text(&boss.email, &agent.email, &made_up, &verdict),
    );
    // Through the second domain's own inbound port, which relays it unsigned (only its users'
    // authenticated submissions are signed).
    let relayed = task("relayed");
    inject_mx(
        b,
        &boss.email,
        &agent.email,
        &dispatch_text(&boss.email, &agent.email, &relayed, ""),
    );
    let forged = [&unsigned, &made_up, &relayed];
    for task in forged {
        let ignored = bridge.wait_event("message.ignored", |e| e["taskId"] == task.as_str());
        let reason = ignored["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("not authenticated")
                && reason.contains(&format!(
                    "no Authentication-Results from {} pass for {}",
                    a.authserv_id, b.domain
                )),
            "{task}: {ignored}"
        );
    }
    // The made-up verdict in the first domain's name never reached the mailbox.
    let arrived = agent_view.wait_for(&made_up, Intent::TaskDispatch).await;
    let headers = agent_view.raw_headers(&arrived.email_id).await;
    assert_eq!(results_by(&headers, &a.authserv_id), Vec::<&str>::new());
    assert!(
        !results_by(&headers, &b.authserv_id).is_empty(),
        "another server's verdict is left (below the server's own Received field, unread)"
    );

    // A genuine dispatch still runs.
    let genuine = boss_peer
        .send(boss_peer.dispatch_to(&agent.email, "Genuine", "run this"))
        .await;
    let result = boss_peer
        .wait_for(genuine.task_id(), Intent::TaskResult)
        .await;
    assert!(matches!(&result.message.body, Body::Result(r) if r.status == Status::Completed));
    for task in forged {
        let about: Vec<_> = bridge
            .seen
            .iter()
            .filter(|e| e["taskId"] == task.as_str() && e["event"] != "message.ignored")
            .collect();
        assert!(about.is_empty(), "{task} went on: {about:?}");
    }
    assert!(bridge.stop().success());
    boss_peer.settle(&agent).await;
    for task in forged {
        assert!(
            boss_peer.intents_for(task).is_empty(),
            "{task}: no ack and no answer to a forged mail"
        );
    }
}
