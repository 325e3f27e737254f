//! A headless Chromium over chromedriver's W3C WebDriver HTTP API, for the live view's tests
//! (Debian's chromium and chromium-driver; scripts/test.sh installs them).

use super::*;
use serde_json::json;

/// The chromedriver binary. Without it the test fails with the fix, as a mail-host test does
/// without the host; with `AAMP_SKIP_MAILHOST=1` it is listed as NOT RUN instead.
pub fn chromedriver() -> Option<&'static str> {
    let path = "/usr/bin/chromedriver";
    if std::path::Path::new(path).exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("AAMP_SKIP_MAILHOST").is_some(),
        "this test needs a browser: apt-get install chromium chromium-driver (scripts/test.sh does); AAMP_SKIP_MAILHOST=1 lists it as NOT RUN instead"
    );
    eprintln!("NOT RUN (AAMP_SKIP_MAILHOST, no chromium-driver): a live view test");
    None
}

/// A headless Chromium session over WebDriver.
pub struct Browser {
    http: reqwest::Client,
    base: String,
    session: String,
    driver: std::process::Child,
}

impl Browser {
    pub async fn start(driver: &str) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = http.get(format!("{base}/status")).send().await;
            if let Ok(r) = ready {
                let v: Value = r.json().await.unwrap_or_default();
                if v["value"]["ready"] == true {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "chromedriver did not get ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,1000"]
            }
        }}});
        let made: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = made["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {made}"))
            .to_string();
        Browser {
            http,
            base,
            session,
            driver: child,
        }
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        v["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The elements matching `css`, by their WebDriver ids.
    pub async fn find_all(&self, css: &str) -> Vec<String> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e.as_object()?.values().next()?.as_str().map(str::to_string))
            .collect()
    }

    pub async fn text(&self, element: &str) -> String {
        self.call(
            reqwest::Method::GET,
            &format!("/element/{element}/text"),
            None,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    pub async fn click(&self, element: &str) {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Runs `script` in the page (`arguments` are `args`), returning what it returns (a
    /// promise's value for an async function body).
    pub async fn execute(&self, script: &str, args: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    pub async fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine as _;
        let png = self
            .call(reqwest::Method::GET, "/screenshot", None)
            .await
            .as_str()
            .unwrap()
            .to_string();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png)
            .unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    /// The text of the first element matching `css`, once there is one (waits up to 30 s).
    pub async fn wait_text(&self, css: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        loop {
            if let Some(e) = self.find_all(css).await.first() {
                last = self.text(e).await;
                if pred(&last) {
                    return last;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no {css} as wanted within 30 s; last text: {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The session's end closes Chromium; then chromedriver goes.
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let _ = reqwest::Client::new().delete(url).send().await;
            });
        })
        .join();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
