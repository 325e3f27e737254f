//! The live view's safety and what it shows (issue 43), in headless Chromium against a running
//! bridge whose agents read an AMP broker (tests/hosts/amp_broker.py), so no mail host:
//! - the access token never reaches another port of 127.0.0.1 (it was a cookie, and browsers
//!   send a host's cookies to all of its ports);
//! - `ui --open` puts no token in a command line, and idle connections do not lock the page out;
//! - a right-to-left override in a title stays inside the title, and in a question it is shown
//!   as `<U+202E>`;
//! - a CLI profile without a stream format shows its lines as they come; "Recent tasks" is
//!   newest first across agents, by title;
//! - what the model calls cost shows per agent and per sender, today and this hour, with a
//!   24-hour chart (issue 45).

mod support;

use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{chromedriver, repo, AmpBroker as Broker, Bridge, Browser, ConfigDir, Toml};

/// A bridge serving the live view on a free loopback port, with two agents on the broker:
/// `plain`, a CLI profile without a stream format that prints a line, waits for the file
/// `go-on`, and prints another; and `asker`, the ACP test agent asking permission to edit a
/// file whose name holds a right-to-left override.
struct Setup {
    broker: Broker,
    boss: (String, String),
    plain: (String, String),
    asker: (String, String),
    dir: ConfigDir,
    bridge: Bridge,
}

impl Setup {
    async fn start() -> Setup {
        let broker = Broker::start(&[]);
        let boss = broker.register("boss").await;
        let plain = broker.register("plain").await;
        let asker = broker.register("asker").await;
        let dir = ConfigDir::empty();
        dir.write_private("amp.key", &broker.key);
        let go_on = dir.dir.path().join("go-on");
        let script = format!(
            "printf 'working on it\\n'; while [ ! -e '{}' ]; do sleep 0.05; done; printf 'all done\\n'",
            go_on.display()
        );
        dir.write(
            "plain.toml",
            &format!("command = \"sh\"\nargs = [\"-c\", {script:?}]\ntimeout_secs = 60\n"),
        );
        let steps = json!({"steps": [
            {"permission": {"id": "edit", "title": "Edit \u{202e}txt.exe", "kind": "edit"}},
            {"say": "Edited."}
        ]});
        dir.write("asking-script.json", &steps.to_string());
        dir.write(
            "asking.toml",
            &format!(
                "kind = \"acp\"\ncommand = \"python3\"\nargs = [{:?}]\nenv = {{ ACP_TEST_SCRIPT = {:?} }}\npermissions = \"ask\"\nask_timeout_secs = 120\n",
                repo().join("tests/agents/acp_agent.py").display(),
                dir.dir.path().join("asking-script.json").display()
            ),
        );
        dir.write_config(
            &Toml::new()
                .top("[ui]\nlisten = \"127.0.0.1:0\"\n")
                .mailbox_text(&broker.mailbox("plain", &plain, ""))
                .mailbox_text(&broker.mailbox("asker", &asker, ""))
                .agent("plain", "plain.toml", &[&boss.1], "")
                .agent("asker", "asking.toml", &[&boss.1], "")
                .text(),
        );
        let bridge = Bridge::start(&dir, 2);
        Setup {
            broker,
            boss,
            plain,
            asker,
            dir,
            bridge,
        }
    }

    /// The link `aamp-bridge ui` prints, its token, and the page's base address.
    fn link(&self) -> (String, String, String) {
        let link = self.dir.run(&["ui"]).trim().to_string();
        assert!(link.starts_with("http://127.0.0.1:"), "{link}");
        let (base, token) = link
            .split_once("/#token=")
            .or_else(|| link.split_once("/?token="))
            .unwrap_or_else(|| panic!("no token in {link}"));
        (link.clone(), token.to_string(), base.to_string())
    }
}

/// The page says it is live (its feed is open).
async fn live(browser: &Browser) {
    browser.wait_text("#link", |t| t == "live").await;
}

/// A web server of its own on another loopback port: it records every request's head and
/// answers a small page.
fn recording_server() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            record
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).into_owned());
            let page = "<!doctype html><title>elsewhere</title><p>another local server</p>";
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    (port, seen)
}

