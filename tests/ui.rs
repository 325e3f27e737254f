//! The live view (`[ui]`, issue 35) in a real browser: Debian's chromium, headless, driven over
//! chromedriver's W3C WebDriver HTTP API by a small client here, against a running bridge on
//! the real mail host. The page lists the agents; a dispatched task appears and its stream
//! fills in order to its answer; a question is answered from the page (once); a task is
//! cancelled from the page; requests without the token, with a foreign Host, or cross-site
//! POSTs are refused; no mailbox password reaches the page.

mod support;

use std::time::Instant;

use aamp_bridge::protocol::{Body, Intent, Status};
use serde_json::{json, Value};
use support::{chromedriver, mailhost, repo, Bridge, Browser, ConfigDir, Peer};

/// An ACP profile running the scripted test agent with `steps`.
fn acp_profile(dir: &ConfigDir, name: &str, steps: Value, extra: &str) {
    dir.write(
        &format!("{name}-script.json"),
        &json!({ "steps": steps }).to_string(),
    );
    dir.write(
        &format!("{name}.toml"),
        &format!(
            "kind = \"acp\"\ncommand = \"python3\"\nargs = [{:?}]\nenv = {{ ACP_TEST_SCRIPT = {:?} }}\n{extra}",
            repo().join("tests/agents/acp_agent.py").display(),
            dir.dir.path().join(format!("{name}-script.json")).display()
        ),
    );
}

fn result_of(msg: &aamp_bridge::mailbox::Inbound) -> (Status, String, String) {
    match &msg.message.body {
        Body::Result(r) => (
            r.status,
            r.output.clone(),
            r.error.clone().unwrap_or_default(),
        ),
        other => panic!("not a result: {other:?}"),
    }
}

