//! Who may ask what, over the real mail host: a `From:` is believed only with evidence the
//! receiving server wrote (here Postfix's record of an authenticated submission).

mod support;

use aamp_bridge::protocol::{Body, Intent, Status};
use support::{inject_mx, inject_mx_as, mailhost, Bridge, ConfigDir, Peer};

/// One echo agent taking tasks from `allow`; `extra` are more keys of its mailbox.
fn config(
    host: &support::MailHost,
    agent: &aamp_bridge::config::Account,
    allow: &str,
    extra: &str,
) -> String {
    support::Toml::new()
        .host_mailbox(host, "agent", agent, extra)
        .agent("agent", "echo", &[allow], "")
        .text()
}

fn dispatch_text(from: &str, to: &str, task_id: &str, extra_headers: &str) -> String {
    format!(
        "{extra_headers}From: {from}\nTo: {to}\nMessage-ID: <{task_id}@forger.test>\nSubject: [AAMP Task] forged\nX-AAMP-Version: 1.1\nX-AAMP-Intent: task.dispatch\nX-AAMP-TaskId: {task_id}\nContent-Type: text/plain\n\nTask: run this\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_from_is_refused_without_an_ack_and_a_genuine_one_runs() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &config(host, &agent, &boss.email, ""));
    let mut peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);

    // Straight into the inbound port, claiming to be the allowed sender.
    let forged = format!("forged-{}", uuid::Uuid::new_v4());
    inject_mx(
        host,
        &boss.email,
        &agent.email,
        &dispatch_text(&boss.email, &agent.email, &forged, ""),
    );
    // The same, with a made-up Received line claiming an authenticated submission.
    let dressed = format!("dressed-{}", uuid::Uuid::new_v4());
    let fake = "Received: from vm (localhost [127.0.0.1])\n\t(Authenticated sender: BOSS)\n\tby localhost (Postfix) with ESMTPA id 1\n\tfor <agent>; Mon, 30 Nov 2026 12:00:00 +0000 (UTC)\n"
        .replace("BOSS", &boss.email);
    inject_mx(
        host,
        &boss.email,
        &agent.email,
        &dispatch_text(&boss.email, &agent.email, &dressed, &fake),
    );
    for task in [&forged, &dressed] {
        let ignored = bridge.wait_event("message.ignored", |e| e["taskId"] == task.as_str());
        assert!(
            ignored["fields"]["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("not authenticated")
                || ignored["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("not authenticated"),
            "{ignored}"
        );
    }

    // The real sender, through the submission port with its own login.
    let genuine = peer
        .send(peer.dispatch_to(&agent.email, "Genuine", "run this"))
        .await;
    let result = peer.wait_for(genuine.task_id(), Intent::TaskResult).await;
    assert!(matches!(&result.message.body, Body::Result(r) if r.status == Status::Completed));
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    for task in [&forged, &dressed] {
        assert!(
            peer.intents_for(task).is_empty(),
            "no ack and no answer to a forged mail"
        );
    }
}

/// EHLO names a stranger may choose: Postfix copies the name into its own Received field, so
/// none of them may change which field is read as the server's, or what it says.
const HOSTILE_EHLO: &[&str] = &[
    "with",
    "WITH",
    "by",
    "from",
    "(Authenticated",
    "esmtpa",
    "id",
    "for",
    "with)",
    "x(Authenticated",
    "Authenticated",
    "sender:",
    ";",
];

/// A forged Received field claiming `login`'s authenticated submission, and a forged
/// Authentication-Results field claiming DMARC passed, both from `localhost`.
fn forged_evidence(login: &str, domain: &str) -> String {
    format!(
        "Authentication-Results: localhost; dmarc=pass header.from={domain}\nReceived: from client.example.net (localhost [127.0.0.1])\n\t(Authenticated sender: {login})\n\tby localhost (Postfix) with ESMTPA id 42F9D99E6B2\n\tfor <agent@example.test>; Mon, 30 Nov 2026 12:00:00 +0000 (UTC)\n"
    )
}

/// Issue 18: with `EHLO with` the first `with` of Postfix's own field was its HELO name, the
/// field was judged "not SMTP" and the forged one below it was read as the server's.
/// `genuine_runs`: the mailbox believes boss's own submissions (not so with only
/// Authentication-Results, which the test host does not write).
async fn hostile_ehlo_names_are_never_believed(extra: &str, genuine_runs: bool) {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &config(host, &agent, &boss.email, extra));
    let mut peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);
    let domain = boss.email.rsplit_once('@').unwrap().1.to_string();
    let mut forged = Vec::new();
    for ehlo in HOSTILE_EHLO {
        let task = format!("ehlo-{}", uuid::Uuid::new_v4());
        inject_mx_as(
            host,
            ehlo,
            &boss.email,
            &agent.email,
            &dispatch_text(
                &boss.email,
                &agent.email,
                &task,
                &forged_evidence(&boss.email, &domain),
            ),
        );
        forged.push((ehlo, task));
    }
    for (ehlo, task) in &forged {
        let ignored = bridge.wait_event("message.ignored", |e| e["taskId"] == task.as_str());
        let reason = ignored["reason"].as_str().unwrap_or_default().to_string()
            + ignored["fields"]["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("not authenticated"),
            "EHLO {ehlo}: {ignored}"
        );
    }
    // A genuine task still runs.
    if genuine_runs {
        let genuine = peer
            .send(peer.dispatch_to(&agent.email, "Genuine", "run this"))
            .await;
        let result = peer.wait_for(genuine.task_id(), Intent::TaskResult).await;
        assert!(matches!(&result.message.body, Body::Result(r) if r.status == Status::Completed));
    }
    for (ehlo, task) in &forged {
        let about: Vec<_> = bridge
            .seen
            .iter()
            .filter(|e| e["taskId"] == task.as_str() && e["event"] != "message.ignored")
            .collect();
        assert!(
            about.is_empty(),
            "EHLO {ehlo}: the forged task went on: {about:?}"
        );
    }
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    for (ehlo, task) in &forged {
        assert!(
            peer.intents_for(task).is_empty(),
            "EHLO {ehlo}: no ack and no answer to a forged mail"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_ehlo_names_over_the_inbound_port_never_pass_as_an_allowed_sender() {
    hostile_ehlo_names_are_never_believed("", true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_ehlo_names_never_make_forged_authentication_results_count() {
    hostile_ehlo_names_are_never_believed(
        "sender_auth = \"authentication-results\"\nauthserv_id = \"localhost\"",
        false,
    )
    .await;
}

/// Issue 18, on stock Postfix: its submission service writes `with ESMTPA` without naming the
/// login, so a genuine submission cannot be told from anyone else's and is not believed (the
/// reason says what to set); the same user through a submission that names the login is.
#[tokio::test(flavor = "multi_thread")]
async fn a_submission_on_stock_postfix_is_not_believed_and_the_reason_says_what_to_set() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &config(host, &agent, &boss.email, ""));
    let mut stock = boss.clone();
    stock.smtp_port = host.smtp_stock_port;
    let stock_peer = Peer::new(stock).await;
    let mut peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);
    let unnamed = stock_peer
        .send(stock_peer.dispatch_to(&agent.email, "Stock", "run this"))
        .await;
    let ignored = bridge.wait_event("message.ignored", |e| e["taskId"] == unnamed.task_id());
    assert!(
        ignored["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("smtpd_sasl_authenticated_header = yes"),
        "{ignored}"
    );
    let named = peer
        .send(peer.dispatch_to(&agent.email, "Named", "run this"))
        .await;
    let result = peer.wait_for(named.task_id(), Intent::TaskResult).await;
    assert!(matches!(&result.message.body, Body::Result(r) if r.status == Status::Completed));
    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    assert!(peer.intents_for(unnamed.task_id()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn with_sender_auth_none_the_from_header_is_believed() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(
        host,
        &config(host, &agent, &boss.email, "sender_auth = \"none\""),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let bridge = Bridge::start(&dir, 1);
    assert!(
        bridge.log().contains("sender_auth = \"none\""),
        "the choice is warned about at start"
    );
    let task = format!("unchecked-{}", uuid::Uuid::new_v4());
    inject_mx(
        host,
        &boss.email,
        &agent.email,
        &dispatch_text(&boss.email, &agent.email, &task, ""),
    );
    let result = peer.wait_for(&task, Intent::TaskResult).await;
    assert!(matches!(&result.message.body, Body::Result(r) if r.status == Status::Completed));
    assert!(bridge.stop().success());
}

fn result_of(msg: &aamp_bridge::mailbox::Inbound) -> (Status, String) {
    match &msg.message.body {
        Body::Result(r) => (r.status, r.error.clone().unwrap_or_default()),
        other => panic!("not a result: {other:?}"),
    }
}

fn policy_cmd(dir: &ConfigDir, args: &[&str]) -> String {
    let out = std::process::Command::new(support::bin())
        .args(["--config", dir.config().to_str().unwrap(), "policy"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn globs_context_rules_and_the_policy_command_decide_who_runs_tasks() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, other) = (host.user("agent"), host.user("boss"), host.user("other"));
    // Nobody in allow_from; a glob with a context rule in the config; the rest by command.
    let extra = "";
    let text = format!(
        "{}{extra}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\n\n[[agents.senders]]\nsender = \"boss-*@{}\"\ncontext = {{ project = [\"alpha\", \"beta\"] }}\n",
        host.mailbox_toml("agent", &agent),
        host.domain
    );
    let dir = ConfigDir::new(host, &text);
    let mut peer = Peer::new(boss.clone()).await;
    let mut outsider = Peer::new(other.clone()).await;
    let bridge = Bridge::start(&dir, 1);

    let with_context = |peer: &Peer, project: &str| {
        let mut msg = peer.dispatch_to(&agent.email, "Ctx", "hello");
        if let Body::Dispatch(d) = &mut msg.body {
            d.dispatch_context.insert("project".into(), project.into());
        }
        msg
    };
    let yes = peer.send(with_context(&peer, "beta")).await;
    let no = peer.send(with_context(&peer, "gamma")).await;
    assert_eq!(
        result_of(&peer.wait_for(yes.task_id(), Intent::TaskResult).await).0,
        Status::Completed
    );
    let (status, why) = result_of(&peer.wait_for(no.task_id(), Intent::TaskResult).await);
    assert_eq!(status, Status::Rejected);
    assert!(why.contains("Dispatch-Context"), "{why}");

    // `other` is refused, then allowed by the command, then denied.
    let first = outsider
        .send(outsider.dispatch_to(&agent.email, "1", "x"))
        .await;
    let (status, why) = result_of(&outsider.wait_for(first.task_id(), Intent::TaskResult).await);
    assert_eq!(status, Status::Rejected);
    assert!(why.starts_with("Unauthorized sender policy"), "{why}");
    policy_cmd(&dir, &["allow", "--agent", "agent", &other.email]);
    let second = outsider
        .send(outsider.dispatch_to(&agent.email, "2", "x"))
        .await;
    assert_eq!(
        result_of(
            &outsider
                .wait_for(second.task_id(), Intent::TaskResult)
                .await
        )
        .0,
        Status::Completed
    );
    policy_cmd(
        &dir,
        &["deny", "--agent", "agent", &format!("@{}", host.domain)],
    );
    let third = outsider
        .send(outsider.dispatch_to(&agent.email, "3", "x"))
        .await;
    let (status, why) = result_of(&outsider.wait_for(third.task_id(), Intent::TaskResult).await);
    assert_eq!(status, Status::Rejected);
    assert!(why.contains("denied"), "{why}");
    let list: serde_json::Value =
        serde_json::from_str(&policy_cmd(&dir, &["list", "--agent", "agent", "--json"])).unwrap();
    let kinds: Vec<(&str, &str)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["kind"].as_str().unwrap(), r["source"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        vec![("allow", "config"), ("allow", "cli"), ("deny", "cli")]
    );
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_are_rate_limited_or_silent_and_a_session_key_is_per_sender() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, other) = (host.user("agent"), host.user("boss"), host.user("other"));
    let (quiet, stranger) = (host.user("quiet"), host.user("stranger"));
    let text = format!(
        "{}{}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\", \"{}\"]\nmax_refusals_per_hour = 1\n\n[[agents]]\nname = \"quiet\"\nmailbox = \"quiet\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\nunknown_senders = \"ignore\"\n",
        host.mailbox_toml("agent", &agent),
        host.mailbox_toml("quiet", &quiet),
        boss.email,
        other.email,
        boss.email
    );
    let dir = ConfigDir::new(host, &text);
    let mut peer = Peer::new(boss.clone()).await;
    let mut second = Peer::new(other.clone()).await;
    let mut outsider = Peer::new(stranger.clone()).await;
    let mut bridge = Bridge::start(&dir, 2);

    // Two refusals, one answer: the bridge is no relay for someone else's mail.
    let a = outsider
        .send(outsider.dispatch_to(&agent.email, "a", "x"))
        .await;
    let b = outsider
        .send(outsider.dispatch_to(&agent.email, "b", "x"))
        .await;
    for t in [&a, &b] {
        bridge.wait_event("task.rejected", |e| e["taskId"] == t.task_id());
    }
    // The quiet agent answers refused senders nothing at all.
    let c = outsider
        .send(outsider.dispatch_to(&quiet.email, "c", "x"))
        .await;
    bridge.wait_event("task.rejected", |e| {
        e["taskId"] == c.task_id() && e["answered"] == false
    });

    // A Session-Key is a conversation of its sender's: the same key from another sender is
    // another conversation, and nobody can squat on a key (issue 18: the second sender's use
    // of it got the first sender's next turn rejected).
    let keyed = |peer: &Peer, title: &str| {
        let mut msg = peer.dispatch_to(&agent.email, title, "a turn");
        if let Body::Dispatch(d) = &mut msg.body {
            d.session_key = Some("shared-key".into());
        }
        msg
    };
    let mine = peer.send(keyed(&peer, "Mine")).await;
    let theirs = second.send(keyed(&second, "Theirs")).await;
    let (status, why) = result_of(&second.wait_for(theirs.task_id(), Intent::TaskResult).await);
    assert_eq!(status, Status::Completed, "{why}");
    let again = peer.send(keyed(&peer, "Mine again")).await;
    for task in [&mine, &again] {
        let (status, why) = result_of(&peer.wait_for(task.task_id(), Intent::TaskResult).await);
        assert_eq!(status, Status::Completed, "{why}");
    }

    assert!(bridge.stop().success());
    outsider.settle(&agent).await;
    let answered = [&a, &b]
        .iter()
        .filter(|t| !outsider.intents_for(t.task_id()).is_empty())
        .count();
    assert_eq!(
        answered, 1,
        "one refusal answered within the hour's allowance"
    );
    assert!(outsider.intents_for(c.task_id()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn cards_early_cancels_silent_cancels_and_automatic_mail() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, slow) = (host.user("agent"), host.user("boss"), host.user("slow"));
    let dir = ConfigDir::new(host, "");
    dir.write("slow.toml", "command = \"sleep\"\nargs = [\"600\"]\n");
    let text = format!(
        "state_dir = \"state\"\n{}{}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\nsummary = \"Echoes tasks\"\ncard = \"# Echo\\nSays back what it is told.\"\n\n[[agents]]\nname = \"slow\"\nmailbox = \"slow\"\nprofile = \"slow.toml\"\nallow_from = [\"{}\"]\ncancel_reply = \"silent\"\n",
        host.mailbox_toml("agent", &agent),
        host.mailbox_toml("slow", &slow),
        boss.email,
        boss.email
    );
    dir.write("config.toml", &text);
    let mut peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 2);

    // card.query → card.response.
    let mut query = peer.dispatch_to(&agent.email, "card", "");
    query.body = Body::CardQuery {
        text: "what can you do?".into(),
    };
    query.envelope.subject = query.subject();
    let query = peer.send(query).await;
    let card = peer.wait_for(query.task_id(), Intent::CardResponse).await;
    match &card.message.body {
        Body::CardResponse { summary, text } => {
            assert_eq!(summary, "Echoes tasks");
            assert!(text.contains("Says back"), "{text}");
        }
        other => panic!("{other:?}"),
    }

    // A cancel that comes before its dispatch: the dispatch is answered, not run.
    let early = peer.dispatch_to(&agent.email, "Early", "never runs");
    let mut cancel = peer.cancel_of(&early, &agent.email);
    cancel.envelope.in_reply_to = None;
    cancel.envelope.references.clear();
    peer.send(cancel).await;
    // The cancel is read before the dispatch is sent.
    bridge.wait_log("cancel before its dispatch").await;
    let early = peer.send(early).await;
    let (status, why) = result_of(&peer.wait_for(early.task_id(), Intent::TaskResult).await);
    assert_eq!(status, Status::Rejected);
    assert!(why.contains("before it started"), "{why}");
    assert!(!bridge
        .seen
        .iter()
        .any(|e| e["event"] == "task.started" && e["taskId"] == early.task_id()));

    // cancel_reply = "silent": the agent stops, and nothing is answered.
    let long = peer
        .send(peer.dispatch_to(&slow.email, "Long", "takes forever"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == long.task_id());
    peer.send(peer.cancel_of(&long, &slow.email)).await;
    bridge.wait_event("task.completed", |e| e["taskId"] == long.task_id());

    // Mail marked Auto-Submitted never starts a task.
    let auto = format!("auto-{}", uuid::Uuid::new_v4());
    let id = format!("<{auto}@example.test>");
    let raw = format!(
        "From: {}\r\nTo: {}\r\nMessage-ID: {id}\r\nAuto-Submitted: auto-generated\r\nSubject: [AAMP Task] auto\r\nX-AAMP-Version: 1.1\r\nX-AAMP-Intent: task.dispatch\r\nX-AAMP-TaskId: {auto}\r\n\r\nTask: loop\r\n",
        peer.account.email, agent.email
    );
    peer.send_raw(&agent.email, &id, raw.into_bytes()).await;
    let ignored = bridge.wait_event("message.ignored", |e| e["taskId"] == auto.as_str());
    assert!(
        ignored["reason"]
            .as_str()
            .unwrap()
            .contains("Auto-Submitted"),
        "{ignored}"
    );

    assert!(bridge.stop().success());
    peer.settle(&agent).await;
    assert_eq!(
        peer.intents_for(long.task_id()),
        vec![Intent::TaskAck],
        "no result after a silent cancel"
    );
    assert!(peer.intents_for(&auto).is_empty());
    let raw_ack = peer.wait_for(early.task_id(), Intent::TaskResult).await;
    let headers = peer.raw_headers(&raw_ack.email_id).await;
    assert_eq!(
        support::header(&headers, "Auto-Submitted").map(str::trim),
        Some("auto-replied")
    );
}

fn pair_code(dir: &ConfigDir, ttl: &str) -> String {
    let out = std::process::Command::new(support::bin())
        .args([
            "--config",
            dir.config().to_str().unwrap(),
            "pair",
            "--agent",
            "agent",
            "--json",
            "--ttl-secs",
            ttl,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["url"]
        .as_str()
        .unwrap()
        .starts_with("aamp://connect?mailbox="));
    v["code"].as_str().unwrap().to_string()
}

fn pair_request(peer: &Peer, to: &str, code: &str) -> aamp_bridge::protocol::AampMessage {
    let mut msg = peer.dispatch_to(to, "pair", "");
    msg.body = Body::PairRequest {
        pair_code: code.into(),
        rules: None,
    };
    msg.envelope.subject = msg.subject();
    msg
}

async fn pair_status(
    peer: &mut Peer,
    msg: &aamp_bridge::protocol::AampMessage,
) -> (Status, String) {
    let answer = peer.wait_for(msg.task_id(), Intent::PairRespond).await;
    match &answer.message.body {
        Body::PairRespond { status, reason } => (*status, reason.clone().unwrap_or_default()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pairing_lets_a_new_sender_in_once_with_a_live_code() {
    let Some(host) = mailhost() else { return };
    let (agent, phone, pest) = (host.user("agent"), host.user("phone"), host.user("pest"));
    let text = format!(
        "{}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\n",
        host.mailbox_toml("agent", &agent)
    );
    let dir = ConfigDir::new(host, &text);
    let mut peer = Peer::new(phone.clone()).await;
    let mut other = Peer::new(pest.clone()).await;
    let bridge = Bridge::start(&dir, 1);

    // Not paired yet: refused.
    let before = peer
        .send(peer.dispatch_to(&agent.email, "Before", "x"))
        .await;
    assert_eq!(
        result_of(&peer.wait_for(before.task_id(), Intent::TaskResult).await).0,
        Status::Rejected
    );

    let expired = pair_code(&dir, "0");
    let code = pair_code(&dir, "300");
    for (attempt, expect) in [
        ("WRONGWRONG12", Status::Rejected),
        (expired.as_str(), Status::Rejected),
        (code.as_str(), Status::Completed),
        (code.as_str(), Status::Rejected),
    ] {
        let sent = peer.send(pair_request(&peer, &agent.email, attempt)).await;
        let (status, reason) = pair_status(&mut peer, &sent).await;
        assert_eq!(status, expect, "{attempt}: {reason}");
        if status == Status::Rejected {
            assert!(reason.contains("invalid or expired"), "{reason}");
        }
    }
    let after = peer
        .send(peer.dispatch_to(&agent.email, "After", "paired now"))
        .await;
    assert_eq!(
        result_of(&peer.wait_for(after.task_id(), Intent::TaskResult).await).0,
        Status::Completed
    );

    // Five wrong codes lock a sender out: a right one is then refused too.
    for i in 0..5 {
        let sent = other
            .send(pair_request(&other, &agent.email, &format!("guess{i:07}")))
            .await;
        assert_eq!(pair_status(&mut other, &sent).await.0, Status::Rejected);
    }
    let fresh = pair_code(&dir, "300");
    let sent = other.send(pair_request(&other, &agent.email, &fresh)).await;
    let (status, reason) = pair_status(&mut other, &sent).await;
    assert_eq!(status, Status::Rejected);
    assert!(reason.contains("too many"), "{reason}");
    let list = policy_cmd(&dir, &["list", "--agent", "agent"]);
    assert!(
        list.contains(&phone.email) && list.contains("pairing"),
        "{list}"
    );
    assert!(!list.contains(&pest.email), "{list}");
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_tasks_start_by_priority_then_by_arrival() {
    use aamp_bridge::protocol::Priority;
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let release = dir.dir.path().join("release");
    dir.write(
        "waits.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}, \"--wait-for\", {:?}]\n",
            format!("{}/tests/agents/fault_agent.py", env!("CARGO_MANIFEST_DIR")),
            release.to_str().unwrap()
        ),
    );
    let text = format!(
        "state_dir = \"state\"\nmax_concurrent_tasks = 1\n{}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"waits.toml\"\nallow_from = [\"{}\"]\nmax_concurrent_tasks = 2\n",
        host.mailbox_toml("agent", &agent),
        boss.email
    );
    dir.write("config.toml", &text);
    let peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);
    // The bridge-wide limit of 1 holds everything behind the first task.
    let first = peer
        .send(peer.dispatch_to(&agent.email, "First", "holds the slot"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == first.task_id());
    let mut sent = Vec::new();
    for (title, priority) in [
        ("normal", Priority::Normal),
        ("high", Priority::High),
        ("urgent", Priority::Urgent),
        ("high-2", Priority::High),
    ] {
        let mut msg = peer.dispatch_to(&agent.email, title, "waits");
        if let Body::Dispatch(d) = &mut msg.body {
            d.priority = priority;
        }
        let msg = peer.send(msg).await;
        bridge.wait_event("task.received", |e| e["taskId"] == msg.task_id());
        sent.push((title, msg.task_id().to_string()));
    }
    std::fs::write(&release, "").unwrap();
    for (_, id) in &sent {
        bridge.wait_event("task.completed", |e| e["taskId"] == id.as_str());
    }
    let started: Vec<&str> = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "task.started")
        .filter_map(|e| {
            sent.iter()
                .find(|(_, id)| e["taskId"] == id.as_str())
                .map(|(t, _)| *t)
        })
        .collect();
    assert_eq!(started, vec!["urgent", "high", "high-2", "normal"]);
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn two_bridges_whose_agents_hand_each_other_work_are_stopped_by_the_hop_limit() {
    let Some(host) = mailhost() else { return };
    let (a, b, boss) = (
        host.user("relay-a"),
        host.user("relay-b"),
        host.user("boss"),
    );
    let relay = format!("{}/tests/agents/relay_agent.py", env!("CARGO_MANIFEST_DIR"));
    let dir_a = ConfigDir::new(host, "");
    let dir_b = ConfigDir::new(host, "");
    let runs_a = dir_a.dir.path().join("runs");
    let runs_b = dir_b.dir.path().join("runs");
    for (dir, me, other, runs, allow) in [
        (
            &dir_a,
            &a,
            &b,
            &runs_a,
            format!("[\"{}\", \"{}\"]", boss.email, b.email),
        ),
        (&dir_b, &b, &a, &runs_b, format!("[\"{}\"]", a.email)),
    ] {
        dir.write(
            "relay.toml",
            &format!(
                "command = \"python3\"\nargs = [{relay:?}, {:?}, {:?}, \"me\", {:?}, {:?}]\n",
                support::bin(),
                dir.config().to_str().unwrap(),
                other.email,
                runs.to_str().unwrap()
            ),
        );
        dir.write(
            "config.toml",
            &format!(
                "state_dir = \"state\"\n{}\n[[agents]]\nname = \"relay\"\nmailbox = \"me\"\nprofile = \"relay.toml\"\nallow_from = {allow}\nmax_hops = 3\n",
                host.mailbox_toml("me", me)
            ),
        );
    }
    let peer = Peer::new(boss.clone()).await;
    let mut bridge_a = Bridge::start(&dir_a, 1);
    let mut bridge_b = Bridge::start(&dir_b, 1);
    peer.send(peer.dispatch_to(&a.email, "Start", "hand it on"))
        .await;

    // boss → A (hop 0) → B (1) → A (2) → B: the third hand-on is refused, with a dead letter.
    let refused = bridge_b.wait_event("task.rejected", |e| {
        e["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("loop guard")
    });
    assert_eq!(refused["from"], a.email.as_str());
    bridge_a.wait_event("message.ignored", |e| {
        e["intent"] == "task.result" && e["from"] == b.email.as_str()
    });
    assert!(bridge_a.stop().success());
    assert!(bridge_b.stop().success());
    assert_eq!(lines(&runs_a), vec!["0", "2"]);
    assert_eq!(lines(&runs_b), vec!["1"]);
}

fn lines(path: &std::path::Path) -> Vec<String> {
    support::lines(path)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_question_is_answered_by_a_plain_reply_and_an_unanswered_one_rejects_the_task() {
    let Some(host) = mailhost() else { return };
    let (agent, slowpoke, boss) = (host.user("agent"), host.user("slowpoke"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    dir.write_asking_agent(600);
    dir.write(
        "impatient.toml",
        &std::fs::read_to_string(dir.dir.path().join("asking.toml"))
            .unwrap()
            .replace("ask_timeout_secs = 600", "ask_timeout_secs = 2"),
    );
    let text = format!(
        "state_dir = \"state\"\n{}{}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"asking.toml\"\nallow_from = [\"{}\"]\n\n[[agents]]\nname = \"slowpoke\"\nmailbox = \"slowpoke\"\nprofile = \"impatient.toml\"\nallow_from = [\"{}\"]\n",
        host.mailbox_toml("agent", &agent),
        host.mailbox_toml("slowpoke", &slowpoke),
        boss.email,
        boss.email
    );
    dir.write("config.toml", &text);
    let mut peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 2);

    let task = peer
        .send(peer.dispatch_to(&agent.email, "Fix the README", "Please fix the typo."))
        .await;
    let help = peer.wait_for(task.task_id(), Intent::TaskHelpNeeded).await;
    // A person answers from a mail client: no AAMP headers, just a reply to the question.
    let id = format!("<reply-{}@example.test>", uuid::Uuid::new_v4());
    let reply = format!(
        "From: {}\r\nTo: {}\r\nMessage-ID: {id}\r\nIn-Reply-To: {}\r\nReferences: {}\r\nSubject: Re: {}\r\n\r\nAllow\r\n\r\n> Which option do you choose?\r\n",
        peer.account.email,
        agent.email,
        help.message.envelope.message_id,
        help.message.envelope.message_id,
        help.message.envelope.subject
    );
    peer.send_raw(&agent.email, &id, reply.into_bytes()).await;
    let (status, why) = result_of(&peer.wait_for(task.task_id(), Intent::TaskResult).await);
    assert_eq!(status, Status::Completed, "{why}");
    let answered = bridge.wait_event("task.answered", |e| e["choice"] == "Allow");
    assert_eq!(answered["answerTaskId"], task.task_id());

    // Nobody answers the impatient agent's question: the task is rejected, saying so.
    let late = peer
        .send(peer.dispatch_to(&slowpoke.email, "Fix it", "Please."))
        .await;
    peer.wait_for(late.task_id(), Intent::TaskHelpNeeded).await;
    let (status, why) = result_of(&peer.wait_for(late.task_id(), Intent::TaskResult).await);
    assert_eq!(status, Status::Rejected);
    assert!(why.contains("no answer within 2s"), "{why}");
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cli_agent_asks_with_a_help_line_and_gets_an_option_or_free_text() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, &config(host, &agent, &boss.email, ""));
    dir.write(
        "echo.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}]\nhelp_lines = true\n",
            format!("{}/tests/agents/asking_cli.py", env!("CARGO_MANIFEST_DIR"))
        ),
    );
    let text = std::fs::read_to_string(dir.config())
        .unwrap()
        .replace("profile = \"echo\"", "profile = \"echo.toml\"");
    dir.write("config.toml", &text);
    let mut peer = Peer::new(boss.clone()).await;
    let bridge = Bridge::start(&dir, 1);

    for (answer, expected) in [
        ("blue", "chose blue"),
        ("green, please\n\n> Which colour?", "chose green, please"),
    ] {
        let task = peer
            .send(peer.dispatch_to(&agent.email, "Paint", "paint the shed"))
            .await;
        let help = peer.wait_for(task.task_id(), Intent::TaskHelpNeeded).await;
        let Body::HelpNeeded(h) = &help.message.body else {
            panic!("not help_needed")
        };
        assert_eq!(h.question, "Which colour?");
        assert_eq!(h.suggested_options, vec!["red", "blue"]);
        let id = format!("<reply-{}@example.test>", uuid::Uuid::new_v4());
        let reply = format!(
            "From: {}\r\nTo: {}\r\nMessage-ID: {id}\r\nIn-Reply-To: {}\r\nSubject: Re: paint\r\n\r\n{}\r\n",
            peer.account.email,
            agent.email,
            help.message.envelope.message_id,
            answer.replace('\n', "\r\n")
        );
        peer.send_raw(&agent.email, &id, reply.into_bytes()).await;
        let result = peer.wait_for(task.task_id(), Intent::TaskResult).await;
        let Body::Result(r) = &result.message.body else {
            panic!("not a result")
        };
        assert_eq!(r.status, Status::Completed, "{:?}", r.error);
        assert_eq!(r.output, expected);
    }
    assert!(bridge.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_from_anyone_but_the_dispatcher_stops_nothing() {
    let Some(host) = mailhost() else { return };
    let (agent, boss, other) = (host.user("agent"), host.user("boss"), host.user("other"));
    let dir = ConfigDir::new(host, "");
    dir.write("slow.toml", "command = \"sleep\"\nargs = [\"600\"]\n");
    dir.write(
        "config.toml",
        &format!(
            "state_dir = \"state\"\n{}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"slow.toml\"\nallow_from = [\"{}\", \"{}\"]\n",
            host.mailbox_toml("agent", &agent),
            boss.email,
            other.email
        ),
    );
    let mut peer = Peer::new(boss.clone()).await;
    let meddler = Peer::new(other.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);
    let task = peer
        .send(peer.dispatch_to(&agent.email, "Long", "keep going"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == task.task_id());
    let cancel = |from: &Peer| from.cancel_of(&task, &agent.email);
    meddler.send(cancel(&meddler)).await;
    bridge.wait_log("cancel before its dispatch").await;
    assert!(
        !bridge.log().contains("cancel received; stopping the task"),
        "another sender's cancel stops nothing"
    );
    // Only its dispatcher's cancel stops it.
    peer.send(cancel(&peer)).await;
    let completed = bridge.wait_event("task.completed", |e| e["taskId"] == task.task_id());
    assert_eq!(completed["status"], "rejected");
    assert!(bridge.log().contains("cancel received; stopping the task"));
    let (status, why) = result_of(&peer.wait_for(task.task_id(), Intent::TaskResult).await);
    assert_eq!(status, Status::Rejected);
    assert!(why.contains("cancelled"), "{why}");
    assert!(bridge.stop().success());
}

/// Issue 18 over the real mail host: five wrong codes from each of four users, then a fifth
/// user's valid code pairs and is answered (before, pairing was locked for everyone and the
/// answer went unsent).
#[tokio::test(flavor = "multi_thread")]
async fn guessers_over_the_mail_host_cannot_lock_pairing_for_someone_with_the_right_code() {
    let Some(host) = mailhost() else { return };
    let agent = host.user("agent");
    let text = format!(
        "{}\n[[agents]]\nname = \"agent\"\nmailbox = \"agent\"\nprofile = \"echo\"\n",
        host.mailbox_toml("agent", &agent)
    );
    let dir = ConfigDir::new(host, &text);
    let mut bridge = Bridge::start(&dir, 1);
    let code = pair_code(&dir, "300");
    let mut guesses = Vec::new();
    for n in 0..4 {
        let guesser = Peer::new(host.user(&format!("guesser{n}"))).await;
        for attempt in 0..5 {
            let sent = guesser
                .send(pair_request(
                    &guesser,
                    &agent.email,
                    &format!("WRONG{attempt}WRONG"),
                ))
                .await;
            guesses.push(sent.task_id().to_string());
        }
    }
    // Every guess refused (journaled) before the newcomer tries.
    bridge.wait_count("pair.refused", guesses.len());
    let mut newcomer = Peer::new(host.user("newcomer")).await;
    let sent = newcomer
        .send(pair_request(&newcomer, &agent.email, &code))
        .await;
    let (status, reason) = pair_status(&mut newcomer, &sent).await;
    assert_eq!(status, Status::Completed, "{reason}");
    assert!(bridge.stop().success());
}

/// Issue 18 over the real mail host: a burst of equal priority behind one slot starts in the
/// order the bridge received it (before, the runtime's polling order reordered it).
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_equal_priority_over_the_mail_host_starts_in_arrival_order() {
    let Some(host) = mailhost() else { return };
    let (agent, boss) = (host.user("agent"), host.user("boss"));
    let dir = ConfigDir::new(host, "");
    let release = dir.dir.path().join("release");
    dir.write(
        "waits.toml",
        &format!(
            "command = \"python3\"\nargs = [{:?}, \"--wait-for\", {:?}]\n",
            format!("{}/tests/agents/fault_agent.py", env!("CARGO_MANIFEST_DIR")),
            release.to_str().unwrap()
        ),
    );
    dir.write_config(
        &support::Toml::new()
            .host_mailbox(host, "agent", &agent, "")
            .agent(
                "agent",
                "waits.toml",
                &[&boss.email],
                "max_concurrent_tasks = 1",
            )
            .text(),
    );
    let peer = Peer::new(boss.clone()).await;
    let mut bridge = Bridge::start(&dir, 1);
    let first = peer
        .send(peer.dispatch_to(&agent.email, "First", "holds the slot"))
        .await;
    bridge.wait_event("task.started", |e| e["taskId"] == first.task_id());
    // Sent back to back: the bridge reads them in one or a few pages.
    let mut burst = Vec::new();
    for n in 0..8 {
        let msg = peer
            .send(peer.dispatch_to(&agent.email, &format!("Burst {n}"), "waits"))
            .await;
        burst.push(msg.task_id().to_string());
    }
    for id in &burst {
        bridge.wait_event("task.received", |e| e["taskId"] == id.as_str());
    }
    std::fs::write(&release, "").unwrap();
    for id in &burst {
        bridge.wait_event("task.completed", |e| e["taskId"] == id.as_str());
    }
    let order_of = |event: &str| -> Vec<String> {
        bridge
            .seen
            .iter()
            .filter(|e| e["event"] == event)
            .filter_map(|e| e["taskId"].as_str())
            .filter(|id| burst.iter().any(|b| b == id))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(order_of("task.started"), order_of("task.received"));
    assert!(bridge.stop().success());
}