/// Issue 43, item 7: the token was a cookie of 127.0.0.1, which the browser sent to every
/// port of 127.0.0.1, so any local web server the operator visited received it. Opened as
/// the operator opens it, the page works; then the browser visits another local server, by
/// address and by name, page and script: no request it receives carries the token.
#[tokio::test(flavor = "multi_thread")]
async fn the_live_views_token_reaches_no_other_port_of_the_host() {
    let Some(driver) = chromedriver() else { return };
    let mut s = Setup::start().await;
    let (link, token, base) = s.link();
    let (other, seen) = recording_server();
    let browser = Browser::start(driver).await;
    browser.goto(&link).await;
    live(&browser).await;
    assert_eq!(
        browser.url().await,
        format!("{base}/"),
        "the token left the address"
    );
    for url in [
        format!("http://127.0.0.1:{other}/"),
        format!("http://localhost:{other}/page"),
    ] {
        browser.goto(&url).await;
        // The page there asks its own server, with whatever credentials the browser has.
        let asked: Value = browser
            .execute(
                "return fetch('/asked', {credentials: 'include'}).then(r => r.status, e => String(e));",
                json!([]),
            )
            .await;
        assert_eq!(asked, 200, "{asked}");
    }
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 4, "the other server was visited: {seen:?}");
    for head in &seen {
        assert!(
            !head.contains(&token),
            "another port of the host received the live view's token:\n{head}"
        );
    }
    // Back on the live view (a reload of its tab), it still works: the token stayed with it.
    browser.goto(&format!("{base}/")).await;
    live(&browser).await;
    drop(browser);
    s.bridge.take_events();
    s.bridge.stop();
}

/// Issue 43, item 8: `ui --open` gave the opener `…?token=…`, readable by any local user in
/// /proc while the browser runs. The opener gets a file URL with no secret in it: an
/// owner-only page that sends the browser on to the live view, which opens live.
#[tokio::test(flavor = "multi_thread")]
async fn ui_open_puts_no_token_in_any_command_line() {
    let Some(driver) = chromedriver() else { return };
    let s = Setup::start().await;
    let (_, token, base) = s.link();
    let fake = tempfile::tempdir().unwrap();
    let argv = fake.path().join("argv");
    for opener in ["xdg-open", "open"] {
        let path = fake.path().join(opener);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > '{}'\n",
                argv.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = std::process::Command::new(support::bin())
        .arg("--config")
        .arg(s.dir.config())
        .args(["ui", "--open"])
        .env(
            "PATH",
            format!(
                "{}:{}",
                fake.path().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let args = std::fs::read_to_string(&argv).expect("the opener ran");
    assert!(
        !args.contains(&token),
        "the token stands in the opener's command line: {args}"
    );
    let url = args.lines().nth(1).unwrap().to_string();
    assert!(url.starts_with("file:///"), "{url}");
    let page = url::Url::parse(&url).unwrap().to_file_path().unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&page).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the page holding the token is the owner's only"
        );
    }
    // What the browser does with it: the page opens, live, without the token in its address.
    let browser = Browser::start(driver).await;
    browser.goto(&url).await;
    live(&browser).await;
    assert_eq!(browser.url().await, format!("{base}/"));
    drop(browser);
    s.bridge.stop();
}

/// Issue 43, item 8: 32 idle connections took every place before any check, and each request
/// then waited 18 s. With 48 idle connections open (all from this address, sending nothing or
/// half a header), the page and its data still answer at once.
#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_do_not_lock_the_page_out() {
    let s = Setup::start().await;
    let (_, token, base) = s.link();
    let addr = base.trim_start_matches("http://").to_string();
    let mut idle = Vec::new();
    for i in 0..48 {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        if i % 2 == 0 {
            stream.write_all(b"GET / HTTP/1.1\r\nHost: ").unwrap();
        }
        idle.push(stream);
    }
    let http = reqwest::Client::new();
    for path in ["/", "/api/task?id=nothing", "/"] {
        let started = Instant::now();
        let response = tokio::time::timeout(
            Duration::from_secs(10),
            http.get(format!("{base}{path}"))
                .header("Authorization", format!("Bearer {token}"))
                .send(),
        )
        .await
        .expect("an answer within 10 s")
        .unwrap();
        let took = started.elapsed();
        assert_eq!(response.status(), 200, "{path}");
        eprintln!(
            "{path} answered in {} ms beside 48 idle connections",
            took.as_millis()
        );
        assert!(took < Duration::from_secs(2), "{path} took {took:?}");
    }
    drop(idle);
    s.bridge.stop();
}