/// The CSRF token and snapshot the feed starts with, read as the page reads them.
async fn first_snapshot(http: &reqwest::Client, base: &str, bearer: &str) -> Value {
    let mut response = http
        .get(format!("{base}/events"))
        .header("Authorization", bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = response.chunk().await.unwrap().expect("the feed sends");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
    assert!(text.starts_with("event: snapshot\n"), "{text}");
    serde_json::from_str(data).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_live_view_streams_tasks_answers_questions_cancels_and_refuses_strangers() {
    let Some(host) = mailhost() else { return };
    let Some(driver) = chromedriver() else { return };
    let (streamer, asker, sleeper, boss) = (
        host.user("streamer"),
        host.user("asker"),
        host.user("sleeper"),
        host.user("boss"),
    );
    let dir = ConfigDir::empty();
    dir.write_private("password", &host.password);
    acp_profile(
        &dir,
        "streaming",
        json!([
            {"plan": [["Read the task", "in_progress"], ["Answer", "pending"]]},
            {"say": "Reading "}, {"sleep": 0.3}, {"say": "the task. "},
            {"tool": {"id": "t1", "title": "grep README", "kind": "search", "input": {"q": "x"}}},
            {"sleep": 0.4},
            {"tool_done": {"id": "t1", "output": "README.md:1: x"}},
            {"plan": [["Read the task", "completed"], ["Answer", "in_progress"]]},
            {"say": "Answer: "}, {"sleep": 0.2}, {"say": "42."},
            {"sleep": 2.5}
        ]),
        "",
    );
    acp_profile(
        &dir,
        "asking",
        json!([
            {"say": "Need to edit. "},
            {"permission": {"id": "edit", "title": "Edit README.md", "kind": "edit"}},
            {"say": "Edited."}
        ]),
        "permissions = \"ask\"\nask_timeout_secs = 120\n",
    );
    acp_profile(
        &dir,
        "sleeping",
        json!([{"say": "Working on it. "}, {"sleep": 90}, {"say": "never said"}]),
        "",
    );
    let mut config = format!(
        "[ui]\nlisten = \"127.0.0.1:0\"\n\n{}{}{}",
        host.mailbox_toml("streamer", &streamer),
        host.mailbox_toml("asker", &asker),
        host.mailbox_toml("sleeper", &sleeper),
    );
    for (name, profile) in [
        ("streamer", "streaming"),
        ("asker", "asking"),
        ("sleeper", "sleeping"),
    ] {
        config.push_str(&format!(
            "\n[[agents]]\nname = \"{name}\"\nmailbox = \"{name}\"\nprofile = \"{profile}.toml\"\nallow_from = [\"{}\"]\n",
            boss.email
        ));
    }
    dir.write_config(&config);
    let mut bridge = Bridge::start(&dir, 3);
    let link = dir.run(&["ui"]).trim().to_string();
    assert!(link.starts_with("http://127.0.0.1:"), "{link}");
    let token = link.split("#token=").nth(1).unwrap().to_string();
    let base = link.split("/#token=").next().unwrap().to_string();
    let state = dir.dir.path().join("state");
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(state.join("ui-token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the token file is the owner's only");
    }

    // Refusals, as a script or another site would meet them.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let port = base.rsplit(':').next().unwrap();
    let bearer = format!("Bearer {token}");
    let get = |path: &str, bearer: Option<&str>, host: Option<&str>| {
        let mut req = http.get(format!("{base}{path}"));
        if let Some(b) = bearer {
            req = req.header("Authorization", b.to_string());
        }
        if let Some(h) = host {
            req = req.header("Host", h.to_string());
        }
        req.send()
    };
    // The page itself holds no data (and no token): anyone who passes the Host check gets it.
    let page = get("/", None, None).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(!page.text().await.unwrap().contains(&token));
    assert_eq!(
        get("/events", None, None).await.unwrap().status(),
        401,
        "no token"
    );
    assert_eq!(
        get("/events", Some(&format!("Bearer {}", "0".repeat(64))), None)
            .await
            .unwrap()
            .status(),
        401,
        "a wrong token"
    );
    assert_eq!(
        get("/", None, Some(&format!("rebound.example:{port}")))
            .await
            .unwrap()
            .status(),
        421,
        "a foreign Host (DNS rebinding) is refused"
    );
    assert_eq!(
        get("/events", Some(&bearer), Some("rebound.example"))
            .await
            .unwrap()
            .status(),
        421,
        "a foreign Host is refused even with the token"
    );
    let snapshot = first_snapshot(&http, &base, &bearer).await;
    let csrf = snapshot["csrf"].as_str().unwrap().to_string();
    let names: Vec<&str> = snapshot["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["agent"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["streamer", "asker", "sleeper"]);
    let feed_text = snapshot.to_string();
    assert!(
        !feed_text.contains(&host.password),
        "no mailbox password in the feed"
    );
    let post = |origin: Option<&str>, csrf: Option<&str>| {
        let mut req = http
            .post(format!("{base}/api/cancel"))
            .header("Authorization", bearer.clone())
            .header("Content-Type", "application/json")
            .body(json!({"agent": "sleeper", "from": boss.email, "taskId": "nothing"}).to_string());
        if let Some(o) = origin {
            req = req.header("Origin", o.to_string());
        }
        if let Some(c) = csrf {
            req = req.header("X-AAMP-CSRF", c.to_string());
        }
        req.send()
    };
    let own = base.clone();
    assert_eq!(
        post(Some(&own), None).await.unwrap().status(),
        403,
        "no CSRF token"
    );
    assert_eq!(
        post(Some(&own), Some(&"0".repeat(64)))
            .await
            .unwrap()
            .status(),
        403,
        "a wrong CSRF token"
    );
    assert_eq!(
        post(Some("http://evil.example"), Some(&csrf))
            .await
            .unwrap()
            .status(),
        403,
        "a foreign Origin"
    );
    assert_eq!(
        post(None, Some(&csrf)).await.unwrap().status(),
        403,
        "no Origin"
    );
    assert_eq!(
        post(Some(&own), Some(&csrf)).await.unwrap().status(),
        409,
        "a same-origin POST with the token gets through (and finds no such task)"
    );

    // The page, in Chromium: the link, then the page without the token in its address.
    let browser = Browser::start(driver).await;
    browser.goto(&link).await;
    assert_eq!(browser.url().await, format!("{base}/"));
    let agents = browser
        .wait_text("#agents", |t| t.contains("sleeper"))
        .await;
    for name in ["streamer", "asker", "sleeper"] {
        assert!(agents.contains(name), "{agents}");
    }
    assert!(agents.contains(&streamer.email), "{agents}");
    assert!(!browser
        .find_all(".agent[data-agent=streamer] .slots")
        .await
        .is_empty());

    // A cross-site page cannot act: from another origin (localhost is another site than
    // 127.0.0.1), a POST with the right CSRF token carries no token and no matching Origin.
    let mut peer = Peer::new(boss.clone()).await;

    // A streaming task: it appears, its stream fills in order, it ends with its answer.
    let sent_at = Instant::now();
    let task = peer
        .send(peer.dispatch_to(&streamer.email, "Stream for the page", "Go."))
        .await;
    let id = task.task_id().to_string();
    let card = format!(".task[data-task=\"{id}\"]");
    browser
        .wait_text(&format!("{card} .text"), |t| !t.is_empty())
        .await;
    let first_delta = sent_at.elapsed();
    browser
        .wait_text(&format!("{card} .stream"), |t| t.contains("42."))
        .await;
    // In cargo's scratch folder for integration tests, wherever the target dir is.
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("live-view.png");
    browser.screenshot(&shot).await;
    let order: Value = browser
        .execute(
            "return [...document.querySelectorAll(arguments[0] + ' .stream > *')].map(e => e.className.split(' ')[0] + ':' + e.textContent);",
            json!([card]),
        )
        .await;
    let order: Vec<String> = order
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(order.len(), 4, "{order:?}");
    assert!(
        order[0].starts_with("todo:Read the taskAnswer"),
        "{order:?}"
    );
    assert_eq!(order[1], "text:Reading the task. ", "{order:?}");
    assert!(order[2].starts_with("tool:grep README"), "{order:?}");
    assert!(order[2].contains("README.md:1: x"), "{order:?}");
    assert_eq!(order[3], "text:Answer: 42.", "{order:?}");
    let done = browser
        .find_all(&format!("{card} .todo li.completed"))
        .await;
    assert_eq!(done.len(), 1, "the plan's first step is checked off");
    let result = peer.wait_for(&id, Intent::TaskResult).await;
    let (status, output, _) = result_of(&result);
    assert_eq!(status, Status::Completed);
    let state_text = browser
        .wait_text(&format!("{card} .state"), |t| t == "completed")
        .await;
    assert_eq!(state_text, "completed");
    let shown = browser
        .wait_text(&format!("{card} .stream"), |_| true)
        .await;
    assert!(
        shown.contains(output.trim()),
        "the page ends with the answer: {shown:?} / {output:?}"
    );
    eprintln!(
        "live view: dispatch to first delta on the page {} ms (mail in, ack, agent start included)",
        first_delta.as_millis()
    );
    // Its timeline, as `task show` has it, with millisecond times.
    let row = browser
        .find_all(&format!("#recent li[data-task=\"{id}\"] .row"))
        .await;
    browser.click(&row[0]).await;
    let timeline = browser
        .wait_text(&format!("#recent li[data-task=\"{id}\"] .timeline"), |t| {
            t.contains("finished: answered")
        })
        .await;
    assert!(timeline.contains(" ms  run 1 started"), "{timeline}");

    // At 400 px wide (a phone over an SSH tunnel) nothing needs scrolling sideways.
    browser
        .call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": 400, "height": 900})),
        )
        .await;
    let fits: Value = browser
        .execute(
            "return [document.documentElement.scrollWidth, window.innerWidth];",
            json!([]),
        )
        .await;
    assert!(
        fits[0].as_u64() <= fits[1].as_u64(),
        "wider than the window: {fits}"
    );
    assert!(
        fits[1].as_u64() <= Some(400),
        "the window is 400 px: {fits}"
    );
    browser
        .call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": 1100, "height": 1000})),
        )
        .await;

    // A question, answered from the page: the agent goes on, and it is answered once.
    let task = peer
        .send(peer.dispatch_to(&asker.email, "Fix the README", "Please fix it."))
        .await;
    let asked = task.task_id().to_string();
    let question = format!(".question[data-task=\"{asked}\"]");
    browser
        .wait_text(&question, |t| t.contains("Edit README.md"))
        .await;
    let mut allow = None;
    for button in browser.find_all(&format!("{question} button.option")).await {
        if browser.text(&button).await.starts_with("Allow") {
            allow = Some(button);
            break;
        }
    }
    browser.click(&allow.expect("an Allow button")).await;
    let answered = bridge.wait_event("task.answered", |e| e["taskId"] == asked.as_str());
    assert!(
        answered["choice"].as_str().unwrap().starts_with("Allow"),
        "{answered}"
    );
    let result = peer.wait_for(&asked, Intent::TaskResult).await;
    let (status, output, why) = result_of(&result);
    assert_eq!(status, Status::Completed, "{why}");
    assert!(output.contains("Edited."), "the agent went on: {output}");
    // The dispatcher is told who answered the question it was asked (issue 35).
    assert!(
        output.contains("was answered on this machine by its operator: \"Allow"),
        "the answer says who answered: {output}"
    );
    // Answered once: a second answer finds no question.
    let again: Value = browser
        .execute(
            "return fetch('/api/answer', {method: 'POST', headers: {'Content-Type': 'application/json', 'X-AAMP-CSRF': state.csrf, 'Authorization': 'Bearer ' + sessionStorage.getItem('aamp-bridge-token')}, body: JSON.stringify({agent: 'asker', from: arguments[0], taskId: arguments[1], answer: 'Allow'})}).then(r => r.status);",
            json!([boss.email, asked]),
        )
        .await;
    assert_eq!(again, 409, "a second answer finds no question waiting");
    bridge.take_events();
    let answers = bridge
        .seen
        .iter()
        .filter(|e| e["event"] == "task.answered" && e["taskId"] == asked.as_str())
        .count();
    assert_eq!(answers, 1);
    peer.settle(&streamer).await;
    let helps = peer
        .intents_for(&asked)
        .iter()
        .filter(|i| **i == Intent::TaskHelpNeeded)
        .count();
    assert_eq!(
        helps,
        1,
        "the dispatcher was asked once: {:?}",
        peer.intents_for(&asked)
    );
    let shown = dir.run(&["task", "show", &asked]);
    assert!(shown.contains("answered by the operator"), "{shown}");
    assert!(
        browser.find_all(&question).await.is_empty(),
        "the question left the page"
    );

    // A task cancelled from the page: answered "cancelled by the operator".
    let task = peer
        .send(peer.dispatch_to(&sleeper.email, "Take forever", "Sleep."))
        .await;
    let slow = task.task_id().to_string();
    let card = format!(".task[data-task=\"{slow}\"]");
    browser
        .wait_text(&format!("{card} .text"), |t| t.contains("Working on it"))
        .await;
    let cancel = browser.find_all(&format!("{card} button.cancel")).await;
    browser.click(&cancel[0]).await;
    let result = peer.wait_for(&slow, Intent::TaskResult).await;
    let (status, _, why) = result_of(&result);
    assert_eq!(status, Status::Rejected);
    assert_eq!(why, "cancelled by the operator");
    browser
        .wait_text(&format!("{card} .state"), |t| t == "rejected")
        .await;
    browser
        .wait_text(&format!("{card} .error"), |t| {
            t == "cancelled by the operator"
        })
        .await;

    // A page of another site cannot act, even knowing the CSRF token: its request carries no
    // access token (the page there has none; the token is never a cookie) and its own Origin.
    let refused = |log: &str| log.matches("live view request refused").count();
    let before = refused(&bridge.log());
    browser.goto(&format!("http://localhost:{port}/")).await;
    let foreign: Value = browser
        .execute(
            "return fetch(arguments[0] + '/api/cancel', {method: 'POST', mode: 'no-cors', credentials: 'include', headers: {'X-AAMP-CSRF': arguments[1]}, body: '{}'}).then(r => r.type, e => 'blocked: ' + e);",
            json!([base, csrf]),
        )
        .await;
    assert!(
        foreign == "opaque" || foreign.as_str().unwrap_or_default().starts_with("blocked"),
        "{foreign}"
    );
    support::poll_until("the server refuses the cross-site POST", || {
        refused(&bridge.log()) > before
    })
    .await;
    assert!(
        browser.find_all(".task").await.is_empty(),
        "the foreign page shows nothing"
    );

    // Nothing of the mailboxes' secrets reached the page.
    browser.goto(&link).await;
    let page: Value = browser
        .execute("return document.documentElement.outerHTML;", json!([]))
        .await;
    assert!(!page.as_str().unwrap().contains(&host.password));
    drop(browser);
    bridge.stop();
}