/// Issue 43, items 9 and 10: a title with a right-to-left override stays inside the title
/// (the page's own words after it keep their place); the question about a file whose name
/// holds one shows it as `<U+202E>`; the CLI agent's first line shows while it still runs;
/// after a reload "Recent tasks" lists the two tasks newest first, by title, across agents.
#[tokio::test(flavor = "multi_thread")]
async fn what_senders_and_agents_write_is_isolated_shown_as_it_comes_and_listed_in_order() {
    let Some(driver) = chromedriver() else { return };
    let mut s = Setup::start().await;
    let (link, _, base) = s.link();
    let browser = Browser::start(driver).await;
    browser.goto(&link).await;
    live(&browser).await;

    let title = "Build \u{202e}the docs";
    s.broker.send(&s.boss, &s.plain.1, title, "go").await;
    let card = ".task[data-agent=\"plain\"]";
    browser
        .wait_text(&format!("{card} .state"), |t| t == "running")
        .await;
    // The title's override ends with the title: the state after it stays after it.
    let placed: Value = browser
        .execute(
            "const h = document.querySelector(arguments[0] + ' h3'); const t = h.querySelector('.title').getBoundingClientRect(); const s = h.querySelector('.state').getBoundingClientRect(); return [t.left, t.right, s.left, s.right];",
            json!([card]),
        )
        .await;
    let at = |i: usize| placed[i].as_f64().unwrap();
    assert!(
        at(2) >= at(1) - 1.0,
        "the page's own word moved into the title: title {}..{}, state {}..{}",
        at(0),
        at(1),
        at(2),
        at(3)
    );
    let stream = browser
        .wait_text(&format!("{card} .stream"), |t| t.contains("working on it"))
        .await;
    assert!(
        !stream.contains("all done"),
        "the agent still runs: {stream}"
    );
    std::fs::write(s.dir.dir.path().join("go-on"), "").unwrap();
    browser
        .wait_text(&format!("{card} .state"), |t| t == "completed")
        .await;
    let stream = browser
        .wait_text(&format!("{card} .stream"), |_| true)
        .await;
    assert!(
        stream.contains("working on it") && stream.contains("all done"),
        "{stream}"
    );

    s.broker
        .send(&s.boss, &s.asker.1, "Edit the README", "go")
        .await;
    let question = ".question[data-agent=\"asker\"]";
    let asked = browser.wait_text(question, |t| t.contains("Edit")).await;
    assert!(asked.contains("Edit <U+202E>txt.exe"), "{asked}");
    assert!(!asked.contains('\u{202e}'), "{asked:?}");
    let mut allow = None;
    for button in browser.find_all(&format!("{question} button.option")).await {
        if browser.text(&button).await.starts_with("Allow") {
            allow = Some(button);
            break;
        }
    }
    browser.click(&allow.expect("an Allow button")).await;
    s.bridge
        .wait_event("task.completed", |e| e["agent"] == "asker");

    // Every override left on the page is inside an isolate holding only the sender's text.
    let loose: Value = browser
        .execute(
            "const bad = []; const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT); for (let n = w.nextNode(); n; n = w.nextNode()) { if (!/[\\u202a-\\u202e\\u2066-\\u2069]/.test(n.data)) continue; const iso = n.parentElement.closest('bdi'); if (!iso || getComputedStyle(iso).unicodeBidi !== 'isolate' || iso.childNodes.length !== 1) bad.push(n.parentElement.outerHTML); } return bad;",
            json!([]),
        )
        .await;
    assert_eq!(loose, json!([]), "overrides not isolated");

    // A reload reads "Recent tasks" from the journal: newest first, whatever the agent, by
    // title.
    browser.goto(&format!("{base}/")).await;
    live(&browser).await;
    browser
        .wait_text("#recent", |t| t.contains("Edit the README"))
        .await;
    let rows: Value = browser
        .execute(
            "return [...document.querySelectorAll('#recent li .title')].map(e => e.textContent);",
            json!([]),
        )
        .await;
    // Newest first: the operator's answer (journaled as a row of its own), the task it
    // answered, then the first task, of the other agent.
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(
        rows[1..],
        [json!("Edit the README"), json!(title)],
        "{rows:?}"
    );
    drop(browser);
    s.bridge.stop();
}

/// Issue 45: what a task cost, journaled while it runs (as `dispatch/run.rs` journals each
/// report its runner sends), reaches the page when it finishes: today's tokens and cost and
/// this hour's, per agent and per sender, the agent's card, and the 24-hour chart of tokens,
/// with the same totals `usage --json` reports.
#[tokio::test(flavor = "multi_thread")]
async fn the_live_view_shows_usage_per_agent_and_sender_today_and_per_hour() {
    let Some(driver) = chromedriver() else { return };
    let mut s = Setup::start().await;
    let (link, _, _) = s.link();
    let browser = Browser::start(driver).await;
    browser.goto(&link).await;
    live(&browser).await;
    browser
        .wait_text("#usage .total", |t| t.contains("nothing reported"))
        .await;

    s.broker.send(&s.boss, &s.plain.1, "Spend", "go").await;
    let started = s
        .bridge
        .wait_event("task.started", |e| e["agent"] == "plain");
    let task_id = started["taskId"].as_str().unwrap().to_string();
    let loaded = aamp_bridge::config::LoadedConfig::load(&s.dir.config()).unwrap();
    let journal = aamp_bridge::dispatch::Journal::open(&loaded.state().journal()).unwrap();
    let row = journal.find_tasks(&task_id).unwrap()[0].id;
    let report = |input, cost, model: &str| aamp_bridge::protocol::Usage {
        input_tokens: input,
        output_tokens: 400,
        cache_read_tokens: 5000,
        cache_write_tokens: 0,
        cost_micros: cost,
        cost_partial: false,
        model: Some(model.into()),
    };
    let now = std::time::SystemTime::now();
    assert!(journal
        .record_usage(row, 1, "a", &report(2000, Some(16_000), "model-a"), now)
        .unwrap());
    assert!(journal
        .record_usage(row, 1, "b", &report(24, None, "model-b"), now)
        .unwrap());
    std::fs::write(s.dir.dir.path().join("go-on"), "").unwrap();
    let done = s
        .bridge
        .wait_event("task.completed", |e| e["taskId"] == task_id.as_str());
    assert_eq!(done["usage"]["totalTokens"], 12_824, "{done}");

    let spent = "12,824 tokens · $0.0160+";
    let total = browser
        .wait_text("#usage .total", |t| t.contains("12,824"))
        .await;
    assert!(total.contains(spent), "{total}");
    let agent = ".usage-agent tr[data-key=\"plain\"]";
    let day = browser.wait_text(&format!("{agent} .day"), |_| true).await;
    assert_eq!(day, spent);
    // The hour the reports were journaled in is the page's last hour, unless the clock
    // passed an hour meanwhile.
    let same_hour = aamp_bridge::dispatch::journal::hour_of(std::time::SystemTime::now())
        == aamp_bridge::dispatch::journal::hour_of(now);
    let hour = browser.wait_text(&format!("{agent} .hour"), |_| true).await;
    if same_hour {
        assert_eq!(hour, spent);
    }
    let senders: Value = browser
        .execute(
            "return [...document.querySelectorAll('.usage-sender tbody tr')].map(r => [r.dataset.key, r.querySelector('.day').textContent]);",
            json!([]),
        )
        .await;
    assert_eq!(senders, json!([[s.boss.1.to_ascii_lowercase(), spent]]));
    let card = browser
        .wait_text(".agent[data-agent=\"plain\"] .spent", |t| {
            t.contains("12,824")
        })
        .await;
    assert_eq!(card, spent);
    let note = browser.wait_text("#usage .uncosted", |_| true).await;
    assert!(
        note.contains("model-b") && !note.contains("model-a"),
        "{note}"
    );
    // The chart: 24 hourly bars, this hour's the tallest.
    let bars: Value = browser
        .execute(
            "return [...document.querySelectorAll('#usage svg rect.tokens')].map(r => Number(r.getAttribute('height')));",
            json!([]),
        )
        .await;
    let bars: Vec<f64> = bars
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_f64().unwrap())
        .collect();
    assert_eq!(bars.len(), 24, "{bars:?}");
    assert_eq!(bars.iter().filter(|b| **b > 0.0).count(), 1, "{bars:?}");
    if same_hour {
        assert_eq!(bars[23], 100.0, "{bars:?}");
    }
    // The report says the same.
    let report: Value = serde_json::from_str(&s.dir.run(&["usage", "--json"])).unwrap();
    assert_eq!(report["total"]["totalTokens"], 12_824, "{report}");
    assert_eq!(report["total"]["costMicros"], 16_000);
    drop(browser);
    s.bridge.stop();
}
